/* test_s3_gate.c: the gateway's step between SigV4 and the operation (cn/s3/s3_gate.c):
 * REST tag calls rewritten into JSON operations (percent-decoding of the ARN and of
 * repeated tagKeys), and bucket policy enforcement against a fake operation runner: which
 * operations are checked, the resource evaluated (bucket or index ARN), explicit deny,
 * policy_default, and errors of the policy read passed through. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "s3_gate.h"

#define ARN "arn:aws:s3vectors:us-east-1:000000000000:bucket/bk1"
#define ARN_ENC "arn%3Aaws%3As3vectors%3Aus-east-1%3A000000000000%3Abucket%2Fbk1"

static int tag_call(const char *url, const char *method, const char *query, const char *body,
		    const char **op, char **nbody)
{
	struct s3_resp r = { 0 };
	size_t n = 0;
	int rc = s3g_tag_call(url, method, query, body, body ? strlen(body) : 0, op, nbody, &n,
			      &r);

	if (rc < 0)
		cr_assert_eq(r.status, rc == -ENOMEM ? 500 : (strcmp(method, "PUT") ? 400 : 405));
	s3_resp_free(&r);
	return rc;
}

Test(s3_gate, tag_calls)
{
	const char *op = NULL;
	char *b = NULL;

	cr_assert_eq(tag_call("/s3v/QueryVectors", "POST", "", "{}", &op, &b), 0);
	cr_assert_eq(tag_call("/s3v/tags/" ARN_ENC, "GET", "", NULL, &op, &b), 1);
	cr_assert_str_eq(op, "ListTagsForResource");
	cr_assert_str_eq(b, "{\"resourceArn\":\"" ARN "\"}");
	free(b);
	cr_assert_eq(tag_call("/tags/" ARN_ENC, "POST", "", "{\"tags\":{\"a\":\"1\"},"
			      "\"vectorBucketName\":\"other\",\"resourceArn\":\"x\"}", &op, &b), 1);
	cr_assert_str_eq(op, "TagResource");
	cr_assert_str_eq(b, "{\"tags\":{\"a\":\"1\"},\"resourceArn\":\"" ARN "\"}");
	free(b);
	cr_assert_eq(tag_call("/tags/" ARN_ENC, "DELETE", "tagKeys=a%20b&x=1&tagKeys=c", NULL,
			      &op, &b), 1);
	cr_assert_str_eq(op, "UntagResource");
	cr_assert_str_eq(b, "{\"resourceArn\":\"" ARN "\",\"tagKeys\":[\"a b\",\"c\"]}");
	free(b);
	/* A bad escape in a key is kept as null: the operation refuses it. */
	cr_assert_eq(tag_call("/tags/" ARN_ENC, "DELETE", "tagKeys=%zz", NULL, &op, &b), 1);
	cr_assert_str_eq(b, "{\"resourceArn\":\"" ARN "\",\"tagKeys\":[null]}");
	free(b);
	cr_assert_eq(tag_call("/tags/arn%3", "GET", "", NULL, &op, &b), -EINVAL);
	cr_assert_eq(tag_call("/tags/a%00b", "GET", "", NULL, &op, &b), -EINVAL);
	cr_assert_eq(tag_call("/tags/", "GET", "", NULL, &op, &b), -EINVAL);
	cr_assert_eq(tag_call("/tags/" ARN_ENC, "POST", "", "[1]", &op, &b), -EINVAL);
	cr_assert_eq(tag_call("/tags/" ARN_ENC, "PUT", "", NULL, &op, &b), -EINVAL);
}

/* The fake operation layer: GetVectorBucketPolicy answers with status/policy. */
struct fake {
	int status;
	const char *policy;
	int calls;
	char last[256];
};

static void fake_run(void *ctx, const char *op, const char *body, size_t len,
		     struct s3_resp *r)
{
	struct fake *f = ctx;

	f->calls++;
	cr_assert_str_eq(op, "GetVectorBucketPolicy");
	snprintf(f->last, sizeof(f->last), "%.*s", (int)len, body);
	memset(r, 0, sizeof(*r));
	if (f->status != 200) {
		s3_resp_error(r, f->status, f->status == 404 ? "NotFoundException" :
			      "ServiceUnavailableException", "x");
		return;
	}
	json_t *o = json_pack("{s:s}", "policy", f->policy);

	r->status = 200;
	r->body = json_dumps(o, 0);
	r->len = strlen(r->body);
	json_decref(o);
}

