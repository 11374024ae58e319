/* kmeans.c: deterministic balanced k-means for the oracle (logical partitioning of the HNSW
 * graph across CNs, SHINE §4).
 *
 * Every CN clusters the same sample with the same seed and must obtain bit-identical
 * centroids without exchanging them. Floating-point results that depend on the OpenBLAS
 * thread count, its kernel (DYNAMIC_ARCH picks one per CPU) or our ISA-dispatched kernels
 * would break that: one point assigned differently near a boundary gives different means,
 * and the runs diverge from there. So:
 *
 *  - every value that decides anything (assignments, k-means++ draws, merges, balance) comes
 *    from dm_oracle_l2_exact(): float inputs widened to double, four accumulators in a fixed
 *    order, compiled with -ffp-contract=off (oracle/meson.build). x86-64 does double in SSE2
 *    with IEEE round-to-nearest, so the same source gives the same bits on every CPU;
 *  - OpenBLAS (through dm_distance_batch) is used for the n x k distance matrices only as a
 *    filter. Any float evaluation of |x|^2 + |c|^2 - 2 x.c, in any summation order, with or
 *    without FMA, is within E = (gamma_dim + 4u) (|x| + |c|)^2 of the true value
 *    (u = 2^-24, gamma_dim = dim u / (1 - dim u), the standard dot-product bound). A centroid
 *    whose BLAS distance exceeds the BLAS minimum by more than 2E (we use 4E) cannot be the
 *    nearest, so only the centroids within that margin are re-evaluated exactly; ties go to
 *    the lower index. The outcome is therefore the exact-arithmetic argmin whatever BLAS
 *    returned, and BLAS still does the O(n k dim) work;
 *  - centroids are means accumulated in double in point-index order, then rounded to float;
 *  - randomness is our own xoshiro256** seeded by splitmix64.
 *
 * Two algorithms (docs/oracle.md has the measurements):
 *  - DM_ORACLE_CONSTRAINED (default): k-means++, a few plain Lloyd iterations, then Lloyd
 *    with a capacity-constrained assignment: all (point, centroid) pairs in increasing exact
 *    distance, a point goes to the first centroid that still has room (capacity
 *    ceil((1+eps) n/k)). A greedy stand-in for Malinen & Fraenti's balanced k-means (which
 *    solves the assignment exactly with the Hungarian algorithm, O(n^3)). Then balancing
 *    biases (km_bias) so that the predictor's nearest-centroid rule reproduces the balance.
 *  - DM_ORACLE_DOUBLING (SHINE): Lloyd with k' = k, 2k, 4k ... fine clusters; after each run
 *    the fine clusters are merged greedily into k groups (Ward cost n_i n_j/(n_i+n_j) |c_i -
 *    c_j|^2, i.e. the closest pair weighted by size, among pairs whose union still fits the
 *    capacity (1+eps) n/k); doubling stops as soon as the groups are balanced.
 *
 * Why CONSTRAINED is the default (figures in docs/oracle.md, Fashion-MNIST and a skewed
 * Gaussian mixture, k = 4, 8, 16): with its balancing biases it meets the balance bound on
 * the sample in every case (doubling: 2 of 6, greedy merging has no look-ahead), its
 * held-out largest group is smaller in 4 of 6, its partitions are tighter on Fashion-MNIST
 * (12-17% lower mean squared distance to the group mean) and within 4% on the mixture, and
 * prediction costs k distance computations instead of up to k * 2^4.
 *
 * Balance criterion (both): the largest group holds at most (1+eps) n/k sample points when
 * every sample point is assigned the way the predictor would assign a query (nearest fine
 * centroid). That is the balance the router will see.
 */
#include "oracle.h"
#include "util/dm_hash.h"
#include "distance.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- RNG: xoshiro256** seeded by splitmix64 ---------------------------------------------- */

/* Uniform double in [0,1) from the top 53 bits (exact, no rounding). */
static double rng_u01(struct dm_rng *r)
{
	return dm_rng_double(r);
}

/* ---- exact kernel -------------------------------------------------------------------------- */

double dm_oracle_l2_exact(const float *a, const float *b, size_t dim)
{
	double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	size_t i = 0;

	for (; i + 4 <= dim; i += 4) {
		double d0 = (double)a[i] - (double)b[i];
		double d1 = (double)a[i + 1] - (double)b[i + 1];
		double d2 = (double)a[i + 2] - (double)b[i + 2];
		double d3 = (double)a[i + 3] - (double)b[i + 3];
		s0 += d0 * d0;
		s1 += d1 * d1;
		s2 += d2 * d2;
		s3 += d3 * d3;
	}
	for (; i < dim; i++) {
		double d = (double)a[i] - (double)b[i];
		s0 += d * d;
	}
	return (s0 + s1) + (s2 + s3);
}

/* Four pairs (x, c_j), j < 4, at once: lane l of acc[j] is s_l of dm_oracle_l2_exact, and
 * every lane does that loop's operations in its order (convert, subtract, multiply, add;
 * separate instructions, never fused), so the bits are the same. */
