/* cn_s3_repl.c: replicas of S3 buckets that missed writes, on the compute node.
 *
 * A write that cannot reach every replica of its bucket is acknowledged once [s3]
 * write_min_replicas of them have it durable, after the missed replicas were marked stale
 * in the cluster state (common/etcd/stale.h; no mark, no acknowledgement). Reads skip stale
 * replicas. The controller (the compute node in office, cstate.h) runs the catch-up: for a
 * stale replica X that is up again, and a caught-up replica S of the same bucket,
 *   1. FL_CATCHUP BEGIN on X: from now on X logs every write of the bucket it applies;
 *   2. FL_IMAGE TAKE on S: an image of the bucket at one instant (after step 1), read in
 *      chunks and sent to X (FL_CATCHUP DATA);
 *   3. FL_CATCHUP END on X: X installs the image and runs the logged writes again, in
 *      their order, with its writes held out; durable before it answers;
 *   4. the stale mark is deleted, guarded by the revision it had before step 1: a write
 *      that missed X meanwhile marked it again (a new revision), and the next round
 *      catches up again.
 * Why no write is lost: a write reaches the caught-up replicas before the stale ones (the
 * gateway sends to stale replicas last), so a write missing from the image (applied on S
 * after step 2's instant) reached X after step 1 and is in X's log. A compute node that
 * has not yet seen a mark (the watch lags by a poll) may still send in placement order;
 * the catch-up waits STALE_SETTLE_S after the last mark before it starts. */
#include "cn_s3_int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster.h"

#if DM_HAVE_ETCD
#include "etcd.h"
#include "stale.h"

#define STALE_SETTLE_S 2               /* seconds after the last mark before a catch-up */
#define CATCHUP_PERIOD_MS 500
#define CATCHUP_BACKOFF_NS 5000000000ull
#define CATCHUP_END_MS 600000          /* install + snapshot on X: large buckets take long */
#define REPL_ETCD_MS 2000
#define STALE_LIST_MAX 256

bool repl_marks(struct cn_s3 *s)
{
	return s->repl.watch != NULL;
}

bool replica_stale(struct cn_s3 *s, const char *b, uint32_t mn)
{
	return dm_stalewatch_has(s->repl.watch, b, mn);
}

int mark_stale(struct cn_s3 *s, const char *b, uint32_t mn)
{
	struct s3_repl *r = &s->repl;
	char by[16];
	int rc;

	if (!r->watch)
		return -ENOTSUP;
	snprintf(by, sizeof(by), "cn%u", s->node->id);
	pthread_mutex_lock(&r->mu);
	rc = r->etcd ? dm_stale_put(r->etcd, s->cfg->name, b, mn, by) : -ENOTCONN;
	if (rc && rc != -ENOTCONN)   /* once more: a loaded etcd may miss one time bound */
		rc = dm_stale_put(r->etcd, s->cfg->name, b, mn, by);
	if (rc)
		dm_warn("cn%u: s3: cannot mark replica mn%u of bucket %s stale (%s): the write is "
			"not acknowledged", s->node->id, mn, b,
			r->etcd ? dm_etcd_errmsg(r->etcd) : "no etcd handle");
	pthread_mutex_unlock(&r->mu);
	if (rc) {
		__atomic_add_fetch(&r->mark_errors, 1, __ATOMIC_RELAXED);
		return rc;
	}
	dm_stalewatch_note(r->watch, b, mn);
	__atomic_add_fetch(&r->marks, 1, __ATOMIC_RELAXED);
	return 0;
}

/* ---- the catch-up (controller) ---- */

/* One FL_CATCHUP / FL_IMAGE call: phase, then the rest of the request from w (freed). */
static int fl(struct cn_s3 *s, uint32_t mn, uint16_t op, struct dm_buf *w, uint8_t **resp,
	      size_t *rlen, int timeout_ms)
{
	*resp = NULL;
	return mn_call_timeout(s, mn, op, w, resp, rlen, timeout_ms);
}

static int catchup_begin(struct cn_s3 *s, uint32_t x, const char *b, uint64_t *id)
{
	struct dm_buf w = { 0 };
	uint8_t *resp;
	size_t rlen;
	int rc;

	dm_buf_u32(&w, DM_FL_CATCHUP_BEGIN);
	dm_buf_str(&w, b);
	rc = fl(s, x, DM_OP_FL_CATCHUP, &w, &resp, &rlen, FL_TIMEOUT_MS);
	if (!rc && rlen != 8)
		rc = -EBADMSG;
	if (!rc)
		*id = dm_get_le64(resp);
	free(resp);
	return rc;
}

