/* oracle_keyrange.c: compute-node partitions as key ranges (issue 15, "partitions as key
 * ranges"): an oracle whose fine centroids are a VHash's K regions and whose k groups (CNs)
 * are contiguous runs of the VHash ring, each holding at most (1 + eps) / k of the sample's
 * mass (the balanced k-means' bound), cut where the k-means objective over the regions is
 * least (cut_runs_dp: the runs end where neighbouring regions lie far apart, not at an
 * equal-mass point inside a dense stretch); the equal-mass cut when no cut meets the bound.
 * The predictor then sends a query to the CN owning the key range of its nearest
 * region (the region its VHash key falls in), and the CN ring is the key order itself
 * (group g is range g), so spilling to ring neighbours spills to the adjacent key ranges
 * and a CN leaving hands its range to a key neighbour (dm_oracle_owners). Everything that
 * takes a struct dm_oracle (rank, spill order, owners, wire form, client-side routing)
 * works on it unchanged. */
#include "oracle.h"
#include "vhash.h"
#include "config.h"   /* DM_MAX_NODES */

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Cut the K ring positions into k contiguous non-empty runs of about equal mass: start[g]
 * is the first position of run g (start[0] = 0), chosen as the first position at which the
 * mass before it reaches g n / k, kept at least one position after the previous start and
 * at most K - (k - g) (room for the runs after it). The fallback of cut_runs. */
static void cut_runs_equal(const struct dm_vhash *vh, uint32_t k, uint32_t *start)
{
	uint64_t before = 0;       /* the mass of ring positions [0, p) */
	uint32_t p = 0;

	start[0] = 0;
	for (uint32_t g = 1; g < k; g++) {
		/* g n / k without overflow: n < 2^64 / k is not guaranteed, use 128 bits */
		unsigned __int128 goal = (unsigned __int128)vh->n * g;
		uint32_t lo = start[g - 1] + 1, hi = vh->k - (k - g);

		while (p < vh->k && (unsigned __int128)before * k < goal)
			before += vh->mass[vh->ring[p++]];
		/* clamped: p moves back (never below lo) or on (at most to lo) with its mass */
		for (; p > hi; p--)
			before -= vh->mass[vh->ring[p - 1]];
		for (; p < lo; p++)
			before += vh->mass[vh->ring[p]];
		start[g] = p;
	}
}

/* The balanced cut: among all ways to cut the ring (in key order, from position 0: the
 * VHash ring starts after its longest edge) into k non-empty contiguous runs of mass at most
 * cap = floor((1 + eps) n / k) each (the bound balanced k-means keeps,
 * DM_ORACLE_CONSTRAINED), the one with the least total run cost. cost[a L + l - 1] is the
 * cost of the run of l positions from position a (run_cost_sse), len[a] the longest
 * run from a under the cap, L the longest of all.
 *
 * Exact by dynamic programming over (runs, positions), O(k K L). Ties keep the first found
 * (the earlier cut): deterministic. Writes start[0..k-1] (start[0] = 0, increasing).
 * Returns 0, -ERANGE when no cut satisfies the cap, -ENOMEM. */
static int cut_runs_dp(uint32_t K, uint32_t k, const uint32_t *len, uint32_t L,
		       const double *cost, uint32_t *start)
{
	/* dp[g (K+1) + i]: the least cost of covering positions [0, i) with g runs */
	double *dp = malloc((size_t)(k + 1) * (K + 1) * sizeof(*dp));
	uint32_t *from = malloc((size_t)(k + 1) * (K + 1) * sizeof(*from));
	int rc = -ERANGE;

	if (!dp || !from) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < (size_t)(k + 1) * (K + 1); i++)
		dp[i] = INFINITY;
	dp[0] = 0;
	for (uint32_t g = 1; g <= k; g++)
		for (uint32_t j = g - 1; j < K; j++) {
			double base = dp[(size_t)(g - 1) * (K + 1) + j];

			if (base == INFINITY)
				continue;
			for (uint32_t l = 1; l <= len[j] && j + l <= K; l++) {
				double c = base + cost[(size_t)j * L + l - 1];
				size_t at = (size_t)g * (K + 1) + j + l;

				if (c < dp[at]) {
					dp[at] = c;
					from[at] = j;
				}
			}
		}
	if (dp[(size_t)k * (K + 1) + K] < INFINITY) {
		uint32_t i = K;

		for (uint32_t g = k; g >= 1; g--) {
			i = from[(size_t)g * (K + 1) + i];
			start[g - 1] = i;
		}
		rc = 0;
	}