static bool authorize(struct fake *f, const char *who, bool deny, const char *op,
		      const char *body, int *status)
{
	struct s3g_authz z = { .principal = who, .region = "us-east-1",
			       .account = "000000000000", .default_deny = deny,
			       .run = fake_run, .ctx = f };
	struct s3_resp r = { 0 };
	bool ok = s3g_authorize(&z, op, body, strlen(body), &r);

	*status = r.status;
	if (!ok)
		cr_assert_neq(r.status, 0);
	s3_resp_free(&r);
	return ok;
}

#define BOB "arn:aws:iam::000000000000:user/bob"
#define ALICE "arn:aws:iam::000000000000:user/alice"

Test(s3_gate, policies)
{
	struct fake f = { .status = 200, .policy =
		"{\"Statement\":[{\"Effect\":\"Deny\",\"Principal\":{\"AWS\":\"" BOB "\"},"
		"\"Action\":\"s3vectors:PutVectors\",\"Resource\":\"" ARN "/index/*\"},"
		"{\"Effect\":\"Allow\",\"Principal\":{\"AWS\":\"" ALICE "\"},\"Action\":\"*\","
		"\"Resource\":\"*\"}]}" };
	const char *ix = "{\"vectorBucketName\":\"bk1\",\"indexName\":\"ix1\"}";
	int st;

	cr_assert(!authorize(&f, BOB, false, "PutVectors", ix, &st));
	cr_assert_eq(st, 403);
	cr_assert_str_eq(f.last, "{\"vectorBucketName\":\"bk1\"}");
	cr_assert(authorize(&f, ALICE, false, "PutVectors", ix, &st));
	cr_assert(authorize(&f, BOB, false, "GetVectors", ix, &st));
	/* The same index named by its ARN, and a bucket-level call (bucket ARN). */
	cr_assert(!authorize(&f, BOB, false, "PutVectors",
			     "{\"indexArn\":\"" ARN "/index/ix1\"}", &st));
	cr_assert(authorize(&f, BOB, false, "PutVectorBucketPolicy",
			    "{\"vectorBucketArn\":\"" ARN "\"}", &st));
	/* The resource is the operation's: an indexName beside a bucket-level call, or a
	 * bucket name beside a tag call's resourceArn, does not move it. */
	f.policy = "{\"Statement\":{\"Effect\":\"Deny\",\"Principal\":\"*\",\"Action\":"
		   "\"*\",\"Resource\":\"" ARN "\"}}";
	cr_assert(!authorize(&f, BOB, false, "DeleteVectorBucketPolicy",
			     "{\"vectorBucketName\":\"bk1\",\"indexName\":\"ix1\"}", &st));
	cr_assert(!authorize(&f, BOB, false, "TagResource",
			     "{\"vectorBucketName\":\"zzz\",\"resourceArn\":\"" ARN "\"}", &st));
	cr_assert_str_eq(f.last, "{\"vectorBucketName\":\"bk1\"}");
	f.policy = "{\"Statement\":[{\"Effect\":\"Deny\",\"Principal\":{\"AWS\":\"" BOB "\"},"
		   "\"Action\":\"s3vectors:PutVectors\",\"Resource\":\"" ARN "/index/*\"},"
		   "{\"Effect\":\"Allow\",\"Principal\":{\"AWS\":\"" ALICE "\"},\"Action\":\"*\","
		   "\"Resource\":\"*\"}]}";
	/* policy_default = deny: only what a statement allows. */
	cr_assert(!authorize(&f, BOB, true, "GetVectors", ix, &st));
	cr_assert(authorize(&f, ALICE, true, "GetVectors", ix, &st));
	/* Account-level operations and requests naming no bucket are not checked. */
	f.calls = 0;
	cr_assert(authorize(&f, BOB, true, "ListVectorBuckets", "{}", &st));
	cr_assert(authorize(&f, BOB, true, "CreateVectorBucket", "{\"vectorBucketName\":\"bk1\"}",
			    &st));
	cr_assert(authorize(&f, BOB, true, "GetIndex", "{\"indexName\":\"ix1\"}", &st));
	cr_assert_eq(f.calls, 0);
	/* No policy (or no bucket): open. */
	f.status = 404;
	cr_assert(authorize(&f, BOB, true, "PutVectors", ix, &st));
	/* The policy cannot be read: the request fails with that error, not silently open. */
	f.status = 503;
	cr_assert(!authorize(&f, ALICE, false, "PutVectors", ix, &st));
	cr_assert_eq(st, 503);
	/* A stored policy that does not parse (never written by PutVectorBucketPolicy): 500. */
	f.status = 200;
	f.policy = "{";
	cr_assert(!authorize(&f, ALICE, false, "PutVectors", ix, &st));
	cr_assert_eq(st, 500);
}
