/* cli.h: the dmann command-line tool's subcommands. Each returns the process exit status
 * (0 ok, 1 failure, 2 usage error) and handles its own --help. */
#ifndef DM_CLI_H
#define DM_CLI_H

#include <stdbool.h>

struct dm_cli_cmd {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv);   /* argv[0] is the subcommand name */
	bool blas_pool;   /* runs large sgemms (ground truth, k-means): keeps OpenBLAS's pool */
};

/* Progress bar on stderr when it is a terminal; silent otherwise. */
struct dm_progress;
struct dm_progress *dm_progress_start(const char *what, unsigned long long total);
void dm_progress_update(struct dm_progress *p, unsigned long long done);
void dm_progress_end(struct dm_progress *p);

/* Argument helpers (cli_args.c): parse a number in [min, max] or print
 * "dmann CMD: OPT: 'S' is not ..." and return -EINVAL; report an unknown/incomplete option. */
int dm_cli_parse_u64(const char *cmd, const char *opt, const char *s, unsigned long long min,
		     unsigned long long max, unsigned long long *out);
int dm_cli_parse_double(const char *cmd, const char *opt, const char *s, double min, double max,
			double *out);
void dm_cli_bad_option(const char *cmd, int c, char **argv, int optind);
/* The cluster file at path, read as an admin (dm_config_load), or NULL after printing
 * "dmann CMD: <file:line: what>". Free with free(). */
struct dm_cluster_cfg;
struct dm_cluster_cfg *dm_cli_load_cfg(const char *cmd, const char *path);

/* Data and local-index commands (cli_data.c, cli_index.c). */
int dm_cmd_gen(int argc, char **argv);
int dm_cmd_fmnist(int argc, char **argv);
int dm_cmd_build(int argc, char **argv);
int dm_cmd_search(int argc, char **argv);

/* Local clusters (cli_local.c). */
int dm_cmd_local(int argc, char **argv);

/* Commands on a running cluster (cli_cluster.c; bench: cli_bench.c, over libdmann). */
int dm_cmd_load(int argc, char **argv);
int dm_cmd_bench(int argc, char **argv);
int dm_cmd_status(int argc, char **argv);
int dm_cmd_demo(int argc, char **argv);
/* cli_demo_s3.c (with libdmann): the S3 part of the demo on index bucket/index: puts, self
 * queries and deletes 200 vectors, then 500 queries against gt. 0 or 1. */
int dm_demo_s3(const char *cfg, const char *query, const char *gt, const char *bucket,
	       const char *index);
/* The live index of the demo (cli_demo_s3.c): created through the API, written, its graph
 * built by a compute node ([s3] graph_auto), written again, queried against a brute
 * force. 0 or 1. */
int dm_demo_live(const char *cfg, const char *base, const char *query, const char *bucket,
		 const char *index);
/* cli_insert.c: online inserts into the loaded index. */
int dm_cmd_insert(int argc, char **argv);
/* cli_graph.c: dmann graph list / drop / check (the HNSW graphs on the memory nodes). */
int dm_cmd_graph(int argc, char **argv);
/* cli_route.c: dmann route refresh (a new oracle epoch on every compute node). */
int dm_cmd_route(int argc, char **argv);
/* cli_client.c: put, get, delete, query (argv[0] names which) over libdmann. */
int dm_cmd_vectors(int argc, char **argv);

#endif
