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
 * float epilogue is one scalar function). The rounding of the tables adds an error of
 * standard deviation delta * sqrt(G / 12) to that sum (G = D/4 groups), which the reported
 * bound includes next to RaBitQ's.
 *
 * Kernels: the codes of a block are 16 bytes per group (low nibbles = slots 0..15, high =
 * 16..31), the tables 16 bytes per group, so a 128-bit lane of codes and the matching lane
 * of tables feed one vpshufb for 16 slots; AVX2 does 2 groups per instruction, AVX-512BW 4.
 * The u8 results are split into even and odd bytes (and / shift) to add into u16 lanes.
 */
#include "rabitq_int.h"

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
	float c_rbq;             /* |q'| / sqrt(D - 1) */
	float c_lut;             /* 2 delta sqrt(G / 12) / sqrt(D): LUT rounding, per |r|/ipob */
	float inv_sqrt_D;
	uint8_t *lut;            /* G * 16 bytes, 64-aligned */
};

typedef void (*acc_fn)(const uint8_t *codes, const uint8_t *lut, uint32_t G, uint32_t *tot);

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

/* Add the u16 lanes of the four accumulators (even/odd bytes of low/high nibble results;
 * lanes 8k..8k+7 of 128-bit lane k) into tot. */
static void flush16(const uint16_t *a0, const uint16_t *a1, const uint16_t *a2,
		    const uint16_t *a3, unsigned nw, uint32_t *tot)
{
	for (unsigned w = 0; w < nw; w++) {
		unsigned s = 2 * (w % 8);
		tot[s] += a0[w];
		tot[s + 1] += a1[w];
		tot[16 + s] += a2[w];
		tot[16 + s + 1] += a3[w];
	}
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
		uint16_t w[4][16];
		_mm256_storeu_si256((__m256i *)w[0], a0);
		_mm256_storeu_si256((__m256i *)w[1], a1);
		_mm256_storeu_si256((__m256i *)w[2], a2);
		_mm256_storeu_si256((__m256i *)w[3], a3);
		flush16(w[0], w[1], w[2], w[3], 16, tot);
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
		uint16_t w[4][32];
		_mm512_storeu_si512((void *)w[0], a0);
		_mm512_storeu_si512((void *)w[1], a1);
		_mm512_storeu_si512((void *)w[2], a2);
		_mm512_storeu_si512((void *)w[3], a3);
		flush16(w[0], w[1], w[2], w[3], 32, tot);
	}
}

/* ---------------------------------------------------------------------------------------
 * Dispatch (as distance.c).
 */

