/* s3_api_catalog.c: the vector bucket and index operations (CreateVectorBucket,
 * GetVectorBucket, DeleteVectorBucket, ListVectorBuckets, CreateIndex, GetIndex, DeleteIndex,
 * ListIndexes) over a flat store, with the AWS validation rules. */
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

/* ---------------------------------------------------------------- buckets ---------- */

static double ms_to_s(int64_t ms)
{
	return (double)ms / 1000.0;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* encryptionConfiguration: only the default (SSE with AES256) is accepted; the gateway
 * does not encrypt at rest itself (docs/api.md). */
static int check_encryption(struct s3_resp *r, json_t *enc)
{
	const char *sse;

	if (!enc || json_is_null(enc))
		return 0;
	if (!json_is_object(enc))
		return s3a_verr(r, "/encryptionConfiguration", "encryptionConfiguration must be an "
			    "object");
	if (s3a_get_str(r, enc, "sseType", &sse) < 0)
		return -EINVAL;
	if (json_object_get(enc, "kmsKeyArn") || (sse && strcmp(sse, "AES256")))
		return s3a_verr(r, "/encryptionConfiguration/sseType", "only sseType AES256 is "
			    "accepted by this gateway (no KMS)");
	return 0;
}

void s3a_op_create_bucket(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	const char *name;
	json_t *enc = json_object_get(o, "encryptionConfiguration");
	int rc = s3a_get_str(r, o, "vectorBucketName", &name);

	if (rc < 0)
		return;
	if (!name) {
		s3a_verr(r, "/vectorBucketName", "vectorBucketName is required");
		return;
	}
	if (!s3a_valid_bucket(a, name)) {
		s3a_verr(r, "/vectorBucketName", "Invalid vector bucket name: 3-63 characters, "
		     "lower-case letters, digits and hyphens, starting and ending with a letter "
		     "or digit");
		return;
	}
	if (check_encryption(r, enc) || s3a_tags_check(r, json_object_get(o, "tags"), "/tags"))
		return;
	if (json_object_get(json_object_get(o, "tags"), S3_SCOPE_TAG)) {
		s3a_verr(r, "/tags", "tag '%s' declares an index's scope: it is given to "
			 "CreateIndex, not to a vector bucket", S3_SCOPE_TAG);
		return;
	}
	/* The gateways' shard count (memory nodes only; s3_api_user_bucket keeps users from
	 * sending it). */
	long long shards = 1;

	if (a->shard_names &&
	    s3a_get_int(r, o, "_dmannShards", 1, DM_S3_SHARDS_MAX, &shards) < 0)
		return;
	rc = flat_bucket_create(a->store, name, now_ms());
	if (rc) {
		s3a_engine_err(r, rc, "vector bucket");
		return;
	}
	if (shards > 1) {
		char txt[24];

		snprintf(txt, sizeof(txt), "%lld", shards);
		rc = flat_attr_set(a->store, name, NULL, FLAT_ATTR_SHARDS, txt,
				   (uint32_t)strlen(txt));
		if (rc) {
			flat_bucket_delete(a->store, name);
			s3a_engine_err(r, rc, "vector bucket");
			return;
		}
	}
	if (s3a_tags_create(a, r, name, NULL, json_object_get(o, "tags")))
		return;
	s3a_ok(r, json_pack("{s:o}", "vectorBucketArn", s3a_bucket_arn(a, name)));
}

void s3a_op_get_bucket(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1];
	struct flat_bucket_info bi;
	int rc;

	if (s3a_req_bucket(a, r, o, b))
		return;
	rc = flat_bucket_get(a->store, b, &bi);
	if (rc) {
		s3a_engine_err(r, rc, "vector bucket");
		return;
	}
	json_t *out = json_pack("{s:s, s:o, s:f}", "vectorBucketName", b, "vectorBucketArn",
				s3a_bucket_arn(a, b), "creationTime", ms_to_s(bi.created_ms));

	/* A gateway asks for the bucket's shard count (memory nodes only). */
	if (a->shard_names && json_is_true(json_object_get(o, "_dmannShards")))
		json_object_set_new(out, "_dmannShards", json_integer(s3a_bucket_shards(a, b)));
	s3a_ok(r, json_pack("{s:o}", "vectorBucket", out));
}

void s3a_op_delete_bucket(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1];
	int rc;

	if (s3a_req_bucket(a, r, o, b))
		return;
	rc = flat_bucket_delete(a->store, b);
	if (rc) {
		s3a_engine_err(r, rc, "vector bucket");
		return;
	}
	s3a_ok(r, NULL);
}