__attribute__((target("avx2"))) static void l2_exact4_avx2(const float *x, const float *c,
							   size_t dim, double *out)
{
	__m256d acc[4] = { _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
			   _mm256_setzero_pd() };
	size_t i = 0;

	for (; i + 4 <= dim; i += 4) {
		__m256d xv = _mm256_cvtps_pd(_mm_loadu_ps(x + i));

		for (int j = 0; j < 4; j++) {
			__m256d d = _mm256_sub_pd(xv, _mm256_cvtps_pd(_mm_loadu_ps(c + j * dim + i)));

			acc[j] = _mm256_add_pd(acc[j], _mm256_mul_pd(d, d));
		}
	}
	for (int j = 0; j < 4; j++) {
		double s[4];

		_mm256_storeu_pd(s, acc[j]);
		for (size_t t = i; t < dim; t++) {
			double d = (double)x[t] - (double)c[j * dim + t];

			s[0] += d * d;
		}
		out[j] = (s[0] + s[1]) + (s[2] + s[3]);
	}
}

void dm_oracle_l2_exact_many(const float *x, const float *c, size_t nc, size_t dim,
			     double *out)
{
	size_t j = 0;

	if (__builtin_cpu_supports("avx2"))
		for (; j + 4 <= nc; j += 4)
			l2_exact4_avx2(x, c + j * dim, dim, out + j);
	for (; j < nc; j++)
		out[j] = dm_oracle_l2_exact(x, c + j * dim, dim);
}

/* Exact squared norm (same fixed order). */
static double norm2_exact(const float *a, size_t dim)
{
	double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	size_t i = 0;

	for (; i + 4 <= dim; i += 4) {
		s0 += (double)a[i] * a[i];
		s1 += (double)a[i + 1] * a[i + 1];
		s2 += (double)a[i + 2] * a[i + 2];
		s3 += (double)a[i + 3] * a[i + 3];
	}
	for (; i < dim; i++)
		s0 += (double)a[i] * a[i];
	return (s0 + s1) + (s2 + s3);
}

/* ---- shared context -------------------------------------------------------------------- */

#define ASSIGN_BLOCK 512   /* sample rows per dm_distance_batch call */

struct km {
	const float *x;     /* n x dim */
	size_t n, dim;
	double *xnorm;      /* |x_i| (not squared), for the error margin */
	float *xnorm2f;     /* |x_i|^2 as float, handed to BLAS */
	double err_coef;    /* (gamma_dim + 4u) * 1.01 */
	float *dbuf;        /* ASSIGN_BLOCK x kmax BLAS distances */
	size_t dbuf_k;
	uint64_t rechecks;
	void (*pace)(void *arg);   /* dm_oracle_params.pace */
	void *pace_arg;
};

/* Between blocks of work: the caller's pace (it may sleep). */
static void km_pace(const struct km *m)
{
	if (m->pace)
		m->pace(m->pace_arg);
}

static int km_init(struct km *m, const float *x, size_t n, size_t dim)
{
	const double u = 0x1.0p-24;
	double nu = (double)dim * u;

	memset(m, 0, sizeof(*m));
	m->x = x;
	m->n = n;
	m->dim = dim;
	m->xnorm = malloc(n * sizeof(double));
	m->xnorm2f = malloc(n * sizeof(float));
	if (!m->xnorm || !m->xnorm2f)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		double n2 = norm2_exact(x + i * dim, dim);
		m->xnorm[i] = sqrt(n2);
		m->xnorm2f[i] = (float)n2;
	}
	m->err_coef = (nu / (1.0 - nu) + 4.0 * u) * 1.01;
	return 0;
}

static void km_fini(struct km *m)
{
	free(m->xnorm);
	free(m->xnorm2f);
	free(m->dbuf);
}

/* Make dbuf hold ASSIGN_BLOCK x k floats. */
static int km_dbuf(struct km *m, size_t k)
{
	if (m->dbuf_k >= k)
		return 0;
	float *b = realloc(m->dbuf, (size_t)ASSIGN_BLOCK * k * sizeof(float));
	if (!b)
		return -ENOMEM;
	m->dbuf = b;
	m->dbuf_k = k;
	return 0;
}

/* Nearest centroid of every sample point under exact arithmetic (ties: lower index), using
 * BLAS distances to skip the centroids that cannot win. assign[i] receives the index;
 * returns the number of points whose assignment changed. */
static long km_assign(struct km *m, const float *cent, size_t k, uint32_t *assign)
{
	size_t dim = m->dim;
	double cmax = 0;
	long changed = 0;

	for (size_t j = 0; j < k; j++)
		cmax = fmax(cmax, sqrt(norm2_exact(cent + j * dim, dim)));
	for (size_t i0 = 0; i0 < m->n; i0 += ASSIGN_BLOCK) {
		size_t nb = DM_MIN((size_t)ASSIGN_BLOCK, m->n - i0);

		km_pace(m);
		dm_distance_batch(DM_METRIC_L2, m->x + i0 * dim, nb, cent, k, dim, NULL, m->dbuf);
		for (size_t r = 0; r < nb; r++) {
			size_t i = i0 + r;
			const float *d = m->dbuf + r * k;
			float dmin = d[0];
			uint32_t best = 0, ncand = 0;
			double s = m->xnorm[i] + cmax;
			double margin = 4.0 * m->err_coef * s * s;

			for (size_t j = 1; j < k; j++)
				if (d[j] < dmin)
					dmin = d[j];
			for (size_t j = 0; j < k; j++)
				if ((double)d[j] <= (double)dmin + margin) {
					ncand++;
					best = (uint32_t)j;
				}
			if (ncand > 1) {
				double be = INFINITY;
				m->rechecks++;
				for (size_t j = 0; j < k; j++) {
					if ((double)d[j] > (double)dmin + margin)
						continue;
					double e = dm_oracle_l2_exact(m->x + i * dim, cent + j * dim, dim);
					if (e < be) {
						be = e;
						best = (uint32_t)j;
					}
				}
			}
			if (assign[i] != best)
				changed++;
			assign[i] = best;
		}
	}
	return changed;
}

