/* cn_graph.c: the compute node's side of its gateway's graph path (cn_graph.h). The
 * gateway asks the node's index view for the keys of graph node ids and, on the compute
 * nodes that run the online indexer (cn/s3/cn_s3_index.c), inserts tail rows into the
 * graph with the online insert engine (cn_insert.h) on a few threads, and makes the
 * inserted records durable before the indexer hands them over to the flat store: every
 * byte range the engines wrote is recorded, and each memory node writes just those ranges
 * into its region snapshot (FL_SNAPDELTA; it takes a full snapshot itself when its objects
 * changed since the last one), or a full snapshot when a range could not be recorded. */
#include "cn_graph.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cn_insert.h"
#include "dgen.h"
#include "fl_rpc.h"
#include "dindex.h"
#include "dindex_bind.h"
#include "cache.h"
#if DM_HAVE_ETCD
#include "cstate.h"
#endif

#define INS_CHUNK 16u                /* rows a thread takes at a time */
#define INS_MAX_THREADS 64u
#define SNAP_CONNECT_MS 2000

/* The indexer's engines: one indexer thread per process calls insert, so they are not
 * shared; created on first use, freed by cn_graph_fini. */
static struct cn_insert *engines[INS_MAX_THREADS];
/* What the engines wrote since the last snapshot (same thread). */
static struct cn_insert_range *dirty;
static size_t ndirty, capdirty;
static bool dirty_lost;

/* Move engine e's recorded ranges into the dirty list. */
static void collect(struct cn_insert *e)
{
	size_t n;
	bool lost;
	struct cn_insert_range *r = cn_insert_take_ranges(e, &n, &lost);

	dirty_lost |= lost;
	if (n && ndirty + n > capdirty) {
		size_t cap = DM_MAX(capdirty * 2, ndirty + n);
		struct cn_insert_range *nd = realloc(dirty, cap * sizeof(*nd));

		if (!nd) {
			dirty_lost = true;
			n = 0;
		} else {
			dirty = nd;
			capdirty = cap;
		}
	}
	if (n)
		memcpy(dirty + ndirty, r, n * sizeof(*r));
	ndirty += n;
	free(r);
}

static int graph_info(void *ctx, const char *bucket, const char *index, uint64_t tag,
		      struct cn_s3_graph_info *gi)
{
	struct cn *cn = ctx;
	int rc = -ENOENT;

	pthread_rwlock_rdlock(&cn->lock);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS && rc; g++) {
		const struct dindex *d = cn->views[g].cur;

		if (d && d->bind && !strcmp(d->bind->bucket, bucket) &&
		    !strcmp(d->bind->index, index) && (!tag || dm_graph_tag(g, d->gen) == tag)) {
			*gi = (struct cn_s3_graph_info){ .gen = d->gen, .graph = g,
							 .metric = (uint32_t)d->p.metric,
							 .dim = d->p.dim };
			rc = 0;
		}
	}
	pthread_rwlock_unlock(&cn->lock);
	return rc;
}

static int graph_keys(void *ctx, uint32_t graph, uint64_t gen, const uint64_t *ids, size_t n,
		      char **keys)
{
	struct cn *cn = ctx;
	int rc = 0;

	memset(keys, 0, n * sizeof(*keys));
	if (graph >= DM_MAX_GRAPHS)
		return -EINVAL;
	pthread_rwlock_rdlock(&cn->lock);
	const struct dindex *d = cn->views[graph].cur;

	if (!d || !d->bind || d->gen != gen)
		rc = -ESTALE;
	for (size_t i = 0; !rc && i < n; i++) {
		uint32_t kl;
		const char *k = dindex_bind_key(d->bind, ids[i], &kl);

		if (k && !(keys[i] = strndup(k, kl)))
			rc = -ENOMEM;
	}
	pthread_rwlock_unlock(&cn->lock);
	if (rc == -ENOMEM)
		for (size_t i = 0; i < n; i++) {
			free(keys[i]);
			keys[i] = NULL;
		}
	return rc;
}

static int graph_bound(void *ctx, uint32_t graph, char *bucket, char *index, uint64_t *gen)
{
	struct cn *cn = ctx;
	int rc = -ENOENT;

	if (graph >= DM_MAX_GRAPHS)
		return -EINVAL;
	pthread_rwlock_rdlock(&cn->lock);
	const struct dindex *d = cn->views[graph].cur;

	if (d && d->bind) {
		snprintf(bucket, DINDEX_BIND_NAME_MAX + 1, "%s", d->bind->bucket);
		snprintf(index, DINDEX_BIND_NAME_MAX + 1, "%s", d->bind->index);
		*gen = d->gen;
		rc = 0;
	}
	pthread_rwlock_unlock(&cn->lock);
	return rc;
}

