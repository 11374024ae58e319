/* s3_api.c: the S3 Vectors operation layer over a flat store: operation dispatch,
 * construction, and the helpers remote engines use (see s3_api.h; the other files are listed
 * in s3_api_int.h). */
#include "s3_api_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ---------------------------------------------------------------- dispatch --------- */

static const struct {
	const char *name;
	void (*fn)(struct s3_api *a, json_t *o, struct s3_resp *r);
} ops[] = {
	{ "CreateVectorBucket", s3a_op_create_bucket },
	{ "GetVectorBucket", s3a_op_get_bucket },
	{ "ListVectorBuckets", s3a_op_list_buckets },
	{ "DeleteVectorBucket", s3a_op_delete_bucket },
	{ "CreateIndex", s3a_op_create_index },
	{ "GetIndex", s3a_op_get_index },
	{ "ListIndexes", s3a_op_list_indexes },
	{ "DeleteIndex", s3a_op_delete_index },
	{ "PutVectors", s3a_op_put_vectors },
	{ "GetVectors", s3a_op_get_vectors },
	{ "ListVectors", s3a_op_list_vectors },
	{ "DeleteVectors", s3a_op_delete_vectors },
	{ "QueryVectors", s3a_op_query_vectors },
	{ "TagResource", s3a_op_tag_resource },
	{ "UntagResource", s3a_op_untag_resource },
	{ "ListTagsForResource", s3a_op_list_tags },
	{ "PutVectorBucketPolicy", s3a_op_put_policy },
	{ "GetVectorBucketPolicy", s3a_op_get_policy },
	{ "DeleteVectorBucketPolicy", s3a_op_delete_policy },
};

bool s3_api_known_op(const char *op)
{
	for (size_t i = 0; i < DM_ARRAY_SIZE(ops); i++)
		if (!strcmp(ops[i].name, op))
			return true;
	return false;
}

/* A gateway's part of a vector operation split over a bucket's shards carries the shard
 * count it split by ("_dmannShards"): refused with a 409 whose message starts with
 * S3_SHARDS_DIFFER when the bucket (or shard) was created with another count (it was
 * deleted and created again since the gateway read it). */
static bool shards_differ(struct s3_api *a, const char *op, json_t *o, struct s3_resp *r)
{
	json_t *v = json_object_get(o, "_dmannShards");
	const char *b = json_string_value(json_object_get(o, "vectorBucketName"));
	uint32_t have;

	if (!json_is_integer(v) || !b || (strcmp(op, "PutVectors") && strcmp(op, "GetVectors") &&
					  strcmp(op, "DeleteVectors") && strcmp(op, "ListVectors")) ||
	    flat_bucket_get(a->store, b, NULL))
		return false;           /* no such bucket: the operation answers */
	have = s3a_bucket_shards(a, b);
	if ((json_int_t)have == json_integer_value(v))
		return false;
	s3_resp_error(r, 409, "ConflictException", "%s: bucket %s has %u shard(s), not %lld",
		      S3_SHARDS_DIFFER, b, have, (long long)json_integer_value(v));
	return true;
}

void s3_api_handle(struct s3_api *a, const char *op, const char *body, size_t len,
		   struct s3_resp *r)
{
	json_t *o;

	memset(r, 0, sizeof(*r));
	for (size_t i = 0; i < DM_ARRAY_SIZE(ops); i++) {
		if (strcmp(ops[i].name, op))
			continue;
		if (len > S3_MAX_PAYLOAD) {
			s3a_verr(r, "/", "The request payload exceeds %u bytes", S3_MAX_PAYLOAD);
			return;
		}
		o = s3a_parse_body(body, len, r);
		if (!o)
			return;
		if (a->shard_names && shards_differ(a, op, o, r)) {
			json_decref(o);
			return;
		}
		ops[i].fn(a, o, r);
		json_decref(o);
		return;
	}
	s3_resp_error(r, 404, "UnknownOperationException", "Unknown or unsupported operation "
		      "'%s'", op);
}

struct s3_api *s3_api_new(struct flat_store *store, const char *region, const char *account)
{
	struct s3_api *a = calloc(1, sizeof(*a));

