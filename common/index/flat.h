/* flat.h: the flat-index storage engine a memory node holds for the S3 Vectors workload.
 *
 * A store is a directory: a catalog of buckets and indexes, and per index the rows
 * (key, float32 vector, metadata) in fragments of a fixed number of rows. The last fragment
 * is the mutable tail (a scoped index has one per scope value: "Scoped indexes" below); a
 * full one is sealed and its columns never change again. Deletes are
 * tombstones (a per-index table beside the fragments); an overwrite by key is a tombstone +
 * an append. Every change is appended to a write-ahead log and fdatasync'ed before the call
 * returns, so a returned write survives a crash; writers that arrive together share one
 * fdatasync (group commit). A write is validated and its memory allocated before it is
 * logged, and it becomes visible to readers once it is durable. Opening a store loads the
 * last snapshot (a compacted image of the catalog and the live rows) and replays the WAL
 * after it; a torn tail (records written after the last sync, cut by a crash) is dropped
 * and the log truncated there, while a damaged record that later records show had been
 * durable makes the open fail (EBADMSG) rather than lose acknowledged writes.
 *
 * Row ids: u64, frag * frag_rows + row, in append order within one open of the store
 * (dense, except in a scoped index; they are compacted by a snapshot, so they are not
 * stable across restarts). A scan returns (distance, row id)
 * partial top-k lists; flat_get_ids resolves ids to rows.
 *
 * Metadata is opaque to the engine: `meta` (what GetVectors returns, JSON text for the S3
 * gateway) and `fmeta` (the filterable part in the encoding the filter evaluator reads) are
 * stored and handed back as given. Filters come in as a callback.
 *
 * Locking: every function is thread-safe. Readers of an index run concurrently; writers to
 * one index log in order (WAL order == apply order) and block readers only while they
 * apply in memory, not during the fdatasync. A failed fdatasync makes the store refuse
 * every later write (-EIO or the error seen) until it is reopened: what reached the disk
 * is unknown then, and the writes in flight may or may not be there after a restart.
 */
#ifndef DM_FLAT_H
#define DM_FLAT_H

#include "dm.h"
#include "distance.h"
#include "topk.h"

/* Bucket and index names: S3 allows 63 bytes (s3_api checks that); the store takes 4 more
 * for the names of a bucket's shards, "B#s" with s in 1..255 (s3_api.h), which the
 * memory nodes store as buckets of their own. Every name on disk and on the wire is
 * length-prefixed, so images written with the old limit read the same. */
#define FLAT_NAME_MAX 67
#define FLAT_KEY_MAX 1024           /* vector keys, bytes */
#define FLAT_DIM_MAX 4096

struct flat_store;
struct flat_index;

/* Scoped indexes (issue 15; the S3 layer's s3_scope.h gives these hooks): an index whose
 * configuration declares a scope keeps the rows of each scope label in fragments of their
 * own: one open tail per label, every fragment labelled (flat_frag_stat.scope), so a reader
 * can scan one label's fragments only. Row ids stay frag * frag_rows + row, so they have
 * holes (the unfilled rows of other labels' tails): every reader skips them as it skips
 * tombstones. The layout is derived from the rows (their label is recomputed when WAL or
 * snapshot records are replayed), so nothing of it is on disk. A scoped index's fragments
 * start with room for 16 rows and grow with them. Scoped indexes take no graph mark
 * (flat_mark_set: -EOPNOTSUPP). Without hooks every index is unscoped. */
struct flat_scope_ops {
	/* The scope key an index's configuration declares (malloc'd), or NULL: unscoped. */
	char *(*conf_key)(const void *conf, uint32_t conf_len);
	/* The label of a row of a scoped index from its filterable metadata (0: none). */
	uint64_t (*label)(const char *key, const void *fmeta, uint32_t fmeta_len);
};

