/* vhash.h: VHash, Semord's learned semantic key space (§3.1), one per index (issue 15, first
 * part). A VHash maps a vector to a 64-bit key so that key order follows semantic order:
 *
 *   regions    K coarse regions: the centroids of the oracle's balanced k-means over a sample
 *              of the index (dm_oracle_build, CONSTRAINED); a vector belongs to its nearest
 *              centroid (exact squared L2, ties to the lower region id), the bias-free rule
 *              of the paper's eq. (3)/(8);
 *   ring       the regions in Semord's topology order (dm_oracle_ring_order: centroid kNN
 *              graph -> MST -> DFS preorder -> 2-opt -> cut at the longest edge);
 *   intervals  the key space [0, 2^64) cut into K non-empty contiguous intervals, in ring
 *              order, of length  M + (2^64 - K M) m_r / n  rounded by largest remainder,
 *              where m_r is the number of sample points whose nearest centroid is r and
 *              M = floor(2^54 / K) is every region's minimum share (so all of them together
 *              reserve at most 2^-10 of the key space); exact integer arithmetic;
 *   radial CDF per region, a monotone piecewise-linear fit F_r of the empirical CDF of the
 *              squared distance d = |x - c_r|^2 of its members, through `knots` quantile
 *              knots (default 17, i.e. 16 equal-mass segments);
 *   key        key(x) = lo_r + floor(F_r(d) * len_r), clamped to [lo_r, hi_r], with r the
 *              nearest region. Key order = ring order of regions, then radius.
 *
 * Determinism: the same sample, K, seed and options give byte-identical dm_vhash_save()
 * output and identical keys in every process on every x86-64 machine: the k-means is the
 * oracle's (bit-identical by construction), and every decision here is taken on fixed-order
 * double arithmetic (dm_oracle_l2_exact, -ffp-contract=off) and integer arithmetic.
 *
 * Metric: squared L2 only. For cosine / inner-product indexes callers normalise vectors
 * (sample and queries) first; L2 order on unit vectors equals cosine order.
 *
 * Not built yet (docs/oracle.md): placement of node ids in key order, CN partitions as key
 * ranges, a query path using the bounded-fanout frontier (the algorithm is vhash_frontier.h),
 * scopes and the two-phase epoch rollout.
 *
 * Errors follow dm.h: int functions return 0 (or a count) or -errno; constructors return
 * NULL with errno set.
 *
 * Thread safety: a struct dm_vhash is immutable after dm_vhash_fit / dm_vhash_load (except
 * `epoch`, which the owner sets before sharing it) and may then be used by any number of
 * threads at once; every call below only reads it.
 */
#ifndef DM_ORACLE_VHASH_H
#define DM_ORACLE_VHASH_H

#include "dm.h"

#define DM_VHASH_MAGIC          0x48534856u /* "VHSH" as little-endian bytes */
#define DM_VHASH_VERSION        1u
#define DM_VHASH_K_DEFAULT      256u        /* regions, the paper's coarse partition */
#define DM_VHASH_K_MAX          65536u
#define DM_VHASH_DIM_MAX        65536u
#define DM_VHASH_KNOTS_DEFAULT  17u         /* 16 equal-mass CDF segments */
#define DM_VHASH_KNOTS_MAX      1025u
#define DM_VHASH_MIN_SHARE_LOG2 54          /* each region gets >= floor(2^54 / K) keys */
#define DM_VHASH_HDR            40u         /* bytes of the serialised header */
/* Default k-means balance bound: groups <= 4 n/K. Looser than the oracle's 0.10 because
 * (1) Semord balances load in the key intervals (mass-proportional), not in the regions;
 * (2) VHash assigns by the bias-free nearest centroid, which drops the oracle's balancing
 * biases anyway; (3) the oracle's bias auction is O(n K) per round and at K = 256 with 0.10
 * did not settle in its 27600 rounds (73 s for 12800 x 32), against 1.2 s with 3.0. */
#define DM_VHASH_BALANCE_EPS    3.0
/* A warm fit keeps the previous ring unless a fresh order is this much shorter. */
#define DM_VHASH_RING_SLACK     0.10

/* Fitting options; dm_vhash_opts_default() gives the defaults. */
struct dm_vhash_opts {
	uint32_t knots;      /* CDF knots per region, 2..DM_VHASH_KNOTS_MAX (default 17) */
	uint32_t ring_knn;   /* neighbours per centroid in the ring's kNN graph (default 8) */
	double balance_eps;  /* balanced k-means: groups <= (1+eps) n/K points (default 3.0:
			      * a guard against giant regions, not a balance target; load
			      * balance is the intervals' job, see DM_VHASH_BALANCE_EPS) */
	uint32_t max_iter;   /* Lloyd iterations of the k-means (default 50) */
	void (*pace)(void *arg);   /* dm_oracle_params.pace (default NULL) */
	void *pace_arg;
	const float *init;   /* k x dim region centroids to start the k-means from (a warm
			      * start from the previous epoch's regions; dm_oracle_params.init);
			      * NULL (default): k-means++ from the seed */
	const uint32_t *init_ring;   /* with init: k, the previous ring (position -> region),
				      * kept unless a fresh order is over DM_VHASH_RING_SLACK
				      * shorter (dm_oracle_ring_order_from); NULL (default):
				      * ordered from scratch */
};

