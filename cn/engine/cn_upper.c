/* cn_upper.c: online upper levels on the compute node (cn_upper.h): publishing the upper
 * nodes of online inserts to the cluster state, and the replay thread that adds every
 * published node to this compute node's views. */
#include "cn_upper.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cn_insert.h"
#include "hnsw/hnsw_upper.h"
#include "hnsw/hnsw_upq.h"

#if DM_HAVE_ETCD
#include "etcd.h"
#include "upper.h"

#define UP_WATCH_MS 1000
#define UP_BACKOFF_US 1000000

/* The published nodes of one graph generation load, in the order this node learnt them. */
struct up_grp {
	uint32_t graph;
	uint64_t gen, tag;
	uint32_t *id, *lv;
	uint32_t n, cap;
};

struct cn_upper {
	struct cn *cn;
	struct dm_etcd *e;
	pthread_t t;
	char prefix[192];
	size_t plen;
	struct up_grp *grp;
	uint32_t ngrp, capgrp;
	uint32_t epoch;              /* bumped when the follow reads everything again */
	struct cn_insert *ins;       /* READs of the published nodes' records */
	struct hnsw_upper_scratch *s;
	uint32_t s_n, s_M;
	float *vec;
	uint32_t vcap;
};

void cn_upper_publish(struct cn *cn, const struct dindex *d, const uint32_t *ids,
		      const uint32_t *lv, uint32_t n)
{
	uint32_t bad = 0;
	int rc = 0;

	if (!cn->ids_etcd || !n)
		return;
	pthread_mutex_lock(&cn->ids_mu);
	for (uint32_t i = 0; i < n; i++) {
		int r = dm_upper_put(cn->ids_etcd, cn->cfg->name, d->graph, d->gen,
				     dindex_ids_tag(d), ids[i], lv[i]);

		if (r) {
			rc = r;
			bad++;
		}
	}
	if (bad)
		dm_warn("cn%u: graph %u: %u of %u upper-level nodes not published (they stay "
			"level 0): %s (%s)", cn->node->id, d->graph, bad, n, strerror(-rc),
			dm_etcd_errmsg(cn->ids_etcd));
	pthread_mutex_unlock(&cn->ids_mu);
	atomic_fetch_add(&cn->upper_published, n - bad);
	atomic_fetch_add(&cn->upper_publish_errors, bad);
}

/* ---- the follow: published nodes into groups ------------------------------------------ */

static struct up_grp *grp_of(struct cn_upper *u, uint32_t graph, uint64_t gen, uint64_t tag,
			     bool create)
{
	for (uint32_t i = 0; i < u->ngrp; i++)
		if (u->grp[i].graph == graph && u->grp[i].gen == gen && u->grp[i].tag == tag)
			return &u->grp[i];
	if (!create)
		return NULL;
	if (u->ngrp == u->capgrp) {
		uint32_t cap = u->capgrp ? 2 * u->capgrp : 8;
		struct up_grp *g = realloc(u->grp, cap * sizeof(*g));

		if (!g)
			return NULL;
		u->grp = g;
		u->capgrp = cap;
	}
	u->grp[u->ngrp] = (struct up_grp){ .graph = graph, .gen = gen, .tag = tag };
	return &u->grp[u->ngrp++];
}

static void on_reset(void *arg)
{
	struct cn_upper *u = arg;

	for (uint32_t i = 0; i < u->ngrp; i++)
		u->grp[i].n = 0;
	u->epoch++;
}

static void on_event(void *arg, const struct dm_etcd_event *ev)
{
	struct cn_upper *u = arg;
	struct dm_upper_ent x;
	struct up_grp *g;

	if (ev->type != DM_ETCD_PUT)
		return;   /* deleted with its graph: its views are gone */
	if (dm_upper_parse(ev->kv.key, ev->kv.key_len, u->plen, ev->kv.val, ev->kv.len, &x)) {
		dm_warn("cn%u: upper levels: malformed key or value in the cluster state: %.*s",
			u->cn->node->id, (int)DM_MIN(ev->kv.key_len, 200u), ev->kv.key);
		return;
	}
	g = grp_of(u, x.graph, x.gen, x.tag, true);
	if (!g)
		return;
	if (g->n == g->cap) {
		uint32_t cap = g->cap ? 2 * g->cap : 256;
		uint32_t *a = realloc(g->id, cap * sizeof(*a)), *b;

		if (!a)
			return;
		g->id = a;
		b = realloc(g->lv, cap * sizeof(*b));
		if (!b)
			return;
		g->lv = b;
		g->cap = cap;
	}
	g->id[g->n] = x.id;
	g->lv[g->n++] = x.level;
}

