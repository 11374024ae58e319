/* test_vhash_frontier.c: the bounded-fanout frontier over key-ordered fragments
 * (oracle/vhash_frontier.c): the budget (B, B_wide), no duplicates, the owner first, the
 * ring stage in key order, region hints over layouts where a region spans many fragments and
 * where a fragment holds many regions, widening exactly when the relative gap is below the
 * threshold, determinism, the key of a query at a region, and refused input.
 */
#include <criterion/criterion.h>

#include "vhash.h"
#include "vhash_frontier.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_rng.h"

#define N    3000
#define DIM  8
#define K    24
#define SEED 11
#define NQ   200

static struct dm_vhash *vh;
static float *data, *queries;

static void setup(void)
{
	data = rng_mixture(SEED, N, DIM, 16, 12.0, NULL, NULL);
	queries = rng_mixture(SEED + 100, NQ, DIM, 16, 12.0, NULL, NULL);
	vh = dm_vhash_fit(data, N, DIM, K, SEED, NULL);
	cr_assert(vh, "fit: errno %d", errno);
}

static void teardown(void)
{
	dm_vhash_free(vh);
	free(data);
	free(queries);
}

/* F fragments of equal key width (the last takes the remainder). */
static void layout_even(uint32_t f, uint64_t *lo, uint64_t *hi)
{
	uint64_t w = UINT64_MAX / f;
	for (uint32_t i = 0; i < f; i++) {
		lo[i] = (uint64_t)i * w;
		hi[i] = i + 1 < f ? (uint64_t)(i + 1) * w - 1 : UINT64_MAX;
	}
}

/* F fragments of about equal rows of `data` in key order (the bench's layout): fragment i
 * starts at the key of the row at rank floor(i N / F), kept strictly increasing. */
static void layout_rows(uint32_t f, uint64_t *lo, uint64_t *hi)
{
	uint64_t *keys = malloc(N * sizeof(*keys));
	cr_assert(keys);
	for (size_t i = 0; i < N; i++)
		keys[i] = dm_vhash_key(vh, data + i * DIM, NULL);
	for (size_t i = 1; i < N; i++) /* insertion sort: small */
		for (size_t j = i; j > 0 && keys[j - 1] > keys[j]; j--) {
			uint64_t t = keys[j];
			keys[j] = keys[j - 1];
			keys[j - 1] = t;
		}
	lo[0] = 0;
	for (uint32_t i = 1; i < f; i++)
		lo[i] = DM_MAX(keys[(size_t)i * N / f], lo[i - 1] + 1);
	for (uint32_t i = 0; i + 1 < f; i++)
		hi[i] = lo[i + 1] - 1;
	hi[f - 1] = UINT64_MAX;
	free(keys);
	cr_assert_eq(dm_frontier_layout_check(lo, hi, f), 0);
}

static void assert_distinct(const uint32_t *out, int n, uint32_t f)
{
	for (int i = 0; i < n; i++) {
		cr_assert_lt(out[i], f);
		for (int j = 0; j < i; j++)
			cr_assert_neq(out[i], out[j], "fragment %u twice", out[i]);
	}
}

TestSuite(vhash_frontier, .init = setup, .fini = teardown);

Test(vhash_frontier, key_at_is_the_key)
{
	for (int i = 0; i < NQ; i++) {
		const float *q = queries + (size_t)i * DIM;
		uint32_t r;
		double d2;
		uint64_t key = dm_vhash_key(vh, q, &r);
		cr_assert_eq(dm_vhash_nearest(vh, q, &d2), r);
		cr_assert_eq(dm_vhash_key_at(vh, r, d2), key);
		/* at any region, the key stays inside that region's interval */
		for (uint32_t j = 0; j < K; j++) {
			double dj = 0;
			for (int d = 0; d < DIM; d++) {
				double t = (double)q[d] - vh->centroids[(size_t)j * DIM + d];
				dj += t * t;
			}
			uint64_t kj = dm_vhash_key_at(vh, j, dj);
			cr_assert(kj >= vh->lo[j] && kj <= vh->hi[j]);
		}
	}
}