struct flat_opts {
	uint32_t frag_rows;             /* rows per fragment (default 4096) */
	uint64_t checkpoint_bytes;      /* snapshot when the WAL grows past this (default 256 MiB;
					   0 = only at close / flat_checkpoint) */
	bool no_sync;                   /* skip fsync (tests of non-durability paths only) */
	bool no_group_commit;           /* one fdatasync per write, under the WAL lock (the
					   behaviour before group commit; for comparisons) */
	uint32_t lock_wait_ms;          /* the directory's lock held by another process: try
					   again for this long before failing with EBUSY (a
					   process SIGKILLed a moment ago may still hold it) */
	uint64_t max_bytes;             /* most bytes of rows the store holds (flat_row_bytes
					   summed over every index; 0 = no limit): a put past it
					   fails with -ENOSPC. Replay at open is never refused. */
	const struct flat_scope_ops *scope; /* NULL: every index unscoped */
};

/* WAL counters since open. */
struct flat_wal_stats {
	uint64_t bytes;                 /* in the WAL file now */
	uint64_t records;               /* records appended */
	uint64_t syncs;                 /* fdatasync calls on the WAL */
	uint64_t lsn, durable_lsn;      /* last written, last known durable */
	int error;                      /* sticky write/sync error (0 = none) */
};

struct flat_bucket_info {
	char name[FLAT_NAME_MAX + 1];
	int64_t created_ms;             /* creation time, ms since the epoch */
};

struct flat_index_info {
	char bucket[FLAT_NAME_MAX + 1];
	char name[FLAT_NAME_MAX + 1];
	uint32_t dim;
	enum dm_metric metric;
	int64_t created_ms;
	const void *conf;               /* opaque per-index configuration given at create */
	uint32_t conf_len;
};

/* One row to write. */
struct flat_row_in {
	const char *key;                /* NUL-terminated, 1..FLAT_KEY_MAX bytes */
	const float *vec;               /* dim floats */
	const void *meta;
	uint32_t meta_len;
	const void *fmeta;
	uint32_t fmeta_len;
};

/* One row as read (pointers valid only inside the callback). */
struct flat_row {
	uint64_t id;
	const char *key;
	const float *vec;
	const void *meta;
	uint32_t meta_len;
	const void *fmeta;
	uint32_t fmeta_len;
};

/* Row callback: return 0 to continue, > 0 to stop after this row (counted), < 0 to stop
 * before it (not counted; e.g. a page byte limit reached). */
typedef int (*flat_row_fn)(void *ctx, const struct flat_row *row);

/* Open (create if missing) the store in dir and recover it. NULL + errno on failure
 * (EBUSY: another process holds it; EBADMSG: corrupt snapshot). */
struct flat_store *flat_open(const char *dir, const struct flat_opts *opts);
/* Snapshot, then free. */
void flat_close(struct flat_store *s);
/* Free without a snapshot, as a crash would leave the directory (tests). */
void flat_abandon(struct flat_store *s);
/* Write a snapshot and truncate the WAL. */
int flat_checkpoint(struct flat_store *s);
/* Bytes currently in the WAL. */
uint64_t flat_wal_bytes(struct flat_store *s);
void flat_wal_stats(struct flat_store *s, struct flat_wal_stats *out);
/* The bytes one row holds in memory: its vector and norm, key, metadata and per-row
 * bookkeeping. A deleted or overwritten row keeps holding them until the store is opened
 * again (a restart compacts it away); a deleted index gives its rows' bytes back at once. */
uint64_t flat_row_bytes(uint32_t dim, size_t key_len, uint32_t meta_len, uint32_t fmeta_len);
/* Bytes of rows the store holds now (every index, dead rows not yet compacted included) and
 * its limit (flat_opts.max_bytes, 0 = none). */
void flat_store_usage(struct flat_store *s, uint64_t *used, uint64_t *max);

/* Catalog. Names are validated by the caller (the gateway applies AWS naming rules); the
 * engine only bounds their length. -EEXIST, -ENOENT, -ENOTEMPTY (bucket with indexes). */
int flat_bucket_create(struct flat_store *s, const char *name, int64_t created_ms);
int flat_bucket_get(struct flat_store *s, const char *name, struct flat_bucket_info *out);
int flat_bucket_delete(struct flat_store *s, const char *name);
/* Buckets in name order with the given prefix and name > after (either may be NULL), at
 * most max of them into out; *more tells whether more follow. Returns the count. */
