/* cn_s3_shard.c: the shards of a vector bucket on the gateway (docs/api.md "Buckets of
 * several shards"). A bucket B created while [s3] bucket_shards is S > 1 holds its rows in
 * S shards: shard 0 is B itself (its catalog too), shard s > 0 the bucket "B#s" on the
 * memory nodes (placed, replicated and caught up like any bucket). A row's shard is
 * s3_key_shard(key) mod S. Here: the shard count of a bucket (recorded with it on the
 * memory nodes, cached for a second), the catalog operations that create and delete the
 * shards with the bucket and its indexes, PutVectors/DeleteVectors/GetVectors split by
 * shard and ListVectors walking the shards. QueryVectors scans every shard
 * (cn_s3_query.c). A bucket of one shard never comes here: today's path, unchanged. */
#include "cn_s3_int.h"
#include "s3_scope.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHARDS_TTL_NS 1000000000ull

/* ---- the shard count of a bucket ---- */

static struct shcount *shc_slot(struct cn_s3 *s, const char *b)
{
	return &s->shc[flat_key_hash(b, strlen(b)) % DM_ARRAY_SIZE(s->shc)];
}

static void shc_forget(struct cn_s3 *s, const char *b)
{
	struct shcount *c = shc_slot(s, b);

	pthread_mutex_lock(&s->shmu);
	if (!strcmp(c->b, b))
		c->b[0] = 0;
	pthread_mutex_unlock(&s->shmu);
}

int bucket_shards(struct cn_s3 *s, const char *b, bool fresh, uint32_t *n, struct s3_resp *r)
{
	struct shcount *c = shc_slot(s, b);
	uint64_t now = dm_now_ns();
	json_t *o, *v;
	char *req;

	pthread_mutex_lock(&s->shmu);
	if (!fresh && !strcmp(c->b, b) && now - c->at < SHARDS_TTL_NS) {
		*n = c->n;
		pthread_mutex_unlock(&s->shmu);
		return 0;
	}
	pthread_mutex_unlock(&s->shmu);
	o = json_pack("{s:s, s:b}", "vectorBucketName", b, "_dmannShards", 1);
	req = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!req) {
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
		return -ENOMEM;
	}
	bucket_op(s, "GetVectorBucket", req, strlen(req), b, true, r);
	free(req);
	if (r->status == 404) {
		s3_resp_free(r);
		memset(r, 0, sizeof(*r));
		*n = 1;                          /* no such bucket: the operation says so */
		return 0;
	}
	if (r->status != 200)
		return -EIO;                     /* e.g. 503: no replica reachable */
	o = json_loadb(r->body, r->len, 0, NULL);
	v = json_object_get(json_object_get(o, "vectorBucket"), "_dmannShards");
	/* absent: a memory node from before shards (every bucket of one shard) */
	*n = !v ? 1 : json_is_integer(v) && json_integer_value(v) >= 1 &&
	     json_integer_value(v) <= DM_S3_SHARDS_MAX ? (uint32_t)json_integer_value(v) : 0;
	json_decref(o);
	s3_resp_free(r);
	memset(r, 0, sizeof(*r));
	if (!*n) {
		s3_resp_error(r, 500, "InternalServerException", "bucket %s: no shard count", b);
		return -EBADMSG;
	}
	pthread_mutex_lock(&s->shmu);
	snprintf(c->b, sizeof(c->b), "%s", b);
	c->n = *n;
	c->at = now;
	pthread_mutex_unlock(&s->shmu);
	return 0;
}

/* ---- requests to one shard ---- */

/* o (a user's request) for shard `shard` of bucket b, index x (NULL: a bucket request):
 * named by vectorBucketName (ARNs dropped), with the shard count n the gateway splits by.
 * A new reference, or NULL. */
