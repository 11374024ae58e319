/* dmann.c: entry point of the dmann CLI; dispatches to the subcommands listed below. */
#include "cli.h"
#include "dm_config.h"

#include <stdio.h>
#include <string.h>

/* Subcommands, in the order --help lists them. */
static const struct dm_cli_cmd cmds[] = {
	{ "gen", "generate a Gaussian-mixture data set + exact ground truth", dm_cmd_gen },
	{ "fmnist", "convert Fashion-MNIST (Debian package) + exact ground truth", dm_cmd_fmnist },
	{ "build", "build an HNSW index image from a vector file", dm_cmd_build },
	{ "search", "search an index image locally: recall, QPS, latency", dm_cmd_search },
	{ "local", "start or stop a local cluster (loopback or network namespaces)", dm_cmd_local },
	{ "load", "place an index image on the memory nodes", dm_cmd_load },
	{ "insert", "insert vectors online into the loaded index", dm_cmd_insert },
	{ "status", "show every node of a cluster", dm_cmd_status },
	{ "graph", "HNSW graphs on the memory nodes: list, drop, check (health)", dm_cmd_graph },
	{ "route", "the compute nodes' router: refresh (roll out a new oracle epoch)", dm_cmd_route },
	{ "demo", "local cluster + index + queries + summary, then stop everything", dm_cmd_demo },
#if DM_HAVE_CLIENT
	{ "bench", "run a query stream on the cluster: recall, QPS, cache, READs", dm_cmd_bench },
	{ "put", "put vectors of a file into an S3 Vectors index (libdmann)", dm_cmd_vectors },
	{ "get", "get vectors by key from an index (libdmann)", dm_cmd_vectors },
	{ "delete", "delete vectors by key from an index (libdmann)", dm_cmd_vectors },
	{ "query", "exact k-NN of every vector of a file in an index (libdmann)", dm_cmd_vectors },
#endif
	{ NULL, NULL, NULL },
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
	for (const struct dm_cli_cmd *c = cmds; c->name; c++)
		if (!strcmp(argv[1], c->name))
			return c->run(argc - 1, argv + 1);
	fprintf(stderr, "dmann: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
