/* s3_api.c: S3 Vectors operations over a local flat store: request validation with the AWS
 * limits, name/ARN resolution, paging tokens, AWS error shapes (see s3_api.h). */
#include "s3_api.h"
#include "s3_filter.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <jansson.h>

#define JSON_OUT_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

struct s3_api {
	struct flat_store *store;
	char region[64];
	char account[32];
	uint64_t epoch;          /* row ids (and so vector tokens) are valid per process */
};

struct s3_query {
	struct flat_index *ix;
	float *vec;
	size_t k;
	struct s3_filter *filter;
	bool ret_meta, ret_dist;
};

/* ---------------------------------------------------------------- responses -------- */

void s3_resp_free(struct s3_resp *r)
{
	free(r->body);
	r->body = NULL;
	r->len = 0;
}

static void resp_json(struct s3_resp *r, int status, const char *errtype, json_t *o)
{
	r->status = status;
	r->errtype = errtype;
	r->body = o ? json_dumps(o, JSON_OUT_FLAGS) : NULL;
	if (o && !r->body) {
		r->status = 500;
		r->errtype = "InternalServerException";
		r->body = strdup("{\"__type\":\"InternalServerException\",\"message\":\"out of memory\"}");
	}
	r->len = r->body ? strlen(r->body) : 0;
	json_decref(o);
}

static void resp_errorv(struct s3_resp *r, int status, const char *type, const char *path,
			const char *fmt, va_list ap)
{
	char msg[512];
	json_t *o;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	o = json_pack("{s:s, s:s}", "__type", type, "message", msg);
	if (o && path)
		json_object_set_new(o, "fieldList",
				    json_pack("[{s:s, s:s}]", "path", path, "message", msg));
	resp_json(r, status, type, o);
}

void s3_resp_error(struct s3_resp *r, int status, const char *type, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	resp_errorv(r, status, type, NULL, fmt, ap);
	va_end(ap);
}

