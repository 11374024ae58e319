/* vhash.c: VHash, Semord's learned semantic key space (§3.1): training (coarse regions from
 * the oracle's balanced k-means, their ring order, mass-proportional key intervals by
 * largest remainder with a minimum share, one radial CDF per region), inference (nearest
 * region, CDF, interval materialisation in integer arithmetic, §3.1.2), the region ranking
 * and ambiguity gap a bounded-fanout frontier needs (§3.2.1), and the serialised form (save,
 * validating load). The formulas and the format are in vhash.h and docs/oracle.md.
 *
 * Everything that decides anything is exact: nearest centroids by dm_oracle_l2_exact (fixed
 * order double arithmetic, -ffp-contract=off), interval lengths and key offsets in 128-bit
 * integers, CDF knots from sorted double distances. So every process fitting the same sample
 * with the same K, seed and options obtains the same bytes and the same keys.
 */
#include "vhash.h"
#include "oracle.h"
#include "util/dm_buf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef unsigned __int128 u128;

/* A model with every array allocated (zeroed), or NULL. */
static struct dm_vhash *vh_alloc(uint32_t dim, uint32_t k, uint32_t knots)
{
	struct dm_vhash *vh = calloc(1, sizeof(*vh));

	if (!vh)
		return NULL;
	vh->dim = dim;
	vh->k = k;
	vh->knots = knots;
	vh->centroids = calloc((size_t)k * dim, sizeof(float));
	vh->ring = calloc(k, sizeof(uint32_t));
	vh->ring_pos = calloc(k, sizeof(uint32_t));
	vh->mass = calloc(k, sizeof(uint64_t));
	vh->lo = calloc(k, sizeof(uint64_t));
	vh->hi = calloc(k, sizeof(uint64_t));
	vh->cdf = calloc((size_t)k * knots, sizeof(double));
	if (!vh->centroids || !vh->ring || !vh->ring_pos || !vh->mass || !vh->lo || !vh->hi ||
	    !vh->cdf) {
		dm_vhash_free(vh);
		return NULL;
	}
	return vh;
}

void dm_vhash_free(struct dm_vhash *vh)
{
	if (!vh)
		return;
	free(vh->centroids);
	free(vh->ring);
	free(vh->ring_pos);
	free(vh->mass);
	free(vh->lo);
	free(vh->hi);
	free(vh->cdf);
	free(vh);
}

/* ---- training: options ---------------------------------------------------------------- */

void dm_vhash_opts_default(struct dm_vhash_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->knots = DM_VHASH_KNOTS_DEFAULT;
	o->ring_knn = 8;
	o->balance_eps = DM_VHASH_BALANCE_EPS;
	o->max_iter = 50;
}

/* ---- key intervals -------------------------------------------------------------------- */

struct remainder {
	uint64_t rem;   /* (R m_r) mod n */
	uint32_t r;
};

/* Larger remainder first, ties to the lower region id. */
static int rem_cmp(const void *a, const void *b)
{
	const struct remainder *x = a, *y = b;

	if (x->rem != y->rem)
		return x->rem > y->rem ? -1 : 1;
	return x->r < y->r ? -1 : x->r > y->r;
}

/* Interval lengths len_r = M + floor(R m_r / n) + (1 for the L largest remainders), with
 * M = floor(2^54 / k), R = 2^64 - k M and L = R - sum floor(...) < k, so that they sum to
 * exactly 2^64 and |len_r - (M + R m_r / n)| < 1. Laid out contiguously in ring order from
 * key 0. Needs vh->mass, vh->n, vh->ring. */
