/* hnsw_upq.h: the descent of the upper levels (Algorithm 5's first loop) on SQ8 codes of
 * the upper-level nodes' vectors (quant/sq8.h), one dense array of (nodes of level >= 1) x
 * vdim bytes. With neighbour codes the descent only chooses the level-0 entry points, whose
 * exact scores the level-0 search computes when it expands them, so the descent needs no
 * exact distance and reads a quarter of the bytes from memory that fits in cache. Local
 * search (hnsw_search.c) and the resumable query (hnsw_query.c) run these functions, so a
 * remote query descends exactly as the local one.
 *
 * The descent is greedy (ef = 1, as in the paper and hnswlib) down to level 2; level 1 is
 * searched with SEARCH-LAYER (Algorithm 2) at ef = ef_upper (hnsw_src.ef_upper) when that
 * is above 1, and its best ceil(ef_upper / 4) nodes all seed level 0. Level 1 is local to
 * a compute node, so the wider search costs CPU there but no READ, and it keeps a query
 * from starting level 0 in the wrong cluster of a clustered set, where the level-0 search
 * wanders far (hundreds of READs) and often finds none of the true neighbours.
 *
 * Built deterministically from the stored vectors (the same floats on the compute node,
 * from the index metadata's upper vectors, and locally, from the records). Read-only once
 * built, but for hnsw_upq_add (online upper levels). Used by common/hnsw and the compute node's index view (cn/engine/dindex.c). */
#ifndef DM_HNSW_UPQ_H
#define DM_HNSW_UPQ_H

#include "hnsw.h"
#include "hnsw_idset.h"
#include "hnsw_pool.h"
#include "quant/sq8.h"

#define HNSW_UPQ_NONE UINT32_MAX

struct hnsw_upq {
	struct dm_sq8 sq;
	dm_sq8_fn score;
	uint32_t n, nup, vdim;
	uint32_t cap_rows;     /* rows codes has room for (>= nup) */
	uint32_t *slot;        /* n: row of a node in codes, HNSW_UPQ_NONE below level 1 */
	uint8_t *codes;        /* nup x vdim */
};

/* Codes of every node id < n for which vec(arg, id) is non-NULL (its stored vector, vdim
 * floats). NULL + errno (ENOMEM, EINVAL for a non-finite value). */
struct hnsw_upq *hnsw_upq_build(uint32_t n, uint32_t vdim, enum dm_metric m,
				const float *(*vec)(void *arg, uint32_t id), void *arg);
void hnsw_upq_free(struct hnsw_upq *u);
/* Online upper levels (hnsw_upper.h): room for ids below n (new ones have no code), and the
 * code of node id (< u->n, without one yet) from its stored vector v, with the quantizer
 * trained at the build (values outside its range are clamped). codes may move: callers
 * hold off readers. 0, -EINVAL (id out of range or already coded), -ENOMEM. */
int hnsw_upq_reserve_ids(struct hnsw_upq *u, uint32_t n);
int hnsw_upq_add(struct hnsw_upq *u, uint32_t id, const float *v);

/* Floats of the per-query buffer hnsw_upq_descend needs. */
static inline size_t hnsw_upq_aux_len(const struct hnsw_upq *u)
{
	return dm_sq8_aux_len(u->vdim);
}

/* Greedy descent from *cur at level top down to level bottom (>= 1) for the prepared query
 * aux (dm_sq8_query on the stored-vector query); *cur ends as the closest node found on
 * level bottom and *curd as its SQ8 score (with top < bottom: *cur and its score). hops
 * counts steps, evals SQ8 scores. 0, or -EIO when a list names a node without a code (none
 * below level 1) or out of range (a corrupt upper area). */
static inline int hnsw_upq_descend(const struct hnsw_upq *u, const float *aux,
				   uint32_t *const *upl, uint32_t M, int top, int bottom,
				   uint32_t *cur, float *curd, uint64_t *hops, uint64_t *evals)
{
	uint32_t vd = u->vdim, c = *cur, s = c < u->n ? u->slot[c] : HNSW_UPQ_NONE;

	if (s == HNSW_UPQ_NONE)
		return -EIO;
	float cd = u->score(aux, u->codes + (size_t)s * vd, vd);

	(*evals)++;
	for (int l = top; l >= bottom; l--) {
		bool changed = true;

		while (changed) {
			const uint32_t *w = upl[c] + (size_t)(l - 1) * hnsw_up_list_words(M);
			uint32_t cnt = DM_MIN(w[0], M), best = c;

			changed = false;
			(*hops)++;
			for (uint32_t j = 0; j < cnt; j++) {
				uint32_t v = w[1 + j];

				s = v < u->n ? u->slot[v] : HNSW_UPQ_NONE;
				if (dm_unlikely(s == HNSW_UPQ_NONE))
					return -EIO;
				__builtin_prefetch(u->codes + (size_t)s * vd);
			}
			for (uint32_t j = 0; j < cnt; j++) {
				uint32_t v = w[1 + j];
				float d = u->score(aux, u->codes + (size_t)u->slot[v] * vd, vd);

				(*evals)++;
				if (d < cd) {
					cd = d;
					best = v;
					changed = true;
				}
			}
			c = best;
		}
	}
	*cur = c;
	*curd = cd;
	return 0;
}

/* Level-0 seeds the level-1 search hands over at most (ef_upper 64 and above). */
#define HNSW_UP_MAX_SEEDS 16u

/* Seeds of level 0 for ef_upper (> 1), at most ef of them. */
static inline uint32_t hnsw_up_seeds(uint32_t ef_upper, uint32_t ef)
{
	uint32_t n = (ef_upper + 3) / 4;

	return DM_MIN(DM_MIN(n, HNSW_UP_MAX_SEEDS), DM_MAX(ef, 1u));
}

/* Scratch of one level-1 search (one per searcher or query; not shared between threads). */
struct hnsw_upbeam {
	struct hnsw_idset vis;
	struct hnsw_pent pool[HNSW_EF_UPPER_MAX];   /* st: expanded */
	uint32_t seed[HNSW_UP_MAX_SEEDS];   /* the result: level-0 seeds, best first */
	float seed_d[HNSW_UP_MAX_SEEDS];
	uint32_t nseed;
};

/* 0 or -ENOMEM; fini frees. */
int hnsw_upbeam_init(struct hnsw_upbeam *b);
void hnsw_upbeam_fini(struct hnsw_upbeam *b);

/* SEARCH-LAYER on level 1 with ef = ef_up (2..HNSW_EF_UPPER_MAX) from entry (SQ8 score
 * entryd, from the descent to level 2) for the prepared query aux: the best nseed
 * (1..HNSW_UP_MAX_SEEDS) nodes found, ascending by SQ8 score, into b->seed / b->seed_d and
 * their count into b->nseed (>= 1: the entry itself at worst). Ties keep the earlier found
 * first, so the result is deterministic. hops counts expansions, evals SQ8 scores. 0,
 * -EINVAL (bad ef_up or nseed), -ENOMEM, or -EIO as hnsw_upq_descend. */
int hnsw_upq_beam(const struct hnsw_upq *u, const float *aux, uint32_t *const *upl, uint32_t M,
		  uint32_t entry, float entryd, uint32_t ef_up, uint32_t nseed,
		  struct hnsw_upbeam *b, uint64_t *hops, uint64_t *evals);

#endif
