/* rollout.h: the two-phase rollout of a new oracle epoch over the compute nodes (issue 15,
 * docs/router.md "Re-clustering and epoch refresh"). Pure decisions over the reports the
 * compute nodes exchange through the memory nodes (FWD_STATE), shared by the router
 * (cn/router/router.c) and its unit test.
 *
 * Phase 1, prepare: a compute node that learns of a higher epoch (asked for with `dmann
 * route refresh`, started by the CSP re-clustering, or reported by another one) builds that
 * epoch's oracle in the background and keeps routing with the current one; its reports say
 * which epoch it rolls out (next) and whether it is built (prepared).
 * Phase 2, activate: once every other live compute node runs that epoch or has it prepared,
 * it switches. All read the same reports, so they switch within one report period of each
 * other; a compute node still admits the queries a client routed with its previous routing
 * epoch, so the clients that have not switched yet are served where they sent the query. */
#ifndef DM_ORACLE_ROLLOUT_H
#define DM_ORACLE_ROLLOUT_H

#include <stdbool.h>
#include <stdint.h>

/* A compute node's last report as the memory nodes hold it. */
struct dm_rollout_cn {
	bool valid;                  /* a report exists */
	bool ready;                  /* it has an oracle (routes with `epoch`) */
	bool prepared;               /* it holds the oracle of `next`, built */
	bool reseed;                 /* it asked for `next` to be fitted from a new seed */
	uint32_t epoch;              /* the oracle epoch it routes with */
	uint32_t next;               /* the epoch it rolls out (= epoch when none) */
	uint32_t age_ms;             /* since the memory node got the report */
};

/* The oracle epoch the cluster moves to: the highest of `local` (asked for here, or this
 * compute node's own epoch) and every valid report's epoch and next. */
uint32_t dm_rollout_target(const struct dm_rollout_cn *cn, uint32_t n, uint32_t local);

/* The epoch a compute node without an oracle builds first: the highest epoch a valid report
 * of a compute node with an oracle runs (0 when none does). It then follows any rollout
 * beyond it like the others. */
uint32_t dm_rollout_current(const struct dm_rollout_cn *cn, uint32_t n);

/* Whether compute node `self`, which holds the oracle of `target` built, switches to it:
 * every other compute node c < n that is up (up[c]; NULL: all), has a report at most
 * fresh_ms old and an oracle, runs `target` or a later epoch or has `target` prepared. A
 * down or silent compute node, or one without an oracle, is not waited for: it adopts the
 * cluster's epoch when it builds its oracle. false when self >= n. */
bool dm_rollout_may_activate(const struct dm_rollout_cn *cn, const bool *up, uint32_t n,
			     uint32_t self, uint32_t target, uint32_t fresh_ms);

/* Mass drift (issue 15: "recomputed when drift (mass imbalance, ...) passes a threshold"):
 * count[p] = how many vectors of the index's upper-level sample the current oracle puts in
 * partition p < k. Returns the largest partition's count over its fair share, max_p
 * count[p] * k / sum: 1 is perfect balance, k is everything in one partition; 0 when the
 * sum is 0 or k is 0. A partitioning fitted on that sample starts near 1 (k-means: at most
 * 1 + balance_eps; key ranges: the mass-proportional cut); inserts that land in a few
 * regions raise it. */
double dm_rollout_mass_ratio(const uint64_t *count, uint32_t k);

#endif
