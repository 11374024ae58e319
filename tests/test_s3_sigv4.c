/* test_s3_sigv4.c: SigV4 against AWS's published vectors (sig-v4 test suite get-vanilla,
 * post-vanilla, get-vanilla-query-order-key-case; the S3 GetObject example), then the
 * verifier: accepted request, and each refusal (bad secret, unknown key, body hash, body
 * tampering, clock skew, scope, missing headers). */
#include <criterion/criterion.h>

#include <string.h>
#include <time.h>

#include "s3_sigv4.h"

#define EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define SUITE_SECRET "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"

struct hdrs {
	const char *kv[16][2];
	int n;
};

static const char *get_hdr(void *ctx, const char *name)
{
	struct hdrs *h = ctx;

	for (int i = 0; i < h->n; i++)
		if (!strcasecmp(h->kv[i][0], name))
			return h->kv[i][1];
	return NULL;
}

static void set_hdr(struct hdrs *h, const char *k, const char *v)
{
	for (int i = 0; i < h->n; i++)
		if (!strcasecmp(h->kv[i][0], k)) {
			h->kv[i][1] = v;
			return;
		}
	h->kv[h->n][0] = k;
	h->kv[h->n][1] = v;
	h->n++;
}

static void suite_sig(const char *method, const char *path, const char *query,
		      const char *want)
{
	struct hdrs h = { 0 };
	struct s3_sigv4_req r = { method, path, query, get_hdr, &h, "", 0 };
	char *creq, sig[65];

	set_hdr(&h, "Host", "example.amazonaws.com");
	set_hdr(&h, "X-Amz-Date", "20150830T123600Z");
	creq = s3_sigv4_canonical_request(&r, "host;x-amz-date", EMPTY_SHA);
	cr_assert_not_null(creq);
	s3_sigv4_signature(SUITE_SECRET, "20150830T123600Z", "us-east-1", "service", creq, sig);
	cr_assert_str_eq(sig, want);
	free(creq);
}

