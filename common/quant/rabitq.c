/* rabitq.c: the RaBitQ quantizer of an index: its random orthogonal rotation (training,
 * rotate / unrotate), its serialised form (save, validating load), and the neighbour-list
 * codes (list geometry, set / move / clear of a slot). Estimation is in rabitq_scan.c.
 *
 * Rotation. P is a structured random orthogonal matrix: RBQ_ROUNDS (4) rounds of
 *     x <- diag(s_t) x                       random signs s_t in {-1,+1}^D
 *     x[w_t .. w_t+L) <- H_L x[w_t .. w_t+L)  normalised Walsh-Hadamard transform, L = the
 *                                            largest power of two <= D, window w_t = 0 for
 *                                            even t and D - L for odd t
 *     x <- K x   (only when D != L)          Kac step: (x_i, x_{i+D/2}) <-
 *                                            ((x_i + x_{i+D/2}) / sqrt2, (x_i - x_{i+D/2}) / sqrt2)
 * (the FHT-Kac rotation of the RaBitQ library). Every factor is orthogonal, so P is, to
 * float rounding (about 1e-7 per entry). Chosen over a dense Haar matrix (QR of a Gaussian
 * matrix) because rotating costs O(D log D) instead of O(D^2) (a query at D = 832: ~2 us
 * against streaming a 2.6 MB matrix), the state is 4 D bits instead of 4 D^2 bytes, and it
 * uses only additions, subtractions and multiplications by fixed constants in a fixed order:
 * bit-identical on every machine and ISA, with no BLAS or libm whose rounding varies. The
 * tests check orthogonality and measure the estimator's error-bound coverage with it.
 *
 * Signs: bit i of round t is bit (i mod 64) of the (t * D/64 + i/64)-th output of
 * splitmix64 seeded with the seed (1 = flip).
 *
 * Serialised form (little-endian):
 *     u32 magic "RBQ1"  u32 version (1 or 2)  u32 dim  u32 D  u32 kind (1 = FHT-Kac)
 *     u32 rounds (4)  u64 seed  u8 bits[rounds * D / 8]
 *     version 2 only: f32 center[D] (the rotated centre c, |c_i| <= RBQ_CENTER_MAX: so that
 *                     |q - c|^2 stays finite for any sane query)
 *     u32 crc32 (zlib) of all before
 * Version 2 is what rbq_train makes; version 1 (no centre, two floats per slot) is still
 * read and estimated, so images built before it keep working.
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
#include <zlib.h>

#define RBQ_MAGIC   0x31514252u   /* "RBQ1" */
#define RBQ_VERSION 2u   /* the newest format, what rbq_train writes */
#define RBQ_HDR     32u
#define RBQ_CENTER_MAX 1e15f  /* largest centre coordinate: D * (2e15)^2 < FLT_MAX */

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint32_t pad_dim(uint32_t dim) { return DM_ALIGN_UP(dim, RBQ_DIM_ALIGN); }

static uint32_t pow2_floor(uint32_t x)
{
	uint32_t p = 1;
	while (p * 2 <= x)
		p *= 2;
	return p;
}

/* Allocate a quantizer for dim with the sign bits to be filled in; sign floats derived by
 * rbq_finish. */
static struct rbq *rbq_alloc(uint32_t dim, uint64_t seed, uint32_t version)
{
	struct rbq *q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->version = version;
	q->dim = dim;
	q->D = pad_dim(dim);
	q->L = pow2_floor(q->D);
	q->seed = seed;
	q->bits = calloc(RBQ_ROUNDS, q->D / 8);
	q->sign = malloc(sizeof(float) * RBQ_ROUNDS * q->D);
	if (version >= 2)
		q->center = calloc(q->D, sizeof(float));
	if (!q->bits || !q->sign || (version >= 2 && !q->center)) {
		rbq_free(q);
		errno = ENOMEM;
		return NULL;
	}
	return q;
}

