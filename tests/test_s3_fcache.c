/* test_s3_fcache.c: the compute node's fragment cache (cn/s3/s3_fcache): hit and miss,
 * LRU eviction order, the byte bound (referenced entries never evicted), replacement of a
 * fragment whose version changed, the drop of an MN's older epoch, and O(1) work per
 * lookup and eviction over 10,000 fragments (counted, not timed). */
#include <criterion/criterion.h>

#include <stdio.h>

#include "s3_fcache.h"

static struct s3_fkey key(uint32_t mn, uint64_t frag, uint64_t epoch, int64_t created)
{
	return (struct s3_fkey){ .mn = mn, .frag = frag, .bucket = "bkt", .index = "idx",
				 .epoch = epoch, .created = created };
}

/* Get (expecting hit or miss), account bytes, release. */
static struct s3_frag *touch(struct s3_fcache *c, struct s3_fkey k, bool want_hit,
			     size_t bytes)
{
	bool hit;
	struct s3_frag *f = s3_fcache_get(c, &k, 4, &hit);

	cr_assert_not_null(f);
	cr_assert_eq(hit, want_hit, "frag %llu: hit %d, want %d", (unsigned long long)k.frag,
		     hit, want_hit);
	if (bytes)
		s3_fcache_account(c, f, bytes);
	s3_fcache_put(c, f);
	return f;
}

Test(s3fcache, hit_miss_and_lru_order)
{
	struct s3_fcache *c = s3_fcache_new(300);
	struct s3_fcache_stats st;

	cr_assert_not_null(c);
	touch(c, key(0, 1, 7, 1), false, 100);
	touch(c, key(0, 2, 7, 1), false, 100);
	touch(c, key(0, 3, 7, 1), false, 100);
	touch(c, key(0, 1, 7, 1), true, 0);        /* 1 is now the most recent: 2 is oldest */
	touch(c, key(0, 4, 7, 1), false, 100);     /* 400 > 300: evicts 2 */
	s3_fcache_stats(c, &st);
	cr_assert_eq(st.evictions, 1);
	cr_assert_eq(st.entries, 3);
	cr_assert_eq(st.bytes, 300);
	touch(c, key(0, 1, 7, 1), true, 0);
	touch(c, key(0, 3, 7, 1), true, 0);
	touch(c, key(0, 4, 7, 1), true, 0);
	touch(c, key(0, 2, 7, 1), false, 100);     /* evicts the oldest now: 1 */
	touch(c, key(0, 3, 7, 1), true, 0);
	touch(c, key(0, 1, 7, 1), false, 0);
	/* Other bucket / index / MN: other entries. */
	struct s3_fkey k = key(0, 3, 7, 1);

	k.index = "idy";
	touch(c, k, false, 0);
	touch(c, key(1, 3, 9, 1), false, 0);
	s3_fcache_stats(c, &st);
	cr_assert_eq(st.hits, 5);
	cr_assert_eq(st.misses, 8);
	cr_assert_leq(st.bytes, 300);
	s3_fcache_free(c);
}

Test(s3fcache, byte_bound_spares_referenced_entries)
{
	struct s3_fcache *c = s3_fcache_new(1000);
	struct s3_fcache_stats st;
	struct s3_frag *held[5];

	for (uint64_t i = 0; i < 5; i++) {
		struct s3_fkey k = key(0, i, 1, 1);

		held[i] = s3_fcache_get(c, &k, 4, NULL);
		cr_assert_not_null(held[i]);
		s3_fcache_account(c, held[i], 400);
	}
	/* 2000 bytes, all referenced: nothing can go. */
	s3_fcache_put(c, held[0]);             /* now unreferenced and over the bound: evicted */
	s3_fcache_stats(c, &st);
	cr_assert_eq(st.evictions, 1);
	cr_assert_eq(st.bytes, 1600);
	for (int i = 1; i < 5; i++)
		s3_fcache_put(c, held[i]);
	s3_fcache_stats(c, &st);
	cr_assert_leq(st.bytes, 1000);
	cr_assert_eq(st.entries, 2);             /* 3 and 4, released last */
	touch(c, key(0, 4, 1, 1), true, 0);
	touch(c, key(0, 3, 1, 1), true, 0);
	/* Growing an entry past the bound evicts the others at its release. */
	struct s3_fkey k = key(0, 9, 1, 1);
	struct s3_frag *big = s3_fcache_get(c, &k, 4, NULL);

	s3_fcache_account(c, big, 900);
	s3_fcache_put(c, big);
	s3_fcache_stats(c, &st);
	cr_assert_eq(st.bytes, 900);
	cr_assert_eq(st.entries, 1);
	s3_fcache_free(c);
}

