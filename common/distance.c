/* distance.c: float32 distance kernels (squared L2, inner product, cosine) in scalar,
 * AVX2+FMA and AVX-512F versions, one of which is chosen once at start-up from the CPU's
 * features (DMANN_ISA can force a lower one), and batched distances through OpenBLAS sgemm.
 *
 * The project builds with -march=x86-64-v2, so the wider kernels are compiled with
 * function-level target attributes and only ever called after a CPU check. */
#include "distance.h"

#include <cblas.h>
#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------
 * Scalar kernels. Eight independent accumulators break the add dependency chain (and let
 * the compiler use SSE registers for them) without changing the result's error bound much.
 */

/* Squared L2 distance, portable. */
static float l2sq_scalar(const float *a, const float *b, size_t dim)
{
	float s[8] = { 0 };
	size_t i = 0;

	for (; i + 8 <= dim; i += 8)
		for (int j = 0; j < 8; j++) {
			float d = a[i + j] - b[i + j];
			s[j] += d * d;
		}
	for (int j = 0; i < dim; i++, j++) {
		float d = a[i] - b[i];
		s[j] += d * d;
	}
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* Dot product, portable. */
static float dot_scalar(const float *a, const float *b, size_t dim)
{
	float s[8] = { 0 };
	size_t i = 0;

	for (; i + 8 <= dim; i += 8)
		for (int j = 0; j < 8; j++)
			s[j] += a[i + j] * b[i + j];
	for (int j = 0; i < dim; i++, j++)
		s[j] += a[i] * b[i];
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* ---------------------------------------------------------------------------------------
 * AVX2 + FMA kernels: four 8-lane accumulators (32 floats per iteration), then one 8-lane
 * step at a time, then a masked load for the last 1..7 elements (masked lanes are not
 * read, so nothing past the end of the vectors is touched).
 */

#define AVX2_TARGET __attribute__((target("avx2,fma")))

/* Mask with the first r (0..8) lanes set. */
static AVX2_TARGET __m256i avx2_tail_mask(size_t r)
{
	static const int32_t m[16] = { -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0 };
	return _mm256_loadu_si256((const __m256i *)(m + 8 - r));
}

/* Horizontal sum of 8 lanes. */
static AVX2_TARGET float avx2_hsum(__m256 v)
{
	__m128 lo = _mm256_castps256_ps128(v);
	__m128 hi = _mm256_extractf128_ps(v, 1);
	lo = _mm_add_ps(lo, hi);
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

/* Squared L2 distance, AVX2+FMA. */
static AVX2_TARGET float l2sq_avx2(const float *a, const float *b, size_t dim)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	__m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
	size_t i = 0;

	for (; i + 32 <= dim; i += 32) {
		__m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
		__m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
		__m256 d2 = _mm256_sub_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16));
		__m256 d3 = _mm256_sub_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24));
		s0 = _mm256_fmadd_ps(d0, d0, s0);
		s1 = _mm256_fmadd_ps(d1, d1, s1);
		s2 = _mm256_fmadd_ps(d2, d2, s2);
		s3 = _mm256_fmadd_ps(d3, d3, s3);
	}
	for (; i + 8 <= dim; i += 8) {
		__m256 d = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
		s0 = _mm256_fmadd_ps(d, d, s0);
	}
	if (i < dim) {
		__m256i m = avx2_tail_mask(dim - i);
		__m256 d = _mm256_sub_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m));
		s1 = _mm256_fmadd_ps(d, d, s1);
	}
	return avx2_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* Dot product, AVX2+FMA. */
static AVX2_TARGET float dot_avx2(const float *a, const float *b, size_t dim)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	__m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
	size_t i = 0;

	for (; i + 32 <= dim; i += 32) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
		s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
		s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
	}
	for (; i + 8 <= dim; i += 8)
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
	if (i < dim) {
		__m256i m = avx2_tail_mask(dim - i);
		s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
	}
	return avx2_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* ---------------------------------------------------------------------------------------
 * AVX-512F kernels: four 16-lane accumulators (64 floats per iteration), 16 at a time,
 * then one masked step for the last 1..15 elements.
 */

