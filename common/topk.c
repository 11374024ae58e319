/* topk.c: bounded top-k selection (max-heap of the k best hits, worst at the root) and a
 * k-way merge of sorted partial lists with dedup by id. Every comparison goes through
 * dm_hit_cmp, which orders by (dist, id) with NaN last, so results are deterministic
 * whatever the order of the input. */
#include "topk.h"
#include "util/dm_hash.h"
#include "util/dm_heap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Total order on hits: ascending distance, then ascending id; NaN distances sort after
 * every number (so they are never kept ahead of a real hit). */
int dm_hit_cmp(const struct dm_hit *a, const struct dm_hit *b)
{
	if (a->dist < b->dist)
		return -1;
	if (a->dist > b->dist)
		return 1;
	bool an = isnan(a->dist), bn = isnan(b->dist);
	if (an != bn)
		return an ? 1 : -1;
	return a->id < b->id ? -1 : (a->id > b->id ? 1 : 0);
}

struct dm_topk *dm_topk_new(size_t k)
{
	struct dm_topk *t;

	if (k == 0 || k > SIZE_MAX / sizeof(struct dm_hit)) {
		errno = EINVAL;
		return NULL;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->h = malloc(k * sizeof(*t->h));
	if (!t->h)
		goto err_free_t;
	t->k = k;
	return t;

err_free_t:
	free(t);
	errno = ENOMEM;
	return NULL;
}

void dm_topk_free(struct dm_topk *t)
{
	if (!t)
		return;
	free(t->h);
	free(t);
}

void dm_topk_reset(struct dm_topk *t)
{
	t->n = 0;
}

/* The kept hits: a max-heap on dm_hit_cmp (h[0] is the worst). */
#define HIT_WORSE(p, q) (dm_hit_cmp((p), (q)) > 0)
DM_HEAP_DEFINE(hitheap, struct dm_hit, size_t, HIT_WORSE)

static inline void sift_down(struct dm_hit *h, size_t n, size_t i)
{
	hitheap_sift_down(h, n, i, h[i]);
}

void dm_topk_push(struct dm_topk *t, float dist, uint64_t id)
{
	struct dm_hit x = { .dist = dist, .pad = 0, .id = id };

	if (t->n < t->k) {
		hitheap_push(t->h, &t->n, x);
		return;
	}
	if (dm_hit_cmp(&x, &t->h[0]) >= 0)
		return;
	t->h[0] = x;
	sift_down(t->h, t->n, 0);
}

float dm_topk_bound(const struct dm_topk *t)
{
	return t->n < t->k ? INFINITY : t->h[0].dist;
}

size_t dm_topk_drain(struct dm_topk *t, struct dm_hit *out)
{
	size_t n = t->n;

	/* heap sort in place: move the worst to the end, shrink, repeat -> ascending */
	for (size_t m = n; m > 1; m--) {
		struct dm_hit w = t->h[0];
		t->h[0] = t->h[m - 1];
		t->h[m - 1] = w;
		sift_down(t->h, m - 1, 0);
	}
	if (n)
		memcpy(out, t->h, n * sizeof(*out));
	t->n = 0;
	return n;
}

/* ---------------------------------------------------------------------------------------
 * Merge. A min-heap of list cursors yields hits in global (dist, id) order; a hit is kept
 * unless its id was already output (its first appearance is its best, since every list is
 * sorted). The id set is an open-addressing hash table of the ids output so far.
 */

struct cursor {
	const struct dm_hit *cur, *end;
};

/* Min-heap of cursors by their current hit. */
#define CURSOR_BEFORE(p, q) (dm_hit_cmp((p)->cur, (q)->cur) < 0)
DM_HEAP_DEFINE(curheap, struct cursor, size_t, CURSOR_BEFORE)

static inline void cursor_sift_down(struct cursor *c, size_t n, size_t i)
{
	curheap_sift_down(c, n, i, c[i]);
}

static inline uint64_t id_hash(uint64_t x)
{
	return dm_mix64(x);
}

/* Whether id is in out[0..n) (linear; used for small k or when the table is missing). */
static bool seen_linear(const struct dm_hit *out, size_t n, uint64_t id)
{
	for (size_t i = 0; i < n; i++)
		if (out[i].id == id)
			return true;
	return false;
}

/* Inserts id into the table (slots hold index+1 into out, 0 = empty); returns true if it
 * was there already. */
static bool seen_insert(uint32_t *tab, size_t mask, const struct dm_hit *out, size_t n,
			uint64_t id)
{
	for (size_t s = id_hash(id) & mask;; s = (s + 1) & mask) {
		if (tab[s] == 0) {
			tab[s] = (uint32_t)(n + 1);
			return false;
		}
		if (out[tab[s] - 1].id == id)
			return true;
	}
}

/* Merge without any allocation (for a few lists and small k, and when memory is short):
 * each output slot is the smallest hit over all lists that sorts after the previous one,
 * found by binary search in each list; O(k * nlists * log len). */
static size_t merge_no_alloc(const struct dm_hit *const *lists, const size_t *lens,
			     size_t nlists, size_t k, struct dm_hit *out)
{
	size_t n = 0;
	const struct dm_hit *last = NULL;

	while (n < k) {
		const struct dm_hit *best = NULL;
		for (size_t i = 0; i < nlists; i++) {
			size_t lo = 0, hi = lists[i] ? lens[i] : 0;
			while (lo < hi) {  /* first element > last */
				size_t mid = lo + (hi - lo) / 2;
				if (last && dm_hit_cmp(&lists[i][mid], last) <= 0)
					lo = mid + 1;
				else
					hi = mid;
			}
			if (lo < lens[i] && lists[i] && (!best || dm_hit_cmp(&lists[i][lo], best) < 0))
				best = &lists[i][lo];
		}
		if (!best)
			break;
		if (!seen_linear(out, n, best->id))
			out[n++] = *best;
		last = best;
	}
	return n;
}

size_t dm_topk_merge(const struct dm_hit *const *lists, const size_t *lens, size_t nlists,
		     size_t k, struct dm_hit *out)
{
	struct cursor *c;
	uint32_t *tab = NULL;
	size_t nc = 0, n = 0, mask = 0;

	if (k == 0 || nlists == 0)
		return 0;
	/* a few short lists (the common case: a handful of shards, small k) need no heap */
	if (nlists <= 4 && k <= 64)
		return merge_no_alloc(lists, lens, nlists, k, out);
	c = malloc(nlists * sizeof(*c));
	if (!c)
		return merge_no_alloc(lists, lens, nlists, k, out);
	for (size_t i = 0; i < nlists; i++)
		if (lens[i] > 0 && lists[i])
			c[nc++] = (struct cursor){ lists[i], lists[i] + lens[i] };
	for (size_t i = nc / 2; i-- > 0;)
		cursor_sift_down(c, nc, i);

	/* hash table for larger k (linear scan is faster below ~64); falls back to linear */
	if (k > 64 && k < UINT32_MAX / 2) {
		size_t cap = 128;
		while (cap < 2 * k)
			cap *= 2;
		tab = calloc(cap, sizeof(*tab));
		mask = cap - 1;
	}

	while (nc > 0 && n < k) {
		const struct dm_hit *h = c[0].cur;
		bool dup = tab ? seen_insert(tab, mask, out, n, h->id) : seen_linear(out, n, h->id);
		if (!dup)
			out[n++] = *h;
		if (++c[0].cur == c[0].end)
			c[0] = c[--nc];
		if (nc > 0)
			cursor_sift_down(c, nc, 0);
	}
	free(tab);
	free(c);
	return n;
}
