/* s3_plan.h: the query plan of the distributed exact scan (DESIGN §7), as pure functions
 * that every CN evaluates to the same answer from the same cluster state:
 *   - W, the members of one replica group, from the index size and the most bytes one CN
 *     should scan per query;
 *   - R, the number of groups, from the query rate and what one group serves;
 *   - which CNs form each group (weighted rendezvous hashing on the index);
 *   - which member of a group scans which fragment: weighted rendezvous hashing on the
 *     fragment with a load cap (a member takes at most load_cap x its capacity-fair share
 *     of the bytes), so shares are balanced and mostly stable when membership changes.
 *
 * The fan-out that uses it (one request per member, partial top-k lists merged at the
 * ingress, hedging to another group) is cn/s3/cn_s3_query.c.
 */
#ifndef DM_S3_PLAN_H
#define DM_S3_PLAN_H

#include "dm.h"
#include "placement.h"

#define S3_PLAN_LOAD_CAP 1.25
#define S3_PLAN_TABLE_MAX 64            /* most members (W x R) s3_plan_members forms */

/* W = ceil(index_bytes / max_scan_bytes), within [1, ncn]. ncn 0 -> 0. */
uint32_t s3_plan_width(uint64_t index_bytes, uint64_t max_scan_bytes, uint32_t ncn);

/* R = ceil(qps / group_qps), within [1, ncn / w] (at least 1 when w <= ncn). */
uint32_t s3_plan_groups(double qps, double group_qps, uint32_t w, uint32_t ncn);

/* The r groups of w CNs for an index: members[g*w + j] is an index into cns[] (up nodes
 * only; group 0 first). Returns the number of groups formed (< r when too few CNs are up),
 * or -EINVAL. */
int s3_plan_members(uint64_t index_id, const struct dm_place_node *cns, size_t ncn,
		    uint32_t w, uint32_t r, uint32_t *members);

/* The groups one query uses: s3_plan_members(w, r), or, when it forms none (W x R past
 * S3_PLAN_TABLE_MAX, or no CN up), the fallback: one group whose one member is `self`
 * (an index into cns[]) scanning every fragment, with *w set to 1. The fallback is logged
 * (dm_warn, at most once per 10 s per process) and counted in *fallbacks (atomically).
 * Returns the number of groups (>= 1), or -EINVAL. */
int s3_plan_pick(uint64_t index_id, const struct dm_place_node *cns, size_t ncn,
		 uint32_t *w, uint32_t r, uint32_t self, uint32_t *members,
		 uint64_t *fallbacks);

/* Assign nfrag fragments (ids and sizes in bytes) to the w members of one group:
 * owner[i] is an index into members[]. Fragments go to their best-scoring member whose
 * load stays within load_cap x its fair share (capacity-weighted); a fragment that fits
 * nowhere goes to the least loaded member relative to its share. Returns 0 or -EINVAL. */
int s3_plan_shares(const uint64_t *frag_ids, const uint64_t *frag_bytes, size_t nfrag,
		   const struct dm_place_node *members, uint32_t w, double load_cap,
		   uint32_t *owner);

#endif
