/* s3_scope.c: scoped retrieval's pieces over S3 data (s3_scope.h): the declaration kept in
 * an index's configuration, a row's scope value in the encoded filterable metadata (the
 * encoding of s3_filter.c: entries u16 key_len | key | u8 type | payload, a string being
 * type 1 with u32 len + bytes), its label, the pin of a filter, and the flat store's hooks
 * (flat_scope_ops) built on them. */
#include "s3_scope.h"
#include "s3_filter.h"
#include "util/dm_hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static bool key_name_ok(const char *k, size_t len)
{
	return len >= 1 && len <= S3_SCOPE_KEY_MAX && strlen(k) == len;
}

int s3_scope_conf_key(const void *conf, uint32_t conf_len, char *key)
{
	json_t *o, *v;
	int rc = 0;

	key[0] = 0;
	if (!conf || !conf_len)
		return 0;
	o = json_loadb(conf, conf_len, 0, NULL);
	if (!json_is_object(o)) {
		json_decref(o);
		return -EINVAL;
	}
	v = json_object_get(o, S3_SCOPE_CONF);
	if (v) {
		if (json_is_string(v) && key_name_ok(json_string_value(v), json_string_length(v))) {
			snprintf(key, S3_SCOPE_KEY_MAX + 1, "%s", json_string_value(v));
			rc = 1;
		} else {
			rc = -EINVAL;
		}
	}
	json_decref(o);
	return rc;
}

int s3_scope_check_decl(const json_t *v, const char *const *nonfilter, size_t nnf, char *err,
			size_t errlen)
{
	const char *k;

	if (!json_is_string(v) || !key_name_ok(json_string_value(v), json_string_length(v))) {
		snprintf(err, errlen, "tag '%s' names the index's scope: a metadata key of 1 to "
			 "%d characters", S3_SCOPE_TAG, S3_SCOPE_KEY_MAX);
		return -EINVAL;
	}
	k = json_string_value(v);
	if (k[0] == '$') {
		snprintf(err, errlen, "tag '%s': '%s' cannot be a metadata key (filter operators "
			 "start with '$')", S3_SCOPE_TAG, k);
		return -EINVAL;
	}
	for (size_t i = 0; i < nnf; i++)
		if (!strcmp(nonfilter[i], k)) {
			snprintf(err, errlen, "tag '%s': the scope key '%s' must be filterable, but "
				 "it is listed in nonFilterableMetadataKeys", S3_SCOPE_TAG, k);
			return -EINVAL;
		}
	return 0;
}

int s3_scope_value(const void *fmeta, size_t len, const char *key, const char **val,
		   uint32_t *vlen)
{
	return s3_fmeta_string(fmeta, len, key, val, vlen);
}

uint64_t s3_scope_label(const char *val, size_t len)
{
	uint64_t h = dm_fnv1a64(DM_FNV64_INIT, val, len);

	h ^= h >> 31;
	h *= 0x7fb5d329728ea185ull;
	h ^= h >> 27;
	return h ? h : 1;
}

/* A pin in one filter object (an implicit AND of its entries) or below its "$and"s. */
static int pin_obj(const json_t *f, const char *key, int depth, char **val, size_t *vlen)
{
	const char *k;
	json_t *v;

	if (depth > S3_FILTER_MAX_DEPTH || !json_is_object(f))
		return 0;
	json_object_foreach((json_t *)f, k, v) {
		const json_t *s = NULL;

		if (!strcmp(k, "$and") && json_is_array(v)) {
			size_t i;
			json_t *e;

			json_array_foreach(v, i, e) {
				int rc = pin_obj(e, key, depth + 1, val, vlen);

				if (rc)
					return rc;
			}
			continue;
		}
		if (strcmp(k, key))
			continue;
		if (json_is_string(v))
			s = v;
		else if (json_is_object(v) && json_is_string(json_object_get(v, "$eq")))
			s = json_object_get(v, "$eq");
		if (!s)
			continue;
		*vlen = json_string_length(s);
		*val = malloc(*vlen + 1);
		if (!*val)
			return -ENOMEM;
		memcpy(*val, json_string_value(s), *vlen);
		(*val)[*vlen] = 0;
		return 1;
	}
	return 0;
}

int s3_scope_pin(const json_t *filter, const char *key, char **val, size_t *vlen)
{
	*val = NULL;
	*vlen = 0;
	if (!filter || !key || !key[0])
		return 0;
	return pin_obj(filter, key, 0, val, vlen);
}

/* ---- the flat store's hooks ---- */

static char *ops_conf_key(const void *conf, uint32_t conf_len)
{
	char key[S3_SCOPE_KEY_MAX + 1];

	return s3_scope_conf_key(conf, conf_len, key) == 1 ? strdup(key) : NULL;
}

static uint64_t ops_label(const char *key, const void *fmeta, uint32_t fmeta_len)
{
	const char *v;
	uint32_t vl;

	return s3_scope_value(fmeta, fmeta_len, key, &v, &vl) == 1 ? s3_scope_label(v, vl) : 0;
}

const struct flat_scope_ops s3_scope_ops = { .conf_key = ops_conf_key, .label = ops_label };
