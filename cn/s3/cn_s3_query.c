/* cn_s3_query.c: the ingress of QueryVectors on a compute node: the request is parsed by
 * the one QueryVectors parser (s3_api) against the index state read from a memory node;
 * the plan (s3_plan) picks W members of a replica group and their fragment shares; the
 * shares are fanned out as sub-requests (this CN's own share scanned in-process), a slow
 * member hedged to another group after hedge_ms, a failed one retried once elsewhere; the
 * members' partial top-k lists are merged into the answer. */
#include "cn_s3_int.h"

#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flat.h"
#include "placement.h"
#include "s3_plan.h"
#include "util/dm_hash.h"

/* Note one query of index id; returns its arrival rate (queries/s, decaying over ~1 s). */
static double rate_note(struct cn_s3 *s, uint64_t id)
{
	struct ixrate *e = &s->rate[id % DM_ARRAY_SIZE(s->rate)];
	uint64_t now = dm_now_ns();
	double q;

	pthread_mutex_lock(&s->rmu);
	if (e->id != id) {
		*e = (struct ixrate){ .id = id, .last_ns = now };
	} else {
		double dt = (double)(now - e->last_ns) * 1e-9;

		e->qps *= exp(-dt);              /* tau = 1 s: qps = sum of exp(-age) */
		e->last_ns = now;
	}
	e->qps += 1.0;
	q = e->qps;
	pthread_mutex_unlock(&s->rmu);
	return q;
}

void scan_time_note(struct cn_s3 *s, uint64_t ns)
{
	pthread_mutex_lock(&s->rmu);
	s->scan_ns = s->scan_ns > 0 ? 0.9 * s->scan_ns + 0.1 * (double)ns : (double)ns;
	pthread_mutex_unlock(&s->rmu);
}

/* Sub-request body (JSON): the index state the ingress read, the share and the original
 * request; extra (may be NULL): more fields (a partitioned scan's selection). */
static char *subreq_json(const struct ixstate *st, const char *b, const char *x,
			 const uint64_t *frags, size_t nf, const char *body, size_t len,
			 json_t *extra)
{
	json_t *fa = json_array(), *o;
	char *out;

	for (size_t i = 0; i < nf; i++)
		json_array_append_new(fa, json_pack("[I,i,i,i]", (json_int_t)frags[i],
						    (int)st->fr[frags[i]].rows,
						    (int)st->fr[frags[i]].dead,
						    (int)st->fr[frags[i]].from));
	o = json_pack("{s:s, s:s, s:i, s:s, s:s, s:i, s:i, s:s%, s:i, s:o, s:s%}",
		      "b", b, "x", x, "mn", (int)st->mn,
		      "epoch", "", "created", "", "dim", (int)st->dim, "metric", (int)st->metric,
		      "conf", st->conf, (size_t)st->conf_len, "fr", (int)st->frag_rows,
		      "frags", fa, "q", body ? body : "", body ? len : 0);
	if (!o)
		return NULL;
	/* 64-bit values as decimal strings (JSON numbers lose precision past 2^53). */
	char num[32];

	snprintf(num, sizeof(num), "%llu", (unsigned long long)st->epoch);
	json_object_set_new(o, "epoch", json_string(num));
	snprintf(num, sizeof(num), "%lld", (long long)st->created);
	json_object_set_new(o, "created", json_string(num));
	if (extra && json_object_update(o, extra)) {
		json_decref(o);
		return NULL;
	}
	out = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return out;
}

struct share {
	uint64_t *frags;
	size_t nf;
	char *req;                       /* sub-request JSON */
	bool have;
	struct s3_resp resp;             /* the answer that won */
	uint32_t tries;                  /* sub-requests sent for it */
	uint64_t t0;
};

static bool cn_up(struct cn_s3 *s, uint32_t cn)
{
	return cn == s->node->id ||
	       __atomic_load_n(&s->cn_down[cn], __ATOMIC_RELAXED) <= dm_now_ns();
}

/* Another CN for a share whose member (cur) is slow or failed: the member at the same
 * position in the next group, else any up CN not tried, else this CN. */