/* k-means++ seeding: first centre uniform, the others drawn with probability proportional to
 * the exact squared distance to the nearest centre chosen so far. BLAS distances (new centre
 * vs all points) only skip points whose minimum cannot change. */
static int km_plusplus(struct km *m, struct dm_rng *rng, size_t k, float *cent)
{
	size_t n = m->n, dim = m->dim;
	double *mind = malloc(n * sizeof(double));
	float *dnew = malloc(n * sizeof(float));
	int ret = 0;

	if (!mind || !dnew) {
		ret = -ENOMEM;
		goto out_free;
	}
	size_t c0 = (size_t)(dm_rng_next(rng) % n);
	memcpy(cent, m->x + c0 * dim, dim * sizeof(float));
	for (size_t i = 0; i < n; i++)
		mind[i] = dm_oracle_l2_exact(m->x + i * dim, cent, dim);
	for (size_t j = 1; j < k; j++) {
		double total = 0, acc = 0;
		size_t pick = n;

		km_pace(m);

		for (size_t i = 0; i < n; i++)
			total += mind[i];
		if (total > 0) {
			double r = rng_u01(rng) * total;
			for (size_t i = 0; i < n; i++) {
				if (mind[i] <= 0)
					continue;
				acc += mind[i];
				pick = i;
				if (acc > r)
					break;
			}
		} else {
			pick = (size_t)(dm_rng_next(rng) % n); /* all points coincide with centres */
		}
		float *c = cent + j * dim;
		memcpy(c, m->x + pick * dim, dim * sizeof(float));
		double cn = sqrt(norm2_exact(c, dim));
		dm_distance_batch(DM_METRIC_L2, c, 1, m->x, n, dim, m->xnorm2f, dnew);
		for (size_t i = 0; i < n; i++) {
			double s = m->xnorm[i] + cn;
			if ((double)dnew[i] > mind[i] + 2.0 * m->err_coef * s * s)
				continue; /* cannot be below the current minimum */
			double e = dm_oracle_l2_exact(m->x + i * dim, c, dim);
			if (e < mind[i])
				mind[i] = e;
		}
	}
out_free:
	free(mind);
	free(dnew);
	return ret;
}

/* Centroids = means of their points (double, point order); an empty cluster takes the point
 * farthest from its centroid (exact, ties to the lower index). */
static int km_update(struct km *m, float *cent, size_t k, uint32_t *assign)
{
	size_t n = m->n, dim = m->dim;
	double *sum = calloc(k * dim, sizeof(double));
	uint64_t *cnt = calloc(k, sizeof(uint64_t));
	int ret = 0;

	if (!sum || !cnt) {
		ret = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0; i < n; i++) {
		const float *xi = m->x + i * dim;
		double *s = sum + (size_t)assign[i] * dim;
		cnt[assign[i]]++;
		for (size_t d = 0; d < dim; d++)
			s[d] += xi[d];
	}
	for (size_t j = 0; j < k; j++) {
		if (!cnt[j])
			continue;
		for (size_t d = 0; d < dim; d++)
			cent[j * dim + d] = (float)(sum[j * dim + d] / (double)cnt[j]);
	}
	for (size_t j = 0; j < k; j++) {
		if (cnt[j])
			continue;
		/* reseed: the worst-served point; mark it so the next empty cluster picks another */
		double worst = -1;
		size_t wi = 0;
		for (size_t i = 0; i < n; i++) {
			if (assign[i] == UINT32_MAX)
				continue;
			double e = dm_oracle_l2_exact(m->x + i * dim, cent + (size_t)assign[i] * dim,
						      dim);
			if (e > worst) {
				worst = e;
				wi = i;
			}
		}
		memcpy(cent + j * dim, m->x + wi * dim, dim * sizeof(float));
		cnt[j] = 1;
		assign[wi] = UINT32_MAX; /* replaced by the next assignment step */
	}
out_free:
	free(sum);
	free(cnt);
	return ret;
}

/* Plain Lloyd from the given centres until no assignment changes or max_iter. On return
 * assign[] is the nearest-centre assignment for cent[] exactly. Returns iterations or -errno. */
static int km_lloyd(struct km *m, float *cent, size_t k, uint32_t *assign, uint32_t max_iter)
{
	uint32_t it;
	int ret = km_dbuf(m, k);

	if (ret)
		return ret;
	for (size_t i = 0; i < m->n; i++)
		assign[i] = UINT32_MAX;
	for (it = 0; it < max_iter; it++) {
		long changed = km_assign(m, cent, k, assign);
		if (changed == 0)
			return (int)it;
		ret = km_update(m, cent, k, assign);
		if (ret)
			return ret;
	}
	km_assign(m, cent, k, assign);
	return (int)it;
}

