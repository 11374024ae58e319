/* stale.c: stale replicas of S3 buckets in etcd (stale.h): the marks' JSON, put, list,
 * guarded clear, and the watch that keeps a copy of them on a compute node. */
#include "stale.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "etcd.h"

#define STALE_TIMEOUT_MS 2000
/* A poll returns with the first events; 250 ms timed out on a loaded 2-core machine before
 * etcd had answered at all (logged as unreachable), and so did 1 s in the soft-RoCE VM.
 * Idle, each poll is a watch created and cancelled in etcd: see WATCH_POLL_MS (cstate.c). */
#define STALE_POLL_MS 10000

static bool name_ok(const char *b)
{
	size_t n = b ? strlen(b) : 0;

	if (!n || n > DM_STALE_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (b[i] == '/' || (unsigned char)b[i] < 0x21 || (unsigned char)b[i] > 0x7e)
			return false;
	return true;
}

static void prefix(char *out, size_t cap, const char *cluster)
{
	snprintf(out, cap, "/dmann/%s/stale/", cluster);
}

int dm_stale_put(struct dm_etcd *e, const char *cluster, const char *bucket, uint32_t mn,
		 const char *by)
{
	char key[256];
	uint64_t seq = 0;
	json_t *o;
	char *v;
	int rc;

	if (!name_ok(bucket) || mn >= DM_MAX_NODES || !by || strlen(by) >= 16)
		return -EINVAL;
	if (getrandom(&seq, sizeof(seq), 0) != sizeof(seq))
		seq = dm_now_ns();
	prefix(key, sizeof(key), cluster);
	snprintf(key + strlen(key), sizeof(key) - strlen(key), "%s/%u", bucket, mn);
	o = json_pack("{s:s, s:I, s:I, s:s, s:I}", "bucket", bucket, "mn", (json_int_t)mn,
		      "since", (json_int_t)time(NULL), "by", by,
		      "seq", (json_int_t)(seq >> 12));
	v = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!v)
		return -ENOMEM;
	rc = dm_etcd_put(e, key, v, strlen(v), 0, NULL);
	free(v);
	return rc;
}

int dm_stale_parse(const char *rest, const void *val, size_t len, struct dm_stale *st)
{
	json_error_t je;
	json_t *o = json_loadb(val, len, JSON_REJECT_DUPLICATES, &je);
	const char *b, *by;
	json_int_t mn, since, seq;
	char kb[256];
	int rc = -EBADMSG;

	memset(st, 0, sizeof(*st));
	if (!o)
		return -EBADMSG;
	if (json_unpack(o, "{s:s, s:I, s:I, s:s, s:I}", "bucket", &b, "mn", &mn, "since", &since,
			"by", &by, "seq", &seq) || !name_ok(b) || mn < 0 || mn >= DM_MAX_NODES ||
	    since < 0 || strlen(by) >= sizeof(st->by))
		goto out;
	/* the key names the same bucket and node as the value */
	snprintf(kb, sizeof(kb), "%s/%u", b, (unsigned)mn);
	if (strcmp(kb, rest))
		goto out;
	snprintf(st->bucket, sizeof(st->bucket), "%s", b);
	snprintf(st->by, sizeof(st->by), "%s", by);
	st->mn = (uint32_t)mn;
	st->since = since;
	rc = 0;
out:
	json_decref(o);
	return rc;
}

int dm_stale_list(struct dm_etcd *e, const char *cluster, struct dm_stale **out, size_t *n)
{
	char p[192];
	struct dm_etcd_kv *kvs;
	size_t nk, pl;
	int rc;

	prefix(p, sizeof(p), cluster);
	pl = strlen(p);
	*out = NULL;
	*n = 0;
	rc = dm_etcd_range(e, p, &kvs, &nk, NULL);
	if (rc)
		return rc;
	*out = calloc(nk ? nk : 1, sizeof(**out));
	if (!*out) {
		dm_etcd_kvs_free(kvs, nk);
		return -ENOMEM;
	}
	for (size_t i = 0; i < nk; i++) {
		struct dm_stale *st = &(*out)[*n];

		if (dm_stale_parse(kvs[i].key + pl, kvs[i].val, kvs[i].len, st)) {
			dm_warn("cluster state: %s is not a stale mark; ignored", kvs[i].key);
			continue;
		}
		st->mod_revision = kvs[i].mod_revision;
		(*n)++;
	}
	dm_etcd_kvs_free(kvs, nk);
	return 0;
}

int dm_stale_clear(struct dm_etcd *e, const char *cluster, const struct dm_stale *st,
		   bool *cleared)
{
	char key[256];

	*cleared = false;
	if (!name_ok(st->bucket) || st->mn >= DM_MAX_NODES || st->mod_revision <= 0)
		return -EINVAL;
	prefix(key, sizeof(key), cluster);
	snprintf(key + strlen(key), sizeof(key) - strlen(key), "%s/%u", st->bucket, st->mn);
	return dm_etcd_delete_if(e, key, st->mod_revision, cleared);
}

/* ---- the watch ---- */

struct dm_stalewatch {
	struct dm_etcd *e;
	char prefix[192];
	pthread_mutex_t mu;
	struct dm_stale *set;        /* under mu */
	size_t n, cap;
	atomic_bool synced, stop;
	bool warned;
	pthread_t thread;
};

static ssize_t find(struct dm_stalewatch *w, const char *bucket, uint32_t mn)
{
	for (size_t i = 0; i < w->n; i++)
		if (w->set[i].mn == mn && !strcmp(w->set[i].bucket, bucket))
			return (ssize_t)i;
	return -1;
}

