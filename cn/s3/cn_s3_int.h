/* cn_s3_int.h: private declarations shared by the files of the compute node's S3 gateway
 * (the distributed path, see cn_s3.h):
 *   cn_s3.c          start/stop, settings, metrics
 *   cn_s3_mn.c       memory-node connection pool, FL calls, index state reads
 *   cn_s3_write.c    operation routing by bucket, replication of writes
 *   cn_s3_shard.c    buckets of several shards: their count, catalog, split vector ops
 *   cn_s3_repl.c     stale replicas (writes that missed one) and their catch-up
 *   cn_s3_catalog.c  catalog listings merged over the memory nodes
 *   cn_s3_query.c    the ingress of QueryVectors: plan, fan-out, hedging, retries, merge
 *   cn_s3_hclient.c  the HTTP client of member sub-requests
 *   cn_s3_member.c   the member side: fragment fetch into the cache, exact scan
 *   cn_s3_graph.c    the graph path of a bulk-imported index (HNSW candidates by key)
 *   cn_s3_gkeys.c    the copy of its key log (node ids the online indexer added -> keys)
 *   cn_s3_index.c    the online indexer (tail rows into the graph, the mark moved on)
 *   cn_s3_scope.c    scoped queries: a scope value's fragments only, rows counted
 *   s3_fcache.c      the fragment cache (hash map + LRU)
 */
#ifndef DM_CN_S3_INT_H
#define DM_CN_S3_INT_H

#include <pthread.h>

#include <jansson.h>

#include "cn_s3.h"
#include "fl_rpc.h"
#include "s3_api.h"
#include "s3_fcache.h"
#include "s3_http.h"
#include "s3_sigv4.h"
#include "util/dm_buf.h"

#define MN_MSG DM_FL_MIN_MSG         /* until FL_INFO tells the MN's receive buffer size */
#define MY_MSG 65536u                /* our receive buffers */
#define FL_TIMEOUT_MS 10000
#define MN_CONNECT_MS 5000           /* generous: a loaded MN may be slow to accept */
#define MN_DOWN_NS 1000000000ull      /* a failed MN is skipped for reads this long */
#define CN_DOWN_NS 2000000000ull      /* a failed CN member is avoided this long */
#define SUB_TIMEOUT_MS 20000
#define NAME_MAX_ (FLAT_NAME_MAX + 1)   /* room for a bucket (or shard, "B#s") name */
#define JSON_OUT (JSON_COMPACT | JSON_REAL_PRECISION(9))
/* A fragment is fetched in pieces of at most this many row bytes (the FL_FRAG max_bytes
 * field): every answer stays far below the DM_FL_MAX_STREAM message cap. */
#define FRAG_PIECE_BYTES (16u << 20)

struct mnconn {
	struct dm_conn *c;
	struct dm_rpc_chan ch;
	uint32_t max_msg;                /* the MN's receive buffer (FL_INFO) */
	struct mnconn *next;
};

struct mnslot {
	pthread_mutex_t mu;
	struct mnconn *idle;
	uint64_t down_until;             /* atomic, dm_now_ns */
};

/* The copy of one memory node's key log of a graph-bound index (cn_s3_gkeys.c). */
struct gkcache {
	pthread_mutex_t mu;
	char b[NAME_MAX_ + 1], x[NAME_MAX_ + 1];
	int64_t created;
	uint64_t tag, epoch;
	uint32_t mn;
	uint64_t n;                      /* log entries [0, n) copied */
	struct gkslot { uint64_t id; char *key; } *slot;   /* open addressing, key NULL = empty */
	size_t cap, used;
};

/* The online indexer (cn_s3_index.c). */
struct s3_indexer {
	pthread_t t;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;                       /* under mu */
	uint32_t interval_ms, batch, threads, ef;
	bool seed_auto;                  /* [s3] graph_auto: graphs for API-created indexes */
	uint32_t seed_room;              /* [s3] graph_room */
	uint64_t seed_next;              /* the next look for indexes to seed (dm_now_ns) */
	uint64_t seeded;                 /* graphs seeded (atomic) */
	uint64_t unbound_seen;           /* graph tag + 1 seen placed, not bound, at the last look */
	uint64_t full_until[DM_MAX_GRAPHS];   /* graph g was full: no insert before this */
	uint64_t glag[DM_MAX_GRAPHS];    /* rows past graph g's index's mark (indexer thread) */
	/* counters (atomics); lag: the sum of glag */
	uint64_t rows, batches, errors, snapshots, snapshot_ns, insert_ns, lag, graphs_dropped;
};

