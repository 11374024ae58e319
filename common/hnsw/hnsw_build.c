/* hnsw_build.c: the offline, multi-threaded HNSW builder. Trains the quantizer on the first
 * rows (with codes), lays out all records (level, original vector, empty lists), then
 * inserts the nodes in id order with nthreads pthreads pulling ids from a shared counter
 * (Algorithm 1 per node, hnsw_insert.c, exact distances over the original vectors), and
 * finally, again with nthreads threads, rotates every stored vector in place (with codes),
 * fills every node's code list and seals every record's CRC. With one thread the insertion
 * order, and so the graph, depend only on the parameters and the data: an index with codes
 * has exactly the graph of the one without.
 *
 * hnsw_build_ordered numbers the nodes in another order (node i = row labels[i]) and does
 * everything else by row (quantizer rows, level draws, insertion order), so that only the
 * numbering differs from hnsw_build over the same file. */
#include "hnsw_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

struct build_ctx {
	struct hnsw_index *idx;
	const uint32_t *inv;         /* NULL, or row -> node id (the insertion order is rows') */
	_Atomic uint32_t next;       /* next id (row) to insert */
	_Atomic int failed;
	hnsw_progress_fn progress;
	void *parg;
	int (*range_fn)(struct hnsw_index *, uint32_t, uint32_t);   /* range_worker_main's pass */
};

struct build_worker {
	struct build_ctx *ctx;
	pthread_t tid;
	bool reports;                /* this worker calls the progress callback */
};

/* Finish records [from, to): code list from (u, its neighbours), then the CRC. */
static int seal_range(struct hnsw_index *idx, uint32_t from, uint32_t to)
{
	uint32_t M = idx->p.M;
	const float **vs = NULL;
	if (idx->quant) {
		vs = malloc(2 * M * sizeof(*vs));
		if (!vs)
			return -ENOMEM;
	}
	for (uint32_t id = from; id < to; id++) {
		struct hnsw_rec_hdr *r = hnsw_rec(idx, id);
		if (idx->quant) {
			const uint32_t *nb = hnsw_rec_nbrs(r);
			for (uint32_t j = 0; j < r->n0; j++)
				vs[j] = hnsw_rec_vec(hnsw_rec(idx, nb[j]), idx->vec_off);
			hnsw_quant_encode_list(idx->quant, M, hnsw_rec_vec(r, idx->vec_off), vs, r->n0,
					       (uint8_t *)hnsw_rec_codes(r, M));
		}
		r->seq = 0;
		r->holder = 0;
		r->crc = hnsw_rec_crc(r, idx->rec_size);
	}
	free(vs);
	return 0;
}

/* Rotate the stored vectors of records [from, to) in place (dim floats -> vdim). */
static int rotate_range(struct hnsw_index *idx, uint32_t from, uint32_t to)
{
	float *tmp = malloc((size_t)idx->vdim * sizeof(float));
	if (!tmp)
		return -ENOMEM;
	for (uint32_t id = from; id < to; id++) {
		float *v = (float *)hnsw_rec_vec(hnsw_rec(idx, id), idx->vec_off);
		hnsw_quant_rotate(idx->quant, v, tmp);
		memcpy(v, tmp, (size_t)idx->vdim * sizeof(float));
	}
	free(tmp);
	return 0;
}

/* Rotation or sealing pass (ctx->range_fn): chunks of 256 ids from the shared counter. */
static void *range_worker_main(void *arg)
{
	struct build_worker *w = arg;
	struct build_ctx *c = w->ctx;
	struct hnsw_index *idx = c->idx;
	for (;;) {
		uint32_t from = atomic_fetch_add(&c->next, 256);
		if (from >= idx->n)
			break;
		if (c->range_fn(idx, from, DM_MIN(idx->n, from + 256)) < 0) {
			atomic_store(&c->failed, ENOMEM);
			break;
		}
	}
	return NULL;
}

/* Run fn on nthreads threads (the caller is worker 0); 0 or -ENOMEM. */
static int run_workers(struct build_ctx *ctx, unsigned nthreads, void *(*fn)(void *))
{
	struct build_worker *w = calloc(nthreads, sizeof(*w));
	if (!w)
		return -ENOMEM;
	unsigned started = 1;
	for (unsigned t = 0; t < nthreads; t++) {
		w[t].ctx = ctx;
		w[t].reports = t == 0;
	}
	for (unsigned t = 1; t < nthreads; t++) {
		if (pthread_create(&w[t].tid, NULL, fn, &w[t]) != 0) {
			dm_warn("hnsw build: could only start %u of %u threads", started, nthreads);
			break;
		}
		started++;
	}
	fn(&w[0]);
	for (unsigned t = 1; t < started; t++)
		pthread_join(w[t].tid, NULL);
	free(w);
	return atomic_load(&ctx->failed) ? -ENOMEM : 0;
}

