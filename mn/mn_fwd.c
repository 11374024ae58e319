/* mn_fwd.c: the memory node's forwarding thread (see mn_fwd.h). One thread polls every
 * adopted connection, and sleeps until one of them has a completion (or a connection is
 * adopted); a relayed message is sent from the receive buffer it arrived in and that buffer
 * is reposted when the send completes, so a relay costs no copy. */
#include "mn_fwd.h"

#include <pthread.h>
#include <sys/prctl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "oracle.h"

#define MAX_FCONN 1024
#define REPLY_SLOTS 64
#define REPLY_SIZE (DM_WIRE_HDR_LEN + sizeof(struct dm_wire_fwd_table) + \
		    DM_MAX_NODES * sizeof(struct dm_wire_fwd_entry))
#define WR_REPLY_TAG (1ull << 62)
#define REPORT_FRESH_NS 10000000000ull   /* reports older than this leave the CSP estimate */

struct fconn {
	struct dm_conn *c;
	uint32_t cn, role, gen;
};

struct cn_report {
	bool valid;
	uint64_t t_ns, sample_ns;   /* last report, last report with a cache sample */
	uint32_t qlen, epoch, n;
	uint32_t next, flags;       /* the epoch rollout (oracle/rollout.h) */
	uint32_t *ids;
};

struct mn_fwd {
	struct dm_xport *x;
	struct dm_msgpool *pool;
	uint32_t node_id;
	pthread_t thread;
	atomic_bool stop;
	pthread_mutex_t lock;            /* the adoption queue */
	struct fconn adopt[64];
	atomic_uint nadopt;
	/* Owned by the thread. */
	struct fconn conn[MAX_FCONN];
	uint32_t nconn, next_gen;
	int serve[DM_MAX_NODES];         /* connection index of each CN's SERVE connection */
	int32_t *owner;                  /* per pool buffer: connection it is being sent on */
	struct cn_report rep[DM_MAX_NODES];
	uint8_t *rbuf;
	struct dm_mr *rmr;
	bool rfree[REPLY_SLOTS];
	atomic_ulong relayed, bounced, dropped, reports;
	atomic_uint nconns;
	/* Completions and adoptions wake the thread (wake_on: every connection can). */
	struct dm_notify wake;
	bool wake_on;
};

static uint32_t pool_index(uint64_t wr_id)
{
	return (uint32_t)(wr_id & ~DM_RPC_RECV_TAG);
}

static void drop_conn(struct mn_fwd *f, uint32_t ci)
{
	struct fconn *fc = &f->conn[ci];

	if (!fc->c)
		return;
	dm_info("mn%u: forwarding connection of cn%u (%s) closed", f->node_id, fc->cn,
		fc->role == DM_FWD_ROLE_SERVE ? "serve" : "origin");
	dm_conn_close(fc->c);
	fc->c = NULL;
	if (fc->role == DM_FWD_ROLE_SERVE && f->serve[fc->cn] == (int)ci)
		f->serve[fc->cn] = -1;
	/* Closing flushed the sends still using receive buffers: give those back. */
	for (uint32_t i = 0; i < f->pool->count; i++)
		if (f->owner[i] == (int32_t)ci) {
			f->owner[i] = -1;
			dm_msgpool_repost(f->pool, DM_RPC_RECV_TAG | i);
		}
	atomic_fetch_sub(&f->nconns, 1);
}

/* Send a received message (buffer wr_id) on connection ci; the buffer is reposted when the
 * send completes (or now, on failure). */
static void relay(struct mn_fwd *f, uint32_t ci, uint64_t wr_id, uint8_t *buf, uint32_t len)
{
	int rc;

	if (ci >= f->nconn || !f->conn[ci].c) {
		atomic_fetch_add(&f->dropped, 1);
		dm_msgpool_repost(f->pool, wr_id);
		return;
	}
	f->owner[pool_index(wr_id)] = (int32_t)ci;
	rc = dm_conn_send(f->conn[ci].c, wr_id, buf, len, f->pool->mr, DM_WR_SIGNALED);
	if (rc) {
		f->owner[pool_index(wr_id)] = -1;
		atomic_fetch_add(&f->dropped, 1);
		dm_msgpool_repost(f->pool, wr_id);
		drop_conn(f, ci);
		return;
	}
	atomic_fetch_add(&f->relayed, 1);
}

