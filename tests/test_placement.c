/* test_placement.c: ideal-state placement is deterministic, capacity-proportional, and
 * moves only the items of a node that goes down; HNSW blocks in placement runs
 * (dindex_block_replicas): a run's blocks share replicas, run 1 is the placement blocks
 * always had, and runs spread evenly. */
#include <criterion/criterion.h>
#include <math.h>

#include "dindex.h"
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

/* dindex_block_replicas: the one function loads, compute node views and repairs place HNSW
 * blocks with. Run 1 is dm_place of the block (graph 0) or graph << 32 | block; a run of R
 * blocks shares the replicas of item b / R; the id counter is placed as itself whatever the
 * run; the result is the same on every call; runs are balanced over the nodes. */
Test(placement, block_runs)
{
	static struct dm_cluster_cfg cfg;
	static struct mn_set s;
	struct dm_place_node nodes[3];
	uint32_t a[2], b[2], c[2], held[3] = { 0 };

	cfg.n_mn = 3;
	for (uint32_t i = 0; i < 3; i++) {
		cfg.mn[i].capacity = 1.0;
		nodes[i] = (struct dm_place_node){ .id = i, .capacity = 1.0, .up = true };
	}
	s.cfg = &cfg;
	s.n = 3;
	for (uint32_t g = 0; g < 3; g++)
		for (uint32_t blk = 0; blk < 2000; blk++) {
			uint64_t item = g ? (uint64_t)g << 32 | blk : blk;

			cr_assert_eq(dindex_block_replicas(&s, g, 1, blk, 2, a), 2);
			cr_assert_eq(dm_place(item, nodes, 3, 2, b), 2);
			cr_assert_arr_eq(a, b, sizeof(a), "run 1 moved block %u of graph %u", blk, g);
			cr_assert_eq(dindex_block_replicas(&s, g, 16, blk, 2, a), 2);
			cr_assert_eq(dindex_block_replicas(&s, g, 16, blk, 2, c), 2);
			cr_assert_arr_eq(a, c, sizeof(a));
			cr_assert_eq(dindex_block_replicas(&s, g, 16, blk - blk % 16, 2, c), 2);
			cr_assert_arr_eq(a, c, sizeof(a), "block %u is not placed with its run", blk);
			item = g ? (uint64_t)g << 32 | blk / 16 : blk / 16;
			cr_assert_eq(dm_place(item, nodes, 3, 2, b), 2);
			cr_assert_arr_eq(a, b, sizeof(a));
			if (g == 1)
				for (int j = 0; j < 2; j++)
					held[a[j]]++;
		}
	cr_assert_eq(dindex_block_replicas(&s, 1, 16, DINDEX_CTR_BLOCK, 1, a), 1);
	cr_assert_eq(dindex_block_replicas(&s, 1, 1, DINDEX_CTR_BLOCK, 1, b), 1);
	cr_assert_eq(a[0], b[0], "the id counter moved with the run");
	/* 125 runs x 2 replicas over 3 nodes: each holds 2/3 of them within 20% */
	for (uint32_t i = 0; i < 3; i++)
		cr_assert(held[i] > 2000 * 2 / 3 * 8 / 10 && held[i] < 2000 * 2 / 3 * 12 / 10,
			  "node %u holds %u of 4000 block copies", i, held[i]);
}
