/* cli_demo_s3.c: the S3 Vectors part of `dmann demo`, on the index the demo bulk-imported
 * with `dmann load --bucket --name`: through libdmann (the S3 calls a user makes), 200 new
 * vectors are put (the tail), each found first by its own vector, found again once the
 * online indexer moved them into the graph (docs/api.md "Online indexing"), deleted again,
 * then 500 queries are answered with their recall@10 against the exact ground truth. QueryVectors
 * takes the graph path for the imported rows (docs/api.md "The graph path"): the compute
 * nodes count it in dmann_cn_s3_graph_queries_total. */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"

#include "cli.h"
#include "dmann.h"
#include "distance.h"
#include "topk.h"
#include "vecfile.h"

#define NEW 200u
#define NQ 500u
#define K 10u

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One counter of a node's Prometheus endpoint host:port (a plain HTTP GET /metrics), or
 * -1 when it cannot be read. */
static long long metric(const char *hostport, const char *name)
{
	char host[DM_ADDR_MAX], *port, *buf = NULL, *p;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	size_t n = 0, cap = 0;
	long long v = -1;
	ssize_t r;
	int fd = -1;

	snprintf(host, sizeof(host), "%s", hostport);
	port = strrchr(host, ':');
	if (!port)
		return -1;
	*port++ = 0;
	if (getaddrinfo(host, port, &hints, &ai) || (fd = socket(ai->ai_family, SOCK_STREAM, 0)) < 0 ||
	    connect(fd, ai->ai_addr, ai->ai_addrlen) ||
	    write(fd, "GET /metrics HTTP/1.0\r\n\r\n", 26) != 26)
		goto out;
	for (;;) {
		if (n + 4097 > cap) {
			char *nb = realloc(buf, cap = cap * 2 + 8192);

			if (!nb)
				goto out;
			buf = nb;
		}
		r = read(fd, buf + n, cap - n - 1);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	if (!buf)
		goto out;
	buf[n] = 0;
	for (p = buf; (p = strstr(p, name)); p++)
		if ((p == buf || p[-1] == '\n') && (p = strchr(p, ' '))) {
			v = strtoll(p + 1, NULL, 10);
			break;
		}
out:
	if (fd >= 0)
		close(fd);
	if (ai)
		freeaddrinfo(ai);
	free(buf);
	return v;
}

/* A counter summed over every compute node (-1: a node's counter not read). */
static long long cn_sum(const char *cfgpath, const char *name)
{
	struct dm_cluster_cfg *c = calloc(1, sizeof(*c));
	char err[512];
	long long sum = 0;

	if (!c || dm_config_load_client(cfgpath, "local", c, err, sizeof(err))) {
		free(c);
		return -1;
	}
	for (uint32_t i = 0; i < c->n_cn && sum >= 0; i++) {
		long long v = c->cn[i].metrics[0] ?
			metric(c->cn[i].metrics, name) : -1;

		sum = v < 0 ? -1 : sum + v;
	}
	free(c);
	return sum;
}

static long long graph_queries(const char *cfgpath)
{
	return cn_sum(cfgpath, "dmann_cn_s3_graph_queries_total");
}

/* Wait (at most 120 s) until the online indexer has moved want more rows than before
 * (indexed0) into the graph and no row is past the mark: the seconds it took, or -1. */
static double wait_indexed(const char *cfgpath, long long indexed0, unsigned want)
{
	double t0 = now_s();

	while (now_s() - t0 < 120) {
		long long rows = cn_sum(cfgpath, "dmann_cn_s3_indexed_rows_total");
		long long lag = cn_sum(cfgpath, "dmann_cn_s3_index_lag_rows");

		if (rows >= 0 && rows - indexed0 >= want && lag == 0)
			return now_s() - t0;
		usleep(200000);
	}
	return -1;
}

/* How many of the NEW written vectors find themselves first (-1: the query failed). */
static int self_find(dmann_t *d, const char *bucket, const char *index, const struct dm_vecs *q,
		     char (*names)[16], char **keys, float *dist, uint32_t *cnt)
{
	int self = 0;

	if (dmann_batch_query(d, bucket, index, q->data, NEW, q->dim, 1, keys, dist, cnt)) {
		fprintf(stderr, "dmann demo: query: %s\n", dmann_errmsg());
		return -1;
	}
	for (unsigned i = 0; i < NEW; i++)
		self += cnt[i] && !strcmp(keys[i], names[i]);
	dmann_free_keys(keys, NEW);
	return self;
}

int dm_demo_s3(const char *cfg, const char *query, const char *gt, const char *bucket,
	       const char *index)
{
	struct dm_vecs q = { 0 }, g = { 0 };
	char err[512], (*names)[16] = NULL, **keys = NULL;
	const char *kp[NEW];
	float *dist = NULL;
	uint32_t *cnt = NULL;
	unsigned self = 0;
	uint64_t hit = 0;
	dmann_t *d = NULL;
	double t0;
	int rc = 1;

	if (dm_vecs_read(query, DM_VF_AUTO, &q, err, sizeof(err)) ||
	    dm_vecs_read(gt, DM_VF_AUTO, &g, err, sizeof(err))) {
		fprintf(stderr, "dmann demo: %s\n", err);
		goto out;
	}
	if (q.n < NEW + NQ || g.n < q.n || g.dim < K) {
		fprintf(stderr, "dmann demo: %s has too few queries\n", query);
		goto out;
	}
	d = dmann_connect(cfg, "local");
	names = calloc(NEW, sizeof(*names));
	keys = calloc((size_t)NQ * K, sizeof(*keys));
	dist = malloc((size_t)NQ * K * sizeof(*dist));
	cnt = malloc(NQ * sizeof(*cnt));
	if (!d || !names || !keys || !dist || !cnt) {
		fprintf(stderr, "dmann demo: %s\n", d ? "out of memory" : dmann_errmsg());
		goto out;
	}
	/* Writes: the first NEW query vectors as new rows (keys new-0 ...). */
	for (unsigned i = 0; i < NEW; i++) {
		snprintf(names[i], sizeof(names[i]), "new-%u", i);
		kp[i] = names[i];
	}
	long long ix0 = cn_sum(cfg, "dmann_cn_s3_indexed_rows_total");

	t0 = now_s();
	if (dmann_put(d, bucket, index, NEW, kp, q.data, q.dim, NULL)) {
		fprintf(stderr, "dmann demo: put: %s\n", dmann_errmsg());
		goto out;
	}
	printf("put %u new vectors into %s/%s (acknowledged once durable): %.2f s\n", NEW, bucket,
	       index, now_s() - t0);
	/* Each finds itself first: at once (from the tail, scanned exactly next to the graph,
	 * or already from the graph), then again once the online indexer moved them into the
	 * graph (no row left past the mark). */
	int s0 = self_find(d, bucket, index, &q, names, keys, dist, cnt);

	if (s0 < 0)
		goto out;
	printf("each new vector queried with itself: %d of %u found first\n", s0, NEW);
	double ws = ix0 >= 0 ? wait_indexed(cfg, ix0, NEW) : -1;

	if (ws < 0) {
		fprintf(stderr, "dmann demo: the online indexer did not move the %u rows into the "
			"graph within 120 s (dmann_cn_s3_indexed_rows_total)\n", NEW);
		goto out;
	}
	long long gq0 = graph_queries(cfg);
	int s1 = self_find(d, bucket, index, &q, names, keys, dist, cnt);
	long long gq1 = graph_queries(cfg);

	if (s1 < 0)
		goto out;
	printf("the online indexer moved them into the graph within %.1f s; queried again: %d of "
	       "%u found first, %lld of %u queries on the graph path, no row left in the tail\n",
	       ws, s1, NEW, gq1 - gq0, NEW);
	self = s0 == NEW && s1 == NEW ? NEW : 0;
	if (dmann_delete(d, bucket, index, NEW, kp)) {
		fprintf(stderr, "dmann demo: delete: %s\n", dmann_errmsg());
		goto out;
	}
	printf("deleted them again\n");
	/* Queries against the exact ground truth of the imported rows. */
	const float *qv = (const float *)q.data + (size_t)NEW * q.dim;

	long long g0 = graph_queries(cfg);

	t0 = now_s();
	if (dmann_batch_query(d, bucket, index, qv, NQ, q.dim, K, keys, dist, cnt)) {
		fprintf(stderr, "dmann demo: query: %s\n", dmann_errmsg());
		goto out;
	}
	double s = now_s() - t0;

	for (unsigned i = 0; i < NQ; i++) {
		const int32_t *gi = (const int32_t *)g.data + (size_t)(NEW + i) * g.dim;

		for (unsigned j = 0; j < cnt[i]; j++) {
			const char *k = keys[(size_t)i * K + j];
			char *end;
			long id = strtol(k, &end, 10);

			for (unsigned t = 0; *end == 0 && t < K; t++)
				hit += gi[t] == id;
			if (!strncmp(k, "new-", 4))
				self = 0;           /* a deleted key came back */
		}
	}
	dmann_free_keys(keys, (size_t)NQ * K);
	long long g1 = graph_queries(cfg);

	printf("QueryVectors: %u queries, recall@10 %.4f (against exact ground truth), %.0f "
	       "queries/s\n", NQ, (double)hit / (NQ * K), NQ / s);
	if (g0 >= 0 && g1 >= 0)
		printf("served by the graph path: %lld of %u (dmann_cn_s3_graph_queries_total)\n",
		       g1 - g0, NQ);
	else
		printf("served by the graph path: the compute nodes' metrics could not be read\n");
	rc = self == NEW ? 0 : 1;
	if (rc)
		fprintf(stderr, "dmann demo: a new vector did not find itself, or a deleted one came "
			"back\n");
out:
	free(names);
	free(keys);
	free(dist);
	free(cnt);
	dmann_close(d);
	dm_vecs_free(&q);
	dm_vecs_free(&g);
	return rc;
}

#define LIVE_ROWS 5000u   /* rows put before the graph is seeded ([s3] graph_min_rows of
			   * the demo cluster) */
