/* etcd.h: a small client of etcd's v3 API through its JSON/HTTP gateway (libcurl + jansson):
 * keys and values, guarded writes (a compare-and-put txn), leases, and prefix watches by
 * polling. The first brick of the cluster state in etcd.
 *
 * Conventions:
 *   - int calls return 0 (dm_etcd_watch_poll: a count) or -errno; constructors NULL + errno;
 *   - unreachable etcd: -ECONNREFUSED (no endpoint accepts a connection, or none resolves)
 *     or -ETIMEDOUT (the call's time bound passed); etcd's own errors: -ENOENT (not found),
 *     -EINVAL (invalid argument), -ESTALE (revision compacted), -EAGAIN (etcd overloaded or
 *     without a leader: try again later), -EIO (anything else); -EBADMSG for an answer
 *     that is not what the API says (everything that comes from etcd is validated: JSON
 *     types, base64, int64 fields, sizes);
 *   - after a failed call, dm_etcd_errmsg(e) gives a one-line reason (etcd's message, the
 *     curl error, or what was wrong with the answer);
 *   - keys are NUL-terminated strings (1 .. DM_ETCD_KEY_MAX bytes), values are bytes (zero
 *     bytes allowed, at most DM_ETCD_VAL_MAX); bad arguments give -EINVAL.
 *
 * Thread-safety: a handle is used by one thread at a time (calls on different handles may
 * run in parallel; libcurl's global initialisation is done once, under pthread_once).
 *
 * Endpoints: a call goes to the endpoint that answered last; when a connection to it cannot
 * be made (refused, unresolvable, connect timeout: the request was not sent), the next
 * endpoint of the list is tried, each once per call. A call whose request was sent is never
 * retried (it may have been applied), so a put_if is never applied twice.
 */
#ifndef DM_ETCD_H
#define DM_ETCD_H

#include "dm.h"

#define DM_ETCD_KEY_MAX 4096
#define DM_ETCD_VAL_MAX (1u << 20)

struct dm_etcd;

/* A key-value as etcd stores it. key and val are malloc'd and NUL-terminated (the NUL is
 * not counted in key_len / len; binary keys and values keep their zero bytes). */
struct dm_etcd_kv {
	char *key;
	size_t key_len;
	void *val;
	size_t len;
	int64_t create_revision, mod_revision, version, lease;
};

enum dm_etcd_ev_type { DM_ETCD_PUT = 0, DM_ETCD_DELETE = 1 };

/* A watch event: its revision is kv.mod_revision (a DELETE carries the key and the deleting
 * revision only: no value). */
struct dm_etcd_event {
	enum dm_etcd_ev_type type;
	struct dm_etcd_kv kv;
};

/* Constructor: endpoints is "http://host:port[,http://host:port...]" (http:// or https://,
 * at most 16), timeout_ms (> 0) bounds every call but the watch (which has its own bound).
 * Does not contact etcd. NULL + errno: EINVAL (bad list), ENOMEM, EIO (libcurl init). */
struct dm_etcd *dm_etcd_open(const char *endpoints, int timeout_ms);
/* Close the handle (NULL is a no-op). */
void dm_etcd_close(struct dm_etcd *e);
/* End the call in progress on e, if any, at once (its connections are shut down), and make
 * every later call on e fail with -ECANCELED: for a thread that stops a watcher blocked in a
 * watch poll. The only call that may run at the same time as another call on the same
 * handle; the handle must still be closed (after the watcher's thread is joined). */
void dm_etcd_abort(struct dm_etcd *e);
/* The reason of the last failed call on e (a static string for NULL e); valid until the
 * next call on e. */
const char *dm_etcd_errmsg(const struct dm_etcd *e);

/* Put key = val (len bytes, val may be NULL when len is 0), attached to lease (0: none).
 * *revision (may be NULL) gets the revision of the put. -ENOENT: the lease does not exist. */
int dm_etcd_put(struct dm_etcd *e, const char *key, const void *val, size_t len,
		int64_t lease, int64_t *revision);
/* Read key: *val (malloc'd, NUL-terminated, free() it), *len, *mod_revision (may be NULL).
 * -ENOENT when the key does not exist (*val untouched). */
int dm_etcd_get(struct dm_etcd *e, const char *key, void **val, size_t *len,
		int64_t *mod_revision);
/* dm_etcd_get served by the member it asks from its own store (a serializable read: no
 * Raft round, possibly behind the leader by what has not reached that member yet): for
 * polls whose next step is checked anyway, e.g. a controller candidate looking whether the
 * leader key is still there before its put-if-absent. */