static uint32_t alt_cn(struct cn_s3 *s, const uint32_t *members, uint32_t w, int ngroups,
		       uint32_t g, uint32_t j, const bool *tried)
{
	for (int k = 1; k < ngroups; k++) {
		uint32_t c = members[((g + (uint32_t)k) % (uint32_t)ngroups) * w + j];

		if (!tried[c] && cn_up(s, c))
			return c;
	}
	for (uint32_t c = 0; c < s->cfg->n_cn; c++)
		if (!tried[c] && cn_up(s, c) && s->cfg->cn[c].http[0])
			return c;
	return s->node->id;
}

/* Merge the members' partial lists (and the graph path's hits gh[0..ngh)) into the
 * QueryVectors response: nearest first, one hit per key. */
static void merge_answer(const struct ixstate *st, const struct s3_qspec *q,
			 struct share *sh, uint32_t w, const struct mhit *gh, size_t ngh,
			 struct s3_resp *r)
{
	struct mhit *all = NULL;
	size_t n = 0, total = ngh, out = 0;
	json_t *arr = json_array(), *o, *e;
	size_t i, jj;

	/* Parse every list (kept alive until the answer is built), then gather the hits. */
	for (uint32_t j = 0; j < w; j++) {
		o = json_loadb(sh[j].resp.body, sh[j].resp.len, 0, NULL);
		total += json_array_size(json_object_get(o, "h"));
		json_array_append_new(arr, o ? o : json_null());
	}
	all = calloc(total ? total : 1, sizeof(*all));
	for (i = 0; all && i < ngh; i++)
		all[n++] = gh[i];
	json_array_foreach(arr, jj, o) {
		json_array_foreach(json_object_get(o, "h"), i, e) {
			if (!all)
				break;
			all[n].dist = (float)json_number_value(json_array_get(e, 0));
			all[n].gid = (uint64_t)json_integer_value(json_array_get(e, 1));
			all[n].key = (char *)json_string_value(json_array_get(e, 2));
			all[n].meta = (char *)json_string_value(json_array_get(e, 3));
			if (all[n].key)
				n++;
		}
	}
	if (n)
		qsort(all, n, sizeof(*all), mhit_cmp);
	json_t *vecs = json_array();

	for (i = 0; all && i < n && out < q->k; i++) {
		/* A key found by both the graph and the tail scan (re-put after the import) has
		 * the same current row in both: the first is kept. */
		bool dup = false;

		for (size_t p = 0; p < i && !dup; p++)
			dup = all[p].key && !strcmp(all[p].key, all[i].key);
		if (dup) {
			all[i].key = NULL;
			continue;
		}
		out++;
		json_t *v = json_pack("{s:s}", "key", all[i].key);

		if (q->ret_dist)
			json_object_set_new(v, "distance", json_real(st->metric == DM_METRIC_L2 ?
				sqrt((double)all[i].dist) : (double)all[i].dist));
		if (q->ret_meta) {
			json_t *m = all[i].meta && all[i].meta[0] ?
				json_loads(all[i].meta, 0, NULL) : NULL;

			json_object_set_new(v, "metadata", m ? m : json_object());
		}
		json_array_append_new(vecs, v);
	}
	json_resp(r, json_pack("{s:o, s:s}", "vectors", vecs, "distanceMetric",
			       st->metric == DM_METRIC_COS ? "cosine" : "euclidean"));
	free(all);
	json_decref(arr);
}

/* ---- the index a query names: its state from the first MN that answers ---- */

struct qtarget {
	struct cn_s3 *s;
	uint32_t avoid;                  /* a replica that just failed this query, or none */
	char b[NAME_MAX_ + 8], x[NAME_MAX_ + 8];
	uint32_t mns[DM_MAX_NODES];
	int nmn;
	struct ixstate st;
};

/* s3_qresolve_fn of the ingress: read the index state (FL_STATE) from a replica. */
static int resolve_state(void *ctx, const char *b, const char *x, struct s3_qindex *out,
			 struct s3_resp *r)
{
	struct qtarget *t = ctx;
	struct cn_s3 *s = t->s;
	int rc = -EHOSTDOWN;