static void rbq_finish(struct rbq *q)
{
	for (uint32_t i = 0; i < RBQ_ROUNDS * q->D; i++)
		q->sign[i] = (q->bits[i / 8] >> (i % 8)) & 1u ? -1.0f : 1.0f;
}

static struct rbq *train(uint32_t dim, const float *sample, size_t nsample, uint64_t seed,
			 uint32_t version)
{
	if (dim == 0 || dim > RBQ_MAX_DIM || (nsample > 0 && !sample)) {
		errno = EINVAL;
		return NULL;
	}
	for (size_t i = 0; i < nsample * dim; i++)
		if (!isfinite(sample[i])) {
			errno = EINVAL;
			return NULL;
		}
	struct rbq *q = rbq_alloc(dim, seed, version);
	if (!q)
		return NULL;
	uint64_t s = seed;
	size_t words = (size_t)RBQ_ROUNDS * q->D / 64;
	for (size_t w = 0; w < words; w++) {
		uint64_t r = splitmix64(&s);
		for (int b = 0; b < 8; b++)
			q->bits[w * 8 + b] = (uint8_t)(r >> (8 * b));
	}
	rbq_finish(q);
	if (q->center && nsample > 0) {
		/* c = mean of the sample (double sums), zero-padded to D, rotated */
		double *acc = calloc(dim, sizeof(double));
		if (!acc) {
			rbq_free(q);
			errno = ENOMEM;
			return NULL;
		}
		for (size_t i = 0; i < nsample; i++)
			for (uint32_t j = 0; j < dim; j++)
				acc[j] += sample[i * dim + j];
		for (uint32_t j = 0; j < dim; j++)
			q->center[j] = (float)(acc[j] / (double)nsample);
		free(acc);
		rbq_rotate(q, q->center, q->center);
		for (uint32_t j = 0; j < q->D; j++)
			if (!(fabsf(q->center[j]) <= RBQ_CENTER_MAX)) {
				/* no use centring data this large: the tables' sums would overflow */
				memset(q->center, 0, sizeof(float) * q->D);
				break;
			}
	}
	return q;
}

struct rbq *rbq_train(uint32_t dim, const float *sample, size_t nsample, uint64_t seed)
{
	return train(dim, sample, nsample, seed, RBQ_VERSION);
}

struct rbq *rbq_train_v1(uint32_t dim, const float *sample, size_t nsample, uint64_t seed)
{
	return train(dim, sample, nsample, seed, 1);
}

void rbq_free(struct rbq *q)
{
	if (!q)
		return;
	free(q->bits);
	free(q->sign);
	free(q->center);
	free(q);
}

uint32_t rbq_version(const struct rbq *q) { return q->version; }

uint32_t rbq_dim(const struct rbq *q) { return q->dim; }
uint32_t rbq_dim_padded(const struct rbq *q) { return q->D; }
uint64_t rbq_seed(const struct rbq *q) { return q->seed; }

/* ---------------------------------------------------------------------------------------
 * Rotation. Plain C: element-wise butterflies in a fixed order, which the compiler may
 * vectorise without changing a bit of the result.
 */

/* Butterfly stages h .. n/2 (h >= 16, every span a multiple of the register width) and
 * the final scaling by s, at three widths. */
static void fwht_wide_sse(float *x, uint32_t n, uint32_t h0, float s)
{
	for (uint32_t h = h0; h < n; h *= 2)
		for (uint32_t i = 0; i < n; i += 2 * h)
			for (uint32_t j = i; j < i + h; j += 4) {
				__m128 a = _mm_loadu_ps(x + j), b = _mm_loadu_ps(x + j + h);
				_mm_storeu_ps(x + j, _mm_add_ps(a, b));
				_mm_storeu_ps(x + j + h, _mm_sub_ps(a, b));
			}
	const __m128 sv = _mm_set1_ps(s);
	for (uint32_t i = 0; i < n; i += 4)
		_mm_storeu_ps(x + i, _mm_mul_ps(_mm_loadu_ps(x + i), sv));
}