/* The model. Region ids are 0..k-1 (k-means order); positions are 0..k-1 in ring order. */
struct dm_vhash {
	uint64_t epoch;      /* set by the caller (0 after fit), saved and loaded as is */
	uint32_t dim;
	uint32_t k;          /* regions */
	uint32_t knots;      /* CDF knots per region */
	uint64_t n;          /* sample size fitted on (= sum of mass) */
	float *centroids;    /* k x dim */
	uint32_t *ring;      /* k: position -> region */
	uint32_t *ring_pos;  /* k: region -> position */
	uint64_t *mass;      /* k: sample points whose nearest centroid is the region (may be 0) */
	uint64_t *lo, *hi;   /* k: the region's key interval [lo, hi], inclusive, lo <= hi */
	double *cdf;         /* k x knots: knot i of region r is the squared radius at which
			      * F_r = i / (knots - 1); non-decreasing, finite, >= 0 */
};

/* Defaults: knots 17, ring_knn 8, balance_eps DM_VHASH_BALANCE_EPS, max_iter 50. */
void dm_vhash_opts_default(struct dm_vhash_opts *o);

/* Fit a VHash on the n x dim row-major sample with k regions (1 <= k <= n, k <=
 * DM_VHASH_K_MAX; DM_VHASH_K_DEFAULT is the usual choice) and the given seed; opts may be
 * NULL (defaults). Cost: the oracle's k-means plus n k dim exact distance terms.
 * NULL with errno EINVAL (NULL sample, dim 0 or > DM_VHASH_DIM_MAX, k 0 or > n or too
 * large, n k > 2^32 - 1, a non-finite or |value| > 1e15 sample value, bad opts) or ENOMEM. */
struct dm_vhash *dm_vhash_fit(const float *sample, size_t n, size_t dim, uint32_t k,
			      uint64_t seed, const struct dm_vhash_opts *opts);
/* NULL is a no-op. */
void dm_vhash_free(struct dm_vhash *vh);

/* Nearest region of x (dim floats): exact squared L2, ties to the lower id. *d2 (may be NULL)
 * receives the squared distance. x must be finite (a non-finite x yields region 0). */
uint32_t dm_vhash_nearest(const struct dm_vhash *vh, const float *x, double *d2);

/* F_r(d2) in [0, 1]: 0 below the first knot (and for NaN), 1 at or above the last, linear
 * between consecutive distinct knots (knot i at i / (knots - 1)). Non-decreasing in d2.
 * r must be < vh->k. */
double dm_vhash_cdf(const struct dm_vhash *vh, uint32_t r, double d2);

/* The key of x: lo_r + floor(F_r(d2) * len_r) with r = dm_vhash_nearest(x), computed in
 * 64 x 64 -> 128-bit integer arithmetic from F scaled to 64 bits, so it is always inside
 * [lo_r, hi_r]. *region (may be NULL) receives r. */
uint64_t dm_vhash_key(const struct dm_vhash *vh, const float *x, uint32_t *region);

/* The key of a vector at region r (r < vh->k) whose squared distance to c_r is d2 (given by
 * the caller, exact as dm_vhash_rank returns it): lo_r + floor(F_r(d2) * len_r) in the
 * integer arithmetic of dm_vhash_key, which is dm_vhash_key_at(vh, nearest, its d2). The
 * bounded-fanout frontier takes a query's key at each of its nearest regions this way. */
uint64_t dm_vhash_key_at(const struct dm_vhash *vh, uint32_t r, double d2);
/* The region whose interval holds key (binary search in ring order). Every key has one. */
uint32_t dm_vhash_key_region(const struct dm_vhash *vh, uint64_t key);

/* The min(m, k) regions nearest to x, nearest first (exact squared L2, ties to the lower
 * id): regions[] and dist[] (squared distances) of room m. What a bounded-fanout frontier
 * ranks (the paper's R_r(q)). Returns the count, -EINVAL on NULL arguments. */
int dm_vhash_rank(const struct dm_vhash *vh, const float *x, uint32_t *regions, double *dist,
		  uint32_t m);

/* Ambiguity gap of §3.2.1 from a dm_vhash_rank() result: Delta = dist[1] - dist[0] (the
 * paper's eq. (12), absolute, in squared-distance units). *rel (may be NULL) receives the
 * scale-free Delta / dist[1] in [0, 1] (0: on the boundary of the two regions, 1: on the
 * nearest centroid; 0 when dist[1] == 0). With count < 2 (k = 1) there is no second region:
 * +INFINITY and rel 1. */
double dm_vhash_gap(const double *dist, uint32_t count, double *rel);

/* Serialised form (little-endian), dm_vhash_save_size() bytes:
 *     u32 magic "VHSH"  u32 version (1)  u64 epoch  u32 dim  u32 k  u32 knots  u32 flags (0)
 *     u64 n                                       (header: DM_VHASH_HDR = 40 bytes)
 *     f32 centroids[k * dim]   u32 ring[k]   u64 mass[k]   (u64 lo, u64 hi)[k]
 *     f64 cdf[k * knots]       u32 crc32 (zlib) of all the bytes before it
 * dm_vhash_save writes it (0, -ENOSPC if len is too small, -EINVAL on NULL). dm_vhash_load
 * validates everything (magic, version, flags, dim, k, knots, exact length, CRC, finite
 * centroids, ring a permutation, masses summing to n, intervals non-empty, contiguous in
 * ring order and covering exactly [0, 2^64), CDF knots finite, >= 0 and non-decreasing)
 * and returns 0 with *out set, -EINVAL for anything malformed or truncated, or -ENOMEM. */
size_t dm_vhash_save_size(const struct dm_vhash *vh);
int dm_vhash_save(const struct dm_vhash *vh, void *buf, size_t len);
int dm_vhash_load(const void *buf, size_t len, struct dm_vhash **out);

#endif /* DM_ORACLE_VHASH_H */
