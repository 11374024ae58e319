/* hnsw_query.c: K-NN-SEARCH (Algorithm 5) and SEARCH-LAYER (Algorithm 2) as a resumable
 * state machine; see hnsw_query.h. */
#include "hnsw_query.h"
#include "hnsw_l0.h"
#include "hnsw_upq.h"
#include "util/dm_hash.h"

#include <stdlib.h>

enum { ST_IDLE, ST_START, ST_ENTRY, ST_UPPER, ST_L0_ENTRY, ST_L0, ST_L0_SCORE, ST_C0, ST_C0_EXPAND,
       ST_DONE };

struct hnsw_query *hnsw_query_new(uint32_t dim)
{
	struct hnsw_query *q = calloc(1, sizeof(*q));

	if (!q)
		return NULL;
	q->q = malloc((size_t)(dim ? dim : 1) * sizeof(float));
	q->cap_cand = q->cap_res = 256;
	q->cand = malloc(q->cap_cand * sizeof(*q->cand));
	q->res = malloc(q->cap_res * sizeof(*q->res));
	if (hnsw_idset_init(&q->vis, 4096) < 0) {
		hnsw_query_free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->arena_cap = 1 << 16;
	q->arena = malloc(q->arena_cap * sizeof(*q->arena));
	q->batch_cap = 64;
	q->batch = malloc(q->batch_cap * sizeof(*q->batch));
	q->dim = dim;
	q->up = malloc(sizeof(*q->up));
	if (q->up && hnsw_upbeam_init(q->up) < 0) {
		free(q->up);
		q->up = NULL;
	}
	q->l0 = malloc(sizeof(*q->l0));
	if (q->l0 && hnsw_l0_init(q->l0) < 0) {
		free(q->l0);
		q->l0 = NULL;
	}
	if (!q->q || !q->cand || !q->res || !q->arena || !q->batch || !q->l0 || !q->up) {
		hnsw_query_free(q);
		errno = ENOMEM;
		return NULL;
	}
	return q;
}

void hnsw_query_free(struct hnsw_query *q)
{
	if (!q)
		return;
	free(q->q);
	free(q->cand);
	free(q->res);
	hnsw_idset_fini(&q->vis);
	free(q->arena);
	free(q->batch);
	free(q->qrot);
	free(q->upaux);
	if (q->l0)
		hnsw_l0_fini(q->l0);
	free(q->l0);
	if (q->up)
		hnsw_upbeam_fini(q->up);
	free(q->up);
	free(q);
}

/* ---- heaps: the sift rules of hnsw_int.h, so the visiting order is identical ---- */

DM_HEAP_DEFINE(minheap, struct hnsw_qcand, uint32_t, HNSW_NEARER)
DM_HEAP_DEFINE(maxheap, struct hnsw_qcand, uint32_t, HNSW_FARTHER)

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
	uint32_t c = *cap;
	void *np;

	if (need <= c)
		return 0;
	if (!c)
		c = 16;
	while (c < need)
		c *= 2;
	np = realloc(*p, (size_t)c * elem);
	if (!np)
		return -ENOMEM;
	*p = np;
	*cap = c;
	return 0;
}

/* Keep a copy of a record's level-0 neighbour list; returns its arena offset or -ENOMEM. */
static int64_t keep_nbrs(struct hnsw_query *q, const struct hnsw_rec_hdr *r)
{
	uint32_t cnt = DM_MIN(r->n0, 2 * q->M);
	size_t need = q->arena_len + 1 + cnt;
	int64_t off = (int64_t)q->arena_len;

	if (need > q->arena_cap) {
		size_t c = q->arena_cap;
		uint32_t *na;

		while (c < need)
			c *= 2;
		na = realloc(q->arena, c * sizeof(*na));
		if (!na)
			return -ENOMEM;
		q->arena = na;
		q->arena_cap = c;
	}
	q->arena[q->arena_len] = cnt;
	memcpy(q->arena + q->arena_len + 1, hnsw_rec_nbrs(r), (size_t)cnt * sizeof(uint32_t));
	q->arena_len = need;
	return off;
}

int hnsw_query_start(struct hnsw_query *q, const struct hnsw_src *src, const float *vec,
		     size_t k, size_t ef)
{
	return hnsw_query_start_b(q, src, vec, k, ef, 1);
}

