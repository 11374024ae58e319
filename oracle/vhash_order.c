/* vhash_order.c: key order of a vector file (vhash_order.h): the VHash fitted on an even
 * sample of the rows, every row keyed (threads over row ranges), rows sorted by (key, row). */
#include "vhash_order.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "distance.h"

struct dm_vhash *dm_vhash_fit_rows(const float *data, size_t n, size_t dim, uint32_t k,
				   size_t sample, bool normalise, uint64_t seed)
{
	struct dm_vhash *vh;
	float *s;
	size_t ns;

	if (!data || !n || !dim || !k) {
		errno = EINVAL;
		return NULL;
	}
	if (!sample)
		sample = (size_t)k * DM_VHASH_ORDER_SAMPLE_PER_REGION;
	ns = sample < n ? sample : n;
	if (k > ns || ns > SIZE_MAX / dim / sizeof(float)) {
		errno = EINVAL;
		return NULL;
	}
	s = malloc(ns * dim * sizeof(float));
	if (!s) {
		errno = ENOMEM;
		return NULL;
	}
	for (size_t i = 0; i < ns; i++) {
		size_t row = (size_t)((unsigned __int128)i * n / ns);

		memcpy(s + i * dim, data + row * dim, dim * sizeof(float));
		if (normalise)
			dm_normalize(s + i * dim, dim);
	}
	vh = dm_vhash_fit(s, ns, dim, k, seed, NULL);
	free(s);
	return vh;
}

struct key_row {
	uint64_t key;
	uint32_t row;
};

struct key_job {
	const struct dm_vhash *vh;
	const float *data;
	size_t dim, from, to;
	bool normalise;
	struct key_row *kr;
	int rc;
	pthread_t tid;
};

static void *key_rows(void *arg)
{
	struct key_job *j = arg;
	float *tmp = j->normalise ? malloc(j->dim * sizeof(float)) : NULL;

	if (j->normalise && !tmp) {
		j->rc = -ENOMEM;
		return NULL;
	}
	for (size_t i = j->from; i < j->to; i++) {
		const float *x = j->data + i * j->dim;

		if (tmp) {
			memcpy(tmp, x, j->dim * sizeof(float));
			dm_normalize(tmp, j->dim);
			x = tmp;
		}
		j->kr[i] = (struct key_row){ .key = dm_vhash_key(j->vh, x, NULL),
					     .row = (uint32_t)i };
	}
	free(tmp);
	return NULL;
}

static int cmp_key_row(const void *a, const void *b)
{
	const struct key_row *x = a, *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return x->row < y->row ? -1 : x->row > y->row;
}

int dm_vhash_order(const struct dm_vhash *vh, const float *data, size_t n, size_t dim,
		   bool normalise, unsigned nthreads, uint32_t *labels, uint64_t *keys)
{
	struct key_job *jobs;
	struct key_row *kr;
	unsigned started = 0;
	int rc = 0;

	if (!vh || !data || !labels || !n || n > UINT32_MAX || dim != vh->dim ||
	    nthreads < 1 || nthreads > 1024)
		return -EINVAL;
	if (nthreads > n)
		nthreads = (unsigned)n;
	kr = malloc(n * sizeof(*kr));
	jobs = calloc(nthreads, sizeof(*jobs));
	if (!kr || !jobs) {
		rc = -ENOMEM;
		goto out_free;
	}
	for (unsigned t = 0; t < nthreads; t++)
		jobs[t] = (struct key_job){ .vh = vh, .data = data, .dim = dim,
					    .from = n * t / nthreads, .to = n * (t + 1) / nthreads,
					    .normalise = normalise, .kr = kr };
	/* job 0 on the calling thread; a thread that cannot start runs here too */
	for (unsigned t = 1; t < nthreads; t++) {
		if (pthread_create(&jobs[t].tid, NULL, key_rows, &jobs[t]))
			break;
		started = t;
	}
	key_rows(&jobs[0]);
	for (unsigned t = started + 1; t < nthreads; t++)
		key_rows(&jobs[t]);
	for (unsigned t = 1; t <= started; t++)
		pthread_join(jobs[t].tid, NULL);
	for (unsigned t = 0; t < nthreads; t++)
		if (jobs[t].rc)
			rc = jobs[t].rc;
	if (rc)
		goto out_free;
	qsort(kr, n, sizeof(*kr), cmp_key_row);
	for (size_t i = 0; i < n; i++) {
		labels[i] = kr[i].row;
		if (keys)
			keys[i] = kr[i].key;
	}
out_free:
	free(jobs);
	free(kr);
	return rc;
}
