/* s3_scope.h: scoped retrieval (issue 15): an S3 index may declare one filterable metadata
 * key as its scope (a tenant id). The declaration is the reserved tag S3_SCOPE_TAG given at
 * CreateIndex ({"tags": {"dmann:scope": "tenant"}}): the key name is then kept in the
 * index's configuration (S3_SCOPE_CONF beside nonFilterableMetadataKeys), immutable for the
 * index's life (TagResource/UntagResource of that tag are refused).
 *
 * What it does: the flat store keeps the rows of each scope value in fragments of their
 * own (one open tail per value, every fragment labelled with s3_scope_label of its value;
 * rows without the key form the "no scope" group, label 0), and a QueryVectors whose filter
 * pins the key to one string value (s3_scope_pin) is served by an exact scan of that
 * value's fragments only, with the whole filter still applied. Scope values must be
 * strings: PutVectors refuses a row whose scope key holds anything else.
 *
 * This file: the declaration (parse, validation), a row's scope value and label from its
 * encoded filterable metadata (s3_filter.h's encoding), the pin of a filter, and the
 * flat store's hooks (flat_scope_ops). */
#ifndef DM_S3_SCOPE_H
#define DM_S3_SCOPE_H

#include "dm.h"
#include "flat.h"

#include <jansson.h>

#define S3_SCOPE_TAG "dmann:scope"      /* the reserved tag of CreateIndex */
#define S3_SCOPE_CONF "dmannScope"      /* its key in the index's configuration JSON */
#define S3_SCOPE_KEY_MAX 63             /* bytes of the key name (as non-filterable keys) */

/* The scope key declared by an index's configuration (JSON text, conf_len bytes) into key
 * (S3_SCOPE_KEY_MAX + 1 bytes): 1 when the index is scoped, 0 when not (no configuration,
 * or none declared), -EINVAL when the configuration is not JSON or the declaration is
 * malformed (not a string of 1..S3_SCOPE_KEY_MAX bytes without NUL). */
int s3_scope_conf_key(const void *conf, uint32_t conf_len, char *key);

/* Validate a CreateIndex declaration: the tag's value v (a string) against the index's
 * non-filterable keys. 0, or -EINVAL with a message in err. */
int s3_scope_check_decl(const json_t *v, const char *const *nonfilter, size_t nnf, char *err,
			size_t errlen);

/* The value of key in encoded filterable metadata (s3_filter.h): 1 with *val / *vlen
 * pointing into fmeta when it is a string, 0 when the key is absent, -EINVAL when it holds
 * another type or the encoding is malformed. */
int s3_scope_value(const void *fmeta, size_t len, const char *key, const char **val,
		   uint32_t *vlen);

/* The label of a scope value: a 64-bit hash of its bytes, never 0 (0 is the label of the
 * rows without a scope value). */
uint64_t s3_scope_label(const char *val, size_t len);

/* The value a filter pins key to: {"key": "v"}, {"key": {"$eq": "v", ...}}, or such an
 * entry of a top-level "$and" (nested "$and"s too; never under "$or", "$ne", "$in" and the
 * like): every row the filter matches then has the scope value v. 1 with *val (malloc'd,
 * *vlen bytes, NUL-terminated), 0 when the filter pins no string value of key, -ENOMEM.
 * The filter is untrusted input (depth bounded by S3_FILTER_MAX_DEPTH). */
int s3_scope_pin(const json_t *filter, const char *key, char **val, size_t *vlen);

/* The flat store's hooks (flat_opts.scope): the memory nodes and dmann-s3 open their stores
 * with them. */
extern const struct flat_scope_ops s3_scope_ops;

#endif
