/* dmann_ops.c: the calls of dmann.h as S3 Vectors operations: argument checks (names, keys,
 * dimension, NaN/Inf, batch size) before anything is sent, request bodies (JSON, floats
 * with 9 significant digits so that every float32 round-trips exactly), splitting into
 * C_CALLs of at most DM_C_MAX_REQ bytes and the S3 per-call limits, and the answers
 * (results, AWS errors mapped to -errno with the server's message). */
#include "dmann_int.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define JFLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9) | JSON_ENCODE_ANY)
#define PUT_MAX 500     /* S3 Vectors: vectors per PutVectors */
#define GET_MAX 100     /* keys per GetVectors */
#define DEL_MAX 500     /* keys per DeleteVectors */

static int name_ok(const char *what, const char *s)
{
	size_t n = s ? strlen(s) : 0;

	if (n == 0 || n > 63)
		return dmann_fail(-EINVAL, "%s name must be 1..63 characters", what);
	return 0;
}

static int keys_ok(size_t n, const char *const *keys)
{
	if (n > DMANN_MAX_BATCH)
		return dmann_fail(-E2BIG, "batch of %zu items exceeds the limit of %u", n,
				  DMANN_MAX_BATCH);
	if (n && !keys)
		return dmann_fail(-EINVAL, "keys is NULL");
	for (size_t i = 0; i < n; i++) {
		size_t l = keys[i] ? strlen(keys[i]) : 0;

		if (l == 0 || l > DMANN_MAX_KEY)
			return dmann_fail(-EINVAL, "key %zu must be 1..%u bytes", i, DMANN_MAX_KEY);
	}
	return 0;
}

static int vecs_ok(const float *v, size_t n, uint32_t dim)
{
	if (n && !v)
		return dmann_fail(-EINVAL, "vectors is NULL");
	for (size_t i = 0; i < n * dim; i++)
		if (!isfinite(v[i]))
			return dmann_fail(-EINVAL, "vector %zu has a NaN or Inf component (%zu)",
					  i / dim, i % dim);
	return 0;
}

/* The answer of a failed operation: -errno from the AWS error type, message kept. */
static int aws_error(int status, const char *json, size_t len)
{
	json_t *o = json_loadb(json, len, 0, NULL);
	const char *type = json_string_value(json_object_get(o, "__type"));
	const char *msg = json_string_value(json_object_get(o, "message"));
	int err = status == 404 ? -ENOENT : status == 409 ? -EEXIST : status == 403 ? -EPERM :
		  status == 503 ? -EAGAIN : status == 413 ? -E2BIG : status == 402 ? -ENOSPC :
		  status < 500 ? -EINVAL :
		  -EIO;

	if (type && strstr(type, "NotFound"))
		err = -ENOENT;
	dmann_fail(err, "%s: %s", type ? type : "error", msg ? msg : "(no message)");
	json_decref(o);
	return err;
}

/* Encode call{op} + text into r. */
static int req_set(struct dmann_req *r, uint32_t op, const char *text, size_t tlen)
{
	struct dm_wire_c_call m = { .op = op, .json_len = (uint32_t)tlen };

	if (DM_WIRE_HDR_LEN + sizeof(m) + tlen > DM_C_MAX_REQ)
		return dmann_fail(-E2BIG, "request of %zu bytes exceeds %u", tlen, DM_C_MAX_REQ);
	r->body = malloc(sizeof(m) + tlen);
	if (!r->body)
		return -ENOMEM;
	dm_wire_c_call_encode(r->body, &m);
	memcpy(r->body + sizeof(m), text, tlen);
	r->blen = (uint32_t)(sizeof(m) + tlen);
	r->read = op == DM_C_GET_BUCKET || op == DM_C_LIST_BUCKETS || op == DM_C_GET_INDEX ||
		  op == DM_C_LIST_INDEXES || op == DM_C_GET_VECTORS || op == DM_C_LIST_VECTORS ||
		  op == DM_C_QUERY_VECTORS;
	return 0;
}

static int req_json(struct dmann_req *r, uint32_t op, json_t *o)
{
	char *t = o ? json_dumps(o, JFLAGS) : NULL;
	int rc = t ? req_set(r, op, t, strlen(t)) : -ENOMEM;

	free(t);
	json_decref(o);
	return rc;
}

static void reqs_free(struct dmann_req *r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(r[i].body);
	free(r);
}

/* done() keeping the parsed answer (json_t *) in r->ctx. */
static int keep_done(struct dmann_req *r, int status, const char *json, size_t len)
{
	if (status >= 300)
		return aws_error(status, json, len);
	r->ctx = json_loadb(json, len, 0, NULL);
	return r->ctx ? 0 : dmann_fail(-EIO, "unparsable answer");
}