/* ---- the replay: published nodes into the views ---------------------------------------- */

/* Plan node id into view d's upper levels: 0 (plan ready, vector in u->vec), 1 (pass it
 * over: not of this view's online range, known already, or its record empty), or -errno
 * (try again later). The caller holds cn->lock for reading; only this thread writes the
 * upper levels, so it reads them without d->up_lock. */
static int plan_one(struct cn_upper *u, struct dindex *d, uint32_t id, uint32_t lv,
		    struct hnsw_upper_plan *plan)
{
	struct hnsw_upper_graph g = {
		.M = d->p.M, .vdim = d->vdim, .n = d->cap, .upl = d->upl, .uvec = d->uvec,
		.kern = hnsw_kernel_for(d->p.metric), .entry = d->entry, .max_level = d->max_level,
	};
	int rc;

	if (id < d->n || id >= d->cap || d->upl[id] || d->max_level < 1)
		return 1;
	lv = DM_MIN(lv, (uint32_t)d->max_level);
	if (u->vcap < d->vdim) {
		float *v = realloc(u->vec, (size_t)d->vdim * sizeof(*v));

		if (!v)
			return -ENOMEM;
		u->vec = v;
		u->vcap = d->vdim;
	}
	if (!u->s || u->s_n != d->cap || u->s_M != d->p.M) {
		hnsw_upper_scratch_free(u->s);
		u->s = hnsw_upper_scratch_new(d->cap, d->p.M, CN_UPPER_EF);
		u->s_n = d->cap;
		u->s_M = d->p.M;
		if (!u->s)
			return -ENOMEM;
	}
	rc = cn_insert_read_stored(u->ins, d, id, u->vec);
	if (rc == -ENODATA)
		return 1;
	if (rc)
		return rc;
	rc = hnsw_upper_plan(&g, u->s, id, lv, u->vec, plan);
	return rc == -EINVAL ? 1 : rc;
}

