/* test_rabitq.c: the RaBitQ quantizer and FastScan lists (common/quant/rabitq.h).
 *   - rotation: orthogonal (P P^T = I and P^T P = I within 1e-5), invertible, norm- and
 *     dot-preserving, deterministic (two trainings give identical bytes, and pinned golden
 *     checksums of the quantizer and of a rotated vector, so another machine must agree);
 *   - serialisation round trip; the loader refuses every truncation, every bit flip and
 *     every bad header field (with a valid checksum);
 *   - lists: setting or moving one slot leaves every other byte alone;
 *   - every ISA's estimates are bit-identical to the scalar ones, and a pair's estimate does
 *     not depend on its slot or on the list's capacity;
 *   - estimator on Gaussian-mixture data (dims 128, 384, 784; triples q, u, v with v a
 *     neighbour-like point of u's cluster): mean error ~0 (unbiased), small mean relative
 *     error, and the coverage of [est - bound, est + bound] at eps0 = 1.9 (printed), for
 *     l2, ip and cos. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "distance.h"
#include "quant/rabitq.h"

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double unif(void) { return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0; }

static float gauss(void)
{
	return (float)(sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif()));
}

static uint32_t crc(const void *p, size_t len)
{
	return (uint32_t)crc32_z(crc32_z(0, Z_NULL, 0), p, len);
}

static double ddot(const float *a, const float *b, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)a[i] * b[i];
	return s;
}

/* ---- rotation -------------------------------------------------------------------------- */

static void check_orthogonal(uint32_t dim)
{
	struct rbq *q = rbq_train(dim, NULL, 0, 1234);
	cr_assert_not_null(q);
	uint32_t D = rbq_dim_padded(q);
	cr_assert_eq(D % 64, 0);
	cr_assert(D >= dim && D < dim + 64);
	float *rows = calloc((size_t)D * D, sizeof(float)), *cols = calloc((size_t)dim * D, 4);
	float *e = calloc(D, sizeof(float));
	/* rows of P: P^T e_i (unrotate takes D floats); columns of P: P e_i for i < dim */
	for (uint32_t i = 0; i < D; i++) {
		memset(e, 0, sizeof(float) * D);
		e[i] = 1.0f;
		rbq_unrotate(q, e, rows + (size_t)i * D);
		if (i < dim)
			rbq_rotate(q, e, cols + (size_t)i * D);
	}
	/* consistency: column i of P = component i of every row */
	for (uint32_t i = 0; i < dim; i++)
		for (uint32_t j = 0; j < D; j++)
			cr_assert_float_eq(cols[(size_t)i * D + j], rows[(size_t)j * D + i], 1e-6,
					   "P e_i vs P^T e_j, dim %u", dim);
	double worst = 0;
	for (uint32_t i = 0; i < D; i++)
		for (uint32_t j = i; j < D; j++) {
			double d = ddot(rows + (size_t)i * D, rows + (size_t)j * D, D);
			worst = fmax(worst, fabs(d - (i == j)));
		}
	for (uint32_t i = 0; i < dim; i++)
		for (uint32_t j = i; j < dim; j++) {
			double d = ddot(cols + (size_t)i * D, cols + (size_t)j * D, D);
			worst = fmax(worst, fabs(d - (i == j)));
		}
	fprintf(stderr, "rabitq: dim %u D %u: max |P P^T - I|, |P^T P - I| = %.2e\n", dim, D,
		worst);
	cr_assert_lt(worst, 1e-5, "dim %u: orthogonality error %g", dim, worst);
	free(rows);
	free(cols);
	free(e);
	rbq_free(q);
}

Test(rabitq, rotation_orthogonal)
{
	check_orthogonal(128);   /* D power of two: no Kac step */
	check_orthogonal(100);
	check_orthogonal(384);
	check_orthogonal(784);
	check_orthogonal(1);
}