/* Worker: insert ids from the shared counter until none is left. */
static void *build_worker_main(void *arg)
{
	struct build_worker *w = arg;
	struct build_ctx *c = w->ctx;
	struct hnsw_index *idx = c->idx;
	struct hnsw_scratch *s = hnsw_scratch_new(idx->n, idx->p.M, idx->p.ef_construction);
	if (!s) {
		atomic_store(&c->failed, ENOMEM);
		return NULL;
	}
	for (;;) {
		uint32_t row = atomic_fetch_add(&c->next, 1);
		if (row >= idx->n)
			break;
		hnsw_insert(idx, s, c->inv ? c->inv[row] : row);
		if (w->reports && c->progress && (row & 255) == 0)
			c->progress(c->parg, row);
	}
	hnsw_scratch_free(s);
	return NULL;
}

/* Check and copy row id (normalised for cos) into out. */
static int take_row(const struct hnsw_params *p, const float *data, uint32_t id, float *out,
		    char *err, size_t errlen)
{
	const float *src = data + (size_t)id * p->dim;
	for (uint32_t j = 0; j < p->dim; j++) {
		if (!isfinite(src[j])) {
			snprintf(err, errlen, "vector %u has a non-finite value at %u", id, j);
			return -EINVAL;
		}
	}
	memcpy(out, src, (size_t)p->dim * sizeof(*out));
	if (p->metric == DM_METRIC_COS && dm_normalize(out, p->dim) < 0) {
		snprintf(err, errlen, "vector %u has zero norm: undefined under cosine", id);
		return -EINVAL;
	}
	return 0;
}

/* Train the quantizer on the first rows (normalised for cos). */
static struct hnsw_quant *train_quant(const struct hnsw_params *p, const float *data,
				      uint32_t n, char *err, size_t errlen)
{
	uint32_t nt = DM_MIN(n, HNSW_QUANT_TRAIN_ROWS);
	float *rows = malloc((size_t)nt * p->dim * sizeof(float));
	if (!rows) {
		snprintf(err, errlen, "out of memory for the quantizer's training rows");
		errno = ENOMEM;
		return NULL;
	}
	for (uint32_t i = 0; i < nt; i++) {
		if (take_row(p, data, i, rows + (size_t)i * p->dim, err, errlen) < 0) {
			free(rows);
			errno = EINVAL;
			return NULL;
		}
	}
	struct hnsw_quant *q = hnsw_quant_train(rows, nt, p->dim, p->metric, p->seed, err, errlen);
	free(rows);
	return q;
}

/* Lay out records: header, vector (normalised for cos; rotated only after the graph is
 * built), level draws, upper-list storage. */
static int layout_records(struct hnsw_index *idx, const float *data, char *err, size_t errlen)
{
	const struct hnsw_params *p = &idx->p;
	uint32_t n = idx->n, M = p->M;
	size_t words = 0;
	for (uint32_t id = 0; id < n; id++) {
		uint32_t row = idx->labels ? idx->labels[id] : id;
		uint32_t lv = hnsw_draw_level(p->seed, row, M);
		struct hnsw_rec_hdr *r = hnsw_rec(idx, id);
		r->seq = 0;
		r->holder = 0;
		r->level = (uint8_t)lv;
		r->flags = 0;
		r->n0 = 0;
		words += (size_t)lv * hnsw_up_list_words(M);
		float *v = (float *)hnsw_rec_vec(r, idx->vec_off);
		int rc = take_row(p, data, row, v, err, errlen);
		if (rc < 0)
			return rc;
	}
	idx->up_words = words;
	idx->up_store = calloc(words ? words : 1, sizeof(uint32_t));
	if (!idx->up_store) {
		snprintf(err, errlen, "out of memory for upper lists (%zu words)", words);
		return -ENOMEM;
	}
	size_t off = 0;
	for (uint32_t id = 0; id < n; id++) {
		uint32_t lv = hnsw_rec(idx, id)->level;
		if (lv) {
			idx->upl[id] = idx->up_store + off;
			off += (size_t)lv * hnsw_up_list_words(M);
		}
	}
	return 0;
}

