/* rabitq_scan.c: per-query RaBitQ estimation over FastScan neighbour lists: the context
 * (q' = q - u or q, its norm and its quantised look-up tables), the accumulation kernels
 * (scalar, AVX2, AVX-512BW; one chosen once at run time, DMANN_ISA forces a lower one) and
 * the estimator with its error bound.
 *
 * LUT: for each group g of 4 dimensions, T_g[c] = sum of q'_{4g+k} over the bits k set in c
 * (c = 0..15), i.e. <x_b, q'> restricted to the group for a code nibble c. Each table is
 * stored as u8: round((T_g[c] - min_g) / delta) with min_g = T_g[c of the negative
 * components] (its minimum) and one delta = max_g(range_g) / 255 for all groups, so
 *     <x_b, q'> ~= delta * sum_g u8_g[nibble_g] + sum_g min_g.
 * The kernels sum the u8 entries exactly (u16 lanes, flushed to u32 every 256 groups so no
 * lane can overflow), hence every ISA gives the same integers and the same estimates (the
 * rest is shared SSE code, SSE being the x86-64-v2 baseline). The rounding of the tables adds an error of
 * standard deviation delta * sqrt(G / 12) to that sum (G = D/4 groups), which the reported
 * bound includes next to RaBitQ's.
 *
 * Kernels: the codes of a block are 16 bytes per group (low nibbles = slots 0..15, high =
 * 16..31), the tables 16 bytes per group, so a 128-bit lane of codes and the matching lane
 * of tables feed one vpshufb for 16 slots; AVX2 does 2 groups per instruction, AVX-512BW 4.
 * The u8 results are split into even and odd bytes (and / shift) to add into u16 lanes.
 */
#include "rabitq_int.h"

/* No fused multiply-adds behind our back (clang contracts by default; gcc does not under
 * -std=c11): the results are defined by the operations as written. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#define CHUNK_GROUPS 256u   /* groups summed in u16 lanes before a flush to u32 */

struct rbq_qctx {
	const struct rbq *q;
	uint32_t D, G;           /* padded dim, groups (D/4) */
	enum dm_metric m;
	float eps0;
	float delta;             /* LUT scale */
	float bias;              /* sum_g min_g */
	float sum_q;             /* sum of q' */
	float c_rbq;             /* |q'| / sqrt(D - 1) (format 2, l2 / cos: per list, from dist_qu) */
	bool centred;            /* format 2, l2 / cos: tables of q - c, per-slot w subtracted */
	float c_lut;             /* 2 delta sqrt(G / 12) / sqrt(D): LUT rounding, per |r|/ipob */
	float inv_sqrt_D;
	uint8_t *lut;            /* G * 16 bytes, 64-aligned */
	float *x;                /* D: q' */
	float *mn;               /* G: minimum of each table */
};

typedef void (*acc_fn)(const uint8_t *codes, const uint8_t *lut, uint32_t G, uint32_t *tot);
/* u8 tables of x: lut[16 g + c] = min(255, trunc((T_g[c] - mn[g]) * inv + 0.5)). */
typedef void (*lut_fn)(const float *x, const float *mn, uint32_t G, float inv, uint8_t *lut);

/* ---------------------------------------------------------------------------------------
 * Tables. T_g[c] is defined as the sum of x_{4g+k} over the bits k of c in increasing k
 * (starting from the first one, no leading 0 + ...), which every ISA computes in that order
 * with masked adds (adding a masked +0 changes at most the sign of a zero, which no later
 * step sees), then quantises with the same float operations and a truncation that
 * saturates at 0 and 255, so all ISAs produce identical tables. mn[g] (the sum of the
 * group's negative components) is the table's minimum up to rounding; an entry a rounding
 * below it still maps to 0 (v > 0.49).
 */

static void lut_scalar(const float *x, const float *mn, uint32_t G, float inv, uint8_t *lut)
{
	for (uint32_t g = 0; g < G; g++) {
		const float *a = x + 4u * g;
		for (unsigned c = 0; c < 16; c++) {
			float t = 0.0f;
			for (unsigned k = 0; k < 4; k++)
				if (c >> k & 1u)
					t += a[k];
			float v = (t - mn[g]) * inv + 0.5f;
			uint32_t i = v > 0.0f ? (uint32_t)v : 0;
			lut[16u * g + c] = (uint8_t)(i > 255 ? 255 : i);
		}
	}
}