Test(rabitq, rotation_keeps_geometry)
{
	rng_state = 7;
	uint32_t dim = 300;
	struct rbq *q = rbq_train(dim, NULL, 0, 99);
	uint32_t D = rbq_dim_padded(q);
	float a[300], b[300], ra[512], rb[512], back[512];
	for (uint32_t i = 0; i < dim; i++) {
		a[i] = gauss();
		b[i] = gauss();
	}
	rbq_rotate(q, a, ra);
	rbq_rotate(q, b, rb);
	cr_assert_float_eq(ddot(ra, rb, D), ddot(a, b, dim), 1e-3);
	cr_assert_float_eq(ddot(ra, ra, D), ddot(a, a, dim), 1e-3);
	rbq_unrotate(q, ra, back);
	for (uint32_t i = 0; i < D; i++)
		cr_assert_float_eq(back[i], i < dim ? a[i] : 0.0f, 1e-5);
	/* in place */
	memcpy(back, a, sizeof(a));
	rbq_rotate(q, back, back);
	cr_assert_eq(memcmp(back, ra, sizeof(float) * D), 0);
	rbq_free(q);
}

Test(rabitq, deterministic)
{
	struct rbq *a = rbq_train(784, NULL, 0, 42), *b = rbq_train(784, NULL, 0, 42);
	struct rbq *c = rbq_train(784, NULL, 0, 43);
	size_t n = rbq_save_size(a);
	cr_assert_eq(n, rbq_save_size(b));
	uint8_t *ba = malloc(n), *bb = malloc(n), *bc = malloc(n);
	cr_assert_eq(rbq_save(a, ba, n), 0);
	cr_assert_eq(rbq_save(b, bb, n), 0);
	cr_assert_eq(rbq_save(c, bc, n), 0);
	cr_assert_eq(memcmp(ba, bb, n), 0, "same seed, same bytes");
	cr_assert_neq(memcmp(ba, bc, n), 0, "another seed, other bytes");
	/* golden values: any machine, compiler or ISA must produce exactly these */
	float x[784], y[832];
	for (int i = 0; i < 784; i++)
		x[i] = (float)((i * 37) % 101 - 50) / 16.0f;
	/* the checksum of all but the blob's own trailing crc (over the whole blob, any CRC-32
	 * gives the same residue constant, which checks nothing) */
	uint32_t cq = crc(ba, n - 4);
	fprintf(stderr, "rabitq: golden crc quantizer %08x\n", cq);
	cr_assert_eq(cq, 0xf94d58d3u, "quantizer bytes changed: %08x", cq);
	/* format 1 (images built before format 2): the bytes the previous code wrote */
	struct rbq *a1 = rbq_train_v1(784, NULL, 0, 42);
	size_t n1 = rbq_save_size(a1);
	uint8_t *b1 = malloc(n1);
	cr_assert_eq(n1, 452);
	cr_assert_eq(rbq_save(a1, b1, n1), 0);
	cr_assert_eq(crc(b1, n1 - 4), 0x333abfbeu, "format-1 bytes changed: %08x", crc(b1, n1 - 4));
	free(b1);
	rbq_free(a1);
	/* the rotation at every ISA this CPU has (SSE, AVX2, AVX-512 butterflies) */
	const char *orig = rbq_isa(), *isas[] = { "scalar", "avx2", "avx512" };
	for (int k = 0; k < 3; k++) {
		if (rbq_set_isa(isas[k]) == -ENOTSUP)
			continue;
		rbq_rotate(a, x, y);
		uint32_t cy = crc(y, sizeof(y));
		fprintf(stderr, "rabitq: golden crc rotated (%s) %08x\n", isas[k], cy);
		cr_assert_eq(cy, 0x3509ef56u, "rotation output changed (%s): %08x", isas[k], cy);
	}
	cr_assert_eq(rbq_set_isa(orig), 0);
	free(ba);
	free(bb);
	free(bc);
	rbq_free(a);
	rbq_free(b);
	rbq_free(c);
}

/* ---- serialisation ---------------------------------------------------------------------- */