static void simple(struct cn_s3 *s, uint32_t mn, uint16_t op, uint32_t phase, uint64_t id)
{
	struct dm_buf w = { 0 };
	uint8_t *resp;
	size_t rlen;

	dm_buf_u32(&w, phase);
	dm_buf_u64(&w, id);
	fl(s, mn, op, &w, &resp, &rlen, FL_TIMEOUT_MS);
	free(resp);
}

/* Catch replica x of bucket b up from replica src: *bytes gets the image's size. */
static int catch_up(struct cn_s3 *s, const char *b, uint32_t src, uint32_t x, uint64_t *bytes)
{
	struct dm_buf w = { 0 };
	uint64_t cid = 0, img = 0, len = 0;
	uint8_t *resp = NULL;
	size_t rlen;
	bool exists = true, have_img = false;
	int rc;

	*bytes = 0;
	rc = catchup_begin(s, x, b, &cid);
	if (rc)
		return rc;
	dm_buf_u32(&w, DM_FL_IMAGE_TAKE);
	dm_buf_str(&w, b);
	rc = fl(s, src, DM_OP_FL_IMAGE, &w, &resp, &rlen, CATCHUP_END_MS);
	if (rc == -ENOENT) {
		exists = false;      /* the bucket is gone on the caught-up replicas */
		rc = 0;
	} else if (!rc && rlen != 16) {
		rc = -EBADMSG;
	} else if (!rc) {
		img = dm_get_le64(resp);
		len = dm_get_le64(resp + 8);
		have_img = true;
	}
	free(resp);
	resp = NULL;
	for (uint64_t off = 0; !rc && exists && off < len;) {
		uint32_t max = (uint32_t)DM_MIN(len - off, (uint64_t)DM_FL_IMAGE_CHUNK);

		dm_buf_u32(&w, DM_FL_IMAGE_READ);
		dm_buf_u64(&w, img);
		dm_buf_u64(&w, off);
		dm_buf_u32(&w, max);
		rc = fl(s, src, DM_OP_FL_IMAGE, &w, &resp, &rlen, FL_TIMEOUT_MS * 3);
		struct dm_rbuf rb = { .p = resp, .n = rc ? 0 : rlen };
		uint32_t blen = 0;
		const void *bytes = rc ? NULL : dm_rbuf_bytes(&rb, &blen, max);

		if (!rc && (rb.bad || rb.at != rb.n || !blen))
			rc = -EBADMSG;
		if (!rc) {
			uint8_t *r2;
			size_t r2len;

			dm_buf_u32(&w, DM_FL_CATCHUP_DATA);
			dm_buf_u64(&w, cid);
			dm_buf_u64(&w, off);
			dm_buf_bytes(&w, bytes, blen);
			rc = fl(s, x, DM_OP_FL_CATCHUP, &w, &r2, &r2len, FL_TIMEOUT_MS * 3);
			free(r2);
			off += blen;
		}
		free(resp);
		resp = NULL;
	}
	if (!rc) {
		dm_buf_u32(&w, DM_FL_CATCHUP_END);
		dm_buf_u64(&w, cid);
		dm_buf_put(&w, &(uint8_t){ exists }, 1);
		rc = fl(s, x, DM_OP_FL_CATCHUP, &w, &resp, &rlen, CATCHUP_END_MS);
		free(resp);
	}
	if (have_img)
		simple(s, src, DM_OP_FL_IMAGE, DM_FL_IMAGE_DROP, img);
	if (rc)
		simple(s, x, DM_OP_FL_CATCHUP, DM_FL_CATCHUP_ABORT, cid);
	*bytes = len;
	return rc;
}

static bool node_down(struct cn_s3 *s, uint32_t mn)
{
	return mn_is_down(s, mn) || (s->gops && s->gops->mn_down && s->gops->mn_down(s->gctx, mn));
}

