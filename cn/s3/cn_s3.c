/* cn_s3.c: the S3 Vectors gateway of a compute node, distributed path (see cn_s3.h):
 * MN connections and FL calls, bucket placement, write replication, ListVectorBuckets
 * merged over the MNs, the query fan-out with hedging and retry, the member-side fragment
 * cache and exact scan. */
#include "cn_s3.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "cluster.h"
#include "distance.h"
#include "fl_rpc.h"
#include "placement.h"
#include "s3_api.h"
#include "s3_filter.h"
#include "s3_http.h"
#include "s3_plan.h"
#include "s3_sigv4.h"
#include "topk.h"

#define MN_MSG DM_FL_MIN_MSG         /* until FL_INFO tells the MN's receive buffer size */
#define MY_MSG 65536u                /* our receive buffers */
#define FL_TIMEOUT_MS 10000
#define MN_CONNECT_MS 5000           /* generous: a loaded MN may be slow to accept */
#define MN_DOWN_NS 1000000000ull      /* a failed MN is skipped for reads this long */
#define CN_DOWN_NS 2000000000ull      /* a failed CN member is avoided this long */
#define SUB_TIMEOUT_MS 20000
#define NAME_MAX_ 64
#define JSON_OUT (JSON_COMPACT | JSON_REAL_PRECISION(9))

/* ---------------------------------------------------------------- state ------------ */

struct mnconn {
	struct dm_conn *c;
	struct dm_rpc_chan ch;
	uint32_t max_msg;                /* the MN's receive buffer (FL_INFO) */
	struct mnconn *next;
};

struct mnslot {
	pthread_mutex_t mu;
	struct mnconn *idle;
	uint64_t down_until;             /* atomic, dm_now_ns */
};

/* A fragment as a member caches it: rows [0, rows) of MN fragment `frag`, with the
 * tombstone flags read at the same instant. */
struct cfrag {
	uint32_t mn;
	uint64_t epoch, frag;
	int64_t created;
	char bucket[NAME_MAX_], index[NAME_MAX_];
	pthread_rwlock_t rw;
	pthread_mutex_t fetch;           /* one fetch at a time */
	uint32_t dim, rows, dead, cap;
	float *vec, *norm2;
	char **key;
	char **meta;                     /* meta JSON bytes, then fmeta bytes */
	uint32_t *mlen, *flen;
	uint8_t *deadf;
	size_t bytes;
	uint64_t last_use;
	int refs;                        /* under cache mutex */
	struct cfrag *next;
};

struct cn_s3 {
	const struct dm_cluster_cfg *cfg;
	const struct dm_node_cfg *node;
	struct dm_xport *x;
	struct dm_msgpool *pool;
	struct mnslot mn[DM_MAX_NODES];
	uint64_t cn_down[DM_MAX_NODES];  /* atomic */
	struct s3_http *http;
	struct s3_backend be;
	struct s3_cred cred;             /* the cluster's [s3] key: users' requests */
	struct s3_cred icred;            /* internal key (from the cluster secret): sub-requests */
	char ikey[32], isecret[72];
	struct s3_sigv4_cfg iauth;
	uint32_t redundancy;
	uint32_t search_threads;
	/* settings */
	uint32_t force_w;
	uint64_t max_scan_bytes;
	uint32_t hedge_ms;
	uint64_t cache_cap;
	uint32_t test_delay_ms;          /* test hook: delay scans served for other CNs */
	/* fragment cache */
	pthread_mutex_t cmu;
	struct cfrag *cache;
	uint64_t cache_bytes;
	/* R from the query rate: per index an exponentially decaying arrival rate, and what
	 * one group serves, from the measured member scan time. */
	uint32_t force_r;
	pthread_mutex_t rmu;
	struct ixrate {
		uint64_t id, last_ns;
		double qps;
	} rate[64];
	double scan_ns;                  /* EWMA of a member scan (this CN) */
	/* counters (atomics) */
	uint64_t hedges, retries, subreqs, fetches;
};

static uint64_t env_u64(const char *name, uint64_t def, uint64_t lo, uint64_t hi)
{
	const char *v = getenv(name);
	char *end;
	unsigned long long x;

	if (!v || !*v)
		return def;
	x = strtoull(v, &end, 10);
	if (*end || x < lo || x > hi) {
		dm_warn("s3: ignoring %s=%s (want %llu..%llu)", name, v, (unsigned long long)lo,
			(unsigned long long)hi);
		return def;
	}
	return x;
}

/* ---------------------------------------------------------------- MN calls --------- */

static void mnconn_free(struct mnconn *mc)
{
	dm_rpc_chan_fini(&mc->ch);
	dm_conn_close(mc->c);
	free(mc);
}

static struct mnconn *mn_connect(struct cn_s3 *s, uint32_t mn)
{
	struct mnconn *mc = calloc(1, sizeof(*mc));
	int rc;

	if (!mc)
		return NULL;
	rc = dm_xport_connect(s->x, s->cfg->mn[mn].address, MN_CONNECT_MS, &mc->c);
	if (rc) {
		dm_debug("s3: cannot connect to mn%u (%s): %s", mn, s->cfg->mn[mn].address,
			 strerror(-rc));
		free(mc);
		return NULL;
	}
	/* Requests as large as the MN's receive buffers (fewer messages per PutVectors). */
	uint8_t *resp = NULL;
	size_t rlen;
	uint32_t max = MN_MSG;

	rc = dm_rpc_chan_init(&mc->ch, mc->c, s->pool, MN_MSG, FL_TIMEOUT_MS);
	if (!rc)
		rc = dm_fl_call(&mc->ch, DM_OP_FL_INFO, NULL, 0, MN_MSG, FL_TIMEOUT_MS, &resp,
				&rlen);
	if (!rc && rlen == 4)
		max = DM_MAX(DM_MIN(dm_get_le32(resp), DM_FL_MAX_MSG), MN_MSG);
	free(resp);
	if (!rc && max > MN_MSG) {
		dm_rpc_chan_fini(&mc->ch);
		rc = dm_rpc_chan_init(&mc->ch, mc->c, s->pool, max, FL_TIMEOUT_MS);
	}
	if (rc) {
		if (mc->ch.sbuf)
			dm_rpc_chan_fini(&mc->ch);
		dm_conn_close(mc->c);
		free(mc);
		return NULL;
	}
	mc->max_msg = max;
	return mc;
}

