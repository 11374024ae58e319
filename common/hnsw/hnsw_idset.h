/* hnsw_idset.h: a set of node ids sized to one query, not to the index: open addressing
 * over a power-of-two table (UINT32_MAX = empty), doubled when half full. The visited set
 * of the resumable query (hnsw_query.c) and of the level-1 beam (hnsw_upq.c), which may
 * not use the searcher's per-node tags. Internal to common/hnsw. */
#ifndef DM_HNSW_IDSET_H
#define DM_HNSW_IDSET_H

#include "dm.h"
#include "util/dm_hash.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HNSW_IDSET_EMPTY UINT32_MAX

struct hnsw_idset {
	uint32_t *a;
	uint32_t cap, n;    /* cap: a power of two */
};

/* An empty set with room for cap/2 ids (cap a power of two >= 16). 0 or -ENOMEM. */
static inline int hnsw_idset_init(struct hnsw_idset *s, uint32_t cap)
{
	s->a = malloc((size_t)cap * sizeof(*s->a));
	if (!s->a)
		return -ENOMEM;
	memset(s->a, 0xff, (size_t)cap * sizeof(*s->a));
	s->cap = cap;
	s->n = 0;
	return 0;
}

static inline void hnsw_idset_fini(struct hnsw_idset *s)
{
	free(s->a);
	s->a = NULL;
	s->cap = s->n = 0;
}

static inline void hnsw_idset_clear(struct hnsw_idset *s)
{
	memset(s->a, 0xff, (size_t)s->cap * sizeof(*s->a));
	s->n = 0;
}

static inline uint32_t hnsw_idset_hash(uint32_t id)
{
	return (uint32_t)((id * DM_GOLDEN64) >> 32);
}

/* Move every id into a table of cap slots. 0 or -ENOMEM (the set unchanged). */
static inline int hnsw_idset_rehash(struct hnsw_idset *s, uint32_t cap)
{
	uint32_t *na = malloc((size_t)cap * sizeof(*na));

	if (!na)
		return -ENOMEM;
	memset(na, 0xff, (size_t)cap * sizeof(*na));
	for (uint32_t i = 0; i < s->cap; i++) {
		if (s->a[i] == HNSW_IDSET_EMPTY)
			continue;
		uint32_t pos = hnsw_idset_hash(s->a[i]) & (cap - 1);

		while (na[pos] != HNSW_IDSET_EMPTY)
			pos = (pos + 1) & (cap - 1);
		na[pos] = s->a[i];
	}
	free(s->a);
	s->a = na;
	s->cap = cap;
	return 0;
}

/* Add id (< UINT32_MAX): 1 when it was not in the set, 0 when it was, -ENOMEM. */
static inline int hnsw_idset_add(struct hnsw_idset *s, uint32_t id)
{
	uint32_t mask, pos;

	if (dm_unlikely(2 * (s->n + 1) > s->cap) && hnsw_idset_rehash(s, 2 * s->cap))
		return -ENOMEM;
	mask = s->cap - 1;
	pos = hnsw_idset_hash(id) & mask;
	while (s->a[pos] != HNSW_IDSET_EMPTY) {
		if (s->a[pos] == id)
			return 0;
		pos = (pos + 1) & mask;
	}
	s->a[pos] = id;
	s->n++;
	return 1;
}

#endif