/* ---- capacity-constrained assignment ------------------------------------------------- */

static int dbl_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* One (point, centroid) pair of the constrained assignment: its exact distance and
 * t = i k + j. Pairs are taken in increasing (d, t): distance, ties in (i, j) order. */
struct km_pair {
	double d;
	uint64_t t;
};

static bool pair_less(const struct km_pair *a, const struct km_pair *b)
{
	return a->d < b->d || (a->d == b->d && a->t < b->t);
}

static void heap_down(struct km_pair *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, s = i;

		if (l < n && pair_less(&h[l], &h[s]))
			s = l;
		if (l + 1 < n && pair_less(&h[l + 1], &h[s]))
			s = l + 1;
		if (s == i)
			return;
		struct km_pair tmp = h[i];
		h[i] = h[s];
		h[s] = tmp;
		i = s;
	}
}

/* One centroid choice of a point: exact distance and centroid, ordered by (d, j). */
struct km_choice {
	double d;
	uint32_t j;
};

static int choice_cmp(const void *a, const void *b)
{
	const struct km_choice *x = a, *y = b;

	if (x->d != y->d)
		return x->d < y->d ? -1 : 1;
	return (x->j > y->j) - (x->j < y->j);
}

/* The capacity-constrained assignment: all (point, centroid) pairs in increasing exact
 * distance (ties in (i, j) order), each point to the first centroid in that order that still
 * has room (capacity cap). Computed as a merge of the points' own lists, which gives the
 * same order as sorting all n k pairs: a heap holds each unassigned point's next pair; a
 * point's first pair is its exact nearest centroid (km_assign, BLAS-filtered), and only a
 * point turned away by a full centroid gets its whole list (k exact distances, sorted).
 * With a cap that binds for few points this costs about one Lloyd step instead of n k exact
 * distances and their radix sort: a VHash fit on 6161 SPACEV-shaped x 100 took 0.11 s of
 * CPU instead of 0.36 (k = 96) and 0.39 instead of 2.2 (k = 256), with byte-identical
 * results (test_oracle constrained_golden_crc). na[] receives the assignment (UINT32_MAX: no room anywhere, which cap >=
 * ceil(n/k) rules out). 0 or -ENOMEM. */
static int km_cassign(struct km *m, const float *cent, size_t k, uint64_t cap,
		      const uint32_t *prev, uint32_t *na, uint64_t *fill)
{
	size_t n = m->n, dim = m->dim, hn = n, nl = 0, lcap = 0;
	struct km_pair *h = malloc(n * sizeof(*h));
	uint32_t *lst = malloc(n * sizeof(uint32_t));   /* point -> its list (UINT32_MAX: none) */
	uint32_t *pos = malloc(n * sizeof(uint32_t));   /* point -> next index in its list */
	struct km_choice *pool = NULL;                   /* the lists, k choices each */
	int ret = 0;

	if (!h || !lst || !pos) {
		ret = -ENOMEM;
		goto out_free;
	}
	memcpy(na, prev, n * sizeof(uint32_t));
	km_assign(m, cent, k, na);
	for (size_t i = 0; i < n; i++) {
		if (i % 1024 == 0)
			km_pace(m);
		h[i].d = dm_oracle_l2_exact(m->x + i * dim, cent + (size_t)na[i] * dim, dim);
		h[i].t = (uint64_t)i * k + na[i];
		lst[i] = UINT32_MAX;
		na[i] = UINT32_MAX;
	}
	for (size_t i = n / 2; i-- > 0;)
		heap_down(h, hn, i);
	memset(fill, 0, k * sizeof(uint64_t));
	while (hn) {
		struct km_pair top = h[0];
		size_t i = top.t / k, j = top.t % k;

		if (fill[j] < cap) {
			na[i] = (uint32_t)j;
			fill[j]++;
			h[0] = h[--hn];
			heap_down(h, hn, 0);
			continue;
		}
		if (lst[i] == UINT32_MAX) {
			/* turned away from its nearest: its whole list, nearest first */
			if (nl == lcap) {
				size_t nc = lcap ? 2 * lcap : 16;
				struct km_choice *np = realloc(pool, nc * k * sizeof(*np));

				if (!np) {
					ret = -ENOMEM;
					goto out_free;
				}
				pool = np;
				lcap = nc;
			}
			km_pace(m);
			struct km_choice *c = pool + nl * k;

			for (size_t jj = 0; jj < k; jj++) {
				c[jj].d = dm_oracle_l2_exact(m->x + i * dim, cent + jj * dim, dim);
				c[jj].j = (uint32_t)jj;
			}
			qsort(c, k, sizeof(*c), choice_cmp);
			lst[i] = (uint32_t)nl++;
			pos[i] = 1;   /* c[0] is (top.d, j): the pair just turned away */
		}
		if (pos[i] == k) {   /* no room anywhere (cap < n/k) */
			h[0] = h[--hn];
			heap_down(h, hn, 0);
			continue;
		}
		const struct km_choice *c = pool + (size_t)lst[i] * k + pos[i]++;

		h[0].d = c->d;
		h[0].t = (uint64_t)i * k + c->j;
		heap_down(h, hn, 0);
	}
out_free:
	free(h);
	free(lst);
	free(pos);
	free(pool);
	return ret;
}

