/* test_shards.c: an S3 index larger than any one memory node's flat store (issue 13 point
 * 4): a bucket of [s3] bucket_shards 4 keeps its rows in 4 shards, each on its own
 * memory nodes (R = 1 here), so it holds more rows than one memory node takes
 * ([mn] flat_max_mb = 1). Every row is gettable, listed once, found first by its own
 * vector through the exact scan of every shard; deletes reach their shard; users can
 * neither name nor see a shard's bucket. A second cluster with the default (1 shard)
 * answers as before.
 *
 * Local clusters of 3 memory and 2 compute nodes; the HTTP calls (ListVectors,
 * ListVectorBuckets, a refused name) are made with curl's SigV4 signing. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cluster_util.h"
#include "cluster_s3.h"
#include "config.h"
#include "distance.h"
#include "dmann.h"
#include "flat.h"
#include "s3_api.h"
#include "topk.h"

#define DIM 32
#define IX "shx"

static char dir[128], lc[160], dmann[300], cfgpath[256], http[128];

static void up(const char *extra)
{
	const char *root = getenv("DMANN_BUILD_ROOT");

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-shards-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(lc, sizeof(lc), "%s/lc", dir);
	cr_assert_eq(sh("%s local up --mn 3 --cn 2 --redundancy 1 --dir %s --region-mb 32 "
			"--transport tcp --mn-set flat_max_mb=1 %s", dmann,
			lc, extra), 0);
	snprintf(cfgpath, sizeof(cfgpath), "%s/cluster.ini", lc);
	cluster_http(cfgpath, http);
}

static void teardown(void)
{
	sh("%s local down --dir %s", dmann, lc);
	if (!getenv("DMANN_KEEP_TEST_DIR"))
		sh("rm -rf %s", dir);
}

TestSuite(shards, .fini = teardown, .timeout = 600);

/* POST op with body to cn0's gateway (SigV4 by curl): the response's JSON and *status. */
static json_t *http_call(const char *op, const char *body, int *status)
{
	json_t *o = cluster_s3_call(lc, dir, http, op, body, status);

	cr_assert_not_null(o, "%s: the answer is not JSON", op);
	return o;
}

static float val(uint32_t row, uint32_t j)
{
	uint64_t h = (uint64_t)row * 0x9e3779b97f4a7c15ull + j * 0xbf58476d1ce4e5b9ull;

	h ^= h >> 29;
	h *= 0x94d049bb133111ebull;
	h ^= h >> 32;
	return (float)(h % 20000) / 1000.0f - 10.0f;
}

static void key_of(uint32_t row, char *k)
{
	snprintf(k, 24, "k%07u", row);
}

/* Every key of the index through ListVectors pages (maxResults 300: several pages per
 * shard): each row once. */
static void list_all(const char *bucket, uint32_t n, const uint8_t *gone)
{
	uint8_t *seen = calloc(n, 1);
	char *tok = NULL;
	uint32_t total = 0, pages = 0;

	cr_assert_not_null(seen);
	do {
		char body[2048];
		int st;
		json_t *o, *e;
		size_t i;

		snprintf(body, sizeof(body), "{\"vectorBucketName\":\"%s\",\"indexName\":\"" IX
			 "\",\"maxResults\":300%s%s%s}", bucket, tok ? ",\"nextToken\":\"" : "",
			 tok ? tok : "", tok ? "\"" : "");
		o = http_call("ListVectors", body, &st);
		cr_assert_eq(st, 200, "ListVectors: %d", st);
		json_array_foreach(json_object_get(o, "vectors"), i, e) {
			const char *k = json_string_value(json_object_get(e, "key"));
			unsigned row;

			cr_assert(k && sscanf(k, "k%u", &row) == 1 && row < n, "key %s", k);
			cr_assert_not(seen[row], "key %s listed twice", k);
			cr_assert_not(gone && gone[row], "deleted key %s listed", k);
			seen[row] = 1;
			total++;
		}
		free(tok);
		tok = json_is_string(json_object_get(o, "nextToken")) ?
			strdup(json_string_value(json_object_get(o, "nextToken"))) : NULL;
		json_decref(o);
		pages++;
		cr_assert_lt(pages, 1000);
	} while (tok);
	for (uint32_t r = 0; r < n; r++)
		cr_assert(seen[r] || (gone && gone[r]), "row %u not listed", r);
	fprintf(stderr, "ListVectors: %u keys in %u pages\n", total, pages);
	free(seen);
}

