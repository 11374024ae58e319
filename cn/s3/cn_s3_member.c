/* cn_s3_member.c: the member side of the distributed exact scan: a ScanShare sub-request
 * (from the ingress, over HTTP or in-process) names an index state and a share of its
 * fragments; the member brings each fragment of the share up to that state in its
 * fragment cache (fetched from the MN in pieces, FL_FRAG), scans it exactly with the
 * filter and answers its partial top-k list. */
#include "cn_s3_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "distance.h"
#include "flat.h"
#include "s3_filter.h"
#include "topk.h"
#include "util/dm_hash.h"

int mhit_cmp(const void *a, const void *b)
{
	const struct mhit *x = a, *y = b;

	if (x->dist != y->dist)
		return x->dist < y->dist ? -1 : 1;
	return x->gid < y->gid ? -1 : x->gid > y->gid;
}

static void mhits_free(struct mhit *h, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(h[i].key);
		free(h[i].meta);
	}
	free(h);
}

/* One piece of a fragment fetch: rows from f->rows on, at most s->frag_piece_bytes of
 * them (the MN always sends at least one row), and the tombstones of every row up to the
 * piece's end. f->fetch held. 0, -ESTALE (MN restarted / index re-created), -errno. */
static int fetch_piece(struct cn_s3 *s, struct s3_frag *f)
{
	struct dm_buf w = { 0 };
	uint8_t *resp = NULL;
	size_t rlen, bytes;
	uint32_t from = f->rows, rows;      /* f->rows changes only under f->fetch */
	int rc;

	dm_buf_str(&w, f->bucket);
	dm_buf_str(&w, f->index);
	dm_buf_u64(&w, f->epoch);
	dm_buf_u64(&w, (uint64_t)f->created);
	dm_buf_u64(&w, f->frag);
	dm_buf_u32(&w, from);
	dm_buf_u32(&w, MY_MSG);          /* our receive buffers: the answer's message size */
	dm_buf_u32(&w, s->frag_piece_bytes);
	rc = mn_call(s, f->mn, DM_OP_FL_FRAG, &w, &resp, &rlen);   /* frees w */
	if (rc)
		goto out;
	__atomic_add_fetch(&s->fetches, 1, __ATOMIC_RELAXED);
	struct dm_rbuf rb = { .p = resp, .n = rlen };
	const uint8_t *dead;

	rows = dm_rbuf_u32(&rb);
	dead = dm_rbuf_get(&rb, rows);
	if (rb.bad || rows < from || rows > (1u << 24)) {
		rc = -EBADMSG;
		goto out;
	}
	pthread_rwlock_wrlock(&f->rw);
	bytes = f->bytes;
	rc = s3_frag_reserve(f, rows);
	for (uint32_t r = from; !rc && r < rows; r++) {
		uint32_t kl, ml, fl;
		const char *k = dm_rbuf_bytes(&rb, &kl, FLAT_KEY_MAX);
		const uint8_t *m = dm_rbuf_bytes(&rb, &ml, DM_FL_MAX_STREAM);
		const uint8_t *fm = dm_rbuf_bytes(&rb, &fl, DM_FL_MAX_STREAM);
		const void *v = dm_rbuf_get(&rb, (size_t)f->dim * sizeof(float));
		float *dst = f->vec + (size_t)r * f->dim;

		if (rb.bad) {
			rc = -EBADMSG;
			break;
		}
		f->key[r] = strndup(k, kl);
		f->meta[r] = malloc((size_t)ml + fl + 1);
		if (!f->key[r] || !f->meta[r]) {
			free(f->key[r]);
			free(f->meta[r]);
			rc = -ENOMEM;
			break;
		}
		memcpy(f->meta[r], m, ml);
		memcpy(f->meta[r] + ml, fm, fl);
		f->mlen[r] = ml;
		f->flen[r] = fl;
		memcpy(dst, v, (size_t)f->dim * sizeof(float));
		f->norm2[r] = dm_dot(dst, dst, f->dim);
		bytes += (size_t)f->dim * sizeof(float) + kl + ml + fl + 64;
		f->rows = r + 1;
	}
	if (!rc) {
		uint32_t d = 0;

		for (uint32_t r = 0; r < rows; r++)
			d += (f->deadf[r] = dead[r] ? 1 : 0);
		f->dead = d;
	}
	pthread_rwlock_unlock(&f->rw);
	s3_fcache_account(s->cache, f, bytes);
out:
	free(resp);
	return rc;
}