out:
	free(dp);
	free(from);
	return rc;
}

/* Run cost: the k-means objective, the within-run sum of squared distances of the regions'
 * centroids to their run's mass-weighted mean, each region weighted by its mass (running
 * sums: sum m|c|^2 - |sum m c|^2 / sum m, doubles in a fixed order). */
static void run_add(const struct dm_vhash *vh, uint32_t r, double *sum, double *w, double *sq)
{
	double m = (double)vh->mass[r];
	const float *c = vh->centroids + (size_t)r * vh->dim;

	for (size_t j = 0; j < vh->dim; j++) {
		sum[j] += m * c[j];
		*sq += m * (double)c[j] * c[j];
	}
	*w += m;
}

static double run_cost(const double *sum, size_t dim, double w, double sq)
{
	double s2 = 0;

	for (size_t j = 0; j < dim; j++)
		s2 += sum[j] * sum[j];
	return w > 0 ? sq - s2 / w : 0;
}

static int run_cost_sse(const struct dm_vhash *vh, const uint32_t *len, uint32_t L, double *cost)
{
	uint32_t K = vh->k;
	size_t dim = vh->dim;
	double *sum = malloc(dim * sizeof(*sum));

	if (!sum)
		return -ENOMEM;
	for (uint32_t a = 0; a < K; a++) {
		double w = 0, sq = 0;

		memset(sum, 0, dim * sizeof(*sum));
		for (uint32_t l = 1; l <= len[a]; l++) {
			run_add(vh, vh->ring[a + l - 1], sum, &w, &sq);
			cost[(size_t)a * L + l - 1] = run_cost(sum, dim, w, sq);
		}
	}
	free(sum);
	return 0;
}

/* Above either bound, the equal-mass cut: the cost table holds K L doubles and takes
 * about 3 K L dim flops (256 regions of 784 dimensions, runs of up to 100: 60 M). */
#define KEYRANGE_DP_MAX_K    4096u
#define KEYRANGE_DP_MAX_WORK (1ull << 28)

/* The cut of dm_oracle_from_vhash: the balanced DP cut of the k-means objective, or -ERANGE
 * (then the caller keeps the equal-mass cut). */
static int cut_runs(const struct dm_vhash *vh, uint32_t k, double eps, uint32_t *start)
{
	uint32_t K = vh->k, L = 0;
	uint64_t cap = (uint64_t)floor((1.0 + eps) * (double)vh->n / (double)k);
	uint32_t *len = NULL;
	double *cost = NULL;
	int rc;

	if (K > KEYRANGE_DP_MAX_K || k > K)
		return -ERANGE;
	len = calloc(K, sizeof(*len));            /* len[a]: the longest run from a under cap */
	if (!len)
		return -ENOMEM;
	for (uint32_t a = 0; a < K; a++) {
		uint64_t m = 0;

		while (a + len[a] < K && m + vh->mass[vh->ring[a + len[a]]] <= cap)
			m += vh->mass[vh->ring[a + len[a]++]];
		if (len[a] > L)
			L = len[a];
	}
	rc = -ERANGE;
	if (L == 0 || (uint64_t)K * L * (vh->dim + 1) > KEYRANGE_DP_MAX_WORK)
		goto out;
	cost = malloc((size_t)K * L * sizeof(*cost));
	rc = -ENOMEM;
	if (!cost)
		goto out;
	rc = run_cost_sse(vh, len, L, cost);
	if (rc == 0)
		rc = cut_runs_dp(K, k, len, L, cost, start);
out:
	free(len);
	free(cost);
	return rc;
}

/* Renumber o's groups: group g becomes perm[g] (o as dm_oracle_from_vhash built it: ring =
 * identity). 0 or -ENOMEM. */
static int renumber(struct dm_oracle *o, const uint32_t *perm)
{
	size_t dim = o->dim;
	float *cent = malloc((size_t)o->k * dim * sizeof(*cent));
	uint64_t *sizes = malloc(o->k * sizeof(*sizes));

	if (!cent || !sizes) {
		free(cent);
		free(sizes);
		return -ENOMEM;
	}
	for (uint32_t g = 0; g < o->k; g++) {
		memcpy(cent + (size_t)perm[g] * dim, o->centroids + (size_t)g * dim,
		       dim * sizeof(*cent));
		sizes[perm[g]] = o->sizes[g];
		o->ring[g] = perm[g];
		o->ring_pos[perm[g]] = g;
	}
	for (uint32_t r = 0; r < o->nfine; r++)
		o->fine_group[r] = perm[o->fine_group[r]];
	free(o->centroids);
	free(o->sizes);
	o->centroids = cent;
	o->sizes = sizes;
	return 0;
}

