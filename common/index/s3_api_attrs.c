/* s3_api_attrs.c: tags (TagResource, UntagResource, ListTagsForResource, and the `tags` of
 * CreateVectorBucket / CreateIndex) and bucket policies (Put/Get/DeleteVectorBucketPolicy)
 * over the flat store's catalog attributes, with the AWS validation rules. Tags are kept as
 * one JSON object per bucket or index, a policy as the text it was given (validated by
 * s3_policy). The REST tag calls (GET/POST/DELETE /tags/{resourceArn}) reach here with the
 * ARN (and UntagResource's tagKeys) moved into the JSON body by the HTTP front end. */
#include "s3_api_int.h"
#include "s3_policy.h"
#include "s3_scope.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAGS_MAX 50
#define TAG_KEY_MAX 128
#define TAG_VALUE_MAX 256

/* ---------------------------------------------------------------- tags ------------- */

int s3a_tags_check(struct s3_resp *r, json_t *tags, const char *path)
{
	const char *k;
	json_t *v;

	if (!tags || json_is_null(tags))
		return 0;
	if (!json_is_object(tags))
		return s3a_verr(r, path, "tags must be a map of strings");
	if (json_object_size(tags) > TAGS_MAX)
		return s3a_verr(r, path, "a resource has at most %d tags", TAGS_MAX);
	json_object_foreach(tags, k, v) {
		size_t kl = strlen(k);

		if (kl < 1 || kl > TAG_KEY_MAX)
			return s3a_verr(r, path, "tag keys are 1 to %d characters", TAG_KEY_MAX);
		if (!strncmp(k, "aws:", 4))
			return s3a_verr(r, path, "tag keys starting with 'aws:' are reserved");
		if (!json_is_string(v) || json_string_length(v) > TAG_VALUE_MAX ||
		    strlen(json_string_value(v)) != json_string_length(v))
			return s3a_verr(r, path, "tag '%s': values are strings of at most %d "
					"characters", k, TAG_VALUE_MAX);
	}
	return 0;
}

/* The tags of bucket b / index x (x NULL: the bucket): a new object, or NULL with r filled. */
static json_t *tags_load(struct s3_api *a, struct s3_resp *r, const char *b, const char *x)
{
	char *text;
	uint32_t len;
	json_t *o;
	int rc = flat_attr_get(a->store, b, x, FLAT_ATTR_TAGS, &text, &len);

	if (rc) {
		s3a_engine_err(r, rc, x ? "index" : "vector bucket");
		return NULL;
	}
	o = text ? json_loadb(text, len, 0, NULL) : json_object();
	free(text);
	if (!json_is_object(o)) {
		json_decref(o);
		o = json_object();
	}
	return o;
}

static int tags_store(struct s3_api *a, struct s3_resp *r, const char *b, const char *x,
		      json_t *tags)
{
	char *text = json_object_size(tags) ? json_dumps(tags, JSON_COMPACT | JSON_SORT_KEYS)
					    : NULL;
	int rc;

	if (json_object_size(tags) && !text) {
		s3a_engine_err(r, -ENOMEM, "");
		return -ENOMEM;
	}
	rc = flat_attr_set(a->store, b, x, FLAT_ATTR_TAGS, text,
			   text ? (uint32_t)strlen(text) : 0);
	free(text);
	if (rc)
		s3a_engine_err(r, rc, x ? "index" : "vector bucket");
	return rc;
}

int s3a_tags_create(struct s3_api *a, struct s3_resp *r, const char *b, const char *x,
		    json_t *tags)
{
	if (!json_object_size(tags))
		return 0;
	return tags_store(a, r, b, x, tags);
}

/* resourceArn: a bucket or an index ARN into b / x (x[0] = 0 for a bucket). */
static int req_resource(struct s3_resp *r, json_t *o, char *b, char *x)
{
	const char *arn;

	if (s3a_get_str(r, o, "resourceArn", &arn) < 0)
		return -EINVAL;
	if (!arn)
		return s3a_verr(r, "/resourceArn", "resourceArn is required");
	x[0] = 0;
	if (s3a_parse_arn(arn, b, x, true) || s3a_parse_arn(arn, b, NULL, false))
		return 0;
	return s3a_verr(r, "/resourceArn", "resourceArn must be a vector bucket or index ARN");
}

