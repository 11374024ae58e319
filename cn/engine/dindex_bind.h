/* dindex_bind.h: the binding of a placed HNSW index to an S3 Vectors index (docs/api.md,
 * "The graph path"): which index it serves (bucket, index name) and the key of every graph
 * node, so that a compute node's gateway turns the graph's node ids into the S3 keys of
 * the rows they were built from.
 *
 * It is an optional trailer of the index metadata object (dindex.h), after the upper-level
 * vectors, so it is copied, published and freed with the metadata:
 *
 *   char magic[8] "DMIDXBD1" | u32 len (trailer bytes after these 16) | u32 crc32 of them |
 *   str bucket | str index | u32 nkeys | (nkeys + 1) x u32 offsets | key bytes
 *
 * where str is u32 length + bytes, all little-endian; offsets start at 0, never decrease
 * and end at the key bytes' length; key i is bytes [off[i], off[i+1]), 1..1024 bytes, no
 * NUL. nkeys is the index's node count at load (node ids below it; ids online inserts add
 * later have no key). */
#ifndef DM_CN_DINDEX_BIND_H
#define DM_CN_DINDEX_BIND_H

#include <stddef.h>
#include <stdint.h>

#include "util/dm_buf.h"

#define DINDEX_BIND_MAGIC "DMIDXBD1"
#define DINDEX_BIND_NAME_MAX 67   /* FLAT_NAME_MAX: a shard's bucket "B#s" too */
#define DINDEX_BIND_KEY_MAX 1024

/* What dmann load binds an index to. */
struct dindex_bind_in {
	const char *bucket, *index;
	const char *const *keys;      /* n keys: node i's key */
	uint32_t n;
};

/* A parsed binding (owned by the index view). */
struct dindex_bind {
	char bucket[DINDEX_BIND_NAME_MAX + 1], index[DINDEX_BIND_NAME_MAX + 1];
	uint32_t nkeys;
	uint32_t *off;                /* nkeys + 1 */
	char *keys;                   /* key bytes */
};

/* Append the trailer for in to b (b->oom on failure; the caller checks). -EINVAL for a
 * bad name or key. */
int dindex_bind_encode(struct dm_buf *b, const struct dindex_bind_in *in);
/* Parse the trailer at p[0..len) (exactly), for an index of n nodes: a binding (free with
 * dindex_bind_free), or NULL with errno EBADMSG (message in err) or ENOMEM. */
struct dindex_bind *dindex_bind_parse(const uint8_t *p, size_t len, uint32_t n, char *err,
				      size_t errlen);
void dindex_bind_free(struct dindex_bind *bd);
/* Node id's key (not NUL-terminated: *len bytes), or NULL for an id without one. */
static inline const char *dindex_bind_key(const struct dindex_bind *bd, uint64_t id,
					  uint32_t *len)
{
	if (!bd || id >= bd->nkeys)
		return NULL;
	*len = bd->off[id + 1] - bd->off[id];
	return bd->keys + bd->off[id];
}

#endif
