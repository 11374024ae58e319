/* cn.h: the compute node process: shared state (index view, cache, counters) and the
 * worker threads that run queries against the memory nodes. */
#ifndef DM_CN_H
#define DM_CN_H

#include <pthread.h>
#include <stdatomic.h>

#include "cache.h"
#include "dindex.h"
#include "router.h"

#define CN_MAX_RETIRED 4            /* old index views kept while queries finish on them */

struct cn {
	struct dm_cluster_cfg *cfg;
	const struct dm_node_cfg *node;
	struct dm_xport *x;
	struct dm_msgpool *pool;          /* receive buffers of every connection */
	/* Native client data ops (C_CALL): one S3 Vectors operation through the gateway
	 * (cn_s3_call); NULL when the CN runs none. Set before the first worker starts. */
	char *(*s3_call)(void *ctx, const char *op, const char *body, size_t len, int *status,
			 size_t *out_len);
	void *s3_ctx;
	/* Before the controller publishes a new placement (cn_repair.c): the S3 gateway marks
	 * the bucket replicas it adds stale (cn_s3_placement_prepare). NULL: no gateway. */
	int (*s3_placement)(void *ctx, const uint64_t *old_retired, const uint64_t *new_retired);

	/* Index view and cache; workers hold lock for reading while they use them. */
	pthread_rwlock_t lock;
	pthread_mutex_t ctl_lock;         /* the control connections (mns) */
	struct mn_set *mns;
	/* Per graph number (DM_MAX_GRAPHS, wire.h): the view new queries use (cur->gen: its
	 * generation; NULL: no such graph) and older views workers still finish on. */
	struct cn_view {
		struct dindex *cur;
		struct dindex *retired[CN_MAX_RETIRED];
		bool gone;            /* ctl_lock: every memory node said it has no current
					 generation (dropped, or never loaded) */
	} views[DM_MAX_GRAPHS];
	struct dm_cache *cache;           /* holds records of views[0].cur only */
	uint64_t cache_bytes;
	uint32_t cache_rec_size;
	double admit_prob;
	bool cache_override;              /* Q_CONFIG (dmann bench) set the cache, not the file */
	int pin_level;                    /* records of nodes of level >= this are pinned */
	atomic_uint gen;                  /* bumped when the MN set changes (workers fail their
					   * queries and reconnect) */
	atomic_bool need_refresh;         /* a worker saw a memory node fail */
	/* Generations (cn_gen.c): when each memory node last took our report (send time); a
	 * worker reads from node m only while that is less than fence_ns old. */
	_Atomic uint64_t report_ns[DM_MAX_NODES];
	uint64_t fence_ns;
	atomic_ulong gen_switches;        /* generation switches served */
	atomic_ulong sq_full;             /* READ posts refused with -EAGAIN (and retried) */
	/* Read failover (cn_worker.c, cn_gen.c): per memory node an up/down epoch, odd while
	 * the node is down (no worker reads from it; cn_refresh tries to bring it back, with
	 * back-off), even while up; a view's addresses on node m are valid at one epoch
	 * (dindex.mn_epoch). */
	atomic_uint mn_epoch[DM_MAX_NODES];
	uint64_t rejoin_at[DM_MAX_NODES];  /* ctl_lock: next attempt to bring node m back */
	uint32_t rejoin_ms[DM_MAX_NODES];  /* ctl_lock: its back-off */
	atomic_ulong failovers;           /* READs reissued to another replica */
	/* Locality of the queries' READs (cn_read.c, summed when a query is answered): queries
	 * counted, their distinct memory nodes and blocks (each a sum over queries), their
	 * round trips (batches with a remote READ) and those batches' distinct memory nodes. */
	atomic_ulong loc_queries, loc_q_mns, loc_q_blocks, loc_rts, loc_rt_mns;
	atomic_ulong salvaged;            /* torn records left by a dead writer, read salvaged */
	atomic_ulong rereads;             /* record READs repeated: torn or held (queries) */
	atomic_ulong mn_downs, mn_ups;    /* memory nodes marked down / up again */
	/* The cluster state (cn_state.c): memory nodes the etcd up-set declares down
	 * (cn_refresh does not bring them back), its version, versions applied. */
	atomic_bool state_down[DM_MAX_NODES];
	atomic_bool state_cn_down[DM_MAX_NODES];        /* compute nodes it declares down */
	atomic_bool state_self_down;      /* it does not list this CN (left, or not yet in) */
	_Atomic uint64_t state_down_ns[DM_MAX_NODES];   /* when the up-set declared it down */
	_Atomic uint64_t state_up_ns[DM_MAX_NODES];     /* ... or up (0: up since the start) */
	_Atomic int64_t state_version;
	atomic_ulong state_changes;
	/* The placement (cn_state.c, cstate.h): retired memory nodes, under ctl_lock; a new
	 * one makes cn_refresh read the view again (placement_dirty). */
	uint64_t retired_mn[DM_MAX_NODES / 64];
	_Atomic int64_t placement_version;
	atomic_bool placement_dirty;
	/* Re-replication (cn_repair.c), run by the controller in office. */
	void *ctl;                        /* struct dm_ctl of this node, or NULL */
	atomic_ulong repair_blocks, repair_bytes, repair_rounds, repair_failed;
	atomic_uint repair_pending;       /* block copies the running repair still has to make */
	/* Graph replicas that missed writes (cn_hcatchup.c): a memory node that comes back
	 * after being down is marked stale for every graph with room for inserts before it
	 * serves again; reads and insert locks use its copies only when no other replica is
	 * left, until the controller caught it up. gstale[g]: bit set of memory nodes. */
	void *stale;                      /* struct dm_stalewatch, NULL: no cluster state */
	void *stale_etcd;                 /* struct dm_etcd for the marks (under stale_mu) */
	pthread_mutex_t stale_mu;
	_Atomic uint64_t gstale[DM_MAX_GRAPHS][DM_MAX_NODES / 64];
	atomic_ulong gstale_marks, hcatchups, hcatchup_records, hcatchup_errors;
	atomic_ulong write_missed[DM_MAX_NODES];   /* record WRITEs node m missed (cn_insert) */
	/* Ids of online inserts (cn_ids.c): with a cluster state, ranges taken from etcd
	 * (common/etcd/idrange.h), the one in use per graph under ids_mu. */
	void *ids_etcd;                   /* struct dm_etcd (with [cluster] etcd) */
	pthread_mutex_t ids_mu;
	struct { uint64_t gen, tag, lo, hi; } ids[DM_MAX_GRAPHS];
	atomic_ulong id_ranges, id_range_errors;
	/* online inserts (cn_insert.h): rows, back-links made and dropped, lock retries */
	atomic_ulong inserts, insert_links, insert_links_dropped, insert_lock_retries;
	atomic_ulong insert_locks_broken;  /* locks of gone holders broken (cn_insert.h) */
	atomic_ulong insert_links_forced;  /* new nodes linked from their nearest by force */
	atomic_ulong insert_links_kept;    /* pushed-out neighbours linked from the new node */
	atomic_ulong insert_rounds;        /* round trips the inserts waited for */
	/* Online upper levels (cn_upper.h): the replay thread, nodes published by this compute
	 * node (and failed to), nodes added to this node's views, nodes passed over. */
	void *upper;                      /* struct cn_upper, NULL without a cluster state */
	atomic_ulong upper_published, upper_publish_errors, upper_added, upper_skipped;

