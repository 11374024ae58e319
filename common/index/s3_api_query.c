/* s3_api_query.c: QueryVectors: the one request parser (s3_api_qspec_parse, used by the
 * local path and by the distributed path of cn/s3), preparation and batched execution over
 * a local flat store (one sgemm pass per index). */
#include "s3_api_int.h"
#include "s3_scope.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ---------------------------------------------------------------- queries ---------- */

void s3_query_free(struct s3_query *q)
{
	if (!q)
		return;
	flat_index_put(q->ix);
	free(q->vec);
	s3_filter_free(q->filter);
	free(q);
}

json_t *s3a_parse_body(const char *body, size_t len, struct s3_resp *r)
{
	json_error_t je;
	json_t *o;

	if (!len)
		return json_object();
	o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!o) {
		s3a_verr(r, "/", "Malformed JSON request body: %s (at byte %d)", je.text, je.position);
		return NULL;
	}
	if (!json_is_object(o)) {
		json_decref(o);
		s3a_verr(r, "/", "The request body must be a JSON object");
		return NULL;
	}
	return o;
}

void s3_qspec_fini(struct s3_qspec *q)
{
	free(q->vec);
	free(q->scope_val);
	s3_filter_free(q->filter);
	memset(q, 0, sizeof(*q));
}

/* The one QueryVectors parser (the local and the distributed path): topK, the flags, the
 * index named (resolve gives its description), the vector and the filter against it. */
static int qv_parse(json_t *o, s3_qresolve_fn resolve, void *ctx, struct s3_qspec *q,
		    struct s3_resp *r)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	struct s3_qindex in;
	long long k = 0;
	json_t *f;
	int rc;

	memset(q, 0, sizeof(*q));
	rc = s3a_get_int(r, o, "topK", 1, S3_TOPK_MAX, &k);
	if (rc < 0)
		goto err;
	if (!rc) {
		rc = s3a_verr(r, "/topK", "topK is required (1 to %d)", S3_TOPK_MAX);
		goto err;
	}
	q->k = (size_t)k;
	if (s3a_get_bool(r, o, "returnMetadata", &q->ret_meta) < 0 ||
	    s3a_get_bool(r, o, "returnDistance", &q->ret_dist) < 0) {
		rc = -EINVAL;
		goto err;
	}
	/* nextToken: every result (topK <= 100) comes in one page and no token is ever issued,
	 * so only an empty one (an initial request) is valid. */
	{
		const char *nt;

		rc = s3a_get_str(r, o, "nextToken", &nt);
		if (rc < 0)
			goto err;
		if (nt && nt[0]) {
			rc = s3a_verr(r, "/nextToken", "Invalid nextToken (QueryVectors returns every "
				      "result in one page)");
			goto err;
		}
	}
	if (!json_object_get(o, "queryVector")) {
		rc = s3a_verr(r, "/queryVector", "queryVector is required");
		goto err;
	}
	if (s3a_req_index(NULL, r, o, b, x)) {
		rc = -EINVAL;
		goto err;
	}
	rc = resolve(ctx, b, x, &in, r);
	if (rc)
		goto err;
	q->vec = malloc((in.dim ? in.dim : 1) * sizeof(float));
	if (!q->vec) {
		s3a_engine_err(r, -ENOMEM, "");
		rc = -ENOMEM;
		goto err;
	}
	rc = s3a_read_vector(r, json_object_get(o, "queryVector"), "/queryVector", in.dim,
			 in.metric == DM_METRIC_COS, q->vec);
	if (rc)
		goto err;
	f = json_object_get(o, "filter");
	if (f && !json_is_null(f)) {
		struct nfkeys nf;
		char err[256];

		s3a_nf_parse(in.conf, in.conf_len, &nf);
		q->filter = s3_filter_parse(f, nf.k, nf.n, err, sizeof(err));
		json_decref(nf.conf);
		if (!q->filter) {
			rc = errno == ENOMEM ? -ENOMEM : s3a_verr(r, "/filter", "Invalid filter: %s",
							      err);
			if (rc == -ENOMEM)
				s3a_engine_err(r, rc, "");
			goto err;
		}
		/* A scoped index: the value the filter pins its scope key to, if any. */
		if (s3_scope_conf_key(in.conf, in.conf_len, q->scope_key) == 1) {
			rc = s3_scope_pin(f, q->scope_key, &q->scope_val, &q->scope_vlen);
			if (rc < 0) {
				s3a_engine_err(r, rc, "");
				goto err;
			}
			q->scoped = rc == 1;
			if (q->scoped)
				q->scope_label = s3_scope_label(q->scope_val, q->scope_vlen);
		}
	}
	return 0;
