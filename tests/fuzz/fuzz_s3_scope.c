/* fuzz_s3_scope.c: libFuzzer target for the parsers of scoped retrieval
 * (common/index/s3_scope.c). The input is read three ways: as an index configuration
 * (s3_scope_conf_key), as encoded filterable metadata (s3_scope_value, any bytes), and as a
 * JSON filter (s3_scope_pin on key "tenant"). A pin must be sound: when the filter pins the
 * value v, a row whose tenant is another string, or that has no tenant, must not match the
 * filter (a scoped query leaves those rows' fragments out). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "s3_filter.h"
#include "s3_scope.h"

/* Does a row with metadata m (a JSON object, consumed) match filter f? */
static bool row_matches(const struct s3_filter *f, json_t *m)
{
	char *js = NULL;
	uint8_t *fm = NULL;
	size_t jl = 0, fl = 0;
	bool hit = false;

	if (m && !s3_meta_encode(m, NULL, 0, &js, &jl, &fm, &fl, NULL, 0))
		hit = s3_filter_match(f, fm, fl);
	free(js);
	free(fm);
	json_decref(m);
	return hit;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char key[S3_SCOPE_KEY_MAX + 1];
	const char *v;
	uint32_t vl;
	int rc;

	/* configuration and metadata: any bytes */
	rc = s3_scope_conf_key(data, (uint32_t)size, key);
	if (rc == 1 && (!key[0] || strlen(key) > S3_SCOPE_KEY_MAX))
		abort();
	rc = s3_scope_value(data, size, "tenant", &v, &vl);
	if (rc == 1 && ((const uint8_t *)v < data || (const uint8_t *)v + vl > data + size))
		abort();
	(void)s3_scope_label((const char *)data, size);

	/* a filter */
	json_t *flt = json_loadb((const char *)data, size, 0, NULL);
	char *val = NULL;
	size_t len = 0;

	if (!flt)
		return 0;
	rc = s3_scope_pin(flt, "tenant", &val, &len);
	if (rc == 1) {
		struct s3_filter *f = s3_filter_parse(flt, NULL, 0, NULL, 0);

		if (!val || val[len])
			abort();
		if (f) {
			char *other = malloc(len + 2);

			if (other) {
				memcpy(other, val, len);
				other[len] = 'x';       /* another string: never equal to val */
				other[len + 1] = 0;
				if (row_matches(f, json_pack("{s:s%}", "tenant", other, len + 1)))
					abort();
				if (row_matches(f, json_pack("{s:i}", "other", 1)))
					abort();
				free(other);
			}
			s3_filter_free(f);
		}
	} else if (rc != 0 && rc != -ENOMEM) {
		abort();
	}
	free(val);
	json_decref(flt);
	return 0;
}