static int fill_groups(struct dm_oracle *o, const struct dm_vhash *vh, const uint32_t *start);

/* The k-means objective of the runs start[0..k] (start[k] = K), as run_cost_sse. */
static double runs_cost(const struct dm_vhash *vh, const uint32_t *start, uint32_t k)
{
	size_t dim = vh->dim;
	double *sum = malloc(dim * sizeof(*sum)), total = 0;

	if (!sum)
		return INFINITY;
	for (uint32_t g = 0; g < k; g++) {
		double w = 0, sq = 0;

		memset(sum, 0, dim * sizeof(*sum));
		for (uint32_t p = start[g]; p < start[g + 1]; p++)
			run_add(vh, vh->ring[p], sum, &w, &sq);
		total += run_cost(sum, dim, w, sq);
	}
	free(sum);
	return total;
}

/* The previous epoch's runs on vh's ring: each CN's regions (prev_cn, by region) one
 * contiguous run, all k CNs, every run within cap. Writes start[0..k] and the runs' CNs
 * (cn[g]); false when they are not. */
static bool prev_runs(const struct dm_vhash *vh, uint32_t k, uint64_t cap, const uint32_t *prev_cn,
		      uint32_t *start, uint32_t *cn)
{
	bool seen[DM_MAX_NODES] = { false };
	uint32_t g = 0;
	uint64_t m = 0;

	for (uint32_t p = 0; p < vh->k; p++) {
		uint32_t c = prev_cn[vh->ring[p]];

		if (c >= k)
			return false;
		if (p == 0 || c != cn[g - 1]) {
			if (seen[c] || g == k || (p && m > cap))
				return false;   /* a CN's second run, or a heavy run */
			seen[c] = true;
			start[g] = p;
			cn[g++] = c;
			m = 0;
		}
		m += vh->mass[vh->ring[p]];
	}
	start[k] = vh->k;
	return g == k && m <= cap;
}

struct keep_pair {
	uint64_t mass;
	uint32_t run, cn;
};

static int keep_cmp(const void *a, const void *b)
{
	const struct keep_pair *x = a, *y = b;

	if (x->mass != y->mass)
		return x->mass > y->mass ? -1 : 1;
	if (x->run != y->run)
		return x->run < y->run ? -1 : 1;
	return x->cn < y->cn ? -1 : x->cn > y->cn;
}

#define KEYRANGE_KEEP_SLACK 0.10

struct dm_oracle *dm_oracle_from_vhash_keep(const struct dm_vhash *vh, uint32_t k,
					    double balance_eps, const uint32_t *prev_cn)
{
	struct dm_oracle *o = dm_oracle_from_vhash(vh, k, balance_eps);
	struct keep_pair *pairs;
	uint32_t perm[DM_MAX_NODES];
	bool cn_used[DM_MAX_NODES] = { false }, run_done[DM_MAX_NODES] = { false };
	size_t np = (size_t)k * k;

	if (!o || !prev_cn)
		return o;
	/* Hysteresis: the previous runs, where they still are runs within the bound, unless
	 * the best cut is over KEYRANGE_KEEP_SLACK cheaper (a cut whose cost moved a little
	 * would otherwise move a range's edge and its rows at every refit) */
	uint32_t pstart[DM_MAX_NODES + 1], dstart[DM_MAX_NODES + 1];
	uint64_t cap = (uint64_t)floor((1.0 + balance_eps) * (double)vh->n / (double)k);

	for (uint32_t p = vh->k; p-- > 0;)
		dstart[o->fine_group[p]] = p;
	dstart[k] = vh->k;
	if (prev_runs(vh, k, cap, prev_cn, pstart, perm) &&
	    runs_cost(vh, pstart, k) <= (1 + KEYRANGE_KEEP_SLACK) * runs_cost(vh, dstart, k)) {
		if (fill_groups(o, vh, pstart) || renumber(o, perm)) {
			dm_oracle_free(o);
			errno = ENOMEM;
			return NULL;
		}
		return o;
	}
	pairs = calloc(np, sizeof(*pairs));
	if (!pairs) {
		dm_oracle_free(o);
		errno = ENOMEM;
		return NULL;
	}
	for (uint32_t g = 0; g < k; g++)
		for (uint32_t c = 0; c < k; c++)
			pairs[(size_t)g * k + c] = (struct keep_pair){ .run = g, .cn = c };
	for (uint32_t r = 0; r < vh->k; r++)   /* region r is fine centroid ring_pos[r] */
		if (prev_cn[r] < k)
			pairs[(size_t)o->fine_group[vh->ring_pos[r]] * k + prev_cn[r]].mass +=
				vh->mass[r];
	qsort(pairs, np, sizeof(*pairs), keep_cmp);
	for (size_t i = 0; i < np; i++) {
		if (!pairs[i].mass || run_done[pairs[i].run] || cn_used[pairs[i].cn])
			continue;
		perm[pairs[i].run] = pairs[i].cn;
		run_done[pairs[i].run] = cn_used[pairs[i].cn] = true;
	}
	for (uint32_t g = 0, c = 0; g < k; g++) {
		if (run_done[g])
			continue;
		while (cn_used[c])
			c++;
		perm[g] = c;
		cn_used[c] = true;
	}
	free(pairs);
	if (renumber(o, perm)) {
		dm_oracle_free(o);
		errno = ENOMEM;
		return NULL;
	}
	return o;
}