__attribute__((target("avx2"))) static void fwht_wide_avx2(float *x, uint32_t n, uint32_t h0,
							     float s)
{
	for (uint32_t h = h0; h < n; h *= 2)
		for (uint32_t i = 0; i < n; i += 2 * h)
			for (uint32_t j = i; j < i + h; j += 8) {
				__m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
				_mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
				_mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
			}
	const __m256 sv = _mm256_set1_ps(s);
	for (uint32_t i = 0; i < n; i += 8)
		_mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
}

__attribute__((target("avx512f"))) static void fwht_wide_avx512(float *x, uint32_t n,
								 uint32_t h0, float s)
{
	for (uint32_t h = h0; h < n; h *= 2)
		for (uint32_t i = 0; i < n; i += 2 * h)
			for (uint32_t j = i; j < i + h; j += 16) {
				__m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + h);
				_mm512_storeu_ps(x + j, _mm512_add_ps(a, b));
				_mm512_storeu_ps(x + j + h, _mm512_sub_ps(a, b));
			}
	const __m512 sv = _mm512_set1_ps(s);
	for (uint32_t i = 0; i < n; i += 16)
		_mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), sv));
}

/* In-place normalised Walsh-Hadamard transform of n (power of two, >= 64) floats: butterflies
 * (a, b) -> (a + b, a - b) for h = 1, 2, 4, ..., n/2, then a multiplication by 1/sqrt(n).
 * Every element sees the same operations in the same order as the plain loop would do,
 * whether in SSE (the x86-64-v2 baseline), AVX2 or AVX-512 registers, so the result does
 * not depend on the code path. */
static void fwht(float *x, uint32_t n)
{
	const __m128 neg1 = _mm_castsi128_ps(_mm_setr_epi32(0, (int)0x80000000, 0, (int)0x80000000));
	const __m128 neg2 = _mm_castsi128_ps(_mm_setr_epi32(0, 0, (int)0x80000000, (int)0x80000000));

	/* h = 1 and h = 2 inside each group of 4 (a + (-b) is exactly a - b) */
	for (uint32_t i = 0; i < n; i += 4) {
		__m128 v = _mm_loadu_ps(x + i);
		__m128 p = _mm_shuffle_ps(v, v, _MM_SHUFFLE(2, 2, 0, 0));
		__m128 q = _mm_shuffle_ps(v, v, _MM_SHUFFLE(3, 3, 1, 1));
		v = _mm_add_ps(p, _mm_xor_ps(q, neg1));
		p = _mm_movelh_ps(v, v);
		q = _mm_movehl_ps(v, v);
		_mm_storeu_ps(x + i, _mm_add_ps(p, _mm_xor_ps(q, neg2)));
	}
	uint32_t h = 4;
	for (; h < n && h < 16; h *= 2)
		for (uint32_t i = 0; i < n; i += 2 * h)
			for (uint32_t j = i; j < i + h; j += 4) {
				__m128 a = _mm_loadu_ps(x + j), b = _mm_loadu_ps(x + j + h);
				_mm_storeu_ps(x + j, _mm_add_ps(a, b));
				_mm_storeu_ps(x + j + h, _mm_sub_ps(a, b));
			}
	/* the wide stages and the scaling: the same additions, subtractions and products in
	 * wider registers, so every ISA gives the same bits */
	float s = (float)(1.0 / sqrt((double)n));
	const char *isa = rbq_isa();   /* the estimator's ISA (rbq_set_isa), checked at start */

	if (isa[0] == 'a' && isa[3] == '5')
		fwht_wide_avx512(x, n, h, s);
	else if (isa[0] == 'a')
		fwht_wide_avx2(x, n, h, s);
	else
		fwht_wide_sse(x, n, h, s);
}

/* Kac step over D floats: orthogonal and its own inverse. */
static void kac(float *x, uint32_t D)
{
	const float c = 0.70710678118654752f;
	uint32_t h = D / 2;
	for (uint32_t i = 0; i < h; i++) {
		float a = x[i], b = x[i + h];
		x[i] = (a + b) * c;
		x[i + h] = (a - b) * c;
	}
}

