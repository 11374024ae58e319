/* test_oracle.c: the oracle (oracle/): bit-identical centroids across runs, processes,
 * OpenBLAS thread counts and kernels; balance; predictor; semantic ring; 2-opt; CSP.
 *
 * Cross-process determinism: the test re-executes this binary (/proc/self/exe) with
 * DM_ORACLE_TEST_DUMP=<file> and the OpenBLAS / kernel environment under test. OpenBLAS reads
 * OPENBLAS_NUM_THREADS and OPENBLAS_CORETYPE in its library constructor, so setenv() in a
 * forked child would come too late; a fresh exec is the only reliable way. The constructor
 * below (run after the shared libraries' constructors, before Criterion's main) builds the
 * oracle, writes the BLAS thread count, core name and the model to the file and exits.
 */
#include <criterion/criterion.h>

#include "oracle.h"
#include "distance.h"
#include "util/dm_hash.h"

#include <cblas.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "test_rng.h"

extern char **environ;

/* ---- test data ---------------------------------------------------------------------------- */

/* lcg, u01, normal: test_rng.h */

/* The determinism sample: big enough that OpenBLAS sgemm actually splits work over threads
 * (512-row blocks x 64 centroids x 96 dims). */
#define DN 6000
#define DDIM 96
#define DK 8

static struct dm_oracle *det_build(enum dm_oracle_algo algo)
{
	struct dm_oracle_params p;
	float *x = rng_mixture(42, DN, DDIM, 20, 6.0, NULL, NULL);
	dm_oracle_params_default(&p, DK);
	p.algo = algo;
	p.seed = 7;
	p.max_doublings = 3;
	struct dm_oracle *o = dm_oracle_build(x, DN, DDIM, &p);
	free(x);
	return o;
}

/* Serialise everything clustering decides (fine centroids, groups, biases, group
 * centroids, sizes, ring) to a buffer; returns its size. */
static size_t model_bytes(const struct dm_oracle *o, unsigned char **out)
{
	size_t nf = o->nfine, k = o->k, dim = o->dim;
	size_t sz = nf * dim * 4 + nf * 4 + nf * 4 + k * dim * 4 + k * 8 + k * 4 + 8, off = 0;
	unsigned char *b = malloc(sz);
	cr_assert(b);
#define PUT(p, len) do { memcpy(b + off, (p), (len)); off += (len); } while (0)
	PUT(o->fine, nf * dim * 4);
	PUT(o->fine_group, nf * 4);
	PUT(o->bias, nf * 4);
	PUT(o->centroids, k * dim * 4);
	PUT(o->sizes, k * 8);
	PUT(o->ring, k * 4);
	PUT(&o->sse, 8);
#undef PUT
	*out = b;
	return sz;
}

/* Child mode: DM_ORACLE_TEST_DUMP=<path> DM_ORACLE_TEST_ALGO=<0|1>. */
__attribute__((constructor)) static void dump_child(void)
{
	const char *path = getenv("DM_ORACLE_TEST_DUMP");
	if (!path)
		return;
	/* the kernel selector in common/distance.c is a constructor too, and the order of
	 * constructors within one executable is unspecified: select explicitly, the way it
	 * does (DMANN_ISA, else the best the CPU supports) */
	const char *want = getenv("DMANN_ISA");
	if (want && *want) {
		if (dm_kernel_set_isa(want) != 0)
			_exit(4);
	} else if (dm_kernel_set_isa("avx512") != 0 && dm_kernel_set_isa("avx2") != 0) {
		dm_kernel_set_isa("scalar");
	}
	const char *a = getenv("DM_ORACLE_TEST_ALGO");
	struct dm_oracle *o = det_build(a && a[0] == '1' ? DM_ORACLE_DOUBLING : DM_ORACLE_CONSTRAINED);
	FILE *f = fopen(path, "wb");
	if (!o || !f)
		_exit(2);
	unsigned char *b;
	size_t n = model_bytes(o, &b);
	int threads = openblas_get_num_threads();
	char core[32] = { 0 };
	snprintf(core, sizeof(core), "%s", openblas_get_corename());
	char isa[16] = { 0 };
	snprintf(isa, sizeof(isa), "%s", dm_kernel_isa());
	fwrite(&threads, sizeof(threads), 1, f);
	fwrite(core, sizeof(core), 1, f);
	fwrite(isa, sizeof(isa), 1, f);
	fwrite(b, 1, n, f);
	free(b);
	dm_oracle_free(o);
	_exit(fclose(f) == 0 ? 0 : 3);
}

struct dump {
	int threads;
	char core[32];
	char isa[16];
	unsigned char *model;
	size_t len;
};

