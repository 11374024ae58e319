/* test_distance.c: every distance kernel ISA the CPU has (scalar, avx2, avx512) against a
 * double-precision reference, on random inputs for all dims 1..300 and a sample up to 4096,
 * with vectors placed against a guard page (the masked tails must not read past the end)
 * and at unaligned addresses; and the sgemm batch path against the same reference. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/dm_hash.h"
#include <sys/mman.h>
#include <unistd.h>

#include "distance.h"

static uint64_t rng_state = DM_GOLDEN64;

static uint64_t rng_next(void)
{
	return dm_splitmix64(&rng_state);
}

/* Uniform in [-scale, scale). */
static float rnd(float scale)
{
	return (float)((double)(rng_next() >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale;
}

struct ref {
	double l2, dot, dot_abs, na, nb;
};

static struct ref reference(const float *a, const float *b, size_t dim)
{
	struct ref r = { 0 };
	for (size_t i = 0; i < dim; i++) {
		double d = (double)a[i] - (double)b[i];
		r.l2 += d * d;
		r.dot += (double)a[i] * b[i];
		r.dot_abs += fabs((double)a[i] * b[i]);
		r.na += (double)a[i] * a[i];
		r.nb += (double)b[i] * b[i];
	}
	r.na = sqrt(r.na);
	r.nb = sqrt(r.nb);
	return r;
}

/* Tolerance 1e-5 relative to the sum of the absolute values of the terms: the natural
 * scale of float rounding in a sum (a plain relative error is meaningless for a dot
 * product that cancels to ~0). For l2 the terms are all positive, so this is the plain
 * relative error. For cos the dot is divided by |a||b|, which scales the bound the same
 * way, plus an absolute float epsilon for the 1 - x. */
#define TOL 1e-5

/* Largest error seen, as a fraction of the tolerance scale (logged per ISA). */
static double worst_l2, worst_dot;

/* Checks all kernels of the active ISA on one pair. */
static void check_pair(const float *a, const float *b, size_t dim)
{
	struct ref r = reference(a, b, dim);
	const char *isa = dm_kernel_isa();
	double got;

	worst_l2 = DM_MAX(worst_l2, fabs(dm_l2sq(a, b, dim) - r.l2) / r.l2);
	worst_dot = DM_MAX(worst_dot, fabs(dm_dot(a, b, dim) - r.dot) / r.dot_abs);

	got = dm_l2sq(a, b, dim);
	cr_assert(fabs(got - r.l2) <= TOL * r.l2 + 1e-30, "%s l2 dim %zu: %.9g vs %.9g", isa,
		  dim, got, r.l2);
	got = dm_distance(DM_METRIC_L2, a, b, dim);
	cr_assert(fabs(got - r.l2) <= TOL * r.l2 + 1e-30, "%s dist l2 dim %zu", isa, dim);
	got = dm_dist_fn_for(DM_METRIC_L2)(a, b, dim);
	cr_assert(fabs(got - r.l2) <= TOL * r.l2 + 1e-30, "%s fn l2 dim %zu", isa, dim);

	got = dm_dot(a, b, dim);
	cr_assert(fabs(got - r.dot) <= TOL * r.dot_abs + 1e-30, "%s dot dim %zu: %.9g vs %.9g",
		  isa, dim, got, r.dot);
	got = dm_distance(DM_METRIC_IP, a, b, dim);
	cr_assert(fabs(got + r.dot) <= TOL * r.dot_abs + 1e-30, "%s ip dim %zu", isa, dim);
	got = dm_dist_fn_for(DM_METRIC_IP)(a, b, dim);
	cr_assert(fabs(got + r.dot) <= TOL * r.dot_abs + 1e-30, "%s fn ip dim %zu", isa, dim);

	got = dm_norm(a, dim);
	cr_assert(fabs(got - r.na) <= TOL * r.na, "%s norm dim %zu", isa, dim);

	double cos_ref = 1.0 - r.dot / (r.na * r.nb);
	double cos_tol = TOL * (r.dot_abs / (r.na * r.nb) + 1.0);
	got = dm_distance(DM_METRIC_COS, a, b, dim);
	cr_assert(fabs(got - cos_ref) <= cos_tol, "%s cos dim %zu: %.9g vs %.9g", isa, dim, got,
		  cos_ref);
}

/* The hot-path cos function expects normalised vectors and returns 1 - a.b. */
static void check_cos_normalised(float *a, float *b, size_t dim)
{
	cr_assert_eq(dm_normalize(a, dim), 0);
	cr_assert_eq(dm_normalize(b, dim), 0);
	struct ref r = reference(a, b, dim);
	double got = dm_dist_fn_for(DM_METRIC_COS)(a, b, dim);
	cr_assert(fabs(got - (1.0 - r.dot)) <= TOL * (r.dot_abs + 1.0), "%s fn cos dim %zu: %.9g vs %.9g",
		  dm_kernel_isa(), dim, got, 1.0 - r.dot);
	cr_assert(fabs(r.na - 1.0) < 1e-6);
}

static const size_t big_dims[] = { 301, 317, 383, 384, 511, 512, 513, 767, 768, 784, 960,
				   1000, 1023, 1024, 1025, 1536, 2047, 2048, 2049, 3000, 3071,
				   4095, 4096 };

#define PAGE 4096
#define MAXDIM 4096

/* A vector of dim floats ending exactly at a PROT_NONE guard page. */
struct guarded {
	unsigned char *base;
	size_t len;
};

static void guarded_map(struct guarded *g)
{
	g->len = MAXDIM * sizeof(float) + 2 * PAGE;  /* room for unaligned starts */
	g->base = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(g->base, MAP_FAILED);
	cr_assert_eq(mprotect(g->base + g->len - PAGE, PAGE, PROT_NONE), 0);
}

static float *guarded_vec(struct guarded *g, size_t dim)
{
	return (float *)(g->base + g->len - PAGE - dim * sizeof(float));
}

/* Runs the whole comparison for one ISA (skips if the CPU lacks it). */
static void check_isa(const char *isa)
{
	int r = dm_kernel_set_isa(isa);
	if (r == -ENOTSUP)
		cr_skip_test("this CPU does not support %s", isa);
	cr_assert_eq(r, 0, "dm_kernel_set_isa(%s) = %d", isa, r);
	cr_assert_str_eq(dm_kernel_isa(), isa);

	struct guarded ga, gb;
	guarded_map(&ga);
	guarded_map(&gb);
	size_t ndims = 300 + DM_ARRAY_SIZE(big_dims);
	for (size_t t = 0; t < ndims; t++) {
		size_t dim = t < 300 ? t + 1 : big_dims[t - 300];
		for (int trial = 0; trial < 3; trial++) {
			/* vary scale and offset so that l2 is not dominated by one regime */
			float sa = trial == 2 ? 100.0f : 1.0f, off = trial == 1 ? 0.5f : 0.0f;
			float *a = guarded_vec(&ga, dim), *b = guarded_vec(&gb, dim);
			/* also the floats before the vectors, read by the unaligned check */
			for (size_t i = 0; i < dim + 3; i++) {
				a[(ptrdiff_t)i - 3] = rnd(sa) + off;
				b[(ptrdiff_t)i - 3] = rnd(1.0f);
			}
			check_pair(a, b, dim);       /* ending at the guard page */
			check_pair(a - 1, b - 3, dim); /* unaligned, other tail */
			check_cos_normalised(a, b, dim);
		}
	}
	munmap(ga.base, ga.len);
	munmap(gb.base, gb.len);
	cr_log_info("%s: worst |error| / sum|terms|: l2 %.3g, dot %.3g (tolerance %g)", isa,
		    worst_l2, worst_dot, TOL);
}

Test(distance, scalar_matches_reference) { check_isa("scalar"); }
Test(distance, avx2_matches_reference) { check_isa("avx2"); }
Test(distance, avx512_matches_reference) { check_isa("avx512"); }

Test(distance, isa_selection)
{
	const char *best = dm_kernel_isa();
	cr_assert(strcmp(best, "scalar") == 0 || strcmp(best, "avx2") == 0 ||
		  strcmp(best, "avx512") == 0);
	cr_assert_eq(dm_kernel_set_isa("sse9"), -EINVAL);
	cr_assert_eq(dm_kernel_set_isa(NULL), -EINVAL);
	cr_assert_eq(dm_kernel_set_isa("scalar"), 0);
	cr_assert_str_eq(dm_kernel_isa(), "scalar");
	cr_log_info("kernel ISA selected at start-up: %s", best);
}

Test(distance, edge_cases)
{
	float z[8] = { 0 }, a[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	/* cos with a zero vector is defined as 1 (orthogonal), not NaN */
	cr_assert_float_eq(dm_distance(DM_METRIC_COS, z, a, 8), 1.0f, 0);
	cr_assert_float_eq(dm_distance(DM_METRIC_COS, a, a, 8), 0.0f, 1e-6);
	cr_assert_eq(dm_normalize(z, 8), -EINVAL);
	float inf[2] = { INFINITY, 1 };
	cr_assert_eq(dm_normalize(inf, 2), -EINVAL);
	/* huge but finite values normalise without overflow */
	float big[2] = { 3e38f, 3e38f };
	cr_assert_eq(dm_normalize(big, 2), 0);
	cr_assert_float_eq(big[0], (float)M_SQRT1_2, 1e-6);
	cr_assert_eq(dm_l2sq(a, a, 0), 0.0f);
}

Test(distance, metric_names)
{
	bool ok;
	cr_assert_eq(dm_metric_from_name("l2", &ok), DM_METRIC_L2);
	cr_assert(ok);
	cr_assert_eq(dm_metric_from_name("ip", &ok), DM_METRIC_IP);
	cr_assert(ok);
	cr_assert_eq(dm_metric_from_name("cosine", &ok), DM_METRIC_COS);
	cr_assert(ok);
	dm_metric_from_name("hamming", &ok);
	cr_assert(!ok);
	for (int m = 0; m < 3; m++) {
		cr_assert_eq(dm_metric_from_name(dm_metric_name((enum dm_metric)m), &ok), m);
		cr_assert(ok);
	}
}

/* Batch via sgemm. Tolerances: IP is one dot product, so the same 1e-5 x sum|terms| as
 * the kernels (sgemm accumulates in float too). L2 is computed as |q|^2 + |b|^2 - 2 q.b,
 * whose rounding error scales with the operands, not with the (possibly much smaller)
 * result: bound 1e-5 x (|q|^2 + |b|^2 + 2 sum|q_i b_i|). COS as for the kernels. With
 * random-sign rounding the observed error is ~sqrt(dim) x 6e-8 of that scale, i.e. below
 * 4e-6 at dim 4096, so 1e-5 holds with margin while still catching any real error. */
static void check_batch(enum dm_metric m, size_t nq, size_t nb, size_t dim, bool pre)
{
	float *q = malloc(nq * dim * sizeof(float)), *b = malloc(nb * dim * sizeof(float));
	float *out = malloc(nq * nb * sizeof(float)), *bn = malloc(nb * sizeof(float));
	cr_assert(q && b && out && bn);
	for (size_t i = 0; i < nq * dim; i++)
		q[i] = rnd(1.0f) + 0.25f;
	for (size_t i = 0; i < nb * dim; i++)
		b[i] = rnd(2.0f);
	for (size_t j = 0; j < nb; j++) {
		double s = 0;
		for (size_t d = 0; d < dim; d++)
			s += (double)b[j * dim + d] * b[j * dim + d];
		bn[j] = (float)s;
	}
	dm_distance_batch(m, q, nq, b, nb, dim, pre ? bn : NULL, out);
	double worst = 0;
	for (size_t i = 0; i < nq; i++)
		for (size_t j = 0; j < nb; j++) {
			struct ref r = reference(q + i * dim, b + j * dim, dim);
			double want, scale;
			switch (m) {
			case DM_METRIC_L2:
				want = r.l2;
				scale = r.na * r.na + r.nb * r.nb + 2 * r.dot_abs;
				break;
			case DM_METRIC_IP:
				want = -r.dot;
				scale = r.dot_abs;
				break;
			default:
				want = 1.0 - r.dot / (r.na * r.nb);
				scale = r.dot_abs / (r.na * r.nb) + 1.0;
				break;
			}
			double err = fabs(out[i * nb + j] - want);
			cr_assert(err <= TOL * scale, "batch %s nq %zu nb %zu dim %zu [%zu,%zu]: %.9g vs %.9g",
				  dm_metric_name(m), nq, nb, dim, i, j, out[i * nb + j], want);
			worst = DM_MAX(worst, err / scale);
		}
	cr_log_info("batch %s dim %zu: worst error / scale = %.3g", dm_metric_name(m), dim, worst);
	free(q);
	free(b);
	free(out);
	free(bn);
}

Test(distance, batch_matches_reference)
{
	static const size_t dims[] = { 1, 3, 17, 96, 128, 300, 784, 1025, 4096 };
	for (int m = 0; m < 3; m++)
		for (size_t d = 0; d < DM_ARRAY_SIZE(dims); d++) {
			size_t nb = dims[d] >= 1024 ? 40 : 1100;  /* > one 1024-column block */
			check_batch((enum dm_metric)m, 5, nb, dims[d], d % 2 == 0);
		}
	/* more queries than one 256-row block */
	check_batch(DM_METRIC_L2, 300, 20, 16, false);
	check_batch(DM_METRIC_COS, 300, 20, 16, true);
}

Test(distance, batch_zero_vectors)
{
	float q[4] = { 0 }, b[8] = { 1, 2, 3, 4, 0, 0, 0, 0 }, out[2];
	dm_distance_batch(DM_METRIC_COS, q, 1, b, 2, 4, NULL, out);
	cr_assert_eq(out[0], 1.0f);
	cr_assert_eq(out[1], 1.0f);
	dm_distance_batch(DM_METRIC_L2, b, 1, b, 2, 4, NULL, out);
	cr_assert_eq(out[0], 0.0f);
	cr_assert_float_eq(out[1], 30.0f, 1e-5);
}

/* Child side of env_forces_isa: only meaningful when started by it with DMANN_EXPECT_ISA. */
Test(distance, env_probe)
{
	const char *want = getenv("DMANN_EXPECT_ISA");
	if (!want)
		cr_skip_test("only run as a child of distance::env_forces_isa");
	cr_assert_str_eq(dm_kernel_isa(), want);
}

/* DMANN_ISA is read once at start-up, so check it in a fresh process: this test binary
 * re-run with a filter on env_probe. A wrong expectation must fail (proves the probe). */
Test(distance, env_forces_isa)
{
	static const char *isas[] = { "scalar", "avx2", "avx512" };
	char cmd[4608], self[4096];
	ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);  /* not the shell's */

	cr_assert(len > 0);
	self[len] = '\0';
	/* Criterion marks its sandboxed test processes with BXFI_MAP; the re-run must not
	 * inherit it or it would try to act as a sandbox child */
	unsetenv("BXFI_MAP");

	for (size_t i = 0; i < DM_ARRAY_SIZE(isas); i++) {
		if (dm_kernel_set_isa(isas[i]) != 0)
			continue;  /* not supported here */
		snprintf(cmd, sizeof(cmd),
			 "DMANN_ISA=%s DMANN_EXPECT_ISA=%s '%s' --filter='distance/env_probe' "
			 "--jobs=1 >/dev/null 2>&1", isas[i], isas[i], self);
		cr_assert_eq(system(cmd), 0, "DMANN_ISA=%s was not honoured", isas[i]);
	}
	snprintf(cmd, sizeof(cmd),
		 "DMANN_ISA=scalar DMANN_EXPECT_ISA=avx2 '%s' --filter='distance/env_probe' "
		 "--jobs=1 >/dev/null 2>&1", self);
	cr_assert_neq(system(cmd), 0, "the probe cannot detect a wrong ISA");
}

/* The node processes' BLAS setting: one thread per call unless OPENBLAS_NUM_THREADS says
 * otherwise (then it is left as the environment set it). */
Test(distance, blas_node_threads)
{
	const char *env = getenv("OPENBLAS_NUM_THREADS");
	int t = dm_blas_node_threads();

	if (!env)
		cr_assert_eq(t, 1, "%d BLAS threads, expected 1", t);
	else
		cr_assert_geq(t, 1);
	/* batched distances still right with one thread */
	float q[2 * 3] = { 1, 2, 3, 0, 0, 1 }, b[2 * 3] = { 1, 2, 3, 1, 0, 0 }, out[4];
	dm_distance_batch(DM_METRIC_L2, q, 2, b, 2, 3, NULL, out);
	cr_assert_float_eq(out[0], 0.0f, 1e-5);
	cr_assert_float_eq(out[1], 13.0f, 1e-5);
	cr_assert_float_eq(out[2], 9.0f, 1e-5);
	cr_assert_float_eq(out[3], 2.0f, 1e-5);
}