static void flip(float *x, const float *s, uint32_t D)
{
	for (uint32_t i = 0; i < D; i++)
		x[i] *= s[i];
}

static uint32_t window(const struct rbq *q, uint32_t t)
{
	return (t & 1u) ? q->D - q->L : 0;
}

void rbq_rotate(const struct rbq *q, const float *x, float *out)
{
	if (out != x)
		memmove(out, x, sizeof(float) * q->dim);
	memset(out + q->dim, 0, sizeof(float) * (q->D - q->dim));
	for (uint32_t t = 0; t < RBQ_ROUNDS; t++) {
		flip(out, q->sign + (size_t)t * q->D, q->D);
		fwht(out + window(q, t), q->L);
		if (q->D != q->L)
			kac(out, q->D);
	}
}

void rbq_unrotate(const struct rbq *q, const float *y, float *out)
{
	if (out != y)
		memmove(out, y, sizeof(float) * q->D);
	for (uint32_t t = RBQ_ROUNDS; t-- > 0;) {
		if (q->D != q->L)
			kac(out, q->D);
		fwht(out + window(q, t), q->L);
		flip(out, q->sign + (size_t)t * q->D, q->D);
	}
}

/* ---------------------------------------------------------------------------------------
 * Serialisation.
 */

static uint32_t crc(const void *p, size_t len)
{
	return (uint32_t)crc32_z(crc32_z(0, Z_NULL, 0), p, len);
}

static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

static size_t center_bytes(uint32_t version, uint32_t D)
{
	return version >= 2 ? sizeof(float) * (size_t)D : 0;
}

size_t rbq_save_size(const struct rbq *q)
{
	return RBQ_HDR + (size_t)RBQ_ROUNDS * q->D / 8 + center_bytes(q->version, q->D) + 4;
}

int rbq_save(const struct rbq *q, void *buf, size_t len)
{
	size_t need = rbq_save_size(q), nbits = (size_t)RBQ_ROUNDS * q->D / 8;
	size_t body = RBQ_HDR + nbits + center_bytes(q->version, q->D);
	uint8_t *p = buf;

	if (len < need)
		return -ENOSPC;
	wr32(p, RBQ_MAGIC);
	wr32(p + 4, q->version);
	wr32(p + 8, q->dim);
	wr32(p + 12, q->D);
	wr32(p + 16, RBQ_ROT_FHT_KAC);
	wr32(p + 20, RBQ_ROUNDS);
	memcpy(p + 24, &q->seed, 8);
	memcpy(p + RBQ_HDR, q->bits, nbits);
	for (uint32_t i = 0; q->center && i < q->D; i++)
		memcpy(p + RBQ_HDR + nbits + 4u * i, &q->center[i], 4);
	wr32(p + body, crc(p, body));
	return 0;
}

int rbq_load(const void *buf, size_t len, struct rbq **out)
{
	const uint8_t *p = buf;

	*out = NULL;
	if (!buf || len < RBQ_HDR + 4)
		return -EINVAL;
	uint32_t version = rd32(p + 4), dim = rd32(p + 8), D = rd32(p + 12);
	if (rd32(p) != RBQ_MAGIC || version < 1 || version > RBQ_VERSION || dim == 0 ||
	    dim > RBQ_MAX_DIM || D != pad_dim(dim) || rd32(p + 16) != RBQ_ROT_FHT_KAC ||
	    rd32(p + 20) != RBQ_ROUNDS)
		return -EINVAL;
	size_t nbits = (size_t)RBQ_ROUNDS * D / 8;
	size_t body = RBQ_HDR + nbits + center_bytes(version, D);
	if (len != body + 4 || rd32(p + body) != crc(p, body))
		return -EINVAL;
	uint64_t seed;
	memcpy(&seed, p + 24, 8);
	struct rbq *q = rbq_alloc(dim, seed, version);
	if (!q)
		return -ENOMEM;
	memcpy(q->bits, p + RBQ_HDR, nbits);
	for (uint32_t i = 0; q->center && i < D; i++) {
		memcpy(&q->center[i], p + RBQ_HDR + nbits + 4u * i, 4);
		if (!(fabsf(q->center[i]) <= RBQ_CENTER_MAX)) {   /* also NaN */
			rbq_free(q);
			return -EINVAL;
		}
	}
	rbq_finish(q);
	*out = q;
	return 0;
}