err:
	s3_qspec_fini(q);
	return rc < 0 ? rc : -EINVAL;
}

int s3_api_qspec_parse(const char *body, size_t len, s3_qresolve_fn resolve, void *ctx,
		       struct s3_qspec *q, struct s3_resp *r)
{
	json_t *o;
	int rc;

	memset(q, 0, sizeof(*q));
	memset(r, 0, sizeof(*r));
	if (len > S3_MAX_PAYLOAD)
		return s3a_verr(r, "/", "The request payload exceeds %u bytes", S3_MAX_PAYLOAD);
	o = s3a_parse_body(body, len, r);
	if (!o)
		return -EINVAL;
	rc = qv_parse(o, resolve, ctx, q, r);
	json_decref(o);
	return rc;
}

int s3_api_qresolve_fixed(void *ctx, const char *bucket, const char *index,
			  struct s3_qindex *out, struct s3_resp *r)
{
	(void)bucket;
	(void)index;
	(void)r;
	*out = *(const struct s3_qindex *)ctx;
	return 0;
}

/* The local resolver: open the index in this process's store (kept in the query). */
struct local_q {
	struct s3_api *a;
	struct flat_index *ix;
};

static int resolve_local(void *ctx, const char *b, const char *x, struct s3_qindex *out,
			 struct s3_resp *r)
{
	struct local_q *lq = ctx;
	const struct flat_index_info *in;

	lq->ix = flat_index_get(lq->a->store, b, x);
	if (!lq->ix) {
		s3a_engine_err(r, -ENOENT, flat_bucket_get(lq->a->store, b, NULL) ? "vector bucket" :
			   "index");
		return -ENOENT;
	}
	in = flat_index_info(lq->ix);
	*out = (struct s3_qindex){ .dim = in->dim, .metric = in->metric, .conf = in->conf,
				   .conf_len = in->conf_len };
	return 0;
}

/* A local query from a parsed body: the one parser with the local resolver. */
static int prepare(struct s3_api *a, json_t *o, struct s3_query **q, struct s3_resp *r)
{
	struct local_q lq = { .a = a };
	struct s3_qspec spec;
	int rc;

	*q = NULL;
	rc = qv_parse(o, resolve_local, &lq, &spec, r);
	if (rc) {
		flat_index_put(lq.ix);
		return rc;
	}
	*q = calloc(1, sizeof(**q));
	if (!*q) {
		flat_index_put(lq.ix);
		s3_qspec_fini(&spec);
		s3a_engine_err(r, -ENOMEM, "");
		return -ENOMEM;
	}
	**q = (struct s3_query){ .ix = lq.ix, .vec = spec.vec, .k = spec.k,
				 .filter = spec.filter, .ret_meta = spec.ret_meta,
				 .ret_dist = spec.ret_dist,
				 .scoped = spec.scoped && flat_index_scoped(lq.ix),
				 .scope = spec.scope_label };
	free(spec.scope_val);
	return 0;
}

int s3_api_query_prepare(struct s3_api *a, const char *body, size_t len, struct s3_query **q,
			 struct s3_resp *r)
{
	json_t *o = s3a_parse_body(body, len, r);
	int rc;

	*q = NULL;
	if (!o)
		return -EINVAL;
	rc = prepare(a, o, q, r);
	json_decref(o);
	return rc;
}

static bool match_cb(void *ctx, const void *fmeta, uint32_t len)
{
	return s3_filter_match(ctx, fmeta, len);
}

struct qres {
	json_t *arr;
	const struct dm_hit *hits;
	size_t n, at;
	bool meta, dist, l2;
};

