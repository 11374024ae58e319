/* test_hnsw_query.c: the resumable K-NN search (the compute node's) returns exactly what
 * the local hnsw_search returns, and never reads a record outside the batch it asked for;
 * without codes and with RaBitQ neighbour codes (beams 1, 2 and 4), where a level-0 batch
 * is the candidates being expanded; level 0 entered from the greedy descent (ef_upper 1)
 * and from the seeds of a level-1 search (ef_upper 16, 64). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "hnsw/hnsw.h"
#include "hnsw/hnsw_query.h"

#define N 4000
#define DIM 24
#define NQ 150

static float *randvecs(size_t n, unsigned seed)
{
	float *v = malloc(n * DIM * sizeof(float));

	for (size_t i = 0; i < n * DIM; i++) {
		seed = seed * 1103515245u + 12345u;
		v[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
	}
	return v;
}

/* A "remote" source: only the records of the last fetch are readable, as on the CN. */
struct strict_src {
	struct hnsw_src s;
	const struct hnsw_index *idx;
	uint32_t ids[1024];
	uint8_t *recs;
	uint32_t n;
	uint64_t batches;
};

static int strict_fetch(struct hnsw_src *s, const uint32_t *ids, size_t n)
{
	struct strict_src *ss = container_of(s, struct strict_src, s);

	cr_assert_leq(n, 1024);
	for (size_t i = 0; i < n; i++) {
		ss->ids[i] = ids[i];
		memcpy(ss->recs + i * s->rec_size, hnsw_rec(ss->idx, ids[i]), s->rec_size);
	}
	ss->n = (uint32_t)n;
	ss->batches++;
	return 0;
}

static const struct hnsw_rec_hdr *strict_get(struct hnsw_src *s, uint32_t id)
{
	struct strict_src *ss = container_of(s, struct strict_src, s);

	for (uint32_t i = 0; i < ss->n; i++)
		if (ss->ids[i] == id)
			return (const struct hnsw_rec_hdr *)(ss->recs + (size_t)i * s->rec_size);
	return NULL;
}

static void check_metric(enum dm_metric m, enum hnsw_codes codes, uint32_t beam, bool upvec)
{
	struct hnsw_params p = { .dim = DIM, .metric = m, .M = 12, .ef_construction = 100,
				 .seed = 42, .block_shift = 10, .codes = codes };
	float *base = randvecs(N, 1), *qs = randvecs(NQ, 2);
	char err[256];
	struct hnsw_index *idx = hnsw_build(&p, base, N, 1, NULL, NULL, err, sizeof(err));
	struct hnsw_src local;
	struct strict_src ss;
	struct hnsw_searcher *se;
	struct hnsw_query *q;

	cr_assert_not_null(idx, "%s", err);
	hnsw_src_local(idx, &local);
	ss.s = local;
	ss.s.blocks = NULL;
	ss.s.fetch = strict_fetch;
	ss.s.get = strict_get;
	ss.idx = idx;
	ss.recs = malloc(1024 * (size_t)idx->rec_size);
	/* the compute node's local vectors of the upper-level nodes */
	const float **uv = calloc(N, sizeof(*uv));
	for (uint32_t i = 0; i < N; i++)
		if (hnsw_rec(idx, i)->level)
			uv[i] = hnsw_rec_vec(hnsw_rec(idx, i), idx->vec_off);
	if (upvec)
		ss.s.uvec = uv;
	se = hnsw_searcher_new(N, DIM);
	q = hnsw_query_new(DIM);
	cr_assert(se && q && ss.recs);

	for (int i = 0; i < NQ; i++) {
		struct dm_hit a[10], b[10], c[10];
		int na, nb, nc, rc;
		size_t ef = 16 + (size_t)(i % 5) * 30;
		/* the greedy descent, a short level-1 list and the default one */
		static const uint32_t efu[] = { 1, 16, HNSW_EF_UPPER_DEFAULT };

		local.ef_upper = ss.s.ef_upper = efu[i % 3];

		na = hnsw_search_b(&local, se, qs + (size_t)i * DIM, 10, ef, beam, a);
		cr_assert_eq(na, 10);

		/* local source: records always readable */
		cr_assert_eq(hnsw_query_start_b(q, &local, qs + (size_t)i * DIM, 10, ef, beam), 0);
		while ((rc = hnsw_query_step(q, &local)) == HNSW_Q_FETCH)
			;
		cr_assert_eq(rc, HNSW_Q_DONE);
		nb = hnsw_query_results(q, b);

		/* strict source: only the last batch readable */
		ss.batches = 0;
		cr_assert_eq(hnsw_query_start_b(q, &ss.s, qs + (size_t)i * DIM, 10, ef, beam), 0);
		while ((rc = hnsw_query_step(q, &ss.s)) == HNSW_Q_FETCH) {
			if (codes && q->level == 0)
				cr_assert_leq(q->nbatch, beam, "a level-0 batch is the expanded nodes");
			cr_assert_eq(strict_fetch(&ss.s, q->batch, q->nbatch), 0);
		}
		cr_assert_eq(rc, HNSW_Q_DONE, "query %d: %d", i, rc);
		nc = hnsw_query_results(q, c);
		cr_assert_eq(ss.batches, q->fetches);
		/* one round trip per hop, plus the entry point */
		cr_assert_leq(q->fetches, q->hops + 1);
		if (codes && upvec) {
			/* records read = level-0 nodes expanded: no READ in the upper levels */
			cr_assert_leq(q->fetched, q->hops, "query %d: %llu records read for %llu hops",
				      i, (unsigned long long)q->fetched, (unsigned long long)q->hops);
		}

		cr_assert_eq(na, nb);
		cr_assert_eq(na, nc);
		for (int j = 0; j < na; j++) {
			cr_assert_eq(a[j].id, b[j].id, "query %d rank %d (local source)", i, j);
			cr_assert_eq(a[j].id, c[j].id, "query %d rank %d (strict source)", i, j);
			cr_assert_eq(a[j].dist, c[j].dist);
		}
	}
	hnsw_query_free(q);
	hnsw_searcher_free(se);
	free(uv);
	free(ss.recs);
	hnsw_free(idx);
	free(base);
	free(qs);
}

