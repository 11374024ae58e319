/* router_etcd.h: the oracle of a rollout epoch handed over through etcd (issue 15 point 5,
 * docs/router.md "Re-clustering and epoch refresh"): one compute node fits it, the others
 * take its result instead of fitting the same model at the same time.
 *
 * Keys (under /dmann/<cluster>/oracle/, docs/operations.md; <tag>: 16 hex digits, a hash
 * of what the oracle is fitted on and with: the index's meta_crc, k, dim, metric, partition
 * kind, regions, sample level; keys left by an earlier run of the cluster, whose epochs
 * started again at 0, or of another index never match):
 *   fit/<E>/<tag>    the claim of epoch E's fit: "<cn id>", created if absent and attached
 *                    to the claimer's member lease (members/cn/<id>): it goes when the
 *                    claimer dies; once the oracle is published it is put again without a
 *                    lease (the list of published epochs, pruned from it)
 *   model/<E>/<tag>  the oracle of epoch E: a header (router_etcd_meta, ROE_HDR_LEN bytes,
 *                    little-endian) and the oracle's wire form (oracle_wire.c, what
 *                    Q_ROUTER sends); a header alone (flag ROE_F_LOCAL) when the wire form
 *                    does not fit in one etcd value (DM_ETCD_VAL_MAX): every compute node
 *                    fits it then
 *   epoch            the highest epoch published, decimal
 * Epochs E-2 and older are deleted by the fitter of E.
 *
 * Everything read is validated (router_etcd_parse); on any etcd error the caller fits
 * locally, as without etcd.
 *
 * Thread-safety: a handle is used by one thread at a time (the router's prepare thread). */
#ifndef DM_CN_ROUTER_ETCD_H
#define DM_CN_ROUTER_ETCD_H

#include "config.h"
#include "dm.h"

#define ROE_HDR_LEN 64u
#define ROE_F_LOCAL 1u                /* no wire form: fit it locally */

/* What an oracle was fitted on and by whom (the header of model/<E>). */
struct router_etcd_meta {
	uint32_t epoch, crc;          /* oracle epoch, the index's meta_crc */
	uint32_t ncn, dim, metric;
	uint32_t keyrange;            /* 1: key ranges, 0: k-means */
	uint32_t regions;             /* [router] regions (0: the default) */
	uint32_t lv, n;               /* sample level and size (the fitter's) */
	uint32_t fitter;              /* cn id */
	uint32_t flags;               /* ROE_F_* */
	uint64_t hash;                /* the fitter's oracle hash (router.c oracle_hash) */
};

struct router_etcd;

/* A handle for compute node self of cluster (nothing contacted yet). NULL + errno. */
struct router_etcd *router_etcd_open(const char *endpoints, const char *cluster,
				     uint32_t self);
void router_etcd_close(struct router_etcd *h);
/* The reason of the last failed etcd call (dm_etcd_errmsg). */
const char *router_etcd_errmsg(const struct router_etcd *h);

/* Take epoch want->epoch's oracle from etcd, or claim its fit: polls model/<E> and tries
 * to create fit/<E> until one succeeds, up to wait_ms, or cancel(arg) says to stop. While
 * another CN holds fit/<E> it polls with reads only (a claim is tried again once that key
 * is gone).
 *   1  taken: *wire (malloc'd; free()), *len, *got: a published oracle whose epoch, crc,
 *      ncn, dim, metric, keyrange, regions and lv are want's (its wire form is not
 *      decoded);
 *   0  claimed (or claimed by this compute node before): fit it, then router_etcd_publish
 *      (or router_etcd_abandon);
 *   -ECANCELED (cancel), -ETIME (the bound passed), -ENOTCONN (not registered as a
 *   member), -E2BIG (the fitter published no wire form), -ESTALE (a published oracle of
 *   another index or shape), -EBADMSG (a value that is not one), or etcd's -errno: fit
 *   locally. */
int router_etcd_obtain(struct router_etcd *h, const struct router_etcd_meta *want,
		       uint32_t wait_ms, bool (*cancel)(void *arg), void *arg, uint8_t **wire,
		       size_t *len, struct router_etcd_meta *got);

/* Take epoch want->epoch's oracle if it is published (one read, no claim, no wait): what a
 * compute node that starts during or after a rollout builds first. 1 as router_etcd_obtain,
 * -ENOENT (not published), or its other -errno. */
int router_etcd_take(struct router_etcd *h, const struct router_etcd_meta *want,
		     uint8_t **wire, size_t *len, struct router_etcd_meta *got);

/* Publish the oracle fitted under the claim: model/<E> = m + wire (len bytes; a header
 * with ROE_F_LOCAL alone when wire is NULL or too large), fit/<E> without a lease, epoch,
 * and delete epochs m->epoch - 2 and older. *bytes (may be NULL): the value's size. 0 or
 * etcd's -errno (the pruning's errors are ignored). */
int router_etcd_publish(struct router_etcd *h, const struct router_etcd_meta *m,
			const uint8_t *wire, size_t len, size_t *bytes);

/* The claimed fit failed, or was not published: delete the claim (another compute node
 * may take it). */
void router_etcd_abandon(struct router_etcd *h, const struct router_etcd_meta *m);

/* The value of model/<E>: encode m + wire into out (ROE_HDR_LEN + len bytes). */
void router_etcd_encode(const struct router_etcd_meta *m, const uint8_t *wire, size_t len,
			uint8_t *out);
/* Parse and validate a value: 0 with *m and *wire / *wlen (inside val; NULL / 0 with
 * ROE_F_LOCAL) or -EBADMSG (wrong magic or version, size, flags, an out-of-range field). */
int router_etcd_parse(const void *val, size_t len, struct router_etcd_meta *m,
		      const uint8_t **wire, size_t *wlen);

#endif
