/* test_vhash.c: the VHash semantic key space (oracle/vhash.c) stage by stage: ring order,
 * key intervals (exact sum, largest-remainder bound), radial CDFs, keys (inside their
 * interval, monotone in radius, grouped by region in key order), region ranking and
 * ambiguity gap, determinism (byte-identical fits, a golden CRC), and the validating loader
 * (every truncation, every bit flip, field-level corruptions with the CRC recomputed).
 */
#include <criterion/criterion.h>

#include "vhash.h"
#include "vhash_order.h"
#include "oracle.h"
#include "util/dm_buf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "test_rng.h"

typedef unsigned __int128 u128;

/* ---- test data ---------------------------------------------------------------------------- */

/* lcg, u01, normal: test_rng.h */

/* n points in dim dimensions around nc centres, unit noise. The centres form `groups`
 * clusters of clusters: group g's centre is uniform in a box of side sep, its members are
 * within sep / 4 of it (groups = nc: plain uniform centres). skew: the centre of a point is
 * floor(nc u^2) (dense low centres) instead of round-robin. */
static float *mixture_g(uint64_t seed, size_t n, size_t dim, size_t nc, size_t groups,
			double sep, bool skew)
{
	uint64_t s = seed;
	float *c = malloc(nc * dim * sizeof(float)), *x = malloc(n * dim * sizeof(float));
	double *g = malloc(groups * dim * sizeof(double));
	cr_assert(c && x && g);
	for (size_t j = 0; j < groups * dim; j++)
		g[j] = u01(&s) * sep;
	for (size_t j = 0; j < nc; j++)
		for (size_t d = 0; d < dim; d++)
			c[j * dim + d] = groups == nc ? (float)g[j * dim + d]
				: (float)(g[(j % groups) * dim + d] + u01(&s) * sep / 4);
	free(g);
	for (size_t i = 0; i < n; i++) {
		double u = u01(&s);
		size_t j = skew ? DM_MIN((size_t)(nc * u * u), nc - 1) : i % nc;
		for (size_t d = 0; d < dim; d++)
			x[i * dim + d] = c[j * dim + d] + (float)normal(&s);
	}
	free(c);
	return x;
}

static float *mixture(uint64_t seed, size_t n, size_t dim, size_t nc, double sep, bool skew)
{
	return mixture_g(seed, n, dim, nc, nc, sep, skew);
}

#define N 2400
#define DIM 12
#define NC 24
#define K 24
#define SEED 7

static struct dm_vhash *fit_std(bool skew, float **xout)
{
	float *x = mixture(42, N, DIM, NC, 12.0, skew);
	struct dm_vhash *vh = dm_vhash_fit(x, N, DIM, K, SEED, NULL);
	cr_assert(vh, "fit failed: errno %d", errno);
	if (xout)
		*xout = x;
	else
		free(x);
	return vh;
}

static unsigned char *save_blob(const struct dm_vhash *vh, size_t *len)
{
	*len = dm_vhash_save_size(vh);
	unsigned char *b = malloc(*len);
	cr_assert(b);
	cr_assert_eq(dm_vhash_save(vh, b, *len), 0);
	return b;
}

static uint32_t crc_before_trailer(const unsigned char *b, size_t len)
{
	return (uint32_t)crc32(0L, b, (uInt)(len - 4));
}

/* ---- ring order --------------------------------------------------------------------------- */

Test(vhash, ring_is_local_permutation)
{
	/* 24 clusters in 4 groups of 6: ring neighbours should mostly be in the same group */
	float *x = mixture_g(17, N, DIM, NC, 4, 40.0, false);
	struct dm_vhash *vh = dm_vhash_fit(x, N, DIM, K, SEED, NULL);
	bool seen[K] = { false };
	double adj = 0, all = 0;
	size_t nall = 0;

	cr_assert(vh);
	cr_assert_eq(vh->k, K);
	for (uint32_t t = 0; t < K; t++) {
		uint32_t r = vh->ring[t];
		cr_assert_lt(r, K);
		cr_assert_not(seen[r], "region %u twice in the ring", r);
		seen[r] = true;
		cr_assert_eq(vh->ring_pos[r], t);
	}
	/* ring neighbours are much closer than random pairs of regions */
	for (uint32_t t = 0; t + 1 < K; t++)
		adj += sqrt(dm_oracle_l2_exact(vh->centroids + (size_t)vh->ring[t] * DIM,
					       vh->centroids + (size_t)vh->ring[t + 1] * DIM, DIM));
	adj /= K - 1;
	for (uint32_t a = 0; a < K; a++)
		for (uint32_t b = a + 1; b < K; b++, nall++)
			all += sqrt(dm_oracle_l2_exact(vh->centroids + (size_t)a * DIM,
						       vh->centroids + (size_t)b * DIM, DIM));
	all /= (double)nall;
	cr_log_info("ring: mean adjacent centroid distance %.3f, mean over all pairs %.3f", adj,
		    all);
	cr_assert_lt(adj, 0.5 * all);
	free(x);
	dm_vhash_free(vh);
}

/* ---- intervals ---------------------------------------------------------------------------- */

static void check_intervals(const struct dm_vhash *vh)
{
	const uint32_t k = vh->k;
	const uint64_t M = (1ull << DM_VHASH_MIN_SHARE_LOG2) / k, n = vh->n;
	const u128 R = ((u128)1 << 64) - (u128)k * M;
	u128 sum = 0, next = 0;
	uint64_t msum = 0;

	for (uint32_t t = 0; t < k; t++) {
		uint32_t r = vh->ring[t];
		cr_assert_leq(vh->lo[r], vh->hi[r], "empty interval");
		cr_assert(vh->lo[r] == (uint64_t)next, "interval %u not contiguous", t);
		u128 len = (u128)(vh->hi[r] - vh->lo[r]) + 1;
		sum += len;
		next = sum;
		msum += vh->mass[r];
		/* |len - (M + R m / n)| < 1, i.e. |len n - (M n + R m)| < n, exactly */
		u128 a = len * n, b = (u128)M * n + R * vh->mass[r];
		cr_assert_lt(a > b ? a - b : b - a, n, "region %u off the largest-remainder bound", r);
		cr_assert_geq(len, M);
	}
	cr_assert(sum == (u128)1 << 64, "intervals do not sum to 2^64");
	cr_assert_eq(vh->hi[vh->ring[k - 1]], UINT64_MAX);
	cr_assert_eq(msum, n);
}