Test(hnsw_query, same_results_as_local_search_l2) { check_metric(DM_METRIC_L2, HNSW_CODES_NONE, 1, false); }
Test(hnsw_query, same_results_as_local_search_ip) { check_metric(DM_METRIC_IP, HNSW_CODES_NONE, 1, false); }
Test(hnsw_query, same_results_as_local_search_cos) { check_metric(DM_METRIC_COS, HNSW_CODES_NONE, 1, false); }
Test(hnsw_query, codes_same_results_l2) { check_metric(DM_METRIC_L2, HNSW_CODES_RABITQ, 1, false); }
Test(hnsw_query, codes_same_results_ip) { check_metric(DM_METRIC_IP, HNSW_CODES_RABITQ, 1, false); }
Test(hnsw_query, codes_same_results_cos) { check_metric(DM_METRIC_COS, HNSW_CODES_RABITQ, 1, false); }
Test(hnsw_query, codes_same_results_beam2) { check_metric(DM_METRIC_L2, HNSW_CODES_RABITQ, 2, true); }
Test(hnsw_query, codes_same_results_beam4) { check_metric(DM_METRIC_L2, HNSW_CODES_RABITQ, 4, true); }
Test(hnsw_query, codes_upper_vectors_l2) { check_metric(DM_METRIC_L2, HNSW_CODES_RABITQ, 1, true); }
Test(hnsw_query, codes_upper_vectors_cos) { check_metric(DM_METRIC_COS, HNSW_CODES_RABITQ, 1, true); }
Test(hnsw_query, upper_vectors_nocodes) { check_metric(DM_METRIC_L2, HNSW_CODES_NONE, 1, true); }

Test(hnsw_query, bad_arguments)
{
	struct hnsw_query *q = hnsw_query_new(4);
	struct hnsw_src s = { .dim = 5 };
	float v[5] = { 0 };

	cr_assert_eq(hnsw_query_start(q, &s, v, 10, 10), -EINVAL);
	s.dim = 4;
	cr_assert_eq(hnsw_query_start(q, &s, v, 0, 10), -EINVAL);
	s.metric = DM_METRIC_COS;
	s.M = 4;
	cr_assert_eq(hnsw_query_start(q, &s, v, 1, 10), -EINVAL, "zero vector under cos");
	hnsw_query_free(q);
}