/* ValidationException with a fieldList naming the offending field. Returns -EINVAL. */
static int verr(struct s3_resp *r, const char *path, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int verr(struct s3_resp *r, const char *path, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	resp_errorv(r, 400, "ValidationException", path, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static void ok(struct s3_resp *r, json_t *o)
{
	resp_json(r, 200, NULL, o ? o : json_object());
}

/* Map an engine error to an AWS error. */
static void engine_err(struct s3_resp *r, int rc, const char *what)
{
	switch (rc) {
	case -ENOENT:
		s3_resp_error(r, 404, "NotFoundException", "The specified %s could not be found",
			      what);
		break;
	case -EEXIST:
		s3_resp_error(r, 409, "ConflictException", "The specified %s already exists", what);
		break;
	case -ENOTEMPTY:
		s3_resp_error(r, 409, "ConflictException", "The %s is not empty", what);
		break;
	default:
		s3_resp_error(r, 500, "InternalServerException", "internal error: %s",
			      strerror(-rc));
		break;
	}
}

/* ---------------------------------------------------------------- field access ------ */

/* Each getter: 0 absent, 1 present and valid, -EINVAL (response filled) if mistyped. */
static int get_str(struct s3_resp *r, json_t *o, const char *name, const char **out)
{
	json_t *v = json_object_get(o, name);
	char path[80];

	*out = NULL;
	if (!v || json_is_null(v))
		return 0;
	snprintf(path, sizeof(path), "/%s", name);
	if (!json_is_string(v))
		return verr(r, path, "%s must be a string", name);
	if (strlen(json_string_value(v)) != json_string_length(v))
		return verr(r, path, "%s must not contain NUL characters", name);
	*out = json_string_value(v);
	return 1;
}

static int get_int(struct s3_resp *r, json_t *o, const char *name, long long lo, long long hi,
		   long long *out)
{
	json_t *v = json_object_get(o, name);
	char path[80];

	if (!v || json_is_null(v))
		return 0;
	snprintf(path, sizeof(path), "/%s", name);
	if (!json_is_integer(v))
		return verr(r, path, "%s must be an integer", name);
	*out = json_integer_value(v);
	if (*out < lo || *out > hi)
		return verr(r, path, "%s must be between %lld and %lld", name, lo, hi);
	return 1;
}

static int get_bool(struct s3_resp *r, json_t *o, const char *name, bool *out)
{
	json_t *v = json_object_get(o, name);
	char path[80];

	if (!v || json_is_null(v))
		return 0;
	snprintf(path, sizeof(path), "/%s", name);
	if (!json_is_boolean(v))
		return verr(r, path, "%s must be a boolean", name);
	*out = json_is_true(v);
	return 1;
}

/* ---------------------------------------------------------------- names, ARNs ------ */

static bool valid_name(const char *s, bool dots)
{
	size_t n = strlen(s);

	if (n < 3 || n > 63)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');

		if ((i == 0 || i == n - 1) && !alnum)
			return false;
		if (!alnum && c != '-' && !(dots && c == '.'))
			return false;
	}
	return true;
}

static json_t *bucket_arn(struct s3_api *a, const char *b)
{
	return json_sprintf("arn:aws:s3vectors:%s:%s:bucket/%s", a->region, a->account, b);
}

static json_t *index_arn(struct s3_api *a, const char *b, const char *x)
{
	return json_sprintf("arn:aws:s3vectors:%s:%s:bucket/%s/index/%s", a->region, a->account,
			    b, x);
}

/* Split an ARN "arn:aws:s3vectors:<region>:<account>:bucket/<b>[/index/<x>]". */
static bool parse_arn(const char *arn, char *b, char *x, bool want_index)
{
	const char *p = arn;
	const char *slash;

	if (strncmp(p, "arn:aws:s3vectors:", 18))
		return false;
	p += 18;
	for (int i = 0; i < 2; i++) {            /* region, account */
		p = strchr(p, ':');
		if (!p)
			return false;
		p++;
	}
	if (strncmp(p, "bucket/", 7))
		return false;
	p += 7;
	slash = strchr(p, '/');
	if (!want_index) {
		if (slash || strlen(p) > FLAT_NAME_MAX)
			return false;
		strcpy(b, p);
		return valid_name(b, false);
	}
	if (!slash || (size_t)(slash - p) > FLAT_NAME_MAX || strncmp(slash, "/index/", 7))
		return false;
	memcpy(b, p, (size_t)(slash - p));
	b[slash - p] = 0;
	p = slash + 7;
	if (strlen(p) > FLAT_NAME_MAX)
		return false;
	strcpy(x, p);
	return valid_name(b, false) && valid_name(x, true);
}

/* Resolve the bucket of a request (vectorBucketName or vectorBucketArn). */
static int req_bucket(struct s3_resp *r, json_t *o, char *b)
{
	const char *name, *arn;
	int rc1 = get_str(r, o, "vectorBucketName", &name), rc2;

	if (rc1 < 0)
		return rc1;
	rc2 = get_str(r, o, "vectorBucketArn", &arn);
	if (rc2 < 0)
		return rc2;
	if (name && arn)
		return verr(r, "/vectorBucketName", "Specify either vectorBucketName or "
			    "vectorBucketArn, not both");
	if (arn) {
		if (!parse_arn(arn, b, NULL, false))
			return verr(r, "/vectorBucketArn", "Invalid vector bucket ARN");
		return 0;
	}
	if (!name)
		return verr(r, "/vectorBucketName", "vectorBucketName or vectorBucketArn is "
			    "required");
	if (!valid_name(name, false))
		return verr(r, "/vectorBucketName", "Invalid vector bucket name: 3-63 "
			    "characters, lower-case letters, digits and hyphens, starting and "
			    "ending with a letter or digit");
	strcpy(b, name);
	return 0;
}

/* Resolve the index of a request (indexArn, or a bucket + indexName). */
static int req_index(struct s3_resp *r, json_t *o, char *b, char *x)
{
	const char *arn, *name;
	int rc = get_str(r, o, "indexArn", &arn);

	if (rc < 0)
		return rc;
	if (arn) {
		if (json_object_get(o, "indexName") || json_object_get(o, "vectorBucketName") ||
		    json_object_get(o, "vectorBucketArn"))
			return verr(r, "/indexArn", "Specify either indexArn or a bucket and "
				    "indexName, not both");
		if (!parse_arn(arn, b, x, true))
			return verr(r, "/indexArn", "Invalid index ARN");
		return 0;
	}
	rc = req_bucket(r, o, b);
	if (rc)
		return rc;
	rc = get_str(r, o, "indexName", &name);
	if (rc < 0)
		return rc;
	if (!name)
		return verr(r, "/indexName", "indexName or indexArn is required");
	if (!valid_name(name, true))
		return verr(r, "/indexName", "Invalid index name: 3-63 characters, lower-case "
			    "letters, digits, hyphens and dots, starting and ending with a letter "
			    "or digit");
	strcpy(x, name);
	return 0;
}

/* Open the request's index: NULL with the error response filled. */
static struct flat_index *open_index(struct s3_api *a, struct s3_resp *r, json_t *o)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	struct flat_index *ix;

	if (req_index(r, o, b, x))
		return NULL;
	ix = flat_index_get(a->store, b, x);
	if (!ix) {
		if (flat_bucket_get(a->store, b, NULL))
			engine_err(r, -ENOENT, "vector bucket");
		else
			engine_err(r, -ENOENT, "index");
	}
	return ix;
}

/* The non-filterable keys from an index's stored configuration. */
struct nfkeys {
	json_t *conf;
	const char *k[S3_NONFILTER_MAX_KEYS];
	size_t n;
};

static void nf_parse(const void *conf, uint32_t conf_len, struct nfkeys *nf)
{
	json_t *arr, *e;
	size_t i;

	nf->n = 0;
	nf->conf = conf_len ? json_loadb(conf, conf_len, 0, NULL) : NULL;
	arr = json_object_get(nf->conf, "nonFilterableMetadataKeys");
	json_array_foreach(arr, i, e)
		if (json_is_string(e) && nf->n < S3_NONFILTER_MAX_KEYS)
			nf->k[nf->n++] = json_string_value(e);
}

static void nf_load(struct flat_index *ix, struct nfkeys *nf)
{
	const struct flat_index_info *in = flat_index_info(ix);

	nf_parse(in->conf, in->conf_len, nf);
}

/* ---------------------------------------------------------------- paging tokens ---- */

static char *token_make(const char *plain)
{
	size_t n = strlen(plain);
	char *t = malloc(2 * n + 1);

	if (!t)
		return NULL;
	for (size_t i = 0; i < n; i++)
		sprintf(t + 2 * i, "%02x", (unsigned char)plain[i]);
	return t;
}

/* Decode a hex token into out (cap bytes); false if malformed. */
static bool token_read(const char *t, char *out, size_t cap)
{
	size_t n = strlen(t);

	if (n % 2 || n / 2 >= cap || !n)
		return false;
	for (size_t i = 0; i < n / 2; i++) {
		unsigned v;

		if (sscanf(t + 2 * i, "%2x", &v) != 1 || !v)
			return false;
		out[i] = (char)v;
	}
	out[n / 2] = 0;
	return true;
}

static int get_token(struct s3_resp *r, json_t *o, char *plain, size_t cap, bool *have)
{
	const char *t;
	int rc = get_str(r, o, "nextToken", &t);

	*have = false;
	if (rc < 0)
		return rc;
	if (!t)
		return 0;
	if (!token_read(t, plain, cap))
		return verr(r, "/nextToken", "Invalid nextToken");
	*have = true;
	return 0;
}

/* ---------------------------------------------------------------- JSON body -------- */

static json_t *vector_data(const float *v, uint32_t dim)
{
	json_t *arr = json_array();

	for (uint32_t i = 0; i < dim && arr; i++)
		json_array_append_new(arr, json_real(v[i]));
	return json_pack("{s:o}", "float32", arr);
}

/* Read {"float32":[...]} of dim finite floats into out. */
static int read_vector(struct s3_resp *r, json_t *data, const char *path, uint32_t dim,
		       bool cosine, float *out)
{
	json_t *arr = json_object_get(data, "float32"), *e;
	char p[96];
	size_t i;
	bool nonzero = false;

	if (!json_is_object(data) || !json_is_array(arr))
		return verr(r, path, "vector data must be an object with a float32 array");
	snprintf(p, sizeof(p), "%s/float32", path);
	if (json_array_size(arr) != dim)
		return verr(r, p, "vector has %zu dimensions, the index has %u",
			    json_array_size(arr), dim);
	json_array_foreach(arr, i, e) {
		double d;

		if (!json_is_number(e))
			return verr(r, p, "vector elements must be numbers");
		d = json_number_value(e);
		out[i] = (float)d;
		if (!isfinite(d) || !isfinite(out[i]))
			return verr(r, p, "vector elements must be finite float32 values");
		nonzero |= out[i] != 0;
	}
	if (cosine && !nonzero)
		return verr(r, p, "an all-zero vector has no cosine distance");
	return 0;
}

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
		return verr(r, "/encryptionConfiguration", "encryptionConfiguration must be an "
			    "object");
	if (get_str(r, enc, "sseType", &sse) < 0)
		return -EINVAL;
	if (json_object_get(enc, "kmsKeyArn") || (sse && strcmp(sse, "AES256")))
		return verr(r, "/encryptionConfiguration/sseType", "only sseType AES256 is "
			    "accepted by this gateway (no KMS)");
	return 0;
}

