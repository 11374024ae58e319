/* config.h: the cluster configuration, one INI file (parsed with inih) that every node and
 * the CLI read. Example:
 *
 *   [cluster]
 *   name = demo                 ; checked in every transport handshake
 *   secret_file = secret        ; relative paths are relative to the config file
 *   transport = tcp             ; tcp | verbs | auto
 *   redundancy = 1              ; replicas of each block / fragment
 *   etcd = http://127.0.0.1:2379 ; cluster state (etcd v3 JSON gateway; comma-separated
 *                               ; endpoints, http:// or https://). Every node registers
 *                               ; itself there under a lease it keeps alive (its
 *                               ; heartbeat); `dmann status` shows who is up. Optional;
 *                               ; `dmann local up` starts a local etcd and sets it
 *   member_lease_s = 5          ; TTL of that lease, 2..60 s: a node SIGKILLed is seen
 *                               ; down within about this long
 *   takeover_grace_s = 8        ; a controller that takes office, or sees etcd again
 *                               ; after an outage, declares no node down for this long
 *                               ; (every lease may have expired at once); 1..600,
 *                               ; default member_lease_s + 3
 *   replace_after_s = 30        ; a memory node the up-set declares down for this long
 *                               ; is retired: the controller copies its index blocks from
 *                               ; the other replicas to the next nodes (1..86400)
 *   repair_mb_s = 100           ; re-replication copies at most this many MiB/s (0: no
 *                               ; bound), so that queries keep their share of the nodes
 *
 *   [mn.0]                      ; memory node 0
 *   address = 127.0.0.1:7000
 *   capacity = 1.0              ; placement weight
 *   zone = a
 *   region_mb = 256
 *   hugepages = auto            ; auto | on | off
 *   numa_node = -1              ; -1: the NIC's node (or unbound)
 *   device = rxe0               ; RDMA device (verbs)
 *   data_dir = mn0              ; snapshots (default: mn<N> beside the config file)
 *   metrics = 127.0.0.1:9100    ; Prometheus text metrics (optional, any node)
 *
 *   [cn.0]                      ; compute node 0
 *   address = 127.0.0.1:7100    ; native client port (queries, forwarded traffic)
 *   http = 127.0.0.1:8100       ; S3 Vectors gateway (plain HTTP; also the port other
 *                               ; CNs send their scan sub-requests to)
 *   https = 127.0.0.1:8443      ; the same gateway over HTTPS (optional; needs [s3]
 *                               ; https_cert and https_key)
 *   zone, device, metrics       ; as for memory nodes
 *   cache = 512MiB              ; overrides [cn] cache / cache_admit for this node
 *
 *   [cn]                        ; every compute node (a [cn.N] may override cache and
 *                               ; cache_admit for its node); all optional
 *   cache = 10%                 ; record cache per CN: a share of the index's record
 *                               ; bytes (0..100%), or bytes with a unit (B, KiB, MiB, GiB,
 *                               ; TiB, KB, MB, GB, TB; 1..2^50 bytes); 0 = off (default 0).
 *                               ; dmann bench --cache-ratio overrides it for a run
 *   cache_admit = 0.1           ; probability that a record read once the cache is full
 *                               ; replaces a cached one, 0..1 (default 0.1)
 *   drain_ms = 5000             ; SIGTERM: how long a CN that left the cluster state may
 *                               ; keep serving the queries still sent to it, 0..600000
 *                               ; (0: stop at once; it stops earlier once idle)
 *   call_threads = 8            ; native S3 calls (libdmann C_CALL) one client connection
 *                               ; may have running at once on a CN, 1..64
 *   ef_upper = 64               ; HNSW queries with codes: search list size on level 1,
 *                               ; 1..256 (1: the greedy descent of hnswlib); its best
 *                               ; ceil(ef_upper/4) nodes are level 0's entry points. Level 1
 *                               ; is local to the CN: CPU, no READ (docs/operations.md)
 *   refresh_ms = 1000           ; period of the CN's index-generation poll, 50..60000
 *                               ; (a new `dmann load` is served within about this long)
 *   lease_ms = 20000            ; generation lease, 1000..3600000: a memory node frees an
 *                               ; old index generation once every CN acknowledged the new
 *                               ; one, or once a CN has not reported for this long; a CN
 *                               ; stops reading from a memory node it could not report to
 *                               ; for half of it (so it never reads freed memory)
 *   send_queue = 256            ; transport work requests (READs + SENDs) in flight per
 *                               ; connection of a CN, 128..65536 (verbs QP depth; the router
 *                               ; samples with batches of 128 READs)
 *
 *   [s3]                        ; S3 Vectors gateway of the compute nodes (cn/s3)
 *   access_key = AKIDEXAMPLE    ; one identity, named "default" (optional when
 *   secret_key_file = s3.secret ; [s3.identity.NAME] sections name others)
 *   policy_default = allow      ; allow | deny: what a bucket policy decides for an action
 *                               ; none of its statements allows or denies (default allow:
 *                               ; identities hold full permissions, a policy restricts
 *                               ; them by Deny); docs/api.md
 *   https_cert = cn.crt         ; PEM certificate and key of the CNs' HTTPS listeners
 *   https_key = cn.key          ; ([cn.N] https; both or neither; default: none)
 *   ; tunables of the distributed exact scan, all optional (defaults shown); each has an
 *   ; environment override for tests, DMANN_S3_<KEY upper-cased> (e.g. DMANN_S3_HEDGE_MS):
 *   ; when set (and valid) it wins over the file, an invalid one is warned about and ignored
 *   width = 0                   ; W, members per replica group, 0..256 (0: from the
 *                               ; index size and max_scan_mb)
 *   groups = 0                  ; R, replica groups, 0..256 (0: from the query rate)
 *   max_scan_mb = 256           ; most MiB one CN scans per query (sets W), 1..1048576
 *   hedge_ms = 50               ; a member slower than this is hedged, 1..60000
 *   cache_mb = 2048             ; fragment cache of each CN in MiB, 1..16777216
 *   frag_fetch_kb = 16384       ; a fragment is fetched from its MN in pieces of at most
 *                               ; this many KiB, 64..32768
 *   queue_depth = 64            ; admitted queries (running + waiting), 1..1048576
 *   search_threads = 0          ; query threads, 0..256 (0: one per online CPU)
 *   http_threads = 8            ; HTTP threads, 1..256
 *   ; the graph path of an index bulk-imported with `dmann load --bucket --name`:
 *   graph_min_rows = 20000      ; below this many graph rows the exact scan serves it
 *   graph_ef = 128              ; HNSW search list size of its queries, 1..65536
 *   graph_beam = 4              ; level-0 candidates expanded per round trip, 1..16
 *   graph_filter_widen = 10     ; a filtered query asks the graph for topK x this many
 *                               ; candidates (1..100), exact scan when too few pass
 *   ; the online indexer of a graph-bound index (one compute node runs it):
 *   index_interval_ms = 1000    ; how often it looks for rows past the mark, 0..3600000
 *                               ; (0: no online indexing, the tail is scanned exactly)
 *   index_batch = 2000          ; rows per batch (one graph snapshot each), 1..8192
 *   index_threads = 4           ; insert threads, 1..64
 *   index_ef = 100              ; efConstruction of its inserts, 1..65536
 *   ; graphs for indexes created through the API (not bulk-imported):
 *   graph_auto = 1              ; 1: once such an index holds graph_min_rows rows, the
 *                               ; first indexer builds a graph of its rows and places it
 *                               ; (the online indexer then keeps it current); 0: exact only
 *   graph_room = 20000          ; rows such a graph takes online beyond its seed rows
 *                               ; (1000..100000000); rows past it stay in the tail
 *   write_min_replicas = 1      ; a write that cannot reach every replica of its bucket is
 *                               ; acknowledged once this many took it (1..256, at most R)
 *                               ; and the missed ones are marked stale in the cluster
 *                               ; state (needs [cluster] etcd; without it every replica)
 *   bucket_shards = 1           ; shards of a vector bucket created from now on, 1..256
 *                               ; (fixed at its creation; each shard on its own R memory
 *                               ; nodes, so an index can outgrow one; S > 1: exact scan
 *                               ; only, no graph path yet)
 *   ; partitioned exact scans (docs/api.md "Partitioned exact scans"):
 *   scan_budget = 0             ; 0: the exact path scans every row; B (1..4096): an
 *                               ; unfiltered query of a large index scans the rows of B
 *                               ; of its VHash regions (the bounded-fanout frontier)
 *   scan_regions = 64           ; VHash regions per index, 8..4096
 *   scan_min_rows = 100000      ; only indexes of at least this many rows, 0..2^40
 *   scan_widen = 1              ; 1: one region more for ambiguous queries (Semord eq. 12)
 *
 *   [s3.identity.NAME]          ; one more S3 identity (NAME: 1..63 of A-Za-z0-9+=,.@_-;
 *                               ; at most 32 identities in all)
 *   access_key = AKIDALICE      ; 1..127 of A-Za-z0-9, unique over all identities
 *   secret_key_file = alice.secret ; its secret key (16..127 bytes)
 *   principal = arn:aws:iam::000000000000:user/NAME ; the ARN bucket policies name it by
 *                               ; (default shown)
 *
 *   [router]                    ; compute nodes' router (cn/router.h); all optional
 *   strategy = none             ; none | bestfit | balanced | adaptive | adaptive-ring
 *                               ; (dmann bench --routing overrides it for a run)
 *   batch = 1000                ; queries per routing batch, 1..1000000
 *   pause_queue = 1000          ; local queue length that pauses routing, 1..1000000
 *   exchange_ms = 200           ; queue-length report period between batches, 10..60000
 *   sample_min_nodes = 1000     ; oracle sample: first HNSW level from the top holding
 *                               ; at least this many nodes, 1..100000000
 *   fit_duty = 10               ; share of a CPU (percent, 5..100) the fit of a new
 *                               ; oracle epoch may take while the CN routes with the
 *                               ; current one: it sleeps between blocks of work (100: never)
 *   recluster_csp = 0.5         ; re-cluster (next oracle epoch) when the cache split
 *                               ; penalty stays above this, 0..1 ...
 *   recluster_secs = 60         ; ... for this many seconds, 0..86400 (0: never)
 *   recluster_mass = 0.5        ; also re-cluster when the largest partition's share of
 *                               ; the index's upper-level sample, over its fair share, has
 *                               ; grown by more than this since the epoch's first measure
 *                               ; (inserts that went to a few partitions) for
 *                               ; recluster_secs, 0..100 (0: never)
 *   csp_slice = 64              ; the CSP estimate samples the cached ids of a fixed
 *                               ; 1/csp_slice of the id hash space (1, 2, 4, ..., 64; 1:
 *                               ; exact); at most 3072 sampled ids per CN are reported
 *   spill_cache = no            ; yes | no: queries spilled off their top-ranked CN fill
 *                               ; the cache of the CN that runs them (bench --spill-cache)
 *
 *   [mn]                        ; settings of every memory node's S3 flat store
 *                               ; (mn/mn_flat.c); all optional
 *   flat_frag_rows = 4096       ; rows per fragment, 16..1048576: applies to every index
 *                               ; when the store opens (row numbering is per open anyway);
 *                               ; DMANN_FLAT_FRAG_ROWS in the MN's environment overrides
 *                               ; it (tests use small fragments)
 *   flat_max_mb = auto          ; most MiB of rows a memory node's flat store holds
 *                               ; (vectors, keys, metadata; deleted rows until the next
 *                               ; restart compacts them): a write past it is refused with
 *                               ; ServiceQuotaExceededException (HTTP 402), nothing of it
 *                               ; acknowledged. auto: 3/4 of the machine's memory; 0: no
 *                               ; limit; else 1..1073741824
 *   wal_group_commit = yes      ; yes: writes that arrive together share one fdatasync;
 *                               ; no: one fdatasync per write, serialised (the behaviour
 *                               ; before group commit, kept for comparisons). Either way
 *                               ; a write is acknowledged only once it is durable.
 *
 *   [client.bench]              ; a client identity (libdmann, Python): it connects to the
 *   secret_file = bench.secret  ; compute nodes with this secret (16..64 bytes) instead of
 *                               ; the cluster secret; up to 32 such sections, names of 1..63
 *                               ; of A-Z a-z 0-9 _ . -. A client's connection gets no remote
 *                               ; memory access and every admin op on it fails with -EPERM.
 *                               ; Memory nodes accept no client identity.
 *
 * Every unknown section or key, and every bad value, is an error naming the file and line.
 */
