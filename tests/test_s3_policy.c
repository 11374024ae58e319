/* test_s3_policy.c: the bucket policy parser and evaluator (common/index/s3_policy.c):
 * Allow / Deny, explicit Deny winning, principals ("*", ARNs, lists, accounts), action and
 * resource wildcards, NotAction / NotResource, and malformed policies refused with a
 * reason. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "s3_policy.h"

#define BUCKET "arn:aws:s3vectors:us-east-1:000000000000:bucket/b1"
#define INDEX BUCKET "/index/ix1"
#define ALICE "arn:aws:iam::000000000000:user/alice"
#define BOB "arn:aws:iam::000000000000:user/bob"
#define OTHER "arn:aws:iam::111122223333:user/carol"

static struct s3p_policy *parse(const char *text)
{
	char msg[256];
	struct s3p_policy *p = s3p_parse(text, strlen(text), msg, sizeof(msg));

	cr_assert_not_null(p, "refused: %s (%s)", text, msg);
	return p;
}

static void refused(const char *text, const char *needle)
{
	char msg[256];
	struct s3p_policy *p = s3p_parse(text, strlen(text), msg, sizeof(msg));

	cr_assert_null(p, "accepted: %s", text);
	cr_assert_eq(errno, EINVAL);
	cr_assert_not_null(strstr(msg, needle), "message '%s' lacks '%s' (%s)", msg, needle, text);
}

Test(s3_policy, glob)
{
	cr_assert(s3p_match("*", "", false));
	cr_assert(s3p_match("a*c", "abbbc", false));
	cr_assert(s3p_match("a?c", "abc", false));
	cr_assert(!s3p_match("a?c", "ac", false));
	cr_assert(s3p_match("*/index/*", BUCKET "/index/x", false));
	cr_assert(!s3p_match("*/index/*", BUCKET, false));
	cr_assert(s3p_match("s3vectors:get*", "s3vectors:GetVectors", true));
	cr_assert(!s3p_match("s3vectors:get*", "s3vectors:GetVectors", false));
	cr_assert(s3p_match("a*b*c", "axxbyyc", false));
	cr_assert(!s3p_match("a*b*c", "axxbyy", false));
}

Test(s3_policy, allow_deny_and_explicit_deny_wins)
{
	struct s3p_policy *p = parse(
		"{\"Version\":\"2012-10-17\",\"Statement\":["
		"{\"Effect\":\"Allow\",\"Principal\":\"*\",\"Action\":\"s3vectors:*\","
		"\"Resource\":[\"" BUCKET "\",\"" BUCKET "/*\"]},"
		"{\"Sid\":\"x\",\"Effect\":\"Deny\",\"Principal\":{\"AWS\":[\"" BOB "\"]},"
		"\"Action\":[\"s3vectors:PutVectors\",\"s3vectors:Delete*\"],\"Resource\":\"" BUCKET
		"/index/*\"}]}");

	cr_assert_eq(s3p_eval(p, ALICE, "s3vectors:PutVectors", INDEX), S3P_ALLOW);
	cr_assert_eq(s3p_eval(p, BOB, "s3vectors:PutVectors", INDEX), S3P_DENY);
	cr_assert_eq(s3p_eval(p, BOB, "s3vectors:DeleteVectors", INDEX), S3P_DENY);
	cr_assert_eq(s3p_eval(p, BOB, "s3vectors:deleteindex", INDEX), S3P_DENY);
	cr_assert_eq(s3p_eval(p, BOB, "s3vectors:GetVectors", INDEX), S3P_ALLOW);
	/* The Deny names indexes only: the bucket itself stays allowed. */
	cr_assert_eq(s3p_eval(p, BOB, "s3vectors:DeleteVectorBucket", BUCKET), S3P_ALLOW);
	/* Another bucket: no statement applies. */
	cr_assert_eq(s3p_eval(p, ALICE, "s3vectors:GetVectors",
			      "arn:aws:s3vectors:us-east-1:000000000000:bucket/b2/index/i"),
		     S3P_IMPLICIT);
	cr_assert_eq(s3p_eval(NULL, ALICE, "s3vectors:GetVectors", INDEX), S3P_IMPLICIT);
	s3p_free(p);
}

