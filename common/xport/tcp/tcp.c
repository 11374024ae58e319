/* tcp.c: the tcp backend's context: open/close, memory registration (the MR table the
 * progress thread checks requests against), the shared receive pool, the progress thread,
 * and connection setup (listen/accept/connect, each running the handshake first). */
#include "tcp.h"
#include "../handshake.h"

#include <netdb.h>
#include <openssl/crypto.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define TCP_CONNECT_DEFAULT_MS 10000

static void tcp_close(struct dm_xport *x);
static int tcp_reg(struct dm_xport *x, void *addr, size_t len, int access, struct dm_mr **out);
static int tcp_dereg(struct dm_xport *x, struct dm_mr *mr);
static int tcp_post_recv(struct dm_xport *x, void *buf, uint32_t len, struct dm_mr *mr,
			 uint64_t wr_id);
static int tcp_listen(struct dm_xport *x, const char *addr, struct dm_listener **out);
static int tcp_accept(struct dm_listener *l, int timeout_ms, struct dm_conn **out);
static void tcp_listener_close(struct dm_listener *l);
static int tcp_listener_port(struct dm_listener *l);
static int tcp_connect(struct dm_xport *x, const char *addr, int timeout_ms,
		       struct dm_conn **out);
static void tcp_conn_close(struct dm_conn *c);

static const struct dm_xport_ops tcp_ops = {
	.size = sizeof(struct dm_xport_ops),
	.name = "tcp",
	.caps = DM_XCAP_READ | DM_XCAP_WRITE | DM_XCAP_ATOMIC | DM_XCAP_SEND | DM_XCAP_INLINE,
	.close = tcp_close,
	.reg = tcp_reg,
	.dereg = tcp_dereg,
	.post_recv = tcp_post_recv,
	.listen = tcp_listen,
	.accept = tcp_accept,
	.listener_close = tcp_listener_close,
	.listener_port = tcp_listener_port,
	.connect = tcp_connect,
	.conn_close = tcp_conn_close,
	.read_batch = tcp_read_batch,
	.write_batch = tcp_write_batch,
	.cas = tcp_cas,
	.faa = tcp_faa,
	.send = tcp_send,
	.poll = tcp_poll,
	.wait = tcp_wait,
	.notify = tcp_notify,
};

static inline struct tcp_xport *to_tx(struct dm_xport *x)
{
	return container_of(x, struct tcp_xport, base);
}

