/* cluster_util.h: helpers of the tests that start local clusters (test_cluster,
 * test_router, test_reload): shell commands, time bounds, the local search's answers. */
#ifndef DM_TESTS_CLUSTER_UTIL_H
#define DM_TESTS_CLUSTER_UTIL_H

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "hnsw/hnsw.h"
#include "vecfile.h"

/* Run a shell command (echoed to stderr); its exit status, or -1. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static int sh(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	fprintf(stderr, "+ %s\n", cmd);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* s seconds in ns, scaled by DMANN_TEST_TIME_SCALE (the soft-RoCE VM runs emulated). */
static __attribute__((unused)) uint64_t bound_s(unsigned s)
{
	const char *e = getenv("DMANN_TEST_TIME_SCALE");
	unsigned f = e ? (unsigned)atoi(e) : 1;

	return (uint64_t)s * (f ? f : 1) * 1000000000ull;
}

/* The ids (k per query) of the local search of index image `index` with ef for every
 * query of `queries`; *nq gets the query count. */
/* Ids of the local search (beam b, 1 = the plain search) of every query of a file; the index
 * must have neighbour codes when need_codes is set. */
static __attribute__((unused)) int32_t *local_search_ids_b(const char *index,
							    const char *queries, int k, int ef,
							    uint32_t beam, bool need_codes,
							    uint32_t *nq)
{
	struct dm_vecs qv;
	char err[512];
	struct hnsw_index *idx;
	struct hnsw_searcher *s;
	struct hnsw_src src;
	struct dm_hit *h = calloc((size_t)k, sizeof(*h));
	int32_t *ids;

	idx = hnsw_load(index, err, sizeof(err));
	cr_assert_not_null(idx, "%s", err);
	if (need_codes)
		cr_assert_not_null(idx->quant, "the index was built without neighbour codes");
	cr_assert_eq(dm_vecs_read(queries, DM_VF_FBIN, &qv, err, sizeof(err)), 0, "%s", err);
	hnsw_src_local(idx, &src);
	s = hnsw_searcher_new(idx->n, idx->p.dim);
	ids = calloc(qv.n * (size_t)k, sizeof(*ids));
	cr_assert(h && s && ids);
	for (uint64_t i = 0; i < qv.n; i++) {
		int n = hnsw_search_b(&src, s, (const float *)qv.data + i * qv.dim, (size_t)k,
				      (size_t)ef, beam, h);

		cr_assert_eq(n, k);
		for (int j = 0; j < k; j++)
			ids[i * (size_t)k + (size_t)j] = (int32_t)h[j].id;
	}
	*nq = (uint32_t)qv.n;
	free(h);
	hnsw_searcher_free(s);
	hnsw_free(idx);
	dm_vecs_free(&qv);
	return ids;
}

static __attribute__((unused)) int32_t *local_search_ids(const char *index, const char *queries,
							  int k, int ef, uint32_t *nq)
{
	return local_search_ids_b(index, queries, k, ef, 1, false, nq);
}

#endif