/* Lloyd with a capacity-constrained assignment step, starting from cent[]. */
static int km_constrained(struct km *m, float *cent, size_t k, uint32_t *assign,
			  uint64_t cap, uint32_t max_iter)
{
	size_t n = m->n;
	uint32_t *na = malloc(n * sizeof(uint32_t));
	uint64_t *fill = malloc(k * sizeof(uint64_t));
	int ret = km_dbuf(m, k);
	uint32_t it;

	if (!na || !fill) {
		ret = -ENOMEM;
		goto out_free;
	}
	if (ret)
		goto out_free;
	for (it = 0; it < max_iter; it++) {
		ret = km_cassign(m, cent, k, cap, assign, na, fill);
		if (ret)
			goto out_free;
		long changed = 0;
		for (size_t i = 0; i < n; i++) {
			changed += na[i] != assign[i];
			assign[i] = na[i];
		}
		if (changed == 0 && it > 0)
			break;
		ret = km_update(m, cent, k, assign);
		if (ret)
			goto out_free;
	}
	ret = (int)it;
out_free:
	free(na);
	free(fill);
	return ret;
}

/* Balancing biases: the constrained assignment is balanced, but the predictor sends a query
 * to its nearest centroid, and the nearest-centroid cells of the constrained centroids are
 * not. Find additive biases b_j (a power diagram) so that argmin_j |x - c_j|^2 + b_j is
 * balanced on the sample: while some cluster holds more than cap points, raise the bias of
 * the fullest one just enough to push its excess (the points with the smallest margin to
 * their second choice) out. Biases only grow and only for full clusters (an auction), so
 * this terminates; a round limit bounds it anyway. Exact D (n x k), deterministic.
 * bias[] receives the biases; assign[] the assignment under them. */
static int km_bias(struct km *m, const float *cent, size_t k, uint64_t cap, float *bias,
		   uint32_t *assign)
{
	size_t n = m->n, dim = m->dim;
	double *D = malloc(n * k * sizeof(double)), *b = calloc(k, sizeof(double));
	double *mg = malloc(n * sizeof(double));
	uint64_t *sz = malloc(k * sizeof(uint64_t));
	int ret = 0;

	if (!D || !b || !mg || !sz) {
		ret = -ENOMEM;
		goto out_free;
	}
	for (size_t i = 0; i < n; i++)
		dm_oracle_l2_exact_many(m->x + i * dim, cent, k, dim, D + i * k);
	/* bid increment (auction epsilon): without it two full clusters can pass one point back
	 * and forth with ever tinier raises; 1% of the mean distance to the nearest centroid */
	double scale = 0;
	for (size_t i = 0; i < n; i++) {
		double mn = D[i * k];
		for (size_t j = 1; j < k; j++)
			mn = fmin(mn, D[i * k + j]);
		scale += mn;
	}
	double bid_eps = 0.01 * scale / (double)n;
	uint32_t round, max_rounds = 2000 + 100 * (uint32_t)k;
	/* every point sits on a centroid (n == k, duplicates): distances cannot separate them,
	 * biases stay 0 */
	if (scale == 0)
		max_rounds = 0;
	for (round = 0; round < max_rounds; round++) {
		km_pace(m);
		memset(sz, 0, k * sizeof(uint64_t));
		for (size_t i = 0; i < n; i++) {
			size_t bj = 0;
			for (size_t j = 1; j < k; j++)
				if (D[i * k + j] + b[j] < D[i * k + bj] + b[bj])
					bj = j;
			assign[i] = (uint32_t)bj;
			sz[bj]++;
		}
		size_t full = 0;
		for (size_t j = 1; j < k; j++)
			if (sz[j] > sz[full])
				full = j;
		if (sz[full] <= cap) {
			dm_debug("oracle: balancing biases settled after %u rounds", round);
			break;
		}
		/* margins of the fullest cluster's points to their best other choice */
		size_t cnt = 0;
		for (size_t i = 0; i < n; i++) {
			if (assign[i] != full)
				continue;
			double other = INFINITY;
			for (size_t j = 0; j < k; j++)
				if (j != full && D[i * k + j] + b[j] < other)
					other = D[i * k + j] + b[j];
			mg[cnt++] = other - (D[i * k + full] + b[full]);
		}
		qsort(mg, cnt, sizeof(double), dbl_cmp);
		double delta = mg[sz[full] - cap - 1];
		/* strictly past the margin so the point leaves; biases stay float-representable
		 * (the predictor stores floats), so this loop's final assignment is the one the
		 * stored biases give */
		double target = b[full] + delta + bid_eps;
		float f = (float)target;
		while ((double)f <= target)
			f = nextafterf(f, INFINITY);
		b[full] = f;
	}
	if (max_rounds && round == max_rounds)
		dm_warn("oracle: balancing biases did not settle in %u rounds", max_rounds);
	/* the assignment under the final biases (differs from the loop's only when the round
	 * limit stopped it) */
	for (size_t i = 0; i < n; i++) {
		size_t bj = 0;
		for (size_t j = 1; j < k; j++)
			if (D[i * k + j] + b[j] < D[i * k + bj] + b[bj])
				bj = j;
		assign[i] = (uint32_t)bj;
	}
	for (size_t j = 0; j < k; j++)
		bias[j] = (float)b[j];
out_free:
	free(D);
	free(b);
	free(mg);
	free(sz);
	return ret;
}

