/* dmann.c: libdmann (dmann.h): connections to the compute nodes with a client identity,
 * and the pipelined C_CALL exchange (wire.h) every call is built on; the S3 Vectors
 * request bodies and their answers are in dmann_ops.c. */
#include "dmann_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"

static __thread char errbuf[512];

const char *dmann_errmsg(void)
{
	return errbuf;
}

int dmann_fail(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
	va_end(ap);
	return err;
}

void dmann_clear_err(void)
{
	errbuf[0] = 0;
}

/* dmann_run: a request failed with err (its message in errbuf): the call reports the first
 * failure and its message, not whatever failed or was recovered from after it. */
static int note_fail(dmann_t *d, int err)
{
	if (err && !d->ferr) {
		d->ferr = err;
		snprintf(d->fmsg, sizeof(d->fmsg), "%s", errbuf);
	}
	return err;
}

static dmann_t *open_handle(const char *cluster, const char *const *eps, size_t n,
			    const char *transport, const char *client, const void *secret,
			    size_t secret_len)
{
	struct dm_xport_params p = { .backend = transport && *transport ? transport : "tcp",
				     .cluster = cluster, .secret = secret, .secret_len = secret_len,
				     .client = client };
	dmann_t *d;
	uint32_t live = 0;
	int err = 0;

	if (!cluster || !eps || n == 0 || n > DMANN_MAX_CN || !client || !secret ||
	    secret_len < 16 || secret_len > 64) {
		dmann_fail(-EINVAL, "connect: need a cluster name, 1..%u endpoints, a client "
			   "identity and a secret of 16..64 bytes", DMANN_MAX_CN);
		errno = EINVAL;
		return NULL;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&d->mu, NULL);
	dmann_route_free(&d->rt);   /* empty: routes nothing */
	for (uint32_t i = 0; i < DM_MAX_NODES_WIRE; i++)
		d->rt.conn_of[i] = -1;
	d->x = dm_xport_open(&p);
	if (!d->x) {
		err = errno;
		dmann_fail(-err, "connect: cannot open the %s transport: %s", p.backend,
			   strerror(err));
		goto err_free;
	}
	d->pool = dm_msgpool_new(d->x, (uint32_t)n * (DMANN_WINDOW + 4), DM_C_MAX_RESP);
	if (!d->pool) {
		err = errno;
		dmann_fail(-err, "connect: cannot post receive buffers: %s", strerror(err));
		goto err_close_x;
	}
	for (size_t i = 0; i < n; i++) {
		struct dmann_conn *c = &d->cn[d->ncn];
		int rc = dm_xport_connect(d->x, eps[i], 5000, &c->conn);

		if (!rc) {
			rc = dm_rpc_chan_init(&c->ch, c->conn, d->pool, DM_C_MAX_REQ, 60000);
			if (rc)
				dm_conn_close(c->conn);
		}
		snprintf(c->ep, sizeof(c->ep), "%s", eps[i]);
		d->ncn++;
		if (rc) {
			/* Kept, down: dmann_revive connects it once it is reachable. */
			err = -rc;
			dmann_fail(rc, "connect: compute node %s: %s", eps[i], strerror(-rc));
			c->conn = NULL;
			c->dead = true;
			c->backoff_ms = 1000;
			c->retry_ns = dm_now_ns() + c->backoff_ms * 1000000ull;
			continue;
		}
		live++;
	}
	if (live == 0)
		goto err_free_pool;
	dmann_clear_err();
	return d;

err_free_pool:
	dm_msgpool_free(d->pool);
err_close_x:
	dm_xport_close(d->x);
err_free:
	pthread_mutex_destroy(&d->mu);
	free(d);
	errno = err ? err : ECONNREFUSED;
	return NULL;
}

dmann_t *dmann_connect_endpoints(const char *cluster, const char *const *endpoints, size_t n,
				 const char *transport, const char *client, const void *secret,
				 size_t secret_len)
{
	return open_handle(cluster, endpoints, n, transport, client, secret, secret_len);
}

