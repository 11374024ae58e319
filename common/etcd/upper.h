/* upper.h: the online upper levels of HNSW graphs in the cluster state (etcd).
 *
 * A node that an online insert gives a level >= 1 (cn/engine/cn_insert.c) is published as
 * one key, once its record is on the memory nodes:
 *     /dmann/<cluster>/upper/<graph>/<gen>/<tag>/<id>  =  "<level>"   (decimal)
 * (tag, 16 hex digits: the load of the graph generation, as idrange.h's). Every compute
 * node follows the prefix and adds those nodes to its own copy of the graph's upper levels
 * (cn/engine/cn_upper.c); the keys of a graph are deleted when it is dropped.
 *
 * Keys and values are validated when read (dm_upper_parse, fuzzed in fuzz_etcd_json).
 *
 * Thread-safety: the calls use the etcd handle given (one thread at a time per handle). */
#ifndef DM_ETCD_UPPER_H
#define DM_ETCD_UPPER_H

#include "dm.h"

struct dm_etcd;

struct dm_upper_ent {
	uint32_t graph;
	uint64_t gen, tag;
	uint32_t id, level;
};

/* The prefix every key is under: "/dmann/<cluster>/upper/" into out (cap bytes). Its
 * length, or -EINVAL (too long). */
int dm_upper_prefix(char *out, size_t cap, const char *cluster);
/* Publish node id of level (1 .. 31) of graph generation (graph, gen) of load tag. 0 or
 * etcd's -errno. */
int dm_upper_put(struct dm_etcd *e, const char *cluster, uint32_t graph, uint64_t gen,
		 uint64_t tag, uint32_t id, uint32_t level);
/* Parse a key (key_len bytes, under prefix plen bytes long) and its value: 0 or -EBADMSG
 * (any part missing, not canonical decimal/hex, out of range: graph < DM_MAX_GRAPHS,
 * level 1 .. 31). */
int dm_upper_parse(const char *key, size_t key_len, size_t plen, const void *val, size_t len,
		   struct dm_upper_ent *out);
/* Delete every key of graph (all its generations and loads). *deleted (may be NULL): how
 * many. 0 or etcd's -errno. */
int dm_upper_forget(struct dm_etcd *e, const char *cluster, uint32_t graph, int64_t *deleted);

#endif