	snprintf(t->b, sizeof(t->b), "%s", b);
	snprintf(t->x, sizeof(t->x), "%s", x);
	t->nmn = bucket_read_mns(s, b, t->mns);    /* caught-up replicas only */
	for (int i = 0; i < t->nmn; i++) {
		if (i + 1 < t->nmn && (mn_is_down(s, t->mns[i]) || t->mns[i] == t->avoid))
			continue;
		rc = ixstate_fetch(s, t->mns[i], b, x, &t->st);
		if (rc != -EHOSTDOWN)
			break;
	}
	if (rc == -ENOENT) {
		/* Which is missing, the bucket or the index? */
		struct s3_resp br;
		char *gb = NULL;

		if (asprintf(&gb, "{\"vectorBucketName\":\"%s\"}", b) < 0)
			gb = NULL;
		rc = gb ? mn_s3(s, t->st.mn ? t->st.mn : t->mns[0], "GetVectorBucket", gb,
				strlen(gb), &br) : -ENOMEM;
		free(gb);
		s3_api_not_found(r, !rc && br.status == 404);
		if (!rc)
			s3_resp_free(&br);
		return -ENOENT;
	}
	if (rc) {
		if (rc == -EHOSTDOWN)
			unavailable(r, "QueryVectors", t->nmn > 0 ? t->mns[0] : 0);
		else
			s3_resp_error(r, 500, "InternalServerException", "index state: %s",
				      strerror(-rc));
		return rc;
	}
	*out = (struct s3_qindex){ .dim = t->st.dim, .metric = (enum dm_metric)t->st.metric,
				   .conf = t->st.conf, .conf_len = t->st.conf_len };
	return 0;
}

/* ---- plan ---- */

struct qplan {
	uint32_t w, g;                   /* members per group, the group used */
	int ngroups;
	uint32_t members[DM_MAX_NODES];  /* ngroups x w, indexes into cfg->cn */
	struct share sh[DM_MAX_NODES];   /* one per member of group g */
};

/* A partitioned scan of the whole index for q ([s3] scan_budget; cn_s3_part.c): the
 * selection fields of its sub-requests ({"vh", "rk", "rg"}), or NULL for a scan of every
 * row (the mode is off, the query has a filter, the graph path took part of the index, the
 * index is too small, or no model is ready on this compute node). */
static json_t *part_plan(struct cn_s3 *s, const struct qtarget *t, const struct s3_qspec *q)
{
	const struct ixstate *st = &t->st;
	uint64_t rows = 0;
	struct s3_part *pm;
	uint32_t *pos;
	json_t *o = NULL, *rg;
	char id[24];
	int n;

	if (!s->scan_budget || !q || q->filter || st->scope)
		return NULL;
	for (uint32_t i = 0; i < st->nfrag; i++) {
		if (st->fr[i].from)
			return NULL;
		rows += st->fr[i].rows;
	}
	if (rows < DM_MAX(s->scan_min_rows, (uint64_t)S3_PART_SAMPLE_ROWS) ||
	    part_get(s, st, t->b, t->x, &pm))
		return NULL;
	pos = calloc(part_regions(pm), sizeof(*pos));
	n = pos ? part_select(s, pm, q->vec, pos, part_regions(pm), NULL) : -ENOMEM;
	rg = n > 0 ? json_array() : NULL;
	for (int i = 0; rg && i < n; i++)
		json_array_append_new(rg, json_integer(pos[i]));
	snprintf(id, sizeof(id), "%016llx", (unsigned long long)part_id(pm));
	if (rg)
		o = json_pack("{s:s, s:i, s:o}", "vh", id, "rk", (int)part_regions(pm), "rg", rg);
	if (o) {
		__atomic_add_fetch(&s->part_queries, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&s->part_regions_sel, (uint64_t)n, __ATOMIC_RELAXED);
	}
	free(pos);
	part_put(s, pm);
	return o;
}

/* W from the index size, the groups over the up CNs, the shares in the group, and the
 * sub-request of each share (q: for a scoped query, and for a partitioned scan when part;
 * may be NULL). 0 or -errno with the error in r. */
static int plan_query(struct cn_s3 *s, const struct qtarget *t, const struct s3_qspec *q,
		      bool part, const char *body, size_t len, struct qplan *p,
		      struct s3_resp *r)
{
	uint8_t *other = NULL;
	json_t *psel = NULL;
	const struct ixstate *st = &t->st;
	struct dm_place_node cns[DM_MAX_NODES], gm[DM_MAX_NODES];
	uint64_t *fids, *fbytes, total = 0;
	uint32_t *owner, ncn = 0, w, nf = 0;
	int rc = -ENOMEM;