/* Put (or replace) st in the copy, mu held. */
static void set_put(struct dm_stalewatch *w, const struct dm_stale *st)
{
	ssize_t i = find(w, st->bucket, st->mn);

	if (i >= 0) {
		w->set[i] = *st;
		return;
	}
	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 16;
		struct dm_stale *ns = realloc(w->set, cap * sizeof(*ns));

		if (!ns)
			return;   /* (logged by nobody: a mark is lost from the copy only on ENOMEM) */
		w->set = ns;
		w->cap = cap;
	}
	w->set[w->n++] = *st;
}

static void watch_ev(void *arg, const struct dm_etcd_event *ev)
{
	struct dm_stalewatch *w = arg;
	size_t pl = strlen(w->prefix);
	const char *rest = ev->kv.key + pl;
	struct dm_stale st;

	if (ev->kv.key_len <= pl || memcmp(ev->kv.key, w->prefix, pl))
		return;
	if (ev->type == DM_ETCD_DELETE) {
		const char *sl = strrchr(rest, '/');
		char b[DM_STALE_NAME_MAX + 1];
		char *end;
		unsigned long mn;

		if (!sl || (size_t)(sl - rest) > DM_STALE_NAME_MAX)
			return;
		memcpy(b, rest, (size_t)(sl - rest));
		b[sl - rest] = 0;
		errno = 0;
		mn = strtoul(sl + 1, &end, 10);
		if (errno || *end || mn >= DM_MAX_NODES)
			return;
		pthread_mutex_lock(&w->mu);
		ssize_t i = find(w, b, (uint32_t)mn);

		if (i >= 0)
			w->set[i] = w->set[--w->n];
		pthread_mutex_unlock(&w->mu);
		return;
	}
	if (dm_stale_parse(rest, ev->kv.val, ev->kv.len, &st)) {
		dm_warn("cluster state: %s is not a stale mark; ignored", ev->kv.key);
		return;
	}
	st.mod_revision = ev->kv.mod_revision;
	pthread_mutex_lock(&w->mu);
	set_put(w, &st);
	pthread_mutex_unlock(&w->mu);
}

/* A resync: the copy starts over from what the read gives. */
static void set_reset(void *arg)
{
	struct dm_stalewatch *w = arg;

	pthread_mutex_lock(&w->mu);
	w->n = 0;
	pthread_mutex_unlock(&w->mu);
}

static void *watch_thread(void *arg)
{
	struct dm_stalewatch *w = arg;
	int64_t from = 0;

	while (!atomic_load(&w->stop)) {
		int rc = dm_etcd_follow(w->e, w->prefix, &from, STALE_POLL_MS, set_reset, watch_ev,
					w);

		if (!rc && from)
			atomic_store(&w->synced, true);
		if (rc && atomic_load(&w->stop))
			break;                  /* aborted by dm_stalewatch_stop */
		if (rc) {
			if (!w->warned)
				dm_warn("cluster state: etcd unreachable (%s); keeping the stale "
					"replicas last seen", dm_etcd_errmsg(w->e));
			w->warned = true;
			for (int i = 0; i < 5 && !atomic_load(&w->stop); i++)
				usleep(100000);
		} else {
			w->warned = false;
		}
	}
	return NULL;
}

struct dm_stalewatch *dm_stalewatch_start(const struct dm_cluster_cfg *cfg)
{
	struct dm_stalewatch *w;
	int err;

	if (!cfg->etcd[0]) {
		errno = 0;
		return NULL;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&w->mu, NULL);
	prefix(w->prefix, sizeof(w->prefix), cfg->name);
	w->e = dm_etcd_open(cfg->etcd, STALE_TIMEOUT_MS);
	if (!w->e) {
		err = errno;
		goto out_free;
	}
	err = pthread_create(&w->thread, NULL, watch_thread, w);
	if (err) {
		dm_etcd_close(w->e);
		goto out_free;
	}
	return w;
out_free:
	pthread_mutex_destroy(&w->mu);
	free(w);
	errno = err;
	return NULL;
}

void dm_stalewatch_stop(struct dm_stalewatch *w)
{
	if (!w)
		return;
	atomic_store(&w->stop, true);
	dm_etcd_abort(w->e);             /* ends the poll in progress at once */
	pthread_join(w->thread, NULL);
	dm_etcd_close(w->e);
	pthread_mutex_destroy(&w->mu);
	free(w->set);
	free(w);
}

bool dm_stalewatch_has(struct dm_stalewatch *w, const char *bucket, uint32_t mn)
{
	bool has;

	if (!w)
		return false;
	pthread_mutex_lock(&w->mu);
	has = w->n && find(w, bucket, mn) >= 0;
	pthread_mutex_unlock(&w->mu);
	return has;
}

void dm_stalewatch_note(struct dm_stalewatch *w, const char *bucket, uint32_t mn)
{
	struct dm_stale st = { .mn = mn, .since = time(NULL) };

	if (!w || !name_ok(bucket))
		return;
	snprintf(st.bucket, sizeof(st.bucket), "%s", bucket);
	pthread_mutex_lock(&w->mu);
	if (find(w, bucket, mn) < 0)
		set_put(w, &st);
	pthread_mutex_unlock(&w->mu);
}

size_t dm_stalewatch_list(struct dm_stalewatch *w, struct dm_stale *out, size_t max)
{
	size_t n;

	if (!w)
		return 0;
	pthread_mutex_lock(&w->mu);
	n = w->n;
	for (size_t i = 0; out && i < n && i < max; i++)
		out[i] = w->set[i];
	pthread_mutex_unlock(&w->mu);
	return n;
}

bool dm_stalewatch_synced(struct dm_stalewatch *w)
{
	return w && atomic_load(&w->synced);
}