#ifndef DM_CONFIG_H
#define DM_CONFIG_H

#include "dm.h"
#include "mem.h"

#define DM_MAX_NODES 256
#define DM_ADDR_MAX 128
#define DM_S3_MAX_IDS 32

enum dm_role { DM_ROLE_MN = 0, DM_ROLE_CN = 1 };

/* Compute-node settings ([cn], per node overridable by [cn.N] where noted). */
struct dm_cn_cfg {
	bool cache_is_ratio;         /* cache = P%: cache_ratio of the index's record bytes */
	double cache_ratio;          /* 0..1 */
	uint64_t cache_bytes;        /* cache = N<unit>; 0 (with !cache_is_ratio): off */
	double cache_admit;          /* 0..1 */
	uint32_t refresh_ms;         /* [cn] only */
	uint32_t drain_ms;           /* [cn] only: SIGTERM drain bound */
	uint32_t lease_ms;           /* [cn] only; memory nodes read it too */
	uint32_t send_queue;         /* [cn] only */
	uint32_t call_threads;       /* [cn] only: C_CALLs run at once per client connection */
	uint32_t ef_upper;           /* [cn] only: HNSW level-1 search list (hnsw_src.ef_upper) */
};
#define DM_CN_MAX_CALL_THREADS 64u
#define DM_CN_SET_CACHE 1u
#define DM_CN_SET_ADMIT 2u