int dm_etcd_get_serial(struct dm_etcd *e, const char *key, void **val, size_t *len,
		       int64_t *mod_revision);
/* All keys under prefix ("" = the whole key space), in key order: *kvs (free with
 * dm_etcd_kvs_free; NULL when *n is 0), *n, and *revision (may be NULL), the store
 * revision the read was served at (the point to watch from: *revision + 1). */
int dm_etcd_range(struct dm_etcd *e, const char *prefix, struct dm_etcd_kv **kvs, size_t *n,
		  int64_t *revision);
void dm_etcd_kvs_free(struct dm_etcd_kv *kvs, size_t n);
/* Delete key, or every key under the (non-empty) prefix when prefix is set. *deleted (may be
 * NULL) gets the number of keys deleted (0 is not an error). */
int dm_etcd_delete(struct dm_etcd *e, const char *key_or_prefix, bool prefix, int64_t *deleted);
/* Guarded delete (one txn): delete key only if its mod_revision is expect_mod_revision
 * (> 0). *succeeded tells whether it was deleted; a failed compare (the key changed or is
 * gone) is not an error. */
int dm_etcd_delete_if(struct dm_etcd *e, const char *key, int64_t expect_mod_revision,
		      bool *succeeded);
/* Guarded put (one txn): put key = val (with lease, 0: none) only if the key's mod_revision
 * is expect_mod_revision, or, when expect_mod_revision is 0, only if the key does not exist.
 * *succeeded tells which; on success *revision (may be NULL) gets the put's revision (the
 * key's new mod_revision: what the next guarded write expects). A failed compare is not an
 * error (0 with *succeeded false). */
int dm_etcd_put_if(struct dm_etcd *e, const char *key, const void *val, size_t len,
		   int64_t lease, int64_t expect_mod_revision, bool *succeeded, int64_t *revision);

/* A write guarded by a leader key (one txn): put key = val (no lease) only if the key's
 * mod_revision is expect_mod_revision (0: the key does not exist) AND the key guard still
 * exists with create_revision guard_create_revision (> 0): the leader that created it has
 * not lost it (its lease did not expire, nobody else took it since). *succeeded / *revision
 * as for dm_etcd_put_if. */
int dm_etcd_put_guarded(struct dm_etcd *e, const char *key, const void *val, size_t len,
			int64_t expect_mod_revision, const char *guard,
			int64_t guard_create_revision, bool *succeeded, int64_t *revision);

/* Grant a lease of ttl_s seconds (1 .. 10^9): *lease gets its id (> 0). */
int dm_etcd_lease_grant(struct dm_etcd *e, int ttl_s, int64_t *lease);
/* Refresh a lease once: *ttl_left (may be NULL) gets its new TTL in seconds. -ENOENT when
 * the lease expired or never existed. */
int dm_etcd_lease_keepalive(struct dm_etcd *e, int64_t lease, int *ttl_left);
/* Revoke a lease: its keys are deleted. -ENOENT when it does not exist (any more). */
int dm_etcd_lease_revoke(struct dm_etcd *e, int64_t lease);

/* Watch the keys under prefix ("" = all) from revision *from_revision (>= 1; 0 = from now):
 * wait up to timeout_ms (> 0) for a batch of events, call cb for each event with revision
 * >= *from_revision, in revision order, then set *from_revision to the last event's
 * revision + 1 (with 0 and no event: to the store revision + 1, so that the next poll
 * misses nothing). cb runs on the caller's thread after the HTTP exchange and must not call
 * into e; the event's memory is valid during the call only. Returns the number of events
 * delivered (0 when none came in time), -ESTALE when *from_revision was compacted (resync
 * with dm_etcd_range, then watch from its revision + 1), or another -errno. */
int dm_etcd_watch_poll(struct dm_etcd *e, const char *prefix, int64_t *from_revision,
		       int timeout_ms, void (*cb)(void *arg, const struct dm_etcd_event *ev),
		       void *arg);

/* Follow the keys under prefix, one step at a time (a watch thread's loop): with *from 0,
 * read them all (reset(arg) first when not NULL, then cb with a PUT event for each key) and
 * set *from to the revision after the read; otherwise dm_etcd_watch_poll from *from (a
 * compacted revision sets *from to 0: the next step reads everything again). 0, or the
 * -errno of an unreachable etcd (the caller backs off and calls again). */
int dm_etcd_follow(struct dm_etcd *e, const char *prefix, int64_t *from, int timeout_ms,
		   void (*reset)(void *arg), void (*cb)(void *arg, const struct dm_etcd_event *ev),
		   void *arg);

#endif /* DM_ETCD_H */