/* Re-exec this binary with extra environment entries; read the child's dump. */
static void run_child(const char *const *extra, int algo, struct dump *d)
{
	char path[] = "/tmp/dm_oracle_dumpXXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	close(fd);

	size_t ne = 0;
	while (environ[ne])
		ne++;
	char **env = calloc(ne + 8, sizeof(char *));
	char dumpvar[64], algovar[32];
	size_t m = 0;
	cr_assert(env);
	for (size_t i = 0; i < ne; i++) {
		/* drop whatever we set explicitly */
		if (!strncmp(environ[i], "OPENBLAS_", 9) || !strncmp(environ[i], "DMANN_ISA=", 10) ||
		    !strncmp(environ[i], "OMP_NUM_THREADS=", 16) ||
		    !strncmp(environ[i], "DM_ORACLE_TEST_", 15))
			continue;
		env[m++] = environ[i];
	}
	snprintf(dumpvar, sizeof(dumpvar), "DM_ORACLE_TEST_DUMP=%s", path);
	snprintf(algovar, sizeof(algovar), "DM_ORACLE_TEST_ALGO=%d", algo);
	env[m++] = dumpvar;
	env[m++] = algovar;
	for (size_t i = 0; extra[i]; i++)
		env[m++] = (char *)extra[i];
	env[m] = NULL;

	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		char *argv[] = { "test_oracle", NULL };
		execve("/proc/self/exe", argv, env);
		_exit(127);
	}
	int st;
	cr_assert(waitpid(pid, &st, 0) == pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: status %d", st);
	free(env);

	FILE *f = fopen(path, "rb");
	cr_assert(f);
	cr_assert(fread(&d->threads, sizeof(d->threads), 1, f) == 1);
	cr_assert(fread(d->core, sizeof(d->core), 1, f) == 1);
	cr_assert(fread(d->isa, sizeof(d->isa), 1, f) == 1);
	d->model = malloc(1 << 22);
	cr_assert(d->model);
	d->len = fread(d->model, 1, 1 << 22, f);
	fclose(f);
	unlink(path);
}

/* ---- determinism -------------------------------------------------------------------------- */

static void same_twice(enum dm_oracle_algo algo)
{
	struct dm_oracle *a = det_build(algo), *b = det_build(algo);
	unsigned char *ba, *bb;
	cr_assert(a && b);
	size_t la = model_bytes(a, &ba), lb = model_bytes(b, &bb);
	cr_assert_eq(la, lb);
	cr_assert(memcmp(ba, bb, la) == 0, "models differ between two builds in one process");
	/* the data has near-ties that BLAS alone could not settle: the exact path is exercised */
	cr_assert_gt(a->exact_rechecks, 0);
	cr_log_info("algo %d: %u assignments settled by exact re-evaluation", algo,
		    a->exact_rechecks);
	free(ba);
	free(bb);
	dm_oracle_free(a);
	dm_oracle_free(b);
}

Test(oracle, deterministic_in_process)
{
	same_twice(DM_ORACLE_CONSTRAINED);
	same_twice(DM_ORACLE_DOUBLING);
}

/* A pace callback (a background fit sleeping between blocks of work) is called, and the
 * model does not depend on it. */
static void count_pace(void *arg)
{
	(*(unsigned *)arg)++;
}

Test(oracle, pace_called_and_model_unchanged)
{
	for (int algo = 0; algo < 2; algo++) {
		struct dm_oracle_params p;
		float *x = rng_mixture(42, DN, DDIM, 20, 6.0, NULL, NULL);
		unsigned calls = 0;
		unsigned char *ba, *bb;

		dm_oracle_params_default(&p, DK);
		p.algo = (enum dm_oracle_algo)algo;
		p.seed = 7;
		p.max_doublings = 3;
		struct dm_oracle *a = dm_oracle_build(x, DN, DDIM, &p);
		p.pace = count_pace;
		p.pace_arg = &calls;
		struct dm_oracle *b = dm_oracle_build(x, DN, DDIM, &p);
		cr_assert(a && b);
		cr_assert_gt(calls, 10, "pace called %u times (algo %d)", calls, algo);
		size_t la = model_bytes(a, &ba), lb = model_bytes(b, &bb);
		cr_assert(la == lb && memcmp(ba, bb, la) == 0, "the pace changed the model (algo %d)",
			  algo);
		free(ba);
		free(bb);
		dm_oracle_free(a);
		dm_oracle_free(b);
		free(x);
	}
}