	struct router *rt;                /* oracle, routing, forwarding (router.c) */
	atomic_uint qlen;                 /* local queue: queries admitted, not answered */
	atomic_ulong queries, errors;
	atomic_uint workers;
	atomic_bool stopping;
};

/* Index generations, the compute node's part (cn_gen.c, protocol in dgen.h): report to
 * every memory node, and switch to a newer generation if one is published (or re-read the
 * view if force is set, reconnecting to the memory nodes first): new queries use the new
 * view at once, queries on the old one finish on it (its objects stay until we report the
 * new generation, which happens once no worker uses the old view). Called every refresh_ms
 * and by Q_CONFIG. Takes ctl_lock and, to switch, the write lock. 0, -ENOENT (no index),
 * or -errno. */
int cn_refresh(struct cn *cn, bool force);
/* Whether workers must not read from memory node m now (the lease, see dgen.h). */
static inline bool cn_fenced(struct cn *cn, uint32_t m, uint64_t now)
{
	uint64_t r = atomic_load_explicit(&cn->report_ns[m], memory_order_relaxed);

	return now > r && now - r > cn->fence_ns;   /* r may be newer than the caller's now */
}
/* Mark memory node m down if its epoch is still seen (the epoch a worker connected at, or
 * the current one): workers stop reading from it and cn_refresh tries to bring it back.
 * true when this call marked it. */
