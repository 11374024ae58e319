/* test_sq8.c: the 8-bit scalar quantizer (common/quant/sq8.h) and the upper-level descent
 * built on it (common/hnsw/hnsw_upq.h).
 *   - every decoded coordinate of a training vector is within step/2 of the original, and
 *     values outside the trained range clamp to it;
 *   - the l2 and ip scores equal the float kernels on the decoded vector (within 1e-4
 *     relative), at every ISA this CPU has, and every ISA gives the same score within the
 *     float rounding of its summation order; dimensions 1..67 and 784 (masked tails);
 *   - training refuses non-finite values and a zero dimension; zero vectors train;
 *   - an index with codes descends its upper levels on SQ8 codes (no exact distance until
 *     level 0), recall >= 0.95 at ef 64 against brute force and within 0.01 of the same
 *     search with the exact descent. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "distance.h"
#include "hnsw/hnsw.h"
#include "quant/sq8.h"
#include "util/dm_hash.h"

static float frand(struct dm_rng *r)
{
	return (float)((double)(dm_rng_next(r) >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void fill(struct dm_rng *r, float *v, size_t n, float scale, float off)
{
	for (size_t i = 0; i < n; i++)
		v[i] = frand(r) * scale + off;
}

Test(sq8, decode_error_within_half_step)
{
	enum { N = 200, D = 97 };
	static float data[N * D];
	const float *vec[N];
	struct dm_rng r;
	struct dm_sq8 sq;
	uint8_t code[D];
	float back[D];

	dm_rng_seed(&r, 7);
	for (int i = 0; i < N; i++) {
		/* a different range per dimension */
		for (int j = 0; j < D; j++)
			data[i * D + j] = frand(&r) * (1.0f + (float)j) + (float)j * 0.5f;
		vec[i] = data + i * D;
	}
	cr_assert_eq(dm_sq8_train(&sq, DM_METRIC_L2, D, vec, N), 0);
	for (int i = 0; i < N; i++) {
		dm_sq8_encode(&sq, vec[i], code);
		dm_sq8_decode(&sq, code, back);
		for (int j = 0; j < D; j++)
			cr_assert_leq(fabsf(back[j] - vec[i][j]), sq.step[j] * 0.5f * 1.001f + 1e-6f,
				      "vector %d dim %d: %g vs %g (step %g)", i, j, back[j],
				      vec[i][j], sq.step[j]);
	}
	/* out of range: clamped to the trained ends */
	float out[D];
	for (int j = 0; j < D; j++)
		out[j] = j % 2 ? 1e6f : -1e6f;
	dm_sq8_encode(&sq, out, code);
	for (int j = 0; j < D; j++)
		cr_assert_eq(code[j], j % 2 ? 255 : 0);
	dm_sq8_fini(&sq);
}

Test(sq8, bad_training_input)
{
	float v[4] = { 1, 2, NAN, 4 }, w[4] = { 0 };
	const float *vec[2] = { w, v };
	struct dm_sq8 sq;

	cr_assert_eq(dm_sq8_train(&sq, DM_METRIC_L2, 4, vec, 2), -EINVAL);
	cr_assert_eq(dm_sq8_train(&sq, DM_METRIC_L2, 0, vec, 1), -EINVAL);
	v[2] = INFINITY;
	cr_assert_eq(dm_sq8_train(&sq, DM_METRIC_IP, 4, vec, 2), -EINVAL);
	/* all-zero data: every code 0, every score exact */
	cr_assert_eq(dm_sq8_train(&sq, DM_METRIC_L2, 4, vec, 1), 0);
	uint8_t c[4];
	float q[4] = { 1, 2, 3, 4 }, aux[9];
	dm_sq8_encode(&sq, w, c);
	dm_sq8_query(&sq, q, aux);
	cr_assert_float_eq(dm_sq8_kernel(&sq)(aux, c, 4), 30.0f, 1e-5);
	dm_sq8_fini(&sq);
	/* no training vectors at all */
	cr_assert_eq(dm_sq8_train(&sq, DM_METRIC_IP, 4, vec, 0), 0);
	dm_sq8_fini(&sq);
}