struct hnsw_index *hnsw_build(const struct hnsw_params *p, const float *data, uint32_t n,
			      unsigned nthreads, hnsw_progress_fn progress, void *parg,
			      char *err, size_t errlen)
{
	return hnsw_build_ordered(p, data, n, NULL, nthreads, progress, parg, err, errlen);
}

struct hnsw_index *hnsw_build_ordered(const struct hnsw_params *p, const float *data,
				      uint32_t n, const uint32_t *labels, unsigned nthreads,
				      hnsw_progress_fn progress, void *parg, char *err,
				      size_t errlen)
{
	uint32_t *inv = NULL;
	int rc = hnsw_params_check(p, err, errlen);
	if (rc < 0) {
		errno = -rc;
		return NULL;
	}
	if (n == 0 || n == UINT32_MAX) {
		snprintf(err, errlen, "cannot build an index of %u vectors", n);
		errno = EINVAL;
		return NULL;
	}
	if (nthreads < 1 || nthreads > 1024) {
		snprintf(err, errlen, "thread count %u out of range 1..1024", nthreads);
		errno = EINVAL;
		return NULL;
	}
	struct hnsw_quant *quant = NULL;
	if (p->codes == HNSW_CODES_RABITQ) {
		quant = train_quant(p, data, n, err, errlen);
		if (!quant)
			return NULL;
	}
	struct hnsw_index *idx = hnsw_alloc(p, n, quant);
	if (!idx) {
		snprintf(err, errlen, "out of memory for %u records", n);
		hnsw_quant_free(quant);
		return NULL;
	}
	idx->locks = calloc(n, 1);
	if (!idx->locks) {
		snprintf(err, errlen, "out of memory for node locks");
		rc = -ENOMEM;
		goto err_free_idx;
	}
	if (labels) {
		/* the label map, checked to be a permutation, and its inverse */
		idx->labels = malloc((size_t)n * sizeof(*labels));
		inv = malloc((size_t)n * sizeof(*inv));
		if (!idx->labels || !inv) {
			snprintf(err, errlen, "out of memory for the label map");
			rc = -ENOMEM;
			goto err_free_idx;
		}
		memcpy(idx->labels, labels, (size_t)n * sizeof(*labels));
		memset(inv, 0xff, (size_t)n * sizeof(*inv));
		for (uint32_t i = 0; i < n; i++) {
			if (labels[i] >= n || inv[labels[i]] != UINT32_MAX) {
				snprintf(err, errlen, "label map: node %u's label %u is %s", i,
					 labels[i], labels[i] >= n ? "out of range" : "repeated");
				rc = -EINVAL;
				goto err_free_idx;
			}
			inv[labels[i]] = i;
		}
	}
	rc = layout_records(idx, data, err, errlen);
	if (rc < 0)
		goto err_free_idx;

	struct build_ctx ctx = { .idx = idx, .inv = inv, .progress = progress, .parg = parg };
	atomic_init(&ctx.next, 0);
	atomic_init(&ctx.failed, 0);
	/* Worker 0 runs on the calling thread and reports progress. The graph is built over
	 * the original vectors (kernel length dim, as without codes), then rotated. */
	uint32_t vdim = idx->vdim;
	idx->vdim = p->dim;
	rc = run_workers(&ctx, nthreads, build_worker_main);
	idx->vdim = vdim;
	if (rc == 0 && idx->quant) {
		atomic_store(&ctx.next, 0);
		ctx.range_fn = rotate_range;
		rc = run_workers(&ctx, nthreads, range_worker_main);
	}
	if (rc == 0) {
		atomic_store(&ctx.next, 0);
		ctx.range_fn = seal_range;
		rc = run_workers(&ctx, nthreads, range_worker_main);
	}
	if (rc == 0)
		rc = hnsw_upq_attach(idx);
	if (rc < 0) {
		snprintf(err, errlen, "out of memory in a build thread");
		goto err_free_idx;
	}
	if (progress)
		progress(parg, n);
	free(idx->locks);
	idx->locks = NULL;
	free(inv);
	return idx;

err_free_idx:
	free(inv);
	hnsw_free(idx);
	errno = -rc;
	return NULL;
}
