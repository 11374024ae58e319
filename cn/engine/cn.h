/* cn.h: the compute node process: shared state (index view, cache, counters) and the
 * worker threads that run queries against the memory nodes. */
#ifndef DM_CN_H
#define DM_CN_H

#include <pthread.h>
#include <stdatomic.h>

#include "cache.h"
#include "dindex.h"
#include "router.h"

struct cn {
	struct dm_cluster_cfg *cfg;
	const struct dm_node_cfg *node;
	struct dm_xport *x;
	struct dm_msgpool *pool;          /* receive buffers of every connection */

	/* Index view and cache; workers hold lock for reading while they use them. */
	pthread_rwlock_t lock;
	pthread_mutex_t ctl_lock;         /* the control connections (mns) */
	struct mn_set *mns;
	struct dindex *idx;
	struct dm_cache *cache;
	uint64_t cache_bytes;
	double admit_prob;
	int pin_level;                    /* records of nodes of level >= this are pinned */
	atomic_uint gen;                  /* bumped whenever idx or the MN set changes */
	atomic_bool need_refresh;         /* a worker saw a memory node fail */

	struct router *rt;                /* oracle, routing, forwarding (router.c) */
	atomic_uint qlen;                 /* local queue: queries admitted, not answered */
	atomic_ulong queries, errors;
	atomic_uint workers;
	atomic_bool stopping;
};

/* Re-read the index from the memory nodes if it changed or force is set (reconnecting to
 * the memory nodes first). Takes the write lock. 0, -ENOENT (no index), or -errno. */
int cn_refresh(struct cn *cn, bool force);

/* Thread body serving one client connection (arg: struct cn_worker_arg). */
struct cn_worker_arg {
	struct cn *cn;
	struct dm_conn *client;
	bool serve;               /* client is a memory node's SERVE connection: it brings
				   * forwarded queries (FWD_QUERY) and takes FWD_RESULTs */
	atomic_bool *alive;       /* serve: cleared when the worker exits */
};
void *cn_worker(void *arg);

#endif