/* One operation; *out (if not NULL) gets the answer object. */
static int call1(dmann_t *d, uint32_t op, json_t *o, json_t **out)
{
	struct dmann_req r = { .done = keep_done };
	int rc = req_json(&r, op, o);

	if (!rc)
		rc = dmann_run(d, &r, 1);
	free(r.body);
	if (out && !rc)
		*out = r.ctx;
	else
		json_decref(r.ctx);
	return rc;
}

static json_t *names(const char *bucket, const char *index)
{
	return index ? json_pack("{s:s, s:s}", "vectorBucketName", bucket, "indexName", index) :
		       json_pack("{s:s}", "vectorBucketName", bucket);
}

static json_t *floats(const float *v, uint32_t dim)
{
	json_t *a = json_array();

	for (uint32_t i = 0; a && i < dim; i++)
		json_array_append_new(a, json_real(v[i]));
	return a;
}

static int check(dmann_t *d, const char *bucket, const char *index)
{
	dmann_clear_err();
	if (!d)
		return dmann_fail(-EINVAL, "no connection handle");
	return name_ok("bucket", bucket) ?: name_ok("index", index);
}

int dmann_describe_index(dmann_t *d, const char *bucket, const char *index, uint32_t *dim,
			 enum dmann_metric *metric)
{
	json_t *a = NULL, *ix;
	int rc = check(d, bucket, index);

	if (!rc)
		rc = call1(d, DM_C_GET_INDEX, names(bucket, index), &a);
	if (rc)
		return rc;
	ix = json_object_get(a, "index");
	if (dim)
		*dim = (uint32_t)json_integer_value(json_object_get(ix, "dimension"));
	if (metric) {
		const char *m = json_string_value(json_object_get(ix, "distanceMetric"));

		*metric = m && !strcmp(m, "cosine") ? DMANN_COSINE : DMANN_EUCLIDEAN;
	}
	json_decref(a);
	return 0;
}

int dmann_create_index(dmann_t *d, const char *bucket, const char *index, uint32_t dim,
		       enum dmann_metric metric)
{
	int rc = check(d, bucket, index);

	if (rc)
		return rc;
	if (dim == 0 || dim > DMANN_MAX_DIM)
		return dmann_fail(-EINVAL, "dimension %u is outside 1..%u", dim, DMANN_MAX_DIM);
	if (metric != DMANN_EUCLIDEAN && metric != DMANN_COSINE)
		return dmann_fail(-EINVAL, "unknown metric %d", (int)metric);
	rc = call1(d, DM_C_CREATE_BUCKET, names(bucket, NULL), NULL);
	if (rc && rc != -EEXIST)
		return rc;
	json_t *o = names(bucket, index);

	json_object_set_new(o, "dataType", json_string("float32"));
	json_object_set_new(o, "dimension", json_integer(dim));
	json_object_set_new(o, "distanceMetric",
			    json_string(metric == DMANN_COSINE ? "cosine" : "euclidean"));
	return call1(d, DM_C_CREATE_INDEX, o, NULL);
}

int dmann_drop_index(dmann_t *d, const char *bucket, const char *index)
{
	int rc = check(d, bucket, index);

	return rc ? rc : call1(d, DM_C_DELETE_INDEX, names(bucket, index), NULL);
}

/* The index's dimension must be what the caller passes. */
static int index_dim(dmann_t *d, const char *bucket, const char *index, uint32_t want)
{
	uint32_t dim = 0;
	int rc = dmann_describe_index(d, bucket, index, &dim, NULL);

	if (rc == -ENOENT)
		return dmann_fail(rc, "no index '%s' in bucket '%s'", index, bucket);
	if (!rc && dim != want)
		return dmann_fail(-EINVAL, "wrong dimension: %u, index '%s' has %u", want, index,
				  dim);
	return rc;
}

/* Answers that only need a success status. */
static int ok_done(struct dmann_req *r, int status, const char *json, size_t len)
{
	(void)r;
	return status >= 300 ? aws_error(status, json, len) : 0;
}