	if (!a) {
		errno = ENOMEM;
		return NULL;
	}
	a->store = store;
	snprintf(a->region, sizeof(a->region), "%s", region ? region : "us-east-1");
	snprintf(a->account, sizeof(a->account), "%s", account ? account : "000000000000");
	if (getrandom(&a->epoch, sizeof(a->epoch), 0) != sizeof(a->epoch))
		a->epoch = dm_now_ns();
	return a;
}

void s3_api_shard_names(struct s3_api *a, bool on)
{
	a->shard_names = on;
}

void s3_api_free(struct s3_api *a)
{
	free(a);
}

/* ---------------------------------------------------------------- remote engines --- */

char *s3_api_token(const char *plain)
{
	return s3a_token_make(plain);
}

int s3_api_req_resource(const char *body, size_t len, char *bucket, char *index)
{
	json_t *o = len ? json_loadb(body, len, 0, NULL) : NULL;
	const char *n, *arn, *x;
	bool found = false;

	bucket[0] = index[0] = 0;
	if (!json_is_object(o))
		goto out;
	/* The tag calls name their resource by resourceArn only (anything else is ignored by
	 * the operation, so it must not decide the bucket either). */
	arn = json_string_value(json_object_get(o, "resourceArn"));
	if (arn) {
		found = s3a_parse_arn(arn, bucket, index, true) ||
			s3a_parse_arn(arn, bucket, NULL, false);
		goto out;
	}
	n = json_string_value(json_object_get(o, "vectorBucketName"));
	x = json_string_value(json_object_get(o, "indexName"));
	if (n && strlen(n) <= FLAT_NAME_MAX) {
		strcpy(bucket, n);
		if (x && strlen(x) <= FLAT_NAME_MAX)
			strcpy(index, x);
		found = true;
		goto out;
	}
	arn = json_string_value(json_object_get(o, "vectorBucketArn"));
	if (arn && s3a_parse_arn(arn, bucket, NULL, false)) {
		if (x && strlen(x) <= FLAT_NAME_MAX)
			strcpy(index, x);
		found = true;
		goto out;
	}
	arn = json_string_value(json_object_get(o, "indexArn"));
	if (arn && s3a_parse_arn(arn, bucket, index, true))
		found = true;
out:
	json_decref(o);
	if (!found)
		bucket[0] = index[0] = 0;
	return found ? 0 : -ENOENT;
}

int s3_api_user_bucket(const char *body, size_t len, struct s3_resp *r)
{
	json_t *o, *v;
	const char *n, *k;
	int rc = 0;

	/* Most bodies have neither a '#' nor a reserved field (nor an escape that could spell
	 * them): no parse for those. */
	if (!len || (!memchr(body, '#', len) && !memmem(body, len, "_dmann", 6) &&
		     !memmem(body, len, "\\u", 2)))
		return 0;
	o = json_loadb(body, len, 0, NULL);
	n = json_string_value(json_object_get(o, "vectorBucketName"));
	if (n && strchr(n, '#'))
		rc = s3a_verr(r, "/vectorBucketName", "Invalid vector bucket name: 3-63 characters, "
			      "lower-case letters, digits and hyphens, starting and ending with a "
			      "letter or digit");
	json_object_foreach(o, k, v)
		if (!rc && !strncmp(k, "_dmann", 6))
			rc = s3a_verr(r, "/", "Unknown field %.64s", k);
	json_decref(o);
	return rc;
}

bool s3_api_is_write(const char *op)
{
	return !strncmp(op, "Create", 6) || !strncmp(op, "Delete", 6) || !strncmp(op, "Put", 3) ||
	       !strcmp(op, "TagResource") || !strcmp(op, "UntagResource");
}

int s3_api_req_bucket(const char *body, size_t len, char *bucket)
{
	char x[FLAT_NAME_MAX + 1];

	return s3_api_req_resource(body, len, bucket, x);
}

void s3_api_not_found(struct s3_resp *r, bool bucket)
{
	s3a_engine_err(r, -ENOENT, bucket ? "vector bucket" : "index");
}
