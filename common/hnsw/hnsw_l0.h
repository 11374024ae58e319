/* hnsw_l0.h: SEARCH-LAYER on level 0 with neighbour codes, the one algorithm behind the
 * local hnsw_search and the resumable hnsw_query (so that a remote query returns exactly
 * the local ids). Internal to common/hnsw.
 *
 * The pool holds the ef best candidates seen, sorted ascending: unexpanded ones by their
 * code estimate, expanded ones by their exact score. A step takes the best b unexpanded
 * candidates (b = 1: one per step), and expanding a candidate u uses u's record alone:
 *   1. the exact score of u from its own (rotated) vector: u moves in the pool to its exact
 *      place and enters the k results (results carry exact scores only);
 *   2. the estimates of all u's listed neighbours in one SIMD pass over u's code list;
 *   3. each neighbour not seen before enters the pool by its estimate if it beats the
 *      pool's worst (pool full) — and, with prune, only if its lower bound does not exceed
 *      the k-th exact result (results full).
 * The search ends when every pool entry is expanded. Only expanded nodes are ever read, so
 * a remote reader READs one record per expansion. */
#ifndef DM_HNSW_L0_H
#define DM_HNSW_L0_H

#include "hnsw_int.h"
#include "hnsw_pool.h"

#define L0_EXPANDED 1u   /* hnsw_pent.st: taken for expansion */

struct hnsw_l0 {
	struct hnsw_pent *pool;
	uint32_t np, cap, first;     /* entries, capacity (ef), first unexpanded (<= np) */
	struct hnsw_heap res;        /* max-heap of the k best exact scores */
	uint32_t k;
	float *est, *lb;             /* 2M estimates / lower bounds of one list */
	uint32_t est_cap;
	struct hnsw_qest *qe;
	const float *q;              /* rotated query (vdim floats) */
	hnsw_kernel_fn kern;
	uint32_t vdim, vec_off, M, n;
	bool prune;
	uint64_t hops, dist_evals, est_evals;
};

int hnsw_l0_init(struct hnsw_l0 *l);
void hnsw_l0_fini(struct hnsw_l0 *l);
/* Start a level-0 search of src for the rotated query q with (k, ef) from entry ep whose
 * exact score is epd. 0 or -ENOMEM. */
int hnsw_l0_start(struct hnsw_l0 *l, const struct hnsw_src *src, hnsw_kernel_fn kern,
		  const float *q, uint32_t k, uint32_t ef, uint32_t ep, float epd);

/* Insert (d, id) into the sorted pool if it fits; keeps first up to date. */
static inline void hnsw_l0_pool_insert(struct hnsw_l0 *l, float d, uint32_t id, uint32_t st)
{
	uint32_t lo = hnsw_pent_insert(l->pool, &l->np, l->cap, d, id, st);
	if (lo == UINT32_MAX)
		return;
	if (!st && lo < l->first)
		l->first = lo;
	else if (l->first > l->np)
		l->first = l->np;
}

/* Advance first past expanded entries. */
static inline void hnsw_l0_pool_skip(struct hnsw_l0 *l)
{
	while (l->first < l->np && (l->pool[l->first].st & L0_EXPANDED))
		l->first++;
}

/* Take up to b unexpanded candidates, best first, into ids; returns how many (0: done). */
static inline uint32_t hnsw_l0_take(struct hnsw_l0 *l, uint32_t *ids, uint32_t b)
{
	uint32_t m = 0;
	hnsw_l0_pool_skip(l);
	for (uint32_t i = l->first; i < l->np && m < b; i++) {
		if (l->pool[i].st & L0_EXPANDED)
			continue;
		l->pool[i].st |= L0_EXPANDED;
		ids[m++] = l->pool[i].id;
	}
	return m;
}

/* Move expanded id from its estimate's place to its exact score's place. */
static inline void hnsw_l0_settle(struct hnsw_l0 *l, uint32_t id, float d)
{
	struct hnsw_pent *a = l->pool;
	uint32_t i = 0;
	while (i < l->np && a[i].id != id)
		i++;
	if (i == l->np)
		return;   /* pushed out by better candidates meanwhile */
	memmove(a + i, a + i + 1, (size_t)(l->np - i - 1) * sizeof(*a));
	l->np--;
	if (i < l->first)
		l->first--;
	hnsw_l0_pool_insert(l, d, id, L0_EXPANDED);
}

/* Expand node id from its record r. visit(arg, nid) returns 1 for a node not seen before
 * (and marks it), 0 for a seen one, < 0 on error (returned). */
static inline int hnsw_l0_expand(struct hnsw_l0 *l, uint32_t id, const struct hnsw_rec_hdr *r,
				 int (*visit)(void *, uint32_t), void *varg)
{
	const float *u = hnsw_rec_vec(r, l->vec_off);
	float d = l->kern(l->q, u, l->vdim);
	struct hnsw_heap *res = &l->res;
	l->hops++;
	l->dist_evals++;
	hnsw_l0_settle(l, id, d);
	if (res->n < l->k || d < res->a[0].d) {
		hnsw_maxheap_push(res, d, id);
		if (res->n > l->k)
			hnsw_maxheap_pop(res);
	}
	uint32_t cnt = DM_MIN(r->n0, 2 * l->M);
	if (!cnt)
		return 0;
	const uint32_t *nb = hnsw_rec_nbrs(r);
	hnsw_qest_list(l->qe, u, d, hnsw_rec_codes(r, l->M), cnt, l->est,
		       l->prune ? l->lb : NULL);
	l->est_evals += cnt;
	for (uint32_t j = 0; j < cnt; j++) {
		uint32_t v = nb[j];
		if (dm_unlikely(v >= l->n))
			continue;   /* a corrupt remote record must not index out of bounds */
		float e = l->est[j];
		if (l->np == l->cap && e >= l->pool[l->np - 1].d)
			continue;   /* cannot enter the pool (stays unvisited: may come back closer) */
		int rc = visit(varg, v);
		if (rc <= 0) {
			if (rc < 0)
				return rc;
			continue;
		}
		if (l->prune && res->n >= l->k && l->lb[j] > res->a[0].d)
			continue;
		hnsw_l0_pool_insert(l, e, v, 0);
	}
	return 0;
}

/* The k results ascending into out (raw scores converted by the caller); returns count. */
static inline int hnsw_l0_results(struct hnsw_l0 *l, enum dm_metric m, struct dm_hit *out)
{
	struct hnsw_heap *res = &l->res;
	int nk = (int)res->n;
	for (int i = nk; i-- > 0;) {
		struct hnsw_cand c = hnsw_maxheap_pop(res);
		out[i].dist = hnsw_score_to_dist(m, c.d);
		out[i].pad = 0;
		out[i].id = c.id;
	}
	return nk;
}

#endif
