/* stale.h: stale replicas of S3 buckets in the cluster state (etcd).
 *
 * A bucket lives on R memory nodes (its replicas). A compute node that acknowledges a write
 * without one of them (it could not be reached) first marks that replica stale:
 *     /dmann/<cluster>/stale/<bucket>/<mn>
 *         {"bucket":"b","mn":2,"since":T,"by":"cn1","seq":N}   (seq random)
 * The put is part of the write: when it fails (etcd unreachable), the write is not
 * acknowledged. Every write puts a new value (seq), so the key's mod_revision moves with
 * every write that missed the replica. Readers skip a replica while its key exists. The
 * controller brings a stale replica up to date (a catch-up: an image of the bucket from a
 * caught-up replica, installed with the writes it received meanwhile) and then deletes the
 * key guarded by the mod_revision it started from: a write that missed the replica again
 * during the catch-up keeps the key (the delete fails) and the next catch-up runs.
 *
 * The watch (dm_stalewatch) keeps a copy of every key of the cluster in memory: a thread
 * reads the prefix, then watches it (resuming at the last revision + 1, re-reading after a
 * compaction). While etcd is unreachable the copy stays as it was last seen.
 *
 * Every value read from etcd is validated (dm_stale_parse, fuzzed in fuzz_etcd_json).
 *
 * Thread-safety: dm_stalewatch_has/count/list from any thread; start/stop from one.
 * dm_stale_put/list/clear use the handle given (one thread at a time per handle). */
#ifndef DM_STALE_H
#define DM_STALE_H

#include "dm.h"

#define DM_STALE_NAME_MAX 67     /* FLAT_NAME_MAX: a bucket or a shard of one ("B#s") */

struct dm_etcd;
struct dm_cluster_cfg;

struct dm_stale {
	char bucket[DM_STALE_NAME_MAX + 1];
	uint32_t mn;
	int64_t since;               /* unix seconds of the put (the last write it missed) */
	int64_t mod_revision;        /* of the key (what dm_stale_clear compares) */
	char by[16];                 /* the node that marked it last */
};

/* Mark replica mn of bucket stale (as node `by`, e.g. "cn1"): a put of a new value (a new
 * seq, since = now). 0 or the etcd client's -errno (-EINVAL for a bad name). */
int dm_stale_put(struct dm_etcd *e, const char *cluster, const char *bucket, uint32_t mn,
		 const char *by);
/* Every stale mark of cluster: *out (free()), *n. 0 or -errno. Keys that do not parse are
 * skipped (with a warning). */
int dm_stale_list(struct dm_etcd *e, const char *cluster, struct dm_stale **out, size_t *n);
/* Delete the mark st (read by dm_stale_list or the watch) if it has not changed since:
 * *cleared tells. 0 or -errno. */
int dm_stale_clear(struct dm_etcd *e, const char *cluster, const struct dm_stale *st,
		   bool *cleared);
/* Parse one key/value of the prefix (key without the cluster prefix: "<bucket>/<mn>"):
 * 0 or -EBADMSG. */
int dm_stale_parse(const char *key_rest, const void *val, size_t len, struct dm_stale *st);

struct dm_stalewatch;
/* Watch cfg's stale marks. NULL when cfg names no etcd (errno 0) or on failure (errno). */
struct dm_stalewatch *dm_stalewatch_start(const struct dm_cluster_cfg *cfg);
void dm_stalewatch_stop(struct dm_stalewatch *w);
/* Whether replica mn of bucket is marked stale in the copy (false for NULL w). */
bool dm_stalewatch_has(struct dm_stalewatch *w, const char *bucket, uint32_t mn);
/* Note a mark this node just put (so that its own readers skip the replica at once). */
void dm_stalewatch_note(struct dm_stalewatch *w, const char *bucket, uint32_t mn);
/* The marks in the copy: their number; up to max of them into out (may be NULL). */
size_t dm_stalewatch_list(struct dm_stalewatch *w, struct dm_stale *out, size_t max);
/* Whether the copy has been read from etcd at least once. */
bool dm_stalewatch_synced(struct dm_stalewatch *w);


#endif /* DM_STALE_H */