void tcp_wake(struct tcp_xport *tx)
{
	uint64_t one = 1;

	if (write(tx->evfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		dm_err("tcp: eventfd write: %s", strerror(errno));
}

/* ---- memory registration ---- */

struct tcp_mr *tcp_mr_lookup(struct tcp_xport *tx, uint32_t rkey)
{
	uint32_t idx = rkey >> 8;
	struct tcp_mr *m;

	if (idx == 0 || idx > tx->n_mrs)
		return NULL;
	m = tx->mrs[idx - 1];
	return m && m->mr.rkey == rkey ? m : NULL;
}

/* Register [addr, addr+len) for the given remote access; the rkey names a table slot plus
 * 8 bits that change on every registration, so a stale key does not hit a new region. */
static int tcp_reg(struct dm_xport *x, void *addr, size_t len, int access, struct dm_mr **out)
{
	struct tcp_xport *tx = to_tx(x);
	static uint32_t seq;
	struct tcp_mr *m;
	uint32_t idx;

	if ((!addr && len) || (access & ~DM_MR_REMOTE_ALL) || !out)
		return -EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->mr.addr = addr;
	m->mr.len = len;
	m->mr.priv = m;
	m->access = access;
	pthread_rwlock_wrlock(&tx->mr_lock);
	for (idx = 0; idx < tx->n_mrs && tx->mrs[idx]; idx++)
		;
	if (idx == tx->n_mrs) {
		struct tcp_mr **n;

		if (tx->n_mrs >= (1u << 24) - 1) {
			pthread_rwlock_unlock(&tx->mr_lock);
			free(m);
			return -ENOSPC;
		}
		n = realloc(tx->mrs, (tx->n_mrs + 1) * sizeof(*n));
		if (!n) {
			pthread_rwlock_unlock(&tx->mr_lock);
			free(m);
			return -ENOMEM;
		}
		tx->mrs = n;
		tx->n_mrs++;
	}
	m->mr.rkey = ((idx + 1) << 8) | ((__atomic_add_fetch(&seq, 0x9d, __ATOMIC_RELAXED)) & 0xff);
	m->mr.lkey = m->mr.rkey;
	tx->mrs[idx] = m;
	pthread_rwlock_unlock(&tx->mr_lock);
	*out = &m->mr;
	return 0;
}

/* Deregister: waits for a request being served from this MR to finish (write lock). */
static int tcp_dereg(struct dm_xport *x, struct dm_mr *mr)
{
	struct tcp_xport *tx = to_tx(x);
	struct tcp_mr *m;

	if (!mr)
		return -EINVAL;
	pthread_rwlock_wrlock(&tx->mr_lock);
	m = tcp_mr_lookup(tx, mr->rkey);
	if (!m || &m->mr != mr) {
		pthread_rwlock_unlock(&tx->mr_lock);
		return -EINVAL;
	}
	tx->mrs[(mr->rkey >> 8) - 1] = NULL;
	pthread_rwlock_unlock(&tx->mr_lock);
	free(m);
	return 0;
}

/* ---- shared receive pool ---- */

static int tcp_post_recv(struct dm_xport *x, void *buf, uint32_t len, struct dm_mr *mr,
			 uint64_t wr_id)
{
	struct tcp_xport *tx = to_tx(x);
	uintptr_t a, b = (uintptr_t)buf;
	bool wake = false;

	if (!buf || !mr)
		return -EINVAL;
	a = (uintptr_t)mr->addr;
	if (b < a || b - a > mr->len || len > mr->len - (b - a))
		return -EINVAL;
	pthread_mutex_lock(&tx->pool_lock);
	if (tx->pool_len == tx->max_recv_wr) {
		pthread_mutex_unlock(&tx->pool_lock);
		return -EAGAIN;
	}
	tx->pool[(tx->pool_head + tx->pool_len) % tx->max_recv_wr] =
		(struct tcp_recv){ .buf = buf, .len = len, .wr_id = wr_id };
	tx->pool_len++;
	if (tx->pool_waiters) {
		tx->pool_waiters = false;
		wake = true;
	}
	pthread_mutex_unlock(&tx->pool_lock);
	if (wake)
		tcp_wake(tx);
	return 0;
}

/* Take one posted buffer; on an empty pool put c on the blocked list (post_recv wakes the
 * progress thread, which resumes it). */
bool tcp_pool_pop(struct tcp_xport *tx, struct tcp_recv *out, struct tcp_conn *c)
{
	bool ok = false;

	pthread_mutex_lock(&tx->pool_lock);
	if (tx->pool_len) {
		*out = tx->pool[tx->pool_head];
		tx->pool_head = (tx->pool_head + 1) % tx->max_recv_wr;
		tx->pool_len--;
		ok = true;
	} else {
		tx->pool_waiters = true;
		if (!c->on_blocked) {
			c->on_blocked = true;
			c->blk_next = tx->blocked;
			tx->blocked = c;
		}
	}
	pthread_mutex_unlock(&tx->pool_lock);
	return ok;
}

/* ---- progress thread ---- */

/* Handle wake-ups: resume connections blocked on the receive pool, serve a close request. */
static bool progress_commands(struct tcp_xport *tx)
{
	struct tcp_conn *b;
	bool stop;
	uint64_t v;

	if (read(tx->evfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		dm_err("tcp: eventfd read: %s", strerror(errno));
	pthread_mutex_lock(&tx->pool_lock);
	b = tx->blocked;
	tx->blocked = NULL;
	for (struct tcp_conn *i = b; i; i = i->blk_next)
		i->on_blocked = false;
	pthread_mutex_unlock(&tx->pool_lock);
	while (b) {
		struct tcp_conn *next = b->blk_next;

		b->blk_next = NULL;
		tcp_conn_resume(b);
		b = next;
	}
	pthread_mutex_lock(&tx->lock);
	if (tx->close_req && !tx->close_done) {
		tcp_conn_detach(tx->close_req);
		tx->close_done = true;
		pthread_cond_broadcast(&tx->cmd_cond);
	}
	stop = tx->stop;
	pthread_mutex_unlock(&tx->lock);
	return stop;
}

/* The progress loop: socket events first, then commands (after the batch, so that a
 * connection freed by a close request never has an event pending in the same batch). */
static void *tcp_progress(void *arg)
{
	struct tcp_xport *tx = arg;
	struct epoll_event ev[64];

	for (;;) {
		bool cmd = false;
		int n = epoll_wait(tx->epfd, ev, DM_ARRAY_SIZE(ev), -1);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			dm_err("tcp: epoll_wait: %s", strerror(errno));
			break;
		}
		for (int i = 0; i < n; i++) {
			if (!ev[i].data.ptr)
				cmd = true;
			else
				tcp_conn_on_event(ev[i].data.ptr, ev[i].events);
		}
		if (cmd && progress_commands(tx))
			break;
	}
	return NULL;
}

/* ---- context ---- */

static struct dm_xport *tcp_open(const struct dm_xport_params *p)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	struct tcp_xport *tx;
	pthread_condattr_t ca;
	sigset_t all, old;
	int rc;

	tx = calloc(1, sizeof(*tx));
	if (!tx) {
		errno = ENOMEM;
		return NULL;
	}
	rc = dm_xport_base_init(&tx->base, &tcp_ops, p);
	if (rc)
		goto err_free_tx;
	tx->max_send_wr = p->max_send_wr ? p->max_send_wr : 256;
	tx->max_recv_wr = p->max_recv_wr ? p->max_recv_wr : 1024;
	tx->max_inline = p->max_inline ? p->max_inline : 128;
	rc = -ENOMEM;
	tx->pool = calloc(tx->max_recv_wr, sizeof(*tx->pool));
	if (!tx->pool)
		goto err_free_tx;
	pthread_mutex_init(&tx->lock, NULL);
	pthread_mutex_init(&tx->pool_lock, NULL);
	pthread_rwlock_init(&tx->mr_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&tx->cmd_cond, &ca);
	pthread_condattr_destroy(&ca);

	tx->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (tx->epfd < 0) {
		rc = -errno;
		goto err_free_pool;
	}
	tx->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (tx->evfd < 0) {
		rc = -errno;
		goto err_close_ep;
	}
	if (epoll_ctl(tx->epfd, EPOLL_CTL_ADD, tx->evfd, &ev) < 0) {
		rc = -errno;
		goto err_close_ev;
	}
	/* The progress thread takes no signals: they belong to the application's threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = -pthread_create(&tx->thread, NULL, tcp_progress, tx);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc)
		goto err_close_ev;
	tx->thread_started = true;
	return &tx->base;

err_close_ev:
	close(tx->evfd);
err_close_ep:
	close(tx->epfd);
err_free_pool:
	free(tx->pool);
err_free_tx:
	free(tx);
	errno = -rc;
	return NULL;
}

static void tcp_close(struct dm_xport *x)
{
	struct tcp_xport *tx = to_tx(x);
	struct tcp_conn *c;

	pthread_mutex_lock(&tx->lock);
	tx->stop = true;
	pthread_mutex_unlock(&tx->lock);
	tcp_wake(tx);
	if (tx->thread_started)
		pthread_join(tx->thread, NULL);
	/* Connections the caller did not close go with the context. */
	while ((c = tx->conns)) {
		tx->conns = c->next;
		dm_debug("tcp: closing connection to %s with its context", c->base.peer);
		tcp_conn_free(c);
	}
	for (uint32_t i = 0; i < tx->n_mrs; i++)
		free(tx->mrs[i]);
	free(tx->mrs);
	free(tx->pool);
	close(tx->evfd);
	close(tx->epfd);
	pthread_cond_destroy(&tx->cmd_cond);
	pthread_rwlock_destroy(&tx->mr_lock);
	pthread_mutex_destroy(&tx->pool_lock);
	pthread_mutex_destroy(&tx->lock);
	OPENSSL_cleanse(tx->base.secret, sizeof(tx->base.secret));
	free(tx);
}

/* ---- connections ---- */

/* Socket options for an established connection: no Nagle (requests are latency-bound),
 * keepalive and a user timeout so that a vanished peer is noticed in seconds. */
static void tcp_sockopts(int fd)
{
	int one = 1, idle = 5, intvl = 2, cnt = 3;
	unsigned int user_to = 15000;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_to, sizeof(user_to));
}

/* Register a handshaken socket as a connection of the context. */
static int tcp_conn_attach(struct tcp_xport *tx, int fd, const char *peer, const char *client,
			   struct dm_conn **out)
{
	struct tcp_conn *c = tcp_conn_new(tx, fd, peer, client);

	if (!c)
		return -errno;
	pthread_mutex_lock(&tx->lock);
	c->next = tx->conns;
	if (tx->conns)
		tx->conns->prev = c;
	tx->conns = c;
	pthread_mutex_unlock(&tx->lock);
	*out = &c->base;
	return 0;
}

/* Close a connection: the progress thread takes it out of epoll first, then it is freed. */
static void tcp_conn_close(struct dm_conn *dc)
{
	struct tcp_conn *c = container_of(dc, struct tcp_conn, base);
	struct tcp_xport *tx = c->tx;

	pthread_mutex_lock(&tx->lock);
	while (tx->close_req)
		pthread_cond_wait(&tx->cmd_cond, &tx->lock);
	tx->close_req = c;
	tx->close_done = false;
	tcp_wake(tx);
	while (!tx->close_done)
		pthread_cond_wait(&tx->cmd_cond, &tx->lock);
	tx->close_req = NULL;
	pthread_cond_broadcast(&tx->cmd_cond);
	if (c->prev)
		c->prev->next = c->next;
	else
		tx->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&tx->lock);
	tcp_conn_free(c);
}