Test(vhash, intervals_exact_and_proportional)
{
	for (int skew = 0; skew <= 1; skew++) {
		struct dm_vhash *vh = fit_std(skew, NULL);
		uint64_t mn = UINT64_MAX, mx = 0;
		uint32_t rmn = 0, rmx = 0;
		check_intervals(vh);
		for (uint32_t r = 0; r < vh->k; r++) {
			if (vh->mass[r] < mn) {
				mn = vh->mass[r];
				rmn = r;
			}
			if (vh->mass[r] > mx) {
				mx = vh->mass[r];
				rmx = r;
			}
		}
		cr_log_info("intervals (skew %d): masses %llu .. %llu of %d", skew,
			    (unsigned long long)mn, (unsigned long long)mx, N);
		if (mx > mn)
			cr_assert_gt(vh->hi[rmx] - vh->lo[rmx], vh->hi[rmn] - vh->lo[rmn]);
		dm_vhash_free(vh);
	}
}

/* ---- radial CDF --------------------------------------------------------------------------- */

Test(vhash, cdf_monotone_in_unit_interval)
{
	struct dm_vhash *vh = fit_std(true, NULL);

	for (uint32_t r = 0; r < vh->k; r++) {
		const double *q = vh->cdf + (size_t)r * vh->knots;
		double top = q[vh->knots - 1], prev = -1;
		for (uint32_t i = 1; i < vh->knots; i++)
			cr_assert_geq(q[i], q[i - 1]);
		cr_assert_eq(dm_vhash_cdf(vh, r, top), 1.0);
		cr_assert_eq(dm_vhash_cdf(vh, r, NAN), 0.0);
		if (q[0] > 0)
			cr_assert_eq(dm_vhash_cdf(vh, r, nextafter(q[0], 0)), 0.0);
		for (int s = 0; s <= 4000; s++) {
			double d = top * 1.25 * s / 4000;
			double f = dm_vhash_cdf(vh, r, d);
			cr_assert(f >= 0 && f <= 1, "F = %g out of [0,1]", f);
			cr_assert_geq(f, prev, "F decreases at %g", d);
			prev = f;
		}
		/* at the knots themselves and just around them */
		prev = -1;
		for (uint32_t i = 0; i < vh->knots; i++) {
			double pts[3] = { nextafter(q[i], -INFINITY), q[i], nextafter(q[i], INFINITY) };
			for (int j = 0; j < 3; j++) {
				double f = dm_vhash_cdf(vh, r, pts[j]);
				cr_assert(f >= 0 && f <= 1);
				cr_assert_geq(f, prev);
				prev = f;
			}
		}
	}
	dm_vhash_free(vh);
}

/* ---- keys --------------------------------------------------------------------------------- */

struct kr {
	uint64_t key;
	double d2;
	uint32_t region;
};

static int by_region_d2(const void *a, const void *b)
{
	const struct kr *x = a, *y = b;
	if (x->region != y->region)
		return x->region < y->region ? -1 : 1;
	return x->d2 < y->d2 ? -1 : x->d2 > y->d2;
}

static int by_key(const void *a, const void *b)
{
	const struct kr *x = a, *y = b;
	return x->key < y->key ? -1 : x->key > y->key;
}

/* Keys of n points: inside their region's interval, key_region inverts them, monotone in
 * radius within a region, and in key order the regions come in ring order, each contiguous. */
static void check_keys(const struct dm_vhash *vh, const float *x, size_t n)
{
	struct kr *a = malloc(n * sizeof(*a));
	cr_assert(a);
	for (size_t i = 0; i < n; i++) {
		a[i].key = dm_vhash_key(vh, x + i * vh->dim, &a[i].region);
		cr_assert_eq(dm_vhash_nearest(vh, x + i * vh->dim, &a[i].d2), a[i].region);
		cr_assert(a[i].key >= vh->lo[a[i].region] && a[i].key <= vh->hi[a[i].region]);
		cr_assert_eq(dm_vhash_key_region(vh, a[i].key), a[i].region);
	}
	qsort(a, n, sizeof(*a), by_region_d2);
	for (size_t i = 1; i < n; i++)
		if (a[i].region == a[i - 1].region)
			cr_assert_geq(a[i].key, a[i - 1].key, "key not monotone in radius");
	qsort(a, n, sizeof(*a), by_key);
	for (size_t i = 1; i < n; i++)
		cr_assert_geq(vh->ring_pos[a[i].region], vh->ring_pos[a[i - 1].region],
			      "regions not contiguous in key order");
	free(a);
}

Test(vhash, keys_in_interval_monotone_grouped)
{
	float *x;
	struct dm_vhash *vh = fit_std(true, &x);
	check_keys(vh, x, N);
	free(x);
	/* held-out points from the same mixture */
	x = mixture(42, 3 * N, DIM, NC, 12.0, true);
	check_keys(vh, x + (size_t)N * DIM, 2 * N);
	free(x);
	/* along rays from a centroid: keys grow with the radius while the region holds */
	uint64_t s = 99;
	for (uint32_t r = 0; r < vh->k; r++) {
		float u[DIM], p[DIM];
		double nu = 0;
		for (int d = 0; d < DIM; d++) {
			u[d] = (float)normal(&s);
			nu += (double)u[d] * u[d];
		}
		uint64_t prev = 0;
		for (int step = 0; step < 400; step++) {
			double t = 0.02 * step / sqrt(nu);
			uint32_t reg;
			for (int d = 0; d < DIM; d++)
				p[d] = vh->centroids[(size_t)r * DIM + d] + (float)(t * u[d]);
			uint64_t key = dm_vhash_key(vh, p, &reg);
			if (reg != r)
				break;
			cr_assert_geq(key, prev);
			prev = key;
		}
	}
	/* the radial CDF spreads a region's members over most of its interval */
	x = mixture(42, N, DIM, NC, 12.0, true);
	for (uint32_t r = 0; r < vh->k; r++) {
		uint64_t kmin = UINT64_MAX, kmax = 0;
		uint32_t reg;
		if (vh->mass[r] < 20)
			continue;
		for (size_t i = 0; i < N; i++) {
			uint64_t key = dm_vhash_key(vh, x + i * DIM, &reg);
			if (reg != r)
				continue;
			kmin = DM_MIN(kmin, key);
			kmax = DM_MAX(kmax, key);
		}
		cr_assert_eq(kmin, vh->lo[r]); /* the nearest member sits at F = 0 */
		cr_assert_geq((double)(kmax - kmin), 0.9 * (double)(vh->hi[r] - vh->lo[r]));
	}
	free(x);
	dm_vhash_free(vh);
}

/* ---- ranking and gap ---------------------------------------------------------------------- */