/* Bring f up to at least the version in want (rows, dead): fetch the new rows and the
 * tombstones from the MN, in pieces. 0, -ESTALE (MN restarted / index re-created),
 * -EPROTO (the MN has fewer rows than its state said), -errno. */
static int cfrag_refresh(struct cn_s3 *s, struct s3_frag *f, const struct fstat *want)
{
	int rc = 0;

	pthread_mutex_lock(&f->fetch);
	for (;;) {
		uint32_t from;
		bool fresh;

		pthread_rwlock_rdlock(&f->rw);
		from = f->rows;
		fresh = f->rows >= want->rows && f->dead >= want->dead;
		pthread_rwlock_unlock(&f->rw);
		if (fresh)
			break;
		rc = fetch_piece(s, f);
		if (rc)
			break;
		/* No new row although some are missing: the MN contradicts its state. (Only
		 * tombstones newer than what f has: that piece brought them, loop ends.) */
		if (f->rows == from && f->rows < want->rows) {
			rc = -EPROTO;
			break;
		}
		if (f->rows == from)
			break;
	}
	pthread_mutex_unlock(&f->fetch);
	return rc;
}

int frag_get(struct cn_s3 *s, const struct ixstate *st, const char *b, const char *x,
	     uint64_t frag, struct s3_frag **out)
{
	struct s3_fkey key = { .mn = st->mn, .frag = frag, .bucket = b, .index = x,
			       .epoch = st->epoch, .created = st->created };
	struct s3_frag *f = s3_fcache_get(s->cache, &key, st->dim, NULL);
	int rc;

	*out = NULL;
	if (!f)
		return -errno;
	rc = cfrag_refresh(s, f, &st->fr[frag]);
	if (rc) {
		s3_fcache_put(s->cache, f);
		return rc;
	}
	*out = f;
	return 0;
}

/* The filter's cardinality estimate (docs/api.md "The graph path"): the share of a sample
 * of live rows that pass f. The sample is up to FSAMPLE_ROWS rows at hashed positions in up
 * to FSAMPLE_FRAGS fragments evenly spread over the index (the ingress's fragment cache holds
 * them after the first query: a sealed fragment is fetched once). *seen rows were looked
 * at, *passed of them passed. 0 or -errno (nothing counted then). */
#define FSAMPLE_FRAGS 4u
#define FSAMPLE_ROWS  1024u
int filter_sample(struct cn_s3 *s, const struct ixstate *st, const char *b, const char *x,
		  const struct s3_filter *flt, uint32_t *seen, uint32_t *passed)
{
	uint32_t nf = 0, frags[FSAMPLE_FRAGS];
	int rc = 0;

	*seen = *passed = 0;
	for (uint32_t i = 0; i < FSAMPLE_FRAGS && st->nfrag; i++) {
		uint32_t f = (uint32_t)(((uint64_t)st->nfrag * (2 * i + 1)) / (2 * FSAMPLE_FRAGS));

		if (st->fr[f].rows && (!nf || frags[nf - 1] != f))
			frags[nf++] = f;
	}
	for (uint32_t i = 0; i < nf; i++) {
		struct s3_frag *f;
		uint32_t rows, per;

		rc = frag_get(s, st, b, x, frags[i], &f);
		if (rc)
			break;
		pthread_rwlock_rdlock(&f->rw);
		rows = DM_MIN(f->rows, st->fr[frags[i]].rows);
		per = DM_MIN(rows, FSAMPLE_ROWS / nf);
		/* Rows at hashed positions (the same ones every time), not at a fixed stride:
		 * metadata that repeats with the row number (a category per row mod 10) would
		 * alias with a stride. A fragment sampled whole when it is small. */
		for (uint32_t j = 0; j < per; j++) {
			uint32_t r = per == rows ? j :
				(uint32_t)(dm_hash64((uint64_t)frags[i] << 32 | j) % rows);

			if (f->deadf[r])
				continue;
			(*seen)++;
			*passed += s3_filter_match(flt, f->meta[r] + f->mlen[r], f->flen[r]);
		}
		pthread_rwlock_unlock(&f->rw);
		s3_fcache_put(s->cache, f);
	}
	if (rc)
		*seen = *passed = 0;
	return rc;
}

/* A partitioned share's selection (cn_s3_part.c): the ingress's model and the regions
 * (ring positions) to scan. */
struct psel {
	uint64_t id;
	uint32_t k;
	uint8_t *sel;                    /* k flags */
};

/* Row r of fragment f against q: into tk when it is among the best so far and passes the
 * filter (id: its row id in the index state). */
