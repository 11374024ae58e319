/* vhash_frontier.h: Semord's bounded-fanout candidate frontier (§3.2.1, eq. (11)-(12)) over
 * key-ordered fragments (issue 15, point 3): given a fitted VHash and F fragments that are
 * contiguous key ranges in key order, choose which fragments a query scans, best first, at
 * most a budget B. The algorithm only; no query path uses it yet (a partitioned query mode
 * and tail fragments in key order are not built; bench/frontier measures it offline).
 *
 * Layout: fragment f holds the keys [flo[f], fhi[f]] (inclusive); flo[0] = 0,
 * flo[f + 1] = fhi[f] + 1, fhi[F - 1] = UINT64_MAX, flo[f] <= fhi[f]: the fragments cut the
 * whole 64-bit key space in key order. A region's key interval [lo_j, hi_j] may span several
 * fragments and a fragment may hold several regions (or a part of one): every rule below is
 * on key ranges, never on "the region's fragment".
 *
 * The query's key at region j: kq_j = lo_j + floor(F_j(|q - c_j|^2) * len_j), the VHash key
 * formula (vhash.h) evaluated as if q belonged to region j; for j the nearest region it is
 * dm_vhash_key(q). The key fragment of j is the fragment holding kq_j; P_j, the fragments of
 * region j (the paper's region peer set), are those overlapping [lo_j, hi_j], ordered by key
 * distance from kq_j (the key fragment first; the paper orders a peer set by "interval overlap
 * with the query key").
 *
 * The frontier, stages in this order, each fragment kept once (first stage that names it),
 * cut at the budget (the paper's Budget_B of eq. (11), "at most B distinct peers after
 * deduplication in stage order"):
 *   1. owner    o(q): the fragment holding dm_vhash_key(q), the key of q at its nearest region
 *               (the paper's successor owner of h(q)). Always first.
 *   [1b. widened only: the key fragments of the ambiguous regions, see below]
 *   2. ring     N_rho(o): up to `ring` fragments on each side of the owner in key order,
 *               nearest in key to dm_vhash_key(q) first (the predecessor/successor repair
 *               stage). The key order is linear, not a ring: the VHash cuts its region ring
 *               at the longest edge, so fragment 0 and F - 1 are not neighbours.
 *   3. hints    for the top `hints` regions R_r(q) of dm_vhash_rank (nearest first), P_j in
 *               the order above (region-directory expansion).
 *
 * Ambiguity widening (eq. (12), relative form): g(q) = (d_(2) - d_(1)) / d_(2) from
 * dm_vhash_gap, d_(i) the squared distance to the i-th nearest centroid. When opts.widen and
 * g(q) < opts.gap_rel, the query is ambiguous and the frontier widens in both ways the paper
 * names ("more directory probes", "elastic within the hard fanout cap"):
 *   - promotion: stage 1b puts, right after the owner and before the ring, the key fragment
 *     of every hint region j of rank >= 2 that is itself ambiguous against the nearest,
 *     (d_j - d_(1)) / d_j < gap_rel (always the second region, since g(q) < gap_rel);
 *   - budget: the cut is at B_wide = B + opts.wide_extra instead of B.
 * Why this variant: an ambiguous query sits near the boundary of its two nearest regions,
 * whose intervals need not be key neighbours (the ring order is a tour of a tree); the
 * ring stage then does not reach the second region, and the hint stage reaches it only after
 * the ring. Promoting just the key fragment (one fragment per ambiguous region, the one at
 * the query's radial position there) buys the other side of the boundary at the smallest
 * cost; the extra budget keeps the owner's ring stage from being crowded out by it. A
 * confident query (g >= gap_rel) is not changed at all, so the widening costs only on the
 * share of ambiguous queries.
 *
 * Cost: one dm_vhash_rank over the K centroids (K dim exact terms), O(log F) per binary
 * search, O(B_wide^2) deduplication (budgets are small), no allocation.
 *
 * Errors follow dm.h: int functions return a count or -errno.
 *
 * Thread safety: every call only reads vh, the layout and opts (the VHash is immutable, see
 * vhash.h) and writes only the caller's out/info: any number of threads at once.
 */
#ifndef DM_ORACLE_VHASH_FRONTIER_H
#define DM_ORACLE_VHASH_FRONTIER_H

#include "vhash.h"

#define DM_FRONTIER_RING_DEFAULT    1u     /* rho: fragments on each side of the owner */
#define DM_FRONTIER_HINTS_DEFAULT   64u    /* r: region hints (dm_vhash_rank) */
#define DM_FRONTIER_HINTS_MAX       256u
#define DM_FRONTIER_GAP_DEFAULT     0.10   /* widen when the relative gap is below this */
#define DM_FRONTIER_WIDE_EXTRA_DEFAULT 1u  /* B_wide = B + this */
#define DM_FRONTIER_FRAG_MAX        (1u << 24) /* fragments in a layout */

/* Options; dm_frontier_opts_default() gives the defaults. */
struct dm_frontier_opts {
	uint32_t ring;        /* rho, 0..F (default 1) */
	uint32_t hints;       /* r, 1..DM_FRONTIER_HINTS_MAX (default 64; min(r, K) are used) */
	bool widen;           /* ambiguity widening (default false: the plain eq. (11)) */
	double gap_rel;       /* widening threshold on the relative gap, 0..1 (default 0.10) */
	uint32_t wide_extra;  /* B_wide - B when widened, 0..F (default 1; 0: promotion only) */
};

/* What the frontier saw, for measurement (every field set on success). */
struct dm_frontier_info {
	uint64_t key;         /* dm_vhash_key(q) */
	uint32_t region;      /* q's nearest region */
	uint32_t owner;       /* o(q), = out[0] */
	double gap_rel;       /* g(q) of eq. (12), relative (1 when K = 1) */
	bool widened;         /* widening applied */
	uint32_t budget;      /* the cut used: B or B_wide (before min with F) */
};

/* Defaults: ring 1, hints 64, widen false, gap_rel 0.10, wide_extra 1. */
void dm_frontier_opts_default(struct dm_frontier_opts *o);

/* Check a layout (the rules above): 0 or -EINVAL (NULL arrays, nfrag 0 or more than
 * DM_FRONTIER_FRAG_MAX, a gap, an overlap, an empty or reversed range, not starting at 0 or not
 * ending at UINT64_MAX). O(F). */
int dm_frontier_layout_check(const uint64_t *flo, const uint64_t *fhi, uint32_t nfrag);

/* The fragment holding key (binary search; the layout must be valid). */
uint32_t dm_frontier_fragment(const uint64_t *flo, uint32_t nfrag, uint64_t key);

/* The frontier of q (vh->dim floats, finite) over the layout, best first, into out (room
 * entries): returns the count, min(F, B) or min(F, B_wide) when widened; out[0] is always
 * the owner, and no fragment appears twice. opts may be NULL (defaults); info may be NULL.
 * Deterministic: the same inputs give the same list. The layout is validated on every call.
 * -EINVAL: NULL vh, q or out, a bad layout, budget 0, bad opts (hints 0 or too many,
 * gap_rel outside [0, 1] or NaN, ring or wide_extra > nfrag), or room < the most the call may
 * return (min(F, B), or min(F, B + wide_extra) when opts->widen). */
int dm_vhash_frontier(const struct dm_vhash *vh, const uint64_t *flo, const uint64_t *fhi,
		      uint32_t nfrag, const float *q, uint32_t budget,
		      const struct dm_frontier_opts *opts, uint32_t *out, uint32_t room,
		      struct dm_frontier_info *info);


#endif /* DM_ORACLE_VHASH_FRONTIER_H */