Test(vhash_frontier, layout_check)
{
	uint64_t lo[8], hi[8];
	layout_even(8, lo, hi);
	cr_assert_eq(dm_frontier_layout_check(lo, hi, 8), 0);
	cr_assert_eq(dm_frontier_layout_check(lo, hi, 0), -EINVAL);
	cr_assert_eq(dm_frontier_layout_check(NULL, hi, 8), -EINVAL);
	cr_assert_eq(dm_frontier_layout_check(lo, NULL, 8), -EINVAL);
	cr_assert_eq(dm_frontier_layout_check(lo, hi, 7), -EINVAL); /* does not reach the end */
	uint64_t one_lo = 0, one_hi = UINT64_MAX;
	cr_assert_eq(dm_frontier_layout_check(&one_lo, &one_hi, 1), 0);
	cr_assert_eq(dm_frontier_fragment(&one_lo, 1, 12345), 0);

	lo[0] = 1; /* not from 0 */
	cr_assert_eq(dm_frontier_layout_check(lo, hi, 8), -EINVAL);
	layout_even(8, lo, hi);
	lo[3] += 1; /* a gap */
	cr_assert_eq(dm_frontier_layout_check(lo, hi, 8), -EINVAL);
	layout_even(8, lo, hi);
	lo[3] -= 1; /* an overlap */
	cr_assert_eq(dm_frontier_layout_check(lo, hi, 8), -EINVAL);
	layout_even(8, lo, hi);
	hi[4] = lo[4] - 1; /* reversed (and a gap) */
	lo[5] = hi[4] + 1;
	cr_assert_eq(dm_frontier_layout_check(lo, hi, 8), -EINVAL);
	layout_even(8, lo, hi);
	hi[2] = UINT64_MAX; /* ends early */
	cr_assert_eq(dm_frontier_layout_check(lo, hi, 8), -EINVAL);

	layout_even(8, lo, hi);
	for (uint32_t f = 0; f < 8; f++) {
		cr_assert_eq(dm_frontier_fragment(lo, 8, lo[f]), f);
		cr_assert_eq(dm_frontier_fragment(lo, 8, hi[f]), f);
	}
}

Test(vhash_frontier, bad_input)
{
	uint64_t lo[8], hi[8];
	uint32_t out[16];
	struct dm_frontier_opts o;
	const float *q = queries;

	layout_even(8, lo, hi);
	dm_frontier_opts_default(&o);
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), 4);
	cr_assert_eq(dm_vhash_frontier(NULL, lo, hi, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	cr_assert_eq(dm_vhash_frontier(vh, NULL, hi, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	cr_assert_eq(dm_vhash_frontier(vh, lo, NULL, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 0, q, 4, &o, out, 16, NULL), -EINVAL);
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, NULL, 4, &o, out, 16, NULL), -EINVAL);
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 0, &o, out, 16, NULL), -EINVAL);
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, NULL, 16, NULL), -EINVAL);
	/* room: min(F, B) without widening, min(F, B + extra) with */
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 3, NULL), -EINVAL);
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 4, NULL), 4);
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 100, &o, out, 8, NULL), 8);
	o.widen = true;
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 4, NULL), -EINVAL);
	cr_assert_gt(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 5, NULL), 0);
	cr_assert_gt(dm_vhash_frontier(vh, lo, hi, 8, q, UINT32_MAX, &o, out, 8, NULL), 0);
	/* a bad layout */
	lo[5] += 1;
	dm_frontier_opts_default(&o);
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	layout_even(8, lo, hi);
	/* bad opts */
	o.hints = 0;
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	o.hints = DM_FRONTIER_HINTS_MAX + 1;
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	o.hints = DM_FRONTIER_HINTS_MAX; /* more than K: min(r, K) used */
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), 4);
	dm_frontier_opts_default(&o);
	o.gap_rel = NAN;
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	o.gap_rel = -0.01;
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	o.gap_rel = 1.01;
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	dm_frontier_opts_default(&o);
	o.ring = 9;
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	o.ring = 8;
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), 4);
	dm_frontier_opts_default(&o);
	o.wide_extra = 9;
	cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, out, 16, NULL), -EINVAL);
	/* NULL opts: the defaults */
	uint32_t a[16], b[16];
	dm_frontier_opts_default(&o);
	int na = dm_vhash_frontier(vh, lo, hi, 8, q, 4, NULL, a, 16, NULL);
	int nb = dm_vhash_frontier(vh, lo, hi, 8, q, 4, &o, b, 16, NULL);
	cr_assert_eq(na, nb);
	cr_assert_arr_eq(a, b, (size_t)na * sizeof(*a));
}