static int ms_left(uint64_t deadline)
{
	uint64_t now = dm_now_ns();

	return now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
}

static int tcp_connect(struct dm_xport *x, const char *addr, int timeout_ms,
		       struct dm_conn **out)
{
	struct tcp_xport *tx = to_tx(x);
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
	char host[256], port[16];
	uint64_t deadline;
	int fd = -1, rc;

	if (!addr || !out || dm_addr_split(addr, host, sizeof(host), port, sizeof(port)))
		return -EINVAL;
	if (timeout_ms <= 0)
		timeout_ms = TCP_CONNECT_DEFAULT_MS;
	deadline = dm_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	rc = getaddrinfo(host, port, &hints, &res);
	if (rc) {
		dm_warn("tcp: cannot resolve %s: %s", addr, gai_strerror(rc));
		return -EHOSTUNREACH;
	}
	rc = -ECONNREFUSED;
	for (ai = res; ai; ai = ai->ai_next) {
		struct pollfd pfd;
		int err = 0;
		socklen_t el = sizeof(err);

		fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			rc = -errno;
			continue;
		}
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		if (errno == EINPROGRESS) {
			pfd = (struct pollfd){ .fd = fd, .events = POLLOUT };
			int n = poll(&pfd, 1, ms_left(deadline));

			if (n == 0) {
				err = ETIMEDOUT;
			} else if (n < 0 ||
				   getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0) {
				err = errno;
			}
			if (!err)
				break;
		} else {
			err = errno;
		}
		rc = -err;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0) {
		dm_debug("tcp: connect to %s: %s", addr, strerror(-rc));
		return rc;
	}
	tcp_sockopts(fd);
	rc = dm_hs_run_fd(x, fd, DM_HS_CLIENT, addr, DM_MAX(ms_left(deadline), 1), NULL);
	if (rc)
		goto err_close_fd;
	rc = tcp_conn_attach(tx, fd, addr, NULL, out);
	if (rc)
		goto err_close_fd;
	return 0;