#define HPOOL_MAX 32              /* idle connections kept per member CN, at most */

struct cn_s3 {
	const struct dm_cluster_cfg *cfg;
	const struct dm_node_cfg *node;
	struct dm_xport *x;
	struct dm_msgpool *pool;
	struct mnslot mn[DM_MAX_NODES];
	uint64_t cn_down[DM_MAX_NODES];  /* atomic */
	struct s3_http *http;
	struct s3_http *https;           /* [cn.N] https, or NULL */
	struct s3_backend be;
	struct s3_cred creds[DM_S3_MAX_IDS]; /* the cluster's S3 identities: users' requests */
	struct s3_cred icred;            /* internal key (from the cluster secret): sub-requests */
	char ikey[32], isecret[72];
	struct s3_sigv4_cfg iauth;
	uint32_t redundancy;
	uint32_t search_threads;
	/* settings ([s3] of the cluster file, environment overrides: cn_s3.c) */
	uint32_t force_w, force_r;
	uint64_t max_scan_bytes;
	uint32_t hedge_ms;
	uint32_t frag_piece_bytes;
	uint32_t test_delay_ms;          /* test hook: delay scans served for other CNs */
	char test_busy[256];             /* test hook: QueryVectors answered 503 while it exists */
	uint32_t shards;                 /* [s3] bucket_shards: of buckets created here */
	/* Shard counts of buckets (cn_s3_shard.c): a small cache, under shmu. */
	pthread_mutex_t shmu;
	struct shcount {
		char b[NAME_MAX_ + 1];
		uint32_t n;
		uint64_t at;                 /* dm_now_ns when read */
	} shc[64];
	struct s3_fcache *cache;
	/* R from the query rate: per index an exponentially decaying arrival rate, and what
	 * one group serves, from the measured member scan time. */
	pthread_mutex_t rmu;
	struct ixrate {
		uint64_t id, last_ns;
		double qps;
	} rate[64];
	double scan_ns;                  /* EWMA of a member scan (this CN) */
	/* Partitioned exact scans (cn_s3_part.c; [s3] scan_*): B regions of K, from this many
	 * rows; the models of the indexes; counters (atomics). */
	uint32_t scan_budget, scan_regions, scan_widen;
	uint64_t scan_min_rows;
	struct s3_parts *parts;
	uint64_t part_queries, part_regions_sel, part_fits, part_fit_ns, part_mismatch;
	uint64_t scan_rows, scan_skipped;
	/* Scoped queries (cn_s3_scope.c; atomics): queries planned on a scope's fragments,
	 * fragments kept and skipped for them; rows their members read, and of those rows of
	 * another scope value. */
	uint64_t scope_queries, scope_frags, scope_frags_skipped, scope_rows, scope_other_rows;
	/* The graph path (cn_s3_graph.c): the compute node's view, a pool of libdmann handles
	 * (as the gateways' identity), settings and counters. */
	const struct cn_s3_graph_ops *gops;
	void *gctx;
	pthread_mutex_t gmu;
	struct dmann *gidle[16];
	uint32_t ngidle;
	uint64_t gretry_at;              /* no new connection before (after a failed one) */
	uint64_t graph_min_rows;
	uint32_t graph_ef, graph_beam, graph_widen;
	struct gkcache gk[DM_MAX_GRAPHS];   /* per graph number */
	struct s3_indexer ix;
	/* Sub-requests to other CNs' gateways (cn_s3_hclient.c): idle kept-alive connections
	 * per CN, at most member_conns each ([s3] member_conns; 0: one connection per
	 * sub-request, closed after it). */
	pthread_mutex_t hpool_mu;
	uint32_t member_conns;
	struct hpool {
		int fd[HPOOL_MAX];
		uint32_t n;
	} hpool[DM_MAX_NODES];
	/* counters (atomics) */
	uint64_t hedges, retries, subreqs, fetches, plan_fallbacks;
	uint64_t subreq_conns, subreq_reused;   /* connections opened / kept-alive ones reused */
	uint64_t graph_queries, graph_fallbacks, graph_errors, graph_tail_rows;
	uint64_t graph_planned_exact;    /* filtered queries the estimate sent to the exact path */
	/* Stale replicas and their catch-up (cn_s3_repl.c). */
	struct s3_repl {
		struct dm_stalewatch *watch;     /* NULL: no cluster state */
		struct dm_etcd *etcd;            /* marks (under mu) */
		pthread_mutex_t mu;
		pthread_cond_t cv;
		pthread_t t;
		bool started, stop;              /* stop under mu */
		uint32_t write_min;              /* [s3] write_min_replicas */
		uint64_t retry_at[DM_MAX_NODES]; /* catch-up thread: back-off per stale node */
		/* counters (atomics) */
		uint64_t degraded_writes, marks, mark_errors, catchups, catchup_errors;
		uint64_t catchup_bytes, catchup_ms;
		/* The placement buckets follow (the cluster state's, applied once the stale
		 * marks its change needs are known here): under pmu. */
		pthread_mutex_t pmu;
		int64_t pver;                    /* atomic */
		uint64_t retired[DM_MAX_NODES / 64];
	} repl;
};

