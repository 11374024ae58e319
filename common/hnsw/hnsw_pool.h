/* hnsw_pool.h: a search list kept sorted by score, best first, of at most cap entries: the
 * level-0 pool with codes (hnsw_l0.h) and the level-1 list on SQ8 codes (hnsw_upq.c).
 * Internal to common/hnsw. */
#ifndef DM_HNSW_POOL_H
#define DM_HNSW_POOL_H

#include <stdint.h>
#include <string.h>

struct hnsw_pent {
	float d;
	uint32_t id;
	uint32_t st;        /* the user's state bits (expanded) */
};

/* Insert (d, id, st) into the sorted a[0 .. *np) of at most cap entries (cap >= 1) after
 * the entries of an equal score (the earlier stays first), the worst falling out of a full
 * list. Returns the position, or UINT32_MAX when it does not fit (full and not better than
 * the worst). */
static inline uint32_t hnsw_pent_insert(struct hnsw_pent *a, uint32_t *np, uint32_t cap,
					float d, uint32_t id, uint32_t st)
{
	uint32_t n = *np;
	if (n == cap && d >= a[n - 1].d)
		return UINT32_MAX;
	uint32_t lo = 0, hi = n;
	while (lo < hi) {
		uint32_t mid = (lo + hi) >> 1;
		if (a[mid].d <= d)
			lo = mid + 1;
		else
			hi = mid;
	}
	uint32_t move = (n == cap ? n - 1 : n) - lo;
	memmove(a + lo + 1, a + lo, (size_t)move * sizeof(*a));
	a[lo] = (struct hnsw_pent){ d, id, st };
	if (n < cap)
		*np = n + 1;
	return lo;
}

#endif
