/* cn_s3_graph.c: the graph path of QueryVectors (docs/api.md, "The graph path"). An index
 * bulk-imported with `dmann load --bucket B --name I` has its rows [0, mark) in the
 * cluster's HNSW graph (the FL_STATE graph mark names the graph generation that holds
 * them); the ingress then asks the graph for candidates through libdmann (the native
 * search: client-side routing to the compute nodes, one-sided READs of the memory nodes),
 * turns their node ids into S3 keys with the binding of its own view of the graph
 * (dindex_bind.h), fetches the candidates' current rows from the index's memory node
 * (FL_GET: a deleted key is gone, a re-put key comes back with its new vector) and ranks
 * them by their exact distance, with the filter applied to their metadata. The rows from
 * the mark on (the tail) are scanned exactly by the usual fan-out (cn_s3_query.c), and the
 * two lists are merged by key. */
#include "cn_s3_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmann.h"
#include "distance.h"
#include "s3_filter.h"

#define GPOOL_RETRY_NS 1000000000ull   /* after a failed connect, the exact path for 1 s */

void cn_s3_set_graph(struct cn_s3 *s, const struct cn_s3_graph_ops *ops, void *ctx)
{
	s->gctx = ctx;
	__atomic_store_n(&s->gops, ops, __ATOMIC_RELEASE);
	indexer_start(s);
}

/* A libdmann handle of the pool, connected as the gateways' identity to every compute
 * node (handles are serialised: one per search thread in use), or NULL. */
static dmann_t *handle_get(struct cn_s3 *s)
{
	const struct dm_cluster_cfg *cfg = s->cfg;
	const char *eps[DM_MAX_NODES];
	struct dm_client_cfg gw;
	dmann_t *h = NULL;
	uint32_t ne = 0;

	pthread_mutex_lock(&s->gmu);
	if (s->ngidle)
		h = s->gidle[--s->ngidle];
	else if (dm_now_ns() < s->gretry_at)
		h = (dmann_t *)-1;
	pthread_mutex_unlock(&s->gmu);
	if (h == (dmann_t *)-1)
		return NULL;
	if (h)
		return h;
	if (dm_config_gateway_client(cfg, &gw))
		return NULL;
	for (uint32_t i = 0; i < cfg->n_cn; i++)
		if (cfg->cn[i].address[0])
			eps[ne++] = cfg->cn[i].address;
	h = dmann_connect_endpoints(cfg->name, eps, ne, cfg->transport[0] ? cfg->transport : NULL,
				    gw.name, gw.secret, gw.secret_len);
	memset(&gw, 0, sizeof(gw));
	if (!h) {
		dm_warn("cn%u: s3: graph path: cannot connect to the compute nodes (%s); the exact "
			"path serves meanwhile", s->node->id, dmann_errmsg());
		pthread_mutex_lock(&s->gmu);
		s->gretry_at = dm_now_ns() + GPOOL_RETRY_NS;
		pthread_mutex_unlock(&s->gmu);
	}
	return h;
}

static void handle_put(struct cn_s3 *s, dmann_t *h)
{
	pthread_mutex_lock(&s->gmu);
	if (s->ngidle < DM_ARRAY_SIZE(s->gidle)) {
		s->gidle[s->ngidle++] = h;
		h = NULL;
	}
	pthread_mutex_unlock(&s->gmu);
	dmann_close(h);
}

void graph_pool_fini(struct cn_s3 *s)
{
	while (s->ngidle)
		dmann_close(s->gidle[--s->ngidle]);
	pthread_mutex_destroy(&s->gmu);
}

/* Distance of stored vector v to the query as the exact scan computes it (cn_s3_member.c):
 * L2 squared, cosine 1 - cos. */
static float exact_dist(const struct ixstate *st, const float *q, float qn, const float *v)
{
	if (st->metric == DM_METRIC_COS) {
		float vn = sqrtf(dm_dot(v, v, st->dim));
		float den = qn * vn;

		return den > 0 ? 1.0f - dm_dot(q, v, st->dim) / den : 1.0f;
	}
	return dm_l2sq(q, v, st->dim);
}