void s3a_op_tag_resource(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	json_t *tags = json_object_get(o, "tags"), *cur;

	if (req_resource(r, o, b, x))
		return;
	if (!tags) {
		s3a_verr(r, "/tags", "tags is required");
		return;
	}
	if (s3a_tags_check(r, tags, "/tags"))
		return;
	if (json_object_get(tags, S3_SCOPE_TAG)) {
		s3a_verr(r, "/tags", "tag '%s' declares an index's scope: it is given once, to "
			 "CreateIndex, and cannot be set or changed afterwards", S3_SCOPE_TAG);
		return;
	}
	cur = tags_load(a, r, b, x[0] ? x : NULL);
	if (!cur)
		return;
	json_object_update(cur, tags);
	if (json_object_size(cur) > TAGS_MAX)
		s3a_verr(r, "/tags", "a resource has at most %d tags", TAGS_MAX);
	else if (!tags_store(a, r, b, x[0] ? x : NULL, cur))
		s3a_ok(r, NULL);
	json_decref(cur);
}

void s3a_op_untag_resource(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	json_t *keys = json_object_get(o, "tagKeys"), *e, *cur;
	size_t i;

	if (req_resource(r, o, b, x))
		return;
	if (!json_is_array(keys) || !json_array_size(keys) || json_array_size(keys) > TAGS_MAX) {
		s3a_verr(r, "/tagKeys", "tagKeys must list 1 to %d keys", TAGS_MAX);
		return;
	}
	json_array_foreach(keys, i, e)
		if (!json_is_string(e) || !json_string_length(e) ||
		    json_string_length(e) > TAG_KEY_MAX) {
			s3a_verr(r, "/tagKeys", "tag keys are 1 to %d characters", TAG_KEY_MAX);
			return;
		} else if (!strcmp(json_string_value(e), S3_SCOPE_TAG)) {
			s3a_verr(r, "/tagKeys", "tag '%s' declares the index's scope for its whole "
				 "life: it cannot be removed", S3_SCOPE_TAG);
			return;
		}
	cur = tags_load(a, r, b, x[0] ? x : NULL);
	if (!cur)
		return;
	json_array_foreach(keys, i, e)
		json_object_del(cur, json_string_value(e));
	if (!tags_store(a, r, b, x[0] ? x : NULL, cur))
		s3a_ok(r, NULL);
	json_decref(cur);
}

void s3a_op_list_tags(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	json_t *cur;

	if (req_resource(r, o, b, x))
		return;
	cur = tags_load(a, r, b, x[0] ? x : NULL);
	if (cur)
		s3a_ok(r, json_pack("{s:o}", "tags", cur));
}

/* ---------------------------------------------------------------- policies --------- */

void s3a_op_put_policy(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], msg[256];
	const char *text;
	struct s3p_policy *p;
	int rc;

	if (s3a_req_bucket(a, r, o, b) || s3a_get_str(r, o, "policy", &text) < 0)
		return;
	if (!text) {
		s3a_verr(r, "/policy", "policy is required");
		return;
	}
	p = s3p_parse(text, strlen(text), msg, sizeof(msg));
	if (!p) {
		if (errno == ENOMEM)
			s3a_engine_err(r, -ENOMEM, "");
		else
			s3a_verr(r, "/policy", "MalformedPolicy: %s", msg);
		return;
	}
	s3p_free(p);
	rc = flat_attr_set(a->store, b, NULL, FLAT_ATTR_POLICY, text, (uint32_t)strlen(text));
	if (rc) {
		s3a_engine_err(r, rc, "vector bucket");
		return;
	}
	s3a_ok(r, NULL);
}

void s3a_op_get_policy(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], *text;
	uint32_t len;
	int rc;

	if (s3a_req_bucket(a, r, o, b))
		return;
	rc = flat_attr_get(a->store, b, NULL, FLAT_ATTR_POLICY, &text, &len);
	if (rc) {
		s3a_engine_err(r, rc, "vector bucket");
		return;
	}
	if (!text) {
		s3_resp_error(r, 404, "NotFoundException", "The vector bucket has no policy");
		return;
	}
	s3a_ok(r, json_pack("{s:s%}", "policy", text, (size_t)len));
	free(text);
}

void s3a_op_delete_policy(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1];
	int rc;

	if (s3a_req_bucket(a, r, o, b))
		return;
	rc = flat_attr_set(a->store, b, NULL, FLAT_ATTR_POLICY, NULL, 0);
	if (rc) {
		s3a_engine_err(r, rc, "vector bucket");
		return;
	}
	s3a_ok(r, NULL);
}