static inline void scan_row(const struct ixstate *st, const struct s3_qspec *q, float qn,
			    const struct s3_frag *f, uint32_t r, uint64_t id, struct dm_topk *tk)
{
	const float *v = f->vec + (size_t)r * st->dim;
	float d;

	if (st->metric == DM_METRIC_COS) {
		float den = qn * sqrtf(f->norm2[r]);

		d = den > 0 ? 1.0f - dm_dot(q->vec, v, st->dim) / den : 1.0f;
	} else {
		d = dm_l2sq(q->vec, v, st->dim);
	}
	if (tk->n == tk->k && !(d < dm_topk_bound(tk)))
		return;
	if (q->filter && !s3_filter_match(q->filter, f->meta[r] + f->mlen[r], f->flen[r]))
		return;
	dm_topk_push(tk, d, id);
}

/* Scan the fragments frags[0..nf) of an index state for q: partial top-k into *out; with
 * ps, only the rows of the chosen regions when this CN's model is the ingress's (else
 * every row, counted as a mismatch). */
static int member_scan(struct cn_s3 *s, const struct ixstate *st, const char *b,
		       const char *x, const uint64_t *frags, size_t nf,
		       const struct s3_qspec *q, const struct psel *ps, struct mhit **out,
		       size_t *nout)
{
	struct s3_part *pm = NULL;
	uint64_t scanned = 0, skipped = 0, srows = 0, sother = 0;
	struct dm_topk *tk = dm_topk_new(q->k);
	struct s3_frag **held = calloc(nf ? nf : 1, sizeof(*held));
	float qn = sqrtf(dm_dot(q->vec, q->vec, st->dim));
	struct dm_hit *hits = NULL;
	struct mhit *res = NULL;
	size_t nh = 0;
	int rc = 0;

	*out = NULL;
	*nout = 0;
	if (!tk || !held) {
		rc = -ENOMEM;
		goto out;
	}
	if (ps && (part_get(s, st, b, x, &pm) || part_id(pm) != ps->id ||
		   part_regions(pm) != ps->k)) {
		__atomic_add_fetch(&s->part_mismatch, 1, __ATOMIC_RELAXED);
		part_put(s, pm);
		pm = NULL;
	}
	for (size_t i = 0; i < nf && !rc; i++) {
		struct s3_frag *f;
		const uint8_t *sel = NULL;
		uint32_t labelled = 0;

		if (frags[i] >= st->nfrag) {
			rc = -EINVAL;
			break;
		}
		rc = frag_get(s, st, b, x, frags[i], &held[i]);
		if (rc)
			break;
		f = held[i];
		pthread_rwlock_rdlock(&f->rw);
		if (pm && (f->part_id != part_id(pm) || f->part_rows < f->rows)) {
			pthread_rwlock_unlock(&f->rw);
			pthread_rwlock_wrlock(&f->rw);
			rc = part_label(pm, f, f->rows);
			pthread_rwlock_unlock(&f->rw);
			if (rc)
				break;
			pthread_rwlock_rdlock(&f->rw);
		}
		if (pm && f->part_id == part_id(pm) && f->pk == ps->k) {
			sel = ps->sel;
			labelled = f->part_rows;
		}
		uint32_t from = st->fr[frags[i]].from;

		/* Partitioned: the labelled rows of the chosen regions only, region by region
		 * (the rows of the others are counted, their vectors not read), then the rows
		 * labelled since (a growing tail) one by one. */
		for (uint32_t g = 0; sel && g < f->pk; g++) {
			for (uint32_t j = f->pstart[g]; j < f->pstart[g + 1]; j++) {
				uint32_t r = f->porder[j];

				if (r < from || f->deadf[r])
					continue;
				if (!sel[g]) {
					skipped++;
					continue;
				}
				scanned++;
				scan_row(st, q, qn, f, r, frags[i] * st->frag_rows + r, tk);
			}
		}
		for (uint32_t r = DM_MAX(from, labelled); r < f->rows; r++) {
			if (f->deadf[r])
				continue;
			scanned++;
			if (q->scoped) {
				/* a scoped query reads its scope value's rows only: checked
				 * (a filtered query is never partitioned, so only here) */
				srows++;
				sother += scope_row_other(q, f->meta[r] + f->mlen[r], f->flen[r]);
			}
			scan_row(st, q, qn, f, r, frags[i] * st->frag_rows + r, tk);
		}
		pthread_rwlock_unlock(&f->rw);
	}
	if (rc)
		goto out;
	hits = malloc(q->k * sizeof(*hits));
	res = calloc(q->k, sizeof(*res));
	if (!hits || !res) {
		rc = -ENOMEM;
		goto out;
	}
	nh = dm_topk_drain(tk, hits);
	for (size_t i = 0; i < nh; i++) {
		uint64_t fr = hits[i].id / st->frag_rows;
		uint32_t r = (uint32_t)(hits[i].id % st->frag_rows);
		struct s3_frag *f = NULL;

		for (size_t j = 0; j < nf; j++)
			if (frags[j] == fr)
				f = held[j];
		if (!f) {
			rc = -EINVAL;
			break;
		}
		pthread_rwlock_rdlock(&f->rw);
		res[i].dist = hits[i].dist;
		res[i].gid = hits[i].id;
		res[i].key = strdup(f->key[r]);
		if (q->ret_meta)
			res[i].meta = strndup(f->meta[r], f->mlen[r]);
		pthread_rwlock_unlock(&f->rw);
		if (!res[i].key || (q->ret_meta && !res[i].meta))
			rc = -ENOMEM;
	}
	if (rc) {
		mhits_free(res, nh);
		res = NULL;
		nh = 0;
	}
	*out = res;
	*nout = nh;
	res = NULL;
out:
	__atomic_add_fetch(&s->scan_rows, scanned, __ATOMIC_RELAXED);
	__atomic_add_fetch(&s->scan_skipped, skipped, __ATOMIC_RELAXED);
	__atomic_add_fetch(&s->scope_rows, srows, __ATOMIC_RELAXED);
	__atomic_add_fetch(&s->scope_other_rows, sother, __ATOMIC_RELAXED);
	part_put(s, pm);
	for (size_t i = 0; held && i < nf; i++)
		if (held[i])
			s3_fcache_put(s->cache, held[i]);
	free(held);
	free(hits);
	free(res);
	dm_topk_free(tk);
	return rc;
}

