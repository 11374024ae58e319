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
 * Library only: the fan-out that uses it (one request per member, partial top-k merged at
 * the ingress with dm_topk_merge, hedging to another group) is not built yet.
 */
#ifndef DM_S3_PLAN_H
#define DM_S3_PLAN_H

#include "dm.h"
#include "placement.h"

#define S3_PLAN_LOAD_CAP 1.25

/* W = ceil(index_bytes / max_scan_bytes), within [1, ncn]. ncn 0 -> 0. */
uint32_t s3_plan_width(uint64_t index_bytes, uint64_t max_scan_bytes, uint32_t ncn);

/* R = ceil(qps / group_qps), within [1, ncn / w] (at least 1 when w <= ncn). */
uint32_t s3_plan_groups(double qps, double group_qps, uint32_t w, uint32_t ncn);

/* The r groups of w CNs for an index: members[g*w + j] is an index into cns[] (up nodes
 * only; group 0 first). Returns the number of groups formed (< r when too few CNs are up),
 * or -EINVAL. */
int s3_plan_members(uint64_t index_id, const struct dm_place_node *cns, size_t ncn,
		    uint32_t w, uint32_t r, uint32_t *members);

/* Assign nfrag fragments (ids and sizes in bytes) to the w members of one group:
 * owner[i] is an index into members[]. Fragments go to their best-scoring member whose
 * load stays within load_cap x its fair share (capacity-weighted); a fragment that fits
 * nowhere goes to the least loaded member relative to its share. Returns 0 or -EINVAL. */
int s3_plan_shares(const uint64_t *frag_ids, const uint64_t *frag_bytes, size_t nfrag,
		   const struct dm_place_node *members, uint32_t w, double load_cap,
		   uint32_t *owner);

#endif