dmann_t *dmann_connect(const char *cluster_file, const char *client)
{
	struct dm_cluster_cfg *cfg;
	const struct dm_client_cfg *cc;
	const char *eps[DMANN_MAX_CN];
	char err[768];
	dmann_t *d = NULL;
	int rc;

	if (!cluster_file) {
		dmann_fail(-EINVAL, "connect: no cluster file");
		errno = EINVAL;
		return NULL;
	}
	cfg = calloc(1, sizeof(*cfg));
	if (!cfg) {
		errno = ENOMEM;
		return NULL;
	}
	rc = dm_config_load_client(cluster_file, client, cfg, err, sizeof(err));
	if (rc) {
		dmann_fail(rc, "%s", err);
		errno = -rc;
		goto out;
	}
	if (cfg->n_cn == 0 || cfg->n_cn > DMANN_MAX_CN) {
		dmann_fail(-EINVAL, "%s: names %u compute nodes (need 1..%u)", cluster_file,
			   cfg->n_cn, DMANN_MAX_CN);
		errno = EINVAL;
		goto out;
	}
	for (uint32_t i = 0; i < cfg->n_cn; i++)
		eps[i] = cfg->cn[i].address;
	cc = dm_config_client(cfg, client && *client ? client : getenv("DMANN_CLIENT_NAME"));
	d = open_handle(cfg->name, eps, cfg->n_cn, cfg->transport[0] ? cfg->transport : NULL,
			cc->name, cc->secret, cc->secret_len);
	memset(cfg->clients, 0, sizeof(cfg->clients));
out:
	free(cfg);
	return d;
}

void dmann_close(dmann_t *d)
{
	if (!d)
		return;
	for (uint32_t i = 0; i < d->ncn; i++) {
		if (d->cn[i].dead)
			continue;
		dm_rpc_chan_fini(&d->cn[i].ch);
		dm_conn_close(d->cn[i].conn);
	}
	dm_msgpool_free(d->pool);
	dm_xport_close(d->x);
	dmann_route_fetch_cancel(d);
	dmann_route_free(&d->rt);
	pthread_mutex_destroy(&d->mu);
	free(d);
}

/* Send request r (C_CALL body already encoded in r->body) on compute node c. */
static int send_one(dmann_t *d, uint32_t c, struct dmann_req *r, uint64_t id)
{
	int rc = dm_rpc_send(&d->cn[c].ch, DM_OP_C_CALL, id, 0, r->body, r->blen);

	if (rc)
		return dmann_fail(rc, "compute node %s: send: %s", d->cn[c].ep,
				  strerror(-rc));
	d->cn[c].inflight++;
	return 0;
}

/* Take one answer from compute node c (waiting up to ms), hand it to done(). 1: took one,
 * 2: a read answered 503 (retry later), in later[] to be sent again at its not_before,
 * 0: none yet, -errno. */
static int take_one(dmann_t *d, uint32_t c, int ms, struct dmann_req *reqs, size_t n,
		    uint64_t base, size_t *later, size_t *nlater)
{
	struct dm_wire_hdr h;
	struct dm_wire_c_call m;
	const uint8_t *json;
	uint8_t *buf;
	uint32_t len;
	uint64_t wr_id;
	int rc = dm_rpc_recv(&d->cn[c].ch, ms, &buf, &len, &wr_id);

	if (rc <= 0) {
		if (rc < 0)
			dmann_fail(rc, "compute node %s: %s", d->cn[c].ep, strerror(-rc));
		return rc;
	}
	rc = dm_wire_hdr_decode(buf, len, &h);
	if (!rc)
		rc = dm_wire_c_check(&h, buf, len, &m, &json);
	if (!rc && (h.op != DM_OP_C_CALL + 1 || h.req_id < base || h.req_id - base >= n ||
		    reqs[h.req_id - base].finished || reqs[h.req_id - base].on != c + 1))
		rc = -EBADMSG;
	if (rc) {
		dm_msgpool_repost(d->pool, wr_id);
		return dmann_fail(-EBADMSG, "compute node %s: malformed answer",
				  d->cn[c].ep);
	}
	d->cn[c].inflight--;
	struct dmann_req *r = &reqs[h.req_id - base];

	if (h.status)
		r->err = dmann_fail(h.status, "compute node %s: %s", d->cn[c].ep,
				    h.status == -ENOSYS ? "runs no S3 gateway (no http address or "
				    "no [s3] key)" : strerror(-h.status));
	else
		r->err = r->done(r, (int)m.op, (const char *)json, m.json_len);
	dm_msgpool_repost(d->pool, wr_id);
	if (r->err == -EAGAIN && !h.status && m.op == 503 && r->read &&
	    r->busy < DMANN_BUSY_TRIES) {
		/* It was answered, not lost: sent again after the back-off, as a new request. */
		r->not_before = dm_now_ns() + (100000000ull << r->busy);
		r->busy++;
		r->err = 0;
		r->on = 0;
		r->tries = 0;
		later[(*nlater)++] = h.req_id - base;
		return 2;
	}
	r->finished = true;
	note_fail(d, r->err);
	return 1;
}