/* Parse one [cn] / [cn.N] key into c (per_node: only the overridable keys). Returns 1 when
 * key is a compute-node setting it took, 0 when key is not one (the caller goes on), or
 * -EINVAL with a message in msg for a bad value. *set gets the DM_CN_SET_* bit it set. */
int dm_config_cn_key(struct dm_cn_cfg *c, bool per_node, const char *key, const char *v,
		     uint32_t *set, char *msg, size_t msglen);
/* Parse a cache size: "0", "P%" or "N<unit>". 0 or -EINVAL. */
int dm_config_parse_cache(const char *v, bool *is_ratio, double *ratio, uint64_t *bytes);
/* The cache bytes a CN with settings c uses for an index of index_bytes record bytes. */
uint64_t dm_config_cache_bytes(const struct dm_cn_cfg *c, uint64_t index_bytes);

struct dm_node_cfg {
	enum dm_role role;
	uint32_t id;                 /* index within its role */
	char address[DM_ADDR_MAX];
	char http[DM_ADDR_MAX];      /* CN only, may be empty */
	char https[DM_ADDR_MAX];     /* CN only, may be empty: the gateway over HTTPS too */
	char zone[32];
	char device[32];
	char data_dir[512];          /* MN: absolute or relative to the config file's dir */
	char metrics[DM_ADDR_MAX];   /* host:port of the Prometheus endpoint, may be empty */
	double capacity;
	uint64_t region_bytes;       /* MN only */
	enum dm_huge_mode hugepages;
	int numa_node;
	struct dm_cn_cfg cnc;        /* CN only: [cn] merged with this node's overrides */
	uint32_t cnc_set;            /* DM_CN_SET_*: keys this [cn.N] set itself */
	bool defined;
};

