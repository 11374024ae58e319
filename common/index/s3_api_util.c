/* s3_api_util.c: helpers of the S3 operation layer: JSON responses and AWS error shapes,
 * typed field access with validation errors naming the field, bucket/index names and ARNs,
 * paging tokens, vectors in and out of JSON bodies. */
#include "s3_api_int.h"
#include "util/dm_hash.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

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

int s3a_verr(struct s3_resp *r, const char *path, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	resp_errorv(r, 400, "ValidationException", path, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

void s3a_ok(struct s3_resp *r, json_t *o)
{
	resp_json(r, 200, NULL, o ? o : json_object());
}

/* Map an engine error to an AWS error. */
void s3a_engine_err(struct s3_resp *r, int rc, const char *what)
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
	case -ENOSPC:
		s3_resp_error(r, 402, "ServiceQuotaExceededException",
			      "The memory nodes holding this %s are full ([mn] flat_max_mb); "
			      "delete an index or add memory", what);
		break;
	default:
		s3_resp_error(r, 500, "InternalServerException", "internal error: %s",
			      strerror(-rc));
		break;
	}
}

/* ---------------------------------------------------------------- field access ------ */

/* Each getter: 0 absent, 1 present and valid, -EINVAL (response filled) if mistyped. */
int s3a_get_str(struct s3_resp *r, json_t *o, const char *name, const char **out)
{
	json_t *v = json_object_get(o, name);
	char path[80];

	*out = NULL;
	if (!v || json_is_null(v))
		return 0;
	snprintf(path, sizeof(path), "/%s", name);
	if (!json_is_string(v))
		return s3a_verr(r, path, "%s must be a string", name);
	if (strlen(json_string_value(v)) != json_string_length(v))
		return s3a_verr(r, path, "%s must not contain NUL characters", name);
	*out = json_string_value(v);
	return 1;
}

int s3a_get_int(struct s3_resp *r, json_t *o, const char *name, long long lo, long long hi,
		   long long *out)
{
	json_t *v = json_object_get(o, name);
	char path[80];

	if (!v || json_is_null(v))
		return 0;
	snprintf(path, sizeof(path), "/%s", name);
	if (!json_is_integer(v))
		return s3a_verr(r, path, "%s must be an integer", name);
	*out = json_integer_value(v);
	if (*out < lo || *out > hi)
		return s3a_verr(r, path, "%s must be between %lld and %lld", name, lo, hi);
	return 1;
}

int s3a_get_bool(struct s3_resp *r, json_t *o, const char *name, bool *out)
{
	json_t *v = json_object_get(o, name);
	char path[80];

	if (!v || json_is_null(v))
		return 0;
	snprintf(path, sizeof(path), "/%s", name);
	if (!json_is_boolean(v))
		return s3a_verr(r, path, "%s must be a boolean", name);
	*out = json_is_true(v);
	return 1;
}

/* ---------------------------------------------------------------- names, ARNs ------ */

bool s3a_valid_name(const char *s, bool dots)
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

uint32_t s3a_bucket_shards(struct s3_api *a, const char *b)
{
	char *txt = NULL;
	uint32_t len;
	long v = 1;

	if (!flat_attr_get(a->store, b, NULL, FLAT_ATTR_SHARDS, &txt, &len) && txt)
		v = strtol(txt, NULL, 10);
	free(txt);
	return v >= 1 && v <= DM_S3_SHARDS_MAX ? (uint32_t)v : 1;
}

bool s3a_check_only(const struct s3_api *a, json_t *o)
{
	return a->shard_names && json_is_true(json_object_get(o, "_dmannCheck"));
}

bool s3a_valid_bucket(const struct s3_api *a, const char *name)
{
	return s3a_valid_name(name, false) ||
	       (a && a->shard_names && s3_shard_parse(name, NULL, NULL));
}