static bool mn_is_down(struct cn_s3 *s, uint32_t mn)
{
	return __atomic_load_n(&s->mn[mn].down_until, __ATOMIC_RELAXED) > dm_now_ns();
}

/* One FL call to memory node mn. A pooled connection that fails (the MN restarted) is
 * replaced by a fresh one once. Returns the peer status or -EHOSTDOWN when the MN cannot
 * be reached (the request was then not served by it, or its fate is unknown). */
static int mn_call(struct cn_s3 *s, uint32_t mn, uint16_t op, const struct dm_buf *req,
		   uint8_t **resp, size_t *rlen)
{
	struct mnslot *sl = &s->mn[mn];

	*resp = NULL;
	*rlen = 0;
	for (int attempt = 0; attempt < 2; attempt++) {
		struct mnconn *mc;
		bool pooled;
		int rc;

		pthread_mutex_lock(&sl->mu);
		mc = sl->idle;
		if (mc)
			sl->idle = mc->next;
		pthread_mutex_unlock(&sl->mu);
		pooled = mc != NULL;
		if (!mc)
			mc = mn_connect(s, mn);
		if (!mc) {
			__atomic_store_n(&sl->down_until, dm_now_ns() + MN_DOWN_NS,
					 __ATOMIC_RELAXED);
			return -EHOSTDOWN;
		}
		rc = dm_fl_call(&mc->ch, op, req->p, req->n, mc->max_msg, FL_TIMEOUT_MS, resp,
				rlen);
		if (rc == 0 || rc == -ENOENT || rc == -ESTALE || rc == -EINVAL ||
		    rc == -EBADMSG || rc == -ENOMEM) {
			pthread_mutex_lock(&sl->mu);
			mc->next = sl->idle;
			sl->idle = mc;
			pthread_mutex_unlock(&sl->mu);
			__atomic_store_n(&sl->down_until, 0, __ATOMIC_RELAXED);
			return rc;
		}
		mnconn_free(mc);
		free(*resp);
		*resp = NULL;
		if (!pooled) {
			__atomic_store_n(&sl->down_until, dm_now_ns() + MN_DOWN_NS,
					 __ATOMIC_RELAXED);
			return -EHOSTDOWN;
		}
	}
	return -EHOSTDOWN;
}

/* The MNs holding a bucket, best first (static ideal state: every MN counted up, so a
 * bucket never moves while an MN is down; there is no re-replication yet). */
static int bucket_mns(struct cn_s3 *s, const char *bucket, uint32_t *out)
{
	struct dm_place_node nodes[DM_MAX_NODES];
	uint64_t h = flat_key_hash(bucket, strlen(bucket));

	for (uint32_t i = 0; i < s->cfg->n_mn; i++)
		nodes[i] = (struct dm_place_node){ .id = i, .capacity = s->cfg->mn[i].capacity > 0 ?
			s->cfg->mn[i].capacity : 1.0, .up = true };
	return dm_place(h, nodes, s->cfg->n_mn, s->redundancy, out);
}

/* FL_CALL of an S3 operation on one MN: fills r from the MN's answer. */
static int mn_s3(struct cn_s3 *s, uint32_t mn, const char *op, const char *body, size_t len,
		 struct s3_resp *r)
{
	struct dm_buf w = { 0 };
	uint8_t *resp;
	size_t rlen;
	int rc;

	memset(r, 0, sizeof(*r));
	dm_buf_str(&w, op);
	dm_buf_bytes(&w, body ? body : "", body ? len : 0);
	if (w.oom) {
		free(w.p);
		return -ENOMEM;
	}
	rc = mn_call(s, mn, DM_OP_FL_CALL, &w, &resp, &rlen);
	free(w.p);
	if (rc)
		return rc;
	struct dm_rbuf rb = { .p = resp, .n = rlen };
	char et[64];
	uint32_t blen;
	uint16_t st = dm_rbuf_u16(&rb);
	const char *b;

	dm_rbuf_str(&rb, et, sizeof(et));
	b = dm_rbuf_bytes(&rb, &blen, DM_FL_MAX_STREAM);
	if (rb.bad || st < 100 || st > 599) {
		free(resp);
		return -EBADMSG;
	}
	r->status = st;
	r->body = malloc(blen + 1);
	if (!r->body) {
		free(resp);
		return -ENOMEM;
	}
	memcpy(r->body, b, blen);
	r->body[blen] = 0;
	r->len = blen;
	/* errtype must outlive the response: map it to the static names s3_http sends. */
	static const char *const types[] = { "ValidationException", "NotFoundException",
		"ConflictException", "ServiceUnavailableException", "AccessDeniedException",
		"InternalServerException", "UnknownOperationException" };
	r->errtype = NULL;
	for (size_t i = 0; et[0] && i < DM_ARRAY_SIZE(types); i++)
		if (!strcmp(et, types[i]))
			r->errtype = types[i];
	if (et[0] && !r->errtype)
		r->errtype = "InternalServerException";
	free(resp);
	return 0;
}

static void unavailable(struct s3_resp *r, const char *what, uint32_t mn)
{
	s3_resp_free(r);
	s3_resp_error(r, 503, "ServiceUnavailableException",
		      "%s: memory node %u is unreachable; retry later", what, mn);
}

static bool is_write(const char *op)
{
	return !strncmp(op, "Create", 6) || !strncmp(op, "Delete", 6) ||
	       !strcmp(op, "PutVectors");
}

/* ListVectorBuckets: every MN lists its buckets; merge by name. */
static void list_buckets(struct cn_s3 *s, const char *body, size_t len, struct s3_resp *r)
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

/* Every operation but QueryVectors: route by bucket; writes to every replica. */
static void be_handle(void *ctx, const char *op, const char *body, size_t len,
		      struct s3_resp *r)
{
	struct cn_s3 *s = ctx;
	uint32_t mns[DM_MAX_NODES];
	char bucket[NAME_MAX_ + 8];
	int n, rc;