	fids = calloc(st->nfrag + 1, sizeof(*fids));
	fbytes = calloc(st->nfrag + 1, sizeof(*fbytes));
	owner = calloc(st->nfrag + 1, sizeof(*owner));
	if (!fids || !fbytes || !owner || scope_select(s, st, q, &other))
		goto oom;
	/* The fragments with rows to scan (the graph path scans those from the mark on; a
	 * scoped query, its scope value's only). */
	for (uint32_t i = 0; i < st->nfrag; i++) {
		if ((st->fr[i].from >= st->fr[i].rows && st->fr[i].rows) || (other && other[i]))
			continue;
		fids[nf] = i;
		fbytes[nf] = (uint64_t)(st->fr[i].rows - st->fr[i].from) * st->dim * sizeof(float);
		total += fbytes[nf++];
	}
	for (uint32_t c = 0; c < s->cfg->n_cn; c++) {
		cns[c] = (struct dm_place_node){ .id = c, .capacity = s->cfg->cn[c].capacity > 0 ?
			s->cfg->cn[c].capacity : 1.0,
			.up = s->cfg->cn[c].http[0] && cn_up(s, c) };
		ncn += cns[c].up;
	}
	w = s->force_w ? DM_MIN(s->force_w, ncn) : s3_plan_width(total, s->max_scan_bytes, ncn);
	w = DM_MAX(w, 1u);
	w = DM_MIN(w, DM_MAX(nf, 1u));
	uint64_t ixid = dm_hash64(flat_key_hash(t->b, strlen(t->b)) ^
				  flat_key_hash(t->x, strlen(t->x)) ^ (uint64_t)st->created);
	double qps = rate_note(s, ixid), sns;
	uint32_t ng;

	pthread_mutex_lock(&s->rmu);
	sns = s->scan_ns;
	pthread_mutex_unlock(&s->rmu);
	/* One group serves about (search threads / member scan time) queries per second:
	 * R = ceil(rate / that), so a rarely queried index is cached by one group only. */
	ng = s->force_r ? DM_MIN(s->force_r, DM_MAX(ncn / w, 1u)) :
	     s3_plan_groups(qps, sns > 0 ? s->search_threads * 1e9 / sns : 0, w, ncn);
	/* No group formed (W x R past the plan's table, or no CN gateway up but this one,
	 * which is always counted up): this CN scans alone (logged and counted). */
	p->ngroups = s3_plan_pick(ixid, cns, s->cfg->n_cn, &w, DM_MAX(ng, 1u), s->node->id,
				  p->members, &s->plan_fallbacks);
	if (p->ngroups <= 0) {
		rc = p->ngroups ? p->ngroups : -EINVAL;
		s3_resp_error(r, 500, "InternalServerException", "query planning failed");
		goto free_arrays;
	}
	p->w = w;
	/* This CN's group when it is in one (one hop less), else a random group. */
	p->g = (uint32_t)(dm_now_ns() % (uint64_t)p->ngroups);
	for (int gi = 0; gi < p->ngroups; gi++)
		for (uint32_t j = 0; j < w; j++)
			if (p->members[(uint32_t)gi * w + j] == s->node->id)
				p->g = (uint32_t)gi;
	for (uint32_t j = 0; j < w; j++)
		gm[j] = cns[p->members[p->g * w + j]];
	if (nf && s3_plan_shares(fids, fbytes, nf, gm, w, S3_PLAN_LOAD_CAP, owner)) {
		rc = -EINVAL;
		s3_resp_error(r, 500, "InternalServerException", "share planning failed");
		goto free_arrays;
	}
	for (uint32_t j = 0; j < w; j++) {
		p->sh[j].frags = calloc(st->nfrag + 1, sizeof(uint64_t));
		if (!p->sh[j].frags)
			goto oom;
	}
	for (uint32_t i = 0; i < nf; i++)
		p->sh[owner[i]].frags[p->sh[owner[i]].nf++] = fids[i];
	psel = part ? part_plan(s, t, q) : NULL;
	for (uint32_t j = 0; j < w; j++) {
		p->sh[j].req = subreq_json(st, t->b, t->x, p->sh[j].frags, p->sh[j].nf, body, len,
					   psel);
		if (!p->sh[j].req)
			goto oom;
	}
	rc = 0;
	goto free_arrays;
oom:
	s3_resp_error(r, 500, "InternalServerException", "out of memory");
free_arrays:
	json_decref(psel);
	free(other);
	free(owner);
	free(fids);
	free(fbytes);
	return rc;
}

