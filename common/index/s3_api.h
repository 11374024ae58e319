/* s3_api.h: the S3 Vectors operations (REST-JSON bodies in, status + JSON body out) over a
 * flat store, with AWS request validation and AWS error shapes. Transport-free: the HTTP
 * layer (s3_http) authenticates, admits and calls in here; tests call it directly.
 *
 * Today the operations run against one local flat store (mn/flat) in this process. The
 * distributed path of DESIGN §7 (the ingress CN fanning a query out to a replica group of W
 * CNs scanning their fragment shares, merging partial top-k lists, writes forwarded to the
 * MNs) is not built yet; s3_api_query_run is where it will plug in.
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

/* Run operation op (e.g. "PutVectors") on a JSON body. Always fills r. */
void s3_api_handle(struct s3_api *a, const char *op, const char *body, size_t len,
		   struct s3_resp *r);
/* Whether op names an operation this gateway implements. */
bool s3_api_known_op(const char *op);

/* QueryVectors in two steps so that the caller can batch queries: prepare validates and
 * resolves one request (0, or -EINVAL with the error response in r); run executes n
 * prepared queries, one sgemm pass per index when several hit the same index, and fills
 * rs[i] for each. Prepared queries are freed by run. */
int s3_api_query_prepare(struct s3_api *a, const char *body, size_t len, struct s3_query **q,
			 struct s3_resp *r);
void s3_api_query_run(struct s3_api *a, struct s3_query **qs, size_t n, struct s3_resp *rs);
void s3_query_free(struct s3_query *q);

/* ---- for engines outside this process (cn/cn_s3.c: the distributed path) ---- */

/* A QueryVectors request validated against an index's description. */
struct s3_qspec {
	size_t k;
	float *vec;                     /* dim floats */
	struct s3_filter *filter;       /* NULL: no filter */
	bool ret_meta, ret_dist;
};
/* The index a QueryVectors body names (bucket + indexName or indexArn, validated). 0, or
 * -EINVAL with the ValidationException in r. */
int s3_api_qspec_target(const char *body, size_t len, char *bucket, char *index,
			struct s3_resp *r);
/* Validate the rest of the request (topK, flags, vector, filter) against the index's dim,
 * metric and stored configuration. 0 or -errno with the error in r. */
int s3_api_qspec_bind(const char *body, size_t len, uint32_t dim, enum dm_metric metric,
		      const void *conf, uint32_t conf_len, struct s3_qspec *q, struct s3_resp *r);
void s3_qspec_fini(struct s3_qspec *q);
/* The bucket a request names (vectorBucketName, vectorBucketArn or indexArn), without
 * further validation (for routing). 0 or -ENOENT (bucket = ""). */
int s3_api_req_bucket(const char *body, size_t len, char *bucket);
/* A ListVectorBuckets/ListIndexes nextToken for the last name returned (malloc'ed). */
char *s3_api_token(const char *plain);
/* NotFoundException for an unknown vector bucket (bucket) or index. */
void s3_api_not_found(struct s3_resp *r, bool bucket);

/* Fill r with an AWS error: status, type, message (no fieldList). */
void s3_resp_error(struct s3_resp *r, int status, const char *type, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void s3_resp_free(struct s3_resp *r);

#endif
