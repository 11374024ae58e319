/* oracle.h: the SHINE-style oracle. Balanced k-means over a representative sample of the
 * index (so that every CN owns a logical partition of the graph), a predictor that ranks CNs
 * for a query by centroid distance, the semantic ring of CNs (Semord's ordering: centroid kNN
 * graph -> MST -> DFS preorder -> 2-opt -> cut at the longest edge) used to spill overflow to
 * semantic neighbours, and the cache split penalty (CSP) estimators.
 *
 * Determinism contract: dm_oracle_build() returns bit-identical centroids for the same sample,
 * parameters and seed on every x86-64 machine, whatever the OpenBLAS thread count or the ISA
 * the distance kernels picked. See oracle/kmeans.c for how (BLAS only pre-selects candidates;
 * every decision is taken on fixed-order double arithmetic).
 *
 * All distances here are squared L2 (the k-means metric). For IP/COS indexes, callers pass
 * normalised vectors, for which L2 ranking equals cosine ranking.
 */
#ifndef DM_ORACLE_H
#define DM_ORACLE_H

#include "dm.h"

/* Clustering algorithms (both measured in docs/oracle.md). */
enum dm_oracle_algo {
	/* k-means++ then Lloyd with capacity-constrained assignment (every cluster holds at
	 * most ceil((1+eps) n/k) points). The default: see docs/oracle.md for the figures. */
	DM_ORACLE_CONSTRAINED = 0,
	/* SHINE: k-means with k, doubling k until balanced, then greedy weighted merges of
	 * the closest clusters until k groups remain. */
	DM_ORACLE_DOUBLING = 1,
	/* Key ranges (issue 15): the fine centroids are a VHash's regions, each group a
	 * contiguous run of its ring of about equal mass (dm_oracle_from_vhash; not an algo
	 * of dm_oracle_build). */
	DM_ORACLE_KEYRANGE = 2,
};

struct dm_oracle_params {
	uint32_t k;               /* number of CNs (groups), >= 1 */
	enum dm_oracle_algo algo;
	uint64_t seed;            /* same seed on every CN */
	double balance_eps;       /* balanced: every group <= (1+eps) * n / k sample points */
	uint32_t max_iter;        /* Lloyd iterations per k-means run */
	uint32_t max_doublings;   /* DOUBLING: at most k * 2^max_doublings fine clusters */
	uint32_t ring_knn;        /* neighbours per centroid in the ring's kNN graph */
	/* Called between blocks of the fit's work (NULL: never), from the fitting thread: a
	 * caller that fits in the background may sleep there to leave the CPU to others
	 * (cn/router/router.c). It must not touch the fit's data; the model does not depend
	 * on it. */
	void (*pace)(void *arg);
	void *pace_arg;
	/* CONSTRAINED only: k x dim centroids to start from (a warm start, e.g. the previous
	 * epoch's, cn/router/router.c) instead of k-means++ from the seed and the unconstrained
	 * Lloyd iterations; NULL: cold. Must be finite (EINVAL). The model depends on it: fits
	 * that must agree (every CN fitting the same epoch) must all pass the same or none. */
	const float *init;
};

/* Defaults: k as given, CONSTRAINED, seed 0x5348494e45 ("SHINE"), eps 0.10, 50 iterations,
 * 4 doublings, ring kNN 8, no pace, no warm start. */
void dm_oracle_params_default(struct dm_oracle_params *p, uint32_t k);

/* The built oracle: immutable once built, safe to share between threads. */
struct dm_oracle {
	uint32_t k;          /* groups = CNs */
	uint32_t dim;
	uint32_t nfine;      /* fine centroids (k for CONSTRAINED, k * 2^d for DOUBLING) */
	float *fine;         /* nfine x dim: what the predictor compares a query with */
	uint32_t *fine_group;/* nfine: group (CN) of each fine centroid */
	float *bias;         /* nfine: added to the squared distance of each fine centroid by the
			      * predictor (CONSTRAINED: makes nearest-centroid routing reproduce
			      * the balanced assignment; DOUBLING: zeros) */
	float *centroids;    /* k x dim: mean of each group's sample points (used by the ring) */
	uint64_t *sizes;     /* k: sample points per group under the predictor's assignment */
	double sse;          /* sum of squared distances of sample points to their group's mean */
	uint64_t n;          /* sample size */
	uint32_t *ring;      /* k: CN ids in ring order (position -> CN) */
	uint32_t *ring_pos;  /* k: CN id -> position in ring */
	enum dm_oracle_algo algo;
	uint32_t iterations; /* Lloyd iterations of the final run (diagnostics) */
	uint32_t exact_rechecks; /* assignments BLAS could not settle alone (diagnostics) */
};

