/* flat_int.h: private declarations shared by the flat store's files (not for users of
 * flat.h): the store, index and fragment structures, and the functions one part of the
 * store calls in another.
 *
 *   flat_catalog.c  buckets and indexes (catalog API, index lifetime)
 *   flat_frag.c     rows, fragments, tombstones, key map; the read API on rows/fragments
 *   flat_apply.c    the write path (PUT/DEL: prepare, log, wait for durability, apply) and
 *                   replay of one record
 *   flat_wal.c      record framing, WAL append with group commit, WAL replay
 *   flat_snap.c     snapshots, checkpoints, open/recovery/close
 *   flat_image.c    a bucket's image and its installation (catch-up of a stale replica)
 *   flat_scan.c     exact scans with partial top-k
 *   flat_attr.c     catalog attributes (tags, bucket policies)
 *   flat_mark.c     the graph mark (rows an HNSW graph holds)
 *   flat_gindex.c   its online part: the key log of nodes an indexer added, the advance
 *   flat_scope.c    the tails of scoped indexes (one open fragment per scope label)
 *
 * Lock order: ckmu -> cat -> index wmu -> index rw -> walmu.
 *
 * Write path of a PUT (flat_apply.c): everything that can fail (validation, the memory of
 * the new rows, fragments and key-map room) happens before the record is logged; then the
 * record is written to the WAL and queued on its index (under wmu, so WAL order == apply
 * order per index), wmu is released while the writer waits for a sync that covers its
 * record (group commit: one fdatasync for all writers waiting together), and the first
 * writer back applies the queue up to its own write, with operations that cannot fail. A
 * write becomes visible only once it is durable.
 */
#ifndef DM_FLAT_INT_H
#define DM_FLAT_INT_H

#include "flat.h"
#include "util/dm_buf.h"
#include "util/dm_u64set.h"
#include "flat_wal.h"

#include <pthread.h>
#include <sys/types.h>

/* One fragment: columns of up to cap rows. Sealed (n == cap) fragments never change; the
 * tombstone flags (dead) are the index's tombstone table, kept beside the columns. */
struct flat_frag {
	uint32_t n, cap;
	uint32_t alloc;        /* rows the columns have room for (cap, or fewer in a scoped
				  index: its fragments grow with their rows, flat_frag_grow) */
	float *vec;            /* cap x dim, 64-byte aligned */
	float *norm2;          /* squared norms (sgemm, cosine) */
	uint64_t *khash;       /* flat_key_hash of each key */
	char **key;
	uint8_t **meta;        /* meta bytes then fmeta bytes, one allocation per row */
	uint32_t *meta_len, *fmeta_len;
	uint8_t *dead;
	uint64_t scope;        /* scope label of its rows (scoped indexes; else 0) */
	struct flat_frag *next_spare;   /* in flat_index.spare until it is used */
};

/* Open-addressing key -> row id map (linear probing, backward-shift deletion). */
struct keymap {
	struct km_slot { uint64_t hash, id; } *slot;   /* id UINT64_MAX = empty */
	size_t cap, n;
};

/* One node an indexer added to the graph (flat_gindex.c). */
struct flat_gkey {
	uint64_t id;
	char *key;
	uint32_t vcrc;
};

/* The key log of an index's graph generation and the set of row versions it holds. */
struct flat_gix {
	struct flat_gkey *log;         /* in log order (under rw; grows under wmu + rw) */
	size_t n, cap;
	struct dm_u64set set;          /* indexed row versions (under wmu) */
};

/* The tails of a scoped index (flat_scope.c; under wmu): per scope label its open fragment
 * as applied (tail) and as planned once every pending write is applied (rtail, rfill). */
struct flat_stail {
	uint64_t label;
	uint64_t tail, rtail;          /* fragment ids, UINT64_MAX: none */
	uint32_t rfill;                /* rows rtail holds in the plan */
	uint64_t full;                 /* a fragment in the table the plan fills up (its
					  columns must grow to frag_rows), UINT64_MAX: none */
	bool used;
};
struct flat_stails {
	struct flat_stail *slot;       /* open addressing by label */
	size_t cap, n;
	uint64_t rfrags;               /* fragments in the plan */
	uint32_t fut_need;             /* most rows a planned fragment not yet in the table
					  will hold: every spare gets room for as many */
	bool replan;                   /* a reservation was given back: recompute the plan */
};