static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static void refix_crc(uint8_t *buf, size_t n)
{
	wr32(buf + n - 4, crc(buf, n - 4));
}

static void check_save_load(struct rbq *a, uint32_t version);

Test(rabitq, save_load)
{
	/* format 2 with a centre from a sample, format 2 without one, format 1 */
	float *sample = malloc(sizeof(float) * 200 * 16);
	rng_state = 17;
	for (size_t i = 0; i < 200 * 16; i++)
		sample[i] = 3.0f + gauss();
	check_save_load(rbq_train(200, sample, 16, 5), 2);
	check_save_load(rbq_train(200, NULL, 0, 5), 2);
	check_save_load(rbq_train_v1(200, sample, 16, 5), 1);
	free(sample);
	cr_assert_null(rbq_train(0, NULL, 0, 1));
	cr_assert_eq(errno, EINVAL);
	cr_assert_null(rbq_train(RBQ_MAX_DIM + 1, NULL, 0, 1));
	float nan_row[4] = { 0, NAN, 0, 0 };
	cr_assert_null(rbq_train(4, nan_row, 1, 1));
}

static void check_save_load(struct rbq *a, uint32_t version)
{
	struct rbq *b = NULL;
	cr_assert_not_null(a);
	cr_assert_eq(rbq_version(a), version);
	size_t n = rbq_save_size(a);
	uint8_t *buf = malloc(n + 8), *buf2 = malloc(n);
	cr_assert_eq(rbq_save(a, buf, n - 1), -ENOSPC);
	cr_assert_eq(rbq_save(a, buf, n), 0);
	cr_assert_eq(rbq_load(buf, n, &b), 0);
	cr_assert_eq(rbq_dim(b), 200);
	cr_assert_eq(rbq_dim_padded(b), 256);
	cr_assert_eq(rbq_seed(b), 5);
	cr_assert_eq(rbq_version(b), version);
	cr_assert_eq(rbq_save(b, buf2, n), 0);
	cr_assert_eq(memcmp(buf, buf2, n), 0);
	rbq_free(b);

	for (size_t len = 0; len < n; len++) {
		cr_assert_eq(rbq_load(buf, len, &b), -EINVAL, "truncated to %zu", len);
		cr_assert_null(b);
	}
	cr_assert_eq(rbq_load(buf, n + 8, &b), -EINVAL, "trailing bytes");
	cr_assert_eq(rbq_load(NULL, n, &b), -EINVAL);
	for (size_t i = 0; i < n; i++)
		for (int bit = 0; bit < 8; bit += 3) {
			buf[i] ^= (uint8_t)(1u << bit);
			cr_assert_eq(rbq_load(buf, n, &b), -EINVAL, "flip byte %zu bit %d", i, bit);
			buf[i] ^= (uint8_t)(1u << bit);
		}
	/* bad fields behind a valid checksum */
	const struct { size_t off; uint32_t v; } bad[] = {
		{ 0, 0x31514253u }, { 4, 0 }, { 4, 3 }, { 4, version == 1 ? 2 : 1 }, { 8, 0 },
		{ 8, 4097 }, { 8, 100 }, { 12, 192 }, { 12, 0 }, { 16, 2 }, { 20, 3 },
		/* format 2: a non-finite first centre coordinate (at 32 + the sign bits); format
		 * 1: a bad magic again (there is no centre) */
		{ version == 2 ? 32 + 4 * 256 / 8 : 0, version == 2 ? 0x7fc00000u : 0 },
	};
	for (size_t k = 0; k < DM_ARRAY_SIZE(bad); k++) {
		memcpy(buf2, buf, n);
		wr32(buf2 + bad[k].off, bad[k].v);
		refix_crc(buf2, n);
		cr_assert_eq(rbq_load(buf2, n, &b), -EINVAL, "field at %zu = %u", bad[k].off,
			     bad[k].v);
	}
	memcpy(buf2, buf, n);
	refix_crc(buf2, n);
	cr_assert_eq(rbq_load(buf2, n, &b), 0);
	rbq_free(b);
	free(buf);
	free(buf2);
	rbq_free(a);
}