/* ---- greedy merging of fine clusters into k groups -------------------------------------- */

/* Merge nf clusters (centroids cent, sizes sz) into k groups: repeatedly the pair with the
 * smallest Ward cost among those whose union fits cap, else the pair with the smallest
 * union. (Preferring unions within n/k first was measured and balanced worse.) Greedy: no
 * guarantee that a balanced grouping is found when one exists. group[f] receives the group of fine cluster f, groups numbered by their
 * lowest fine index. Deterministic: exact double arithmetic, ties to the lowest (i, j). */
static int merge_groups(const float *cent, const uint64_t *sz, size_t nf, size_t dim, size_t k,
			uint64_t cap, uint32_t *group)
{
	double *c = malloc(nf * dim * sizeof(double));
	double *w = malloc(nf * nf * sizeof(double));   /* squared centroid distance */
	uint64_t *s = malloc(nf * sizeof(uint64_t));
	uint32_t *rep = malloc(nf * sizeof(uint32_t));  /* fine -> surviving cluster */
	bool *alive = malloc(nf * sizeof(bool));
	int ret = 0;

	if (!c || !w || !s || !rep || !alive) {
		ret = -ENOMEM;
		goto out_free;
	}
	for (size_t f = 0; f < nf * dim; f++)
		c[f] = cent[f];
	for (size_t f = 0; f < nf; f++) {
		s[f] = sz[f];
		rep[f] = (uint32_t)f;
		alive[f] = true;
	}
	for (size_t i = 0; i < nf; i++)
		for (size_t j = i + 1; j < nf; j++)
			w[i * nf + j] = dm_oracle_l2_exact(cent + i * dim, cent + j * dim, dim);
	for (size_t left = nf; left > k; left--) {
		size_t bi = 0, bj = 0;
		bool bfit = false, found = false;
		double bcost = INFINITY;
		uint64_t bsize = UINT64_MAX;

		for (size_t i = 0; i < nf; i++) {
			if (!alive[i])
				continue;
			for (size_t j = i + 1; j < nf; j++) {
				if (!alive[j])
					continue;
				uint64_t u = s[i] + s[j];
				double cost = u ? (double)s[i] * (double)s[j] / (double)u * w[i * nf + j]
						: 0.0;
				bool fit = u <= cap;
				bool better;
				if (!found || fit != bfit)
					better = !found || fit;
				else if (fit)
					better = cost < bcost;
				else
					better = u < bsize || (u == bsize && cost < bcost);
				if (better) {
					found = true;
					bi = i;
					bj = j;
					bfit = fit;
					bcost = cost;
					bsize = u;
				}
			}
		}
		/* merge bj into bi: weighted mean */
		uint64_t u = s[bi] + s[bj];
		for (size_t d = 0; d < dim; d++)
			c[bi * dim + d] = u ? ((double)s[bi] * c[bi * dim + d] +
					       (double)s[bj] * c[bj * dim + d]) / (double)u
					    : c[bi * dim + d];
		s[bi] = u;
		alive[bj] = false;
		for (size_t f = 0; f < nf; f++)
			if (rep[f] == bj)
				rep[f] = (uint32_t)bi;
		for (size_t j = 0; j < nf; j++) {
			if (!alive[j] || j == bi)
				continue;
			double acc0 = 0, acc1 = 0;
			size_t d = 0;
			for (; d + 2 <= dim; d += 2) {
				double e0 = c[bi * dim + d] - c[j * dim + d];
				double e1 = c[bi * dim + d + 1] - c[j * dim + d + 1];
				acc0 += e0 * e0;
				acc1 += e1 * e1;
			}
			for (; d < dim; d++) {
				double e = c[bi * dim + d] - c[j * dim + d];
				acc0 += e * e;
			}
			size_t a = DM_MIN(bi, j), b = DM_MAX(bi, j);
			w[a * nf + b] = acc0 + acc1;
		}
	}
	/* number groups in order of their lowest fine index; w (nf*nf >= nf) is free now */
	{
		uint32_t *map = (uint32_t *)w, next = 0;
		for (size_t f = 0; f < nf; f++)
			map[f] = UINT32_MAX;
		for (size_t f = 0; f < nf; f++) {
			if (map[rep[f]] == UINT32_MAX)
				map[rep[f]] = next++;
			group[f] = map[rep[f]];
		}
	}
out_free:
	free(c);
	free(w);
	free(s);
	free(rep);
	free(alive);
	return ret;
}

/* ---- public ------------------------------------------------------------------------------ */

void dm_oracle_params_default(struct dm_oracle_params *p, uint32_t k)
{
	memset(p, 0, sizeof(*p));
	p->k = k;
	p->algo = DM_ORACLE_CONSTRAINED;
	p->seed = 0x5348494e45ull;
	p->balance_eps = 0.10;
	p->max_iter = 50;
	p->max_doublings = 4;
	p->ring_knn = 8;
}

int dm_oracle_pick_level(const uint64_t *counts, uint32_t nlevels, uint64_t min_nodes)
{
	if (!counts || nlevels == 0)
		return -EINVAL;
	for (uint32_t l = nlevels; l-- > 0;)
		if (counts[l] >= min_nodes)
			return (int)l;
	return 0;
}

