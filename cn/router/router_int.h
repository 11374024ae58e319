/* router_int.h: what the three files of the compute node's router share (not a public
 * header): the router's state (struct router), an oracle being built (struct oracle_build),
 * and the functions one file calls in another.
 *   router.c          routing decisions, the state exchange through the memory nodes, CSP,
 *                     the mass-drift pass, the router thread;
 *   router_oracle.c   an oracle's sample, fit and installation (router_build_oracle: the
 *                     first oracle of a CN);
 *   router_rollout.c  the two-phase rollout of a later epoch (prepare on a background
 *                     thread, through etcd when the cluster has one; activate once every
 *                     live CN has it). */
#ifndef DM_CN_ROUTER_INT_H
#define DM_CN_ROUTER_INT_H

#include "router.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cn.h"
#include "oracle.h"
#include "rollout.h"
#include "route_limits.h"
#include "vhash.h"

#define ROLLOUT_POLL_MS 20u   /* report period while prepared and waiting */

struct router_etcd;

struct router {
	struct cn *cn;
	struct router_params p;
	uint32_t self, ncn;
	pthread_t thread;
	atomic_bool stop;
	bool joined;

	/* Routing state: everything below, under mu. */
	pthread_mutex_t mu;
	pthread_cond_t wake;         /* a batch ended: exchange now */
	bool batch_done;
	struct dm_oracle *o;
	uint32_t *spill;             /* ncn x (ncn-1): ring spill order of each partition */
	/* Partition p (the oracle's group p, CN p's own) is served by owner[p]: p while the
	 * cluster state has it up, else a ring neighbour (dm_oracle_owners). A query's
	 * candidates are the owners of its partitions in rank (or ring) order; limits,
	 * demand and the batch histogram count CNs, over the live ones. */
	uint32_t *owner;
	uint32_t *cand, *ring_seq;   /* scratch: candidate CNs, partitions in ring order */
	uint64_t hash;
	uint32_t crc;                /* the index the oracle was fitted on (meta_crc) */
	uint32_t sample_level;
	uint32_t *hist, *limit, total;
	uint32_t *want;              /* queries of this batch whose top-ranked CN is c */
	double *demand;              /* smoothed share of queries whose top-ranked CN is c */
	uint32_t *qlen;              /* last known queue length of each CN */
	uint32_t *cns;               /* scratch for ranks */
	float *qv;                   /* scratch for a normalised query */
	uint32_t metric;             /* the index's (cosine: queries ranked normalised) */
	uint8_t *owire;              /* the oracle's wire form (Q_ROUTER), owire_len bytes */
	size_t owire_len;
	atomic_uint strategy;
	atomic_bool ready;           /* an oracle exists */
	atomic_bool spill_cache;     /* spilled queries fill the cache */
	atomic_bool paused;          /* routing is paused now */
	atomic_ulong pauses;         /* times routing paused */

	/* Counters and the CSP estimate. */
	atomic_ulong cnt[RC_COUNT];
	atomic_uint csp_ppm, csp_cns, epoch, reclusters;
	atomic_uint repoch;          /* routing epoch (dm_oracle_route_epoch of epoch, owner) */
	atomic_uint moved;           /* partitions served by another CN than their own */
	atomic_ulong owner_changes;  /* times the owner table changed */
	atomic_ulong csp_t_ns;
	/* Oracle epochs: the highest one asked for here (dmann route refresh, re-clustering)
	 * and the highest one the memory nodes reported. */
	atomic_uint want_epoch, seen_epoch;
	/* The epoch the CSP re-clustering asked for here (0: none): fitted from a new seed,
	 * reported with DM_FWD_S_RESEED (a warm fit would give the same partitions back). */
	atomic_uint reseed_epoch;
	/* The two-phase rollout (oracle/rollout.h; router thread, except the atomics): the
	 * oracle of a later epoch being fitted by the prepare thread or fitted (prep_done),
	 * installed once every live CN has it. */
	struct oracle_build *prep;
	pthread_t prep_thread;
	bool prep_running;            /* prep_thread to join */
	atomic_bool prep_done;
	uint64_t prep_retry_ns;       /* a failed prepare: not again before */
	atomic_uint next_epoch;       /* the epoch rolled out (= epoch when none) */
	/* With [cluster] etcd, one CN fits a rollout's oracle and the others take it from
	 * etcd (router_etcd.h): the prepare thread's handle and the router thread's (a first
	 * oracle), each opened on first use (a handle is one thread's at a time). */
	struct router_etcd *etcd, *etcd_first;
	atomic_ulong fits_here;       /* rollout oracles fitted here */
	atomic_ulong fits_warm;       /* of those, started from the current epoch's centroids */
	atomic_ulong fits_taken;      /* rollout oracles taken from etcd */
	atomic_uint rollout;          /* DM_FWD_ROLLOUT_* */
	uint32_t cluster_epoch;       /* the epoch the others route with (the first oracle's) */
	/* The routing epoch before the current one: client-routed queries of it are admitted
	 * too (the clients that have not seen the switch yet). */
	atomic_uint prev_repoch;
	atomic_bool prev_ok;