err_close_fd:
	close(fd);
	return rc;
}

static int tcp_listen(struct dm_xport *x, const char *addr, struct dm_listener **out)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *res, *ai;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[256], port[16];
	struct tcp_listener *l;
	int fd = -1, one = 1, rc;

	if (!addr || !out || dm_addr_split(addr, host, sizeof(host), port, sizeof(port)))
		return -EINVAL;
	rc = getaddrinfo(host[0] && strcmp(host, "*") ? host : NULL, port, &hints, &res);
	if (rc) {
		dm_warn("tcp: cannot resolve %s: %s", addr, gai_strerror(rc));
		return -EADDRNOTAVAIL;
	}
	rc = -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			rc = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0)
			break;
		rc = -errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0) {
		dm_warn("tcp: cannot listen on %s: %s", addr, strerror(-rc));
		return rc;
	}
	l = calloc(1, sizeof(*l));
	if (!l) {
		close(fd);
		return -ENOMEM;
	}
	l->base.x = x;
	l->fd = fd;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
		l->port = ntohs(ss.ss_family == AF_INET6 ?
				((struct sockaddr_in6 *)&ss)->sin6_port :
				((struct sockaddr_in *)&ss)->sin_port);
	*out = &l->base;
	return 0;
}

static int tcp_listener_port(struct dm_listener *dl)
{
	return container_of(dl, struct tcp_listener, base)->port;
}

