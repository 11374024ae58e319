/* hnsw_insert.c: INSERT (Algorithm 1 of Malkov & Yashunin) with SEARCH-LAYER (Algorithm 2) on
 * the local graph under construction and SELECT-NEIGHBORS-HEURISTIC (Algorithm 4, without
 * extendCandidates / keepPrunedConnections, as hnswlib). Concurrent inserts synchronise with
 * one spinlock byte per node, held only while a neighbour list is copied or rewritten, and a
 * global mutex for the entry point. */
#include "hnsw_int.h"

#include <stdlib.h>

struct hnsw_scratch {
	struct hnsw_visited vis;
	struct hnsw_heap cand;      /* min-heap: candidates to expand */
	struct hnsw_heap res;       /* max-heap: the ef best so far */
	struct hnsw_cand *w;        /* W sorted ascending (ef entries) */
	struct hnsw_cand *sel;      /* selected neighbours (2M + 1) */
	struct hnsw_cand *tmp;      /* neighbour-shrink candidates (2M + 1) */
	uint32_t *nbuf;             /* copy of one neighbour list (2M) */
	uint32_t *batch;            /* unvisited neighbours of one expansion (2M) */
	struct hnsw_cand *lsel;     /* selected neighbours per level ((MAX_LEVEL + 1) x M) */
	uint32_t lns[HNSW_MAX_LEVEL + 1];
	uint32_t ef;
};

struct hnsw_scratch *hnsw_scratch_new(uint32_t nodes, uint32_t M, uint32_t ef)
{
	struct hnsw_scratch *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->ef = ef;
	if (hnsw_visited_init(&s->vis, nodes) < 0 || hnsw_heap_init(&s->cand, 2 * ef + 64) < 0 ||
	    hnsw_heap_init(&s->res, ef + 1) < 0)
		goto err_free;
	s->w = malloc((size_t)(ef + 1) * sizeof(*s->w));
	s->sel = malloc((size_t)(2 * M + 1) * sizeof(*s->sel));
	s->tmp = malloc((size_t)(2 * M + 1) * sizeof(*s->tmp));
	s->nbuf = malloc((size_t)2 * M * sizeof(*s->nbuf));
	s->batch = malloc((size_t)2 * M * sizeof(*s->batch));
	s->lsel = malloc((size_t)(HNSW_MAX_LEVEL + 1) * M * sizeof(*s->lsel));
	if (!s->w || !s->sel || !s->tmp || !s->nbuf || !s->batch || !s->lsel)
		goto err_free;
	return s;

err_free:
	hnsw_scratch_free(s);
	errno = ENOMEM;
	return NULL;
}

void hnsw_scratch_free(struct hnsw_scratch *s)
{
	if (!s)
		return;
	hnsw_visited_fini(&s->vis);
	hnsw_heap_fini(&s->cand);
	hnsw_heap_fini(&s->res);
	free(s->w);
	free(s->sel);
	free(s->tmp);
	free(s->nbuf);
	free(s->batch);
	free(s->lsel);
	free(s);
}

static inline const float *vec_of(const struct hnsw_index *idx, uint32_t id)
{
	return hnsw_rec_vec(hnsw_rec(idx, id), idx->vec_off);
}

/* Neighbour list of id at level l: its count word and its id array. */
static inline uint32_t *list_of(const struct hnsw_index *idx, uint32_t id, uint32_t l,
				uint32_t **cnt)
{
	if (l == 0) {
		struct hnsw_rec_hdr *r = hnsw_rec(idx, id);
		*cnt = &r->n0;
		return (uint32_t *)hnsw_rec_nbrs(r);
	}
	uint32_t *w = hnsw_up_list(idx, id, l);
	*cnt = w;
	return w + 1;
}

/* Copy the neighbour list of id at level l into out under the node's lock. */
static uint32_t copy_list(struct hnsw_index *idx, uint32_t id, uint32_t l, uint32_t *out)
{
	uint32_t *cnt, *ids = list_of(idx, id, l, &cnt);
	hnsw_lock(&idx->locks[id]);
	uint32_t n = *cnt;
	memcpy(out, ids, (size_t)n * sizeof(*out));
	hnsw_unlock(&idx->locks[id]);
	return n;
}