/* ---- lists ------------------------------------------------------------------------------ */

struct fixture {
	struct rbq *q;
	uint32_t dim, D, cap;
	float *u, *v;   /* rotated: u, and cap neighbours */
	uint8_t *list;
	size_t lb;
};

/* fmt 1: rbq_train_v1; 2: rbq_train with a sample (a centre away from 0) */
static void fixture_init_fmt(struct fixture *f, uint32_t dim, uint32_t cap, uint64_t seed,
			     uint32_t fmt)
{
	rng_state = seed;
	f->dim = dim;
	f->cap = cap;
	float *sample = malloc(sizeof(float) * dim * 8);
	for (size_t i = 0; i < (size_t)dim * 8; i++)
		sample[i] = 1.0f + gauss();
	f->q = fmt == 1 ? rbq_train_v1(dim, NULL, 0, seed) : rbq_train(dim, sample, 8, seed);
	free(sample);
	cr_assert_not_null(f->q);
	f->D = rbq_dim_padded(f->q);
	f->u = calloc(f->D, sizeof(float));
	f->v = calloc((size_t)cap * f->D, sizeof(float));
	float *x = calloc(dim, sizeof(float));
	for (uint32_t i = 0; i < dim; i++)
		x[i] = gauss();
	rbq_rotate(f->q, x, f->u);
	for (uint32_t s = 0; s < cap; s++) {
		float *y = calloc(dim, sizeof(float));
		for (uint32_t i = 0; i < dim; i++)
			y[i] = x[i] + 0.5f * gauss();
		rbq_rotate(f->q, y, f->v + (size_t)s * f->D);
		free(y);
	}
	free(x);
	f->lb = rbq_list_bytes(f->q, cap);
	f->list = malloc(f->lb);
	rbq_list_clear(f->q, f->list, cap);
	for (uint32_t s = 0; s < cap; s++)
		rbq_list_set(f->q, f->list, cap, s, f->u, f->v + (size_t)s * f->D);
}

static void fixture_init(struct fixture *f, uint32_t dim, uint32_t cap, uint64_t seed)
{
	fixture_init_fmt(f, dim, cap, seed, 2);
}

static void fixture_fini(struct fixture *f)
{
	free(f->u);
	free(f->v);
	free(f->list);
	rbq_free(f->q);
}

Test(rabitq, list_set_one_slot)
{
	struct fixture f;
	fixture_init(&f, 100, 40, 11);
	cr_assert_eq(f.lb, 2 * (size_t)f.D * 4 + 12 * 40);
	uint8_t *before = malloc(f.lb);
	float *w = calloc(f.D, sizeof(float));
	for (uint32_t i = 0; i < f.D; i++)
		w[i] = gauss();
	for (uint32_t slot = 0; slot < f.cap; slot++) {
		memcpy(before, f.list, f.lb);
		rbq_list_set(f.q, f.list, f.cap, slot, f.u, w);
		size_t changed = 0;
		for (size_t i = 0; i < f.lb; i++) {
			uint8_t d = before[i] ^ f.list[i];
			if (!d)
				continue;
			changed++;
			size_t norm_off = 2 * (size_t)f.D * 4, ip_off = norm_off + 4 * 40;
			size_t w_off = ip_off + 4 * 40;
			if (i >= w_off)
				cr_assert_eq((i - w_off) / 4, slot);
			else if (i >= ip_off)
				cr_assert_eq((i - ip_off) / 4, slot);
			else if (i >= norm_off)
				cr_assert_eq((i - norm_off) / 4, slot);
			else {
				size_t blk = i / ((size_t)f.D * 4), j = i % 16;
				unsigned lo = d & 0x0f, hi = d >> 4;
				cr_assert_eq(blk, slot / 32, "byte %zu of another block", i);
				if (lo)
					cr_assert_eq(j, slot % 32, "low nibble of slot %zu", blk * 32 + j);
				if (hi)
					cr_assert_eq(j + 16, slot % 32, "high nibble, slot %u", slot);
			}
		}
		cr_assert_gt(changed, 0);
		/* put it back: the list is exactly as it was */
		rbq_list_set(f.q, f.list, f.cap, slot, f.u, f.v + (size_t)slot * f.D);
		cr_assert_eq(memcmp(before, f.list, f.lb), 0);
	}
	/* move: slot 35 <- 3 gives the bytes of setting 35 from v[3] */
	memcpy(before, f.list, f.lb);
	rbq_list_move(f.q, f.list, f.cap, 35, 3);
	rbq_list_set(f.q, before, f.cap, 35, f.u, f.v + 3 * (size_t)f.D);
	cr_assert_eq(memcmp(before, f.list, f.lb), 0);
	free(before);
	free(w);
	fixture_fini(&f);
}

