/* member.h: a node's membership in the cluster state (etcd). A node registers the key
 *     /dmann/<cluster>/members/<role>/<id>   (role "mn" or "cn", id its node number)
 * with a JSON value {"role", "id", "address", "pid", "since"} attached to a lease of
 * member_lease_s seconds that a thread of the node keeps alive: the lease is its heartbeat.
 * A SIGKILLed node's key vanishes when the lease expires; a node that stops cleanly revokes
 * it (the key goes at once). When etcd cannot be reached the node keeps serving (nothing
 * it does waits on etcd), keeps trying, and registers again with a new lease once etcd is
 * back (a lease that expired meanwhile is replaced).
 *
 * Thread-safety: dm_member_start / dm_member_stop from one thread; dm_member_up may be
 * called from any thread. dm_members_list opens its own handle. */
#ifndef DM_MEMBER_H
#define DM_MEMBER_H

#include "dm.h"

struct dm_member;

/* Start registering (a background thread; the first registration is tried before it
 * returns, so that a node that starts with etcd up is visible at once). NULL + errno:
 * EINVAL (bad endpoints, role or ttl), ENOMEM, or the thread's error. etcd being down is
 * not an error (the thread keeps trying and says so in the log). */
struct dm_member *dm_member_start(const char *endpoints, const char *cluster, const char *role,
				  uint32_t id, const char *address, uint32_t ttl_s);
/* The node's registration as its cluster file says ([cluster] etcd, member_lease_s): NULL
 * when it names no etcd, or (logged as a warning) when it cannot start. */
struct dm_cluster_cfg;
struct dm_member *dm_member_join(const struct dm_cluster_cfg *cfg, const char *role,
				 uint32_t id, const char *address);
/* Leave: stop the thread and revoke the lease (the key goes at once). NULL: no-op. */
void dm_member_stop(struct dm_member *m);
/* Whether the node is registered now (its last keepalive succeeded). */
bool dm_member_up(const struct dm_member *m);

struct dm_member_info {
	char role[4];                /* "mn" or "cn" */
	uint32_t id;
	char address[128];
	int64_t pid;
	int64_t since;               /* unix seconds of the registration */
	int64_t lease;
};

/* The registered members of cluster (every key under /dmann/<cluster>/members/), in key
 * order: *out (free()) and *n. Values that are not a member's JSON are skipped. 0 or
 * -errno (the etcd client's; err gets its message). */
int dm_members_list(const char *endpoints, const char *cluster, int timeout_ms,
		    struct dm_member_info **out, size_t *n, char *err, size_t errlen);

#endif /* DM_MEMBER_H */