bool dm_oracle_balanced(const struct dm_oracle *o, double eps)
{
	if (!o || !o->k)
		return false;
	uint64_t cap = (uint64_t)floor((1.0 + eps) * (double)o->n / (double)o->k);

	for (uint32_t g = 0; g < o->k; g++)
		if (o->sizes[g] > cap)
			return false;
	return true;
}

uint64_t dm_oracle_largest(const struct dm_oracle *o)
{
	uint64_t m = 0;

	for (uint32_t g = 0; o && g < o->k; g++)
		if (o->sizes[g] > m)
			m = o->sizes[g];
	return m;
}

int dm_oracle_region_ring(const struct dm_oracle *o, uint32_t *order)
{
	if (!o || !order || o->algo != DM_ORACLE_KEYRANGE)
		return -EINVAL;
	/* dm_oracle_from_vhash keeps its regions in key order: runs in CN ring order */
	for (uint32_t p = 1; p < o->nfine; p++)
		if (o->ring_pos[o->fine_group[p]] < o->ring_pos[o->fine_group[p - 1]])
			return -EINVAL;
	for (uint32_t p = 0; p < o->nfine; p++)
		order[p] = p;
	return 0;
}

/* Whether each group's entries of grp (K) are one contiguous index range. */
static bool runs_contiguous(const uint32_t *grp, uint32_t K, uint32_t k)
{
	bool seen[DM_MAX_NODES] = { false };

	for (uint32_t p = 0; p < K; p++) {
		if (grp[p] >= k || (seen[grp[p]] && grp[p] != grp[p - 1]))
			return false;
		seen[grp[p]] = true;
	}
	return true;
}

struct dm_oracle *dm_oracle_keyrange_fit(const float *sample, size_t n, size_t dim, uint32_t K,
					 uint32_t k, double eps, uint64_t seed,
					 const float *cur_regions, const uint32_t *cur_cn,
					 void (*pace)(void *arg), void *pace_arg, bool *warm)
{
	struct dm_vhash_opts vo;
	struct dm_vhash *vh;
	struct dm_oracle *o;
	uint32_t *ring = NULL;

	if (warm)
		*warm = false;
	dm_vhash_opts_default(&vo);
	vo.pace = pace;
	vo.pace_arg = pace_arg;
	vo.init = cur_regions;
	if (cur_regions && cur_cn && k <= DM_MAX_NODES && runs_contiguous(cur_cn, K, k)) {
		/* the current regions are in key order: keep it as the ring where it serves */
		ring = malloc(K * sizeof(*ring));
		if (!ring) {
			errno = ENOMEM;
			return NULL;
		}
		for (uint32_t p = 0; p < K; p++)
			ring[p] = p;
		vo.init_ring = ring;
	}
	vh = dm_vhash_fit(sample, n, dim, K, seed, &vo);
	free(ring);
	if (!vh)
		return NULL;
	o = dm_oracle_from_vhash_keep(vh, k, eps, cur_regions ? cur_cn : NULL);
	dm_vhash_free(vh);
	if (!o || !cur_regions)
		return o;
	if (!dm_oracle_balanced(o, eps)) {
		/* No cut within the bound: the warm start may have kept regions that the sample
		 * now crowds into. Fit from scratch too and take whichever is better balanced
		 * (a sample with a heavy region cannot be cut within the bound either way). */
		struct dm_oracle *co = dm_oracle_keyrange_fit(sample, n, dim, K, k, eps, seed, NULL,
							      NULL, pace, pace_arg, NULL);

		if (co && dm_oracle_largest(co) < dm_oracle_largest(o)) {
			dm_oracle_free(o);
			return co;   /* cold */
		}
		dm_oracle_free(co);
	}
	if (warm)
		*warm = true;
	return o;
}

