/* graph_bench.c: the client side of bench/s3/graph.sh, over libdmann (the S3 calls a user
 * makes; QueryVectors runs the compute node's planner, so the same program measures the
 * graph path and the exact path):
 *   put:   rows [from, to) of a vector file into an index, keys = row numbers in decimal,
 *          batches of 1,000;
 *   query: nq queries with dmann_batch_query (its pipelining: up to 32 requests in flight
 *          per compute node), queries per second and recall@k against a ground-truth file
 *          whose ids are row numbers; one JSON line;
 *   lat:   nq queries with dmann_query, one at a time on each of --conc threads (a handle
 *          per thread, query i on thread i % conc): the latency of every query (p50, p99,
 *          mean), queries per second and recall@k; one JSON line (bench/s3/latency.sh).
 * usage: graph_bench put --config C --bucket B --name I --base F --from A --to Z
 *        graph_bench query --config C --bucket B --name I --query F --gt F [--nq N] [--k K]
 *                    [--label L]
 *        graph_bench lat (the options of query) [--conc C] */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dm.h"
#include "dmann.h"
#include "vecfile.h"

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: graph_bench put --config C --bucket B --name I --base F --from A --to Z\n"
		   "       graph_bench query --config C --bucket B --name I --query F --gt F "
		   "[--nq N] [--k K] [--label L]\n"
		   "       graph_bench lat --config C --bucket B --name I --query F --gt F "
		   "[--nq N] [--k K] [--label L] [--conc C]\n");
}

static int do_put(dmann_t *d, const char *b, const char *x, const struct dm_vecs *v,
		  uint64_t from, uint64_t to)
{
	char (*kb)[24] = malloc(1000 * sizeof(*kb));
	const char *keys[1000];
	double t0 = now_s();

	if (!kb)
		return 1;
	for (uint64_t at = from; at < to; at += 1000) {
		size_t n = (size_t)DM_MIN(1000ull, to - at);

		for (size_t i = 0; i < n; i++) {
			snprintf(kb[i], sizeof(kb[i]), "%llu", (unsigned long long)(at + i));
			keys[i] = kb[i];
		}
		if (dmann_put(d, b, x, n, keys, (const float *)v->data + at * v->dim, v->dim,
			      NULL)) {
			fprintf(stderr, "graph_bench: put %llu..: %s\n", (unsigned long long)at,
				dmann_errmsg());
			free(kb);
			return 1;
		}
	}
	printf("{\"put\": %llu, \"s\": %.2f}\n", (unsigned long long)(to - from), now_s() - t0);
	free(kb);
	return 0;
}

static int do_query(dmann_t *d, const char *b, const char *x, const struct dm_vecs *q,
		    const struct dm_vecs *gt, size_t nq, uint32_t k, const char *label)
{
	char **keys = calloc(nq * k, sizeof(*keys));
	float *dist = malloc(nq * k * sizeof(*dist));
	uint32_t *cnt = malloc(nq * sizeof(*cnt));
	uint64_t hit = 0;
	double t0, s;
	int rc;

	if (!keys || !dist || !cnt)
		return 1;
	t0 = now_s();
	rc = dmann_batch_query(d, b, x, q->data, nq, q->dim, k, keys, dist, cnt);
	s = now_s() - t0;
	if (rc) {
		fprintf(stderr, "graph_bench: query: %s\n", dmann_errmsg());
		return 1;
	}
	for (size_t i = 0; i < nq; i++) {
		const int32_t *g = (const int32_t *)gt->data + i * gt->dim;

		for (uint32_t j = 0; j < cnt[i]; j++) {
			long id = strtol(keys[i * k + j], NULL, 10);

			for (uint32_t t = 0; t < k; t++)
				hit += g[t] == id;
		}
	}
	printf("{\"label\": \"%s\", \"queries\": %zu, \"s\": %.3f, \"qps\": %.1f, "
	       "\"recall\": %.4f}\n", label, nq, s, (double)nq / s, (double)hit / ((double)nq * k));
	dmann_free_keys(keys, nq * k);
	free(keys);
	free(dist);
	free(cnt);
	return 0;
}

/* lat: one thread of --conc, its own handle, queries t, t + conc, ... one at a time. */
struct lat_arg {
	const char *cfg, *b, *x;
	const struct dm_vecs *q, *gt;
	size_t nq, conc, t;
	uint32_t k;
	double *ms;     /* per query */
	uint64_t hit;
	int rc;
};