Test(vhash, rank_matches_brute_force)
{
	struct dm_vhash *vh = fit_std(false, NULL);
	float *q = mixture(5, 200, DIM, NC, 12.0, false);
	uint32_t reg[K + 4];
	double dist[K + 4];

	for (size_t i = 0; i < 200; i++) {
		const float *x = q + i * DIM;
		uint32_t kr;
		dm_vhash_key(vh, x, &kr);
		cr_assert_eq(dm_vhash_rank(vh, x, reg, dist, K + 4), K);
		cr_assert_eq(reg[0], kr);
		for (uint32_t j = 0; j < K; j++) {
			cr_assert_eq(dist[j], dm_oracle_l2_exact(x, vh->centroids + (size_t)reg[j] * DIM,
								 DIM));
			if (j)
				cr_assert(dist[j] > dist[j - 1] ||
					  (dist[j] == dist[j - 1] && reg[j] > reg[j - 1]));
		}
		/* a shorter ranking is a prefix of the full one */
		uint32_t reg3[3];
		double dist3[3];
		cr_assert_eq(dm_vhash_rank(vh, x, reg3, dist3, 3), 3);
		cr_assert_arr_eq(reg3, reg, sizeof(reg3));
		double rel, g = dm_vhash_gap(dist, 2, &rel);
		cr_assert_eq(g, dist[1] - dist[0]);
		cr_assert(g >= 0 && rel >= 0 && rel <= 1);
	}
	cr_assert_eq(dm_vhash_rank(vh, q, reg, dist, 0), 0);
	cr_assert_eq(dm_vhash_rank(vh, q, NULL, dist, 2), -EINVAL);
	double rel = 0;
	cr_assert(isinf(dm_vhash_gap(dist, 1, &rel)));
	cr_assert_eq(rel, 1.0);
	free(q);
	dm_vhash_free(vh);
}

/* ---- degenerate fits ---------------------------------------------------------------------- */

Test(vhash, degenerate_fits)
{
	/* one region: the whole key space */
	float *x = mixture(3, 300, 4, 3, 5.0, false);
	struct dm_vhash *vh = dm_vhash_fit(x, 300, 4, 1, 1, NULL);
	cr_assert(vh);
	cr_assert_eq(vh->lo[0], 0);
	cr_assert_eq(vh->hi[0], UINT64_MAX);
	check_intervals(vh);
	check_keys(vh, x, 300);
	dm_vhash_free(vh);
	free(x);

	/* n == K with duplicate points: regions with 0 or 1 member, all still valid */
	float d[8 * 2] = { 0, 0, 0, 0, 1, 0, 1, 0, 0, 1, 5, 5, 5, 5, 5, 5 };
	vh = dm_vhash_fit(d, 8, 2, 8, 3, NULL);
	cr_assert(vh, "errno %d", errno);
	uint32_t empty = 0;
	for (uint32_t r = 0; r < vh->k; r++)
		empty += vh->mass[r] == 0;
	cr_log_info("degenerate: %u of 8 regions without members", empty);
	check_intervals(vh);
	check_keys(vh, d, 8);
	size_t len;
	unsigned char *b = save_blob(vh, &len);
	struct dm_vhash *l;
	cr_assert_eq(dm_vhash_load(b, len, &l), 0);
	free(b);
	dm_vhash_free(l);
	dm_vhash_free(vh);
}

/* ---- determinism -------------------------------------------------------------------------- */

/* The fit's pace callback (dm_vhash_opts.pace) is called and changes nothing. */
static void count_pace(void *arg)
{
	(*(unsigned *)arg)++;
}

Test(vhash, pace_called_and_fit_unchanged)
{
	float *x;
	struct dm_vhash *a = fit_std(true, &x), *b;
	struct dm_vhash_opts o;
	unsigned calls = 0;
	size_t la, lb;

	dm_vhash_opts_default(&o);
	o.pace = count_pace;
	o.pace_arg = &calls;
	b = dm_vhash_fit(x, N, DIM, K, SEED, &o);
	cr_assert(b, "fit failed: errno %d", errno);
	cr_assert_gt(calls, 10, "pace called %u times", calls);
	unsigned char *ba = save_blob(a, &la), *bb = save_blob(b, &lb);
	cr_assert(la == lb && memcmp(ba, bb, la) == 0, "the pace changed the fit");
	free(ba);
	free(bb);
	free(x);
	dm_vhash_free(a);
	dm_vhash_free(b);
}

/* A warm start from the regions of a fit on the same sample (the previous epoch's, cn/router)
 * gives back the same regions: every point in the same region, the same ring, the same
 * key-range partition of k = 3 groups; and it is deterministic. */
Test(vhash, warm_start_keeps_regions)
{
	float *x;
	struct dm_vhash *a = fit_std(true, &x), *b, *c;
	struct dm_vhash_opts o;
	size_t lb, lc;

	dm_vhash_opts_default(&o);
	o.init = a->centroids;
	b = dm_vhash_fit(x, N, DIM, K, SEED + 1, &o);   /* the seed does not matter now */
	c = dm_vhash_fit(x, N, DIM, K, SEED + 2, &o);
	cr_assert(b && c, "warm fit failed: errno %d", errno);
	unsigned char *bb = save_blob(b, &lb), *bc = save_blob(c, &lc);
	cr_assert(lb == lc && memcmp(bb, bc, lb) == 0, "two warm fits differ");
	for (uint32_t t = 0; t < K; t++)
		cr_assert_eq(b->ring[t], a->ring[t], "ring position %u differs", t);
	struct dm_oracle *pa = dm_oracle_from_vhash(a, 3, 0.10);
	struct dm_oracle *pb = dm_oracle_from_vhash(b, 3, 0.10);
	cr_assert(pa && pb);
	for (size_t i = 0; i < N; i++) {
		uint32_t ra, rb;

		dm_vhash_key(a, x + i * DIM, &ra);
		dm_vhash_key(b, x + i * DIM, &rb);
		cr_assert_eq(ra, rb, "point %zu moved from region %u to %u", i, ra, rb);
		cr_assert_eq(dm_oracle_best(pa, x + i * DIM), dm_oracle_best(pb, x + i * DIM));
	}
	dm_oracle_free(pa);
	dm_oracle_free(pb);
	free(bb);
	free(bc);
	free(x);
	dm_vhash_free(a);
	dm_vhash_free(b);
	dm_vhash_free(c);
}

/* Key ranges that keep their owners through a refit (dm_oracle_from_vhash_keep, the warm
 * refit of cn/router): the regions in key order (dm_oracle_region_ring: identity), the
 * previous runs kept (also under another numbering of the CNs, which they follow), and a
 * warm refit on another sample of the same mixture moves far fewer points to another CN
 * than a cold one. */
