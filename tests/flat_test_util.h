/* flat_test_util.h: rows for the flat store's tests (test_flat.c, test_flat_image.c):
 * deterministic vectors per key number and generation, and a range of keys put at once. */
#ifndef DM_FLAT_TEST_UTIL_H
#define DM_FLAT_TEST_UTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flat.h"
#include "util/dm_hash.h"

/* Deterministic vector of key number i at generation gen (dim d). */
static __attribute__((unused)) void vec_of(unsigned i, unsigned gen, float *v, uint32_t d)
{
	struct dm_rng rng;

	dm_rng_seed(&rng, (uint64_t)i << 32 | gen);
	for (uint32_t j = 0; j < d; j++)
		v[j] = (float)(dm_rng_double(&rng) * 2.0 - 1.0);
}

/* key-<from>..key-<to - 1> at generation gen (vector, metadata and a one-byte fmeta). */
static __attribute__((unused)) void put_range(struct flat_index *ix, unsigned from, unsigned to,
					      unsigned gen)
{
	uint32_t d = flat_index_info(ix)->dim;
	size_t n = to - from;
	struct flat_row_in *rows = calloc(n, sizeof(*rows));
	float *v = malloc(n * d * sizeof(float));
	char (*keys)[32] = malloc(n * 32), (*meta)[48] = malloc(n * 48);

	for (size_t i = 0; i < n; i++) {
		unsigned k = from + (unsigned)i;

		snprintf(keys[i], 32, "key-%u", k);
		snprintf(meta[i], 48, "{\"n\":%u,\"gen\":%u}", k, gen);
		vec_of(k, gen, v + i * d, d);
		rows[i] = (struct flat_row_in){ keys[i], v + i * d, meta[i],
						(uint32_t)strlen(meta[i]), &meta[i][5], 1 };
	}
	cr_assert_eq(flat_put(ix, rows, n), 0);
	free(rows); free(v); free(keys); free(meta);
}

#endif
