/* xport.c: backend registry and selection at open time. */
#include "xport_int.h"
#include "dm_config.h"

#include <stdio.h>
#include <string.h>

#include "../wire.h"

static const struct dm_xport_backend *const backends[] = {
#if DM_HAVE_VERBS
	&dm_verbs_backend,
#endif
	&dm_tcp_backend,
};

static const char *const backend_names[] = {
#if DM_HAVE_VERBS
	"verbs",
#endif
	"tcp",
	NULL,
};

const char *const *dm_xport_backends(void)
{
	return backend_names;
}

static const struct dm_xport_backend *find_backend(const char *name)
{
	for (size_t i = 0; i < DM_ARRAY_SIZE(backends); i++)
		if (!strcmp(backends[i]->name, name))
			return backends[i];
	return NULL;
}

bool dm_xport_available(const char *backend, const char **why)
{
	const struct dm_xport_backend *b = find_backend(backend);

	if (!b) {
		if (why)
			*why = "backend not compiled in (or unknown name)";
		return false;
	}
	return b->available(why);
}

struct dm_xport *dm_xport_open(const struct dm_xport_params *p)
{
	const struct dm_xport_backend *b;

	if (!p || !p->cluster || !p->secret || p->secret_len == 0) {
		errno = EINVAL;
		return NULL;
	}
	if (p->backend) {
		b = find_backend(p->backend);
		if (!b) {
			errno = ENOENT;
			return NULL;
		}
		return b->open(p);
	}
	/* Default: the first backend that can run here (verbs before tcp). */
	for (size_t i = 0; i < DM_ARRAY_SIZE(backends); i++)
		if (backends[i]->available(NULL))
			return backends[i]->open(p);
	errno = ENODEV;
	return NULL;
}

int dm_xport_base_init(struct dm_xport *x, const struct dm_xport_ops *ops,
		       const struct dm_xport_params *p)
{
	size_t cl = strlen(p->cluster);

	if (cl == 0 || cl >= sizeof(x->cluster) || p->secret_len > sizeof(x->secret))
		return -EINVAL;
	x->ops = ops;
	memcpy(x->cluster, p->cluster, cl + 1);
	memcpy(x->secret, p->secret, p->secret_len);
	x->secret_len = p->secret_len;
	if (p->client) {
		if (!dm_wire_client_name_ok(p->client))
			return -EINVAL;
		snprintf(x->client, sizeof(x->client), "%s", p->client);
	}
	if (p->n_creds > DM_XPORT_MAX_CREDS || (p->n_creds && !p->creds))
		return -EINVAL;
	for (size_t i = 0; i < p->n_creds; i++) {
		if (!dm_wire_client_name_ok(p->creds[i].name) || p->creds[i].secret_len == 0 ||
		    p->creds[i].secret_len > sizeof(x->creds[i].secret))
			return -EINVAL;
		x->creds[i] = p->creds[i];
	}
	x->n_creds = p->n_creds;
	return 0;
}
