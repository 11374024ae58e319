/* cn_s3_hclient.c: the internal HTTP client of the ingress: one member sub-request
 * (POST /_dmann/ScanShare to another CN's gateway, SigV4-signed with the cluster-internal
 * key, Connection: close) driven on a non-blocking socket by the ingress's poll loop. */
#include "cn_s3_int.h"

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

/* Start a signed POST /_dmann/ScanShare to CN cn (non-blocking). false on failure. */
bool hcall_start(struct cn_s3 *s, struct hcall *h, uint32_t cn, const char *op, const char *body)
{
	const char *hp = s->cfg->cn[cn].http;
	char host[DM_ADDR_MAX], *colon, date[32], sha[65], auth[512], path[64];
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	size_t blen = strlen(body);
	time_t now = time(NULL);
	struct tm tm;
	int fd;

	memset(h, 0, sizeof(*h));
	h->fd = -1;
	snprintf(path, sizeof(path), "/_dmann/%s", op);
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
	struct s3_sigv4_client_hdrs sh = { .host = hp, .date = date, .sha = sha,
					   .ctype = "application/json" };
	struct s3_sigv4_req sr = { .method = "POST", .path = path, .query = "",
				   .header = s3_sigv4_client_header, .hctx = &sh, .body = body,
				   .body_len = blen };

	if (s3_sigv4_authorization(&sr, s->icred.access_key, s->icred.secret_key, date,
				   "us-east-1", "s3vectors",
				   "content-type;host;x-amz-content-sha256;x-amz-date", sha, auth,
				   sizeof(auth))) {
		close(fd);
		return false;
	}
	dm_buf_printf(&h->out,
		      "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
		      "Content-Length: %zu\r\nx-amz-date: %s\r\nx-amz-content-sha256: %s\r\n"
		      "Authorization: %s\r\nConnection: close\r\n\r\n",
		      path, hp, blen, date, sha, auth);
	dm_buf_put(&h->out, body, blen);
	if (h->out.oom) {
		dm_buf_free(&h->out);
		close(fd);
		return false;
	}
	h->fd = fd;
	return true;
}

/* Parse a complete response (EOF seen). */
void hcall_finish(struct hcall *h)
{
	const char *sep;

	const char *in = (const char *)h->in.p;

	h->done = true;
	if (!in || h->in.n < 12 || strncmp(in, "HTTP/1.", 7)) {
		h->failed = true;
		return;
	}
	h->status = atoi(in + 9);
	sep = memmem(in, h->in.n, "\r\n\r\n", 4);
	if (!sep) {
		h->failed = true;
		return;
	}
	h->body = sep + 4;
	h->blen = h->in.n - (size_t)(h->body - in);
	if (h->status != 200)
		h->failed = true;
}

/* Progress on poll events. */
void hcall_io(struct hcall *h, short ev)
{
	if (h->done)
		return;
	if (ev & (POLLERR | POLLNVAL)) {
		h->done = h->failed = true;
		return;
	}
	while ((ev & POLLOUT) && h->sent < h->out.n) {
		ssize_t n = send(h->fd, h->out.p + h->sent, h->out.n - h->sent, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				h->done = h->failed = true;
			break;
		}
		h->sent += (size_t)n;
	}
	if (ev & (POLLIN | POLLHUP)) {
		for (;;) {
			if (!dm_buf_reserve(&h->in, 65536 + 1)) {
				h->done = h->failed = true;
				return;
			}
			ssize_t n = recv(h->fd, h->in.p + h->in.n, h->in.cap - h->in.n - 1, 0);

			if (n > 0) {
				h->in.n += (size_t)n;
				h->in.p[h->in.n] = 0;
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

void hcall_fini(struct hcall *h)
{
	if (h->fd >= 0)
		close(h->fd);
	dm_buf_free(&h->out);
	dm_buf_free(&h->in);
	h->fd = -1;
}
