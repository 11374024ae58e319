/* dm_u64set.h: a set of non-zero 64-bit values (already hashes: the low bits pick the
 * slot), open addressing with linear probing, load at most 1/2, no deletion. Used for the
 * row versions an online indexer handed over (cn/s3/cn_s3_index.c) and a flat index's set
 * of indexed row versions (common/index/flat_gindex.c). Not thread-safe. */
#ifndef DM_U64SET_H
#define DM_U64SET_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

struct dm_u64set {
	uint64_t *slot;                /* 0 = empty */
	size_t cap, n;
};

static inline bool dm_u64set_has(const struct dm_u64set *s, uint64_t v)
{
	if (!s->cap)
		return false;
	for (size_t i = v & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
		if (s->slot[i] == v)
			return true;
		if (!s->slot[i])
			return false;
	}
}

/* Add v (!= 0) into room made by dm_u64set_reserve. */
static inline void dm_u64set_add(struct dm_u64set *s, uint64_t v)
{
	size_t i = v & (s->cap - 1);

	while (s->slot[i] && s->slot[i] != v)
		i = (i + 1) & (s->cap - 1);
	if (!s->slot[i]) {
		s->slot[i] = v;
		s->n++;
	}
}

/* Room for `more` values: 0, or -ENOMEM with the set unchanged. */
static inline int dm_u64set_reserve(struct dm_u64set *s, size_t more)
{
	size_t cap = s->cap ? s->cap : 64;
	struct dm_u64set ns = { 0 };

	while ((s->n + more) * 2 > cap)
		cap *= 2;
	if (cap == s->cap)
		return 0;
	ns.slot = calloc(cap, sizeof(*ns.slot));
	if (!ns.slot)
		return -ENOMEM;
	ns.cap = cap;
	for (size_t i = 0; i < s->cap; i++)
		if (s->slot[i])
			dm_u64set_add(&ns, s->slot[i]);
	free(s->slot);
	*s = ns;
	return 0;
}

static inline void dm_u64set_free(struct dm_u64set *s)
{
	free(s->slot);
	s->slot = NULL;
	s->cap = s->n = 0;
}

#endif