/* One look at the stale marks (controller only). */
static void catchup_round(struct cn_s3 *s, struct dm_etcd *e)
{
	struct s3_repl *r = &s->repl;
	struct dm_stale *st = malloc(STALE_LIST_MAX * sizeof(*st));
	size_t n = st ? dm_stalewatch_list(r->watch, st, STALE_LIST_MAX) : 0;
	time_t now = time(NULL);

	for (size_t i = 0; i < n && i < STALE_LIST_MAX; i++) {
		uint32_t mns[DM_MAX_NODES], x = st[i].mn, src = UINT32_MAX;
		int nm;
		uint64_t bytes, t0;
		bool cleared;
		int rc;

		bool holds = false;

		if (st[i].mod_revision <= 0 || x >= s->cfg->n_mn || st[i].bucket[0] == '#')
			continue;   /* ("#g<n>": a graph's mark, cn_hcatchup.c) */
		nm = bucket_mns(s, st[i].bucket, mns);
		for (int j = 0; j < nm; j++)
			holds |= mns[j] == x;
		if (!holds) {
			/* Not (or no longer: retired by the placement) a replica of the bucket:
			 * nothing to catch up. (Only once this node follows the placement that
			 * moved it: the mark was put before that placement was published.) */
			const struct cn_s3_graph_ops *g = __atomic_load_n(&s->gops, __ATOMIC_ACQUIRE);
			int64_t pv = g && g->placement ? g->placement(s->gctx, NULL) : 0;

			if (nm > 0 && pv == __atomic_load_n(&r->pver, __ATOMIC_ACQUIRE) &&
			    !dm_stale_clear(e, s->cfg->name, &st[i], &cleared) && cleared)
				dm_info("cn%u: s3: mn%u no longer holds bucket %s: its stale mark "
					"dropped", s->node->id, x, st[i].bucket);
			continue;
		}
		if (now - st[i].since < STALE_SETTLE_S || dm_now_ns() < r->retry_at[x] ||
		    node_down(s, x))
			continue;
		for (int j = 0; j < nm && src == UINT32_MAX; j++)
			if (mns[j] != x && !replica_stale(s, st[i].bucket, mns[j]) &&
			    !node_down(s, mns[j]))
				src = mns[j];
		if (src == UINT32_MAX)
			continue;     /* no caught-up replica reachable: later */
		t0 = dm_now_ns();
		rc = catch_up(s, st[i].bucket, src, x, &bytes);
		if (rc) {
			__atomic_add_fetch(&r->catchup_errors, 1, __ATOMIC_RELAXED);
			r->retry_at[x] = dm_now_ns() + CATCHUP_BACKOFF_NS;
			dm_warn("cn%u: s3: catch-up of bucket %s on mn%u from mn%u failed: %s; again "
				"in %llu s", s->node->id, st[i].bucket, x, src, strerror(-rc),
				CATCHUP_BACKOFF_NS / 1000000000ull);
			continue;
		}
		__atomic_add_fetch(&r->catchup_bytes, bytes, __ATOMIC_RELAXED);
		__atomic_add_fetch(&r->catchup_ms, (dm_now_ns() - t0) / 1000000ull, __ATOMIC_RELAXED);
		rc = dm_stale_clear(e, s->cfg->name, &st[i], &cleared);
		if (rc || !cleared) {
			dm_info("cn%u: s3: bucket %s caught up on mn%u from mn%u (%llu bytes), but %s: "
				"again", s->node->id, st[i].bucket, x, src, (unsigned long long)bytes,
				rc ? dm_etcd_errmsg(e) : "a write missed it meanwhile");
			continue;
		}
		__atomic_add_fetch(&r->catchups, 1, __ATOMIC_RELAXED);
		dm_info("cn%u: s3: bucket %s caught up on mn%u from mn%u: %llu bytes in %.2f s", 
			s->node->id, st[i].bucket, x, src, (unsigned long long)bytes,
			(double)(dm_now_ns() - t0) / 1e9);
	}
	free(st);
}

static void *catchup_thread(void *arg)
{
	struct cn_s3 *s = arg;
	struct s3_repl *r = &s->repl;
	struct dm_etcd *e = dm_etcd_open(s->cfg->etcd, REPL_ETCD_MS);

	if (!e)
		dm_warn("cn%u: s3: no catch-up of stale replicas: %s", s->node->id, strerror(errno));
	pthread_mutex_lock(&r->mu);
	while (!r->stop) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += CATCHUP_PERIOD_MS * 1000000l;
		ts.tv_sec += ts.tv_nsec / 1000000000l;
		ts.tv_nsec %= 1000000000l;
		pthread_cond_timedwait(&r->cv, &r->mu, &ts);
		if (r->stop)
			break;
		pthread_mutex_unlock(&r->mu);
		const struct cn_s3_graph_ops *g = __atomic_load_n(&s->gops, __ATOMIC_ACQUIRE);

		if (e && g && g->leader && g->leader(s->gctx) && dm_stalewatch_list(r->watch, NULL, 0))
			catchup_round(s, e);
		pthread_mutex_lock(&r->mu);
	}
	pthread_mutex_unlock(&r->mu);
	dm_etcd_close(e);
	return NULL;
}