/* Index of the first HNSW level from the top holding >= min_nodes nodes, given node counts
 * per level (counts[0] = level 0 = all nodes). Level 0 if no upper level is big enough;
 * -EINVAL if nlevels == 0. */
int dm_oracle_pick_level(const uint64_t *counts, uint32_t nlevels, uint64_t min_nodes);

/* Cluster the n x dim sample (row-major). NULL with errno EINVAL (bad parameters, n < k,
 * non-finite values) or ENOMEM. */
struct dm_oracle *dm_oracle_build(const float *sample, size_t n, size_t dim,
				  const struct dm_oracle_params *p);
void dm_oracle_free(struct dm_oracle *o);

/* Partitions as key ranges (oracle_keyrange.c): an oracle of k groups from VHash vh: fine
 * centroids = its K regions (bias 0: a query goes to its nearest region's group, the range
 * its key falls in), group g = the g-th of k contiguous non-empty runs of the VHash ring
 * (position 0 first), cut, among the cuts whose runs all hold at most
 * floor((1 + balance_eps) n / k) of the sample's mass (the bound of balanced k-means), where
 * the within-run sum of squared distances of the regions' centroids to their run's
 * mass-weighted mean (each region weighted by its mass) is least, exactly (dynamic
 * programming, O(k K L) for runs of at most L regions); when no cut meets the bound (a region
 * heavier than it), K > 4096 or K L dim > 2^28, where the sample mass before a position
 * reaches g n / k.
 * Centroids = the mass-weighted means of the runs' region centroids, sizes = the runs'
 * masses, ring = the identity (the CN ring is the key order). Deterministic given vh and
 * balance_eps. NULL with errno EINVAL (vh NULL, k outside 1..DM_MAX_NODES, k > vh->k,
 * vh->k > 256 k: more regions than the wire form allows, balance_eps outside 0..100) or
 * ENOMEM. */
struct dm_vhash;
struct dm_oracle *dm_oracle_from_vhash(const struct dm_vhash *vh, uint32_t k, double balance_eps);
/* The same key ranges numbered to keep the previous epoch's owners (a refit: the previous
 * regions warm-started, dm_vhash_opts.init, so region r is still about where it was):
 * prev_cn[r] (vh->k entries; UINT32_MAX: none) is the CN region r belonged to; run g goes to
 * CN perm[g], pairs (run, CN) taken greedily by decreasing sample mass they share (ties to
 * the lower run, then the lower CN), runs sharing none numbered with the CNs left in
 * order. The CN ring stays the key order (ring[g] = perm[g]). NULL prev_cn: exactly
 * dm_oracle_from_vhash. Errors as dm_oracle_from_vhash. */
struct dm_oracle *dm_oracle_from_vhash_keep(const struct dm_vhash *vh, uint32_t k,
					    double balance_eps, const uint32_t *prev_cn);
/* Whether every group of o holds at most floor((1 + eps) n / k) of its sample (the balanced
 * k-means' bound; a key-range cut that found no such cut does not). false for NULL. */
bool dm_oracle_balanced(const struct dm_oracle *o, double eps);
/* The sample points of o's largest group (0 for NULL). */
uint64_t dm_oracle_largest(const struct dm_oracle *o);
/* The regions of a key-range oracle in key order (to start the next epoch's ring from,
 * dm_vhash_opts.init_ring): the identity, as dm_oracle_from_vhash stores them. order:
 * o->nfine entries. 0, or -EINVAL (not a key-range oracle, or its regions are not in key
 * order: runs out of CN ring order). */