bool s3_shard_parse(const char *name, char *base, uint32_t *shard)
{
	const char *h = strrchr(name, '#');
	char b[FLAT_NAME_MAX + 1];
	unsigned long s = 0;
	size_t bl, dl;

	if (!h)
		return false;
	bl = (size_t)(h - name);
	dl = strlen(h + 1);
	if (bl >= sizeof(b) || dl < 1 || dl > 3 || h[1] == '0')
		return false;
	for (size_t i = 1; i <= dl; i++) {
		if (h[i] < '0' || h[i] > '9')
			return false;
		s = s * 10 + (unsigned long)(h[i] - '0');
	}
	if (s < 1 || s >= DM_S3_SHARDS_MAX)
		return false;
	memcpy(b, name, bl);
	b[bl] = 0;
	if (!s3a_valid_name(b, false))
		return false;
	if (base)
		memcpy(base, b, bl + 1);
	if (shard)
		*shard = (uint32_t)s;
	return true;
}

int s3_shard_name(const char *bucket, uint32_t shard, char *out)
{
	if (!bucket || !s3a_valid_name(bucket, false) || shard >= DM_S3_SHARDS_MAX)
		return -EINVAL;
	if (!shard)
		snprintf(out, FLAT_NAME_MAX + 1, "%s", bucket);
	else
		snprintf(out, FLAT_NAME_MAX + 1, "%s#%u", bucket, shard);
	return 0;
}

bool s3_is_shard_name(const char *name)
{
	return strchr(name, '#') != NULL;
}

uint32_t s3_key_shard(const char *key, size_t len, uint32_t nshards)
{
	/* Salted so that the shard is independent of other hashes of the key (the indexer's
	 * rendezvous of keys over compute nodes hashes them too). */
	static const char salt[] = "dmann-s3-shard";
	uint64_t h;

	if (nshards <= 1)
		return 0;
	h = dm_fnv1a64(DM_FNV64_INIT, salt, sizeof(salt) - 1);
	h = dm_mix64(dm_fnv1a64(h, key, len));
	return (uint32_t)(h % nshards);
}

json_t *s3a_bucket_arn(struct s3_api *a, const char *b)
{
	return json_sprintf("arn:aws:s3vectors:%s:%s:bucket/%s", a->region, a->account, b);
}

json_t *s3a_index_arn(struct s3_api *a, const char *b, const char *x)
{
	return json_sprintf("arn:aws:s3vectors:%s:%s:bucket/%s/index/%s", a->region, a->account,
			    b, x);
}

/* Split an ARN "arn:aws:s3vectors:<region>:<account>:bucket/<b>[/index/<x>]". */
bool s3a_parse_arn(const char *arn, char *b, char *x, bool want_index)
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
		return s3a_valid_name(b, false);
	}
	if (!slash || (size_t)(slash - p) > FLAT_NAME_MAX || strncmp(slash, "/index/", 7))
		return false;
	memcpy(b, p, (size_t)(slash - p));
	b[slash - p] = 0;
	p = slash + 7;
	if (strlen(p) > FLAT_NAME_MAX)
		return false;
	strcpy(x, p);
	return s3a_valid_name(b, false) && s3a_valid_name(x, true);
}

/* Resolve the bucket of a request (vectorBucketName or vectorBucketArn). */
int s3a_req_bucket(const struct s3_api *a, struct s3_resp *r, json_t *o, char *b)
{
	const char *name, *arn;
	int rc1 = s3a_get_str(r, o, "vectorBucketName", &name), rc2;

	if (rc1 < 0)
		return rc1;
	rc2 = s3a_get_str(r, o, "vectorBucketArn", &arn);
	if (rc2 < 0)
		return rc2;
	if (name && arn)
		return s3a_verr(r, "/vectorBucketName", "Specify either vectorBucketName or "
			    "vectorBucketArn, not both");
	if (arn) {
		if (!s3a_parse_arn(arn, b, NULL, false))
			return s3a_verr(r, "/vectorBucketArn", "Invalid vector bucket ARN");
		return 0;
	}
	if (!name)
		return s3a_verr(r, "/vectorBucketName", "vectorBucketName or vectorBucketArn is "
			    "required");
	if (!s3a_valid_bucket(a, name))
		return s3a_verr(r, "/vectorBucketName", "Invalid vector bucket name: 3-63 "
			    "characters, lower-case letters, digits and hyphens, starting and "
			    "ending with a letter or digit");
	strcpy(b, name);
	return 0;
}