/* Greedy descent on level l (SEARCH-LAYER with ef = 1): move to any closer neighbour. */
static void greedy(struct hnsw_index *idx, struct hnsw_scratch *s, const float *q, uint32_t l,
		   uint32_t *cur, float *curd)
{
	size_t dim = idx->vdim;
	bool changed = true;
	while (changed) {
		changed = false;
		uint32_t n = copy_list(idx, *cur, l, s->nbuf);
		for (uint32_t j = 0; j < n; j++) {
			float d = idx->kern(q, vec_of(idx, s->nbuf[j]), dim);
			if (d < *curd) {
				*curd = d;
				*cur = s->nbuf[j];
				changed = true;
			}
		}
	}
}

/* Algorithm 2: SEARCH-LAYER(q, ep, ef, l); leaves W sorted ascending in s->w, returns |W|. */
static uint32_t search_layer(struct hnsw_index *idx, struct hnsw_scratch *s, const float *q,
			     uint32_t ep, float epd, uint32_t ef, uint32_t l)
{
	size_t dim = idx->vdim;
	struct hnsw_heap *cand = &s->cand, *res = &s->res;
	hnsw_visited_next(&s->vis);
	uint16_t *tag = s->vis.tag, epoch = s->vis.epoch;
	cand->n = res->n = 0;
	tag[ep] = epoch;
	hnsw_minheap_push(cand, epd, ep);
	hnsw_maxheap_push(res, epd, ep);
	while (cand->n) {
		struct hnsw_cand c = hnsw_minheap_pop(cand);
		if (c.d > res->a[0].d && res->n >= ef)
			break;
		uint32_t n = copy_list(idx, c.id, l, s->nbuf), m = 0;
		/* Collect the unvisited neighbours first and prefetch their vectors, then score. */
		for (uint32_t j = 0; j < n; j++) {
			uint32_t id = s->nbuf[j];
			if (tag[id] == epoch)
				continue;
			tag[id] = epoch;
			s->batch[m++] = id;
			__builtin_prefetch(vec_of(idx, id));
		}
		if (hnsw_heap_reserve(cand, cand->n + m) < 0)
			abort();   /* construction scratch cannot grow: out of memory */
		for (uint32_t j = 0; j < DM_MIN(m, HNSW_PF_AHEAD); j++)
			hnsw_prefetch_vec(vec_of(idx, s->batch[j]), dim);
		for (uint32_t j = 0; j < m; j++) {
			uint32_t id = s->batch[j];
			if (j + HNSW_PF_AHEAD < m)
				hnsw_prefetch_vec(vec_of(idx, s->batch[j + HNSW_PF_AHEAD]), dim);
			float d = idx->kern(q, vec_of(idx, id), dim);
			if (res->n < ef || d < res->a[0].d) {
				hnsw_minheap_push(cand, d, id);
				hnsw_maxheap_push(res, d, id);
				if (res->n > ef)
					hnsw_maxheap_pop(res);
			}
		}
	}
	uint32_t nw = res->n;
	for (uint32_t i = nw; i-- > 0;)
		s->w[i] = hnsw_maxheap_pop(res);
	return nw;
}

static const float *idx_vec(const void *ctx, uint32_t id)
{
	return vec_of(ctx, id);
}

/* Algorithm 4 over the index's records (hnsw_select_heuristic). */
static uint32_t select_heuristic(const struct hnsw_index *idx, const struct hnsw_cand *c,
				 uint32_t nc, uint32_t M, struct hnsw_cand *out)
{
	return hnsw_select_heuristic(c, nc, M, idx->kern, idx->vdim, idx_vec, idx, out);
}