	/* Router thread's connections (ORIGIN role, state reports) and SERVE workers. */
	struct dm_conn *oc[DM_MAX_NODES];
	struct dm_rpc_chan och[DM_MAX_NODES];
	atomic_bool serve_alive[DM_MAX_NODES];
	uint64_t seq;
	uint64_t csp_high_since;
	/* Mass drift (router thread, mass_step; the atomics are read by router_mass): one pass
	 * over the upper-level sample in chunks, counting the vectors the current oracle puts
	 * in each partition. */
	uint64_t *mass_count;        /* per partition, in this pass */
	float *mass_v;               /* one decoded vector */
	uint32_t mass_dim;
	uint32_t mass_next;          /* node id the pass goes on from (0: none in progress) */
	uint32_t mass_epoch;         /* the oracle epoch the pass counts for ... */
	uint32_t mass_crc;           /* ... and the index (meta_crc) */
	uint64_t mass_pass_ns;       /* when the last pass ended */
	uint64_t mass_high_since;
	atomic_ulong mass_ppm, mass_base_ppm, mass_passes;   /* base: the epoch's first pass */
	atomic_ulong csp_truncated;   /* reports whose cache sample was cut at DM_FWD_MAX_SAMPLE */
	atomic_uint mass_measured;   /* the oracle epoch of the last pass */
};

/* One oracle being built: the sample (read by the router thread), then the fit (on the
 * router thread, or on the prepare thread of a rollout), then installed. */
struct oracle_build {
	uint32_t epoch, crc, ncn, regions, dim, metric, n;
	uint32_t duty;               /* percent of a CPU the fit may take (fit_pace) */
	uint64_t cpu_mark_ns;        /* the fitting thread's CPU time at its last pause */
	int lv;
	bool keyrange;
	float *sample;               /* n x dim, normalised for cosine (sample_finish) */
	float *raw;                  /* until sample_finish: n x vdim stored vectors */
	uint32_t vdim;               /* their width */
	struct hnsw_quant *quant;    /* NULL, or a copy of the index's quantizer: raw is rotated */
	float *init;                 /* NULL, or the current epoch's centroids to start from */
	uint32_t *prev_cn;           /* key ranges, with init: each region's current CN */
	/* the fit */
	int rc;
	struct dm_oracle *o;
	uint32_t *spill;             /* ncn x (ncn-1) */
	uint8_t *owire;              /* NULL: no client-side routing with it */
	size_t owire_len;
	float *qv;                   /* the router's scratch for a normalised query */
	uint64_t hash;
	uint64_t t0_ns, sampled_ns, built_ns;   /* sampling started, sample read, fit done */
	bool taken;                  /* taken from etcd (fitted by cn `fitter`), not fitted */
	uint32_t fitter;
};

/* router_oracle.c */
/* The centroid hash of an oracle (logged, in dmann status, checked on a model from etcd). */
uint64_t router_oracle_hash(const struct dm_oracle *o);
/* The sample of the current index for an oracle of epoch (router thread). 0 or -errno
 * (-ENOENT: no index). */
int router_gather_sample(struct router *r, uint32_t epoch, bool online,
			 struct oracle_build **out);
/* Fit b's oracle on its sample (the same result on every CN). 0 or -errno (also b->rc). */
int router_fit_oracle(struct oracle_build *b);
/* Route with b's oracle from now on (takes b's contents; b is freed). */
void router_install_oracle(struct router *r, struct oracle_build *b);
void router_log_built(const struct router *r, const struct oracle_build *b, const char *how);
/* Every CN's spill order and the scratch vector for b's oracle. 0 or -ENOMEM. */
int router_build_spill(struct oracle_build *b);
/* The VHash regions of a key-range oracle fitted on b's sample. */
uint32_t router_fit_regions(const struct oracle_build *b);
void router_build_free(struct oracle_build *b);
/* The oracle of the current index for epoch, installed at once (router thread). 0 or
 * -errno. */
int router_build_oracle(struct router *r, uint32_t epoch);

/* router_rollout.c */
/* The first oracle of a CN, of an epoch > 0, taken from etcd when a rollout published it:
 * whether b is done. */
bool router_first_from_etcd(struct router *r, struct oracle_build *b);
/* One step of the rollout after a report (router thread): whether to report again soon. */
bool router_rollout_step(struct router *r, const struct dm_rollout_cn *rep);
/* Drop the prepared oracle (waits for its thread first). */
void router_prepare_drop(struct router *r);

/* router.c: the routing state (caller holds r->mu, but router_cn_ok) */
void router_reset_demand(struct router *r);
void router_set_limits(struct router *r);
void router_set_owners(struct router *r, bool force);
bool router_cn_ok(const struct router *r, uint32_t c);

#endif