#define LIVE_NEW 200u     /* rows put once the graph serves */
#define LIVE_NQ 200u      /* queries measured against a brute force */

/* The top K row numbers of vector qv among rows[0..n) (dim floats each), L2, into top
 * (UINT32_MAX past the rows found). */
static void brute_top(struct dm_topk *tk, const float *rows, uint32_t n, uint32_t dim,
		      const float *qv, uint32_t *top)
{
	struct dm_hit h[K];
	size_t got;

	dm_topk_reset(tk);
	for (uint32_t r = 0; r < n; r++)
		dm_topk_push(tk, dm_l2sq(rows + (size_t)r * dim, qv, dim), r);
	got = dm_topk_drain(tk, h);
	for (unsigned j = 0; j < K; j++)
		top[j] = j < got ? (uint32_t)h[j].id : UINT32_MAX;
}

int dm_demo_live(const char *cfg, const char *base, const char *query, const char *bucket,
		 const char *index)
{
	struct dm_vecs b = { 0 }, q = { 0 };
	char err[512], (*names)[24] = NULL, **keys = NULL;
	const char **kp = NULL;
	float *dist = NULL;
	uint32_t *cnt = NULL, n = LIVE_ROWS + LIVE_NEW;
	dmann_t *d = NULL;
	struct dm_topk *tk = dm_topk_new(K);
	uint64_t hit = 0;
	unsigned first = 0;
	int rc = 1;

	if (dm_vecs_read(base, DM_VF_AUTO, &b, err, sizeof(err)) ||
	    dm_vecs_read(query, DM_VF_AUTO, &q, err, sizeof(err))) {
		fprintf(stderr, "dmann demo: %s\n", err);
		goto out;
	}
	if (b.n < n || q.n < LIVE_NQ || b.dim != q.dim) {
		fprintf(stderr, "dmann demo: %s has too few rows\n", base);
		goto out;
	}
	d = dmann_connect(cfg, "local");
	names = calloc(n, sizeof(*names));
	kp = calloc(n, sizeof(*kp));
	keys = calloc((size_t)LIVE_NQ * K, sizeof(*keys));
	dist = malloc((size_t)LIVE_NQ * K * sizeof(*dist));
	cnt = malloc(LIVE_NQ * sizeof(*cnt));
	if (!d || !names || !kp || !keys || !dist || !cnt || !tk) {
		fprintf(stderr, "dmann demo: %s\n", d ? "out of memory" : dmann_errmsg());
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		snprintf(names[i], sizeof(names[i]), "live-%u", i);
		kp[i] = names[i];
	}
	if (dmann_create_index(d, bucket, index, (uint32_t)b.dim, DMANN_EUCLIDEAN)) {
		fprintf(stderr, "dmann demo: create index: %s\n", dmann_errmsg());
		goto out;
	}
	long long ix0 = cn_sum(cfg, "dmann_cn_s3_indexed_rows_total");
	double t0 = now_s();

	if (dmann_put(d, bucket, index, LIVE_ROWS, kp, b.data, (uint32_t)b.dim, NULL)) {
		fprintf(stderr, "dmann demo: put: %s\n", dmann_errmsg());
		goto out;
	}
	printf("created %s/%s through the API and put %u vectors: %.2f s\n", bucket, index,
	       LIVE_ROWS, now_s() - t0);
	double ws = ix0 >= 0 ? wait_indexed(cfg, ix0, LIVE_ROWS) : -1;

	if (ws < 0) {
		fprintf(stderr, "dmann demo: no graph was built for %s/%s within 120 s "
			"(dmann_cn_s3_index_graphs_seeded_total)\n", bucket, index);
		goto out;
	}
	printf("a compute node built a graph of them and placed it on the memory nodes "
	       "([s3] graph_auto): %.1f s\n", ws);
	ix0 = cn_sum(cfg, "dmann_cn_s3_indexed_rows_total");
	t0 = now_s();
	if (dmann_put(d, bucket, index, LIVE_NEW, kp + LIVE_ROWS,
		      (const float *)b.data + (size_t)LIVE_ROWS * b.dim, (uint32_t)b.dim, NULL)) {
		fprintf(stderr, "dmann demo: put: %s\n", dmann_errmsg());
		goto out;
	}
	ws = ix0 >= 0 ? wait_indexed(cfg, ix0, LIVE_NEW) : -1;
	if (ws < 0) {
		fprintf(stderr, "dmann demo: the online indexer did not move the %u rows into the "
			"graph within 120 s\n", LIVE_NEW);
		goto out;
	}
	printf("put %u more; the online indexer moved them into the graph within %.1f s\n",
	       LIVE_NEW, ws);
	/* each of the later rows finds itself first */
	long long g0 = graph_queries(cfg);

	if (dmann_batch_query(d, bucket, index, (const float *)b.data + (size_t)LIVE_ROWS * b.dim,
			      LIVE_NEW, (uint32_t)b.dim, K, keys, dist, cnt)) {
		fprintf(stderr, "dmann demo: query: %s\n", dmann_errmsg());
		goto out;
	}
	for (unsigned i = 0; i < LIVE_NEW; i++)
		first += cnt[i] && !strcmp(keys[(size_t)i * K], names[LIVE_ROWS + i]);
	dmann_free_keys(keys, (size_t)LIVE_NQ * K);
	/* queries against a brute force over the index's rows */
	t0 = now_s();
	if (dmann_batch_query(d, bucket, index, q.data, LIVE_NQ, (uint32_t)q.dim, K, keys, dist,
			      cnt)) {
		fprintf(stderr, "dmann demo: query: %s\n", dmann_errmsg());
		goto out;
	}
	double qs = now_s() - t0;
	long long g1 = graph_queries(cfg);

	for (unsigned i = 0; i < LIVE_NQ; i++) {
		uint32_t top[K];

		brute_top(tk, b.data, n, (uint32_t)b.dim,
			  (const float *)q.data + (size_t)i * q.dim, top);
		for (unsigned j = 0; j < cnt[i]; j++)
			for (unsigned t = 0; t < K; t++)
				hit += top[t] != UINT32_MAX &&
				       !strcmp(keys[(size_t)i * K + j], names[top[t]]);
	}
	dmann_free_keys(keys, (size_t)LIVE_NQ * K);
	printf("QueryVectors on %s/%s: %u of %u later rows found first; %u queries, recall@10 "
	       "%.4f (against a brute force over its %u rows), %.0f queries/s; served by the "
	       "graph path: %lld of %u\n", bucket, index, first, LIVE_NEW, LIVE_NQ,
	       (double)hit / (LIVE_NQ * K), n, LIVE_NQ / qs, g0 >= 0 && g1 >= 0 ? g1 - g0 : -1,
	       LIVE_NEW + LIVE_NQ);
	rc = first == LIVE_NEW && g1 - g0 == LIVE_NEW + LIVE_NQ ? 0 : 1;
	if (rc)
		fprintf(stderr, "dmann demo: a later row did not find itself first, or a query "
			"missed the graph path\n");
out:
	free(names);
	free(kp);
	free(keys);
	free(dist);
	free(cnt);
	dm_topk_free(tk);
	dmann_close(d);
	dm_vecs_free(&b);
	dm_vecs_free(&q);
	return rc;
}