/* Add q to e's list at level l; if the list is full, re-select by the heuristic. */
static void link_back(struct hnsw_index *idx, struct hnsw_scratch *s, uint32_t e, uint32_t q,
		      float dq, uint32_t l, uint32_t mmax)
{
	uint32_t *cnt, *ids = list_of(idx, e, l, &cnt);
	hnsw_lock(&idx->locks[e]);
	uint32_t n = *cnt;
	for (uint32_t j = 0; j < n; j++)
		if (ids[j] == q)
			goto out_unlock;
	if (n < mmax) {
		ids[n] = q;
		*cnt = n + 1;
		goto out_unlock;
	}
	const float *ve = vec_of(idx, e);
	for (uint32_t j = 0; j < n; j++) {
		s->tmp[j].id = ids[j];
		s->tmp[j].d = idx->kern(ve, vec_of(idx, ids[j]), idx->vdim);
	}
	s->tmp[n].id = q;
	s->tmp[n].d = dq;
	hnsw_sort_cands(s->tmp, n + 1);
	uint32_t k = select_heuristic(idx, s->tmp, n + 1, mmax, s->sel);
	for (uint32_t j = 0; j < k; j++)
		ids[j] = s->sel[j].id;
	for (uint32_t j = k; j < mmax; j++)
		ids[j] = 0;
	*cnt = k;
out_unlock:
	hnsw_unlock(&idx->locks[e]);
}

/* Algorithm 1: INSERT. The record of id already holds its vector and level.
 *
 * All levels are searched first, then the node's own lists are written, and only then do
 * its neighbours link back to it. The searches cannot see the new node (nothing links to it
 * yet), so this gives the same graph as linking level by level, but a concurrent insert that
 * finds the node at some level always finds its lists of every level already written: it
 * can never descend into a node with an empty list, nor have a back-link overwritten. */
void hnsw_insert(struct hnsw_index *idx, struct hnsw_scratch *s, uint32_t id)
{
	uint32_t M = idx->p.M, dim = idx->vdim;
	struct hnsw_rec_hdr *rec = hnsw_rec(idx, id);
	const float *q = hnsw_rec_vec(rec, idx->vec_off);
	int level = rec->level;

	pthread_mutex_lock(&idx->glock);
	int maxl = idx->max_level;
	uint32_t ep = idx->entry;
	if (maxl < 0) {
		idx->entry = id;
		idx->max_level = level;
		pthread_mutex_unlock(&idx->glock);
		return;
	}
	/* A new top node keeps the global lock so that no other insert races the entry point. */
	bool top = level > maxl;
	if (!top)
		pthread_mutex_unlock(&idx->glock);

	uint32_t cur = ep;
	float curd = idx->kern(q, vec_of(idx, ep), dim);
	for (int l = maxl; l > level; l--)
		greedy(idx, s, q, (uint32_t)l, &cur, &curd);

	int low = DM_MIN(level, maxl);
	for (int l = low; l >= 0; l--) {
		uint32_t nw = search_layer(idx, s, q, cur, curd, idx->p.ef_construction, (uint32_t)l);
		struct hnsw_cand *sel = s->lsel + (size_t)l * M;
		uint32_t ns = select_heuristic(idx, s->w, nw, M, sel);
		s->lns[l] = ns;
		if (ns) {
			cur = sel[0].id;
			curd = sel[0].d;
		}
	}
	hnsw_lock(&idx->locks[id]);
	for (int l = low; l >= 0; l--) {
		uint32_t *cnt, *ids = list_of(idx, id, (uint32_t)l, &cnt);
		for (uint32_t j = 0; j < s->lns[l]; j++)
			ids[j] = s->lsel[(size_t)l * M + j].id;
		*cnt = s->lns[l];
	}
	hnsw_unlock(&idx->locks[id]);
	for (int l = low; l >= 0; l--) {
		const struct hnsw_cand *sel = s->lsel + (size_t)l * M;
		uint32_t mmax = l ? M : 2 * M;
		for (uint32_t j = 0; j < s->lns[l]; j++)
			link_back(idx, s, sel[j].id, id, sel[j].d, (uint32_t)l, mmax);
	}

	if (top) {
		idx->entry = id;
		idx->max_level = level;
		pthread_mutex_unlock(&idx->glock);
	}
}
