/* cli_import.c: the S3 side of `dmann load --bucket B --name I` (bulk import): the image's
 * vectors become the rows of a new S3 Vectors index (through libdmann, as the gateways'
 * identity: the same put path as every client, durable on every replica of the bucket),
 * the graph is then placed bound to that index (dindex_bind.h) by the caller, and finally
 * the index's graph mark is set on every replica of the bucket (FL_MARK: its first n rows
 * are in the graph of that generation), after which QueryVectors takes the graph path.
 * Row i of the index is node i of the graph; with a key-ordered image (a label map: node ->
 * row of the vector file it was built from) its key and metadata are those of the node's
 * label (the default key is the label, or line label+1 of --keys), so the keys name the
 * same vectors whatever the image's order, and the graph is placed without the label map
 * (the binding's keys carry it). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_import.h"
#include "dmann.h"
#include "fl_rpc.h"
#include "flat.h"
#include "hnsw/hnsw_codes.h"
#include "util/dm_buf.h"
#include "vecfile.h"

#define BATCH 1000u

/* The lines of path (n of them wanted; "" lines allowed when empty_ok): malloc'd strings,
 * or NULL with a message. */
static char **read_lines(const char *path, uint32_t n, bool empty_ok, size_t max, char *err,
			 size_t errlen)
{
	FILE *f = fopen(path, "r");
	char **out = calloc(n ? n : 1, sizeof(*out));
	char *line = NULL;
	size_t cap = 0;
	uint32_t i = 0;
	ssize_t len;

	if (!f || !out) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		goto fail;
	}
	while ((len = getline(&line, &cap, f)) >= 0) {
		if (len && line[len - 1] == '\n')
			line[--len] = 0;
		if (i == n) {
			snprintf(err, errlen, "%s: more than %u lines (one per vector of the index)",
				 path, n);
			goto fail;
		}
		if ((!len && !empty_ok) || (size_t)len > max || memchr(line, 0, (size_t)len)) {
			snprintf(err, errlen, "%s:%u: %s", path, i + 1, !len ? "empty line" :
				 (size_t)len > max ? "too long" : "a NUL byte");
			goto fail;
		}
		out[i] = strdup(line);
		if (!out[i++]) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
	}
	if (i != n) {
		snprintf(err, errlen, "%s: %u lines, the index has %u vectors", path, i, n);
		goto fail;
	}
	free(line);
	fclose(f);
	return out;
fail:
	free(line);
	if (f)
		fclose(f);
	for (uint32_t j = 0; out && j < n; j++)
		free(out[j]);
	free(out);
	return NULL;
}

void dm_import_fini(struct dm_import *im)
{
	for (uint32_t i = 0; im->keys && i < im->n; i++)
		free(im->keys[i]);
	free(im->keys);
	im->keys = NULL;
}

static int mark_rows(const struct dm_cluster_cfg *cfg, struct mn_set *s,
		     const struct dm_import *im, uint64_t rows, uint64_t gen, char *err,
		     size_t errlen);

/* Does row (of the vector file) match img (node's vector in the image, rotated back)? The
 * image holds it normalised for cos and rotated when it has codes: both round, so within
 * 1e-3 of its norm (a wrong file differs by far more). */
static bool same_vector(const float *row, const float *img, uint32_t dim, bool cos)
{
	double nr = 0, d = 0;

	for (uint32_t j = 0; j < dim; j++)
		nr += (double)row[j] * row[j];
	nr = sqrt(nr);
	for (uint32_t j = 0; j < dim; j++) {
		double a = cos ? (nr > 0 ? row[j] / nr : 0) : row[j], t = a - img[j];

		d += t * t;
	}
	return sqrt(d) <= 1e-3 * (cos ? 1.0 : fmax(1.0, nr));
}

/* Is row labels[i] (or i) of vf node i's vector in idx, for every node? 0 or -EINVAL. */
static int check_vectors(const struct hnsw_index *idx, const struct dm_vecs *vf,
			 const char *name, char *err, size_t errlen)
{
	uint32_t dim = idx->p.dim;
	float *tmp = malloc((size_t)idx->vdim * sizeof(float));

	if (!tmp) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < idx->n; i++) {
		const float *v = hnsw_rec_vec(hnsw_rec(idx, i), idx->vec_off);
		uint32_t row = idx->labels ? idx->labels[i] : i;

		if (idx->quant) {
			hnsw_quant_unrotate(idx->quant, v, tmp);
			v = tmp;
		}
		if (!same_vector((const float *)vf->data + (size_t)row * dim, v, dim,
				 idx->p.metric == DM_METRIC_COS)) {
			snprintf(err, errlen, "%s: row %u is not the vector of node %u of the "
				 "image: give the file the image was built from", name, row, i);
			free(tmp);
			return -EINVAL;
		}
	}
	free(tmp);
	return 0;
}