/* ---- cn_s3_mn.c ---- */

/* A fragment's version in an index state: rows written, of those tombstoned. */
struct fstat {
	uint32_t rows, dead;
	uint32_t from;                   /* a ScanShare's: scan rows from this one on (the
					  * graph mark's fragment; 0 otherwise) */
};

/* An index as one MN describes it (FL_STATE). */
struct ixstate {
	uint32_t mn;
	uint64_t epoch;
	int64_t created;
	uint32_t dim, metric, frag_rows, nfrag;
	char *conf;
	uint32_t conf_len;
	struct fstat *fr;
	uint64_t mark, mark_tag;         /* the graph mark (flat.h): rows [0, mark) in graph
					  * generation mark_tag */
	uint64_t gkeys;                  /* length of its key log (online indexer) */
	uint64_t *scope;                 /* a scoped index's labels per fragment, else NULL */
};

void mnconn_free(struct mnconn *mc);
bool mn_is_down(struct cn_s3 *s, uint32_t mn);
/* One FL call to memory node mn with the request in req (freed here, also on error;
 * -ENOMEM if it overflowed): the peer status, or -EHOSTDOWN when it cannot be reached. */
int mn_call(struct cn_s3 *s, uint32_t mn, uint16_t op, struct dm_buf *req,
	    uint8_t **resp, size_t *rlen);
/* The same with its own time bound (a catch-up's install may take longer than 10 s). */
int mn_call_timeout(struct cn_s3 *s, uint32_t mn, uint16_t op, struct dm_buf *req,
		    uint8_t **resp, size_t *rlen, int timeout_ms);
/* The MNs holding a bucket, best first, under the placement of the cluster state (a
 * retired node's buckets are on the next nodes: cn_s3_repl.c): their number, or -errno. */
int bucket_mns(struct cn_s3 *s, const char *bucket, uint32_t *out);
/* An S3 operation on one MN (FL_CALL): 0 with r filled from its answer, or -errno. */
int mn_s3(struct cn_s3 *s, uint32_t mn, const char *op, const char *body, size_t len,
	  struct s3_resp *r);
/* The filter's cardinality estimate: of *seen sampled live rows of the index (up to 1,024
 * from up to 4 fragments spread over it, through the fragment cache), *passed pass flt.
 * 0 or -errno (cn_s3_member.c). */
#define FSAMPLE_MIN 64u            /* fewer sampled rows: no estimate (the widen rule) */
int filter_sample(struct cn_s3 *s, const struct ixstate *st, const char *b, const char *x,
		  const struct s3_filter *flt, uint32_t *seen, uint32_t *passed);
/* 503: memory node mn is unreachable. */
void unavailable(struct s3_resp *r, const char *what, uint32_t mn);
int ixstate_fetch(struct cn_s3 *s, uint32_t mn, const char *b, const char *x,
		  struct ixstate *st);
void ixstate_fini(struct ixstate *st);

/* Fragment frag of an index state from the fragment cache, brought up to the state's
 * version: 0 with *out held (s3_fcache_put it), or -errno with nothing held
 * (cn_s3_member.c). */
int frag_get(struct cn_s3 *s, const struct ixstate *st, const char *b, const char *x,
	     uint64_t frag, struct s3_frag **out);

/* ---- cn_s3_part.c: partitioned exact scans ---- */

