/* s3_filter.h: S3 Vectors metadata (validation against the AWS limits, and the compact
 * binary encoding of the filterable part that the storage engine keeps beside each vector)
 * and the metadata filter language: a parser into a tree and an evaluator over that
 * encoding.
 *
 * Filter language: {"key": value} (bare value = $eq), {"key": {"$op": operand, ...}},
 * {"$and": [f, ...]}, {"$or": [f, ...]}; several entries in one object are ANDed.
 *   $eq $ne      string | number | boolean; on a list field, $eq matches if any element is
 *                equal and $ne if none is. A missing key: $eq false, $ne true.
 *   $gt $gte $lt $lte   number (a list field matches if any element does)
 *   $in $nin     non-empty array of strings/numbers/booleans ($nin true for a missing key)
 *   $exists      boolean
 * Keys declared non-filterable for the index cannot be filtered on.
 */
#ifndef DM_S3_FILTER_H
#define DM_S3_FILTER_H

#include "dm.h"

#include <jansson.h>

#define S3_META_MAX_BYTES (40 * 1024)       /* whole metadata, compact JSON */
#define S3_META_MAX_FILTERABLE (2 * 1024)   /* filterable part, compact JSON */
#define S3_META_MAX_KEYS 50
#define S3_NONFILTER_MAX_KEYS 10
#define S3_FILTER_MAX_DEPTH 16
#define S3_FILTER_MAX_NODES 1024

/* Validate metadata (a JSON object; NULL = none) and encode it: *json receives the compact
 * JSON text (malloc, may be NULL when meta is NULL), *fmeta the binary encoding of the
 * filterable keys (malloc, may be NULL when empty). -EINVAL with a message in err. */
int s3_meta_encode(const json_t *meta, const char *const *nonfilter, size_t nnf,
		   char **json, size_t *json_len, uint8_t **fmeta, size_t *fmeta_len,
		   char *err, size_t errlen);

struct s3_filter;

/* Parse a filter; NULL + errno EINVAL (message in err) or ENOMEM. */
struct s3_filter *s3_filter_parse(const json_t *f, const char *const *nonfilter, size_t nnf,
				  char *err, size_t errlen);
void s3_filter_free(struct s3_filter *f);
/* Does the encoded filterable metadata match? (Malformed encodings match nothing.) */
bool s3_filter_match(const struct s3_filter *f, const void *fmeta, size_t len);

/* The string value of key in encoded filterable metadata: 1 with *val / *vlen pointing
 * into fmeta, 0 when the key is absent, -EINVAL when it holds another type or the encoding
 * is malformed. */
int s3_fmeta_string(const void *fmeta, size_t len, const char *key, const char **val,
		    uint32_t *vlen);

/* Decode an fmeta blob back to a JSON object (tests, debugging); NULL if malformed. */
json_t *s3_fmeta_to_json(const void *fmeta, size_t len);

#endif