void json_resp(struct s3_resp *r, json_t *o)
{
	memset(r, 0, sizeof(*r));
	r->status = 200;
	r->body = json_dumps(o, JSON_OUT);
	r->len = r->body ? strlen(r->body) : 0;
	json_decref(o);
	if (!r->body)
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
}

/* Member side of a sub-request (also run locally by the ingress): parse, scan, answer
 * {"h": [[dist, gid, key, meta?], ...]}. */
void be_internal(void *ctx, const char *op, const char *body, size_t len,
			struct s3_resp *r)
{
	struct cn_s3 *s = ctx;
	struct ixstate st = { 0 };
	struct s3_qspec q;
	json_t *o = len ? json_loadb(body, len, 0, NULL) : NULL, *fa, *e;
	const char *b, *x, *ep, *cr, *qs, *conf;
	uint64_t *frags = NULL;
	struct mhit *hits = NULL;
	struct psel ps = { 0 };
	size_t nf, nh = 0, i, qlen, clen;
	int mn, dim, metric, fr, rc;

	memset(r, 0, sizeof(*r));
	if (!strcmp(op, "CacheClear")) {
		/* The online indexer changed graph records: drop this node's cached copies. */
		if (s->gops && s->gops->cache_clear)
			s->gops->cache_clear(s->gctx);
		json_resp(r, json_object());
		goto out;
	}
	if (strcmp(op, "ScanShare")) {
		s3_resp_error(r, 404, "UnknownOperationException", "unknown internal operation");
		goto out;
	}
	if (!o || json_unpack(o, "{s:s, s:s, s:i, s:s, s:s, s:i, s:i, s:s%, s:i, s:o, s:s%}",
			      "b", &b, "x", &x, "mn", &mn, "epoch", &ep, "created", &cr,
			      "dim", &dim, "metric", &metric, "conf", &conf, &clen, "fr", &fr,
			      "frags", &fa, "q", &qs, &qlen) ||
	    mn < 0 || (uint32_t)mn >= s->cfg->n_mn || dim < 1 || dim > FLAT_DIM_MAX || fr < 1 ||
	    (metric != DM_METRIC_L2 && metric != DM_METRIC_COS) || !json_is_array(fa) ||
	    strlen(b) >= NAME_MAX_ || strlen(x) >= NAME_MAX_) {
		s3_resp_error(r, 400, "ValidationException", "malformed ScanShare request");
		goto out;
	}
	st.mn = (uint32_t)mn;
	st.epoch = strtoull(ep, NULL, 10);
	st.created = strtoll(cr, NULL, 10);
	st.dim = (uint32_t)dim;
	st.metric = (uint32_t)metric;
	st.frag_rows = (uint32_t)fr;
	nf = json_array_size(fa);
	frags = calloc(nf ? nf : 1, sizeof(*frags));
	/* State entries only for the share's fragments: index them densely by fragment id. */
	uint64_t maxf = 0;

