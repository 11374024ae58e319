/* cn_s3_hclient.c: the internal HTTP client of the ingress: one member sub-request
 * (POST /_dmann/ScanShare or CacheClear to another CN's gateway, SigV4-signed with the
 * cluster-internal key) driven on a non-blocking socket by the caller's poll loop, on a
 * kept-alive connection from a per-CN pool ([s3] member_conns idle ones at most; 0: one
 * connection per sub-request, "Connection: close"). A pooled connection the member closed
 * meanwhile is noticed before use (peek) or, when the close races the request, by an end
 * before any answer byte: the request is then sent once more on a new connection, so a
 * member is never taken for down because of an idle connection it dropped. */
#include "cn_s3_int.h"
#include "s3_hresp.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A new non-blocking connection to CN cn's gateway (connect in progress); -1 on failure. */
static int hconnect(struct cn_s3 *s, uint32_t cn)
{
	const char *hp = s->cfg->cn[cn].http;
	char host[DM_ADDR_MAX], *colon;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	int fd, one = 1;

	snprintf(host, sizeof(host), "%s", hp);
	colon = strrchr(host, ':');
	if (!colon)
		return -1;
	*colon = 0;
	if (colon > host && colon[-1] == ']')
		colon[-1] = 0;                  /* [v6]:port */
	if (getaddrinfo(host[0] == '[' ? host + 1 : host, colon + 1, &hints, &ai) || !ai)
		return -1;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || (connect(fd, ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS)) {
		if (fd >= 0)
			close(fd);
		freeaddrinfo(ai);
		return -1;
	}
	freeaddrinfo(ai);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	__atomic_add_fetch(&s->subreq_conns, 1, __ATOMIC_RELAXED);
	return fd;
}

/* An idle pooled connection to cn that the member has not closed; -1 if none. */
static int hpool_take(struct cn_s3 *s, uint32_t cn)
{
	for (;;) {
		int fd = -1;
		char c;

		pthread_mutex_lock(&s->hpool_mu);
		if (s->hpool[cn].n)
			fd = s->hpool[cn].fd[--s->hpool[cn].n];
		pthread_mutex_unlock(&s->hpool_mu);
		if (fd < 0)
			return -1;
		/* Idle means nothing to read: EOF, an error or stray bytes retire it. */
		if (recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) < 0 &&
		    (errno == EAGAIN || errno == EWOULDBLOCK))
			return fd;
		close(fd);
	}
}

static void hpool_put(struct cn_s3 *s, uint32_t cn, int fd)
{
	pthread_mutex_lock(&s->hpool_mu);
	if (s->hpool[cn].n < s->member_conns) {
		s->hpool[cn].fd[s->hpool[cn].n++] = fd;
		fd = -1;
	}
	pthread_mutex_unlock(&s->hpool_mu);
	if (fd >= 0)
		close(fd);
}

void hpool_fini(struct cn_s3 *s)
{
	for (uint32_t c = 0; c < DM_MAX_NODES; c++)
		while (s->hpool[c].n)
			close(s->hpool[c].fd[--s->hpool[c].n]);
}