static int fit_intervals(struct dm_vhash *vh)
{
	const uint32_t k = vh->k;
	const uint64_t n = vh->n, M = (1ull << DM_VHASH_MIN_SHARE_LOG2) / k;
	const u128 space = (u128)1 << 64, R = space - (u128)k * M;
	u128 *len = malloc(k * sizeof(*len)), given = 0;
	struct remainder *rm = malloc(k * sizeof(*rm));
	uint64_t at = 0;
	int ret = 0;

	if (!len || !rm) {
		ret = -ENOMEM;
		goto out_free;
	}
	for (uint32_t r = 0; r < k; r++) {
		u128 q = R * vh->mass[r];
		len[r] = M + q / n;
		rm[r].rem = (uint64_t)(q % n);
		rm[r].r = r;
		given += len[r];
	}
	/* sum of the remainders is L n with every remainder < n: L < k, and only regions with
	 * a non-zero remainder get one of the L extra keys */
	uint64_t left = (uint64_t)(space - given);
	qsort(rm, k, sizeof(*rm), rem_cmp);
	for (uint64_t t = 0; t < left; t++)
		len[rm[t].r]++;
	for (uint32_t t = 0; t < k; t++) {
		uint32_t r = vh->ring[t];
		vh->lo[r] = at;
		vh->hi[r] = at + (uint64_t)(len[r] - 1);
		at = vh->hi[r] + 1; /* wraps to 0 after the last interval, which ends at 2^64 - 1 */
	}
out_free:
	free(len);
	free(rm);
	return ret;
}

/* ---- radial CDFs ---------------------------------------------------------------------- */