/* Resolve the index of a request (indexArn, or a bucket + indexName). */
int s3a_req_index(const struct s3_api *a, struct s3_resp *r, json_t *o, char *b, char *x)
{
	const char *arn, *name;
	int rc = s3a_get_str(r, o, "indexArn", &arn);

	if (rc < 0)
		return rc;
	if (arn) {
		if (json_object_get(o, "indexName") || json_object_get(o, "vectorBucketName") ||
		    json_object_get(o, "vectorBucketArn"))
			return s3a_verr(r, "/indexArn", "Specify either indexArn or a bucket and "
				    "indexName, not both");
		if (!s3a_parse_arn(arn, b, x, true))
			return s3a_verr(r, "/indexArn", "Invalid index ARN");
		return 0;
	}
	rc = s3a_req_bucket(a, r, o, b);
	if (rc)
		return rc;
	rc = s3a_get_str(r, o, "indexName", &name);
	if (rc < 0)
		return rc;
	if (!name)
		return s3a_verr(r, "/indexName", "indexName or indexArn is required");
	if (!s3a_valid_name(name, true))
		return s3a_verr(r, "/indexName", "Invalid index name: 3-63 characters, lower-case "
			    "letters, digits, hyphens and dots, starting and ending with a letter "
			    "or digit");
	strcpy(x, name);
	return 0;
}

/* Open the request's index: NULL with the error response filled. */
struct flat_index *s3a_open_index(struct s3_api *a, struct s3_resp *r, json_t *o)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	struct flat_index *ix;

	if (s3a_req_index(a, r, o, b, x))
		return NULL;
	ix = flat_index_get(a->store, b, x);
	if (!ix) {
		if (flat_bucket_get(a->store, b, NULL))
			s3a_engine_err(r, -ENOENT, "vector bucket");
		else
			s3a_engine_err(r, -ENOENT, "index");
	}
	return ix;
}


void s3a_nf_parse(const void *conf, uint32_t conf_len, struct nfkeys *nf)
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

void s3a_nf_load(struct flat_index *ix, struct nfkeys *nf)
{
	const struct flat_index_info *in = flat_index_info(ix);

	s3a_nf_parse(in->conf, in->conf_len, nf);
}

/* ---------------------------------------------------------------- paging tokens ---- */

char *s3a_token_make(const char *plain)
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
bool s3_api_token_read(const char *t, char *out, size_t cap)
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

int s3a_get_token(struct s3_resp *r, json_t *o, char *plain, size_t cap, bool *have)
{
	const char *t;
	int rc = s3a_get_str(r, o, "nextToken", &t);

	*have = false;
	if (rc < 0)
		return rc;
	if (!t)
		return 0;
	if (!s3_api_token_read(t, plain, cap))
		return s3a_verr(r, "/nextToken", "Invalid nextToken");
	*have = true;
	return 0;
}

/* ---------------------------------------------------------------- JSON body -------- */

json_t *s3a_vector_data(const float *v, uint32_t dim)
{
	json_t *arr = json_array();

	for (uint32_t i = 0; i < dim && arr; i++)
		json_array_append_new(arr, json_real(v[i]));
	return json_pack("{s:o}", "float32", arr);
}

/* Read {"float32":[...]} of dim finite floats into out. */
int s3a_read_vector(struct s3_resp *r, json_t *data, const char *path, uint32_t dim,
		       bool cosine, float *out)
{
	json_t *arr = json_object_get(data, "float32"), *e;
	char p[96];
	size_t i;
	bool nonzero = false;

	if (!json_is_object(data) || !json_is_array(arr))
		return s3a_verr(r, path, "vector data must be an object with a float32 array");
	snprintf(p, sizeof(p), "%s/float32", path);
	if (json_array_size(arr) != dim)
		return s3a_verr(r, p, "vector has %zu dimensions, the index has %u",
			    json_array_size(arr), dim);
	json_array_foreach(arr, i, e) {
		double d;

		if (!json_is_number(e))
			return s3a_verr(r, p, "vector elements must be numbers");
		d = json_number_value(e);
		out[i] = (float)d;
		if (!isfinite(d) || !isfinite(out[i]))
			return s3a_verr(r, p, "vector elements must be finite float32 values");
		nonzero |= out[i] != 0;
	}
	if (cosine && !nonzero)
		return s3a_verr(r, p, "an all-zero vector has no cosine distance");
	return 0;
}