static void op_create_bucket(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	const char *name;
	json_t *enc = json_object_get(o, "encryptionConfiguration");
	int rc = get_str(r, o, "vectorBucketName", &name);

	if (rc < 0)
		return;
	if (!name) {
		verr(r, "/vectorBucketName", "vectorBucketName is required");
		return;
	}
	if (!valid_name(name, false)) {
		verr(r, "/vectorBucketName", "Invalid vector bucket name: 3-63 characters, "
		     "lower-case letters, digits and hyphens, starting and ending with a letter "
		     "or digit");
		return;
	}
	if (check_encryption(r, enc))
		return;
	rc = flat_bucket_create(a->store, name, now_ms());
	if (rc) {
		engine_err(r, rc, "vector bucket");
		return;
	}
	ok(r, json_pack("{s:o}", "vectorBucketArn", bucket_arn(a, name)));
}

static void op_get_bucket(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1];
	struct flat_bucket_info bi;
	int rc;

	if (req_bucket(r, o, b))
		return;
	rc = flat_bucket_get(a->store, b, &bi);
	if (rc) {
		engine_err(r, rc, "vector bucket");
		return;
	}
	ok(r, json_pack("{s:{s:s, s:o, s:f}}", "vectorBucket", "vectorBucketName", b,
			"vectorBucketArn", bucket_arn(a, b), "creationTime",
			ms_to_s(bi.created_ms)));
}

static void op_delete_bucket(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1];
	int rc;

	if (req_bucket(r, o, b))
		return;
	rc = flat_bucket_delete(a->store, b);
	if (rc) {
		engine_err(r, rc, "vector bucket");
		return;
	}
	ok(r, NULL);
}

static void op_list_buckets(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	long long max = S3_LIST_CATALOG_DEFAULT;
	const char *prefix;
	char after[FLAT_NAME_MAX + 8];
	bool have, more;
	struct flat_bucket_info *bi;
	json_t *arr, *out;
	int n;

	if (get_int(r, o, "maxResults", 1, S3_LIST_CATALOG_MAX, &max) < 0 ||
	    get_str(r, o, "prefix", &prefix) < 0 ||
	    get_token(r, o, after, sizeof(after), &have) < 0)
		return;
	if (have && strncmp(after, "b:", 2)) {
		verr(r, "/nextToken", "Invalid nextToken");
		return;
	}
	bi = malloc((size_t)max * sizeof(*bi));
	if (!bi) {
		engine_err(r, -ENOMEM, "");
		return;
	}
	n = flat_bucket_list(a->store, prefix, have ? after + 2 : NULL, (size_t)max, bi, &more);
	if (n < 0) {
		free(bi);
		engine_err(r, n, "vector bucket");
		return;
	}
	arr = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(arr, json_pack("{s:s, s:o, s:f}", "vectorBucketName",
						     bi[i].name, "vectorBucketArn",
						     bucket_arn(a, bi[i].name), "creationTime",
						     ms_to_s(bi[i].created_ms)));
	out = json_pack("{s:o}", "vectorBuckets", arr);
	if (more && n) {
		char plain[FLAT_NAME_MAX + 8], *t;

		snprintf(plain, sizeof(plain), "b:%s", bi[n - 1].name);
		t = token_make(plain);
		json_object_set_new(out, "nextToken", json_string(t));
		free(t);
	}
	free(bi);
	ok(r, out);
}

/* ---------------------------------------------------------------- indexes ---------- */

