/* etcd_watch.c: prefix watches by polling (see dm_etcd_watch_poll in etcd.h). The 3.4
 * gateway's /v3/watch is a streaming POST answering newline-delimited JSON messages: one
 * poll opens a stream from the start revision, reads messages until the first one with
 * events (or the time bound), closes it and delivers the events. The stream messages are
 * parsed by dm_etcd_ans_watch (etcd_json.c). */
#include "etcd_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wstate {
	struct dm_etcd *e;
	struct dm_buf line;              /* the message being received */
	long status;                     /* HTTP status (0 until the first byte) */
	int64_t from, now;               /* the start revision; the store's at creation + 1 */
	bool created, done;
	int err;
	struct dm_etcd_wmsg m;           /* the first message with events */
};

/* One stream message: 0, or -errno (e->err set) to stop. */
static int wline(struct wstate *w, const void *p, size_t n)
{
	struct dm_etcd_wmsg m;
	json_t *r;
	int rc;

	if ((rc = dm_etcd_answer(w->e, "/v3/watch", 200, p, n, &r)))
		return rc;
	rc = dm_etcd_ans_watch(r, &m);
	json_decref(r);
	if (rc)
		return dm_etcd_fail(w->e, rc, "/v3/watch: malformed stream message");
	if (m.canceled) {
		dm_etcd_wmsg_free(&m);
		if (m.compact_revision > 0)
			return dm_etcd_fail(w->e, -ESTALE, "watch from revision %lld: compacted "
					    "(the oldest kept is %lld)", (long long)w->from,
					    (long long)m.compact_revision);
		return dm_etcd_fail(w->e, -ECANCELED, "watch canceled: %s", m.reason);
	}
	if (m.created) {
		if (w->from == 0 && m.revision <= 0) {
			dm_etcd_wmsg_free(&m);
			return dm_etcd_fail(w->e, -EBADMSG, "/v3/watch: created without a revision");
		}
		w->created = true;
		w->now = m.revision + 1;
	}
	if (m.nev && w->created) {
		w->m = m;
		w->done = true;
	} else {
		dm_etcd_wmsg_free(&m);
	}
	return 0;
}

static bool blank(const uint8_t *p, size_t n)
{
	while (n && (*p == ' ' || *p == '\r' || *p == '\t' || *p == '\n'))
		p++, n--;
	return n == 0;
}

static size_t wwr(char *p, size_t sz, size_t nm, void *ctx)
{
	struct wstate *w = ctx;
	size_t n = sz * nm, at = 0, scan = w->line.n;
	uint8_t *nl;

	if (!w->status)
		w->e->cu->easy_getinfo(w->e->wcurl, CURLINFO_RESPONSE_CODE, &w->status);
	if (w->line.n + n > DM_ETCD_ANSWER_MAX) {
		w->err = dm_etcd_fail(w->e, -EBADMSG, "/v3/watch: a message over %u bytes",
				      DM_ETCD_ANSWER_MAX);
		return 0;
	}
	dm_buf_put(&w->line, p, n);
	if (w->line.oom) {
		w->err = dm_etcd_fail(w->e, -ENOMEM, "out of memory");
		return 0;
	}
	if (w->status != 200)
		return n;                     /* an error answer: read whole */
	while (!w->done && (nl = memchr(w->line.p + scan, '\n', w->line.n - scan))) {
		size_t l = (size_t)(nl - (w->line.p + at));

		if (!blank(w->line.p + at, l) && (w->err = wline(w, w->line.p + at, l)))
			return 0;
		at = scan = at + l + 1;
	}
	if (w->done)
		return 0;                     /* stop the transfer: -ECANCELED */
	memmove(w->line.p, w->line.p + at, w->line.n - at);
	w->line.n -= at;
	return n;
}

