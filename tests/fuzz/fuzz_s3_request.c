/* fuzz_s3_request.c: libFuzzer target for the S3 gateway's parsers: the filter language
 * (parse + evaluate), metadata validation/encoding (+ decode of what it encoded), request
 * validation of every operation (s3_api_handle over a scratch store), the distributed
 * QueryVectors parser against the local one (same answers), and the SigV4
 * canonical request built from a hostile path/query. The first input byte picks the
 * operation; the rest is the JSON body. */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "s3_api.h"
#include "s3_filter.h"
#include "s3_sigv4.h"

static char dir[64];
static struct flat_store *store;
static struct s3_api *api;
static unsigned long runs;

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st; (void)flag; (void)f;
	return remove(p);
}

/* libFuzzer exits without tearing down: remove the scratch directory then. */
static void cleanup(void)
{
	if (!api)
		return;
	s3_api_free(api);
	flat_abandon(store);
	nftw(dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
	api = NULL;
}

static void scratch_store(void)
{
	static const char *setup[][2] = {
		{ "CreateVectorBucket", "{\"vectorBucketName\":\"fuzz\"}" },
		{ "CreateIndex", "{\"vectorBucketName\":\"fuzz\",\"indexName\":\"idx\","
		  "\"dataType\":\"float32\",\"dimension\":2,\"distanceMetric\":\"cosine\","
		  "\"metadataConfiguration\":{\"nonFilterableMetadataKeys\":[\"text\"]}}" },
		{ "PutVectors", "{\"vectorBucketName\":\"fuzz\",\"indexName\":\"idx\",\"vectors\":["
		  "{\"key\":\"a\",\"data\":{\"float32\":[1,0]},\"metadata\":{\"g\":\"x\",\"n\":1,"
		  "\"l\":[\"p\",2,true],\"text\":\"t\"}},{\"key\":\"b\",\"data\":{\"float32\":[0,1]}}]}" },
	};
	struct flat_opts o = { .frag_rows = 4, .no_sync = true };

	if (api) {
		s3_api_free(api);
		flat_abandon(store);
		nftw(dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
	}
	snprintf(dir, sizeof(dir), "/tmp/dmann-fuzz-s3-XXXXXX");
	if (!mkdtemp(dir))
		abort();
	store = flat_open(dir, &o);
	api = s3_api_new(store, NULL, NULL);
	if (!store || !api)
		abort();
	for (size_t i = 0; i < sizeof(setup) / sizeof(setup[0]); i++) {
		struct s3_resp r;

		s3_api_handle(api, setup[i][0], setup[i][1], strlen(setup[i][1]), &r);
		if (r.status != 200)
			abort();
		s3_resp_free(&r);
	}
}

static void fuzz_json(const char *p, size_t n)
{
	static const char *nf[] = { "text" };
	json_t *j = json_loadb(p, n, JSON_REJECT_DUPLICATES, NULL);
	struct s3_filter *f;
	char err[256], *js;
	uint8_t *fm;
	size_t jl, fl;

	if (!j)
		return;
	f = s3_filter_parse(j, nf, 1, err, sizeof(err));
	if (s3_meta_encode(j, nf, 1, &js, &jl, &fm, &fl, err, sizeof(err)) == 0) {
		json_t *back = s3_fmeta_to_json(fm, fl);

		if (fl && !back)
			abort();           /* what we encode must decode */
		if (f)
			(void)s3_filter_match(f, fm, fl);
		json_decref(back);
		free(js);
		free(fm);
	}
	if (f) {
		(void)s3_filter_match(f, "\x01\x00g\x01\x01\x00\x00\x00x", 10);
		(void)s3_filter_match(f, p, n);    /* arbitrary bytes as an encoding */
		s3_filter_free(f);
	}
	json_decref(j);
}

/* The distributed path's QueryVectors parser (s3_api_qspec_parse, a resolver describing
 * the scratch index as the compute nodes do) must agree with the local path: the same
 * error, or both accept. Compared only when the request named the scratch index or failed
 * before naming one (another index may exist with another dimension). */
struct fz_resolve {
	struct s3_qindex in;
	bool called, same;
};

static int fz_resolver(void *ctx, const char *b, const char *x, struct s3_qindex *out,
		       struct s3_resp *r)
{
	struct fz_resolve *fr = ctx;

	(void)r;
	fr->called = true;
	fr->same = !strcmp(b, "fuzz") && !strcmp(x, "idx");
	*out = fr->in;
	return 0;
}

static void fuzz_qspec(const char *p, size_t n, const struct s3_resp *local)
{
	struct flat_index *ix = flat_index_get(store, "fuzz", "idx");
	struct s3_qspec q;
	struct s3_resp r;
	int rc;

	if (!ix)
		return;                  /* deleted by an earlier input */
	const struct flat_index_info *in = flat_index_info(ix);
	struct fz_resolve fr = { .in = { .dim = in->dim, .metric = in->metric, .conf = in->conf,
					 .conf_len = in->conf_len } };

	rc = s3_api_qspec_parse(p, n, fz_resolver, &fr, &q, &r);
	if (!fr.called || fr.same) {
		if ((rc == 0) != (local->status == 200))
			abort();
		if (rc && (r.status != local->status || strcmp(r.body, local->body)))
			abort();
	}
	if (rc == 0 && (!q.vec || !q.k || q.k > S3_TOPK_MAX))
		abort();
	s3_qspec_fini(&q);
	s3_resp_free(&r);
	flat_index_put(ix);
}

static const char *hdr(void *ctx, const char *name)
{
	(void)name;
	return ctx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *ops[] = {
		"QueryVectors", "PutVectors", "GetVectors", "ListVectors", "DeleteVectors",
		"CreateIndex", "GetIndex", "ListIndexes", "CreateVectorBucket", "GetVectorBucket",
		"ListVectorBuckets", "DeleteIndex", "DeleteVectorBucket",
	};
	struct s3_resp r;
	char *s;

	if (!size)
		return 0;
	if (!api) {
		scratch_store();
		atexit(cleanup);
	} else if (++runs % 5000 == 0) {
		scratch_store();
	}
	fuzz_json((const char *)data + 1, size - 1);
	const char *op = ops[data[0] % (sizeof(ops) / sizeof(ops[0]))];

	s3_api_handle(api, op, (const char *)data + 1, size - 1, &r);
	if (r.status < 200 || !r.body)
		abort();
	if (!strcmp(op, "QueryVectors"))
		fuzz_qspec((const char *)data + 1, size - 1, &r);
	s3_resp_free(&r);

	/* SigV4 canonical request from a hostile path?query. */
	s = strndup((const char *)data, size);
	if (s) {
		char *q = strchr(s, '?'), *creq;

		if (q)
			*q++ = 0;
		struct s3_sigv4_req sr = { "POST", s, q ? q : "", hdr, "v", "", 0 };

		creq = s3_sigv4_canonical_request(&sr, "host;x-amz-date", "h");
		free(creq);
		free(s);
	}
	return 0;
}
