/* route_limits.h: the per-batch limits of the balanced and adaptive routing strategies.
 * Pure arithmetic, shared by the compute nodes' router (cn/router/router.c), libdmann's
 * client-side router (cn/client/dmann_route.c) and its unit test. */
#ifndef DM_CN_ROUTE_LIMITS_H
#define DM_CN_ROUTE_LIMITS_H

#include <stdint.h>

/* A CN counts as overloaded when its queue is longer than ROUTE_BAND x the mean queue +
 * ROUTE_BAND_ADD; adaptive limits leave ROUTE_SLACK of room over the expected demand. */
#define ROUTE_BAND 1.5
#define ROUTE_BAND_ADD 4.0
#define ROUTE_SLACK 1.1
/* A CN takes a query a client routed to it (client-side routing) unless its queue is longer
 * than ROUTE_ADMIT_BAND x the mean queue + ROUTE_ADMIT_ADD: the client already followed the
 * queues the CNs report; this is the safety valve for load it cannot see (other clients). */
#define ROUTE_ADMIT_BAND 2.0
#define ROUTE_ADMIT_ADD 16.0

/* Fold one batch into the smoothed demand: demand[c] (share of queries whose top-ranked CN
 * is c) moves halfway to want[c] / total. No change when total is 0. */
void route_demand_update(uint32_t k, double *demand, const uint32_t *want, uint32_t total);

/* Limits of the next batch of `batch` queries for k CNs.
 * balanced (adaptive false): ceil(batch / k) each.
 * adaptive: w_c = max(demand_c, 0.02 / k) x min(1, hi / q_c) with
 * hi = ROUTE_BAND x mean(q) + ROUTE_BAND_ADD, limit_c = ceil(ROUTE_SLACK x batch x w_c / sum w):
 * while no CN is overloaded every query can go to its top-ranked CN (the caches stay
 * partitioned); an overloaded CN's share shrinks in proportion to its excess and its
 * overflow goes to the next CN in rank (or ring) order. */
void route_limits(uint32_t k, uint32_t batch, int adaptive, const double *demand,
		  const uint32_t *qlen, uint32_t *limit);

/* The same over the CNs that own their partition (owner[c] == c: the live ones, see
 * dm_oracle_owners): limits and means over them alone; a CN whose partition another one
 * serves gets limit 0. */
void route_limits_owned(uint32_t k, uint32_t batch, int adaptive, const double *demand,
			const uint32_t *qlen, const uint32_t *owner, uint32_t *limit);

/* Candidate CNs of a query: the owners of parts[0 .. n) (partitions in rank or ring order)
 * in that order, each CN once. Returns their number (<= n). */
uint32_t route_owner_order(const uint32_t *owner, const uint32_t *parts, uint32_t n,
			   uint32_t *out);

#endif