Test(vhash, keyrange_keeps_owners)
{
	float *x;
	struct dm_vhash *vh = fit_std(false, &x);
	const uint32_t k = 4;
	struct dm_oracle *o = dm_oracle_from_vhash(vh, k, 0.10), *o2;
	uint32_t order[K], prev[K], perm[4] = { 2, 0, 3, 1 };

	cr_assert(o);
	cr_assert_eq(dm_oracle_region_ring(o, order), 0);
	for (uint32_t p = 0; p < K; p++)
		cr_assert_eq(order[p], p, "the regions are in key order");
	/* the same runs, numbered as before: nothing moves */
	for (uint32_t r = 0; r < K; r++)
		prev[r] = o->fine_group[vh->ring_pos[r]];
	o2 = dm_oracle_from_vhash_keep(vh, k, 0.10, prev);
	cr_assert(o2);
	cr_assert_arr_eq(o2->fine_group, o->fine_group, K * sizeof(uint32_t));
	dm_oracle_free(o2);
	/* CNs numbered otherwise: each run keeps its CN, and the CN ring follows the key order */
	for (uint32_t r = 0; r < K; r++)
		prev[r] = perm[o->fine_group[vh->ring_pos[r]]];
	o2 = dm_oracle_from_vhash_keep(vh, k, 0.10, prev);
	cr_assert(o2);
	for (uint32_t p = 0; p < K; p++)
		cr_assert_eq(o2->fine_group[p], perm[o->fine_group[p]]);
	for (uint32_t g = 0; g < k; g++) {
		cr_assert_eq(o2->ring[g], perm[g]);
		cr_assert_eq(o2->ring_pos[perm[g]], g);
		cr_assert_eq(o2->sizes[perm[g]], o->sizes[g]);
	}
	cr_assert_eq(dm_oracle_region_ring(o2, order), 0);
	for (uint32_t p = 0; p < K; p++)
		cr_assert_eq(order[p], p);
	for (size_t i = 0; i < N; i += 5)
		cr_assert_eq(dm_oracle_best(o2, x + i * DIM), perm[dm_oracle_best(o, x + i * DIM)]);
	dm_oracle_free(o2);
	/* a refit on a sample whose every point moved a little (the next epoch's): warm (from the
	 * oracle's regions and key order, keeping owners) against cold (another seed) */
	float *y = malloc((size_t)N * DIM * sizeof(float));   /* every point moved a little */
	uint64_t js = 77;

	cr_assert(y);
	for (size_t i = 0; i < (size_t)N * DIM; i++)
		y[i] = x[i] + 0.3f * (float)normal(&js);
	struct dm_vhash_opts vo;
	uint32_t ring[K];

	for (uint32_t p = 0; p < K; p++)
		ring[p] = p;
	dm_vhash_opts_default(&vo);
	vo.init = o->fine;
	vo.init_ring = ring;
	struct dm_vhash *wv = dm_vhash_fit(y, N, DIM, K, SEED + 1, &vo);
	struct dm_vhash *cv = dm_vhash_fit(y, N, DIM, K, SEED + 1, NULL);
	cr_assert(wv && cv);
	struct dm_oracle *wo = dm_oracle_from_vhash_keep(wv, k, 0.10, o->fine_group);
	struct dm_oracle *co = dm_oracle_from_vhash(cv, k, 0.10);
	cr_assert(wo && co);
	uint64_t tot = 0;

	for (uint32_t g = 0; g < k; g++)
		tot += wo->sizes[g];
	cr_assert_eq(tot, N);
	size_t wm = 0, cm = 0;
	for (size_t i = 0; i < N; i++) {
		uint32_t before = dm_oracle_best(o, x + i * DIM);

		wm += dm_oracle_best(wo, x + i * DIM) != before;
		cm += dm_oracle_best(co, x + i * DIM) != before;
	}
	fprintf(stderr, "keyrange refit on another sample: warm moves %zu of %d points to another "
		"CN, cold %zu\n", wm, N, cm);
	cr_assert_lt(wm * 4, cm, "warm moved %zu, cold %zu", wm, cm);
	dm_oracle_free(wo);
	dm_oracle_free(co);
	dm_vhash_free(wv);
	dm_vhash_free(cv);
	free(y);
	dm_oracle_free(o);
	dm_vhash_free(vh);
	free(x);
}

Test(vhash, deterministic_fit_and_roundtrip)
{
	float *x;
	struct dm_vhash *a = fit_std(true, &x), *b = fit_std(true, NULL), *l;
	size_t la, lb, ll;
	unsigned char *ba = save_blob(a, &la), *bb = save_blob(b, &lb), *bl;

	cr_assert_eq(la, lb);
	cr_assert(memcmp(ba, bb, la) == 0, "two fits of the same sample differ");
	a->epoch = 0x1122334455667788ull;
	free(ba);
	ba = save_blob(a, &la);
	cr_assert_eq(dm_vhash_load(ba, la, &l), 0);
	cr_assert_eq(l->epoch, a->epoch);
	bl = save_blob(l, &ll);
	cr_assert_eq(ll, la);
	cr_assert(memcmp(bl, ba, la) == 0, "save -> load -> save changed the bytes");
	for (size_t i = 0; i < N; i++) {
		uint64_t ka = dm_vhash_key(a, x + i * DIM, NULL);
		cr_assert_eq(ka, dm_vhash_key(b, x + i * DIM, NULL));
		cr_assert_eq(ka, dm_vhash_key(l, x + i * DIM, NULL));
	}
	/* another seed gives another model */
	struct dm_vhash *c = dm_vhash_fit(x, N, DIM, K, SEED + 1, NULL);
	unsigned char *bc;
	size_t lc;
	cr_assert(c);
	bc = save_blob(c, &lc);
	cr_assert(memcmp(bc, bb, lb) != 0);
	free(bc);
	dm_vhash_free(c);
	/* a short buffer */
	cr_assert_eq(dm_vhash_save(a, ba, la - 1), -ENOSPC);
	free(x);
	free(ba);
	free(bb);
	free(bl);
	dm_vhash_free(a);
	dm_vhash_free(b);
	dm_vhash_free(l);
}

/* The CRC of the saved bytes (before the trailing CRC field) for a fixed input: changes
 * whenever anything in the fit or the format changes. Update it only on purpose. */
#define GOLDEN_CRC 0x4c9e38e9u