static json_t *part_of(json_t *o, const char *b, const char *x, uint32_t shard, uint32_t n)
{
	char name[NAME_MAX_ + 1];
	json_t *p = json_deep_copy(o);

	if (!p || s3_shard_name(b, shard, name)) {
		json_decref(p);
		return NULL;
	}
	json_object_del(p, "vectorBucketArn");
	json_object_del(p, "indexArn");
	json_object_set_new(p, "vectorBucketName", json_string(name));
	if (x)
		json_object_set_new(p, "indexName", json_string(x));
	json_object_set_new(p, "_dmannShards", json_integer(n));
	return p;
}

/* Run op with body p (consumed) on shard `shard` of b: r filled. */
static void part_run(struct cn_s3 *s, const char *op, json_t *p, const char *b, uint32_t shard,
		     bool read, struct s3_resp *r)
{
	char name[NAME_MAX_ + 1];
	char *txt = p ? json_dumps(p, JSON_COMPACT) : NULL;

	json_decref(p);
	memset(r, 0, sizeof(*r));
	if (!txt || s3_shard_name(b, shard, name)) {
		free(txt);
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
		return;
	}
	bucket_op(s, op, txt, strlen(txt), name, read, r);
	free(txt);
}

/* Whether r is a memory node's answer that the shard count the gateway used is stale. */
static bool count_stale(const struct s3_resp *r)
{
	return r->status == 409 && r->body && strstr(r->body, S3_SHARDS_DIFFER);
}

/* ---- catalog: buckets and indexes with their shards ---- */

/* Create shards 1..n-1 of bucket b (op CreateVectorBucket, x NULL) or of index x in them
 * (CreateIndex, body o): one left over from a delete that did not reach every shard is
 * deleted first. 0, or -1 with the error in r. */
static int create_shards(struct cn_s3 *s, const char *op, json_t *o, const char *b,
			 const char *x, uint32_t n, struct s3_resp *r)
{
	const char *del = x ? "DeleteIndex" : "DeleteVectorBucket";

	for (uint32_t i = 1; i < n; i++) {
		json_t *p = part_of(o, b, x, i, n);

		json_t *sc = json_object_get(json_object_get(o, "tags"), S3_SCOPE_TAG);

		json_object_del(p, "tags");     /* the user's tags stay with shard 0 */
		if (x && sc)                    /* but every shard's index has its scope */
			json_object_set_new(p, "tags", json_pack("{s:O}", S3_SCOPE_TAG, sc));
		part_run(s, op, json_incref(p), b, i, false, r);
		if (r->status == 409) {
			json_t *d = part_of(o, b, x, i, n);

			s3_resp_free(r);
			json_object_del(d, "_dmannShards");
			part_run(s, del, d, b, i, false, r);
			s3_resp_free(r);
			part_run(s, op, json_incref(p), b, i, false, r);
		}
		json_decref(p);
		if (r->status != 200)
			return -1;
		s3_resp_free(r);
	}
	return 0;
}

/* Delete shards 1..n-1 of bucket b (x NULL) or index x in them. Shards not found are
 * fine; one that cannot be reached now keeps its leftover until the name is created
 * again (create_shards). */
static void delete_shards(struct cn_s3 *s, json_t *o, const char *b, const char *x,
			  uint32_t n)
{
	for (uint32_t i = 1; i < n; i++) {
		json_t *p = part_of(o, b, x, i, n);
		struct s3_resp one;

		json_object_del(p, "_dmannShards");
		part_run(s, x ? "DeleteIndex" : "DeleteVectorBucket", p, b, i, false, &one);
		if (one.status != 200 && one.status != 404)
			dm_warn("s3: %s of %s%s%s: shard %u left over (%d)", x ? "DeleteIndex" :
				"DeleteVectorBucket", b, x ? "/" : "", x ? x : "", i, one.status);
		s3_resp_free(&one);
	}
}

/* CreateVectorBucket of [s3] bucket_shards S > 1: B (which decides: validation, conflict)
 * recording S, then B#1..B#S-1; when a shard cannot be made, B is deleted again. */
