/* test_s3_plan.c: the distributed exact-scan plan: W and R formulas, replica groups
 * (deterministic, disjoint, up CNs only), fragment shares (complete, within the 1.25x load
 * cap, capacity-weighted, mostly stable when a member leaves), and a scan split along the
 * planned shares and merged with dm_topk_merge equal to the full scan. */
#include <criterion/criterion.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flat.h"
#include "s3_plan.h"

Test(s3plan, width_and_groups)
{
	cr_assert_eq(s3_plan_width(100, 30, 8), 4);
	cr_assert_eq(s3_plan_width(90, 30, 8), 3);
	cr_assert_eq(s3_plan_width(0, 30, 8), 1);
	cr_assert_eq(s3_plan_width(1000, 30, 8), 8);
	cr_assert_eq(s3_plan_width(1000, 0, 5), 5);
	cr_assert_eq(s3_plan_width(1000, 30, 0), 0);
	cr_assert_eq(s3_plan_groups(1000, 300, 2, 8), 4);
	cr_assert_eq(s3_plan_groups(500, 300, 2, 8), 2);
	cr_assert_eq(s3_plan_groups(1e6, 300, 2, 9), 4);
	cr_assert_eq(s3_plan_groups(0, 300, 2, 8), 1);
	cr_assert_eq(s3_plan_groups(10, 300, 3, 2), 0);
}

Test(s3plan, groups_deterministic_disjoint_up_only)
{
	struct dm_place_node cns[10];
	uint32_t a[8], b[8];

	for (uint32_t i = 0; i < 10; i++)
		cns[i] = (struct dm_place_node){ .id = 100 + i, .capacity = 1, .up = i != 3 };
	for (uint64_t ix = 0; ix < 200; ix++) {
		cr_assert_eq(s3_plan_members(ix, cns, 10, 2, 4, a), 4);
		cr_assert_eq(s3_plan_members(ix, cns, 10, 2, 4, b), 4);
		cr_assert_arr_eq(a, b, sizeof(a));
		for (int i = 0; i < 8; i++) {
			cr_assert_neq(a[i], 3);
			for (int j = 0; j < i; j++)
				cr_assert_neq(a[i], a[j]);
		}
	}
	/* Too few up CNs: fewer groups. */
	for (uint32_t i = 0; i < 10; i++)
		cns[i].up = i < 5;
	cr_assert_eq(s3_plan_members(1, cns, 10, 2, 4, a), 2);
	cr_assert_eq(s3_plan_members(1, cns, 10, 0, 4, a), -EINVAL);
}

#define NF 2000

static void loads(const uint64_t *bytes, const uint32_t *owner, size_t n, double *load,
		  uint32_t w)
{
	memset(load, 0, w * sizeof(double));
	for (size_t i = 0; i < n; i++)
		load[owner[i]] += (double)bytes[i];
}

Test(s3plan, shares_balanced_weighted_stable)
{
	struct dm_place_node m[4];
	uint64_t ids[NF], bytes[NF], total = 0;
	uint32_t own[NF], own2[NF], own3[NF];
	double load[4];
	size_t moved = 0, kept = 0;

	for (size_t i = 0; i < NF; i++) {
		ids[i] = 1000 + i;
		bytes[i] = (i % 10 == 9) ? 300000 : 1572864;     /* sealed fragments + tails */
		total += bytes[i];
	}
	for (uint32_t j = 0; j < 4; j++)
		m[j] = (struct dm_place_node){ .id = 7 + j, .capacity = 1, .up = true };
	cr_assert_eq(s3_plan_shares(ids, bytes, NF, m, 4, S3_PLAN_LOAD_CAP, own), 0);
	cr_assert_eq(s3_plan_shares(ids, bytes, NF, m, 4, S3_PLAN_LOAD_CAP, own2), 0);
	cr_assert_arr_eq(own, own2, sizeof(own));
	loads(bytes, own, NF, load, 4);
	for (uint32_t j = 0; j < 4; j++)
		cr_assert_leq(load[j], S3_PLAN_LOAD_CAP * (double)total / 4, "member %u: %g", j,
			      load[j]);

	/* Capacities 1:1:2: the big member takes more, and nobody exceeds its cap. */
	m[2].capacity = 2;
	cr_assert_eq(s3_plan_shares(ids, bytes, NF, m, 3, S3_PLAN_LOAD_CAP, own3), 0);
	loads(bytes, own3, NF, load, 3);
	cr_assert_gt(load[2], load[0]);
	cr_assert_gt(load[2], load[1]);
	for (uint32_t j = 0; j < 3; j++)
		cr_assert_leq(load[j], S3_PLAN_LOAD_CAP * (double)total * m[j].capacity / 4);
	m[2].capacity = 1;

	/* Member 1 leaves: its fragments move; few of the others do. */
	struct dm_place_node rest[3] = { m[0], m[2], m[3] };
	const uint32_t map[3] = { 0, 2, 3 };

	cr_assert_eq(s3_plan_shares(ids, bytes, NF, rest, 3, S3_PLAN_LOAD_CAP, own2), 0);
	for (size_t i = 0; i < NF; i++) {
		if (own[i] == 1)
			continue;
		kept++;
		moved += map[own2[i]] != own[i];
	}
	cr_assert_lt(moved * 10, kept, "%zu of %zu fragments moved between staying members",
		     moved, kept);
	cr_assert_eq(s3_plan_shares(ids, bytes, NF, m, 4, 0.5, own), -EINVAL);
}

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st; (void)flag; (void)f;
	return remove(p);
}