/* ---------------------------------------------------------------------------------------
 * Neighbour lists (layout in rabitq.h).
 */

size_t rbq_list_bytes(const struct rbq *q, uint32_t cap)
{
	return rbq_ipob_off(q, cap) + (q->version >= 2 ? 8u : 4u) * (size_t)cap;
}

void rbq_list_clear(const struct rbq *q, uint8_t *list, uint32_t cap)
{
	memset(list, 0, rbq_list_bytes(q, cap));
}

/* Byte of group g of slot's block, and the nibble shift of slot in it. */
static uint8_t *slot_byte0(const struct rbq *q, uint8_t *list, uint32_t slot, unsigned *shift)
{
	uint32_t j = slot % RBQ_BLOCK;
	*shift = j < 16 ? 0 : 4;
	return list + (size_t)(slot / RBQ_BLOCK) * rbq_block_bytes(q) + (j % 16);
}

void rbq_list_set(const struct rbq *q, uint8_t *list, uint32_t cap, uint32_t slot,
		  const float *u_rot, const float *v_rot)
{
	unsigned sh;
	uint8_t *b = slot_byte0(q, list, slot, &sh);
	uint8_t keep = sh ? 0x0f : 0xf0;
	double n2 = 0.0, n1 = 0.0, w = 0.0;   /* w: sqrt(D) <o_bar, u - c> */
	const float *c = q->center;

	for (uint32_t g = 0; g < q->D / 4; g++) {
		unsigned nib = 0;
		for (unsigned k = 0; k < 4; k++) {
			uint32_t i = 4 * g + k;
			float r = v_rot[i] - u_rot[i];
			n2 += (double)r * r;
			n1 += fabs((double)r);
			unsigned bit = r > 0.0f;
			nib |= bit << k;
			if (c)   /* +-(u - c) without a branch: the signs are random */
				w += (double)((float)(2 * (int)bit - 1) * (u_rot[i] - c[i]));
		}
		b[16 * g] = (uint8_t)((b[16 * g] & keep) | (nib << sh));
	}
	float norm = (float)sqrt(n2), ipob = 1.0f;
	if (n2 > 0.0 && isfinite(n2))
		ipob = (float)(n1 / (sqrt(n2) * sqrt((double)q->D)));
	else
		norm = 0.0f;
	rbq_stf(list + rbq_norm_off(q, cap) + 4u * slot, norm);
	rbq_stf(list + rbq_ipob_off(q, cap) + 4u * slot, ipob);
	if (c)
		rbq_stf(list + rbq_w_off(q, cap) + 4u * slot,
			isfinite(w) ? (float)(w / sqrt((double)q->D)) : 0.0f);
}

void rbq_list_move(const struct rbq *q, uint8_t *list, uint32_t cap, uint32_t dst,
		   uint32_t src)
{
	unsigned ssh, dsh;
	uint8_t *s = slot_byte0(q, list, src, &ssh), *d = slot_byte0(q, list, dst, &dsh);
	uint8_t keep = dsh ? 0x0f : 0xf0;

	if (dst == src)
		return;
	for (uint32_t g = 0; g < q->D / 4; g++) {
		unsigned nib = (s[16 * g] >> ssh) & 0x0fu;
		d[16 * g] = (uint8_t)((d[16 * g] & keep) | (nib << dsh));
	}
	size_t no = rbq_norm_off(q, cap), io = rbq_ipob_off(q, cap);
	memmove(list + no + 4u * dst, list + no + 4u * src, 4);
	memmove(list + io + 4u * dst, list + io + 4u * src, 4);
	if (q->center) {
		size_t wo = rbq_w_off(q, cap);
		memmove(list + wo + 4u * dst, list + wo + 4u * src, 4);
	}
}
