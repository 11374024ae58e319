/* test_topk.c: the bounded heap against a full sort on random data (with many ties), the
 * deterministic tie-breaking by id, NaN handling, and the merge of sorted partial lists
 * (dedup by id, both the small no-allocation path and the heap + hash path) against a
 * reference built by sorting everything. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "topk.h"
#include "util/dm_hash.h"

static uint64_t rng_state = 12345;

static uint64_t rng_next(void)
{
	return dm_splitmix64(&rng_state);
}

static int cmp_qsort(const void *a, const void *b)
{
	return dm_hit_cmp(a, b);
}

static void assert_same(const struct dm_hit *got, const struct dm_hit *want, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		cr_assert(got[i].id == want[i].id && got[i].dist == want[i].dist,
			  "position %zu: got (%g, %llu) want (%g, %llu)", i, (double)got[i].dist,
			  (unsigned long long)got[i].id, (double)want[i].dist,
			  (unsigned long long)want[i].id);
	}
}

/* Pushes n random hits into a top-k and compares with sorting all of them. */
static void heap_vs_sort(size_t k, size_t n, unsigned distinct_dists)
{
	struct dm_topk *t = dm_topk_new(k);
	struct dm_hit *all = malloc((n + 1) * sizeof(*all)), *out = malloc(k * sizeof(*out));
	cr_assert(t && all && out);

	for (size_t i = 0; i < n; i++) {
		/* few distinct distances -> many ties, decided by id */
		all[i].dist = distinct_dists ? (float)(rng_next() % distinct_dists)
					     : (float)(rng_next() >> 40) / 1024.0f;
		all[i].pad = 0;
		all[i].id = rng_next() % (4 * n + 1);  /* ids may repeat: heap does not dedup */
		dm_topk_push(t, all[i].dist, all[i].id);
		if (i + 1 < k)
			cr_assert(isinf(dm_topk_bound(t)));
	}
	qsort(all, n, sizeof(*all), cmp_qsort);
	size_t want = DM_MIN(k, n);
	if (n >= k)
		cr_assert_eq(dm_topk_bound(t), all[k - 1].dist);
	size_t got = dm_topk_drain(t, out);
	cr_assert_eq(got, want);
	assert_same(out, all, want);
	cr_assert_eq(t->n, 0, "drain leaves the heap empty");
	dm_topk_free(t);
	free(all);
	free(out);
}

Test(topk, heap_matches_sort)
{
	static const size_t ks[] = { 1, 2, 5, 10, 100, 1000 };
	static const size_t ns[] = { 0, 1, 7, 100, 5000 };
	for (size_t a = 0; a < DM_ARRAY_SIZE(ks); a++)
		for (size_t b = 0; b < DM_ARRAY_SIZE(ns); b++) {
			heap_vs_sort(ks[a], ns[b], 0);
			heap_vs_sort(ks[a], ns[b], 3);
			heap_vs_sort(ks[a], ns[b], 50);
		}
}

Test(topk, ties_broken_by_id)
{
	struct dm_topk *t = dm_topk_new(10);
	struct dm_hit out[10];
	uint64_t ids[1000];
	for (int i = 0; i < 1000; i++)
		ids[i] = (uint64_t)i * 7 + 100;
	for (int i = 999; i > 0; i--) {  /* shuffle */
		int j = (int)(rng_next() % (uint64_t)(i + 1));
		uint64_t x = ids[i];
		ids[i] = ids[j];
		ids[j] = x;
	}
	for (int i = 0; i < 1000; i++)
		dm_topk_push(t, 0.5f, ids[i]);
	cr_assert_eq(dm_topk_drain(t, out), 10);
	for (int i = 0; i < 10; i++) {
		cr_assert_eq(out[i].id, (uint64_t)i * 7 + 100);
		cr_assert_eq(out[i].dist, 0.5f);
	}
	dm_topk_free(t);
}

Test(topk, nan_never_beats_a_number)
{
	struct dm_topk *t = dm_topk_new(2);
	struct dm_hit out[2];
	dm_topk_push(t, NAN, 1);
	dm_topk_push(t, NAN, 2);
	dm_topk_push(t, 5.0f, 3);
	dm_topk_push(t, NAN, 0);
	dm_topk_push(t, INFINITY, 4);
	cr_assert_eq(dm_topk_drain(t, out), 2);
	cr_assert_eq(out[0].id, 3);
	cr_assert_eq(out[1].id, 4);
	dm_topk_free(t);
}

Test(topk, reset_reuse_and_bad_k)
{
	struct dm_topk *t = dm_topk_new(3);
	struct dm_hit out[3];
	for (int i = 0; i < 10; i++)
		dm_topk_push(t, (float)i, (uint64_t)i);
	cr_assert_eq(dm_topk_bound(t), 2.0f);
	dm_topk_reset(t);
	cr_assert(isinf(dm_topk_bound(t)));
	dm_topk_push(t, 9.0f, 9);
	cr_assert_eq(dm_topk_drain(t, out), 1);
	cr_assert_eq(out[0].id, 9);
	dm_topk_free(t);
	dm_topk_free(NULL);

	errno = 0;
	cr_assert_null(dm_topk_new(0));
	cr_assert_eq(errno, EINVAL);
	cr_assert_null(dm_topk_new(SIZE_MAX / 2));
}