#define AVX512_TARGET __attribute__((target("avx512f")))

/* Squared L2 distance, AVX-512F. */
static AVX512_TARGET float l2sq_avx512(const float *a, const float *b, size_t dim)
{
	__m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
	__m512 s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
	size_t i = 0;

	for (; i + 64 <= dim; i += 64) {
		__m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
		__m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16));
		__m512 d2 = _mm512_sub_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32));
		__m512 d3 = _mm512_sub_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48));
		s0 = _mm512_fmadd_ps(d0, d0, s0);
		s1 = _mm512_fmadd_ps(d1, d1, s1);
		s2 = _mm512_fmadd_ps(d2, d2, s2);
		s3 = _mm512_fmadd_ps(d3, d3, s3);
	}
	for (; i + 16 <= dim; i += 16) {
		__m512 d = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
		s0 = _mm512_fmadd_ps(d, d, s0);
	}
	if (i < dim) {
		__mmask16 m = (__mmask16)((1u << (dim - i)) - 1);
		__m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
		s1 = _mm512_fmadd_ps(d, d, s1);
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* Dot product, AVX-512F. */
static AVX512_TARGET float dot_avx512(const float *a, const float *b, size_t dim)
{
	__m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
	__m512 s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
	size_t i = 0;

	for (; i + 64 <= dim; i += 64) {
		s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
		s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
		s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
		s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
	}
	for (; i + 16 <= dim; i += 16)
		s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
	if (i < dim) {
		__mmask16 m = (__mmask16)((1u << (dim - i)) - 1);
		s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* ---------------------------------------------------------------------------------------
 * Metric wrappers per ISA for the hot path (dm_dist_fn_for): one indirect call, no switch.
 */
#define DEFINE_METRIC_WRAPPERS(isa, attr)                                                  \
	static attr float ipdist_##isa(const float *a, const float *b, size_t dim)         \
	{                                                                                   \
		return -dot_##isa(a, b, dim);                                               \
	}                                                                                   \
	static attr float cosdist_##isa(const float *a, const float *b, size_t dim)        \
	{                                                                                   \
		return 1.0f - dot_##isa(a, b, dim);                                         \
	}

DEFINE_METRIC_WRAPPERS(scalar, )
DEFINE_METRIC_WRAPPERS(avx2, AVX2_TARGET)
DEFINE_METRIC_WRAPPERS(avx512, AVX512_TARGET)

struct kernel_set {
	const char *name;
	dm_dist_fn l2sq, dot, ipdist, cosdist;
};

static const struct kernel_set kernel_sets[] = {
	{ "scalar", l2sq_scalar, dot_scalar, ipdist_scalar, cosdist_scalar },
	{ "avx2", l2sq_avx2, dot_avx2, ipdist_avx2, cosdist_avx2 },
	{ "avx512", l2sq_avx512, dot_avx512, ipdist_avx512, cosdist_avx512 },
};

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

/* The active set. Written once by the constructor below (before main, before any thread)
 * and afterwards only by dm_kernel_set_isa, which is for single-threaded tests. */
static const struct kernel_set *ks = &kernel_sets[ISA_SCALAR];

/* Best ISA this CPU (and OS, which libgcc checks through XGETBV) supports. */
static int best_isa(void)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f"))
		return ISA_AVX512;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return ISA_AVX2;
	return ISA_SCALAR;
}

static int isa_from_name(const char *s)
{
	for (size_t i = 0; i < DM_ARRAY_SIZE(kernel_sets); i++)
		if (strcmp(s, kernel_sets[i].name) == 0)
			return (int)i;
	return -1;
}

/* Selects the kernels once at load time: the best ISA, or DMANN_ISA if it names a lower
 * (supported) one. */
__attribute__((constructor)) static void kernel_select(void)
{
	int isa = best_isa();
	const char *env = getenv("DMANN_ISA");

	if (env && *env) {
		int want = isa_from_name(env);
		if (want < 0)
			dm_warn("DMANN_ISA=%s unknown (scalar|avx2|avx512), using %s", env,
				kernel_sets[isa].name);
		else if (want > isa)
			dm_warn("DMANN_ISA=%s not supported by this CPU, using %s", env,
				kernel_sets[isa].name);
		else
			isa = want;
	}
	ks = &kernel_sets[isa];
}

const char *dm_kernel_isa(void)
{
	return ks->name;
}

int dm_kernel_set_isa(const char *isa)
{
	int want = isa ? isa_from_name(isa) : -1;

	if (want < 0)
		return -EINVAL;
	if (want > best_isa())
		return -ENOTSUP;
	ks = &kernel_sets[want];
	return 0;
}

/* ---------------------------------------------------------------------------------------
 * Public single-vector API.
 */

float dm_l2sq(const float *a, const float *b, size_t dim)
{
	return ks->l2sq(a, b, dim);
}

float dm_dot(const float *a, const float *b, size_t dim)
{
	return ks->dot(a, b, dim);
}

float dm_norm(const float *a, size_t dim)
{
	return sqrtf(ks->dot(a, a, dim));
}

/* Cosine distance from a dot product and two squared norms; 1 (orthogonal) when either
 * vector is zero, clamped to [0, 2] against rounding. */
static float cos_from_parts(float dot, float na2, float nb2)
{
	if (!(na2 > 0.0f) || !(nb2 > 0.0f))
		return 1.0f;
	/* double for the product so that large norms cannot overflow float */
	double c = (double)dot / sqrt((double)na2 * (double)nb2);
	float d = (float)(1.0 - c);
	return d < 0.0f ? 0.0f : (d > 2.0f ? 2.0f : d);
}

float dm_distance(enum dm_metric m, const float *a, const float *b, size_t dim)
{
	switch (m) {
	case DM_METRIC_L2:
		return ks->l2sq(a, b, dim);
	case DM_METRIC_IP:
		return -ks->dot(a, b, dim);
	case DM_METRIC_COS:
		return cos_from_parts(ks->dot(a, b, dim), ks->dot(a, a, dim), ks->dot(b, b, dim));
	}
	return NAN;
}

dm_dist_fn dm_dist_fn_for(enum dm_metric m)
{
	switch (m) {
	case DM_METRIC_L2:
		return ks->l2sq;
	case DM_METRIC_IP:
		return ks->ipdist;
	case DM_METRIC_COS:
		return ks->cosdist;
	}
	return NULL;
}

int dm_normalize(float *v, size_t dim)
{
	/* double so that a vector of huge finite values does not overflow to inf */
	double s = 0.0;
	for (size_t i = 0; i < dim; i++)
		s += (double)v[i] * (double)v[i];
	if (!(s > 0.0) || !isfinite(s))
		return -EINVAL;
	double inv = 1.0 / sqrt(s);
	for (size_t i = 0; i < dim; i++)
		v[i] = (float)(v[i] * inv);
	return 0;
}

enum dm_metric dm_metric_from_name(const char *s, bool *ok)
{
	static const struct { const char *name; enum dm_metric m; } names[] = {
		{ "l2", DM_METRIC_L2 }, { "euclidean", DM_METRIC_L2 },
		{ "ip", DM_METRIC_IP }, { "dot", DM_METRIC_IP },
		{ "cos", DM_METRIC_COS }, { "cosine", DM_METRIC_COS }, { "angular", DM_METRIC_COS },
	};
	for (size_t i = 0; s && i < DM_ARRAY_SIZE(names); i++)
		if (strcasecmp(s, names[i].name) == 0) {
			if (ok)
				*ok = true;
			return names[i].m;
		}
	if (ok)
		*ok = false;
	return DM_METRIC_L2;
}

const char *dm_metric_name(enum dm_metric m)
{
	switch (m) {
	case DM_METRIC_L2:
		return "l2";
	case DM_METRIC_IP:
		return "ip";
	case DM_METRIC_COS:
		return "cos";
	}
	return "unknown";
}

/* ---------------------------------------------------------------------------------------
 * Batched distances through sgemm: dot products for a block of queries x a block of base
 * vectors in one call, then the metric from the dots and the (once computed) squared norms.
 * Blocks keep the norms on the stack (no allocation, so the function cannot fail) and
 * every sgemm size within int.
 */

#define BATCH_QB 256   /* queries per block */
#define BATCH_BB 1024  /* base vectors per block */

/* Batched distances for one block; out points at out[q0 * ldo + b0]. */
static void batch_block(enum dm_metric m, const float *q, size_t nq, const float *b, size_t nb,
			size_t dim, const float *bnorm2, float *out, size_t ldo)
{
	float qn[BATCH_QB], bn[BATCH_BB];

	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nb, (int)dim, 1.0f,
		    q, (int)dim, b, (int)dim, 0.0f, out, (int)ldo);
	if (m == DM_METRIC_IP) {
		for (size_t i = 0; i < nq; i++)
			for (size_t j = 0; j < nb; j++)
				out[i * ldo + j] = -out[i * ldo + j];
		return;
	}
	for (size_t i = 0; i < nq; i++)
		qn[i] = ks->dot(q + i * dim, q + i * dim, dim);
	for (size_t j = 0; j < nb; j++)
		bn[j] = bnorm2 ? bnorm2[j] : ks->dot(b + j * dim, b + j * dim, dim);
	for (size_t i = 0; i < nq; i++) {
		float *o = out + i * ldo;
		if (m == DM_METRIC_L2) {
			for (size_t j = 0; j < nb; j++) {
				/* |q|^2 + |b|^2 - 2 q.b can go slightly negative by cancellation */
				float d = qn[i] + bn[j] - 2.0f * o[j];
				o[j] = d > 0.0f ? d : 0.0f;
			}
		} else {
			for (size_t j = 0; j < nb; j++)
				o[j] = cos_from_parts(o[j], qn[i], bn[j]);
		}
	}
}

/* Row-by-row fallback when a dimension exceeds what BLAS's int arguments can carry. */
static void batch_direct(enum dm_metric m, const float *q, size_t nq, const float *b,
			 size_t nb, size_t dim, float *out)
{
	for (size_t i = 0; i < nq; i++)
		for (size_t j = 0; j < nb; j++)
			out[i * nb + j] = dm_distance(m, q + i * dim, b + j * dim, dim);
}

/* OpenBLAS's own: stop the pool's threads (it runs this at fork); a later threaded call
 * starts them again. Not in its headers: weak, so that another BLAS links too. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

int dm_blas_node_threads(void)
{
	if (!getenv("OPENBLAS_NUM_THREADS")) {
		openblas_set_num_threads(1);
		/* The pool started with the process before main, and fewer threads do not
		 * stop its idle workers spinning on sched_yield (a 0.5 s `dmann route refresh`
		 * spent 0.08 s of CPU on it): stop them; one-thread calls never use the pool. */
		if (blas_thread_shutdown_)
			blas_thread_shutdown_();
	}
	return openblas_get_num_threads();
}

void dm_distance_batch(enum dm_metric m, const float *q, size_t nq, const float *b,
		       size_t nb, size_t dim, const float *bnorm2, float *out)
{
	if (nq == 0 || nb == 0)
		return;
	if (dim == 0) {
		/* empty vectors: l2 and ip are 0, cos is 1 (as for any zero vector) */
		for (size_t i = 0; i < nq * nb; i++)
			out[i] = m == DM_METRIC_COS ? 1.0f : 0.0f;
		return;
	}
	if (dim > INT_MAX || nb > INT_MAX) {
		batch_direct(m, q, nq, b, nb, dim, out);
		return;
	}
	for (size_t i0 = 0; i0 < nq; i0 += BATCH_QB) {
		size_t qb = DM_MIN(BATCH_QB, nq - i0);
		for (size_t j0 = 0; j0 < nb; j0 += BATCH_BB) {
			size_t bb = DM_MIN(BATCH_BB, nb - j0);
			batch_block(m, q + i0 * dim, qb, b + j0 * dim, bb, dim,
				    bnorm2 ? bnorm2 + j0 : NULL, out + i0 * nb + j0, nb);
		}
	}
}
