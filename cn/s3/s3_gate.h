/* s3_gate.h: what the S3 gateway does between authentication and running an operation:
 * the REST tag calls (GET/POST/DELETE [prefix]/tags/{resourceArn}) rewritten into JSON
 * operations, and the bucket policy of the resource evaluated for the caller's principal
 * (s3_policy) before any operation runs, on dmann-s3 and on the compute nodes alike: the
 * policy is read through the operation layer (GetVectorBucketPolicy), so on a cluster it
 * comes from the memory nodes holding the bucket, on every call.
 */
#ifndef DM_S3_GATE_H
#define DM_S3_GATE_H

#include "dm.h"
#include "s3_api.h"

/* Run an operation (the local s3_api or the backend). */
typedef void (*s3g_run_fn)(void *ctx, const char *op, const char *body, size_t len,
			   struct s3_resp *r);

/* A tag call? 1 with *op set and the JSON body in *nbody (malloc'ed: the body with
 * resourceArn from the path and, for DELETE, tagKeys from the query); 0 when url is not a
 * tag call; -EINVAL with the error in r. query is the raw query string. */
int s3g_tag_call(const char *url, const char *method, const char *query, const char *body,
		 size_t len, const char **op, char **nbody, size_t *nlen, struct s3_resp *r);

struct s3g_authz {
	const char *principal;          /* the caller's principal ARN */
	const char *region, *account;   /* of the ARNs */
	bool default_deny;              /* [s3] policy_default = deny */
	s3g_run_fn run;
	void *ctx;
};

/* Whether the caller may run op on the resource the body names: true, or false with a 403
 * AccessDeniedException in r. */
bool s3g_authorize(const struct s3g_authz *z, const char *op, const char *body, size_t len,
		   struct s3_resp *r);

#endif
