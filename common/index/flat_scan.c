/* flat_scan.c: exact scans of a flat index: each fragment (or a CN's share of them) is
 * scanned with the SIMD distance kernels for one query, or one sgemm for a batch of
 * queries, and the filter runs only on rows that would enter the partial top-k. */
#include "flat_int.h"

#include <math.h>
#include <stdlib.h>

/* Offer row (f, r) with distance d to topk t if it passes the filter. The filter runs only
 * for rows that would enter the heap (rows are scanned in ascending id order, so a tie
 * with the bound loses and can be skipped). */
static inline void offer(struct dm_topk *t, const struct flat_frag *f, uint32_t r, uint64_t id,
			 float d, flat_match_fn match, void *mctx)
{
	if (t->n == t->k && !(d < dm_topk_bound(t)))
		return;
	if (mctx && !match(mctx, f->meta[r] + f->meta_len[r], f->fmeta_len[r]))
		return;
	dm_topk_push(t, d, id);
}

int flat_search(struct flat_index *ix, const struct flat_scan *sc, struct dm_hit *out,
		size_t *nout)
{
	uint32_t dim = ix->info.dim;
	enum dm_metric m = ix->info.metric;
	struct dm_topk **tk;
	float *dist = NULL, *qn = NULL;
	int rc = 0;

	if (!sc || !sc->q || !sc->nq || !sc->k || !out || !nout ||
	    (sc->share_count && sc->share_index >= sc->share_count))
		return -EINVAL;
	tk = calloc(sc->nq, sizeof(*tk));
	qn = malloc(sc->nq * sizeof(float));
	if (!tk || !qn) {
		rc = -ENOMEM;
		goto err_free;
	}
	for (size_t i = 0; i < sc->nq; i++) {
		tk[i] = dm_topk_new(sc->k);
		if (!tk[i]) {
			rc = -ENOMEM;
			goto err_free;
		}
		qn[i] = sqrtf(dm_dot(sc->q + i * dim, sc->q + i * dim, dim));
	}
	if (sc->nq > 1) {
		dist = malloc(sc->nq * (size_t)ix->frag_rows * sizeof(float));
		if (!dist) {
			rc = -ENOMEM;
			goto err_free;
		}
	}

	pthread_rwlock_rdlock(&ix->rw);
	for (size_t fi = 0; fi < ix->nfrags; fi++) {
		const struct flat_frag *f = ix->frags[fi];
		uint64_t base = (uint64_t)fi * ix->frag_rows;

		if (sc->frag_sel ? !sc->frag_sel(sc->frag_ctx, fi) :
		    (sc->share_count && fi % sc->share_count != sc->share_index))
			continue;
		if (sc->scoped && f->scope != sc->scope)
			continue;       /* another scope's fragment (flat.h "Scoped indexes") */
		if (sc->nq == 1) {
			const float *q = sc->q;
			void *mctx = sc->match && sc->match_ctx ? sc->match_ctx[0] : NULL;

			for (uint32_t r = 0; r < f->n; r++) {
				const float *v = f->vec + (size_t)r * dim;
				float d;

				if (f->dead[r])
					continue;
				if (m == DM_METRIC_L2) {
					d = dm_l2sq(q, v, dim);
				} else if (m == DM_METRIC_IP) {
					d = -dm_dot(q, v, dim);
				} else {
					float den = qn[0] * sqrtf(f->norm2[r]);

					d = den > 0 ? 1.0f - dm_dot(q, v, dim) / den : 1.0f;
				}
				offer(tk[0], f, r, base + r, d, sc->match, mctx);
			}
			continue;
		}
		/* Several queries: one sgemm for the fragment, then the same selection. */
		dm_distance_batch(m, sc->q, sc->nq, f->vec, f->n, dim, f->norm2, dist);
		for (size_t i = 0; i < sc->nq; i++) {
			void *mctx = sc->match && sc->match_ctx ? sc->match_ctx[i] : NULL;
			const float *drow = dist + i * f->n;

			for (uint32_t r = 0; r < f->n; r++) {
				float d = drow[r];

				if (f->dead[r])
					continue;
				if (m == DM_METRIC_L2 && d < 0)
					d = 0;     /* sgemm rounding */
				offer(tk[i], f, r, base + r, d, sc->match, mctx);
			}
		}
	}
	pthread_rwlock_unlock(&ix->rw);
	for (size_t i = 0; i < sc->nq; i++)
		nout[i] = dm_topk_drain(tk[i], out + i * sc->k);
err_free:
	if (tk)
		for (size_t i = 0; i < sc->nq; i++)
			dm_topk_free(tk[i]);
	free(tk);
	free(qn);
	free(dist);
	return rc;
}