static void create_bucket(struct cn_s3 *s, json_t *o, const char *b, struct s3_resp *r)
{
	json_t *p = json_deep_copy(o);

	json_object_set_new(p, "_dmannShards", json_integer(s->shards));
	part_run(s, "CreateVectorBucket", p, b, 0, false, r);
	shc_forget(s, b);
	if (r->status != 200)
		return;
	struct s3_resp first = *r;

	if (create_shards(s, "CreateVectorBucket", o, b, NULL, s->shards, r)) {
		struct s3_resp undo;
		json_t *d = json_pack("{s:s}", "vectorBucketName", b);

		dm_warn("s3: CreateVectorBucket %s: a shard could not be created (%d); undone", b,
			r->status);
		delete_shards(s, d, b, NULL, s->shards);
		part_run(s, "DeleteVectorBucket", d, b, 0, false, &undo);
		s3_resp_free(&undo);
		s3_resp_free(&first);
		return;
	}
	*r = first;
}

/* ---- vectors ---- */

/* The key of element e of a PutVectors "vectors" (or of "keys"), or NULL. */
static const char *key_of(json_t *e, bool put)
{
	return json_string_value(put ? json_object_get(e, "key") : e);
}

/* PutVectors / DeleteVectors: the whole request checked by shard 0 without being applied
 * (the same validation and errors as one bucket), then each shard's part written to
 * that shard's replicas; the request succeeds when every part did. A part that fails
 * answers (the parts before it stay written, as a write that fails on a replica). */
static int write_split(struct cn_s3 *s, const char *op, json_t *o, const char *b,
		       const char *x, uint32_t n, struct s3_resp *r)
{
	bool put = !strcmp(op, "PutVectors");
	json_t *arr = json_object_get(o, put ? "vectors" : "keys"), *e, *p;
	json_t **parts = calloc(n, sizeof(*parts));
	size_t i;

	if (!parts) {
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
		return -ENOMEM;
	}
	p = part_of(o, b, x, 0, n);
	json_object_set_new(p, "_dmannCheck", json_true());
	part_run(s, op, p, b, 0, true, r);
	if (r->status != 200 || count_stale(r)) {
		free(parts);
		return count_stale(r) ? -ESTALE : 0;
	}
	s3_resp_free(r);
	json_array_foreach(arr, i, e) {
		const char *k = key_of(e, put);
		uint32_t sh = s3_key_shard(k, strlen(k), n);

		if (!parts[sh])
			parts[sh] = json_array();
		json_array_append(parts[sh], e);
	}
	for (uint32_t sh = 0; sh < n; sh++) {
		if (!parts[sh])
			continue;
		if (!r->status || r->status == 200) {
			s3_resp_free(r);
			p = part_of(o, b, x, sh, n);
			json_object_set(p, put ? "vectors" : "keys", parts[sh]);
			part_run(s, op, p, b, sh, false, r);
		}
		json_decref(parts[sh]);
	}
	free(parts);
	return count_stale(r) ? -ESTALE : 0;
}

/* GetVectors: each shard's keys from that shard; the rows found, in the request's order. */
static int get_split(struct cn_s3 *s, json_t *o, const char *b, const char *x, uint32_t n,
		     struct s3_resp *r)
{
	json_t *keys = json_object_get(o, "keys"), *e, *found = json_object(), *out;
	size_t i;

	for (uint32_t sh = 0; sh < n; sh++) {
		json_t *part = json_array(), *p, *ro;

		json_array_foreach(keys, i, e)
			if (s3_key_shard(json_string_value(e), strlen(json_string_value(e)), n) == sh)
				json_array_append(part, e);
		if (!json_array_size(part)) {
			json_decref(part);
			continue;
		}
		p = part_of(o, b, x, sh, n);
		json_object_set_new(p, "keys", part);
		part_run(s, "GetVectors", p, b, sh, true, r);
		if (r->status != 200) {
			json_decref(found);
			return count_stale(r) ? -ESTALE : 0;
		}
		ro = json_loadb(r->body, r->len, 0, NULL);
		s3_resp_free(r);
		json_array_foreach(json_object_get(ro, "vectors"), i, e)
			if (json_is_string(json_object_get(e, "key")))
				json_object_set(found, json_string_value(json_object_get(e, "key")),
						e);
		json_decref(ro);
	}
	out = json_array();
	json_array_foreach(keys, i, e) {
		json_t *v = json_object_get(found, json_string_value(e));

		if (v)
			json_array_append(out, v);
	}
	json_decref(found);
	json_resp(r, json_pack("{s:o}", "vectors", out));
	return 0;
}

