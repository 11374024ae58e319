/* hnsw_query.h: K-NN-SEARCH (Algorithm 5, with SEARCH-LAYER, Algorithm 2, on level 0) as an
 * explicit, resumable state machine, for readers whose records arrive asynchronously: the
 * compute node keeps many queries in flight per worker thread, and each query stops
 * whenever it needs records, handing out the whole batch of ids one expansion needs (all
 * unvisited neighbours of the expanded candidate: one doorbell of READs), and resumes when
 * they are available through hnsw_get(src, id).
 *
 * It visits nodes in exactly the order hnsw_search does on the same index (same heaps, same
 * comparisons), so a query answered remotely returns the ids a local search returns; a test
 * checks this. Unlike hnsw_search it never rereads a record it has scored: it keeps the
 * level-0 neighbour list of every node that entered the candidate queue, because a remote
 * reader only guarantees the records of the last batch.
 *
 * With neighbour codes (src->quant), level 0 is the pool search of hnsw_l0.h: a batch is
 * the one candidate to expand (or the best `beam` ones: one doorbell for b records), whose
 * record gives its exact score and the estimates of all its neighbours; so the READs of a
 * query are its expansions (plus the upper-level descent).
 */
#ifndef DM_HNSW_QUERY_H
#define DM_HNSW_QUERY_H

#include "hnsw.h"
#include "hnsw_idset.h"
#include "hnsw_upq.h"

enum hnsw_q_status {
	HNSW_Q_FETCH = 1,   /* make the records of q->batch[0 .. q->nbatch) readable, step again */
	HNSW_Q_DONE = 2,    /* results ready: hnsw_query_results */
};

struct hnsw_qcand {
	float d;
	uint32_t id;
	uint32_t off;       /* neighbour list in the arena */
};

struct hnsw_query {
	/* parameters */
	uint32_t dim, M, n, k, ef;
	enum dm_metric metric;
	hnsw_kernel_fn kern;
	float *q;                 /* the query (normalised for cos) */
	/* state */
	int state, level;
	uint32_t cur;
	float curd;
	uint32_t cur_off;         /* neighbour list of cur in the arena */
	struct hnsw_qcand *cand, *res;   /* min-heap of candidates, max-heap of results */
	uint32_t ncand, nres, cap_cand, cap_res;
	struct hnsw_idset vis;    /* visited set (level 0) */
	uint32_t *arena;          /* [n0, ids...] lists */
	size_t arena_len, arena_cap;
	/* the batch to fetch */
	uint32_t *batch;
	uint32_t nbatch, batch_cap;
	/* neighbour codes */
	const struct hnsw_quant *quant;
	struct hnsw_l0 *l0;       /* level-0 pool search state */
	float *qrot;              /* rotated query (vdim floats) */
	float *upaux;             /* the query prepared for the SQ8 upper-level descent */
	struct hnsw_upbeam *up;   /* level-1 search on SQ8 codes; up->nseed > 1: its level-0
				     seeds besides cur (0 when the search did not run) */
	uint32_t vdim, vec_off, qrot_cap, beam, upaux_cap;
	/* counters of the last query: hops = expanded nodes (upper levels included) */
	uint64_t hops, fetches, fetched, dist_evals, est_evals;
};

/* Allocate reusable query state for an index of dim dimensions (NULL + errno). */
struct hnsw_query *hnsw_query_new(uint32_t dim);
void hnsw_query_free(struct hnsw_query *q);

/* Start a query on src: 0 or -errno (-EINVAL for a zero vector under cos, or dim mismatch).
 * Counters are reset. Follow with hnsw_query_step. */
int hnsw_query_start(struct hnsw_query *q, const struct hnsw_src *src, const float *vec,
		     size_t k, size_t ef);
/* The same with beam b (1..64): candidates expanded per fetch on level 0 with codes. */
int hnsw_query_start_b(struct hnsw_query *q, const struct hnsw_src *src, const float *vec,
		       size_t k, size_t ef, uint32_t b);

/* Run until records are needed (HNSW_Q_FETCH) or the search is over (HNSW_Q_DONE);
 * -EIO when a record of the batch is not readable, -ENOMEM. */
int hnsw_query_step(struct hnsw_query *q, struct hnsw_src *src);

/* The k best hits, ascending; returns their number. Only after HNSW_Q_DONE. */
int hnsw_query_results(struct hnsw_query *q, struct dm_hit *out);

#endif