Test(sigv4, aws_suite_get_vanilla)
{
	struct hdrs h = { 0 };
	struct s3_sigv4_req r = { "GET", "/", "", get_hdr, &h, "", 0 };
	char *creq;

	set_hdr(&h, "Host", "example.amazonaws.com");
	set_hdr(&h, "X-Amz-Date", "20150830T123600Z");
	creq = s3_sigv4_canonical_request(&r, "host;x-amz-date", EMPTY_SHA);
	cr_assert_str_eq(creq, "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n"
			 "\nhost;x-amz-date\n" EMPTY_SHA);
	free(creq);
	suite_sig("GET", "/", "",
		  "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

Test(sigv4, aws_suite_post_vanilla)
{
	suite_sig("POST", "/", "",
		  "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b");
}

Test(sigv4, aws_suite_query_order_key_case)
{
	suite_sig("GET", "/", "Param2=value2&Param1=value1",
		  "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}

/* The GetObject example of the S3 SigV4 documentation (range header, content hash). */
Test(sigv4, aws_s3_get_object_example)
{
	struct hdrs h = { 0 };
	struct s3_sigv4_req r = { "GET", "/test.txt", "", get_hdr, &h, "", 0 };
	char out[512];

	set_hdr(&h, "Host", "examplebucket.s3.amazonaws.com");
	set_hdr(&h, "Range", "bytes=0-9");
	set_hdr(&h, "x-amz-content-sha256", EMPTY_SHA);
	set_hdr(&h, "x-amz-date", "20130524T000000Z");
	cr_assert_eq(s3_sigv4_authorization(&r, "AKIAIOSFODNN7EXAMPLE",
					    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
					    "20130524T000000Z", "us-east-1", "s3",
					    "host;range;x-amz-content-sha256;x-amz-date", EMPTY_SHA,
					    out, sizeof(out)), 0);
	cr_assert_str_eq(out, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1"
			 "/s3/aws4_request, SignedHeaders=host;range;x-amz-content-sha256;"
			 "x-amz-date, Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd9"
			 "1039c6036bdb41");
}

Test(sigv4, canonical_encoding)
{
	struct hdrs h = { 0 };
	struct s3_sigv4_req r = { "POST", "/s3v/a b%2F", "b=2&a=x%20y&a=1&c", get_hdr, &h, "", 0 };
	char *creq;

	set_hdr(&h, "host", "h");
	set_hdr(&h, "x-amz-date", "  20150830T123600Z   ");
	set_hdr(&h, "x-multi", "a   b \t c");
	creq = s3_sigv4_canonical_request(&r, "host;x-amz-date;x-multi", "HASH");
	/* Path encoded once more (non-S3 services), query decoded/re-encoded and sorted,
	 * header values trimmed with runs of spaces collapsed. */
	cr_assert_str_eq(creq, "POST\n/s3v/a%20b%252F\na=1&a=x%20y&b=2&c=\nhost:h\n"
			 "x-amz-date:20150830T123600Z\nx-multi:a b c\n\n"
			 "host;x-amz-date;x-multi\nHASH");
	free(creq);
	cr_assert_null(s3_sigv4_canonical_request(&r, "host;x-missing", "HASH"));
	cr_assert_null(s3_sigv4_canonical_request(&r, "Host", "HASH"));
}

/* ---- verification ----------------------------------------------------------------- */

static struct s3_cred creds[] = {
	{ "AKIDEXAMPLE", SUITE_SECRET, NULL },
	{ "OTHERKEY", "other-secret", NULL },
};

static const struct s3_sigv4_cfg cfg = {
	.creds = creds, .ncreds = 2, .service = "s3vectors", .region = NULL, .max_skew_s = 900,
};

#define BODY "{\"topK\":3,\"queryVector\":{\"float32\":[0.1,0.2]}}"
#define SIGNED "content-type;host;x-amz-content-sha256;x-amz-date"

struct signed_req {
	struct hdrs h;
	struct s3_sigv4_req r;
	char authz[512], hash[65];
	time_t now;
};

static void make_req(struct signed_req *s, const char *ak, const char *secret,
		     const char *region, const char *service)
{
	struct tm tm = { .tm_year = 126, .tm_mon = 10, .tm_mday = 30, .tm_hour = 2,
			 .tm_min = 52, .tm_sec = 8 };

	memset(s, 0, sizeof(*s));
	s->now = timegm(&tm);
	s3_sha256_hex(BODY, strlen(BODY), s->hash);
	set_hdr(&s->h, "content-type", "application/json");
	set_hdr(&s->h, "host", "127.0.0.1:9");
	set_hdr(&s->h, "x-amz-date", "20261130T025208Z");
	set_hdr(&s->h, "x-amz-content-sha256", s->hash);
	s->r = (struct s3_sigv4_req){ "POST", "/QueryVectors", "", get_hdr, &s->h, BODY,
				      strlen(BODY) };
	cr_assert_eq(s3_sigv4_authorization(&s->r, ak, secret, "20261130T025208Z", region,
					    service, SIGNED, s->hash, s->authz,
					    sizeof(s->authz)), 0);
	set_hdr(&s->h, "authorization", s->authz);
}

static void expect_denied(struct signed_req *s, time_t now, const char *why)
{
	char msg[256] = "";

	cr_assert_eq(s3_sigv4_verify(&cfg, &s->r, now, msg, sizeof(msg)), -EACCES);
	cr_assert(strstr(msg, why), "message '%s' lacks '%s'", msg, why);
}

Test(sigv4, verify_accepts)
{
	struct signed_req s;
	char msg[256];

	make_req(&s, "AKIDEXAMPLE", SUITE_SECRET, "us-east-1", "s3vectors");
	cr_assert_eq(s3_sigv4_verify(&cfg, &s.r, s.now, msg, sizeof(msg)), 0, "%s", msg);
	cr_assert_eq(s3_sigv4_verify(&cfg, &s.r, s.now + 899, msg, sizeof(msg)), 0, "%s", msg);
	make_req(&s, "OTHERKEY", "other-secret", "eu-west-3", "s3vectors");
	cr_assert_eq(s3_sigv4_verify(&cfg, &s.r, s.now - 899, msg, sizeof(msg)), 0, "%s", msg);
}

Test(sigv4, verify_refusals)
{
	struct signed_req s;
	struct s3_sigv4_cfg reg = cfg;
	char msg[256];

	make_req(&s, "AKIDEXAMPLE", "wrong-secret", "us-east-1", "s3vectors");
	expect_denied(&s, s.now, "signature we calculated does not match");
	make_req(&s, "NOSUCHKEY", SUITE_SECRET, "us-east-1", "s3vectors");
	expect_denied(&s, s.now, "security token");
	make_req(&s, "AKIDEXAMPLE", SUITE_SECRET, "us-east-1", "s3");
	expect_denied(&s, s.now, "service");
	make_req(&s, "AKIDEXAMPLE", SUITE_SECRET, "us-east-1", "s3vectors");
	expect_denied(&s, s.now + 901, "expired");
	expect_denied(&s, s.now - 901, "expired");
	reg.region = "eu-west-1";
	cr_assert_eq(s3_sigv4_verify(&reg, &s.r, s.now, msg, sizeof(msg)), -EACCES);
	cr_assert(strstr(msg, "region"));

	/* Body changed, declared hash left: content hash mismatch. */
	s.r.body = "{\"topK\":4}";
	s.r.body_len = strlen(s.r.body);
	expect_denied(&s, s.now, "x-amz-content-sha256");
	/* Body and declared hash both changed: the signature no longer matches. */
	char h2[65];

	s3_sha256_hex(s.r.body, s.r.body_len, h2);
	set_hdr(&s.h, "x-amz-content-sha256", h2);
	expect_denied(&s, s.now, "signature we calculated does not match");

	/* A signed header altered in transit. */
	make_req(&s, "AKIDEXAMPLE", SUITE_SECRET, "us-east-1", "s3vectors");
	set_hdr(&s.h, "host", "127.0.0.1:10");
	expect_denied(&s, s.now, "does not match");
	/* A signed header missing. */
	make_req(&s, "AKIDEXAMPLE", SUITE_SECRET, "us-east-1", "s3vectors");
	set_hdr(&s.h, "content-type", NULL);
	expect_denied(&s, s.now, "missing");
	/* Path altered. */
	make_req(&s, "AKIDEXAMPLE", SUITE_SECRET, "us-east-1", "s3vectors");
	s.r.path = "/DeleteVectors";
	expect_denied(&s, s.now, "does not match");
	/* No Authorization; other schemes; malformed credential; missing date. */
	make_req(&s, "AKIDEXAMPLE", SUITE_SECRET, "us-east-1", "s3vectors");
	set_hdr(&s.h, "authorization", NULL);
	expect_denied(&s, s.now, "Missing Authentication Token");
	set_hdr(&s.h, "authorization", "AWS AKIDEXAMPLE:abc");
	expect_denied(&s, s.now, "scheme");
	set_hdr(&s.h, "authorization", "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261130/x, "
		"SignedHeaders=host;x-amz-date, Signature=00");
	expect_denied(&s, s.now, "Credential");
	make_req(&s, "AKIDEXAMPLE", SUITE_SECRET, "us-east-1", "s3vectors");
	set_hdr(&s.h, "x-amz-date", NULL);
	expect_denied(&s, s.now, "x-amz-date");
	make_req(&s, "AKIDEXAMPLE", SUITE_SECRET, "us-east-1", "s3vectors");
	set_hdr(&s.h, "x-amz-date", "20261201T025208Z");
	expect_denied(&s, s.now, "date");
}