/* Budget, distinctness, owner first, over three kinds of layout: F >> K (regions span
 * fragments), F ~ K by rows, F << K (fragments hold many regions). */
Test(vhash_frontier, budget_distinct_owner_first)
{
	static const uint32_t fs[] = { 2, 5, 32, 200 };
	uint64_t lo[200], hi[200];
	uint32_t out[256];
	struct dm_frontier_opts o;

	for (size_t li = 0; li < 2 * DM_ARRAY_SIZE(fs); li++) {
		uint32_t f = fs[li % DM_ARRAY_SIZE(fs)];
		if (li < DM_ARRAY_SIZE(fs))
			layout_even(f, lo, hi);
		else
			layout_rows(f, lo, hi);
		for (int w = 0; w < 2; w++) {
			dm_frontier_opts_default(&o);
			o.widen = w;
			o.wide_extra = DM_MIN(2u, f);
			for (int i = 0; i < NQ; i += 7) {
				const float *q = queries + (size_t)i * DIM;
				uint64_t key = dm_vhash_key(vh, q, NULL);
				uint32_t owner = dm_frontier_fragment(lo, f, key);
				for (uint32_t b = 1; b <= f + 3; b += (b < 20 ? 1 : 37)) {
					struct dm_frontier_info info;
					int n = dm_vhash_frontier(vh, lo, hi, f, q, b, &o, out, 256,
								  &info);
					cr_assert_gt(n, 0);
					uint32_t want = DM_MIN(b + (info.widened ? o.wide_extra : 0), f);
					/* exactly the budget: the default 64 hints cover all 24
					 * regions, hence every fragment */
					cr_assert_eq((uint32_t)n, want);
					cr_assert(!w || !info.widened || info.budget == b + o.wide_extra);
					if (!info.widened)
						cr_assert_eq(info.budget, b);
					assert_distinct(out, n, f);
					cr_assert_eq(out[0], owner, "F %u B %u: owner %u, first %u", f,
						     b, owner, out[0]);
					cr_assert_eq(info.owner, owner);
					cr_assert_eq(info.key, key);
				}
			}
		}
	}
}

/* With as many hints as regions, every fragment holding a region is reachable: the
 * frontier fills min(F, B) exactly. */
Test(vhash_frontier, fills_the_budget)
{
	uint64_t lo[64], hi[64];
	uint32_t out[64];
	struct dm_frontier_opts o;

	dm_frontier_opts_default(&o);
	o.hints = K;
	o.ring = 0;
	layout_rows(64, lo, hi);
	for (int i = 0; i < NQ; i += 5) {
		const float *q = queries + (size_t)i * DIM;
		/* fragments holding a region's interval: with rows cut at keys, every one does */
		for (uint32_t b = 1; b <= 64; b++) {
			int n = dm_vhash_frontier(vh, lo, hi, 64, q, b, &o, out, 64, NULL);
			cr_assert_eq(n, (int)b);
		}
	}
}

/* Without widening, a larger budget extends the list: the frontier of B is a prefix of
 * the frontier of B + 1 (stage order does not depend on the budget). */