bool cn_mn_down(struct cn *cn, uint32_t m, unsigned seen, int why);
static inline bool cn_mn_is_down(struct cn *cn, uint32_t m)
{
	return atomic_load_explicit(&cn->mn_epoch[m], memory_order_acquire) & 1;
}
/* Whether memory node m's copies of graph g are marked stale (cn_hcatchup.c). */
static inline bool cn_graph_stale(struct cn *cn, uint32_t g, uint32_t m)
{
	return g < DM_MAX_GRAPHS && m < DM_MAX_NODES &&
	       (atomic_load_explicit(&cn->gstale[g][m / 64], memory_order_acquire) >> (m % 64) & 1);
}
/* Graph catch-up (cn_hcatchup.c): start the stale-mark watch (with [cluster] etcd); mark
 * memory node m stale for graph g before it serves again (0, or -errno: do not bring it
 * back then); refresh the bits from the watch (cn_refresh); the controller's round. */
void cn_hcatchup_init(struct cn *cn);
void cn_hcatchup_fini(struct cn *cn);
int cn_gstale_mark(struct cn *cn, uint32_t g, uint32_t m);
void cn_gstale_sync(struct cn *cn);
void cn_hcatchup_round(struct cn *cn);
/* Ids of online inserts (cn_ids.c). With [cluster] etcd they come in ranges from the
 * cluster state, so inserts need no memory node in particular (the id counter object is
 * one object on one node); without it the engine FAAs that counter. init/fini once;
 * cn_ids_on tells which. cn_ids_next: the next id of graph g's generation gen (load tag:
 * dindex_ids_tag) at or above first (the imported rows) and below cap:
 * 0, -ENOSPC (full), or -errno (etcd's, or seed's when the generation has no range yet:
 * seed gives its first id; taken is told the end of every range taken, under the lock).
 * Thread-safe (ids_mu; a range is taken under it). */
typedef int (*cn_ids_seed_fn)(void *ctx, uint64_t *base);
typedef void (*cn_ids_taken_fn)(void *ctx, uint64_t hi);
void cn_ids_init(struct cn *cn);
void cn_ids_fini(struct cn *cn);
static inline bool cn_ids_on(const struct cn *cn)
{
	return cn->cfg->etcd[0] != 0;   /* every compute node alike: never mixed with FAAs */
}
int cn_ids_next(struct cn *cn, uint32_t g, uint64_t gen, uint64_t tag, uint64_t first,
		uint64_t cap, cn_ids_seed_fn seed, cn_ids_taken_fn taken, void *ctx,
		uint64_t *id);
/* Graph g was dropped: its range keys are deleted from the cluster state and this node's
 * range forgotten (best effort: a failure is logged; the keys are small). */
void cn_ids_forget(struct cn *cn, uint32_t g);
/* The up-set callback (cn_state.c; arg: the struct cn), run by the cluster-state watch
 * (dm_upwatch_start) for every new version. */
