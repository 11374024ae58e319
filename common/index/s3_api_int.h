/* s3_api_int.h: what the files of the S3 operation layer share (private to common/index):
 *   s3_api.c          dispatch, construction, helpers for remote engines
 *   s3_api_util.c     responses and AWS error shapes, field access, names and ARNs, paging
 *                     tokens, vectors in JSON bodies
 *   s3_api_catalog.c  vector buckets and indexes (Create/Get/List/Delete)
 *   s3_api_vectors.c  PutVectors, GetVectors, ListVectors, DeleteVectors
 *   s3_api_attrs.c    tags and bucket policies (catalog attributes)
 *   s3_api_query.c    QueryVectors: the one request parser (local and distributed paths),
 *                     batched local execution
 */
#ifndef DM_S3_API_INT_H
#define DM_S3_API_INT_H

#include "s3_api.h"
#include "s3_filter.h"

#include <jansson.h>

#define JSON_OUT_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

struct s3_api {
	struct flat_store *store;
	char region[64];
	char account[32];
	uint64_t epoch;          /* row ids (and so vector tokens) are valid per process */
	bool shard_names;        /* bucket names "B#s" accepted (the memory nodes) */
};

struct s3_query {
	struct flat_index *ix;
	float *vec;
	size_t k;
	struct s3_filter *filter;
	bool ret_meta, ret_dist;
	bool scoped;                     /* scan only the fragments of scope label `scope` */
	uint64_t scope;
};

/* The non-filterable keys from an index's stored configuration. */
struct nfkeys {
	json_t *conf;
	const char *k[S3_NONFILTER_MAX_KEYS];
	size_t n;
};

int s3a_verr(struct s3_resp *r, const char *path, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void s3a_ok(struct s3_resp *r, json_t *o);
void s3a_engine_err(struct s3_resp *r, int rc, const char *what);
int s3a_get_str(struct s3_resp *r, json_t *o, const char *name, const char **out);
int s3a_get_int(struct s3_resp *r, json_t *o, const char *name, long long lo, long long hi,
		long long *out);
int s3a_get_bool(struct s3_resp *r, json_t *o, const char *name, bool *out);
bool s3a_valid_name(const char *s, bool dots);
/* The shard count recorded with bucket b at its creation (1 when none, or unreadable). */
uint32_t s3a_bucket_shards(struct s3_api *a, const char *b);
/* Whether a is asked to check a write without applying it (memory nodes only: the
 * gateway's "_dmannCheck" before it splits a write over the shards of a bucket). */
bool s3a_check_only(const struct s3_api *a, json_t *o);
/* A bucket name a request may use through a: an S3 name (s3a_valid_name), or with a's
 * shard names on (a not NULL) also a shard's "B#s" (s3_shard_parse). */
bool s3a_valid_bucket(const struct s3_api *a, const char *name);
json_t *s3a_bucket_arn(struct s3_api *a, const char *b);
json_t *s3a_index_arn(struct s3_api *a, const char *b, const char *x);
bool s3a_parse_arn(const char *arn, char *b, char *x, bool want_index);
int s3a_req_bucket(const struct s3_api *a, struct s3_resp *r, json_t *o, char *b);
int s3a_req_index(const struct s3_api *a, struct s3_resp *r, json_t *o, char *b, char *x);
struct flat_index *s3a_open_index(struct s3_api *a, struct s3_resp *r, json_t *o);
void s3a_nf_parse(const void *conf, uint32_t conf_len, struct nfkeys *nf);
void s3a_nf_load(struct flat_index *ix, struct nfkeys *nf);
char *s3a_token_make(const char *plain);
int s3a_get_token(struct s3_resp *r, json_t *o, char *plain, size_t cap, bool *have);
json_t *s3a_vector_data(const float *v, uint32_t dim);
int s3a_read_vector(struct s3_resp *r, json_t *data, const char *path, uint32_t dim,
		    bool cosine, float *out);
void s3a_op_create_bucket(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_get_bucket(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_delete_bucket(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_list_buckets(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_create_index(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_get_index(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_delete_index(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_list_indexes(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_put_vectors(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_get_vectors(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_list_vectors(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_delete_vectors(struct s3_api *a, json_t *o, struct s3_resp *r);
int s3a_tags_check(struct s3_resp *r, json_t *tags, const char *path);
int s3a_tags_create(struct s3_api *a, struct s3_resp *r, const char *b, const char *x,
		    json_t *tags);
void s3a_op_tag_resource(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_untag_resource(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_list_tags(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_put_policy(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_get_policy(struct s3_api *a, json_t *o, struct s3_resp *r);
void s3a_op_delete_policy(struct s3_api *a, json_t *o, struct s3_resp *r);
json_t *s3a_parse_body(const char *body, size_t len, struct s3_resp *r);
void s3a_op_query_vectors(struct s3_api *a, json_t *o, struct s3_resp *r);

#endif
