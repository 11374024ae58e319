/* cli_demo.c: `dmann demo`: the whole path in one command. Starts a local cluster of 2
 * memory nodes and 2 compute nodes, builds an HNSW index of Fashion-MNIST (from Debian's
 * dataset-fashion-mnist when installed, a generated SIFT-shaped set otherwise), bulk-imports
 * it into an S3 Vectors index (the graph on the memory nodes), runs the native query stream
 * through the compute nodes without a cache and with a 10% cache, then the S3 calls on the
 * same index (cli_demo_s3.c), prints a summary and stops every process it started. The data set and
 * index are kept in a cache directory so that a second run starts at once. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "dm.h"

static void demo_usage(FILE *f)
{
	fprintf(f, "usage: dmann demo [--dir DIR] [--keep]\n\n"
		   "Start a local cluster (2 memory + 2 compute nodes on loopback), build and load\n"
		   "an index of Fashion-MNIST (generated data if the Debian package\n"
		   "dataset-fashion-mnist is missing), import it into S3 Vectors index demo/fmnist\n"
		   "(or demo/sift), run native queries with the cache off and at 10%%, then write,\n"
		   "query and delete through the S3 calls (served by the graph), print a summary,\n"
		   "and stop everything it started.\n\n"
		   "  --dir DIR   working directory for data, index and cluster state\n"
		   "              (default $XDG_CACHE_HOME/dmann-demo or ~/.cache/dmann-demo)\n"
		   "  --keep      leave the cluster running (stop it with dmann local down --dir DIR/cluster)\n");
}

static int call(int (*fn)(int, char **), const char *what, int argc, char **argv)
{
	int rc;

	printf("\n== %s\n", what);
	fflush(stdout);
	rc = fn(argc, argv);
	fflush(stdout);
	if (rc)
		fprintf(stderr, "dmann demo: %s failed (status %d)\n", what, rc);
	return rc;
}

static bool exists(const char *p)
{
	return access(p, R_OK) == 0;
}

int dm_cmd_demo(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dir", required_argument, 0, 'd' }, { "keep", no_argument, 0, 'k' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	char dir[1024], data[1100], idx[1100], lc[1100];
	char cfg[1200], base[1200], query[1200], gt[1200], mark[1200];
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	bool keep = false, fmnist;
	int c, rc = 1;

	dir[0] = '\0';
	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'd': snprintf(dir, sizeof(dir), "%s", optarg); break;
		case 'k': keep = true; break;
		case 'h': demo_usage(stdout); return 0;
		default: dm_cli_bad_option("demo", c, argv, optind); return 2;
		}
	}
	if (optind != argc) {
		demo_usage(stderr);
		return 2;
	}
	if (!dir[0]) {
		if (xdg && *xdg)
			snprintf(dir, sizeof(dir), "%s/dmann-demo", xdg);
		else
			snprintf(dir, sizeof(dir), "%s/.cache/dmann-demo", home && *home ? home : "/tmp");
	}
	/* mkdir -p of the working directory. */
	for (char *p = dir + 1; *p; p++)
		if (*p == '/') {
			*p = '\0';
			mkdir(dir, 0755);
			*p = '/';
		}
	if (mkdir(dir, 0755) && errno != EEXIST) {
		fprintf(stderr, "dmann demo: cannot create %s: %s\n", dir, strerror(errno));
		return 1;
	}
	fmnist = exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
	snprintf(data, sizeof(data), "%s/%s", dir, fmnist ? "fmnist" : "sift-gen");
	snprintf(idx, sizeof(idx), "%s/%s.v2.hnsw", dir, fmnist ? "fmnist" : "sift-gen");
	snprintf(lc, sizeof(lc), "%s/cluster", dir);
	snprintf(cfg, sizeof(cfg), "%s/cluster.ini", lc);
	snprintf(base, sizeof(base), "%s/base.fbin", data);
	snprintf(query, sizeof(query), "%s/query.fbin", data);
	snprintf(gt, sizeof(gt), "%s/gt.ibin", data);
	snprintf(mark, sizeof(mark), "%s/pids", lc);
	printf("dmann demo: working directory %s\n", dir);
	printf("data: %s\n", fmnist ? "Fashion-MNIST (Debian dataset-fashion-mnist): 60000 x 784 "
	       "base, 10000 queries, L2" : "dataset-fashion-mnist not installed: a generated "
	       "SIFT-shaped set, 50000 x 128, 2000 queries, L2");
	if (exists(mark)) {
		char *down[] = { "local", "down", "--dir", lc, NULL };

		printf("a previous demo cluster is still running: stopping it\n");
		dm_cmd_local(4, down);
	}

	if (!exists(gt)) {
		if (fmnist) {
			char *a[] = { "fmnist", "--out", data, NULL };

			if (call(dm_cmd_fmnist, "dmann fmnist (data set + exact ground truth)", 3, a))
				return 1;
		} else {
			char *a[] = { "gen", "--kind", "sift", "--n", "50000", "--nq", "2000", "--seed",
				      "7", "--out", data, NULL };

			if (call(dm_cmd_gen, "dmann gen (data set + exact ground truth)", 11, a))
				return 1;
		}
	} else {
		printf("\n== data set cached in %s\n", data);
	}
	if (!exists(idx)) {
		char *a[] = { "build", "--base", base, "--metric", "l2", "--M", "16", "--efc", "200",
			      "--out", idx, NULL };

		if (call(dm_cmd_build, "dmann build (HNSW, M=16, efConstruction=200)", 11, a))
			return 1;
	} else {
		printf("== index cached: %s\n", idx);
	}
	{
		/* graph_min_rows 5000: the live index gets its graph at 5,000 rows */
		char *a[] = { "local", "up", "--mn", "2", "--cn", "2", "--dir", lc, "--region-mb",
			      fmnist ? "400" : "160", "--s3-set", "graph_min_rows=5000", "--s3-set",
			      "graph_room=5000", NULL };

		if (call(dm_cmd_local, "dmann local up (2 memory nodes, 2 compute nodes, loopback)",
			 14, a))
			return 1;
	}
	{
#if DM_HAVE_CLIENT
		char *a[] = { "load", "--config", cfg, "--index", idx, "--bucket", "demo",
			      "--name", fmnist ? "fmnist" : "sift", "--vectors", base, "--spare",
			      "2000", NULL };

		if (call(dm_cmd_load, "dmann load --bucket demo --name ... --vectors BASE --spare "
			 "2000 (bulk import: the vectors into an S3 Vectors index, the graph's blocks "
			 "to the memory nodes, room for 2,000 rows indexed online)", 13, a))
			goto out_down;
#else
		char *a[] = { "load", "--config", cfg, "--index", idx, NULL };

		if (call(dm_cmd_load, "dmann load (blocks to the memory nodes)", 5, a))
			goto out_down;
#endif
	}
	{
		char *a0[] = { "bench", "--config", cfg, "--query", query, "--gt", gt, "--k", "10",
			       "--ef", "64", "--cache-ratio", "0", "--nq", "2000", NULL };
		char *a10[] = { "bench", "--config", cfg, "--query", query, "--gt", gt, "--k", "10",
				"--ef", "64", "--cache-ratio", "10%", "--nq", "2000", "--warmup", "2000",
				NULL };

		if (call(dm_cmd_bench, "dmann bench: 2000 queries, k=10, ef=64, no cache", 15, a0) ||
		    call(dm_cmd_bench, "dmann bench: same queries, 10% cache per compute node "
			 "(after a warm-up pass)", 17, a10))
			goto out_down;
	}
