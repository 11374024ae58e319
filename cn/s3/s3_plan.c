/* s3_plan.c: W, R, replica groups and fragment shares of the distributed exact scan
 * (see s3_plan.h). */
#include "s3_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint32_t s3_plan_width(uint64_t index_bytes, uint64_t max_scan_bytes, uint32_t ncn)
{
	uint64_t w;

	if (!ncn)
		return 0;
	if (!max_scan_bytes)
		return ncn;
	w = index_bytes / max_scan_bytes + (index_bytes % max_scan_bytes != 0);
	return (uint32_t)DM_MAX(1, DM_MIN(w, ncn));
}

uint32_t s3_plan_groups(double qps, double group_qps, uint32_t w, uint32_t ncn)
{
	double r;
	uint32_t rmax;

	if (!w || w > ncn)
		return 0;
	rmax = ncn / w;
	if (!(group_qps > 0) || !(qps > 0))
		return 1;
	r = ceil(qps / group_qps);
	return r >= rmax ? rmax : (uint32_t)DM_MAX(1.0, r);
}

int s3_plan_members(uint64_t index_id, const struct dm_place_node *cns, size_t ncn,
		    uint32_t w, uint32_t r, uint32_t *members)
{
	uint32_t *order;
	int n;

	if (!w || !r || (uint64_t)w * r > S3_PLAN_TABLE_MAX || (!cns && ncn) || !members)
		return -EINVAL;
	order = malloc((size_t)w * r * sizeof(*order));
	if (!order)
		return -ENOMEM;
	/* The best w*r CNs for the index, dealt into groups in score order: group 0 gets the
	 * best w. Deterministic on every CN. */
	n = dm_place(dm_hash64(index_id ^ 0x5336564543ull), cns, ncn, w * r, order);
	if (n < 0) {
		free(order);
		return n;
	}
	memcpy(members, order, (size_t)n * sizeof(*order));
	free(order);
	return n / (int)w;
}

int s3_plan_pick(uint64_t index_id, const struct dm_place_node *cns, size_t ncn,
		 uint32_t *w, uint32_t r, uint32_t self, uint32_t *members,
		 uint64_t *fallbacks)
{
	static uint64_t last_warn_ns;   /* atomic */
	uint64_t now, last;
	int n;

	if (!w || !members || !fallbacks || self >= ncn)
		return -EINVAL;
	n = s3_plan_members(index_id, cns, ncn, *w, r, members);
	if (n > 0)
		return n;
	__atomic_add_fetch(fallbacks, 1, __ATOMIC_RELAXED);
	now = dm_now_ns();
	last = __atomic_load_n(&last_warn_ns, __ATOMIC_RELAXED);
	if ((!last || now - last > 10000000000ull) &&
	    __atomic_compare_exchange_n(&last_warn_ns, &last, now, false, __ATOMIC_RELAXED,
					__ATOMIC_RELAXED))
		dm_warn("s3 plan: %s (W %u x R %u, table %u): this CN scans all of index %016llx "
			"alone", n == 0 ? "no scan member is up" : "no replica group formed", *w, r,
			S3_PLAN_TABLE_MAX, (unsigned long long)index_id);
	*w = 1;
	members[0] = self;
	return 1;
}

struct cand {
	double score;
	uint32_t m;
};

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;

	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	return x->m < y->m ? -1 : x->m > y->m;
}

int s3_plan_shares(const uint64_t *frag_ids, const uint64_t *frag_bytes, size_t nfrag,
		   const struct dm_place_node *members, uint32_t w, double load_cap,
		   uint32_t *owner)
{
	double total = 0, capsum = 0, *limit, *load;
	struct cand *c;
	int rc = 0;

	if (!w || !members || (nfrag && (!frag_ids || !frag_bytes || !owner)) || load_cap < 1)
		return -EINVAL;
	for (uint32_t j = 0; j < w; j++) {
		if (!(members[j].capacity > 0))
			return -EINVAL;
		capsum += members[j].capacity;
	}
	for (size_t i = 0; i < nfrag; i++)
		total += (double)frag_bytes[i];
	limit = calloc(w, sizeof(double));
	load = calloc(w, sizeof(double));
	c = calloc(w, sizeof(*c));
	if (!limit || !load || !c) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t j = 0; j < w; j++)
		limit[j] = load_cap * total * members[j].capacity / capsum;
	/* Fragments in the given order (callers pass them by id): deterministic. */
	for (size_t i = 0; i < nfrag; i++) {
		double b = (double)frag_bytes[i], best_ratio = INFINITY;
		uint32_t pick = UINT32_MAX, fallback = 0;

		for (uint32_t j = 0; j < w; j++)
			c[j] = (struct cand){ dm_place_score(frag_ids[i], members[j].id,
							     members[j].capacity), j };
		qsort(c, w, sizeof(*c), cand_cmp);
		for (uint32_t t = 0; t < w; t++) {
			uint32_t j = c[t].m;
			double ratio = (load[j] + b) / (limit[j] > 0 ? limit[j] : 1);

			if (load[j] + b <= limit[j]) {
				pick = j;
				break;
			}
			if (ratio < best_ratio) {
				best_ratio = ratio;
				fallback = j;
			}
		}
		if (pick == UINT32_MAX)
			pick = fallback;
		owner[i] = pick;
		load[pick] += b;
	}
out:
	free(limit);
	free(load);
	free(c);
	return rc;
}
