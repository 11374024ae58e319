/* tcp_conn.c: one tcp connection: posting requests (READ/WRITE/CAS/FAA/SEND), the
 * completion queue, and the progress thread's side: parsing the peer's byte stream, serving
 * its one-sided requests like an RNIC (key, access, bounds, alignment), placing its SENDs in
 * the shared receive pool, and completing our requests from its responses. */
#include "tcp.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define TCP_RX_CAP       (256u * 1024)
#define TCP_DIRECT_MIN   (16u * 1024)   /* payloads this large are received in place */
#define TCP_ZC_MIN       1024u          /* READ data this large is sent from the MR */
#define RW_REQ_LEN       (DM_WIRE_HDR_LEN + sizeof(struct dm_wire_rw_req))

static inline struct tcp_conn *to_tc(struct dm_conn *dc)
{
	return container_of(dc, struct tcp_conn, base);
}

/* ---- byte buffer ---- */

/* Make room for n more bytes at the end of b. */
static int buf_reserve(struct tcp_buf *b, size_t n)
{
	size_t cap;
	uint8_t *p;

	if (b->off == b->len)
		b->off = b->len = 0;
	if (b->len + n <= b->cap)
		return 0;
	if (b->off) {
		memmove(b->data, b->data + b->off, b->len - b->off);
		b->len -= b->off;
		b->off = 0;
		if (b->len + n <= b->cap)
			return 0;
	}
	cap = b->cap ? b->cap : 16384;
	while (cap < b->len + n)
		cap *= 2;
	p = realloc(b->data, cap);
	if (!p)
		return -ENOMEM;
	b->data = p;
	b->cap = cap;
	return 0;
}

static inline uint8_t *buf_tail(struct tcp_buf *b, size_t n)
{
	uint8_t *p = b->data + b->len;

	b->len += n;
	return p;
}

/* ---- connection object ---- */

struct tcp_conn *tcp_conn_new(struct tcp_xport *tx, int fd, const char *peer,
			      const char *client)
{
	struct epoll_event ev = { .events = EPOLLIN };
	pthread_condattr_t ca;
	struct tcp_conn *c;

	c = calloc(1, sizeof(*c));
	if (!c)
		goto err;
	c->base.x = &tx->base;
	snprintf(c->base.peer, sizeof(c->base.peer), "%s", peer);
	/* Before the socket reaches epoll: every request on it is checked against this. */
	snprintf(c->base.client, sizeof(c->base.client), "%s", client ? client : "");
	c->tx = tx;
	c->fd = fd;
	c->cap_ops = tx->max_send_wr;
	c->ops = calloc(c->cap_ops, sizeof(*c->ops));
	c->cq_cap = tx->max_send_wr + 64;
	c->cq = calloc(c->cq_cap, sizeof(*c->cq));
	c->rx_cap = TCP_RX_CAP;
	c->rx = malloc(c->rx_cap);
	c->segs = calloc(TCP_MAX_SEGS, sizeof(*c->segs));
	if (!c->ops || !c->cq || !c->rx || !c->segs)
		goto err_free;
	if (buf_reserve(&c->out, 16384))
		goto err_free;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->rx_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cond, &ca);
	pthread_condattr_destroy(&ca);
	c->ev_in = true;
	ev.data.ptr = c;
	if (epoll_ctl(tx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int e = errno;

		pthread_cond_destroy(&c->cond);
		pthread_mutex_destroy(&c->rx_lock);
		pthread_mutex_destroy(&c->lock);
		errno = e;
		goto err_free_keep_errno;
	}
	return c;

err_free:
	errno = ENOMEM;
err_free_keep_errno:
	free(c->segs);
	free(c->out.data);
	free(c->rx);
	free(c->cq);
	free(c->ops);
	free(c);
	return NULL;
err:
	errno = ENOMEM;
	return NULL;
}

/* Free a connection that the progress thread no longer sees. Closing the socket tells the
 * peer (EOF), which completes its outstanding work with -ECONNRESET. */
void tcp_conn_free(struct tcp_conn *c)
{
	close(c->fd);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->rx_lock);
	pthread_mutex_destroy(&c->lock);
	free(c->segs);
	free(c->out.data);
	free(c->rx);
	free(c->cq);
	free(c->ops);
	free(c);
}

