/* s3_bench.c: S3 Vectors QueryVectors latency against a gateway (dmann-cn or dmann-s3), and
 * in the same run the exact-scan rate of one core next to a STREAM-style read of one core.
 *
 *   s3_bench load  --endpoint H:P --ak AK --sk-file F --base base.fbin [--bucket B --index I
 *                  --metric cosine|euclidean --tenants T --seed S --scoped]
 *   s3_bench query --endpoint H:P --ak AK --sk-file F --query query.fbin [--nq N --k K
 *                  --warmup W --label L --tenants T --seed S --base base.fbin --metric M]
 *                                                  -> one JSON line: p50_us, p99_us, qps
 *   s3_bench scan  --base base.fbin --query query.fbin [--nq N]
 *                                                  -> one JSON line: scan and read GB/s
 * Requests are signed with SigV4 (s3_sigv4.h) over one keep-alive HTTP/1.1 connection;
 * queries are sent one at a time (latency, not throughput).
 *
 * Tenants (bench/s3/scope.sh): with --tenants T, load gives row i the metadata
 * {"tenant": "t<j>", "i": i}, j drawn from T tenants of skewed sizes (weights 25^(j/(T-1)):
 * the largest tenant about 25 times the smallest) by a hash of (S, i), and --scoped creates the
 * index with the tag dmann:scope = tenant; query sends query j with the filter
 * {"tenant": "t<j mod T>"} and checks its answer against the exact filtered top-k it computes
 * from --base (the same tenant assignment): the JSON line adds recall, the queried tenants'
 * rows (their sum: what a scoped plan must read) and the tenant sizes. */
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "distance.h"
#include "s3_sigv4.h"
#include "topk.h"
#include "util/dm_buf.h"
#include "vecfile.h"

struct conn {
	int fd;
	char host[128], port[16], hostport[160];
	const char *ak, *sk;
};