/* FL_GET of keys[0..n) on the state's memory node: the rows that exist as graph hits
 * (those that pass the filter), into out[] (room for n). 0 or -errno. */
static int fetch_rows(struct cn_s3 *s, const char *b, const char *x, const struct ixstate *st,
		      const struct s3_qspec *q, char **keys, size_t n, struct mhit *out,
		      size_t *nout)
{
	struct dm_buf w = { 0 };
	uint8_t *resp = NULL;
	size_t rlen;
	float qn = sqrtf(dm_dot(q->vec, q->vec, st->dim));
	uint32_t found;
	int rc;

	*nout = 0;
	dm_buf_str(&w, b);
	dm_buf_str(&w, x);
	dm_buf_u64(&w, (uint64_t)st->created);
	dm_buf_u32(&w, (uint32_t)n);
	for (size_t i = 0; i < n; i++)
		dm_buf_str(&w, keys[i]);
	rc = mn_call(s, st->mn, DM_OP_FL_GET, &w, &resp, &rlen);   /* frees w */
	if (rc)
		return rc;
	struct dm_rbuf rb = { .p = resp, .n = rlen };

	found = dm_rbuf_u32(&rb);
	if (rb.bad || found > n) {
		rc = -EBADMSG;
		goto out;
	}
	for (uint32_t i = 0; i < found; i++) {
		uint32_t kl, ml, fl;
		const char *k = dm_rbuf_bytes(&rb, &kl, FLAT_KEY_MAX);
		const char *m = dm_rbuf_bytes(&rb, &ml, DM_FL_MAX_STREAM);
		const uint8_t *fm = dm_rbuf_bytes(&rb, &fl, DM_FL_MAX_STREAM);
		const uint8_t *vp = dm_rbuf_get(&rb, (size_t)st->dim * sizeof(float));
		float *v;

		if (rb.bad) {
			rc = -EBADMSG;
			goto out;
		}
		if (q->filter && !s3_filter_match(q->filter, fm, fl))
			continue;
		v = malloc((size_t)st->dim * sizeof(float));
		if (!v) {
			rc = -ENOMEM;
			goto out;
		}
		memcpy(v, vp, (size_t)st->dim * sizeof(float));   /* aligned copy */
		struct mhit *h = &out[*nout];

		h->dist = exact_dist(st, q->vec, qn, v);
		free(v);
		h->gid = UINT64_MAX - *nout;         /* ties after the scan's rows */
		h->key = strndup(k, kl);
		h->meta = q->ret_meta ? strndup(m, ml) : NULL;
		if (!h->key || (q->ret_meta && !h->meta)) {
			free(h->key);
			free(h->meta);
			rc = -ENOMEM;
			goto out;
		}
		(*nout)++;
	}
	if (rb.at != rb.n)
		rc = -EBADMSG;
out:
	free(resp);
	if (rc) {
		for (size_t i = 0; i < *nout; i++) {
			free(out[i].key);
			free(out[i].meta);
		}
		*nout = 0;
	}
	return rc;
}

static int key_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sort keys[0..n) and drop repeats (two nodes of one key: a row indexed again after a
 * re-put); the new count. */
static size_t unique_keys(char **keys, size_t n)
{
	size_t m = 0;

	if (n < 2)
		return n;
	qsort(keys, n, sizeof(*keys), key_cmp);
	for (size_t i = 0; i < n; i++) {
		if (m && !strcmp(keys[m - 1], keys[i])) {
			free(keys[i]);
			keys[i] = NULL;
		} else {
			keys[m++] = keys[i];
		}
	}
	for (size_t i = m; i < n; i++)
		keys[i] = NULL;
	return m;
}

