/* cluster.h: what every dmann process does with the cluster file: open the transport with
 * the cluster's name, secret and backend, and resolve paths relative to the file. */
#ifndef DM_CLUSTER_H
#define DM_CLUSTER_H

#include <stdio.h>

#include "config.h"
#include "xport/xport.h"

/* Open the configured transport (auto: verbs when a device exists, else tcp). device may
 * be NULL. NULL with errno set; a message is logged. */
struct dm_xport *dm_cluster_xport(const struct dm_cluster_cfg *cfg, const char *device);

/* Path relative to the config file's directory (absolute paths are kept). 0 or
 * -ENAMETOOLONG. */
int dm_cluster_path(const struct dm_cluster_cfg *cfg, const char *p, char *out, size_t cap);

/* Arguments every node binary takes: --config FILE --id N [--log LEVEL] [--help]; sets the
 * log level (default info). Returns -1 to go on, or the exit status to return at once (0
 * after --help, 2 for a usage error, with the message printed). */
int dm_node_args(int argc, char **argv, const char *prog, void (*usage)(FILE *f),
		 const char **config, long *id);

/* Object keys used on memory nodes: (kind, index, number) packed in 64 bits. */
enum dm_obj_kind { DM_OBJ_HNSW_META = 1, DM_OBJ_HNSW_BLOCK = 2, DM_OBJ_FLAT = 3 };
static inline uint64_t dm_obj_key(enum dm_obj_kind kind, uint32_t index, uint32_t num)
{
	return ((uint64_t)kind << 56) | ((uint64_t)(index & 0xffffff) << 32) | num;
}
#define DM_OBJ_INDEX_MASK 0xffffffff00000000ull

#endif
