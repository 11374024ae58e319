/* test_hnsw_upbeam.c: the level-1 search on SQ8 codes that chooses level 0's entry points
 * (common/hnsw/hnsw_upq.h, hsrc.ef_upper).
 *   - hnsw_upq_beam with a list as long as level 1 returns the level-1 nodes of the best
 *     SQ8 scores (against scoring every level-1 node), ascending, and the same on a second
 *     run; its bounds are checked (-EINVAL);
 *   - on a clustered set (256 well-separated clusters, a sparse graph: M = 6), the search
 *     with ef_upper = 16 has recall >= 0.9 at ef 16 against brute force, at least the
 *     recall of the greedy descent (ef_upper = 1, hnswlib's), fewer queries that find none
 *     of their neighbours, and a lower worst case of level-0 expansions (the READs of a
 *     remote query); ef_upper = 1 is the greedy descent: no more upper hops than levels
 *     crossed plus steps, and the answers equal those of a source that never set it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "distance.h"
#include "hnsw/hnsw.h"
#include "hnsw/hnsw_upq.h"
#include "util/dm_hash.h"

enum { DIM = 24, CLUSTERS = 256, PER = 60, N = CLUSTERS * PER, NQ = 400, K = 10 };

static float gauss(struct dm_rng *r)
{
	double u1 = ((double)(dm_rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
	double u2 = ((double)(dm_rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
	return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* N base points (PER per cluster) and NQ queries drawn from the same clusters. */
static void mixture(float *base, float *q)
{
	static float cent[CLUSTERS * DIM];
	struct dm_rng r;

	dm_rng_seed(&r, 2026);
	for (size_t i = 0; i < (size_t)CLUSTERS * DIM; i++)
		cent[i] = 6.0f * gauss(&r);
	for (uint32_t i = 0; i < N; i++)
		for (uint32_t j = 0; j < DIM; j++)
			base[(size_t)i * DIM + j] = cent[(size_t)(i % CLUSTERS) * DIM + j] + gauss(&r);
	for (uint32_t i = 0; i < NQ; i++) {
		uint32_t c = (uint32_t)(dm_rng_next(&r) % CLUSTERS);

		for (uint32_t j = 0; j < DIM; j++)
			q[(size_t)i * DIM + j] = cent[(size_t)c * DIM + j] + gauss(&r);
	}
}

static void brute(const float *base, const float *q, uint32_t *ids)
{
	float best[K];

	for (int j = 0; j < K; j++)
		best[j] = INFINITY, ids[j] = UINT32_MAX;
	for (uint32_t v = 0; v < N; v++) {
		float d = dm_l2sq(q, base + (size_t)v * DIM, DIM);
		int j = K - 1;

		if (d >= best[j])
			continue;
		while (j > 0 && best[j - 1] > d) {
			best[j] = best[j - 1];
			ids[j] = ids[j - 1];
			j--;
		}
		best[j] = d;
		ids[j] = v;
	}
}

struct run {
	double recall;
	unsigned lost;            /* queries with none of their K neighbours */
	uint64_t worst_l0;        /* most level-0 expansions (exact distances) of one query */
	uint32_t first[NQ][K];
};

static void search_all(struct hnsw_src *src, struct hnsw_searcher *s, const float *qs,
		       uint32_t (*gt)[K], uint32_t ef, struct run *out)
{
	unsigned found = 0;

	out->lost = 0;
	out->worst_l0 = 0;
	for (int i = 0; i < NQ; i++) {
		struct dm_hit hits[K];
		uint64_t d0 = src->dist_evals;
		unsigned f = 0;

		cr_assert_eq(hnsw_search(src, s, qs + (size_t)i * DIM, K, ef, hits), K);
		if (src->dist_evals - d0 > out->worst_l0)
			out->worst_l0 = src->dist_evals - d0;
		for (int a = 0; a < K; a++) {
			out->first[i][a] = hits[a].id;
			for (int b = 0; b < K; b++)
				f += hits[a].id == gt[i][b];
		}
		found += f;
		out->lost += f == 0;
	}
	out->recall = (double)found / (NQ * K);
}