/* ---- ISAs ------------------------------------------------------------------------------- */

Test(rabitq, simd_equals_scalar)
{
	static const uint32_t dims[] = { 128, 100, 384, 784, 1500, 4096 };
	static const char *isas[] = { "scalar", "avx2", "avx512" };
	static const enum dm_metric ms[] = { DM_METRIC_L2, DM_METRIC_IP, DM_METRIC_COS };
	const char *orig = rbq_isa();
	for (size_t d = 0; d < DM_ARRAY_SIZE(dims); d++) {
		struct fixture f;
		fixture_init(&f, dims[d], 64, 100 + d);
		struct rbq_qctx *ctx = rbq_qctx_new(f.q);
		float *qr = calloc(f.D, sizeof(float));
		for (uint32_t i = 0; i < f.D; i++)
			qr[i] = f.u[i] + gauss();
		float ref[64], refl[64], e[64], l[64];
		for (size_t m = 0; m < 3; m++) {
			for (size_t k = 0; k < 3; k++) {
				int rc = rbq_set_isa(isas[k]);
				if (rc == -ENOTSUP) {
					fprintf(stderr, "rabitq: %s not on this CPU\n", isas[k]);
					continue;
				}
				cr_assert_eq(rc, 0);
				/* the tables are built by the ISA's code too */
				cr_assert_eq(rbq_prep(f.q, ctx, qr, f.u, ms[m]), 0);
				for (uint32_t n = 1; n <= 64; n += 21) {
					float *oe = k == 0 ? ref : e, *ol = k == 0 ? refl : l;
					rbq_list_estimate(f.q, ctx, f.list, 64, n, 3.0f, oe, ol);
					if (k)
						cr_assert_eq(memcmp(e, ref, 4 * n) | memcmp(l, refl, 4 * n), 0,
							     "%s vs scalar, dim %u n %u", isas[k], dims[d], n);
				}
				rbq_list_estimate(f.q, ctx, f.list, 64, 64, 3.0f, k ? e : ref,
						  k ? l : refl);
			}
		}
		free(qr);
		rbq_qctx_free(ctx);
		fixture_fini(&f);
	}
	cr_assert_eq(rbq_set_isa(orig), 0);
	cr_assert_eq(rbq_set_isa("sse9"), -EINVAL);
}

/* ---- estimator -------------------------------------------------------------------------- */

#define NCLUST 16
#define NEPS 3
#define TRIPLES 40   /* u per (dim, metric); 32 neighbours each, 8 queries each */

/* A Gaussian mixture: centres N(0, 1), points centre + N(0, sigma^2). */
static void mixture_point(const float *centres, uint32_t dim, uint32_t c, float sigma, float *x)
{
	for (uint32_t i = 0; i < dim; i++)
		x[i] = centres[(size_t)c * dim + i] + sigma * gauss();
}