static int collect_hit(void *ctx, const struct flat_row *row)
{
	struct qres *q = ctx;
	json_t *o = json_pack("{s:s}", "key", row->key);

	/* flat_get_ids walks ids in order, skipping rows deleted since the scan. */
	while (q->at < q->n && q->hits[q->at].id != row->id)
		q->at++;
	if (q->dist && q->at < q->n) {
		double d = q->hits[q->at].dist;

		json_object_set_new(o, "distance", json_real(q->l2 ? sqrt(d) : d));
	}
	if (q->meta) {
		json_t *m = row->meta_len ? json_loadb(row->meta, row->meta_len, 0, NULL) : NULL;

		json_object_set_new(o, "metadata", m ? m : json_object());
	}
	json_array_append_new(q->arr, o);
	return 0;
}

void s3_api_query_run(struct s3_api *a, struct s3_query **qs, size_t n, struct s3_resp *rs)
{
	bool *done = calloc(n, sizeof(bool));

	(void)a;
	if (!done) {
		for (size_t i = 0; i < n; i++) {
			s3a_engine_err(&rs[i], -ENOMEM, "");
			s3_query_free(qs[i]);
		}
		return;
	}
	/* Group queries by index (and scope): one scan (one sgemm per fragment) per group. */
	for (size_t i = 0; i < n; i++) {
		struct flat_index *ix = qs[i]->ix;
		const struct flat_index_info *in = flat_index_info(ix);
		size_t g = 0, kmax = 0, *gi, *nout;
		float *qv;
		void **mctx;
		struct dm_hit *hits;
		int rc;

		if (done[i])
			continue;
		gi = malloc(n * sizeof(size_t));
		for (size_t j = i; gi && j < n; j++)
			if (!done[j] && qs[j]->ix == ix && qs[j]->scoped == qs[i]->scoped &&
			    qs[j]->scope == qs[i]->scope) {
				gi[g++] = j;
				kmax = DM_MAX(kmax, qs[j]->k);
			}
		qv = gi ? malloc(g * in->dim * sizeof(float)) : NULL;
		mctx = calloc(g ? g : 1, sizeof(void *));
		nout = calloc(g ? g : 1, sizeof(size_t));
		hits = malloc((g ? g : 1) * kmax * sizeof(*hits));
		if (!gi || !qv || !mctx || !nout || !hits) {
			rc = -ENOMEM;
		} else {
			for (size_t t = 0; t < g; t++) {
				memcpy(qv + t * in->dim, qs[gi[t]]->vec, in->dim * sizeof(float));
				mctx[t] = qs[gi[t]]->filter;
			}
			struct flat_scan sc = { .q = qv, .nq = g, .k = kmax, .match = match_cb,
						.match_ctx = mctx, .scoped = qs[i]->scoped,
						.scope = qs[i]->scope };

			rc = flat_search(ix, &sc, hits, nout);
		}
		for (size_t t = 0; gi && t < g; t++) {
			struct s3_query *q = qs[gi[t]];
			struct s3_resp *r = &rs[gi[t]];

			done[gi[t]] = true;
			if (rc) {
				s3a_engine_err(r, rc, "index");
				continue;
			}
			size_t nh = DM_MIN(nout[t], q->k);
			uint64_t *ids = malloc((nh ? nh : 1) * sizeof(uint64_t));
			struct qres qr = { .arr = json_array(), .hits = hits + t * kmax, .n = nh,
					   .meta = q->ret_meta, .dist = q->ret_dist,
					   .l2 = in->metric == DM_METRIC_L2 };

			if (!ids) {
				json_decref(qr.arr);
				s3a_engine_err(r, -ENOMEM, "");
				continue;
			}
			for (size_t h = 0; h < nh; h++)
				ids[h] = qr.hits[h].id;
			flat_get_ids(ix, ids, nh, collect_hit, &qr);
			free(ids);
			s3a_ok(r, json_pack("{s:o, s:s}", "vectors", qr.arr, "distanceMetric",
					in->metric == DM_METRIC_COS ? "cosine" : "euclidean"));
		}
		if (!gi) {
			done[i] = true;
			s3a_engine_err(&rs[i], -ENOMEM, "");
		}
		free(gi);
		free(qv);
		free(mctx);
		free(nout);
		free(hits);
	}
	for (size_t i = 0; i < n; i++)
		s3_query_free(qs[i]);
	free(done);
}

void s3a_op_query_vectors(struct s3_api *a, json_t *o, struct s3_resp *r)
{
	struct s3_query *q;

	if (prepare(a, o, &q, r))
		return;
	s3_api_query_run(a, &q, 1, r);
}
