/* cache.h: the compute node's record cache, shared by all worker threads.
 *
 * Bounded in bytes (the cache ratio times the index size), fixed-size slots of one record
 * each, split into shards with their own lock, hash table and CLOCK hand so that lookups
 * from different threads rarely meet (no global lock). Eviction is CLOCK (second chance);
 * admission follows SHINE: everything is admitted while there is free space, afterwards a
 * record replaces a victim only with probability admit_prob, so that a scan of cold records
 * does not flush the hot set. Pinned records (the top HNSW levels' nodes, see
 * dindex_pin_level) are never evicted and bypass the admission policy; at most half of a
 * shard's slots are pinned, further pin requests are cached as ordinary records.
 */
#ifndef DM_CN_CACHE_H
#define DM_CN_CACHE_H

#include <pthread.h>

#include "dm.h"

struct dm_cache_stats {
	uint64_t hits, misses, inserts, rejects, evictions;
	uint64_t bytes;           /* bytes held in used slots */
	uint64_t capacity_bytes;
	uint64_t entries, pinned;
};

struct dm_cache;

/* Constructor: room for floor(capacity_bytes / rec_size) records (0 is a valid, always
 * missing cache). admit_prob in [0,1]. NULL + errno. */
struct dm_cache *dm_cache_new(size_t capacity_bytes, uint32_t rec_size, double admit_prob,
			      uint64_t seed);
void dm_cache_free(struct dm_cache *c);

/* Copy the record of id into out (rec_size bytes) if cached: true on a hit. */
bool dm_cache_get(struct dm_cache *c, uint32_t id, void *out);
/* Offer a record just read. pin: keep it forever (upper-level nodes). Returns true if it
 * is now cached. */
bool dm_cache_put(struct dm_cache *c, uint32_t id, const void *rec, bool pin);
/* Whether id is cached (no copy, no counter change; for CSP sampling). */
bool dm_cache_contains(struct dm_cache *c, uint32_t id);
/* Call fn for every cached id (shard by shard, each under its lock). */
void dm_cache_for_each(struct dm_cache *c, void (*fn)(void *arg, uint32_t id), void *arg);
void dm_cache_stats(struct dm_cache *c, struct dm_cache_stats *st);
void dm_cache_clear(struct dm_cache *c);

#endif
