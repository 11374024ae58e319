/* test_s3_api.c: the S3 Vectors operations without HTTP (s3_api_handle over a temporary
 * flat store): request validation against the AWS limits with ValidationException +
 * fieldList, NotFound/Conflict shapes, paging tokens, queries and filters, and data that
 * survives a restart. */
#include <criterion/criterion.h>

#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "s3_api.h"

static char tdir[64];
static struct flat_store *store;
static struct s3_api *api;

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st; (void)flag; (void)f;
	return remove(p);
}

static void setup(void)
{
	snprintf(tdir, sizeof(tdir), "/tmp/dmann-s3api-XXXXXX");
	cr_assert_not_null(mkdtemp(tdir));
	store = flat_open(tdir, NULL);
	cr_assert_not_null(store);
	api = s3_api_new(store, "us-east-1", "123456789012");
}

static void teardown(void)
{
	s3_api_free(api);
	flat_close(store);
	nftw(tdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(s3api, .init = setup, .fini = teardown);

/* Run op with a printf-formatted body; returns the parsed response body. */
static json_t *call(const char *op, int want_status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static json_t *call(const char *op, int want_status, const char *fmt, ...)
{
	va_list ap;
	char *body;
	struct s3_resp r;
	json_t *o;

	va_start(ap, fmt);
	cr_assert_geq(vasprintf(&body, fmt, ap), 0);
	va_end(ap);
	s3_api_handle(api, op, body, strlen(body), &r);
	o = json_loadb(r.body, r.len, 0, NULL);
	cr_assert_not_null(o, "%s: response is not JSON", op);
	cr_assert_eq(r.status, want_status, "%s %s -> %d %s", op, body, r.status, r.body);
	if (r.status != 200) {
		cr_assert_not_null(r.errtype);
		cr_assert_str_eq(json_string_value(json_object_get(o, "__type")), r.errtype);
		cr_assert(json_is_string(json_object_get(o, "message")));
	} else {
		cr_assert_null(r.errtype);
	}
	s3_resp_free(&r);
	free(body);
	return o;
}

/* Expect a ValidationException whose fieldList names path. */
static void invalid(const char *op, const char *path, const char *body)
{
	json_t *o = call(op, 400, "%s", body);
	json_t *fl = json_object_get(o, "fieldList");

	cr_assert_str_eq(json_string_value(json_object_get(o, "__type")), "ValidationException");
	cr_assert(json_is_array(fl) && json_array_size(fl) == 1, "%s: no fieldList", body);
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(fl, 0), "path")), path,
			 "%s", body);
	json_decref(o);
}

static void expect_type(const char *op, int status, const char *type, const char *body)
{
	json_t *o = call(op, status, "%s", body);

	cr_assert_str_eq(json_string_value(json_object_get(o, "__type")), type);
	json_decref(o);
}

#define B "\"vectorBucketName\":\"bkt\""
#define IX B ",\"indexName\":\"idx\""

static void make_index(const char *metric)
{
	json_decref(call("CreateVectorBucket", 200, "{" B "}"));
	json_decref(call("CreateIndex", 200, "{" IX ",\"dataType\":\"float32\",\"dimension\":3,"
			 "\"distanceMetric\":\"%s\",\"metadataConfiguration\":"
			 "{\"nonFilterableMetadataKeys\":[\"text\"]}}", metric));
}

/* A full store (flat_opts.max_bytes): PutVectors is refused with
 * ServiceQuotaExceededException (402) and nothing of it is stored; DeleteIndex frees the
 * room. */
Test(s3api, full_store_refuses_puts_with_quota_exceeded)
{
	s3_api_free(api);
	flat_close(store);
	store = flat_open(tdir, &(struct flat_opts){ .max_bytes = 4096 });
	cr_assert_not_null(store);
	api = s3_api_new(store, "us-east-1", "123456789012");
	make_index("euclidean");
	int ok = 0;

	for (; ok < 1000; ok++) {
		char body[256];
		struct s3_resp r;

		snprintf(body, sizeof(body), "{" IX ",\"vectors\":[{\"key\":\"k%d\",\"data\":"
			 "{\"float32\":[1,2,3]},\"metadata\":{\"n\":%d}}]}", ok, ok);
		s3_api_handle(api, "PutVectors", body, strlen(body), &r);
		if (r.status != 200) {
			cr_assert_eq(r.status, 402, "%d %s", r.status, r.body);
			cr_assert_str_eq(r.errtype, "ServiceQuotaExceededException");
			s3_resp_free(&r);
			break;
		}
		s3_resp_free(&r);
	}
	cr_assert(ok > 10 && ok < 1000, "%d puts fit in 4 KiB", ok);
	json_t *o = call("GetVectors", 200, "{" IX ",\"keys\":[\"k0\",\"k%d\"]}", ok);

	cr_assert_eq(json_array_size(json_object_get(o, "vectors")), 1, "the refused row is there");
	json_decref(o);
	json_decref(call("DeleteIndex", 200, "{" IX "}"));
	json_decref(call("CreateIndex", 200, "{" IX ",\"dataType\":\"float32\",\"dimension\":3,"
			 "\"distanceMetric\":\"euclidean\"}"));
	json_decref(call("PutVectors", 200, "{" IX ",\"vectors\":[{\"key\":\"k0\",\"data\":"
			 "{\"float32\":[1,2,3]}}]}"));
}

