/* hnsw_upper.c: planning the insertion of a node into a graph's local upper levels
 * (hnsw_upper.h): greedy descent, SEARCH-LAYER (Algorithm 2) and SELECT-NEIGHBORS-HEURISTIC
 * (Algorithm 4) of INSERT (Algorithm 1) on levels >= 1, every list read checked. */
#include "hnsw_upper.h"
#include "hnsw_int.h"

#include <stdlib.h>

struct hnsw_upper_scratch {
	uint32_t n, M, ef;
	struct hnsw_visited vis;
	struct hnsw_heap cand, res;
	struct hnsw_cand *w;          /* W, ascending (ef) */
	struct hnsw_cand *sel;        /* selected (M + 1) */
	struct hnsw_cand *tmp;        /* a neighbour's list plus x (M + 1) */
	struct hnsw_cand *lsel;       /* x's selected neighbours per level ((MAX_LEVEL + 1) x M) */
	struct hnsw_upper_list *lists;
	uint32_t *words;
};

/* Lists a plan may hold: per level x's own and its M neighbours'. */
static size_t max_lists(uint32_t M)
{
	return (size_t)HNSW_MAX_LEVEL * (1 + M);
}

struct hnsw_upper_scratch *hnsw_upper_scratch_new(uint32_t n, uint32_t M, uint32_t ef)
{
	struct hnsw_upper_scratch *s = calloc(1, sizeof(*s));

	if (!s)
		goto err_oom;
	s->n = n;
	s->M = M;
	s->ef = ef ? ef : 1;
	if (hnsw_visited_init(&s->vis, n) || hnsw_heap_init(&s->cand, 2 * s->ef + 64) ||
	    hnsw_heap_init(&s->res, s->ef + 1))
		goto err_free;
	s->w = malloc((size_t)(s->ef + 1) * sizeof(*s->w));
	s->sel = malloc((size_t)(M + 1) * sizeof(*s->sel));
	s->tmp = malloc((size_t)(M + 1) * sizeof(*s->tmp));
	s->lsel = malloc((size_t)(HNSW_MAX_LEVEL + 1) * M * sizeof(*s->lsel));
	s->lists = malloc(max_lists(M) * sizeof(*s->lists));
	s->words = malloc(max_lists(M) * hnsw_up_list_words(M) * sizeof(*s->words));
	if (!s->w || !s->sel || !s->tmp || !s->lsel || !s->lists || !s->words)
		goto err_free;
	return s;

err_free:
	hnsw_upper_scratch_free(s);
err_oom:
	errno = ENOMEM;
	return NULL;
}

void hnsw_upper_scratch_free(struct hnsw_upper_scratch *s)
{
	if (!s)
		return;
	hnsw_visited_fini(&s->vis);
	hnsw_heap_fini(&s->cand);
	hnsw_heap_fini(&s->res);
	free(s->w);
	free(s->sel);
	free(s->tmp);
	free(s->lsel);
	free(s->lists);
	free(s->words);
	free(s);
}

/* Node c's list at level l, checked: every id in range and of level >= l. NULL: corrupt. */
static const uint32_t *list_at(const struct hnsw_upper_graph *g, uint32_t c, uint32_t l)
{
	if (c >= g->n || !g->upl[c] || g->upl[c][-1] < l)
		return NULL;
	const uint32_t *w = g->upl[c] + (size_t)(l - 1) * hnsw_up_list_words(g->M);

	if (w[0] > g->M)
		return NULL;
	for (uint32_t j = 0; j < w[0]; j++)
		if (w[1 + j] >= g->n || !g->upl[w[1 + j]] || g->upl[w[1 + j]][-1] < l ||
		    !g->uvec[w[1 + j]])
			return NULL;
	return w;
}

/* SEARCH-LAYER with ef = 1 on level l. 0 or -EIO. */
static int greedy(const struct hnsw_upper_graph *g, const float *v, uint32_t l, uint32_t *cur,
		  float *curd)
{
	bool changed = true;

	while (changed) {
		const uint32_t *w = list_at(g, *cur, l);

		if (!w)
			return -EIO;
		changed = false;
		for (uint32_t j = 0; j < w[0]; j++) {
			float d = g->kern(v, g->uvec[w[1 + j]], g->vdim);

			if (d < *curd) {
				*curd = d;
				*cur = w[1 + j];
				changed = true;
			}
		}
	}
	return 0;
}

/* Algorithm 2 on level l from ep: W ascending in s->w; its size, or -EIO / -ENOMEM. */
static int search_layer(const struct hnsw_upper_graph *g, struct hnsw_upper_scratch *s,
			const float *v, uint32_t ep, float epd, uint32_t l)
{
	struct hnsw_heap *cand = &s->cand, *res = &s->res;
	uint16_t *tag, epoch;

	hnsw_visited_next(&s->vis);
	tag = s->vis.tag;
	epoch = s->vis.epoch;
	cand->n = res->n = 0;
	tag[ep] = epoch;
	hnsw_minheap_push(cand, epd, ep);
	hnsw_maxheap_push(res, epd, ep);
	while (cand->n) {
		struct hnsw_cand c = hnsw_minheap_pop(cand);

		if (c.d > res->a[0].d && res->n >= s->ef)
			break;
		const uint32_t *w = list_at(g, c.id, l);

		if (!w)
			return -EIO;
		if (hnsw_heap_reserve(cand, cand->n + w[0]))
			return -ENOMEM;
		for (uint32_t j = 0; j < w[0]; j++) {
			uint32_t id = w[1 + j];

			if (tag[id] == epoch)
				continue;
			tag[id] = epoch;
			float d = g->kern(v, g->uvec[id], g->vdim);

			if (res->n < s->ef || d < res->a[0].d) {
				hnsw_minheap_push(cand, d, id);
				hnsw_maxheap_push(res, d, id);
				if (res->n > s->ef)
					hnsw_maxheap_pop(res);
			}
		}
	}
	uint32_t nw = res->n;

	for (uint32_t i = nw; i-- > 0;)
		s->w[i] = hnsw_maxheap_pop(res);
	return (int)nw;
}