/* Store a CN's report and answer with the table of all reports and their CSP. */
static void on_state(struct mn_fwd *f, uint32_t ci, const uint8_t *buf, uint32_t len,
		     uint64_t req_id)
{
	struct dm_wire_fwd_state s;
	struct dm_wire_fwd_table t = { .csp_ppm = DM_FWD_CSP_NONE };
	const uint32_t *ids[DM_MAX_NODES];
	size_t cnt[DM_MAX_NODES];
	struct cn_report *r;
	uint64_t now = dm_now_ns();
	uint32_t nids = 0, slot;
	uint8_t *out;

	dm_wire_fwd_state_decode(buf + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &s);
	r = &f->rep[s.cn];
	if (!r->ids)
		r->ids = malloc(DM_FWD_MAX_SAMPLE * sizeof(uint32_t));
	if (!r->ids)
		return;
	/* A queue-length-only report keeps the CN's last cache sample (and its age). */
	if (s.entries != DM_FWD_NO_SAMPLE || !r->valid) {
		for (uint32_t i = 0; i < s.nsample; i++)
			r->ids[i] = dm_get_le32(buf + DM_WIRE_HDR_LEN + sizeof(s) + 4 * (size_t)i);
		r->n = s.nsample;
		r->sample_ns = now;
	}
	r->qlen = s.qlen;
	r->epoch = s.epoch;
	r->next = s.next;
	r->flags = s.flags;
	r->t_ns = now;
	r->valid = true;
	atomic_fetch_add(&f->reports, 1);

	for (slot = 0; slot < REPLY_SLOTS && !f->rfree[slot]; slot++)
		;
	if (slot == REPLY_SLOTS)
		return;   /* replies backed up: the CN uses its last known table */
	out = f->rbuf + (size_t)slot * REPLY_SIZE;
	for (uint32_t c = 0; c < DM_MAX_NODES; c++) {
		struct cn_report *e = &f->rep[c];
		struct dm_wire_fwd_entry en;

		if (!e->valid)
			continue;
		en = (struct dm_wire_fwd_entry){ .cn = c, .qlen = e->qlen, .epoch = e->epoch,
			.next = e->next, .flags = e->flags,
			.age_ms = (uint32_t)DM_MIN((now - e->t_ns) / 1000000, UINT32_MAX) };
		dm_wire_fwd_entry_encode(out + DM_WIRE_HDR_LEN + sizeof(t) +
					 sizeof(en) * (size_t)t.n, &en);
		t.n++;
		t.epoch = DM_MAX(t.epoch, e->epoch);
		if (now - e->sample_ns < REPORT_FRESH_NS) {
			ids[nids] = e->ids;
			cnt[nids++] = e->n;
		}
	}
	if (nids) {
		double csp = dm_csp_exact(ids, cnt, nids);

		if (csp >= 0) {
			t.csp_ppm = (uint32_t)(csp * 1e6 + 0.5);
			t.csp_cns = nids;
		}
	}
	dm_wire_fwd_table_encode(out + DM_WIRE_HDR_LEN, &t);
	len = DM_WIRE_HDR_LEN + (uint32_t)sizeof(t) + (uint32_t)sizeof(struct dm_wire_fwd_entry) * t.n;
	dm_wire_hdr_encode(out, DM_OP_FWD_STATE + 1, len, 0, req_id);
	if (dm_conn_send(f->conn[ci].c, WR_REPLY_TAG | slot, out, len, f->rmr, DM_WR_SIGNALED))
		drop_conn(f, ci);
	else
		f->rfree[slot] = false;
}

