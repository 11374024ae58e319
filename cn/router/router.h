/* router.h: the compute node's router (SHINE's logical partitioning of the cache).
 *
 * Every CN builds the same oracle at start (balanced k-means over the vectors of the first
 * HNSW level from the top holding >= 1000 nodes, read from the memory nodes; k = number of
 * CNs; fixed seed) and routes each query that arrives from a client:
 *   none           run it here
 *   bestfit        always the top-ranked CN
 *   balanced       per batch of B queries every CN takes at most ceil(B/k); a full CN's
 *                  queries go to the next CN in rank order
 *   adaptive       as balanced, but the limits are recomputed after every batch from the
 *                  queue lengths the CNs last reported (short queues get more)
 *   adaptive-ring  as adaptive, overflow goes to the top-ranked CN's ring neighbours first
 * Routing pauses (queries wait in the intake) while the local queue is over a threshold.
 *
 * Decisions are taken in the workers' intake under the router's lock: the batch, histogram
 * and limits are one shared state per CN, exactly what a separate routing thread would own,
 * without handing every query to another thread and back. The router thread does the rest:
 * builds the oracle, keeps one SERVE connection per memory node (served by a worker thread
 * in forwarding mode), exchanges queue lengths and cache samples with the other CNs through
 * the memory nodes after every batch and periodically, tracks the cache split penalty, and
 * rolls out the next oracle epoch (next seed) when the CSP stays above a threshold or
 * `dmann route refresh` asks for it: every CN prepares the new oracle in the background and
 * all switch once all have it (oracle/rollout.h); a CN admits client-routed queries of its
 * previous routing epoch too. */
#ifndef DM_CN_ROUTER_H
#define DM_CN_ROUTER_H

#include "wire.h"

struct cn;
struct router;

struct router_params {
	uint32_t strategy;          /* enum dm_route_strategy */
	uint32_t batch;             /* queries per routing batch */
	uint32_t pause;             /* local queue length that pauses routing */
	uint32_t exchange_ms;       /* state report period when no batch ends */
	uint32_t sample_min_nodes;  /* oracle sample: first level with >= this many nodes */
	uint32_t fit_duty;          /* percent of a CPU an oracle fit may take (0 or 100: all) */
	double recluster_csp;       /* re-cluster when CSP stays above this ... */
	uint32_t recluster_secs;    /* ... for this long (0: never) */
	double recluster_mass;      /* or the largest partition's sample share over its fair
				     * share grown by this since the epoch's first measure, as
				     * long (0: never) */
	bool spill_cache;           /* spilled queries (run off their top-ranked CN) fill the cache */
	/* Partitions: balanced k-means groups (false), or key ranges (true): contiguous runs of
	 * a VHash ring fitted on the same sample (dm_oracle_from_vhash), with `regions` regions
	 * (0: min(256, sample / 64): at least 64 sample points per region; at least one region
	 * per CN, at most 256 per CN). */
	bool keyrange;
	uint32_t regions;
	uint32_t csp_slice;         /* CSP sample: 1/csp_slice of the id hash space (1..64, a
				     * power of two; 0: 64) */
};

struct router *router_start(struct cn *cn, const struct router_params *p);
/* Stop and join the router thread (idempotent). Workers may still use the router. */
void router_stop(struct router *r);
/* Free it once no worker is left. */
void router_free(struct router *r);

/* Where a query with vector vec goes: a CN id (the local one means "run it here"); *top
 * gets the CN the oracle ranks first. Call only when router_active(). */
uint32_t router_route(struct router *r, const float *vec, uint32_t dim, uint32_t *top);
/* Whether queries run off their top-ranked CN ("spilled" by the limits) fill the cache of
 * the CN that runs them ([router] spill_cache). Off by default: their records belong to
 * another CN's partition, and caching them is the duplication the cache split penalty
 * counts. */
bool router_spill_cache(struct router *r);
/* Routing is on (strategy other than none, an oracle exists, more than one CN). */
bool router_active(struct router *r);
/* The local queue is over the pause threshold (counts each time routing pauses). */
bool router_paused(struct router *r);

/* A query a client routed here with the oracle of `epoch` (client-side routing, DM_Q_F_ROUTED;
 * client_spilled: the client sent it off its top-ranked CN). The CN stays authoritative:
 * with its routing epoch or the previous one (a client that has not seen a switch yet) it
 * runs the query here (*spilled = client_spilled) unless its queue is over the admission
 * band of the known queues (route_limits.h; never with bestfit), then it sends it to the
 * first CN in rank order that is not; with another epoch it routes it as router_route
 * does. Returns the target. */
uint32_t router_admit(struct router *r, const float *vec, uint32_t dim, uint32_t epoch,
		      bool client_spilled, uint32_t *top, bool *spilled);
/* The strategy, and the routing epoch when routing is active (what answers piggyback for
 * client-side routers). r may be NULL (strategy none, false). */
bool router_epoch(struct router *r, uint32_t *epoch, uint32_t *strategy);
/* Partitions: the routing epoch, how many partitions a neighbour serves for a CN the cluster
 * state declares down, how often the owners changed, and the owner table (k entries, may
 * be NULL). r may be NULL (all 0). */
void router_partitions(struct router *r, uint32_t *route_epoch, uint32_t *moved,
		       uint64_t *changes, uint32_t *owner);
/* Rollout oracles (not the first one a CN builds) fitted here, those of them that started
 * from the current epoch's centroids (warm: a fit through etcd), and oracles taken from
 * etcd (fitted by another CN in a rollout: router_etcd.h; a CN that starts after a rollout
 * takes its epoch's too). r may be NULL (0, 0, 0). */
void router_oracle_sources(struct router *r, uint64_t *fitted, uint64_t *warm,
			   uint64_t *taken);
/* Reports whose cache sample for the CSP estimate was cut at DM_FWD_MAX_SAMPLE ids (the
 * slice of [router] csp_slice held more): the estimate misses duplicates then. 0 for NULL. */
uint64_t router_csp_truncated(struct router *r);
/* The mass drift: the largest partition's share of the index's upper-level sample over its
 * fair share (dm_rollout_mass_ratio) at the last full pass, the same at the first pass of
 * that oracle epoch (base), the epoch, and how many passes were made. false while no pass
 * has completed (or r is NULL). */
bool router_mass(struct router *r, double *ratio, double *base, uint32_t *epoch,
		 uint64_t *passes);
/* Q_ROUTER: the fixed part into *h, the owner table (ncn u32) and the oracle's wire form
 * into buf (cap bytes). Bytes written, -EAGAIN (no oracle yet), -E2BIG (cap too small), -ENOMEM. */
int router_export(struct router *r, struct dm_wire_q_router *h, uint8_t *buf, size_t cap);

enum router_counter { RC_LOCAL, RC_FORWARDED, RC_RECEIVED, RC_BOUNCED, RC_ADMITTED, RC_COUNT };
void router_count(struct router *r, enum router_counter c);

/* FWD_ROUTER: apply a configuration (if set) and fill the statistics. 0 or -errno. */
int router_config(struct router *r, const struct dm_wire_fwd_rcfg *c,
		  struct dm_wire_fwd_rstats *st);

#endif
