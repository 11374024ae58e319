/* cn_s3_catalog.c: catalog listings that span the memory nodes: ListVectorBuckets asks
 * every MN for its buckets and merges the pages by name (replicas' duplicates dropped,
 * cut at maxResults, with the single-store nextToken format). */
#include "cn_s3_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ListVectorBuckets: every MN lists its buckets; merge by name. */
void list_buckets(struct cn_s3 *s, const char *body, size_t len, struct s3_resp *r)
{
	json_t *all = json_array(), *req = len ? json_loadb(body, len, 0, NULL) : NULL;
	long long max = 100;
	bool more = false;
	json_t *mr = json_object_get(req, "maxResults");

	if (json_is_integer(mr))
		max = json_integer_value(mr);
	for (uint32_t mn = 0; mn < s->cfg->n_mn; mn++) {
		struct s3_resp one;
		json_t *o, *arr, *e;
		size_t i;
		int rc = mn_s3(s, mn, "ListVectorBuckets", body, len, &one);

		if (rc) {
			s3_resp_free(&one);
			json_decref(all);
			json_decref(req);
			unavailable(r, "ListVectorBuckets", mn);
			return;
		}
		if (one.status != 200) {          /* validation: every MN says the same */
			json_decref(all);
			json_decref(req);
			*r = one;
			return;
		}
		o = json_loadb(one.body, one.len, 0, NULL);
		s3_resp_free(&one);
		arr = json_object_get(o, "vectorBuckets");
		json_array_foreach(arr, i, e)
			json_array_append(all, e);
		if (json_object_get(o, "nextToken"))
			more = true;
		json_decref(o);
	}
	/* Sort by name, drop replicas' duplicates, cut at maxResults. */
	size_t n = json_array_size(all);
	json_t **v = calloc(n ? n : 1, sizeof(*v));
	json_t *out = json_array();
	const char *last = NULL;

	for (size_t i = 0; v && i < n; i++)
		v[i] = json_array_get(all, i);
	for (size_t i = 1; v && i < n; i++)       /* insertion sort: pages are small */
		for (size_t j = i; j > 0; j--) {
			const char *a = json_string_value(json_object_get(v[j - 1], "vectorBucketName"));
			const char *b = json_string_value(json_object_get(v[j], "vectorBucketName"));

			if (!a || !b || strcmp(a, b) <= 0)
				break;
			json_t *t = v[j - 1];

			v[j - 1] = v[j];
			v[j] = t;
		}
	for (size_t i = 0; v && i < n; i++) {
		const char *nm = json_string_value(json_object_get(v[i], "vectorBucketName"));

		if (!nm || (last && !strcmp(last, nm)))
			continue;
		if ((long long)json_array_size(out) == max) {
			more = true;
			break;
		}
		json_array_append(out, v[i]);
		last = nm;
	}
	json_t *resp = json_pack("{s:o}", "vectorBuckets", out);

	if (more && last) {
		char plain[NAME_MAX_ + 8], *t;

		snprintf(plain, sizeof(plain), "b:%s", last);   /* s3_api's bucket token */
		t = s3_api_token(plain);

		if (t)
			json_object_set_new(resp, "nextToken", json_string(t));
		free(t);
	}
	memset(r, 0, sizeof(*r));
	r->status = 200;
	r->body = json_dumps(resp, JSON_OUT);
	r->len = r->body ? strlen(r->body) : 0;
	json_decref(resp);
	free(v);
	json_decref(all);
	json_decref(req);
}
