/* dm_hash.h: the tree's one set of hashing and pseudo-random helpers, all deterministic and
 * the same on every machine (placement, sampling and seeded builds depend on that):
 *   dm_mix64       splitmix64's finaliser: a 64-bit bijective mix of one word
 *   dm_splitmix64  the splitmix64 generator step (seeding, cheap per-id draws)
 *   dm_fnv1a64     FNV-1a over bytes (names, keys, fingerprints of arrays)
 *   struct dm_rng  xoshiro256** (Blackman & Vigna) seeded by splitmix64; uniform doubles and
 *                  floats, bounded integers, standard normals (Box-Muller)
 * Header-only, no state outside the caller's. Thread-safe as long as a dm_rng is not shared.
 */
#ifndef DM_UTIL_HASH_H
#define DM_UTIL_HASH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define DM_GOLDEN64 0x9e3779b97f4a7c15ull

static inline uint64_t dm_mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

/* One splitmix64 step: advance *state and return the next output. */
static inline uint64_t dm_splitmix64(uint64_t *state)
{
	return dm_mix64(*state += DM_GOLDEN64);
}

/* A hash of one word: splitmix64 output for state x (placement, key ids). */
static inline uint64_t dm_hash64(uint64_t x)
{
	return dm_mix64(x + DM_GOLDEN64);
}

#define DM_FNV64_INIT 0xcbf29ce484222325ull

/* FNV-1a: continue hash h over n bytes (start with DM_FNV64_INIT). */
static inline uint64_t dm_fnv1a64(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

struct dm_rng {
	uint64_t s[4];
};

static inline void dm_rng_seed(struct dm_rng *r, uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		r->s[i] = dm_splitmix64(&seed);
}

static inline uint64_t dm_rotl64(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* xoshiro256**: the next 64 random bits. */
static inline uint64_t dm_rng_next(struct dm_rng *r)
{
	uint64_t *s = r->s;
	uint64_t out = dm_rotl64(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = dm_rotl64(s[3], 45);
	return out;
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double dm_rng_double(struct dm_rng *r)
{
	return (double)(dm_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Uniform in [0, n) (n > 0; Lemire's multiply-shift, bias < 2^-32 for n < 2^32). */
static inline uint64_t dm_rng_below(struct dm_rng *r, uint64_t n)
{
	return (uint64_t)(((unsigned __int128)dm_rng_next(r) * n) >> 64);
}

/* Standard normal (Box-Muller; one draw per call, the second value is discarded). */
static inline double dm_rng_normal(struct dm_rng *r)
{
	double u1 = dm_rng_double(r), u2 = dm_rng_double(r);

	if (u1 < 1e-300)
		u1 = 1e-300;
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