int dm_oracle_region_ring(const struct dm_oracle *o, uint32_t *order);
/* The key-range oracle of k groups a compute node fits for an epoch: a VHash of K regions
 * on the n x dim sample, cut into k runs. Cold (cur_regions NULL): dm_vhash_fit from seed,
 * dm_oracle_from_vhash. Warm (a refit: cur_regions = the current key-range oracle's fine
 * centroids, K x dim, cur_cn = their groups, K): the k-means starts from cur_regions, the
 * key order is kept where it serves when the current runs are contiguous (init_ring), the
 * runs keep their CNs (dm_oracle_from_vhash_keep); a warm fit without a cut within the
 * bound is fitted cold too and the better balanced of the two is returned. pace/pace_arg:
 * dm_vhash_opts.pace. *warm (may be NULL): whether the result is the warm fit. NULL with
 * errno as dm_vhash_fit / dm_oracle_from_vhash. */
struct dm_oracle *dm_oracle_keyrange_fit(const float *sample, size_t n, size_t dim, uint32_t K,
					 uint32_t k, double eps, uint64_t seed,
					 const float *cur_regions, const uint32_t *cur_cn,
					 void (*pace)(void *arg), void *pace_arg, bool *warm);

/* Predictor: CN of the fine centroid nearest to q (squared distance + bias). */
uint32_t dm_oracle_best(const struct dm_oracle *o, const float *q);
/* Predictor: all k CNs ranked by distance (a CN's distance is that of its nearest fine
 * centroid, bias included), nearest first, ties to the lower CN id. dist may be NULL. Returns k. */
int dm_oracle_rank(const struct dm_oracle *o, const float *q, uint32_t *cns, float *dist);

/* Semantic ring: the CN before/after cn in ring order, or -1 at an end of the ring (the ring
 * is cut at its longest edge, so its two ends are not semantic neighbours). */
int dm_oracle_ring_prev(const struct dm_oracle *o, uint32_t cn);
int dm_oracle_ring_next(const struct dm_oracle *o, uint32_t cn);
/* Spill order: the other k-1 CNs ordered by ring distance from cn (|position difference|),
 * at equal ring distance the one with the nearer centroid first. Returns k-1. */
int dm_oracle_spill_order(const struct dm_oracle *o, uint32_t cn, uint32_t *out);

/* Partition owners for a set of live CNs (a CN joining or leaving re-partitions the
 * router): owner[p] = p when up[p], else the first live CN in p's spill order (its ring
 * neighbours first), so a leaving CN's partition goes to a semantic neighbour and a joining
 * one takes back exactly its own; p itself when no CN is up. Deterministic: the same on
 * every CN and client that holds the oracle and the same live set. Returns the number of
 * partitions whose owner is not themselves, -EINVAL. */
int dm_oracle_owners(const struct dm_oracle *o, const bool *up, uint32_t *owner);
/* The routing epoch of an oracle epoch and an owner table (k entries): equal for equal
 * inputs, different after a re-clustering or a change of owners (24 bits of a hash of the
 * table, below the low 8 bits of the oracle epoch). */
uint32_t dm_oracle_route_epoch(uint32_t oracle_epoch, const uint32_t *owner, uint32_t k);

/* Semord's ordering of k points (k x dim, row-major): kNN graph (knn neighbours each,
 * symmetrised) -> MST (Prim, components joined by their closest pair) -> DFS preorder from
 * point 0, children by increasing edge length -> 2-opt on the closed tour -> cut at the
 * longest edge -> 2-opt on the open path. order[] receives the k indices. -EINVAL / -ENOMEM. */
int dm_oracle_ring_order(const float *pts, uint32_t k, size_t dim, uint32_t knn,
			 uint32_t *order);
/* A warm ring with hysteresis: init (a permutation of 0..k-1, e.g. the previous epoch's ring
 * of the same points, moved a little) as it is, unless the fresh order
 * (dm_oracle_ring_order) is shorter than it by over slack (a fraction; open paths): a
 * fresh order of moved points is another order (the MST can be another tree), which would
 * move every key. order must not be init. -EINVAL (not a permutation, bad slack) /
 * -ENOMEM. */
int dm_oracle_ring_order_from(const float *pts, uint32_t k, size_t dim, uint32_t knn,
			      const uint32_t *init, double slack, uint32_t *order);
/* Length of the closed tour through pts in order (Euclidean, not squared). */
double dm_oracle_tour_length(const float *pts, const uint32_t *order, uint32_t k, size_t dim);
/* 2-opt on the closed tour, in place, first-improvement passes until no improving move or
 * max_passes. Never lengthens the tour. Returns the number of moves applied. */