	json_array_foreach(fa, i, e) {
		json_int_t id = json_integer_value(json_array_get(e, 0));

		if (id < 0 || id > (1 << 24)) {
			s3_resp_error(r, 400, "ValidationException", "bad fragment id");
			goto out;
		}
		maxf = DM_MAX(maxf, (uint64_t)id + 1);
	}
	st.nfrag = (uint32_t)maxf;
	st.fr = calloc(maxf ? maxf : 1, sizeof(*st.fr));
	if (!frags || !st.fr) {
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
		goto out;
	}
	json_array_foreach(fa, i, e) {
		frags[i] = (uint64_t)json_integer_value(json_array_get(e, 0));
		st.fr[frags[i]].rows = (uint32_t)json_integer_value(json_array_get(e, 1));
		st.fr[frags[i]].dead = (uint32_t)json_integer_value(json_array_get(e, 2));
		/* optional 4th: the first row to scan (the graph path scans the tail only) */
		json_int_t from = json_integer_value(json_array_get(e, 3));

		st.fr[frags[i]].from = from > 0 && from <= fr ? (uint32_t)from : 0;
	}
	/* optional: a partitioned share ("vh": the model's id, "rk": its regions, "rg": the
	 * ring positions to scan) */
	json_t *vh = json_object_get(o, "vh"), *rg = json_object_get(o, "rg");
	json_int_t rk = json_integer_value(json_object_get(o, "rk"));

	if (vh || rg) {
		if (!json_is_string(vh) || !json_is_array(rg) || rk < 8 || rk > 4096 ||
		    json_array_size(rg) > (size_t)rk) {
			s3_resp_error(r, 400, "ValidationException", "malformed partition selection");
			goto out;
		}
		ps.id = strtoull(json_string_value(vh), NULL, 16);
		ps.k = (uint32_t)rk;
		ps.sel = calloc(ps.k, 1);
		if (!ps.sel) {
			s3_resp_error(r, 500, "InternalServerException", "out of memory");
			goto out;
		}
		json_array_foreach(rg, i, e) {
			json_int_t pos = json_integer_value(e);

			if (!json_is_integer(e) || pos < 0 || pos >= rk) {
				s3_resp_error(r, 400, "ValidationException", "bad region");
				goto out;
			}
			ps.sel[pos] = 1;
		}
	}
	struct s3_qindex qi = { .dim = st.dim, .metric = (enum dm_metric)st.metric,
				.conf = conf, .conf_len = (uint32_t)clen };

	rc = s3_api_qspec_parse(qs, qlen, s3_api_qresolve_fixed, &qi, &q, r);
	if (rc)
		goto out;
	uint64_t t0 = dm_now_ns();

	rc = member_scan(s, &st, b, x, frags, nf, &q, ps.sel ? &ps : NULL, &hits, &nh);
	s3_qspec_fini(&q);
	if (!rc)
		scan_time_note(s, dm_now_ns() - t0);
	if (rc) {
		bool again = rc == -ESTALE || rc == -EHOSTDOWN;   /* another replica may serve */

		s3_resp_error(r, again ? 503 : 500, again ?
			      "ServiceUnavailableException" : "InternalServerException",
			      "scan failed: %s", strerror(-rc));
		goto out;
	}
	json_t *ha = json_array();

	for (i = 0; i < nh; i++) {
		json_t *h = json_pack("[f,I,s]", (double)hits[i].dist, (json_int_t)hits[i].gid,
				      hits[i].key);

		if (hits[i].meta)
			json_array_append_new(h, json_string(hits[i].meta));
		json_array_append_new(ha, h);
	}
	json_resp(r, json_pack("{s:o}", "h", ha));
out:
	mhits_free(hits, nh);
	free(ps.sel);
	free(frags);
	free(st.fr);
	json_decref(o);
}

/* A sub-request from another CN (over HTTP). DMANN_S3_TEST_DELAY_MS (on the CNs named by
 * DMANN_S3_TEST_DELAY_CN) delays it: how the tests make a member slow to see it hedged. */
void be_internal_http(void *ctx, const char *op, const char *body, size_t len,
			     struct s3_resp *r)
{
	struct cn_s3 *s = ctx;

	if (s->test_delay_ms)
		usleep(s->test_delay_ms * 1000u);
	be_internal(ctx, op, body, len, r);
}
