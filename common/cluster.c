/* cluster.c: transport and paths from the cluster configuration. */
#include "cluster.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dm_xport *dm_cluster_xport(const struct dm_cluster_cfg *cfg, const char *device)
{
	struct dm_xport_params p = {
		.backend = cfg->transport[0] ? cfg->transport : NULL,
		.cluster = cfg->name,
		.secret = cfg->secret,
		.secret_len = cfg->secret_len,
		.device = device && *device ? device : NULL,
		/* Every process posts several message pools to one shared receive queue. */
		.max_recv_wr = 4096,
	};
	struct dm_xport *x = dm_xport_open(&p);

	if (!x)
		dm_err("cannot open the %s transport: %s", p.backend ? p.backend : "default",
		       strerror(errno));
	return x;
}

int dm_cluster_path(const struct dm_cluster_cfg *cfg, const char *p, char *out, size_t cap)
{
	int n;

	if (p[0] == '/')
		n = snprintf(out, cap, "%s", p);
	else
		n = snprintf(out, cap, "%s/%s", cfg->dir, p);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int dm_node_args(int argc, char **argv, const char *prog, void (*usage)(FILE *f),
		 const char **config, long *id)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "id", required_argument, NULL, 'i' },
		{ "log", required_argument, NULL, 'l' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static const char *const levels[] = { "error", "warn", "info", "debug" };
	const char *log = "info";
	char *end;
	int c;

	*config = NULL;
	*id = -1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'c': *config = optarg; break;
		case 'i':
			*id = strtol(optarg, &end, 10);
			if (*end || *id < 0 || *id >= DM_MAX_NODES) {
				fprintf(stderr, "%s: --id '%s' is not a node number\n", prog, optarg);
				return 2;
			}
			break;
		case 'l': log = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!*config || *id < 0 || optind != argc) {
		usage(stderr);
		return 2;
	}
	for (size_t i = 0; i < DM_ARRAY_SIZE(levels); i++)
		if (!strcmp(log, levels[i])) {
			dm_log_set_level((enum dm_log_level)i);
			return -1;
		}
	fprintf(stderr, "%s: --log '%s' must be error, warn, info or debug\n", prog, log);
	return 2;
}