Test(s3api, buckets_and_indexes)
{
	json_t *o;

	o = call("CreateVectorBucket", 200, "{" B "}");
	cr_assert_str_eq(json_string_value(json_object_get(o, "vectorBucketArn")),
			 "arn:aws:s3vectors:us-east-1:123456789012:bucket/bkt");
	json_decref(o);
	expect_type("CreateVectorBucket", 409, "ConflictException", "{" B "}");
	invalid("CreateVectorBucket", "/vectorBucketName", "{\"vectorBucketName\":\"Bad_Name\"}");
	invalid("CreateVectorBucket", "/vectorBucketName", "{\"vectorBucketName\":\"ab\"}");
	invalid("CreateVectorBucket", "/vectorBucketName", "{}");
	invalid("CreateVectorBucket", "/vectorBucketName", "{\"vectorBucketName\":7}");
	invalid("CreateVectorBucket", "/encryptionConfiguration/sseType",
		"{\"vectorBucketName\":\"b2b\",\"encryptionConfiguration\":{\"sseType\":\"aws:kms\"}}");
	invalid("CreateVectorBucket", "/", "{\"vectorBucketName\":");
	invalid("CreateVectorBucket", "/", "[1]");
	invalid("CreateVectorBucket", "/", "{\"a\":1,\"a\":2}");

	o = call("GetVectorBucket", 200, "{\"vectorBucketArn\":"
		 "\"arn:aws:s3vectors:us-east-1:123456789012:bucket/bkt\"}");
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(o, "vectorBucket"),
							   "vectorBucketName")), "bkt");
	json_decref(o);
	expect_type("GetVectorBucket", 404, "NotFoundException", "{\"vectorBucketName\":\"nob\"}");
	invalid("GetVectorBucket", "/vectorBucketName",
		"{" B ",\"vectorBucketArn\":\"arn:aws:s3vectors:r:a:bucket/bkt\"}");
	invalid("GetVectorBucket", "/vectorBucketArn", "{\"vectorBucketArn\":\"arn:aws:s3:::x\"}");

	/* CreateIndex validation */
	invalid("CreateIndex", "/dimension", "{" IX ",\"dataType\":\"float32\",\"dimension\":0,"
		"\"distanceMetric\":\"cosine\"}");
	invalid("CreateIndex", "/dimension", "{" IX ",\"dataType\":\"float32\",\"dimension\":4097,"
		"\"distanceMetric\":\"cosine\"}");
	invalid("CreateIndex", "/dimension", "{" IX ",\"dataType\":\"float32\","
		"\"distanceMetric\":\"cosine\"}");
	invalid("CreateIndex", "/dataType", "{" IX ",\"dataType\":\"float16\",\"dimension\":4,"
		"\"distanceMetric\":\"cosine\"}");
	invalid("CreateIndex", "/distanceMetric", "{" IX ",\"dataType\":\"float32\","
		"\"dimension\":4,\"distanceMetric\":\"dot\"}");
	invalid("CreateIndex", "/indexName", "{" B ",\"indexName\":\"-x-\",\"dataType\":\"float32\","
		"\"dimension\":4,\"distanceMetric\":\"cosine\"}");
	invalid("CreateIndex", "/metadataConfiguration/nonFilterableMetadataKeys", "{" IX
		",\"dataType\":\"float32\",\"dimension\":4,\"distanceMetric\":\"cosine\","
		"\"metadataConfiguration\":{\"nonFilterableMetadataKeys\":[\"a\",\"b\",\"c\",\"d\","
		"\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\"]}}");
	expect_type("CreateIndex", 404, "NotFoundException", "{\"vectorBucketName\":\"nob\","
		    "\"indexName\":\"idx\",\"dataType\":\"float32\",\"dimension\":4,"
		    "\"distanceMetric\":\"cosine\"}");
	for (int i = 0; i < 3; i++)
		json_decref(call("CreateIndex", 200, "{" B ",\"indexName\":\"idx.%d\",\"dataType\":"
				 "\"float32\",\"dimension\":4,\"distanceMetric\":\"cosine\"}", i));
	expect_type("CreateIndex", 409, "ConflictException", "{" B ",\"indexName\":\"idx.1\","
		    "\"dataType\":\"float32\",\"dimension\":4,\"distanceMetric\":\"cosine\"}");

	/* ListIndexes paging */
	o = call("ListIndexes", 200, "{" B ",\"maxResults\":2}");
	cr_assert_eq(json_array_size(json_object_get(o, "indexes")), 2);
	const char *tok = json_string_value(json_object_get(o, "nextToken"));

	cr_assert_not_null(tok);
	json_t *o2 = call("ListIndexes", 200, "{" B ",\"maxResults\":2,\"nextToken\":\"%s\"}", tok);

	cr_assert_eq(json_array_size(json_object_get(o2, "indexes")), 1);
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(
		json_object_get(o2, "indexes"), 0), "indexName")), "idx.2");
	cr_assert_null(json_object_get(o2, "nextToken"));
	json_decref(o);
	json_decref(o2);
	invalid("ListIndexes", "/nextToken", "{" B ",\"nextToken\":\"zz\"}");
	invalid("ListIndexes", "/maxResults", "{" B ",\"maxResults\":0}");

	o = call("GetIndex", 200, "{\"indexArn\":\"arn:aws:s3vectors:us-east-1:123456789012:"
		 "bucket/bkt/index/idx.0\"}");
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "index"),
							"dimension")), 4);
	json_decref(o);
	expect_type("GetIndex", 404, "NotFoundException", "{" B ",\"indexName\":\"nope\"}");
	expect_type("DeleteVectorBucket", 409, "ConflictException", "{" B "}");
	for (int i = 0; i < 3; i++)
		json_decref(call("DeleteIndex", 200, "{" B ",\"indexName\":\"idx.%d\"}", i));
	json_decref(call("DeleteVectorBucket", 200, "{" B "}"));
	expect_type("DeleteVectorBucket", 404, "NotFoundException", "{" B "}");
	expect_type("Frobnicate", 404, "UnknownOperationException", "{}");
}