#if DM_HAVE_CLIENT
	printf("\n== the S3 Vectors API on the same index (libdmann; QueryVectors searches the "
	       "graph for the imported rows and scans the new ones)\n");
	fflush(stdout);
	if (dm_demo_s3(cfg, query, gt, "demo", fmnist ? "fmnist" : "sift"))
		goto out_down;
	printf("\n== a live index next to it: created through the API, written, served by a "
	       "graph a compute node builds and keeps current\n");
	fflush(stdout);
	if (dm_demo_live(cfg, base, query, "demo", "live"))
		goto out_down;
	fflush(stdout);
#endif
	{
		char *a[] = { "status", "--config", cfg, NULL };

		call(dm_cmd_status, "dmann status", 3, a);
	}
	rc = 0;
out_down:
	if (!keep) {
		char *a[] = { "local", "down", "--dir", lc, NULL };

		call(dm_cmd_local, "dmann local down", 4, a);
	} else {
		printf("\ncluster left running: dmann local down --dir %s\n", lc);
	}
	printf("\ndmann demo: %s\n", rc ? "FAILED (see the messages above)" :
	       "done. Recall is against exact ground truth; READs, bytes and round trips are per "
	       "query. On this tcp transport the memory nodes' transport threads serve the READs "
	       "(an RNIC does that with verbs); on loopback with 2 cores the CPU, not the network, "
	       "limits throughput, so the cache shows in READs and bytes more than in QPS "
	       "(docs/benchmarks.md has rate-limited runs)");
	return rc;
}
