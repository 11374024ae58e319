/* s3_sigv4.h: AWS Signature Version 4 verification for the S3 Vectors gateway (and the
 * signing half, for tests and clients). Header-based auth only (no presigned URLs).
 *
 * The server rebuilds the canonical request from the SignedHeaders list of the
 * Authorization header, checks x-amz-content-sha256 against the body, bounds the clock
 * skew of x-amz-date, and compares signatures in constant time.
 */
#ifndef DM_S3_SIGV4_H
#define DM_S3_SIGV4_H

#include "dm.h"

#include <time.h>

/* A request as the verifier sees it. path and query are raw (as on the wire: still
 * percent-encoded); query excludes the '?', "" when absent. header() returns the value of
 * a header by lower-case name (the first one if repeated), or NULL. */
struct s3_sigv4_req {
	const char *method;
	const char *path;
	const char *query;
	const char *(*header)(void *ctx, const char *lname);
	void *hctx;
	const void *body;
	size_t body_len;
};

/* The headers a client of the gateway signs ("content-type;host;x-amz-content-sha256;
 * x-amz-date"): s3_sigv4_client_header is a header() for them, hctx a struct
 * s3_sigv4_client_hdrs. */
struct s3_sigv4_client_hdrs {
	const char *host, *date, *sha, *ctype;
};
const char *s3_sigv4_client_header(void *ctx, const char *lname);

/* One identity: its key pair and the principal ARN bucket policies name it by (NULL:
 * arn:aws:iam::000000000000:user/<access_key>, see s3_cred_principal). */
struct s3_cred {
	char *access_key;
	char *secret_key;
	char *principal;
};

struct s3_sigv4_cfg {
	const struct s3_cred *creds;
	size_t ncreds;
	const char *service;           /* "s3vectors" */
	const char *region;            /* required region, or NULL to accept any */
	int max_skew_s;                /* allowed |now - x-amz-date| (AWS: 900) */
};

/* 0 if the request is signed by one of the keys; -EACCES otherwise with a reason in msg. */
int s3_sigv4_verify(const struct s3_sigv4_cfg *cfg, const struct s3_sigv4_req *r, time_t now,
		    char *msg, size_t msglen);
/* The same, telling which: 0 with *who = the index of the signing credential; or -ENOKEY
 * (unknown access key: AWS UnrecognizedClientException), -EKEYREJECTED (the signature does
 * not match: InvalidSignatureException), -EACCES (anything else), with a reason in msg. */
int s3_sigv4_verify_who(const struct s3_sigv4_cfg *cfg, const struct s3_sigv4_req *r,
			time_t now, size_t *who, char *msg, size_t msglen);
/* The AWS error type of a s3_sigv4_verify_who failure. */
const char *s3_sigv4_errtype(int rc);
/* The principal ARN of a credential (its own, or the default from its access key) into
 * out. */
void s3_cred_principal(const struct s3_cred *c, char *out, size_t outlen);

/* Lower-case hex SHA-256. */
void s3_sha256_hex(const void *p, size_t n, char hex[65]);

/* The canonical request for the given signed headers (';'-separated, lower case) and
 * payload hash; malloc'ed, NULL (errno EINVAL) if a signed header is missing. */
char *s3_sigv4_canonical_request(const struct s3_sigv4_req *r, const char *signed_headers,
				 const char *payload_hash);

/* Signature (hex) of a canonical request: amz_date is YYYYMMDDTHHMMSSZ. */
void s3_sigv4_signature(const char *secret, const char *amz_date, const char *region,
			const char *service, const char *canonical_request, char sig[65]);

/* Build the Authorization header value for r (signing side). Returns 0, -EINVAL. */
int s3_sigv4_authorization(const struct s3_sigv4_req *r, const char *access_key,
			   const char *secret, const char *amz_date, const char *region,
			   const char *service, const char *signed_headers,
			   const char *payload_hash, char *out, size_t outlen);

#endif