/* The names of a bucket's shards ("B#s", s3_api.h): refused unless the switch the memory
 * nodes turn on is on, and then only in their exact form; ARNs never carry them; the
 * gateway's check refuses '#' from users; the key's shard is deterministic and spread. */
Test(s3api, shard_bucket_names)
{
	static const char *const good[] = { "bkt#1", "bkt#9", "bkt#10", "bkt#255" };
	static const char *const bad[] = { "bkt#0", "bkt#01", "bkt#256", "bkt#1000", "bkt#",
		"bkt#-1", "bkt#1a", "#1", "ab#1", "Bkt#1", "bkt#1#2", "bkt##1", "-bk#1",
		"a-b.c#2" /* dots: no bucket name */ };
	char base[FLAT_NAME_MAX + 1], name[FLAT_NAME_MAX + 1], long63[64];
	uint32_t shard;

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		cr_assert(s3_shard_parse(good[i], base, &shard), "%s", good[i]);
		cr_assert_str_eq(base, "bkt");
		cr_assert_eq(s3_shard_name("bkt", shard, name), 0);
		cr_assert_str_eq(name, good[i]);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_not(s3_shard_parse(bad[i], NULL, NULL), "%s", bad[i]);
	cr_assert_eq(s3_shard_name("bkt", 0, name), 0);
	cr_assert_str_eq(name, "bkt");
	cr_assert_eq(s3_shard_name("bkt", DM_S3_SHARDS_MAX, name), -EINVAL);
	cr_assert_eq(s3_shard_name("b#1", 1, name), -EINVAL);
	/* The longest: a 63-character bucket's shard 255 (FLAT_NAME_MAX). */
	memset(long63, 'a', 63);
	long63[63] = 0;
	cr_assert_eq(s3_shard_name(long63, 255, name), 0);
	cr_assert_eq(strlen(name), FLAT_NAME_MAX);
	cr_assert(s3_shard_parse(name, base, &shard));
	cr_assert_eq(shard, 255);

	/* Off (dmann-s3, the default): '#' is refused everywhere. */
	invalid("CreateVectorBucket", "/vectorBucketName", "{\"vectorBucketName\":\"bkt#1\"}");
	invalid("GetVectorBucket", "/vectorBucketName", "{\"vectorBucketName\":\"bkt#1\"}");
	invalid("CreateIndex", "/vectorBucketName", "{\"vectorBucketName\":\"bkt#1\","
		"\"indexName\":\"idx\",\"dataType\":\"float32\",\"dimension\":3,"
		"\"distanceMetric\":\"euclidean\"}");
	/* On (the memory nodes): "B#s" is a bucket like any other, malformed ones are not. */
	s3_api_shard_names(api, true);
	json_decref(call("CreateVectorBucket", 200, "{\"vectorBucketName\":\"bkt\"}"));
	json_decref(call("CreateVectorBucket", 200, "{\"vectorBucketName\":\"bkt#1\"}"));
	json_decref(call("CreateVectorBucket", 200, "{\"vectorBucketName\":\"%s\"}", name));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char body[128];

		snprintf(body, sizeof(body), "{\"vectorBucketName\":\"%s\"}", bad[i]);
		invalid("CreateVectorBucket", "/vectorBucketName", body);
	}
	json_decref(call("CreateIndex", 200, "{\"vectorBucketName\":\"bkt#1\",\"indexName\":"
			 "\"idx\",\"dataType\":\"float32\",\"dimension\":3,\"distanceMetric\":"
			 "\"euclidean\"}"));
	json_decref(call("PutVectors", 200, "{\"vectorBucketName\":\"bkt#1\",\"indexName\":"
			 "\"idx\",\"vectors\":[{\"key\":\"k\",\"data\":{\"float32\":[1,2,3]}}]}"));
	json_t *o = call("GetVectors", 200, "{\"vectorBucketName\":\"bkt#1\",\"indexName\":"
			 "\"idx\",\"keys\":[\"k\"]}");

	cr_assert_eq(json_array_size(json_object_get(o, "vectors")), 1);
	json_decref(o);
	/* The shard bucket is listed here (the gateway hides it), and is its own bucket. */
	o = call("ListVectorBuckets", 200, "{}");
	cr_assert_eq(json_array_size(json_object_get(o, "vectorBuckets")), 3);
	json_decref(o);
	expect_type("GetIndex", 404, "NotFoundException", "{\"vectorBucketName\":\"bkt\","
		    "\"indexName\":\"idx\"}");
	/* An ARN never names a shard. */
	invalid("GetVectorBucket", "/vectorBucketArn", "{\"vectorBucketArn\":"
		"\"arn:aws:s3vectors:us-east-1:123456789012:bucket/bkt#1\"}");
	json_decref(call("DeleteIndex", 200, "{\"vectorBucketName\":\"bkt#1\",\"indexName\":"
			 "\"idx\"}"));
	json_decref(call("DeleteVectorBucket", 200, "{\"vectorBucketName\":\"bkt#1\"}"));
	s3_api_shard_names(api, false);
	invalid("GetVectorBucket", "/vectorBucketName", "{\"vectorBucketName\":\"bkt#1\"}");

	/* The gateway's check of a user's request. */
	struct s3_resp r = { 0 };

	const char *ub = "{\"vectorBucketName\":\"bkt#1\"}";

	cr_assert_eq(s3_api_user_bucket(ub, strlen(ub), &r), -EINVAL);
	cr_assert_eq(r.status, 400);
	cr_assert_str_eq(r.errtype, "ValidationException");
	s3_resp_free(&r);
	ub = "{\"vectorBucketName\":\"bkt\"}";
	cr_assert_eq(s3_api_user_bucket(ub, strlen(ub), &r), 0);
	ub = "{\"vectorBucketName\":\"bkt\\u00231\"}";     /* '#' escaped */
	cr_assert_eq(s3_api_user_bucket(ub, strlen(ub), &r), -EINVAL);
	s3_resp_free(&r);

	/* Keys' shards: deterministic, in range, spread (4 shards: each near a quarter). */
	uint32_t cnt[4] = { 0 };

	for (int i = 0; i < 4000; i++) {
		char k[16];
		int n = snprintf(k, sizeof(k), "key-%d", i);
		uint32_t s = s3_key_shard(k, (size_t)n, 4);

		cr_assert_lt(s, 4);
		cr_assert_eq(s, s3_key_shard(k, (size_t)n, 4));
		cr_assert_eq(s3_key_shard(k, (size_t)n, 1), 0);
		cnt[s]++;
	}
	for (int s = 0; s < 4; s++)
		cr_assert(cnt[s] > 850 && cnt[s] < 1150, "shard %d: %u of 4000", s, cnt[s]);
}