int hnsw_query_start_b(struct hnsw_query *q, const struct hnsw_src *src, const float *vec,
		       size_t k, size_t ef, uint32_t b)
{
	if (src->dim != q->dim || k == 0 || k > (1u << 24) || ef > (1u << 24) || b < 1 || b > 64)
		return -EINVAL;
	q->beam = b;
	q->quant = src->quant;
	q->vdim = src->vdim;
	q->vec_off = src->vec_off;
	q->M = src->M;
	q->n = src->n;
	q->k = (uint32_t)k;
	q->ef = (uint32_t)DM_MAX(ef, k);
	if (q->metric != src->metric || !q->kern) {
		q->metric = src->metric;
		q->kern = hnsw_kernel_for(src->metric);
	}
	memcpy(q->q, vec, (size_t)q->dim * sizeof(float));
	if (src->metric == DM_METRIC_COS && dm_normalize(q->q, q->dim) < 0)
		return -EINVAL;
	if (q->quant) {
		if (grow((void **)&q->qrot, &q->qrot_cap, q->vdim, sizeof(float)))
			return -ENOMEM;
		hnsw_quant_rotate(q->quant, q->q, q->qrot);
	}
	if (grow((void **)&q->batch, &q->batch_cap, DM_MAX(2 * q->M + 1, b), sizeof(*q->batch)) ||
	    grow((void **)&q->res, &q->cap_res, q->ef + 1, sizeof(*q->res)))
		return -ENOMEM;
	hnsw_idset_clear(&q->vis);
	q->up->nseed = 0;
	q->ncand = q->nres = 0;
	q->arena_len = 0;
	q->hops = q->fetches = q->fetched = q->dist_evals = q->est_evals = 0;
	if (src->max_level < 0 || src->n == 0) {
		q->state = ST_DONE;
		return 0;
	}
	q->state = ST_START;
	q->level = src->max_level;
	q->batch[0] = src->entry;
	q->nbatch = 1;
	return 0;
}

/* Ask for the batch currently in q->batch. */
static int need(struct hnsw_query *q, int next_state)
{
	q->state = next_state;
	q->fetches++;
	q->fetched += q->nbatch;
	return HNSW_Q_FETCH;
}

/* Put the upper list of cur at q->level into the batch (ef = 1 greedy descent). */
static void upper_batch(struct hnsw_query *q, const struct hnsw_src *src)
{
	if (src->uplock)
		pthread_rwlock_rdlock(src->uplock);
	const uint32_t *w = src->upl[q->cur] + (size_t)(q->level - 1) * hnsw_up_list_words(q->M);
	uint32_t n = DM_MIN(w[0], q->M);

	memcpy(q->batch, w + 1, (size_t)n * sizeof(uint32_t));
	q->nbatch = n;
	if (src->uplock)
		pthread_rwlock_unlock(src->uplock);
}

/* The upper-level descent of ST_START under src->uplock (when set): 1 when it ran (rc in
 * *rc), 0 when the upper levels are not local (the descent READs them). */
static int upper_start(struct hnsw_query *q, struct hnsw_src *src, int *rc);

/* The query vector the kernels see: rotated with codes. */
static inline const float *qvec(const struct hnsw_query *q)
{
	return q->quant ? q->qrot : q->q;
}

static int visit_hash(void *arg, uint32_t id)
{
	return hnsw_idset_add(arg, id);
}

/* Enter level 0: the current node seeds both heaps (as in search_level0), or the pool. */
static int start_level0(struct hnsw_query *q, const struct hnsw_src *src)
{
	if (hnsw_idset_add(&q->vis, q->cur) < 0 ||
	    grow((void **)&q->cand, &q->cap_cand, 1, sizeof(*q->cand)))
		return -ENOMEM;
	if (q->quant) {
		int rc = hnsw_l0_start(q->l0, src, q->kern, q->qrot, q->k, q->ef, q->cur, q->curd);
		if (rc)
			return rc;
		/* the other seeds of the level-1 search (q->cur is the first), as hnsw_search */
		for (uint32_t i = 1; i < q->up->nseed; i++) {
			rc = hnsw_idset_add(&q->vis, q->up->seed[i]);
			if (rc < 0)
				return rc;
			if (rc)
				hnsw_l0_pool_insert(q->l0, q->up->seed_d[i], q->up->seed[i], 0);
		}
		q->state = ST_C0;
		return 0;
	}
	minheap_push(q->cand, &q->ncand, (struct hnsw_qcand){ q->curd, q->cur, q->cur_off });
	maxheap_push(q->res, &q->nres, (struct hnsw_qcand){ q->curd, q->cur, q->cur_off });
	q->state = ST_L0;
	return 0;
}

/* The whole greedy descent of the upper levels from the local upper vectors (src->uvec):
 * the same steps, scores and counters as ST_ENTRY/ST_UPPER, without a fetch. */