Test(vhash_frontier, prefix_property)
{
	uint64_t lo[32], hi[32];
	uint32_t a[32], b[32];

	layout_rows(32, lo, hi);
	for (int i = 0; i < NQ; i += 3) {
		const float *q = queries + (size_t)i * DIM;
		int na = dm_vhash_frontier(vh, lo, hi, 32, q, 1, NULL, a, 32, NULL);
		for (uint32_t bb = 2; bb <= 32; bb++) {
			int nb = dm_vhash_frontier(vh, lo, hi, 32, q, bb, NULL, b, 32, NULL);
			cr_assert_geq(nb, na);
			cr_assert_arr_eq(a, b, (size_t)na * sizeof(*a));
			memcpy(a, b, (size_t)nb * sizeof(*a));
			na = nb;
		}
	}
}

/* The ring stage: right after the owner come its key neighbours, at most rho each side,
 * the nearer in key to the query first. */
Test(vhash_frontier, ring_stage_in_key_order)
{
	uint64_t lo[200], hi[200];
	uint32_t out[8];
	struct dm_frontier_opts o;

	layout_even(200, lo, hi);
	dm_frontier_opts_default(&o);
	o.ring = 2;
	for (int i = 0; i < NQ; i++) {
		const float *q = queries + (size_t)i * DIM;
		uint64_t key = dm_vhash_key(vh, q, NULL);
		uint32_t ow = dm_frontier_fragment(lo, 200, key);
		uint32_t nring = (ow >= 2 ? 2 : ow) + (ow + 2 < 200 ? 2 : 199 - ow);
		int n = dm_vhash_frontier(vh, lo, hi, 200, q, 1 + nring, &o, out, 8, NULL);
		cr_assert_eq(n, (int)(1 + nring));
		cr_assert_eq(out[0], ow);
		for (uint32_t j = 1; j <= nring; j++)
			cr_assert(out[j] + 2 >= ow && out[j] <= ow + 2 && out[j] != ow);
		/* the first neighbour is the side nearer the key (ties: predecessor) */
		if (ow > 0 && ow < 199) {
			uint64_t dl = key - hi[ow - 1], dr = lo[ow + 1] - key;
			cr_assert_eq(out[1], dl <= dr ? ow - 1 : ow + 1);
		}
		/* rho = 0: the owner, then straight to the hints */
		o.ring = 0;
		n = dm_vhash_frontier(vh, lo, hi, 200, q, 1, &o, out, 8, NULL);
		cr_assert_eq(n, 1);
		cr_assert_eq(out[0], ow);
		o.ring = 2;
	}
}

/* A region spanning many fragments (F = 200 >> K = 24): with no ring and one hint, the
 * frontier is exactly the nearest region's fragments, growing outwards from the owner, each
 * prefix a contiguous run that holds the owner. */
Test(vhash_frontier, region_spans_fragments)
{
	uint64_t lo[200], hi[200];
	uint32_t out[200];
	struct dm_frontier_opts o;
	int spanning = 0;

	layout_even(200, lo, hi);
	dm_frontier_opts_default(&o);
	o.ring = 0;
	o.hints = 1;
	for (int i = 0; i < NQ; i++) {
		const float *q = queries + (size_t)i * DIM;
		uint32_t r;
		uint64_t key = dm_vhash_key(vh, q, &r);
		uint32_t fa = dm_frontier_fragment(lo, 200, vh->lo[r]);
		uint32_t fb = dm_frontier_fragment(lo, 200, vh->hi[r]);
		int n = dm_vhash_frontier(vh, lo, hi, 200, q, 200, &o, out, 200, NULL);
		cr_assert_eq(n, (int)(fb - fa + 1), "region %u: fragments %u..%u, frontier %d", r,
			     fa, fb, n);
		spanning += fb > fa;
		cr_assert_eq(out[0], dm_frontier_fragment(lo, 200, key));
		uint32_t mn = out[0], mx = out[0];
		for (int j = 1; j < n; j++) {
			cr_assert(out[j] == mn - 1 || out[j] == mx + 1, "not outwards");
			mn = DM_MIN(mn, out[j]);
			mx = DM_MAX(mx, out[j]);
		}
		cr_assert(mn == fa && mx == fb);
	}
	cr_assert_gt(spanning, NQ / 2); /* the layout does what the test is for */
}

