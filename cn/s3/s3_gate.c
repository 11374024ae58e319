/* s3_gate.c: REST tag calls rewritten into JSON operations, and bucket policies enforced
 * before every operation (see s3_gate.h; the evaluation rule is in docs/api.md). */
#include "s3_gate.h"
#include "s3_policy.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* Percent-decode s[0..n) (NULL on a bad escape or an embedded NUL). */
static char *pct_decode(const char *s, size_t n)
{
	char *out = malloc(n + 1), *o = out;

	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '%') {
			unsigned v;

			if (i + 2 >= n || !isxdigit((unsigned char)s[i + 1]) ||
			    !isxdigit((unsigned char)s[i + 2]) || sscanf(s + i + 1, "%2x", &v) != 1 ||
			    !v)
				goto err_free;
			*o++ = (char)v;
			i += 2;
		} else if (s[i] == '+') {
			*o++ = ' ';
		} else {
			*o++ = s[i];
		}
	}
	*o = 0;
	return out;

err_free:
	free(out);
	return NULL;
}

int s3g_tag_call(const char *url, const char *method, const char *query, const char *body,
		 size_t len, const char **op, char **nbody, size_t *nlen, struct s3_resp *r)
{
	const char *t = strstr(url, "/tags/");
	json_t *o;
	char *arn;

	if (!t || strchr(t + 6, '/'))
		return 0;
	if (!strcmp(method, "GET"))
		*op = "ListTagsForResource";
	else if (!strcmp(method, "POST"))
		*op = "TagResource";
	else if (!strcmp(method, "DELETE"))
		*op = "UntagResource";
	else {
		s3_resp_error(r, 405, "ValidationException", "tag calls are GET, POST or DELETE "
			      "/tags/{resourceArn}");
		return -EINVAL;
	}
	arn = pct_decode(t + 6, strlen(t + 6));
	if (!arn || !arn[0]) {
		free(arn);
		s3_resp_error(r, 400, "ValidationException", "invalid resourceArn in the path");
		return -EINVAL;
	}
	/* Only what the operation's input has: TagResource's body carries tags alone. */
	o = json_object();
	if (!strcmp(*op, "TagResource")) {
		json_t *in = len ? json_loadb(body, len, 0, NULL) : NULL;

		if (!json_is_object(in)) {
			json_decref(in);
			json_decref(o);
			free(arn);
			s3_resp_error(r, 400, "ValidationException", "The request body is not a JSON "
				      "object");
			return -EINVAL;
		}
		if (json_object_get(in, "tags"))
			json_object_set(o, "tags", json_object_get(in, "tags"));
		json_decref(in);
	}
	json_object_set_new(o, "resourceArn", json_string(arn));
	free(arn);
	if (!strcmp(*op, "UntagResource")) {
		json_t *keys = json_array();

		for (const char *q = query; q && *q;) {
			const char *amp = strchr(q, '&'), *end = amp ? amp : q + strlen(q);
			const char *eq = memchr(q, '=', (size_t)(end - q));

			if (eq && eq - q == 7 && !strncmp(q, "tagKeys", 7)) {
				char *k = pct_decode(eq + 1, (size_t)(end - eq - 1));

				if (k)
					json_array_append_new(keys, json_string(k));
				else
					json_array_append_new(keys, json_null());
				free(k);
			}
			q = amp ? amp + 1 : end;
		}
		json_object_set_new(o, "tagKeys", keys);
	}
	*nbody = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (!*nbody) {
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
		return -ENOMEM;
	}
	*nlen = strlen(*nbody);
	return 1;
}

static void deny(struct s3_resp *r, const struct s3g_authz *z, const char *action,
		 const char *res, bool explicit)
{
	s3_resp_error(r, 403, "AccessDeniedException", "User: %s is not authorized to perform: "
		      "%s on resource: %s %s", z->principal, action, res,
		      explicit ? "with an explicit deny in a resource-based policy" :
				 "because no resource-based policy allows the action");
}

/* Operations on the bucket itself: evaluated against the bucket ARN whatever else the
 * body holds. The others act on an index (or, for tags, on the resourceArn). */
static bool bucket_level(const char *op)
{
	static const char *const ops[] = { "GetVectorBucket", "DeleteVectorBucket", "ListIndexes",
		"PutVectorBucketPolicy", "GetVectorBucketPolicy", "DeleteVectorBucketPolicy" };

	for (size_t i = 0; i < DM_ARRAY_SIZE(ops); i++)
		if (!strcmp(op, ops[i]))
			return true;
	return false;
}

bool s3g_authorize(const struct s3g_authz *z, const char *op, const char *body, size_t len,
		   struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1], res[320], action[64], req[96], msg[256];
	struct s3_resp pr = { 0 };
	struct s3p_policy *p = NULL;
	enum s3p_decision d;
	json_t *o;
	const char *text;

	/* Account-level operations: no bucket policy applies. */
	if (!strcmp(op, "CreateVectorBucket") || !strcmp(op, "ListVectorBuckets"))
		return true;
	if (s3_api_req_resource(body, len, b, x))
		return true;                    /* names no bucket: the operation refuses it */
	if (bucket_level(op))
		x[0] = 0;                       /* an indexName beside it does not change that */
	snprintf(req, sizeof(req), "{\"vectorBucketName\":\"%s\"}", b);
	if (strpbrk(b, "\"\\"))
		return true;                    /* not a valid name: the operation refuses it */
	z->run(z->ctx, "GetVectorBucketPolicy", req, strlen(req), &pr);
	if (pr.status == 404) {                 /* no bucket or no policy: nothing restricts */
		s3_resp_free(&pr);
		return true;
	}
	if (pr.status != 200) {
		*r = pr;                        /* e.g. 503: the memory node is unreachable */
		return false;
	}
	o = json_loadb(pr.body, pr.len, 0, NULL);
	s3_resp_free(&pr);
	text = json_string_value(json_object_get(o, "policy"));
	if (text)
		p = s3p_parse(text, strlen(text), msg, sizeof(msg));
	json_decref(o);
	if (!p) {
		s3_resp_error(r, 500, "InternalServerException", "the bucket policy cannot be read");
		return false;
	}
	if (x[0])
		snprintf(res, sizeof(res), "arn:aws:s3vectors:%s:%s:bucket/%s/index/%s", z->region,
			 z->account, b, x);
	else
		snprintf(res, sizeof(res), "arn:aws:s3vectors:%s:%s:bucket/%s", z->region,
			 z->account, b);
	snprintf(action, sizeof(action), "s3vectors:%s", op);
	d = s3p_eval(p, z->principal, action, res);
	s3p_free(p);
	if (d == S3P_DENY || (d == S3P_IMPLICIT && z->default_deny)) {
		deny(r, z, action, res, d == S3P_DENY);
		return false;
	}
	return true;
}