static void run_local(struct cn_s3 *s, struct share *sh)
{
	be_internal(s, "ScanShare", sh->req, strlen(sh->req), &sh->resp);
	sh->have = true;
}

/* ---- fan-out ---- */

/* Send each share to its member (this CN's share, if any, scanned right here), hedge slow
 * members and retry failed ones on another CN, until every share has its answer. 0 or
 * -errno with the error in r. */
static int fan_out(struct cn_s3 *s, struct qplan *p, struct s3_resp *r)
{
	uint32_t w = p->w, g = p->g;
	struct share *sh = p->sh;
	struct hcall *calls;
	size_t ncalls = 0;
	bool tried[DM_MAX_NODES];
	int local = -1, rc = 0;

	calls = calloc(4 * (size_t)w + 4, sizeof(*calls));
	if (!calls) {
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
		return -ENOMEM;
	}
	for (uint32_t j = 0; j < w; j++) {
		uint32_t c = p->members[g * w + j];

		sh[j].t0 = dm_now_ns();
		if (c == s->node->id) {
			local = (int)j;
			continue;
		}
		if (hcall_start(s, &calls[ncalls], c, "ScanShare", sh[j].req)) {
			calls[ncalls].share = j;
			sh[j].tries++;
			ncalls++;
			__atomic_add_fetch(&s->subreqs, 1, __ATOMIC_RELAXED);
		} else {
			__atomic_store_n(&s->cn_down[c], dm_now_ns() + CN_DOWN_NS, __ATOMIC_RELAXED);
		}
	}
	if (local >= 0)
		run_local(s, &sh[local]);
	/* Shares whose first sub-request could not even start: run them here too. */
	for (uint32_t j = 0; j < w; j++)
		if (!sh[j].have && !sh[j].tries) {
			run_local(s, &sh[j]);
			__atomic_add_fetch(&s->retries, 1, __ATOMIC_RELAXED);
		}
	for (;;) {
		struct pollfd pf[4 * DM_MAX_NODES + 4];
		size_t np = 0, idx[4 * DM_MAX_NODES + 4];
		uint32_t missing = 0;
		uint64_t now = dm_now_ns();

		for (uint32_t j = 0; j < w; j++)
			missing += !sh[j].have;
		if (!missing)
			break;
		for (size_t i = 0; i < ncalls; i++) {
			if (calls[i].done || sh[calls[i].share].have)
				continue;
			pf[np] = (struct pollfd){ .fd = calls[i].fd, .events = POLLIN |
				(calls[i].sent < calls[i].out.n ? POLLOUT : 0) };
			idx[np++] = i;
		}
		/* Hedge slow shares and retry failed ones on another CN (once each). */
		for (uint32_t j = 0; j < w; j++) {
			bool slow = now - sh[j].t0 > (uint64_t)s->hedge_ms * 1000000ull;
			bool inflight = false;

			for (size_t i = 0; i < ncalls; i++)
				if (calls[i].share == j && !calls[i].done)
					inflight = true;
			if (sh[j].have || sh[j].tries >= 2 || (inflight && !slow))
				continue;
			memset(tried, 0, sizeof(tried));
			for (size_t i = 0; i < ncalls; i++)
				if (calls[i].share == j)
					tried[calls[i].cn] = true;
			uint32_t c = alt_cn(s, p->members, w, p->ngroups, g, j, tried);

			sh[j].tries++;
			__atomic_add_fetch(inflight ? &s->hedges : &s->retries, 1, __ATOMIC_RELAXED);
			if (c == s->node->id) {
				run_local(s, &sh[j]);
				continue;
			}
			if (hcall_start(s, &calls[ncalls], c, "ScanShare", sh[j].req)) {
				calls[ncalls].share = j;
				calls[ncalls].hedge = true;
				pf[np] = (struct pollfd){ .fd = calls[ncalls].fd,
							  .events = POLLIN | POLLOUT };
				idx[np++] = ncalls;
				ncalls++;
			}
		}
		if (!np) {
			/* Nothing in flight for a missing share and no retry left. */
			bool stuck = false;

			for (uint32_t j = 0; j < w; j++)
				if (!sh[j].have)
					stuck = true;
			if (stuck) {
				s3_resp_error(r, 503, "ServiceUnavailableException",
					      "a scan member failed; retry later");
				rc = -EHOSTDOWN;
				goto close_calls;
			}
			break;
		}
		for (uint32_t j = 0; j < w; j++)
			if (!sh[j].have && now - sh[j].t0 > (uint64_t)SUB_TIMEOUT_MS * 1000000ull) {
				s3_resp_error(r, 503, "ServiceUnavailableException",
					      "a scan member timed out; retry later");
				rc = -ETIMEDOUT;
				goto close_calls;
			}
		if (poll(pf, np, (int)s->hedge_ms) < 0 && errno != EINTR) {
			rc = -errno;
			s3_resp_error(r, 500, "InternalServerException", "poll: %s", strerror(errno));
			goto close_calls;
		}
		for (size_t k = 0; k < np; k++) {
			struct hcall *h = &calls[idx[k]];

			if (!pf[k].revents)
				continue;
			hcall_io(h, pf[k].revents);
			if (!h->done)
				continue;
			if (h->failed) {
				/* A member that answers an error, or not at all. A 4xx means the
				 * request itself is bad (it was validated here: should not happen). */
				if (h->status >= 500 || !h->status)
					__atomic_store_n(&s->cn_down[h->cn],
							 dm_now_ns() + CN_DOWN_NS, __ATOMIC_RELAXED);
				continue;       /* done and not in flight: retried next round */
			}
			struct share *t = &sh[h->share];

			if (t->have)
				continue;
			t->resp.status = 200;
			t->resp.body = strndup(h->body, h->blen);
			if (!t->resp.body) {
				s3_resp_error(r, 500, "InternalServerException", "out of memory");
				rc = -ENOMEM;
				goto close_calls;
			}
			t->resp.len = h->blen;
			t->have = true;
		}
	}
close_calls:
	for (size_t i = 0; i < ncalls; i++)
		hcall_fini(&calls[i]);
	free(calls);
	return rc;
}

