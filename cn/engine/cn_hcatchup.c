/* cn_hcatchup.c: HNSW graph replicas that missed writes, on the compute node: the graph
 * side of "catch-up of a stale replica" (docs/architecture.md).
 *
 * Online inserts WRITE every replica of a block whose memory node is up; a node that is
 * down (or restarts from its last region snapshot) misses those writes. So a compute node
 * that brings a memory node m back after it was down (cn_gen.c rejoin_one) first marks it
 * stale for every graph that takes inserts (room past its rows) and has a block on m: the
 * mark "#g<graph>" / m in the cluster state (common/etcd/stale.h, the same keys as bucket
 * replicas); no mark, no rejoin. While the mark exists, reads and insert locks use m's
 * copies only when no other replica of the block is up (cn_read.c pick, cn_insert.c
 * replica_r); inserts still WRITE them.
 *
 * The controller catches (graph g, node m) up once m is up: on connections of its own, for
 * every block of g's current generation that m holds, both copies are READ and every record
 * at rest on a caught-up replica that differs on m is written to m, pass after pass until
 * a pass writes nothing (dindex_sync_block: an insert that changes a record meanwhile
 * writes m too, and a difference left by the race shows in the next pass); then m
 * snapshots its region, and the mark is deleted guarded by the revision it had when the
 * catch-up started (a compute node that marked it again meanwhile keeps it). */
#include "cn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "dgen.h"

#if DM_HAVE_ETCD
#include "etcd.h"
#include "stale.h"

#define HC_SETTLE_S 2                 /* a mark this old (a rejoin is under way otherwise) */
#define HC_PASSES 8
#define HC_LIST_MAX 256

static bool graph_of(const char *name, uint32_t *g)
{
	char *end;
	unsigned long v;

	if (name[0] != '#' || name[1] != 'g' || !name[2])
		return false;
	v = strtoul(name + 2, &end, 10);
	if (*end || v >= DM_MAX_GRAPHS)
		return false;
	*g = (uint32_t)v;
	return true;
}

void cn_hcatchup_init(struct cn *cn)
{
	pthread_mutex_init(&cn->stale_mu, NULL);
	if (!cn->cfg->etcd[0])
		return;
	cn->stale = dm_stalewatch_start(cn->cfg);
	if (!cn->stale) {
		dm_warn("cn%u: not following stale graph replicas (%s): a memory node that comes "
			"back serves at once", cn->node->id, strerror(errno));
		return;
	}
	cn->stale_etcd = dm_etcd_open(cn->cfg->etcd, 2000);
}

void cn_hcatchup_fini(struct cn *cn)
{
	dm_stalewatch_stop(cn->stale);
	cn->stale = NULL;
	dm_etcd_close(cn->stale_etcd);
	cn->stale_etcd = NULL;
	pthread_mutex_destroy(&cn->stale_mu);
}

int cn_gstale_mark(struct cn *cn, uint32_t g, uint32_t m)
{
	char name[16], by[16];
	int rc;

	if (!cn->stale || g >= DM_MAX_GRAPHS || m >= DM_MAX_NODES)
		return 0;   /* no cluster state: nothing to mark it in (the node serves at once) */
	snprintf(name, sizeof(name), "#g%u", g);
	snprintf(by, sizeof(by), "cn%u", cn->node->id);
	pthread_mutex_lock(&cn->stale_mu);
	rc = cn->stale_etcd ? dm_stale_put(cn->stale_etcd, cn->cfg->name, name, m, by) : -ENOTCONN;
	if (rc)
		dm_warn("cn%u: cannot mark mn%u stale for graph %u (%s): it is not brought back yet",
			cn->node->id, m, g, cn->stale_etcd ? dm_etcd_errmsg(cn->stale_etcd) :
			"no etcd handle");
	pthread_mutex_unlock(&cn->stale_mu);
	if (rc)
		return rc;
	dm_stalewatch_note(cn->stale, name, m);
	atomic_fetch_or(&cn->gstale[g][m / 64], 1ull << (m % 64));
	atomic_fetch_add(&cn->gstale_marks, 1);
	return 0;
}

void cn_gstale_sync(struct cn *cn)
{
	uint64_t bits[DM_MAX_GRAPHS][DM_MAX_NODES / 64] = { { 0 } };
	struct dm_stale *st;
	size_t n;

	if (!cn->stale || !dm_stalewatch_synced(cn->stale))
		return;
	st = malloc(HC_LIST_MAX * sizeof(*st));
	if (!st)
		return;
	n = DM_MIN(dm_stalewatch_list(cn->stale, st, HC_LIST_MAX), (size_t)HC_LIST_MAX);
	for (size_t i = 0; i < n; i++) {
		uint32_t g;

		if (graph_of(st[i].bucket, &g) && st[i].mn < DM_MAX_NODES)
			bits[g][st[i].mn / 64] |= 1ull << (st[i].mn % 64);
	}
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
		for (uint32_t w = 0; w < DM_MAX_NODES / 64; w++)
			atomic_store(&cn->gstale[g][w], bits[g][w]);
	free(st);
}

