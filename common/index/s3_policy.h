/* s3_policy.h: S3 Vectors bucket policies: the parser/validator (PutVectorBucketPolicy on
 * the memory nodes and dmann-s3) and the evaluator the gateway runs before every
 * operation, as AWS evaluates resource policies:
 *
 *   - a policy is {"Version"?, "Id"?, "Statement": statement | [statement, ...]};
 *   - a statement is {"Sid"?, "Effect": "Allow"|"Deny", "Principal": "*" | {"AWS": p | [p]},
 *     "Action" | "NotAction": a | [a], "Resource" | "NotResource": r | [r]} where p is "*",
 *     an IAM principal ARN, an account id or arn:aws:iam::ACCOUNT:root (every principal of
 *     that account); a is "*", "s3vectors:*" or "s3vectors:<Operation>" with `*` / `?`
 *     wildcards (matched case-insensitively); r is an ARN pattern with `*` / `?` (matched
 *     case-sensitively). Condition, NotPrincipal and unknown members are refused;
 *   - a statement applies when principal, action and resource all match; an explicit Deny
 *     wins over any Allow; otherwise any matching Allow gives S3P_ALLOW, else S3P_IMPLICIT
 *     (the caller decides what an implicit decision means: docs/api.md).
 */
#ifndef DM_S3_POLICY_H
#define DM_S3_POLICY_H

#include "dm.h"

#define S3P_MAX_BYTES (20u << 10)      /* AWS: a bucket policy is at most 20 KB */

enum s3p_decision { S3P_IMPLICIT = 0, S3P_ALLOW = 1, S3P_DENY = 2 };

struct s3p_policy;

/* Parse and validate a policy document: NULL + errno (EINVAL with the reason in msg,
 * ENOMEM). */
struct s3p_policy *s3p_parse(const char *text, size_t len, char *msg, size_t msglen);
void s3p_free(struct s3p_policy *p);

/* The decision for principal (an ARN) doing action ("s3vectors:PutVectors") on resource
 * (a bucket or index ARN). */
enum s3p_decision s3p_eval(const struct s3p_policy *p, const char *principal,
			   const char *action, const char *resource);

/* Glob match with `*` (any run) and `?` (one character); nocase for actions. */
bool s3p_match(const char *pattern, const char *s, bool nocase);

#endif