static int upper_local(struct hnsw_query *q, const struct hnsw_src *src)
{
	while (q->level >= 1) {
		const uint32_t *w = src->upl[q->cur] + (size_t)(q->level - 1) * hnsw_up_list_words(q->M);
		uint32_t n = DM_MIN(w[0], q->M);
		bool changed = false;

		q->hops++;
		for (uint32_t j = 0; j < n; j++) {
			const float *v = w[1 + j] < q->n ? src->uvec[w[1 + j]] : NULL;
			float d;

			if (!v)
				return -EIO;
			d = q->kern(qvec(q), v, q->vdim);
			q->dist_evals++;
			if (d < q->curd) {
				q->curd = d;
				q->cur = w[1 + j];
				changed = true;
			}
		}
		if (!changed)
			q->level--;
	}
	return 0;
}

static int upper_start(struct hnsw_query *q, struct hnsw_src *src, int *rc)
{
	uint64_t h0 = q->hops;
	int ran = 0;

	*rc = 0;
	if (q->level < 1)
		return 0;
	if (q->quant && src->upq &&
	    grow((void **)&q->upaux, &q->upaux_cap, (uint32_t)hnsw_upq_aux_len(src->upq),
		 sizeof(float))) {
		*rc = -ENOMEM;
		return 1;
	}
	if (src->uplock)
		pthread_rwlock_rdlock(src->uplock);
	if (q->quant && src->upq) {
		/* Upper levels on SQ8 codes (hnsw_upq.h), as the local search. */
		const struct hnsw_upq *u = src->upq;

		dm_sq8_query(&u->sq, q->qrot, q->upaux);
		uint32_t efu = DM_MIN(src->ef_upper, HNSW_EF_UPPER_MAX);

		q->cur = q->batch[0];
		*rc = hnsw_upq_descend(u, q->upaux, src->upl, q->M, q->level, efu > 1 ? 2 : 1,
				       &q->cur, &q->curd, &q->hops, &q->est_evals);
		if (!*rc && efu > 1) {
			*rc = hnsw_upq_beam(u, q->upaux, src->upl, q->M, q->cur, q->curd, efu,
					    hnsw_up_seeds(efu, q->ef), q->up, &q->hops,
					    &q->est_evals);
			if (!*rc) {
				q->cur = q->up->seed[0];
				q->curd = q->up->seed_d[0];
			}
		}
		q->level = 0;
		ran = 1;
	} else if (src->uvec && src->uvec[q->batch[0]]) {
		/* Upper levels from the local upper vectors: no READ until level 0. */
		q->cur = q->batch[0];
		q->curd = q->kern(qvec(q), src->uvec[q->cur], q->vdim);
		*rc = upper_local(q, src);
		ran = 1;
	}
	if (src->uplock)
		pthread_rwlock_unlock(src->uplock);
	src->hops += q->hops - h0;
	if (!ran || *rc)
		return ran;
	if (q->quant) {
		*rc = start_level0(q, src);
		return 1;
	}
	/* without codes level 0 starts from cur's neighbour list (state stays ST_START: the
	 * caller asks for it) */
	q->batch[0] = q->cur;
	q->nbatch = 1;
	return 1;
}