void dmann_conn_lost(dmann_t *d, uint32_t c)
{
	struct dmann_conn *k = &d->cn[c];

	if (k->dead)
		return;
	dm_rpc_chan_fini(&k->ch);
	dm_conn_close(k->conn);
	k->conn = NULL;
	k->inflight = 0;
	k->dead = true;
	k->backoff_ms = 1000;
	k->retry_ns = dm_now_ns() + k->backoff_ms * 1000000ull;
	d->rt.stale = d->rt.ok;
}

uint32_t dmann_revive(dmann_t *d)
{
	uint64_t now = dm_now_ns();
	uint32_t live = 0;

	for (uint32_t c = 0; c < d->ncn; c++) {
		struct dmann_conn *k = &d->cn[c];
		int rc;

		if (k->dead && now >= k->retry_ns) {
			rc = dm_xport_connect(d->x, k->ep, 1000, &k->conn);
			if (!rc) {
				rc = dm_rpc_chan_init(&k->ch, k->conn, d->pool, DM_C_MAX_REQ, 60000);
				if (rc)
					dm_conn_close(k->conn);
			}
			if (rc) {
				k->conn = NULL;
				k->backoff_ms = DM_MIN(2 * k->backoff_ms, 10000u);
				k->retry_ns = dm_now_ns() + k->backoff_ms * 1000000ull;
			} else {
				k->dead = false;
				k->inflight = 0;
				d->rt.stale = d->rt.ok;   /* its node is reachable again */
			}
		}
		live += !k->dead;
	}
	return live;
}

int dmann_live_pick(dmann_t *d, uint32_t *rr, const uint32_t *window, uint32_t all)
{
	for (uint32_t j = 0; j < d->ncn; j++) {
		uint32_t c = (*rr + j) % d->ncn;

		if (!d->cn[c].dead && d->cn[c].inflight < (window ? window[c] : all)) {
			*rr = c + 1;
			return (int)c;
		}
	}
	return -1;
}

/* Connection c of dmann_run failed with err: its requests in flight go back to the retry
 * queue (once each) or fail. The number that failed. */
static size_t run_lost(dmann_t *d, uint32_t c, struct dmann_req *reqs, size_t next,
		       size_t *retry, size_t *nretry, int err)
{
	size_t failed = 0;
	char ep[128];

	snprintf(ep, sizeof(ep), "%s", d->cn[c].ep);
	dmann_conn_lost(d, c);
	for (size_t i = 0; i < next; i++) {
		struct dmann_req *r = &reqs[i];

		if (r->finished || r->on != c + 1)
			continue;
		r->on = 0;
		if (r->tries < DMANN_TRIES) {
			retry[(*nretry)++] = i;
			continue;
		}
		r->err = note_fail(d, dmann_fail(err == -EBADMSG ? err : -EHOSTDOWN, "compute node "
						 "%s: %s (the request was sent %u times)", ep,
						 strerror(-err), r->tries));
		r->finished = true;
		failed++;
	}
	return failed;
}

/* Busy reads whose back-off passed go to the retry queue; the time until the next one is
 * due (ns, UINT64_MAX if none is waiting). */
static uint64_t later_due(struct dmann_req *reqs, size_t *later, size_t *nlater,
			  size_t *retry, size_t *nretry)
{
	uint64_t now = dm_now_ns(), wait = UINT64_MAX;

	for (size_t i = 0; i < *nlater;) {
		struct dmann_req *r = &reqs[later[i]];

		if (r->not_before <= now) {
			retry[(*nretry)++] = later[i];
			later[i] = later[--*nlater];
		} else {
			wait = DM_MIN(wait, r->not_before - now);
			i++;
		}
	}
	return wait;
}