int repl_start(struct cn_s3 *s)
{
	struct s3_repl *r = &s->repl;
	int err;

	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	pthread_mutex_init(&r->pmu, NULL);
	if (!s->cfg->etcd[0])
		return 0;
	r->watch = dm_stalewatch_start(s->cfg);
	if (!r->watch) {
		dm_warn("cn%u: s3: not following stale replicas (%s): every write needs every "
			"replica", s->node->id, strerror(errno));
		return 0;
	}
	r->etcd = dm_etcd_open(s->cfg->etcd, REPL_ETCD_MS);
	err = pthread_create(&r->t, NULL, catchup_thread, s);
	if (err) {
		dm_warn("cn%u: s3: no catch-up thread: %s", s->node->id, strerror(err));
		return 0;
	}
	r->started = true;
	return 0;
}

void repl_stop(struct cn_s3 *s)
{
	struct s3_repl *r = &s->repl;

	if (r->started) {
		pthread_mutex_lock(&r->mu);
		r->stop = true;
		pthread_cond_broadcast(&r->cv);
		pthread_mutex_unlock(&r->mu);
		pthread_join(r->t, NULL);
		r->started = false;
	}
	dm_stalewatch_stop(r->watch);
	r->watch = NULL;
	dm_etcd_close(r->etcd);
	r->etcd = NULL;
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	pthread_mutex_destroy(&r->pmu);
}

size_t repl_stale_count(struct cn_s3 *s)
{
	return dm_stalewatch_list(s->repl.watch, NULL, 0);
}

/* Before buckets move to a new placement: the stale marks the controller put before it
 * published it (the replicas it adds) are read into the watch's copy, so that reads skip
 * those replicas at once (the watch itself may be a poll behind). false without a watch
 * (buckets do not move then) or when etcd cannot be read (the next request tries again). */
static bool marks_read(struct cn_s3 *s)
{
	struct s3_repl *r = &s->repl;
	struct dm_stale *st = NULL;
	size_t n = 0;
	int rc;

	if (!r->watch)
		return false;
	pthread_mutex_lock(&r->mu);
	rc = r->etcd ? dm_stale_list(r->etcd, s->cfg->name, &st, &n) : -ENOTCONN;
	pthread_mutex_unlock(&r->mu);
	for (size_t i = 0; !rc && i < n; i++)
		dm_stalewatch_note(r->watch, st[i].bucket, st[i].mn);
	free(st);
	return rc == 0;
}

/* Mark the replicas of bucket b that placement nx adds to those of old. */
static int prepare_bucket(struct cn_s3 *s, const char *b, const uint64_t *old,
			  const uint64_t *nx, uint32_t *marked)
{
	uint32_t a[DM_MAX_NODES], c[DM_MAX_NODES];
	int na = flat_bucket_mns_placed(s->cfg, old, b, a), nc = flat_bucket_mns_placed(s->cfg, nx,
										       b, c);

	for (int i = 0; i < nc; i++) {
		bool had = false;
		int rc;

		for (int j = 0; j < na; j++)
			had |= a[j] == c[i];
		if (had)
			continue;
		rc = mark_stale(s, b, c[i]);
		if (rc)
			return rc;
		(*marked)++;
	}
	return 0;
}

