/* metrics.h: the Prometheus text endpoint of a node (GET /metrics on the `metrics` address
 * of its config section), served by libmicrohttpd. The node supplies a callback that writes
 * its counters in the text exposition format; it runs on the HTTP thread, so it must only
 * read counters that are safe to read concurrently (atomics, or take the node's locks). */
#ifndef DM_METRICS_H
#define DM_METRICS_H

#include <stdio.h>

#include "dm.h"

struct dm_metrics;
typedef void (*dm_metrics_fn)(void *arg, FILE *out);

/* Constructor: listen on "host:port". NULL + errno (ENOSYS when built without
 * libmicrohttpd, EINVAL for a bad address, or the bind error). */
struct dm_metrics *dm_metrics_start(const char *addr, dm_metrics_fn fn, void *arg);
void dm_metrics_stop(struct dm_metrics *m);

#endif