static void op_create_index(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1];
	const char *name, *dtype, *metric;
	long long dim = 0;
	json_t *mc = json_object_get(o, "metadataConfiguration"), *conf = NULL, *keys, *e;
	enum dm_metric m;
	char *ctext = NULL;
	size_t i;
	int rc;

	if (req_bucket(r, o, b) || get_str(r, o, "indexName", &name) < 0 ||
	    get_str(r, o, "dataType", &dtype) < 0 || get_str(r, o, "distanceMetric", &metric) < 0)
		return;
	rc = get_int(r, o, "dimension", 1, FLAT_DIM_MAX, &dim);
	if (rc < 0)
		return;
	if (!name) {
		verr(r, "/indexName", "indexName is required");
		return;
	}
	if (!valid_name(name, true)) {
		verr(r, "/indexName", "Invalid index name: 3-63 characters, lower-case letters, "
		     "digits, hyphens and dots, starting and ending with a letter or digit");
		return;
	}
	if (check_encryption(r, json_object_get(o, "encryptionConfiguration")))
		return;
	if (!dtype || strcmp(dtype, "float32")) {
		verr(r, "/dataType", "dataType is required and must be float32");
		return;
	}
	if (!rc) {
		verr(r, "/dimension", "dimension is required (1 to %d)", FLAT_DIM_MAX);
		return;
	}
	if (metric && !strcmp(metric, "euclidean")) {
		m = DM_METRIC_L2;
	} else if (metric && !strcmp(metric, "cosine")) {
		m = DM_METRIC_COS;
	} else {
		verr(r, "/distanceMetric", "distanceMetric is required: euclidean or cosine");
		return;
	}
	if (mc && !json_is_null(mc)) {
		keys = json_object_get(mc, "nonFilterableMetadataKeys");
		if (!json_is_object(mc) || !json_is_array(keys)) {
			verr(r, "/metadataConfiguration/nonFilterableMetadataKeys",
			     "metadataConfiguration needs a nonFilterableMetadataKeys array");
			return;
		}
		if (json_array_size(keys) < 1 || json_array_size(keys) > S3_NONFILTER_MAX_KEYS) {
			verr(r, "/metadataConfiguration/nonFilterableMetadataKeys",
			     "between 1 and %d non-filterable metadata keys", S3_NONFILTER_MAX_KEYS);
			return;
		}
		json_array_foreach(keys, i, e) {
			size_t l = json_is_string(e) ? json_string_length(e) : 0;

			if (l < 1 || l > 63 || strlen(json_string_value(e)) != l) {
				verr(r, "/metadataConfiguration/nonFilterableMetadataKeys",
				     "non-filterable keys must be strings of 1 to 63 characters");
				return;
			}
			for (size_t j = 0; j < i; j++)
				if (json_equal(json_array_get(keys, j), e)) {
					verr(r, "/metadataConfiguration/nonFilterableMetadataKeys",
					     "duplicate non-filterable key '%s'",
					     json_string_value(e));
					return;
				}
		}
		conf = json_pack("{s:O}", "nonFilterableMetadataKeys", keys);
		ctext = conf ? json_dumps(conf, JSON_COMPACT) : NULL;
		json_decref(conf);
		if (!ctext) {
			engine_err(r, -ENOMEM, "");
			return;
		}
	}
	rc = flat_index_create(a->store, b, name, (uint32_t)dim, m, ctext,
			       ctext ? (uint32_t)strlen(ctext) : 0, now_ms());
	free(ctext);
	if (rc) {
		engine_err(r, rc, rc == -ENOENT ? "vector bucket" : "index");
		return;
	}
	ok(r, json_pack("{s:o}", "indexArn", index_arn(a, b, name)));
}

static void op_get_index(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	struct flat_index *ix = open_index(a, r, o);
	const struct flat_index_info *in;
	json_t *idx;
	struct nfkeys nf;

	if (!ix)
		return;
	in = flat_index_info(ix);
	idx = json_pack("{s:s, s:s, s:o, s:f, s:s, s:I, s:s}", "vectorBucketName", in->bucket,
			"indexName", in->name, "indexArn", index_arn(a, in->bucket, in->name),
			"creationTime", ms_to_s(in->created_ms), "dataType", "float32",
			"dimension", (json_int_t)in->dim, "distanceMetric",
			in->metric == DM_METRIC_COS ? "cosine" : "euclidean");
	nf_load(ix, &nf);
	if (nf.conf)
		json_object_set(idx, "metadataConfiguration", nf.conf);
	json_decref(nf.conf);
	flat_index_put(ix);
	ok(r, json_pack("{s:o}", "index", idx));
}

static void op_delete_index(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	int rc;

	if (req_index(r, o, b, x))
		return;
	rc = flat_index_delete(a->store, b, x);
	if (rc) {
		engine_err(r, rc, flat_bucket_get(a->store, b, NULL) ? "vector bucket" : "index");
		return;
	}
	ok(r, NULL);
}

static void op_list_indexes(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], after[FLAT_NAME_MAX + 8];
	long long max = S3_LIST_CATALOG_DEFAULT;
	const char *prefix;
	bool have, more;
	char (*names)[FLAT_NAME_MAX + 1];
	json_t *arr, *out;
	int n;

	if (req_bucket(r, o, b) || get_int(r, o, "maxResults", 1, S3_LIST_CATALOG_MAX, &max) < 0 ||
	    get_str(r, o, "prefix", &prefix) < 0 ||
	    get_token(r, o, after, sizeof(after), &have) < 0)
		return;
	if (have && strncmp(after, "i:", 2)) {
		verr(r, "/nextToken", "Invalid nextToken");
		return;
	}
	names = malloc((size_t)max * sizeof(*names));
	if (!names) {
		engine_err(r, -ENOMEM, "");
		return;
	}
	n = flat_index_list(a->store, b, prefix, have ? after + 2 : NULL, (size_t)max, names,
			    &more);
	if (n < 0) {
		free(names);
		engine_err(r, n, "vector bucket");
		return;
	}
	arr = json_array();
	for (int i = 0; i < n; i++) {
		struct flat_index *ix = flat_index_get(a->store, b, names[i]);
		double ct = ix ? ms_to_s(flat_index_info(ix)->created_ms) : 0;

		flat_index_put(ix);
		json_array_append_new(arr, json_pack("{s:s, s:s, s:o, s:f}", "vectorBucketName", b,
						     "indexName", names[i], "indexArn",
						     index_arn(a, b, names[i]), "creationTime", ct));
	}
	out = json_pack("{s:o}", "indexes", arr);
	if (more && n) {
		char plain[FLAT_NAME_MAX + 8], *t;

		snprintf(plain, sizeof(plain), "i:%s", names[n - 1]);
		t = token_make(plain);
		json_object_set_new(out, "nextToken", json_string(t));
		free(t);
	}
	free(names);
	ok(r, out);
}

