/* test_route_limits.c: the routing limits of the balanced and adaptive strategies
 * (oracle/route_limits.c) and the choice of the pinned HNSW levels (dindex_pin_level). */
#include <criterion/criterion.h>

#include "dindex.h"
#include "route_limits.h"
#include "wire.h"

static uint32_t sum(const uint32_t *v, uint32_t k)
{
	uint32_t s = 0;

	for (uint32_t i = 0; i < k; i++)
		s += v[i];
	return s;
}

Test(route_limits, balanced_is_equal_shares)
{
	double demand[4] = { 0.7, 0.1, 0.1, 0.1 };
	uint32_t q[4] = { 90, 1, 1, 1 }, lim[4];

	route_limits(4, 1000, 0, demand, q, lim);
	for (int c = 0; c < 4; c++)
		cr_assert_eq(lim[c], 250, "cn%d limit %u", c, lim[c]);
	route_limits(3, 1000, 0, demand, q, lim);
	cr_assert_eq(lim[0], 334, "ceil(1000 / 3)");
}

/* Nobody overloaded: every CN may take at least the demand for it, so each query can go to
 * its top-ranked CN even when the demand is skewed (no spill, partitioned caches). */
Test(route_limits, adaptive_follows_demand_when_queues_are_even)
{
	double demand[4] = { 0.55, 0.25, 0.15, 0.05 };
	uint32_t q[4] = { 12, 9, 8, 6 }, lim[4];

	route_limits(4, 1000, 1, demand, q, lim);
	for (int c = 0; c < 4; c++)
		cr_assert_geq(lim[c], (uint32_t)(demand[c] * 1000), "cn%d limit %u under its demand %.0f",
			      c, lim[c], demand[c] * 1000);
	cr_assert_geq(sum(lim, 4), 1000, "every query of the batch has room somewhere");
}

/* An overloaded CN (queue far over the band) gets less than its demand, the others more. */
Test(route_limits, adaptive_sheds_an_overloaded_cn)
{
	double demand[4] = { 0.55, 0.25, 0.15, 0.05 };
	uint32_t q[4] = { 200, 10, 10, 10 }, lim[4], even[4];
	uint32_t even_q[4] = { 10, 10, 10, 10 };

	route_limits(4, 1000, 1, demand, q, lim);
	route_limits(4, 1000, 1, demand, even_q, even);
	cr_assert_lt(lim[0], 550, "overloaded cn0 keeps %u of its demand 550", lim[0]);
	cr_assert_lt(lim[0], even[0] * 3 / 4, "cn0's limit %u vs %u with even queues", lim[0], even[0]);
	for (int c = 1; c < 4; c++)
		cr_assert_gt(lim[c], even[c], "cn%d takes overflow: %u vs %u", c, lim[c], even[c]);
	cr_assert_geq(sum(lim, 4), 1000);
}

/* A CN nobody ranks first still gets room for overflow. */
Test(route_limits, adaptive_floor_for_idle_cn)
{
	double demand[4] = { 1.0, 0.0, 0.0, 0.0 };
	uint32_t q[4] = { 300, 0, 0, 0 }, lim[4];

	route_limits(4, 1000, 1, demand, q, lim);
	for (int c = 1; c < 4; c++)
		cr_assert_gt(lim[c], 0, "cn%d can take overflow", c);
	cr_assert_geq(sum(lim, 4), 1000);
}

Test(route_limits, demand_is_smoothed)
{
	double demand[2] = { 0.5, 0.5 };
	uint32_t want[2] = { 100, 0 };

	route_demand_update(2, demand, want, 100);
	cr_assert_float_eq(demand[0], 0.75, 1e-12);
	cr_assert_float_eq(demand[1], 0.25, 1e-12);
	route_demand_update(2, demand, want, 0);   /* empty batch: unchanged */
	cr_assert_float_eq(demand[0], 0.75, 1e-12);
	for (int i = 0; i < 40; i++)
		route_demand_update(2, demand, want, 100);
	cr_assert_float_eq(demand[0], 1.0, 1e-9, "converges to the observed share");
}

/* The pinned levels: the lowest level whose nodes fit in a quarter of the cache. */
Test(route_limits, pin_level_fits_a_quarter_of_the_cache)
{
	struct dindex d = { .n = 60000, .max_level = 4 };

	d.at_level[1] = 3750;
	d.at_level[2] = 234;
	d.at_level[3] = 15;
	d.at_level[4] = 1;
	cr_assert_eq(dindex_pin_level(&d, 3000), 2, "5%% cache: level 1 (3750) > 750 slots");
	cr_assert_eq(dindex_pin_level(&d, 15000), 1, "25%% cache: every upper level fits");
	cr_assert_eq(dindex_pin_level(&d, 100), 3, "tiny cache: only the top");
	cr_assert_eq(dindex_pin_level(&d, 0), 5, "no cache: pin nothing");
}
