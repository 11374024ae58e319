/* vhash_order.h: key order of a whole vector file (issue 15, DESIGN §12 "graph node ids
 * assigned in key order"): fit a VHash on a sample of the rows, key every row, and list the
 * rows in key order. `dmann build --order vhash` numbers the graph's nodes that way
 * (hnsw_build_ordered), so that a block of consecutive node ids is a semantic region. */
#ifndef DM_ORACLE_VHASH_ORDER_H
#define DM_ORACLE_VHASH_ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vhash.h"

/* Rows the VHash of a key order is fitted on by default: 100 per region. */
#define DM_VHASH_ORDER_SAMPLE_PER_REGION 100u

/* Fit a VHash with k regions on an even sample of the n x dim row-major data: rows
 * floor(i * n / s) for i < s, s = min(n, sample) (sample 0: k x
 * DM_VHASH_ORDER_SAMPLE_PER_REGION), normalised first when normalise (cosine indexes).
 * NULL + errno (EINVAL: k > s, non-finite values, see dm_vhash_fit; ENOMEM). */
struct dm_vhash *dm_vhash_fit_rows(const float *data, size_t n, size_t dim, uint32_t k,
				   size_t sample, bool normalise, uint64_t seed);

/* labels[i] = the row of data with the i-th smallest key (ties: the lower row first), each
 * row normalised first when normalise; keys computed with nthreads threads (1..1024; the
 * result does not depend on it). keys (may be NULL) receives the keys in label order
 * (keys[i] is row labels[i]'s). n < 2^32. 0, -EINVAL or -ENOMEM. */
int dm_vhash_order(const struct dm_vhash *vh, const float *data, size_t n, size_t dim,
		   bool normalise, unsigned nthreads, uint32_t *labels, uint64_t *keys);

#endif /* DM_ORACLE_VHASH_ORDER_H */