/* fmt 1: format 1; 2: format 2 with the centre of 64 mixture points (tables per query) */
static void check_estimator_fmt(uint32_t dim, enum dm_metric m, uint32_t fmt)
{
	rng_state = 1000 + dim * 3 + m;
	float *centres = malloc(sizeof(float) * NCLUST * dim), *x = malloc(4 * (size_t)dim);
	for (size_t i = 0; i < (size_t)NCLUST * dim; i++)
		centres[i] = gauss();
	float *sample = malloc(sizeof(float) * 64 * dim);
	for (uint32_t t = 0; t < 64; t++) {
		mixture_point(centres, dim, (uint32_t)(rng_next() % NCLUST), 0.5f, sample + t * dim);
		if (m == DM_METRIC_COS)
			dm_normalize(sample + t * dim, dim);
	}
	struct rbq *q = fmt == 1 ? rbq_train_v1(dim, NULL, 0, 77) : rbq_train(dim, sample, 64, 77);
	free(sample);
	uint32_t D = rbq_dim_padded(q), cap = 32;
	struct rbq_qctx *ctx = rbq_qctx_new(q);
	float *u = malloc(4 * (size_t)D), *v = malloc(4 * (size_t)D * cap), *qr = malloc(4 * (size_t)D);
	uint8_t *list = malloc(rbq_list_bytes(q, cap));
	static const double eps[NEPS] = { 1.9, 2.6, 3.0 };
	double sum_err = 0, sum_abs = 0, sum_exact = 0;
	long covered[NEPS] = { 0 }, above_low = 0, total = 0;
	for (int t = 0; t < TRIPLES; t++) {
		uint32_t c = (uint32_t)(rng_next() % NCLUST);
		mixture_point(centres, dim, c, 0.5f, x);
		if (m == DM_METRIC_COS)
			dm_normalize(x, dim);
		rbq_rotate(q, x, u);
		for (uint32_t s = 0; s < cap; s++) {
			/* neighbours: same cluster, nearer than a random member */
			float *y = malloc(4 * (size_t)dim);
			for (uint32_t i = 0; i < dim; i++)
				y[i] = x[i] + 0.3f * gauss();
			if (m == DM_METRIC_COS)
				dm_normalize(y, dim);
			rbq_rotate(q, y, v + (size_t)s * D);
			rbq_list_set(q, list, cap, s, u, v + (size_t)s * D);
			free(y);
		}
		for (int k = 0; k < 8; k++) {
			/* queries: from the mixture, half of them from u's cluster */
			uint32_t qc = k < 4 ? c : (uint32_t)(rng_next() % NCLUST);
			mixture_point(centres, dim, qc, 0.5f, x);
			if (m == DM_METRIC_COS)
				dm_normalize(x, dim);
			rbq_rotate(q, x, qr);
			float dqu = dm_distance(m == DM_METRIC_COS ? DM_METRIC_IP : m, qr, u, D);
			if (m == DM_METRIC_COS)
				dqu += 1.0f;
			cr_assert_eq(rbq_prep(q, ctx, qr, u, m), 0);
			float est[32], low[32];
			rbq_list_estimate(q, ctx, list, cap, cap, dqu, est, low);
			for (uint32_t s = 0; s < cap; s++) {
				const float *vs = v + (size_t)s * D;
				double ex = m == DM_METRIC_L2 ? 0 : ddot(qr, vs, D);
				if (m == DM_METRIC_L2)
					for (uint32_t i = 0; i < D; i++)
						ex += ((double)qr[i] - vs[i]) * ((double)qr[i] - vs[i]);
				else
					ex = m == DM_METRIC_IP ? -ex : 1.0 - ex;
				/* bound at eps0 = 1.9 (the context's); others scale with eps0 */
				double bound = est[s] - low[s], err = ex - est[s];
				cr_assert_geq(bound, 0.0);
				for (int e = 0; e < NEPS; e++)
					covered[e] += fabs(err) <= bound * eps[e] / 1.9;
				above_low += ex >= low[s];
				total++;
				sum_err += est[s] - ex;
				sum_exact += fabs(ex);
				sum_abs += fabs(est[s] - ex);
			}
		}
	}
	double cov[NEPS], bias = sum_err / sum_exact, mre = sum_abs / sum_exact;
	for (int e = 0; e < NEPS; e++)
		cov[e] = (double)covered[e] / total;
	fprintf(stderr, "rabitq: format %u dim %4u %-3s: %ld estimates, mean |err| %.4f and bias "
		"%+.5f of mean |d|; coverage of est +- bound at eps0 1.9: %.2f%% (exact >= lower: "
		"%.2f%%), 2.6: %.2f%%, 3.0: %.2f%%\n", fmt, dim, dm_metric_name(m), total, mre, bias,
		cov[0] * 100.0, 100.0 * above_low / total, cov[1] * 100.0, cov[2] * 100.0);
	cr_assert_lt(fabs(bias), 0.01, "dim %u %s: biased (%g)", dim, dm_metric_name(m), bias);
	cr_assert_lt(mre, 0.1, "dim %u %s: mean error %g", dim, dm_metric_name(m), mre);
	/* theory (the error is ~ N(0, sigma^2) with bound = eps0 sigma): 94.3% at 1.9, 99.1%
	 * at 2.6, 99.7% at 3.0 */
	cr_assert_geq(cov[0], 0.93, "dim %u %s: coverage %.4f", dim, dm_metric_name(m), cov[0]);
	cr_assert_geq(cov[1], 0.985, "dim %u %s: coverage %.4f", dim, dm_metric_name(m), cov[1]);
	cr_assert_geq(cov[2], 0.99, "dim %u %s: coverage %.4f", dim, dm_metric_name(m), cov[2]);
	free(centres);
	free(x);
	free(u);
	free(v);
	free(qr);
	free(list);
	rbq_qctx_free(ctx);
	rbq_free(q);
}