/* ---------------------------------------------------------------------------------------
 * Kernels: tot[0..31] = sum_g lut[16 g + nibble of slot j in group g].
 */

static void acc_scalar(const uint8_t *codes, const uint8_t *lut, uint32_t G, uint32_t *tot)
{
	memset(tot, 0, sizeof(uint32_t) * RBQ_BLOCK);
	for (uint32_t g = 0; g < G; g++) {
		const uint8_t *c = codes + 16u * g, *t = lut + 16u * g;
		for (unsigned j = 0; j < 16; j++) {
			tot[j] += t[c[j] & 0x0f];
			tot[j + 16] += t[c[j] >> 4];
		}
	}
}

#define AVX2_TARGET __attribute__((target("avx2")))

/* Add 16 slots' sums into tot[0..15]: e and o hold, per 128-bit lane, the u16 sums of the
 * even and odd slots 0, 2, ..., 14 and 1, 3, ..., 15 over the groups of that lane. */
static AVX2_TARGET void flush16(__m256i e, __m256i o, uint32_t *tot)
{
	__m256i e32 = _mm256_add_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(e)),
				       _mm256_cvtepu16_epi32(_mm256_extracti128_si256(e, 1)));
	__m256i o32 = _mm256_add_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(o)),
				       _mm256_cvtepu16_epi32(_mm256_extracti128_si256(o, 1)));
	__m256i lo = _mm256_unpacklo_epi32(e32, o32), hi = _mm256_unpackhi_epi32(e32, o32);
	__m256i s0 = _mm256_permute2x128_si256(lo, hi, 0x20);   /* slots 0..7 */
	__m256i s1 = _mm256_permute2x128_si256(lo, hi, 0x31);   /* slots 8..15 */
	_mm256_storeu_si256((__m256i *)tot,
			    _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)tot), s0));
	_mm256_storeu_si256((__m256i *)(tot + 8),
			    _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(tot + 8)), s1));
}

static AVX2_TARGET void acc_avx2(const uint8_t *codes, const uint8_t *lut, uint32_t G,
				 uint32_t *tot)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f), m8 = _mm256_set1_epi16(0x00ff);

	memset(tot, 0, sizeof(uint32_t) * RBQ_BLOCK);
	for (uint32_t g0 = 0; g0 < G; g0 += CHUNK_GROUPS) {
		uint32_t g1 = DM_MIN(G, g0 + CHUNK_GROUPS);
		__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
		for (uint32_t g = g0; g < g1; g += 2) {
			__m256i c = _mm256_loadu_si256((const __m256i *)(codes + 16u * g));
			__m256i t = _mm256_loadu_si256((const __m256i *)(lut + 16u * g));
			__m256i lo = _mm256_and_si256(c, m4);
			__m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);
			__m256i rl = _mm256_shuffle_epi8(t, lo), rh = _mm256_shuffle_epi8(t, hi);
			a0 = _mm256_add_epi16(a0, _mm256_and_si256(rl, m8));
			a1 = _mm256_add_epi16(a1, _mm256_srli_epi16(rl, 8));
			a2 = _mm256_add_epi16(a2, _mm256_and_si256(rh, m8));
			a3 = _mm256_add_epi16(a3, _mm256_srli_epi16(rh, 8));
		}
		flush16(a0, a1, tot);
		flush16(a2, a3, tot + 16);
	}
}

