/* idrange.h: ranges of node ids for the online inserts of an HNSW graph, handed out from
 * the cluster state (etcd).
 *
 * Every online insert takes a fresh node id. Without a cluster state the ids come from one
 * FAA on a counter object on one memory node; with it, a compute node takes ranges of ids
 * from one key per load of a graph generation:
 *     /dmann/<cluster>/ids/<graph>/<gen>/<tag>  =  "<next>"   (decimal: the first id of no
 *     range; tag, 16 hex digits, tells loads apart: a graph dropped and loaded again may
 *     get the same generation number)
 * moved by guarded puts (compare the key's mod_revision, or its absence), so two ranges
 * never overlap, whichever memory or compute nodes are down: only etcd has to be up. A
 * range a compute node did not use up (it died, the generation changed) is never handed
 * out again: that room of the graph is lost, at most a range per compute node and event.
 *
 * The value is validated when read (dm_idrange_parse, fuzzed in fuzz_etcd_json).
 *
 * Thread-safety: the calls use the etcd handle given (one thread at a time per handle). */
#ifndef DM_IDRANGE_H
#define DM_IDRANGE_H

#include "dm.h"

struct dm_etcd;

/* The first id of a graph generation whose key does not exist yet: *base (0 or -errno;
 * the take fails with that error). */
typedef int (*dm_idrange_seed_fn)(void *ctx, uint64_t *base);

/* Take a range of up to want ids (>= 1) of graph generation (graph, gen) of load tag,
 * at or above first (the rows the load imported: never handed out, whatever the key says)
 * and below cap: [*lo, *hi), hi > lo, and at most 1/share (>= 1) of the room left (but at
 * least one id), so that near the capacity the ranges shrink and little room is left in
 * the unused ranges of other takers. The key is created from seed's base when it does not
 * exist.
 * 0, -ENOSPC (every id below cap is handed out), -EAGAIN (other takers won 32 times in a
 * row), -EBADMSG (the key's value is not a number), the seed's error, or etcd's -errno
 * (a put whose answer was lost may have taken a range that nobody uses: room lost, never
 * an id twice). */
int dm_idrange_take(struct dm_etcd *e, const char *cluster, uint32_t graph, uint64_t gen,
		    uint64_t tag, uint64_t first, uint64_t want, uint64_t share, uint64_t cap,
		    dm_idrange_seed_fn seed, void *ctx, uint64_t *lo, uint64_t *hi);
/* The first id no range has yet: *next. -ENOENT when no range was ever taken. */
int dm_idrange_read(struct dm_etcd *e, const char *cluster, uint32_t graph, uint64_t gen,
		    uint64_t tag, uint64_t *next);
/* Delete every range key of graph (all its generations and loads): once the graph is
 * dropped, nothing reads them again (a new load has another tag). *deleted (may be NULL):
 * how many. 0 or etcd's -errno. */
int dm_idrange_forget(struct dm_etcd *e, const char *cluster, uint32_t graph,
		      int64_t *deleted);
/* Parse a value ("<next>": 1-20 decimal digits, no sign, no spaces, <= 2^63): 0 or
 * -EBADMSG. */
int dm_idrange_parse(const void *val, size_t len, uint64_t *next);

#endif
