/* test_hnsw_upper.c: online upper levels (common/hnsw/hnsw_upper.h): a graph built over a
 * seed grows by nodes planned into its upper levels and applied the way a compute node
 * does (cn/engine/cn_upper.c); the lists stay well formed, the new nodes are reachable by
 * the greedy descent, the descent to level 0 ends nearer to the queries than over the
 * seed's upper levels alone, and bad arguments and corrupt lists are refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hnsw/hnsw.h"
#include "hnsw/hnsw_upper.h"

#define DIM 16
#define N0 2000u              /* the seed, built offline */
#define NE 20000u             /* grown online: 10x */
#define GM 8u

struct up {
	uint32_t **upl;
	const float **uvec;
	void **blk;
	uint32_t nblk;
	struct hnsw_upper_graph g;
};

static float *clustered(uint32_t n, uint64_t seed)
{
	float *v = malloc((size_t)n * DIM * sizeof(float));
	uint64_t s = seed;

	cr_assert_not_null(v);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t c;

		s = s * 6364136223846793005ull + 1442695040888963407ull;
		c = (uint32_t)(s >> 33) % 32;
		for (uint32_t d = 0; d < DIM; d++) {
			s = s * 6364136223846793005ull + 1442695040888963407ull;
			v[(size_t)i * DIM + d] = (float)((c * 7 + d * 3) % 11) +
						 (float)((s >> 40) & 0xffff) / 65536.0f;
		}
	}
	return v;
}

/* node id's upper lists (level lv) and vector in one block, as cn_upper.c lays them out */
static void put_node(struct up *u, uint32_t id, uint32_t lv, const uint32_t *lists,
		     const float *v)
{
	size_t words = 1 + (size_t)lv * hnsw_up_list_words(GM);
	uint32_t *b = calloc(words + DIM, sizeof(uint32_t));

	cr_assert_not_null(b);
	b[0] = lv;
	if (lists)
		memcpy(b + 1, lists, (words - 1) * sizeof(uint32_t));
	memcpy(b + words, v, DIM * sizeof(float));
	u->blk[u->nblk++] = b;
	u->upl[id] = b + 1;
	u->uvec[id] = (const float *)(void *)(b + words);
}

/* the seed's upper levels, copied out of the local index */
static void from_seed(struct up *u, const struct hnsw_index *idx, uint32_t cap)
{
	u->upl = calloc(cap, sizeof(*u->upl));
	u->uvec = calloc(cap, sizeof(*u->uvec));
	u->blk = calloc(cap, sizeof(*u->blk));
	cr_assert(u->upl && u->uvec && u->blk);
	for (uint32_t id = 0; id < idx->n; id++)
		if (idx->upl[id])
			put_node(u, id, hnsw_rec(idx, id)->level, idx->upl[id],
				 hnsw_rec_vec(hnsw_rec(idx, id), idx->vec_off));
	u->g = (struct hnsw_upper_graph){ .M = GM, .vdim = DIM, .n = cap,
		.upl = u->upl, .uvec = u->uvec, .kern = hnsw_kernel_for(DM_METRIC_L2),
		.entry = idx->entry, .max_level = idx->max_level };
}

static void up_free(struct up *u)
{
	for (uint32_t i = 0; i < u->nblk; i++)
		free(u->blk[i]);
	free(u->blk);
	free(u->upl);
	free(u->uvec);
}

static void apply(struct up *u, const struct hnsw_upper_plan *p, const float *v)
{
	uint32_t lw = hnsw_up_list_words(GM), own[HNSW_MAX_LEVEL * (1 + GM)];

	memset(own, 0, sizeof(own));
	for (uint32_t i = 0; i < p->nlists; i++)
		if (p->lists[i].node == p->id)
			memcpy(own + (p->lists[i].level - 1) * lw, p->lists[i].w, lw * 4);
	put_node(u, p->id, p->level, own, v);
	for (uint32_t i = 0; i < p->nlists; i++)
		if (p->lists[i].node != p->id)
			memcpy(u->upl[p->lists[i].node] + (p->lists[i].level - 1) * lw,
			       p->lists[i].w, lw * 4);
}

/* greedy descent from the entry down to level 1: the node it ends on (and its distance) */
static uint32_t descend(const struct hnsw_upper_graph *g, const float *q, float *dist)
{
	uint32_t c = g->entry;
	float cd = g->kern(q, g->uvec[c], DIM);

	for (int l = g->max_level; l >= 1; l--) {
		bool changed = true;

		while (changed) {
			const uint32_t *w = g->upl[c] + (size_t)(l - 1) * hnsw_up_list_words(GM);

			changed = false;
			for (uint32_t j = 0; j < w[0]; j++) {
				float d = g->kern(q, g->uvec[w[1 + j]], DIM);

				if (d < cd) {
					cd = d;
					c = w[1 + j];
					changed = true;
				}
			}
		}
	}
	*dist = cd;
	return c;
}

