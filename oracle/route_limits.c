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
