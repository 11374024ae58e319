/* test_s3_part.c: partitioned exact scans (issue 15, cn/s3/cn_s3_part.c) on a local
 * cluster of 2 MN + 2 CN (R=1, no graph: [s3] graph_auto 0, so the exact path serves every
 * query; width 2, so every query is split over both compute nodes and each member fits the
 * index's model itself): 24,000 x 128 rows put through libdmann, 200 unfiltered queries
 * through libdmann with [s3] scan_budget 8 of 64 regions, in rounds until the models are
 * fitted (in the background), then one round measured. Asserts that every query of it was
 * partitioned, that the members' models matched the ingress's (no share scanned whole for
 * a mismatch), that most rows were skipped, and that recall@10 against the exact top-10 of
 * `dmann gen` stays >= 0.90; and that 200 rows queried by their own vector find themselves
 * first (a query's own region is always scanned). */
#include <string.h>

#include "cluster_util.h"
#include "vecfile.h"

#define NB 24000
#define NQ 200
#define K  10

static char dir[128], dmann[300], lc[200];

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-s3part-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(lc, sizeof(lc), "%s/lc", dir);
}

static void teardown(void)
{
	sh("%s local down --dir %s", dmann, lc);
	cluster_test_dir_done(dir);
}

TestSuite(s3_part, .init = setup, .fini = teardown, .timeout = 400);

/* Sum of a counter over both compute nodes. */
static long long both(const char *name)
{
	long long a = cluster_metric(lc, 0, name), b = cluster_metric(lc, 1, name);

	cr_assert(a >= 0 && b >= 0, "%s not on both compute nodes", name);
	return a + b;
}

/* Recall@K of `dmann query` answers (lines "q: key dist ...", keys v<row>) in file name
 * against the first K of each query's exact ids in gt (nq x gk). */
static double recall_of(const char *name, const struct dm_vecs *gt)
{
	char p[256], *line = NULL;
	size_t cap = 0;
	unsigned q = 0, hit = 0;
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	f = fopen(p, "r");
	cr_assert_not_null(f, "%s", p);
	while (getline(&line, &cap, f) > 0 && q < NQ) {
		char *save = NULL, *tok = strtok_r(line, " \n", &save);
		const int32_t *want = (const int32_t *)gt->data + (size_t)q * gt->dim;

		cr_assert(tok && strtoul(tok, NULL, 10) == q, "%s: line %u", name, q);
		for (unsigned j = 0; (tok = strtok_r(NULL, " \n", &save)); j++) {
			long r = tok[0] == 'v' ? strtol(tok + 1, NULL, 10) : -1;

			cr_assert(r >= 0 && r < NB, "%s: query %u: unknown key %s", name, q, tok);
			for (unsigned i = 0; i < K; i++)
				hit += want[i] == r;
			cr_assert_not_null(strtok_r(NULL, " \n", &save), "%s: no distance", name);
		}
		q++;
	}
	free(line);
	fclose(f);
	cr_assert_eq(q, NQ, "%s: %u answers", name, q);
	return (double)hit / (NQ * K);
}