/* Scores of every ISA against the float kernels on the decoded vectors. */
static void check_scores(enum dm_metric m, uint32_t D)
{
	enum { N = 64 };
	float *data = malloc(sizeof(float) * N * D), *q = malloc(sizeof(float) * D);
	float *back = malloc(sizeof(float) * D), *aux = malloc(sizeof(float) * dm_sq8_aux_len(D));
	uint8_t *codes = malloc((size_t)N * D);
	const float *vec[N];
	const char *isas[] = { "scalar", "avx2", "avx512" }, *orig = dm_kernel_isa();
	float ref[N];
	struct dm_rng r;
	struct dm_sq8 sq;

	dm_rng_seed(&r, D * 31u + (uint32_t)m);
	for (int i = 0; i < N; i++) {
		fill(&r, data + (size_t)i * D, D, 3.0f, 0.25f);
		vec[i] = data + (size_t)i * D;
	}
	fill(&r, q, D, 3.0f, 0.0f);
	cr_assert_eq(dm_sq8_train(&sq, m, D, vec, N), 0);
	for (int i = 0; i < N; i++)
		dm_sq8_encode(&sq, vec[i], codes + (size_t)i * D);
	for (int k = 0; k < 3; k++) {
		if (dm_kernel_set_isa(isas[k]) < 0)
			continue;
		dm_sq8_fn f = dm_sq8_kernel(&sq);

		dm_sq8_query(&sq, q, aux);
		for (int i = 0; i < N; i++) {
			float s = f(aux, codes + (size_t)i * D, D), want;

			dm_sq8_decode(&sq, codes + (size_t)i * D, back);
			want = m == DM_METRIC_L2 ? dm_l2sq(q, back, D) : -dm_dot(q, back, D);
			cr_assert_leq(fabsf(s - want), 1e-4f * (1.0f + fabsf(want)) + 1e-4f,
				      "%s dim %u vector %d: %g vs %g", isas[k], D, i, s, want);
			if (k == 0)
				ref[i] = s;
			else
				cr_assert_leq(fabsf(s - ref[i]), 1e-4f * (1.0f + fabsf(ref[i])),
					      "%s vs scalar dim %u", isas[k], D);
		}
	}
	cr_assert_eq(dm_kernel_set_isa(orig), 0);
	dm_sq8_fini(&sq);
	free(data);
	free(q);
	free(back);
	free(aux);
	free(codes);
}

Test(sq8, scores_match_decoded_vectors_every_isa)
{
	for (uint32_t d = 1; d <= 67; d++) {
		check_scores(DM_METRIC_L2, d);
		check_scores(DM_METRIC_IP, d);
	}
	check_scores(DM_METRIC_L2, 784);
	check_scores(DM_METRIC_IP, 784);
}

Test(sq8, upper_descent_in_search)
{
	enum { N = 4000, D = 24, NQ = 200, K = 10 };
	float *data = malloc(sizeof(float) * N * D), q[D];
	struct dm_rng r;
	char err[256];
	struct hnsw_params p = { .dim = D, .metric = DM_METRIC_L2, .M = 12, .ef_construction = 100,
				 .seed = 3, .block_shift = 10, .codes = HNSW_CODES_RABITQ };

	dm_rng_seed(&r, 11);
	fill(&r, data, (size_t)N * D, 1.0f, 0.0f);
	struct hnsw_index *idx = hnsw_build(&p, data, N, 2, NULL, NULL, err, sizeof(err));
	cr_assert_not_null(idx, "%s", err);
	cr_assert_not_null(idx->upq, "an index with codes has its upper-level codes");
	cr_assert_gt(idx->max_level, 0);
	struct hnsw_searcher *s = hnsw_searcher_new(N, D);
	struct hnsw_src src;
	struct dm_hit hits[K];
	unsigned found = 0, found_exact = 0;

	hnsw_src_local(idx, &src);
	for (int i = 0; i < NQ; i++) {
		float best[K];
		uint32_t bid[K];

		fill(&r, q, D, 1.0f, 0.0f);
		for (int j = 0; j < K; j++)
			best[j] = INFINITY, bid[j] = UINT32_MAX;
		for (uint32_t v = 0; v < N; v++) {
			float d = dm_l2sq(q, data + (size_t)v * D, D);
			int j = K - 1;

			if (d >= best[j])
				continue;
			while (j > 0 && best[j - 1] > d) {
				best[j] = best[j - 1];
				bid[j] = bid[j - 1];
				j--;
			}
			best[j] = d;
			bid[j] = v;
		}
		/* the same search without the SQ8 descent (exact upper levels), for reference */
		src.upq = NULL;
		cr_assert_eq(hnsw_search(&src, s, q, K, 64, hits), K);
		for (int a = 0; a < K; a++)
			for (int b = 0; b < K; b++)
				found_exact += hits[a].id == bid[b];
		hnsw_src_local(idx, &src);
		src.hops = src.dist_evals = src.est_evals = 0;
		int nk = hnsw_search(&src, s, q, K, 64, hits);
		cr_assert_eq(nk, K);
		/* upper levels: steps but no exact distance (one exact per level-0 expansion) */
		cr_assert_leq(src.dist_evals + (uint64_t)idx->max_level, src.hops,
			      "query %d: %llu exact distances, %llu hops", i,
			      (unsigned long long)src.dist_evals, (unsigned long long)src.hops);
		for (int a = 0; a < K; a++)
			for (int b = 0; b < K; b++)
				found += hits[a].id == bid[b];
	}
	double recall = (double)found / (NQ * K), rexact = (double)found_exact / (NQ * K);
	cr_log_info("recall@10 at ef 64: SQ8 upper descent %.4f, exact upper descent %.4f",
		    recall, rexact);
	cr_assert_geq(recall, 0.95, "recall %.4f", recall);
	cr_assert_geq(recall, rexact - 0.01, "SQ8 descent %.4f vs exact %.4f", recall, rexact);
	hnsw_searcher_free(s);
	hnsw_free(idx);
	free(data);
}