int dmann_put(dmann_t *d, const char *bucket, const char *index, size_t n,
	      const char *const *keys, const float *vectors, uint32_t dim,
	      const char *const *metadata)
{
	struct dmann_req *reqs = NULL;
	size_t nr = 0, i = 0;
	char *pre = NULL;
	int rc = check(d, bucket, index);

	if (!rc)
		rc = keys_ok(n, keys) ?: index_dim(d, bucket, index, dim);
	if (!rc)
		rc = vecs_ok(vectors, n, dim);
	if (rc || n == 0)
		return rc;
	reqs = calloc(n, sizeof(*reqs));
	json_t *nm = names(bucket, index);

	pre = nm ? json_dumps(nm, JFLAGS) : NULL;   /* {"vectorBucketName":..,..} */
	json_decref(nm);
	if (!reqs || !pre) {
		rc = -ENOMEM;
		goto out;
	}
	pre[strlen(pre) - 1] = 0;
	/* Pack vectors into calls: {names, "vectors":[item, ...]} under the size limit. */
	while (i < n && !rc) {
		size_t cap = DM_C_MAX_REQ, len, cnt = 0;
		char *text = malloc(cap);

		if (!text) {
			rc = -ENOMEM;
			break;
		}
		len = (size_t)snprintf(text, cap, "%s,\"vectors\":[", pre);
		while (i < n && cnt < PUT_MAX) {
			json_t *it = json_pack("{s:s, s:{s:o}}", "key", keys[i], "data", "float32",
					       floats(vectors + i * dim, dim));
			char *s;
			size_t sl;

			if (it && metadata && metadata[i]) {
				json_error_t je;
				json_t *md = json_loads(metadata[i], 0, &je);

				if (!json_is_object(md)) {
					json_decref(md);
					json_decref(it);
					rc = dmann_fail(-EINVAL, "metadata %zu is not a JSON object", i);
					break;
				}
				json_object_set_new(it, "metadata", md);
			}
			s = it ? json_dumps(it, JFLAGS) : NULL;
			json_decref(it);
			if (!s) {
				rc = -ENOMEM;
				break;
			}
			sl = strlen(s);
			if (len + sl + 3 + sizeof(struct dm_wire_c_call) + DM_WIRE_HDR_LEN > cap) {
				free(s);
				if (cnt == 0)
					rc = dmann_fail(-E2BIG, "vector %zu (key and metadata) does not "
							"fit one request of %u bytes", i, DM_C_MAX_REQ);
				break;
			}
			if (cnt)
				text[len++] = ',';
			memcpy(text + len, s, sl);
			len += sl;
			free(s);
			cnt++;
			i++;
		}
		if (!rc) {
			memcpy(text + len, "]}", 2);
			reqs[nr].done = ok_done;
			rc = req_set(&reqs[nr++], DM_C_PUT_VECTORS, text, len + 2);
		}
		free(text);
	}
	if (!rc)
		rc = dmann_run(d, reqs, nr);
out:
	free(pre);
	if (reqs)
		reqs_free(reqs, nr);
	return rc;
}

/* Requests over keys in chunks of per; each gets {names, "keys":[...]} + extra. */
static int key_reqs(const char *bucket, const char *index, size_t n, const char *const *keys,
		    size_t per, uint32_t op, bool data, struct dmann_req **out, size_t *nout)
{
	size_t nr = (n + per - 1) / per;
	struct dmann_req *r = calloc(nr ? nr : 1, sizeof(*r));
	int rc = 0;

	if (!r)
		return -ENOMEM;
	for (size_t c = 0; c < nr && !rc; c++) {
		json_t *o = names(bucket, index), *a = json_array();

		for (size_t i = c * per; i < n && i < (c + 1) * per; i++)
			json_array_append_new(a, json_string(keys[i]));
		json_object_set_new(o, "keys", a);
		if (data)
			json_object_set_new(o, "returnData", json_true());
		r[c].index = c * per;
		rc = req_json(&r[c], op, o);
	}
	*out = r;
	*nout = nr;
	return rc;
}

int dmann_delete(dmann_t *d, const char *bucket, const char *index, size_t n,
		 const char *const *keys)
{
	struct dmann_req *r = NULL;
	size_t nr = 0;
	int rc = check(d, bucket, index);

	if (!rc)
		rc = keys_ok(n, keys);
	if (rc || n == 0)
		return rc;
	rc = key_reqs(bucket, index, n, keys, DEL_MAX, DM_C_DELETE_VECTORS, false, &r, &nr);
	for (size_t i = 0; i < nr; i++)
		r[i].done = ok_done;
	if (!rc)
		rc = dmann_run(d, r, nr);
	reqs_free(r, nr);
	return rc;
}