int flat_bucket_list(struct flat_store *s, const char *prefix, const char *after, size_t max,
		     struct flat_bucket_info *out, bool *more);

int flat_index_create(struct flat_store *s, const char *bucket, const char *name, uint32_t dim,
		      enum dm_metric metric, const void *conf, uint32_t conf_len,
		      int64_t created_ms);
int flat_index_delete(struct flat_store *s, const char *bucket, const char *name);
/* Index names of a bucket, same paging rules as flat_bucket_list. names[i] receives a
 * FLAT_NAME_MAX + 1 byte name. -ENOENT for an unknown bucket. */
int flat_index_list(struct flat_store *s, const char *bucket, const char *prefix,
		    const char *after, size_t max, char (*names)[FLAT_NAME_MAX + 1], bool *more);

/* Catalog attributes: opaque bytes kept with a bucket or an index (the S3 gateway keeps
 * tags and bucket policies there as JSON text), logged and snapshotted with the catalog and
 * dropped with their bucket or index. */
enum flat_attr_kind { FLAT_ATTR_TAGS = 1, FLAT_ATTR_POLICY = 2,
	FLAT_ATTR_SHARDS = 3 /* a bucket's shard count S > 1, decimal (s3_api.h) */ };
#define FLAT_ATTR_MAX (256u << 10)      /* bytes of one attribute */
/* Set (len > 0) or clear (len 0) attribute kind of bucket (index NULL) or of index
 * bucket/index; durable when it returns 0. -ENOENT (no such bucket or index), -EINVAL. */
int flat_attr_set(struct flat_store *s, const char *bucket, const char *index, uint32_t kind,
		  const void *val, uint32_t len);
/* A malloc'ed NUL-terminated copy into *out (*len bytes), *out NULL when unset. 0,
 * -ENOENT (no such bucket or index), -ENOMEM. */
int flat_attr_get(struct flat_store *s, const char *bucket, const char *index, uint32_t kind,
		  char **out, uint32_t *len);

/* Catch-up of a stale replica (flat_image.c). An image of one bucket at one instant: its
 * catalog entry, its indexes with their live rows, graph marks and key logs, and the
 * attributes of the bucket and its indexes, in the snapshot's record framing after a magic
 * and the bucket's name; every write acknowledged before the call is in it. *out
 * (malloc'ed, *len bytes) is the caller's. -ENOENT (no such bucket), -EINVAL, -ENOMEM. */
int flat_bucket_image(struct flat_store *s, const char *bucket, uint8_t **out, size_t *len);
/* Replace bucket by an image flat_bucket_image took (of a store with the same or another
 * frag_rows); img NULL / len 0: drop the bucket if there is one (the source has none). The
 * whole image is checked first: -EBADMSG (a bad image or one of another bucket), -ENOMEM,
 * nothing changed then. Then, with every writer held out, the bucket's indexes are dropped
 * as flat_index_delete drops them (handles held stay valid; their writes fail with
 * -ENOENT), the image's bucket takes its place, and a checkpoint makes the store durable
 * before writers go on (the install is not logged; it is never refused for space, as
 * replay is not). A failed checkpoint makes the store refuse every later write (as a failed
 * WAL sync does) and is returned; a store that had already failed so returns its error,
 * nothing changed. */
int flat_bucket_install(struct flat_store *s, const char *bucket, const uint8_t *img,
			size_t len);

/* Take a reference to an index (NULL + errno ENOENT). The handle stays usable after a
 * concurrent delete (its writes then fail with -ENOENT) until flat_index_put. */
struct flat_index *flat_index_get(struct flat_store *s, const char *bucket, const char *name);
void flat_index_put(struct flat_index *ix);
/* The index's description (owned by the handle). */
const struct flat_index_info *flat_index_info(const struct flat_index *ix);
/* Whether the index is scoped (flat_scope_ops; its fragments carry scope labels). */
bool flat_index_scoped(const struct flat_index *ix);
/* Live rows, all rows (incl. tombstoned), fragments. */
void flat_index_stats(struct flat_index *ix, uint64_t *live, uint64_t *rows, uint64_t *frags);