int dm_import_rows(const struct dm_cluster_cfg *cfg,
		   const struct hnsw_index *idx, struct dm_import *im, char *err, size_t errlen)
{
	struct dm_vecs vf = { 0 };
	bool have_vf = false;
	char **meta = NULL;
	struct dm_client_cfg gw;
	const char *eps[DM_MAX_NODES];
	uint32_t ne = 0, dim = idx->p.dim;
	float *vecs = NULL, *tmp = NULL;
	dmann_t *d = NULL;
	int rc = -EINVAL;

	im->n = idx->n;
	if (idx->p.metric != DM_METRIC_L2 && idx->p.metric != DM_METRIC_COS) {
		snprintf(err, errlen, "an S3 Vectors index is euclidean or cosine: this image is "
			 "inner product");
		return -EINVAL;
	}
	if (im->keys_file) {
		im->keys = read_lines(im->keys_file, idx->n, false, DMANN_MAX_KEY, err, errlen);
		if (!im->keys)
			return -EINVAL;
		if (idx->labels) {
			/* node i's key is line labels[i] */
			char **k = malloc(idx->n * sizeof(*k));

			if (!k) {
				snprintf(err, errlen, "out of memory");
				return -ENOMEM;
			}
			for (uint32_t i = 0; i < idx->n; i++)
				k[i] = im->keys[idx->labels[i]];
			free(im->keys);
			im->keys = k;
		}
	} else {
		im->keys = calloc(idx->n, sizeof(*im->keys));
		for (uint32_t i = 0; im->keys && i < idx->n; i++)
			if (asprintf(&im->keys[i], "%u", idx->labels ? idx->labels[i] : i) < 0)
				im->keys[i] = NULL;
		for (uint32_t i = 0; im->keys && i < idx->n; i++)
			if (!im->keys[i]) {
				snprintf(err, errlen, "out of memory");
				return -ENOMEM;
			}
	}
	if (im->meta_file) {
		meta = read_lines(im->meta_file, idx->n, true, 40u << 10, err, errlen);
		if (!meta)
			return -EINVAL;
	}
	if (im->vec_file) {
		rc = dm_vecs_read(im->vec_file, DM_VF_AUTO, &vf, err, errlen);
		if (rc < 0)
			goto out;
		have_vf = true;
		rc = -EINVAL;
		if (vf.type != DM_VT_F32) {
			snprintf(err, errlen, "%s holds ids, not vectors", im->vec_file);
			goto out;
		}
		if (vf.n != idx->n || vf.dim != dim) {
			snprintf(err, errlen, "%s: %llu x %u vectors, the image has %u x %u: give the "
				 "file the image was built from", im->vec_file,
				 (unsigned long long)vf.n, vf.dim, idx->n, dim);
			goto out;
		}
		/* every row checked before anything is created: a wrong file changes nothing */
		rc = check_vectors(idx, &vf, im->vec_file, err, errlen);
		if (rc)
			goto out;
		rc = -EINVAL;
	} else if (idx->quant || idx->p.metric == DM_METRIC_COS) {
		fprintf(stderr, "dmann load: note: without --vectors the rows put are the image's "
			"vectors (%s): give --vectors FILE (the file the image was built from) to "
			"store the exact ones\n", idx->quant ? "rotated back, within float rounding "
			"of the originals" : "normalised");
	}
	if (dm_config_gateway_client(cfg, &gw)) {
		snprintf(err, errlen, "the cluster file has no cluster secret");
		goto out;
	}
	for (uint32_t i = 0; i < cfg->n_cn; i++)
		eps[ne++] = cfg->cn[i].address;
	d = dmann_connect_endpoints(cfg->name, eps, ne, cfg->transport[0] ? cfg->transport : NULL,
				    gw.name, gw.secret, gw.secret_len);
	memset(&gw, 0, sizeof(gw));
	if (!d) {
		rc = -errno;
		snprintf(err, errlen, "connecting to the compute nodes: %s", dmann_errmsg());
		goto out;
	}
	rc = dmann_create_index(d, im->bucket, im->index, dim, idx->p.metric == DM_METRIC_COS ?
				DMANN_COSINE : DMANN_EUCLIDEAN);
	if (rc) {
		snprintf(err, errlen, rc == -EEXIST ? "index %s/%s exists: an import makes a new "
			 "index (delete it first)" : "creating index %s/%s: %s", im->bucket,
			 im->index, rc == -EEXIST ? "" : dmann_errmsg());
		goto out;
	}
	if (im->s) {
		/* tagged as an import in progress: the compute nodes build no graph for it */
		rc = mark_rows(cfg, im->s, im, 0, DM_GRAPH_TAG_IMPORT, err, errlen);
		if (rc)
			goto out;
	}
	vecs = malloc((size_t)BATCH * dim * sizeof(float));
	tmp = malloc((size_t)idx->vdim * sizeof(float));
	if (!vecs || !tmp) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (uint32_t at = 0; at < idx->n; at += BATCH) {
		uint32_t nb = DM_MIN(BATCH, idx->n - at);
		const char *mp[BATCH];

		for (uint32_t i = 0; i < nb; i++) {
			const float *v = hnsw_rec_vec(hnsw_rec(idx, at + i), idx->vec_off);

			uint32_t row = idx->labels ? idx->labels[at + i] : at + i;

			if (have_vf) {
				/* the exact vector of the node's row (checked) */
				v = (const float *)vf.data + (size_t)row * dim;
			} else if (idx->quant) {
				/* with codes the image holds the rotated vector: rotate it back */
				hnsw_quant_unrotate(idx->quant, v, tmp);
				v = tmp;
			}
			memcpy(vecs + (size_t)i * dim, v, (size_t)dim * sizeof(float));

			mp[i] = meta && meta[row][0] ? meta[row] : NULL;
		}
		rc = dmann_put(d, im->bucket, im->index, nb, (const char *const *)im->keys + at, vecs,
			       dim, meta ? mp : NULL);
		if (rc) {
			snprintf(err, errlen, "putting vectors %u..%u: %s", at, at + nb - 1,
				 dmann_errmsg());
			goto out;
		}
		if (im->progress)
			im->progress(im->parg, at + nb);
	}
out:
	free(vecs);
	free(tmp);
	if (have_vf)
		dm_vecs_free(&vf);
	dmann_close(d);
	for (uint32_t j = 0; meta && j < idx->n; j++)
		free(meta[j]);
	free(meta);
	return rc;
}