Test(upbeam, clustered_set_recall_and_worst_case, .timeout = 120)
{
	static float base[(size_t)N * DIM], qs[(size_t)NQ * DIM];
	static uint32_t gt[NQ][K];
	static struct run greedy, beam, unset;
	struct hnsw_params p = { .dim = DIM, .metric = DM_METRIC_L2, .M = 6, .ef_construction = 40,
				 .seed = 5, .block_shift = 10, .codes = HNSW_CODES_RABITQ };
	char err[256];

	mixture(base, qs);
	for (int i = 0; i < NQ; i++)
		brute(base, qs + (size_t)i * DIM, gt[i]);
	struct hnsw_index *idx = hnsw_build(&p, base, N, 1, NULL, NULL, err, sizeof(err));
	cr_assert_not_null(idx, "%s", err);
	cr_assert_not_null(idx->upq);
	struct hnsw_searcher *s = hnsw_searcher_new(N, DIM);
	struct hnsw_src src;

	cr_assert_not_null(s);
	hnsw_src_local(idx, &src);
	cr_assert_eq(src.ef_upper, HNSW_EF_UPPER_DEFAULT, "local sources take the default");
	src.ef_upper = 1;
	search_all(&src, s, qs, gt, 16, &greedy);
	src.ef_upper = 0;
	search_all(&src, s, qs, gt, 16, &unset);
	src.ef_upper = 16;
	search_all(&src, s, qs, gt, 16, &beam);
	cr_log_info("ef 16: greedy descent recall %.4f, %u lost, worst %llu level-0 expansions; "
		    "ef_upper 16: recall %.4f, %u lost, worst %llu",
		    greedy.recall, greedy.lost, (unsigned long long)greedy.worst_l0, beam.recall,
		    beam.lost, (unsigned long long)beam.worst_l0);
	cr_assert(memcmp(greedy.first, unset.first, sizeof(greedy.first)) == 0,
		  "ef_upper 0 and 1 are both the greedy descent");
	cr_assert_geq(beam.recall, 0.9);
	cr_assert_geq(beam.recall, greedy.recall);
	cr_assert_leq(beam.lost, greedy.lost);
	cr_assert_leq(beam.worst_l0, greedy.worst_l0);
	hnsw_searcher_free(s);
	hnsw_free(idx);
}

/* Every level-1 node's SQ8 score for aux, and the nseed best (ids ascending by score, ties
 * by id) by scoring them all; returns the number of level-1 nodes. */
static uint32_t level1_best(const struct hnsw_index *idx, const float *aux, uint32_t nseed,
			    uint32_t *ids, float *ds)
{
	const struct hnsw_upq *u = idx->upq;
	uint32_t m = 0, all = 0;

	for (uint32_t v = 0; v < idx->n; v++) {
		if (!idx->upl[v])
			continue;
		float d = u->score(aux, u->codes + (size_t)u->slot[v] * u->vdim, u->vdim);
		uint32_t j = m < nseed ? m++ : nseed;

		all++;

		if (j == nseed && d >= ds[nseed - 1])
			continue;
		if (j == nseed)
			j = nseed - 1;
		while (j > 0 && ds[j - 1] > d) {
			ds[j] = ds[j - 1];
			ids[j] = ids[j - 1];
			j--;
		}
		ds[j] = d;
		ids[j] = v;
	}
	return all;
}