struct flat_index {
	struct flat_store *s;
	struct flat_index_info info;
	void *conf;
	int refs;
	bool deleted;                  /* under wmu */
	pthread_mutex_t wmu;           /* serialises logging: WAL order == apply order */
	pthread_cond_t apply_cv;       /* the queue of logged writes got shorter */
	pthread_rwlock_t rw;           /* readers vs applying writers */
	uint32_t frag_rows;
	struct flat_frag **frags;
	size_t nfrags, capfrags;
	uint64_t next_id, live;        /* next_id: past the highest row id placed */
	uint64_t placed;               /* rows placed (next_id in an unscoped index) */
	char *scope_key;               /* a scoped index's key (flat_scope_ops), else NULL */
	const struct flat_scope_ops *sops;
	struct flat_stails st;         /* its tails (scoped only) */
	uint64_t mark, mark_tag;       /* the graph mark (flat_mark.c; under rw) */
	struct flat_gix gix;           /* its online part (flat_gindex.c) */
	struct keymap map;
	/* Logged, not yet applied writes (under wmu), in log order; their rows are reserved
	 * (key-map room, spare fragments) so that applying them cannot fail. */
	struct flat_pending *qhead, *qtail;
	uint64_t pending_rows;
	uint64_t bytes;                /* flat_row_bytes of every row placed (under wmu) */
	struct flat_frag *spare;       /* preallocated empty fragments */
	size_t nspare;
};

struct flat_store {
	char *dir;
	char *wal_path;
	int lockfd, walfd;
	struct flat_opts o;
	pthread_rwlock_t cat;          /* catalog */
	pthread_mutex_t ckmu;          /* one checkpoint at a time */
	struct flat_bucket_info *buckets;
	size_t nb, capb;
	struct flat_index **ix;
	size_t nix, capix;
	struct flat_attr *attrs;       /* catalog attributes (under cat) */
	size_t nattr, capattr;
	/* WAL state, under walmu. */
	pthread_mutex_t walmu;
	pthread_cond_t walcv;          /* durable_lsn moved, or a sync failed */
	uint64_t lsn;                  /* last record written */
	uint64_t durable_lsn;          /* every record <= this is on disk (fdatasync'ed) */
	uint64_t wal_bytes;            /* bytes written */
	bool syncing;                  /* a leader is in fdatasync */
	int wal_err;                   /* sticky: a failed write/sync; the store refuses writes */
	uint64_t n_records, n_syncs;   /* statistics */
	/* Capacity (atomics): bytes of the rows placed in every index, and bytes of puts
	 * admitted and not yet placed (flat_put checks both against o.max_bytes). */
	uint64_t bytes, admitted;
};

/* A write logged and not yet applied: lives in its writer's stack frame until done. Once a
 * writer's record is durable, so are the records before it, and it applies every queued
 * write up to its own (theirs included: their writers then find them done). */
struct flat_pending {
	struct flat_pending *next;
	uint64_t lsn;
	struct flat_prow *rows;        /* PUT */
	size_t nrows;
	const char *const *keys;       /* DEL */
	size_t nkeys;
	bool done;
};

/* ---- flat_frag.c ---- */
struct flat_frag *flat_frag_new(uint32_t cap, uint32_t dim);
/* A fragment of cap rows whose columns have room for alloc of them (NULL). */
struct flat_frag *flat_frag_new_n(uint32_t cap, uint32_t alloc, uint32_t dim);
/* Room for rows rows in f's columns (wmu held; shared: f is in ix's table, its new columns
 * are swapped in under rw). 0 or -ENOMEM (f unchanged). */
int flat_frag_grow(struct flat_index *ix, struct flat_frag *f, uint32_t rows, bool shared);
void flat_frag_free(struct flat_frag *f);
void flat_fill_row(const struct flat_index *ix, uint64_t id, struct flat_row *row);
bool flat_row_dead(const struct flat_index *ix, uint64_t id);
uint64_t flat_km_get(const struct flat_index *ix, const char *key);
void flat_row_kill(struct flat_index *ix, uint64_t id);

/* A row ready to be applied: its memory is allocated (prepare), so placing it cannot fail. */
struct flat_prow {
	char *key;                     /* owned until placed */
	uint8_t *meta;                 /* meta then fmeta, owned until placed */
	uint32_t meta_len, fmeta_len;
	uint32_t key_len;              /* strlen(key) */
	uint64_t khash;
	uint64_t scope;                /* its scope label (flat_scope_row; 0 unscoped) */
	const void *vec;               /* dim floats, any alignment (copied when placed) */
};
/* Allocate the copies of one row (-ENOMEM); flat_prow_free releases an unplaced one. */
int flat_prow_init(struct flat_prow *p, const char *key, const void *vec, const void *meta,
		   uint32_t mlen, const void *fmeta, uint32_t flen);
void flat_prow_free(struct flat_prow *p);
/* Reserve room for the n rows p (their scope labels set) beyond those already pending
 * (wmu held; takes rw for the moment it grows the key map or the fragment table): -ENOMEM,
 * nothing reserved then. */