static int conn_open(struct conn *c)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai;
	int one = 1;

	if (getaddrinfo(c->host, c->port, &hints, &ai))
		return -1;
	c->fd = socket(ai->ai_family, SOCK_STREAM, 0);
	if (c->fd < 0 || connect(c->fd, ai->ai_addr, ai->ai_addrlen)) {
		freeaddrinfo(ai);
		return -1;
	}
	freeaddrinfo(ai);
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* POST /op with body; returns the HTTP status and the response body (malloc'ed). */
static int call(struct conn *c, const char *op, const char *body, char **resp)
{
	char path[128], date[32], sha[65], auth[512], hdr[2048];
	size_t blen = strlen(body);
	time_t now = time(NULL);
	struct tm tm;
	static struct dm_buf in;         /* one connection at a time: single-threaded */

	*resp = NULL;
	snprintf(path, sizeof(path), "/%s", op);
	gmtime_r(&now, &tm);
	strftime(date, sizeof(date), "%Y%m%dT%H%M%SZ", &tm);
	s3_sha256_hex(body, blen, sha);
	struct s3_sigv4_client_hdrs h = { c->hostport, date, sha, "application/json" };
	struct s3_sigv4_req r = { "POST", path, "", s3_sigv4_client_header, &h, body, blen };

	if (s3_sigv4_authorization(&r, c->ak, c->sk, date, "us-east-1", "s3vectors",
				   "content-type;host;x-amz-content-sha256;x-amz-date", sha, auth,
				   sizeof(auth)))
		return -1;
	int n = snprintf(hdr, sizeof(hdr), "POST %s HTTP/1.1\r\nHost: %s\r\n"
			 "Content-Type: application/json\r\nContent-Length: %zu\r\n"
			 "x-amz-date: %s\r\nx-amz-content-sha256: %s\r\nAuthorization: %s\r\n\r\n",
			 path, c->hostport, blen, date, sha, auth);

	if (write_all(c->fd, hdr, (size_t)n) || write_all(c->fd, body, blen))
		return -1;
	/* Read headers, then Content-Length bytes (keep-alive). */
	dm_buf_reset(&in);
	for (;;) {
		char *end, *cl, *buf;

		if (!dm_buf_reserve(&in, 65536 + 1))
			return -1;
		ssize_t got = recv(c->fd, in.p + in.n, in.cap - in.n - 1, 0);

		if (got <= 0)
			return -1;
		in.n += (size_t)got;
		in.p[in.n] = 0;
		buf = (char *)in.p;
		end = strstr(buf, "\r\n\r\n");
		if (!end)
			continue;
		cl = strcasestr(buf, "content-length:");
		size_t len = cl && cl < end ? strtoull(cl + 15, NULL, 10) : 0;
		size_t hl = (size_t)(end + 4 - buf);

		if (in.n < hl + len)
			continue;
		*resp = strndup(end + 4, len);
		return atoi(buf + 9);
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static char *vec_json(const float *v, uint32_t dim)
{
	json_t *a = json_array();
	char *s;

	for (uint32_t i = 0; i < dim; i++)
		json_array_append_new(a, json_real(v[i]));
	s = json_dumps(a, JSON_COMPACT | JSON_REAL_PRECISION(9));
	json_decref(a);
	return s;
}

/* Tenants: row i's tenant, deterministic from (seed, i); sizes skewed (see the top). */
struct tenants {
	unsigned t;                      /* 0: no tenants */
	uint64_t seed;
	double *cdf;                     /* t cumulative shares */
};

static void tenants_init(struct tenants *tn)
{
	double sum = 0;

	if (!tn->t)
		return;
	tn->cdf = malloc(tn->t * sizeof(double));
	for (unsigned j = 0; j < tn->t; j++)
		tn->cdf[j] = sum += pow(25.0, tn->t > 1 ? (double)j / (tn->t - 1) : 0);
	for (unsigned j = 0; j < tn->t; j++)
		tn->cdf[j] /= sum;
}

static unsigned tenant_of(const struct tenants *tn, uint64_t i)
{
	uint64_t h = tn->seed * 0x9e3779b97f4a7c15ull + (i + 1) * 0xbf58476d1ce4e5b9ull;
	unsigned lo = 0, hi = tn->t - 1;

	h ^= h >> 31;
	h *= 0x94d049bb133111ebull;
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 32;
	double u = (double)(h >> 11) * 0x1.0p-53;

	while (lo < hi) {                /* the first j with u < cdf[j] */
		unsigned mid = (lo + hi) / 2;

		if (u < tn->cdf[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

static int do_load(struct conn *c, const char *base, const char *bucket, const char *index,
		   const char *metric, const struct tenants *tn, bool scoped)
{
	struct dm_vecs v;
	char err[256], *resp, body[512];
	int st;

	if (dm_vecs_read(base, dm_vec_format_from_name(base), &v, err, sizeof(err))) {
		fprintf(stderr, "s3_bench: %s\n", err);
		return 1;
	}
	snprintf(body, sizeof(body), "{\"vectorBucketName\":\"%s\"}", bucket);
	st = call(c, "CreateVectorBucket", body, &resp);
	free(resp);
	snprintf(body, sizeof(body), "{\"vectorBucketName\":\"%s\",\"indexName\":\"%s\","
		 "\"dataType\":\"float32\",\"dimension\":%u,\"distanceMetric\":\"%s\"%s}",
		 bucket, index, v.dim, metric, scoped ? ",\"tags\":{\"dmann:scope\":\"tenant\"}" : "");
	st = call(c, "CreateIndex", body, &resp);
	if (st != 200) {
		fprintf(stderr, "s3_bench: CreateIndex %s: %d %s\n", index, st, resp ? resp : "");
		free(resp);
		dm_vecs_free(&v);
		return 1;
	}
	free(resp);
	double t0 = now_s();

	for (size_t i = 0; i < v.n; i += 500) {
		size_t n = DM_MIN((size_t)500, v.n - i);
		json_t *arr = json_array();

		for (size_t j = 0; j < n; j++) {
			json_t *d = json_array();
			char key[32];

			for (uint32_t k = 0; k < v.dim; k++)
				json_array_append_new(d, json_real(((const float *)v.data)[(i + j) * v.dim + k]));
			snprintf(key, sizeof(key), "v%zu", i + j);
			json_t *m = json_pack("{s:I}", "i", (json_int_t)(i + j));

			if (tn->t) {
				char tname[16];

				snprintf(tname, sizeof(tname), "t%u", tenant_of(tn, i + j));
				json_object_set_new(m, "tenant", json_string(tname));
			}
			json_array_append_new(arr, json_pack("{s:s, s:{s:o}, s:o}", "key", key,
							     "data", "float32", d, "metadata", m));
		}
		json_t *o = json_pack("{s:s, s:s, s:o}", "vectorBucketName", bucket, "indexName",
				      index, "vectors", arr);
		char *b = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));

		json_decref(o);
		st = call(c, "PutVectors", b, &resp);
		free(b);
		if (st != 200) {
			fprintf(stderr, "s3_bench: PutVectors at %zu: %d %s\n", i, st,
				resp ? resp : "");
			free(resp);
			dm_vecs_free(&v);
			return 1;
		}
		free(resp);
	}
	fprintf(stderr, "s3_bench: loaded %zu x %u in %.1f s\n", v.n, v.dim, now_s() - t0);
	dm_vecs_free(&v);
	return 0;
}

static int cmp_f(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

/* Tenant mode: the answer of query qv for tenant t against the exact filtered top-k over
 * the tenant's rows (rows[0..n) of base); ties at the k-th distance count as hits. Returns
 * the recall, -1 on an answer that cannot be read. */
static double check_answer(const char *resp, const float *qv, const struct dm_vecs *base,
			   const struct tenants *tn, const uint32_t *rows, size_t n,
			   enum dm_metric m, unsigned t, size_t k, float *dist)
{
	size_t want = DM_MIN(k, n), i, hit = 0;
	json_t *o = json_loads(resp, 0, NULL), *vs = json_object_get(o, "vectors"), *e;

	if (!json_is_array(vs)) {
		json_decref(o);
		return -1;
	}
	for (i = 0; i < n; i++)
		dist[i] = dm_distance(m, qv, (const float *)base->data + (size_t)rows[i] * base->dim,
				      base->dim);
	qsort(dist, n, sizeof(float), cmp_f);
	float kth = want ? dist[want - 1] : 0;

	json_array_foreach(vs, i, e) {
		const char *key = json_string_value(json_object_get(e, "key"));
		unsigned long long r;
		char *end;

		if (i >= want || !key || key[0] != 'v')
			continue;
		r = strtoull(key + 1, &end, 10);
		if (*end || r >= base->n || tenant_of(tn, r) != t)
			continue;                /* not a row of the tenant: a miss */
		float d = dm_distance(m, qv, (const float *)base->data + r * base->dim, base->dim);

		hit += d <= kth + fabsf(kth) * 1e-5f + 1e-6f;
	}
	json_decref(o);
	return want ? (double)hit / want : 1.0;
}

static int do_query(struct conn *c, const char *qf, const char *bucket, const char *index,
		    size_t nq, size_t k, size_t warm, const char *label, const struct tenants *tn,
		    const char *basef, enum dm_metric metric)
{
	struct dm_vecs q, base = { 0 };
	char err[256], *resp;
	double *lat, recall = 0;
	uint32_t **trows = NULL;         /* tenant mode: each tenant's rows */
	size_t *tcnt = NULL, qrows = 0, qmin = SIZE_MAX, qmax = 0;
	float *dist = NULL;
	unsigned worst_t = 0;
	double worst = 2;

	if (dm_vecs_read(qf, dm_vec_format_from_name(qf), &q, err, sizeof(err)) ||
	    (tn->t && dm_vecs_read(basef, dm_vec_format_from_name(basef), &base, err,
				   sizeof(err)))) {
		fprintf(stderr, "s3_bench: %s\n", err);
		return 1;
	}
	if (tn->t) {
		if (base.dim != q.dim) {
			fprintf(stderr, "s3_bench: base dim %u, query dim %u\n", base.dim, q.dim);
			return 1;
		}
		trows = calloc(tn->t, sizeof(*trows));
		tcnt = calloc(tn->t, sizeof(*tcnt));
		size_t *cap = calloc(tn->t, sizeof(*cap));

		for (uint64_t r = 0; r < base.n; r++) {
			unsigned t = tenant_of(tn, r);

			if (tcnt[t] == cap[t]) {
				cap[t] = cap[t] ? 2 * cap[t] : 256;
				trows[t] = realloc(trows[t], cap[t] * sizeof(uint32_t));
			}
			trows[t][tcnt[t]++] = (uint32_t)r;
		}
		free(cap);
		dist = malloc(base.n * sizeof(float));
	}
	nq = DM_MIN(nq, q.n);
	lat = calloc(nq, sizeof(double));
	double t0 = 0;

	for (size_t i = 0; i < nq + warm; i++) {
		const float *qv = ((const float *)q.data) + (i % q.n) * q.dim;
		char *vj = vec_json(qv, q.dim), *b, filter[64] = "";
		unsigned tq = tn->t ? (unsigned)((i % q.n) % tn->t) : 0;

		if (tn->t)
			snprintf(filter, sizeof(filter), ",\"filter\":{\"tenant\":\"t%u\"}", tq);
		if (asprintf(&b, "{\"vectorBucketName\":\"%s\",\"indexName\":\"%s\",\"topK\":%zu,"
			     "\"queryVector\":{\"float32\":%s},\"returnDistance\":true%s}", bucket,
			     index, k, vj, filter) < 0)
			return 1;
		free(vj);
		if (i == warm)
			t0 = now_s();
		double t = now_s();
		int st = call(c, "QueryVectors", b, &resp);

		t = now_s() - t;
		free(b);
		if (st != 200) {
			fprintf(stderr, "s3_bench: QueryVectors: %d %s\n", st, resp ? resp : "");
			free(resp);
			return 1;
		}
		if (i >= warm)
			lat[i - warm] = t * 1e6;
		if (tn->t && i >= warm) {
			double r = check_answer(resp, qv, &base, tn, trows[tq], tcnt[tq], metric, tq,
						k, dist);

			if (r < 0) {
				fprintf(stderr, "s3_bench: QueryVectors: an answer without vectors: "
					"%s\n", resp);
				free(resp);
				return 1;
			}
			if (r < worst) {
				worst = r;
				worst_t = tq;
			}
			recall += r;
			qrows += tcnt[tq];
			qmin = DM_MIN(qmin, tcnt[tq]);
			qmax = DM_MAX(qmax, tcnt[tq]);
		}
		free(resp);
	}
	double total = now_s() - t0;

	qsort(lat, nq, sizeof(double), cmp_d);
	printf("{\"label\":\"%s\",\"queries\":%zu,\"k\":%zu,\"p50_us\":%.0f,\"p99_us\":%.0f,"
	       "\"qps\":%.1f", label, nq, k, lat[nq / 2], lat[(size_t)(nq * 0.99)],
	       nq / total);
	if (tn->t) {
		size_t tmin = SIZE_MAX, tmax = 0, covered = 0;
		bool *seen = calloc(tn->t, sizeof(bool));

		for (unsigned t = 0; t < tn->t; t++) {
			tmin = DM_MIN(tmin, tcnt[t]);
			tmax = DM_MAX(tmax, tcnt[t]);
		}
		for (size_t i = warm; i < nq + warm; i++) {
			unsigned t = (unsigned)((i % q.n) % tn->t);

			covered += !seen[t];
			seen[t] = true;
		}
		free(seen);
		printf(",\"tenants\":%u,\"tenants_queried\":%zu,\"rows\":%llu,\"recall\":%.6f,"
		       "\"worst_recall\":%.4f,\"worst_tenant\":\"t%u\",\"tenant_rows_sum\":%zu,"
		       "\"tenant_rows_mean\":%.1f,\"queried_tenant_rows_min\":%zu,"
		       "\"queried_tenant_rows_max\":%zu,\"tenant_rows_min\":%zu,"
		       "\"tenant_rows_max\":%zu", tn->t, covered, (unsigned long long)base.n,
		       recall / nq, worst, worst_t, qrows, (double)qrows / nq, qmin, qmax, tmin,
		       tmax);
		for (unsigned t = 0; t < tn->t; t++)
			free(trows[t]);
		free(trows);
		free(tcnt);
		free(dist);
		dm_vecs_free(&base);
	}
	printf("}\n");
	free(lat);
	dm_vecs_free(&q);
	return 0;
}

/* One core: exact cosine scan (the members' loop: dot + norms + top-k) vs a STREAM-style
 * read (sum of the same bytes). */
static int do_scan(const char *base, const char *qf, size_t nq)
{
	struct dm_vecs v, q;
	char err[256];

	if (dm_vecs_read(base, dm_vec_format_from_name(base), &v, err, sizeof(err)) ||
	    dm_vecs_read(qf, dm_vec_format_from_name(qf), &q, err, sizeof(err))) {
		fprintf(stderr, "s3_bench: %s\n", err);
		return 1;
	}
	size_t n = v.n, dim = v.dim, bytes = n * dim * sizeof(float);
	float *norm2 = malloc(n * sizeof(float));
	struct dm_topk *tk = dm_topk_new(10);
	struct dm_hit hits[10];
	volatile double sink = 0;

	for (size_t i = 0; i < n; i++)
		norm2[i] = dm_dot(((const float *)v.data) + i * dim, ((const float *)v.data) + i * dim, dim);
	nq = DM_MIN(nq, q.n);
	/* STREAM-style read of the same bytes at the kernels' SIMD width (the build's own
	 * loops are compiled for x86-64-v2 only): the dot kernel of each 4096-float block with
	 * itself reads every byte once. Best of 5. */
	double best_read = 0;

	for (int rep = 0; rep < 5; rep++) {
		double t = now_s();
		const float *p = ((const float *)v.data);
		size_t total = n * dim;

		for (size_t i = 0; i < total; i += 4096)
			sink += dm_dot(p + i, p + i, DM_MIN((size_t)4096, total - i));
		t = now_s() - t;
		best_read = DM_MAX(best_read, bytes / t / 1e9);
	}
	double t = now_s();

	for (size_t j = 0; j < nq; j++) {
		const float *qv = ((const float *)q.data) + j * dim;
		float qn = sqrtf(dm_dot(qv, qv, dim));

		dm_topk_reset(tk);
		for (size_t i = 0; i < n; i++) {
			float den = qn * sqrtf(norm2[i]);
			float d = den > 0 ? 1.0f - dm_dot(qv, ((const float *)v.data) + i * dim, dim) / den : 1.0f;

			if (tk->n < tk->k || d < dm_topk_bound(tk))
				dm_topk_push(tk, d, i);
		}
		dm_topk_drain(tk, hits);
		sink += hits[0].dist;
	}
	t = now_s() - t;
	printf("{\"label\":\"scan\",\"rows\":%zu,\"dim\":%zu,\"queries\":%zu,"
	       "\"scan_gbps_per_core\":%.2f,\"scan_ms_per_query\":%.2f,"
	       "\"stream_read_gbps_per_core\":%.2f,\"kernel\":\"%s\"}\n", n, dim, nq,
	       (double)bytes * nq / t / 1e9, t * 1e3 / nq, best_read, dm_kernel_isa());
	(void)sink;
	free(norm2);
	dm_topk_free(tk);
	dm_vecs_free(&v);
	dm_vecs_free(&q);
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: s3_bench load|query|scan [--endpoint H:P --ak AK --sk-file F]\n"
		   "       [--base F] [--query F] [--bucket B] [--index I] [--nq N] [--k K]\n"
		   "       [--warmup W] [--label L] [--metric cosine|euclidean] [--tenants T]\n"
		   "       [--seed S] [--scoped]\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "endpoint", required_argument, NULL, 'e' }, { "ak", required_argument, NULL, 'a' },
		{ "sk-file", required_argument, NULL, 's' }, { "base", required_argument, NULL, 'b' },
		{ "query", required_argument, NULL, 'q' }, { "bucket", required_argument, NULL, 'B' },
		{ "index", required_argument, NULL, 'I' }, { "nq", required_argument, NULL, 'n' },
		{ "k", required_argument, NULL, 'k' }, { "warmup", required_argument, NULL, 'w' },
		{ "label", required_argument, NULL, 'l' }, { "help", no_argument, NULL, 'h' },
		{ "metric", required_argument, NULL, 'm' }, { "tenants", required_argument, NULL, 'T' },
		{ "seed", required_argument, NULL, 'S' }, { "scoped", no_argument, NULL, 'c' },
		{ NULL, 0, NULL, 0 },
	};
	const char *ep = NULL, *skf = NULL, *base = NULL, *qf = NULL, *bucket = "bench",
		   *index = "cos384", *label = "query", *metric = "cosine";
	struct tenants tn = { .seed = 1 };
	bool scoped = false;
	struct conn c = { .fd = -1 };
	size_t nq = 1000, k = 10, warm = 50;
	char sk[256] = "";
	int o;

	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		usage(stdout);
		return 0;
	}
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	while ((o = getopt_long(argc - 1, argv + 1, "", opts, NULL)) != -1) {
		switch (o) {
		case 'e': ep = optarg; break;
		case 'a': c.ak = optarg; break;
		case 's': skf = optarg; break;
		case 'b': base = optarg; break;
		case 'q': qf = optarg; break;
		case 'B': bucket = optarg; break;
		case 'I': index = optarg; break;
		case 'n': nq = strtoull(optarg, NULL, 10); break;
		case 'k': k = strtoull(optarg, NULL, 10); break;
		case 'w': warm = strtoull(optarg, NULL, 10); break;
		case 'l': label = optarg; break;
		case 'm': metric = optarg; break;
		case 'T': tn.t = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'S': tn.seed = strtoull(optarg, NULL, 10); break;
		case 'c': scoped = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!strcmp(argv[1], "scan")) {
		if (!base || !qf) {
			usage(stderr);
			return 2;
		}
		return do_scan(base, qf, nq ? nq : 1);
	}
	if (!ep || !c.ak || !skf || !nq) {
		usage(stderr);
		return 2;
	}
	enum dm_metric dmetric = !strcmp(metric, "euclidean") ? DM_METRIC_L2 :
				 !strcmp(metric, "cosine") ? DM_METRIC_COS : DM_METRIC_IP;

	if (dmetric == DM_METRIC_IP || (scoped && !tn.t) ||
	    (tn.t && !strcmp(argv[1], "query") && !base)) {
		fprintf(stderr, "s3_bench: --metric is cosine or euclidean; --scoped needs "
			"--tenants; query --tenants needs --base\n");
		return 2;
	}
	tenants_init(&tn);
	FILE *f = fopen(skf, "r");

	if (!f || !fgets(sk, sizeof(sk), f)) {
		fprintf(stderr, "s3_bench: cannot read %s\n", skf);
		return 1;
	}
	fclose(f);
	sk[strcspn(sk, "\r\n")] = 0;
	c.sk = sk;
	const char *colon = strrchr(ep, ':');

	if (!colon) {
		usage(stderr);
		return 2;
	}
	snprintf(c.host, sizeof(c.host), "%.*s", (int)(colon - ep), ep);
	snprintf(c.port, sizeof(c.port), "%s", colon + 1);
	snprintf(c.hostport, sizeof(c.hostport), "%s", ep);
	if (conn_open(&c)) {
		fprintf(stderr, "s3_bench: cannot connect to %s\n", ep);
		return 1;
	}
	int rc = !strcmp(argv[1], "load") ? (base ? do_load(&c, base, bucket, index, metric, &tn,
							    scoped) : 2) :
		 !strcmp(argv[1], "query") ? (qf ? do_query(&c, qf, bucket, index, nq, k, warm,
							    label, &tn, base, dmetric) : 2) : 2;

	close(c.fd);
	free(tn.cdf);
	return rc;
}