Test(vhash, golden_crc)
{
	float *x = mixture(2024, 1200, 8, 12, 10.0, true);
	struct dm_vhash *vh = dm_vhash_fit(x, 1200, 8, 12, 0x53454d4f5244ull /* "SEMORD" */, NULL);
	size_t len;
	cr_assert(vh);
	vh->epoch = 1;
	unsigned char *b = save_blob(vh, &len);
	uint32_t crc = crc_before_trailer(b, len);
	cr_assert_eq(dm_get_le32(b + len - 4), crc);
	cr_log_info("golden CRC 0x%08x (%zu bytes)", crc, len);
	fprintf(stderr, "vhash golden CRC 0x%08x (%zu bytes)\n", crc, len);
	cr_assert_eq(crc, GOLDEN_CRC, "golden CRC 0x%08x, expected 0x%08x", crc, GOLDEN_CRC);
	free(b);
	free(x);
	dm_vhash_free(vh);
}

/* ---- loader ------------------------------------------------------------------------------- */

/* A small model for the exhaustive loader tests. */
static unsigned char *small_blob(size_t *len, struct dm_vhash **vh_out)
{
	float *x = mixture(11, 400, 4, 8, 8.0, false);
	struct dm_vhash *vh = dm_vhash_fit(x, 400, 4, 8, 5, NULL);
	cr_assert(vh);
	free(x);
	vh->epoch = 77;
	unsigned char *b = save_blob(vh, len);
	if (vh_out)
		*vh_out = vh;
	else
		dm_vhash_free(vh);
	return b;
}

Test(vhash, load_rejects_every_truncation)
{
	size_t len;
	unsigned char *b = small_blob(&len, NULL), *c = malloc(len + 1);
	struct dm_vhash *l = (struct dm_vhash *)1;

	cr_assert(c);
	for (size_t n = 0; n < len; n++) {
		/* a fresh, exactly sized copy: ASan catches any read past the given length */
		unsigned char *t = malloc(n ? n : 1);
		cr_assert(t);
		memcpy(t, b, n);
		cr_assert_eq(dm_vhash_load(t, n, &l), -EINVAL, "truncated to %zu accepted", n);
		cr_assert_null(l);
		free(t);
	}
	memcpy(c, b, len);
	c[len] = 0;
	cr_assert_eq(dm_vhash_load(c, len + 1, &l), -EINVAL); /* trailing garbage */
	cr_assert_eq(dm_vhash_load(c, len, &l), 0);
	dm_vhash_free(l);
	cr_assert_eq(dm_vhash_load(NULL, len, &l), -EINVAL);
	free(b);
	free(c);
}

Test(vhash, load_rejects_every_bit_flip)
{
	size_t len;
	unsigned char *b = small_blob(&len, NULL);
	struct dm_vhash *l;

	cr_log_info("bit flips over %zu bytes", len);
	for (size_t i = 0; i < len; i++) {
		for (int bit = 0; bit < 8; bit++) {
			b[i] ^= (unsigned char)(1u << bit);
			cr_assert_eq(dm_vhash_load(b, len, &l), -EINVAL, "flip of bit %d of byte %zu "
				     "accepted", bit, i);
			b[i] ^= (unsigned char)(1u << bit);
		}
	}
	cr_assert_eq(dm_vhash_load(b, len, &l), 0);
	dm_vhash_free(l);
	free(b);
}

/* Offsets of the arrays in a blob of this model (vhash.h). */
struct layout {
	size_t cent, ring, mass, iv, cdf, crc;
};

static struct layout layout_of(const struct dm_vhash *vh)
{
	struct layout o;
	o.cent = DM_VHASH_HDR;
	o.ring = o.cent + (size_t)vh->k * vh->dim * 4;
	o.mass = o.ring + (size_t)vh->k * 4;
	o.iv = o.mass + (size_t)vh->k * 8;
	o.cdf = o.iv + (size_t)vh->k * 16;
	o.crc = o.cdf + (size_t)vh->k * vh->knots * 8;
	return o;
}

/* Load a copy of b with the CRC recomputed after `edit`; returns dm_vhash_load's result. */
static int load_edited(const unsigned char *b, size_t len, void (*edit)(unsigned char *,
	const struct layout *, const struct dm_vhash *), const struct layout *o,
	const struct dm_vhash *vh)
{
	unsigned char *c = malloc(len);
	struct dm_vhash *l;
	cr_assert(c);
	memcpy(c, b, len);
	edit(c, o, vh);
	dm_put_le32(c + len - 4, crc_before_trailer(c, len));
	int ret = dm_vhash_load(c, len, &l);
	if (ret == 0)
		dm_vhash_free(l);
	else
		cr_assert_null(l);
	free(c);
	return ret;
}

static void put_f64(unsigned char *p, double v)
{
	uint64_t u;
	memcpy(&u, &v, 8);
	dm_put_le64(p, u);
}