static void check_estimator(uint32_t dim, enum dm_metric m)
{
	check_estimator_fmt(dim, m, 2);
	check_estimator_fmt(dim, m, 1);
}

Test(rabitq, estimator_l2) { check_estimator(128, DM_METRIC_L2); check_estimator(384, DM_METRIC_L2); check_estimator(784, DM_METRIC_L2); }
Test(rabitq, estimator_ip) { check_estimator(128, DM_METRIC_IP); check_estimator(384, DM_METRIC_IP); check_estimator(784, DM_METRIC_IP); }
Test(rabitq, estimator_cos) { check_estimator(128, DM_METRIC_COS); check_estimator(384, DM_METRIC_COS); check_estimator(784, DM_METRIC_COS); }

static void check_exact_cases(uint32_t fmt);

Test(rabitq, exact_cases)
{
	check_exact_cases(1);
	check_exact_cases(2);
}

static void check_exact_cases(uint32_t fmt)
{
	struct fixture f;
	fixture_init_fmt(&f, 64, 32, 3, fmt);
	struct rbq_qctx *ctx = rbq_qctx_new(f.q);
	float est[32], low[32];
	/* v == u: distance of u, bound 0 */
	rbq_list_set(f.q, f.list, 32, 5, f.u, f.u);
	cr_assert_eq(rbq_prep(f.q, ctx, f.v, f.u, DM_METRIC_L2), 0);
	rbq_list_estimate(f.q, ctx, f.list, 32, 32, 2.5f, est, low);
	cr_assert_eq(est[5], 2.5f);
	cr_assert_eq(low[5], 2.5f);
	/* eps0 = 0: lower == est; NULL lower allowed */
	cr_assert_eq(rbq_qctx_set_eps0(ctx, 0.0f), 0);
	rbq_list_estimate(f.q, ctx, f.list, 32, 32, 2.5f, est, low);
	for (int s = 0; s < 32; s++)
		cr_assert_eq(est[s], low[s]);
	rbq_list_estimate(f.q, ctx, f.list, 32, 7, 2.5f, est, NULL);
	cr_assert_eq(rbq_qctx_set_eps0(ctx, -1.0f), -EINVAL);
	cr_assert_eq(rbq_qctx_set_eps0(ctx, NAN), -EINVAL);
	cr_assert_eq(rbq_prep(f.q, ctx, f.v, f.u, (enum dm_metric)7), -EINVAL);
	/* query == u: q' = 0, every estimate exact (format 1); format 2 builds its tables
	 * from q - c, so only their rounding remains: inside the bound, which is that
	 * rounding's term alone (|q'| = 0) */
	cr_assert_eq(rbq_qctx_set_eps0(ctx, RBQ_EPS0_DEFAULT), 0);
	cr_assert_eq(rbq_prep(f.q, ctx, f.u, f.u, DM_METRIC_L2), 0);
	rbq_list_estimate(f.q, ctx, f.list, 32, 32, 0.0f, est, low);
	for (int s = 0; s < 32; s++) {
		double ex = 0;
		for (uint32_t i = 0; i < f.D; i++) {
			double d = (double)f.u[i] - f.v[(size_t)s * f.D + i];
			ex += d * d;
		}
		if (s == 5)
			continue;
		if (fmt == 1)
			cr_assert_float_eq(est[s], ex, 1e-3 * ex);
		else
			cr_assert(fabs(est[s] - ex) <= 2.0 * (est[s] - low[s]) + 1e-4 * ex,
				  "slot %d: est %g exact %g bound %g", s, est[s], ex, est[s] - low[s]);
	}
	cr_assert_eq(rbq_prep_per_query(f.q, DM_METRIC_L2), fmt == 2);
	cr_assert(rbq_prep_per_query(f.q, DM_METRIC_IP));
	/* ip: the context does not depend on u (u_rot may be NULL) */
	float e2[32];
	cr_assert_eq(rbq_prep(f.q, ctx, f.v, f.u, DM_METRIC_IP), 0);
	rbq_list_estimate(f.q, ctx, f.list, 32, 32, -1.0f, est, low);
	cr_assert_eq(rbq_prep(f.q, ctx, f.v, NULL, DM_METRIC_IP), 0);
	rbq_list_estimate(f.q, ctx, f.list, 32, 32, -1.0f, e2, NULL);
	cr_assert_eq(memcmp(est, e2, sizeof(e2)), 0);
	rbq_qctx_free(ctx);
	fixture_fini(&f);
}

