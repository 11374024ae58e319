/* hnsw_util.c: HNSW index allocation, parameter checks, level draws, the distance kernels of
 * the graph hot path, CRC32C of records, heaps and the visited set. */
#include "hnsw_int.h"
#include "hnsw_upq.h"
#include "util/dm_hash.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Validate build parameters; a message goes to err. */
int hnsw_params_check(const struct hnsw_params *p, char *err, size_t errlen)
{
	if (p->dim == 0 || p->dim > 65536) {
		snprintf(err, errlen, "dimension %u out of range 1..65536", p->dim);
		return -EINVAL;
	}
	if (p->metric != DM_METRIC_L2 && p->metric != DM_METRIC_IP && p->metric != DM_METRIC_COS) {
		snprintf(err, errlen, "unknown metric %d", (int)p->metric);
		return -EINVAL;
	}
	if (p->M < 2 || p->M > HNSW_MAX_M) {
		snprintf(err, errlen, "M=%u out of range 2..%u", p->M, HNSW_MAX_M);
		return -EINVAL;
	}
	if (p->ef_construction < 1 || p->ef_construction > 100000) {
		snprintf(err, errlen, "efConstruction=%u out of range 1..100000", p->ef_construction);
		return -EINVAL;
	}
	if (p->block_shift < 6 || p->block_shift > 20) {
		snprintf(err, errlen, "block_shift=%u out of range 6..20", p->block_shift);
		return -EINVAL;
	}
	if (p->codes != HNSW_CODES_NONE && p->codes != HNSW_CODES_RABITQ) {
		snprintf(err, errlen, "unknown code kind %d", (int)p->codes);
		return -EINVAL;
	}
	return 0;
}

/* Allocate an index with zeroed records for n nodes. */
struct hnsw_index *hnsw_alloc(const struct hnsw_params *p, uint32_t n, struct hnsw_quant *quant)
{
	char msg[128];
	if (hnsw_params_check(p, msg, sizeof(msg)) < 0) {
		errno = EINVAL;
		return NULL;
	}
	struct hnsw_index *idx = calloc(1, sizeof(*idx));
	if (!idx)
		return NULL;
	idx->p = *p;
	idx->n = n;
	idx->code_bytes = quant ? hnsw_quant_list_bytes(quant, p->M) : 0;
	idx->vdim = quant ? hnsw_quant_vdim(quant) : p->dim;
	idx->vec_off = hnsw_rec_vec_off(p->M, idx->code_bytes);
	idx->rec_size = hnsw_rec_size(p->M, idx->vdim, idx->code_bytes);
	idx->max_level = -1;
	idx->kern = hnsw_kernel_for(p->metric);
	pthread_mutex_init(&idx->glock, NULL);
	uint32_t per = 1u << p->block_shift;
	idx->nblocks = n ? (uint32_t)(((uint64_t)n + per - 1) / per) : 0;
	idx->blocks = calloc(idx->nblocks ? idx->nblocks : 1, sizeof(*idx->blocks));
	idx->upl = calloc(n ? n : 1, sizeof(*idx->upl));
	if (!idx->blocks || !idx->upl)
		goto err_free_idx;
	for (uint32_t b = 0; b < idx->nblocks; b++) {
		/* the last block holds only the records that exist: a header cannot make us
		 * allocate (and zero) a whole 2^20-record block for one record */
		size_t nrec = DM_MIN((uint64_t)per, (uint64_t)n - (uint64_t)b * per);
		size_t len = DM_ALIGN_UP(nrec * idx->rec_size, HNSW_REC_ALIGN);
		idx->blocks[b] = aligned_alloc(HNSW_REC_ALIGN, len);
		if (!idx->blocks[b])
			goto err_free_idx;
		memset(idx->blocks[b], 0, len);
	}
	idx->quant = quant;
	return idx;

err_free_idx:
	hnsw_free(idx);
	errno = ENOMEM;
	return NULL;
}

void hnsw_free(struct hnsw_index *idx)
{
	if (!idx)
		return;
	if (idx->blocks)
		for (uint32_t b = 0; b < idx->nblocks; b++)
			free(idx->blocks[b]);
	free(idx->blocks);
	free(idx->upl);
	free(idx->up_store);
	free(idx->locks);
	free(idx->labels);
	hnsw_quant_free(idx->quant);
	hnsw_upq_free(idx->upq);
	pthread_mutex_destroy(&idx->glock);
	free(idx);
}

/* splitmix64 output for state x (util/dm_hash.h): a good 64-bit mix for per-id draws. */
static inline uint64_t mix64(uint64_t x)
{
	return dm_hash64(x);
}

uint32_t hnsw_draw_level(uint64_t seed, uint32_t id, uint32_t M)
{
	uint64_t r = mix64(seed ^ mix64(id));
	/* U in (0, 1]: 53 random bits, never 0 so the log is finite. */
	double u = ((double)(r >> 11) + 1.0) * (1.0 / 9007199254740992.0);
	double l = -log(u) / log((double)M);
	return l >= HNSW_MAX_LEVEL ? HNSW_MAX_LEVEL : (uint32_t)l;
}

/* ---- kernels ------------------------------------------------------------------------------
 * The graph calls one distance per neighbour through one function pointer; these AVX-512 and
 * AVX+FMA versions (two accumulators, no further dispatch) are used when the CPU has them,
 * else the portable kernels of distance.h. */

__attribute__((target("avx,fma"))) static inline float hsum256(__m256 v)
{
	__m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
	lo = _mm_add_ps(lo, hi);
	lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
	lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
	return _mm_cvtss_f32(lo);
}

