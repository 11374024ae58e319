/* s3_api_vectors.c: the vector operations (PutVectors, GetVectors, ListVectors,
 * DeleteVectors) over a flat store, with the AWS limits. */
#include "s3_api_int.h"
#include "s3_scope.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ---------------------------------------------------------------- vectors ---------- */

void s3a_op_put_vectors(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	struct flat_index *ix;
	json_t *vs = json_object_get(o, "vectors"), *v;
	const struct flat_index_info *in;
	struct flat_row_in *rows = NULL;
	float *data = NULL;
	char **mj = NULL;
	uint8_t **fm = NULL;
	struct nfkeys nf = { 0 };
	char scope[S3_SCOPE_KEY_MAX + 1] = "";
	size_t n, i;
	int rc;

	if (!json_is_array(vs) || !json_array_size(vs) || json_array_size(vs) > S3_PUT_MAX) {
		s3a_verr(r, "/vectors", "vectors must be an array of 1 to %d vectors", S3_PUT_MAX);
		return;
	}
	ix = s3a_open_index(a, r, o);
	if (!ix)
		return;
	in = flat_index_info(ix);
	n = json_array_size(vs);
	rows = calloc(n, sizeof(*rows));
	data = malloc(n * in->dim * sizeof(float));
	mj = calloc(n, sizeof(*mj));
	fm = calloc(n, sizeof(*fm));
	if (!rows || !data || !mj || !fm) {
		s3a_engine_err(r, -ENOMEM, "");
		goto out;
	}
	s3a_nf_load(ix, &nf);
	if (s3_scope_conf_key(in->conf, in->conf_len, scope) < 0)
		scope[0] = 0;
	json_array_foreach(vs, i, v) {
		char path[64], err[256];
		json_t *key = json_object_get(v, "key");
		size_t ml, fl;

		snprintf(path, sizeof(path), "/vectors/%zu", i);
		if (!json_is_object(v)) {
			s3a_verr(r, path, "each vector must be an object");
			goto out;
		}
		snprintf(path, sizeof(path), "/vectors/%zu/key", i);
		if (!json_is_string(key) || json_string_length(key) < 1 ||
		    json_string_length(key) > FLAT_KEY_MAX ||
		    strlen(json_string_value(key)) != json_string_length(key)) {
			s3a_verr(r, path, "key must be a string of 1 to %d characters", FLAT_KEY_MAX);
			goto out;
		}
		snprintf(path, sizeof(path), "/vectors/%zu/data", i);
		if (s3a_read_vector(r, json_object_get(v, "data"), path, in->dim,
				in->metric == DM_METRIC_COS, data + i * in->dim))
			goto out;
		json_t *meta = json_object_get(v, "metadata");

		if (json_is_null(meta))
			meta = NULL;
		rc = s3_meta_encode(meta, nf.k, nf.n, &mj[i], &ml, &fm[i], &fl, err, sizeof(err));
		if (rc) {
			snprintf(path, sizeof(path), "/vectors/%zu/metadata", i);
			if (rc == -EINVAL)
				s3a_verr(r, path, "%s", err);
			else
				s3a_engine_err(r, rc, "");
			goto out;
		}
		/* A scoped index (s3_scope.h): its scope key holds a string, or is absent. */
		const char *sv;
		uint32_t svl;

		snprintf(path, sizeof(path), "/vectors/%zu/metadata", i);
		if (scope[0] && s3_scope_value(fm[i], fl, scope, &sv, &svl) < 0) {
			s3a_verr(r, path, "metadata key '%s' is this index's scope: its value must "
				 "be a string", scope);
			goto out;
		}
		rows[i] = (struct flat_row_in){ json_string_value(key), data + i * in->dim, mj[i],
						(uint32_t)ml, fm[i], (uint32_t)fl };
	}
	rc = s3a_check_only(a, o) ? 0 : flat_put(ix, rows, n);
	if (rc)
		s3a_engine_err(r, rc, "index");
	else
		s3a_ok(r, NULL);
out:
	for (i = 0; mj && fm && i < n; i++) {
		free(mj[i]);
		free(fm[i]);
	}
	free(mj);
	free(fm);
	free(rows);
	free(data);
	json_decref(nf.conf);
	flat_index_put(ix);
}

/* Collects rows into a JSON array for Get/List. */
struct rowcol {
	json_t *arr;
	uint32_t dim;
	bool data, meta;
	size_t bytes, max_bytes;
};

static json_t *row_json(const struct flat_row *row, uint32_t dim, bool data, bool meta)
{
	json_t *o = json_pack("{s:s}", "key", row->key);

	if (data)
		json_object_set_new(o, "data", s3a_vector_data(row->vec, dim));
	if (meta) {
		json_t *m = row->meta_len ? json_loadb(row->meta, row->meta_len, 0, NULL) : NULL;

		json_object_set_new(o, "metadata", m ? m : json_object());
	}
	return o;
}

static int collect_row(void *ctx, const struct flat_row *row)
{
	struct rowcol *c = ctx;
	size_t est = strlen(row->key) + 16 + (c->data ? c->dim * 12u : 0) +
		     (c->meta ? row->meta_len : 0);

	/* ListVectors ends a page early at about 1 MB (always at least one row). */
	if (c->max_bytes && json_array_size(c->arr) && c->bytes + est > c->max_bytes)
		return -1;
	c->bytes += est;
	json_array_append_new(c->arr, row_json(row, c->dim, c->data, c->meta));
	return 0;
}

