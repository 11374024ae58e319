/* s3_fcache.h: the member-side fragment cache of the distributed exact scan (cn_s3): the
 * fragments a compute node scans for QueryVectors, as fetched from the memory nodes.
 *
 * An entry is keyed by (memory node, bucket, index, fragment id) and carries the version
 * it was read at (the MN's store epoch and the index's creation time). A hash map gives
 * O(1) lookup; an intrusive doubly-linked LRU list of the unreferenced entries gives O(1)
 * eviction. Referenced entries (held by a scan) are off the list and never evicted. The
 * cache is bounded in bytes (the bytes each entry reports with s3_fcache_account); it can
 * pass its bound only while referenced entries alone exceed it.
 *
 * A lookup that finds the key at another version (the MN restarted, or the index was
 * deleted and created again) replaces the entry: the old one leaves the map at once and is
 * freed when its last reference goes. An MN epoch seen for the first time also drops the
 * unreferenced entries of that MN's older epoch (once per MN restart).
 *
 * Thread-safe (one mutex). An entry's rows are filled by the caller under e->rw (write
 * lock) while it holds a reference, one fetch at a time (e->fetch).
 */
#ifndef DM_S3_FCACHE_H
#define DM_S3_FCACHE_H

#include <pthread.h>

#include "dm.h"

#define S3_FC_NAME_MAX 68        /* FLAT_NAME_MAX + 1: shard buckets "B#s" too */

struct s3_fkey {
	uint32_t mn;
	uint64_t frag;
	const char *bucket, *index;
	/* version */
	uint64_t epoch;
	int64_t created;
};

/* A cached fragment: rows [0, rows) of MN fragment `frag`, with the tombstone flags read
 * at the same instant. */
struct s3_frag {
	uint32_t mn;
	uint64_t frag, epoch;
	int64_t created;
	char bucket[S3_FC_NAME_MAX], index[S3_FC_NAME_MAX];
	uint64_t hash;
	pthread_rwlock_t rw;             /* the columns below */
	pthread_mutex_t fetch;           /* one fetch at a time */
	uint32_t dim, rows, dead, cap;
	float *vec, *norm2;
	char **key;
	char **meta;                     /* meta JSON bytes, then fmeta bytes */
	uint32_t *mlen, *flen;
	uint8_t *deadf;
	/* partitioned scans (cn_s3_part.c): rows [0, part_rows) labelled with their region's
	 * ring position under model part_id (under rw, written with it held for writing) */
	uint16_t *part;
	uint32_t part_rows, part_cap;
	uint64_t part_id;
	/* the same rows grouped by label (a counting sort): rows of label g are
	 * porder[pstart[g] .. pstart[g + 1]), in row order; pk labels. A scan reads only the
	 * chosen labels' rows: skipping rows in place still streamed every vector through
	 * the memory bus (rows of all regions are interleaved in arrival order). */
	uint32_t *porder, *pstart, pk;
	/* cache bookkeeping (under the cache mutex) */
	size_t bytes;
	int refs;
	bool detached;                   /* replaced: out of the map, freed at the last put */
	struct s3_frag *hnext;           /* hash chain */
	struct s3_frag *lprev, *lnext;   /* LRU list (unreferenced entries only) */
};

struct s3_fcache_stats {
	uint64_t lookups, hits, misses, replaced, evictions;
	uint64_t probes;                 /* chain entries looked at by lookups (work) */
	uint64_t evict_steps;            /* entries looked at by eviction (work) */
	uint64_t entries, bytes, cap;
};

struct s3_fcache;

/* A cache of at most cap bytes (cap > 0). NULL + errno. */
struct s3_fcache *s3_fcache_new(uint64_t cap);
void s3_fcache_free(struct s3_fcache *c);

/* The entry for key at key's version, referenced (release with s3_fcache_put): found, or
 * created empty (rows 0, dim as given). NULL + errno (ENOMEM, EINVAL for a name longer
 * than S3_FC_NAME_MAX - 1). *hit (may be NULL) tells which. */
struct s3_frag *s3_fcache_get(struct s3_fcache *c, const struct s3_fkey *key, uint32_t dim,
			      bool *hit);
/* Drop a reference; evicts least recently used entries until the cache fits. */
void s3_fcache_put(struct s3_fcache *c, struct s3_frag *f);
/* Set the bytes a referenced entry holds (after the caller grew it). */
void s3_fcache_account(struct s3_fcache *c, struct s3_frag *f, size_t bytes);
void s3_fcache_stats(struct s3_fcache *c, struct s3_fcache_stats *out);

/* Grow f's columns to hold n rows (f->rw held for writing). 0 or -ENOMEM. */
int s3_frag_reserve(struct s3_frag *f, uint32_t n);

#endif
