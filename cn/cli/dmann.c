/* dmann.c: entry point of the dmann CLI; dispatches to the subcommands listed below. */
#include "cli.h"
#include "distance.h"
#include "dm_config.h"

#include <stdio.h>
#include <string.h>

/* Subcommands, in the order --help lists them. */
static const struct dm_cli_cmd cmds[] = {
	{ "gen", "generate a Gaussian-mixture data set + exact ground truth", dm_cmd_gen, true },
	{ "fmnist", "convert Fashion-MNIST (Debian package) + exact ground truth", dm_cmd_fmnist,
	  true },
	{ "build", "build an HNSW index image from a vector file", dm_cmd_build, true },
	{ "search", "search an index image locally: recall, QPS, latency", dm_cmd_search, false },
	{ "local", "start or stop a local cluster (loopback or network namespaces)", dm_cmd_local,
	  false },
	{ "load", "place an index image on the memory nodes", dm_cmd_load, false },
	{ "insert", "insert vectors online into the loaded index", dm_cmd_insert, false },
	{ "status", "show every node of a cluster", dm_cmd_status, false },
	{ "graph", "HNSW graphs on the memory nodes: list, drop, check (health)", dm_cmd_graph,
	  false },
	{ "route", "the compute nodes' router: refresh (roll out a new oracle epoch)", dm_cmd_route,
	  false },
	{ "demo", "local cluster + index + queries + summary, then stop everything", dm_cmd_demo,
	  true },
#if DM_HAVE_CLIENT
	{ "bench", "run a query stream on the cluster: recall, QPS, cache, READs", dm_cmd_bench,
	  false },
	{ "put", "put vectors of a file into an S3 Vectors index (libdmann)", dm_cmd_vectors,
	  false },
	{ "get", "get vectors by key from an index (libdmann)", dm_cmd_vectors, false },
	{ "delete", "delete vectors by key from an index (libdmann)", dm_cmd_vectors, false },
	{ "query", "exact k-NN of every vector of a file in an index (libdmann)", dm_cmd_vectors,
	  false },
#endif
	{ NULL, NULL, NULL, false },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: dmann <command> [options]   (dmann <command> --help for details)\n\n"
		   "dmann %s: vector search for disaggregated memory.\n\ncommands:\n", DM_VERSION);
	for (const struct dm_cli_cmd *c = cmds; c->name; c++)
		fprintf(f, "  %-8s %s\n", c->name, c->summary);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("dmann %s\n", DM_VERSION);
		return 0;
	}
	for (const struct dm_cli_cmd *c = cmds; c->name; c++) {
		if (strcmp(argv[1], c->name))
			continue;
		/* OpenBLAS's pool, started with the process, has its idle workers spin on
		 * sched_yield: `dmann route refresh` burnt 0.08 s of CPU in 0.6 s that way, on
		 * the machine whose queries its rollout must not slow. One thread for every
		 * command that does no large sgemm (OPENBLAS_NUM_THREADS still wins). */
		if (!c->blas_pool)
			dm_blas_node_threads();
		return c->run(argc - 1, argv + 1);
	}
	fprintf(stderr, "dmann: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
