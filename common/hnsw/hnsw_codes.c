/* hnsw_codes.c: the HNSW index's neighbour codes over the RaBitQ quantizer of
 * common/quant/rabitq.h (see hnsw_codes.h): training, rotation, code lists, the blob the
 * index metadata carries, and the per-expansion estimate of a whole list. The only file of
 * common/hnsw that talks to common/quant. */
#include "hnsw_int.h"
#include "quant/rabitq.h"

#include <stdio.h>
#include <stdlib.h>

struct hnsw_quant {
	struct rbq *rbq;
	uint32_t dim, vdim;
	enum dm_metric metric;
};

struct hnsw_qest {
	const struct hnsw_quant *q;
	struct rbq_qctx *ctx;
	uint32_t M;
	bool per_query;     /* the quantizer's tables do not depend on the expanded node */
	const float *q_rot; /* the query of hnsw_qest_query */
};

static struct hnsw_quant *wrap(struct rbq *r, uint32_t dim, enum dm_metric metric)
{
	struct hnsw_quant *q = calloc(1, sizeof(*q));
	if (!q) {
		rbq_free(r);
		errno = ENOMEM;
		return NULL;
	}
	q->rbq = r;
	q->dim = dim;
	q->vdim = rbq_dim_padded(r);
	q->metric = metric;
	return q;
}

struct hnsw_quant *hnsw_quant_train(const float *rows, uint32_t n, uint32_t dim,
				    enum dm_metric metric, uint64_t seed, char *err, size_t errlen)
{
	if (dim > RBQ_MAX_DIM) {
		snprintf(err, errlen, "dimension %u: codes support at most %u (use --codes none)",
			 dim, RBQ_MAX_DIM);
		errno = EINVAL;
		return NULL;
	}
	struct rbq *r = rbq_train(dim, rows, n, seed);
	if (!r) {
		snprintf(err, errlen, "training the quantizer: %s", strerror(errno));
		return NULL;
	}
	return wrap(r, dim, metric);
}

void hnsw_quant_free(struct hnsw_quant *q)
{
	if (!q)
		return;
	rbq_free(q->rbq);
	free(q);
}

uint32_t hnsw_quant_list_bytes(const struct hnsw_quant *q, uint32_t M)
{
	return (uint32_t)rbq_list_bytes(q->rbq, 2 * M);
}

uint32_t hnsw_quant_vdim(const struct hnsw_quant *q)
{
	return q->vdim;
}

void hnsw_quant_rotate(const struct hnsw_quant *q, const float *in, float *out)
{
	rbq_rotate(q->rbq, in, out);
}

void hnsw_quant_unrotate(const struct hnsw_quant *q, const float *in, float *out)
{
	rbq_unrotate(q->rbq, in, out);
}

void hnsw_quant_encode_list(const struct hnsw_quant *q, uint32_t M, const float *u_rot,
			    const float *const *v_rot, uint32_t n, uint8_t *list)
{
	rbq_list_clear(q->rbq, list, 2 * M);
	for (uint32_t j = 0; j < n; j++)
		rbq_list_set(q->rbq, list, 2 * M, j, u_rot, v_rot[j]);
}

void hnsw_quant_set_slot(const struct hnsw_quant *q, uint32_t M, uint8_t *list, uint32_t slot,
			 const float *u_rot, const float *v_rot)
{
	rbq_list_set(q->rbq, list, 2 * M, slot, u_rot, v_rot);
}

void hnsw_quant_move_slot(const struct hnsw_quant *q, uint32_t M, uint8_t *list, uint32_t dst,
			  uint32_t src)
{
	rbq_list_move(q->rbq, list, 2 * M, dst, src);
}

size_t hnsw_quant_blob_size(const struct hnsw_quant *q)
{
	return rbq_save_size(q->rbq);
}

void hnsw_quant_blob(const struct hnsw_quant *q, void *out)
{
	rbq_save(q->rbq, out, rbq_save_size(q->rbq));
}

struct hnsw_quant *hnsw_quant_from_blob(const void *blob, size_t len, uint32_t dim,
					enum dm_metric metric, uint32_t M, uint32_t code_bytes,
					char *err, size_t errlen)
{
	struct rbq *r = NULL;
	int rc = rbq_load(blob, len, &r);
	if (rc < 0) {
		snprintf(err, errlen, "quantizer blob (%zu bytes) malformed: %s", len, strerror(-rc));
		errno = -rc;
		return NULL;
	}
	if (rbq_dim(r) != dim || rbq_list_bytes(r, 2 * M) != code_bytes) {
		snprintf(err, errlen, "quantizer (dim %u, list %zu bytes) does not match the index "
			 "(dim %u, code area %u bytes)", rbq_dim(r), rbq_list_bytes(r, 2 * M), dim,
			 code_bytes);
		rbq_free(r);
		errno = EINVAL;
		return NULL;
	}
	return wrap(r, dim, metric);
}

struct hnsw_quant *hnsw_quant_dup(const struct hnsw_quant *q)
{
	size_t len = rbq_save_size(q->rbq);
	void *buf = malloc(len);
	struct rbq *r = NULL;
	int rc = buf ? rbq_save(q->rbq, buf, len) : -ENOMEM;

	if (rc >= 0)
		rc = rbq_load(buf, len, &r);
	free(buf);
	if (rc < 0) {
		errno = -rc;
		return NULL;
	}
	return wrap(r, q->dim, q->metric);
}

struct hnsw_qest *hnsw_qest_new(const struct hnsw_quant *q, uint32_t M)
{
	struct hnsw_qest *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->q = q;
	e->M = M;
	e->per_query = rbq_prep_per_query(q->rbq, q->metric);
	e->ctx = rbq_qctx_new(q->rbq);
	if (!e->ctx) {
		free(e);
		errno = ENOMEM;
		return NULL;
	}
	return e;
}

void hnsw_qest_free(struct hnsw_qest *e)
{
	if (!e)
		return;
	rbq_qctx_free(e->ctx);
	free(e);
}

bool hnsw_qest_fits(const struct hnsw_qest *e, const struct hnsw_quant *q, uint32_t M)
{
	return e && e->q == q && e->M == M;
}

void hnsw_qest_query(struct hnsw_qest *e, const float *q_rot)
{
	e->q_rot = q_rot;
	if (e->per_query)
		rbq_prep(e->q->rbq, e->ctx, q_rot, NULL, e->q->metric);
}

void hnsw_qest_list(struct hnsw_qest *e, const float *u_rot, float d_qu, const uint8_t *list,
		    uint32_t n, float *est, float *lb)
{
	const struct hnsw_quant *q = e->q;
	/* raw score -> rabitq.h's distance convention and back: only cos differs (1 - dot) */
	float off = q->metric == DM_METRIC_COS ? 1.0f : 0.0f;
	if (!e->per_query)
		rbq_prep(q->rbq, e->ctx, e->q_rot, u_rot, q->metric);
	rbq_list_estimate(q->rbq, e->ctx, list, 2 * e->M, n, d_qu + off, est, lb);
	if (off != 0.0f) {
		for (uint32_t j = 0; j < n; j++)
			est[j] -= off;
		if (lb)
			for (uint32_t j = 0; j < n; j++)
				lb[j] -= off;
	}
}