int flat_reserve(struct flat_index *ix, const struct flat_prow *p, uint64_t n);
/* Give back a reservation of n rows that will not be applied (wmu held). */
void flat_unreserve(struct flat_index *ix, uint64_t n);
/* Place a prepared row (wmu and rw held, room reserved): tombstones the key's old row. */
void flat_place(struct flat_index *ix, struct flat_prow *p);

/* ---- flat_scope.c ---- */
/* The scope label of a row of ix with filterable metadata fmeta (0 when ix is unscoped or
 * the row has no scope value). */
uint64_t flat_scope_row(const struct flat_index *ix, const void *fmeta, uint32_t flen);
/* Plan the n rows p after the pending ones (wmu held): *frags = the fragments the index
 * will have once they are applied. -ENOMEM, nothing planned then. */
int flat_scope_plan(struct flat_index *ix, const struct flat_prow *p, uint64_t n,
		    uint64_t *frags);
/* Room in the columns of every fragment the plan of rows p puts rows in: the table's
 * (grown under rw) and the spares (wmu held). 0 or -ENOMEM (the plan must then be
 * recomputed). */
int flat_scope_room(struct flat_index *ix, const struct flat_prow *p, uint64_t n);
/* A planned reservation given back (or one that failed halfway): the plan is recomputed
 * at the next flat_scope_plan. */
void flat_scope_unplan(struct flat_index *ix);
/* Where the next row of label goes (wmu and rw held, planned): its fragment; *fresh when
 * that is a new fragment (id ix->nfrags) the caller appends. */
uint64_t flat_scope_take(struct flat_index *ix, uint64_t label, bool *fresh);
void flat_scope_free(struct flat_stails *t);

/* ---- flat_catalog.c ---- */
struct flat_index *flat_index_new(struct flat_store *s, const char *bucket, const char *name,
				  uint32_t dim, enum dm_metric metric, const void *conf,
				  uint32_t conf_len, int64_t created);
void flat_index_free(struct flat_index *ix);
ssize_t flat_bucket_find(struct flat_store *s, const char *name);
ssize_t flat_index_find(struct flat_store *s, const char *bucket, const char *name);
/* Room for one more element in *arr (n used of *cap, doubling): 0 or -ENOMEM. */
int flat_grow(void **arr, size_t n, size_t *cap, size_t elem);
/* Room for one more bucket / index in the catalog arrays (-ENOMEM). */
int flat_cat_reserve(struct flat_store *s);
/* Add (room reserved by flat_cat_reserve) and remove catalog entries. */
void flat_cat_add_bucket(struct flat_store *s, const char *name, int64_t created);
void flat_cat_add_index(struct flat_store *s, struct flat_index *ix);
void flat_cat_drop_index(struct flat_store *s, size_t i);

/* ---- flat_attr.c ---- */
/* One attribute: (bucket, index or "" for the bucket itself, kind) -> bytes. */
struct flat_attr {
	char bucket[FLAT_NAME_MAX + 1];
	char index[FLAT_NAME_MAX + 1];
	uint32_t kind;
	uint8_t *val;
	uint32_t len;
};
/* Drop the attributes of a bucket (index NULL: the bucket's own) or of an index (cat
 * write-locked). */
void flat_attr_drop(struct flat_store *s, const char *bucket, const char *index);
/* Drop every attribute of a bucket and of its indexes (cat write-locked). */
void flat_attr_drop_bucket(struct flat_store *s, const char *bucket);
/* Room for n more attributes (-ENOMEM), then move every attribute of src into s (room
 * reserved; none of them may be in s already; src keeps none). */
int flat_attr_reserve_n(struct flat_store *s, size_t n);
void flat_attr_move(struct flat_store *s, struct flat_store *src);
/* Replay of a FLAT_REC_ATTR record (recovery). */
int flat_attr_apply(struct flat_store *s, const uint8_t *p, uint32_t n);
/* Encode attribute i as a FLAT_REC_ATTR payload into b (after flat_rec_begin). */
void flat_attr_enc(struct dm_buf *b, const struct flat_attr *a);
void flat_attr_free_all(struct flat_store *s);

/* ---- flat_mark.c ---- */
/* Replay of a FLAT_REC_MARK record (recovery). */
int flat_mark_apply(struct flat_store *s, const uint8_t *p, uint32_t n);
/* The MARK record of ix for a snapshot into b (after flat_rec_begin): the mark counted in
 * the snapshot's numbering (live rows below it); false when ix has no mark. */
bool flat_mark_snap(struct flat_index *ix, struct dm_buf *b);