/* One message received on connection ci. */
static void on_recv(struct mn_fwd *f, uint32_t ci, const struct dm_wc *wc)
{
	uint8_t *buf = dm_msgpool_buf(f->pool, wc->wr_id);
	struct dm_wire_hdr h;
	struct dm_wire_fwd fw;
	int target;

	if (!buf || dm_wire_hdr_decode(buf, wc->byte_len, &h) ||
	    dm_wire_fwd_check(&h, buf, wc->byte_len)) {
		dm_warn("mn%u: malformed forwarding message from %s; closing", f->node_id,
			f->conn[ci].c->peer);
		if (buf)
			dm_msgpool_repost(f->pool, wc->wr_id);
		drop_conn(f, ci);
		return;
	}
	switch (h.op) {
	case DM_OP_FWD_QUERY:
		dm_wire_fwd_decode(buf + DM_WIRE_HDR_LEN, wc->byte_len - DM_WIRE_HDR_LEN, &fw);
		fw.token = ci | ((uint64_t)f->conn[ci].gen << 32);
		fw.origin = f->conn[ci].cn;
		dm_wire_fwd_encode(buf + DM_WIRE_HDR_LEN, &fw);
		target = f->serve[fw.target];
		if (target < 0) {
			/* The target is not (yet) connected here: the origin runs it itself. */
			dm_wire_hdr_encode(buf, DM_OP_FWD_BOUNCE, h.length, 0, h.req_id);
			atomic_fetch_add(&f->bounced, 1);
			relay(f, ci, wc->wr_id, buf, wc->byte_len);
			return;
		}
		relay(f, (uint32_t)target, wc->wr_id, buf, wc->byte_len);
		return;
	case DM_OP_FWD_RESULT: {
		uint32_t oi;

		dm_wire_fwd_decode(buf + DM_WIRE_HDR_LEN, wc->byte_len - DM_WIRE_HDR_LEN, &fw);
		oi = (uint32_t)(fw.token & 0xffffffffu);
		if (oi >= f->nconn || !f->conn[oi].c || f->conn[oi].gen != (uint32_t)(fw.token >> 32)) {
			/* The origin connection is gone (its worker left): nobody to answer. */
			atomic_fetch_add(&f->dropped, 1);
			dm_msgpool_repost(f->pool, wc->wr_id);
			return;
		}
		relay(f, oi, wc->wr_id, buf, wc->byte_len);
		return;
	}
	case DM_OP_FWD_STATE:
		on_state(f, ci, buf, wc->byte_len, h.req_id);
		break;
	default:
		/* HELLO twice, or a message meant for a CN: ignore. */
		break;
	}
	dm_msgpool_repost(f->pool, wc->wr_id);
}

static void take_adopted(struct mn_fwd *f)
{
	pthread_mutex_lock(&f->lock);
	for (uint32_t i = 0; i < f->nadopt; i++) {
		struct fconn *a = &f->adopt[i];
		uint32_t ci;

		for (ci = 0; ci < f->nconn && f->conn[ci].c; ci++)
			;
		if (ci == MAX_FCONN) {
			dm_warn("mn%u: too many forwarding connections; refusing %s", f->node_id,
				a->c->peer);
			dm_conn_close(a->c);
			continue;
		}
		if (ci == f->nconn)
			f->nconn++;
		if (f->wake_on && dm_conn_notify(a->c, &f->wake))
			f->wake_on = false;   /* cannot be woken by it: poll them all */
		f->conn[ci] = *a;
		f->conn[ci].gen = ++f->next_gen;
		atomic_fetch_add(&f->nconns, 1);
		if (a->role == DM_FWD_ROLE_SERVE) {
			/* A CN that reconnects replaces its old SERVE connection. */
			if (f->serve[a->cn] >= 0 && f->serve[a->cn] != (int)ci)
				drop_conn(f, (uint32_t)f->serve[a->cn]);
			f->serve[a->cn] = (int)ci;
		}
		dm_info("mn%u: cn%u %s connection from %s", f->node_id, a->cn,
			a->role == DM_FWD_ROLE_SERVE ? "serves forwarded queries on its" :
			"forwards through its", a->c->peer);
	}
	atomic_store(&f->nadopt, 0);
	pthread_mutex_unlock(&f->lock);
}

static void *fwd_thread(void *arg)
{
	struct mn_fwd *f = arg;
	unsigned idle = 0;
	bool armed = false;

	prctl(PR_SET_TIMERSLACK, 1000UL);   /* 1 us: short idle sleeps stay short */

	while (!atomic_load(&f->stop)) {
		bool progress = false;

		if (atomic_load(&f->nadopt))   /* peek; the queue is taken under the lock */
			take_adopted(f);
		for (uint32_t ci = 0; ci < f->nconn; ci++) {
			struct dm_wc wc[32];
			int n;

			if (!f->conn[ci].c)
				continue;
			n = dm_conn_poll(f->conn[ci].c, wc, 32);
			if (n < 0) {
				drop_conn(f, ci);
				continue;
			}
			for (int i = 0; i < n && f->conn[ci].c; i++) {
				progress = true;
				if (wc[i].opcode == DM_WC_SEND) {
					if (wc[i].wr_id & WR_REPLY_TAG) {
						f->rfree[wc[i].wr_id & (REPLY_SLOTS - 1)] = true;
					} else if (dm_msgpool_buf(f->pool, wc[i].wr_id)) {
						f->owner[pool_index(wc[i].wr_id)] = -1;
						dm_msgpool_repost(f->pool, wc[i].wr_id);
					}
					if (wc[i].status)
						drop_conn(f, ci);
					continue;
				}
				if (wc[i].status) {
					if (wc[i].opcode == DM_WC_RECV && dm_msgpool_buf(f->pool, wc[i].wr_id))
						dm_msgpool_repost(f->pool, wc[i].wr_id);
					drop_conn(f, ci);
					continue;
				}
				if (wc[i].opcode == DM_WC_RECV)
					on_recv(f, ci, &wc[i]);
			}
		}
		/* Idle: sleep until a completion or an adoption wakes us (armed first, then one
		 * more look at every connection). Without wake-ups (a transport that cannot),
		 * poll while traffic flows and back off exponentially from 5 us to 1 ms per round
		 * (the thread's timer slack is 1 us). */
		if (progress) {
			idle = 0;
		} else if (f->wake_on) {
			if (!armed) {
				dm_notify_arm(&f->wake);
				armed = true;
			} else {
				dm_notify_wait(&f->wake, 1000);
				armed = false;
			}
		} else if (++idle > 16) {
			usleep(idle < 24 ? 5u << (idle - 17) : 1000);
		}
	}
	for (uint32_t ci = 0; ci < f->nconn; ci++)
		drop_conn(f, ci);
	return NULL;
}