	memset(r, 0, sizeof(*r));
	if (!strcmp(op, "ListVectorBuckets")) {
		list_buckets(s, body, len, r);
		return;
	}
	if (s3_api_req_bucket(body, len, bucket)) {
		/* No bucket named: invalid; any MN answers the ValidationException. */
		for (uint32_t mn = 0; mn < s->cfg->n_mn; mn++)
			if (!mn_s3(s, mn, op, body, len, r))
				return;
		unavailable(r, op, 0);
		return;
	}
	n = bucket_mns(s, bucket, mns);
	if (n <= 0) {
		unavailable(r, op, 0);
		return;
	}
	if (!is_write(op)) {
		/* Reads: the first replica that answers (every replica has every ack'ed write). */
		for (int i = 0; i < n; i++) {
			if (i + 1 < n && mn_is_down(s, mns[i]))
				continue;
			rc = mn_s3(s, mns[i], op, body, len, r);
			if (!rc)
				return;
		}
		unavailable(r, op, mns[n - 1]);
		return;
	}
	/* Writes: every replica, in placement order; success only when all have it durable.
	 * A replica that cannot be reached fails the write (503) rather than leave it on
	 * fewer replicas than configured: there is no catch-up of a returning MN yet. */
	for (int i = 0; i < n; i++) {
		struct s3_resp one;

		rc = mn_s3(s, mns[i], op, body, len, &one);
		if (rc) {
			s3_resp_free(&one);
			unavailable(r, op, mns[i]);
			return;
		}
		if (i == 0) {
			*r = one;
			if (r->status != 200)
				return;               /* validation / conflict: nothing written */
		} else {
			if (one.status != r->status)
				dm_warn("s3: %s: mn%u answered %d, mn%u %d", op, mns[0], r->status,
					mns[i], one.status);
			s3_resp_free(&one);
		}
	}
}

/* ---------------------------------------------------------------- index state ------ */

struct fstat {
	uint32_t rows, dead;
};

struct ixstate {
	uint32_t mn;
	uint64_t epoch;
	int64_t created;
	uint32_t dim, metric, frag_rows, nfrag;
	char *conf;
	uint32_t conf_len;
	struct fstat *fr;
};

static void ixstate_fini(struct ixstate *st)
{
	free(st->conf);
	free(st->fr);
	memset(st, 0, sizeof(*st));
}

static int ixstate_fetch(struct cn_s3 *s, uint32_t mn, const char *b, const char *x,
			 struct ixstate *st)
{
	struct dm_buf w = { 0 };
	uint8_t *resp;
	size_t rlen;
	const void *conf;
	int rc;

	memset(st, 0, sizeof(*st));
	dm_buf_str(&w, b);
	dm_buf_str(&w, x);
	if (w.oom) {
		free(w.p);
		return -ENOMEM;
	}
	rc = mn_call(s, mn, DM_OP_FL_STATE, &w, &resp, &rlen);
	free(w.p);
	if (rc)
		return rc;
	struct dm_rbuf rb = { .p = resp, .n = rlen };

	st->mn = mn;
	st->epoch = dm_rbuf_u64(&rb);
	st->created = (int64_t)dm_rbuf_u64(&rb);
	st->dim = dm_rbuf_u32(&rb);
	st->metric = dm_rbuf_u32(&rb);
	conf = dm_rbuf_bytes(&rb, &st->conf_len, 1u << 20);
	st->frag_rows = dm_rbuf_u32(&rb);
	st->nfrag = dm_rbuf_u32(&rb);
	if (rb.bad || !st->dim || st->dim > FLAT_DIM_MAX || !st->frag_rows ||
	    st->nfrag > (rlen - rb.at) / 8 || (st->metric != DM_METRIC_L2 &&
					       st->metric != DM_METRIC_COS)) {
		free(resp);
		return -EBADMSG;
	}
	st->conf = malloc(st->conf_len + 1);
	st->fr = calloc(st->nfrag ? st->nfrag : 1, sizeof(*st->fr));
	if (!st->conf || !st->fr) {
		free(resp);
		ixstate_fini(st);
		return -ENOMEM;
	}
	memcpy(st->conf, conf, st->conf_len);
	st->conf[st->conf_len] = 0;
	for (uint32_t i = 0; i < st->nfrag; i++) {
		st->fr[i].rows = dm_rbuf_u32(&rb);
		st->fr[i].dead = dm_rbuf_u32(&rb);
		if (st->fr[i].rows > st->frag_rows || st->fr[i].dead > st->fr[i].rows)
			rb.bad = true;
	}
	free(resp);
	if (rb.bad) {
		ixstate_fini(st);
		return -EBADMSG;
	}
	return 0;
}

/* ---------------------------------------------------------------- fragment cache --- */

static void cfrag_free(struct cfrag *f)
{
	for (uint32_t r = 0; r < f->rows; r++) {
		free(f->key[r]);
		free(f->meta[r]);
	}
	free(f->vec);
	free(f->norm2);
	free(f->key);
	free(f->meta);
	free(f->mlen);
	free(f->flen);
	free(f->deadf);
	pthread_rwlock_destroy(&f->rw);
	pthread_mutex_destroy(&f->fetch);
	free(f);
}

/* Evict least recently used unreferenced fragments until the cache fits (cmu held). */
static void cache_trim(struct cn_s3 *s)
{
	while (s->cache_bytes > s->cache_cap) {
		struct cfrag **pp, **victim = NULL;

		for (pp = &s->cache; *pp; pp = &(*pp)->next)
			if (!(*pp)->refs && (!victim || (*pp)->last_use < (*victim)->last_use))
				victim = pp;
		if (!victim)
			return;
		struct cfrag *v = *victim;

		*victim = v->next;
		s->cache_bytes -= v->bytes;
		cfrag_free(v);
	}
}

/* Find or create the cache entry of a fragment (referenced; cache_put when done). Entries
 * of an older epoch of the same MN are dropped. */
static struct cfrag *cache_get(struct cn_s3 *s, const struct ixstate *st, const char *b,
			       const char *x, uint64_t frag)
{
	struct cfrag *f, **pp;

	pthread_mutex_lock(&s->cmu);
	for (pp = &s->cache; *pp;) {
		f = *pp;
		if (f->mn == st->mn && f->epoch != st->epoch && !f->refs) {
			*pp = f->next;
			s->cache_bytes -= f->bytes;
			cfrag_free(f);
			continue;
		}
		if (f->mn == st->mn && f->epoch == st->epoch && f->created == st->created &&
		    f->frag == frag && !strcmp(f->bucket, b) && !strcmp(f->index, x)) {
			f->refs++;
			f->last_use = dm_now_ns();
			pthread_mutex_unlock(&s->cmu);
			return f;
		}
		pp = &f->next;
	}
	f = calloc(1, sizeof(*f));
	if (f) {
		f->mn = st->mn;
		f->epoch = st->epoch;
		f->created = st->created;
		f->frag = frag;
		f->dim = st->dim;
		snprintf(f->bucket, sizeof(f->bucket), "%s", b);
		snprintf(f->index, sizeof(f->index), "%s", x);
		pthread_rwlock_init(&f->rw, NULL);
		pthread_mutex_init(&f->fetch, NULL);
		f->refs = 1;
		f->last_use = dm_now_ns();
		f->next = s->cache;
		s->cache = f;
	}
	pthread_mutex_unlock(&s->cmu);
	return f;
}