/* Apply a plan to view d (the caller holds d->up_lock for writing). 0 or -ENOMEM. */
static int apply(struct dindex *d, const struct hnsw_upper_plan *p, const float *v)
{
	uint32_t lw = hnsw_up_list_words(d->p.M);
	size_t words = 1 + (size_t)p->level * lw;
	uint32_t *blk;

	if (d->n_extra == d->cap_extra) {
		uint32_t cap = d->cap_extra ? 2 * d->cap_extra : 256;
		void **a = realloc(d->up_extra, cap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		d->up_extra = a;
		d->cap_extra = cap;
	}
	blk = calloc(words + d->vdim, sizeof(uint32_t));
	if (!blk)
		return -ENOMEM;
	if (d->upq && hnsw_upq_add(d->upq, p->id, v)) {
		free(blk);
		return -ENOMEM;
	}
	d->up_extra[d->n_extra++] = blk;
	blk[0] = p->level;
	memcpy(blk + words, v, (size_t)d->vdim * sizeof(float));
	for (uint32_t i = 0; i < p->nlists && p->lists[i].node == p->id; i++)
		memcpy(blk + 1 + (size_t)(p->lists[i].level - 1) * lw, p->lists[i].w,
		       lw * sizeof(uint32_t));
	/* x's lists and vector first, then the lists that name it */
	d->uvec[p->id] = (const float *)(void *)(blk + words);
	d->upl[p->id] = blk + 1;
	for (uint32_t i = 0; i < p->nlists; i++)
		if (p->lists[i].node != p->id)
			memcpy(d->upl[p->lists[i].node] + (size_t)(p->lists[i].level - 1) * lw,
			       p->lists[i].w, lw * sizeof(uint32_t));
	for (uint32_t l = 1; l <= p->level; l++)
		d->at_level[l]++;
	d->up_added++;
	return 0;
}

/* Replay what graph g's current view has not seen yet, one node at a time under cn->lock
 * held for reading (the view stays; a writer waiting for the lock, a generation switch,
 * waits for one node at most): only the apply takes the view's up_lock, which readers hold
 * for one descent. 0, or -errno (stop this pass). */
static int replay_graph(struct cn_upper *u, uint32_t g)
{
	struct cn *cn = u->cn;

	while (!atomic_load(&cn->stopping)) {
		struct hnsw_upper_plan plan;
		struct dindex *d;
		struct up_grp *gr;
		uint32_t i, id;
		int rc;

		pthread_rwlock_rdlock(&cn->lock);
		d = cn->views[g].cur;
		if (d && d->up_epoch != u->epoch) {
			d->up_epoch = u->epoch;   /* only this thread reads and writes it */
			d->up_done = 0;
		}
		gr = d && d->cap > d->n ? grp_of(u, g, d->gen, dindex_ids_tag(d), false) : NULL;
		if (!gr || d->up_done >= gr->n) {
			pthread_rwlock_unlock(&cn->lock);
			return 0;
		}
		i = d->up_done;
		id = gr->id[i];
		rc = plan_one(u, d, id, gr->lv[i], &plan);
		if (rc == 0) {
			pthread_rwlock_wrlock(&d->up_lock);
			rc = apply(d, &plan, u->vec);
			pthread_rwlock_unlock(&d->up_lock);
			if (!rc)
				atomic_fetch_add(&cn->upper_added, 1);
		} else if (rc == 1) {
			rc = 0;
			atomic_fetch_add(&cn->upper_skipped, 1);
		}
		if (!rc)
			d->up_done = i + 1;
		pthread_rwlock_unlock(&cn->lock);
		if (rc) {
			dm_warn("cn%u: graph %u: upper-level node %u not added yet: %s",
				cn->node->id, g, id, strerror(-rc));
			return rc;
		}
	}
	return 0;
}

static void *upper_main(void *arg)
{
	struct cn_upper *u = arg;
	struct cn *cn = u->cn;
	int64_t from = 0;

	while (!atomic_load(&cn->stopping)) {
		int rc = dm_etcd_follow(u->e, u->prefix, &from, UP_WATCH_MS, on_reset, on_event, u);

		if (atomic_load(&cn->stopping))
			break;
		if (rc < 0) {
			if (rc != -ECANCELED)
				usleep(UP_BACKOFF_US);
			continue;
		}
		for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
			if (replay_graph(u, g))
				usleep(UP_BACKOFF_US / 10);
	}
	return NULL;
}

void cn_upper_start(struct cn *cn)
{
	struct cn_upper *u;
	int n;

	if (!cn_upper_on(cn))
		return;
	u = calloc(1, sizeof(*u));
	if (!u)
		goto err_warn;
	u->cn = cn;
	n = dm_upper_prefix(u->prefix, sizeof(u->prefix), cn->cfg->name);
	if (n < 0) {
		errno = EINVAL;
		goto err_free;
	}
	u->plen = (size_t)n;
	u->e = dm_etcd_open(cn->cfg->etcd, 5000);
	if (!u->e)
		goto err_free;
	u->ins = cn_insert_new(cn);
	if (!u->ins)
		goto err_close_etcd;
	if (pthread_create(&u->t, NULL, upper_main, u)) {
		errno = EAGAIN;
		goto err_free_ins;
	}
	cn->upper = u;
	return;

err_free_ins:
	cn_insert_free(u->ins);
err_close_etcd:
	dm_etcd_close(u->e);
err_free:
	free(u);
err_warn:
	dm_warn("cn%u: online upper levels not followed (%s): nodes inserted online stay level "
		"0 on this compute node", cn->node->id, strerror(errno));
}

void cn_upper_stop(struct cn *cn)
{
	struct cn_upper *u = cn->upper;

	if (!u)
		return;
	atomic_store(&cn->stopping, true);
	dm_etcd_abort(u->e);
	pthread_join(u->t, NULL);
	dm_etcd_close(u->e);
	cn_insert_free(u->ins);
	hnsw_upper_scratch_free(u->s);
	for (uint32_t i = 0; i < u->ngrp; i++) {
		free(u->grp[i].id);
		free(u->grp[i].lv);
	}
	free(u->grp);
	free(u->vec);
	free(u);
	cn->upper = NULL;
}
#else
void cn_upper_start(struct cn *cn)
{
	(void)cn;
}

void cn_upper_stop(struct cn *cn)
{
	(void)cn;
}

void cn_upper_publish(struct cn *cn, const struct dindex *d, const uint32_t *ids,
		      const uint32_t *lv, uint32_t n)
{
	(void)cn, (void)d, (void)ids, (void)lv, (void)n;
}
#endif
