/* hnsw_search.c: K-NN-SEARCH (Algorithm 5 of Malkov & Yashunin): greedy descent through the
 * upper levels, then SEARCH-LAYER on level 0: with neighbour codes the pool search of
 * hnsw_l0.h (one record read per expanded node), without codes Algorithm 2 with ef
 * candidates and exact scores of every neighbour.
 *
 * Records are read only through hnsw_get() on a struct hnsw_src, and every expansion is
 * structured as collect -> fetch -> score: the unvisited neighbour ids of the expanded node
 * are collected first, handed to src->fetch as one batch (a remote source posts all their
 * READs with one doorbell; the local source only prefetches), and scored afterwards. The
 * same code therefore serves a local index and the compute node's remote reader. */
#include "hnsw_l0.h"
#include "hnsw_upq.h"

#include <stdlib.h>

/* Records of the next expansions prefetched whole (local search with codes). */
#ifndef HNSW_L0_PF
#define HNSW_L0_PF 2u
#endif

struct hnsw_searcher {
	struct hnsw_visited vis;
	struct hnsw_heap cand;      /* min-heap */
	struct hnsw_heap res;       /* max-heap, at most ef */
	uint32_t *batch;
	uint32_t batch_cap;
	float *qbuf;                /* normalised query (cos) */
	float *qrot;                /* rotated query (codes) */
	float *upaux;               /* the query prepared for the SQ8 upper-level descent */
	uint32_t qdim, qrot_cap, upaux_cap;
	enum dm_metric kmetric;
	hnsw_kernel_fn kern;
	struct hnsw_l0 l0;          /* level-0 search with codes */
	struct hnsw_upbeam up;      /* level-1 search on SQ8 codes, and level 0's seeds */
};

/* ---- level-0 pool search state (hnsw_l0.h) ----------------------------------------------- */

int hnsw_l0_init(struct hnsw_l0 *l)
{
	memset(l, 0, sizeof(*l));
	return hnsw_heap_init(&l->res, 16);
}

void hnsw_l0_fini(struct hnsw_l0 *l)
{
	free(l->pool);
	free(l->est);
	free(l->lb);
	hnsw_heap_fini(&l->res);
	hnsw_qest_free(l->qe);
	memset(l, 0, sizeof(*l));
}

int hnsw_l0_start(struct hnsw_l0 *l, const struct hnsw_src *src, hnsw_kernel_fn kern,
		  const float *q, uint32_t k, uint32_t ef, uint32_t ep, float epd)
{
	if (ef > l->cap || !l->pool) {
		struct hnsw_pent *p = realloc(l->pool, (size_t)DM_MAX(ef, 16u) * sizeof(*p));
		if (!p)
			return -ENOMEM;
		l->pool = p;
	}
	if (2 * src->M > l->est_cap) {
		float *e = realloc(l->est, (size_t)2 * src->M * sizeof(*e));
		if (e)
			l->est = e;
		float *b = realloc(l->lb, (size_t)2 * src->M * sizeof(*b));
		if (b)
			l->lb = b;
		if (!e || !b)
			return -ENOMEM;
		l->est_cap = 2 * src->M;
	}
	if (!hnsw_qest_fits(l->qe, src->quant, src->M)) {
		hnsw_qest_free(l->qe);
		l->qe = hnsw_qest_new(src->quant, src->M);
		if (!l->qe)
			return -ENOMEM;
	}
	if (hnsw_heap_reserve(&l->res, k + 1) < 0)
		return -ENOMEM;
	l->cap = ef;
	l->np = l->first = 0;
	l->res.n = 0;
	l->k = k;
	l->q = q;
	hnsw_qest_query(l->qe, q);
	l->kern = kern;
	l->vdim = src->vdim;
	l->vec_off = src->vec_off;
	l->M = src->M;
	l->n = src->n;
	l->hops = l->dist_evals = l->est_evals = 0;
	hnsw_l0_pool_insert(l, epd, ep, 0);
	return 0;
}

struct hnsw_searcher *hnsw_searcher_new(uint32_t nodes, uint32_t dim)
{
	struct hnsw_searcher *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	if (hnsw_visited_init(&s->vis, nodes) < 0 || hnsw_heap_init(&s->cand, 256) < 0 ||
	    hnsw_heap_init(&s->res, 256) < 0)
		goto err_free;
	s->batch_cap = 64;
	s->batch = malloc(s->batch_cap * sizeof(*s->batch));
	s->qdim = dim ? dim : 1;
	s->qbuf = malloc((size_t)s->qdim * sizeof(*s->qbuf));
	if (!s->batch || !s->qbuf || hnsw_l0_init(&s->l0) < 0 || hnsw_upbeam_init(&s->up) < 0)
		goto err_free;
	s->kmetric = DM_METRIC_L2;
	s->kern = hnsw_kernel_for(DM_METRIC_L2);
	return s;

err_free:
	hnsw_searcher_free(s);
	errno = ENOMEM;
	return NULL;
}