static void cache_put(struct cn_s3 *s, struct cfrag *f)
{
	pthread_mutex_lock(&s->cmu);
	f->refs--;
	cache_trim(s);
	pthread_mutex_unlock(&s->cmu);
}

/* Grow f's columns to hold n rows (wrlock held). */
static int cfrag_reserve(struct cfrag *f, uint32_t n)
{
	uint32_t cap = f->cap ? f->cap : 64;

	if (n <= f->cap)
		return 0;
	while (cap < n)
		cap *= 2;
	float *v = realloc(f->vec, (size_t)cap * f->dim * sizeof(float));

	if (!v)
		return -ENOMEM;
	f->vec = v;
#define GROW(field) do {                                                 \
		void *p_ = realloc(f->field, cap * sizeof(*f->field));   \
		if (!p_)                                                 \
			return -ENOMEM;                                  \
		f->field = p_;                                           \
	} while (0)
	GROW(norm2);
	GROW(key);
	GROW(meta);
	GROW(mlen);
	GROW(flen);
	GROW(deadf);
#undef GROW
	f->cap = cap;
	return 0;
}

/* Bring f up to at least the version in want (rows, dead): fetch the new rows and the
 * tombstones from the MN. 0, -ESTALE (MN restarted / index re-created), -errno. */
static int cfrag_refresh(struct cn_s3 *s, struct cfrag *f, const struct fstat *want)
{
	struct dm_buf w = { 0 };
	uint8_t *resp = NULL;
	size_t rlen;
	uint32_t from, rows;
	int rc = 0;

	pthread_mutex_lock(&f->fetch);
	pthread_rwlock_rdlock(&f->rw);
	from = f->rows;
	bool fresh = f->rows >= want->rows && f->dead >= want->dead;

	pthread_rwlock_unlock(&f->rw);
	if (fresh)
		goto out;
	dm_buf_str(&w, f->bucket);
	dm_buf_str(&w, f->index);
	dm_buf_u64(&w, f->epoch);
	dm_buf_u64(&w, (uint64_t)f->created);
	dm_buf_u64(&w, f->frag);
	dm_buf_u32(&w, from);
	dm_buf_u32(&w, MY_MSG);          /* our receive buffers: the answer's message size */
	rc = w.oom ? -ENOMEM : mn_call(s, f->mn, DM_OP_FL_FRAG, &w, &resp, &rlen);
	free(w.p);
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
	rc = cfrag_reserve(f, rows);
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
		f->bytes += (size_t)f->dim * sizeof(float) + kl + ml + fl + 64;
		f->rows = r + 1;
	}
	if (!rc) {
		uint32_t d = 0;

		for (uint32_t r = 0; r < rows; r++)
			d += (f->deadf[r] = dead[r] ? 1 : 0);
		f->dead = d;
	}
	pthread_rwlock_unlock(&f->rw);
	pthread_mutex_lock(&s->cmu);
	s->cache_bytes = 0;
	for (struct cfrag *c = s->cache; c; c = c->next)
		s->cache_bytes += c->bytes;
	pthread_mutex_unlock(&s->cmu);
out:
	pthread_mutex_unlock(&f->fetch);
	free(resp);
	return rc;
}

/* ---------------------------------------------------------------- member scan ------ */

struct mhit {
	float dist;
	uint64_t gid;                    /* frag * frag_rows + row: the single-store order */
	char *key;
	char *meta;                      /* JSON text or NULL */
};

static int mhit_cmp(const void *a, const void *b)
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