/* ---- flat_gindex.c ---- */
/* Replay of a FLAT_REC_GINDEX record (recovery). */
int flat_gindex_apply(struct flat_store *s, const uint8_t *p, uint32_t n);
/* The next GINDEX record of ix's key log from entry *at for a snapshot into b (after
 * flat_rec_begin; *at advanced), false when the log is done. */
bool flat_gindex_snap(struct flat_index *ix, size_t *at, struct dm_buf *b);
/* Forget the key log (a new graph generation, or the index freed). */
void flat_gix_clear(struct flat_gix *g);

/* ---- flat_apply.c ---- */
/* Encode a PUT of rows for ix into b (after flat_rec_begin). */
void flat_enc_put(struct dm_buf *b, const struct flat_index *ix, const struct flat_row_in *rows,
		  size_t n);
/* Replay one record (recovery, single-threaded): -EBADMSG if it does not fit the state. */
int flat_apply_record(struct flat_store *s, uint32_t type, const uint8_t *p, uint32_t n);
/* Wait until every write logged for ix so far is applied or dropped (wmu held). */
void flat_drain(struct flat_index *ix);

/* ---- flat_wal.c ---- */
/* Frame b (header reserved by flat_rec_begin) as the next record and write it to the WAL;
 * *lsn receives its lsn. Not durable yet unless group commit is off. -E2BIG, -ENOMEM, or
 * the sticky error of an earlier failed write or sync. */
int flat_wal_write(struct flat_store *s, struct dm_buf *b, uint32_t type, uint64_t *lsn);
/* Wait until record lsn is durable: one of the waiting writers runs fdatasync for all of
 * them (leader), the others wait for its result. 0 or the sync error (sticky). */
int flat_wal_wait(struct flat_store *s, uint64_t lsn);
/* Write + wait (catalog operations). */
int flat_wal_append(struct flat_store *s, struct dm_buf *b, uint32_t type);
/* Replay the WAL at s->wal_path after a snapshot at snap_lsn (see flat_wal.c for how a torn
 * tail is told from corruption). */
int flat_wal_replay(struct flat_store *s, uint64_t snap_lsn);

/* ---- flat_snap.c ---- */
int flat_write_all(int fd, const void *p, size_t n, off_t off);
int flat_read_file(const char *path, uint8_t **out, size_t *len);
/* Checkpoint if the WAL has grown past the threshold (called with no locks held). */
void flat_maybe_checkpoint(struct flat_store *s);
/* An empty store in memory (no directory, no WAL, no lock file: a scratch store that
 * flat_apply_record can fill) with opts (NULL: defaults); NULL + errno. flat_store_free
 * frees it (or an opened store) without a snapshot. */
struct flat_store *flat_store_new(const struct flat_opts *opts);
void flat_store_free(struct flat_store *s);
/* Hold every writer of the store out (ckmu held by the caller): cat write-locked, then
 * every index's wmu held once the writes it logged are applied (lock order). Release
 * unlocks the wmu of every index in the catalog then, and cat. */
void flat_writers_hold(struct flat_store *s);
void flat_writers_release(struct flat_store *s);
/* Snapshot + WAL truncate with the writers held out (flat_writers_hold). 0, the WAL's
 * sticky error (nothing written then) or the error of the snapshot's files. */
int flat_checkpoint_held(struct flat_store *s);

/* Records in the snapshot framing (lsn 0, inflight 0): each is built in rec (after
 * flat_rec_begin) and framed onto out by flat_snap_emit, which counts it in nrec. With fd
 * >= 0, out is written to fd at off in large pieces (a snapshot file); with fd -1 it keeps
 * every record (a bucket image, flat_image.c). The first error stays in rc. */
struct flat_snapw {
	int fd;
	off_t off;
	struct dm_buf out, rec;
	uint64_t nrec;
	int rc;
};
void flat_snap_emit(struct flat_snapw *w, uint32_t type);
/* BUCKET_CREATE of b. */
void flat_snap_bucket(struct flat_snapw *w, const struct flat_bucket_info *b);
/* INDEX_CREATE, PUT batches of the live rows (compacted), MARK and GINDEX of ix (its
 * writers held out). */
void flat_snap_index(struct flat_snapw *w, struct flat_index *ix);
/* ATTR of a. */
void flat_snap_attr(struct flat_snapw *w, const struct flat_attr *a);
/* SNAP_END {u64 records before it}. */
void flat_snap_end(struct flat_snapw *w);

/* Test hook: when > 0, counts down on every allocation of the write path's prepare step
 * and makes the one that reaches 0 fail with -ENOMEM (tests of "fails before logging"). */
extern int flat_fault_alloc;
/* Test hook: when > 0, counts down on every fdatasync of the WAL by a writer and makes the
 * one that reaches 0 fail with -EIO (tests of a failed sync). */
extern int flat_fault_sync;

#endif
