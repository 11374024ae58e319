/* topk.h: bounded top-k selection (a max-heap of the k smallest distances) and a merge of
 * partial top-k lists. Ties are broken by id so that results are deterministic. */
#ifndef DM_TOPK_H
#define DM_TOPK_H

#include "dm.h"

struct dm_hit {
	float dist;
	uint32_t pad;
	uint64_t id;
};

struct dm_topk {
	size_t k, n;
	struct dm_hit *h;     /* heap, h[0] is the worst of the kept */
};

/* Constructor: NULL with errno on failure. */
struct dm_topk *dm_topk_new(size_t k);
void dm_topk_free(struct dm_topk *t);
void dm_topk_reset(struct dm_topk *t);
/* Offer a candidate; kept if among the k best so far. */
void dm_topk_push(struct dm_topk *t, float dist, uint64_t id);
/* Current worst kept distance (INFINITY while fewer than k). */
float dm_topk_bound(const struct dm_topk *t);
/* Sort the kept hits ascending (dist, id) into out (at least t->n entries); returns n.
 * The heap is left empty. */
size_t dm_topk_drain(struct dm_topk *t, struct dm_hit *out);

/* Merge nlists sorted partial lists into the k best (sorted, dedup by id keeping the
 * smallest distance). Returns the number written to out (<= k). */
size_t dm_topk_merge(const struct dm_hit *const *lists, const size_t *lens, size_t nlists,
		     size_t k, struct dm_hit *out);

int dm_hit_cmp(const struct dm_hit *a, const struct dm_hit *b);

#endif
