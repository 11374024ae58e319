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

/* Limits over the CNs that own their partition: a CN whose partition a neighbour serves
 * gets 0, the live ones share the batch as if they were all there is. */
Test(route_limits, owned_limits_skip_cns_that_left)
{
	double demand[3] = { 1.0 / 3, 1.0 / 3, 1.0 / 3 };
	uint32_t qlen[3] = { 0, 0, 0 }, owner[3] = { 0, 1, 1 }, limit[3], all[3];

	route_limits_owned(3, 64, 0, demand, qlen, owner, limit);
	cr_assert_eq(limit[2], 0);
	cr_assert_eq(limit[0], 32);
	cr_assert_eq(limit[1], 32);
	route_limits_owned(3, 64, 1, demand, qlen, owner, limit);
	cr_assert_eq(limit[2], 0);
	cr_assert_geq(limit[0] + limit[1], 64, "the live CNs can take the whole batch");
	owner[2] = 2;
	route_limits_owned(3, 64, 1, demand, qlen, owner, limit);
	route_limits(3, 64, 1, demand, qlen, all);
	cr_assert_arr_eq(limit, all, sizeof(all), "everyone up: the plain limits");
}

/* Candidates: the owners of the ranked partitions, in order, each once. */
Test(route_limits, owner_order_maps_and_dedups)
{
	uint32_t owner[4] = { 0, 1, 1, 0 }, parts[4] = { 2, 3, 1, 0 }, out[4];

	cr_assert_eq(route_owner_order(owner, parts, 4, out), 2);
	cr_assert_eq(out[0], 1);
	cr_assert_eq(out[1], 0);
	owner[2] = 2;
	owner[3] = 3;
	cr_assert_eq(route_owner_order(owner, parts, 4, out), 4);
	cr_assert_arr_eq(out, parts, sizeof(parts));
}

/* Q_ROUTER's owner table: decoded after the fixed part, every owner < ncn, a body too
 * short for ncn owners refused. */
Test(route_limits, q_router_owner_table)
{
	struct dm_wire_q_router h = { .epoch = 7, .strategy = DM_ROUTE_ADAPTIVE, .batch = 64,
				      .ncn = 3, .self = 1, .metric = 0, .centroid_hash = 9 }, h2;
	uint8_t b[sizeof(h) + 12 + 4];
	uint32_t own[3];

	dm_wire_q_router_encode(b, &h);
	dm_put_le32(b + sizeof(h), 0);
	dm_put_le32(b + sizeof(h) + 4, 1);
	dm_put_le32(b + sizeof(h) + 8, 1);
	cr_assert_eq(dm_wire_q_router_decode(b, sizeof(b), &h2), 0);
	cr_assert_eq(dm_wire_q_router_owners(b, sizeof(b), &h2, own), 0);
	cr_assert_eq(own[0], 0);
	cr_assert_eq(own[1], 1);
	cr_assert_eq(own[2], 1);
	cr_assert_eq(dm_wire_q_router_owners(b, sizeof(h) + 11, &h2, own), -EBADMSG);
	dm_put_le32(b + sizeof(h) + 8, 3);
	cr_assert_eq(dm_wire_q_router_owners(b, sizeof(b), &h2, own), -EBADMSG, "owner >= ncn");
}