int dm_oracle_ring_build(struct dm_oracle *o, uint32_t knn); /* ring.c */

/* Fill the model from fine centroids, their groups and the sample. have_assign: assign[]
 * already holds the predictor's assignment (CONSTRAINED, biases included); otherwise it is
 * computed here as the nearest fine centroid. */
static int finish_model(struct dm_oracle *o, struct km *m, uint32_t *assign, bool have_assign)
{
	size_t n = m->n, dim = m->dim;
	double *sum = calloc((size_t)o->k * dim, sizeof(double));
	int ret = 0;

	if (!sum)
		return -ENOMEM;
	if (!have_assign) {
		ret = km_dbuf(m, o->nfine);
		if (ret)
			goto out_free;
		for (size_t i = 0; i < n; i++)
			assign[i] = UINT32_MAX;
		km_assign(m, o->fine, o->nfine, assign);
	}
	for (size_t i = 0; i < n; i++) {
		uint32_t g = o->fine_group[assign[i]];
		o->sizes[g]++;
		for (size_t d = 0; d < dim; d++)
			sum[(size_t)g * dim + d] += m->x[i * dim + d];
	}
	for (size_t g = 0; g < o->k; g++)
		for (size_t d = 0; d < dim; d++)
			o->centroids[g * dim + d] = o->sizes[g] ?
				(float)(sum[g * dim + d] / (double)o->sizes[g]) : 0.0f;
	/* a group that got no sample point keeps the mean of its fine centroids */
	for (size_t g = 0; g < o->k; g++) {
		if (o->sizes[g])
			continue;
		uint32_t cnt = 0;
		for (size_t f = 0; f < o->nfine; f++) {
			if (o->fine_group[f] != g)
				continue;
			cnt++;
			for (size_t d = 0; d < dim; d++)
				sum[g * dim + d] += o->fine[f * dim + d];
		}
		for (size_t d = 0; d < dim; d++)
			o->centroids[g * dim + d] = cnt ? (float)(sum[g * dim + d] / cnt) : 0.0f;
	}
	o->sse = 0;
	for (size_t i = 0; i < n; i++)
		o->sse += dm_oracle_l2_exact(m->x + i * dim,
					     o->centroids + (size_t)o->fine_group[assign[i]] * dim, dim);
out_free:
	free(sum);
	return ret;
}

static uint64_t max_u64(const uint64_t *a, size_t n)
{
	uint64_t mx = 0;
	for (size_t i = 0; i < n; i++)
		mx = DM_MAX(mx, a[i]);
	return mx;
}

/* SHINE's doubling: returns 0 and fills o->fine / fine_group / nfine. */
static int build_doubling(struct dm_oracle *o, struct km *m, const struct dm_oracle_params *p,
			  uint32_t *assign)
{
	size_t n = m->n, dim = m->dim, k = p->k;
	uint64_t cap = (uint64_t)floor((1.0 + p->balance_eps) * (double)n / (double)k);
	uint64_t best_max = UINT64_MAX;
	float *cent = NULL;
	uint32_t *grp = NULL;
	uint64_t *sz = NULL;
	int ret = 0;

	if (cap < (n + k - 1) / k)
		cap = (n + k - 1) / k;
	for (uint32_t dbl = 0; dbl <= p->max_doublings; dbl++) {
		/* SHINE's loop; each run is seeded from (seed, k') so runs are independent */
		size_t kf = k << dbl;
		struct dm_rng rng;

		if (kf > n)
			break;
		free(cent);
		free(grp);
		free(sz);
		cent = malloc(kf * dim * sizeof(float));
		grp = malloc(kf * sizeof(uint32_t));
		sz = calloc(kf, sizeof(uint64_t));
		if (!cent || !grp || !sz) {
			ret = -ENOMEM;
			goto out_free;
		}
		dm_rng_seed(&rng, p->seed ^ ((uint64_t)kf * DM_GOLDEN64));
		ret = km_plusplus(m, &rng, kf, cent);
		if (ret)
			goto out_free;
		ret = km_lloyd(m, cent, kf, assign, p->max_iter);
		if (ret < 0)
			goto out_free;
		o->iterations = (uint32_t)ret;
		ret = 0;
		for (size_t i = 0; i < n; i++)
			sz[assign[i]]++;
		ret = merge_groups(cent, sz, kf, dim, k, cap, grp);
		if (ret)
			goto out_free;
		uint64_t *gs = calloc(k, sizeof(uint64_t));
		if (!gs) {
			ret = -ENOMEM;
			goto out_free;
		}
		for (size_t f = 0; f < kf; f++)
			gs[grp[f]] += sz[f];
		uint64_t mx = max_u64(gs, k);
		free(gs);
		dm_debug("oracle: doubling k'=%zu largest group %llu (cap %llu)", kf,
			 (unsigned long long)mx, (unsigned long long)cap);
		if (mx < best_max) {
			/* keep this one */
			best_max = mx;
			free(o->fine);
			free(o->fine_group);
			o->fine = cent;
			o->fine_group = grp;
			o->nfine = (uint32_t)kf;
			cent = NULL;
			grp = NULL;
		}
		if (mx <= cap)
			break;
	}
	if (!ret) {
		o->bias = calloc(o->nfine, sizeof(float));
		if (!o->bias)
			ret = -ENOMEM;
	}
out_free:
	free(cent);
	free(grp);
	free(sz);
	return ret;
}