static uint32_t graph_indexers(void *ctx, uint32_t *cns)
{
	struct cn *cn = ctx;
	const struct dm_cluster_cfg *cfg = cn->cfg;
	uint32_t n = 0;

	for (uint32_t c = 0; c < cfg->n_cn && c < DM_MAX_NODES; c++) {
		bool down;

		if (!cfg->cn[c].http[0])
			continue;       /* no gateway there: it runs no indexer */
		down = c == cn->node->id ? atomic_load(&cn->state_self_down) :
					  atomic_load(&cn->state_cn_down[c]);
		if (!down)
			cns[n++] = c;
	}
	return n;
}

struct ins_job {
	struct cn *cn;
	uint32_t graph;
	uint64_t gen;
	const float *v;
	uint32_t n, dim, ef;
	uint64_t *ids;
	atomic_uint next, done;
	atomic_int err;
};

struct ins_arg {
	struct ins_job *j;
	struct cn_insert *e;
	pthread_t t;
};

static void *ins_main(void *arg)
{
	struct ins_arg *a = arg;
	struct ins_job *j = a->j;
	struct cn *cn = j->cn;

	for (;;) {
		uint32_t i = atomic_fetch_add(&j->next, INS_CHUNK), cnt;
		struct cn_insert_stats st = { 0 };
		int rc;

		if (i >= j->n || atomic_load(&j->err))
			break;
		cnt = DM_MIN(INS_CHUNK, j->n - i);
		pthread_rwlock_rdlock(&cn->lock);
		struct dindex *d = cn->views[j->graph].cur;

		rc = d && d->gen == j->gen ?
		     cn_insert_run(a->e, d, j->v + (size_t)i * j->dim, cnt, j->dim, j->ef, j->ids + i,
				   &st) : -ESTALE;
		pthread_rwlock_unlock(&cn->lock);
		cn_insert_count(cn, &st);
		atomic_fetch_add(&j->done, (unsigned)st.inserted);
		for (uint64_t k = st.inserted; k < cnt; k++)
			j->ids[i + k] = UINT64_MAX;
		if (st.inserted < cnt) {
			int err = rc < 0 ? rc : st.err ? st.err : -EIO;
			int zero = 0;

			if (atomic_compare_exchange_strong(&j->err, &zero, err))
				dm_warn("cn%u: graph %u: an online insert failed: %s%s%s", cn->node->id,
					j->graph, strerror(-err), st.err_at[0] ? ": " : "", st.err_at);
			break;
		}
	}
	return NULL;
}

static int graph_insert(void *ctx, uint32_t graph, uint64_t gen, const float *vecs, uint32_t n,
			uint32_t dim, uint32_t ef, uint32_t nthreads, uint64_t *ids)
{
	struct cn *cn = ctx;
	struct ins_arg a[INS_MAX_THREADS];
	struct ins_job j = { .cn = cn, .graph = graph, .gen = gen, .v = vecs, .n = n, .dim = dim,
			     .ef = ef, .ids = ids };
	uint32_t nt = 0;

	if (graph >= DM_MAX_GRAPHS)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		ids[i] = UINT64_MAX;
	nthreads = DM_MAX(1u, DM_MIN(nthreads, INS_MAX_THREADS));
	nthreads = DM_MIN(nthreads, (n + INS_CHUNK - 1) / INS_CHUNK);
	for (uint32_t t = 0; t < nthreads; t++) {
		if (!engines[t] && !(engines[t] = cn_insert_new(cn)))
			break;
		cn_insert_track(engines[t], true);
		a[nt] = (struct ins_arg){ .j = &j, .e = engines[t] };
		if (pthread_create(&a[nt].t, NULL, ins_main, &a[nt]))
			break;
		nt++;
	}
	if (!nt && n)
		return -ENOMEM;
	for (uint32_t t = 0; t < nt; t++) {
		pthread_join(a[t].t, NULL);
		collect(a[t].e);
	}
	if (atomic_load(&j.done))
		return (int)atomic_load(&j.done);
	return n ? atomic_load(&j.err) : 0;
}