#define DM_MAX_CLIENTS 32
struct dm_client_cfg {               /* [client.NAME] */
	char name[64];
	char secret_file[512];
	uint8_t secret[64];          /* empty when not read (dm_config_load_client: others) */
	size_t secret_len;
};

struct dm_cluster_cfg {
	char path[512];
	char dir[512];               /* directory of the config file */
	char name[64];
	char transport[16];          /* "tcp", "verbs" or "" for auto */
	uint8_t secret[64];
	size_t secret_len;
	uint32_t redundancy;
	char etcd[512];              /* [cluster] etcd endpoints, "" = no cluster state */
	uint32_t etcd_lease_s;       /* [cluster] member_lease_s: heartbeat lease TTL */
	uint32_t etcd_grace_s;       /* [cluster] takeover_grace_s, 0 = member_lease_s + 3 */
	uint32_t replace_after_s;    /* [cluster] replace_after_s: a memory node down this long
				      * is retired and its blocks copied to others */
	uint32_t repair_mb_s;        /* [cluster] repair_mb_s: copy rate of re-replication,
				      * MiB/s (0: unbounded) */
	char s3_access_key[128];
	char s3_secret_key[128];
	/* S3 identities: the [s3] access_key (named "default") first, then every
	 * [s3.identity.NAME] in file order. */
	struct dm_s3_identity {
		char name[64];
		char access_key[128];
		char secret[128];
		char principal[256];
	} s3_ids[DM_S3_MAX_IDS];
	uint32_t n_s3_ids;
	bool s3_policy_deny;         /* [s3] policy_default = deny */
	char s3_https_cert[520];     /* resolved paths, "" = plain HTTP */
	char s3_https_key[520];
	/* [s3] tunables (see above; cn/s3 applies the environment overrides) */
	struct dm_s3_cfg {
		uint32_t width, groups;  /* 0: from the index size / the query rate */
		uint64_t max_scan_bytes;
		uint32_t hedge_ms;
		uint64_t cache_bytes;
		uint32_t frag_fetch_bytes;
		uint32_t queue_depth, search_threads, http_threads;
		uint64_t graph_min_rows;  /* the graph path (docs/api.md) from this many rows */
		uint32_t graph_ef, graph_beam, graph_filter_widen;
		uint32_t index_interval_ms, index_batch, index_threads, index_ef;
		uint32_t member_conns;   /* idle kept-alive connections per member CN (0: none) */
		uint32_t graph_auto;     /* 1: indexes created through the API get a graph */
		uint32_t graph_room;     /* rows of spare room in such a graph */
		uint32_t write_min_replicas;   /* a write is acknowledged with this many */
		uint32_t bucket_shards;  /* shards of a new bucket (1: the whole bucket on R MNs) */
		uint32_t scan_budget;    /* partitioned exact scans: regions scanned (0: all) */
		uint32_t scan_regions;   /* their VHash regions per index */
		uint64_t scan_min_rows;  /* from this many index rows */
		uint32_t scan_widen;     /* 1: widen ambiguous queries (eq. 12) */
	} s3;
	struct dm_router_cfg {
		uint32_t strategy;       /* enum dm_route_strategy of wire.h */
		uint32_t batch, pause_queue, exchange_ms, sample_min_nodes, recluster_secs;
		uint32_t fit_duty;       /* percent of a CPU an oracle fit may take (5..100) */
		double recluster_csp;
		double recluster_mass;   /* 0: no mass re-clustering */
		uint32_t csp_slice;      /* CSP sample: ids in 1/csp_slice of the hash space */
		bool spill_cache;
		bool keyrange;           /* partitions = keyrange (else kmeans, the default) */
		uint32_t regions;        /* keyrange: VHash regions (0: auto) */
	} router;
	/* [mn] (settings of all memory nodes; parsed by mn_settings_key in config.c) */
#define DM_FLAT_MAX_AUTO UINT64_MAX  /* flat_max_mb = auto: 3/4 of physical memory */
	struct dm_mn_settings {
		uint32_t flat_frag_rows;     /* default 4096 */
		uint64_t flat_max_mb;        /* 0: no limit (default: DM_FLAT_MAX_AUTO) */
		bool wal_group_commit;       /* default true */
	} mn_set;
	struct dm_cn_cfg cn_all;     /* [cn]: every compute node's settings */
	uint32_t n_clients;
	struct dm_client_cfg clients[DM_MAX_CLIENTS];
	uint32_t n_mn, n_cn;
	struct dm_node_cfg mn[DM_MAX_NODES];
	struct dm_node_cfg cn[DM_MAX_NODES];
};