Test(s3_policy, principals)
{
	struct s3p_policy *p = parse(
		"{\"Statement\":{\"Effect\":\"Allow\",\"Principal\":{\"AWS\":\"" ALICE "\"},"
		"\"Action\":\"*\",\"Resource\":\"*\"}}");

	cr_assert_eq(s3p_eval(p, ALICE, "s3vectors:QueryVectors", INDEX), S3P_ALLOW);
	cr_assert_eq(s3p_eval(p, BOB, "s3vectors:QueryVectors", INDEX), S3P_IMPLICIT);
	s3p_free(p);
	/* An account id and an account root name every principal of that account. */
	p = parse("{\"Statement\":[{\"Effect\":\"Deny\",\"Principal\":{\"AWS\":\"111122223333\"},"
		  "\"Action\":\"*\",\"Resource\":\"*\"},{\"Effect\":\"Deny\",\"Principal\":{\"AWS\":"
		  "[\"arn:aws:iam::000000000000:root\"]},\"Action\":\"s3vectors:Query*\","
		  "\"Resource\":\"*\"}]}");
	cr_assert_eq(s3p_eval(p, OTHER, "s3vectors:GetIndex", INDEX), S3P_DENY);
	cr_assert_eq(s3p_eval(p, ALICE, "s3vectors:GetIndex", INDEX), S3P_IMPLICIT);
	cr_assert_eq(s3p_eval(p, BOB, "s3vectors:QueryVectors", INDEX), S3P_DENY);
	s3p_free(p);
}

Test(s3_policy, not_action_not_resource)
{
	/* "bob may only GetVectors": Deny everything else. */
	struct s3p_policy *p = parse(
		"{\"Statement\":{\"Effect\":\"Deny\",\"Principal\":{\"AWS\":\"" BOB "\"},"
		"\"NotAction\":\"s3vectors:GetVectors\",\"Resource\":\"*\"}}");

	cr_assert_eq(s3p_eval(p, BOB, "s3vectors:GetVectors", INDEX), S3P_IMPLICIT);
	cr_assert_eq(s3p_eval(p, BOB, "s3vectors:QueryVectors", INDEX), S3P_DENY);
	cr_assert_eq(s3p_eval(p, ALICE, "s3vectors:QueryVectors", INDEX), S3P_IMPLICIT);
	s3p_free(p);
	p = parse("{\"Statement\":{\"Effect\":\"Deny\",\"Principal\":\"*\",\"Action\":\"*\","
		  "\"NotResource\":[\"" BUCKET "/index/ix?\"]}}");
	cr_assert_eq(s3p_eval(p, ALICE, "s3vectors:GetVectors", INDEX), S3P_IMPLICIT);
	cr_assert_eq(s3p_eval(p, ALICE, "s3vectors:GetVectors", BUCKET "/index/other"),
		     S3P_DENY);
	cr_assert_eq(s3p_eval(p, ALICE, "s3vectors:GetVectorBucket", BUCKET), S3P_DENY);
	s3p_free(p);
}

Test(s3_policy, malformed)
{
	char big[S3P_MAX_BYTES + 64];

	refused("", "empty");
	refused("{", "not valid JSON");
	refused("[]", "JSON object");
	refused("{\"Statement\":[]}", "1 to");
	refused("{\"Version\":\"2020-01-01\",\"Statement\":{}}", "Version");
	refused("{\"Statements\":[]}", "unsupported policy member");
	refused("{\"Statement\":{\"Effect\":\"Maybe\",\"Principal\":\"*\",\"Action\":\"*\","
		"\"Resource\":\"*\"}}", "Effect");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Action\":\"*\",\"Resource\":\"*\"}}",
		"Principal");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Principal\":\"bob\",\"Action\":\"*\","
		"\"Resource\":\"*\"}}", "Principal");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Principal\":{\"Service\":\"x\"},"
		"\"Action\":\"*\",\"Resource\":\"*\"}}", "principal type");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Principal\":{\"AWS\":\"bob\"},"
		"\"Action\":\"*\",\"Resource\":\"*\"}}", "invalid principal");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Principal\":\"*\",\"Action\":"
		"\"s3:GetObject\",\"Resource\":\"*\"}}", "invalid action");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Principal\":\"*\",\"Action\":\"*\","
		"\"NotAction\":\"*\",\"Resource\":\"*\"}}", "exactly one of Action");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Principal\":\"*\",\"Action\":[],"
		"\"Resource\":\"*\"}}", "1 to");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Principal\":\"*\",\"Action\":\"*\"}}",
		"Resource");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Principal\":\"*\",\"Action\":\"*\","
		"\"Resource\":\"bucket/x\"}}", "invalid resource");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Principal\":\"*\",\"Action\":\"*\","
		"\"Resource\":\"*\",\"Condition\":{}}}", "Condition");
	refused("{\"Statement\":{\"Effect\":\"Allow\",\"Effect\":\"Deny\",\"Principal\":\"*\","
		"\"Action\":\"*\",\"Resource\":\"*\"}}", "not valid JSON");   /* duplicate key */
	memset(big, ' ', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	refused(big, "exceeds");
}
