/* sq8.c: the 8-bit scalar quantizer of sq8.h: training, encoding, query preparation and
 * the scoring kernels (scalar, AVX2+FMA, AVX-512F; compiled with function-level target
 * attributes and used only after the distance kernels' CPU check chose that ISA).
 *
 * A prepared query (aux) for l2 is a_i = q_i - lo_i and step_i, so that
 *   score = sum (a_i - step_i c_i)^2;
 * for ip/cos it is w_i = q_i step_i and C = sum q_i lo_i, so that
 *   score = -(C + sum w_i c_i). */
#include "sq8.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int dm_sq8_train(struct dm_sq8 *sq, enum dm_metric m, uint32_t dim, const float *const *vecs,
		 uint32_t n)
{
	memset(sq, 0, sizeof(*sq));
	if (!dim)
		return -EINVAL;
	sq->lo = malloc((size_t)dim * sizeof(float));
	sq->step = malloc((size_t)dim * sizeof(float));
	if (!sq->lo || !sq->step) {
		dm_sq8_fini(sq);
		return -ENOMEM;
	}
	sq->dim = dim;
	sq->l2 = m == DM_METRIC_L2;
	for (uint32_t i = 0; i < dim; i++) {
		float lo = n ? vecs[0][i] : 0.0f, hi = lo;

		for (uint32_t j = 0; j < n; j++) {
			float v = vecs[j][i];

			if (!isfinite(v)) {
				dm_sq8_fini(sq);
				return -EINVAL;
			}
			lo = v < lo ? v : lo;
			hi = v > hi ? v : hi;
		}
		sq->lo[i] = lo;
		/* a zero range still needs a positive step (every code is then 0) */
		sq->step[i] = hi > lo ? (hi - lo) / 255.0f : 1.0f;
	}
	return 0;
}

void dm_sq8_fini(struct dm_sq8 *sq)
{
	free(sq->lo);
	free(sq->step);
	memset(sq, 0, sizeof(*sq));
}

void dm_sq8_encode(const struct dm_sq8 *sq, const float *x, uint8_t *code)
{
	for (uint32_t i = 0; i < sq->dim; i++) {
		float c = rintf((x[i] - sq->lo[i]) / sq->step[i]);

		/* NaN fails both comparisons and ends as 0 */
		code[i] = c >= 255.0f ? 255 : c > 0.0f ? (uint8_t)c : 0;
	}
}

void dm_sq8_decode(const struct dm_sq8 *sq, const uint8_t *code, float *x)
{
	for (uint32_t i = 0; i < sq->dim; i++)
		x[i] = sq->lo[i] + sq->step[i] * (float)code[i];
}

void dm_sq8_query(const struct dm_sq8 *sq, const float *q, float *aux)
{
	uint32_t d = sq->dim;

	if (sq->l2) {
		for (uint32_t i = 0; i < d; i++) {
			aux[i] = q[i] - sq->lo[i];
			aux[d + i] = sq->step[i];
		}
		aux[2 * d] = 0.0f;
		return;
	}
	double c = 0;

	for (uint32_t i = 0; i < d; i++) {
		aux[i] = q[i] * sq->step[i];
		aux[d + i] = 0.0f;
		c += (double)q[i] * sq->lo[i];
	}
	aux[2 * d] = (float)c;
}

/* ---- scalar ----------------------------------------------------------------------------- */

static float l2_scalar(const float *aux, const uint8_t *c, uint32_t dim)
{
	const float *a = aux, *s = aux + dim;
	float acc[8] = { 0 };
	uint32_t i = 0;

	for (; i + 8 <= dim; i += 8)
		for (int j = 0; j < 8; j++) {
			float t = a[i + j] - s[i + j] * (float)c[i + j];
			acc[j] += t * t;
		}
	for (int j = 0; i < dim; i++, j++) {
		float t = a[i] - s[i] * (float)c[i];
		acc[j] += t * t;
	}
	return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static float ip_scalar(const float *aux, const uint8_t *c, uint32_t dim)
{
	float acc[8] = { 0 };
	uint32_t i = 0;

	for (; i + 8 <= dim; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += aux[i + j] * (float)c[i + j];
	for (int j = 0; i < dim; i++, j++)
		acc[j] += aux[i] * (float)c[i];
	return -(aux[2 * dim] + (((acc[0] + acc[1]) + (acc[2] + acc[3])) +
				 ((acc[4] + acc[5]) + (acc[6] + acc[7]))));
}

/* ---- AVX2 + FMA: 8 codes per step, widened u8 -> i32 -> f32 ------------------------------ */

#define AVX2_TARGET __attribute__((target("avx2,fma")))

static AVX2_TARGET inline float avx2_hsum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static AVX2_TARGET inline __m256 avx2_codes(const uint8_t *c)
{
	return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)c)));
}