int dm_etcd_watch_poll(struct dm_etcd *e, const char *prefix, int64_t *from_revision,
		       int timeout_ms, void (*cb)(void *arg, const struct dm_etcd_event *ev),
		       void *arg)
{
	struct wstate w = { .e = e };
	struct dm_buf q = { 0 };
	int64_t last = 0;
	json_t *a;
	int rc, cnt = 0;

	if (!e)
		return -EINVAL;
	if (!prefix || strlen(prefix) > DM_ETCD_KEY_MAX || !from_revision || *from_revision < 0 ||
	    timeout_ms <= 0 || !cb)
		return dm_etcd_fail(e, -EINVAL, "bad arguments");
	if (!e->wcurl && !(e->wcurl = e->cu->easy_init()))
		return dm_etcd_fail(e, -ENOMEM, "curl_easy_init failed");
	w.from = *from_revision;
	dm_buf_printf(&q, "{\"create_request\":{");
	dm_etcd_range_req(&q, prefix);
	dm_buf_printf(&q, ",\"start_revision\":\"%lld\"}}", (long long)w.from);
	if (q.oom) {
		rc = dm_etcd_fail(e, -ENOMEM, "out of memory");
		goto out_free_q;
	}
	rc = dm_etcd_post(e, e->wcurl, "/v3/watch", (char *)q.p, timeout_ms, wwr, &w);
	if (w.err) {
		rc = w.err;
		goto out_free_m;
	}
	if (w.status != 200 && w.status != 0) {       /* an error answer */
		if ((rc = dm_etcd_answer(e, "/v3/watch", w.status, w.line.p, w.line.n, &a)) == 0) {
			json_decref(a);
			rc = dm_etcd_fail(e, -EBADMSG, "/v3/watch: HTTP %ld", w.status);
		}
		goto out_free_m;
	}
	if (!w.done && rc == 0 && !blank(w.line.p, w.line.n) &&
	    (rc = wline(&w, w.line.p, w.line.n)))   /* the stream ended on an unterminated line */
		goto out_free_m;
	if (!w.done) {
		if (rc == -ETIMEDOUT && w.created) {
			if (w.from == 0)
				*from_revision = w.now;
			rc = 0;
		} else if (rc == 0 || rc == -ECANCELED) {
			rc = dm_etcd_fail(e, -ECONNRESET, "/v3/watch: the stream ended early");
		}
		goto out_free_m;
	}
	for (size_t i = 0; i < w.m.nev; i++) {
		const struct dm_etcd_event *ev = &w.m.ev[i];

		if (ev->kv.mod_revision < w.from)
			continue;
		cb(arg, ev);
		last = ev->kv.mod_revision;
		cnt++;
	}
	if (cnt)
		*from_revision = last + 1;
	else if (w.from == 0)
		*from_revision = w.now;
	rc = cnt;
out_free_m:
	dm_etcd_wmsg_free(&w.m);
	dm_buf_free(&w.line);
out_free_q:
	dm_buf_free(&q);
	return rc;
}

int dm_etcd_follow(struct dm_etcd *e, const char *prefix, int64_t *from, int timeout_ms,
		   void (*reset)(void *arg), void (*cb)(void *arg, const struct dm_etcd_event *ev),
		   void *arg)
{
	int rc;

	if (!*from) {   /* (re)sync: every key as a PUT, then watch from the revision after */
		struct dm_etcd_kv *kvs;
		size_t n;
		int64_t rev;

		rc = dm_etcd_range(e, prefix, &kvs, &n, &rev);
		if (rc)
			return rc;
		if (reset)
			reset(arg);
		for (size_t i = 0; i < n; i++) {
			struct dm_etcd_event ev = { .type = DM_ETCD_PUT, .kv = kvs[i] };

			cb(arg, &ev);
		}
		dm_etcd_kvs_free(kvs, n);
		*from = rev + 1;
		return 0;
	}
	rc = dm_etcd_watch_poll(e, prefix, from, timeout_ms, cb, arg);
	if (rc == -ESTALE) {
		*from = 0;      /* compacted: read everything again next time */
		return 0;
	}
	return rc < 0 ? rc : 0;
}
