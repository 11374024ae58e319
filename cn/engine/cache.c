/* cache.c: sharded CLOCK record cache with probabilistic admission (see cache.h). */
#include "cache.h"
#include "util/dm_hash.h"

#include <stdlib.h>
#include <string.h>

#define NSHARDS 64u
#define EMPTY   UINT32_MAX

struct shard {
	pthread_mutex_t lock;
	uint32_t nslots, used, hand;
	uint32_t tsize;            /* hash table size (power of two, >= 2 * nslots) */
	uint32_t *table;           /* open addressing: slot index or EMPTY */
	uint32_t *ids;             /* per slot: id */
	uint8_t *ref;              /* per slot: CLOCK reference bit */
	uint8_t *pinned;
	uint8_t *data;             /* nslots * rec_size */
	uint64_t rng;
	uint64_t hits, misses, inserts, rejects, evictions, npinned;
	char pad[64];
};

struct dm_cache {
	uint32_t rec_size;
	double admit_prob;
	size_t capacity;
	struct shard sh[NSHARDS];
};

static inline uint32_t hash_id(uint32_t id)
{
	uint64_t x = id * DM_GOLDEN64;

	return (uint32_t)(x >> 32);
}

static inline struct shard *shard_of(struct dm_cache *c, uint32_t id)
{
	return &c->sh[hash_id(id) % NSHARDS];
}

static inline uint64_t next_rand(uint64_t *s)
{
	return dm_splitmix64(s);
}