/* Start a signed POST /_dmann/<op> to CN cn (non-blocking). false on failure. */
bool hcall_start(struct cn_s3 *s, struct hcall *h, uint32_t cn, const char *op, const char *body)
{
	const char *hp = s->cfg->cn[cn].http;
	char date[32], sha[65], auth[512], path[64];
	size_t blen = strlen(body);
	time_t now = time(NULL);
	struct tm tm;
	int fd;

	memset(h, 0, sizeof(*h));
	h->fd = -1;
	h->s = s;
	snprintf(path, sizeof(path), "/_dmann/%s", op);
	h->cn = cn;
	gmtime_r(&now, &tm);
	strftime(date, sizeof(date), "%Y%m%dT%H%M%SZ", &tm);
	s3_sha256_hex(body, blen, sha);
	struct s3_sigv4_client_hdrs sh = { .host = hp, .date = date, .sha = sha,
					   .ctype = "application/json" };
	struct s3_sigv4_req sr = { .method = "POST", .path = path, .query = "",
				   .header = s3_sigv4_client_header, .hctx = &sh, .body = body,
				   .body_len = blen };

	if (s3_sigv4_authorization(&sr, s->icred.access_key, s->icred.secret_key, date,
				   "us-east-1", "s3vectors",
				   "content-type;host;x-amz-content-sha256;x-amz-date", sha, auth,
				   sizeof(auth)))
		return false;
	dm_buf_printf(&h->out,
		      "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
		      "Content-Length: %zu\r\nx-amz-date: %s\r\nx-amz-content-sha256: %s\r\n"
		      "Authorization: %s\r\nConnection: %s\r\n\r\n",
		      path, hp, blen, date, sha, auth, s->member_conns ? "keep-alive" : "close");
	dm_buf_put(&h->out, body, blen);
	if (h->out.oom) {
		dm_buf_free(&h->out);
		return false;
	}
	fd = s->member_conns ? hpool_take(s, cn) : -1;
	if (fd >= 0) {
		h->reused = true;
		__atomic_add_fetch(&s->subreq_reused, 1, __ATOMIC_RELAXED);
	} else {
		fd = hconnect(s, cn);
	}
	if (fd < 0) {
		dm_buf_free(&h->out);
		return false;
	}
	h->fd = fd;
	return true;
}

/* A kept-alive connection ended before any byte of the answer (the member closed it while
 * it sat idle): send the request again on a new connection. false when that fails too. */
static bool hcall_redo(struct hcall *h)
{
	if (!h->reused || h->in.n || h->done)
		return false;
	close(h->fd);
	h->reused = false;
	h->sent = 0;
	h->fd = hconnect(h->s, h->cn);
	return h->fd >= 0;
}

/* The answer is in (rc 1 of s3_hresp_parse) or broken (rc < 0). */
static void hcall_done(struct hcall *h, int rc, const struct s3_hresp *r)
{
	h->done = true;
	if (rc < 0) {
		h->failed = true;
		h->keep = false;
		return;
	}
	h->status = r->status;
	h->body = r->body;
	h->blen = r->blen;
	h->keep = r->keep;       /* with member_conns 0 the member closes (Connection: close) */
	if (h->status != 200) {
		h->failed = true;
		h->keep = false;
	}
}

/* Progress on poll events. */
void hcall_io(struct hcall *h, short ev)
{
	struct s3_hresp r;
	int rc;

	if (h->done)
		return;
	if (ev & (POLLERR | POLLNVAL)) {
		if (!hcall_redo(h))
			h->done = h->failed = true;
		return;
	}
	while ((ev & POLLOUT) && h->sent < h->out.n) {
		ssize_t n = send(h->fd, h->out.p + h->sent, h->out.n - h->sent, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && !hcall_redo(h))
				h->done = h->failed = true;
			return;
		}
		h->sent += (size_t)n;
	}
	if (!(ev & (POLLIN | POLLHUP)))
		return;
	for (;;) {
		if (!dm_buf_reserve(&h->in, 65536 + 1)) {
			h->done = h->failed = true;
			return;
		}
		ssize_t n = recv(h->fd, h->in.p + h->in.n, h->in.cap - h->in.n - 1, 0);

		if (n > 0) {
			h->in.n += (size_t)n;
			h->in.p[h->in.n] = 0;
			rc = s3_hresp_parse((const char *)h->in.p, h->in.n, false, &r);
			if (!rc)
				continue;
			hcall_done(h, rc, &r);
			return;
		}
		if (n == 0) {
			if (!hcall_redo(h))
				hcall_done(h, s3_hresp_parse((const char *)h->in.p, h->in.n, true, &r),
					   &r);
		} else if (errno != EAGAIN && errno != EWOULDBLOCK) {
			if (!hcall_redo(h))
				h->done = h->failed = true;
		}
		return;
	}
}

void hcall_fini(struct hcall *h)
{
	if (h->fd >= 0) {
		if (h->done && !h->failed && h->keep)
			hpool_put(h->s, h->cn, h->fd);
		else
			close(h->fd);
	}
	dm_buf_free(&h->out);
	dm_buf_free(&h->in);
	h->fd = -1;
}
