/* refit_bench.c: what a key-range oracle's refit moves (issue 15, epoch refresh): for the
 * next epoch's sample, a cold fit (k-means++ from the next seed, a fresh ring and cut: what
 * every compute node does without etcd) against the warm refit the fitting compute node does
 * through etcd (the current regions as the k-means' start, the current key order kept
 * unless a fresh one is over DM_VHASH_RING_SLACK shorter, the current runs kept unless the
 * best cut is over 10% cheaper, runs numbered to keep their compute nodes:
 * dm_oracle_keyrange_fit with the current oracle, the call cn/router/router.c makes).
 * Reported per scenario and number of compute nodes k: the share of ALL base rows
 * whose compute node (the oracle's predictor) changes from the current epoch's, the fit's
 * CPU time, the k-means objective of the k partitions over the base rows (mean squared
 * distance to their partition's mean) and the largest partition's share of the sample.
 *
 * Scenarios (the current epoch is fitted cold on rows [0, n)):
 *   same       the same sample again (a refresh with nothing changed);
 *   resample   rows [n, 2n): another sample of the same data (the upper levels after
 *              inserts and deletes turned them over);
 *   drift      rows [0, n) with every fourth replaced by a row of the rows [2n, N) nearest
 *              to the first of them (inserts crowding one part of the space).
 *
 * One JSON line per (scenario, k) on stdout.
 * usage: refit_bench --base F [--n N] [--regions K] [--cns "3 4 8"] [--seed S]
 */
#include "oracle.h"
#include "vhash.h"
#include "vecfile.h"
#include "config.h"   /* DM_MAX_NODES */

#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Mean squared distance of the rows to their partition's mean (partition: o's predictor). */
static double objective(const struct dm_oracle *o, const float *x, size_t n, uint32_t *part)
{
	size_t d = o->dim;
	double *mu = calloc((size_t)o->k * d, sizeof(double)), *cnt = calloc(o->k, sizeof(double));
	double s = 0;

	if (!mu || !cnt) {
		free(mu);
		free(cnt);
		return NAN;
	}
	for (size_t i = 0; i < n; i++) {
		uint32_t g = part[i];

		cnt[g]++;
		for (size_t j = 0; j < d; j++)
			mu[g * d + j] += x[i * d + j];
	}
	for (uint32_t g = 0; g < o->k; g++)
		for (size_t j = 0; j < d; j++)
			mu[g * d + j] /= cnt[g] ? cnt[g] : 1;
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < d; j++) {
			double t = x[i * d + j] - mu[part[i] * d + j];

			s += t * t;
		}
	free(mu);
	free(cnt);
	return s / (double)n;
}

static double largest_share(const struct dm_oracle *o)
{
	uint64_t m = 0, tot = 0;

	for (uint32_t g = 0; g < o->k; g++) {
		tot += o->sizes[g];
		if (o->sizes[g] > m)
			m = o->sizes[g];
	}
	return tot ? (double)m * o->k / (double)tot : 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: refit_bench --base F [--n N] [--regions K] [--cns \"3 4 8\"] [--seed S]\n"
		   "\n"
		   "A key-range oracle refit, cold against warm (the current regions, key order and\n"
		   "owners kept where they still serve): rows changing compute node, fit CPU, the\n"
		   "partitions' k-means objective. One JSON line per scenario and k.\n"
		   "  --base F      base vectors (fbin/fvecs/...), at least 3 n rows\n"
		   "  --n N         sample rows (default: rows / 16, the HNSW level-1 share)\n"
		   "  --regions K   VHash regions (default: min(256, n / 64), the router's rule)\n"
		   "  --cns LIST    compute nodes k (default \"3 4 8\")\n"
		   "  --seed S      the current epoch's seed (default 1; the cold refit uses S + 1)\n");
}