/* Update the epoll registration to ev_in/ev_out. Called with c->lock held. */
static void conn_arm(struct tcp_conn *c)
{
	struct epoll_event ev = {
		.events = (c->ev_in && !c->user_rx ? EPOLLIN : 0) | (c->ev_out ? EPOLLOUT : 0),
		.data.ptr = c,
	};

	if (!c->removed && epoll_ctl(c->tx->epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		dm_err("tcp: epoll_ctl(%s): %s", c->base.peer, strerror(errno));
}

/* Remove c from the context's list of connections blocked on the receive pool. */
static void blocked_remove(struct tcp_conn *c)
{
	struct tcp_conn **pp = &c->tx->blocked;

	pthread_mutex_lock(&c->tx->pool_lock);
	for (; *pp; pp = &(*pp)->blk_next)
		if (*pp == c) {
			*pp = c->blk_next;
			c->blk_next = NULL;
			break;
		}
	c->on_blocked = false;
	pthread_mutex_unlock(&c->tx->pool_lock);
}

/* Progress thread, on a close request: stop watching c. */
void tcp_conn_detach(struct tcp_conn *c)
{
	pthread_mutex_lock(&c->lock);
	if (!c->removed) {
		epoll_ctl(c->tx->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		c->removed = true;
	}
	c->closing = true;
	pthread_mutex_unlock(&c->lock);
	blocked_remove(c);
}

/* ---- completion queue (c->lock held) ---- */

static void cq_push(struct tcp_conn *c, uint64_t wr_id, int status, uint32_t len,
		    uint8_t opcode)
{
	if (c->cq_len == c->cq_cap) {
		uint32_t cap = c->cq_cap * 2;
		struct dm_wc *n = malloc(cap * sizeof(*n));

		if (!n) {
			dm_err("tcp: completion queue of %s overflows (out of memory)", c->base.peer);
			return;
		}
		for (uint32_t i = 0; i < c->cq_len; i++)
			n[i] = c->cq[(c->cq_head + i) % c->cq_cap];
		free(c->cq);
		c->cq = n;
		c->cq_cap = cap;
		c->cq_head = 0;
	}
	c->cq[(c->cq_head + c->cq_len) % c->cq_cap] = (struct dm_wc){
		.wr_id = wr_id, .status = status, .byte_len = status ? 0 : len, .opcode = opcode,
	};
	c->cq_len++;
	if (c->waiters)
		pthread_cond_signal(&c->cond);
	if (c->notify)
		dm_notify_wake(c->notify);
}

/* Put the connection in error state: every outstanding op completes with status, the
 * socket is shut down (the peer sees EOF) and later posts fail with -ENOTCONN. Progress
 * thread, c->lock held. */
static void conn_fail_locked(struct tcp_conn *c, int status, const char *why)
{
	if (c->failed)
		return;
	/* A peer that hangs up with nothing of ours outstanding is an ordinary close. */
	if (why && (c->head_id != c->next_id || status != -ECONNRESET))
		dm_warn("tcp: connection to %s failed: %s (%lu ops outstanding)", c->base.peer,
			why, (unsigned long)(c->next_id - c->head_id));
	else if (why)
		dm_debug("tcp: connection to %s closed: %s", c->base.peer, why);
	c->failed = true;
	for (; c->head_id != c->next_id; c->head_id++) {
		struct tcp_op *op = &c->ops[c->head_id % c->cap_ops];

		cq_push(c, op->wr_id, status, 0, op->opcode);
	}
	/* A receive buffer being filled is not returned to the pool: it completes in error. */
	if (c->pl_kind == TCP_PL_SEND) {
		cq_push(c, c->pl_recv.wr_id, status, 0, DM_WC_RECV);
		c->pl_kind = TCP_PL_NONE;
	}
	if (!c->removed) {
		epoll_ctl(c->tx->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		c->removed = true;
	}
	shutdown(c->fd, SHUT_RDWR);
	c->out.off = c->out.len = 0;
	c->nseg = 0;
	pthread_cond_broadcast(&c->cond);
	if (c->notify)
		dm_notify_wake(c->notify);
}

/* Write as much of the output buffer as the socket takes; arm EPOLLOUT for the rest.
 * c->lock held. 0 or -ECONNRESET. */
static int conn_flush(struct tcp_conn *c)
{
	struct tcp_buf *b = &c->out;

	while (b->off < b->len) {
		ssize_t n = send(c->fd, b->data + b->off, b->len - b->off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n > 0) {
			b->off += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			if (!c->ev_out) {
				c->ev_out = true;
				conn_arm(c);
			}
			return 0;
		}
		return -ECONNRESET;
	}
	b->off = b->len = 0;
	if (c->ev_out) {
		c->ev_out = false;
		conn_arm(c);
	}
	return 0;
}

/* Write the output buffer with the zero-copy segments gathered in (one sendmsg when the
 * socket takes it all); what the socket does not take is copied into a fresh output buffer,
 * because MR memory may change or go away once the MR read lock is released. c->lock and
 * the MR read lock held. 0, -ENOMEM or -ECONNRESET. */
static int conn_flush_segs(struct tcp_conn *c)
{
	struct iovec iov[2 * TCP_MAX_SEGS + 1];
	struct tcp_buf *b = &c->out, nb = { 0 };
	size_t pos = b->off, total = 0;
	int k = 0, i = 0;

	for (uint32_t s = 0; s < c->nseg; s++) {
		if (c->segs[s].at > pos)
			iov[k++] = (struct iovec){ b->data + pos, c->segs[s].at - pos };
		iov[k++] = (struct iovec){ (void *)c->segs[s].ptr, c->segs[s].len };
		pos = c->segs[s].at;
	}
	if (b->len > pos)
		iov[k++] = (struct iovec){ b->data + pos, b->len - pos };
	c->nseg = 0;
	for (int j = 0; j < k; j++)
		total += iov[j].iov_len;
	while (i < k) {
		struct msghdr mh = { .msg_iov = iov + i, .msg_iovlen = (size_t)(k - i) };
		ssize_t n = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		if (n <= 0)
			return -ECONNRESET;
		total -= (size_t)n;
		for (; i < k && (size_t)n >= iov[i].iov_len; i++)
			n -= (ssize_t)iov[i].iov_len;
		if (i < k) {
			iov[i].iov_base = (uint8_t *)iov[i].iov_base + n;
			iov[i].iov_len -= (size_t)n;
		}
	}
	if (i == k) {
		b->off = b->len = 0;
		return 0;
	}
	if (buf_reserve(&nb, total))
		return -ENOMEM;
	for (; i < k; i++)
		memcpy(buf_tail(&nb, iov[i].iov_len), iov[i].iov_base, iov[i].iov_len);
	free(b->data);
	*b = nb;
	if (!c->ev_out) {
		c->ev_out = true;
		conn_arm(c);
	}
	return 0;
}

/* ---- posting (application threads) ---- */

static bool in_mr(const struct dm_mr *mr, const void *p, size_t len)
{
	uintptr_t a, b = (uintptr_t)p;

	if (!mr || !p)
		return false;
	a = (uintptr_t)mr->addr;
	return b >= a && b - a <= mr->len && len <= mr->len - (b - a);
}

/* Lock c and check it can take n more ops. On success the lock is held. */
static int post_begin(struct tcp_conn *c, uint32_t n)
{
	pthread_mutex_lock(&c->lock);
	if (c->failed) {
		pthread_mutex_unlock(&c->lock);
		return -ENOTCONN;
	}
	if (c->next_id - c->head_id + n > c->cap_ops) {
		pthread_mutex_unlock(&c->lock);
		return -EAGAIN;
	}
	return 0;
}

/* Record an outstanding op; returns its request id. c->lock held. */
static uint64_t op_push(struct tcp_conn *c, uint64_t wr_id, void *local, uint32_t len,
			uint8_t opcode, uint32_t flags)
{
	uint64_t id = c->next_id++;

	c->ops[id % c->cap_ops] = (struct tcp_op){
		.wr_id = wr_id, .local = local, .len = len, .opcode = opcode,
		.signaled = flags & DM_WR_SIGNALED,
	};
	return id;
}

/* Ring the doorbell: write what was appended. Errors surface through the progress thread
 * (the socket reports them there), so posting itself succeeds. */
static void post_end(struct tcp_conn *c)
{
	if (!c->ev_out)
		(void)conn_flush(c);
	pthread_mutex_unlock(&c->lock);
}

static int rw_batch(struct dm_conn *dc, const struct dm_rdma_wr *wr, int n, bool write)
{
	struct tcp_conn *c = to_tc(dc);
	size_t bytes = 0;
	int rc;

	if (n <= 0 || !wr)
		return n == 0 ? 0 : -EINVAL;
	if ((uint32_t)n > c->cap_ops)
		return -EINVAL;   /* could never fit: -EAGAIN would loop forever */
	for (int i = 0; i < n; i++) {
		if (!in_mr(wr[i].mr, wr[i].local, wr[i].len) ||
		    wr[i].len > DM_WIRE_MAX_LEN - RW_REQ_LEN)
			return -EINVAL;
		bytes += RW_REQ_LEN + (write ? wr[i].len : 0);
	}
	rc = post_begin(c, (uint32_t)n);
	if (rc)
		return rc;
	if (buf_reserve(&c->out, bytes)) {
		pthread_mutex_unlock(&c->lock);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		struct dm_wire_rw_req m = { .remote = wr[i].remote, .rkey = wr[i].rkey,
					    .len = wr[i].len };
		uint32_t plen = write ? wr[i].len : 0;
		uint64_t id = op_push(c, wr[i].wr_id, wr[i].local, wr[i].len,
				      write ? DM_WC_WRITE : DM_WC_READ, wr[i].flags);
		uint8_t *p = buf_tail(&c->out, RW_REQ_LEN + plen);

		dm_wire_hdr_encode(p, write ? DM_OP_WRITE_REQ : DM_OP_READ_REQ,
				   (uint32_t)RW_REQ_LEN + plen, 0, id);
		dm_wire_rw_req_encode(p + DM_WIRE_HDR_LEN, &m);
		if (plen)
			memcpy(p + RW_REQ_LEN, wr[i].local, plen);
	}
	post_end(c);
	return 0;
}

int tcp_read_batch(struct dm_conn *dc, const struct dm_rdma_wr *wr, int n)
{
	return rw_batch(dc, wr, n, false);
}

int tcp_write_batch(struct dm_conn *dc, const struct dm_rdma_wr *wr, int n)
{
	return rw_batch(dc, wr, n, true);
}

/* Queue one atomic request (body already encoded) whose 8-byte answer lands in local. */
static int post_atomic(struct tcp_conn *c, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
		       uint16_t op, uint8_t wc_op, uint32_t flags, const uint8_t *body, size_t blen)
{
	const size_t len = DM_WIRE_HDR_LEN + blen;
	uint64_t id;
	uint8_t *p;
	int rc;

	if (!in_mr(mr, local, sizeof(*local)))
		return -EINVAL;
	rc = post_begin(c, 1);
	if (rc)
		return rc;
	if (buf_reserve(&c->out, len)) {
		pthread_mutex_unlock(&c->lock);
		return -ENOMEM;
	}
	id = op_push(c, wr_id, local, 8, wc_op, flags);
	p = buf_tail(&c->out, len);
	dm_wire_hdr_encode(p, op, (uint32_t)len, 0, id);
	memcpy(p + DM_WIRE_HDR_LEN, body, blen);
	post_end(c);
	return 0;
}

int tcp_cas(struct dm_conn *dc, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
	    uint64_t remote, uint32_t rkey, uint64_t expect, uint64_t desired, uint32_t flags)
{
	struct dm_wire_cas_req m = { .remote = remote, .rkey = rkey, .compare = expect,
				     .swap = desired };
	uint8_t body[sizeof(m)];

	dm_wire_cas_req_encode(body, &m);
	return post_atomic(to_tc(dc), wr_id, local, mr, DM_OP_CAS_REQ, DM_WC_CAS, flags, body,
			   sizeof(body));
}

int tcp_faa(struct dm_conn *dc, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
	    uint64_t remote, uint32_t rkey, uint64_t add, uint32_t flags)
{
	struct dm_wire_faa_req m = { .remote = remote, .rkey = rkey, .add = add };
	uint8_t body[sizeof(m)];

	dm_wire_faa_req_encode(body, &m);
	return post_atomic(to_tc(dc), wr_id, local, mr, DM_OP_FAA_REQ, DM_WC_FAA, flags, body,
			   sizeof(body));
}

int tcp_send(struct dm_conn *dc, uint64_t wr_id, const void *buf, uint32_t len,
	     struct dm_mr *mr, uint32_t flags)
{
	struct tcp_conn *c = to_tc(dc);
	uint64_t id;
	uint8_t *p;
	int rc;

	if (flags & DM_WR_INLINE) {
		if (len > c->tx->max_inline || (len && !buf))
			return -EINVAL;
	} else if (len && !in_mr(mr, buf, len)) {
		return -EINVAL;
	}
	if (len > DM_WIRE_MAX_LEN - DM_WIRE_HDR_LEN)
		return -EINVAL;
	rc = post_begin(c, 1);
	if (rc)
		return rc;
	if (buf_reserve(&c->out, DM_WIRE_HDR_LEN + len)) {
		pthread_mutex_unlock(&c->lock);
		return -ENOMEM;
	}
	/* The payload is copied now, so every SEND behaves as inline would. */
	id = op_push(c, wr_id, NULL, len, DM_WC_SEND, flags);
	p = buf_tail(&c->out, DM_WIRE_HDR_LEN + len);
	dm_wire_hdr_encode(p, DM_OP_SEND, DM_WIRE_HDR_LEN + len, 0, id);
	if (len)
		memcpy(p + DM_WIRE_HDR_LEN, buf, len);
	post_end(c);
	return 0;
}

/* ---- completions (application threads) ---- */

static int cq_pop(struct tcp_conn *c, struct dm_wc *wc, int n)
{
	int k = 0;

	while (k < n && c->cq_len) {
		wc[k++] = c->cq[c->cq_head];
		c->cq_head = (c->cq_head + 1) % c->cq_cap;
		c->cq_len--;
	}
	return k;
}

int tcp_poll(struct dm_conn *dc, struct dm_wc *wc, int n)
{
	struct tcp_conn *c = to_tc(dc);
	int k;

	if (n < 0 || (n && !wc))
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	k = cq_pop(c, wc, n);
	pthread_mutex_unlock(&c->lock);
	return k;
}

static void conn_rx(struct tcp_conn *c);

/* Read the socket in the waiting thread until a completion arrives, the deadline (ns, 0:
 * none) passes, or the connection fails or blocks on the receive pool. The progress thread
 * leaves the socket alone meanwhile (EPOLLIN off, rx_lock held): the response goes straight
 * to the thread that wants it instead of through a second thread. */
static void wait_user_rx(struct tcp_conn *c, uint64_t deadline)
{
	bool blocked;

	pthread_mutex_lock(&c->lock);
	if (c->failed || c->cq_len || c->removed || c->rx_blocked) {
		pthread_mutex_unlock(&c->lock);
		return;
	}
	c->user_rx = true;
	conn_arm(c);
	pthread_mutex_unlock(&c->lock);

	pthread_mutex_lock(&c->rx_lock);
	for (;;) {
		struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
		uint64_t now;
		int n, ms = -1;

		conn_rx(c);
		if (__atomic_load_n(&c->cq_len, __ATOMIC_ACQUIRE) ||
		    __atomic_load_n(&c->failed, __ATOMIC_ACQUIRE) || c->rx_blocked ||
		    __atomic_load_n(&c->removed, __ATOMIC_ACQUIRE))
			break;
		if (deadline) {
			now = dm_now_ns();
			if (now >= deadline)
				break;
			ms = (int)((deadline - now + 999999) / 1000000);
		}
		n = poll(&pfd, 1, ms);
		if (n == 0 || (n < 0 && errno != EINTR))
			break;
	}
	blocked = c->rx_blocked;
	pthread_mutex_unlock(&c->rx_lock);

	pthread_mutex_lock(&c->lock);
	c->user_rx = false;
	conn_arm(c);
	pthread_mutex_unlock(&c->lock);
	if (blocked)
		tcp_wake(c->tx);   /* let the progress thread resume it when buffers come */
}

/* Wait for at least one completion. On a failed connection with nothing left to report it
 * returns -ENOTCONN at once instead of waiting out the timeout. */
int tcp_wait(struct dm_conn *dc, struct dm_wc *wc, int n, int timeout_ms)
{
	struct tcp_conn *c = to_tc(dc);
	struct timespec ts;
	int k;

	if (n <= 0 || !wc)
		return -EINVAL;
	if (timeout_ms > 0) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += timeout_ms / 1000;
		ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
	}
	if (timeout_ms != 0 && !__atomic_load_n(&c->cq_len, __ATOMIC_ACQUIRE))
		wait_user_rx(c, timeout_ms > 0 ? dm_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0);
	pthread_mutex_lock(&c->lock);
	while (!c->cq_len) {
		int rc;

		if (c->failed) {
			pthread_mutex_unlock(&c->lock);
			return -ENOTCONN;
		}
		if (timeout_ms == 0)
			break;
		c->waiters++;
		rc = timeout_ms < 0 ? pthread_cond_wait(&c->cond, &c->lock) :
				      pthread_cond_timedwait(&c->cond, &c->lock, &ts);
		c->waiters--;
		if (rc == ETIMEDOUT)
			break;
	}
	k = cq_pop(c, wc, n);
	pthread_mutex_unlock(&c->lock);
	return k;
}

int tcp_notify(struct dm_conn *dc, struct dm_notify *n)
{
	struct tcp_conn *c = to_tc(dc);

	pthread_mutex_lock(&c->lock);
	c->notify = n;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* ---- progress thread: serving and completing ---- */

/* Append a header-only or fixed-body message to the output; any SEND_ACK we owe goes first
 * so that the peer sees its completions in request order. c->lock held. */
static uint8_t *emit_part(struct tcp_conn *c, uint16_t op, uint32_t len, uint32_t inbuf,
			  int32_t status, uint64_t req_id)
{
	uint8_t *p;

	if (buf_reserve(&c->out, inbuf + DM_WIRE_HDR_LEN)) {
		conn_fail_locked(c, -ENOMEM, "out of memory");
		return NULL;
	}
	if (c->ack_owed && op != DM_OP_SEND_ACK) {
		dm_wire_hdr_encode(buf_tail(&c->out, DM_WIRE_HDR_LEN), DM_OP_SEND_ACK,
				   DM_WIRE_HDR_LEN, 0, c->ack_id);
		c->ack_owed = false;
	}
	if (op == DM_OP_SEND_ACK)
		c->ack_owed = false;   /* cumulative: this one covers what we owed */
	p = buf_tail(&c->out, inbuf);
	dm_wire_hdr_encode(p, op, len, status, req_id);
	return p;
}

/* Append a whole message of len bytes (header + fixed body + payload to fill in). */
static uint8_t *emit(struct tcp_conn *c, uint16_t op, uint32_t len, int32_t status,
		     uint64_t req_id)
{
	return emit_part(c, op, len, len, status, req_id);
}

/* An error response: the request is refused and, like an RC QP after a remote error, this
 * connection takes no further requests (the initiator tears it down). */
static void emit_error(struct tcp_conn *c, uint16_t op, int32_t status, uint64_t req_id)
{
	emit(c, op, DM_WIRE_HDR_LEN, status, req_id);
	c->rx_discard = true;
}

/* Check a remote access the way an RNIC does: key, permission, bounds. */
static int mr_check(struct tcp_conn *c, uint32_t rkey, uint64_t remote, uint64_t len,
		    int access, uint8_t **ptr)
{
	struct tcp_mr *m;
	uint64_t base;

	if (c->base.client[0])
		return -EACCES;   /* a client identity never gets remote memory access */
	m = tcp_mr_lookup(c->tx, rkey);
	if (!m || !(m->access & access))
		return -EACCES;
	base = (uintptr_t)m->mr.addr;
	if (remote < base || remote - base > m->mr.len || len > m->mr.len - (remote - base))
		return -EFAULT;
	*ptr = (uint8_t *)(uintptr_t)remote;
	return 0;
}

/* Complete the oldest outstanding op; an error puts the connection in error state. */
static void complete_head(struct tcp_conn *c, int status)
{
	struct tcp_op *op = &c->ops[c->head_id % c->cap_ops];

	c->head_id++;
	if (status || op->signaled)
		cq_push(c, op->wr_id, status, op->len, op->opcode);
	if (status)
		conn_fail_locked(c, -ECANCELED, NULL);
}

/* The response must answer the oldest outstanding op, of the expected kind. */
static struct tcp_op *head_for(struct tcp_conn *c, uint64_t req_id, uint8_t opcode)
{
	struct tcp_op *op;

	if (c->head_id == c->next_id || req_id != c->head_id)
		return NULL;
	op = &c->ops[c->head_id % c->cap_ops];
	return op->opcode == opcode ? op : NULL;
}

/* A whole payload has arrived. */
static void payload_done(struct tcp_conn *c)
{
	enum tcp_pl_kind kind = c->pl_kind;

	c->pl_kind = TCP_PL_NONE;
	switch (kind) {
	case TCP_PL_READ_RESP:
		complete_head(c, 0);
		break;
	case TCP_PL_WRITE_REQ:
		if (c->pl_status)
			emit_error(c, DM_OP_WRITE_RESP, c->pl_status, c->pl_req_id);
		else
			emit(c, DM_OP_WRITE_RESP, DM_WIRE_HDR_LEN, 0, c->pl_req_id);
		break;
	case TCP_PL_SEND:
		cq_push(c, c->pl_recv.wr_id, c->pl_status, c->pl_total, DM_WC_RECV);
		if (c->pl_status) {
			emit_error(c, DM_OP_SEND_ACK, c->pl_status, c->pl_req_id);
		} else {
			c->ack_owed = true;
			c->ack_id = c->pl_req_id;
		}
		break;
	default:
		break;
	}
}

/* Handle one message whose header and fixed body are in the rx buffer. Returns 0 (consumed;
 * a payload may follow), 1 (blocked: no receive buffer, leave it in place) or -errno
 * (protocol violation). c->lock and the MR read lock held. */
static int handle(struct tcp_conn *c, const struct dm_wire_hdr *h, const uint8_t *body,
		  size_t blen)
{
	struct tcp_xport *tx = c->tx;
	uint32_t plen = h->length - DM_WIRE_HDR_LEN - (uint32_t)blen;
	struct tcp_op *op;
	uint8_t *ptr = NULL, *p;
	int rc, st;

	switch (h->op) {
	case DM_OP_READ_REQ: {
		struct dm_wire_rw_req m;

		if ((rc = dm_wire_rw_req_decode(body, blen, &m)) || plen)
			return rc ? rc : -EBADMSG;
		st = mr_check(c, m.rkey, m.remote, m.len, DM_MR_REMOTE_READ, &ptr);
		if (st) {
			emit_error(c, DM_OP_READ_RESP, st, h->req_id);
			return 0;
		}
		if (c->zc && c->nseg < TCP_MAX_SEGS && m.len >= TCP_ZC_MIN) {
			/* Header now, data gathered from the MR when the batch is written. */
			if (emit_part(c, DM_OP_READ_RESP, DM_WIRE_HDR_LEN + m.len, DM_WIRE_HDR_LEN,
				      0, h->req_id))
				c->segs[c->nseg++] = (struct tcp_seg){ .at = c->out.len, .ptr = ptr,
								       .len = m.len };
			return 0;
		}
		p = emit(c, DM_OP_READ_RESP, DM_WIRE_HDR_LEN + m.len, 0, h->req_id);
		if (p && m.len)
			memcpy(p + DM_WIRE_HDR_LEN, ptr, m.len);
		return 0;
	}
	case DM_OP_WRITE_REQ: {
		struct dm_wire_rw_req m;

		if ((rc = dm_wire_rw_req_decode(body, blen, &m)))
			return rc;
		if (plen != m.len)
			return -EBADMSG;
		st = mr_check(c, m.rkey, m.remote, m.len, DM_MR_REMOTE_WRITE, &ptr);
		c->pl_kind = TCP_PL_WRITE_REQ;
		c->pl_dst = st ? NULL : ptr;
		c->pl_left = m.len;
		c->pl_status = st;
		c->pl_req_id = h->req_id;
		c->pl_rkey = m.rkey;
		return 0;
	}
	case DM_OP_CAS_REQ:
	case DM_OP_FAA_REQ: {
		struct dm_wire_cas_req cm;
		struct dm_wire_faa_req fm;
		uint64_t remote, old = 0;
		uint32_t rkey;
		uint16_t rop = h->op == DM_OP_CAS_REQ ? DM_OP_CAS_RESP : DM_OP_FAA_RESP;

		if (h->op == DM_OP_CAS_REQ) {
			rc = dm_wire_cas_req_decode(body, blen, &cm);
			remote = cm.remote;
			rkey = cm.rkey;
		} else {
			rc = dm_wire_faa_req_decode(body, blen, &fm);
			remote = fm.remote;
			rkey = fm.rkey;
		}
		if (rc)
			return rc;
		st = mr_check(c, rkey, remote, 8, DM_MR_REMOTE_ATOMIC, &ptr);
		if (!st && (remote & 7))
			st = -EINVAL;
		if (st) {
			emit_error(c, rop, st, h->req_id);
			return 0;
		}
		/* Real atomics, so that they are atomic against the target's own CPU too. */
		if (h->op == DM_OP_CAS_REQ) {
			old = cm.compare;
			__atomic_compare_exchange_n((uint64_t *)ptr, &old, cm.swap, false,
						    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
		} else {
			old = __atomic_fetch_add((uint64_t *)ptr, fm.add, __ATOMIC_SEQ_CST);
		}
		p = emit(c, rop, DM_WIRE_HDR_LEN + sizeof(struct dm_wire_atomic_resp), 0,
			 h->req_id);
		if (p)
			dm_wire_atomic_resp_encode(p + DM_WIRE_HDR_LEN,
						   &(struct dm_wire_atomic_resp){ .old = old });
		return 0;
	}
	case DM_OP_SEND: {
		struct tcp_recv r;

		if (!tcp_pool_pop(tx, &r, c)) {
			/* Back-pressure: stop reading this socket until a buffer is posted. */
			c->rx_blocked = true;
			c->ev_in = false;
			conn_arm(c);
			return 1;
		}
		c->pl_kind = TCP_PL_SEND;
		c->pl_recv = r;
		c->pl_total = plen;
		c->pl_left = plen;
		c->pl_req_id = h->req_id;
		c->pl_status = plen > r.len ? -EMSGSIZE : 0;
		c->pl_dst = c->pl_status ? NULL : r.buf;
		return 0;
	}
	case DM_OP_READ_RESP:
		op = head_for(c, h->req_id, DM_WC_READ);
		if (!op)
			return -EPROTO;
		if (h->status) {
			complete_head(c, h->status);
			return 0;
		}
		if (plen != op->len)
			return -EBADMSG;
		c->pl_kind = TCP_PL_READ_RESP;
		c->pl_dst = op->local;
		c->pl_left = plen;
		return 0;
	case DM_OP_WRITE_RESP:
		if (!head_for(c, h->req_id, DM_WC_WRITE))
			return -EPROTO;
		complete_head(c, h->status);
		return 0;
	case DM_OP_CAS_RESP:
	case DM_OP_FAA_RESP:
		op = head_for(c, h->req_id, h->op == DM_OP_CAS_RESP ? DM_WC_CAS : DM_WC_FAA);
		if (!op)
			return -EPROTO;
		if (!h->status) {
			struct dm_wire_atomic_resp m;

			if ((rc = dm_wire_atomic_resp_decode(body, blen, &m)))
				return rc;
			memcpy(op->local, &m.old, sizeof(m.old));
		}
		complete_head(c, h->status);
		return 0;
	case DM_OP_SEND_ACK:
		/* Cumulative: every SEND up to req_id is acknowledged; a status is for req_id. */
		if (c->head_id == c->next_id || h->req_id < c->head_id || h->req_id >= c->next_id)
			return -EPROTO;
		while (!c->failed && c->head_id <= h->req_id) {
			if (c->ops[c->head_id % c->cap_ops].opcode != DM_WC_SEND)
				return -EPROTO;
			complete_head(c, c->head_id == h->req_id ? h->status : 0);
		}
		return 0;
	default:
		return -EPROTO;
	}
}

/* Parse everything in the rx buffer. Progress thread. */
static void conn_parse(struct tcp_conn *c)
{
	struct tcp_xport *tx = c->tx;

	pthread_rwlock_rdlock(&tx->mr_lock);
	pthread_mutex_lock(&c->lock);
	c->zc = c->out.off == c->out.len && !c->ev_out;
	while (!c->failed && !c->rx_blocked) {
		size_t avail = c->rx_len - c->rx_off;
		struct dm_wire_hdr h;
		int rc, blen;

		if (c->pl_kind != TCP_PL_NONE) {
			size_t k = DM_MIN(avail, c->pl_left);

			if (k) {
				/* A WRITE target rechecks its MR: it may be deregistered mid-way. */
				if (c->pl_kind == TCP_PL_WRITE_REQ && c->pl_dst &&
				    !tcp_mr_lookup(tx, c->pl_rkey)) {
					c->pl_dst = NULL;
					c->pl_status = -EACCES;
				}
				if (c->pl_dst) {
					memcpy(c->pl_dst, c->rx + c->rx_off, k);
					c->pl_dst += k;
				}
				c->rx_off += k;
				c->pl_left -= k;
			}
			if (c->pl_left)
				break;
			payload_done(c);
			continue;
		}
		if (avail < DM_WIRE_HDR_LEN)
			break;
		rc = dm_wire_hdr_decode(c->rx + c->rx_off, avail, &h);
		if (!rc)
			rc = dm_wire_check_len(&h);
		if (rc) {
			conn_fail_locked(c, -EPROTO, "malformed message");
			break;
		}
		blen = dm_wire_body_len(h.op, h.status);
		if (avail < DM_WIRE_HDR_LEN + (size_t)blen)
			break;
		if (c->rx_discard) {
			c->rx_off += DM_WIRE_HDR_LEN;
			c->pl_kind = TCP_PL_DISCARD;
			c->pl_dst = NULL;
			c->pl_left = h.length - DM_WIRE_HDR_LEN;
			continue;
		}
		rc = handle(c, &h, c->rx + c->rx_off + DM_WIRE_HDR_LEN, (size_t)blen);
		if (rc > 0)
			break;
		if (rc < 0) {
			conn_fail_locked(c, -EPROTO, "protocol violation");
			break;
		}
		c->rx_off += DM_WIRE_HDR_LEN + (size_t)blen;
	}
	if (!c->failed) {
		if (c->ack_owed)
			emit(c, DM_OP_SEND_ACK, DM_WIRE_HDR_LEN, 0, c->ack_id);
		if (c->nseg) {
			int rc = conn_flush_segs(c);

			if (rc)
				conn_fail_locked(c, rc, rc == -ENOMEM ? "out of memory" :
					      "peer closed the connection");
		} else if (!c->failed && !c->ev_out && conn_flush(c)) {
			conn_fail_locked(c, -ECONNRESET, "peer closed the connection");
		}
	}
	pthread_mutex_unlock(&c->lock);
	pthread_rwlock_unlock(&tx->mr_lock);
}

static void conn_fail(struct tcp_conn *c, int status, const char *why)
{
	pthread_mutex_lock(&c->lock);
	conn_fail_locked(c, status, why);
	pthread_mutex_unlock(&c->lock);
	blocked_remove(c);
}

/* Read what the socket has and parse it. Progress thread. */
static void conn_rx(struct tcp_conn *c)
{
	for (;;) {
		size_t want;
		ssize_t n;

		if (c->rx_blocked || c->removed)
			return;
		if (c->pl_kind != TCP_PL_NONE && c->pl_kind != TCP_PL_WRITE_REQ && c->pl_dst &&
		    c->rx_off == c->rx_len && c->pl_left >= TCP_DIRECT_MIN) {
			/* Large payload into its final place: no copy through rx. */
			want = c->pl_left;
			n = recv(c->fd, c->pl_dst, want, MSG_DONTWAIT);
			if (n > 0) {
				c->pl_dst += n;
				c->pl_left -= (size_t)n;
			}
		} else {
			if (c->rx_off == c->rx_len) {
				c->rx_off = c->rx_len = 0;
			} else if (c->rx_off && c->rx_cap - c->rx_len < 4096) {
				memmove(c->rx, c->rx + c->rx_off, c->rx_len - c->rx_off);
				c->rx_len -= c->rx_off;
				c->rx_off = 0;
			}
			want = c->rx_cap - c->rx_len;
			n = recv(c->fd, c->rx + c->rx_len, want, MSG_DONTWAIT);
			if (n > 0)
				c->rx_len += (size_t)n;
		}
		if (n == 0) {
			conn_fail(c, -ECONNRESET, c->closing ? NULL : "peer closed the connection");
			return;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return;
			conn_fail(c, -ECONNRESET, strerror(errno));
			return;
		}
		conn_parse(c);
		if ((size_t)n < want)
			return;
	}
}

void tcp_conn_on_event(struct tcp_conn *c, uint32_t events)
{
	if (c->removed)
		return;
	if (events & EPOLLOUT) {
		int rc;

		pthread_mutex_lock(&c->lock);
		rc = conn_flush(c);
		pthread_mutex_unlock(&c->lock);
		if (rc) {
			conn_fail(c, -ECONNRESET, "peer closed the connection");
			return;
		}
	}
	if (c->rx_blocked && (events & (EPOLLERR | EPOLLHUP))) {
		conn_fail(c, -ECONNRESET, "peer closed the connection");
		return;
	}
	if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
		/* Busy: the application thread waiting on c reads it (EPOLLIN is off then). */
		if (pthread_mutex_trylock(&c->rx_lock))
			return;
		conn_rx(c);
		pthread_mutex_unlock(&c->rx_lock);
	}
}

/* A receive buffer was posted: continue a connection blocked on the pool. */
void tcp_conn_resume(struct tcp_conn *c)
{
	if (pthread_mutex_trylock(&c->rx_lock)) {
		/* The waiter is leaving its read loop; it wakes us again if still blocked. */
		pthread_mutex_lock(&c->tx->pool_lock);
		if (!c->on_blocked) {
			c->on_blocked = true;
			c->blk_next = c->tx->blocked;
			c->tx->blocked = c;
		}
		pthread_mutex_unlock(&c->tx->pool_lock);
		return;
	}
	if (!c->removed && c->rx_blocked) {
		c->rx_blocked = false;
		conn_parse(c);
		if (!c->rx_blocked && !c->failed) {
			pthread_mutex_lock(&c->lock);
			c->ev_in = true;
			conn_arm(c);
			pthread_mutex_unlock(&c->lock);
		}
	}
	pthread_mutex_unlock(&c->rx_lock);
}