struct mn_fwd *mn_fwd_start(struct dm_xport *x, struct dm_msgpool *pool, uint32_t node_id)
{
	struct mn_fwd *f = calloc(1, sizeof(*f));
	int rc;

	if (!f)
		return NULL;
	f->wake.fd = -1;
	f->x = x;
	f->pool = pool;
	f->node_id = node_id;
	pthread_mutex_init(&f->lock, NULL);
	for (uint32_t i = 0; i < DM_MAX_NODES; i++)
		f->serve[i] = -1;
	f->owner = malloc(pool->count * sizeof(*f->owner));
	f->rbuf = aligned_alloc(64, DM_ALIGN_UP((size_t)REPLY_SLOTS * REPLY_SIZE, 64));
	if (!f->owner || !f->rbuf)
		goto err_free;
	for (uint32_t i = 0; i < pool->count; i++)
		f->owner[i] = -1;
	for (uint32_t i = 0; i < REPLY_SLOTS; i++)
		f->rfree[i] = true;
	f->wake_on = !dm_notify_init(&f->wake);
	rc = dm_xport_reg(x, f->rbuf, (size_t)REPLY_SLOTS * REPLY_SIZE, 0, &f->rmr);
	if (rc) {
		errno = -rc;
		goto err_free;
	}
	rc = pthread_create(&f->thread, NULL, fwd_thread, f);
	if (rc) {
		dm_xport_dereg(x, f->rmr);
		errno = rc;
		goto err_free;
	}
	return f;

err_free:
	dm_notify_fini(&f->wake);
	free(f->owner);
	free(f->rbuf);
	free(f);
	return NULL;
}

void mn_fwd_stop(struct mn_fwd *f)
{
	if (!f)
		return;
	atomic_store(&f->stop, true);
	dm_notify_wake(&f->wake);
	pthread_join(f->thread, NULL);
	for (uint32_t i = 0; i < f->nadopt; i++)
		dm_conn_close(f->adopt[i].c);
	for (uint32_t c = 0; c < DM_MAX_NODES; c++)
		free(f->rep[c].ids);
	dm_xport_dereg(f->x, f->rmr);
	free(f->rbuf);
	free(f->owner);
	pthread_mutex_destroy(&f->lock);
	dm_notify_fini(&f->wake);
	free(f);
}

void mn_fwd_adopt(struct mn_fwd *f, struct dm_conn *conn, const struct dm_wire_fwd_hello *hello)
{
	pthread_mutex_lock(&f->lock);
	if (f->nadopt == DM_ARRAY_SIZE(f->adopt)) {
		pthread_mutex_unlock(&f->lock);
		dm_warn("mn%u: forwarding adoption queue full; closing %s", f->node_id, conn->peer);
		dm_conn_close(conn);
		return;
	}
	f->adopt[atomic_fetch_add(&f->nadopt, 1)] = (struct fconn){ .c = conn, .cn = hello->cn,
								  .role = hello->role };
	pthread_mutex_unlock(&f->lock);
	dm_notify_wake(&f->wake);
}

void mn_fwd_stats(struct mn_fwd *f, struct mn_fwd_stats *st)
{
	st->relayed = atomic_load(&f->relayed);
	st->bounced = atomic_load(&f->bounced);
	st->dropped = atomic_load(&f->dropped);
	st->reports = atomic_load(&f->reports);
	st->conns = atomic_load(&f->nconns);
}
