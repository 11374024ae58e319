/* route_limits.c: per-batch routing limits (see route_limits.h). */
#include "route_limits.h"

#include <math.h>

#include "config.h"
#include "dm.h"

void route_demand_update(uint32_t k, double *demand, const uint32_t *want, uint32_t total)
{
	if (!total)
		return;
	for (uint32_t c = 0; c < k; c++)
		demand[c] = 0.5 * demand[c] + 0.5 * (double)want[c] / total;
}

void route_limits(uint32_t k, uint32_t batch, int adaptive, const double *demand,
		  const uint32_t *qlen, uint32_t *limit)
{
	double mean = 0, hi, wsum = 0, w[DM_MAX_NODES];

	if (!k)
		return;
	if (!adaptive) {
		for (uint32_t c = 0; c < k; c++)
			limit[c] = (batch + k - 1) / k;
		return;
	}
	for (uint32_t c = 0; c < k; c++)
		mean += qlen[c];
	mean /= k;
	hi = ROUTE_BAND * mean + ROUTE_BAND_ADD;
	for (uint32_t c = 0; c < k; c++) {
		/* The floor keeps a CN nobody ranks first able to take overflow. */
		w[c] = DM_MAX(demand[c], 0.02 / k);
		if (qlen[c] > hi)
			w[c] *= hi / qlen[c];
		wsum += w[c];
	}
	for (uint32_t c = 0; c < k; c++)
		limit[c] = (uint32_t)ceil(ROUTE_SLACK * batch * w[c] / wsum);
}

void route_limits_owned(uint32_t k, uint32_t batch, int adaptive, const double *demand,
			const uint32_t *qlen, const uint32_t *owner, uint32_t *limit)
{
	double d[DM_MAX_NODES];
	uint32_t q[DM_MAX_NODES], l[DM_MAX_NODES], idx[DM_MAX_NODES], n = 0;

	if (!k || k > DM_MAX_NODES)
		return;
	for (uint32_t c = 0; c < k; c++) {
		limit[c] = 0;
		if (owner[c] != c)
			continue;
		d[n] = demand[c];
		q[n] = qlen[c];
		idx[n++] = c;
	}
	route_limits(n, batch, adaptive, d, q, l);
	for (uint32_t i = 0; i < n; i++)
		limit[idx[i]] = l[i];
}

uint32_t route_owner_order(const uint32_t *owner, const uint32_t *parts, uint32_t n,
			   uint32_t *out)
{
	uint32_t m = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint32_t c = owner[parts[i]], j = 0;

		while (j < m && out[j] != c)
			j++;
		if (j == m)
			out[m++] = c;
	}
	return m;
}