/* Scan the fragments frags[0..nf) of an index state for q: partial top-k into *out. */
static int member_scan(struct cn_s3 *s, const struct ixstate *st, const char *b,
		       const char *x, const uint64_t *frags, size_t nf,
		       const struct s3_qspec *q, struct mhit **out, size_t *nout)
{
	struct dm_topk *tk = dm_topk_new(q->k);
	struct cfrag **held = calloc(nf ? nf : 1, sizeof(*held));
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
	for (size_t i = 0; i < nf && !rc; i++) {
		struct cfrag *f;

		if (frags[i] >= st->nfrag) {
			rc = -EINVAL;
			break;
		}
		f = held[i] = cache_get(s, st, b, x, frags[i]);
		if (!f) {
			rc = -ENOMEM;
			break;
		}
		rc = cfrag_refresh(s, f, &st->fr[frags[i]]);
		if (rc)
			break;
		pthread_rwlock_rdlock(&f->rw);
		for (uint32_t r = 0; r < f->rows; r++) {
			const float *v = f->vec + (size_t)r * st->dim;
			float d;

			if (f->deadf[r])
				continue;
			if (st->metric == DM_METRIC_COS) {
				float den = qn * sqrtf(f->norm2[r]);

				d = den > 0 ? 1.0f - dm_dot(q->vec, v, st->dim) / den : 1.0f;
			} else {
				d = dm_l2sq(q->vec, v, st->dim);
			}
			if (tk->n == tk->k && !(d < dm_topk_bound(tk)))
				continue;
			if (q->filter && !s3_filter_match(q->filter, f->meta[r] + f->mlen[r],
							  f->flen[r]))
				continue;
			dm_topk_push(tk, d, frags[i] * st->frag_rows + r);
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
		struct cfrag *f = NULL;

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
	for (size_t i = 0; held && i < nf; i++)
		if (held[i])
			cache_put(s, held[i]);
	free(held);
	free(hits);
	free(res);
	dm_topk_free(tk);
	return rc;
}

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

static void scan_time_note(struct cn_s3 *s, uint64_t ns)
{
	pthread_mutex_lock(&s->rmu);
	s->scan_ns = s->scan_ns > 0 ? 0.9 * s->scan_ns + 0.1 * (double)ns : (double)ns;
	pthread_mutex_unlock(&s->rmu);
}

/* Sub-request body (JSON): the index state the ingress read, the share and the original
 * request. */
static char *subreq_json(const struct ixstate *st, const char *b, const char *x,
			 const uint64_t *frags, size_t nf, const char *body, size_t len)
{
	json_t *fa = json_array(), *o;
	char *out;

	for (size_t i = 0; i < nf; i++)
		json_array_append_new(fa, json_pack("[I,i,i]", (json_int_t)frags[i],
						    (int)st->fr[frags[i]].rows,
						    (int)st->fr[frags[i]].dead));
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
	out = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return out;
}

static void json_resp(struct s3_resp *r, json_t *o)
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
static void be_internal(void *ctx, const char *op, const char *body, size_t len,
			struct s3_resp *r)
{
	struct cn_s3 *s = ctx;
	struct ixstate st = { 0 };
	struct s3_qspec q;
	json_t *o = len ? json_loadb(body, len, 0, NULL) : NULL, *fa, *e;
	const char *b, *x, *ep, *cr, *qs, *conf;
	uint64_t *frags = NULL;
	struct mhit *hits = NULL;
	size_t nf, nh = 0, i, qlen, clen;
	int mn, dim, metric, fr, rc;

	memset(r, 0, sizeof(*r));
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
	}
	rc = s3_api_qspec_bind(qs, qlen, st.dim, st.metric, conf, (uint32_t)clen, &q, r);
	if (rc)
		goto out;
	uint64_t t0 = dm_now_ns();

	rc = member_scan(s, &st, b, x, frags, nf, &q, &hits, &nh);
	s3_qspec_fini(&q);
	if (!rc)
		scan_time_note(s, dm_now_ns() - t0);
	if (rc) {
		s3_resp_error(r, rc == -ESTALE ? 503 : 500, rc == -ESTALE ?
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
	free(frags);
	free(st.fr);
	json_decref(o);
}

/* A sub-request from another CN (over HTTP). DMANN_S3_TEST_DELAY_MS (on the CNs named by
 * DMANN_S3_TEST_DELAY_CN) delays it: how the tests make a member slow to see it hedged. */
static void be_internal_http(void *ctx, const char *op, const char *body, size_t len,
			     struct s3_resp *r)
{
	struct cn_s3 *s = ctx;

	if (s->test_delay_ms)
		usleep(s->test_delay_ms * 1000u);
	be_internal(ctx, op, body, len, r);
}

/* ---------------------------------------------------------------- HTTP client ------ */

struct hcall {
	int fd;
	uint32_t cn;                     /* target CN */
	uint32_t share;                  /* which share it serves */
	bool hedge;
	char *out;                       /* request bytes */
	size_t olen, sent;
	char *in;
	size_t ilen, icap;
	bool done, failed;
	int status;
	const char *body;                /* into in */
	size_t blen;
};

struct sig_hdrs {
	const char *host, *date, *sha, *ctype;
};

static const char *sig_hdr(void *ctx, const char *name)
{
	const struct sig_hdrs *h = ctx;

	if (!strcmp(name, "host")) return h->host;
	if (!strcmp(name, "x-amz-date")) return h->date;
	if (!strcmp(name, "x-amz-content-sha256")) return h->sha;
	if (!strcmp(name, "content-type")) return h->ctype;
	return NULL;
}

/* Start a signed POST /_dmann/ScanShare to CN cn (non-blocking). false on failure. */
static bool hcall_start(struct cn_s3 *s, struct hcall *h, uint32_t cn, const char *body)
{
	const char *hp = s->cfg->cn[cn].http;
	char host[DM_ADDR_MAX], *colon, date[32], sha[65], auth[512];
	const char *path = "/_dmann/ScanShare";
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	size_t blen = strlen(body);
	time_t now = time(NULL);
	struct tm tm;
	int fd;

	memset(h, 0, sizeof(*h));
	h->fd = -1;
	h->cn = cn;
	snprintf(host, sizeof(host), "%s", hp);
	colon = strrchr(host, ':');
	if (!colon)
		return false;
	*colon = 0;
	if (colon > host && colon[-1] == ']')
		colon[-1] = 0;                  /* [v6]:port */
	if (getaddrinfo(host[0] == '[' ? host + 1 : host, colon + 1, &hints, &ai) || !ai)
		return false;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || (connect(fd, ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS)) {
		if (fd >= 0)
			close(fd);
		freeaddrinfo(ai);
		return false;
	}
	freeaddrinfo(ai);
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	gmtime_r(&now, &tm);
	strftime(date, sizeof(date), "%Y%m%dT%H%M%SZ", &tm);
	s3_sha256_hex(body, blen, sha);
	struct sig_hdrs sh = { .host = hp, .date = date, .sha = sha,
			       .ctype = "application/json" };
	struct s3_sigv4_req sr = { .method = "POST", .path = path, .query = "",
				   .header = sig_hdr, .hctx = &sh, .body = body,
				   .body_len = blen };

	if (s3_sigv4_authorization(&sr, s->icred.access_key, s->icred.secret_key, date,
				   "us-east-1", "s3vectors",
				   "content-type;host;x-amz-content-sha256;x-amz-date", sha, auth,
				   sizeof(auth))) {
		close(fd);
		return false;
	}
	h->olen = (size_t)asprintf(&h->out,
				   "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
				   "Content-Length: %zu\r\nx-amz-date: %s\r\nx-amz-content-sha256: %s\r\n"
				   "Authorization: %s\r\nConnection: close\r\n\r\n%s",
				   path, hp, blen, date, sha, auth, body);
	if (!h->out) {
		close(fd);
		return false;
	}
	h->fd = fd;
	return true;
}

/* Parse a complete response (EOF seen). */
static void hcall_finish(struct hcall *h)
{
	char *sep;

	h->done = true;
	if (!h->in || h->ilen < 12 || strncmp(h->in, "HTTP/1.", 7)) {
		h->failed = true;
		return;
	}
	h->status = atoi(h->in + 9);
	sep = memmem(h->in, h->ilen, "\r\n\r\n", 4);
	if (!sep) {
		h->failed = true;
		return;
	}
	h->body = sep + 4;
	h->blen = h->ilen - (size_t)(h->body - h->in);
	if (h->status != 200)
		h->failed = true;
}

/* Progress on poll events. */
static void hcall_io(struct hcall *h, short ev)
{
	if (h->done)
		return;
	if (ev & (POLLERR | POLLNVAL)) {
		h->done = h->failed = true;
		return;
	}
	while ((ev & POLLOUT) && h->sent < h->olen) {
		ssize_t n = send(h->fd, h->out + h->sent, h->olen - h->sent, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				h->done = h->failed = true;
			break;
		}
		h->sent += (size_t)n;
	}
	if (ev & (POLLIN | POLLHUP)) {
		for (;;) {
			if (h->ilen + 65536 + 1 > h->icap) {
				size_t cap = DM_MAX(h->icap * 2, h->ilen + 65536 + 1);
				char *p = realloc(h->in, cap);

				if (!p) {
					h->done = h->failed = true;
					return;
				}
				h->in = p;
				h->icap = cap;
			}
			ssize_t n = recv(h->fd, h->in + h->ilen, h->icap - h->ilen - 1, 0);

			if (n > 0) {
				h->ilen += (size_t)n;
				h->in[h->ilen] = 0;
				continue;
			}
			if (n == 0)
				hcall_finish(h);
			else if (errno != EAGAIN && errno != EWOULDBLOCK)
				h->done = h->failed = true;
			break;
		}
	}
}

static void hcall_fini(struct hcall *h)
{
	if (h->fd >= 0)
		close(h->fd);
	free(h->out);
	free(h->in);
	h->fd = -1;
	h->out = h->in = NULL;
}

/* ---------------------------------------------------------------- ingress ---------- */

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

/* Merge the members' partial lists into the QueryVectors response. */
static void merge_answer(const struct ixstate *st, const struct s3_qspec *q,
			 struct share *sh, uint32_t w, struct s3_resp *r)
{
	struct mhit *all = NULL;
	size_t n = 0, cap = 0;
	json_t *arr = json_array();

	for (uint32_t j = 0; j < w; j++) {
		json_t *o = json_loadb(sh[j].resp.body, sh[j].resp.len, 0, NULL), *e;
		size_t i;

		json_array_foreach(json_object_get(o, "h"), i, e) {
			if (n == cap) {
				cap = cap ? cap * 2 : 256;
				all = realloc(all, cap * sizeof(*all));
				if (!all)
					break;
			}
			all[n].dist = (float)json_number_value(json_array_get(e, 0));
			all[n].gid = (uint64_t)json_integer_value(json_array_get(e, 1));
			all[n].key = (char *)json_string_value(json_array_get(e, 2));
			all[n].meta = (char *)json_string_value(json_array_get(e, 3));
			if (all[n].key)
				n++;
		}
		/* Keep the parsed lists alive until the answer is built. */
		json_array_append_new(arr, o ? o : json_null());
	}
	if (n)
		qsort(all, n, sizeof(*all), mhit_cmp);
	json_t *vecs = json_array();

	for (size_t i = 0; all && i < n && i < q->k; i++) {
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

/* The QueryVectors of one admitted request (search thread). */
static void be_query(void *ctx, const char *body, size_t len, struct s3_resp *r)
{
	struct cn_s3 *s = ctx;
	char b[NAME_MAX_ + 8], x[NAME_MAX_ + 8];
	uint32_t mns[DM_MAX_NODES], members[DM_MAX_NODES], owner_buf[1];
	struct dm_place_node cns[DM_MAX_NODES], gm[DM_MAX_NODES];
	struct ixstate st = { 0 };
	struct s3_qspec q = { 0 };
	struct share sh[DM_MAX_NODES];
	struct hcall *calls = NULL;
	uint64_t *fids = NULL, *fbytes = NULL, total = 0;
	uint32_t *owner = owner_buf, w, g = 0;
	int nmn, ngroups, rc = -EHOSTDOWN;
	size_t ncalls = 0;
	bool tried[DM_MAX_NODES];

	memset(sh, 0, sizeof(sh));
	if (s3_api_qspec_target(body, len, b, x, r))
		return;
	nmn = bucket_mns(s, b, mns);
	for (int i = 0; i < nmn; i++) {
		if (i + 1 < nmn && mn_is_down(s, mns[i]))
			continue;
		rc = ixstate_fetch(s, mns[i], b, x, &st);
		if (rc != -EHOSTDOWN)
			break;
	}
	if (rc == -ENOENT) {
		struct s3_resp br;
		char *gb = NULL;

		if (asprintf(&gb, "{\"vectorBucketName\":\"%s\"}", b) < 0)
			gb = NULL;
		rc = gb ? mn_s3(s, st.mn ? st.mn : mns[0], "GetVectorBucket", gb, strlen(gb), &br)
			: -ENOMEM;
		free(gb);
		s3_api_not_found(r, !rc && br.status == 404);
		if (!rc)
			s3_resp_free(&br);
		return;
	}
	if (rc) {
		if (rc == -EHOSTDOWN)
			unavailable(r, "QueryVectors", mns[0]);
		else
			s3_resp_error(r, 500, "InternalServerException", "index state: %s",
				      strerror(-rc));
		return;
	}
	if (s3_api_qspec_bind(body, len, st.dim, st.metric, st.conf, st.conf_len, &q, r))
		goto out;

	/* Plan: W from the index size, the groups over the up CNs, the shares in the group. */
	fids = calloc(st.nfrag + 1, sizeof(*fids));
	fbytes = calloc(st.nfrag + 1, sizeof(*fbytes));
	owner = calloc(st.nfrag + 1, sizeof(*owner));
	if (!fids || !fbytes || !owner) {
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < st.nfrag; i++) {
		fids[i] = i;
		fbytes[i] = (uint64_t)st.fr[i].rows * st.dim * sizeof(float);
		total += fbytes[i];
	}
	uint32_t ncn = 0;

	for (uint32_t c = 0; c < s->cfg->n_cn; c++) {
		cns[c] = (struct dm_place_node){ .id = c, .capacity = s->cfg->cn[c].capacity > 0 ?
			s->cfg->cn[c].capacity : 1.0,
			.up = s->cfg->cn[c].http[0] && cn_up(s, c) };
		ncn += cns[c].up;
	}
	w = s->force_w ? DM_MIN(s->force_w, ncn) : s3_plan_width(total, s->max_scan_bytes, ncn);
	w = DM_MAX(w, 1u);
	w = DM_MIN(w, DM_MAX(st.nfrag, 1u));
	uint64_t ixid = dm_hash64(flat_key_hash(b, strlen(b)) ^ flat_key_hash(x, strlen(x)) ^
				  (uint64_t)st.created);
	double qps = rate_note(s, ixid), sns;
	uint32_t ng;

	pthread_mutex_lock(&s->rmu);
	sns = s->scan_ns;
	pthread_mutex_unlock(&s->rmu);
	/* One group serves about (search threads / member scan time) queries per second:
	 * R = ceil(rate / that), so a rarely queried index is cached by one group only. */
	ng = s->force_r ? DM_MIN(s->force_r, DM_MAX(ncn / w, 1u)) :
	     s3_plan_groups(qps, sns > 0 ? s->search_threads * 1e9 / sns : 0, w, ncn);
	ngroups = s3_plan_members(ixid, cns, s->cfg->n_cn, w, DM_MAX(ng, 1u), members);
	if (ngroups <= 0) {
		/* No CN gateway is up but this one (it is always counted up): scan alone. */
		w = 1;
		ngroups = 1;
		members[0] = s->node->id;
	}
	/* This CN's group when it is in one (one hop less), else a random group. */
	g = (uint32_t)(dm_now_ns() % (uint64_t)ngroups);
	for (int gi = 0; gi < ngroups; gi++)
		for (uint32_t j = 0; j < w; j++)
			if (members[(uint32_t)gi * w + j] == s->node->id)
				g = (uint32_t)gi;
	for (uint32_t j = 0; j < w; j++)
		gm[j] = cns[members[g * w + j]];
	if (st.nfrag && s3_plan_shares(fids, fbytes, st.nfrag, gm, w, S3_PLAN_LOAD_CAP, owner)) {
		s3_resp_error(r, 500, "InternalServerException", "share planning failed");
		goto out;
	}
	for (uint32_t j = 0; j < w; j++) {
		sh[j].frags = calloc(st.nfrag + 1, sizeof(uint64_t));
		if (!sh[j].frags) {
			s3_resp_error(r, 500, "InternalServerException", "out of memory");
			goto out;
		}
	}
	for (uint32_t i = 0; i < st.nfrag; i++)
		sh[owner[i]].frags[sh[owner[i]].nf++] = i;
	for (uint32_t j = 0; j < w; j++) {
		sh[j].req = subreq_json(&st, b, x, sh[j].frags, sh[j].nf, body, len);
		if (!sh[j].req) {
			s3_resp_error(r, 500, "InternalServerException", "out of memory");
			goto out;
		}
	}

	/* Fan out: remote members by HTTP, this CN's share (if any) right here. */
	calls = calloc(4 * (size_t)w + 4, sizeof(*calls));
	if (!calls) {
		s3_resp_error(r, 500, "InternalServerException", "out of memory");
		goto out;
	}
	memset(tried, 0, sizeof(tried));
	int local = -1;

	for (uint32_t j = 0; j < w; j++) {
		uint32_t c = members[g * w + j];

		sh[j].t0 = dm_now_ns();
		if (c == s->node->id) {
			local = (int)j;
			continue;
		}
		if (hcall_start(s, &calls[ncalls], c, sh[j].req)) {
			calls[ncalls].share = j;
			sh[j].tries++;
			ncalls++;
			__atomic_add_fetch(&s->subreqs, 1, __ATOMIC_RELAXED);
		} else {
			__atomic_store_n(&s->cn_down[c], dm_now_ns() + CN_DOWN_NS, __ATOMIC_RELAXED);
		}
	}
	if (local >= 0) {
		be_internal(s, "ScanShare", sh[local].req, strlen(sh[local].req), &sh[local].resp);
		sh[local].have = true;
	}
	/* Shares whose first sub-request could not even start: run them here too. */
	for (uint32_t j = 0; j < w; j++)
		if (!sh[j].have && !sh[j].tries) {
			be_internal(s, "ScanShare", sh[j].req, strlen(sh[j].req), &sh[j].resp);
			sh[j].have = true;
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
				(calls[i].sent < calls[i].olen ? POLLOUT : 0) };
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
			uint32_t c = alt_cn(s, members, w, ngroups, g, j, tried);

			sh[j].tries++;
			__atomic_add_fetch(inflight ? &s->hedges : &s->retries, 1, __ATOMIC_RELAXED);
			if (c == s->node->id) {
				be_internal(s, "ScanShare", sh[j].req, strlen(sh[j].req), &sh[j].resp);
				sh[j].have = true;
				continue;
			}
			if (hcall_start(s, &calls[ncalls], c, sh[j].req)) {
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
				goto out;
			}
			break;
		}
		int left = s->hedge_ms;

		for (uint32_t j = 0; j < w; j++)
			if (!sh[j].have && now - sh[j].t0 > (uint64_t)SUB_TIMEOUT_MS * 1000000ull) {
				s3_resp_error(r, 503, "ServiceUnavailableException",
					      "a scan member timed out; retry later");
				goto out;
			}
		if (poll(pf, np, left) < 0 && errno != EINTR) {
			s3_resp_error(r, 500, "InternalServerException", "poll: %s", strerror(errno));
			goto out;
		}
		for (size_t p = 0; p < np; p++) {
			struct hcall *h = &calls[idx[p]];

			if (!pf[p].revents)
				continue;
			hcall_io(h, pf[p].revents);
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
			t->resp.body = malloc(h->blen + 1);
			if (!t->resp.body) {
				s3_resp_error(r, 500, "InternalServerException", "out of memory");
				goto out;
			}
			memcpy(t->resp.body, h->body, h->blen);
			t->resp.body[h->blen] = 0;
			t->resp.len = h->blen;
			t->have = true;
		}
	}
	for (uint32_t j = 0; j < w; j++)
		if (sh[j].resp.status != 200) {
			*r = sh[j].resp;
			memset(&sh[j].resp, 0, sizeof(sh[j].resp));
			goto out;
		}
	merge_answer(&st, &q, sh, w, r);
out:
	for (size_t i = 0; i < ncalls; i++)
		hcall_fini(&calls[i]);
	free(calls);
	for (uint32_t j = 0; j < DM_MAX_NODES && j < s->cfg->n_cn + 1; j++) {
		free(sh[j].frags);
		free(sh[j].req);
		s3_resp_free(&sh[j].resp);
	}
	if (owner != owner_buf)
		free(owner);
	free(fids);
	free(fbytes);
	s3_qspec_fini(&q);
	ixstate_fini(&st);
}

/* ---------------------------------------------------------------- start / stop ----- */

struct cn_s3 *cn_s3_start(const struct dm_cluster_cfg *cfg, const struct dm_node_cfg *node)
{
	struct cn_s3 *s;
	char host[DM_ADDR_MAX], *colon, *end;
	unsigned long port;
	int err;

	if (!node->http[0] || !cfg->s3_access_key[0] || !cfg->s3_secret_key[0]) {
		errno = ENOENT;
		return NULL;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		errno = ENOMEM;
		return NULL;
	}
	s->cfg = cfg;
	s->node = node;
	s->redundancy = DM_MAX(1u, DM_MIN(cfg->redundancy ? cfg->redundancy : 1, cfg->n_mn));
	s->force_w = (uint32_t)env_u64("DMANN_S3_WIDTH", 0, 0, DM_MAX_NODES);
	s->force_r = (uint32_t)env_u64("DMANN_S3_GROUPS", 0, 0, DM_MAX_NODES);
	pthread_mutex_init(&s->rmu, NULL);
	s->max_scan_bytes = env_u64("DMANN_S3_MAX_SCAN_MB", 256, 1, 1u << 20) << 20;
	s->hedge_ms = (uint32_t)env_u64("DMANN_S3_HEDGE_MS", 50, 1, 60000);
	s->cache_cap = env_u64("DMANN_S3_CACHE_MB", 2048, 1, 1u << 24) << 20;
	const char *dcn = getenv("DMANN_S3_TEST_DELAY_CN");

	if (dcn && *dcn && strtoul(dcn, NULL, 10) == node->id)
		s->test_delay_ms = (uint32_t)env_u64("DMANN_S3_TEST_DELAY_MS", 0, 0, 60000);
	pthread_mutex_init(&s->cmu, NULL);
	for (uint32_t i = 0; i < cfg->n_mn; i++)
		pthread_mutex_init(&s->mn[i].mu, NULL);
	s->cred.access_key = (char *)cfg->s3_access_key;
	s->cred.secret_key = (char *)cfg->s3_secret_key;
	/* Sub-requests between CNs are signed with a key only cluster members can derive: an
	 * HMAC of the cluster secret (S3 users hold the [s3] key, not this one). */
	{
		uint8_t mac[32];
		unsigned int ml = sizeof(mac);

		HMAC(EVP_sha256(), cfg->secret, (int)cfg->secret_len,
		     (const uint8_t *)"dmann-s3-internal", 17, mac, &ml);
		for (unsigned i = 0; i < 32; i++)
			sprintf(s->isecret + 2 * i, "%02x", mac[i]);
		snprintf(s->ikey, sizeof(s->ikey), "DMANNCLUSTER%02X%02X", mac[30], mac[31]);
		s->icred = (struct s3_cred){ .access_key = s->ikey, .secret_key = s->isecret };
		s->iauth = (struct s3_sigv4_cfg){ .creds = &s->icred, .ncreds = 1,
						  .service = "s3vectors", .max_skew_s = 900 };
	}

	s->x = dm_cluster_xport(cfg, NULL);
	if (!s->x) {
		err = errno;
		goto err_free;
	}
	/* Our own context: S3 streams never share receive buffers with the HNSW path. */
	s->pool = dm_msgpool_new(s->x, 256, MY_MSG);
	if (!s->pool) {
		err = errno;
		dm_err("cn%u: s3: cannot post receive buffers: %s", node->id, strerror(err));
		goto err_close_x;
	}
	snprintf(host, sizeof(host), "%s", node->http);
	colon = strrchr(host, ':');
	port = colon ? strtoul(colon + 1, &end, 10) : 0;
	if (!colon || *end || port > 65535) {
		dm_err("cn%u: http = %s is not host:port", node->id, node->http);
		err = EINVAL;
		goto err_free_pool;
	}
	*colon = 0;
	s->search_threads = (uint32_t)env_u64("DMANN_S3_SEARCH_THREADS", 0, 0, 256);
	s->be = (struct s3_backend){ .ctx = s, .handle = be_handle, .query = be_query,
				     .internal = be_internal_http, .internal_auth = &s->iauth };
	struct s3_http_cfg hc = {
		.addr = host[0] == '[' ? NULL : host,
		.port = (uint16_t)port,
		.backend = &s->be,
		.auth = { .creds = &s->cred, .ncreds = 1, .service = "s3vectors",
			  .region = NULL, .max_skew_s = 900 },
		.http_threads = (unsigned)env_u64("DMANN_S3_HTTP_THREADS", 8, 1, 256),
		.search_threads = s->search_threads,
		.queue_depth = (unsigned)env_u64("DMANN_S3_QUEUE_DEPTH", 64, 1, 1u << 20),
	};

	s->http = s3_http_start(&hc);
	if (s->http && !s->search_threads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		s->search_threads = n > 0 ? (uint32_t)n : 1;   /* s3_http's default */
	}
	if (!s->http) {
		err = errno;
		dm_err("cn%u: s3: cannot serve on %s: %s", node->id, node->http, strerror(err));
		goto err_free_pool;
	}
	dm_info("cn%u: S3 Vectors gateway on %s (%u memory nodes, redundancy %u)", node->id,
		node->http, cfg->n_mn, s->redundancy);
	return s;

err_free_pool:
	dm_msgpool_free(s->pool);
err_close_x:
	dm_xport_close(s->x);
err_free:
	free(s);
	errno = err;
	return NULL;
}

void cn_s3_stop(struct cn_s3 *s)
{
	if (!s)
		return;
	s3_http_stop(s->http);
	for (uint32_t i = 0; i < s->cfg->n_mn; i++) {
		while (s->mn[i].idle) {
			struct mnconn *mc = s->mn[i].idle;

			s->mn[i].idle = mc->next;
			mnconn_free(mc);
		}
		pthread_mutex_destroy(&s->mn[i].mu);
	}
	while (s->cache) {
		struct cfrag *f = s->cache;

		s->cache = f->next;
		cfrag_free(f);
	}
	dm_info("cn%u: s3: %llu sub-requests, %llu hedged, %llu retried, %llu fragment fetches",
		s->node->id, (unsigned long long)s->subreqs, (unsigned long long)s->hedges,
		(unsigned long long)s->retries, (unsigned long long)s->fetches);
	dm_msgpool_free(s->pool);
	dm_xport_close(s->x);
	pthread_mutex_destroy(&s->cmu);
	pthread_mutex_destroy(&s->rmu);
	free(s);
}