#define S3_PART_SAMPLE_ROWS 16384u  /* a model is fitted on the index's first rows */
struct s3_parts;
struct s3_part;
/* The table of models (NULL + errno); waiting for the fits under way (call it before the
 * memory-node connections go); its end (drains too). */
struct s3_parts *parts_new(void);
void parts_drain(struct s3_parts *t);
void parts_free(struct s3_parts *t);
/* The model of index b/x as memory node st->mn holds it, referenced (part_put it): 0;
 * -EAGAIN while it is being fitted (a fit from the first rows starts in a thread of its
 * own when this compute node has none), -ENODATA (too few rows), -EBUSY (the table is full
 * of models in use), -errno (a failed fit: tried again after 30 s). */
int part_get(struct cn_s3 *s, const struct ixstate *st, const char *b, const char *x,
	     struct s3_part **out);
void part_put(struct cn_s3 *s, struct s3_part *p);
/* The model's identity (a hash of its bytes) and its region count K. */
uint64_t part_id(const struct s3_part *p);
uint32_t part_regions(const struct s3_part *p);
/* The regions (ring positions 0..K-1) query q scans, best first, at most [s3] scan_budget
 * (one more when widened): the count, or -errno. room >= K. *widened (may be NULL). */
int part_select(struct cn_s3 *s, const struct s3_part *p, const float *q, uint32_t *pos,
		uint32_t room, bool *widened);
/* Label rows [.., upto) of f with their ring positions under p (f->rw held for writing):
 * 0 or -ENOMEM. */
int part_label(const struct s3_part *p, struct s3_frag *f, uint32_t upto);

/* ---- cn_s3_scope.c ---- */

/* The fragments of state st a query q leaves out: NULL in *other when q is not scoped (or
 * st has no labels), else *other (malloc'd, nfrag flags) marks the fragments of other scope
 * values (counted). 0 or -ENOMEM. */
int scope_select(struct cn_s3 *s, const struct ixstate *st, const struct s3_qspec *q,
		 uint8_t **other);
/* Whether a row (its encoded filterable metadata) lies outside scoped query q's value. */
bool scope_row_other(const struct s3_qspec *q, const void *fmeta, uint32_t flen);

/* ---- cn_s3_repl.c ---- */

/* Start / stop the stale-replica watch and the catch-up thread (the thread acts only while
 * this compute node is the controller). Without [cluster] etcd nothing starts and every
 * write needs every replica. */
int repl_start(struct cn_s3 *s);
void repl_stop(struct cn_s3 *s);
/* Whether writes may be acknowledged without every replica (a cluster state to mark the
 * missed ones in). */
bool repl_marks(struct cn_s3 *s);
/* Whether replica mn of bucket b is marked stale (reads skip it). */
bool replica_stale(struct cn_s3 *s, const char *b, uint32_t mn);
/* The replicas of bucket b a read may use (not stale), best first: their number (0: none
 * caught up), or -errno. */
int bucket_read_mns(struct cn_s3 *s, const char *b, uint32_t *out);
/* Mark replica mn of b stale in the cluster state before a write that missed it is
 * acknowledged. 0, or -errno (the write must not be acknowledged then). */
int mark_stale(struct cn_s3 *s, const char *b, uint32_t mn);
/* Stale marks the watch knows of now (every bucket and node). */
size_t repl_stale_count(struct cn_s3 *s);

/* ---- cn_s3_write.c / cn_s3_catalog.c ---- */

/* Every operation but QueryVectors (s3_backend.handle). */
void be_handle(void *ctx, const char *op, const char *body, size_t len, struct s3_resp *r);
/* Operation op on bucket (a user's bucket or a shard's "B#s"): read (the first caught-up
 * replica that answers) or write (every replica, write_replicas). */
void bucket_op(struct cn_s3 *s, const char *op, const char *body, size_t len,
	       const char *bucket, bool read, struct s3_resp *r);

/* ---- cn_s3_shard.c ---- */

/* The shard count of bucket b (recorded with it at its creation; cached for a second, or
 * read again when fresh): 0 with *n (1 for a bucket that does not exist), or -errno with
 * the error in r. */
int bucket_shards(struct cn_s3 *s, const char *b, bool fresh, uint32_t *n, struct s3_resp *r);
/* Run op on a bucket of several shards (and create buckets of [s3] bucket_shards): true
 * with r filled; false when the bucket has one shard (or op concerns shard 0 only, or the
 * request is invalid: bucket_op answers it as for any bucket). */