static AVX2_TARGET float l2_avx2(const float *aux, const uint8_t *c, uint32_t dim)
{
	const float *a = aux, *s = aux + dim;
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	uint32_t i = 0;

	for (; i + 16 <= dim; i += 16) {
		__m256 t0 = _mm256_fnmadd_ps(_mm256_loadu_ps(s + i), avx2_codes(c + i),
					     _mm256_loadu_ps(a + i));
		__m256 t1 = _mm256_fnmadd_ps(_mm256_loadu_ps(s + i + 8), avx2_codes(c + i + 8),
					     _mm256_loadu_ps(a + i + 8));

		s0 = _mm256_fmadd_ps(t0, t0, s0);
		s1 = _mm256_fmadd_ps(t1, t1, s1);
	}
	float r = avx2_hsum(_mm256_add_ps(s0, s1));

	for (; i < dim; i++) {
		float t = a[i] - s[i] * (float)c[i];

		r += t * t;
	}
	return r;
}

static AVX2_TARGET float ip_avx2(const float *aux, const uint8_t *c, uint32_t dim)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	uint32_t i = 0;

	for (; i + 16 <= dim; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(aux + i), avx2_codes(c + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(aux + i + 8), avx2_codes(c + i + 8), s1);
	}
	float r = avx2_hsum(_mm256_add_ps(s0, s1));

	for (; i < dim; i++)
		r += aux[i] * (float)c[i];
	return -(aux[2 * dim] + r);
}

/* ---- AVX-512F: 16 codes per step, one masked step for the tail --------------------------- */

#define AVX512_TARGET __attribute__((target("avx512f")))

/* 16 codes widened to floats (a masked byte load would need AVX512BW+VL: the tail is
 * copied into a zeroed buffer instead). */
static AVX512_TARGET inline __m512 avx512_codes_full(const uint8_t *c)
{
	return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)c)));
}

static AVX512_TARGET float l2_avx512(const float *aux, const uint8_t *c, uint32_t dim)
{
	const float *a = aux, *s = aux + dim;
	__m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
	uint32_t i = 0;

	for (; i + 32 <= dim; i += 32) {
		__m512 t0 = _mm512_fnmadd_ps(_mm512_loadu_ps(s + i), avx512_codes_full(c + i),
					     _mm512_loadu_ps(a + i));
		__m512 t1 = _mm512_fnmadd_ps(_mm512_loadu_ps(s + i + 16),
					     avx512_codes_full(c + i + 16),
					     _mm512_loadu_ps(a + i + 16));

		s0 = _mm512_fmadd_ps(t0, t0, s0);
		s1 = _mm512_fmadd_ps(t1, t1, s1);
	}
	for (; i + 16 <= dim; i += 16) {
		__m512 t = _mm512_fnmadd_ps(_mm512_loadu_ps(s + i), avx512_codes_full(c + i),
					    _mm512_loadu_ps(a + i));

		s0 = _mm512_fmadd_ps(t, t, s0);
	}
	if (i < dim) {
		uint8_t tail[16] = { 0 };
		__mmask16 m = (__mmask16)((1u << (dim - i)) - 1);

		memcpy(tail, c + i, dim - i);
		__m512 t = _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(m, s + i), avx512_codes_full(tail),
					    _mm512_maskz_loadu_ps(m, a + i));

		s1 = _mm512_fmadd_ps(t, t, s1);
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

static AVX512_TARGET float ip_avx512(const float *aux, const uint8_t *c, uint32_t dim)
{
	__m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
	uint32_t i = 0;

	for (; i + 32 <= dim; i += 32) {
		s0 = _mm512_fmadd_ps(_mm512_loadu_ps(aux + i), avx512_codes_full(c + i), s0);
		s1 = _mm512_fmadd_ps(_mm512_loadu_ps(aux + i + 16), avx512_codes_full(c + i + 16),
				     s1);
	}
	for (; i + 16 <= dim; i += 16)
		s0 = _mm512_fmadd_ps(_mm512_loadu_ps(aux + i), avx512_codes_full(c + i), s0);
	if (i < dim) {
		uint8_t tail[16] = { 0 };
		__mmask16 m = (__mmask16)((1u << (dim - i)) - 1);

		memcpy(tail, c + i, dim - i);
		s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, aux + i), avx512_codes_full(tail), s1);
	}
	return -(aux[2 * dim] + _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)));
}

dm_sq8_fn dm_sq8_kernel(const struct dm_sq8 *sq)
{
	const char *isa = dm_kernel_isa();

	if (!strcmp(isa, "avx512"))
		return sq->l2 ? l2_avx512 : ip_avx512;
	if (!strcmp(isa, "avx2"))
		return sq->l2 ? l2_avx2 : ip_avx2;
	return sq->l2 ? l2_scalar : ip_scalar;
}