Test(s3fcache, changed_fragment_is_replaced)
{
	struct s3_fcache *c = s3_fcache_new(1 << 20);
	struct s3_fcache_stats st;
	struct s3_fkey k = key(0, 5, 1, 100);
	struct s3_frag *old = s3_fcache_get(c, &k, 4, NULL), *nw;
	bool hit = true;

	s3_fcache_account(c, old, 500);
	old->rows = 0;
	/* The index was deleted and created again (created differs), while old is held. */
	k.created = 200;
	nw = s3_fcache_get(c, &k, 8, &hit);
	cr_assert_not_null(nw);
	cr_assert_not(hit);
	cr_assert_neq(nw, old);
	cr_assert_eq(nw->dim, 8);
	s3_fcache_stats(c, &st);
	cr_assert_eq(st.replaced, 1);
	cr_assert_eq(st.entries, 1);
	cr_assert_eq(st.bytes, 500);             /* old still counted while held */
	s3_fcache_put(c, old);                   /* freed now */
	s3_fcache_stats(c, &st);
	cr_assert_eq(st.bytes, 0);
	s3_fcache_put(c, nw);
	touch(c, k, true, 0);
	/* The old version is not found again. */
	k.created = 100;
	touch(c, k, false, 0);
	s3_fcache_stats(c, &st);
	cr_assert_eq(st.replaced, 2);
	s3_fcache_free(c);
}

Test(s3fcache, new_mn_epoch_drops_that_mns_old_entries)
{
	struct s3_fcache *c = s3_fcache_new(1 << 20);
	struct s3_fcache_stats st;

	for (uint64_t i = 0; i < 10; i++) {
		touch(c, key(0, i, 1, 1), false, 10);
		touch(c, key(1, i, 5, 1), false, 10);
	}
	touch(c, key(0, 100, 2, 1), false, 10);  /* mn0 restarted: epoch 2 */
	s3_fcache_stats(c, &st);
	cr_assert_eq(st.entries, 11);            /* mn1's ten + the new one */
	cr_assert_eq(st.bytes, 110);
	touch(c, key(1, 3, 5, 1), true, 0);
	s3_fcache_free(c);
}

Test(s3fcache, names_too_long_rejected)
{
	struct s3_fcache *c = s3_fcache_new(100);
	char longname[80];
	struct s3_fkey k = key(0, 1, 1, 1);

	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	k.bucket = longname;
	cr_assert_null(s3_fcache_get(c, &k, 4, NULL));
	cr_assert_eq(errno, EINVAL);
	cr_assert_null(s3_fcache_new(0));
	s3_fcache_free(c);
}

#define NFRAG 10000

/* Work per operation stays constant as the cache grows: every lookup looks at a bounded
 * number of chain entries on average, every eviction at one entry. (The old cache scanned
 * the whole list per fragment: 10,000 x 10,000 steps here.) */
Test(s3fcache, lookups_over_10000_fragments_are_o1)
{
	struct s3_fcache *c = s3_fcache_new(UINT64_MAX / 2);
	struct s3_fcache_stats a, b;

	for (uint64_t i = 0; i < NFRAG; i++)
		touch(c, key(0, i, 1, 1), false, 1000);
	s3_fcache_stats(c, &a);
	cr_assert_eq(a.entries, NFRAG);
	for (int round = 0; round < 3; round++)
		for (uint64_t i = 0; i < NFRAG; i++)
			touch(c, key(0, (i * 7919) % NFRAG, 1, 1), true, 0);
	s3_fcache_stats(c, &b);
	uint64_t lookups = b.lookups - a.lookups, probes = b.probes - a.probes;

	cr_assert_eq(lookups, 3 * NFRAG);
	/* Load factor <= 1: about 1.5 entries looked at per successful lookup. */
	cr_assert_lt(probes, 3 * lookups, "%llu probes for %llu lookups",
		     (unsigned long long)probes, (unsigned long long)lookups);
	cr_assert_lt(a.probes, 3ull * NFRAG, "inserting: %llu probes", (unsigned long long)a.probes);
	s3_fcache_free(c);

	/* Evictions: a cache of 100 fragments fed 10,000: one step per eviction. */
	c = s3_fcache_new(100 * 1000);
	for (uint64_t i = 0; i < NFRAG; i++)
		touch(c, key(0, i, 1, 1), false, 1000);
	s3_fcache_stats(c, &b);
	cr_assert_eq(b.evictions, NFRAG - 100);
	cr_assert_eq(b.evict_steps, b.evictions);
	cr_assert_lt(b.probes, 3ull * NFRAG, "%llu probes", (unsigned long long)b.probes);
	cr_assert_eq(b.entries, 100);
	s3_fcache_free(c);
}
