/* config.h: the cluster configuration, one INI file (parsed with inih) that every node and
 * the CLI read. Example:
 *
 *   [cluster]
 *   name = demo                 ; checked in every transport handshake
 *   secret_file = secret        ; relative paths are relative to the config file
 *   transport = tcp             ; tcp | verbs | auto
 *   redundancy = 1              ; replicas of each block / fragment
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
 *   http = 127.0.0.1:8100       ; S3 Vectors gateway
 *
 *   [s3]                        ; S3 Vectors gateway of the compute nodes (cn/s3)
 *   access_key = AKIDEXAMPLE
 *   secret_key_file = s3.secret
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
 *
 *   [router]                    ; compute nodes' router (cn/router.h); all optional
 *   strategy = none             ; none | bestfit | balanced | adaptive | adaptive-ring
 *                               ; (dmann bench --routing overrides it for a run)
 *   batch = 1000                ; queries per routing batch, 1..1000000
 *   pause_queue = 1000          ; local queue length that pauses routing, 1..1000000
 *   exchange_ms = 200           ; queue-length report period between batches, 10..60000
 *   sample_min_nodes = 1000     ; oracle sample: first HNSW level from the top holding
 *                               ; at least this many nodes, 1..100000000
 *   recluster_csp = 0.5         ; re-cluster (next oracle epoch) when the cache split
 *                               ; penalty stays above this, 0..1 ...
 *   recluster_secs = 60         ; ... for this many seconds, 0..86400 (0: never)
 *
 *   [mn]                        ; settings of every memory node's S3 flat store
 *                               ; (mn/mn_flat.c); all optional
 *   flat_frag_rows = 4096       ; rows per fragment, 16..1048576: applies to every index
 *                               ; when the store opens (row numbering is per open anyway);
 *                               ; DMANN_FLAT_FRAG_ROWS in the MN's environment overrides
 *                               ; it (tests use small fragments)
 *   wal_group_commit = yes      ; yes: writes that arrive together share one fdatasync;
 *                               ; no: one fdatasync per write, serialised (the behaviour
 *                               ; before group commit, kept for comparisons). Either way
 *                               ; a write is acknowledged only once it is durable.
 *
 * Every unknown section or key, and every bad value, is an error naming the file and line.
 */
#ifndef DM_CONFIG_H
#define DM_CONFIG_H

#include "dm.h"
#include "mem.h"

#define DM_MAX_NODES 256
#define DM_ADDR_MAX 128

enum dm_role { DM_ROLE_MN = 0, DM_ROLE_CN = 1 };

struct dm_node_cfg {
	enum dm_role role;
	uint32_t id;                 /* index within its role */
	char address[DM_ADDR_MAX];
	char http[DM_ADDR_MAX];      /* CN only, may be empty */
	char zone[32];
	char device[32];
	char data_dir[512];          /* MN: absolute or relative to the config file's dir */
	char metrics[DM_ADDR_MAX];   /* host:port of the Prometheus endpoint, may be empty */
	double capacity;
	uint64_t region_bytes;       /* MN only */
	enum dm_huge_mode hugepages;
	int numa_node;
	bool defined;
};

struct dm_cluster_cfg {
	char path[512];
	char dir[512];               /* directory of the config file */
	char name[64];
	char transport[16];          /* "tcp", "verbs" or "" for auto */
	uint8_t secret[64];
	size_t secret_len;
	uint32_t redundancy;
	char s3_access_key[128];
	char s3_secret_key[128];
	/* [s3] tunables (see above; cn/s3 applies the environment overrides) */
	struct dm_s3_cfg {
		uint32_t width, groups;  /* 0: from the index size / the query rate */
		uint64_t max_scan_bytes;
		uint32_t hedge_ms;
		uint64_t cache_bytes;
		uint32_t frag_fetch_bytes;
		uint32_t queue_depth, search_threads, http_threads;
	} s3;
	struct dm_router_cfg {
		uint32_t strategy;       /* enum dm_route_strategy of wire.h */
		uint32_t batch, pause_queue, exchange_ms, sample_min_nodes, recluster_secs;
		double recluster_csp;
		bool spill_cache;
	} router;
	/* [mn] (settings of all memory nodes; parsed by mn_settings_key in config.c) */
	struct dm_mn_settings {
		uint32_t flat_frag_rows;     /* default 4096 */
		bool wal_group_commit;       /* default true */
	} mn_set;
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

const struct dm_node_cfg *dm_config_node(const struct dm_cluster_cfg *cfg, enum dm_role role,
					 uint32_t id);

#endif
