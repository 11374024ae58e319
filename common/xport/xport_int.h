/* xport_int.h: what backends provide to the transport core (not for callers). */
#ifndef DM_XPORT_INT_H
#define DM_XPORT_INT_H

#include "xport.h"
#include "dm_config.h"

struct dm_xport_backend {
	const char *name;
	/* Constructor: NULL with errno set. */
	struct dm_xport *(*open)(const struct dm_xport_params *p);
	/* Can it run here? On false, *why says why (static string). */
	bool (*available)(const char **why);
};

extern const struct dm_xport_backend dm_tcp_backend;
#if DM_HAVE_VERBS
extern const struct dm_xport_backend dm_verbs_backend;
#endif

/* Fill the base struct's cluster name and secret from params (validated). 0 or -EINVAL. */
int dm_xport_base_init(struct dm_xport *x, const struct dm_xport_ops *ops,
		       const struct dm_xport_params *p);

#endif