static AVX2_TARGET void lut_avx2(const float *x, const float *mn, uint32_t G, float inv,
				 uint8_t *lut)
{
	/* lanes c = 0..7 (and 8..15, which add x3): bit k of c as all-ones masks */
	const __m256 b0 = _mm256_castsi256_ps(_mm256_setr_epi32(0, -1, 0, -1, 0, -1, 0, -1));
	const __m256 b1 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, -1, -1, 0, 0, -1, -1));
	const __m256 b2 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1));
	const __m256 vinv = _mm256_set1_ps(inv), half = _mm256_set1_ps(0.5f);
	for (uint32_t g = 0; g < G; g++) {
		const float *a = x + 4u * g;
		__m256 x0 = _mm256_broadcast_ss(a), x1 = _mm256_broadcast_ss(a + 1);
		__m256 x2 = _mm256_broadcast_ss(a + 2), x3 = _mm256_broadcast_ss(a + 3);
		__m256 lo = _mm256_add_ps(_mm256_and_ps(x0, b0), _mm256_and_ps(x1, b1));
		lo = _mm256_add_ps(lo, _mm256_and_ps(x2, b2));
		__m256 hi = _mm256_add_ps(lo, x3), m = _mm256_broadcast_ss(mn + g);
		__m256 v0 = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(lo, m), vinv), half);
		__m256 v1 = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(hi, m), vinv), half);
		__m256i i0 = _mm256_cvttps_epi32(v0), i1 = _mm256_cvttps_epi32(v1);
		/* i32 -> u16 -> u8 with saturation (inputs are >= 0) */
		__m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(i0, i1), 0xd8);
		__m128i b = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
		_mm_storeu_si128((__m128i *)(lut + 16u * g), b);
	}
}

#define AVX512_TARGET __attribute__((target("avx512f,avx512bw")))

static AVX512_TARGET void acc_avx512(const uint8_t *codes, const uint8_t *lut, uint32_t G,
				     uint32_t *tot)
{
	const __m512i m4 = _mm512_set1_epi8(0x0f), m8 = _mm512_set1_epi16(0x00ff);

	memset(tot, 0, sizeof(uint32_t) * RBQ_BLOCK);
	for (uint32_t g0 = 0; g0 < G; g0 += CHUNK_GROUPS) {
		uint32_t g1 = DM_MIN(G, g0 + CHUNK_GROUPS);
		__m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
		for (uint32_t g = g0; g < g1; g += 4) {
			__m512i c = _mm512_loadu_si512((const void *)(codes + 16u * g));
			__m512i t = _mm512_loadu_si512((const void *)(lut + 16u * g));
			__m512i lo = _mm512_and_si512(c, m4);
			__m512i hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
			__m512i rl = _mm512_shuffle_epi8(t, lo), rh = _mm512_shuffle_epi8(t, hi);
			a0 = _mm512_add_epi16(a0, _mm512_and_si512(rl, m8));
			a1 = _mm512_add_epi16(a1, _mm512_srli_epi16(rl, 8));
			a2 = _mm512_add_epi16(a2, _mm512_and_si512(rh, m8));
			a3 = _mm512_add_epi16(a3, _mm512_srli_epi16(rh, 8));
		}
		/* fold the four 128-bit lanes to two (u16: each lane holds <= 64 x 255) */
		flush16(_mm256_add_epi16(_mm512_castsi512_si256(a0), _mm512_extracti64x4_epi64(a0, 1)),
			_mm256_add_epi16(_mm512_castsi512_si256(a1), _mm512_extracti64x4_epi64(a1, 1)),
			tot);
		flush16(_mm256_add_epi16(_mm512_castsi512_si256(a2), _mm512_extracti64x4_epi64(a2, 1)),
			_mm256_add_epi16(_mm512_castsi512_si256(a3), _mm512_extracti64x4_epi64(a3, 1)),
			tot + 16);
	}
}

static AVX512_TARGET void lut_avx512(const float *x, const float *mn, uint32_t G, float inv,
				     uint8_t *lut)
{
	const __m512 vinv = _mm512_set1_ps(inv), half = _mm512_set1_ps(0.5f);
	for (uint32_t g = 0; g < G; g++) {
		const float *a = x + 4u * g;
		__m512 t = _mm512_maskz_mov_ps(0xaaaa, _mm512_set1_ps(a[0]));
		t = _mm512_mask_add_ps(t, 0xcccc, t, _mm512_set1_ps(a[1]));
		t = _mm512_mask_add_ps(t, 0xf0f0, t, _mm512_set1_ps(a[2]));
		t = _mm512_mask_add_ps(t, 0xff00, t, _mm512_set1_ps(a[3]));
		__m512 v = _mm512_sub_ps(t, _mm512_set1_ps(mn[g]));
		v = _mm512_add_ps(_mm512_mul_ps(v, vinv), half);
		_mm_storeu_si128((__m128i *)(lut + 16u * g),
				 _mm512_cvtusepi32_epi8(_mm512_cvttps_epi32(v)));
	}
}