static void *lat_thread(void *p)
{
	struct lat_arg *a = p;
	char *keys[DMANN_MAX_K];
	float dist[DMANN_MAX_K];
	dmann_t *d = dmann_connect(a->cfg, "local");

	if (!d) {
		fprintf(stderr, "graph_bench: connect: %s\n", dmann_errmsg());
		a->rc = 1;
		return NULL;
	}
	for (size_t i = a->t; i < a->nq; i += a->conc) {
		const int32_t *g = (const int32_t *)a->gt->data + i * a->gt->dim;
		double t0 = now_s();
		int n = dmann_query(d, a->b, a->x, (const float *)a->q->data + i * a->q->dim,
				    a->q->dim, a->k, keys, dist);

		a->ms[i] = (now_s() - t0) * 1e3;
		if (n < 0) {
			fprintf(stderr, "graph_bench: query %zu: %s\n", i, dmann_errmsg());
			a->rc = 1;
			break;
		}
		for (int j = 0; j < n; j++) {
			long id = strtol(keys[j], NULL, 10);

			for (uint32_t t = 0; t < a->k; t++)
				a->hit += g[t] == id;
		}
		dmann_free_keys(keys, (size_t)n);
	}
	dmann_close(d);
	return NULL;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int do_lat(const char *cfg, const char *b, const char *x, const struct dm_vecs *q,
		  const struct dm_vecs *gt, size_t nq, uint32_t k, size_t conc, const char *label)
{
	struct lat_arg *a = calloc(conc, sizeof(*a));
	pthread_t *th = calloc(conc, sizeof(*th));
	double *ms = calloc(nq, sizeof(*ms));
	double t0, s, sum = 0;
	uint64_t hit = 0;
	size_t started = 0;
	int rc = 0;

	if (!a || !th || !ms) {
		rc = 1;
		goto out;
	}
	t0 = now_s();
	for (; started < conc; started++) {
		a[started] = (struct lat_arg){ .cfg = cfg, .b = b, .x = x, .q = q, .gt = gt,
					       .nq = nq, .conc = conc, .t = started, .k = k,
					       .ms = ms };
		if (pthread_create(&th[started], NULL, lat_thread, &a[started])) {
			rc = 1;
			break;
		}
	}
	for (size_t i = 0; i < started; i++) {
		pthread_join(th[i], NULL);
		rc |= a[i].rc;
		hit += a[i].hit;
	}
	s = now_s() - t0;
	if (rc)
		goto out;
	for (size_t i = 0; i < nq; i++)
		sum += ms[i];
	qsort(ms, nq, sizeof(*ms), cmp_d);
	printf("{\"label\": \"%s\", \"queries\": %zu, \"conc\": %zu, \"s\": %.3f, "
	       "\"qps\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"mean_ms\": %.3f, "
	       "\"recall\": %.4f}\n", label, nq, conc, s, (double)nq / s, ms[nq / 2],
	       ms[DM_MIN(nq - 1, nq * 99 / 100)], sum / (double)nq, (double)hit / ((double)nq * k));
out:
	free(a);
	free(th);
	free(ms);
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, 0, 'c' }, { "bucket", required_argument, 0, 'b' },
		{ "name", required_argument, 0, 'n' }, { "base", required_argument, 0, 'B' },
		{ "from", required_argument, 0, 'f' }, { "to", required_argument, 0, 't' },
		{ "query", required_argument, 0, 'q' }, { "gt", required_argument, 0, 'g' },
		{ "nq", required_argument, 0, 'N' }, { "k", required_argument, 0, 'k' },
		{ "label", required_argument, 0, 'l' }, { "help", no_argument, 0, 'h' },
		{ "conc", required_argument, 0, 'C' },
		{ 0, 0, 0, 0 },
	};
	const char *cfg = NULL, *b = NULL, *x = NULL, *base = NULL, *qf = NULL, *gf = NULL;
	const char *label = "query";
	unsigned long long from = 0, to = 0, nq = 0;
	unsigned long k = 10, conc = 1;
	struct dm_vecs v = { 0 }, g = { 0 };
	char err[512];
	dmann_t *d;
	int c, rc;

	if (argc < 2 || !strcmp(argv[1], "--help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	optind = 2;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'c': cfg = optarg; break;
		case 'b': b = optarg; break;
		case 'n': x = optarg; break;
		case 'B': base = optarg; break;
		case 'f': from = strtoull(optarg, NULL, 10); break;
		case 't': to = strtoull(optarg, NULL, 10); break;
		case 'q': qf = optarg; break;
		case 'g': gf = optarg; break;
		case 'N': nq = strtoull(optarg, NULL, 10); break;
		case 'k': k = strtoul(optarg, NULL, 10); break;
		case 'l': label = optarg; break;
		case 'C': conc = strtoul(optarg, NULL, 10); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	bool put = !strcmp(argv[1], "put"), lat = !strcmp(argv[1], "lat");

	if (!cfg || !b || !x || (put ? !base || to <= from : !qf || !gf) || !k ||
	    k > DMANN_MAX_K || !conc || conc > 256 ||
	    (!put && !lat && strcmp(argv[1], "query"))) {
		usage(stderr);
		return 2;
	}
	if (dm_vecs_read(put ? base : qf, DM_VF_AUTO, &v, err, sizeof(err)) ||
	    (!put && dm_vecs_read(gf, DM_VF_AUTO, &g, err, sizeof(err)))) {
		fprintf(stderr, "graph_bench: %s\n", err);
		return 1;
	}
	if ((put && to > v.n) || (!put && (g.n < v.n || g.dim < k))) {
		fprintf(stderr, "graph_bench: rows or ground truth do not fit\n");
		return 1;
	}
	if (lat) {
		rc = do_lat(cfg, b, x, &v, &g, nq && nq < v.n ? (size_t)nq : (size_t)v.n,
			    (uint32_t)k, (size_t)conc, label);
		dm_vecs_free(&v);
		dm_vecs_free(&g);
		return rc;
	}
	d = dmann_connect(cfg, "local");
	if (!d) {
		fprintf(stderr, "graph_bench: connect: %s\n", dmann_errmsg());
		return 1;
	}
	rc = put ? do_put(d, b, x, &v, from, to) :
	     do_query(d, b, x, &v, &g, nq && nq < v.n ? (size_t)nq : (size_t)v.n, (uint32_t)k,
		      label);
	dmann_close(d);
	dm_vecs_free(&v);
	dm_vecs_free(&g);
	return rc;
}