Test(s3_part, partitioned_scan_reads_few_regions_and_keeps_recall)
{
	struct dm_vecs gt;
	char p[256], err[256];
	long long pq, regions, rows, skipped, mism;
	double rec;

	cr_assert_eq(sh("%s gen --kind sift --n %d --nq %d --seed 5 --out %s/d >/dev/null", dmann,
			NB, NQ, dir), 0);
	snprintf(p, sizeof(p), "%s/d/gt.ibin", dir);
	cr_assert_eq(dm_vecs_read(p, DM_VF_AUTO, &gt, err, sizeof(err)), 0, "%s", err);
	cr_assert_geq(gt.dim, K);
	cr_assert_eq(sh("%s local up --mn 2 --cn 2 --redundancy 1 --dir %s --region-mb 32 "
			"--transport tcp --s3-set graph_auto=0 --s3-set scan_budget=8 --s3-set "
			"scan_regions=64 --s3-set scan_min_rows=20000 --s3-set width=2", dmann, lc),
		     0);
	cr_assert_eq(sh("%s put --config %s/cluster.ini --bucket pbkt --name pidx --vectors "
			"%s/d/base.fbin --key-prefix v --create euclidean >/dev/null", dmann, lc,
			dir), 0);
	/* The models are fitted in the background once the index is queried (the ingress's
	 * first, then each member's on its first partitioned share): queries meanwhile scan
	 * every row. Rounds of the queries until one is wholly partitioned, then one more,
	 * measured. */
	long long pq0 = 0, mism0 = 0;
	uint64_t t0 = dm_now_ns();

	for (;;) {
		cr_assert_eq(sh("%s query --config %s/cluster.ini --bucket pbkt --name pidx "
				"--vectors %s/d/query.fbin --k %d >/dev/null", dmann, lc, dir, K), 0);
		pq = both("dmann_cn_s3_partitioned_queries_total");
		mism = both("dmann_cn_s3_partition_mismatches_total");
		if (pq - pq0 == NQ && mism == mism0)
			break;
		pq0 = pq;
		mism0 = mism;
		cr_assert_lt(dm_now_ns() - t0, bound_s(120), "models not ready after 120 s");
		sleep(1);
	}
	pq0 = pq;
	mism0 = mism;
	long long regions0 = both("dmann_cn_s3_partition_regions_total");
	long long rows0 = both("dmann_cn_s3_scan_rows_total");
	long long skipped0 = both("dmann_cn_s3_scan_rows_skipped_total");

	cr_assert_eq(sh("%s query --config %s/cluster.ini --bucket pbkt --name pidx --vectors "
			"%s/d/query.fbin --k %d >%s/part.txt", dmann, lc, dir, K, dir), 0);
	rec = recall_of("part.txt", &gt);
	pq = both("dmann_cn_s3_partitioned_queries_total") - pq0;
	regions = both("dmann_cn_s3_partition_regions_total") - regions0;
	rows = both("dmann_cn_s3_scan_rows_total") - rows0;
	skipped = both("dmann_cn_s3_scan_rows_skipped_total") - skipped0;
	mism = both("dmann_cn_s3_partition_mismatches_total") - mism0;
	cr_log_info("partitioned scans: %lld of %d queries, %.2f regions each, %lld rows compared "
		    "and %lld skipped (%.1f%% read), %lld mismatched shares, recall@10 %.4f",
		    pq, NQ, pq ? (double)regions / (double)pq : 0.0, rows, skipped,
		    100.0 * (double)rows / (double)(rows + skipped + !(rows + skipped)), mism, rec);
	cr_assert_eq(pq, NQ, "%lld of %d queries partitioned", pq, NQ);
	cr_assert_eq(mism, 0, "shares scanned whole: the members' models differed");
	cr_assert_geq(both("dmann_cn_s3_partition_fits_total"), 2, "each CN fits its own model");
	cr_assert_lt(rows * 2, skipped, "at most a third of the rows should be compared");
	cr_assert_geq(rec, 0.90, "recall@10 %.4f", rec);

	/* A row queried by its own vector is always compared: the frontier's first region is
	 * the query's own (its nearest centroid), the row's label too. */
	struct dm_vecs base;
	unsigned first = 0;

	snprintf(p, sizeof(p), "%s/d/base.fbin", dir);
	cr_assert_eq(dm_vecs_read(p, DM_VF_AUTO, &base, err, sizeof(err)), 0, "%s", err);
	snprintf(p, sizeof(p), "%s/self.fbin", dir);
	cr_assert_eq(dm_vecs_write(p, DM_VF_FBIN, base.data, DM_VT_F32, NQ, base.dim), 0);
	dm_vecs_free(&base);
	pq0 = both("dmann_cn_s3_partitioned_queries_total");
	cr_assert_eq(sh("%s query --config %s/cluster.ini --bucket pbkt --name pidx --vectors "
			"%s --k 1 >%s/self.txt", dmann, lc, p, dir), 0);
	cr_assert_eq(both("dmann_cn_s3_partitioned_queries_total") - pq0, NQ);
	snprintf(p, sizeof(p), "%s/self.txt", dir);
	FILE *f = fopen(p, "r");
	char line[256], want[32];

	cr_assert_not_null(f);
	for (unsigned q = 0; fgets(line, sizeof(line), f); q++) {
		snprintf(want, sizeof(want), "%u: v%u ", q, q);
		first += strncmp(line, want, strlen(want)) == 0;
	}
	fclose(f);
	cr_log_info("self-find through partitioned scans: %u of %d first", first, NQ);
	cr_assert_eq(first, NQ, "%u of %d rows found themselves first", first, NQ);
	dm_vecs_free(&gt);
}