void s3a_op_list_buckets(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	long long max = S3_LIST_CATALOG_DEFAULT;
	const char *prefix;
	char after[FLAT_NAME_MAX + 8];
	bool have, more;
	struct flat_bucket_info *bi;
	json_t *arr, *out;
	int n;

	if (s3a_get_int(r, o, "maxResults", 1, S3_LIST_CATALOG_MAX, &max) < 0 ||
	    s3a_get_str(r, o, "prefix", &prefix) < 0 ||
	    s3a_get_token(r, o, after, sizeof(after), &have) < 0)
		return;
	if (have && strncmp(after, "b:", 2)) {
		s3a_verr(r, "/nextToken", "Invalid nextToken");
		return;
	}
	bi = malloc((size_t)max * sizeof(*bi));
	if (!bi) {
		s3a_engine_err(r, -ENOMEM, "");
		return;
	}
	n = flat_bucket_list(a->store, prefix, have ? after + 2 : NULL, (size_t)max, bi, &more);
	if (n < 0) {
		free(bi);
		s3a_engine_err(r, n, "vector bucket");
		return;
	}
	arr = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(arr, json_pack("{s:s, s:o, s:f}", "vectorBucketName",
						     bi[i].name, "vectorBucketArn",
						     s3a_bucket_arn(a, bi[i].name), "creationTime",
						     ms_to_s(bi[i].created_ms)));
	out = json_pack("{s:o}", "vectorBuckets", arr);
	if (more && n) {
		char plain[FLAT_NAME_MAX + 8], *t;

		snprintf(plain, sizeof(plain), "b:%s", bi[n - 1].name);
		t = s3a_token_make(plain);
		json_object_set_new(out, "nextToken", json_string(t));
		free(t);
	}
	free(bi);
	s3a_ok(r, out);
}

/* ---------------------------------------------------------------- indexes ---------- */

void s3a_op_create_index(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1];
	const char *name, *dtype, *metric;
	long long dim = 0;
	json_t *mc = json_object_get(o, "metadataConfiguration"), *conf = NULL, *keys, *e;
	enum dm_metric m;
	char *ctext = NULL;
	size_t i;
	int rc;

	if (s3a_req_bucket(a, r, o, b) || s3a_get_str(r, o, "indexName", &name) < 0 ||
	    s3a_get_str(r, o, "dataType", &dtype) < 0 || s3a_get_str(r, o, "distanceMetric", &metric) < 0)
		return;
	rc = s3a_get_int(r, o, "dimension", 1, FLAT_DIM_MAX, &dim);
	if (rc < 0)
		return;
	if (!name) {
		s3a_verr(r, "/indexName", "indexName is required");
		return;
	}
	if (!s3a_valid_name(name, true)) {
		s3a_verr(r, "/indexName", "Invalid index name: 3-63 characters, lower-case letters, "
		     "digits, hyphens and dots, starting and ending with a letter or digit");
		return;
	}
	if (check_encryption(r, json_object_get(o, "encryptionConfiguration")) ||
	    s3a_tags_check(r, json_object_get(o, "tags"), "/tags"))
		return;
	if (!dtype || strcmp(dtype, "float32")) {
		s3a_verr(r, "/dataType", "dataType is required and must be float32");
		return;
	}
	if (!rc) {
		s3a_verr(r, "/dimension", "dimension is required (1 to %d)", FLAT_DIM_MAX);
		return;
	}
	if (metric && !strcmp(metric, "euclidean")) {
		m = DM_METRIC_L2;
	} else if (metric && !strcmp(metric, "cosine")) {
		m = DM_METRIC_COS;
	} else {
		s3a_verr(r, "/distanceMetric", "distanceMetric is required: euclidean or cosine");
		return;
	}
	keys = NULL;
	if (mc && !json_is_null(mc)) {
		keys = json_object_get(mc, "nonFilterableMetadataKeys");
		if (!json_is_object(mc) || !json_is_array(keys)) {
			s3a_verr(r, "/metadataConfiguration/nonFilterableMetadataKeys",
			     "metadataConfiguration needs a nonFilterableMetadataKeys array");
			return;
		}
		if (json_array_size(keys) < 1 || json_array_size(keys) > S3_NONFILTER_MAX_KEYS) {
			s3a_verr(r, "/metadataConfiguration/nonFilterableMetadataKeys",
			     "between 1 and %d non-filterable metadata keys", S3_NONFILTER_MAX_KEYS);
			return;
		}
		json_array_foreach(keys, i, e) {
			size_t l = json_is_string(e) ? json_string_length(e) : 0;

			if (l < 1 || l > 63 || strlen(json_string_value(e)) != l) {
				s3a_verr(r, "/metadataConfiguration/nonFilterableMetadataKeys",
				     "non-filterable keys must be strings of 1 to 63 characters");
				return;
			}
			for (size_t j = 0; j < i; j++)
				if (json_equal(json_array_get(keys, j), e)) {
					s3a_verr(r, "/metadataConfiguration/nonFilterableMetadataKeys",
					     "duplicate non-filterable key '%s'",
					     json_string_value(e));
					return;
				}
		}
	}
	/* A scope (s3_scope.h): the reserved tag names a filterable key, kept in the
	 * configuration beside the non-filterable keys (immutable from now on). */
	json_t *scope = json_object_get(json_object_get(o, "tags"), S3_SCOPE_TAG);

	if (scope) {
		const char *nfk[S3_NONFILTER_MAX_KEYS];
		size_t nnf = 0;
		char err[256];

		json_array_foreach(keys, i, e)
			nfk[nnf++] = json_string_value(e);
		if (s3_scope_check_decl(scope, nfk, nnf, err, sizeof(err))) {
			s3a_verr(r, "/tags", "%s", err);
			return;
		}
	}
	if (keys || scope) {
		conf = json_object();
		if (conf && keys)
			json_object_set(conf, "nonFilterableMetadataKeys", keys);
		if (conf && scope)
			json_object_set(conf, S3_SCOPE_CONF, scope);
		ctext = conf ? json_dumps(conf, JSON_COMPACT) : NULL;
		json_decref(conf);
		if (!ctext) {
			s3a_engine_err(r, -ENOMEM, "");
			return;
		}
	}
	rc = flat_index_create(a->store, b, name, (uint32_t)dim, m, ctext,
			       ctext ? (uint32_t)strlen(ctext) : 0, now_ms());
	free(ctext);
	if (rc) {
		s3a_engine_err(r, rc, rc == -ENOENT ? "vector bucket" : "index");
		return;
	}
	if (s3a_tags_create(a, r, b, name, json_object_get(o, "tags")))
		return;
	s3a_ok(r, json_pack("{s:o}", "indexArn", s3a_index_arn(a, b, name)));
}