/* What the gateways tell the memory nodes about shards (only with the switch on): the
 * count recorded at CreateVectorBucket and read back on request, a part split by another
 * count refused with a 409 naming S3_SHARDS_DIFFER, a write checked without being applied. */
Test(s3api, shard_count_and_checked_writes)
{
	json_t *o;

	/* Off: a user's "_dmannShards" is no setting (the gateway refuses the field). */
	json_decref(call("CreateVectorBucket", 200, "{\"vectorBucketName\":\"uno\","
			 "\"_dmannShards\":4}"));
	s3_api_shard_names(api, true);
	json_decref(call("CreateVectorBucket", 200, "{" B ",\"_dmannShards\":4}"));
	invalid("CreateVectorBucket", "/_dmannShards", "{\"vectorBucketName\":\"b99\","
		"\"_dmannShards\":257}");
	o = call("GetVectorBucket", 200, "{" B ",\"_dmannShards\":true}");
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "vectorBucket"),
							"_dmannShards")), 4);
	json_decref(o);
	o = call("GetVectorBucket", 200, "{\"vectorBucketName\":\"uno\",\"_dmannShards\":true}");
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "vectorBucket"),
							"_dmannShards")), 1);
	json_decref(o);
	o = call("GetVectorBucket", 200, "{" B "}");
	cr_assert_null(json_object_get(json_object_get(o, "vectorBucket"), "_dmannShards"));
	json_decref(o);
	json_decref(call("CreateIndex", 200, "{" IX ",\"dataType\":\"float32\",\"dimension\":3,"
			 "\"distanceMetric\":\"euclidean\"}"));
	/* A part split by another count: refused, nothing written. */
	o = call("PutVectors", 409, "{" IX ",\"_dmannShards\":2,\"vectors\":[{\"key\":\"a\","
		 "\"data\":{\"float32\":[1,2,3]}}]}");
	cr_assert(strstr(json_string_value(json_object_get(o, "message")), S3_SHARDS_DIFFER));
	json_decref(o);
	/* Checked, not applied; then applied. */
	json_decref(call("PutVectors", 200, "{" IX ",\"_dmannShards\":4,\"_dmannCheck\":true,"
			 "\"vectors\":[{\"key\":\"a\",\"data\":{\"float32\":[1,2,3]}}]}"));
	invalid("PutVectors", "/vectors/1/data/float32", "{" IX ",\"_dmannCheck\":true,"
		"\"vectors\":[{\"key\":\"a\",\"data\":{\"float32\":[1,2,3]}},{\"key\":\"b\","
		"\"data\":{\"float32\":[1,2]}}]}");
	o = call("GetVectors", 200, "{" IX ",\"_dmannShards\":4,\"keys\":[\"a\"]}");
	cr_assert_eq(json_array_size(json_object_get(o, "vectors")), 0);
	json_decref(o);
	json_decref(call("PutVectors", 200, "{" IX ",\"_dmannShards\":4,\"vectors\":[{\"key\":"
			 "\"a\",\"data\":{\"float32\":[1,2,3]}}]}"));
	json_decref(call("DeleteVectors", 200, "{" IX ",\"_dmannCheck\":true,\"keys\":[\"a\"]}"));
	o = call("GetVectors", 200, "{" IX ",\"keys\":[\"a\"]}");
	cr_assert_eq(json_array_size(json_object_get(o, "vectors")), 1);
	json_decref(o);
	/* The gateway refuses the reserved fields from users. */
	struct s3_resp r = { 0 };
	const char *ub = "{" B ",\"_dmannCheck\":true}";

	cr_assert_eq(s3_api_user_bucket(ub, strlen(ub), &r), -EINVAL);
	cr_assert_eq(r.status, 400);
	s3_resp_free(&r);
}

