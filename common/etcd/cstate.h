/* cstate.h: the shared cluster state in etcd beyond membership (member.h): the up-set, which
 * says which nodes the cluster treats as up, kept by a controller elected through etcd and
 * watched by the nodes.
 *
 * Keys, under /dmann/<cluster>/:
 *   controller  the leader key: {"role","id","since"}, attached to the leader's own lease
 *               (member_lease_s, kept alive by its thread); it vanishes with the leader.
 *   upset       {"version":V,"controller":"cn0","mn":[ids up],"cn":[ids up],"time":T}:
 *               every node of the cluster file not listed is down. V grows by one with
 *               every change. No key yet: no controller ran, every node counts as up.
 *
 * The controller (dm_ctl): every compute node is a candidate; the one whose put-if-absent of
 * the leader key succeeds is in office until its lease is gone. Each period (300 ms) it
 * reads the members; a registered node is up; a node that is not registered (its lease
 * expired: a crash, a partition; or it left) is declared down, but only once the controller
 * has been in office, and has seen etcd answer without a failure, for takeover_grace_s:
 * after an etcd outage (or a new election) every lease may have expired at once, and the
 * nodes need a moment to register again. The new up-set is written as one txn guarded by
 * the leader key's create revision, so a deposed controller's write is refused.
 *
 * The watch (dm_upwatch): a thread reads the up-set, then watches its key (resuming at the
 * last revision + 1, re-reading after a compaction), and calls back with every newer
 * version. While etcd is unreachable the node keeps the last up-set it saw.
 *
 * Thread-safety: start/stop from one thread; dm_ctl_leader and dm_upwatch_version from any.
 * Callbacks run on the watch thread, one at a time, in version order. */
#ifndef DM_CSTATE_H
#define DM_CSTATE_H

#include "dm.h"

#define DM_UPSET_WORDS 4          /* bit sets over node ids 0 .. 255 (DM_MAX_NODES) */

struct dm_upset {
	int64_t version;          /* >= 1 */
	int64_t time;             /* unix seconds of the change */
	int64_t mod_revision;     /* of the key (0: not read from etcd) */
	char controller[16];      /* "cn0" */
	uint64_t mn[DM_UPSET_WORDS], cn[DM_UPSET_WORDS];   /* ids up */
};

static inline bool dm_upset_has(const uint64_t *set, uint32_t id)
{
	return id < 64 * DM_UPSET_WORDS && (set[id / 64] >> (id % 64) & 1);
}
static inline void dm_upset_set(uint64_t *set, uint32_t id, bool up)
{
	if (id >= 64 * DM_UPSET_WORDS)
		return;
	if (up)
		set[id / 64] |= 1ull << (id % 64);
	else
		set[id / 64] &= ~(1ull << (id % 64));
}

/* Parse an up-set value (validated: types, version >= 1, ids 0..255 without repeats, the
 * controller name). 0, -EBADMSG. */
int dm_upset_parse(const void *txt, size_t len, struct dm_upset *u);
/* Its JSON (malloc'd, NUL-terminated), NULL on ENOMEM. */
char *dm_upset_format(const struct dm_upset *u);

/* The placement: which memory nodes hold no data any more (retired: down for longer than
 * replace_after_s, their blocks copied to the next nodes in placement order). Block
 * replicas are the top R nodes in rendezvous order among the cluster file's memory nodes
 * that are not retired. Key /dmann/<cluster>/placement:
 *   {"version":V,"time":T,"by":"cn0","retired":[ids]}   (no key: nobody retired). */
struct dm_placement {
	int64_t version;          /* 0: no key yet */
	int64_t time;
	int64_t mod_revision;
	char by[16];
	uint64_t retired[DM_UPSET_WORDS];
};
int dm_placement_parse(const void *txt, size_t len, struct dm_placement *p);
char *dm_placement_format(const struct dm_placement *p);
/* Read it once: 0, -ENOENT (no placement yet: *p zeroed), -errno (err says why). */
int dm_placement_read(const char *endpoints, const char *cluster, int timeout_ms,
		      struct dm_placement *p, char *err, size_t errlen);

struct dm_cluster_cfg;
struct dm_ctl;
/* Write placement p (p->version the new one, p->mod_revision the key's revision it
 * replaces, 0 when there is none) as controller c, guarded by its leader key: *ok false
 * when refused (someone else wrote it, or c lost its office). -EPERM when c is not in
 * office. Any thread. */
int dm_placement_write(const struct dm_ctl *c, const struct dm_placement *p, bool *ok,
		       char *err, size_t errlen);
/* Stand as a candidate (a thread; a node of role/id of cfg). NULL when cfg names no etcd
 * (errno 0) or on failure (errno; logged). */
struct dm_ctl *dm_ctl_start(const struct dm_cluster_cfg *cfg, const char *role, uint32_t id);
/* Stop; a controller in office resigns (revokes its lease: another takes over at once). */
void dm_ctl_stop(struct dm_ctl *c);
/* Whether this candidate is in office now. */
bool dm_ctl_leader(const struct dm_ctl *c);

struct dm_upwatch;
typedef void (*dm_upset_cb)(void *arg, const struct dm_upset *u);
/* Watch the up-set of cfg's cluster: cb for every newer version (the first one read
 * included). NULL when cfg names no etcd (errno 0) or on failure (errno). */
struct dm_upwatch *dm_upwatch_start(const struct dm_cluster_cfg *cfg, dm_upset_cb cb, void *arg);
void dm_upwatch_stop(struct dm_upwatch *w);
/* Watch the placement the same way (cb for every newer version). */
typedef void (*dm_placement_cb)(void *arg, const struct dm_placement *p);
struct dm_upwatch *dm_placewatch_start(const struct dm_cluster_cfg *cfg, dm_placement_cb cb,
				       void *arg);
/* The version last delivered (0: none yet). */
int64_t dm_upwatch_version(const struct dm_upwatch *w);

/* Read the up-set and the controller's name once (dmann status): 0, -ENOENT (no up-set
 * yet; *ctl may still be set, "" when there is no controller), -errno (err says why). */
int dm_upset_read(const char *endpoints, const char *cluster, int timeout_ms,
		  struct dm_upset *u, char *ctl, size_t ctlcap, char *err, size_t errlen);

#endif /* DM_CSTATE_H */