int dmann_run(dmann_t *d, struct dmann_req *reqs, size_t n)
{
	size_t next = 0, done = 0, nretry = 0, nlater = 0, *retry, *later;
	uint64_t base, wait;
	int first = 0;
	uint32_t rr;
	bool reconnected = false;

	retry = malloc((n ? n : 1) * sizeof(*retry));
	later = malloc((n ? n : 1) * sizeof(*later));
	if (!retry || !later) {
		free(retry);
		free(later);
		return dmann_fail(-ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&d->mu);
	base = d->next_id;
	d->next_id += n;
	d->ferr = 0;
	rr = d->rr;
	dmann_revive(d);
	while (done < n) {
		bool progress = false;

		wait = later_due(reqs, later, &nlater, retry, &nretry);
		/* Send: retries first, then new requests, to live compute nodes with room. */
		while (!first && (nretry || next < n)) {
			int c = dmann_live_pick(d, &rr, NULL, DMANN_WINDOW);
			size_t i;
			int rc;

			if (c < 0)
				break;
			i = nretry ? retry[--nretry] : next;
			rc = send_one(d, (uint32_t)c, &reqs[i], base + i);
			if (rc) {
				if (i == next)
					retry[nretry++] = next++;   /* not sent: it goes first */
				else
					retry[nretry++] = i;
				done += run_lost(d, (uint32_t)c, reqs, next, retry, &nretry, rc);
				continue;
			}
			reqs[i].on = (uint32_t)c + 1;
			reqs[i].tries++;
			if (i == next)
				next++;
			progress = true;
		}
		if ((nretry || next < n) && !first && dmann_live_pick(d, &rr, NULL, UINT32_MAX) < 0) {
			if (!reconnected) {
				/* Every connection failed: one attempt now to connect again, back-off
				 * notwithstanding (a connection may break while its node lives on). */
				reconnected = true;
				for (uint32_t c = 0; c < d->ncn; c++)
					d->cn[c].retry_ns = 0;
				if (dmann_revive(d))
					continue;
			}
			/* Nobody left to send to (busy reads waiting fail below, with the call). */
			first = note_fail(d, dmann_fail(-EHOSTDOWN, "no compute node is reachable"));
			for (size_t i = 0; i < nretry; i++, done++)
				reqs[retry[i]].err = first, reqs[retry[i]].finished = true;
			nretry = 0;
			for (; next < n; next++, done++)
				reqs[next].err = first, reqs[next].finished = true;
		}
		for (uint32_t c = 0; c < d->ncn; c++) {
			while (!d->cn[c].dead && d->cn[c].inflight) {
				int rc = take_one(d, c, 0, reqs, n, base, later, &nlater);

				if (rc < 0)
					done += run_lost(d, c, reqs, next, retry, &nretry, rc);
				if (rc <= 0)
					break;
				done += rc == 1;
				progress = true;
			}
		}
		if (first && !nretry) {
			/* Stop sending; collect what is in flight, then report (a busy read
			 * among them is not sent again: it fails with the call). */
			for (uint32_t c = 0; c < d->ncn; c++) {
				int rc;

				while (!d->cn[c].dead && d->cn[c].inflight &&
				       (rc = take_one(d, c, 60000, reqs, n, base, later,
						      &nlater)) > 0)
					done += rc == 1;
			}
			for (size_t i = 0; i < nlater; i++, done++)
				reqs[later[i]].err = first, reqs[later[i]].finished = true;
			break;
		}
		if (!progress) {
			bool waited = false;

			for (uint32_t c = 0; c < d->ncn; c++) {
				int rc;

				if (d->cn[c].dead || !d->cn[c].inflight)
					continue;
				rc = take_one(d, c, 1, reqs, n, base, later, &nlater);
				if (rc == 1)
					done++;
				else if (rc < 0)
					done += run_lost(d, c, reqs, next, retry, &nretry, rc);
				waited = true;
				break;
			}
			if (!waited && !nretry && nlater && wait != UINT64_MAX)
				/* Only busy reads left, none due: sleep until the first is. */
				nanosleep(&(struct timespec){ .tv_nsec = (long)DM_MIN(wait, 10000000ull) },
					  NULL);
		}
	}
	d->rr++;
	first = d->ferr;
	if (first)
		snprintf(errbuf, sizeof(errbuf), "%s", d->fmsg);   /* errbuf: this thread's */
	pthread_mutex_unlock(&d->mu);
	free(retry);
	free(later);
	return first;
}