int dmann_get(dmann_t *d, const char *bucket, const char *index, size_t n,
	      const char *const *keys, float *out, uint32_t dim, uint8_t *found)
{
	struct dmann_req *r = NULL;
	size_t nr = 0;
	int rc = check(d, bucket, index), nfound = 0;

	if (!rc)
		rc = keys_ok(n, keys) ?: index_dim(d, bucket, index, dim);
	if (rc || n == 0)
		return rc;
	if (out)
		memset(out, 0, n * dim * sizeof(float));
	if (found)
		memset(found, 0, n);
	rc = key_reqs(bucket, index, n, keys, GET_MAX, DM_C_GET_VECTORS, true, &r, &nr);
	for (size_t i = 0; i < nr; i++)
		r[i].done = keep_done;
	if (!rc)
		rc = dmann_run(d, r, nr);
	for (size_t c = 0; c < nr; c++) {
		json_t *v, *vs = json_object_get(r[c].ctx, "vectors");
		size_t j;

		json_array_foreach(vs, j, v) {
			const char *key = json_string_value(json_object_get(v, "key"));
			json_t *f = json_object_get(json_object_get(v, "data"), "float32");

			/* The answer lists found keys; match them to this chunk's keys. */
			for (size_t i = r[c].index; key && i < n && i < r[c].index + GET_MAX; i++) {
				if (strcmp(keys[i], key))
					continue;
				if (found && !found[i])
					nfound++;
				else if (!found)
					nfound++;
				if (found)
					found[i] = 1;
				for (uint32_t e = 0; out && e < dim && e < json_array_size(f); e++)
					out[i * dim + e] = (float)json_number_value(json_array_get(f, e));
				break;
			}
		}
		json_decref(r[c].ctx);
	}
	reqs_free(r, nr);
	return rc ? rc : nfound;
}

struct qout {
	char **keys;
	float *dist;
	uint32_t *counts;
	uint32_t k;
};

static int query_done(struct dmann_req *r, int status, const char *json, size_t len)
{
	struct qout *q = r->ctx;
	json_t *o, *vs, *v;
	size_t j;

	if (status >= 300)
		return aws_error(status, json, len);
	o = json_loadb(json, len, 0, NULL);
	vs = json_object_get(o, "vectors");
	if (!json_is_array(vs)) {
		json_decref(o);
		return dmann_fail(-EIO, "unparsable query answer");
	}
	json_array_foreach(vs, j, v) {
		size_t at = r->index * q->k + j;
		const char *key = json_string_value(json_object_get(v, "key"));

		if (j >= q->k || !key)
			break;
		q->keys[at] = strdup(key);
		q->dist[at] = (float)json_number_value(json_object_get(v, "distance"));
		if (q->counts)
			q->counts[r->index] = (uint32_t)j + 1;
	}
	json_decref(o);
	return 0;
}

int dmann_batch_query(dmann_t *d, const char *bucket, const char *index, const float *vectors,
		      size_t nq, uint32_t dim, uint32_t k, char **keys, float *distances,
		      uint32_t *counts)
{
	struct qout q = { .keys = keys, .dist = distances, .counts = counts, .k = k };
	struct dmann_req *r;
	int rc = check(d, bucket, index);

	if (rc)
		return rc;
	if (nq > DMANN_MAX_BATCH)
		return dmann_fail(-E2BIG, "batch of %zu queries exceeds the limit of %u", nq,
				  DMANN_MAX_BATCH);
	if (k == 0 || k > DMANN_MAX_K)
		return dmann_fail(-EINVAL, "k = %u is outside 1..%u", k, DMANN_MAX_K);
	if (!keys || !distances)
		return dmann_fail(-EINVAL, "keys and distances must not be NULL");
	rc = index_dim(d, bucket, index, dim) ?: vecs_ok(vectors, nq, dim);
	if (rc || nq == 0)
		return rc;
	for (size_t i = 0; i < nq * k; i++) {
		keys[i] = NULL;
		distances[i] = INFINITY;
	}
	if (counts)
		memset(counts, 0, nq * sizeof(*counts));
	r = calloc(nq, sizeof(*r));
	if (!r)
		return -ENOMEM;
	for (size_t i = 0; i < nq && !rc; i++) {
		json_t *o = names(bucket, index);

		json_object_set_new(o, "queryVector",
				    json_pack("{s:o}", "float32", floats(vectors + i * dim, dim)));
		json_object_set_new(o, "topK", json_integer(k));
		json_object_set_new(o, "returnDistance", json_true());
		r[i] = (struct dmann_req){ .done = query_done, .ctx = &q, .index = i };
		rc = req_json(&r[i], DM_C_QUERY_VECTORS, o);
	}
	if (!rc)
		rc = dmann_run(d, r, nq);
	reqs_free(r, nq);
	return rc;
}

int dmann_query(dmann_t *d, const char *bucket, const char *index, const float *vector,
		uint32_t dim, uint32_t k, char **keys, float *distances)
{
	uint32_t n = 0;
	int rc = dmann_batch_query(d, bucket, index, vector, 1, dim, k, keys, distances, &n);

	return rc ? rc : (int)n;
}

void dmann_free_keys(char **keys, size_t n)
{
	for (size_t i = 0; keys && i < n; i++) {
		free(keys[i]);
		keys[i] = NULL;
	}
}