/* ---------------------------------------------------------------------------------------
 * Dispatch (as distance.c).
 */

static const struct {
	const char *name;
	acc_fn acc;
	lut_fn lut;
} isas[] = {
	{ "scalar", acc_scalar, lut_scalar },
	{ "avx2", acc_avx2, lut_avx2 },
	{ "avx512", acc_avx512, lut_avx512 },
};

static int cur_isa;   /* written by the constructor and by rbq_set_isa (tests) only */

static int best_isa(void)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
		return 2;
	if (__builtin_cpu_supports("avx2"))
		return 1;
	return 0;
}

static int isa_from_name(const char *s)
{
	for (size_t i = 0; s && i < DM_ARRAY_SIZE(isas); i++)
		if (strcmp(s, isas[i].name) == 0)
			return (int)i;
	return -1;
}

__attribute__((constructor)) static void rbq_isa_select(void)
{
	int isa = best_isa(), want = isa_from_name(getenv("DMANN_ISA"));

	if (want >= 0 && want < isa)
		isa = want;
	cur_isa = isa;
}

const char *rbq_isa(void)
{
	return isas[cur_isa].name;
}

int rbq_set_isa(const char *isa)
{
	int want = isa_from_name(isa);

	if (want < 0)
		return -EINVAL;
	if (want > best_isa())
		return -ENOTSUP;
	cur_isa = want;
	return 0;
}

/* ---------------------------------------------------------------------------------------
 * Context.
 */

struct rbq_qctx *rbq_qctx_new(const struct rbq *q)
{
	struct rbq_qctx *c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->q = q;
	c->D = q->D;
	c->G = q->D / 4;
	c->eps0 = RBQ_EPS0_DEFAULT;
	c->lut = aligned_alloc(64, DM_ALIGN_UP((size_t)c->G * 16, 64));
	c->x = aligned_alloc(64, DM_ALIGN_UP(sizeof(float) * c->D, 64));
	c->mn = aligned_alloc(64, DM_ALIGN_UP(sizeof(float) * c->G, 64));
	if (!c->lut || !c->x || !c->mn) {
		rbq_qctx_free(c);
		errno = ENOMEM;
		return NULL;
	}
	memset(c->lut, 0, (size_t)c->G * 16);
	return c;
}

void rbq_qctx_free(struct rbq_qctx *ctx)
{
	if (!ctx)
		return;
	free(ctx->lut);
	free(ctx->x);
	free(ctx->mn);
	free(ctx);
}

int rbq_qctx_set_eps0(struct rbq_qctx *ctx, float eps0)
{
	if (!(eps0 >= 0.0f) || !isfinite(eps0))
		return -EINVAL;
	ctx->eps0 = eps0;
	return 0;
}

/* Pass 1 of rbq_prep: x = q - u (or q), |x|^2, sum x, mn[g] (the table minima) and the
 * largest table range (positives - negatives), defined for every ISA as: n2 and sum in 16
 * lanes (lane l: elements 16 t + l, t ascending) combined as below; mn[g] = ((n0 + n1) +
 * n2) + n3 over the negative components of group g (positives alike); bias = the sum of mn
 * in 4 lanes (g mod 4) combined as hsum4. */
struct pass1 {
	float n2, sum, rmax, bias;
};

/* Horizontal sum of 4 lanes, (v0 + v1) + (v2 + v3). */
static float hsum4(__m128 v)
{
	__m128 p = _mm_add_ps(v, _mm_shuffle_ps(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
	return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehl_ps(p, p)));
}

/* 16 lanes as four 4-lane vectors: ((v0 + v1) + (v2 + v3)), then hsum4. */
static float hsum16(__m128 v0, __m128 v1, __m128 v2, __m128 v3)
{
	return hsum4(_mm_add_ps(_mm_add_ps(v0, v1), _mm_add_ps(v2, v3)));
}

static float hmax4(__m128 v)
{
	v = _mm_max_ps(v, _mm_movehl_ps(v, v));
	return _mm_cvtss_f32(_mm_max_ss(v, _mm_movehdup_ps(v)));
}

typedef struct pass1 (*pass1_fn)(const float *q, const float *u, bool resid, uint32_t G,
				  float *x, float *mn);