void s3a_op_get_index(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	struct flat_index *ix = s3a_open_index(a, r, o);
	const struct flat_index_info *in;
	json_t *idx;
	struct nfkeys nf;

	if (!ix)
		return;
	in = flat_index_info(ix);
	idx = json_pack("{s:s, s:s, s:o, s:f, s:s, s:I, s:s}", "vectorBucketName", in->bucket,
			"indexName", in->name, "indexArn", s3a_index_arn(a, in->bucket, in->name),
			"creationTime", ms_to_s(in->created_ms), "dataType", "float32",
			"dimension", (json_int_t)in->dim, "distanceMetric",
			in->metric == DM_METRIC_COS ? "cosine" : "euclidean");
	/* metadataConfiguration as the SDK models it: the non-filterable keys only (a scope
	 * is shown by its tag, s3_scope.h) */
	s3a_nf_load(ix, &nf);
	json_t *nfa = json_object_get(nf.conf, "nonFilterableMetadataKeys");

	if (nfa)
		json_object_set_new(idx, "metadataConfiguration",
				    json_pack("{s:O}", "nonFilterableMetadataKeys", nfa));
	json_decref(nf.conf);
	flat_index_put(ix);
	s3a_ok(r, json_pack("{s:o}", "index", idx));
}

void s3a_op_delete_index(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	int rc;

	if (s3a_req_index(a, r, o, b, x))
		return;
	rc = flat_index_delete(a->store, b, x);
	if (rc) {
		s3a_engine_err(r, rc, flat_bucket_get(a->store, b, NULL) ? "vector bucket" : "index");
		return;
	}
	s3a_ok(r, NULL);
}

void s3a_op_list_indexes(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], after[FLAT_NAME_MAX + 8];
	long long max = S3_LIST_CATALOG_DEFAULT;
	const char *prefix;
	bool have, more;
	char (*names)[FLAT_NAME_MAX + 1];
	json_t *arr, *out;
	int n;

	if (s3a_req_bucket(a, r, o, b) || s3a_get_int(r, o, "maxResults", 1, S3_LIST_CATALOG_MAX, &max) < 0 ||
	    s3a_get_str(r, o, "prefix", &prefix) < 0 ||
	    s3a_get_token(r, o, after, sizeof(after), &have) < 0)
		return;
	if (have && strncmp(after, "i:", 2)) {
		s3a_verr(r, "/nextToken", "Invalid nextToken");
		return;
	}
	names = malloc((size_t)max * sizeof(*names));
	if (!names) {
		s3a_engine_err(r, -ENOMEM, "");
		return;
	}
	n = flat_index_list(a->store, b, prefix, have ? after + 2 : NULL, (size_t)max, names,
			    &more);
	if (n < 0) {
		free(names);
		s3a_engine_err(r, n, "vector bucket");
		return;
	}
	arr = json_array();
	for (int i = 0; i < n; i++) {
		struct flat_index *ix = flat_index_get(a->store, b, names[i]);
		double ct = ix ? ms_to_s(flat_index_info(ix)->created_ms) : 0;

		flat_index_put(ix);
		json_array_append_new(arr, json_pack("{s:s, s:s, s:o, s:f}", "vectorBucketName", b,
						     "indexName", names[i], "indexArn",
						     s3a_index_arn(a, b, names[i]), "creationTime", ct));
	}
	out = json_pack("{s:o}", "indexes", arr);
	if (more && n) {
		char plain[FLAT_NAME_MAX + 8], *t;

		snprintf(plain, sizeof(plain), "i:%s", names[n - 1]);
		t = s3a_token_make(plain);
		json_object_set_new(out, "nextToken", json_string(t));
		free(t);
	}
	free(names);
	s3a_ok(r, out);
}