/* ---------------------------------------------------------------- vectors ---------- */

static void op_put_vectors(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	struct flat_index *ix;
	json_t *vs = json_object_get(o, "vectors"), *v;
	const struct flat_index_info *in;
	struct flat_row_in *rows = NULL;
	float *data = NULL;
	char **mj = NULL;
	uint8_t **fm = NULL;
	struct nfkeys nf = { 0 };
	size_t n, i;
	int rc;

	if (!json_is_array(vs) || !json_array_size(vs) || json_array_size(vs) > S3_PUT_MAX) {
		verr(r, "/vectors", "vectors must be an array of 1 to %d vectors", S3_PUT_MAX);
		return;
	}
	ix = open_index(a, r, o);
	if (!ix)
		return;
	in = flat_index_info(ix);
	n = json_array_size(vs);
	rows = calloc(n, sizeof(*rows));
	data = malloc(n * in->dim * sizeof(float));
	mj = calloc(n, sizeof(*mj));
	fm = calloc(n, sizeof(*fm));
	if (!rows || !data || !mj || !fm) {
		engine_err(r, -ENOMEM, "");
		goto out;
	}
	nf_load(ix, &nf);
	json_array_foreach(vs, i, v) {
		char path[64], err[256];
		json_t *key = json_object_get(v, "key");
		size_t ml, fl;

		snprintf(path, sizeof(path), "/vectors/%zu", i);
		if (!json_is_object(v)) {
			verr(r, path, "each vector must be an object");
			goto out;
		}
		snprintf(path, sizeof(path), "/vectors/%zu/key", i);
		if (!json_is_string(key) || json_string_length(key) < 1 ||
		    json_string_length(key) > FLAT_KEY_MAX ||
		    strlen(json_string_value(key)) != json_string_length(key)) {
			verr(r, path, "key must be a string of 1 to %d characters", FLAT_KEY_MAX);
			goto out;
		}
		snprintf(path, sizeof(path), "/vectors/%zu/data", i);
		if (read_vector(r, json_object_get(v, "data"), path, in->dim,
				in->metric == DM_METRIC_COS, data + i * in->dim))
			goto out;
		json_t *meta = json_object_get(v, "metadata");

		if (json_is_null(meta))
			meta = NULL;
		rc = s3_meta_encode(meta, nf.k, nf.n, &mj[i], &ml, &fm[i], &fl, err, sizeof(err));
		if (rc) {
			snprintf(path, sizeof(path), "/vectors/%zu/metadata", i);
			if (rc == -EINVAL)
				verr(r, path, "%s", err);
			else
				engine_err(r, rc, "");
			goto out;
		}
		rows[i] = (struct flat_row_in){ json_string_value(key), data + i * in->dim, mj[i],
						(uint32_t)ml, fm[i], (uint32_t)fl };
	}
	rc = flat_put(ix, rows, n);
	if (rc)
		engine_err(r, rc, "index");
	else
		ok(r, NULL);
out:
	for (i = 0; mj && fm && i < n; i++) {
		free(mj[i]);
		free(fm[i]);
	}
	free(mj);
	free(fm);
	free(rows);
	free(data);
	json_decref(nf.conf);
	flat_index_put(ix);
}

/* Collects rows into a JSON array for Get/List. */
struct rowcol {
	json_t *arr;
	uint32_t dim;
	bool data, meta;
	size_t bytes, max_bytes;
};

static json_t *row_json(const struct flat_row *row, uint32_t dim, bool data, bool meta)
{
	json_t *o = json_pack("{s:s}", "key", row->key);

	if (data)
		json_object_set_new(o, "data", vector_data(row->vec, dim));
	if (meta) {
		json_t *m = row->meta_len ? json_loadb(row->meta, row->meta_len, 0, NULL) : NULL;

		json_object_set_new(o, "metadata", m ? m : json_object());
	}
	return o;
}

static int collect_row(void *ctx, const struct flat_row *row)
{
	struct rowcol *c = ctx;
	size_t est = strlen(row->key) + 16 + (c->data ? c->dim * 12u : 0) +
		     (c->meta ? row->meta_len : 0);

	/* ListVectors ends a page early at about 1 MB (always at least one row). */
	if (c->max_bytes && json_array_size(c->arr) && c->bytes + est > c->max_bytes)
		return -1;
	c->bytes += est;
	json_array_append_new(c->arr, row_json(row, c->dim, c->data, c->meta));
	return 0;
}

static int read_keys(struct s3_resp *r, json_t *o, size_t max, const char ***keys, size_t *n)
{
	json_t *ks = json_object_get(o, "keys"), *e;
	size_t i;

	if (!json_is_array(ks) || !json_array_size(ks) || json_array_size(ks) > max)
		return verr(r, "/keys", "keys must be an array of 1 to %zu keys", max);
	*n = json_array_size(ks);
	*keys = calloc(*n, sizeof(**keys));
	if (!*keys) {
		engine_err(r, -ENOMEM, "");
		return -ENOMEM;
	}
	json_array_foreach(ks, i, e) {
		if (!json_is_string(e) || json_string_length(e) < 1 ||
		    json_string_length(e) > FLAT_KEY_MAX ||
		    strlen(json_string_value(e)) != json_string_length(e)) {
			char path[48];

			snprintf(path, sizeof(path), "/keys/%zu", i);
			free(*keys);
			*keys = NULL;
			return verr(r, path, "keys must be strings of 1 to %d characters",
				    FLAT_KEY_MAX);
		}
		(*keys)[i] = json_string_value(e);
	}
	return 0;
}