/* SSE (the baseline), four groups at a time. */
static struct pass1 pass1_sse(const float *q, const float *u, bool resid, uint32_t G, float *x,
			      float *mn)
{
	const __m128 z = _mm_setzero_ps();
	__m128 vn2[4] = { z, z, z, z }, vsum[4] = { z, z, z, z }, vmax = z, vbias = z;
	for (uint32_t g = 0; g < G; g += 4) {
		__m128 c[4];
		for (unsigned k = 0; k < 4; k++) {
			c[k] = _mm_loadu_ps(q + 4u * g + 4u * k);
			if (resid)
				c[k] = _mm_sub_ps(c[k], _mm_loadu_ps(u + 4u * g + 4u * k));
			_mm_storeu_ps(x + 4u * g + 4u * k, c[k]);
			vn2[k] = _mm_add_ps(vn2[k], _mm_mul_ps(c[k], c[k]));
			vsum[k] = _mm_add_ps(vsum[k], c[k]);
		}
		_MM_TRANSPOSE4_PS(c[0], c[1], c[2], c[3]);   /* c[k] = component k of 4 groups */
		__m128 n = _mm_min_ps(c[0], z), p = _mm_max_ps(c[0], z);
		for (unsigned k = 1; k < 4; k++) {
			n = _mm_add_ps(n, _mm_min_ps(c[k], z));
			p = _mm_add_ps(p, _mm_max_ps(c[k], z));
		}
		_mm_storeu_ps(mn + g, n);
		vmax = _mm_max_ps(vmax, _mm_sub_ps(p, n));
		vbias = _mm_add_ps(vbias, n);
	}
	return (struct pass1){ hsum16(vn2[0], vn2[1], vn2[2], vn2[3]),
			       hsum16(vsum[0], vsum[1], vsum[2], vsum[3]), hmax4(vmax),
			       hsum4(vbias) };
}

/* AVX-512F: four groups per register (group m in 128-bit lane m). */
static AVX512_TARGET struct pass1 pass1_avx512(const float *q, const float *u, bool resid,
					       uint32_t G, float *x, float *mn)
{
	const __m512 z = _mm512_setzero_ps();
	const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
	__m512 vn2 = z, vsum = z;
	__m128 vmax = _mm_setzero_ps(), vbias = _mm_setzero_ps();
	for (uint32_t g = 0; g < G; g += 4) {
		__m512 c = _mm512_loadu_ps(q + 4u * g);
		if (resid)
			c = _mm512_sub_ps(c, _mm512_loadu_ps(u + 4u * g));
		_mm512_storeu_ps(x + 4u * g, c);
		vn2 = _mm512_add_ps(vn2, _mm512_mul_ps(c, c));
		vsum = _mm512_add_ps(vsum, c);
		__m512 n = _mm512_min_ps(c, z), p = _mm512_max_ps(c, z);
		/* lane 0 of each 128-bit lane: ((e0 + e1) + e2) + e3 */
		__m512 sn = _mm512_add_ps(n, _mm512_permute_ps(n, 0x55));
		sn = _mm512_add_ps(sn, _mm512_permute_ps(n, 0xaa));
		sn = _mm512_add_ps(sn, _mm512_permute_ps(n, 0xff));
		__m512 sp = _mm512_add_ps(p, _mm512_permute_ps(p, 0x55));
		sp = _mm512_add_ps(sp, _mm512_permute_ps(p, 0xaa));
		sp = _mm512_add_ps(sp, _mm512_permute_ps(p, 0xff));
		__m128 n4 = _mm512_castps512_ps128(_mm512_permutexvar_ps(first, sn));
		__m128 p4 = _mm512_castps512_ps128(_mm512_permutexvar_ps(first, sp));
		_mm_storeu_ps(mn + g, n4);
		vmax = _mm_max_ps(vmax, _mm_sub_ps(p4, n4));
		vbias = _mm_add_ps(vbias, n4);
	}
	return (struct pass1){
		hsum16(_mm512_castps512_ps128(vn2), _mm512_extractf32x4_ps(vn2, 1),
		       _mm512_extractf32x4_ps(vn2, 2), _mm512_extractf32x4_ps(vn2, 3)),
		hsum16(_mm512_castps512_ps128(vsum), _mm512_extractf32x4_ps(vsum, 1),
		       _mm512_extractf32x4_ps(vsum, 2), _mm512_extractf32x4_ps(vsum, 3)),
		hmax4(vmax), hsum4(vbias) };
}