/* Fragments holding several regions (F = 2, 5 << K = 24): hints that land on a fragment
 * already chosen add nothing; the list is the distinct fragments of the stages. */
Test(vhash_frontier, fragments_hold_many_regions)
{
	uint64_t lo[5], hi[5];
	uint32_t out[5];
	struct dm_frontier_opts o;

	dm_frontier_opts_default(&o);
	o.ring = 0;
	o.hints = K;
	layout_rows(5, lo, hi);
	for (int i = 0; i < NQ; i++) {
		const float *q = queries + (size_t)i * DIM;
		uint32_t regions[K];
		double dist[K];
		cr_assert_eq(dm_vhash_rank(vh, q, regions, dist, K), K);
		/* expected: the fragments of each region in rank order, deduplicated */
		uint32_t want[5], nw = 0;
		for (int j = 0; j < K && nw < 5; j++) {
			uint32_t fa = dm_frontier_fragment(lo, 5, vh->lo[regions[j]]);
			uint32_t fb = dm_frontier_fragment(lo, 5, vh->hi[regions[j]]);
			for (uint32_t f = fa; f <= fb; f++) {
				bool seen = false;
				for (uint32_t t = 0; t < nw; t++)
					seen |= want[t] == f;
				if (!seen && nw < 5)
					want[nw++] = f;
			}
		}
		int n = dm_vhash_frontier(vh, lo, hi, 5, q, 5, &o, out, 5, NULL);
		cr_assert_eq(n, (int)nw);
		/* same set (the order inside a spanning region is by key, checked elsewhere) */
		for (int j = 0; j < n; j++) {
			bool seen = false;
			for (uint32_t t = 0; t < nw; t++)
				seen |= want[t] == out[j];
			cr_assert(seen);
		}
	}
}

/* Widening happens exactly when the relative gap of eq. (12) is below the threshold; then
 * the second region's key fragment comes right after the owner (unless it is the owner) and
 * the budget is B + wide_extra; otherwise the list is the unwidened one. */