Test(s3api, vector_validation)
{
	char *many;
	size_t n = 0;

	make_index("cosine");
	invalid("PutVectors", "/vectors", "{" IX ",\"vectors\":[]}");
	invalid("PutVectors", "/vectors/0/data/float32", "{" IX ",\"vectors\":[{\"key\":\"a\","
		"\"data\":{\"float32\":[1,2]}}]}");
	invalid("PutVectors", "/vectors/0/data/float32", "{" IX ",\"vectors\":[{\"key\":\"a\","
		"\"data\":{\"float32\":[0,0,0]}}]}");
	invalid("PutVectors", "/vectors/0/data/float32", "{" IX ",\"vectors\":[{\"key\":\"a\","
		"\"data\":{\"float32\":[1e39,0,0]}}]}");
	invalid("PutVectors", "/vectors/0/data/float32", "{" IX ",\"vectors\":[{\"key\":\"a\","
		"\"data\":{\"float32\":[1,\"2\",0]}}]}");
	invalid("PutVectors", "/", "{" IX ",\"vectors\":[{\"key\":\"a\","
		"\"data\":{\"float32\":[NaN,0,0]}}]}");
	invalid("PutVectors", "/vectors/1/key", "{" IX ",\"vectors\":[{\"key\":\"a\","
		"\"data\":{\"float32\":[1,0,0]}},{\"key\":\"\",\"data\":{\"float32\":[1,0,0]}}]}");
	invalid("PutVectors", "/vectors/0/metadata", "{" IX ",\"vectors\":[{\"key\":\"a\","
		"\"data\":{\"float32\":[1,0,0]},\"metadata\":{\"x\":{\"y\":1}}}]}");
	expect_type("PutVectors", 404, "NotFoundException", "{" B ",\"indexName\":\"nope\","
		    "\"vectors\":[{\"key\":\"a\",\"data\":{\"float32\":[1,0,0]}}]}");

	/* 501 vectors, 1025-char key, 101 GetVectors keys, 501 DeleteVectors keys */
	many = malloc(1 << 20);
	n = (size_t)sprintf(many, "{" IX ",\"vectors\":[");
	for (int i = 0; i < 501; i++)
		n += (size_t)sprintf(many + n, "%s{\"key\":\"k%d\",\"data\":{\"float32\":[1,0,0]}}",
				     i ? "," : "", i);
	sprintf(many + n, "]}");
	invalid("PutVectors", "/vectors", many);
	n = (size_t)sprintf(many, "{" IX ",\"vectors\":[{\"key\":\"");
	memset(many + n, 'k', 1025);
	n += 1025;
	sprintf(many + n, "\",\"data\":{\"float32\":[1,0,0]}}]}");
	invalid("PutVectors", "/vectors/0/key", many);
	n = (size_t)sprintf(many, "{" IX ",\"keys\":[");
	for (int i = 0; i < 101; i++)
		n += (size_t)sprintf(many + n, "%s\"k%d\"", i ? "," : "", i);
	sprintf(many + n, "]}");
	invalid("GetVectors", "/keys", many);
	n = (size_t)sprintf(many, "{" IX ",\"keys\":[");
	for (int i = 0; i < 501; i++)
		n += (size_t)sprintf(many + n, "%s\"k%d\"", i ? "," : "", i);
	sprintf(many + n, "]}");
	invalid("DeleteVectors", "/keys", many);
	free(many);
	invalid("GetVectors", "/keys/1", "{" IX ",\"keys\":[\"a\",5]}");

	/* Queries */
	invalid("QueryVectors", "/topK", "{" IX ",\"topK\":0,\"queryVector\":{\"float32\":[1,0,0]}}");
	invalid("QueryVectors", "/topK", "{" IX ",\"topK\":101,\"queryVector\":{\"float32\":[1,0,0]}}");
	invalid("QueryVectors", "/topK", "{" IX ",\"queryVector\":{\"float32\":[1,0,0]}}");
	invalid("QueryVectors", "/queryVector", "{" IX ",\"topK\":1}");
	invalid("QueryVectors", "/queryVector/float32", "{" IX ",\"topK\":1,\"queryVector\":"
		"{\"float32\":[0,0,0]}}");
	invalid("QueryVectors", "/filter", "{" IX ",\"topK\":1,\"queryVector\":"
		"{\"float32\":[1,0,0]},\"filter\":{\"text\":\"x\"}}");
	invalid("QueryVectors", "/filter", "{" IX ",\"topK\":1,\"queryVector\":"
		"{\"float32\":[1,0,0]},\"filter\":{\"a\":{\"$regex\":\"x\"}}}");
	invalid("QueryVectors", "/returnDistance", "{" IX ",\"topK\":1,\"queryVector\":"
		"{\"float32\":[1,0,0]},\"returnDistance\":\"yes\"}");
	invalid("ListVectors", "/segmentIndex", "{" IX ",\"segmentCount\":2,\"segmentIndex\":2}");
	invalid("ListVectors", "/segmentIndex", "{" IX ",\"segmentCount\":2}");
	invalid("ListVectors", "/segmentCount", "{" IX ",\"segmentCount\":17,\"segmentIndex\":0}");
	invalid("ListVectors", "/maxResults", "{" IX ",\"maxResults\":1001}");
	invalid("ListVectors", "/nextToken", "{" IX ",\"nextToken\":\"763a31\"}");
}