static void op_get_vectors(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	const char **keys;
	size_t n;
	struct rowcol c = { 0 };
	struct flat_index *ix;

	if (read_keys(r, o, S3_GET_MAX, &keys, &n))
		return;
	if (get_bool(r, o, "returnData", &c.data) < 0 ||
	    get_bool(r, o, "returnMetadata", &c.meta) < 0) {
		free(keys);
		return;
	}
	ix = open_index(a, r, o);
	if (!ix) {
		free(keys);
		return;
	}
	c.dim = flat_index_info(ix)->dim;
	c.arr = json_array();
	flat_get(ix, keys, n, collect_row, &c);
	flat_index_put(ix);
	free(keys);
	ok(r, json_pack("{s:o}", "vectors", c.arr));
}

static void op_list_vectors(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	long long max = S3_LIST_VECTORS_DEFAULT, segc = 0, segi = -1;
	struct rowcol c = { .max_bytes = S3_LIST_PAGE_BYTES };
	char plain[128];
	bool have;
	uint64_t start = 0, next;
	struct flat_index *ix;
	json_t *out;
	int hc, hi;

	if (get_int(r, o, "maxResults", 1, S3_LIST_VECTORS_MAX, &max) < 0 ||
	    (hc = get_int(r, o, "segmentCount", 1, S3_LIST_SEGMENTS_MAX, &segc)) < 0 ||
	    (hi = get_int(r, o, "segmentIndex", 0, S3_LIST_SEGMENTS_MAX - 1, &segi)) < 0 ||
	    get_bool(r, o, "returnData", &c.data) < 0 ||
	    get_bool(r, o, "returnMetadata", &c.meta) < 0 ||
	    get_token(r, o, plain, sizeof(plain), &have) < 0)
		return;
	if (hc != hi) {
		verr(r, hc ? "/segmentIndex" : "/segmentCount",
		     "segmentCount and segmentIndex must be given together");
		return;
	}
	if (hc && segi >= segc) {
		verr(r, "/segmentIndex", "segmentIndex must be less than segmentCount");
		return;
	}
	ix = open_index(a, r, o);
	if (!ix)
		return;
	if (have) {
		uint64_t ep;
		long long tc, ti;
		int end = 0;

		if (sscanf(plain, "v:%" SCNx64 ":%lld:%lld:%" SCNu64 "%n", &ep, &tc, &ti, &start,
			   &end) != 4 || plain[end] || ep != a->epoch || tc != segc ||
		    ti != (hc ? segi : -1)) {
			flat_index_put(ix);
			verr(r, "/nextToken", "Invalid nextToken (it must come from the previous "
			     "page of the same listing, since the gateway last started)");
			return;
		}
	}
	c.dim = flat_index_info(ix)->dim;
	c.arr = json_array();
	flat_list(ix, start, hc ? (uint32_t)segc : 0, hc ? (uint32_t)segi : 0, (size_t)max,
		  collect_row, &c, &next);
	flat_index_put(ix);
	out = json_pack("{s:o}", "vectors", c.arr);
	if (next != UINT64_MAX) {
		char *t;

		snprintf(plain, sizeof(plain), "v:%" PRIx64 ":%lld:%lld:%" PRIu64, a->epoch, segc,
			 hc ? segi : -1, next);
		t = token_make(plain);
		json_object_set_new(out, "nextToken", json_string(t));
		free(t);
	}
	ok(r, out);
}

static void op_delete_vectors(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	const char **keys;
	size_t n;
	struct flat_index *ix;
	int rc;

	if (read_keys(r, o, S3_DELETE_MAX, &keys, &n))
		return;
	ix = open_index(a, r, o);
	if (!ix) {
		free(keys);
		return;
	}
	rc = flat_delete(ix, keys, n);
	flat_index_put(ix);
	free(keys);
	if (rc)
		engine_err(r, rc, "index");
	else
		ok(r, NULL);
}

/* ---------------------------------------------------------------- queries ---------- */

void s3_query_free(struct s3_query *q)
{
	if (!q)
		return;
	flat_index_put(q->ix);
	free(q->vec);
	s3_filter_free(q->filter);
	free(q);
}

static json_t *parse_body(const char *body, size_t len, struct s3_resp *r)
{
	json_error_t je;
	json_t *o;

	if (!len)
		return json_object();
	o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!o) {
		verr(r, "/", "Malformed JSON request body: %s (at byte %d)", je.text, je.position);
		return NULL;
	}
	if (!json_is_object(o)) {
		json_decref(o);
		verr(r, "/", "The request body must be a JSON object");
		return NULL;
	}
	return o;
}

void s3_qspec_fini(struct s3_qspec *q)
{
	free(q->vec);
	s3_filter_free(q->filter);
	memset(q, 0, sizeof(*q));
}

/* The one QueryVectors parser (the local and the distributed path): topK, the flags, the
 * index named (resolve gives its description), the vector and the filter against it. */