/* Reference merge: all hits, best distance per id, sorted, first k. */
static size_t merge_reference(struct dm_hit *all, size_t n, size_t k, struct dm_hit *out)
{
	qsort(all, n, sizeof(*all), cmp_qsort);
	size_t m = 0;
	for (size_t i = 0; i < n && m < k; i++) {
		bool seen = false;
		for (size_t j = 0; j < m && !seen; j++)
			seen = out[j].id == all[i].id;
		if (!seen)
			out[m++] = all[i];
	}
	return m;
}

/* Random sorted lists with ids shared across lists (different distances), then merge. */
static void merge_case(size_t nlists, size_t maxlen, size_t k, uint64_t id_range,
		       unsigned distinct_dists)
{
	struct dm_hit **lists = calloc(nlists, sizeof(*lists));
	size_t *lens = calloc(nlists, sizeof(*lens)), total = 0;
	for (size_t l = 0; l < nlists; l++) {
		lens[l] = maxlen ? rng_next() % (maxlen + 1) : 0;
		lists[l] = malloc((lens[l] + 1) * sizeof(struct dm_hit));
		for (size_t i = 0; i < lens[l]; i++) {
			lists[l][i].dist = (float)(rng_next() % distinct_dists);
			lists[l][i].pad = 0;
			/* an id appears at most once per list, as in a real partial result */
			bool dup;
			do {
				lists[l][i].id = rng_next() % id_range;
				dup = false;
				for (size_t j = 0; j < i; j++)
					dup |= lists[l][j].id == lists[l][i].id;
			} while (dup && lens[l] < id_range);
		}
		qsort(lists[l], lens[l], sizeof(struct dm_hit), cmp_qsort);
		total += lens[l];
	}
	struct dm_hit *all = malloc((total + 1) * sizeof(*all));
	struct dm_hit *want = malloc((k + 1) * sizeof(*want)), *got = malloc((k + 1) * sizeof(*got));
	size_t p = 0;
	for (size_t l = 0; l < nlists; l++) {
		memcpy(all + p, lists[l], lens[l] * sizeof(*all));
		p += lens[l];
	}
	size_t nwant = merge_reference(all, total, k, want);
	size_t ngot = dm_topk_merge((const struct dm_hit *const *)lists, lens, nlists, k, got);
	cr_assert_eq(ngot, nwant, "nlists %zu k %zu: got %zu want %zu", nlists, k, ngot, nwant);
	assert_same(got, want, nwant);
	for (size_t l = 0; l < nlists; l++)
		free(lists[l]);
	free(lists);
	free(lens);
	free(all);
	free(want);
	free(got);
}

Test(topk, merge_matches_reference)
{
	for (int rep = 0; rep < 20; rep++) {
		/* small: no-allocation path (<= 4 lists, k <= 64) */
		merge_case(1, 20, 10, 30, 5);
		merge_case(3, 30, 10, 40, 4);
		merge_case(4, 50, 64, 60, 100);
		merge_case(2, 5, 64, 100, 3);   /* k larger than the total */
		/* heap + hash path */
		merge_case(5, 30, 10, 50, 6);
		merge_case(16, 200, 100, 500, 50);
		merge_case(64, 100, 1000, 2000, 1000);
		merge_case(3, 500, 300, 600, 20);
	}
	merge_case(8, 0, 10, 10, 2);  /* all empty */
}

Test(topk, merge_dedup_keeps_smallest)
{
	struct dm_hit a[] = { { 1.0f, 0, 7 }, { 2.0f, 0, 8 }, { 3.0f, 0, 9 } };
	struct dm_hit b[] = { { 0.5f, 0, 8 }, { 2.5f, 0, 7 }, { 4.0f, 0, 10 } };
	const struct dm_hit *lists[] = { a, b };
	size_t lens[] = { 3, 3 };
	struct dm_hit out[5];
	size_t n = dm_topk_merge(lists, lens, 2, 5, out);
	cr_assert_eq(n, 4);
	cr_assert_eq(out[0].id, 8);
	cr_assert_eq(out[0].dist, 0.5f);
	cr_assert_eq(out[1].id, 7);
	cr_assert_eq(out[1].dist, 1.0f);
	cr_assert_eq(out[2].id, 9);
	cr_assert_eq(out[3].id, 10);
	cr_assert_eq(dm_topk_merge(lists, lens, 2, 0, out), 0);
	cr_assert_eq(dm_topk_merge(lists, lens, 0, 5, out), 0);
}