struct share {
	const uint32_t *owner;
	uint32_t me;
};

static bool in_share(void *ctx, uint64_t frag)
{
	const struct share *s = ctx;

	return s->owner[frag] == s->me;
}

/* A scan split along planned shares and merged equals the full scan. */
Test(s3plan, planned_shares_scan_and_merge)
{
	char dir[64] = "/tmp/dmann-s3plan-XXXXXX";
	struct flat_opts o = { .frag_rows = 64, .no_sync = true };
	struct flat_store *s;
	struct flat_index *ix;
	enum { N = 3000, D = 16, K = 20, W = 3 };
	float *v = malloc(N * D * sizeof(float));
	struct flat_row_in *rows = calloc(N, sizeof(*rows));
	char (*keys)[16] = malloc(N * 16);
	uint64_t bytes[256], ids[256];
	uint32_t owner[256];
	struct dm_place_node m[W];
	struct dm_hit full[K], part[W][K], merged[K];
	const struct dm_hit *lists[W] = { part[0], part[1], part[2] };
	size_t nfull, lens[W], nf, nm;

	cr_assert_not_null(mkdtemp(dir));
	s = flat_open(dir, &o);
	cr_assert_not_null(s);
	flat_bucket_create(s, "b", 0);
	flat_index_create(s, "b", "i", D, DM_METRIC_L2, NULL, 0, 0);
	ix = flat_index_get(s, "b", "i");
	srand(5);
	for (int i = 0; i < N; i++) {
		for (int j = 0; j < D; j++)
			v[i * D + j] = (float)rand() / RAND_MAX;
		snprintf(keys[i], 16, "k%d", i);
		rows[i] = (struct flat_row_in){ keys[i], v + i * D, NULL, 0, NULL, 0 };
	}
	cr_assert_eq(flat_put(ix, rows, N), 0);
	nf = flat_fragments(ix, bytes, 256);
	cr_assert_eq(nf, (N + 63) / 64);
	for (size_t i = 0; i < nf; i++)
		ids[i] = i;
	for (uint32_t j = 0; j < W; j++)
		m[j] = (struct dm_place_node){ .id = j, .capacity = 1, .up = true };
	cr_assert_eq(s3_plan_shares(ids, bytes, nf, m, W, S3_PLAN_LOAD_CAP, owner), 0);

	for (int q = 0; q < 5; q++) {
		struct flat_scan sc = { .q = v + q * 97 * D, .nq = 1, .k = K };

		cr_assert_eq(flat_search(ix, &sc, full, &nfull), 0);
		for (uint32_t j = 0; j < W; j++) {
			struct share sh = { owner, j };
			struct flat_scan ss = sc;

			ss.frag_sel = in_share;
			ss.frag_ctx = &sh;
			cr_assert_eq(flat_search(ix, &ss, part[j], &lens[j]), 0);
		}
		nm = dm_topk_merge(lists, lens, W, K, merged);
		cr_assert_eq(nm, nfull);
		for (size_t i = 0; i < nm; i++) {
			cr_assert_eq(merged[i].id, full[i].id);
			cr_assert_eq(merged[i].dist, full[i].dist);
		}
	}
	flat_index_put(ix);
	flat_close(s);
	nftw(dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
	free(v);
	free(rows);
	free(keys);
}

/* W x R past the plan's table (or no member up): the query falls back to this CN alone,
 * and the fallback is counted (the CN exports the counter as
 * dmann_cn_s3_plan_fallbacks_total). A plan that forms its groups counts nothing. */
Test(s3plan, fallback_to_one_cn_is_counted)
{
	struct dm_place_node cns[100];
	uint32_t members[256], w;
	uint64_t fallbacks = 0;
	int n;

	for (uint32_t i = 0; i < 100; i++)
		cns[i] = (struct dm_place_node){ .id = i, .capacity = 1, .up = true };
	w = 4;
	n = s3_plan_pick(7, cns, 100, &w, 4, 42, members, &fallbacks);
	cr_assert_eq(n, 4);
	cr_assert_eq(w, 4);
	cr_assert_eq(fallbacks, 0);
	/* 8 x 9 = 72 members > S3_PLAN_TABLE_MAX (64). */
	cr_assert_gt(8 * 9, S3_PLAN_TABLE_MAX);
	w = 8;
	n = s3_plan_pick(7, cns, 100, &w, 9, 42, members, &fallbacks);
	cr_assert_eq(n, 1);
	cr_assert_eq(w, 1);
	cr_assert_eq(members[0], 42);
	cr_assert_eq(fallbacks, 1);
	/* Logged at most once per 10 s, counted every time. */
	w = 8;
	cr_assert_eq(s3_plan_pick(8, cns, 100, &w, 9, 42, members, &fallbacks), 1);
	cr_assert_eq(fallbacks, 2);
	/* No CN up: the same fallback. */
	for (uint32_t i = 0; i < 100; i++)
		cns[i].up = false;
	w = 2;
	cr_assert_eq(s3_plan_pick(9, cns, 100, &w, 1, 3, members, &fallbacks), 1);
	cr_assert_eq(members[0], 3);
	cr_assert_eq(fallbacks, 3);
	cr_assert_eq(s3_plan_pick(9, cns, 100, &w, 1, 100, members, &fallbacks), -EINVAL);
}