/* The user-visible buckets: exactly the one named. */
static void buckets_are(const char *bucket)
{
	int st;
	json_t *o = http_call("ListVectorBuckets", "{\"maxResults\":1}", &st), *a;
	uint32_t pages = 0;

	for (;;) {
		cr_assert_eq(st, 200);
		a = json_object_get(o, "vectorBuckets");
		if (json_array_size(a)) {
			cr_assert_eq(json_array_size(a), 1);
			cr_assert_str_eq(json_string_value(json_object_get(json_array_get(a, 0),
									   "vectorBucketName")), bucket);
			pages++;
		}
		const char *t = json_string_value(json_object_get(o, "nextToken"));
		char body[600];

		if (!t)
			break;
		snprintf(body, sizeof(body), "{\"maxResults\":1,\"nextToken\":\"%s\"}", t);
		json_decref(o);
		o = http_call("ListVectorBuckets", body, &st);
	}
	json_decref(o);
	cr_assert_eq(pages, 1, "one bucket listed, got %u", pages);
}

/* n rows into bucket/IX, then each row got back exactly, every row listed once, a sample
 * found first by its own vector (the exact scan), deletes applied. */
static void rows_round_trip(dmann_t *d, const char *bucket, uint32_t n)
{
	float *v = malloc(sizeof(float) * (size_t)n * DIM), *back;
	char **keys = malloc(sizeof(char *) * n);
	uint8_t *found = malloc(n), *gone = calloc(n, 1);
	enum { NQ = 64, NDEL = 200 };

	cr_assert(v && keys && found && gone);
	for (uint32_t r = 0; r < n; r++) {
		keys[r] = malloc(24);
		key_of(r, keys[r]);
		for (uint32_t j = 0; j < DIM; j++)
			v[(size_t)r * DIM + j] = val(r, j);
	}
	uint64_t t0 = dm_now_ns();

	cr_assert_eq(dmann_put(d, bucket, IX, n, (const char *const *)keys, v, DIM, NULL), 0,
		     "put: %s", dmann_errmsg());
	fprintf(stderr, "put %u rows in %.2f s\n", n, (dm_now_ns() - t0) / 1e9);
	back = malloc(sizeof(float) * (size_t)n * DIM);
	cr_assert_not_null(back);
	cr_assert_eq(dmann_get(d, bucket, IX, n, (const char *const *)keys, back, DIM, found),
		     (int)n, "get: %s", dmann_errmsg());
	cr_assert_eq(memcmp(back, v, sizeof(float) * (size_t)n * DIM), 0,
		     "every vector must come back exactly");
	list_all(bucket, n, NULL);

	char *got[NQ];
	float dist[NQ], qv[NQ * DIM];
	uint32_t cnt[NQ];

	for (uint32_t i = 0; i < NQ; i++)
		memcpy(qv + i * DIM, v + (size_t)(i * (n / NQ)) * DIM, sizeof(float) * DIM);
	cr_assert_eq(dmann_batch_query(d, bucket, IX, qv, NQ, DIM, 1, got, dist, cnt), 0,
		     "query: %s", dmann_errmsg());
	for (uint32_t i = 0; i < NQ; i++) {
		cr_assert_eq(cnt[i], 1);
		cr_assert_str_eq(got[i], keys[i * (n / NQ)], "query %u", i);
		cr_assert_leq(dist[i], 1e-4f);
	}
	dmann_free_keys(got, NQ);
	/* Deletes reach their shard: gone from gets, lists and queries. */
	for (uint32_t i = 0; i < NDEL; i++)
		gone[i * (n / NDEL)] = 1;
	{
		const char *dk[NDEL];

		for (uint32_t i = 0; i < NDEL; i++)
			dk[i] = keys[i * (n / NDEL)];
		cr_assert_eq(dmann_delete(d, bucket, IX, NDEL, dk), 0, "%s", dmann_errmsg());
		cr_assert_eq(dmann_get(d, bucket, IX, NDEL, dk, NULL, DIM, found), 0);
	}
	cr_assert_eq(dmann_query(d, bucket, IX, v, DIM, 1, got, dist), 1);
	cr_assert_str_neq(got[0], keys[0], "a deleted row was found");
	dmann_free_keys(got, 1);
	list_all(bucket, n, gone);
	for (uint32_t r = 0; r < n; r++)
		free(keys[r]);
	free(keys);
	free(v);
	free(back);
	free(found);
	free(gone);
}

