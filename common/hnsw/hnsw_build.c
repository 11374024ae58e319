/* hnsw_build.c: the offline, multi-threaded HNSW builder. Lays out all records first (level,
 * vector, empty lists), then inserts the nodes in id order with nthreads pthreads pulling
 * ids from a shared counter (Algorithm 1 per node, hnsw_insert.c). With one thread the
 * insertion order, and so the graph, depend only on the parameters and the data. */
#include "hnsw_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

struct build_ctx {
	struct hnsw_index *idx;
	_Atomic uint32_t next;       /* next id to insert */
	_Atomic int failed;
	hnsw_progress_fn progress;
	void *parg;
};

struct build_worker {
	struct build_ctx *ctx;
	pthread_t tid;
	bool reports;                /* this worker calls the progress callback */
};

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
		uint32_t id = atomic_fetch_add(&c->next, 1);
		if (id >= idx->n)
			break;
		hnsw_insert(idx, s, id);
		if (w->reports && c->progress && (id & 255) == 0)
			c->progress(c->parg, id);
	}
	hnsw_scratch_free(s);
	return NULL;
}

/* Lay out records: header, vector (normalised for cos), level draws, upper-list storage. */
static int layout_records(struct hnsw_index *idx, const float *data, char *err, size_t errlen)
{
	const struct hnsw_params *p = &idx->p;
	uint32_t n = idx->n, M = p->M;
	size_t words = 0;
	for (uint32_t id = 0; id < n; id++) {
		uint32_t lv = hnsw_draw_level(p->seed, id, M);
		struct hnsw_rec_hdr *r = hnsw_rec(idx, id);
		r->version = HNSW_REC_VERSION;
		r->level = (uint8_t)lv;
		r->flags = 0;
		r->n0 = 0;
		words += (size_t)lv * hnsw_up_list_words(M);
		float *v = (float *)hnsw_rec_vec(r, M);
		const float *src = data + (size_t)id * p->dim;
		for (uint32_t j = 0; j < p->dim; j++) {
			if (!isfinite(src[j])) {
				snprintf(err, errlen, "vector %u has a non-finite value at %u", id, j);
				return -EINVAL;
			}
		}
		memcpy(v, src, (size_t)p->dim * sizeof(*v));
		if (p->metric == DM_METRIC_COS && dm_normalize(v, p->dim) < 0) {
			snprintf(err, errlen, "vector %u has zero norm: undefined under cosine", id);
			return -EINVAL;
		}
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
	struct hnsw_index *idx = hnsw_alloc(p, n);
	if (!idx) {
		snprintf(err, errlen, "out of memory for %u records of %u bytes", n,
			 hnsw_rec_size(p->M, p->dim));
		return NULL;
	}
	idx->locks = calloc(n, 1);
	if (!idx->locks) {
		snprintf(err, errlen, "out of memory for node locks");
		rc = -ENOMEM;
		goto err_free_idx;
	}
	rc = layout_records(idx, data, err, errlen);
	if (rc < 0)
		goto err_free_idx;

	struct build_ctx ctx = { .idx = idx, .progress = progress, .parg = parg };
	atomic_init(&ctx.next, 0);
	atomic_init(&ctx.failed, 0);
	struct build_worker *w = calloc(nthreads, sizeof(*w));
	if (!w) {
		snprintf(err, errlen, "out of memory for build threads");
		rc = -ENOMEM;
		goto err_free_idx;
	}
	/* Worker 0 runs on the calling thread and reports progress. */
	unsigned started = 1;
	for (unsigned t = 0; t < nthreads; t++) {
		w[t].ctx = &ctx;
		w[t].reports = t == 0;
	}
	for (unsigned t = 1; t < nthreads; t++) {
		if (pthread_create(&w[t].tid, NULL, build_worker_main, &w[t]) != 0) {
			dm_warn("hnsw build: could only start %u of %u threads", started, nthreads);
			break;
		}
		started++;
	}
	build_worker_main(&w[0]);
	for (unsigned t = 1; t < started; t++)
		pthread_join(w[t].tid, NULL);
	free(w);
	if (atomic_load(&ctx.failed)) {
		snprintf(err, errlen, "out of memory in a build thread");
		rc = -ENOMEM;
		goto err_free_idx;
	}
	if (progress)
		progress(parg, n);
	free(idx->locks);
	idx->locks = NULL;
	return idx;

err_free_idx:
	hnsw_free(idx);
	errno = -rc;
	return NULL;
}