int hnsw_query_step(struct hnsw_query *q, struct hnsw_src *src)
{
	const struct hnsw_rec_hdr *r;
	int64_t off;

	for (;;) {
		switch (q->state) {
		case ST_START: {
			int rc;

			if (upper_start(q, src, &rc)) {
				if (rc)
					return rc;
				if (q->state == ST_START)
					return need(q, ST_L0_ENTRY);
				break;
			}
			/* First of all the entry point's record (batch set up by start). */
			return need(q, ST_ENTRY);
		}
		case ST_L0_ENTRY: {
			int rc;

			r = hnsw_get(src, q->batch[0]);
			if (!r)
				return -EIO;
			off = keep_nbrs(q, r);
			if (off < 0)
				return (int)off;
			q->cur_off = (uint32_t)off;
			rc = start_level0(q, src);
			if (rc)
				return rc;
			break;
		}
		case ST_ENTRY:
			/* The entry point's record arrived: score it, start the descent. */
			r = hnsw_get(src, q->batch[0]);
			if (!r)
				return -EIO;
			q->cur = q->batch[0];
			q->curd = q->kern(qvec(q), hnsw_rec_vec(r, q->vec_off), q->vdim);
			off = keep_nbrs(q, r);
			if (off < 0)
				return (int)off;
			q->cur_off = (uint32_t)off;
			if (q->level < 1) {
				int rc = start_level0(q, src);

				if (rc)
					return rc;
				break;
			}
			src->hops++;
			q->hops++;
			upper_batch(q, src);
			return need(q, ST_UPPER);
		case ST_UPPER: {
			/* One greedy step on level q->level: move to the closest neighbour. */
			bool changed = false;

			for (uint32_t j = 0; j < q->nbatch; j++) {
				float d;

				r = hnsw_get(src, q->batch[j]);
				if (!r)
					return -EIO;
				d = q->kern(qvec(q), hnsw_rec_vec(r, q->vec_off), q->vdim);
				q->dist_evals++;
				if (d < q->curd) {
					q->curd = d;
					q->cur = q->batch[j];
					off = keep_nbrs(q, r);
					if (off < 0)
						return (int)off;
					q->cur_off = (uint32_t)off;
					changed = true;
				}
			}
			if (!changed && --q->level < 1) {
				int rc = start_level0(q, src);

				if (rc)
					return rc;
				break;
			}
			src->hops++;
			q->hops++;
			upper_batch(q, src);
			return need(q, ST_UPPER);
		}
		case ST_L0: {
			/* Expand the closest candidate: collect its unvisited neighbours. */
			struct hnsw_qcand c;
			const uint32_t *nb;
			uint32_t cnt, m = 0;

			if (!q->ncand) {
				q->state = ST_DONE;
				return HNSW_Q_DONE;
			}
			c = minheap_pop(q->cand, &q->ncand);
			if (c.d > q->res[0].d && q->nres >= q->ef) {
				q->state = ST_DONE;
				return HNSW_Q_DONE;
			}
			q->hops++;
			src->hops++;
			nb = q->arena + c.off + 1;
			cnt = q->arena[c.off];
			for (uint32_t j = 0; j < cnt; j++) {
				uint32_t id = nb[j];
				int added;

				if (dm_unlikely(id >= q->n))
					continue;   /* a corrupt record must not index out of bounds */
				added = hnsw_idset_add(&q->vis, id);
				if (added < 0)
					return -ENOMEM;
				if (added)
					q->batch[m++] = id;
			}
			q->nbatch = m;
			if (!m)
				break;
			return need(q, ST_L0_SCORE);
		}
		case ST_L0_SCORE:
			/* Score the batch; keep the neighbour lists of those that enter the queue. */
			if (grow((void **)&q->cand, &q->cap_cand, q->ncand + q->nbatch,
				 sizeof(*q->cand)))
				return -ENOMEM;
			for (uint32_t j = 0; j < q->nbatch; j++) {
				float d;

				r = hnsw_get(src, q->batch[j]);
				if (!r)
					return -EIO;
				d = q->kern(q->q, hnsw_rec_vec(r, q->vec_off), q->vdim);
				q->dist_evals++;
				if (q->nres < q->ef || d < q->res[0].d) {
					off = keep_nbrs(q, r);
					if (off < 0)
						return (int)off;
					struct hnsw_qcand x = { d, q->batch[j], (uint32_t)off };

					minheap_push(q->cand, &q->ncand, x);
					maxheap_push(q->res, &q->nres, x);
					if (q->nres > q->ef)
						maxheap_pop(q->res, &q->nres);
				}
			}
			q->state = ST_L0;
			break;
		case ST_C0:
			/* With codes: hand out the best beam unexpanded candidates. */
			q->nbatch = hnsw_l0_take(q->l0, q->batch, q->beam);
			if (!q->nbatch) {
				q->state = ST_DONE;
				return HNSW_Q_DONE;
			}
			return need(q, ST_C0_EXPAND);
		case ST_C0_EXPAND: {
			uint64_t e0 = q->l0->est_evals;

			for (uint32_t j = 0; j < q->nbatch; j++) {
				int rc;

				r = hnsw_get(src, q->batch[j]);
				if (!r)
					return -EIO;
				rc = hnsw_l0_expand(q->l0, q->batch[j], r, visit_hash, &q->vis);
				if (rc < 0)
					return rc;
			}
			q->hops += q->nbatch;
			src->hops += q->nbatch;
			q->dist_evals += q->nbatch;
			q->est_evals += q->l0->est_evals - e0;
			q->state = ST_C0;
			break;
		}
		case ST_DONE:
			return HNSW_Q_DONE;
		default:
			return -EINVAL;
		}
	}
}

int hnsw_query_results(struct hnsw_query *q, struct dm_hit *out)
{
	int nk;

	if (q->state != ST_DONE)
		return -EINVAL;
	if (q->quant)
		return hnsw_l0_results(q->l0, q->metric, out);
	while (q->nres > q->k)
		maxheap_pop(q->res, &q->nres);
	nk = (int)q->nres;
	for (int i = nk; i-- > 0;) {
		struct hnsw_qcand c = maxheap_pop(q->res, &q->nres);

		out[i].dist = hnsw_score_to_dist(q->metric, c.d);
		out[i].pad = 0;
		out[i].id = c.id;
	}
	return nk;
}