static int qv_parse(json_t *o, s3_qresolve_fn resolve, void *ctx, struct s3_qspec *q,
		    struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	struct s3_qindex in;
	long long k = 0;
	json_t *f;
	int rc;

	memset(q, 0, sizeof(*q));
	rc = get_int(r, o, "topK", 1, S3_TOPK_MAX, &k);
	if (rc < 0)
		goto err;
	if (!rc) {
		rc = verr(r, "/topK", "topK is required (1 to %d)", S3_TOPK_MAX);
		goto err;
	}
	q->k = (size_t)k;
	if (get_bool(r, o, "returnMetadata", &q->ret_meta) < 0 ||
	    get_bool(r, o, "returnDistance", &q->ret_dist) < 0) {
		rc = -EINVAL;
		goto err;
	}
	if (!json_object_get(o, "queryVector")) {
		rc = verr(r, "/queryVector", "queryVector is required");
		goto err;
	}
	if (req_index(r, o, b, x)) {
		rc = -EINVAL;
		goto err;
	}
	rc = resolve(ctx, b, x, &in, r);
	if (rc)
		goto err;
	q->vec = malloc((in.dim ? in.dim : 1) * sizeof(float));
	if (!q->vec) {
		engine_err(r, -ENOMEM, "");
		rc = -ENOMEM;
		goto err;
	}
	rc = read_vector(r, json_object_get(o, "queryVector"), "/queryVector", in.dim,
			 in.metric == DM_METRIC_COS, q->vec);
	if (rc)
		goto err;
	f = json_object_get(o, "filter");
	if (f && !json_is_null(f)) {
		struct nfkeys nf;
		char err[256];

		nf_parse(in.conf, in.conf_len, &nf);
		q->filter = s3_filter_parse(f, nf.k, nf.n, err, sizeof(err));
		json_decref(nf.conf);
		if (!q->filter) {
			rc = errno == ENOMEM ? -ENOMEM : verr(r, "/filter", "Invalid filter: %s",
							      err);
			if (rc == -ENOMEM)
				engine_err(r, rc, "");
			goto err;
		}
	}
	return 0;
err:
	s3_qspec_fini(q);
	return rc < 0 ? rc : -EINVAL;
}

int s3_api_qspec_parse(const char *body, size_t len, s3_qresolve_fn resolve, void *ctx,
		       struct s3_qspec *q, struct s3_resp *r)
{
	json_t *o;
	int rc;

	memset(q, 0, sizeof(*q));
	memset(r, 0, sizeof(*r));
	if (len > S3_MAX_PAYLOAD)
		return verr(r, "/", "The request payload exceeds %u bytes", S3_MAX_PAYLOAD);
	o = parse_body(body, len, r);
	if (!o)
		return -EINVAL;
	rc = qv_parse(o, resolve, ctx, q, r);
	json_decref(o);
	return rc;
}

int s3_api_qresolve_fixed(void *ctx, const char *bucket, const char *index,
			  struct s3_qindex *out, struct s3_resp *r)
{
	(void)bucket;
	(void)index;
	(void)r;
	*out = *(const struct s3_qindex *)ctx;
	return 0;
}

/* The local resolver: open the index in this process's store (kept in the query). */
struct local_q {
	struct s3_api *a;
	struct flat_index *ix;
};

static int resolve_local(void *ctx, const char *b, const char *x, struct s3_qindex *out,
			 struct s3_resp *r)
{
	struct local_q *lq = ctx;
	const struct flat_index_info *in;

	lq->ix = flat_index_get(lq->a->store, b, x);
	if (!lq->ix) {
		engine_err(r, -ENOENT, flat_bucket_get(lq->a->store, b, NULL) ? "vector bucket" :
			   "index");
		return -ENOENT;
	}
	in = flat_index_info(lq->ix);
	*out = (struct s3_qindex){ .dim = in->dim, .metric = in->metric, .conf = in->conf,
				   .conf_len = in->conf_len };
	return 0;
}

/* A local query from a parsed body: the one parser with the local resolver. */
static int prepare(struct s3_api *a, json_t *o, struct s3_query **q, struct s3_resp *r)
{
	struct local_q lq = { .a = a };
	struct s3_qspec spec;
	int rc;

	*q = NULL;
	rc = qv_parse(o, resolve_local, &lq, &spec, r);
	if (rc) {
		flat_index_put(lq.ix);
		return rc;
	}
	*q = calloc(1, sizeof(**q));
	if (!*q) {
		flat_index_put(lq.ix);
		s3_qspec_fini(&spec);
		engine_err(r, -ENOMEM, "");
		return -ENOMEM;
	}
	**q = (struct s3_query){ .ix = lq.ix, .vec = spec.vec, .k = spec.k,
				 .filter = spec.filter, .ret_meta = spec.ret_meta,
				 .ret_dist = spec.ret_dist };
	return 0;
}

int s3_api_query_prepare(struct s3_api *a, const char *body, size_t len, struct s3_query **q,
			 struct s3_resp *r)
{
	json_t *o = parse_body(body, len, r);
	int rc;

	*q = NULL;
	if (!o)
		return -EINVAL;
	rc = prepare(a, o, q, r);
	json_decref(o);
	return rc;
}

static bool match_cb(void *ctx, const void *fmeta, uint32_t len)
{
	return s3_filter_match(ctx, fmeta, len);
}

struct qres {
	json_t *arr;
	const struct dm_hit *hits;
	size_t n, at;
	bool meta, dist, l2;
};

static int collect_hit(void *ctx, const struct flat_row *row)
{
	struct qres *q = ctx;
	json_t *o = json_pack("{s:s}", "key", row->key);

	/* flat_get_ids walks ids in order, skipping rows deleted since the scan. */
	while (q->at < q->n && q->hits[q->at].id != row->id)
		q->at++;
	if (q->dist && q->at < q->n) {
		double d = q->hits[q->at].dist;

		json_object_set_new(o, "distance", json_real(q->l2 ? sqrt(d) : d));
	}
	if (q->meta) {
		json_t *m = row->meta_len ? json_loadb(row->meta, row->meta_len, 0, NULL) : NULL;

		json_object_set_new(o, "metadata", m ? m : json_object());
	}
	json_array_append_new(q->arr, o);
	return 0;
}

