/* cn_ids.c: node ids of online inserts handed out from ranges of the cluster state
 * (common/etcd/idrange.h), on the compute node.
 *
 * With [cluster] etcd, a compute node takes CN_IDS_RANGE ids of a graph generation at a
 * time (less near the capacity: at most 1/(2 x compute nodes) of the room left) with one
 * guarded put, and hands them out to its insert threads one by one. Ids then
 * need only etcd: the id counter object (one object on one memory node, that FAAs were
 * taken from) made every online insert fail while its node was down, and a node that
 * restarted from an older snapshot would have handed ids out again. The room a compute
 * node's unused range holds when it dies (or the generation changes) is lost: at most
 * CN_IDS_RANGE - 1 ids per such event; near the capacity the ranges shrink, so that the
 * other compute nodes' unused ranges hold little of the room left. The first range of a
 * generation starts where the counter object is (seed), for a graph that took inserts before the cluster had a state,
 * or a cluster whose state was lost (a local cluster started again with a new etcd): so
 * the counter object is raised to the end of every range taken (taken; best effort: not
 * while its node is down), and the snapshots that make the inserts durable hold it. */
#include "cn.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

#if DM_HAVE_ETCD
#include "etcd.h"
#include "idrange.h"
#include "upper.h"

#define CN_IDS_RANGE 128
#define CN_IDS_TRIES 3
#define CN_IDS_TIMEOUT_MS 5000

/* etcd unreachable or slow: worth another try (and its message is etcd's). */
static bool etcd_transient(int rc)
{
	return rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -EAGAIN || rc == -EIO;
}

void cn_ids_init(struct cn *cn)
{
	pthread_mutex_init(&cn->ids_mu, NULL);
	if (!cn->cfg->etcd[0])
		return;
	cn->ids_etcd = dm_etcd_open(cn->cfg->etcd, CN_IDS_TIMEOUT_MS);
	if (!cn->ids_etcd)   /* never the counter object instead: other nodes take ranges */
		dm_warn("cn%u: no etcd handle for online insert ids (%s): online inserts fail",
			cn->node->id, strerror(errno));
}

void cn_ids_fini(struct cn *cn)
{
	dm_etcd_close(cn->ids_etcd);
	cn->ids_etcd = NULL;
	pthread_mutex_destroy(&cn->ids_mu);
}

int cn_ids_next(struct cn *cn, uint32_t g, uint64_t gen, uint64_t tag, uint64_t first,
		uint64_t cap, cn_ids_seed_fn seed, cn_ids_taken_fn taken, void *ctx,
		uint64_t *id)
{
	int rc = 0;

	if (g >= DM_MAX_GRAPHS)
		return -EINVAL;
	if (!cn->ids_etcd)
		return -ENOTCONN;
	pthread_mutex_lock(&cn->ids_mu);
	if (cn->ids[g].gen != gen || cn->ids[g].tag != tag || cn->ids[g].lo >= cn->ids[g].hi) {
		uint64_t lo, hi;

		/* a slow etcd (a loaded machine, an emulated VM) gets three tries of 5 s: a put
		 * whose answer was lost may have taken a range nobody uses, never one twice */
		for (int t = 0; t < CN_IDS_TRIES; t++) {
			if (t)
				usleep(200000u << t);
			rc = dm_idrange_take(cn->ids_etcd, cn->cfg->name, g, gen, tag, first,
					     CN_IDS_RANGE, 2 * DM_MAX(cn->cfg->n_cn, 1u), cap,
					     seed, ctx, &lo, &hi);
			if (!etcd_transient(rc))
				break;
		}
		if (!rc) {
			cn->ids[g].gen = gen;
			cn->ids[g].tag = tag;
			cn->ids[g].lo = lo;
			cn->ids[g].hi = hi;
			atomic_fetch_add(&cn->id_ranges, 1);
			if (taken)
				taken(ctx, hi);
		} else if (rc != -ENOSPC) {
			bool etcd = etcd_transient(rc) && rc != -EAGAIN;

			atomic_fetch_add(&cn->id_range_errors, 1);

			dm_warn("cn%u: graph %u: no range of ids from the cluster state: %s%s%s%s",
				cn->node->id, g, strerror(-rc), etcd ? " (" : "",
				etcd ? dm_etcd_errmsg(cn->ids_etcd) : "", etcd ? ")" : "");
		}
	}
	if (!rc)
		*id = cn->ids[g].lo++;
	pthread_mutex_unlock(&cn->ids_mu);
	return rc;
}

void cn_ids_forget(struct cn *cn, uint32_t g)
{
	int64_t n = 0;
	int rc;

	if (g >= DM_MAX_GRAPHS || !cn->ids_etcd)
		return;
	pthread_mutex_lock(&cn->ids_mu);
	cn->ids[g].lo = cn->ids[g].hi = 0;
	rc = dm_idrange_forget(cn->ids_etcd, cn->cfg->name, g, &n);
	if (rc)
		dm_warn("cn%u: graph %u: its id ranges stay in the cluster state: %s (%s)",
			cn->node->id, g, strerror(-rc), dm_etcd_errmsg(cn->ids_etcd));
	else if (n)
		dm_info("cn%u: graph %u: %lld id range key(s) deleted", cn->node->id, g,
			(long long)n);
	/* and its online upper-level nodes (cn_upper.h) */
	rc = dm_upper_forget(cn->ids_etcd, cn->cfg->name, g, &n);
	if (rc)
		dm_warn("cn%u: graph %u: its upper-level keys stay in the cluster state: %s (%s)",
			cn->node->id, g, strerror(-rc), dm_etcd_errmsg(cn->ids_etcd));
	pthread_mutex_unlock(&cn->ids_mu);
}
#else
void cn_ids_init(struct cn *cn)
{
	pthread_mutex_init(&cn->ids_mu, NULL);
}

void cn_ids_fini(struct cn *cn)
{
	pthread_mutex_destroy(&cn->ids_mu);
}

int cn_ids_next(struct cn *cn, uint32_t g, uint64_t gen, uint64_t tag, uint64_t first,
		uint64_t cap, cn_ids_seed_fn seed, cn_ids_taken_fn taken, void *ctx,
		uint64_t *id)
{
	(void)cn, (void)g, (void)gen, (void)tag, (void)first, (void)cap, (void)seed, (void)ctx;
	(void)taken, (void)id;
	return -ENOSYS;
}

void cn_ids_forget(struct cn *cn, uint32_t g)
{
	(void)cn, (void)g;
}
#endif
