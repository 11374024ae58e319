/* test_rng.h: the seeded generator behind the oracle and VHash tests' synthetic data (an
 * LCG, uniform doubles, Box-Muller normals) and the Gaussian mixture they draw from it. Only to generate data: its exactness does not
 * matter, but its sequence does (golden values in the tests depend on it). */
#ifndef DM_TEST_RNG_H
#define DM_TEST_RNG_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static inline uint64_t lcg(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return *s >> 11;
}

static inline double u01(uint64_t *s)
{
	return (double)lcg(s) * 0x1.0p-53;
}

static inline double normal(uint64_t *s)
{
	double u = u01(s) + 1e-300, v = u01(s);
	return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* n x dim vectors of nc clusters: centroids uniform in [0, sep)^dim, row i from cluster
 * i % nc (label[i], when label is not NULL) plus unit Gaussian noise. The centroids go to
 * *cent_out (the caller frees them) when it is not NULL. */
static inline float *rng_mixture(uint64_t seed, size_t n, size_t dim, size_t nc, double sep,
				 float **cent_out, uint32_t *label)
{
	uint64_t s = seed;
	float *c = malloc(nc * dim * sizeof(float)), *x = malloc(n * dim * sizeof(float));

	cr_assert(c && x);
	for (size_t j = 0; j < nc * dim; j++)
		c[j] = (float)(u01(&s) * sep);
	for (size_t i = 0; i < n; i++) {
		size_t j = i % nc;

		if (label)
			label[i] = (uint32_t)j;
		for (size_t d = 0; d < dim; d++)
			x[i * dim + d] = c[j * dim + d] + (float)normal(&s);
	}
	if (cent_out)
		*cent_out = c;
	else
		free(c);
	return x;
}

#endif
