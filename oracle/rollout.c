/* rollout.c: the decisions of the two-phase oracle epoch rollout (see rollout.h). */
#include "rollout.h"

uint32_t dm_rollout_target(const struct dm_rollout_cn *cn, uint32_t n, uint32_t local)
{
	uint32_t t = local;

	for (uint32_t c = 0; cn && c < n; c++) {
		if (!cn[c].valid)
			continue;
		if (cn[c].epoch > t)
			t = cn[c].epoch;
		if (cn[c].next > t)
			t = cn[c].next;
	}
	return t;
}

uint32_t dm_rollout_current(const struct dm_rollout_cn *cn, uint32_t n)
{
	uint32_t e = 0;

	for (uint32_t c = 0; cn && c < n; c++)
		if (cn[c].valid && cn[c].ready && cn[c].epoch > e)
			e = cn[c].epoch;
	return e;
}

bool dm_rollout_may_activate(const struct dm_rollout_cn *cn, const bool *up, uint32_t n,
			     uint32_t self, uint32_t target, uint32_t fresh_ms)
{
	if (!cn || self >= n)
		return false;
	for (uint32_t c = 0; c < n; c++) {
		const struct dm_rollout_cn *r = &cn[c];

		if (c == self || (up && !up[c]))
			continue;
		if (!r->valid || !r->ready || r->age_ms > fresh_ms)
			continue;   /* silent, or building its first oracle: not waited for */
		if (r->epoch >= target || (r->prepared && r->next == target))
			continue;
		return false;
	}
	return true;
}

double dm_rollout_mass_ratio(const uint64_t *count, uint32_t k)
{
	uint64_t sum = 0, mx = 0;

	if (!count || k == 0)
		return 0;
	for (uint32_t p = 0; p < k; p++) {
		sum += count[p];
		mx = count[p] > mx ? count[p] : mx;
	}
	return sum ? (double)mx * k / (double)sum : 0;
}
