/* cluster.c: transport and paths from the cluster configuration. */
#include "cluster.h"

#include <stdio.h>
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