/* ---- the graph path of one index state ---- */

static void hits_free(struct mhit *h, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(h[i].key);
		free(h[i].meta);
	}
	free(h);
}

/* The graph part of a query on index t (its state read): 0 when the graph answers for the
 * rows below the mark (its hits in *gh, *ngh; t's fragments then start their scan at the
 * mark, and *tail says whether rows past it exist), 1 when the exact path must answer for
 * every row (no graph, another generation, too few candidates passed the filter, or the
 * graph search failed: counted). */
static int graph_part(struct cn_s3 *s, struct qtarget *t, const struct s3_qspec *q,
		      struct mhit **gh, size_t *ngh, bool *tail)
{
	bool complete = false;
	uint64_t total = 0;
	int grc = graph_query(s, t->b, t->x, &t->st, q, gh, ngh, &complete);

	if (grc < 0)
		__atomic_add_fetch(&s->graph_errors, 1, __ATOMIC_RELAXED);
	if (!grc && !complete) {
		__atomic_add_fetch(&s->graph_fallbacks, 1, __ATOMIC_RELAXED);
		grc = 1;
	}
	if (grc) {
		hits_free(*gh, *ngh);
		*gh = NULL;
		*ngh = 0;
		*tail = true;
		return 1;
	}
	for (uint32_t i = 0; i < t->st.nfrag; i++) {
		uint64_t first = (uint64_t)i * t->st.frag_rows;

		total += t->st.fr[i].rows;
		t->st.fr[i].from = t->st.mark <= first ? 0 :
			(uint32_t)DM_MIN(t->st.mark - first, (uint64_t)t->st.fr[i].rows);
	}
	__atomic_add_fetch(&s->graph_queries, 1, __ATOMIC_RELAXED);
	if (total > t->st.mark)
		__atomic_add_fetch(&s->graph_tail_rows, total - t->st.mark, __ATOMIC_RELAXED);
	*tail = total > t->st.mark;
	return 0;
}

