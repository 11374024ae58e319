/* cn_s3_catalog.c: catalog listings that span the memory nodes: ListVectorBuckets asks
 * every MN for its buckets and merges the pages by name (replicas' duplicates dropped,
 * the shards of buckets ("B#s", s3_api.h) hidden, cut at maxResults, with the
 * single-store nextToken format). */
#include "cn_s3_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int name_cmp(const void *a, const void *b)
{
	const char *x = json_string_value(json_object_get(*(json_t *const *)a, "vectorBucketName"));
	const char *y = json_string_value(json_object_get(*(json_t *const *)b, "vectorBucketName"));

	return strcmp(x ? x : "", y ? y : "");
}

/* One round: every MN lists up to max buckets (body: the request of this round); their
 * entries into all, *more set when an MN has more. 0, or with r filled (an MN's
 * validation error or unavailable) -1. */
static int list_round(struct cn_s3 *s, const char *body, size_t len, json_t *all, bool *more,
		      struct s3_resp *r)
{
	for (uint32_t mn = 0; mn < s->cfg->n_mn; mn++) {
		struct s3_resp one;
		json_t *o, *e;
		size_t i;
		int rc = mn_s3(s, mn, "ListVectorBuckets", body, len, &one);

		if (rc) {
			s3_resp_free(&one);
			unavailable(r, "ListVectorBuckets", mn);
			return -1;
		}
		if (one.status != 200) {          /* validation: every MN says the same */
			*r = one;
			return -1;
		}
		o = json_loadb(one.body, one.len, 0, NULL);
		s3_resp_free(&one);
		json_array_foreach(json_object_get(o, "vectorBuckets"), i, e)
			if (json_is_string(json_object_get(e, "vectorBucketName")))
				json_array_append(all, e);
		if (json_object_get(o, "nextToken"))
			*more = true;
		json_decref(o);
	}
	return 0;
}

/* ListVectorBuckets: every MN lists its buckets; merge by name. The first max names of
 * the union of the MNs' pages (each at most max long) are every name up to the last of
 * them; shard buckets among them are skipped, and another round after the last one
 * fills the page when they left it short. */
void list_buckets(struct cn_s3 *s, const char *body, size_t len, struct s3_resp *r)
{
	json_t *req = len ? json_loadb(body, len, 0, NULL) : NULL, *out = json_array();
	json_t *mr = json_object_get(req, "maxResults");
	long long max = json_is_integer(mr) ? json_integer_value(mr) : S3_LIST_CATALOG_DEFAULT;
	char last[NAME_MAX_ + 8] = "", *rbody = NULL;
	bool more = false, full = false;

	memset(r, 0, sizeof(*r));
	if (!json_is_object(req)) {
		json_decref(req);
		req = json_object();
	}
	for (int round = 0; !full; round++) {
		json_t *all = json_array(), **v;
		size_t n, considered;
		const char *prev = NULL;
		int rc;

		more = false;
		if (round) {
			char plain[NAME_MAX_ + 8], *t;

			snprintf(plain, sizeof(plain), "b:%s", last);   /* s3_api's bucket token */
			t = s3_api_token(plain);
			json_object_set_new(req, "nextToken", t ? json_string(t) : json_null());
			free(t);
			free(rbody);
			rbody = json_dumps(req, JSON_COMPACT);
		}
		rc = rbody || !round ? list_round(s, round ? rbody : body, round ? strlen(rbody) : len,
						 all, &more, r) : -1;
		if (rc && !r->status)
			s3_resp_error(r, 500, "InternalServerException", "out of memory");
		n = json_array_size(all);
		v = calloc(n ? n : 1, sizeof(*v));
		if (rc || !v) {
			if (!rc)
				s3_resp_error(r, 500, "InternalServerException", "out of memory");
			free(v);
			json_decref(all);
			goto out_err;
		}
		for (size_t i = 0; i < n; i++)
			v[i] = json_array_get(all, i);
		qsort(v, n, sizeof(*v), name_cmp);
		considered = 0;
		for (size_t i = 0; i < n; i++) {
			const char *nm = json_string_value(json_object_get(v[i], "vectorBucketName"));

			if (prev && !strcmp(prev, nm))
				continue;                 /* another replica's entry */
			if ((long long)considered == max || (long long)json_array_size(out) == max) {
				more = true;
				break;
			}
			prev = nm;
			considered++;
			snprintf(last, sizeof(last), "%s", nm);
			if (!s3_is_shard_name(nm))
				json_array_append(out, v[i]);
		}
		full = (long long)json_array_size(out) == max || !more || !considered;
		free(v);
		json_decref(all);
	}
	json_t *resp = json_pack("{s:o}", "vectorBuckets", out);

	out = NULL;
	if (more && last[0]) {
		char plain[NAME_MAX_ + 8], *t;

		snprintf(plain, sizeof(plain), "b:%s", last);
		t = s3_api_token(plain);
		if (t)
			json_object_set_new(resp, "nextToken", json_string(t));
		free(t);
	}
	r->status = 200;
	r->body = json_dumps(resp, JSON_OUT);
	r->len = r->body ? strlen(r->body) : 0;
	json_decref(resp);
out_err:
	json_decref(out);
	json_decref(req);
	free(rbody);
}