int dm_oracle_two_opt(const float *pts, uint32_t *order, uint32_t k, size_t dim,
		      uint32_t max_passes);

/* Deterministic squared L2 in double, fixed summation order (same bits on every x86-64). */
double dm_oracle_l2_exact(const float *a, const float *b, size_t dim);
/* out[j] = dm_oracle_l2_exact(x, c + j * dim, dim) for j < nc, bit for bit; with AVX2, four
 * centroids at a time (the four accumulators of one pair are the four lanes of a vector,
 * and four pairs give the independent chains a scalar loop lacks). */
void dm_oracle_l2_exact_many(const float *x, const float *c, size_t nc, size_t dim,
			     double *out);

/* ---- cache split penalty ---------------------------------------------------------------- */

/* SHINE's offline CSP: 1 - CHR(n CNs at r%) / CHR(1 CN at n*r%). Returns a value in
 * [0,1] (clamped), NaN if chr_one <= 0 or an input is outside [0,1]. */
double dm_csp_from_chr(double chr_n_cns, double chr_one_cn);

/* Exact CSP from the sets of cached node ids of ncn CNs: duplicated entries / all entries,
 * where an id cached by c CNs counts c entries of which c-1 are duplicates. Repeated ids
 * within one CN count once. 0 when nothing is cached; -ENOMEM/-EINVAL as a negative
 * return value (check < 0). */
double dm_csp_exact(const uint32_t *const *ids, const size_t *counts, uint32_t ncn);

/* The sampled slice: ids whose 64-bit mixed hash has its top 6 bits zero (1/64 of ids). */
bool dm_csp_in_sample(uint32_t id);
/* Whether id is in the 1/2^shift hash slice (shift 0..63; 0: every id). The slices nest:
 * the 1/64 slice (dm_csp_in_sample) lies inside every coarser one. */
bool dm_csp_in_slice(uint32_t id, unsigned shift);
/* Copy the ids of in[] that are in the sample slice to out[] (may alias in); returns the
 * count. */
size_t dm_csp_sample(const uint32_t *in, size_t n, uint32_t *out);
/* CSP over only the sampled ids of each CN (what CNs exchange online). */
double dm_csp_sampled(const uint32_t *const *ids, const size_t *counts, uint32_t ncn);

/* ---- wire form -------------------------------------------------------------------------- */

/* Wire form of the predictor (what a client needs to rank CNs as the CNs do): little-endian
 * magic "DMOR", version 1, k, dim, nfine, algo, then fine (nfine x dim f32), fine_group
 * (nfine u32), bias (nfine f32), centroids (k x dim f32), ring (k u32). */
#define DM_ORACLE_WIRE_MAX (16u << 20)   /* bytes */
size_t dm_oracle_wire_size(const struct dm_oracle *o);
/* Write o into buf (cap bytes). Bytes written, -ENOSPC if cap is too small, -EINVAL (NULL, or
 * an oracle whose header fields or size the decoder would reject). */
long dm_oracle_encode(const struct dm_oracle *o, uint8_t *buf, size_t cap);
/* Decode and validate len bytes: NULL + errno EBADMSG (any inconsistency: wrong magic or
 * version, k outside 1..DM_MAX_NODES, dim outside 1..DM_Q_MAX_DIM, nfine < k or
 * nfine > k * 256, algo not a dm_oracle_algo, a size that is not exactly len or over
 * DM_ORACLE_WIRE_MAX, a fine_group >= k, a group with no fine centroid, a non-finite float,
 * a ring that is not a permutation of 0..k-1) or ENOMEM.
 * The result is a full struct dm_oracle usable by dm_oracle_rank, dm_oracle_best,
 * dm_oracle_spill_order and dm_oracle_ring_prev/next, freed by dm_oracle_free: ring_pos is
 * rebuilt from ring, sizes is allocated and zeroed (the sample is not sent), sse, n,
 * iterations and exact_rechecks are 0. Re-encoding it gives back exactly the same bytes. */
struct dm_oracle *dm_oracle_decode(const uint8_t *buf, size_t len);

#endif /* DM_ORACLE_H */