static int dbl_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Knots of a region without sample members (possible when two centroids coincide or a
 * centroid's cell holds none of the points that made it): evenly spaced up to a quarter of
 * the squared distance to the nearest other centroid (the squared radius of the largest
 * ball around c_r inside its cell), so that keys still spread with the radius. */
static void empty_knots(const struct dm_vhash *vh, uint32_t r, double *q)
{
	const uint32_t Q = vh->knots - 1;
	const float *c = vh->centroids + (size_t)r * vh->dim;
	double h = INFINITY;

	for (uint32_t j = 0; j < vh->k; j++)
		if (j != r)
			h = fmin(h, dm_oracle_l2_exact(c, vh->centroids + (size_t)j * vh->dim,
						       vh->dim));
	if (!isfinite(h))
		h = 0; /* k = 1 (cannot be empty then: n >= 1), defensive */
	h /= 4;
	for (uint32_t i = 0; i <= Q; i++)
		q[i] = h * i / Q;
}

/* Knot i of a region with m >= 1 members whose sorted squared distances are d[0..m-1]: the
 * linearly interpolated quantile at i / Q (position (m-1) i / Q, integer part exact). One
 * member: every knot equals its distance (F steps from 0 to 1 there). Rounding cannot make
 * the knots decrease: each is clamped to [previous knot, next order statistic]. */
static void member_knots(const double *d, uint64_t m, uint32_t knots, double *q)
{
	const uint64_t Q = knots - 1;

	for (uint64_t i = 0; i <= Q; i++) {
		uint64_t pos = (m - 1) * i, a = pos / Q, rem = pos % Q;
		double v = d[a];
		if (rem) {
			v = d[a] + (double)rem / (double)Q * (d[a + 1] - d[a]);
			v = fmin(v, d[a + 1]);
		}
		if (i && v < q[i - 1])
			v = q[i - 1];
		q[i] = v;
	}
}

/* Fit every region's CDF knots from the sample's nearest regions and squared distances. */
static int fit_cdfs(struct dm_vhash *vh, const uint32_t *assign, const double *d2)
{
	const uint32_t k = vh->k;
	size_t *cur = malloc(((size_t)k + 1) * sizeof(size_t));
	double *by = malloc(vh->n * sizeof(double));
	int ret = 0;

	if (!cur || !by) {
		ret = -ENOMEM;
		goto out_free;
	}
	/* group the distances by region (counting sort, point order within a region) */
	cur[0] = 0;
	for (uint32_t r = 0; r < k; r++)
		cur[r + 1] = cur[r] + vh->mass[r];
	for (size_t i = 0; i < vh->n; i++)
		by[cur[assign[i]]++] = d2[i];
	/* cur[r] is now the end of region r, i.e. the start of region r + 1 */
	for (uint32_t r = 0; r < k; r++) {
		double *d = by + (cur[r] - vh->mass[r]), *q = vh->cdf + (size_t)r * vh->knots;
		if (!vh->mass[r]) {
			empty_knots(vh, r, q);
			continue;
		}
		qsort(d, vh->mass[r], sizeof(double), dbl_cmp);
		member_knots(d, vh->mass[r], vh->knots, q);
	}
out_free:
	free(cur);
	free(by);
	return ret;
}

/* ---- fit ------------------------------------------------------------------------------ */

static bool opts_ok(const struct dm_vhash_opts *o)
{
	return o->knots >= 2 && o->knots <= DM_VHASH_KNOTS_MAX && o->balance_eps >= 0 &&
	       isfinite(o->balance_eps) && o->max_iter > 0;
}

struct dm_vhash *dm_vhash_fit(const float *sample, size_t n, size_t dim, uint32_t k,
			      uint64_t seed, const struct dm_vhash_opts *opts)
{
	struct dm_vhash_opts def;
	struct dm_oracle_params p;
	struct dm_oracle *o;
	struct dm_vhash *vh;
	uint32_t *assign = NULL;
	double *d2 = NULL;
	int ret;

	if (!opts) {
		dm_vhash_opts_default(&def);
		opts = &def;
	}
	if (!sample || dim == 0 || dim > DM_VHASH_DIM_MAX || k == 0 || k > DM_VHASH_K_MAX ||
	    n < k || (uint64_t)n * k > UINT32_MAX || !opts_ok(opts)) {
		errno = EINVAL;
		return NULL;
	}
	for (size_t i = 0; i < n * dim; i++) {
		if (!(fabsf(sample[i]) <= 1e15f)) { /* also NaN; the oracle's bound */
			dm_err("vhash: sample value %zu is not finite or too large", i);
			errno = EINVAL;
			return NULL;
		}
	}
	/* layer 1: the oracle's balanced k-means; its group centroids are the regions */
	dm_oracle_params_default(&p, k);
	p.seed = seed;
	p.balance_eps = opts->balance_eps;
	p.max_iter = opts->max_iter;
	p.ring_knn = opts->ring_knn;
	p.pace = opts->pace;
	p.pace_arg = opts->pace_arg;
	p.init = opts->init;
	o = dm_oracle_build(sample, n, dim, &p);
	if (!o)
		return NULL; /* errno set */
	vh = vh_alloc((uint32_t)dim, k, opts->knots);
	if (!vh)
		goto err_oracle;
	memcpy(vh->centroids, o->centroids, (size_t)k * dim * sizeof(float));
	dm_oracle_free(o);
	vh->n = n;
	/* layer 2: ring order (position -> region) */
	ret = opts->init && opts->init_ring ?
		dm_oracle_ring_order_from(vh->centroids, k, dim, opts->ring_knn, opts->init_ring,
					  DM_VHASH_RING_SLACK, vh->ring) :
		dm_oracle_ring_order(vh->centroids, k, dim, opts->ring_knn, vh->ring);
	if (ret)
		goto err_vhash;
	for (uint32_t t = 0; t < k; t++)
		vh->ring_pos[vh->ring[t]] = t;
	/* masses under the inference rule (nearest centroid, no balancing bias) */
	assign = malloc(n * sizeof(uint32_t));
	d2 = malloc(n * sizeof(double));
	if (!assign || !d2) {
		ret = -ENOMEM;
		goto err_scratch;
	}
	for (size_t i = 0; i < n; i++) {
		assign[i] = dm_vhash_nearest(vh, sample + i * dim, &d2[i]);
		vh->mass[assign[i]]++;
	}
	ret = fit_intervals(vh);
	if (ret)
		goto err_scratch;
	/* layer 3: radial CDFs */
	ret = fit_cdfs(vh, assign, d2);
	if (ret)
		goto err_scratch;
	free(assign);
	free(d2);
	return vh;

err_scratch:
	free(assign);
	free(d2);
err_vhash:
	dm_vhash_free(vh);
	errno = -ret;
	return NULL;
err_oracle:
	dm_oracle_free(o);
	errno = ENOMEM;
	return NULL;
}

/* ---- inference ------------------------------------------------------------------------ */

uint32_t dm_vhash_nearest(const struct dm_vhash *vh, const float *x, double *d2)
{
	double best = INFINITY, d[64];
	uint32_t br = 0;

	for (uint32_t r0 = 0; r0 < vh->k; r0 += 64) {
		uint32_t nr = DM_MIN(64u, vh->k - r0);

		dm_oracle_l2_exact_many(x, vh->centroids + (size_t)r0 * vh->dim, nr, vh->dim, d);
		for (uint32_t j = 0; j < nr; j++) {
			if (d[j] < best) { /* strict: ties stay with the lower id */
				best = d[j];
				br = r0 + j;
			}
		}
	}
	if (d2)
		*d2 = best;
	return br;
}

double dm_vhash_cdf(const struct dm_vhash *vh, uint32_t r, double d2)
{
	const double *q = vh->cdf + (size_t)r * vh->knots;
	const uint32_t Q = vh->knots - 1;
	uint32_t a = 0, b = Q;

	if (!(d2 >= q[0]))
		return 0.0; /* below the first knot, or NaN */
	if (d2 >= q[Q])
		return 1.0;
	/* invariant q[a] <= d2 < q[b]: at the end b = a + 1 and q[a] < q[b] */
	while (b - a > 1) {
		uint32_t mid = a + (b - a) / 2;
		if (q[mid] <= d2)
			a = mid;
		else
			b = mid;
	}
	/* t in [0, 1] (rounding is monotone), so F is in [a/Q, (a+1)/Q] on this segment and
	 * >= (a+1)/Q on the next ones: non-decreasing */
	double t = (d2 - q[a]) / (q[b] - q[a]);
	return ((double)a + t) / (double)Q;
}

uint64_t dm_vhash_key_at(const struct dm_vhash *vh, uint32_t r, double d2)
{
	double f = dm_vhash_cdf(vh, r, d2);
	/* F as a 64-bit fraction: ldexp is exact, truncation monotone; F = 1 -> 1 - 2^-64 */
	uint64_t frac = f >= 1.0 ? UINT64_MAX : (uint64_t)ldexp(f, 64);
	uint64_t span = vh->hi[r] - vh->lo[r];                 /* len - 1 */
	uint64_t off = (uint64_t)(((u128)frac * ((u128)span + 1)) >> 64); /* < len */

	return vh->lo[r] + DM_MIN(off, span);
}

uint64_t dm_vhash_key(const struct dm_vhash *vh, const float *x, uint32_t *region)
{
	double d2;
	uint32_t r = dm_vhash_nearest(vh, x, &d2);

	if (region)
		*region = r;
	return dm_vhash_key_at(vh, r, d2);
}

uint32_t dm_vhash_key_region(const struct dm_vhash *vh, uint64_t key)
{
	uint32_t a = 0, b = vh->k; /* last position whose interval starts at or before key */

	while (b - a > 1) {
		uint32_t mid = a + (b - a) / 2;
		if (vh->lo[vh->ring[mid]] <= key)
			a = mid;
		else
			b = mid;
	}
	return vh->ring[a];
}

int dm_vhash_rank(const struct dm_vhash *vh, const float *x, uint32_t *regions, double *dist,
		  uint32_t m)
{
	uint32_t cnt = 0;

	if (!vh || !x || (m && (!regions || !dist)))
		return -EINVAL;
	m = DM_MIN(m, vh->k);
	for (uint32_t r = 0; m && r < vh->k; r++) {
		double d = dm_oracle_l2_exact(x, vh->centroids + (size_t)r * vh->dim, vh->dim);
		/* strictly nearer than the current last: equal distances keep the lower id */
		if (cnt == m && !(d < dist[cnt - 1]))
			continue;
		uint32_t at = cnt < m ? cnt++ : m - 1;
		while (at > 0 && d < dist[at - 1]) {
			dist[at] = dist[at - 1];
			regions[at] = regions[at - 1];
			at--;
		}
		dist[at] = d;
		regions[at] = r;
	}
	return (int)cnt;
}

double dm_vhash_gap(const double *dist, uint32_t count, double *rel)
{
	if (!dist || count < 2) {
		if (rel)
			*rel = 1.0;
		return INFINITY;
	}
	double g = dist[1] - dist[0];
	if (rel)
		*rel = dist[1] > 0 ? g / dist[1] : 0.0;
	return g;
}

/* ---- serialised form ------------------------------------------------------------------ */

/* zlib's crc32 of n bytes (its length argument is 32 bits wide: fed in chunks). */
static uint32_t crc_of(const uint8_t *p, size_t n)
{
	uLong c = crc32(0L, Z_NULL, 0);

	for (size_t at = 0; at < n;) {
		uInt chunk = (uInt)DM_MIN(n - at, (size_t)1 << 30);
		c = crc32(c, p + at, chunk);
		at += chunk;
	}
	return (uint32_t)c;
}

/* Bytes of a model with these sizes (header, arrays, CRC). */
static size_t blob_size(uint32_t dim, uint32_t k, uint32_t knots)
{
	return DM_VHASH_HDR + (size_t)k * dim * 4 + (size_t)k * (4 + 8 + 16) +
	       (size_t)k * knots * 8 + 4;
}

size_t dm_vhash_save_size(const struct dm_vhash *vh)
{
	return blob_size(vh->dim, vh->k, vh->knots);
}

int dm_vhash_save(const struct dm_vhash *vh, void *buf, size_t len)
{
	uint8_t *p = buf, *w;
	size_t k = vh ? vh->k : 0;

	if (!vh || !buf)
		return -EINVAL;
	if (len < dm_vhash_save_size(vh))
		return -ENOSPC;
	dm_put_le32(p, DM_VHASH_MAGIC);
	dm_put_le32(p + 4, DM_VHASH_VERSION);
	dm_put_le64(p + 8, vh->epoch);
	dm_put_le32(p + 16, vh->dim);
	dm_put_le32(p + 20, vh->k);
	dm_put_le32(p + 24, vh->knots);
	dm_put_le32(p + 28, 0); /* flags */
	dm_put_le64(p + 32, vh->n);
	w = p + DM_VHASH_HDR;
	for (size_t i = 0; i < k * vh->dim; i++, w += 4) {
		uint32_t u;
		memcpy(&u, &vh->centroids[i], 4);
		dm_put_le32(w, u);
	}
	for (size_t r = 0; r < k; r++, w += 4)
		dm_put_le32(w, vh->ring[r]);
	for (size_t r = 0; r < k; r++, w += 8)
		dm_put_le64(w, vh->mass[r]);
	for (size_t r = 0; r < k; r++, w += 16) {
		dm_put_le64(w, vh->lo[r]);
		dm_put_le64(w + 8, vh->hi[r]);
	}
	for (size_t i = 0; i < k * vh->knots; i++, w += 8) {
		uint64_t u;
		memcpy(&u, &vh->cdf[i], 8);
		dm_put_le64(w, u);
	}
	dm_put_le32(w, crc_of(p, (size_t)(w - p)));
	return 0;
}

/* The contents of a loaded model make sense (the bytes were already length- and
 * CRC-checked): see dm_vhash_load in vhash.h. */
static bool model_ok(struct dm_vhash *vh)
{
	const uint32_t k = vh->k;
	uint64_t sum = 0;

	for (size_t i = 0; i < (size_t)k * vh->dim; i++)
		if (!isfinite(vh->centroids[i]))
			return false;
	/* ring: a permutation (ring_pos doubles as the seen marker) */
	for (uint32_t r = 0; r < k; r++)
		vh->ring_pos[r] = UINT32_MAX;
	for (uint32_t t = 0; t < k; t++) {
		uint32_t r = vh->ring[t];
		if (r >= k || vh->ring_pos[r] != UINT32_MAX)
			return false;
		vh->ring_pos[r] = t;
	}
	if (vh->n < k)
		return false;
	for (uint32_t r = 0; r < k; r++) {
		if (vh->mass[r] > vh->n - sum)
			return false;
		sum += vh->mass[r];
	}
	if (sum != vh->n)
		return false;
	/* intervals: non-empty, contiguous in ring order from 0, the last ending at 2^64 - 1 */
	for (uint32_t t = 0; t < k; t++) {
		uint32_t r = vh->ring[t];
		if (vh->lo[r] > vh->hi[r])
			return false;
		if (t == 0 && vh->lo[r] != 0)
			return false;
		if (t > 0 && (vh->hi[vh->ring[t - 1]] == UINT64_MAX ||
			      vh->lo[r] != vh->hi[vh->ring[t - 1]] + 1))
			return false;
	}
	if (vh->hi[vh->ring[k - 1]] != UINT64_MAX)
		return false;
	/* CDF knots: finite, >= 0, non-decreasing */
	for (uint32_t r = 0; r < k; r++) {
		const double *q = vh->cdf + (size_t)r * vh->knots;
		for (uint32_t i = 0; i < vh->knots; i++)
			if (!isfinite(q[i]) || !(q[i] >= (i ? q[i - 1] : 0.0)))
				return false;
	}
	return true;
}

int dm_vhash_load(const void *buf, size_t len, struct dm_vhash **out)
{
	const uint8_t *p = buf, *rd;
	struct dm_vhash *vh;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!buf || len < DM_VHASH_HDR + 4)
		return -EINVAL;
	uint32_t dim = dm_get_le32(p + 16), k = dm_get_le32(p + 20), knots = dm_get_le32(p + 24);
	if (dm_get_le32(p) != DM_VHASH_MAGIC || dm_get_le32(p + 4) != DM_VHASH_VERSION ||
	    dm_get_le32(p + 28) != 0 || dim == 0 || dim > DM_VHASH_DIM_MAX || k == 0 ||
	    k > DM_VHASH_K_MAX || knots < 2 || knots > DM_VHASH_KNOTS_MAX)
		return -EINVAL;
	size_t body = blob_size(dim, k, knots) - 4;
	if (len != body + 4 || dm_get_le32(p + body) != crc_of(p, body))
		return -EINVAL;
	vh = vh_alloc(dim, k, knots);
	if (!vh)
		return -ENOMEM;
	vh->epoch = dm_get_le64(p + 8);
	vh->n = dm_get_le64(p + 32);
	rd = p + DM_VHASH_HDR;
	for (size_t i = 0; i < (size_t)k * dim; i++, rd += 4) {
		uint32_t u = dm_get_le32(rd);
		memcpy(&vh->centroids[i], &u, 4);
	}
	for (uint32_t r = 0; r < k; r++, rd += 4)
		vh->ring[r] = dm_get_le32(rd);
	for (uint32_t r = 0; r < k; r++, rd += 8)
		vh->mass[r] = dm_get_le64(rd);
	for (uint32_t r = 0; r < k; r++, rd += 16) {
		vh->lo[r] = dm_get_le64(rd);
		vh->hi[r] = dm_get_le64(rd + 8);
	}
	for (size_t i = 0; i < (size_t)k * knots; i++, rd += 8) {
		uint64_t u = dm_get_le64(rd);
		memcpy(&vh->cdf[i], &u, 8);
	}
	if (!model_ok(vh)) {
		dm_vhash_free(vh);
		return -EINVAL;
	}
	*out = vh;
	return 0;
}
