/* test_rng.h: the seeded generator behind the oracle and VHash tests' synthetic data (an
 * LCG, uniform doubles, Box-Muller normals). Only to generate data: its exactness does not
 * matter, but its sequence does (golden values in the tests depend on it). */
#ifndef DM_TEST_RNG_H
#define DM_TEST_RNG_H

#include <math.h>
#include <stdint.h>

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

#endif