/* Capacity-constrained k-means: fills o->fine (k centroids, identity groups). */
static int build_constrained(struct dm_oracle *o, struct km *m,
			     const struct dm_oracle_params *p, uint32_t *assign)
{
	size_t n = m->n, dim = m->dim, k = p->k;
	uint64_t cap = (uint64_t)ceil((1.0 + p->balance_eps) * (double)n / (double)k);
	struct dm_rng rng;
	int ret;

	if (cap < (n + k - 1) / k)
		cap = (n + k - 1) / k;
	o->fine = malloc(k * dim * sizeof(float));
	o->fine_group = malloc(k * sizeof(uint32_t));
	if (!o->fine || !o->fine_group)
		return -ENOMEM;
	o->nfine = (uint32_t)k;
	for (size_t j = 0; j < k; j++)
		o->fine_group[j] = (uint32_t)j;
	if (p->init) {
		/* warm: the given centroids are already near a constrained optimum (the previous
		 * epoch's, on a sample that moved little); unconstrained Lloyd would first pull
		 * them away from it */
		memcpy(o->fine, p->init, k * dim * sizeof(float));
		for (size_t i = 0; i < n; i++)
			assign[i] = UINT32_MAX;
	} else {
		dm_rng_seed(&rng, p->seed ^ ((uint64_t)k * DM_GOLDEN64));
		ret = km_plusplus(m, &rng, k, o->fine);
		if (ret)
			return ret;
		/* a few unconstrained iterations (cheap, BLAS-filtered) to get near a local
		 * optimum */
		ret = km_lloyd(m, o->fine, k, assign, DM_MIN(p->max_iter, 10u));
		if (ret < 0)
			return ret;
	}
	ret = km_constrained(m, o->fine, k, assign, cap, p->max_iter);
	if (ret < 0)
		return ret;
	o->iterations = (uint32_t)ret;
	o->bias = malloc(k * sizeof(float));
	if (!o->bias)
		return -ENOMEM;
	return km_bias(m, o->fine, k, cap, o->bias, assign);
}

/* Finite and small enough that squared norms cannot overflow float sgemm. */
static bool values_ok(const float *v, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(v[i]) || fabsf(v[i]) > 1e15f) {
			dm_err("oracle: %s value %zu is not finite or too large", what, i);
			return false;
		}
	}
	return true;
}

struct dm_oracle *dm_oracle_build(const float *sample, size_t n, size_t dim,
				  const struct dm_oracle_params *p)
{
	struct dm_oracle *o;
	struct km m;
	uint32_t *assign = NULL;
	int ret;

	if (!sample || !p || p->k == 0 || n < p->k || dim == 0 || dim > (1u << 20) ||
	    (uint64_t)n * p->k > UINT32_MAX || !(p->balance_eps >= 0) || p->max_iter == 0 ||
	    (p->algo != DM_ORACLE_CONSTRAINED && p->algo != DM_ORACLE_DOUBLING) ||
	    p->max_doublings > 16) {
		errno = EINVAL;
		return NULL;
	}
	if (!values_ok(sample, n * dim, "sample") ||
	    (p->init && (p->algo != DM_ORACLE_CONSTRAINED ||
			 !values_ok(p->init, (size_t)p->k * dim, "starting centroid")))) {
		errno = EINVAL;
		return NULL;
	}
	o = calloc(1, sizeof(*o));
	if (!o) {
		errno = ENOMEM;
		return NULL;
	}
	o->k = p->k;
	o->dim = (uint32_t)dim;
	o->n = n;
	o->algo = p->algo;
	ret = km_init(&m, sample, n, dim);
	if (ret)
		goto err_fini;
	m.pace = p->pace;
	m.pace_arg = p->pace_arg;
	assign = malloc(n * sizeof(uint32_t));
	o->centroids = malloc((size_t)p->k * dim * sizeof(float));
	o->sizes = calloc(p->k, sizeof(uint64_t));
	if (!assign || !o->centroids || !o->sizes) {
		ret = -ENOMEM;
		goto err_fini;
	}
	ret = p->algo == DM_ORACLE_DOUBLING ? build_doubling(o, &m, p, assign)
					    : build_constrained(o, &m, p, assign);
	if (ret)
		goto err_fini;
	ret = finish_model(o, &m, assign, p->algo == DM_ORACLE_CONSTRAINED);
	if (ret)
		goto err_fini;
	o->exact_rechecks = (uint32_t)DM_MIN(m.rechecks, (uint64_t)UINT32_MAX);
	ret = dm_oracle_ring_build(o, p->ring_knn);
	if (ret)
		goto err_fini;
	free(assign);
	km_fini(&m);
	return o;

err_fini:
	free(assign);
	km_fini(&m);
	dm_oracle_free(o);
	errno = -ret;
	return NULL;
}

void dm_oracle_free(struct dm_oracle *o)
{
	if (!o)
		return;
	free(o->fine);
	free(o->fine_group);
	free(o->bias);
	free(o->centroids);
	free(o->sizes);
	free(o->ring);
	free(o->ring_pos);
	free(o);
}