/* The creation time of index bucket/index on memory node m (each replica has its own). */
static int index_created(struct mn_set *s, uint32_t m, const char *bucket, const char *index,
			 int64_t *created)
{
	struct dm_buf w = { 0 };
	uint8_t *resp = NULL;
	size_t rlen;
	int rc;

	if (!s->link[m].up)
		return -EHOSTDOWN;
	dm_buf_str(&w, bucket);
	dm_buf_str(&w, index);
	rc = w.oom ? -ENOMEM : dm_fl_call(&s->link[m].ch, DM_OP_FL_STATE, w.p, w.n, DM_FL_MIN_MSG,
					   10000, &resp, &rlen);
	dm_buf_free(&w);
	if (!rc) {
		struct dm_rbuf rb = { .p = resp, .n = rlen };

		(void)dm_rbuf_u64(&rb);
		*created = (int64_t)dm_rbuf_u64(&rb);
		if (rb.bad)
			rc = -EBADMSG;
	}
	free(resp);
	return rc;
}

int dm_import_mark(const struct dm_cluster_cfg *cfg, struct mn_set *s,
		   const struct dm_import *im, uint64_t gen, char *err, size_t errlen)
{
	return mark_rows(cfg, s, im, im->n, gen, err, errlen);
}

/* The mark (rows, tag gen) on every replica of the bucket. */
static int mark_rows(const struct dm_cluster_cfg *cfg, struct mn_set *s,
		     const struct dm_import *im, uint64_t rows, uint64_t gen, char *err,
		     size_t errlen)
{
	uint32_t mns[DM_MAX_NODES];
	int nm = flat_bucket_mns(cfg, im->bucket, mns);

	for (int i = 0; i < nm; i++) {
		struct dm_buf w = { 0 };
		uint8_t *resp = NULL;
		size_t rlen;
		int64_t created = 0;
		int rc = index_created(s, mns[i], im->bucket, im->index, &created);

		if (rc) {
			snprintf(err, errlen, "memory node %u: reading the state of %s/%s: %s", mns[i],
				 im->bucket, im->index, strerror(-rc));
			return rc;
		}
		dm_buf_str(&w, im->bucket);
		dm_buf_str(&w, im->index);
		dm_buf_u64(&w, (uint64_t)created);
		dm_buf_u64(&w, rows);
		dm_buf_u64(&w, gen);
		rc = w.oom ? -ENOMEM : !s->link[mns[i]].up ? -EHOSTDOWN :
		     dm_fl_call(&s->link[mns[i]].ch, DM_OP_FL_MARK, w.p, w.n, DM_FL_MIN_MSG, 10000,
				&resp, &rlen);
		dm_buf_free(&w);
		free(resp);
		if (rc) {
			snprintf(err, errlen, "memory node %u: %s", mns[i], rc == -EBUSY ?
				 "the index was written during the import (its row count is not the "
				 "image's)" : strerror(-rc));
			return rc;
		}
	}
	return 0;
}
