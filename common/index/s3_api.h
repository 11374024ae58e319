/* s3_api.h: the S3 Vectors operations (REST-JSON bodies in, status + JSON body out) over a
 * flat store, with AWS request validation and AWS error shapes. Transport-free: the HTTP
 * layer (s3_http) authenticates, admits and calls in here; tests call it directly.
 *
 * The operations run against a flat store in this process: dmann-s3 (single-process
 * gateway) and the memory nodes (mn/mn_flat.c, FL_CALL) use them directly. The distributed
 * path of DESIGN §7 (cn/s3/cn_s3*.c: the ingress CN fanning a query out to a replica group
 * of W CNs scanning their fragment shares, merging partial top-k lists, writes forwarded
 * to the MNs) uses the request validation below: the same QueryVectors parser
 * (s3_api_qspec_parse) as the local path, with its own index resolver.
 */
#ifndef DM_S3_API_H
#define DM_S3_API_H

#include "dm.h"
#include "flat.h"

#define S3_MAX_PAYLOAD (20u << 20)      /* request body limit */
#define S3_TOPK_MAX 100
#define S3_PUT_MAX 500
#define S3_DELETE_MAX 500
#define S3_GET_MAX 100
#define S3_LIST_VECTORS_DEFAULT 500
#define S3_LIST_VECTORS_MAX 1000
#define S3_LIST_PAGE_BYTES (1u << 20)   /* ListVectors ends a page early past this */
#define S3_LIST_SEGMENTS_MAX 16
#define S3_LIST_CATALOG_DEFAULT 100
#define S3_LIST_CATALOG_MAX 500

/* A response: HTTP status, the AWS error type (NULL on success) and the JSON body. */
struct s3_resp {
	int status;
	const char *errtype;
	char *body;
	size_t len;
};

struct s3_api;
struct s3_query;

/* region and account appear in ARNs (defaults us-east-1 / 000000000000). NULL + errno. */
struct s3_api *s3_api_new(struct flat_store *store, const char *region, const char *account);
void s3_api_free(struct s3_api *a);

/* ---- shards of a vector bucket (cn/s3: a bucket's rows spread over S shards) ----
 * Shard 0 of bucket B is B itself; shard s in 1..S-1 is stored on the memory nodes as a
 * bucket of its own named "B#s" (s decimal, no leading zero), placed, replicated, marked
 * stale and caught up like any bucket. Users never see or name those: the gateway refuses
 * '#' in their bucket names and hides shard buckets from ListVectorBuckets. */
#define DM_S3_SHARDS_MAX 256
/* The start of the message of a memory node's 409 to a gateway whose shard count of a
 * bucket is out of date (it re-reads the count and tries again). */
#define S3_SHARDS_DIFFER "dmann-shards-differ"

/* Whether a accepts the names of shard buckets ("B#s") where requests name a bucket by
 * vectorBucketName (not by ARN). Off by default (dmann-s3: users' names only); the memory
 * nodes turn it on (mn/mn_flat.c). */
void s3_api_shard_names(struct s3_api *a, bool on);
/* Whether name is "B#s" with B a valid bucket name and s in 1..DM_S3_SHARDS_MAX-1 without
 * leading zero: true with base (FLAT_NAME_MAX + 1 bytes) and *shard filled (either may be
 * NULL). */
bool s3_shard_parse(const char *name, char *base, uint32_t *shard);
/* The name of shard `shard` of bucket (valid S3 name) into out (FLAT_NAME_MAX + 1 bytes):
 * bucket itself for shard 0. 0, or -EINVAL. */
int s3_shard_name(const char *bucket, uint32_t shard, char *out);
/* Whether a bucket name carries a '#' (a shard's, or not a user's name at all). */
bool s3_is_shard_name(const char *name);
/* The shard (0..nshards-1) of a vector key: a salted hash of its bytes mod nshards. */
uint32_t s3_key_shard(const char *key, size_t len, uint32_t nshards);

/* Run operation op (e.g. "PutVectors") on a JSON body. Always fills r. */
void s3_api_handle(struct s3_api *a, const char *op, const char *body, size_t len,
		   struct s3_resp *r);
/* Whether op names an operation this gateway implements (the 19 the SDK models). */
bool s3_api_known_op(const char *op);