Test(hnsw_upper, grows_navigable_upper_levels, .timeout = 120)
{
	struct hnsw_params p = { .dim = DIM, .metric = DM_METRIC_L2, .M = GM,
				 .ef_construction = 64, .seed = 7, .block_shift = 10 };
	float *seed = clustered(N0, 1), *grow = clustered(NE, 2), *qs = clustered(500, 3);
	char err[256];
	struct hnsw_index *idx = hnsw_build(&p, seed, N0, 1, NULL, NULL, err, sizeof(err));
	struct hnsw_upper_scratch *s = hnsw_upper_scratch_new(N0 + NE, GM, 64);
	struct up on = { 0 }, off = { 0 };
	uint32_t added = 0, self = 0, inlinked = 0;
	double don = 0, doff = 0;

	cr_assert_not_null(idx, "%s", err);
	cr_assert_not_null(s);
	cr_assert_geq(idx->max_level, 1);
	from_seed(&on, idx, N0 + NE);
	from_seed(&off, idx, N0 + NE);
	for (uint32_t i = 0; i < NE; i++) {
		uint32_t id = N0 + i, lv = hnsw_draw_level(11, id, GM);
		struct hnsw_upper_plan plan;

		lv = lv > (uint32_t)idx->max_level ? (uint32_t)idx->max_level : lv;
		if (!lv)
			continue;
		cr_assert_eq(hnsw_upper_plan(&on.g, s, id, lv, grow + (size_t)i * DIM, &plan), 0);
		cr_assert_eq(plan.id, id);
		cr_assert_eq(plan.level, lv);
		cr_assert_geq(plan.nlists, lv);
		apply(&on, &plan, grow + (size_t)i * DIM);
		added++;
	}
	/* about 1/GM of the new nodes */
	cr_assert(added > NE / GM / 2 && added < NE / GM * 2, "%u added", added);
	/* every list well formed: at most GM distinct ids of nodes of that level, no self */
	for (uint32_t id = 0; id < N0 + NE; id++) {
		if (!on.upl[id])
			continue;
		for (uint32_t l = 1; l <= on.upl[id][-1]; l++) {
			const uint32_t *w = on.upl[id] + (l - 1) * hnsw_up_list_words(GM);

			cr_assert_leq(w[0], GM);
			for (uint32_t j = 0; j < w[0]; j++) {
				cr_assert_neq(w[1 + j], id);
				cr_assert_not_null(on.upl[w[1 + j]]);
				cr_assert_geq(on.upl[w[1 + j]][-1], l);
				for (uint32_t k = 0; k < j; k++)
					cr_assert_neq(w[1 + k], w[1 + j]);
				if (l == 1 && w[1 + j] >= N0)
					inlinked++;
			}
		}
	}
	/* the new nodes are linked to and found: a descent for a new node's own vector ends on
	 * it (or a node at distance 0) */
	cr_assert_geq(inlinked, added, "%u in-links to %u new nodes", inlinked, added);
	for (uint32_t i = 0; i < NE; i++) {
		uint32_t id = N0 + i;
		float d;

		if (!on.upl[id])
			continue;
		descend(&on.g, grow + (size_t)i * DIM, &d);
		self += d == 0.0f;
	}
	/* as often as the offline build's own upper nodes are (the greedy descent, ef = 1,
	 * does not always end on the query's own node) */
	uint32_t nseed = 0, seedself = 0;
	float *all = malloc((size_t)(N0 + NE) * DIM * sizeof(float));
	struct hnsw_index *full;
	struct up fu = { 0 };

	cr_assert_not_null(all);
	memcpy(all, seed, (size_t)N0 * DIM * sizeof(float));
	memcpy(all + (size_t)N0 * DIM, grow, (size_t)NE * DIM * sizeof(float));
	full = hnsw_build(&p, all, N0 + NE, 1, NULL, NULL, err, sizeof(err));
	cr_assert_not_null(full, "%s", err);
	from_seed(&fu, full, N0 + NE);
	for (uint32_t id = 0; id < N0 + NE; id++) {
		float d;

		if (!fu.upl[id])
			continue;
		nseed++;
		descend(&fu.g, fu.uvec[id], &d);
		seedself += d == 0.0f;
	}
	up_free(&fu);
	hnsw_free(full);
	free(all);
	cr_assert_geq((double)self / added, (double)seedself / nseed - 0.05,
		      "%u of %u new upper nodes found by descent; offline build of the same rows %u of %u", self, added,
		      seedself, nseed);
	/* queries from the grown distribution: level 0 is entered nearer to them */
	for (uint32_t i = 0; i < 500; i++) {
		float a, b;

		descend(&on.g, qs + (size_t)i * DIM, &a);
		descend(&off.g, qs + (size_t)i * DIM, &b);
		don += a;
		doff += b;
	}
	cr_assert_lt(don, doff, "mean entry distance %.3f online, %.3f seed only", don / 500,
		     doff / 500);
	cr_log_info("%u upper nodes added, %u found by descent (an offline build of the same rows: %u of %u); mean "
		    "level-0 entry distance %.3f online, %.3f seed only\n", added, self, seedself,
		    nseed, don / 500, doff / 500);

	/* bad arguments */
	struct hnsw_upper_plan plan;
	uint32_t known = idx->entry;

	cr_assert_eq(hnsw_upper_plan(&on.g, s, known, 1, grow, &plan), -EINVAL);
	cr_assert_eq(hnsw_upper_plan(&on.g, s, N0 + NE, 1, grow, &plan), -EINVAL);
	for (uint32_t id = N0; id < N0 + NE; id++) {
		if (on.upl[id])
			continue;
		cr_assert_eq(hnsw_upper_plan(&on.g, s, id, 0, grow, &plan), -EINVAL);
		cr_assert_eq(hnsw_upper_plan(&on.g, s, id, (uint32_t)idx->max_level + 1, grow,
					     &plan), -EINVAL);
		/* a corrupt list: the entry's top list names an id out of range */
		uint32_t *w = on.upl[idx->entry] + (size_t)(idx->max_level - 1) *
			      hnsw_up_list_words(GM);
		uint32_t keep0 = w[0], keep1 = w[1];

		w[0] = keep0 ? keep0 : 1;
		w[1] = N0 + NE + 5;
		cr_assert_eq(hnsw_upper_plan(&on.g, s, id, 1, grow, &plan), -EIO);
		w[0] = keep0;
		w[1] = keep1;
		break;
	}
	hnsw_upper_scratch_free(s);
	up_free(&on);
	up_free(&off);
	hnsw_free(idx);
	free(seed);
	free(grow);
	free(qs);
}