struct dm_cache *dm_cache_new(size_t capacity_bytes, uint32_t rec_size, double admit_prob,
			      uint64_t seed)
{
	struct dm_cache *c;
	uint64_t total;

	if (rec_size == 0 || !(admit_prob >= 0 && admit_prob <= 1)) {
		errno = EINVAL;
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->rec_size = rec_size;
	c->admit_prob = admit_prob;
	total = capacity_bytes / rec_size;
	c->capacity = (size_t)total * rec_size;
	for (uint32_t i = 0; i < NSHARDS; i++) {
		struct shard *s = &c->sh[i];
		uint32_t n = (uint32_t)(total / NSHARDS + (i < total % NSHARDS));
		uint32_t ts = 4;

		while (ts < 2 * n)
			ts <<= 1;
		pthread_mutex_init(&s->lock, NULL);
		s->nslots = n;
		s->tsize = ts;
		s->rng = seed ^ (0x1234567ull * (i + 1));
		s->table = malloc(ts * sizeof(uint32_t));
		s->ids = calloc(n ? n : 1, sizeof(uint32_t));
		s->ref = calloc(n ? n : 1, 1);
		s->pinned = calloc(n ? n : 1, 1);
		s->data = malloc((size_t)(n ? n : 1) * rec_size);
		if (!s->table || !s->ids || !s->ref || !s->pinned || !s->data) {
			dm_cache_free(c);
			errno = ENOMEM;
			return NULL;
		}
		memset(s->table, 0xff, ts * sizeof(uint32_t));
	}
	return c;
}

void dm_cache_free(struct dm_cache *c)
{
	if (!c)
		return;
	for (uint32_t i = 0; i < NSHARDS; i++) {
		struct shard *s = &c->sh[i];

		pthread_mutex_destroy(&s->lock);
		free(s->table);
		free(s->ids);
		free(s->ref);
		free(s->pinned);
		free(s->data);
	}
	free(c);
}

/* Table position holding id, or the empty position where it would go. */
static uint32_t probe(const struct shard *s, uint32_t id, bool *found)
{
	uint32_t mask = s->tsize - 1, pos = hash_id(id) >> 6 & mask;

	for (;;) {
		uint32_t slot = s->table[pos];

		if (slot == EMPTY) {
			*found = false;
			return pos;
		}
		if (s->ids[slot] == id) {
			*found = true;
			return pos;
		}
		pos = (pos + 1) & mask;
	}
}

/* Remove table position pos (backward-shift deletion keeps linear probing correct). */
static void table_remove(struct shard *s, uint32_t pos)
{
	uint32_t mask = s->tsize - 1, next = (pos + 1) & mask;

	s->table[pos] = EMPTY;
	while (s->table[next] != EMPTY) {
		uint32_t slot = s->table[next];
		uint32_t home = hash_id(s->ids[slot]) >> 6 & mask;

		/* Move it back if its home is not in (pos, next]. */
		if ((next > pos && (home <= pos || home > next)) ||
		    (next < pos && (home <= pos && home > next))) {
			s->table[pos] = slot;
			s->table[next] = EMPTY;
			pos = next;
		}
		next = (next + 1) & mask;
	}
}

bool dm_cache_get(struct dm_cache *c, uint32_t id, void *out)
{
	struct shard *s = shard_of(c, id);
	bool found = false;
	uint32_t pos;

	pthread_mutex_lock(&s->lock);
	if (s->nslots) {
		pos = probe(s, id, &found);
		if (found) {
			uint32_t slot = s->table[pos];

			memcpy(out, s->data + (size_t)slot * c->rec_size, c->rec_size);
			s->ref[slot] = 1;
		}
	}
	if (found)
		s->hits++;
	else
		s->misses++;
	pthread_mutex_unlock(&s->lock);
	return found;
}

bool dm_cache_contains(struct dm_cache *c, uint32_t id)
{
	struct shard *s = shard_of(c, id);
	bool found = false;

	pthread_mutex_lock(&s->lock);
	if (s->nslots)
		probe(s, id, &found);
	pthread_mutex_unlock(&s->lock);
	return found;
}

/* CLOCK: advance the hand, clearing reference bits, to the first unreferenced unpinned slot.
 * Returns EMPTY when every slot is pinned. */
static uint32_t find_victim(struct shard *s)
{
	for (uint32_t step = 0; step < 2 * s->nslots + 1; step++) {
		uint32_t slot = s->hand;

		s->hand = (s->hand + 1) % s->nslots;
		if (s->pinned[slot])
			continue;
		if (s->ref[slot]) {
			s->ref[slot] = 0;
			continue;
		}
		return slot;
	}
	return EMPTY;
}

bool dm_cache_put(struct dm_cache *c, uint32_t id, const void *rec, bool pin)
{
	struct shard *s = shard_of(c, id);
	bool found, ok = false;
	uint32_t pos, slot;

	pthread_mutex_lock(&s->lock);
	if (!s->nslots)
		goto out;
	/* Pinned records never leave: keep at least half of every shard for the rest. */
	if (pin && s->npinned >= s->nslots / 2)
		pin = false;
	pos = probe(s, id, &found);
	if (found) {
		slot = s->table[pos];
		if (pin && !s->pinned[slot]) {
			s->pinned[slot] = 1;
			s->npinned++;
		}
		ok = true;
		goto out;
	}
	if (s->used < s->nslots) {
		slot = s->used++;
	} else {
		uint32_t vpos;
		bool vfound;

		if (!pin && c->admit_prob < 1.0 &&
		    (double)(next_rand(&s->rng) >> 11) / 9007199254740992.0 >= c->admit_prob) {
			s->rejects++;
			goto out;
		}
		slot = find_victim(s);
		if (slot == EMPTY) {
			s->rejects++;
			goto out;
		}
		vpos = probe(s, s->ids[slot], &vfound);
		table_remove(s, vpos);
		s->evictions++;
		pos = probe(s, id, &found);
	}
	s->ids[slot] = id;
	s->ref[slot] = 0;
	s->pinned[slot] = pin;
	if (pin)
		s->npinned++;
	memcpy(s->data + (size_t)slot * c->rec_size, rec, c->rec_size);
	s->table[pos] = slot;
	s->inserts++;
	ok = true;
out:
	pthread_mutex_unlock(&s->lock);
	return ok;
}

void dm_cache_for_each(struct dm_cache *c, void (*fn)(void *arg, uint32_t id), void *arg)
{
	for (uint32_t i = 0; i < NSHARDS; i++) {
		struct shard *s = &c->sh[i];

		pthread_mutex_lock(&s->lock);
		for (uint32_t slot = 0; slot < s->used; slot++)
			fn(arg, s->ids[slot]);
		pthread_mutex_unlock(&s->lock);
	}
}

void dm_cache_stats(struct dm_cache *c, struct dm_cache_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->capacity_bytes = c->capacity;
	for (uint32_t i = 0; i < NSHARDS; i++) {
		struct shard *s = &c->sh[i];

		pthread_mutex_lock(&s->lock);
		st->hits += s->hits;
		st->misses += s->misses;
		st->inserts += s->inserts;
		st->rejects += s->rejects;
		st->evictions += s->evictions;
		st->entries += s->used;
		st->pinned += s->npinned;
		pthread_mutex_unlock(&s->lock);
	}
	st->bytes = st->entries * c->rec_size;
}

void dm_cache_clear(struct dm_cache *c)
{
	for (uint32_t i = 0; i < NSHARDS; i++) {
		struct shard *s = &c->sh[i];

		pthread_mutex_lock(&s->lock);
		memset(s->table, 0xff, s->tsize * sizeof(uint32_t));
		s->used = 0;
		s->hand = 0;
		s->npinned = 0;
		pthread_mutex_unlock(&s->lock);
	}
}