static void ed_none(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)c; (void)o; (void)vh; }
static void ed_epoch(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; (void)vh; dm_put_le64(c + 8, 12345); }
static void ed_magic(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; (void)vh; c[0] ^= 1; }
static void ed_version0(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; (void)vh; dm_put_le32(c + 4, 0); }
static void ed_version2(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; (void)vh; dm_put_le32(c + 4, DM_VHASH_VERSION + 1); }
static void ed_dim0(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; (void)vh; dm_put_le32(c + 16, 0); }
static void ed_k0(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; (void)vh; dm_put_le32(c + 20, 0); }
static void ed_kbig(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; (void)vh; dm_put_le32(c + 20, DM_VHASH_K_MAX + 1); }
static void ed_kplus1(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; dm_put_le32(c + 20, vh->k + 1); }
static void ed_knots1(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; (void)vh; dm_put_le32(c + 24, 1); }
static void ed_flags(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; (void)vh; dm_put_le32(c + 28, 1); }
static void ed_n_small(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)o; dm_put_le64(c + 32, vh->n - 1); }
static void ed_mass_over(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)vh; dm_put_le64(c + o->mass, UINT64_MAX); }
static void ed_cent_nan(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{
	float f = NAN;
	uint32_t u;
	(void)vh;
	memcpy(&u, &f, 4);
	dm_put_le32(c + o->cent + 4, u);
}
static void ed_ring_dup(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)vh; dm_put_le32(c + o->ring + 4, dm_get_le32(c + o->ring)); }
static void ed_ring_range(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ dm_put_le32(c + o->ring, vh->k); }
/* region of ring position t, read from the blob */
static uint32_t blob_ring(const unsigned char *c, const struct layout *o, uint32_t t)
{ return dm_get_le32(c + o->ring + 4 * (size_t)t); }
static void ed_iv_short(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{
	/* the last interval ends one key early: the intervals sum to 2^64 - 1 */
	uint32_t r = blob_ring(c, o, vh->k - 1);
	dm_put_le64(c + o->iv + 16 * (size_t)r + 8, UINT64_MAX - 1);
}
static void ed_iv_gap(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{
	/* the second interval starts one key late */
	uint32_t r = blob_ring(c, o, 1);
	(void)vh;
	dm_put_le64(c + o->iv + 16 * (size_t)r, dm_get_le64(c + o->iv + 16 * (size_t)r) + 1);
}
static void ed_iv_overlap(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{
	uint32_t r = blob_ring(c, o, 1);
	(void)vh;
	dm_put_le64(c + o->iv + 16 * (size_t)r, dm_get_le64(c + o->iv + 16 * (size_t)r) - 1);
}
static void ed_iv_first(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{
	uint32_t r = blob_ring(c, o, 0);
	(void)vh;
	dm_put_le64(c + o->iv + 16 * (size_t)r, 1);
}
static void ed_iv_empty(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{
	/* position 1 becomes [lo, lo - 1] and position 2 starts at its lo: contiguous but
	 * empty */
	uint32_t r1 = blob_ring(c, o, 1), r2 = blob_ring(c, o, 2);
	uint64_t lo1 = dm_get_le64(c + o->iv + 16 * (size_t)r1);
	(void)vh;
	dm_put_le64(c + o->iv + 16 * (size_t)r1 + 8, lo1 - 1);
	dm_put_le64(c + o->iv + 16 * (size_t)r2, lo1);
}
static void ed_cdf_down(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{
	/* knot 5 of region 3 below knot 4 */
	size_t at = o->cdf + (3 * (size_t)vh->knots + 5) * 8;
	uint64_t u = dm_get_le64(c + at - 8);
	double prev;
	memcpy(&prev, &u, 8);
	put_f64(c + at, prev * 0.5 - 1.0);
}
static void ed_cdf_neg(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ (void)vh; put_f64(c + o->cdf, -1.0); }
static void ed_cdf_nan(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ put_f64(c + o->cdf + ((size_t)vh->knots - 1) * 8, NAN); }
static void ed_cdf_inf(unsigned char *c, const struct layout *o, const struct dm_vhash *vh)
{ put_f64(c + o->cdf + ((size_t)vh->knots - 1) * 8, INFINITY); }

Test(vhash, load_rejects_bad_fields)
{
	struct dm_vhash *vh;
	size_t len;
	unsigned char *b = small_blob(&len, &vh);
	struct layout o = layout_of(vh);
	static const struct {
		const char *what;
		void (*edit)(unsigned char *, const struct layout *, const struct dm_vhash *);
		int want;
	} cases[] = {
		{ "unchanged", ed_none, 0 },
		{ "another epoch", ed_epoch, 0 },
		{ "bad magic", ed_magic, -EINVAL },
		{ "version 0", ed_version0, -EINVAL },
		{ "newer version", ed_version2, -EINVAL },
		{ "dim 0", ed_dim0, -EINVAL },
		{ "K = 0", ed_k0, -EINVAL },
		{ "K > DM_VHASH_K_MAX", ed_kbig, -EINVAL },
		{ "K + 1 (length mismatch)", ed_kplus1, -EINVAL },
		{ "one knot", ed_knots1, -EINVAL },
		{ "flags", ed_flags, -EINVAL },
		{ "masses do not sum to n", ed_n_small, -EINVAL },
		{ "mass overflows", ed_mass_over, -EINVAL },
		{ "NaN centroid", ed_cent_nan, -EINVAL },
		{ "ring has a duplicate", ed_ring_dup, -EINVAL },
		{ "ring region out of range", ed_ring_range, -EINVAL },
		{ "intervals sum to 2^64 - 1", ed_iv_short, -EINVAL },
		{ "gap between intervals", ed_iv_gap, -EINVAL },
		{ "overlapping intervals", ed_iv_overlap, -EINVAL },
		{ "first interval not at 0", ed_iv_first, -EINVAL },
		{ "empty interval", ed_iv_empty, -EINVAL },
		{ "non-monotone CDF", ed_cdf_down, -EINVAL },
		{ "negative CDF knot", ed_cdf_neg, -EINVAL },
		{ "NaN CDF knot", ed_cdf_nan, -EINVAL },
		{ "infinite CDF knot", ed_cdf_inf, -EINVAL },
	};

	cr_assert_eq(o.crc + 4, len);
	for (size_t i = 0; i < DM_ARRAY_SIZE(cases); i++)
		cr_assert_eq(load_edited(b, len, cases[i].edit, &o, vh), cases[i].want,
			     "case '%s'", cases[i].what);
	free(b);
	dm_vhash_free(vh);
}

/* ---- bad input to fit --------------------------------------------------------------------- */

Test(vhash, fit_rejects_bad_input)
{
	float *x = mixture(1, 64, 4, 4, 5.0, false);
	struct dm_vhash_opts op;
	struct dm_vhash *vh;

#define FAILS(expr) do { errno = 0; vh = (expr); cr_assert_null(vh, #expr); \
			 cr_assert_eq(errno, EINVAL, #expr); } while (0)
	FAILS(dm_vhash_fit(NULL, 64, 4, 4, 1, NULL));
	FAILS(dm_vhash_fit(x, 64, 0, 4, 1, NULL));                   /* dim 0 */
	FAILS(dm_vhash_fit(x, 64, DM_VHASH_DIM_MAX + 1, 4, 1, NULL));
	FAILS(dm_vhash_fit(x, 64, 4, 0, 1, NULL));                   /* K = 0 */
	FAILS(dm_vhash_fit(x, 3, 4, 4, 1, NULL));                    /* n < K */
	FAILS(dm_vhash_fit(x, 64, 4, DM_VHASH_K_MAX + 1, 1, NULL));
	dm_vhash_opts_default(&op);
	op.knots = 1;
	FAILS(dm_vhash_fit(x, 64, 4, 4, 1, &op));
	op.knots = DM_VHASH_KNOTS_MAX + 1;
	FAILS(dm_vhash_fit(x, 64, 4, 4, 1, &op));
	dm_vhash_opts_default(&op);
	op.balance_eps = NAN;
	FAILS(dm_vhash_fit(x, 64, 4, 4, 1, &op));
	float keep = x[37];
	x[37] = NAN;
	FAILS(dm_vhash_fit(x, 64, 4, 4, 1, NULL));
	x[37] = INFINITY;
	FAILS(dm_vhash_fit(x, 64, 4, 4, 1, NULL));
	x[37] = 1e16f;
	FAILS(dm_vhash_fit(x, 64, 4, 4, 1, NULL));
#undef FAILS
	x[37] = keep;
	dm_vhash_opts_default(&op);
	op.knots = 2;
	vh = dm_vhash_fit(x, 64, 4, 4, 1, &op);
	cr_assert(vh);
	check_intervals(vh);
	check_keys(vh, x, 64);
	dm_vhash_free(vh);
	free(x);
}

/* ---- key order of a vector file (vhash_order.c) ------------------------------------------- */

/* dm_vhash_order: a permutation of the rows, keys non-decreasing along it (ties by row), the
 * same whatever the thread count; dm_vhash_fit_rows fits on the even sample it documents. */
Test(vhash, order_is_sorted_permutation)
{
	float *x = mixture(43, N, DIM, NC, 12.0, false);
	struct dm_vhash *vh = dm_vhash_fit_rows(x, N, DIM, K, 0, false, SEED), *v2;
	uint32_t *l1 = malloc(N * sizeof(*l1)), *l3 = malloc(N * sizeof(*l3));
	uint64_t *k1 = malloc(N * sizeof(*k1));
	unsigned char *seen = calloc(N, 1);

	cr_assert(vh && l1 && l3 && k1 && seen);
	cr_assert_eq(dm_vhash_order(vh, x, N, DIM, false, 1, l1, k1), 0);
	cr_assert_eq(dm_vhash_order(vh, x, N, DIM, false, 3, l3, NULL), 0);
	cr_assert(!memcmp(l1, l3, N * sizeof(*l1)), "the order depends on the thread count");
	for (uint32_t i = 0; i < N; i++) {
		cr_assert_lt(l1[i], N);
		cr_assert_eq(seen[l1[i]]++, 0, "row %u twice", l1[i]);
		cr_assert_eq(k1[i], dm_vhash_key(vh, x + (size_t)l1[i] * DIM, NULL));
		if (i)
			cr_assert(k1[i - 1] < k1[i] || (k1[i - 1] == k1[i] && l1[i - 1] < l1[i]),
				  "not in (key, row) order at %u", i);
	}
	/* a sample of min(n, K x 100) = all N rows here: the same model as dm_vhash_fit */
	v2 = dm_vhash_fit(x, N, DIM, K, SEED, NULL);
	cr_assert(v2);
	{
		size_t la, lb;
		unsigned char *a = save_blob(vh, &la), *b = save_blob(v2, &lb);

		cr_assert(la == lb && !memcmp(a, b, la));
		free(a);
		free(b);
	}
	/* bad input */
	cr_assert_eq(dm_vhash_order(vh, x, N, DIM + 1, false, 1, l1, NULL), -EINVAL);
	cr_assert_eq(dm_vhash_order(vh, x, N, DIM, false, 0, l1, NULL), -EINVAL);
	cr_assert_null(dm_vhash_fit_rows(x, N, DIM, K, K - 1, false, SEED));
	dm_vhash_free(v2);
	dm_vhash_free(vh);
	free(seen);
	free(k1);
	free(l3);
	free(l1);
	free(x);
}

/* ---- partitions as key ranges (oracle_keyrange.c) ------------------------------------------ */

/* The k-means objective of one cut, for the brute force below: the within-run sum of
 * squared distances of the regions' centroids to their run's mass-weighted mean. */
static double cut_cost(const struct dm_vhash *vh, const uint32_t *grp)
{
	double c = 0;

	for (uint32_t g = 0; g < vh->k; g++) {
		double w = 0, mu[DIM] = { 0 };

		for (uint32_t r = 0; r < vh->k; r++)
			if (grp[r] == g) {
				w += (double)vh->mass[r];
				for (size_t j = 0; j < vh->dim; j++)
					mu[j] += (double)vh->mass[r] * vh->centroids[r * vh->dim + j];
			}
		if (w == 0)
			continue;
		for (size_t j = 0; j < vh->dim; j++)
			mu[j] /= w;
		for (uint32_t r = 0; r < vh->k; r++)
			if (grp[r] == g)
				for (size_t j = 0; j < vh->dim; j++) {
					double e = vh->centroids[r * vh->dim + j] - mu[j];

					c += (double)vh->mass[r] * e * e;
				}
	}
	return c;
}

/* Every cut of the ring into k runs (run q from st[q]; st[0] = 0) whose runs all hold at
 * most cap: the least cost, by enumeration (INFINITY: no such cut). */
static double best_cut(const struct dm_vhash *vh, uint32_t k, uint64_t cap, uint32_t *st,
		       uint32_t g, uint32_t *grp)
{
	double best = INFINITY;

	if (g == k) {
		for (uint32_t q = 0; q < k; q++) {
			uint32_t end = q + 1 < k ? st[q + 1] : vh->k;
			uint64_t m = 0;

			for (uint32_t p = st[q]; p < end; p++) {
				grp[vh->ring[p]] = q;
				m += vh->mass[vh->ring[p]];
			}
			if (m > cap)
				return INFINITY;
		}
		return cut_cost(vh, grp);
	}
	for (uint32_t p = st[g - 1] + 1; p + (k - g) <= vh->k; p++) {
		st[g] = p;
		double c = best_cut(vh, k, cap, st, g + 1, grp);

		if (c < best)
			best = c;
	}
	return best;
}

/* dm_oracle_from_vhash's cut: every run holds at most floor(1.1 n / k) of the sample (the
 * balanced k-means' bound), and among all such cuts it has the least k-means objective
 * over the regions, checked by enumeration; the same cut every time. */
Test(vhash, keyrange_cut_is_balanced_and_optimal)
{
	uint32_t feasible = 0;

	for (int skew = 0; skew < 2; skew++) {
		struct dm_vhash *vh = fit_std(skew, NULL);

		for (uint32_t k = 2; k <= 5; k++) {
			struct dm_oracle *o = dm_oracle_from_vhash(vh, k, 0.10);
			uint64_t cap = (uint64_t)floor(1.10 * N / k);
			uint32_t st[8] = { 0 }, grp[K];

			cr_assert(o, "k=%u: errno %d", k, errno);
			double want = best_cut(vh, k, cap, st, 1, grp);

			/* no cut meets the cap (a heavy region): the equal-mass cut stands */
			if (want < INFINITY) {
				feasible++;
				for (uint32_t g = 0; g < k; g++)
					cr_assert_leq(o->sizes[g], cap, "k=%u: run %u holds %llu > %llu",
						      k, g, (unsigned long long)o->sizes[g],
						      (unsigned long long)cap);
				uint32_t byreg[K];   /* fine centroid p is the region at ring position p */

				for (uint32_t r = 0; r < K; r++)
					byreg[r] = o->fine_group[vh->ring_pos[r]];
				double got = cut_cost(vh, byreg);

				cr_assert(got <= want * (1 + 1e-9), "skew %d k=%u: cut cost %.9g, the "
					  "best %.9g", skew, k, got, want);
			}
			struct dm_oracle *o2 = dm_oracle_from_vhash(vh, k, 0.10);

			cr_assert(o2);
			cr_assert_arr_eq(o->fine_group, o2->fine_group, K * sizeof(uint32_t));
			dm_oracle_free(o2);
			dm_oracle_free(o);
		}
		if (skew) {
			/* a cap no cut meets (eps 0, regions of unequal mass): the equal-mass cut */
			struct dm_oracle *o = dm_oracle_from_vhash(vh, 3, 0.0);

			cr_assert(o);
			dm_oracle_free(o);
			errno = 0;
			cr_assert_null(dm_oracle_from_vhash(vh, 3, -0.1));
			cr_assert_eq(errno, EINVAL);
			cr_assert_null(dm_oracle_from_vhash(vh, 3, NAN));
		}
		dm_vhash_free(vh);
	}
	cr_assert_geq(feasible, 5, "only %u of 8 cuts could meet the cap", feasible);
}

/* dm_oracle_from_vhash: every group a contiguous non-empty run of the ring, in ring order;
 * masses near n / k (at most 1.1 n / k, or one region's mass past n / k); the
 * predictor sends a point to the group of its nearest region, i.e. to the range its key
 * falls in; the ring of CNs is the identity, so a leaving CN's range goes to a key neighbour
 * and no other range moves; the wire form round-trips; bad arguments. */
Test(vhash, keyrange_partitions)
{
	float *x;
	struct dm_vhash *vh = fit_std(true, &x);
	uint64_t maxmass = 0;

	for (uint32_t r = 0; r < vh->k; r++)
		maxmass = DM_MAX(maxmass, vh->mass[r]);
	for (uint32_t k = 1; k <= 5; k++) {
		struct dm_oracle *o = dm_oracle_from_vhash(vh, k, 0.10);
		uint64_t sum = 0;
		uint32_t prev = 0;

		cr_assert(o, "k=%u: errno %d", k, errno);
		cr_assert_eq(o->k, k);
		cr_assert_eq(o->nfine, vh->k);
		cr_assert_eq(o->algo, DM_ORACLE_KEYRANGE);
		/* contiguous, non-decreasing by one along the ring, covering 0..k-1 */
		/* fine centroid p is the region at ring position p */
		for (uint32_t p = 0; p < vh->k; p++)
			cr_assert(memcmp(o->fine + (size_t)p * DIM,
					 vh->centroids + (size_t)vh->ring[p] * DIM,
					 DIM * sizeof(float)) == 0);
		cr_assert_eq(o->fine_group[0], 0);
		for (uint32_t p = 1; p < vh->k; p++) {
			uint32_t g = o->fine_group[p];

			cr_assert(g == prev || g == prev + 1, "k=%u: group %u after %u at %u", k, g,
				  prev, p);
			prev = g;
		}
		cr_assert_eq(prev, k - 1);
		for (uint32_t g = 0; g < k; g++) {
			sum += o->sizes[g];
			cr_assert_eq(o->ring[g], g);
			cr_assert_eq(o->ring_pos[g], g);
			cr_assert_leq(o->sizes[g], DM_MAX((uint64_t)floor(1.10 * N / k), N / k + maxmass),
				      "k=%u: group %u holds %llu", k, g, (unsigned long long)o->sizes[g]);
		}
		cr_assert_eq(sum, N);
		/* the predictor: the group owning the point's key */
		for (size_t i = 0; i < N; i += 7) {
			uint32_t reg, g = dm_oracle_best(o, x + i * DIM);
			uint64_t key = dm_vhash_key(vh, x + i * DIM, &reg);

			cr_assert_eq(g, o->fine_group[vh->ring_pos[reg]]);
			cr_assert_eq(g, o->fine_group[vh->ring_pos[dm_vhash_key_region(vh, key)]]);
		}
		/* the wire form keeps it whole */
		size_t len = dm_oracle_wire_size(o);
		uint8_t *w = malloc(len);

		cr_assert(w);
		cr_assert_eq(dm_oracle_encode(o, w, len), (long)len);
		struct dm_oracle *d = dm_oracle_decode(w, len);

		cr_assert(d, "decode: errno %d", errno);
		cr_assert_eq(d->algo, DM_ORACLE_KEYRANGE);
		for (size_t i = 0; i < N; i += 13)
			cr_assert_eq(dm_oracle_best(d, x + i * DIM), dm_oracle_best(o, x + i * DIM));
		dm_oracle_free(d);
		free(w);
		dm_oracle_free(o);
	}
	/* A CN leaving hands its key range to a key neighbour (the identity ring): with 5
	 * partitions and CN c down, only partition c changes owner, to c - 1 or c + 1. */
	{
		struct dm_oracle *o5 = dm_oracle_from_vhash(vh, 5, 0.10);
		bool up[5];
		uint32_t owner[5];

		cr_assert(o5);
		for (uint32_t c = 0; c < 5; c++) {
			for (uint32_t i = 0; i < 5; i++)
				up[i] = i != c;
			cr_assert_eq(dm_oracle_owners(o5, up, owner), 1);
			for (uint32_t i = 0; i < 5; i++)
				if (i != c)
					cr_assert_eq(owner[i], i);
			cr_assert(owner[c] + 1 == c || owner[c] == c + 1, "partition %u went to %u", c,
				  owner[c]);
		}
		dm_oracle_free(o5);
	}
	errno = 0;
	cr_assert_null(dm_oracle_from_vhash(vh, 0, 0.10));
	cr_assert_eq(errno, EINVAL);
	cr_assert_null(dm_oracle_from_vhash(vh, vh->k + 1, 0.10));
	cr_assert_null(dm_oracle_from_vhash(NULL, 2, 0.10));
	/* every region its own group: k = K */
	struct dm_oracle *o = dm_oracle_from_vhash(vh, vh->k, 0.10);

	cr_assert(o);
	for (uint32_t p = 0; p < vh->k; p++)
		cr_assert_eq(o->fine_group[p], p);
	dm_oracle_free(o);
	dm_vhash_free(vh);
	free(x);
}