void hnsw_searcher_free(struct hnsw_searcher *s)
{
	if (!s)
		return;
	hnsw_visited_fini(&s->vis);
	hnsw_heap_fini(&s->cand);
	hnsw_heap_fini(&s->res);
	free(s->batch);
	free(s->qbuf);
	free(s->qrot);
	free(s->upaux);
	hnsw_l0_fini(&s->l0);
	hnsw_upbeam_fini(&s->up);
	free(s);
}

void hnsw_src_local(const struct hnsw_index *idx, struct hnsw_src *src)
{
	memset(src, 0, sizeof(*src));
	src->dim = idx->p.dim;
	src->M = idx->p.M;
	src->rec_size = idx->rec_size;
	src->vec_off = idx->vec_off;
	src->vdim = idx->vdim;
	src->quant = idx->quant;
	src->block_shift = idx->p.block_shift;
	src->n = idx->n;
	src->metric = idx->p.metric;
	src->blocks = idx->blocks;
	src->upl = idx->upl;
	src->upq = idx->quant ? idx->upq : NULL;
	src->entry = idx->entry;
	src->max_level = idx->max_level;
	src->ef_upper = HNSW_EF_UPPER_DEFAULT;
}

/* Prefetch the whole vector of a local record (one of the next to score). */
static inline void prefetch_vec(struct hnsw_src *src, uint32_t id)
{
	hnsw_prefetch_vec(hnsw_rec_vec(hnsw_get(src, id), src->vec_off), src->vdim);
}

/* Make a batch of records readable: prefetch locally, one READ batch remotely. */
static inline int fetch_batch(struct hnsw_src *src, const uint32_t *ids, uint32_t n)
{
	if (dm_likely(src->blocks != NULL)) {
		uint32_t voff = src->vec_off;
		for (uint32_t j = 0; j < n; j++) {
			const char *r = (const char *)hnsw_get(src, ids[j]);
			__builtin_prefetch(r + voff);
		}
		return 0;
	}
	return n ? src->fetch(src, ids, n) : 0;
}

/* Greedy descent on upper level l (ef = 1), reading lists from the local upper area. */
static int greedy_upper(struct hnsw_src *src, struct hnsw_searcher *s, const float *q,
			uint32_t l, uint32_t *cur, float *curd)
{
	uint32_t M = src->M, dim = src->vdim;
	bool changed = true;
	while (changed) {
		changed = false;
		const uint32_t *w = src->upl[*cur] + (size_t)(l - 1) * hnsw_up_list_words(M);
		uint32_t n = DM_MIN(w[0], M);
		/* w stays valid across fetches: the upper area is local and immutable here. */
		int rc = fetch_batch(src, w + 1, n);
		if (rc < 0)
			return rc;
		src->hops++;
		uint32_t best = *cur;
		for (uint32_t j = 0; j < n; j++) {
			const struct hnsw_rec_hdr *r = hnsw_get(src, w[1 + j]);
			if (dm_unlikely(!r))
				return -EIO;
			float d = s->kern(q, hnsw_rec_vec(r, src->vec_off), dim);
			src->dist_evals++;
			if (d < *curd) {
				*curd = d;
				best = w[1 + j];
				changed = true;
			}
		}
		*cur = best;
	}
	return 0;
}