/* Load and validate a cluster file. On error returns -errno (-EINVAL for content errors)
 * and writes "FILE:LINE: problem" into err. */
/* The [s3] tunables: their defaults, and one key (name as in the file, value text) parsed
 * into s3. 0, -ENOENT (no such key) or -ERANGE (bad value; msg says why). Also used for the
 * environment overrides. */
void dm_s3_cfg_defaults(struct dm_s3_cfg *s3);
int dm_s3_cfg_key(struct dm_s3_cfg *s3, const char *key, const char *v, char *msg,
		  size_t msglen);

int dm_config_load(const char *path, struct dm_cluster_cfg *cfg, char *err, size_t errlen);

/* Parse from a string (tests, fuzzing); base_dir resolves relative secret paths. */
int dm_config_parse(const char *text, const char *name, const char *base_dir,
		    struct dm_cluster_cfg *cfg, char *err, size_t errlen);

/* Load a cluster file as client identity `client` (NULL or "": $DMANN_CLIENT_NAME) does:
 * only that client's secret is read (neither the cluster secret, secret_len stays 0, nor
 * the [s3] key nor other clients' secrets). $DMANN_CLIENT_SECRET_FILE, when set, names the
 * client's secret file instead (the client then need not have a section in this file; the
 * compute nodes must still know it). 0 or -errno (-ENOENT: no such client) with err. */
int dm_config_load_client(const char *path, const char *client, struct dm_cluster_cfg *cfg,
			  char *err, size_t errlen);
/* The compute nodes' own client identity: their S3 gateways search the HNSW index through
 * libdmann as this client, and `dmann load` imports through it. Its secret is derived from
 * the cluster secret (HMAC-SHA256), so only holders of the cluster secret have it; the name
 * is reserved in [client.NAME]. 0, -EACCES (cfg was loaded without the cluster secret). */
#define DM_GATEWAY_CLIENT "dmann-gateway"
int dm_config_gateway_client(const struct dm_cluster_cfg *cfg, struct dm_client_cfg *out);
/* The [client.NAME] entry, or NULL. */
const struct dm_client_cfg *dm_config_client(const struct dm_cluster_cfg *cfg,
					     const char *name);

const struct dm_node_cfg *dm_config_node(const struct dm_cluster_cfg *cfg, enum dm_role role,
					 uint32_t id);

#endif