static int read_keys(struct s3_resp *r, json_t *o, size_t max, const char ***keys, size_t *n)
{
	json_t *ks = json_object_get(o, "keys"), *e;
	size_t i;

	if (!json_is_array(ks) || !json_array_size(ks) || json_array_size(ks) > max)
		return s3a_verr(r, "/keys", "keys must be an array of 1 to %zu keys", max);
	*n = json_array_size(ks);
	*keys = calloc(*n, sizeof(**keys));
	if (!*keys) {
		s3a_engine_err(r, -ENOMEM, "");
		return -ENOMEM;
	}
	json_array_foreach(ks, i, e) {
		if (!json_is_string(e) || json_string_length(e) < 1 ||
		    json_string_length(e) > FLAT_KEY_MAX ||
		    strlen(json_string_value(e)) != json_string_length(e)) {
			char path[48];

			snprintf(path, sizeof(path), "/keys/%zu", i);
			free(*keys);
			*keys = NULL;
			return s3a_verr(r, path, "keys must be strings of 1 to %d characters",
				    FLAT_KEY_MAX);
		}
		(*keys)[i] = json_string_value(e);
	}
	return 0;
}

void s3a_op_get_vectors(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	const char **keys;
	size_t n;
	struct rowcol c = { 0 };
	struct flat_index *ix;

	if (read_keys(r, o, S3_GET_MAX, &keys, &n))
		return;
	if (s3a_get_bool(r, o, "returnData", &c.data) < 0 ||
	    s3a_get_bool(r, o, "returnMetadata", &c.meta) < 0) {
		free(keys);
		return;
	}
	ix = s3a_open_index(a, r, o);
	if (!ix) {
		free(keys);
		return;
	}
	c.dim = flat_index_info(ix)->dim;
	c.arr = json_array();
	flat_get(ix, keys, n, collect_row, &c);
	flat_index_put(ix);
	free(keys);
	s3a_ok(r, json_pack("{s:o}", "vectors", c.arr));
}

void s3a_op_list_vectors(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	long long max = S3_LIST_VECTORS_DEFAULT, segc = 0, segi = -1;
	struct rowcol c = { .max_bytes = S3_LIST_PAGE_BYTES };
	char plain[128];
	bool have;
	uint64_t start = 0, next;
	struct flat_index *ix;
	json_t *out;
	int hc, hi;

	if (s3a_get_int(r, o, "maxResults", 1, S3_LIST_VECTORS_MAX, &max) < 0 ||
	    (hc = s3a_get_int(r, o, "segmentCount", 1, S3_LIST_SEGMENTS_MAX, &segc)) < 0 ||
	    (hi = s3a_get_int(r, o, "segmentIndex", 0, S3_LIST_SEGMENTS_MAX - 1, &segi)) < 0 ||
	    s3a_get_bool(r, o, "returnData", &c.data) < 0 ||
	    s3a_get_bool(r, o, "returnMetadata", &c.meta) < 0 ||
	    s3a_get_token(r, o, plain, sizeof(plain), &have) < 0)
		return;
	if (hc != hi) {
		s3a_verr(r, hc ? "/segmentIndex" : "/segmentCount",
		     "segmentCount and segmentIndex must be given together");
		return;
	}
	if (hc && segi >= segc) {
		s3a_verr(r, "/segmentIndex", "segmentIndex must be less than segmentCount");
		return;
	}
	ix = s3a_open_index(a, r, o);
	if (!ix)
		return;
	if (have) {
		uint64_t ep;
		long long tc, ti;
		int end = 0;

		if (sscanf(plain, "v:%" SCNx64 ":%lld:%lld:%" SCNu64 "%n", &ep, &tc, &ti, &start,
			   &end) != 4 || plain[end] || ep != a->epoch || tc != segc ||
		    ti != (hc ? segi : -1)) {
			flat_index_put(ix);
			s3a_verr(r, "/nextToken", "Invalid nextToken (it must come from the previous "
			     "page of the same listing, since the gateway last started)");
			return;
		}
	}
	c.dim = flat_index_info(ix)->dim;
	c.arr = json_array();
	flat_list(ix, start, hc ? (uint32_t)segc : 0, hc ? (uint32_t)segi : 0, (size_t)max,
		  collect_row, &c, &next);
	flat_index_put(ix);
	out = json_pack("{s:o}", "vectors", c.arr);
	if (next != UINT64_MAX) {
		char *t;

		snprintf(plain, sizeof(plain), "v:%" PRIx64 ":%lld:%lld:%" PRIu64, a->epoch, segc,
			 hc ? segi : -1, next);
		t = s3a_token_make(plain);
		json_object_set_new(out, "nextToken", json_string(t));
		free(t);
	}
	s3a_ok(r, out);
}

void s3a_op_delete_vectors(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	const char **keys;
	size_t n;
	struct flat_index *ix;
	int rc;

	if (read_keys(r, o, S3_DELETE_MAX, &keys, &n))
		return;
	ix = s3a_open_index(a, r, o);
	if (!ix) {
		free(keys);
		return;
	}
	rc = s3a_check_only(a, o) ? 0 : flat_delete(ix, keys, n);
	flat_index_put(ix);
	free(keys);
	if (rc)
		s3a_engine_err(r, rc, "index");
	else
		s3a_ok(r, NULL);
}