bool rbq_prep_per_query(const struct rbq *q, enum dm_metric m)
{
	return q->center != NULL || m == DM_METRIC_IP;
}

int rbq_prep(const struct rbq *q, struct rbq_qctx *ctx, const float *q_rot,
	     const float *u_rot, enum dm_metric m)
{
	uint32_t D = ctx->D, G = ctx->G;

	if (ctx->q != q || (m != DM_METRIC_L2 && m != DM_METRIC_IP && m != DM_METRIC_COS))
		return -EINVAL;
	/* format 2: q' = q - u is handled as (q - c) - (u - c), the second part per slot */
	bool centred = q->center && m != DM_METRIC_IP;
	if (centred)
		u_rot = q->center;
	pass1_fn p1 = cur_isa == 2 ? pass1_avx512 : pass1_sse;   /* 2: "avx512" in isas[] */
	struct pass1 r = p1(q_rot, u_rot, m != DM_METRIC_IP, G, ctx->x, ctx->mn);
	if (!isfinite(r.n2) || !isfinite(r.sum) || !isfinite(r.rmax))
		return -EINVAL;
	float inv = r.rmax > 0.0f ? 255.0f / r.rmax : 0.0f;
	isas[cur_isa].lut(ctx->x, ctx->mn, G, inv, ctx->lut);
	ctx->m = m;
	ctx->centred = centred;
	ctx->delta = r.rmax / 255.0f;
	ctx->bias = r.bias;
	ctx->sum_q = r.sum;
	ctx->inv_sqrt_D = (float)(1.0 / sqrt((double)D));
	ctx->c_rbq = (float)(sqrt((double)r.n2) / sqrt((double)D - 1.0));
	ctx->c_lut = (float)(2.0 * ctx->delta * sqrt(G / 12.0) / sqrt((double)D));
	return 0;
}

/* ---------------------------------------------------------------------------------------
 * Estimator.
 */

/* Estimates of the cnt slots of a block from their LUT sums, in 4-lane SSE (the x86-64-v2
 * baseline, so the same instructions for every ISA: bit-identical results). */