bool shard_op(struct cn_s3 *s, const char *op, const char *body, size_t len, const char *b,
	      struct s3_resp *r);
/* ListVectorBuckets merged over every MN. */
void list_buckets(struct cn_s3 *s, const char *body, size_t len, struct s3_resp *r);

/* ---- cn_s3_member.c ---- */

/* One hit of a member's partial top-k. */
struct mhit {
	float dist;
	uint64_t gid;                    /* frag * frag_rows + row: the single-store order */
	char *key;
	char *meta;                      /* JSON text or NULL */
};

int mhit_cmp(const void *a, const void *b);
/* A ScanShare sub-request (s3_backend.internal; also run locally by the ingress). */
void be_internal(void *ctx, const char *op, const char *body, size_t len,
		 struct s3_resp *r);
/* The same for requests from other CNs (test delay hook). */
void be_internal_http(void *ctx, const char *op, const char *body, size_t len,
		      struct s3_resp *r);
/* A 200 response with o's JSON (o is consumed). */
void json_resp(struct s3_resp *r, json_t *o);

/* ---- cn_s3_hclient.c ---- */

/* One sub-request in flight: a signed POST /_dmann/<op> on a non-blocking socket. */
struct hcall {
	int fd;
	struct cn_s3 *s;
	uint32_t cn;                     /* target CN */
	uint32_t share;                  /* which share it serves */
	bool hedge;
	bool reused;                     /* on a kept-alive connection from the pool */
	bool keep;                       /* done: the connection may serve the next one */
	struct dm_buf out;               /* request bytes */
	size_t sent;
	struct dm_buf in;                /* response bytes (parsed by s3_hresp.c) */
	bool done, failed;
	int status;
	const char *body;                /* into in */
	size_t blen;
};

/* Start a sub-request of internal operation op (ScanShare, CacheClear) to CN cn (connect,
 * sign, queue the bytes). false on failure. */
bool hcall_start(struct cn_s3 *s, struct hcall *h, uint32_t cn, const char *op,
		 const char *body);
/* Progress on poll events ev; sets done (and failed) when it ends. */
void hcall_io(struct hcall *h, short ev);
/* End a sub-request: its connection goes back to the pool when the answer was whole and
 * the member keeps it open, else it is closed. */
void hcall_fini(struct hcall *h);
/* Close the pool's idle connections (cn_s3_stop). */
void hpool_fini(struct cn_s3 *s);

/* ---- cn_s3_graph.c ---- */

/* The graph's candidates for q on index b/x in state st (its graph mark set), as exact
 * hits of their current rows that pass the filter, into *out (malloc'd, *nout of them;
 * free the keys and metadata); *complete tells whether they hold the top k of the rows
 * below the mark (else the exact path must serve the query). 0, 1 (no graph for this
 * index: the exact path), or -errno (the graph path failed: the exact path). */
int graph_query(struct cn_s3 *s, const char *b, const char *x, const struct ixstate *st,
		const struct s3_qspec *q, struct mhit **out, size_t *nout, bool *complete);
void graph_pool_fini(struct cn_s3 *s);

/* ---- cn_s3_gkeys.c ---- */

/* Fill the NULL entries of keys[0..n) for node ids[0..n) of graph `graph` (one copy per
 * graph number) from the key log of index b/x as state st describes it (brought up to st->gkeys entries first); ids the log does not hold
 * stay NULL. 0 or -errno (the MN's, -ENOMEM). */
int gk_keys(struct cn_s3 *s, uint32_t graph, const char *b, const char *x,
	    const struct ixstate *st, const uint64_t *ids, size_t n, char **keys);
void gk_fini(struct cn_s3 *s);

/* ---- cn_s3_index.c ---- */

/* Start the indexer thread (graph ops set, interval not 0); stop and join it. */
void indexer_start(struct cn_s3 *s);
void indexer_stop(struct cn_s3 *s);

/* ---- cn_s3_query.c ---- */

/* QueryVectors of one admitted request (s3_backend.query, on a search thread). */
void be_query(void *ctx, const char *body, size_t len, struct s3_resp *r);
/* Note a member scan's duration (the R estimate). */
void scan_time_note(struct cn_s3 *s, uint64_t ns);

#endif