static json_t *query(const char *extra, const char *vec)
{
	return call("QueryVectors", 200, "{" IX ",\"topK\":3,\"queryVector\":{\"float32\":[%s]},"
		    "\"returnDistance\":true,\"returnMetadata\":true%s}", vec, extra);
}

static const char *hit_key(json_t *o, size_t i)
{
	return json_string_value(json_object_get(json_array_get(json_object_get(o, "vectors"),
								i), "key"));
}

static double hit_dist(json_t *o, size_t i)
{
	return json_number_value(json_object_get(json_array_get(json_object_get(o, "vectors"),
								i), "distance"));
}

Test(s3api, put_get_list_query_restart)
{
	json_t *o;

	make_index("euclidean");
	json_decref(call("PutVectors", 200, "{" IX ",\"vectors\":["
		"{\"key\":\"a\",\"data\":{\"float32\":[0,0,0]},\"metadata\":{\"g\":\"x\",\"n\":1}},"
		"{\"key\":\"b\",\"data\":{\"float32\":[1,0,0]},\"metadata\":{\"g\":\"y\",\"n\":2,"
		"\"text\":\"hello\"}},"
		"{\"key\":\"c\",\"data\":{\"float32\":[0,2,0]},\"metadata\":{\"g\":[\"x\",\"z\"]}},"
		"{\"key\":\"d\",\"data\":{\"float32\":[0,0,3]}}]}"));
	/* Euclidean distances are the (non-squared) L2 distance. */
	o = query("", "0,0,0");
	cr_assert_str_eq(hit_key(o, 0), "a");
	cr_assert_str_eq(hit_key(o, 1), "b");
	cr_assert_str_eq(hit_key(o, 2), "c");
	cr_assert_float_eq(hit_dist(o, 2), 2.0, 1e-6);
	cr_assert_str_eq(json_string_value(json_object_get(o, "distanceMetric")), "euclidean");
	json_decref(o);
	o = query(",\"filter\":{\"g\":\"x\"}", "0,0,0");          /* list element matches */
	cr_assert_eq(json_array_size(json_object_get(o, "vectors")), 2);
	cr_assert_str_eq(hit_key(o, 1), "c");
	json_decref(o);
	o = query(",\"filter\":{\"$or\":[{\"n\":{\"$gte\":2}},{\"g\":{\"$exists\":false}}]}",
		  "0,0,0");
	cr_assert_eq(json_array_size(json_object_get(o, "vectors")), 2);
	cr_assert_str_eq(hit_key(o, 0), "b");
	cr_assert_str_eq(hit_key(o, 1), "d");
	json_decref(o);

	/* Overwrite and delete. */
	json_decref(call("PutVectors", 200, "{" IX ",\"vectors\":[{\"key\":\"a\","
			 "\"data\":{\"float32\":[9,9,9]},\"metadata\":{\"g\":\"w\"}}]}"));
	json_decref(call("DeleteVectors", 200, "{" IX ",\"keys\":[\"b\",\"zz\"]}"));
	o = call("GetVectors", 200, "{" IX ",\"keys\":[\"a\",\"b\",\"c\"],\"returnData\":true,"
		 "\"returnMetadata\":true}");
	cr_assert_eq(json_array_size(json_object_get(o, "vectors")), 2);
	json_t *a = json_array_get(json_object_get(o, "vectors"), 0);

	cr_assert_str_eq(json_string_value(json_object_get(a, "key")), "a");
	cr_assert_float_eq(json_number_value(json_array_get(json_object_get(json_object_get(a,
		"data"), "float32"), 1)), 9.0, 1e-6);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(a, "metadata"), "g")),
			 "w");
	json_decref(o);

	/* List in pages of 1 in two segments: every live key once. */
	int seen = 0;

	for (int seg = 0; seg < 2; seg++) {
		char tok[256] = "";

		do {
			o = call("ListVectors", 200, "{" IX ",\"maxResults\":1,\"segmentCount\":2,"
				 "\"segmentIndex\":%d%s%s%s}", seg, tok[0] ? ",\"nextToken\":\"" : "",
				 tok, tok[0] ? "\"" : "");
			seen += (int)json_array_size(json_object_get(o, "vectors"));
			const char *t = json_string_value(json_object_get(o, "nextToken"));

			snprintf(tok, sizeof(tok), "%s", t ? t : "");
			json_decref(o);
		} while (tok[0]);
	}
	cr_assert_eq(seen, 3);

	/* Restart: same data. */
	s3_api_free(api);
	flat_close(store);
	store = flat_open(tdir, NULL);
	cr_assert_not_null(store);
	api = s3_api_new(store, NULL, NULL);
	o = query("", "9,9,9");
	cr_assert_str_eq(hit_key(o, 0), "a");
	cr_assert_float_eq(hit_dist(o, 0), 0.0, 1e-6);
	cr_assert_eq(json_array_size(json_object_get(o, "vectors")), 3);
	json_decref(o);
}

