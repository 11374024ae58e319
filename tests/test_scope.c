/* test_scope.c: scoped retrieval on a local cluster (issue 15 point 4; s3_scope.h,
 * cn/s3/cn_s3_scope.c): 2 memory + 2 compute nodes (R = 1, tcp, fragments of 64 rows, scan
 * width 2, graphs seeded from 2,000 rows on, no hedging: a hedged share is scanned twice
 * and its rows counted twice). An index declared with the tag dmann:scope =
 * "tenant" at CreateIndex holds the rows of 100 tenants (40 to 199 rows each) and 200 rows
 * without a tenant, put through libdmann. For every tenant one QueryVectors through the
 * HTTP gateway (SigV4 by curl) whose filter pins the tenant (bare value, $eq, or inside a
 * top-level $and with another condition) must answer exactly the brute force over that
 * tenant's live rows computed here (recall 1.0), and the compute nodes' counters must show
 * that its members read that tenant's live rows and nothing else: rows read == its live
 * rows, rows of other scopes read == 0. Then keys moved to another tenant by an overwrite
 * and keys deleted, both memory nodes SIGKILLed and restarted (WAL replay), and every
 * tenant queried again. Bad declarations are refused, and the scoped index gets no graph. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cluster_util.h"
#include "cluster_s3.h"
#include "dmann.h"

#define DIM 16
#define NT 100                       /* tenants (the sharded case: 20) */
#define NX 200                       /* rows without a tenant */
#define K 10

static char dir[128], lc[160], dmann[300], dmann_mn[300], cfgpath[256], http[128];

/* The test's copy of the rows. */
static struct row {
	int tenant;                      /* -1: none */
	int grp;
	bool alive;
	float v[DIM];
} *rows;
static uint32_t nrows;
static int nt = NT;                  /* tenants of this case */
static long long nshard = 1;         /* the bucket's shards: scoped plans per query */

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dmann_mn, sizeof(dmann_mn), "%s/mn/dmann-mn", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-scope-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(lc, sizeof(lc), "%s/lc", dir);
	snprintf(cfgpath, sizeof(cfgpath), "%s/cluster.ini", lc);
}

static void teardown(void)
{
	sh("%s local down --dir %s", dmann, lc);
	cluster_test_dir_done(dir);
	free(rows);
}

TestSuite(scope, .init = setup, .fini = teardown, .timeout = 400);

/* POST op with body to cn0's gateway (SigV4 by curl): the answer's JSON and *status. */
static json_t *http_call(const char *op, const char *body, int *status)
{
	json_t *o = cluster_s3_call(lc, dir, http, op, body, status);

	return o ? o : json_object();
}

static void expect(const char *op, int want, const char *body)
{
	int st;
	json_t *o = http_call(op, body, &st);

	cr_assert_eq(st, want, "%s %s -> %d %s", op, body, st,
		     json_string_value(json_object_get(o, "message")));
	json_decref(o);
}

/* Sum of a counter over both compute nodes. */
static long long both(const char *name)
{
	long long a = cluster_metric(lc, 0, name), b = cluster_metric(lc, 1, name);

	cr_assert(a >= 0 && b >= 0, "%s not on both compute nodes", name);
	return a + b;
}

static float val(uint64_t seed, uint32_t j)
{
	uint64_t h = seed * 0x9e3779b97f4a7c15ull + j * 0xbf58476d1ce4e5b9ull;

	h ^= h >> 29;
	h *= 0x94d049bb133111ebull;
	h ^= h >> 32;
	return (float)(h % 20000) / 1000.0f - 10.0f;
}

static float l2(const float *a, const float *b)
{
	float d = 0;

	for (int j = 0; j < DIM; j++)
		d += (a[j] - b[j]) * (a[j] - b[j]);
	return d;
}

/* Put rows [lo, hi) as the array says (vectors, tenant, group) through libdmann. */
static void put_rows(dmann_t *d, uint32_t lo, uint32_t hi)
{
	uint32_t n = hi - lo;
	char **keys = calloc(n, sizeof(char *)), **meta = calloc(n, sizeof(char *));
	float *v = malloc((size_t)n * DIM * sizeof(float));

	cr_assert(keys && meta && v);
	for (uint32_t i = 0; i < n; i++) {
		const struct row *r = &rows[lo + i];

		cr_assert_geq(asprintf(&keys[i], "k%u", lo + i), 0);
		if (r->tenant >= 0)
			cr_assert_geq(asprintf(&meta[i], "{\"tenant\":\"t%d\",\"grp\":%d}",
					       r->tenant, r->grp), 0);
		else
			cr_assert_geq(asprintf(&meta[i], "{\"grp\":%d}", r->grp), 0);
		memcpy(v + (size_t)i * DIM, r->v, sizeof(r->v));
	}
	cr_assert_eq(dmann_put(d, "sbkt", "sidx", n, (const char *const *)keys, v, DIM,
			       (const char *const *)meta), 0, "put: %s", dmann_errmsg());
	for (uint32_t i = 0; i < n; i++) {
		free(keys[i]);
		free(meta[i]);
	}
	free(keys);
	free(meta);
	free(v);
}

