/* graph_bench.c: the client side of bench/s3/graph.sh, over libdmann (the S3 calls a user
 * makes; QueryVectors runs the compute node's planner, so the same program measures the
 * graph path and the exact path):
 *   put:   rows [from, to) of a vector file into an index, keys = row numbers in decimal,
 *          batches of 1,000;
 *   query: nq queries with dmann_batch_query (its pipelining: up to 32 requests in flight
 *          per compute node), queries per second and recall@k against a ground-truth file
 *          whose ids are row numbers; one JSON line.
 * usage: graph_bench put --config C --bucket B --name I --base F --from A --to Z
 *        graph_bench query --config C --bucket B --name I --query F --gt F [--nq N] [--k K]
 *                    [--label L] */
#include <errno.h>
#include <getopt.h>
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
		   "[--nq N] [--k K] [--label L]\n");
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

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, 0, 'c' }, { "bucket", required_argument, 0, 'b' },
		{ "name", required_argument, 0, 'n' }, { "base", required_argument, 0, 'B' },
		{ "from", required_argument, 0, 'f' }, { "to", required_argument, 0, 't' },
		{ "query", required_argument, 0, 'q' }, { "gt", required_argument, 0, 'g' },
		{ "nq", required_argument, 0, 'N' }, { "k", required_argument, 0, 'k' },
		{ "label", required_argument, 0, 'l' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	const char *cfg = NULL, *b = NULL, *x = NULL, *base = NULL, *qf = NULL, *gf = NULL;
	const char *label = "query";
	unsigned long long from = 0, to = 0, nq = 0;
	unsigned long k = 10;
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
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	bool put = !strcmp(argv[1], "put");

	if (!cfg || !b || !x || (put ? !base || to <= from : !qf || !gf) || !k ||
	    k > DMANN_MAX_K || (!put && strcmp(argv[1], "query"))) {
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
