/* hnsw_upq.h: the greedy descent of the upper levels (Algorithm 5's first loop, ef = 1) on
 * SQ8 codes of the upper-level nodes' vectors (quant/sq8.h), one dense array of
 * (nodes of level >= 1) x vdim bytes. With neighbour codes the descent only chooses the
 * level-0 entry point, whose exact score the level-0 search computes when it expands it, so
 * the descent needs no exact distance and reads a quarter of the bytes from memory that
 * fits in cache. Local search (hnsw_search.c) and the resumable query (hnsw_query.c) run
 * this one function, so a remote query descends exactly as the local one.
 *
 * Built deterministically from the stored vectors (the same floats on the compute node,
 * from the index metadata's upper vectors, and locally, from the records). Read-only once
 * built, but for hnsw_upq_add (online upper levels). Used by common/hnsw and the compute node's index view (cn/engine/dindex.c). */
#ifndef DM_HNSW_UPQ_H
#define DM_HNSW_UPQ_H

#include "hnsw.h"
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

/* Greedy descent from *cur at level top down to level 1 for the prepared query aux
 * (dm_sq8_query on the stored-vector query); *cur ends as level 0's entry point and *curd
 * as its SQ8 score. hops counts steps, evals SQ8 scores. 0, or -EIO when a list names a
 * node without a code (none below level 1) or out of range (a corrupt upper area). */
static inline int hnsw_upq_descend(const struct hnsw_upq *u, const float *aux,
				   uint32_t *const *upl, uint32_t M, int top, uint32_t *cur,
				   float *curd, uint64_t *hops, uint64_t *evals)
{
	uint32_t vd = u->vdim, c = *cur, s = c < u->n ? u->slot[c] : HNSW_UPQ_NONE;

	if (s == HNSW_UPQ_NONE)
		return -EIO;
	float cd = u->score(aux, u->codes + (size_t)s * vd, vd);

	(*evals)++;
	for (int l = top; l >= 1; l--) {
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

#endif