Test(oracle, deterministic_forked_children)
{
	for (int algo = 0; algo < 2; algo++) {
		unsigned char *mine;
		struct dm_oracle *o = det_build((enum dm_oracle_algo)algo);
		cr_assert(o);
		size_t len = model_bytes(o, &mine);
		for (int c = 0; c < 2; c++) {
			int pfd[2];
			cr_assert(pipe(pfd) == 0);
			pid_t pid = fork();
			cr_assert(pid >= 0);
			if (pid == 0) {
				close(pfd[0]);
				struct dm_oracle *co = det_build((enum dm_oracle_algo)algo);
				unsigned char *cb;
				if (!co)
					_exit(2);
				size_t cl = model_bytes(co, &cb);
				size_t off = 0;
				while (off < cl) {
					ssize_t w = write(pfd[1], cb + off, cl - off);
					if (w <= 0)
						_exit(3);
					off += (size_t)w;
				}
				_exit(0);
			}
			close(pfd[1]);
			unsigned char *got = malloc(len + 1);
			size_t off = 0;
			ssize_t r;
			while ((r = read(pfd[0], got + off, len + 1 - off)) > 0)
				off += (size_t)r;
			close(pfd[0]);
			int st;
			cr_assert(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
			cr_assert_eq(off, len);
			cr_assert(memcmp(got, mine, len) == 0, "child %d computed other centroids", c);
			free(got);
		}
		free(mine);
		dm_oracle_free(o);
	}
}

Test(oracle, deterministic_across_blas_threads, .timeout = 120)
{
	static const char *const t1[] = { "OPENBLAS_NUM_THREADS=1", NULL };
	static const char *const t2[] = { "OPENBLAS_NUM_THREADS=2", NULL };
	for (int algo = 0; algo < 2; algo++) {
		struct dump a, b;
		run_child(t1, algo, &a);
		run_child(t2, algo, &b);
		cr_assert_eq(a.threads, 1, "OPENBLAS_NUM_THREADS=1 not in effect (%d)", a.threads);
		cr_assert_eq(b.threads, 2, "OPENBLAS_NUM_THREADS=2 not in effect (%d)", b.threads);
		cr_assert_gt(a.len, 0);
		cr_assert_eq(a.len, b.len);
		cr_assert(memcmp(a.model, b.model, a.len) == 0,
			  "centroids differ between 1 and 2 OpenBLAS threads (algo %d)", algo);
		free(a.model);
		free(b.model);
	}
}

/* Different OpenBLAS kernel (DYNAMIC_ARCH core type) and our scalar kernels vs the defaults:
 * what two CNs with different CPUs would run. */
Test(oracle, deterministic_across_kernels, .timeout = 120)
{
	static const char *const def[] = { "OPENBLAS_NUM_THREADS=2", NULL };
	static const char *const old[] = { "OPENBLAS_NUM_THREADS=1", "OPENBLAS_CORETYPE=Prescott",
					   "DMANN_ISA=scalar", NULL };
	struct dump a, b;
	run_child(def, 0, &a);
	run_child(old, 0, &b);
	cr_log_info("default: core %s isa %s; forced: core %s isa %s", a.core, a.isa, b.core,
		    b.isa);
	cr_assert_str_eq(b.isa, "scalar");
	if (dm_kernel_set_isa("avx2") == 0) /* this CPU has more than scalar: the runs differ */
		cr_assert_str_neq(a.isa, "scalar");
	cr_assert_eq(a.len, b.len);
	cr_assert(memcmp(a.model, b.model, a.len) == 0,
		  "centroids differ between kernels %s/%s and %s/%s", a.core, a.isa, b.core, b.isa);
	free(a.model);
	free(b.model);
}

Test(oracle, seed_matters)
{
	struct dm_oracle_params p;
	float *x = rng_mixture(3, 2000, 16, 12, 5.0, NULL, NULL);
	dm_oracle_params_default(&p, 4);
	struct dm_oracle *a = dm_oracle_build(x, 2000, 16, &p);
	p.seed++;
	struct dm_oracle *b = dm_oracle_build(x, 2000, 16, &p);
	cr_assert(a && b);
	/* different seeds may find the same optimum, but then the same fine centroids in some
	 * order; here we only check the build ran and sizes cover the sample */
	uint64_t sa = 0, sb = 0;
	for (uint32_t g = 0; g < 4; g++) {
		sa += a->sizes[g];
		sb += b->sizes[g];
	}
	cr_assert_eq(sa, 2000);
	cr_assert_eq(sb, 2000);
	dm_oracle_free(a);
	dm_oracle_free(b);
	free(x);
}

/* ---- balance -------------------------------------------------------------------------------- */

/* Skewed mixture: blob i gets weight ~ 1/(i+1), so plain k-means is unbalanced. */
static float *skewed(size_t n, size_t dim, size_t nblob)
{
	uint64_t s = 99;
	float *c = malloc(nblob * dim * sizeof(float)), *x = malloc(n * dim * sizeof(float));
	double tw = 0;
	cr_assert(c && x);
	for (size_t b = 0; b < nblob; b++)
		tw += 1.0 / (double)(b + 1);
	for (size_t j = 0; j < nblob * dim; j++)
		c[j] = (float)(u01(&s) * 10.0);
	for (size_t i = 0; i < n; i++) {
		double r = u01(&s) * tw, acc = 0;
		size_t b = 0;
		for (; b + 1 < nblob; b++) {
			acc += 1.0 / (double)(b + 1);
			if (acc > r)
				break;
		}
		for (size_t d = 0; d < dim; d++)
			x[i * dim + d] = c[b * dim + d] + (float)normal(&s);
	}
	free(c);
	return x;
}

Test(oracle, constrained_balance_bound)
{
	const size_t n = 4000, dim = 24;
	float *x = skewed(n, dim, 16);
	for (uint32_t k = 2; k <= 8; k *= 2) {
		struct dm_oracle_params p;
		dm_oracle_params_default(&p, k);
		p.balance_eps = 0.05;
		struct dm_oracle *o = dm_oracle_build(x, n, dim, &p);
		cr_assert(o);
		uint64_t cap = (uint64_t)ceil(1.05 * (double)n / k), tot = 0;
		for (uint32_t g = 0; g < k; g++) {
			/* sizes are the predictor's assignment of the sample (biases included) */
			cr_assert_leq(o->sizes[g], cap, "k=%u group %u holds %llu > %llu", k, g,
				      (unsigned long long)o->sizes[g], (unsigned long long)cap);
			tot += o->sizes[g];
		}
		cr_assert_eq(tot, n);
		/* the predictor agrees with the recorded sizes */
		uint64_t cnt[8] = { 0 };
		for (size_t i = 0; i < n; i++)
			cnt[dm_oracle_best(o, x + i * dim)]++;
		for (uint32_t g = 0; g < k; g++)
			cr_assert_leq(cnt[g], cap + n / 100, "predictor: group %u holds %llu", g,
				      (unsigned long long)cnt[g]);
		dm_oracle_free(o);
	}
	free(x);
}

/* The wire form's CRC for fixed inputs, constrained k-means with a cap that binds for many
 * points (k = 4, eps 0.05) and for few (k = 40, eps 3.0, the VHash's setting): changes
 * whenever the fit's result changes. Recorded with the assignment that sorted all n k
 * pairs; the per-point merge that replaced it must give the same bits. Update only on
 * purpose. */
static uint32_t wire_crc(const struct dm_oracle *o)
{
	size_t len = dm_oracle_wire_size(o);
	uint8_t *b = malloc(len);
	cr_assert(b);
	cr_assert_eq(dm_oracle_encode(o, b, len), (long)len);
	uint32_t crc = (uint32_t)crc32(0, b, (uInt)len);
	free(b);
	return crc;
}

Test(oracle, constrained_golden_crc)
{
	const size_t n = 4000, dim = 24;
	const struct { uint32_t k; double eps; uint32_t crc; } c[] = {
		{ 4, 0.05, 0x1aae8b86u }, { 40, 3.0, 0xccb1f1a3u },
	};
	float *x = skewed(n, dim, 16);
	for (size_t t = 0; t < sizeof(c) / sizeof(c[0]); t++) {
		struct dm_oracle_params p;
		dm_oracle_params_default(&p, c[t].k);
		p.balance_eps = c[t].eps;
		struct dm_oracle *o = dm_oracle_build(x, n, dim, &p);
		cr_assert(o);
		uint32_t crc = wire_crc(o);
		fprintf(stderr, "oracle golden k=%u eps %.2f: CRC 0x%08x\n", c[t].k, c[t].eps, crc);
		cr_expect_eq(crc, c[t].crc, "k=%u: CRC 0x%08x, expected 0x%08x", c[t].k, crc, c[t].crc);
		dm_oracle_free(o);
	}
	free(x);
}

/* The many-centroid kernel gives dm_oracle_l2_exact's bits for every pair: dimensions 1..133
 * (vector tails) and 1..13 centroids (groups of four and the rest), values of mixed scale. */
/* A warm start (dm_oracle_params.init, the previous epoch's centroids): on the same sample
 * it converges at once to the model it started from (every point in the same group), it
 * stays within the balance bound on another sample, it is deterministic, and it rejects a
 * non-finite start or the doubling algorithm. */
Test(oracle, warm_start)
{
	const size_t n = 4000, dim = 24;
	const uint32_t k = 4;
	float *x = skewed(n, dim, 16);
	struct dm_oracle_params p;

	dm_oracle_params_default(&p, k);
	p.balance_eps = 0.05;
	struct dm_oracle *cold = dm_oracle_build(x, n, dim, &p);
	cr_assert(cold);
	p.init = cold->fine;
	struct dm_oracle *warm = dm_oracle_build(x, n, dim, &p), *again;
	cr_assert(warm, "warm fit failed: errno %d", errno);
	cr_assert_leq(warm->iterations, 2, "warm start took %u iterations", warm->iterations);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(dm_oracle_best(warm, x + i * dim), dm_oracle_best(cold, x + i * dim),
			     "point %zu changed group", i);
	again = dm_oracle_build(x, n, dim, &p);
	cr_assert(again);
	cr_assert_eq(wire_crc(again), wire_crc(warm), "two warm fits differ");
	dm_oracle_free(again);
	/* another sample of the same shape (the next epoch's): balanced as a cold fit */
	float *y = skewed(n + 500, dim, 16);
	uint64_t cap = (uint64_t)ceil(1.05 * (double)(n + 500) / k), tot = 0;

	again = dm_oracle_build(y, n + 500, dim, &p);
	cr_assert(again);
	for (uint32_t g = 0; g < k; g++) {
		cr_assert_leq(again->sizes[g], cap);
		tot += again->sizes[g];
	}
	cr_assert_eq(tot, n + 500);
	dm_oracle_free(again);
	free(y);
	/* bad starts */
	float *bad = malloc(k * dim * sizeof(float));
	cr_assert(bad);
	memcpy(bad, cold->fine, k * dim * sizeof(float));
	bad[k * dim - 1] = NAN;
	p.init = bad;
	errno = 0;
	cr_assert_null(dm_oracle_build(x, n, dim, &p));
	cr_assert_eq(errno, EINVAL);
	p.init = cold->fine;
	p.algo = DM_ORACLE_DOUBLING;
	errno = 0;
	cr_assert_null(dm_oracle_build(x, n, dim, &p));
	cr_assert_eq(errno, EINVAL);
	free(bad);
	dm_oracle_free(warm);
	dm_oracle_free(cold);
	free(x);
}

Test(oracle, l2_exact_many_is_bit_identical)
{
	struct dm_rng r;
	float x[133], c[13 * 133];
	double out[13];

	dm_rng_seed(&r, 77);
	for (size_t dim = 1; dim <= 133; dim++) {
		for (size_t nc = 1; nc <= 13; nc += 3) {
			for (size_t i = 0; i < dim; i++)
				x[i] = (float)((dm_rng_double(&r) - 0.5) * 1e3 * dm_rng_double(&r));
			for (size_t i = 0; i < nc * dim; i++)
				c[i] = (float)((dm_rng_double(&r) - 0.5) * 1e3 * dm_rng_double(&r));
			dm_oracle_l2_exact_many(x, c, nc, dim, out);
			for (size_t j = 0; j < nc; j++) {
				double e = dm_oracle_l2_exact(x, c + j * dim, dim);

				cr_assert(memcmp(&e, &out[j], sizeof(e)) == 0,
					  "dim %zu centroid %zu of %zu: %.17g vs %.17g", dim, j, nc,
					  out[j], e);
			}
		}
	}
}

/* SHINE doubling: greedy merging promises no bound in general, so check (1) on 8 equal,
 * well separated blobs and k=4 the groups meet the bound (k'=8 finds the blobs, merges pair
 * them), (2) on a skewed mixture doubling is never less balanced than its own first run
 * (plain k-means with k, i.e. max_doublings=0), since it keeps the most balanced run. */
Test(oracle, doubling_balance_bound)
{
	const size_t n = 3200, dim = 16;
	float *x = rng_mixture(5, n, dim, 8, 40.0, NULL, NULL);
	struct dm_oracle_params p;
	dm_oracle_params_default(&p, 4);
	p.algo = DM_ORACLE_DOUBLING;
	p.balance_eps = 0.10;
	struct dm_oracle *o = dm_oracle_build(x, n, dim, &p);
	cr_assert(o);
	uint64_t tot = 0;
	for (uint32_t g = 0; g < 4; g++) {
		cr_assert_leq(o->sizes[g], (uint64_t)(1.10 * n / 4), "group %u holds %llu", g,
			      (unsigned long long)o->sizes[g]);
		tot += o->sizes[g];
	}
	cr_assert_eq(tot, n);
	dm_oracle_free(o);
	free(x);

	const size_t n2 = 4000;
	x = skewed(n2, 24, 16);
	for (uint32_t k = 3; k <= 8; k++) {
		uint64_t mx[2] = { 0, 0 };
		for (int d = 0; d < 2; d++) {
			p.k = k;
			p.max_doublings = d ? 4 : 0;
			o = dm_oracle_build(x, n2, 24, &p);
			cr_assert(o);
			for (uint32_t g = 0; g < k; g++)
				mx[d] = DM_MAX(mx[d], o->sizes[g]);
			dm_oracle_free(o);
		}
		cr_assert_leq(mx[1], mx[0], "k=%u: doubling %llu vs plain %llu", k,
			      (unsigned long long)mx[1], (unsigned long long)mx[0]);
	}
	free(x);
}

/* ---- predictor -------------------------------------------------------------------------- */

Test(oracle, predictor_ranks_own_cluster_first)
{
	const size_t nc = 6, per = 300, n = nc * per, dim = 20;
	uint32_t *label = malloc(n * sizeof(uint32_t));
	float *cent;
	float *x = rng_mixture(11, n, dim, nc, 200.0, &cent, label);  /* far apart, unit noise */
	for (int algo = 0; algo < 2; algo++) {
		struct dm_oracle_params p;
		dm_oracle_params_default(&p, nc);
		p.algo = (enum dm_oracle_algo)algo;
		struct dm_oracle *o = dm_oracle_build(x, n, dim, &p);
		cr_assert(o);
		/* map true blob -> CN from the blob's centre */
		uint32_t cn_of[6];
		for (size_t j = 0; j < nc; j++)
			cn_of[j] = dm_oracle_best(o, cent + j * dim);
		for (size_t a = 0; a < nc; a++)
			for (size_t b = a + 1; b < nc; b++)
				cr_assert_neq(cn_of[a], cn_of[b], "two blobs share a CN");
		uint64_t s = 77;
		for (int t = 0; t < 500; t++) {
			size_t j = (size_t)(lcg(&s) % nc);
			float q[20];
			for (size_t d = 0; d < dim; d++)
				q[d] = cent[j * dim + d] + (float)normal(&s);
			uint32_t ranked[6];
			float dist[6];
			cr_assert_eq(dm_oracle_rank(o, q, ranked, dist), (int)nc);
			cr_assert_eq(ranked[0], cn_of[j]);
			cr_assert_eq(dm_oracle_best(o, q), cn_of[j]);
			for (size_t r = 1; r < nc; r++)
				cr_assert_leq(dist[r - 1], dist[r]);
			/* every CN appears once */
			uint32_t seen = 0;
			for (size_t r = 0; r < nc; r++)
				seen |= 1u << ranked[r];
			cr_assert_eq(seen, (1u << nc) - 1);
		}
		dm_oracle_free(o);
	}
	free(x);
	free(cent);
	free(label);
}

Test(oracle, pick_level)
{
	uint64_t counts[] = { 60000, 3750, 234, 15, 1 };
	cr_assert_eq(dm_oracle_pick_level(counts, 5, 1000), 1);
	cr_assert_eq(dm_oracle_pick_level(counts, 5, 200), 2);
	cr_assert_eq(dm_oracle_pick_level(counts, 5, 1), 4);
	cr_assert_eq(dm_oracle_pick_level(counts, 5, 100000), 0);
	cr_assert_eq(dm_oracle_pick_level(counts, 0, 1000), -EINVAL);
}

Test(oracle, bad_input)
{
	struct dm_oracle_params p;
	float x[8] = { 0, 1, 2, 3, 4, 5, 6, NAN };
	dm_oracle_params_default(&p, 2);
	errno = 0;
	cr_assert_null(dm_oracle_build(x, 4, 2, &p));
	cr_assert_eq(errno, EINVAL);
	x[7] = 7;
	p.k = 5;
	cr_assert_null(dm_oracle_build(x, 4, 2, &p)); /* n < k */
	p.k = 0;
	cr_assert_null(dm_oracle_build(x, 4, 2, &p));
	p.k = 2;
	struct dm_oracle *o = dm_oracle_build(x, 4, 2, &p);
	cr_assert(o);
	dm_oracle_free(o);
}

/* ---- semantic ring ------------------------------------------------------------------------ */

/* k points on a jittered circle embedded in 8 dims, presented in shuffled order. */
static float *circle(uint32_t k, uint64_t seed, uint32_t *pos_of)
{
	const size_t dim = 8;
	float *pts = calloc(k * dim, sizeof(float));
	uint32_t *perm = malloc(k * sizeof(uint32_t));
	uint64_t s = seed;
	cr_assert(pts && perm);
	for (uint32_t i = 0; i < k; i++)
		perm[i] = i;
	for (uint32_t i = k - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(lcg(&s) % (i + 1)), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	for (uint32_t c = 0; c < k; c++) {
		/* circle position c goes to index perm[c] */
		double a = 2 * M_PI * (c + 0.3 * (u01(&s) - 0.5)) / k;
		double r = 10.0 * (1.0 + 0.002 * (u01(&s) - 0.5)); /* stays in convex position */
		float *p = pts + (size_t)perm[c] * dim;
		p[0] = (float)(r * cos(a));
		p[1] = (float)(r * sin(a));
		p[2] = (float)(0.01 * (u01(&s) - 0.5));
		pos_of[perm[c]] = c;
	}
	free(perm);
	return pts;
}

Test(oracle, ring_recovers_circle)
{
	for (uint32_t k = 3; k <= 40; k += 3) {
		for (uint64_t seed = 1; seed <= 5; seed++) {
			uint32_t pos_of[40], order[40];
			float *pts = circle(k, seed * 1000 + k, pos_of);
			cr_assert_eq(dm_oracle_ring_order(pts, k, 8, 4, order), 0);
			/* a permutation whose consecutive entries are circle neighbours */
			uint64_t seen = 0;
			for (uint32_t i = 0; i < k; i++)
				seen |= 1ull << order[i];
			cr_assert_eq(seen, (k == 64 ? 0 : (1ull << k)) - 1);
			for (uint32_t i = 0; i + 1 < k; i++) {
				uint32_t a = pos_of[order[i]], b = pos_of[order[i + 1]];
				uint32_t diff = (a + k - b) % k;
				cr_assert(diff == 1 || diff == k - 1,
					  "k=%u seed=%llu: ring step %u -> %u is not a circle step", k,
					  (unsigned long long)seed, a, b);
			}
			free(pts);
		}
	}
}

Test(oracle, two_opt_never_lengthens)
{
	uint64_t s = 5;
	for (int t = 0; t < 200; t++) {
		uint32_t k = 2 + (uint32_t)(lcg(&s) % 30), order[32];
		size_t dim = 1 + (size_t)(lcg(&s) % 5);
		float *pts = malloc(k * dim * sizeof(float));
		cr_assert(pts);
		for (size_t i = 0; i < k * dim; i++)
			pts[i] = (float)u01(&s);
		for (uint32_t i = 0; i < k; i++)
			order[i] = i;
		for (uint32_t i = k - 1; i > 0; i--) {
			uint32_t j = (uint32_t)(lcg(&s) % (i + 1)), tmp = order[i];
			order[i] = order[j];
			order[j] = tmp;
		}
		double before = dm_oracle_tour_length(pts, order, k, dim);
		int moves = dm_oracle_two_opt(pts, order, k, dim, 100);
		double after = dm_oracle_tour_length(pts, order, k, dim);
		cr_assert_geq(moves, 0);
		cr_assert_leq(after, before * (1 + 1e-12), "2-opt lengthened %f -> %f", before, after);
		if (moves > 0)
			cr_assert_lt(after, before);
		/* still a permutation */
		uint64_t seen = 0;
		for (uint32_t i = 0; i < k; i++)
			seen |= 1ull << order[i];
		cr_assert_eq(seen, (1ull << k) - 1);
		free(pts);
	}
}

/* The warm ring (dm_oracle_ring_order_from): a good previous order is kept as it is, a much
 * longer one gives way to the fresh order, and a non-permutation is refused. */
Test(oracle, ring_order_from_keeps_a_good_order)
{
	const uint32_t k = 24;
	const size_t dim = 3;
	float pts[24 * 3];
	uint32_t fresh[24], init[24], out[24];
	uint64_t s = 5;

	for (uint32_t i = 0; i < k * dim; i++)
		pts[i] = (float)((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 40) /
			 (float)(1u << 24);
	cr_assert_eq(dm_oracle_ring_order(pts, k, dim, 8, fresh), 0);
	/* the fresh order with two neighbours swapped: a little longer, kept */
	memcpy(init, fresh, sizeof(init));
	init[10] = fresh[11];
	init[11] = fresh[10];
	cr_assert_eq(dm_oracle_ring_order_from(pts, k, dim, 8, init, 0.5, out), 0);
	cr_assert_arr_eq(out, init, sizeof(init));
	/* a far worse order (every other point first): the fresh one */
	for (uint32_t i = 0; i < k; i++)
		init[i] = fresh[(i * 2) % k + (i * 2 >= k)];
	cr_assert_eq(dm_oracle_ring_order_from(pts, k, dim, 8, init, 0.10, out), 0);
	cr_assert_arr_eq(out, fresh, sizeof(fresh));
	/* not a permutation */
	init[3] = init[4];
	cr_assert_eq(dm_oracle_ring_order_from(pts, k, dim, 8, init, 0.10, out), -EINVAL);
	init[3] = k;
	cr_assert_eq(dm_oracle_ring_order_from(pts, k, dim, 8, init, 0.10, out), -EINVAL);
	cr_assert_eq(dm_oracle_ring_order_from(pts, k, dim, 8, fresh, -1, out), -EINVAL);
}

Test(oracle, ring_neighbours_and_spill_order)
{
	/* blobs on a line: the ring must be the line order (up to direction) */
	const uint32_t k = 6;
	const size_t per = 200, dim = 4, n = k * per;
	float *x = malloc(n * dim * sizeof(float));
	uint64_t s = 8;
	cr_assert(x);
	for (size_t i = 0; i < n; i++)
		for (size_t d = 0; d < dim; d++)
			x[i * dim + d] = (d == 0 ? (float)(100.0 * (double)(i % k)) : 0.0f) +
					 (float)normal(&s);
	struct dm_oracle_params p;
	dm_oracle_params_default(&p, k);
	struct dm_oracle *o = dm_oracle_build(x, n, dim, &p);
	cr_assert(o);
	/* ring positions follow the x coordinate of the centroids monotonically */
	int dir = o->centroids[(size_t)o->ring[1] * dim] > o->centroids[(size_t)o->ring[0] * dim]
			  ? 1 : -1;
	for (uint32_t i = 0; i + 1 < k; i++) {
		float a = o->centroids[(size_t)o->ring[i] * dim];
		float b = o->centroids[(size_t)o->ring[i + 1] * dim];
		cr_assert(dir > 0 ? b > a : b < a, "ring is not the line order");
	}
	cr_assert_eq(dm_oracle_ring_prev(o, o->ring[0]), -1);
	cr_assert_eq(dm_oracle_ring_next(o, o->ring[k - 1]), -1);
	for (uint32_t i = 1; i < k; i++) {
		cr_assert_eq(dm_oracle_ring_prev(o, o->ring[i]), (int)o->ring[i - 1]);
		cr_assert_eq(dm_oracle_ring_next(o, o->ring[i - 1]), (int)o->ring[i]);
	}
	/* spill order from position 2: ring distances 1,1,2,3,3? -> positions {1,3},{0,4},{5} */
	uint32_t sp[6];
	cr_assert_eq(dm_oracle_spill_order(o, o->ring[2], sp), (int)k - 1);
	uint32_t dist[5];
	for (uint32_t i = 0; i < k - 1; i++)
		dist[i] = (uint32_t)abs((int)o->ring_pos[sp[i]] - 2);
	cr_assert_eq(dist[0], 1);
	cr_assert_eq(dist[1], 1);
	cr_assert_eq(dist[2], 2);
	cr_assert_eq(dist[3], 2);
	cr_assert_eq(dist[4], 3);
	dm_oracle_free(o);
	free(x);
}

/* ---- CSP -------------------------------------------------------------------------------- */

Test(oracle, csp_from_chr)
{
	cr_assert_float_eq(dm_csp_from_chr(0.30, 0.60), 0.5, 1e-12);
	cr_assert_float_eq(dm_csp_from_chr(0.60, 0.60), 0.0, 1e-12);
	cr_assert_float_eq(dm_csp_from_chr(0.0, 0.5), 1.0, 1e-12);
	cr_assert_float_eq(dm_csp_from_chr(0.7, 0.6), 0.0, 1e-12); /* clamped */
	cr_assert(isnan(dm_csp_from_chr(0.5, 0.0)));
	cr_assert(isnan(dm_csp_from_chr(-0.1, 0.5)));
	cr_assert(isnan(dm_csp_from_chr(0.5, 1.5)));
}

Test(oracle, csp_exact_hand_cases)
{
	/* CN0 {1,2,3,4}, CN1 {3,4,5}, CN2 {4,6}: id 3 twice, id 4 three times.
	 * entries 9, distinct 6, duplicates 3 -> 1/3 */
	uint32_t a[] = { 1, 2, 3, 4 }, b[] = { 3, 4, 5 }, c[] = { 4, 6 };
	const uint32_t *ids[] = { a, b, c };
	size_t cnt[] = { 4, 3, 2 };
	cr_assert_float_eq(dm_csp_exact(ids, cnt, 3), 3.0 / 9.0, 1e-12);
	/* identical caches on n CNs: 1 - 1/n */
	const uint32_t *same[] = { a, a, a, a };
	size_t c4[] = { 4, 4, 4, 4 };
	cr_assert_float_eq(dm_csp_exact(same, c4, 4), 0.75, 1e-12);
	/* disjoint: 0; empty: 0; a repeated id inside one CN counts once */
	uint32_t d[] = { 7, 7, 8 };
	const uint32_t *dis[] = { a, d };
	size_t cd[] = { 4, 3 };
	cr_assert_float_eq(dm_csp_exact(dis, cd, 2), 0.0, 1e-12);
	size_t zero[] = { 0, 0 };
	const uint32_t *none[] = { NULL, NULL };
	cr_assert_float_eq(dm_csp_exact(none, zero, 2), 0.0, 1e-12);
	cr_assert_float_eq(dm_csp_exact(NULL, NULL, 0), 0.0, 1e-12);
	const uint32_t *bad[] = { NULL };
	size_t cb[] = { 3 };
	cr_assert_lt(dm_csp_exact(bad, cb, 1), 0);
}

Test(oracle, csp_sample_slice)
{
	size_t in = 0;
	for (uint32_t id = 0; id < 640000; id++)
		in += dm_csp_in_sample(id);
	/* 1/64 of 640000 = 10000, binomial sd ~ 99 */
	cr_assert(in > 9500 && in < 10500, "slice holds %zu of 640000", in);
	uint32_t v[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };
	uint32_t out[16];
	size_t m = dm_csp_sample(v, 16, out);
	for (size_t i = 0; i < m; i++)
		cr_assert(dm_csp_in_sample(out[i]));
}

/* [router] csp_slice: the 1/2^s slices hold their share and nest, so the 1/64 slice is the
 * old sample and every coarser slice contains it. */
Test(oracle, csp_slices_nest)
{
	for (unsigned s = 0; s <= 6; s++) {
		size_t in = 0;

		for (uint32_t id = 0; id < 640000; id++) {
			bool a = dm_csp_in_slice(id, s);

			in += a;
			if (s == 6)
				cr_assert_eq(a, dm_csp_in_sample(id));
			if (dm_csp_in_slice(id, s + 1))
				cr_assert(a, "id %u in the 1/%u slice but not the 1/%u one", id,
					  1u << (s + 1), 1u << s);
		}
		double want = 640000.0 / (double)(1u << s), sd = sqrt(want);
		cr_assert(fabs((double)in - want) < 6 * sd + 1, "1/%u slice holds %zu", 1u << s, in);
	}
	cr_assert(dm_csp_in_slice(12345, 0));
}

Test(oracle, csp_sampled_close_to_exact)
{
	const uint32_t ncn = 4;
	const size_t per = 60000;
	uint64_t s = 21;
	for (int t = 0; t < 4; t++) {
		/* overlap grows with t: a shared hot set plus private ids */
		uint32_t *ids[4];
		size_t cnt[4];
		double shared = 0.15 * t;
		for (uint32_t c = 0; c < ncn; c++) {
			ids[c] = malloc(per * sizeof(uint32_t));
			cr_assert(ids[c]);
			for (size_t i = 0; i < per; i++) {
				if (u01(&s) < shared)
					ids[c][i] = (uint32_t)(lcg(&s) % 100000);      /* hot, shared */
				else
					ids[c][i] = 1000000u + c * 10000000u +
						    (uint32_t)(lcg(&s) % 5000000);
			}
			cnt[c] = per;
		}
		double ex = dm_csp_exact((const uint32_t *const *)ids, cnt, ncn);
		double sa = dm_csp_sampled((const uint32_t *const *)ids, cnt, ncn);
		cr_log_info("csp exact %.4f sampled %.4f", ex, sa);
		cr_assert_geq(ex, 0);
		cr_assert(fabs(ex - sa) < 0.03, "exact %.4f sampled %.4f", ex, sa);
		for (uint32_t c = 0; c < ncn; c++)
			free(ids[c]);
	}
}

/* Degenerate inputs still give a complete model: k=1, n=k, all points identical. */
Test(oracle, degenerate_inputs)
{
	float x[64 * 4];
	uint64_t s = 4;
	for (size_t i = 0; i < 64 * 4; i++)
		x[i] = (float)u01(&s);
	for (int algo = 0; algo < 2; algo++) {
		struct dm_oracle_params p;
		dm_oracle_params_default(&p, 1);
		p.algo = (enum dm_oracle_algo)algo;
		struct dm_oracle *o = dm_oracle_build(x, 64, 4, &p);
		cr_assert(o);
		cr_assert_eq(o->sizes[0], 64);
		cr_assert_eq(dm_oracle_best(o, x), 0);
		cr_assert_eq(dm_oracle_ring_prev(o, 0), -1);
		cr_assert_eq(dm_oracle_ring_next(o, 0), -1);
		dm_oracle_free(o);

		p.k = 8; /* n == k */
		o = dm_oracle_build(x, 8, 4, &p);
		cr_assert(o);
		uint64_t tot = 0;
		for (uint32_t g = 0; g < 8; g++)
			tot += o->sizes[g];
		cr_assert_eq(tot, 8);
		dm_oracle_free(o);

		float same[40 * 3];
		for (size_t i = 0; i < 40 * 3; i++)
			same[i] = 1.5f;
		p.k = 4;
		o = dm_oracle_build(same, 40, 3, &p);
		cr_assert(o);
		tot = 0;
		for (uint32_t g = 0; g < 4; g++)
			tot += o->sizes[g];
		cr_assert_eq(tot, 40);
		uint32_t sp[4];
		cr_assert_eq(dm_oracle_spill_order(o, 0, sp), 3);
		dm_oracle_free(o);
	}
}
