/* mn_store.h: the memory node's registered region and the objects in it. An object is a
 * byte range named by a 64-bit key (an HNSW block, an index's metadata, a flat fragment)
 * that a loader allocates, fills with one-sided WRITEs and then commits with a checksum the
 * memory node verifies. Compute nodes find committed objects with a lookup and then read
 * them with one-sided READs; the memory node's CPU is not on that path.
 *
 * The object table lives in process memory (not in the registered region) and is saved
 * with the region's contents by mn_store_snapshot; mn_store_restore reloads it at start. */
#ifndef DM_MN_STORE_H
#define DM_MN_STORE_H

#include <pthread.h>

#include "dm.h"
#include "mem.h"
#include "wire.h"

#define MN_MAX_OBJS 65536u
#define MN_OBJ_ALIGN 64u

enum mn_obj_state { MN_OBJ_FREE = 0, MN_OBJ_WRITING = 1, MN_OBJ_COMMITTED = 2 };

struct mn_obj {
	uint64_t key;
	uint64_t off;       /* offset in the region */
	uint64_t len;
	uint32_t crc;       /* zlib crc32 of the contents at commit */
	uint32_t state;     /* enum mn_obj_state */
	uint32_t flags;     /* MN_OBJ_MUTABLE */
};

/* Object flag: its contents change after the commit (one-sided WRITEs of online inserts
 * into HNSW blocks, a counter word), so its crc describes the commit only and is not
 * checked when a snapshot is restored. */
#define MN_OBJ_MUTABLE 1u

/* Index generations (wire.h CTL_GEN_*, docs/architecture.md "Index generations"): per
 * HNSW index, the current generation, the retired one whose objects are still held, and
 * what every compute node of the cluster file last reported (the oldest generation it may
 * still read; 0 before its first report) and when. The retired generation's objects are
 * dropped as soon as no compute node holds it: every CN reported a newer generation, or
 * has not reported for lease_ns. An entry with neither generation (a dropped graph,
 * released) is free again. The table is rebuilt from the metadata keys at restore (reports
 * start empty: a restarted memory node waits for the CNs' next reports); the HNSW blocks
 * of an index without metadata (a dropped graph's) are dropped then. */
#define MN_MAX_GEN_INDEXES DM_MAX_GRAPHS

struct mn_gen {
	bool used, has_current, has_retired;
	uint32_t index;
	uint64_t current, retired;
	uint64_t reported[DM_MAX_NODES_WIRE];
	uint64_t seen_ns[DM_MAX_NODES_WIRE];
};

struct mn_gen_state {
	bool has_current, has_retired;
	uint64_t current, retired;
	uint32_t waiting;          /* CNs holding the retired generation */
	uint32_t freed;            /* objects dropped by this call */
};

struct mn_gen_entry {          /* mn_store_gen_list */
	uint32_t index;
	bool has_current, has_retired;
	uint64_t current, retired; /* 0 when not there */
};

struct mn_store {
	struct dm_region region;
	pthread_mutex_t lock;
	uint64_t used;      /* bump pointer */
	uint32_t nobj;      /* entries in objs (free ones included, reused as holes) */
	struct mn_obj *objs;
	uint32_t n_cn;      /* compute nodes that must acknowledge a generation */
	uint64_t lease_ns;
	uint64_t gen_t0;    /* when the table was set up (counts as every CN's last report) */
	struct mn_gen gens[MN_MAX_GEN_INDEXES];
	/* The last full snapshot's layout, for mn_store_snapshot_delta: its committed objects
	 * sorted by region offset with their data offsets in the file; valid while objver
	 * (bumped by every change of an object's state) equals snap_objver. */
	uint64_t objver, snap_objver;
	struct mn_snap_loc { uint64_t off, len, foff; uint32_t flags; } *snap_loc;
	uint32_t nsnap_loc;
};

/* Constructor: allocates the region (hugepages / NUMA as asked). NULL with errno. */
struct mn_store *mn_store_new(size_t len, int numa_node, enum dm_huge_mode huge);
void mn_store_free(struct mn_store *st);

/* Reserve len bytes for key; *off receives the offset. An uncommitted object of the same key
 * is replaced. -EEXIST if key is committed (drop it first), -ENOSPC when the region is full,
 * -EINVAL for len 0. */