Test(upbeam, full_list_finds_the_best_level1_nodes)
{
	enum { SMALL = 1500, NS = 8 };
	static float base[(size_t)N * DIM], qs[(size_t)NQ * DIM];
	struct hnsw_params p = { .dim = DIM, .metric = DM_METRIC_L2, .M = 16, .ef_construction = 100,
				 .seed = 9, .block_shift = 10, .codes = HNSW_CODES_RABITQ };
	char err[256];
	struct hnsw_upbeam b;
	uint32_t lvl1 = 0;

	mixture(base, qs);
	struct hnsw_index *idx = hnsw_build(&p, base, SMALL, 1, NULL, NULL, err, sizeof(err));
	cr_assert_not_null(idx, "%s", err);
	for (uint32_t v = 0; v < idx->n; v++)
		lvl1 += idx->upl[v] != NULL;
	cr_assert(lvl1 > NS && lvl1 <= HNSW_EF_UPPER_MAX, "%u level-1 nodes", lvl1);
	cr_assert_eq(hnsw_upbeam_init(&b), 0);
	float *aux = malloc(hnsw_upq_aux_len(idx->upq) * sizeof(float));
	cr_assert_not_null(aux);
	for (int i = 0; i < 50; i++) {
		/* the level-1 search runs on the stored (rotated) vectors: a query near node i */
		const float *v = hnsw_rec_vec(hnsw_rec(idx, (uint32_t)i * 7), idx->vec_off);
		uint32_t want[NS], got[NS], e = idx->entry;
		float wd[NS], gd[NS], ed;
		uint64_t hops = 0, evals = 0;

		dm_sq8_query(&idx->upq->sq, v, aux);
		cr_assert_eq(hnsw_upq_descend(idx->upq, aux, idx->upl, idx->p.M, idx->max_level, 2,
					      &e, &ed, &hops, &evals), 0);
		cr_assert_eq(hnsw_upq_beam(idx->upq, aux, idx->upl, idx->p.M, e, ed,
					   HNSW_EF_UPPER_MAX, NS, &b, &hops, &evals), 0);
		cr_assert_eq(b.nseed, NS);
		memcpy(got, b.seed, sizeof(got));
		memcpy(gd, b.seed_d, sizeof(gd));
		cr_assert_eq(level1_best(idx, aux, NS, want, wd), lvl1);
		for (int j = 0; j < NS; j++) {
			cr_assert_eq(gd[j], wd[j], "query %d rank %d: score %g, best %g", i, j, gd[j],
				     wd[j]);
			if (j)
				cr_assert_leq(gd[j - 1], gd[j], "ascending");
		}
		/* deterministic */
		cr_assert_eq(hnsw_upq_beam(idx->upq, aux, idx->upl, idx->p.M, e, ed, 16, NS, &b,
					   &hops, &evals), 0);
		uint32_t again[NS];
		uint32_t n1 = b.nseed;
		memcpy(again, b.seed, sizeof(again));
		cr_assert_eq(hnsw_upq_beam(idx->upq, aux, idx->upl, idx->p.M, e, ed, 16, NS, &b,
					   &hops, &evals), 0);
		cr_assert_eq(b.nseed, n1);
		cr_assert(memcmp(again, b.seed, n1 * sizeof(uint32_t)) == 0);
	}
	float ed = 0;
	uint64_t h = 0, ev = 0;
	cr_assert_eq(hnsw_upq_beam(idx->upq, aux, idx->upl, idx->p.M, idx->entry, ed, 1, 1, &b, &h,
				   &ev), -EINVAL);
	cr_assert_eq(hnsw_upq_beam(idx->upq, aux, idx->upl, idx->p.M, idx->entry, ed,
				   HNSW_EF_UPPER_MAX + 1, 1, &b, &h, &ev), -EINVAL);
	cr_assert_eq(hnsw_upq_beam(idx->upq, aux, idx->upl, idx->p.M, idx->entry, ed, 16, 0, &b, &h,
				   &ev), -EINVAL);
	cr_assert_eq(hnsw_upq_beam(idx->upq, aux, idx->upl, idx->p.M, idx->entry, ed, 16,
				   HNSW_UP_MAX_SEEDS + 1, &b, &h, &ev), -EINVAL);
	cr_assert_eq(hnsw_upq_beam(idx->upq, aux, idx->upl, idx->p.M, idx->n, ed, 16, 1, &b, &h,
				   &ev), -EIO, "an entry out of range");
	free(aux);
	hnsw_upbeam_fini(&b);
	hnsw_free(idx);
}