/* Algorithm 2 on level 0 with ef; results left in the max-heap s->res. */
static int search_level0(struct hnsw_src *src, struct hnsw_searcher *s, const float *q,
			 uint32_t ep, float epd, uint32_t ef)
{
	uint32_t M = src->M, dim = src->vdim, n = src->n, voff = src->vec_off;
	struct hnsw_heap *cand = &s->cand, *res = &s->res;
	hnsw_visited_next(&s->vis);
	uint16_t *tag = s->vis.tag, epoch = s->vis.epoch;
	hnsw_kernel_fn kern = s->kern;
	uint32_t *batch = s->batch;
	uint64_t hops = 0, evals = 0;
	cand->n = res->n = 0;
	tag[ep] = epoch;
	hnsw_minheap_push(cand, epd, ep);
	hnsw_maxheap_push(res, epd, ep);
	while (cand->n) {
		struct hnsw_cand c = hnsw_minheap_pop(cand);
		if (c.d > res->a[0].d && res->n >= ef)
			break;
		hops++;
		/* collect: unvisited neighbours of c */
		const struct hnsw_rec_hdr *r = hnsw_get(src, c.id);
		if (dm_unlikely(!r))
			return -EIO;
		const uint32_t *nb = hnsw_rec_nbrs(r);
		uint32_t cnt = DM_MIN(r->n0, 2 * M), m = 0;
		for (uint32_t j = 0; j < cnt; j++) {
			uint32_t id = nb[j];
			if (dm_unlikely(id >= n))
				continue;   /* a corrupt remote record must not index out of bounds */
			if (tag[id] == epoch)
				continue;
			tag[id] = epoch;
			batch[m++] = id;
		}
		/* fetch: one batch (prefetch locally, one doorbell remotely) */
		int rc = fetch_batch(src, batch, m);
		if (rc < 0)
			return rc;
		if (dm_unlikely(hnsw_heap_reserve(cand, cand->n + m) < 0))
			return -ENOMEM;
		/* score */
		if (src->blocks) {
			for (uint32_t j = 0; j < DM_MIN(m, (uint32_t)HNSW_PF_AHEAD); j++)
				prefetch_vec(src, batch[j]);
		}
		for (uint32_t j = 0; j < m; j++) {
			const struct hnsw_rec_hdr *nr = hnsw_get(src, batch[j]);
			if (src->blocks && j + HNSW_PF_AHEAD < m)
				prefetch_vec(src, batch[j + HNSW_PF_AHEAD]);
			if (dm_unlikely(!nr))
				return -EIO;
			float d = kern(q, hnsw_rec_vec(nr, voff), dim);
			evals++;
			if (res->n < ef || d < res->a[0].d) {
				hnsw_minheap_push(cand, d, batch[j]);
				hnsw_maxheap_push(res, d, batch[j]);
				if (res->n > ef)
					hnsw_maxheap_pop(res);
			}
		}
	}
	src->hops += hops;
	src->dist_evals += evals;
	return 0;
}

static int visit_tag(void *arg, uint32_t id)
{
	struct hnsw_visited *v = arg;
	if (v->tag[id] == v->epoch)
		return 0;
	v->tag[id] = v->epoch;
	return 1;
}

/* Prefetch the records, whole (ids, codes, vector), of the next npf unexpanded pool
 * entries: the search is bound by memory once the estimator is cheap. */
static inline void prefetch_next(struct hnsw_src *src, struct hnsw_l0 *l, uint32_t npf)
{
	uint32_t pf = 0;
	hnsw_l0_pool_skip(l);
	for (uint32_t i = l->first; i < l->np && pf < npf; i++) {
		if (l->pool[i].st & L0_EXPANDED)
			continue;
		const char *nr = (const char *)hnsw_get(src, l->pool[i].id);
		for (uint32_t o = 0; o < src->rec_size; o += 64)
			__builtin_prefetch(nr + o);
		pf++;
	}
}

/* Level 0 with codes (hnsw_l0.h) from the seeds in s->up (entry points with the score that
 * chose them): expand the best b pool entries per fetch. */
static int search_level0_codes(struct hnsw_src *src, struct hnsw_searcher *s, const float *q,
			       uint32_t k, uint32_t ef, uint32_t b)
{
	struct hnsw_l0 *l = &s->l0;
	const struct hnsw_upbeam *up = &s->up;
	uint32_t *ids = s->batch, m;
	hnsw_visited_next(&s->vis);
	s->vis.tag[up->seed[0]] = s->vis.epoch;
	int rc = hnsw_l0_start(l, src, s->kern, q, k, ef, up->seed[0], up->seed_d[0]);
	if (rc < 0)
		return rc;
	for (uint32_t i = 1; i < up->nseed; i++) {
		if (s->vis.tag[up->seed[i]] == s->vis.epoch)
			continue;
		s->vis.tag[up->seed[i]] = s->vis.epoch;
		hnsw_l0_pool_insert(l, up->seed_d[i], up->seed[i], 0);
	}
	while ((m = hnsw_l0_take(l, ids, b)) != 0) {
		rc = fetch_batch(src, ids, m);
		if (rc < 0)
			return rc;
		for (uint32_t j = 0; j < m; j++) {
			const struct hnsw_rec_hdr *r = hnsw_get(src, ids[j]);
			if (dm_unlikely(!r))
				return -EIO;
			rc = hnsw_l0_expand(l, ids[j], r, visit_tag, &s->vis);
			if (rc < 0)
				return rc;
		}
		if (src->blocks)
			prefetch_next(src, l, HNSW_L0_PF);
	}
	src->hops += l->hops;
	src->dist_evals += l->dist_evals;
	src->est_evals += l->est_evals;
	return 0;
}

/* Algorithm 5: K-NN-SEARCH. */
int hnsw_search(struct hnsw_src *src, struct hnsw_searcher *s, const float *q, size_t k,
		size_t ef, struct dm_hit *out)
{
	return hnsw_search_b(src, s, q, k, ef, 1, out);
}

