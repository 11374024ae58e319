/* test_cache.c: the compute node's record cache: byte bound, hits return the right
 * bytes, CLOCK eviction, admission policy, pinning, and consistency under concurrent use. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

#include "cache.h"

#define REC 256

static void make_rec(uint32_t id, uint8_t *r)
{
	for (uint32_t i = 0; i < REC; i++)
		r[i] = (uint8_t)(id * 31 + i);
}

static bool rec_ok(uint32_t id, const uint8_t *r)
{
	uint8_t want[REC];

	make_rec(id, want);
	return memcmp(want, r, REC) == 0;
}

Test(cache, bound_hits_and_stats)
{
	struct dm_cache *c = dm_cache_new(1000 * REC, REC, 1.0, 1);
	struct dm_cache_stats st;
	uint8_t r[REC], out[REC];

	cr_assert_not_null(c);
	for (uint32_t id = 0; id < 5000; id++) {
		make_rec(id, r);
		dm_cache_put(c, id, r, false);
	}
	dm_cache_stats(c, &st);
	cr_assert_leq(st.bytes, 1000 * REC, "the byte bound holds");
	cr_assert_eq(st.entries, 1000);
	cr_assert_eq(st.evictions, 4000);
	unsigned hits = 0;
	for (uint32_t id = 0; id < 5000; id++)
		if (dm_cache_get(c, id, out)) {
			cr_assert(rec_ok(id, out), "id %u returned wrong bytes", id);
			hits++;
		}
	cr_assert_eq(hits, 1000);
	dm_cache_stats(c, &st);
	cr_assert_eq(st.hits, 1000);
	cr_assert_eq(st.misses, 4000);
	dm_cache_free(c);
}

Test(cache, clock_keeps_referenced_records)
{
	struct dm_cache *c = dm_cache_new(64 * 16 * REC, REC, 1.0, 1);
	uint8_t r[REC], out[REC];

	/* Fill, touch the first half, then insert as many new records as half the capacity:
	 * CLOCK must evict the untouched half and keep the touched one. */
	for (uint32_t id = 0; id < 1024; id++) {
		make_rec(id, r);
		dm_cache_put(c, id, r, false);
	}
	/* Shards fill unevenly, so count only the touched records that were present. */
	static bool touched[1024];
	unsigned ntouched = 0, kept = 0;

	for (uint32_t id = 0; id < 1024; id += 2)
		if (dm_cache_get(c, id, out)) {
			touched[id] = true;
			ntouched++;
		}
	cr_assert_gt(ntouched, 400);
	for (uint32_t id = 10000; id < 10000 + 512; id++) {
		make_rec(id, r);
		dm_cache_put(c, id, r, false);
	}
	for (uint32_t id = 0; id < 1024; id += 2)
		kept += touched[id] && dm_cache_contains(c, id);
	/* FIFO or random replacement would keep about half; CLOCK keeps nearly all. */
	cr_assert_geq(kept, ntouched * 85 / 100, "only %u of %u referenced records survived",
		      kept, ntouched);
	dm_cache_free(c);
}

Test(cache, admission_and_pinning)
{
	struct dm_cache *c = dm_cache_new(640 * REC, REC, 0.0, 1);
	struct dm_cache_stats st;
	uint8_t r[REC];

	for (uint32_t id = 0; id < 64; id++) {
		make_rec(id, r);
		cr_assert(dm_cache_put(c, id, r, true));
	}
	for (uint32_t id = 100; id < 5000; id++) {
		make_rec(id, r);
		dm_cache_put(c, id, r, false);
	}
	dm_cache_stats(c, &st);
	cr_assert_eq(st.evictions, 0, "admission probability 0: nothing replaced once full");
	cr_assert_gt(st.rejects, 0);
	for (uint32_t id = 0; id < 64; id++)
		cr_assert(dm_cache_contains(c, id), "pinned %u evicted", id);
	dm_cache_free(c);

	c = dm_cache_new(0, REC, 1.0, 1);
	make_rec(1, r);
	cr_assert_not(dm_cache_put(c, 1, r, false), "a zero-byte cache holds nothing");
	cr_assert_not(dm_cache_get(c, 1, r));
	dm_cache_free(c);
	cr_assert_null(dm_cache_new(100, 0, 1.0, 1));
	cr_assert_null(dm_cache_new(100, REC, 1.5, 1));
}

/* Pinning asks for more than the cache can give: at most half of every shard is pinned, the
 * rest stays available to ordinary records (which still enter and get evicted). */
Test(cache, pinning_bounded_to_half)
{
	struct dm_cache *c = dm_cache_new(6400 * REC, REC, 1.0, 1);
	struct dm_cache_stats st;
	uint8_t r[REC];

	for (uint32_t id = 0; id < 20000; id++) {
		make_rec(id, r);
		dm_cache_put(c, id, r, true);
	}
	dm_cache_stats(c, &st);
	cr_assert_leq(st.pinned, 3200, "pinned %llu of 6400 slots", (unsigned long long)st.pinned);
	cr_assert_gt(st.pinned, 2800, "pinning up to the bound: %llu", (unsigned long long)st.pinned);
	for (uint32_t id = 100000; id < 120000; id++) {
		make_rec(id, r);
		dm_cache_put(c, id, r, false);
	}
	dm_cache_stats(c, &st);
	cr_assert_gt(st.evictions, 0, "unpinned slots are still replaced");
	cr_assert_geq(st.pinned, 2800, "pinned records stay");
	dm_cache_free(c);
}

struct worker {
	struct dm_cache *c;
	unsigned seed, bad;
};

static void *hammer(void *arg)
{
	struct worker *w = arg;
	uint8_t r[REC], out[REC];

	for (unsigned i = 0; i < 200000; i++) {
		uint32_t id = (uint32_t)(rand_r(&w->seed) % 20000);

		if (dm_cache_get(w->c, id, out)) {
			if (!rec_ok(id, out))
				w->bad++;
		} else {
			make_rec(id, r);
			dm_cache_put(w->c, id, r, false);
		}
	}
	return NULL;
}

Test(cache, concurrent_use_stays_consistent)
{
	struct dm_cache *c = dm_cache_new(2000 * REC, REC, 0.5, 7);
	struct worker w[4];
	pthread_t t[4];
	struct dm_cache_stats st;

	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){ .c = c, .seed = (unsigned)i + 1 };
		pthread_create(&t[i], NULL, hammer, &w[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(w[i].bad, 0, "thread %d saw %u wrong records", i, w[i].bad);
	}
	dm_cache_stats(c, &st);
	cr_assert_eq(st.hits + st.misses, 800000);
	cr_assert_leq(st.entries, 2000);
	dm_cache_free(c);
}