/* QueryVectors in two steps so that the caller can batch queries: prepare validates and
 * resolves one request (0, or -EINVAL with the error response in r); run executes n
 * prepared queries, one sgemm pass per index when several hit the same index, and fills
 * rs[i] for each. Prepared queries are freed by run. */
int s3_api_query_prepare(struct s3_api *a, const char *body, size_t len, struct s3_query **q,
			 struct s3_resp *r);
void s3_api_query_run(struct s3_api *a, struct s3_query **qs, size_t n, struct s3_resp *rs);
void s3_query_free(struct s3_query *q);

/* ---- for engines outside this process (cn/s3/cn_s3*.c: the distributed path) ---- */

/* A QueryVectors request validated against an index's description. */
struct s3_qspec {
	size_t k;
	float *vec;                     /* dim floats */
	struct s3_filter *filter;       /* NULL: no filter */
	bool ret_meta, ret_dist;
	/* A scoped index (s3_scope.h) whose filter pins its scope key to one value: that
	 * value's fragments alone can hold the answer. */
	bool scoped;
	char scope_key[64];             /* S3_SCOPE_KEY_MAX + 1 */
	char *scope_val;                /* malloc'd, scope_vlen bytes + NUL */
	size_t scope_vlen;
	uint64_t scope_label;           /* s3_scope_label of the value */
};
/* What the QueryVectors parser needs to know of the index a request names. */
struct s3_qindex {
	uint32_t dim;
	enum dm_metric metric;
	const void *conf;               /* the index's stored configuration (JSON) */
	uint32_t conf_len;
};
/* Find the index bucket/index (names validated): 0 with out filled (conf must stay valid
 * until the parser returns), or -errno with the error response in r. */
typedef int (*s3_qresolve_fn)(void *ctx, const char *bucket, const char *index,
			      struct s3_qindex *out, struct s3_resp *r);
/* The one QueryVectors parser (also behind s3_api_query_prepare): the payload limit, the
 * JSON body, topK, returnMetadata/returnDistance, queryVector present, the index named
 * (vectorBucketName + indexName or indexArn), then resolve, then the vector against the
 * index's dimension and metric and the filter against its non-filterable keys, in this
 * order (the first problem is the one reported); for a scoped index, the value the filter
 * pins its scope key to (q->scoped). 0, or -errno with the error in r (q is then empty). */
int s3_api_qspec_parse(const char *body, size_t len, s3_qresolve_fn resolve, void *ctx,
		       struct s3_qspec *q, struct s3_resp *r);
/* A resolver for a known index: ctx is a const struct s3_qindex * (any names). */
int s3_api_qresolve_fixed(void *ctx, const char *bucket, const char *index,
			  struct s3_qindex *out, struct s3_resp *r);
void s3_qspec_fini(struct s3_qspec *q);
/* The bucket a request names (vectorBucketName, vectorBucketArn or indexArn), without
 * further validation (for routing). 0 or -ENOENT (bucket = ""). */
int s3_api_req_bucket(const char *body, size_t len, char *bucket);
/* What a gateway checks before it routes a user's request: a vectorBucketName with a '#'
 * (the memory nodes' names of shards, s3_shard_parse) is refused, and so is a top-level
 * field named "_dmann..." (what gateways tell memory nodes). 0, or -EINVAL with a 400
 * ValidationException in r. */
int s3_api_user_bucket(const char *body, size_t len, struct s3_resp *r);
/* Whether operation op changes state (Create*, Delete*, Put*, TagResource, UntagResource):
 * what a gateway sends to every replica of a bucket. */
bool s3_api_is_write(const char *op);
/* The same with the index it names (indexName beside a bucket, indexArn, or an index
 * resourceArn) into index (FLAT_NAME_MAX + 1 bytes; "" when the request names a bucket
 * only): what bucket policies are evaluated against. */
int s3_api_req_resource(const char *body, size_t len, char *bucket, char *index);
/* A ListVectorBuckets/ListIndexes nextToken for the last name returned (malloc'ed). */
char *s3_api_token(const char *plain);
/* The text of such a token into plain (cap bytes): false if malformed. */
bool s3_api_token_read(const char *token, char *plain, size_t cap);
/* NotFoundException for an unknown vector bucket (bucket) or index. */
void s3_api_not_found(struct s3_resp *r, bool bucket);

/* Fill r with an AWS error: status, type, message (no fieldList). */
void s3_resp_error(struct s3_resp *r, int status, const char *type, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void s3_resp_free(struct s3_resp *r);

#endif
