/* cn_insert.h: online inserts from a compute node into the HNSW graph on the memory nodes
 * (INSERT, Algorithm 1 of Malkov & Yashunin, against remote memory; DESIGN §4), for indexes
 * loaded with spare room (`dmann load --spare N`, dindex.h).
 *
 * One insert of a vector x:
 *   1. its id: one FAA on the index's id counter (ids n .. capacity-1; -ENOSPC past it);
 *   2. SEARCH-LAYER on level 0 with ef = efConstruction through the resumable query
 *      (hnsw_query.h, the search the workers run: upper levels from the compute node's copy,
 *      one READ per expanded node with codes), the expanded nodes' vectors kept;
 *   3. SELECT-NEIGHBORS-HEURISTIC (Algorithm 4) down to M of them, exact distances;
 *   4. x's record (level 0, its list, the codes of its neighbours, its rotated vector, CRC)
 *      WRITTEN to every replica of its block: nothing links to it yet, so no lock;
 *   5. for each neighbour e, the back-link under e's record lock: READ e (primary replica),
 *      CAS its 8-byte header word from the stable value read to seq + 1 with this CN's id
 *      as holder, add x to e's list (a free slot, else x replaces e's farthest neighbour
 *      when x is closer; distances from e's own codes, whose residual norms are exact;
 *      when no neighbour took x, the nearest one is made to, in its farthest slot),
 *      with x's code in that slot; WRITE the record with seq + 2 to the other replicas,
 *      then the body and last the header word to the primary (the release). A lock is
 *      never held across more than one READ round, and never two at once. A header word
 *      that stays held (or torn) for CN_INSERT_LOCK_LEASE_NS is a gone holder's: the lock
 *      is taken over, a whole copy (the primary's or a replica's) written back, released.
 * Readers (cn_read.c) accept a record whose CRC32C matches (hnsw_rec_intact: a whole old or
 * new body, even while a writer holds it), so a torn record is read again, then from
 * another replica; the order of the WRITEs keeps one copy whole at every instant (the
 * other replicas are rewritten before the primary's body), also when the writer dies.
 * With one replica a writer that dies mid-WRITE leaves no whole copy: readers still
 * meeting it torn after the lease use it salvaged (hnsw_rec_salvage: a back-link changes
 * only n0, one slot, its code and the CRC), and so does the next writer that breaks its
 * lock, which writes the salvaged copy back.
 *
 * A new node's level is drawn as in Algorithm 1 (at most the import's top level: the entry
 * point never changes); a node of level >= 1 is published to the cluster state once its
 * run ends, and every compute node adds it to its own copy of the upper levels
 * (cn_upper.h). Not built yet (issue 13): inserted records live in memory-node
 * memory until the next snapshot (no tail/WAL behind them); the compute nodes' caches may
 * keep a neighbour's record without its new back-link.
 *
 * Thread-safety: one engine per thread (a worker owns one); engines of any number of
 * compute nodes insert into the same index concurrently. */
#ifndef DM_CN_INSERT_H
#define DM_CN_INSERT_H

#include "cn.h"
#include "dindex.h"

#define CN_INSERT_EF_DEFAULT 100u
#define CN_INSERT_LOCK_TRIES 64u   /* CAS attempts on one neighbour before the link is dropped */
/* A record whose header word stays held (or torn) this long is a gone holder's: its lock
 * is broken and a whole copy written back (a live writer holds one for milliseconds). */
#define CN_INSERT_LOCK_LEASE_NS 2000000000ull

struct cn_insert;

struct cn_insert_stats {
	uint64_t inserted, links, links_dropped, lock_retries, rereads, reads, locks_broken;
	uint64_t salvaged;  /* torn records of a gone holder with no whole copy, salvaged */
	uint64_t forced;    /* new nodes no neighbour linked to: linked from the nearest by force */
	uint64_t kept;      /* neighbours a back-link pushed out, linked from the new node */
	uint64_t rounds;    /* round trips waited for (a batch to several memory nodes: one) */
	int err;            /* what stopped a batch early (0: all inserted) */
	char err_at[96];    /* where it did, for the logs ("" when not known) */
};

/* An engine for compute node cn (its transport and cluster file). NULL + errno. */
struct cn_insert *cn_insert_new(struct cn *cn);
void cn_insert_free(struct cn_insert *e);

/* Insert rows vecs[0 .. n) (dim floats each, the index's dimension) into index view d (the
 * caller holds cn->lock for reading) with search breadth ef (0: CN_INSERT_EF_DEFAULT);
 * ids[i] gets row i's id. Returns the rows inserted (all n on success) or -errno when none
 * was: -ENOENT no spare room (a read-only index), -ENOSPC the index is full, -EINVAL a bad
 * dimension or a zero/non-finite vector under cos, -EHOSTUNREACH a block's replicas or the
 * id counter unreachable, -EIO a record that stays torn; when some rows were inserted
 * and then one failed, st->err says why. Counters add into st. */
int cn_insert_run(struct cn_insert *e, const struct dindex *d, const float *vecs, uint32_t n,
		  uint32_t dim, uint32_t ef, uint64_t *ids, struct cn_insert_stats *st);

/* Node id's record of view d read from the memory nodes as inserts read records (a whole
 * copy, waited for while torn or held, salvaged past the lease) and its stored vector
 * (d->vdim floats) copied to out. The caller holds cn->lock for reading. 0, -ENODATA (an
 * empty record: never written, or lost with a memory node's memory), -EINVAL, or -errno. */
int cn_insert_read_stored(struct cn_insert *e, const struct dindex *d, uint32_t id, float *out);

/* The dirty-range log, for a snapshot of only what was written (the online indexer's
 * FL_SNAPDELTA): while on, every byte range this engine WRITEs or changes atomically on a
 * memory node (records, header words, the id counter) is recorded. take hands the ranges
 * recorded so far over (malloc'd, *n of them, in write order; free them) and starts
 * afresh; *lost is true when a range could not be recorded (no memory): the caller must
 * take a full snapshot then. */
struct cn_insert_range {
	uint32_t mn, len;
	uint64_t addr;                  /* the memory node's address (region base + offset) */
};
void cn_insert_track(struct cn_insert *e, bool on);
/* Add st's counters to compute node cn's (its Prometheus metrics). */
void cn_insert_count(struct cn *cn, const struct cn_insert_stats *st);
struct cn_insert_range *cn_insert_take_ranges(struct cn_insert *e, size_t *n, bool *lost);

#endif