/* Insert or overwrite rows; durable when it returns 0. A key repeated in one call: the last
 * one wins. -EINVAL for a bad key or length, -E2BIG for a call whose record passes 64 MiB,
 * -ENOSPC when the rows would take the store past flat_opts.max_bytes, -ENOMEM; nothing is
 * logged or applied then. */
int flat_put(struct flat_index *ix, const struct flat_row_in *rows, size_t n);
/* Delete keys (missing keys are ignored); durable when it returns. Returns 0. */
int flat_delete(struct flat_index *ix, const char *const *keys, size_t n);

/* Call fn for each present key (missing keys are skipped). Returns the number found. */
int flat_get(struct flat_index *ix, const char *const *keys, size_t n, flat_row_fn fn,
	     void *ctx);
/* Same by row id (ids of tombstoned rows are skipped too). */
int flat_get_ids(struct flat_index *ix, const uint64_t *ids, size_t n, flat_row_fn fn,
		 void *ctx);
/* List live rows with id >= start in id order, only keys in segment seg_index of seg_count
 * (by flat_key_hash; seg_count 0 or 1 = all), at most max rows. *next is where to resume,
 * or UINT64_MAX when the end was reached. Returns the number of rows given to fn. */
int flat_list(struct flat_index *ix, uint64_t start, uint32_t seg_count, uint32_t seg_index,
	      size_t max, flat_row_fn fn, void *ctx, uint64_t *next);

/* The memory nodes that hold bucket `bucket` in cluster cfg, best first (weighted
 * rendezvous over the cluster file's memory nodes by flat_key_hash of the name, [cluster]
 * redundancy of them): their number, or -errno. The gateway and `dmann load --bucket` use
 * it. */
struct dm_cluster_cfg;
int flat_bucket_mns(const struct dm_cluster_cfg *cfg, const char *bucket, uint32_t *out);
/* The same under a placement that retires the memory nodes of the bit set retired (ids
 * 0..255 in 4 words; NULL: none): a retired node's buckets go to the next node in each
 * bucket's order, the others stay (the compute nodes' gateways follow the cluster state's
 * placement, cstate.h). */
int flat_bucket_mns_placed(const struct dm_cluster_cfg *cfg, const uint64_t *retired,
			   const char *bucket, uint32_t *out);

/* Stable 64-bit hash of a key (segments, the key map). */
uint64_t flat_key_hash(const char *key, size_t len);

/* Filter callback: true if the row's filterable metadata matches. */
typedef bool (*flat_match_fn)(void *ctx, const void *fmeta, uint32_t fmeta_len);

/* An exact scan of nq queries (one sgemm per fragment when nq > 1). */
struct flat_scan {
	const float *q;                 /* nq x dim */
	size_t nq;
	size_t k;                       /* partial top-k size per query */
	flat_match_fn match;            /* NULL = no filter */
	void *const *match_ctx;         /* per query ctx, NULL entries = no filter for it */
	/* Scan only fragments f with f % share_count == share_index (a CN's share of the
	 * index); share_count 0 = every fragment. */
	uint32_t share_count, share_index;
	/* Or, when set, exactly the fragments for which frag_sel returns true (a share
	 * computed by s3_plan_shares); overrides share_count. */
	bool (*frag_sel)(void *ctx, uint64_t frag);
	void *frag_ctx;
	/* Scoped: only the fragments labelled `scope` (flat_scope_ops), on top of the above. */
	bool scoped;
	uint64_t scope;
};

/* Fragment sizes for share planning: bytes[f] = vector bytes of fragment f (its id), for up
 * to max fragments; returns the number of fragments. */
size_t flat_fragments(struct flat_index *ix, uint64_t *bytes, size_t max);

/* Scan: out receives nq lists of up to k hits, list i at out + i*k sorted ascending by
 * (distance, id), nout[i] its length. Distances as in distance.h (L2 squared, cosine
 * 1 - cos). -EINVAL for bad arguments, -ENOMEM. */