void s3_api_query_run(struct s3_api *a, struct s3_query **qs, size_t n, struct s3_resp *rs)
{
	bool *done = calloc(n, sizeof(bool));

	(void)a;
	if (!done) {
		for (size_t i = 0; i < n; i++) {
			engine_err(&rs[i], -ENOMEM, "");
			s3_query_free(qs[i]);
		}
		return;
	}
	/* Group queries by index: one scan (one sgemm per fragment) per group. */
	for (size_t i = 0; i < n; i++) {
		struct flat_index *ix = qs[i]->ix;
		const struct flat_index_info *in = flat_index_info(ix);
		size_t g = 0, kmax = 0, *gi, *nout;
		float *qv;
		void **mctx;
		struct dm_hit *hits;
		int rc;

		if (done[i])
			continue;
		gi = malloc(n * sizeof(size_t));
		for (size_t j = i; gi && j < n; j++)
			if (!done[j] && qs[j]->ix == ix) {
				gi[g++] = j;
				kmax = DM_MAX(kmax, qs[j]->k);
			}
		qv = gi ? malloc(g * in->dim * sizeof(float)) : NULL;
		mctx = calloc(g ? g : 1, sizeof(void *));
		nout = calloc(g ? g : 1, sizeof(size_t));
		hits = malloc((g ? g : 1) * kmax * sizeof(*hits));
		if (!gi || !qv || !mctx || !nout || !hits) {
			rc = -ENOMEM;
		} else {
			for (size_t t = 0; t < g; t++) {
				memcpy(qv + t * in->dim, qs[gi[t]]->vec, in->dim * sizeof(float));
				mctx[t] = qs[gi[t]]->filter;
			}
			struct flat_scan sc = { .q = qv, .nq = g, .k = kmax, .match = match_cb,
						.match_ctx = mctx };

			rc = flat_search(ix, &sc, hits, nout);
		}
		for (size_t t = 0; gi && t < g; t++) {
			struct s3_query *q = qs[gi[t]];
			struct s3_resp *r = &rs[gi[t]];

			done[gi[t]] = true;
			if (rc) {
				engine_err(r, rc, "index");
				continue;
			}
			size_t nh = DM_MIN(nout[t], q->k);
			uint64_t *ids = malloc((nh ? nh : 1) * sizeof(uint64_t));
			struct qres qr = { .arr = json_array(), .hits = hits + t * kmax, .n = nh,
					   .meta = q->ret_meta, .dist = q->ret_dist,
					   .l2 = in->metric == DM_METRIC_L2 };

			if (!ids) {
				json_decref(qr.arr);
				engine_err(r, -ENOMEM, "");
				continue;
			}
			for (size_t h = 0; h < nh; h++)
				ids[h] = qr.hits[h].id;
			flat_get_ids(ix, ids, nh, collect_hit, &qr);
			free(ids);
			ok(r, json_pack("{s:o, s:s}", "vectors", qr.arr, "distanceMetric",
					in->metric == DM_METRIC_COS ? "cosine" : "euclidean"));
		}
		if (!gi) {
			done[i] = true;
			engine_err(&rs[i], -ENOMEM, "");
		}
		free(gi);
		free(qv);
		free(mctx);
		free(nout);
		free(hits);
	}
	for (size_t i = 0; i < n; i++)
		s3_query_free(qs[i]);
	free(done);
}

static void op_query_vectors(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	struct s3_query *q;

	if (prepare(a, o, &q, r))
		return;
	s3_api_query_run(a, &q, 1, r);
}

/* ---------------------------------------------------------------- dispatch --------- */

static const struct {
	const char *name;
	void (*fn)(struct s3_api *a, json_t *o, struct s3_resp *r);
} ops[] = {
	{ "CreateVectorBucket", op_create_bucket },
	{ "GetVectorBucket", op_get_bucket },
	{ "ListVectorBuckets", op_list_buckets },
	{ "DeleteVectorBucket", op_delete_bucket },
	{ "CreateIndex", op_create_index },
	{ "GetIndex", op_get_index },
	{ "ListIndexes", op_list_indexes },
	{ "DeleteIndex", op_delete_index },
	{ "PutVectors", op_put_vectors },
	{ "GetVectors", op_get_vectors },
	{ "ListVectors", op_list_vectors },
	{ "DeleteVectors", op_delete_vectors },
	{ "QueryVectors", op_query_vectors },
};

bool s3_api_known_op(const char *op)
{
	for (size_t i = 0; i < DM_ARRAY_SIZE(ops); i++)
		if (!strcmp(ops[i].name, op))
			return true;
	return false;
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
			verr(r, "/", "The request payload exceeds %u bytes", S3_MAX_PAYLOAD);
			return;
		}
		o = parse_body(body, len, r);
		if (!o)
			return;
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

void s3_api_free(struct s3_api *a)
{
	free(a);
}

/* ---------------------------------------------------------------- remote engines --- */

char *s3_api_token(const char *plain)
{
	return token_make(plain);
}

int s3_api_req_bucket(const char *body, size_t len, char *bucket)
{
	json_t *o = len ? json_loadb(body, len, 0, NULL) : NULL;
	const char *n = NULL, *arn = NULL;
	char x[FLAT_NAME_MAX + 1];
	bool ok = false;

	bucket[0] = 0;
	if (!json_is_object(o))
		goto out;
	n = json_string_value(json_object_get(o, "vectorBucketName"));
	if (n && strlen(n) <= FLAT_NAME_MAX) {
		strcpy(bucket, n);
		ok = true;
		goto out;
	}
	arn = json_string_value(json_object_get(o, "vectorBucketArn"));
	if (arn && parse_arn(arn, bucket, NULL, false)) {
		ok = true;
		goto out;
	}
	arn = json_string_value(json_object_get(o, "indexArn"));
	if (arn && parse_arn(arn, bucket, x, true))
		ok = true;
out:
	json_decref(o);
	if (!ok)
		bucket[0] = 0;
	return ok ? 0 : -ENOENT;
}

void s3_api_not_found(struct s3_resp *r, bool bucket)
{
	engine_err(r, -ENOENT, bucket ? "vector bucket" : "index");
}