/* A vector of the graph, or the node being planned (not in the graph yet). */
struct vec_ctx {
	const struct hnsw_upper_graph *g;
	uint32_t x;
	const float *vx;
};

static const float *graph_vec(const void *ctx, uint32_t id)
{
	const struct vec_ctx *c = ctx;

	return id == c->x ? c->vx : c->g->uvec[id];
}

static struct hnsw_upper_list *new_list(struct hnsw_upper_scratch *s,
					 struct hnsw_upper_plan *p, uint32_t node, uint32_t l)
{
	struct hnsw_upper_list *o = &s->lists[p->nlists];

	o->node = node;
	o->level = l;
	o->w = s->words + (size_t)p->nlists++ * hnsw_up_list_words(s->M);
	memset(o->w, 0, hnsw_up_list_words(s->M) * sizeof(*o->w));
	return o;
}

/* e's list at level l with x (distance dx to e) added, re-selected past M. */
static int link_back(const struct hnsw_upper_graph *g, struct hnsw_upper_scratch *s,
		     struct hnsw_upper_plan *p, uint32_t e, uint32_t x, float dx,
		     const float *vx, uint32_t l)
{
	const uint32_t *w = list_at(g, e, l);
	const struct vec_ctx vc = { g, x, vx };
	struct hnsw_upper_list *o;
	uint32_t k;

	if (!w)
		return -EIO;
	o = new_list(s, p, e, l);
	if (w[0] < g->M) {
		memcpy(o->w, w, (size_t)(1 + w[0]) * sizeof(*w));
		o->w[1 + o->w[0]++] = x;
		return 0;
	}
	for (uint32_t j = 0; j < w[0]; j++)
		s->tmp[j] = (struct hnsw_cand){ g->kern(g->uvec[e], g->uvec[w[1 + j]], g->vdim),
						w[1 + j] };
	s->tmp[w[0]] = (struct hnsw_cand){ dx, x };
	hnsw_sort_cands(s->tmp, w[0] + 1);
	k = hnsw_select_heuristic(s->tmp, w[0] + 1, g->M, g->kern, g->vdim, graph_vec, &vc,
				  s->sel);
	o->w[0] = k;
	for (uint32_t j = 0; j < k; j++)
		o->w[1 + j] = s->sel[j].id;
	return 0;
}

int hnsw_upper_plan(const struct hnsw_upper_graph *g, struct hnsw_upper_scratch *s, uint32_t id,
		    uint32_t level, const float *v, struct hnsw_upper_plan *plan)
{
	uint32_t cur = g->entry;
	float curd;
	int rc;

	if (id >= g->n || id >= s->n || g->upl[id] || g->M != s->M || level < 1 ||
	    g->max_level < 1 || level > (uint32_t)g->max_level || level > HNSW_MAX_LEVEL)
		return -EINVAL;
	if (cur >= g->n || !g->uvec[cur] || !g->upl[cur])
		return -EIO;
	plan->id = id;
	plan->level = level;
	plan->nlists = 0;
	plan->lists = s->lists;
	curd = g->kern(v, g->uvec[cur], g->vdim);
	for (uint32_t l = (uint32_t)g->max_level; l > level; l--) {
		rc = greedy(g, v, l, &cur, &curd);
		if (rc)
			return rc;
	}
	/* x's own lists first, all levels, then the back-links (their order is the apply
	 * order: x's lists exist before any list names x) */
	uint32_t nsel[HNSW_MAX_LEVEL + 1] = { 0 };
	const struct vec_ctx vc = { g, id, v };

	for (uint32_t l = level; l >= 1; l--) {
		rc = search_layer(g, s, v, cur, curd, l);
		if (rc < 0)
			return rc;
		nsel[l] = hnsw_select_heuristic(s->w, (uint32_t)rc, g->M, g->kern, g->vdim,
						graph_vec, &vc, s->lsel + (size_t)l * g->M);
		struct hnsw_upper_list *o = new_list(s, plan, id, l);

		o->w[0] = nsel[l];
		for (uint32_t j = 0; j < nsel[l]; j++)
			o->w[1 + j] = s->lsel[(size_t)l * g->M + j].id;
		cur = s->w[0].id;
		curd = s->w[0].d;
	}
	for (uint32_t l = level; l >= 1; l--)
		for (uint32_t j = 0; j < nsel[l]; j++) {
			const struct hnsw_cand *c = &s->lsel[(size_t)l * g->M + j];

			rc = link_back(g, s, plan, c->id, id, c->d, v, l);
			if (rc)
				return rc;
		}
	return 0;
}
