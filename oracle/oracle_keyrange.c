/* oracle_keyrange.c: compute-node partitions as key ranges (issue 15, "partitions as key
 * ranges"): an oracle whose fine centroids are a VHash's K regions and whose k groups (CNs)
 * are contiguous runs of the VHash ring, cut so that each holds about 1/k of the sample's
 * mass. The predictor then sends a query to the CN owning the key range of its nearest
 * region (the region its VHash key falls in), and the CN ring is the key order itself
 * (group g is range g), so spilling to ring neighbours spills to the adjacent key ranges
 * and a CN leaving hands its range to a key neighbour (dm_oracle_owners). Everything that
 * takes a struct dm_oracle (rank, spill order, owners, wire form, client-side routing)
 * works on it unchanged. */
#include "oracle.h"
#include "vhash.h"
#include "config.h"   /* DM_MAX_NODES */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Cut the K ring positions into k contiguous non-empty runs of about equal mass: start[g]
 * is the first position of run g (start[0] = 0), chosen as the first position at which the
 * mass before it reaches g n / k, kept at least one position after the previous start and
 * at most K - (k - g) (room for the runs after it). */
static void cut_runs(const struct dm_vhash *vh, uint32_t k, uint32_t *start)
{
	uint64_t before = 0;       /* the mass of ring positions [0, p) */
	uint32_t p = 0;

	start[0] = 0;
	for (uint32_t g = 1; g < k; g++) {
		/* g n / k without overflow: n < 2^64 / k is not guaranteed, use 128 bits */
		unsigned __int128 goal = (unsigned __int128)vh->n * g;
		uint32_t lo = start[g - 1] + 1, hi = vh->k - (k - g);

		while (p < vh->k && (unsigned __int128)before * k < goal)
			before += vh->mass[vh->ring[p++]];
		/* clamped: p moves back (never below lo) or on (at most to lo) with its mass */
		for (; p > hi; p--)
			before -= vh->mass[vh->ring[p - 1]];
		for (; p < lo; p++)
			before += vh->mass[vh->ring[p]];
		start[g] = p;
	}
}

struct dm_oracle *dm_oracle_from_vhash(const struct dm_vhash *vh, uint32_t k)
{
	struct dm_oracle *o;
	uint32_t *start = NULL;
	double *acc = NULL, *w = NULL;
	size_t dim;

	if (!vh || k < 1 || k > DM_MAX_NODES || k > vh->k || vh->k > k * 256u) {
		errno = EINVAL;
		return NULL;
	}
	dim = vh->dim;
	o = calloc(1, sizeof(*o));
	start = calloc(k + 1, sizeof(*start));
	acc = calloc((size_t)k * dim, sizeof(*acc));
	w = calloc(k, sizeof(*w));
	if (!o || !start || !acc || !w)
		goto out_nomem;
	o->k = k;
	o->dim = vh->dim;
	o->nfine = vh->k;
	o->algo = DM_ORACLE_KEYRANGE;
	o->n = vh->n;
	o->fine = malloc((size_t)vh->k * dim * sizeof(*o->fine));
	o->fine_group = malloc(vh->k * sizeof(*o->fine_group));
	o->bias = calloc(vh->k, sizeof(*o->bias));      /* the VHash's bias-free rule */
	o->centroids = malloc((size_t)k * dim * sizeof(*o->centroids));
	o->sizes = calloc(k, sizeof(*o->sizes));
	o->ring = malloc(k * sizeof(*o->ring));
	o->ring_pos = malloc(k * sizeof(*o->ring_pos));
	if (!o->fine || !o->fine_group || !o->bias || !o->centroids || !o->sizes || !o->ring ||
	    !o->ring_pos)
		goto out_nomem;
	memcpy(o->fine, vh->centroids, (size_t)vh->k * dim * sizeof(*o->fine));
	cut_runs(vh, k, start);
	start[k] = vh->k;
	for (uint32_t g = 0; g < k; g++)
		for (uint32_t p = start[g]; p < start[g + 1]; p++) {
			uint32_t r = vh->ring[p];
			/* weight: the region's mass, at least 1 (an empty region still counts) */
			double m = vh->mass[r] ? (double)vh->mass[r] : 1.0;

			o->fine_group[r] = g;
			o->sizes[g] += vh->mass[r];
			w[g] += m;
			for (size_t j = 0; j < dim; j++)
				acc[(size_t)g * dim + j] += m * vh->centroids[(size_t)r * dim + j];
		}
	/* A group's centroid: the mass-weighted mean of its regions' centroids (what the spill
	 * order breaks ties on). The ring of CNs is the key order: run g is CN g. */
	for (uint32_t g = 0; g < k; g++) {
		for (size_t j = 0; j < dim; j++)
			o->centroids[(size_t)g * dim + j] = (float)(acc[(size_t)g * dim + j] / w[g]);
		o->ring[g] = g;
		o->ring_pos[g] = g;
	}
	free(start);
	free(acc);
	free(w);
	return o;

out_nomem:
	free(start);
	free(acc);
	free(w);
	dm_oracle_free(o);
	errno = ENOMEM;
	return NULL;
}