/* Groups of o from the cut start[0..k] (start[k] = K): fine_group (by ring position),
 * sizes, centroids (the mass-weighted means of the runs' region centroids: what the spill
 * order breaks ties on), ring = identity (the CN ring is the key order: run g is CN g).
 * 0 or -ENOMEM. */
static int fill_groups(struct dm_oracle *o, const struct dm_vhash *vh, const uint32_t *start)
{
	uint32_t k = o->k;
	size_t dim = vh->dim;
	double *acc = calloc((size_t)k * dim, sizeof(*acc)), *w = calloc(k, sizeof(*w));

	if (!acc || !w) {
		free(acc);
		free(w);
		return -ENOMEM;
	}
	memset(o->sizes, 0, k * sizeof(*o->sizes));
	for (uint32_t g = 0; g < k; g++)
		for (uint32_t p = start[g]; p < start[g + 1]; p++) {
			uint32_t r = vh->ring[p];
			/* weight: the region's mass, at least 1 (an empty region still counts) */
			double m = vh->mass[r] ? (double)vh->mass[r] : 1.0;

			o->fine_group[p] = g;
			o->sizes[g] += vh->mass[r];
			w[g] += m;
			for (size_t j = 0; j < dim; j++)
				acc[(size_t)g * dim + j] += m * vh->centroids[(size_t)r * dim + j];
		}
	for (uint32_t g = 0; g < k; g++) {
		for (size_t j = 0; j < dim; j++)
			o->centroids[(size_t)g * dim + j] = (float)(acc[(size_t)g * dim + j] / w[g]);
		o->ring[g] = g;
		o->ring_pos[g] = g;
	}
	free(acc);
	free(w);
	return 0;
}

struct dm_oracle *dm_oracle_from_vhash(const struct dm_vhash *vh, uint32_t k, double balance_eps)
{
	struct dm_oracle *o;
	uint32_t *start = NULL;
	int rc;
	size_t dim;

	if (!vh || k < 1 || k > DM_MAX_NODES || k > vh->k || vh->k > k * 256u ||
	    !(balance_eps >= 0 && balance_eps <= 100)) {
		errno = EINVAL;
		return NULL;
	}
	dim = vh->dim;
	o = calloc(1, sizeof(*o));
	start = calloc(k + 1, sizeof(*start));
	if (!o || !start)
		goto out_nomem;
	o->k = k;
	o->dim = vh->dim;
	o->nfine = vh->k;
	o->algo = DM_ORACLE_KEYRANGE;
	o->n = vh->n;
	o->fine = malloc((size_t)vh->k * dim * sizeof(*o->fine));
	o->fine_group = malloc(vh->k * sizeof(*o->fine_group));
	o->bias = calloc(vh->k, sizeof(*o->bias));      /* the VHash's bias-free rule */
	o->centroids = malloc((size_t)k * dim * sizeof(*o->centroids));
	o->sizes = calloc(k, sizeof(*o->sizes));
	o->ring = malloc(k * sizeof(*o->ring));
	o->ring_pos = malloc(k * sizeof(*o->ring_pos));
	if (!o->fine || !o->fine_group || !o->bias || !o->centroids || !o->sizes || !o->ring ||
	    !o->ring_pos)
		goto out_nomem;
	/* fine centroid p = the region at ring position p: the oracle keeps the key order of
	 * its regions (dm_oracle_region_ring), and the runs are index ranges */
	for (uint32_t p = 0; p < vh->k; p++)
		memcpy(o->fine + (size_t)p * dim, vh->centroids + (size_t)vh->ring[p] * dim,
		       dim * sizeof(*o->fine));
	rc = cut_runs(vh, k, balance_eps, start);
	if (rc == -ENOMEM)
		goto out_nomem;
	if (rc < 0)
		cut_runs_equal(vh, k, start);
	start[k] = vh->k;
	if (fill_groups(o, vh, start))
		goto out_nomem;
	free(start);
	return o;

out_nomem:
	free(start);
	dm_oracle_free(o);
	errno = ENOMEM;
	return NULL;
}