/* A bucket name whose 4 shards are placed (R = 1) with at most 2 on any memory node:
 * into name; the most shards on one node. */
static uint32_t pick_bucket(const struct dm_cluster_cfg *cfg, char *name)
{
	for (int c = 0; c < 100; c++) {
		uint32_t per[DM_MAX_NODES] = { 0 }, most = 0;

		snprintf(name, 32, "sharded%d", c);
		for (uint32_t s = 0; s < 4; s++) {
			char sn[FLAT_NAME_MAX + 1];
			uint32_t mns[DM_MAX_NODES];

			cr_assert_eq(s3_shard_name(name, s, sn), 0);
			cr_assert_eq(flat_bucket_mns(cfg, sn, mns), 1);
			per[mns[0]]++;
			most = DM_MAX(most, per[mns[0]]);
		}
		if (most <= 2)
			return most;
	}
	cr_assert_fail("no bucket name spreads 4 shards over 3 nodes");
	return 0;
}

Test(shards, index_larger_than_one_memory_node)
{
	struct dm_cluster_cfg cfg;
	char err[512], bucket[32];
	uint32_t most, per[DM_MAX_NODES] = { 0 }, busiest = 0;
	uint64_t rb = flat_row_bytes(DIM, 8, 0, 0), cap = (1ull << 20) / rb, n;

	up("--s3-set bucket_shards=4 --s3-set graph_auto=0");
	cr_assert_eq(dm_config_load(cfgpath, &cfg, err, sizeof(err)), 0, "%s", err);
	most = pick_bucket(&cfg, bucket);
	/* Rows: 1.5 x what one memory node takes, unless the busiest node's shards would
	 * then not fit (each shard ~1/4 of the rows). */
	n = cap * 3 / 2;
	for (uint32_t r = 0; r < n; r++) {
		char k[24], sn[FLAT_NAME_MAX + 1];
		uint32_t mns[DM_MAX_NODES];

		key_of(r, k);
		cr_assert_eq(s3_shard_name(bucket, s3_key_shard(k, strlen(k), 4), sn), 0);
		cr_assert_eq(flat_bucket_mns(&cfg, sn, mns), 1);
		per[mns[0]]++;
		busiest = DM_MAX(busiest, per[mns[0]]);
	}
	fprintf(stderr, "%s: %llu rows of %llu bytes, one memory node takes %llu; at most %u "
		"shards and %u rows on one\n", bucket, (unsigned long long)n,
		(unsigned long long)rb, (unsigned long long)cap, most, busiest);
	cr_assert_gt(n, cap + cap / 4, "the index must not fit on one memory node");
	cr_assert_lt(busiest, cap * 95 / 100, "the busiest node's shards must fit");

	dmann_t *d = dmann_connect(cfgpath, "local");

	cr_assert_not_null(d, "connect: %s", dmann_errmsg());
	cr_assert_eq(dmann_create_index(d, bucket, IX, DIM, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	rows_round_trip(d, bucket, (uint32_t)n);
	buckets_are(bucket);

	/* Users cannot name a shard's bucket, nor send what gateways tell memory nodes. */
	int st;
	char body[256];
	json_t *o;

	snprintf(body, sizeof(body), "{\"vectorBucketName\":\"%s#1\",\"indexName\":\"" IX "\","
		 "\"keys\":[\"k0000001\"]}", bucket);
	o = http_call("GetVectors", body, &st);
	cr_assert_eq(st, 400);
	cr_assert_str_eq(json_string_value(json_object_get(o, "__type")), "ValidationException");
	json_decref(o);
	o = http_call("CreateVectorBucket", "{\"vectorBucketName\":\"new#1\"}", &st);
	cr_assert_eq(st, 400);
	json_decref(o);
	snprintf(body, sizeof(body), "{\"vectorBucketName\":\"%s\",\"_dmannShards\":1}", bucket);
	o = http_call("GetVectorBucket", body, &st);
	cr_assert_eq(st, 400);
	json_decref(o);
	cr_assert_eq(dmann_create_index(d, "x#1", IX, DIM, DMANN_EUCLIDEAN), -EINVAL);

	/* The index and the bucket go with their shards: made again, empty. */
	cr_assert_eq(dmann_drop_index(d, bucket, IX), 0, "%s", dmann_errmsg());
	cr_assert_eq(dmann_create_index(d, bucket, IX, DIM, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	{
		const char *k1[1] = { "k0000005" };

		cr_assert_eq(dmann_get(d, bucket, IX, 1, k1, NULL, DIM, NULL), 0);
	}
	dmann_close(d);
}

/* The default, one shard per bucket: the same answers, no shard bucket anywhere. */
Test(shards, one_shard_as_before)
{
	dmann_t *d;

	up("--s3-set graph_auto=0");
	d = dmann_connect(cfgpath, "local");
	cr_assert_not_null(d, "connect: %s", dmann_errmsg());
	cr_assert_eq(dmann_create_index(d, "plain", IX, DIM, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	rows_round_trip(d, "plain", 2000);
	buckets_are("plain");
	/* What the sharded bucket holds does not fit in a bucket of one shard: its memory node
	 * refuses the rows past its [mn] flat_max_mb (402 ServiceQuotaExceededException). */
	uint64_t n = (1ull << 20) / flat_row_bytes(DIM, 8, 0, 0) * 3 / 2;
	float *v = calloc(n * DIM, sizeof(float));
	char **keys = malloc(n * sizeof(char *));

	cr_assert(v && keys);
	for (uint64_t r = 0; r < n; r++) {
		keys[r] = malloc(24);
		key_of((uint32_t)r, keys[r]);
		v[r * DIM] = (float)r;
	}
	cr_assert_eq(dmann_create_index(d, "plain", "big", DIM, DMANN_EUCLIDEAN), 0);
	cr_assert_neq(dmann_put(d, "plain", "big", n, (const char *const *)keys, v, DIM, NULL), 0);
	cr_assert(strstr(dmann_errmsg(), "full"), "%s", dmann_errmsg());
	for (uint64_t r = 0; r < n; r++)
		free(keys[r]);
	free(keys);
	free(v);
	dmann_close(d);
}

/* Sum of metric name over the 2 compute nodes. */
static long long cn_sum(const char *name)
{
	long long v = 0;

	for (unsigned c = 0; c < 2; c++) {
		long long x = cluster_metric(lc, c, name);

		cr_assert_geq(x, 0, "cn%u: no %s", c, name);
		v += x;
	}
	return v;
}

/* Graphs the memory nodes hold (dmann graph list): lines with a generation. */
static unsigned graphs_listed(void)
{
	char out[256];
	FILE *f;
	unsigned n = 0, g;
	unsigned long long gen;
	char line[512];

	snprintf(out, sizeof(out), "%s/graphs.txt", dir);
	if (sh("%s graph list --config %s > %s 2>/dev/null", dmann, cfgpath, out))
		return 0;
	f = fopen(out, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f))
		n += sscanf(line, "%u %llu", &g, &gen) == 2;
	fclose(f);
	return n;
}

/* Issue 13 point 4, indexed: a bucket of 4 shards holding more than any memory node takes
 * (rows: 1.5x one node's [mn] flat_max_mb; with its graphs: more bytes than one node's
 * flat store and region together) is written, indexed (each shard's index gets its own
 * graph, seeded at graph_min_rows and kept current by the online indexers) and queried
 * (every shard's graph, merged): recall@10 against the test's brute force, self-find,
 * no tail row scanned once indexed, deleted keys never returned. */
Test(shards, larger_index_indexed_and_queried_by_graphs)
{
	struct dm_cluster_cfg cfg;
	char err[512], bucket[32];
	uint64_t rb = flat_row_bytes(DIM, 8, 0, 0), cap = (1ull << 20) / rb;
	uint32_t n = (uint32_t)(cap * 3 / 2), half = n / 2;
	enum { NQ = 64, K = 10, NDEL = 100 };

	/* regions of 8 MiB: the 4 graphs take more than one, less than three */
	up("--s3-set bucket_shards=4 --s3-set graph_min_rows=300 --s3-set graph_room=1500 "
	   "--s3-set index_interval_ms=200 --region-mb 8");
	cr_assert_eq(dm_config_load(cfgpath, &cfg, err, sizeof(err)), 0, "%s", err);
	long long base[3];   /* region bytes in use before the index */

	for (unsigned m = 0; m < 3; m++) {
		base[m] = cluster_node_metric(lc, "mn", m, "dmann_mn_region_used_bytes");
		cr_assert_geq(base[m], 0, "mn%u metrics", m);
	}
	pick_bucket(&cfg, bucket);

	float *v = malloc(sizeof(float) * (size_t)n * DIM);
	char **keys = malloc(sizeof(char *) * n);

	cr_assert(v && keys);
	for (uint32_t r = 0; r < n; r++) {
		keys[r] = malloc(24);
		key_of(r, keys[r]);
		for (uint32_t j = 0; j < DIM; j++)
			v[(size_t)r * DIM + j] = val(r, j);
	}
	dmann_t *d = dmann_connect(cfgpath, "local");

	cr_assert_not_null(d, "connect: %s", dmann_errmsg());
	cr_assert_eq(dmann_create_index(d, bucket, IX, DIM, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	/* The first half: each shard's index passes graph_min_rows and gets its graph. */
	cr_assert_eq(dmann_put(d, bucket, IX, half, (const char *const *)keys, v, DIM, NULL), 0,
		     "put: %s", dmann_errmsg());
	uint64_t t0 = dm_now_ns();
	unsigned ng;

	while ((ng = graphs_listed()) < 4) {
		cr_assert_lt(dm_now_ns() - t0, 120000000000ull, "%u of 4 shard graphs after 120 s",
			     ng);
		sleep(1);
	}
	fprintf(stderr, "4 shard graphs seeded in %.1f s\n", (dm_now_ns() - t0) / 1e9);
	/* The second half: indexed online into the shards' graphs. */
	cr_assert_eq(dmann_put(d, bucket, IX, n - half, (const char *const *)keys + half,
			       v + (size_t)half * DIM, DIM, NULL), 0, "put: %s", dmann_errmsg());
	/* Indexed: a query searches the graph of every shard and scans no tail row (the lag
	 * gauge alone may read 0 before an indexer has looked at the new rows). */
	t0 = dm_now_ns();
	for (;;) {
		long long g0 = cn_sum("dmann_cn_s3_graph_queries_total");
		long long r0 = cn_sum("dmann_cn_s3_graph_tail_rows_total");
		char *k1[1];
		float d1[1];

		cr_assert_eq(dmann_query(d, bucket, IX, v, DIM, 1, k1, d1), 1, "%s",
			     dmann_errmsg());
		dmann_free_keys(k1, 1);
		if (cn_sum("dmann_cn_s3_graph_queries_total") - g0 == 4 &&
		    cn_sum("dmann_cn_s3_graph_tail_rows_total") == r0 &&
		    cn_sum("dmann_cn_s3_index_lag_rows") == 0)
			break;
		cr_assert_lt(dm_now_ns() - t0, 300000000000ull, "rows still past the marks");
		sleep(1);
	}
	fprintf(stderr, "second half indexed %.1f s after its put; %lld rows handed over\n",
		(dm_now_ns() - t0) / 1e9, cn_sum("dmann_cn_s3_indexed_rows_total"));
	cr_assert_eq(graphs_listed(), 4, "one graph per shard");

	/* The footprint: more than any memory node holds, flat store and region together. */
	long long used = 0, most = 0;

	for (unsigned m = 0; m < 3; m++) {
		long long fb = cluster_node_metric(lc, "mn", m, "dmann_mn_flat_bytes");
		long long ru = cluster_node_metric(lc, "mn", m, "dmann_mn_region_used_bytes");
		long long fm = cluster_node_metric(lc, "mn", m, "dmann_mn_flat_max_bytes");
		long long rg = cluster_node_metric(lc, "mn", m, "dmann_mn_region_bytes");

		cr_assert(fb >= 0 && ru >= 0 && fm > 0 && rg > 0, "mn%u metrics", m);
		fprintf(stderr, "mn%u: flat %lld of %lld bytes, region %lld of %lld (%lld before "
			"the index)\n", m, fb, fm, ru, rg, base[m]);
		used += fb + ru - base[m];
		most = DM_MAX(most, fm + rg);
	}
	fprintf(stderr, "index and graphs: %lld bytes; one memory node holds at most %lld\n",
		used, most);
	cr_assert_gt(used, most, "the index must not fit on one memory node");

	/* Queries: recall@10 of NQ other vectors against the brute force, and self-find. */
	float qv[NQ * DIM], dist[NQ * K];
	char *got[NQ * K];
	uint32_t cnt[NQ];
	long long gq0 = cn_sum("dmann_cn_s3_graph_queries_total");
	long long tr0 = cn_sum("dmann_cn_s3_graph_tail_rows_total");
	unsigned hit = 0, self = 0;

	for (uint32_t i = 0; i < NQ; i++)
		for (uint32_t j = 0; j < DIM; j++)
			qv[i * DIM + j] = val(n + 1000 + i, j);
	cr_assert_eq(dmann_batch_query(d, bucket, IX, qv, NQ, DIM, K, got, dist, cnt), 0,
		     "query: %s", dmann_errmsg());
	struct dm_topk *tk = dm_topk_new(K);

	cr_assert_not_null(tk);
	for (uint32_t i = 0; i < NQ; i++) {
		struct dm_hit best[K];

		dm_topk_reset(tk);
		for (uint32_t r = 0; r < n; r++)
			dm_topk_push(tk, dm_l2sq(qv + i * DIM, v + (size_t)r * DIM, DIM), r);
		cr_assert_eq(dm_topk_drain(tk, best), K);
		cr_assert_eq(cnt[i], K);
		for (uint32_t a = 0; a < K; a++)
			for (uint32_t b = 0; b < K; b++)
				hit += !strcmp(got[i * K + a], keys[best[b].id]);
	}
	dm_topk_free(tk);
	dmann_free_keys(got, NQ * K);
	for (uint32_t i = 0; i < NQ; i++)
		memcpy(qv + i * DIM, v + (size_t)(i * (n / NQ)) * DIM, sizeof(float) * DIM);
	cr_assert_eq(dmann_batch_query(d, bucket, IX, qv, NQ, DIM, 1, got, dist, cnt), 0,
		     "query: %s", dmann_errmsg());
	for (uint32_t i = 0; i < NQ; i++)
		self += cnt[i] == 1 && !strcmp(got[i], keys[i * (n / NQ)]) && dist[i] <= 1e-4f;
	dmann_free_keys(got, NQ);
	long long gq = cn_sum("dmann_cn_s3_graph_queries_total") - gq0;
	long long tr = cn_sum("dmann_cn_s3_graph_tail_rows_total") - tr0;

	fprintf(stderr, "recall@10 %.4f over %u queries; self-find %u of %u; %lld shard graph "
		"searches for %u queries; %lld tail rows scanned\n", hit / (double)(NQ * K), NQ,
		self, NQ, gq, 2 * NQ, tr);
	cr_assert_geq(hit, NQ * K * 95 / 100, "recall@10 %u of %u", hit, NQ * K);
	cr_assert_eq(self, NQ, "self-find %u of %u", self, NQ);
	cr_assert_eq(gq, 4 * 2 * NQ, "every query searches the graph of each of the 4 shards");
	cr_assert_eq(tr, 0, "every row indexed: no tail scanned");

	/* Deleted keys never come back (the graph still routes through them). */
	const char *dk[NDEL];

	for (uint32_t i = 0; i < NDEL; i++)
		dk[i] = keys[i * (n / NDEL)];
	cr_assert_eq(dmann_delete(d, bucket, IX, NDEL, dk), 0, "%s", dmann_errmsg());
	for (uint32_t i = 0; i < NDEL; i++)
		memcpy(qv + (i % NQ) * DIM, v + (size_t)(i * (n / NDEL)) * DIM, sizeof(float) * DIM);
	cr_assert_eq(dmann_batch_query(d, bucket, IX, qv, NQ, DIM, K, got, dist, cnt), 0,
		     "query: %s", dmann_errmsg());
	for (uint32_t i = 0; i < NQ * K; i++)
		for (uint32_t j = 0; j < NDEL && got[i]; j++)
			cr_assert_str_neq(got[i], dk[j], "deleted key %s returned", dk[j]);
	dmann_free_keys(got, NQ * K);

	/* DeleteIndex frees every shard's graph. */
	cr_assert_eq(dmann_drop_index(d, bucket, IX), 0, "%s", dmann_errmsg());
	t0 = dm_now_ns();
	while ((ng = graphs_listed()) > 0) {
		cr_assert_lt(dm_now_ns() - t0, 60000000000ull, "%u graphs left after DeleteIndex",
			     ng);
		sleep(1);
	}
	dmann_close(d);
	for (uint32_t r = 0; r < n; r++)
		free(keys[r]);
	free(keys);
	free(v);
}