int mn_store_alloc(struct mn_store *st, uint64_t key, uint64_t len, uint64_t *off);
/* Verify the contents against crc and mark committed: -ENOENT, -EBADMSG on mismatch (the
 * object stays uncommitted), -EINVAL if len differs from the allocation. */
int mn_store_commit(struct mn_store *st, uint64_t key, uint64_t len, uint32_t crc,
		    uint32_t flags);
/* Find a committed object. -ENOENT if none. */
int mn_store_lookup(struct mn_store *st, uint64_t key, struct mn_obj *out);
/* Drop every object whose key & mask == key_value & mask; returns how many. */
int mn_store_drop(struct mn_store *st, uint64_t key_value, uint64_t mask);
/* Committed objects and bytes. */
void mn_store_stats(struct mn_store *st, uint32_t *objects, uint64_t *bytes);

/* Generations. setup: the compute nodes that must acknowledge (ids 0..n_cn-1) and the
 * lease; call once after restore. publish: make gen current for index (its metadata object
 * committed here: else -ENOENT; -ESTALE unless gen > current; -EBUSY while a retired
 * generation is still held). report: cn (or DM_GEN_NO_CN: read only) still reads
 * generations >= gen. tick: apply the lease (call now and then). Each fills *out. */
void mn_store_gen_setup(struct mn_store *st, uint32_t n_cn, uint32_t lease_ms);
int mn_store_gen_publish(struct mn_store *st, uint32_t index, uint64_t gen,
			 struct mn_gen_state *out);
int mn_store_gen_report(struct mn_store *st, uint32_t index, uint32_t cn, uint64_t gen,
			struct mn_gen_state *out);
void mn_store_gen_tick(struct mn_store *st);
/* drop (CTL_GEN_DROP): graph index goes. Its current generation gen's metadata object is
 * dropped at once and gen becomes the retired generation (no current one), whose blocks
 * the rule above frees (a CN reporting DM_GEN_NONE or anything > gen no longer holds it);
 * then the entry is free again. -ENOENT: no such graph; -ESTALE: gen is not the current
 * one; -EBUSY: an older retired generation is still held. Dropping again while gen's blocks
 * are held is 0. Fills *out (may be NULL) like the others. */
int mn_store_gen_drop(struct mn_store *st, uint32_t index, uint64_t gen,
		      struct mn_gen_state *out);
/* list (CTL_GEN_LIST): every used entry of the table, at most cap, into out; their count. */
uint32_t mn_store_gen_list(struct mn_store *st, struct mn_gen_entry *out, uint32_t cap);

/* Save committed objects to path (path.tmp, fsync, rename). 0 or -errno. */
int mn_store_snapshot(struct mn_store *st, const char *path);
/* One byte range of the region that one-sided WRITEs changed (region offset, length). */
struct mn_range {
	uint64_t off;
	uint32_t len;
};
/* Bring the snapshot at path (the last full one) up to date for the ranges given: each is
 * copied from the region into the file where its object's bytes are, then the file is
 * fdatasync'ed. Only for ranges inside mutable committed objects, and only while the set of
 * objects is the one the last full snapshot of path wrote: otherwise (and when there was
 * none) a full snapshot is taken instead. -EINVAL for a range outside the region or inside
 * an object that is not mutable (nothing written then), -errno of the file. *full tells
 * whether a full snapshot was taken. */
int mn_store_snapshot_delta(struct mn_store *st, const char *path, const struct mn_range *r,
			    size_t n, bool *full);
/* Parse an FL_SNAPDELTA payload (wire.h: u32 n, n x {u64 addr, u32 len}) of a region at
 * address base into *r (malloc'd, *n ranges as region offsets). 0, -EBADMSG (malformed),
 * -EINVAL (an address below base), -ENOMEM. */
int mn_snapdelta_parse(const uint8_t *p, size_t len, uint64_t base, struct mn_range **r,
		       uint32_t *n);
/* Load a snapshot into an empty store. -ENOENT when there is none; -EBADMSG (with err
 * naming the problem) for a corrupted or truncated file; -ENOSPC if it does not fit. */
int mn_store_restore(struct mn_store *st, const char *path, char *err, size_t errlen);

#endif