static int cmp(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

struct totals {
	unsigned queries;
	double recall;
	long long rows_read, other_rows;
};

/* One scoped query of tenant t (the filter's form by t and round): its answer against the
 * brute force, and the counters' deltas against the tenant's live rows. */
static void query_tenant(int t, int round, struct totals *tot)
{
	float q[DIM];
	char body[2048], filter[256], *p = body;
	int form = (t + round) % 3, st;
	uint32_t live = 0, cand = 0;

	for (int j = 0; j < DIM; j++)
		q[j] = val(1000003u * (uint64_t)(round + 1) + (uint64_t)t, (uint32_t)j);
	if (form == 0)
		snprintf(filter, sizeof(filter), "{\"tenant\":\"t%d\"}", t);
	else if (form == 1)
		snprintf(filter, sizeof(filter), "{\"tenant\":{\"$eq\":\"t%d\"}}", t);
	else
		snprintf(filter, sizeof(filter), "{\"$and\":[{\"grp\":{\"$ne\":1}},{\"tenant\":"
			 "{\"$eq\":\"t%d\"}}]}", t);
	p += sprintf(p, "{\"vectorBucketName\":\"sbkt\",\"indexName\":\"sidx\",\"topK\":%d,"
		     "\"returnDistance\":true,\"filter\":%s,\"queryVector\":{\"float32\":[", K,
		     filter);
	for (int j = 0; j < DIM; j++)
		p += sprintf(p, "%s%.9g", j ? "," : "", (double)q[j]);
	sprintf(p, "]}}");
	/* the brute force: the K-th distance among the tenant's live rows passing the filter */
	float *dist = malloc(nrows * sizeof(float));

	cr_assert_not_null(dist);
	for (uint32_t r = 0; r < nrows; r++) {
		if (!rows[r].alive || rows[r].tenant != t)
			continue;
		live++;
		if (form == 2 && rows[r].grp == 1)
			continue;
		dist[cand++] = l2(q, rows[r].v);
	}
	qsort(dist, cand, sizeof(float), cmp);
	float kth = cand ? dist[DM_MIN(cand, (uint32_t)K) - 1] : 0;

	free(dist);
	long long q0 = both("dmann_cn_s3_scope_queries_total");
	long long r0 = both("dmann_cn_s3_scope_rows_total");
	long long o0 = both("dmann_cn_s3_scope_other_rows_total");
	json_t *o = http_call("QueryVectors", body, &st), *e;
	size_t i;
	unsigned hit = 0;

	cr_assert_eq(st, 200, "tenant t%d: %d %s", t, st,
		     json_string_value(json_object_get(o, "message")));
	json_t *vs = json_object_get(o, "vectors");

	cr_assert_eq(json_array_size(vs), DM_MIN(cand, (uint32_t)K), "tenant t%d: %zu hits of %u",
		     t, json_array_size(vs), DM_MIN(cand, (uint32_t)K));
	json_array_foreach(vs, i, e) {
		const char *k = json_string_value(json_object_get(e, "key"));
		unsigned r;

		cr_assert(k && sscanf(k, "k%u", &r) == 1 && r < nrows, "key %s", k);
		cr_assert(rows[r].alive && rows[r].tenant == t, "t%d answered %s (tenant %d%s)", t,
			  k, rows[r].tenant, rows[r].alive ? "" : ", deleted");
		cr_assert(form != 2 || rows[r].grp != 1, "t%d: %s does not pass the filter", t, k);
		/* exact: within the brute force's K nearest (ties at the K-th distance kept) */
		hit += l2(q, rows[r].v) <= kth * (1.0f + 1e-5f) + 1e-6f;
	}
	json_decref(o);
	long long dq = both("dmann_cn_s3_scope_queries_total") - q0;
	long long dr = both("dmann_cn_s3_scope_rows_total") - r0;
	long long dother = both("dmann_cn_s3_scope_other_rows_total") - o0;

	cr_assert_eq(dq, nshard, "tenant t%d: not planned as a scoped query (once per shard)", t);
	cr_assert_eq(dr, (long long)live, "tenant t%d: %lld rows read, it has %u live rows", t, dr,
		     live);
	cr_assert_eq(dother, 0, "tenant t%d: %lld rows of other scopes read", t, dother);
	tot->queries++;
	tot->recall += cand ? (double)hit / DM_MIN(cand, (uint32_t)K) : 1.0;
	tot->rows_read += dr;
	tot->other_rows += dother;
}

static void all_tenants(int round, const char *what)
{
	struct totals tot = { 0 };
	uint64_t t0 = dm_now_ns();
	long long fk = both("dmann_cn_s3_scope_fragments_total");
	long long fs = both("dmann_cn_s3_scope_fragments_skipped_total");

	for (int t = 0; t < nt; t++)
		query_tenant(t, round, &tot);
	fk = both("dmann_cn_s3_scope_fragments_total") - fk;
	fs = both("dmann_cn_s3_scope_fragments_skipped_total") - fs;
	fprintf(stderr, "FIGURES scoped queries (%s): %u tenants, recall@%d %.4f, %lld rows read "
		"(all of their tenants' live rows), %lld rows of other scopes, %lld fragments "
		"read and %lld skipped, %.1f s\n", what, tot.queries, K, tot.recall / tot.queries,
		tot.rows_read, tot.other_rows, fk, fs, (double)(dm_now_ns() - t0) / 1e9);
	cr_assert_eq(tot.recall, (double)tot.queries, "recall %.4f", tot.recall / tot.queries);
	cr_assert_gt(fs, fk, "most fragments are other tenants'");
}

static void restart_mns(void)
{
	for (int m = 0; m < 2; m++) {
		char node[8];

		snprintf(node, sizeof(node), "mn%d", m);
		cr_assert_eq(kill(cluster_pid_of(lc, node), SIGKILL), 0);
	}
	usleep(300000);
	for (int m = 0; m < 2; m++)
		cr_assert_eq(sh("cd %s && (setsid %s --config %s --id %d >>mn%d.log 2>&1 & "
				"echo \"$! mn%db\" >>pids)", lc, dmann_mn, cfgpath, m, m, m), 0);
	/* until the gateway serves the index again */
	uint64_t t0 = dm_now_ns();

	for (;;) {
		int st;
		json_t *o = http_call("QueryVectors", "{\"vectorBucketName\":\"sbkt\",\"indexName\":"
				      "\"sidx\",\"topK\":1,\"filter\":{\"tenant\":\"t0\"},"
				      "\"queryVector\":{\"float32\":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,"
				      "0]}}", &st);

		json_decref(o);
		if (st == 200)
			break;
		cr_assert_lt(dm_now_ns() - t0, bound_s(60), "the index is not served after the "
			     "memory nodes' restart (%d)", st);
		usleep(300000);
	}
}

/* The rows: tenant t (of nt) has 40 + (53 t mod 160) rows, interleaved; then NX without
 * one. */
static void make_rows(void)
{
	uint32_t per[NT], left = 0;

	for (int t = 0; t < nt; t++)
		left += per[t] = 40 + (uint32_t)(53 * t) % 160;
	nrows = left + NX;
	rows = calloc(nrows, sizeof(*rows));
	cr_assert_not_null(rows);
	for (uint32_t r = 0, t = 0; r < nrows; r++) {
		if (r < left) {
			while (!per[t % nt])
				t++;
			rows[r].tenant = (int)(t % nt);
			per[t % nt]--;
			t++;
		} else {
			rows[r].tenant = -1;
		}
		rows[r].grp = (int)(r % 3);
		rows[r].alive = true;
		for (int j = 0; j < DIM; j++)
			rows[r].v[j] = val(r, (uint32_t)j);
	}
}

Test(scope, scoped_queries_read_only_their_scope)
{
	uint64_t t0 = dm_now_ns();

	cr_assert_eq(sh("%s local up --mn 2 --cn 2 --redundancy 1 --dir %s --region-mb 32 "
			"--transport tcp --mn-set flat_frag_rows=64 --s3-set width=2 --s3-set "
			"graph_min_rows=2000 --s3-set hedge_ms=20000", dmann, lc), 0);
	cluster_http(cfgpath, http);
	make_rows();
	/* declarations: refused, then the scoped index */
	expect("CreateVectorBucket", 200, "{\"vectorBucketName\":\"sbkt\"}");
	expect("CreateIndex", 400, "{\"vectorBucketName\":\"sbkt\",\"indexName\":\"bad\","
	       "\"dataType\":\"float32\",\"dimension\":16,\"distanceMetric\":\"euclidean\","
	       "\"metadataConfiguration\":{\"nonFilterableMetadataKeys\":[\"tenant\"]},"
	       "\"tags\":{\"dmann:scope\":\"tenant\"}}");
	expect("CreateIndex", 200, "{\"vectorBucketName\":\"sbkt\",\"indexName\":\"sidx\","
	       "\"dataType\":\"float32\",\"dimension\":16,\"distanceMetric\":\"euclidean\","
	       "\"tags\":{\"dmann:scope\":\"tenant\"}}");
	expect("TagResource", 200, "{\"resourceArn\":\"arn:aws:s3vectors:us-east-1:"
	       "000000000000:bucket/sbkt/index/sidx\",\"tags\":{\"team\":\"a\"}}");
	expect("TagResource", 400, "{\"resourceArn\":\"arn:aws:s3vectors:us-east-1:"
	       "000000000000:bucket/sbkt/index/sidx\",\"tags\":{\"dmann:scope\":\"grp\"}}");
	expect("PutVectors", 400, "{\"vectorBucketName\":\"sbkt\",\"indexName\":\"sidx\","
	       "\"vectors\":[{\"key\":\"x\",\"data\":{\"float32\":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,"
	       "0,1]},\"metadata\":{\"tenant\":7}}]}");

	dmann_t *d = dmann_connect(cfgpath, "local");

	cr_assert_not_null(d, "connect: %s", dmann_errmsg());
	put_rows(d, 0, nrows);
	fprintf(stderr, "put %u rows of %d tenants (+%d without one) in %.1f s since start\n",
		nrows, nt, NX, (double)(dm_now_ns() - t0) / 1e9);
	all_tenants(0, "as written");

	/* an unscoped query still works, and a filter that does not pin the tenant is not
	 * scoped */
	long long q0 = both("dmann_cn_s3_scope_queries_total");

	expect("QueryVectors", 200, "{\"vectorBucketName\":\"sbkt\",\"indexName\":\"sidx\","
	       "\"topK\":3,\"queryVector\":{\"float32\":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}}");
	expect("QueryVectors", 200, "{\"vectorBucketName\":\"sbkt\",\"indexName\":\"sidx\","
	       "\"topK\":3,\"filter\":{\"$or\":[{\"tenant\":\"t1\"},{\"tenant\":\"t2\"}]},"
	       "\"queryVector\":{\"float32\":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}}");
	cr_assert_eq(both("dmann_cn_s3_scope_queries_total"), q0);

	/* 20 keys of t5 move to t6 (new vectors), 20 keys of t7 are deleted */
	uint32_t moved = 0, gone = 0, lo = nrows, hi = 0;
	char *del[20];

	for (uint32_t r = 0; r < nrows && (moved < 20 || gone < 20); r++) {
		if (rows[r].tenant == 5 && moved < 20) {
			rows[r].tenant = 6;
			for (int j = 0; j < DIM; j++)
				rows[r].v[j] = val(r + 7777777u, (uint32_t)j);
			lo = DM_MIN(lo, r);
			hi = DM_MAX(hi, r + 1);
			moved++;
		} else if (rows[r].tenant == 7 && gone < 20) {
			rows[r].alive = false;
			cr_assert_geq(asprintf(&del[gone++], "k%u", r), 0);
		}
	}
	put_rows(d, lo, hi);        /* the rows between them again as they are: the same */
	cr_assert_eq(dmann_delete(d, "sbkt", "sidx", 20, (const char *const *)del), 0,
		     "delete: %s", dmann_errmsg());
	for (int i = 0; i < 20; i++)
		free(del[i]);
	all_tenants(1, "after 20 keys moved t5 -> t6 and 20 of t7 deleted");

	/* both memory nodes SIGKILLed and restarted: WAL replay keeps the scopes */
	restart_mns();
	all_tenants(2, "after both memory nodes were SIGKILLed and restarted");
	dmann_close(d);

	cr_assert_eq(both("dmann_cn_s3_index_graphs_seeded_total"), 0,
		     "a scoped index got a graph");
	fprintf(stderr, "FIGURES test_scope: %.1f s in all\n", (double)(dm_now_ns() - t0) / 1e9);
}

/* A bucket of 3 shards ([s3] bucket_shards): every shard's index is scoped, each shard is
 * scanned on its scope value's fragments. 20 tenants. */
Test(scope, scoped_queries_on_a_bucket_of_shards)
{
	nt = 20;
	nshard = 3;
	cr_assert_eq(sh("%s local up --mn 2 --cn 2 --redundancy 1 --dir %s --region-mb 32 "
			"--transport tcp --mn-set flat_frag_rows=64 --s3-set width=2 --s3-set "
			"hedge_ms=20000 --s3-set bucket_shards=3", dmann, lc), 0);
	cluster_http(cfgpath, http);
	make_rows();
	expect("CreateVectorBucket", 200, "{\"vectorBucketName\":\"sbkt\"}");
	expect("CreateIndex", 200, "{\"vectorBucketName\":\"sbkt\",\"indexName\":\"sidx\","
	       "\"dataType\":\"float32\",\"dimension\":16,\"distanceMetric\":\"euclidean\","
	       "\"tags\":{\"dmann:scope\":\"tenant\"}}");
	dmann_t *d = dmann_connect(cfgpath, "local");

	cr_assert_not_null(d, "connect: %s", dmann_errmsg());
	put_rows(d, 0, nrows);
	dmann_close(d);
	all_tenants(0, "a bucket of 3 shards");
}