static void tcp_listener_close(struct dm_listener *dl)
{
	struct tcp_listener *l = container_of(dl, struct tcp_listener, base);

	close(l->fd);
	free(l);
}

/* Accept one peer and run the server side of the handshake. A peer that fails it is
 * dropped and its error returned (the caller simply accepts again). */
static int tcp_accept(struct dm_listener *dl, int timeout_ms, struct dm_conn **out)
{
	struct tcp_listener *l = container_of(dl, struct tcp_listener, base);
	struct tcp_xport *tx = to_tx(dl->x);
	uint64_t deadline = timeout_ms >= 0 ? dm_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
	struct sockaddr_storage ss;
	char host[NI_MAXHOST], serv[NI_MAXSERV], peer[NI_MAXHOST + NI_MAXSERV + 2];
	char client[DM_HS_CLUSTER_LEN];
	int fd, rc;

	if (!out)
		return -EINVAL;
	for (;;) {
		struct pollfd pfd = { .fd = l->fd, .events = POLLIN };
		socklen_t sl = sizeof(ss);
		int n = poll(&pfd, 1, timeout_ms >= 0 ? ms_left(deadline) : -1);

		if (n < 0 && errno != EINTR)
			return -errno;
		if (n == 0)
			return -ETIMEDOUT;
		fd = accept4(l->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0)
			break;
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			return -errno;
	}
	if (getnameinfo((struct sockaddr *)&ss, sizeof(ss), host, sizeof(host), serv,
			sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV))
		snprintf(peer, sizeof(peer), "?");
	else
		snprintf(peer, sizeof(peer), "%s:%s", host, serv);
	tcp_sockopts(fd);
	rc = dm_hs_run_fd(&tx->base, fd, DM_HS_SERVER, peer, DM_HS_TIMEOUT_MS, client);
	if (rc)
		goto err_close_fd;
	rc = tcp_conn_attach(tx, fd, peer, client, out);
	if (rc)
		goto err_close_fd;
	return 0;

err_close_fd:
	close(fd);
	return rc;
}

static bool tcp_available(const char **why)
{
	(void)why;
	return true;
}

const struct dm_xport_backend dm_tcp_backend = {
	.name = "tcp",
	.open = tcp_open,
	.available = tcp_available,
};
