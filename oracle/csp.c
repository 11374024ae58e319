/* csp.c: cache split penalty (SHINE): the share of cache entries across CNs that duplicate
 * an entry another CN already holds. Offline from cache-hit ratios (SHINE's definition),
 * exactly from the sets of cached node ids, and from a fixed 1/64 hash slice of those sets
 * (what CNs exchange online: every CN samples the same ids, so duplicates stay visible).
 */
#include "oracle.h"
#include "util/dm_hash.h"

#include <math.h>
#include <stdlib.h>

double dm_csp_from_chr(double chr_n_cns, double chr_one_cn)
{
	if (!(chr_n_cns >= 0 && chr_n_cns <= 1 && chr_one_cn > 0 && chr_one_cn <= 1))
		return NAN;
	double csp = 1.0 - chr_n_cns / chr_one_cn;
	return csp < 0 ? 0 : csp;
}

/* Final mixer of splitmix64: ids that differ in one bit land in unrelated slices. */
static inline uint64_t mix64(uint64_t z)
{
	return dm_hash64(z);
}

bool dm_csp_in_slice(uint32_t id, unsigned shift)
{
	return shift == 0 || (shift < 64 && (mix64(id) >> (64 - shift)) == 0);
}

bool dm_csp_in_sample(uint32_t id)
{
	return dm_csp_in_slice(id, 6);
}

size_t dm_csp_sample(const uint32_t *in, size_t n, uint32_t *out)
{
	size_t m = 0;

	for (size_t i = 0; i < n; i++)
		if (dm_csp_in_sample(in[i]))
			out[m++] = in[i];
	return m;
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* CSP over (id, cn) pairs, optionally only sampled ids. */
static double csp_pairs(const uint32_t *const *ids, const size_t *counts, uint32_t ncn,
			bool sampled)
{
	size_t total = 0, m = 0, entries = 0, distinct = 0;
	uint64_t *p;

	if ((!ids || !counts) && ncn)
		return -EINVAL;
	for (uint32_t c = 0; c < ncn; c++) {
		if (counts[c] && !ids[c])
			return -EINVAL;
		total += counts[c];
	}
	if (total == 0)
		return 0;
	p = malloc(total * sizeof(uint64_t));
	if (!p)
		return -ENOMEM;
	for (uint32_t c = 0; c < ncn; c++)
		for (size_t i = 0; i < counts[c]; i++)
			if (!sampled || dm_csp_in_sample(ids[c][i]))
				p[m++] = (uint64_t)ids[c][i] << 32 | c;
	qsort(p, m, sizeof(uint64_t), u64_cmp);
	for (size_t i = 0; i < m; i++) {
		if (i && p[i] == p[i - 1])
			continue; /* the same id twice in one CN counts once */
		entries++;
		if (i == 0 || (p[i] >> 32) != (p[i - 1] >> 32))
			distinct++;
	}
	free(p);
	return entries ? (double)(entries - distinct) / (double)entries : 0;
}

double dm_csp_exact(const uint32_t *const *ids, const size_t *counts, uint32_t ncn)
{
	return csp_pairs(ids, counts, ncn, false);
}

double dm_csp_sampled(const uint32_t *const *ids, const size_t *counts, uint32_t ncn)
{
	return csp_pairs(ids, counts, ncn, true);
}