int main(int argc, char **argv)
{
	const char *base = NULL, *cns = "3 4 8";
	size_t n = 0;
	uint32_t K = 0;
	uint64_t seed = 1;
	struct dm_vecs v;
	char err[256];

	for (int i = 1; i < argc; i += 2) {   /* every option takes a value */
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 0;
		}
		if (strcmp(a, "--base") && strcmp(a, "--n") && strcmp(a, "--regions") &&
		    strcmp(a, "--cns") && strcmp(a, "--seed")) {
			fprintf(stderr, "refit_bench: unknown option %s\n", a);
			usage(stderr);
			return 2;
		}
		if (!val) {
			fprintf(stderr, "refit_bench: %s needs a value\n", a);
			usage(stderr);
			return 2;
		}
		if (!strcmp(a, "--base"))
			base = val;
		else if (!strcmp(a, "--n"))
			n = strtoull(val, NULL, 10);
		else if (!strcmp(a, "--regions"))
			K = (uint32_t)strtoul(val, NULL, 10);
		else if (!strcmp(a, "--cns"))
			cns = val;
		else if (!strcmp(a, "--seed"))
			seed = strtoull(val, NULL, 10);
		else {
			fprintf(stderr, "refit_bench: unknown option %s\n", a);
			usage(stderr);
			return 2;
		}
	}
	if (!base) {
		usage(stderr);
		return 2;
	}
	if (dm_vecs_read(base, DM_VF_AUTO, &v, err, sizeof(err))) {
		fprintf(stderr, "refit_bench: %s\n", err);
		return 1;
	}
	const float *x = v.data;
	size_t N = v.n, dim = v.dim;

	if (!n)
		n = N / 16;
	if (!K)
		K = (uint32_t)(n / 64 < 256 ? n / 64 : 256);
	if (v.type != DM_VT_F32 || n < 64 || 3 * n > N || K < 8) {
		fprintf(stderr, "refit_bench: need float vectors and at least 3 n rows (n %zu of %zu; "
			"regions %u)\n", n, N, K);
		dm_vecs_free(&v);
		return 1;
	}
	/* the scenarios' samples */
	float *same = malloc(n * dim * sizeof(float)), *drift = malloc(n * dim * sizeof(float));
	uint32_t *pa = malloc(N * sizeof(uint32_t)), *pb = malloc(N * sizeof(uint32_t));
	double *dd = malloc((N - 2 * n) * sizeof(double));
	size_t *idx = malloc((N - 2 * n) * sizeof(size_t));

	if (!same || !drift || !pa || !pb || !dd || !idx) {
		fprintf(stderr, "refit_bench: out of memory\n");
		return 1;
	}
	memcpy(same, x, n * dim * sizeof(float));
	memcpy(drift, x, n * dim * sizeof(float));
	/* drift: every fourth sample row replaced by the rows of [2n, N) nearest to row 2n,
	 * nearest first (partial selection by repeated minimum: n / 4 of them) */
	for (size_t i = 0; i < N - 2 * n; i++) {
		dd[i] = dm_oracle_l2_exact(x + (2 * n + i) * dim, x + 2 * n * dim, dim);
		idx[i] = 2 * n + i;
	}
	for (size_t r = 0; r < n / 4; r++) {
		size_t best = r;

		for (size_t i = r + 1; i < N - 2 * n; i++)
			if (dd[i] < dd[best])
				best = i;
		double td = dd[r];
		size_t ti = idx[r];

		dd[r] = dd[best];
		idx[r] = idx[best];
		dd[best] = td;
		idx[best] = ti;
		memcpy(drift + 4 * r * dim, x + idx[r] * dim, dim * sizeof(float));
	}
	struct {
		const char *name;
		const float *s;
	} sc[] = { { "same", same }, { "resample", x + n * dim }, { "drift", drift } };

	for (const char *c = cns; *c;) {
		char *end;
		unsigned long k = strtoul(c, &end, 10);

		if (end == c)
			break;
		c = end;
		while (*c == ' ')
			c++;
		if (k < 2 || k > K || k > DM_MAX_NODES)
			continue;
		struct dm_oracle *oc = dm_oracle_keyrange_fit(x, n, dim, K, (uint32_t)k, 0.10, seed,
							      NULL, NULL, NULL, NULL, NULL);

		if (!oc) {
			fprintf(stderr, "refit_bench: the current fit failed: %s\n", strerror(errno));
			return 1;
		}
		for (size_t i = 0; i < N; i++)
			pa[i] = dm_oracle_best(oc, x + i * dim);
		for (size_t s = 0; s < sizeof(sc) / sizeof(sc[0]); s++) {
			double t0 = cpu_s();
			struct dm_oracle *co = dm_oracle_keyrange_fit(sc[s].s, n, dim, K, (uint32_t)k,
								      0.10, seed + 1, NULL, NULL,
								      NULL, NULL, NULL);
			double tc = cpu_s() - t0;
			bool warm = false;

			/* the router's refit through etcd: from the current oracle */
			t0 = cpu_s();
			struct dm_oracle *wo = dm_oracle_keyrange_fit(sc[s].s, n, dim, K, (uint32_t)k,
								      0.10, seed + 1, oc->fine,
								      oc->fine_group, NULL, NULL,
								      &warm);
			bool recold = wo && !warm;
			double tw = cpu_s() - t0;

			if (!co || !wo) {
				fprintf(stderr, "refit_bench: a refit failed: %s\n", strerror(errno));
				return 1;
			}
			size_t mc = 0, mw = 0;

			for (size_t i = 0; i < N; i++) {
				pb[i] = dm_oracle_best(co, x + i * dim);
				mc += pb[i] != pa[i];
			}
			double objc = objective(co, x, N, pb);

			for (size_t i = 0; i < N; i++) {
				pb[i] = dm_oracle_best(wo, x + i * dim);
				mw += pb[i] != pa[i];
			}
			double objw = objective(wo, x, N, pb);

			printf("{\"scenario\": \"%s\", \"k\": %lu, \"rows\": %zu, \"n\": %zu, "
			       "\"regions\": %u, \"dim\": %zu, \"moved_cold\": %.4f, "
			       "\"moved_warm\": %.4f, \"cpu_cold\": %.4f, \"cpu_warm\": %.4f, "
			       "\"objective_cold\": %.6g, \"objective_warm\": %.6g, "
			       "\"largest_cold\": %.3f, \"largest_warm\": %.3f, \"recold\": %s}\n",
			       sc[s].name, k, N, n, K, dim, (double)mc / (double)N,
			       (double)mw / (double)N, tc, tw, objc, objw, largest_share(co),
			       largest_share(wo), recold ? "true" : "false");
			fflush(stdout);
			dm_oracle_free(co);
			dm_oracle_free(wo);
		}
		dm_oracle_free(oc);
	}
	free(same);
	free(drift);
	free(pa);
	free(pb);
	free(dd);
	free(idx);
	dm_vecs_free(&v);
	return 0;
}
