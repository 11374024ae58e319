/* test_placement.c: ideal-state placement is deterministic, capacity-proportional, and
 * moves only the items of a node that goes down. */
#include <criterion/criterion.h>
#include <math.h>

#include "placement.h"

#define NITEMS 20000

Test(placement, deterministic_distinct_and_r_bounded)
{
	struct dm_place_node nodes[5];
	uint32_t a[3], b[3];

	for (uint32_t i = 0; i < 5; i++)
		nodes[i] = (struct dm_place_node){ .id = i, .capacity = 1.0, .up = true };
	for (uint64_t item = 0; item < 1000; item++) {
		cr_assert_eq(dm_place(item, nodes, 5, 3, a), 3);
		cr_assert_eq(dm_place(item, nodes, 5, 3, b), 3);
		cr_assert_arr_eq(a, b, sizeof(a));
		cr_assert(a[0] != a[1] && a[1] != a[2] && a[0] != a[2]);
	}
	nodes[1].up = nodes[2].up = nodes[3].up = false;
	cr_assert_eq(dm_place(7, nodes, 5, 3, a), 2);
	cr_assert_eq(dm_place(7, nodes, 5, 0, a), -EINVAL);
}

Test(placement, capacity_proportional)
{
	struct dm_place_node nodes[3] = {
		{ .id = 10, .capacity = 1.0, .up = true },
		{ .id = 11, .capacity = 2.0, .up = true },
		{ .id = 12, .capacity = 1.0, .up = true },
	};
	unsigned cnt[3] = { 0 };
	uint32_t o;

	for (uint64_t item = 0; item < NITEMS; item++) {
		cr_assert_eq(dm_place(item, nodes, 3, 1, &o), 1);
		cnt[o]++;
	}
	/* Expected shares 1/4, 1/2, 1/4; 20k samples: sd ~ 0.3% -> 2% is > 6 sd. */
	cr_assert_float_eq(cnt[0] / (double)NITEMS, 0.25, 0.02);
	cr_assert_float_eq(cnt[1] / (double)NITEMS, 0.50, 0.02);
	cr_assert_float_eq(cnt[2] / (double)NITEMS, 0.25, 0.02);
}

Test(placement, minimal_movement_when_a_node_goes_down)
{
	struct dm_place_node nodes[4];
	uint32_t before, after;

	for (uint32_t i = 0; i < 4; i++)
		nodes[i] = (struct dm_place_node){ .id = i, .capacity = 1.0, .up = true };
	for (uint64_t item = 0; item < NITEMS; item++) {
		dm_place(item, nodes, 4, 1, &before);
		nodes[2].up = false;
		dm_place(item, nodes, 4, 1, &after);
		nodes[2].up = true;
		if (before != 2)
			cr_assert_eq(before, after, "item %lu moved off a live node", (unsigned long)item);
		else
			cr_assert_neq(after, 2);
	}
}