/* ListVectors over the shards in order: the gateway's nextToken carries the shard and
 * that shard's own token ("z:<shard>:<token>"); a page is filled from the next shards
 * while it has room. */
static int list_split(struct cn_s3 *s, json_t *o, const char *b, const char *x, uint32_t n,
		      struct s3_resp *r)
{
	const char *tok = json_string_value(json_object_get(o, "nextToken"));
	json_t *mr = json_object_get(o, "maxResults"), *out = json_array(), *e, *resp;
	long long max = json_is_integer(mr) ? json_integer_value(mr) : S3_LIST_VECTORS_DEFAULT;
	char plain[512], inner[512] = "", *t;
	uint32_t sh = 0;
	size_t bytes = 0, i;
	int used = 0;

	if (tok) {
		unsigned v;

		if (!s3_api_token_read(tok, plain, sizeof(plain)) ||
		    sscanf(plain, "z:%u:%n", &v, &used) != 1 || !used || v >= n) {
			json_decref(out);
			s3_resp_error(r, 400, "ValidationException", "Invalid nextToken");
			return 0;
		}
		sh = v;
		snprintf(inner, sizeof(inner), "%s", plain + used);
	}
	for (; sh < n; sh++) {
		json_t *p = part_of(o, b, x, sh, n), *ro;
		const char *nt;

		json_object_del(p, "nextToken");
		if (inner[0])
			json_object_set_new(p, "nextToken", json_string(inner));
		if (json_array_size(out))
			json_object_set_new(p, "maxResults",
					    json_integer(max - (long long)json_array_size(out)));
		part_run(s, "ListVectors", p, b, sh, true, r);
		if (r->status != 200) {
			json_decref(out);
			return count_stale(r) ? -ESTALE : 0;
		}
		bytes += r->len;
		ro = json_loadb(r->body, r->len, 0, NULL);
		s3_resp_free(r);
		json_array_foreach(json_object_get(ro, "vectors"), i, e)
			json_array_append(out, e);
		nt = json_string_value(json_object_get(ro, "nextToken"));
		snprintf(inner, sizeof(inner), "%s", nt ? nt : "");
		json_decref(ro);
		if (inner[0])
			break;                       /* this shard has more */
		if ((long long)json_array_size(out) >= max || bytes >= S3_LIST_PAGE_BYTES) {
			sh++;
			break;
		}
	}
	resp = json_pack("{s:o}", "vectors", out);
	if (sh < n) {
		snprintf(plain, sizeof(plain), "z:%u:%s", sh, inner);
		t = s3_api_token(plain);
		if (t)
			json_object_set_new(resp, "nextToken", json_string(t));
		free(t);
	}
	json_resp(r, resp);
	return 0;
}

/* Whether array a (of PutVectors' vectors or of keys) is one the split can group: every
 * element with a string key. Else the request goes to shard 0 unsplit and is refused
 * there with the usual error. */
static bool keyed(json_t *a, bool put)
{
	json_t *e;
	size_t i;

	if (!json_is_array(a) || !json_array_size(a))
		return false;
	json_array_foreach(a, i, e)
		if (!key_of(e, put))
			return false;
	return true;
}

