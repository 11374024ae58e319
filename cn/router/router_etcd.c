/* router_etcd.c: a rollout epoch's oracle handed over through etcd (router_etcd.h): the
 * claim of its fit, the published oracle, and the pruning of old epochs. */
#include "router_etcd.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd.h"
#include "util/dm_buf.h"
#include "util/dm_hash.h"

#define ROE_TIMEOUT_MS 2000
#define ROE_POLL_MS 50
#define ROE_WATCH_MS 500   /* one watch of the oracle keys while another CN fits */
#define ROE_MAGIC 0x454f4d44u         /* "DMOE" little-endian */
#define ROE_VERSION 1u

struct router_etcd {
	struct dm_etcd *e;
	char cluster[128];
	uint32_t self;
};

struct router_etcd *router_etcd_open(const char *endpoints, const char *cluster,
				     uint32_t self)
{
	struct router_etcd *h;

	if (!endpoints || !cluster || strlen(cluster) >= sizeof(h->cluster)) {
		errno = EINVAL;
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->e = dm_etcd_open(endpoints, ROE_TIMEOUT_MS);
	if (!h->e)
		goto err_free;
	snprintf(h->cluster, sizeof(h->cluster), "%s", cluster);
	h->self = self;
	return h;
err_free:
	free(h);
	return NULL;
}

void router_etcd_close(struct router_etcd *h)
{
	if (!h)
		return;
	dm_etcd_close(h->e);
	free(h);
}

const char *router_etcd_errmsg(const struct router_etcd *h)
{
	return dm_etcd_errmsg(h ? h->e : NULL);
}

/* ---- the value of model/<E> ---- */

void router_etcd_encode(const struct router_etcd_meta *m, const uint8_t *wire, size_t len,
			uint8_t *out)
{
	const uint32_t f[] = { ROE_MAGIC, ROE_VERSION, m->epoch, m->crc, m->ncn, m->dim,
			       m->metric, m->keyrange, m->lv, m->n, m->fitter, m->flags };

	memset(out, 0, ROE_HDR_LEN);
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		dm_put_le32(out + 4 * i, f[i]);
	dm_put_le64(out + 48, m->hash);
	dm_put_le32(out + 56, (uint32_t)len);
	dm_put_le32(out + 60, m->regions);
	if (len)
		memcpy(out + ROE_HDR_LEN, wire, len);
}

int router_etcd_parse(const void *val, size_t len, struct router_etcd_meta *m,
		      const uint8_t **wire, size_t *wlen)
{
	const uint8_t *p = val;
	uint32_t wl;

	if (!p || len < ROE_HDR_LEN || dm_get_le32(p) != ROE_MAGIC ||
	    dm_get_le32(p + 4) != ROE_VERSION)
		return -EBADMSG;
	*m = (struct router_etcd_meta){
		.epoch = dm_get_le32(p + 8), .crc = dm_get_le32(p + 12), .ncn = dm_get_le32(p + 16),
		.dim = dm_get_le32(p + 20), .metric = dm_get_le32(p + 24),
		.keyrange = dm_get_le32(p + 28), .lv = dm_get_le32(p + 32), .n = dm_get_le32(p + 36),
		.fitter = dm_get_le32(p + 40), .flags = dm_get_le32(p + 44),
		.hash = dm_get_le64(p + 48), .regions = dm_get_le32(p + 60) };
	wl = dm_get_le32(p + 56);
	if (m->ncn < 1 || m->ncn > DM_MAX_NODES || m->dim < 1 || m->keyrange > 1 ||
	    m->fitter >= DM_MAX_NODES || (m->flags & ~ROE_F_LOCAL) ||
	    (size_t)wl != len - ROE_HDR_LEN || (m->flags & ROE_F_LOCAL ? wl != 0 : wl == 0))
		return -EBADMSG;
	*wire = wl ? p + ROE_HDR_LEN : NULL;
	*wlen = wl;
	return 0;
}

/* ---- keys ---- */

/* What an oracle of an epoch is fitted on and with (index, shape, partitions, sample
 * level): the last part of its keys, so that the keys a cluster left in etcd before a
 * restart (epochs start again at 0) or another index never pass for this one's. */
static uint64_t tag_of(const struct router_etcd_meta *m)
{
	const uint32_t f[] = { m->crc, m->ncn, m->dim, m->metric, m->keyrange, m->regions, m->lv };
	uint8_t b[sizeof(f)];

	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		dm_put_le32(b + 4 * i, f[i]);
	return dm_fnv1a64(DM_FNV64_INIT, b, sizeof(b));
}

static void key_of(const struct router_etcd *h, char *out, size_t cap, const char *what,
		   const struct router_etcd_meta *m)
{
	snprintf(out, cap, "/dmann/%s/oracle/%s/%u/%016" PRIx64, h->cluster, what, m->epoch,
		 tag_of(m));
}

/* The lease of this compute node's member key (members/cn/<self>): *lease, or -ENOTCONN
 * when it is not registered (no key, or one without a lease). */
static int member_lease(struct router_etcd *h, int64_t *lease)
{
	char key[256];
	struct dm_etcd_kv *kvs = NULL;
	size_t n = 0;
	int rc;

	snprintf(key, sizeof(key), "/dmann/%s/members/cn/%u", h->cluster, h->self);
	rc = dm_etcd_range(h->e, key, &kvs, &n, NULL);
	if (rc)
		return rc;
	rc = -ENOTCONN;
	for (size_t i = 0; i < n; i++)
		if (!strcmp(kvs[i].key, key) && kvs[i].lease > 0) {
			*lease = kvs[i].lease;
			rc = 0;
		}
	dm_etcd_kvs_free(kvs, n);
	return rc;
}

static void sleep_ms(uint32_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* A published model/<E> (val, len): 1 with *wire / *len / *got when it is want's, or the
 * -errno of router_etcd_obtain. Takes val. */
static int take(const struct router_etcd_meta *want, void *val, size_t len, uint8_t **wire,
		size_t *wlen, struct router_etcd_meta *got)
{
	const uint8_t *w;
	size_t wl;
	int rc = router_etcd_parse(val, len, got, &w, &wl);

	if (rc)
		goto out_free;
	rc = -E2BIG;
	if (got->flags & ROE_F_LOCAL)
		goto out_free;
	rc = -ESTALE;
	if (got->epoch != want->epoch || got->crc != want->crc || got->ncn != want->ncn ||
	    got->dim != want->dim || got->metric != want->metric ||
	    got->keyrange != want->keyrange || got->regions != want->regions ||
	    got->lv != want->lv)
		goto out_free;
	/* the wire form to the front of the buffer: one allocation handed over */
	memmove(val, w, wl);
	*wire = val;
	*wlen = wl;
	return 1;
out_free:
	free(val);
	return rc;
}

/* What a waiter's watch saw: the model's value when it was published (a copy), so that
 * the waiter does not read the same 40 KB again right after the event that carried it. */
struct seen {
	const char *model;   /* the model's key */
	void *val;           /* NULL, or its value (malloc'd) */
	size_t len;
};

/* Any change sends the waiter back to its reads, but the model's PUT is kept. */
static void change_seen(void *arg, const struct dm_etcd_event *ev)
{
	struct seen *s = arg;

	if (ev->type != DM_ETCD_PUT || ev->kv.key_len != strlen(s->model) ||
	    memcmp(ev->kv.key, s->model, ev->kv.key_len))
		return;
	free(s->val);
	s->val = malloc(ev->kv.len ? ev->kv.len : 1);
	s->len = s->val ? ev->kv.len : 0;
	if (s->val)
		memcpy(s->val, ev->kv.val, ev->kv.len);   /* else: read it as before */
}

/* Wait (at most ms) for a change of the cluster's oracle keys after the claim of revision
 * claim_rev: the model published, or the claim gone with its holder's lease. A watch from
 * claim_rev + 1, so a change between the last read and the watch is not missed. The
 * waiting CNs take the model from the event that published it (seen) instead of reading
 * the model and the claim every ROE_POLL_MS (two reads each, which kept etcd busy while
 * the fitter fitted, and a waiter saw the model up to ROE_POLL_MS late). The number of
 * events (0: none in time) or -errno (the caller polls instead). */
static int wait_change(struct router_etcd *h, int64_t claim_rev, uint32_t ms,
		       struct seen *seen)
{
	char prefix[192];
	int64_t from = claim_rev + 1;

	snprintf(prefix, sizeof(prefix), "/dmann/%s/oracle/", h->cluster);
	return dm_etcd_watch_poll(h->e, prefix, &from, (int)ms, change_seen, seen);
}

int router_etcd_obtain(struct router_etcd *h, const struct router_etcd_meta *want,
		       uint32_t wait_ms, bool (*cancel)(void *arg), void *arg, uint8_t **wire,
		       size_t *len, struct router_etcd_meta *got)
{
	char model[256], fit[256], me[16];
	uint64_t t0 = dm_now_ns();
	int64_t lease = 0;
	bool asked_holder = false;
	bool held = false;   /* another CN holds the claim: poll with reads only */
	int64_t claim_rev = 0;   /* held: the claim's mod_revision, the model comes after it */

	key_of(h, model, sizeof(model), "model", want);
	key_of(h, fit, sizeof(fit), "fit", want);
	snprintf(me, sizeof(me), "%u", h->self);
	for (;;) {
		void *val = NULL;
		size_t vlen = 0;
		bool ok = false;
		int rc;

		if (cancel && cancel(arg))
			return -ECANCELED;
		rc = dm_etcd_get(h->e, model, &val, &vlen, NULL);
		if (rc == 0)
			return take(want, val, vlen, wire, len, got);
		if (rc != -ENOENT)
			return rc;
		if (held) {
			/* The claim is read, not tried again: a transaction goes through Raft
			 * (a WAL write) even when its comparison fails, and the waiting CNs would
			 * write every ROE_POLL_MS while the fitter works. Claim again only once
			 * the holder's key is gone (its member lease expired). */
			rc = dm_etcd_get(h->e, fit, &val, &vlen, &claim_rev);
			if (rc == 0) {
				free(val);
				goto wait;
			}
			if (rc != -ENOENT)
				return rc;
			held = false;
		}
		if (!lease) {
			rc = member_lease(h, &lease);
			if (rc)
				return rc;
		}
		rc = dm_etcd_put_if(h->e, fit, me, strlen(me), lease, 0, &ok, NULL);
		if (rc)
			return rc;   /* -ENOENT: the member lease just expired */
		if (ok)
			return 0;
		held = true;
		if (!asked_holder) {
			/* a claim of ours from an earlier try (a fit that failed, a sample of
			 * an index replaced meanwhile) is ours to fit again */
			asked_holder = true;
			rc = dm_etcd_get(h->e, fit, &val, &vlen, &claim_rev);
			if (rc == 0) {
				ok = vlen == strlen(me) && !memcmp(val, me, vlen);
				if (!ok)
					dm_debug("cn%u: oracle epoch %u: waiting for cn%.*s's fit in "
						 "etcd", h->self, want->epoch, (int)DM_MIN(vlen, 8u),
						 (const char *)val);
				free(val);
				if (ok)
					return 0;
			} else if (rc != -ENOENT) {
				return rc;
			} else {
				held = false;   /* gone meanwhile: try to claim it again */
			}
		}
wait:;
		uint64_t waited_ms = (dm_now_ns() - t0) / 1000000ull;

		if (waited_ms >= wait_ms)
			return -ETIME;
		struct seen seen = { .model = model };

		if (!held || claim_rev <= 0 ||
		    wait_change(h, claim_rev, DM_MIN(ROE_WATCH_MS, wait_ms - (uint32_t)waited_ms),
				&seen) < 0)
			sleep_ms(ROE_POLL_MS);
		if (seen.val) {   /* published: the value came with the event */
			dm_debug("cn%u: oracle epoch %u: the model from the watch event (%zu bytes)",
				 h->self, want->epoch, seen.len);
			return take(want, seen.val, seen.len, wire, len, got);
		}
	}
}

int router_etcd_take(struct router_etcd *h, const struct router_etcd_meta *want,
		     uint8_t **wire, size_t *len, struct router_etcd_meta *got)
{
	char model[256];
	void *val = NULL;
	size_t vlen = 0;
	int rc;

	key_of(h, model, sizeof(model), "model", want);
	rc = dm_etcd_get(h->e, model, &val, &vlen, NULL);
	return rc ? rc : take(want, val, vlen, wire, len, got);
}

/* Delete the keys of epochs older than keep (best effort): the claims list them
 * (fit/<E>/<tag>; its model is model/<E>/<tag>). */
static void prune(struct router_etcd *h, uint32_t keep)
{
	char prefix[256], key[256 + DM_ETCD_KEY_MAX];
	struct dm_etcd_kv *kvs = NULL;
	size_t n = 0, plen;

	plen = (size_t)snprintf(prefix, sizeof(prefix), "/dmann/%s/oracle/fit/", h->cluster);
	if (dm_etcd_range(h->e, prefix, &kvs, &n, NULL))
		return;
	for (size_t i = 0; i < n; i++) {
		const char *s = kvs[i].key + plen;
		char *end;
		unsigned long ep;

		if (kvs[i].key_len <= plen || strlen(kvs[i].key) != kvs[i].key_len || *s < '0' ||
		    *s > '9')
			continue;
		errno = 0;
		ep = strtoul(s, &end, 10);
		if (errno || *end != '/' || ep >= keep)
			continue;
		snprintf(key, sizeof(key), "/dmann/%s/oracle/model/%s", h->cluster, s);
		dm_etcd_delete(h->e, key, false, NULL);
		dm_etcd_delete(h->e, kvs[i].key, false, NULL);
	}
	dm_etcd_kvs_free(kvs, n);
}

int router_etcd_publish(struct router_etcd *h, const struct router_etcd_meta *m,
			const uint8_t *wire, size_t len, size_t *bytes)
{
	struct router_etcd_meta hm = *m;
	char key[256], me[16], ep[16];
	void *cur = NULL;
	size_t clen = 0;
	uint8_t *val;
	bool ok;
	int rc;

	if (!wire || ROE_HDR_LEN + len > DM_ETCD_VAL_MAX) {
		hm.flags |= ROE_F_LOCAL;   /* the others fit it themselves */
		len = 0;
	}
	val = malloc(ROE_HDR_LEN + len);
	if (!val)
		return -ENOMEM;
	router_etcd_encode(&hm, wire, len, val);
	key_of(h, key, sizeof(key), "model", m);
	/* create-if-absent: a second fitter (the claim expired) has the same bytes anyway */
	rc = dm_etcd_put_if(h->e, key, val, ROE_HDR_LEN + len, 0, 0, &ok, NULL);
	free(val);
	if (rc)
		return rc;
	if (bytes)
		*bytes = ROE_HDR_LEN + len;
	key_of(h, key, sizeof(key), "fit", m);
	snprintf(me, sizeof(me), "%u", h->self);
	rc = dm_etcd_put(h->e, key, me, strlen(me), 0, NULL);
	if (rc)
		return rc;
	snprintf(key, sizeof(key), "/dmann/%s/oracle/epoch", h->cluster);
	rc = dm_etcd_get(h->e, key, &cur, &clen, NULL);
	if (rc && rc != -ENOENT)
		return rc;
	ok = rc == -ENOENT || strtoul(cur, NULL, 10) < m->epoch;
	free(cur);
	if (ok) {
		snprintf(ep, sizeof(ep), "%u", m->epoch);
		rc = dm_etcd_put(h->e, key, ep, strlen(ep), 0, NULL);
		if (rc)
			return rc;
	}
	if (m->epoch >= 2)
		prune(h, m->epoch - 1);
	return 0;
}

void router_etcd_abandon(struct router_etcd *h, const struct router_etcd_meta *m)
{
	char key[256];

	key_of(h, key, sizeof(key), "fit", m);
	dm_etcd_delete(h->e, key, false, NULL);
}
