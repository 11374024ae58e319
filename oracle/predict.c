/* predict.c: the oracle's predictor. A query goes to the CN whose part of the graph it most
 * likely needs: the CN owning the nearest fine centroid. nfine distance computations with
 * the fast ISA kernel; unlike clustering, prediction need not be bit-identical across CNs
 * (only the CN that routes the query evaluates it).
 */
#include "oracle.h"
#include "distance.h"

#include <math.h>

uint32_t dm_oracle_best(const struct dm_oracle *o, const float *q)
{
	float best = INFINITY;
	uint32_t bf = 0;

	for (uint32_t f = 0; f < o->nfine; f++) {
		float d = dm_l2sq(q, o->fine + (size_t)f * o->dim, o->dim) + o->bias[f];
		if (d < best) {
			best = d;
			bf = f;
		}
	}
	return o->fine_group[bf];
}

int dm_oracle_rank(const struct dm_oracle *o, const float *q, uint32_t *cns, float *dist)
{
	float gd[o->k];

	for (uint32_t g = 0; g < o->k; g++)
		gd[g] = INFINITY;
	for (uint32_t f = 0; f < o->nfine; f++) {
		float d = dm_l2sq(q, o->fine + (size_t)f * o->dim, o->dim) + o->bias[f];
		uint32_t g = o->fine_group[f];
		if (d < gd[g])
			gd[g] = d;
	}
	/* insertion sort of CN ids by (distance, id): k is the number of CNs, small */
	for (uint32_t a = 0; a < o->k; a++) {
		uint32_t b = a;
		while (b > 0 && gd[cns[b - 1]] > gd[a])
			{
				cns[b] = cns[b - 1];
				b--;
			}
		cns[b] = a;
	}
	if (dist)
		for (uint32_t a = 0; a < o->k; a++)
			dist[a] = gd[cns[a]];
	return (int)o->k;
}