struct dm_upset;
void cn_state_apply(void *arg, const struct dm_upset *u);
/* The placement callback (cn_state.c), run by dm_placewatch_start's watch. */
struct dm_placement;
void cn_placement_apply(void *arg, const struct dm_placement *p);
/* Re-replication (cn_repair.c): a thread that, while this node is the controller in office,
 * retires memory nodes the up-set has declared down for replace_after_s and copies their
 * blocks to the next nodes in placement order, then publishes the new placement. NULL +
 * errno. cn_repair_stop joins it. */
struct cn_repair;
struct cn_repair *cn_repair_start(struct cn *cn);
void cn_repair_stop(struct cn_repair *r);
/* Size the cache for the current view from the cluster file's [cn] cache (unless Q_CONFIG
 * overrode it) and clear it; the write lock held. 0 or -ENOMEM. */
int cn_cache_apply(struct cn *cn);

/* Thread body serving one client connection (arg: struct cn_worker_arg). */
struct cn_worker_arg {
	struct cn *cn;
	struct dm_conn *client;
	bool serve;               /* client is a memory node's SERVE connection: it brings
				   * forwarded queries (FWD_QUERY) and takes FWD_RESULTs */
	atomic_bool *alive;       /* serve: cleared when the worker exits */
};
void *cn_worker(void *arg);

/* ---- cn_call.c: native client data ops (C_CALL) ---- */
#define CN_CALL_WR (1ull << 59)   /* wr_id of an answer's SEND (Q_ROUTER) */
#define CN_CALL_ASYNC_WR (1ull << 58)   /* | answer slot: a C_CALL answer's SEND */
struct cn_call_pool;
struct cn_call {                  /* one per connection */
	uint8_t *buf;                 /* DM_C_MAX_RESP bytes, registered */
	struct dm_mr *mr;
	bool busy;                    /* the last answer's SEND has not completed */
	struct cn_call_pool *pool;    /* C_CALLs: threads and answer slots (lazily made) */
	struct dm_notify *wake;       /* woken when a call finished (NULL: the worker polls) */
};
/* Hand the C_CALL message msg[0..len) (validated on receipt; copied, so the caller reposts
 * its buffer) to the connection's call threads ([cn] call_threads of them, started on the
 * first call): the S3 operation runs there, so one connection's reads (Get*, List*,
 * QueryVectors) run concurrently (a graph-path query waits on round trips, an exact scan on
 * the CPU); calls start in arrival order and a write runs alone (after every earlier call,
 * before any later one), so the connection's writes keep their order. 0 or -ENOMEM. */
int cn_call_submit(struct cn *cn, struct cn_call *cc, const uint8_t *msg, uint32_t len);
/* Send the answers of finished calls on conn from free answer slots (signalled SENDs,
 * wr_id CN_CALL_ASYNC_WR | slot; call cn_call_sent when one completes). The worker calls it
 * every round; the answers go out in the order the calls finish (clients match them by
 * req_id). Calls submitted, not yet answered: their number (>= 0), or -errno from the
 * send (then drop the connection). */
int cn_call_flush(struct cn_call *cc, struct dm_conn *conn);
/* The SEND of answer slot `slot` completed: the slot is free again. */
void cn_call_sent(struct cn_call *cc, uint32_t slot);
/* Q_ROUTER: send the router's fixed part and oracle (router_export) from the answer buffer
 * (status -EAGAIN before the oracle exists, -ENOSYS without a router). 0 or -errno. */
int cn_call_router(struct cn *cn, struct cn_call *cc, struct dm_conn *conn, uint64_t req_id,
		   bool (*other)(void *, const struct dm_wc *), void *arg);
/* Wait for the running calls, stop the threads, free the buffers. */
void cn_call_fini(struct cn *cn, struct cn_call *cc);

#endif