static const struct { const char *name; acc_fn fn; } isas[] = {
	{ "scalar", acc_scalar },
	{ "avx2", acc_avx2 },
	{ "avx512", acc_avx512 },
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
	if (!c->lut) {
		free(c);
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
	free(ctx);
}

int rbq_qctx_set_eps0(struct rbq_qctx *ctx, float eps0)
{
	if (!(eps0 >= 0.0f) || !isfinite(eps0))
		return -EINVAL;
	ctx->eps0 = eps0;
	return 0;
}

int rbq_prep(const struct rbq *q, struct rbq_qctx *ctx, const float *q_rot,
	     const float *u_rot, enum dm_metric m)
{
	uint32_t G = ctx->G;
	bool resid = m == DM_METRIC_L2 || m == DM_METRIC_COS;
	double n2 = 0.0, sum = 0.0;
	float range_max = 0.0f;

	if (ctx->q != q || (m != DM_METRIC_L2 && m != DM_METRIC_IP && m != DM_METRIC_COS))
		return -EINVAL;
	/* pass 1: norm, sum, largest table range */
	for (uint32_t g = 0; g < G; g++) {
		float range = 0.0f;
		for (unsigned k = 0; k < 4; k++) {
			float x = resid ? q_rot[4 * g + k] - u_rot[4 * g + k] : q_rot[4 * g + k];
			n2 += (double)x * x;
			sum += x;
			range += fabsf(x);
		}
		range_max = range > range_max ? range : range_max;
	}
	if (!isfinite(n2) || !isfinite(range_max))
		return -EINVAL;
	float inv = range_max > 0.0f ? 255.0f / range_max : 0.0f;
	double bias = 0.0;
	/* pass 2: the tables */
	for (uint32_t g = 0; g < G; g++) {
		float x[4], t[16], mn = 0.0f;
		for (unsigned k = 0; k < 4; k++) {
			x[k] = resid ? q_rot[4 * g + k] - u_rot[4 * g + k] : q_rot[4 * g + k];
			mn += x[k] < 0.0f ? x[k] : 0.0f;
		}
		t[0] = 0.0f;
		for (unsigned c = 1; c < 16; c++)
			t[c] = t[c & (c - 1)] + x[__builtin_ctz(c)];
		for (unsigned c = 0; c < 16; c++) {
			float v = (t[c] - mn) * inv + 0.5f;
			ctx->lut[16 * g + c] = v >= 255.0f ? 255 : (v > 0.0f ? (uint8_t)v : 0);
		}
		bias += mn;
	}
	ctx->m = m;
	ctx->delta = range_max / 255.0f;
	ctx->bias = (float)bias;
	ctx->sum_q = (float)sum;
	ctx->inv_sqrt_D = (float)(1.0 / sqrt((double)ctx->D));
	ctx->c_rbq = (float)(sqrt(n2) / sqrt((double)ctx->D - 1.0));
	ctx->c_lut = (float)(2.0 * ctx->delta * sqrt(G / 12.0) / sqrt((double)ctx->D));
	return 0;
}

/* ---------------------------------------------------------------------------------------
 * Estimator.
 */

/* Estimates of slots [s0, s0 + cnt) from their LUT sums (shared by every ISA). */
static void epilogue(const struct rbq_qctx *c, const uint8_t *norms, const uint8_t *ipobs,
		     const uint32_t *tot, uint32_t cnt, float dist_qu, float *est, float *lower)
{
	for (uint32_t j = 0; j < cnt; j++) {
		float nr = rbq_ldf(norms + 4u * j), ob = rbq_ldf(ipobs + 4u * j);
		float xq = c->delta * (float)tot[j] + c->bias;            /* <x_b, q'> */
		float k = nr / ob;
		float ip = k * ((2.0f * xq - c->sum_q) * c->inv_sqrt_D);  /* <q', r> */
		float s = 1.0f - ob * ob;
		float err = c->eps0 * k * (c->c_rbq * sqrtf(s > 0.0f ? s : 0.0f) + c->c_lut);
		float e, b;
		switch (c->m) {
		case DM_METRIC_L2:
			e = dist_qu + nr * nr - 2.0f * ip;
			b = 2.0f * err;
			break;
		case DM_METRIC_COS:
			e = dist_qu + 0.5f * nr * nr - ip;
			b = err;
			break;
		default:
			e = dist_qu - ip;
			b = err;
			break;
		}
		if (nr == 0.0f) {   /* v == u (or a cleared slot): exact */
			e = dist_qu;
			b = 0.0f;
		}
		est[j] = e;
		if (lower)
			lower[j] = e - b;
	}
}

void rbq_list_estimate(const struct rbq *q, const struct rbq_qctx *ctx, const uint8_t *list,
		       uint32_t cap, uint32_t n, float dist_qu, float *est, float *lower)
{
	acc_fn fn = isas[cur_isa].fn;
	uint32_t tot[RBQ_BLOCK];
	size_t bb = rbq_block_bytes(q);
	const uint8_t *norms = list + rbq_norm_off(q, cap), *ipobs = list + rbq_ipob_off(q, cap);

	if (n > cap)
		n = cap;
	for (uint32_t s0 = 0; s0 < n; s0 += RBQ_BLOCK) {
		uint32_t cnt = DM_MIN(RBQ_BLOCK, n - s0);
		fn(list + (size_t)(s0 / RBQ_BLOCK) * bb, ctx->lut, ctx->G, tot);
		epilogue(ctx, norms + 4u * s0, ipobs + 4u * s0, tot, cnt, dist_qu, est + s0,
			 lower ? lower + s0 : NULL);
	}
}