/* ---- buckets of several shards ---- */

/* The state of the index t->x in shard bucket t->b from its first caught-up replica that
 * answers; 0, or -errno with the error in r (a shard without the index its bucket has is
 * an index whose creation or deletion did not reach every shard: 500). */
static int shard_state(struct cn_s3 *s, struct qtarget *t, struct s3_resp *r)
{
	int rc = -EHOSTDOWN;

	t->nmn = bucket_read_mns(s, t->b, t->mns);
	for (int i = 0; i < t->nmn; i++) {
		if (i + 1 < t->nmn && mn_is_down(s, t->mns[i]))
			continue;
		rc = ixstate_fetch(s, t->mns[i], t->b, t->x, &t->st);
		if (rc != -EHOSTDOWN)
			break;
	}
	if (rc == -EHOSTDOWN)
		unavailable(r, "QueryVectors", t->nmn > 0 ? t->mns[0] : 0);
	else if (rc)
		s3_resp_error(r, 500, "InternalServerException", "index %s/%s: %s", t->b, t->x,
			      strerror(-rc));
	return rc;
}

/* A query on a bucket of n > 1 shards (t0: shard 0, its state read). Each shard's index
 * is an index of its own on the memory nodes, with its own graph (seeded and indexed
 * online like any index's, cn_s3_index.c): per shard the graph path answers for its rows
 * below its mark and the fan-out scans the rest (the exact path for all of them when the
 * shard has no graph yet), one shard after the other; the hits of every shard are merged
 * (a key lives in one shard only). */
static void query_shards(struct cn_s3 *s, struct qtarget *t0, const struct s3_qspec *q,
			 uint32_t n, const char *body, size_t len, struct s3_resp *r)
{
	struct share *all = NULL;
	struct mhit *gall = NULL;
	size_t nall = 0, ngall = 0;
	struct qtarget *ts = calloc(1, sizeof(*ts));
	struct qplan *p = calloc(1, sizeof(*p));
	bool ok = ts && p;

	if (!ok)
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
	for (uint32_t sh = 0; ok && sh < n; sh++) {
		struct qtarget *t = t0;
		struct share *grow;
		struct mhit *gh = NULL;
		size_t ngh = 0;
		bool tail = true;

		if (sh) {
			*ts = (struct qtarget){ .s = s, .avoid = UINT32_MAX };
			t = ts;
			s3_shard_name(t0->b, sh, ts->b);
			snprintf(ts->x, sizeof(ts->x), "%s", t0->x);
			ok = !shard_state(s, ts, r);
			if (ok && (ts->st.dim != t0->st.dim || ts->st.metric != t0->st.metric)) {
				s3_resp_error(r, 500, "InternalServerException", "index %s/%s: its "
					      "shard %u differs", t0->b, t0->x, sh);
				ok = false;
			}
		}
		if (ok && !graph_part(s, t, q, &gh, &ngh, &tail) && ngh) {
			struct mhit *g = realloc(gall, (ngall + ngh) * sizeof(*gall));

			if (!g) {
				s3_resp_error(r, 500, "InternalServerException", "out of memory");
				hits_free(gh, ngh);
				ok = false;
			} else {
				gall = g;
				memcpy(gall + ngall, gh, ngh * sizeof(*gh));
				ngall += ngh;
				free(gh);
			}
		}
		memset(p, 0, sizeof(*p));
		if (ok && tail)
			ok = !plan_query(s, t, q, false, body, len, p, r) && !fan_out(s, p, r);
		grow = ok ? realloc(all, (nall + p->w + 1) * sizeof(*all)) : NULL;
		if (ok && !grow)
			s3_resp_error(r, 500, "InternalServerException", "out of memory");
		ok = ok && grow;
		all = grow ? grow : all;
		for (uint32_t j = 0; j < DM_MAX_NODES; j++) {
			if (ok && j < p->w && p->sh[j].resp.status != 200) {
				*r = p->sh[j].resp;
				memset(&p->sh[j].resp, 0, sizeof(p->sh[j].resp));
				ok = false;
			}
			if (ok && j < p->w) {
				all[nall++] = (struct share){ .resp = p->sh[j].resp, .have = true };
				memset(&p->sh[j].resp, 0, sizeof(p->sh[j].resp));
			}
			free(p->sh[j].frags);
			free(p->sh[j].req);
			s3_resp_free(&p->sh[j].resp);
		}
		if (sh)
			ixstate_fini(&ts->st);
	}
	if (ok)
		merge_answer(&t0->st, q, all, (uint32_t)nall, gall, ngall, r);
	for (size_t i = 0; i < nall; i++)
		s3_resp_free(&all[i].resp);
	free(all);
	hits_free(gall, ngall);
	free(ts);
	free(p);
}