int graph_query(struct cn_s3 *s, const char *b, const char *x, const struct ixstate *st,
		const struct s3_qspec *q, struct mhit **out, size_t *nout, bool *complete)
{
	struct cn_s3_graph_info gi;
	struct dmann_search_params sp = { 0 };
	uint64_t *ids = NULL;
	char **keys = NULL;
	uint32_t cnt = 0, kg;
	struct mhit *hits = NULL;
	size_t nk = 0, nh = 0;
	dmann_t *h;
	int rc;

	*out = NULL;
	*nout = 0;
	*complete = false;
	if (!s->gops || !st->mark || st->mark < s->graph_min_rows)
		return 1;
	if (!st->mark_tag || s->gops->info(s->gctx, b, x, st->mark_tag, &gi) ||
	    gi.metric != st->metric || gi.dim != st->dim)
		return 1;               /* not bound to this index, or another generation */
	kg = (uint32_t)DM_MIN((uint64_t)q->k * (q->filter ? s->graph_widen : 2) + 10, 1024u);
	if (q->filter) {
		/* Cardinality estimate: ask the graph for enough candidates that about 2k of
		 * them pass, by the share that passes in a sample of the index's rows taken low
		 * (passed - 2 sqrt(passed): a 1,024-row sample of a 1% filter may show 2%);
		 * when that is more than the graph can give, the exact path answers at once. */
		uint32_t seen, passed;

		if (!filter_sample(s, st, b, x, q->filter, &seen, &passed) &&
		    seen >= FSAMPLE_MIN) {
			double lo = (double)passed - 2.0 * sqrt((double)passed);
			double want = lo > 0 ? ceil(2.0 * (double)q->k * seen / lo) : INFINITY;

			if (want > 1024 - 10) {
				__atomic_add_fetch(&s->graph_planned_exact, 1, __ATOMIC_RELAXED);
				return 1;
			}
			kg = (uint32_t)DM_MAX((uint64_t)want + 10, (uint64_t)q->k * 2 + 10);
		}
	}
	sp = (struct dmann_search_params){ .k = kg, .ef = DM_MAX(s->graph_ef, kg),
					   .beam = s->graph_beam, .inflight = 1,
					   .routing = DMANN_ROUTE_CLIENT, .graph = gi.graph };
	ids = malloc(kg * sizeof(*ids));
	keys = calloc(kg, sizeof(*keys));
	hits = calloc(kg, sizeof(*hits));
	if (!ids || !keys || !hits) {
		rc = -ENOMEM;
		goto out;
	}
	h = handle_get(s);
	if (!h) {
		rc = -EHOSTDOWN;
		goto out;
	}
	/* The graph's distances are not used: candidates are ranked by their current rows. */
	rc = dmann_search(h, q->vec, 1, st->dim, &sp, ids, NULL, &cnt, NULL);
	if (rc) {
		dm_warn("cn%u: s3: graph search of %s/%s failed (%s: %s); the exact path serves it",
			s->node->id, b, x, strerror(-rc), dmann_errmsg());
		dmann_close(h);
	} else {
		handle_put(s, h);
	}
	if (rc)
		goto out;
	/* Node ids to keys: the binding's for the imported nodes (our view of the same
	 * generation), the key log's for those the online indexer added; a node id neither
	 * knows (inserted, not yet handed over) is skipped: its row is in the tail. */
	rc = s->gops->keys(s->gctx, gi.graph, gi.gen, ids, cnt, keys);
	if (!rc)
		rc = gk_keys(s, gi.graph, b, x, st, ids, cnt, keys);
	for (size_t i = 0; i < cnt; i++)
		if (keys[i])
			keys[nk++] = keys[i];
	for (size_t i = nk; i < cnt; i++)
		keys[i] = NULL;
	if (rc)
		goto out;
	nk = unique_keys(keys, nk);
	rc = fetch_rows(s, b, x, st, q, keys, nk, hits, &nh);
	if (rc)
		goto out;
	/* Fewer than k candidates pass (filter, deleted keys) although the graph gave all it
	 * was asked for: rows past them may pass too, so the answer could be incomplete. */
	*complete = nh >= q->k || cnt < kg;
	*out = hits;
	*nout = nh;
	hits = NULL;
out:
	for (size_t i = 0; keys && i < nk; i++)
		free(keys[i]);
	free(keys);
	free(hits);
	free(ids);
	return rc;
}