int cn_s3_placement_prepare(struct cn_s3 *s, const uint64_t *old, const uint64_t *nx)
{
	json_t *done = json_object();
	uint32_t marked = 0, lists = 0;
	int rc = 0;

	if (!s || !s->repl.watch) {
		json_decref(done);
		return 0;   /* buckets do not follow the placement without the stale marks */
	}
	for (uint32_t mn = 0; mn < s->cfg->n_mn && !rc && done; mn++) {
		char *tok = NULL;

		if (node_down(s, mn))
			continue;
		for (;;) {
			json_t *req = tok ? json_pack("{s:i, s:s}", "maxResults", 100, "nextToken", tok)
					  : json_pack("{s:i}", "maxResults", 100), *o, *e;
			char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
			struct s3_resp one;
			size_t i;
			int crc;

			json_decref(req);
			free(tok);
			tok = NULL;
			crc = body ? mn_s3(s, mn, "ListVectorBuckets", body, strlen(body), &one) : -ENOMEM;
			free(body);
			if (crc || one.status != 200) {
				if (!crc)
					s3_resp_free(&one);
				break;        /* this node's list is not needed: the others have them */
			}
			o = json_loadb(one.body, one.len, 0, NULL);
			s3_resp_free(&one);
			json_array_foreach(json_object_get(o, "vectorBuckets"), i, e) {
				const char *b = json_string_value(json_object_get(e, "vectorBucketName"));

				if (!b || json_object_get(done, b))
					continue;
				json_object_set_new(done, b, json_true());
				rc = prepare_bucket(s, b, old, nx, &marked);
				if (rc)
					break;
			}
			if (!rc && json_is_string(json_object_get(o, "nextToken")))
				tok = strdup(json_string_value(json_object_get(o, "nextToken")));
			json_decref(o);
			if (rc || !tok)
				break;
		}
		free(tok);
		lists++;
	}
	dm_info("cn%u: s3: next placement: %zu bucket(s) listed on %u memory node(s), %u new "
		"replica(s) marked stale (filled by catch-up)%s", s->node->id,
		done ? json_object_size(done) : 0, lists, marked, rc ? ": failed" : "");
	json_decref(done);
	return done ? rc : -ENOMEM;
}

#else /* !DM_HAVE_ETCD: every write needs every replica */

bool repl_marks(struct cn_s3 *s)
{
	(void)s;
	return false;
}
bool replica_stale(struct cn_s3 *s, const char *b, uint32_t mn)
{
	(void)s, (void)b, (void)mn;
	return false;
}
int mark_stale(struct cn_s3 *s, const char *b, uint32_t mn)
{
	(void)s, (void)b, (void)mn;
	return -ENOTSUP;
}
int repl_start(struct cn_s3 *s)
{
	pthread_mutex_init(&s->repl.pmu, NULL);
	return 0;
}
void repl_stop(struct cn_s3 *s)
{
	pthread_mutex_destroy(&s->repl.pmu);
}
size_t repl_stale_count(struct cn_s3 *s)
{
	(void)s;
	return 0;
}
static bool marks_read(struct cn_s3 *s)
{
	(void)s;
	return false;
}
int cn_s3_placement_prepare(struct cn_s3 *s, const uint64_t *old, const uint64_t *nx)
{
	(void)s, (void)old, (void)nx;
	return 0;
}
#endif

int bucket_mns(struct cn_s3 *s, const char *bucket, uint32_t *out)
{
	const struct cn_s3_graph_ops *g = __atomic_load_n(&s->gops, __ATOMIC_ACQUIRE);
	struct s3_repl *r = &s->repl;
	uint64_t ret[DM_MAX_NODES / 64];

	if (g && g->placement) {
		int64_t v = g->placement(s->gctx, NULL);

		if (v != __atomic_load_n(&r->pver, __ATOMIC_ACQUIRE)) {
			int64_t v2 = g->placement(s->gctx, ret);

			/* A new placement moves buckets only once the stale marks of the
			 * replicas it adds (put before it was published) are known here. */
			if (marks_read(s)) {
				pthread_mutex_lock(&r->pmu);
				memcpy(r->retired, ret, sizeof(ret));
				__atomic_store_n(&r->pver, v2, __ATOMIC_RELEASE);
				pthread_mutex_unlock(&r->pmu);
				dm_info("cn%u: s3: buckets follow placement version %lld",
					s->node->id, (long long)v2);
			}
		}
	}
	pthread_mutex_lock(&r->pmu);
	memcpy(ret, r->retired, sizeof(ret));
	pthread_mutex_unlock(&r->pmu);
	return flat_bucket_mns_placed(s->cfg, ret, bucket, out);
}

int bucket_read_mns(struct cn_s3 *s, const char *b, uint32_t *out)
{
	int n = bucket_mns(s, b, out), k = 0;

	for (int i = 0; i < n; i++)
		if (!replica_stale(s, b, out[i]))
			out[k++] = out[i];
	return n < 0 ? n : k;
}