/* One try of a query, its index state read from a caught-up replica other than `avoid`
 * when there is one: *used gets the replica it read (UINT32_MAX: none). */
static void query_once(struct cn_s3 *s, const char *body, size_t len, struct s3_resp *r,
		       uint32_t avoid, uint32_t *used)
{
	struct qtarget t = { .s = s, .avoid = avoid };
	struct s3_qspec q = { 0 };
	struct qplan *p = calloc(1, sizeof(*p));
	struct mhit *gh = NULL;
	size_t ngh = 0;
	bool tail = true;
	int grc = 1;

	*used = UINT32_MAX;
	memset(r, 0, sizeof(*r));
	if (!p) {
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
		return;
	}
	if (s3_api_qspec_parse(body, len, resolve_state, &t, &q, r))
		goto free_query;
	uint32_t nsh;

	if (bucket_shards(s, t.b, false, &nsh, r))
		goto free_query;
	if (nsh > 1) {
		query_shards(s, &t, &q, nsh, body, len, r);
		goto free_query;
	}
	/* The graph path for the rows below the graph mark, the fan-out for the rest; the
	 * exact path over everything when the index has no graph or the graph's candidates
	 * cannot answer (docs/api.md "The graph path"). */
	grc = graph_part(s, &t, &q, &gh, &ngh, &tail);
	if (!grc && !tail) {
		merge_answer(&t.st, &q, p->sh, 0, gh, ngh, r);   /* no tail */
		goto free_query;
	}
	if (plan_query(s, &t, &q, true, body, len, p, r) || fan_out(s, p, r))
		goto free_query;
	for (uint32_t j = 0; j < p->w; j++)
		if (p->sh[j].resp.status != 200) {
			*r = p->sh[j].resp;
			memset(&p->sh[j].resp, 0, sizeof(p->sh[j].resp));
			goto free_query;
		}
	merge_answer(&t.st, &q, p->sh, p->w, grc ? NULL : gh, grc ? 0 : ngh, r);
free_query:
	hits_free(gh, ngh);
	for (uint32_t j = 0; j < DM_MAX_NODES; j++) {
		free(p->sh[j].frags);
		free(p->sh[j].req);
		s3_resp_free(&p->sh[j].resp);
	}
	free(p);
	s3_qspec_fini(&q);
	*used = t.st.conf ? t.st.mn : UINT32_MAX;
	ixstate_fini(&t.st);
}

void be_query(void *ctx, const char *body, size_t len, struct s3_resp *r)
{
	struct cn_s3 *s = ctx;
	uint32_t used = UINT32_MAX;

	memset(r, 0, sizeof(*r));
	if (s3_api_user_bucket(body, len, r))
		return;                 /* "B#s" names a shard: never a user's bucket */
	if (s->test_busy[0] && access(s->test_busy, F_OK) == 0) {
		s3_resp_error(r, 503, "ServiceUnavailableException", "test hook: busy");
		return;
	}
	query_once(s, body, len, r, UINT32_MAX, &used);
	if (r->status == 503 && used != UINT32_MAX) {
		/* The memory node whose rows the scans read failed under them (it died, or it
		 * restarted and renumbered its rows): once more from another replica. */
		__atomic_add_fetch(&s->retries, 1, __ATOMIC_RELAXED);
		s3_resp_free(r);
		query_once(s, body, len, r, used, &used);
	}
}
