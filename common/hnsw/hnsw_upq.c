/* hnsw_upq.c: the SQ8 codes of the upper-level nodes (hnsw_upq.h) and the level-1 search on
 * them. Building: collect the stored vectors of the nodes that have one, in id order, train
 * the quantizer on them and encode each into its row. */
#include "hnsw_upq.h"
#include "hnsw_int.h"

#include <stdlib.h>

struct hnsw_upq *hnsw_upq_build(uint32_t n, uint32_t vdim, enum dm_metric m,
				const float *(*vec)(void *arg, uint32_t id), void *arg)
{
	struct hnsw_upq *u = calloc(1, sizeof(*u));
	const float **v = NULL;
	int rc;

	if (!u)
		goto err_oom;
	u->n = n;
	u->vdim = vdim;
	u->slot = malloc((size_t)(n ? n : 1) * sizeof(*u->slot));
	if (!u->slot)
		goto err_free_upq;
	for (uint32_t id = 0; id < n; id++) {
		u->slot[id] = vec(arg, id) ? u->nup++ : HNSW_UPQ_NONE;
	}
	v = malloc((size_t)(u->nup ? u->nup : 1) * sizeof(*v));
	u->codes = malloc((size_t)(u->nup ? u->nup : 1) * vdim);
	if (!v || !u->codes)
		goto err_free_upq;
	for (uint32_t id = 0; id < n; id++)
		if (u->slot[id] != HNSW_UPQ_NONE)
			v[u->slot[id]] = vec(arg, id);
	rc = dm_sq8_train(&u->sq, m, vdim, v, u->nup);
	if (rc) {
		free(v);
		hnsw_upq_free(u);
		errno = -rc;
		return NULL;
	}
	for (uint32_t i = 0; i < u->nup; i++)
		dm_sq8_encode(&u->sq, v[i], u->codes + (size_t)i * vdim);
	u->score = dm_sq8_kernel(&u->sq);
	u->cap_rows = u->nup ? u->nup : 1;
	free(v);
	return u;

err_free_upq:
	free(v);
	hnsw_upq_free(u);
err_oom:
	errno = ENOMEM;
	return NULL;
}

void hnsw_upq_free(struct hnsw_upq *u)
{
	if (!u)
		return;
	dm_sq8_fini(&u->sq);
	free(u->slot);
	free(u->codes);
	free(u);
}

int hnsw_upq_reserve_ids(struct hnsw_upq *u, uint32_t n)
{
	uint32_t *s;

	if (n <= u->n)
		return 0;
	s = realloc(u->slot, (size_t)n * sizeof(*s));
	if (!s)
		return -ENOMEM;
	for (uint32_t id = u->n; id < n; id++)
		s[id] = HNSW_UPQ_NONE;
	u->slot = s;
	u->n = n;
	return 0;
}

int hnsw_upq_add(struct hnsw_upq *u, uint32_t id, const float *v)
{
	if (id >= u->n || u->slot[id] != HNSW_UPQ_NONE || u->nup == HNSW_UPQ_NONE - 1)
		return -EINVAL;
	if (u->nup == u->cap_rows) {
		uint32_t cap = u->cap_rows < (1u << 30) ? 2 * u->cap_rows : HNSW_UPQ_NONE - 1;
		uint8_t *c = realloc(u->codes, (size_t)cap * u->vdim);

		if (!c)
			return -ENOMEM;
		u->codes = c;
		u->cap_rows = cap;
	}
	dm_sq8_encode(&u->sq, v, u->codes + (size_t)u->nup * u->vdim);
	u->slot[id] = u->nup++;
	return 0;
}

static const float *rec_vec_upper(void *arg, uint32_t id)
{
	const struct hnsw_index *idx = arg;

	return idx->upl[id] ? hnsw_rec_vec(hnsw_rec(idx, id), idx->vec_off) : NULL;
}

int hnsw_upq_attach(struct hnsw_index *idx)
{
	struct hnsw_upq *u;

	if (!idx->quant)
		return 0;
	u = hnsw_upq_build(idx->n, idx->vdim, idx->p.metric, rec_vec_upper, idx);
	if (!u)
		return -errno;
	hnsw_upq_free(idx->upq);
	idx->upq = u;
	return 0;
}

/* ---- level 1: SEARCH-LAYER (Algorithm 2) on SQ8 scores ----------------------------------- */

int hnsw_upbeam_init(struct hnsw_upbeam *b)
{
	b->nseed = 0;
	return hnsw_idset_init(&b->vis, 1024);
}

void hnsw_upbeam_fini(struct hnsw_upbeam *b)
{
	hnsw_idset_fini(&b->vis);
}

int hnsw_upq_beam(const struct hnsw_upq *u, const float *aux, uint32_t *const *upl, uint32_t M,
		  uint32_t entry, float entryd, uint32_t ef_up, uint32_t nseed,
		  struct hnsw_upbeam *b, uint64_t *hops, uint64_t *evals)
{
	struct hnsw_pent *pool = b->pool;
	uint32_t vd = u->vdim, np = 0, i = 0;
	int rc;

	if (ef_up < 2 || ef_up > HNSW_EF_UPPER_MAX || nseed < 1 || nseed > HNSW_UP_MAX_SEEDS)
		return -EINVAL;
	hnsw_idset_clear(&b->vis);
	rc = hnsw_idset_add(&b->vis, entry);
	if (rc < 0)
		return rc;
	hnsw_pent_insert(pool, &np, ef_up, entryd, entry, 0);
	for (;;) {
		/* the closest unexpanded entry; done when none (all of W expanded) */
		while (i < np && pool[i].st)
			i++;
		if (i == np)
			break;
		pool[i].st = 1;
		uint32_t c = pool[i].id;
		const uint32_t *w = c < u->n ? upl[c] : NULL;

		if (dm_unlikely(!w))
			return -EIO;
		uint32_t cnt = DM_MIN(w[0], M);

		(*hops)++;
		for (uint32_t j = 0; j < cnt; j++) {
			uint32_t v = w[1 + j], s = v < u->n ? u->slot[v] : HNSW_UPQ_NONE;

			if (dm_unlikely(s == HNSW_UPQ_NONE))
				return -EIO;
			__builtin_prefetch(u->codes + (size_t)s * vd);
		}
		for (uint32_t j = 0; j < cnt; j++) {
			uint32_t v = w[1 + j];
			float d;

			rc = hnsw_idset_add(&b->vis, v);
			if (rc <= 0) {
				if (rc < 0)
					return rc;
				continue;
			}
			d = u->score(aux, u->codes + (size_t)u->slot[v] * vd, vd);
			(*evals)++;
			uint32_t pos = hnsw_pent_insert(pool, &np, ef_up, d, v, 0);

			/* everything before i is expanded; a new entry at or before i is not */
			if (pos < i)
				i = pos;
		}
	}
	b->nseed = DM_MIN(nseed, np);
	for (uint32_t j = 0; j < b->nseed; j++) {
		b->seed[j] = pool[j].id;
		b->seed_d[j] = pool[j].d;
	}
	return 0;
}