static void epilogue(const struct rbq_qctx *c, const uint8_t *norms, const uint8_t *ipobs,
		     const uint8_t *ws, const uint32_t *tot, uint32_t cnt, float dist_qu,
		     float *est, float *lower)
{
	static const float wzero[RBQ_BLOCK];
	float e[RBQ_BLOCK], b[RBQ_BLOCK], nrs[RBQ_BLOCK], obs[RBQ_BLOCK], wss[RBQ_BLOCK];
	const float *pn = (const float *)(const void *)norms, *po = (const float *)(const void *)ipobs;
	const float *pw = ws ? (const float *)(const void *)ws : wzero;
	float *pe = est, *pb = lower;
	/* |q'| of this list: format 2 (l2, cos) from the exact distance of u, |q - u|^2 being
	 * dist_qu (l2) or 2 dist_qu (cos: 1 - <q,u> of unit vectors) */
	float c_rbq = c->c_rbq;
	if (c->centred) {
		float q2 = (c->m == DM_METRIC_COS ? 2.0f : 1.0f) * dist_qu;
		c_rbq = (float)(sqrt(q2 > 0.0f ? (double)q2 : 0.0) / sqrt((double)c->D - 1.0));
	}
	const __m128 delta = _mm_set1_ps(c->delta), bias = _mm_set1_ps(c->bias);
	const __m128 sumq = _mm_set1_ps(c->sum_q), isd = _mm_set1_ps(c->inv_sqrt_D);
	const __m128 crbq = _mm_set1_ps(c_rbq), clut = _mm_set1_ps(c->c_lut);
	const __m128 eps0 = _mm_set1_ps(c->eps0), one = _mm_set1_ps(1.0f);
	const __m128 two = _mm_set1_ps(2.0f), dqu = _mm_set1_ps(dist_qu), zero = _mm_setzero_ps();
	/* l2: d + nr^2 - 2 ip, bound 2 err; cos: d + nr^2 / 2 - ip, err; ip: d - ip, err */
	const __m128 fr2 = _mm_set1_ps(c->m == DM_METRIC_L2 ? 1.0f :
				       c->m == DM_METRIC_COS ? 0.5f : 0.0f);
	const __m128 fip = _mm_set1_ps(c->m == DM_METRIC_L2 ? 2.0f : 1.0f);

	if (cnt % 4 || !lower) {
		/* a partial last vector: work on copies (the list ends after ipobs[cap - 1]) */
		memset(nrs, 0, sizeof(nrs));
		memset(obs, 0, sizeof(obs));
		memset(wss, 0, sizeof(wss));
		memcpy(nrs, norms, sizeof(float) * cnt);
		memcpy(obs, ipobs, sizeof(float) * cnt);
		if (ws)
			memcpy(wss, ws, sizeof(float) * cnt);
		pn = nrs;
		po = obs;
		pw = wss;
		pe = e;
		pb = b;
	}
	for (uint32_t j = 0; j < cnt; j += 4) {
		__m128 nr = _mm_loadu_ps(pn + j), ob = _mm_loadu_ps(po + j);
		/* <x_b, x> (x: the tables' vector), then <q', r> = |r| / ob * <o_bar, q'> with
		 * <o_bar, q'> = (2 <x_b, x> - sum x) / sqrt(D) - w (w = 0 but in format 2) */
		__m128 xq = _mm_add_ps(_mm_mul_ps(delta, _mm_cvtepi32_ps(_mm_loadu_si128(
						(const __m128i *)(tot + j)))), bias);
		__m128 k = _mm_div_ps(nr, ob);
		__m128 ip = _mm_mul_ps(k, _mm_sub_ps(_mm_mul_ps(_mm_sub_ps(_mm_mul_ps(two, xq), sumq),
								isd), _mm_loadu_ps(pw + j)));
		__m128 s = _mm_max_ps(_mm_sub_ps(one, _mm_mul_ps(ob, ob)), zero);
		__m128 err = _mm_mul_ps(_mm_mul_ps(eps0, k),
					_mm_add_ps(_mm_mul_ps(crbq, _mm_sqrt_ps(s)), clut));
		__m128 ev = _mm_sub_ps(_mm_add_ps(dqu, _mm_mul_ps(fr2, _mm_mul_ps(nr, nr))),
				       _mm_mul_ps(fip, ip));
		__m128 bv = _mm_mul_ps(fip, err);
		/* |r| = 0 (v == u, or a cleared slot): exactly the distance of u */
		__m128 z = _mm_cmpeq_ps(nr, zero);
		ev = _mm_blendv_ps(ev, dqu, z);
		bv = _mm_blendv_ps(bv, zero, z);
		_mm_storeu_ps(pe + j, ev);
		_mm_storeu_ps(pb + j, _mm_sub_ps(ev, bv));
	}
	if (pe == e) {
		memcpy(est, e, sizeof(float) * cnt);
		if (lower)
			memcpy(lower, b, sizeof(float) * cnt);
	}
}

void rbq_list_estimate(const struct rbq *q, const struct rbq_qctx *ctx, const uint8_t *list,
		       uint32_t cap, uint32_t n, float dist_qu, float *est, float *lower)
{
	acc_fn fn = isas[cur_isa].acc;
	uint32_t tot[RBQ_BLOCK];
	size_t bb = rbq_block_bytes(q);
	const uint8_t *norms = list + rbq_norm_off(q, cap), *ipobs = list + rbq_ipob_off(q, cap);
	const uint8_t *ws = ctx->centred ? list + rbq_w_off(q, cap) : NULL;

	if (n > cap)
		n = cap;
	for (uint32_t s0 = 0; s0 < n; s0 += RBQ_BLOCK) {
		uint32_t cnt = DM_MIN(RBQ_BLOCK, n - s0);
		fn(list + (size_t)(s0 / RBQ_BLOCK) * bb, ctx->lut, ctx->G, tot);
		epilogue(ctx, norms + 4u * s0, ipobs + 4u * s0, ws ? ws + 4u * s0 : NULL, tot, cnt,
			 dist_qu, est + s0, lower ? lower + s0 : NULL);
	}
}