static int range_cmp(const void *a, const void *b)
{
	const struct cn_insert_range *x = a, *y = b;

	if (x->mn != y->mn)
		return x->mn < y->mn ? -1 : 1;
	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The dirty ranges r[0..n) (sorted) of memory node i, merged, as one FL_SNAPDELTA; a node
 * that refuses it takes a full snapshot. */
static int snap_one(const struct cn *cn, struct mn_set *s, uint32_t i,
		    const struct cn_insert_range *r, size_t n)
{
	struct dm_buf w = { 0 };
	uint8_t *resp = NULL;
	size_t rlen, cnt = 0, at;
	uint64_t ms = 30000 + s->link[i].info.region_len / (50ull << 10);
	int rc;

	dm_buf_u32(&w, 0);
	for (size_t k = 0; k < n; k = at) {
		uint64_t lo = r[k].addr, hi = r[k].addr + r[k].len;

		/* overlapping only: touching ranges may belong to two objects */
		for (at = k + 1; at < n && r[at].addr < hi; at++)
			hi = DM_MAX(hi, r[at].addr + r[at].len);
		while (lo < hi) {       /* ranges are u32 long */
			uint32_t len = (uint32_t)DM_MIN(hi - lo, (uint64_t)1 << 30);

			dm_buf_u64(&w, lo);
			dm_buf_u32(&w, len);
			lo += len;
			cnt++;
		}
	}
	if (w.oom || cnt > DM_FL_SNAPDELTA_MAX) {
		dm_buf_free(&w);
		return dm_rpc_call(&s->link[i].ch, DM_OP_CTL_SNAPSHOT, NULL, 0, NULL, 0, NULL);
	}
	dm_put_le32(w.p, (uint32_t)cnt);
	rc = dm_fl_call(&s->link[i].ch, DM_OP_FL_SNAPDELTA, w.p, w.n, DM_FL_MIN_MSG,
			(int)DM_MIN(ms, 3600000ull), &resp, &rlen);
	dm_buf_free(&w);
	free(resp);
	if (rc == -EINVAL || rc == -EPROTO || rc == -ENOSYS) {
		dm_warn("cn%u: memory node %u refused a snapshot delta (%s): full snapshot",
			cn->node->id, i, strerror(-rc));
		rc = dm_rpc_call(&s->link[i].ch, DM_OP_CTL_SNAPSHOT, NULL, 0, NULL, 0, NULL);
	}
	return rc;
}

static int graph_snapshot(void *ctx)
{
	struct cn *cn = ctx;
	struct mn_set *s = mn_set_open(cn->cfg, cn->x, cn->pool, false, SNAP_CONNECT_MS);
	int rc = 0;

	if (!s)
		return -errno;
	if (dirty_lost) {
		rc = mn_set_snapshot(s);
	} else {
		qsort(dirty, ndirty, sizeof(*dirty), range_cmp);
		for (size_t k = 0, at; k < ndirty; k = at) {
			uint32_t m = dirty[k].mn;

			for (at = k + 1; at < ndirty && dirty[at].mn == m; at++)
				;
			/* A node down now took none of these WRITEs since it went down; what it
			 * took before comes back only with a full copy (as with mn_set_snapshot). */
			if (m >= s->n || !s->link[m].up)
				continue;
			int r = snap_one(cn, s, m, dirty + k, at - k);

			if (r && !rc)
				rc = r;
		}
	}
	mn_set_close(s);
	if (!rc) {
		ndirty = 0;
		dirty_lost = false;
	}
	return rc;
}

static void graph_cache_clear(void *ctx)
{
	struct cn *cn = ctx;

	pthread_rwlock_rdlock(&cn->lock);
	if (cn->cache)
		dm_cache_clear(cn->cache);
	pthread_rwlock_unlock(&cn->lock);
}

/* Connections of the indexer's own to every memory node, under the current placement
 * (not cn->mns: a drop may wait up to the lease, and cn_refresh must go on reporting
 * meanwhile). NULL + errno. */
static struct mn_set *own_set(struct cn *cn)
{
	struct mn_set *s = mn_set_open(cn->cfg, cn->x, cn->pool, false, SNAP_CONNECT_MS);

	if (s) {
		pthread_mutex_lock(&cn->ctl_lock);
		memcpy(s->retired, cn->retired_mn, sizeof(s->retired));
		pthread_mutex_unlock(&cn->ctl_lock);
	}
	return s;
}

static int graph_drop(void *ctx, uint32_t graph)
{
	struct cn *cn = ctx;
	struct mn_set *s;
	char err[512] = "";
	int rc;

	if (graph >= DM_MAX_GRAPHS)
		return -EINVAL;
	s = own_set(cn);
	rc = s ? dindex_drop_graph(s, graph, err, sizeof(err)) : -errno;
	mn_set_close(s);
	if (!rc)
		cn_ids_forget(cn, graph);
	if (rc && rc != -ENOENT)
		dm_warn("cn%u: dropping graph %u: %s", cn->node->id, graph,
			err[0] ? err : strerror(-rc));
	return rc == -ENOENT ? 0 : rc;
}

static int graph_seed(void *ctx, const char *bucket, const char *index, uint32_t metric,
		      uint32_t dim, const float *vecs, char *const *keys, uint32_t n, uint32_t room,
		      uint32_t ef, uint32_t nthreads, uint32_t *graph, uint64_t *gen)
{
	struct cn *cn = ctx;
	struct hnsw_params hp = { .dim = dim, .metric = (enum dm_metric)metric, .M = 16,
				  .ef_construction = ef, .seed = 42,
				  .block_shift = HNSW_DEFAULT_BLOCK_SHIFT,
				  .codes = HNSW_CODES_RABITQ };
	struct dindex_bind_in bind = { .bucket = bucket, .index = index,
				       .keys = (const char *const *)keys, .n = n };
	struct hnsw_index *idx;
	struct dgen_graphs gl;
	struct mn_set *s;
	char err[512];
	uint32_t g;
	int rc;

	idx = hnsw_build(&hp, vecs, n, DM_MAX(1u, nthreads), NULL, NULL, err, sizeof(err));
	if (!idx) {
		rc = -errno;
		dm_warn("cn%u: seeding a graph for %s/%s: %s", cn->node->id, bucket, index, err);
		return rc ? rc : -EINVAL;
	}
	s = own_set(cn);
	if (!s) {
		rc = -errno;
		goto out_free;
	}
	rc = dgen_list(s, &gl);
	if (rc)
		goto out_close;
	g = dgen_free_graph(&gl);
	if (g == DM_MAX_GRAPHS) {
		dm_warn("cn%u: no graph for %s/%s: all %u graph numbers are in use (dmann graph "
			"list)", cn->node->id, bucket, index, DM_MAX_GRAPHS);
		rc = -ENOSPC;
		goto out_close;
	}
	room = (uint32_t)DM_MIN((uint64_t)room, (uint64_t)DINDEX_MAX_CAP - n);
	rc = dindex_load(s, g, idx, room, 1, &bind, gen, NULL, NULL, err, sizeof(err));
	if (rc) {
		dm_warn("cn%u: placing the graph of %s/%s: %s", cn->node->id, bucket, index, err);
		goto out_close;
	}
	*graph = g;
	dirty_lost = true;   /* the next graph_snapshot takes full snapshots: new objects */
out_close:
	mn_set_close(s);
out_free:
	hnsw_free(idx);
	return rc;
}

static bool graph_leader(void *ctx)
{
#if DM_HAVE_ETCD
	struct cn *cn = ctx;

	return cn->ctl && dm_ctl_leader(cn->ctl);
#else
	(void)ctx;
	return false;
#endif
}

static bool graph_mn_down(void *ctx, uint32_t mn)
{
	struct cn *cn = ctx;

	return mn < DM_MAX_NODES && atomic_load(&cn->state_down[mn]);
}

static int64_t graph_placement(void *ctx, uint64_t *retired)
{
	struct cn *cn = ctx;
	int64_t v;

	if (!retired)
		return atomic_load(&cn->placement_version);
	pthread_mutex_lock(&cn->ctl_lock);
	v = atomic_load(&cn->placement_version);
	memcpy(retired, cn->retired_mn, sizeof(cn->retired_mn));
	pthread_mutex_unlock(&cn->ctl_lock);
	return v;
}

const struct cn_s3_graph_ops cn_graph_ops = {
	.info = graph_info, .keys = graph_keys, .bound = graph_bound, .indexers = graph_indexers,
	.insert = graph_insert, .snapshot = graph_snapshot, .cache_clear = graph_cache_clear,
	.drop = graph_drop, .seed = graph_seed, .leader = graph_leader, .mn_down = graph_mn_down,
	.placement = graph_placement,
};

void cn_graph_fini(struct cn *cn)
{
	(void)cn;
	for (uint32_t t = 0; t < INS_MAX_THREADS; t++) {
		cn_insert_free(engines[t]);
		engines[t] = NULL;
	}
	free(dirty);
	dirty = NULL;
	ndirty = capdirty = 0;
}