/* The estimate of (u, v) does not depend on the list it sits in: slot s of a 33-slot list
 * (two blocks, a partial last vector) equals a 1-slot list holding the same pair. */
Test(rabitq, estimate_independent_of_slot)
{
	struct fixture f;
	fixture_init(&f, 200, 33, 21);
	struct rbq_qctx *ctx = rbq_qctx_new(f.q);
	size_t lb1 = rbq_list_bytes(f.q, 1);
	uint8_t *one = malloc(lb1);
	rbq_list_clear(f.q, one, 1);
	float *qr = calloc(f.D, sizeof(float)), est[33], low[33], e1, l1;
	for (uint32_t i = 0; i < f.D; i++)
		qr[i] = f.u[i] + gauss();
	static const enum dm_metric ms[] = { DM_METRIC_L2, DM_METRIC_IP, DM_METRIC_COS };
	for (size_t m = 0; m < 3; m++) {
		cr_assert_eq(rbq_prep(f.q, ctx, qr, f.u, ms[m]), 0);
		rbq_list_estimate(f.q, ctx, f.list, 33, 33, 1.5f, est, low);
		for (uint32_t s = 0; s < 33; s++) {
			rbq_list_set(f.q, one, 1, 0, f.u, f.v + (size_t)s * f.D);
			rbq_list_estimate(f.q, ctx, one, 1, 1, 1.5f, &e1, &l1);
			cr_assert(e1 == est[s] && l1 == low[s], "slot %u: %g/%g vs %g/%g", s, e1, l1,
				  est[s], low[s]);
		}
	}
	free(one);
	free(qr);
	rbq_qctx_free(ctx);
	fixture_fini(&f);
}