bool shard_op(struct cn_s3 *s, const char *op, const char *body, size_t len, const char *b,
	      struct s3_resp *r)
{
	static const char *const ops[] = { "CreateVectorBucket", "DeleteVectorBucket",
		"CreateIndex", "DeleteIndex", "PutVectors", "DeleteVectors", "GetVectors",
		"ListVectors" };
	char bb[NAME_MAX_ + 8], x[NAME_MAX_ + 8];
	bool known = false, put = !strcmp(op, "PutVectors");
	json_t *o;
	uint32_t n;
	int rc = -ESTALE;

	for (size_t i = 0; i < DM_ARRAY_SIZE(ops); i++)
		known |= !strcmp(op, ops[i]);
	if (!known || (!strcmp(op, "CreateVectorBucket") && s->shards <= 1))
		return false;
	/* A bucket of one shard (the count cached) goes its usual way without a parse here:
	 * a PutVectors body may be megabytes. */
	if (strcmp(op, "CreateVectorBucket")) {
		if (bucket_shards(s, b, false, &n, r))
			return true;                 /* r: why the count cannot be read */
		if (n <= 1)
			return false;
		s3_resp_free(r);
		memset(r, 0, sizeof(*r));
	}
	o = json_loadb(body, len, 0, NULL);
	if (!json_is_object(o) || s3_api_req_resource(body, len, bb, x) || strcmp(bb, b)) {
		json_decref(o);
		return false;                    /* invalid: shard 0 refuses it */
	}
	if (!strcmp(op, "CreateVectorBucket")) {
		create_bucket(s, o, b, r);
		json_decref(o);
		return true;
	}
	for (int attempt = 0; attempt < 2 && rc == -ESTALE; attempt++) {
		if (bucket_shards(s, b, attempt > 0, &n, r)) {
			json_decref(o);
			return true;                 /* r: why the count cannot be read */
		}
		if (n <= 1) {
			json_decref(o);
			return false;
		}
		s3_resp_free(r);
		memset(r, 0, sizeof(*r));
		rc = 0;
		if (!strcmp(op, "DeleteVectorBucket") || !strcmp(op, "DeleteIndex")) {
			/* Shard 0 decides (not found, not empty); the other shards follow. */
			bool ix = !strcmp(op, "DeleteIndex");

			bucket_op(s, op, body, len, b, false, r);
			if (r->status == 200 && (!ix || x[0]))
				delete_shards(s, o, b, ix ? x : NULL, n);
			if (r->status == 200 && !ix)
				shc_forget(s, b);
		} else if (!strcmp(op, "CreateIndex")) {
			struct s3_resp first;

			bucket_op(s, op, body, len, b, false, r);
			first = *r;                      /* the answer (indexArn), if they all go */
			memset(r, 0, sizeof(*r));
			if (first.status != 200 || !x[0]) {
				*r = first;
			} else if (create_shards(s, op, o, b, x, n, r)) {
				struct s3_resp undo;
				json_t *d = part_of(o, b, x, 0, n);

				json_object_del(d, "_dmannShards");
				dm_warn("s3: CreateIndex %s/%s: a shard could not be created (%d); "
					"undone", b, x, r->status);
				delete_shards(s, d, b, x, n);
				part_run(s, "DeleteIndex", d, b, 0, false, &undo);
				s3_resp_free(&undo);
				s3_resp_free(&first);
			} else {
				*r = first;
			}
		} else if (!x[0] || (strcmp(op, "ListVectors") &&
				     !keyed(json_object_get(o, put ? "vectors" : "keys"), put)) ||
			   (!strcmp(op, "GetVectors") &&
			    json_array_size(json_object_get(o, "keys")) > S3_GET_MAX)) {
			json_decref(o);
			return false;                /* invalid: shard 0 refuses it */
		} else if (!strcmp(op, "GetVectors")) {
			rc = get_split(s, o, b, x, n, r);
		} else if (!strcmp(op, "ListVectors")) {
			rc = list_split(s, o, b, x, n, r);
		} else {
			rc = write_split(s, op, o, b, x, n, r);
		}
		if (rc == -ESTALE && !attempt)
			s3_resp_free(r);
	}
	json_decref(o);
	return true;
}