/* The one QueryVectors parser: the distributed path (s3_api_qspec_parse with a resolver
 * describing the index, as the compute nodes use it) gives every answer the local path
 * (s3_api_handle) gives: the same error, or success with the same request. */
struct rec_resolve {
	struct s3_qindex in;
	int calls;
	char b[64], x[64];
	int fail;                        /* resolver error to return (0: none) */
};

static int rec_resolver(void *ctx, const char *b, const char *x, struct s3_qindex *out,
			struct s3_resp *r)
{
	struct rec_resolve *rr = ctx;

	rr->calls++;
	snprintf(rr->b, sizeof(rr->b), "%s", b);
	snprintf(rr->x, sizeof(rr->x), "%s", x);
	if (rr->fail) {
		s3_api_not_found(r, false);
		return rr->fail;
	}
	*out = rr->in;
	return 0;
}

Test(s3api, one_query_parser_for_both_paths)
{
	static const char *bodies[] = {
		"{" IX ",\"topK\":2,\"queryVector\":{\"float32\":[1,0,0]}}",
		"{" IX ",\"topK\":2,\"queryVector\":{\"float32\":[1,0,0]},\"returnMetadata\":true,"
		"\"returnDistance\":true,\"filter\":{\"genre\":{\"$in\":[\"a\",\"b\"]}}}",
		"{\"indexArn\":\"arn:aws:s3vectors:us-east-1:000000000000:bucket/bkt/index/idx\","
		"\"topK\":1,\"queryVector\":{\"float32\":[0,1,0]}}",
		"{" IX ",\"topK\":0,\"queryVector\":{\"float32\":[1,0,0]}}",
		"{" IX ",\"topK\":101,\"queryVector\":{\"float32\":[1,0,0]}}",
		"{" IX ",\"queryVector\":{\"float32\":[1,0,0]}}",
		"{" IX ",\"topK\":1}",
		"{" IX ",\"topK\":1,\"queryVector\":{\"float32\":[0,0,0]}}",
		"{" IX ",\"topK\":1,\"queryVector\":{\"float32\":[1,0]}}",
		"{" IX ",\"topK\":1,\"queryVector\":{\"float32\":[1,0,0]},\"filter\":{\"text\":\"x\"}}",
		"{" IX ",\"topK\":1,\"queryVector\":{\"float32\":[1,0,0]},\"filter\":{\"a\":"
		"{\"$regex\":\"x\"}}}",
		"{" IX ",\"topK\":1,\"queryVector\":{\"float32\":[1,0,0]},\"returnDistance\":\"yes\"}",
		"{" B ",\"topK\":1,\"queryVector\":{\"float32\":[1,0,0]}}",
		"{\"indexArn\":\"bad\",\"topK\":1,\"queryVector\":{\"float32\":[1,0,0]}}",
		"{\"topK\":1,\"queryVector\":{\"float32\":[1,0,0]}}",
		"[1,2]",
		"{\"topK\":",
		"{" IX ",\"topK\":1,\"topK\":2,\"queryVector\":{\"float32\":[1,0,0]}}",
	};
	struct flat_index *ix;

	make_index("cosine");
	ix = flat_index_get(store, "bkt", "idx");
	cr_assert_not_null(ix);
	const struct flat_index_info *info = flat_index_info(ix);

	for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
		struct rec_resolve rr = { .in = { .dim = info->dim, .metric = info->metric,
						  .conf = info->conf, .conf_len = info->conf_len } };
		struct s3_resp lr, dr;
		struct s3_qspec q;
		int rc;

		s3_api_handle(api, "QueryVectors", bodies[i], strlen(bodies[i]), &lr);
		rc = s3_api_qspec_parse(bodies[i], strlen(bodies[i]), rec_resolver, &rr, &q, &dr);
		if (lr.status == 200) {
			cr_assert_eq(rc, 0, "%s: local 200, distributed %d %s", bodies[i], dr.status,
				     dr.body);
			cr_assert_eq(rr.calls, 1);
			cr_assert_str_eq(rr.b, "bkt");
			cr_assert_str_eq(rr.x, "idx");
			cr_assert_not_null(q.vec);
			cr_assert_geq(q.k, 1);
		} else {
			cr_assert_neq(rc, 0, "%s: local %d, distributed accepted it", bodies[i],
				      lr.status);
			cr_assert_eq(dr.status, lr.status, "%s", bodies[i]);
			cr_assert_str_eq(dr.errtype, lr.errtype, "%s", bodies[i]);
			cr_assert_str_eq(dr.body, lr.body, "%s", bodies[i]);
			cr_assert_null(q.vec);
		}
		s3_qspec_fini(&q);
		s3_resp_free(&dr);
		s3_resp_free(&lr);
	}
	/* The second body's flags and filter. */
	struct rec_resolve rr = { .in = { .dim = 3, .metric = DM_METRIC_COS } };
	struct s3_qspec q;
	struct s3_resp r;

	cr_assert_eq(s3_api_qspec_parse(bodies[1], strlen(bodies[1]), rec_resolver, &rr, &q, &r), 0);
	cr_assert_eq(q.k, 2);
	cr_assert(q.ret_meta && q.ret_dist);
	cr_assert_not_null(q.filter);
	s3_qspec_fini(&q);
	/* A resolver's error is the answer; it is not called when the request is bad first. */
	rr.fail = -ENOENT;
	cr_assert_eq(s3_api_qspec_parse(bodies[0], strlen(bodies[0]), rec_resolver, &rr, &q, &r),
		     -ENOENT);
	cr_assert_eq(r.status, 404);
	s3_resp_free(&r);
	rr.calls = 0;
	cr_assert_eq(s3_api_qspec_parse(bodies[3], strlen(bodies[3]), rec_resolver, &rr, &q, &r),
		     -EINVAL);
	cr_assert_eq(rr.calls, 0);
	s3_resp_free(&r);
	/* The payload limit. */
	cr_assert_eq(s3_api_qspec_parse(bodies[0], S3_MAX_PAYLOAD + 1, rec_resolver, &rr, &q, &r),
		     -EINVAL);
	cr_assert_eq(r.status, 400);
	s3_resp_free(&r);
	/* The fixed resolver (member side). */
	struct s3_qindex fixed = { .dim = 3, .metric = DM_METRIC_L2 };

	cr_assert_eq(s3_api_qspec_parse(bodies[7], strlen(bodies[7]), s3_api_qresolve_fixed, &fixed,
					&q, &r), 0, "euclidean takes a zero vector");
	s3_qspec_fini(&q);
	flat_index_put(ix);
}