/* Catch graph g up on memory node m (views over s): 0 or -errno; *recs records written. */
static int catch_up(struct cn *cn, struct mn_set *s, uint32_t g, uint64_t gen, uint32_t m,
		    uint64_t *recs)
{
	struct dindex *d = NULL;
	char err[256];
	int rc = dindex_open(s, g, gen, &d, err, sizeof(err));

	*recs = 0;
	if (rc)
		return rc;
	for (uint32_t b = 0; b < d->nblocks && !rc; b++) {
		uint32_t src = UINT32_MAX, w = 0;
		bool holds = false;

		for (uint32_t j = 0; j < d->nrep; j++) {
			uint32_t r = d->block_mn[(size_t)b * d->nrep + j];

			if (r == DINDEX_NO_MN)
				continue;
			if (r == m)
				holds = true;
			else if (src == UINT32_MAX && s->link[r].up && !atomic_load(&cn->state_down[r]) &&
				 !cn_graph_stale(cn, g, r))
				src = r;
		}
		if (!holds)
			continue;
		if (src == UINT32_MAX) {
			rc = -EHOSTUNREACH;   /* no caught-up replica of this block is up */
			break;
		}
		rc = dindex_sync_block(s, d, b, src, m, HC_PASSES, &w);
		*recs += w;
	}
	dindex_free(d);
	return rc;
}

void cn_hcatchup_round(struct cn *cn)
{
	static _Thread_local uint64_t retry_at[DM_MAX_GRAPHS][DM_MAX_NODES];
	struct dm_stale *st;
	struct mn_set *s = NULL;
	struct dgen_graphs gl = { 0 };
	time_t now = time(NULL);
	size_t n;

	if (!cn->stale || !cn->stale_etcd)
		return;
	st = malloc(HC_LIST_MAX * sizeof(*st));
	n = st ? DM_MIN(dm_stalewatch_list(cn->stale, st, HC_LIST_MAX), (size_t)HC_LIST_MAX) : 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t g, m = st[i].mn;
		uint64_t t0 = dm_now_ns(), recs = 0;
		bool cleared = false;
		int rc;

		if (!graph_of(st[i].bucket, &g) || st[i].mod_revision <= 0 || m >= cn->cfg->n_mn ||
		    now - st[i].since < HC_SETTLE_S || dm_now_ns() < retry_at[g][m] ||
		    atomic_load(&cn->state_down[m]) || cn_mn_is_down(cn, m))
			continue;
		if (!s) {
			s = mn_set_open(cn->cfg, cn->x, cn->pool, false, 2000);
			if (!s)
				break;
			pthread_mutex_lock(&cn->ctl_lock);
			memcpy(s->retired, cn->retired_mn, sizeof(s->retired));
			pthread_mutex_unlock(&cn->ctl_lock);
			dgen_list(s, &gl);
		}
		if (!(gl.mask >> g & 1)) {
			rc = 0;          /* the graph is gone: nothing to catch up */
		} else {
			rc = s->link[m].up ? 0 : mn_link_open(s, m, 2000);
			if (!rc)
				rc = catch_up(cn, s, g, gl.current[g], m, &recs);
			if (!rc)
				rc = mn_link_snapshot(s, m);
		}
		if (!rc) {
			pthread_mutex_lock(&cn->stale_mu);
			rc = dm_stale_clear(cn->stale_etcd, cn->cfg->name, &st[i], &cleared);
			pthread_mutex_unlock(&cn->stale_mu);
		}
		if (rc) {
			atomic_fetch_add(&cn->hcatchup_errors, 1);
			retry_at[g][m] = dm_now_ns() + 3000000000ull;
			dm_warn("cn%u: catch-up of graph %u on mn%u failed: %s; again in 3 s",
				cn->node->id, g, m, strerror(-rc));
			continue;
		}
		atomic_fetch_add(&cn->hcatchup_records, recs);
		if (!cleared) {
			dm_info("cn%u: graph %u caught up on mn%u (%llu records), but it was marked "
				"again meanwhile: again", cn->node->id, g, m, (unsigned long long)recs);
			continue;
		}
		atomic_fetch_add(&cn->hcatchups, 1);
		dm_info("cn%u: graph %u caught up on mn%u: %llu records written in %.2f s",
			cn->node->id, g, m, (unsigned long long)recs,
			(double)(dm_now_ns() - t0) / 1e9);
	}
	mn_set_close(s);
	free(st);
}

#else /* !DM_HAVE_ETCD: no marks; a node that comes back serves at once */

void cn_hcatchup_init(struct cn *cn)
{
	pthread_mutex_init(&cn->stale_mu, NULL);
}
void cn_hcatchup_fini(struct cn *cn)
{
	pthread_mutex_destroy(&cn->stale_mu);
}
int cn_gstale_mark(struct cn *cn, uint32_t g, uint32_t m)
{
	(void)cn, (void)g, (void)m;
	return 0;
}
void cn_gstale_sync(struct cn *cn)
{
	(void)cn;
}
void cn_hcatchup_round(struct cn *cn)
{
	(void)cn;
}
#endif
