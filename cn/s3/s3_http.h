/* s3_http.h: the S3 Vectors HTTP front end (libmicrohttpd, internal thread pool; HTTPS
 * with GnuTLS when given a certificate): reads `POST [prefix]/<OperationName>` requests and
 * the REST tag calls, verifies SigV4 (several identities), enforces the bucket policy
 * (s3_gate), runs the operation through s3_api, and answers with AWS error shapes (x-amzn-errortype header + {"__type",
 * "message"} body).
 *
 * QueryVectors goes through a bounded admission queue served by search threads (which
 * batch queued queries of one index into one sgemm scan); when the queue is full the
 * request is refused at once with 503 ServiceUnavailableException. Other operations run on
 * the HTTP threads.
 */
#ifndef DM_S3_HTTP_H
#define DM_S3_HTTP_H

#include "dm.h"
#include "s3_api.h"
#include "s3_sigv4.h"

/* Operations run elsewhere (a compute node's distributed path, cn/s3/cn_s3*.c) instead of
 * through a local s3_api. */
struct s3_backend {
	void *ctx;
	/* Any operation but QueryVectors (known, authenticated), on an HTTP thread. */
	void (*handle)(void *ctx, const char *op, const char *body, size_t len,
		       struct s3_resp *r);
	/* One admitted QueryVectors, on a search thread. */
	void (*query)(void *ctx, const char *body, size_t len, struct s3_resp *r);
	/* Cluster-internal operations, `POST [prefix]/_dmann/<op>`: SigV4-signed with a key of
	 * internal_auth (not the S3 users' keys), run on the HTTP thread without admission
	 * (they serve queries another CN already admitted). NULL: none. */
	void (*internal)(void *ctx, const char *op, const char *body, size_t len,
			 struct s3_resp *r);
	const struct s3_sigv4_cfg *internal_auth;
};

struct s3_http_cfg {
	const char *addr;              /* numeric IPv4/IPv6 address; NULL = all IPv4 */
	uint16_t port;                 /* 0 = an ephemeral port (see s3_http_port) */
	struct s3_api *api;            /* local operations, or NULL with backend */
	const struct s3_backend *backend;
	struct s3_sigv4_cfg auth;      /* ncreds must be >= 1 */
	unsigned http_threads;         /* default 4 */
	unsigned search_threads;       /* default: online CPUs */
	unsigned queue_depth;          /* admitted queries (running + waiting), default 64 */
	unsigned batch_max;            /* queries per batched scan, default 16 */
	const char *arn_region;        /* region and account of the ARNs bucket policies name */
	const char *arn_account;       /* (NULL: us-east-1 / 000000000000, as s3_api) */
	bool policy_default_deny;      /* an action no bucket policy statement allows is
					* refused (default: allowed unless explicitly denied) */
	const char *tls_cert;          /* PEM files: serve HTTPS (NULL: plain HTTP) */
	const char *tls_key;
};

struct s3_http_stats {
	uint64_t requests;             /* requests answered */
	uint64_t auth_failures;        /* 403 */
	uint64_t queries;              /* QueryVectors executed */
	uint64_t rejected;             /* QueryVectors refused with 503 */
	uint64_t batches;              /* scans run by the search threads */
};

struct s3_http;

/* Start serving; NULL + errno (EADDRINUSE, EINVAL...). */
struct s3_http *s3_http_start(const struct s3_http_cfg *cfg);
uint16_t s3_http_port(const struct s3_http *h);
void s3_http_stats(const struct s3_http *h, struct s3_http_stats *out);
/* Finish admitted queries, stop the threads, close the socket. */
void s3_http_stop(struct s3_http *h);

#endif