Test(vhash_frontier, widening_only_when_ambiguous)
{
	uint64_t lo[32], hi[32];
	uint32_t plain[32], wide[32];
	struct dm_frontier_opts o, p;
	int nwide = 0, nconf = 0;

	layout_rows(32, lo, hi);
	dm_frontier_opts_default(&p);
	o = p;
	o.widen = true;
	o.gap_rel = 0.15;
	o.wide_extra = 2;
	for (int i = 0; i < NQ; i++) {
		const float *q = queries + (size_t)i * DIM;
		uint32_t regions[2];
		double dist[2], rel;
		cr_assert_eq(dm_vhash_rank(vh, q, regions, dist, 2), 2);
		dm_vhash_gap(dist, 2, &rel);
		struct dm_frontier_info info;
		int nw = dm_vhash_frontier(vh, lo, hi, 32, q, 4, &o, wide, 32, &info);
		int np = dm_vhash_frontier(vh, lo, hi, 32, q, 4, &p, plain, 32, NULL);
		cr_assert_eq(info.gap_rel, rel);
		cr_assert_eq(info.widened, rel < o.gap_rel);
		cr_assert_eq(np, 4);
		if (!info.widened) {
			nconf++;
			cr_assert_eq(nw, np);
			cr_assert_arr_eq(wide, plain, (size_t)np * sizeof(*wide));
			cr_assert_eq(info.budget, 4);
			continue;
		}
		nwide++;
		cr_assert_eq(nw, 6);
		cr_assert_eq(info.budget, 6);
		cr_assert_eq(wide[0], plain[0]);
		uint32_t f2 = dm_frontier_fragment(lo, 32, dm_vhash_key_at(vh, regions[1], dist[1]));
		if (f2 != wide[0])
			cr_assert_eq(wide[1], f2, "second region's fragment %u not promoted", f2);
	}
	/* the threshold splits the queries (else the test proves nothing) */
	cr_assert_gt(nwide, 0);
	cr_assert_gt(nconf, 0);

	/* threshold 0: never widened; 1: widened unless the gap is exactly 1 */
	for (int i = 0; i < NQ; i++) {
		const float *q = queries + (size_t)i * DIM;
		struct dm_frontier_info info;
		o.gap_rel = 0;
		cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 32, q, 4, &o, wide, 32, &info), 4);
		cr_assert(!info.widened);
		o.gap_rel = 1;
		cr_assert_gt(dm_vhash_frontier(vh, lo, hi, 32, q, 4, &o, wide, 32, &info), 0);
		cr_assert_eq(info.widened, info.gap_rel < 1);
	}
	/* widen off ignores the threshold */
	p.gap_rel = 1;
	for (int i = 0; i < NQ; i++) {
		struct dm_frontier_info info;
		cr_assert_eq(dm_vhash_frontier(vh, lo, hi, 32, queries + (size_t)i * DIM, 4, &p,
					       plain, 32, &info), 4);
		cr_assert(!info.widened);
	}
}

/* K = 1: no second region, gap 1 (vhash.h), never widened; every query's owner is the
 * fragment of its radial position. */
Test(vhash_frontier, single_region)
{
	struct dm_vhash *one = dm_vhash_fit(data, N, DIM, 1, SEED, NULL);
	uint64_t lo[16], hi[16];
	uint32_t out[16];
	struct dm_frontier_opts o;
	cr_assert(one);
	layout_even(16, lo, hi);
	dm_frontier_opts_default(&o);
	o.widen = true;
	o.gap_rel = 1;
	for (int i = 0; i < NQ; i += 11) {
		struct dm_frontier_info info;
		const float *q = queries + (size_t)i * DIM;
		int n = dm_vhash_frontier(one, lo, hi, 16, q, 3, &o, out, 16, &info);
		cr_assert_eq(n, 3);
		cr_assert(!info.widened);
		cr_assert_eq(out[0], dm_frontier_fragment(lo, 16, dm_vhash_key(one, q, NULL)));
	}
	dm_vhash_free(one);
}

Test(vhash_frontier, deterministic)
{
	uint64_t lo[64], hi[64];
	uint32_t a[64], b[64];
	struct dm_frontier_opts o;

	layout_rows(64, lo, hi);
	dm_frontier_opts_default(&o);
	o.widen = true;
	o.gap_rel = 0.2;
	o.wide_extra = 3;
	o.ring = 2;
	/* a second VHash fitted the same way gives the same frontiers */
	struct dm_vhash *vh2 = dm_vhash_fit(data, N, DIM, K, SEED, NULL);
	cr_assert(vh2);
	for (int i = 0; i < NQ; i++) {
		const float *q = queries + (size_t)i * DIM;
		for (uint32_t bb = 1; bb <= 16; bb *= 2) {
			int na = dm_vhash_frontier(vh, lo, hi, 64, q, bb, &o, a, 64, NULL);
			int nb = dm_vhash_frontier(vh2, lo, hi, 64, q, bb, &o, b, 64, NULL);
			cr_assert_eq(na, nb);
			cr_assert_arr_eq(a, b, (size_t)na * sizeof(*a));
			nb = dm_vhash_frontier(vh, lo, hi, 64, q, bb, &o, b, 64, NULL);
			cr_assert_arr_eq(a, b, (size_t)na * sizeof(*a));
		}
	}
	dm_vhash_free(vh2);
}