int flat_search(struct flat_index *ix, const struct flat_scan *sc, struct dm_hit *out,
		size_t *nout);

/* The graph mark: rows [0, mark) of an index are held by an HNSW graph identified by tag
 * (a graph generation), so a planner searches the graph for them and scans only the rows
 * from the mark on (the tail). It is durable (logged), kept in the store's own numbering
 * across restarts (a snapshot counts the live rows below it), 0 for a new index, and
 * dropped with the index. flat_mark_set sets it to `rows`, which must be every row the
 * index has had written (ids [0, rows), dead or alive) when it applies: -EBUSY when the
 * index has another count (a write came in between), -ENOENT (index deleted),
 * -EOPNOTSUPP (a scoped index: no graph), or the WAL's error. */
int flat_mark_set(struct flat_index *ix, uint64_t rows, uint64_t tag);
void flat_mark_get(struct flat_index *ix, uint64_t *mark, uint64_t *tag);

/* Online indexing (flat_gindex.c): an indexer that inserted rows of the tail into graph
 * generation `tag` (and made the graph durable) hands over one entry per node: its id, the
 * row's key and flat_vec_crc of the row's vector. flat_gindex_add logs them (durable when
 * it returns), appends them to the index's key log and moves the mark over every row from
 * it on that is dead or whose key and vector an entry (of this or an earlier call) holds,
 * up to the first row no entry holds; *mark (optional) gets the new mark. n may be 0 (the
 * advance alone). -EINVAL (more than FLAT_GINDEX_MAX entries, a bad key), -ESTALE (the
 * index has no graph mark or one of another generation), -ENOENT (deleted), -ENOMEM or the
 * WAL's error; nothing is logged then. A new flat_mark_set empties the key log. */
#define FLAT_GINDEX_MAX 8192u
struct flat_gentry {
	uint64_t id;
	const char *key;
	uint32_t vcrc;
};
uint32_t flat_vec_crc(const float *v, uint32_t dim);
/* A row version (key, flat_vec_crc of its vector) as a non-zero 64-bit hash. */
uint64_t flat_row_version(const char *key, uint32_t vcrc);
int flat_gindex_add(struct flat_index *ix, uint64_t tag, const struct flat_gentry *e, size_t n,
		    uint64_t *mark);
/* The key log from entry `from` on, at most max entries, in log order: fn per entry (a
 * non-zero return stops). Returns the log's length. */
typedef int (*flat_gkey_fn)(void *ctx, uint64_t id, const char *key);
uint64_t flat_gindex_read(struct flat_index *ix, uint64_t from, size_t max, flat_gkey_fn fn,
			  void *ctx);
uint64_t flat_gindex_count(struct flat_index *ix);

/* Fragment-level access for readers that cache fragments elsewhere (compute nodes): a
 * fragment's rows never change once written (an overwrite is a tombstone + an append), and
 * its tombstone count only grows, so (rows, dead) is a version: a copy with at least as
 * many rows and tombstones as a later flat_frag_stats is still current. */
struct flat_frag_stat {
	uint32_t rows;                  /* rows written */
	uint32_t dead;                  /* of those, tombstoned */
	uint64_t scope;                 /* its scope label (0 in an unscoped index) */
};

/* Rows per fragment of the index. */
uint32_t flat_frag_rows(const struct flat_index *ix);
/* Stats of up to max fragments into out; returns the number of fragments. */
size_t flat_frag_stats(struct flat_index *ix, struct flat_frag_stat *out, size_t max);
/* Read fragment frag at one instant: its tombstone flags for every row written so far
 * into dead (dead_cap >= flat_frag_rows bytes; 1 = tombstoned), and fn for each row from
 * row `from` on, dead or alive (row ids are frag * frag_rows + row). Returns the number of
 * rows written in the fragment, -ENOENT for a fragment that does not exist, -EINVAL. */
int flat_frag_read(struct flat_index *ix, uint64_t frag, uint32_t from, uint8_t *dead,
		   size_t dead_cap, flat_row_fn fn, void *ctx);

#endif