int hnsw_search_b(struct hnsw_src *src, struct hnsw_searcher *s, const float *q, size_t k,
		  size_t ef, uint32_t b, struct dm_hit *out)
{
	if (k == 0 || src->max_level < 0 || src->n == 0)
		return 0;
	if (src->dim != s->qdim || ef > (1u << 24) || k > (1u << 24))
		return -EINVAL;
	if (ef < k)
		ef = k;
	if (s->kmetric != src->metric) {
		s->kmetric = src->metric;
		s->kern = hnsw_kernel_for(src->metric);
	}
	if (hnsw_visited_reserve(&s->vis, src->n) < 0 || hnsw_heap_reserve(&s->res, (uint32_t)ef + 1) < 0)
		return -ENOMEM;
	if (b < 1 || b > 64)
		return -EINVAL;
	if (s->batch_cap < DM_MAX(2 * src->M, b)) {
		uint32_t c = DM_MAX(2 * src->M, b);
		uint32_t *nb = realloc(s->batch, (size_t)c * sizeof(*nb));
		if (!nb)
			return -ENOMEM;
		s->batch = nb;
		s->batch_cap = c;
	}
	if (src->metric == DM_METRIC_COS) {
		memcpy(s->qbuf, q, (size_t)src->dim * sizeof(*q));
		if (dm_normalize(s->qbuf, src->dim) < 0)
			return -EINVAL;
		q = s->qbuf;
	}
	if (src->quant) {
		if (s->qrot_cap < src->vdim) {
			float *r = realloc(s->qrot, (size_t)src->vdim * sizeof(*r));
			if (!r)
				return -ENOMEM;
			s->qrot = r;
			s->qrot_cap = src->vdim;
		}
		hnsw_quant_rotate(src->quant, q, s->qrot);
		q = s->qrot;
	}

	uint32_t cur = src->entry;
	float curd;
	bool seeded = false;   /* s->up holds the level-1 search's seeds */
	int rc;
	if (src->quant && src->upq && src->max_level >= 1) {
		/* Upper levels on SQ8 codes: the level-0 search scores its entry exactly when
		 * it expands it, so the SQ8 score only seeds the pool. */
		const struct hnsw_upq *u = src->upq;
		if (s->upaux_cap < hnsw_upq_aux_len(u)) {
			float *a = realloc(s->upaux, hnsw_upq_aux_len(u) * sizeof(*a));
			if (!a)
				return -ENOMEM;
			s->upaux = a;
			s->upaux_cap = (uint32_t)hnsw_upq_aux_len(u);
		}
		dm_sq8_query(&u->sq, q, s->upaux);
		uint32_t efu = DM_MIN(src->ef_upper, HNSW_EF_UPPER_MAX);
		rc = hnsw_upq_descend(u, s->upaux, src->upl, src->M, src->max_level, efu > 1 ? 2 : 1,
				      &cur, &curd, &src->hops, &src->est_evals);
		if (rc < 0)
			return rc;
		if (efu > 1) {
			rc = hnsw_upq_beam(u, s->upaux, src->upl, src->M, cur, curd, efu,
					   hnsw_up_seeds(efu, (uint32_t)ef), &s->up, &src->hops,
					   &src->est_evals);
			if (rc < 0)
				return rc;
			seeded = true;
		}
	} else {
		rc = fetch_batch(src, &cur, 1);
		if (rc < 0)
			return rc;
		const struct hnsw_rec_hdr *r = hnsw_get(src, cur);
		if (!r)
			return -EIO;
		curd = s->kern(q, hnsw_rec_vec(r, src->vec_off), src->vdim);
		for (int l = src->max_level; l >= 1; l--) {
			rc = greedy_upper(src, s, q, (uint32_t)l, &cur, &curd);
			if (rc < 0)
				return rc;
		}
	}
	if (!seeded) {   /* the greedy descent's node is level 0's one entry point */
		s->up.nseed = 1;
		s->up.seed[0] = cur;
		s->up.seed_d[0] = curd;
	}
	if (src->quant) {
		rc = search_level0_codes(src, s, q, (uint32_t)k, (uint32_t)ef, b);
		return rc < 0 ? rc : hnsw_l0_results(&s->l0, src->metric, out);
	}
	rc = search_level0(src, s, q, cur, curd, (uint32_t)ef);
	if (rc < 0)
		return rc;

	/* The heap holds up to ef; drop the worst until k remain, then drain ascending. */
	struct hnsw_heap *res = &s->res;
	while (res->n > k)
		hnsw_maxheap_pop(res);
	int nk = (int)res->n;
	for (int i = nk; i-- > 0;) {
		struct hnsw_cand c = hnsw_maxheap_pop(res);
		out[i].dist = hnsw_score_to_dist(src->metric, c.d);
		out[i].pad = 0;
		out[i].id = c.id;
	}
	return nk;
}