__attribute__((target("avx,fma"))) static float l2_avx(const float *a, const float *b, size_t d)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	size_t i = 0;
	for (; i + 16 <= d; i += 16) {
		__m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
		__m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));
		s0 = _mm256_fmadd_ps(d0, d0, s0);
		s1 = _mm256_fmadd_ps(d1, d1, s1);
	}
	if (i + 8 <= d) {
		__m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
		s0 = _mm256_fmadd_ps(d0, d0, s0);
		i += 8;
	}
	float s = hsum256(_mm256_add_ps(s0, s1));
	for (; i < d; i++) {
		float t = a[i] - b[i];
		s += t * t;
	}
	return s;
}

__attribute__((target("avx,fma"))) static float negdot_avx(const float *a, const float *b, size_t d)
{
	__m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
	size_t i = 0;
	for (; i + 16 <= d; i += 16) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
		s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
	}
	if (i + 8 <= d) {
		s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
		i += 8;
	}
	float s = hsum256(_mm256_add_ps(s0, s1));
	for (; i < d; i++)
		s += a[i] * b[i];
	return -s;
}

__attribute__((target("avx512f"))) static float l2_avx512(const float *a, const float *b, size_t d)
{
	__m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
	size_t i = 0;
	for (; i + 32 <= d; i += 32) {
		__m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
		__m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16));
		s0 = _mm512_fmadd_ps(d0, d0, s0);
		s1 = _mm512_fmadd_ps(d1, d1, s1);
	}
	if (i < d) {
		/* masked tail: up to two 16-lane steps */
		for (; i < d; i += 16) {
			__mmask16 m = d - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - i)) - 1);
			__m512 t = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
			s0 = _mm512_fmadd_ps(t, t, s0);
		}
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

__attribute__((target("avx512f"))) static float negdot_avx512(const float *a, const float *b, size_t d)
{
	__m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
	size_t i = 0;
	for (; i + 32 <= d; i += 32) {
		s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
		s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
	}
	for (; i < d; i += 16) {
		__mmask16 m = d - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - i)) - 1);
		s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
	}
	return -_mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

static float negdot_generic(const float *a, const float *b, size_t d)
{
	return -dm_dot(a, b, d);
}

hnsw_kernel_fn hnsw_kernel_for(enum dm_metric m)
{
	/* DMANN_ISA=scalar|avx2 caps the choice as for the kernels of distance.h (tests) */
	const char *force = getenv("DMANN_ISA");
	int cap = !force ? 2 : !strcmp(force, "scalar") ? 0 : !strcmp(force, "avx2") ? 1 : 2;
	bool avx512 = cap >= 2 && __builtin_cpu_supports("avx512f");
	bool avx = cap >= 1 && __builtin_cpu_supports("avx") && __builtin_cpu_supports("fma");
	if (m == DM_METRIC_L2)
		return avx512 ? l2_avx512 : avx ? l2_avx : dm_l2sq;
	return avx512 ? negdot_avx512 : avx ? negdot_avx : negdot_generic;
}

/* ---- CRC32C ------------------------------------------------------------------------------ */

#ifndef __SSE4_2__
static uint32_t crc32c_table[256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

static void crc32c_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		crc32c_table[i] = c;
	}
}
#endif

uint32_t hnsw_crc32c(uint32_t crc, const void *p, size_t len)
{
	const unsigned char *c = p;
	crc = ~crc;
#ifdef __SSE4_2__
	uint64_t x = crc;
	for (; len >= 8; len -= 8, c += 8) {
		uint64_t w;
		memcpy(&w, c, 8);
		x = __builtin_ia32_crc32di(x, w);
	}
	crc = (uint32_t)x;
	for (; len; len--)
		crc = __builtin_ia32_crc32qi(crc, *c++);
#else
	pthread_once(&crc32c_once, crc32c_init);
	for (; len; len--)
		crc = crc32c_table[(crc ^ *c++) & 0xff] ^ (crc >> 8);
#endif
	return ~crc;
}

/* ---- heaps and visited set --------------------------------------------------------------- */

int hnsw_heap_init(struct hnsw_heap *h, uint32_t cap)
{
	h->n = 0;
	h->cap = cap ? cap : 16;
	h->a = malloc((size_t)h->cap * sizeof(*h->a));
	return h->a ? 0 : -ENOMEM;
}

void hnsw_heap_fini(struct hnsw_heap *h)
{
	free(h->a);
	h->a = NULL;
	h->n = h->cap = 0;
}

int hnsw_heap_reserve(struct hnsw_heap *h, uint32_t need)
{
	if (need <= h->cap)
		return 0;
	uint32_t cap = h->cap;
	while (cap < need)
		cap *= 2;
	struct hnsw_cand *a = realloc(h->a, (size_t)cap * sizeof(*a));
	if (!a)
		return -ENOMEM;
	h->a = a;
	h->cap = cap;
	return 0;
}

int hnsw_visited_init(struct hnsw_visited *v, uint32_t n)
{
	v->n = n;
	v->epoch = 0;
	v->tag = calloc(n ? n : 1, sizeof(*v->tag));
	return v->tag ? 0 : -ENOMEM;
}

void hnsw_visited_fini(struct hnsw_visited *v)
{
	free(v->tag);
	v->tag = NULL;
	v->n = 0;
}

int hnsw_visited_reserve(struct hnsw_visited *v, uint32_t n)
{
	if (n <= v->n)
		return 0;
	uint16_t *t = realloc(v->tag, (size_t)n * sizeof(*t));
	if (!t)
		return -ENOMEM;
	memset(t + v->n, 0, (size_t)(n - v->n) * sizeof(*t));
	v->tag = t;
	v->n = n;
	return 0;
}
