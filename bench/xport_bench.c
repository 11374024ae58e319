/* xport_bench.c: transport micro-benchmark. For each backend that can run here it measures
 *   - batched one-sided READs of 4 KiB (batches of 1, 16, 64; one batch in flight): batch
 *     latency (median, p99) and throughput;
 *   - small two-sided SEND/RECV message rate (32-byte messages, window of 256);
 * and, in the same run, the same exchanges over a plain TCP socket with a minimal server
 * (send/recv/writev, TCP_NODELAY, no framework): the reference a transport over sockets
 * cannot beat. Servers run in separate processes (this binary re-executed with --serve-*).
 *
 * The two sides of each comparison alternate in short rounds (median reported).
 * Usage: xport_bench [--secs S] [--host H] [--backend NAME]   (prints a Markdown table)
 */
#include "xport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define CLUSTER   "bench"
#define SECRET    "bench-secret"
#define REGION    (16u << 20)
#define RLEN      4096u
#define MSG_LEN   32u
#define WINDOW    256
#define NRECV     1024
#define RECV_SLOT 256u

static double secs = 1.5;
static const char *host = "127.0.0.1";

/* ---- small helpers ---- */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

struct lat {
	uint64_t *v;
	size_t n, cap;
};

static void lat_add(struct lat *l, uint64_t ns)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 4096;
		l->v = realloc(l->v, l->cap * sizeof(*l->v));
		if (!l->v) {
			perror("realloc");
			exit(1);
		}
	}
	l->v[l->n++] = ns;
}

static double lat_pct(struct lat *l, double p)
{
	if (!l->n)
		return 0;
	qsort(l->v, l->n, sizeof(*l->v), cmp_u64);
	return (double)l->v[(size_t)(p * (double)(l->n - 1))] / 1000.0;
}

static void die(const char *what, int err)
{
	fprintf(stderr, "xport_bench: %s: %s\n", what, strerror(err));
	exit(1);
}

/* Start this binary as a server; returns its pid, reads "port addr rkey" from it. */
static pid_t spawn_server(const char *mode, const char *backend, int *port,
			  unsigned long *addr, unsigned *rkey)
{
	int pfd[2];
	pid_t pid;
	FILE *f;

	if (pipe(pfd))
		die("pipe", errno);
	pid = fork();
	if (pid < 0)
		die("fork", errno);
	if (pid == 0) {
		setpgid(0, 0);
		dup2(pfd[1], 1);
		close(pfd[0]);
		close(pfd[1]);
		execl("/proc/self/exe", "xport_bench", mode, backend, host, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	f = fdopen(pfd[0], "r");
	if (!f || fscanf(f, "%d %lu %u", port, addr, rkey) != 3)
		die("server did not start", EIO);
	fclose(f);
	return pid;
}

static void reap(pid_t pid)
{
	kill(-pid, SIGTERM);   /* the server and its connection processes */
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
}

/* ---- plain socket reference ---- */

static int plain_listen(int *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	if (fd < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		die("plain socket", errno ? errno : EINVAL);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 4) ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl))
		die("plain listen", errno);
	*port = ntohs(sa.sin_port);
	return fd;
}

static int plain_connect(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	if (fd < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
	    connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		die("plain connect", errno);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static void read_full(int fd, void *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = recv(fd, (char *)buf + got, len - got, 0);

		if (n <= 0)
			die("plain recv", n ? errno : ECONNRESET);
		got += (size_t)n;
	}
}

static void write_full(int fd, const void *buf, size_t len)
{
	size_t put = 0;

	while (put < len) {
		ssize_t n = send(fd, (const char *)buf + put, len - put, MSG_NOSIGNAL);

		if (n <= 0)
			die("plain send", errno);
		put += (size_t)n;
	}
}

/* Plain server: first byte of a connection picks the mode.
 *   'R': 16-byte requests {u64 off, u32 len, u32 pad}; each answered with len bytes of the
 *        region, all requests of one recv() answered with one writev (the server's batch);
 *   'S': messages {u32 len, payload}; after each recv() the cumulative count (u64) is sent. */
static void plain_serve(void)
{
	static uint8_t in[1 << 16];
	uint8_t *region = malloc(REGION);
	int port, lfd = plain_listen(&port), fd, one = 1;
	char mode;

	memset(region, 0x5a, REGION);
	signal(SIGCHLD, SIG_IGN);   /* connection processes reap themselves */
	printf("%d 0 0\n", port);
	fflush(stdout);
	for (;;) {
		size_t have = 0;
		uint64_t count = 0;

		fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			die("plain accept", errno);
		/* One process per connection, like a forking echo server. */
		if (fork() != 0) {
			close(fd);
			continue;
		}
		close(lfd);
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (recv(fd, &mode, 1, MSG_WAITALL) != 1) {
			close(fd);
			continue;
		}
		for (;;) {
			ssize_t n = recv(fd, in + have, sizeof(in) - have, 0);
			size_t off = 0;

			if (n <= 0)
				break;
			have += (size_t)n;
			if (mode == 'R') {
				struct iovec iov[1024];
				int k = 0;

				for (; have - off >= 16 && k < 1024; off += 16) {
					uint64_t o;
					uint32_t l;

					memcpy(&o, in + off, 8);
					memcpy(&l, in + off + 8, 4);
					if (o > REGION || l > REGION - o)
						break;
					iov[k++] = (struct iovec){ region + o, l };
				}
				for (int i = 0; i < k;) {
					ssize_t w = writev(fd, iov + i, k - i);

					if (w <= 0)
						break;
					for (; i < k && (size_t)w >= iov[i].iov_len; i++)
						w -= (ssize_t)iov[i].iov_len;
					if (i < k) {
						iov[i].iov_base = (char *)iov[i].iov_base + w;
						iov[i].iov_len -= (size_t)w;
					}
				}
			} else {
				for (;;) {
					uint32_t l;

					if (have - off < 4)
						break;
					memcpy(&l, in + off, 4);
					if (l > sizeof(in) - 4 || have - off < 4 + l)
						break;
					off += 4 + l;
					count++;
				}
				write_full(fd, &count, sizeof(count));
			}
			memmove(in, in + off, have - off);
			have -= off;
		}
		_exit(0);
	}
}

static struct dm_xport *open_backend(const char *backend)
{
	struct dm_xport_params p = {
		.backend = backend, .cluster = CLUSTER, .secret = (const uint8_t *)SECRET,
		.secret_len = strlen(SECRET), .max_recv_wr = NRECV,
	};
	struct dm_xport *x = dm_xport_open(&p);

	if (!x)
		die(backend, errno);
	return x;
}

/* dmann server: a registered region for READs, receive buffers reposted as they fill. */
static void xport_serve(const char *backend)
{
	struct dm_xport *x = open_backend(backend);
	uint8_t *region = aligned_alloc(4096, REGION), *bufs = aligned_alloc(4096, NRECV * RECV_SLOT);
	struct dm_mr *mr, *bmr;
	struct dm_listener *l;
	char addr[128];
	int rc;

	if (!region || !bufs)
		die("alloc", ENOMEM);
	memset(region, 0x5a, REGION);
	snprintf(addr, sizeof(addr), "%s:0", host);
	if ((rc = dm_xport_reg(x, region, REGION, DM_MR_REMOTE_ALL, &mr)) ||
	    (rc = dm_xport_reg(x, bufs, NRECV * RECV_SLOT, 0, &bmr)) ||
	    (rc = dm_xport_listen(x, addr, &l)))
		die("server setup", -rc);
	for (int i = 0; i < NRECV; i++)
		if ((rc = dm_xport_post_recv(x, bufs + (size_t)i * RECV_SLOT, RECV_SLOT, bmr,
					     (uint64_t)i)))
			die("post_recv", -rc);
	printf("%d %lu %u\n", dm_listener_port(l), (unsigned long)(uintptr_t)region, mr->rkey);
	fflush(stdout);
	for (;;) {
		struct dm_conn *c;
		struct dm_wc wc[64];

		if (dm_listener_accept(l, -1, &c))
			continue;
		while ((rc = dm_conn_wait(c, wc, 64, 1000)) >= 0)
			for (int i = 0; i < rc; i++)
				if (wc[i].opcode == DM_WC_RECV && wc[i].status == 0)
					dm_xport_post_recv(x, bufs + wc[i].wr_id * RECV_SLOT,
							   RECV_SLOT, bmr, wc[i].wr_id);
		dm_conn_close(c);
	}
}

struct xclient {
	struct dm_xport *x;
	struct dm_conn *c;
	uint8_t *local;
	struct dm_mr *mr;
	uint64_t remote;
	uint32_t rkey;
};

static void xclient_open(struct xclient *xc, const char *backend, int port, unsigned long addr,
			 unsigned rkey)
{
	char a[128];
	int rc = -ENOMEM;

	xc->x = open_backend(backend);
	xc->local = aligned_alloc(4096, 64 * RLEN);
	snprintf(a, sizeof(a), "%s:%d", host, port);
	if (!xc->local || (rc = dm_xport_reg(xc->x, xc->local, 64 * RLEN, 0, &xc->mr)) ||
	    (rc = dm_xport_connect(xc->x, a, 5000, &xc->c)))
		die("client setup", -rc);
	xc->remote = addr;
	xc->rkey = rkey;
}

static void xclient_close(struct xclient *xc)
{
	dm_conn_close(xc->c);
	dm_xport_dereg(xc->x, xc->mr);
	dm_xport_close(xc->x);
	free(xc->local);
}


/* ---- measurements: each runs for dur seconds, adds batch latencies to lat, returns the
 * rate (READs/s or messages/s) ---- */

static double plain_reads(int fd, int batch, double dur, struct lat *lat)
{
	static uint8_t dst[64 * RLEN];
	uint8_t req[64 * 16];
	static unsigned seed = 1;
	uint64_t t0 = dm_now_ns(), end = t0 + (uint64_t)(dur * 1e9), n = 0;

	while (dm_now_ns() < end) {
		uint64_t t = dm_now_ns();

		for (int i = 0; i < batch; i++) {
			uint64_t off = (uint64_t)(rand_r(&seed) % (REGION / RLEN)) * RLEN;
			uint32_t l = RLEN, pad = 0;

			memcpy(req + i * 16, &off, 8);
			memcpy(req + i * 16 + 8, &l, 4);
			memcpy(req + i * 16 + 12, &pad, 4);
		}
		write_full(fd, req, (size_t)batch * 16);
		read_full(fd, dst, (size_t)batch * RLEN);
		lat_add(lat, dm_now_ns() - t);
		n += (uint64_t)batch;
	}
	return (double)n / ((double)(dm_now_ns() - t0) / 1e9);
}

static double plain_sends(int fd, double dur)
{
	uint8_t msg[4 + MSG_LEN] = { 0 };
	static uint64_t base;   /* the server's count is cumulative over rounds */
	uint64_t t0 = dm_now_ns(), end = t0 + (uint64_t)(dur * 1e9), sent = 0, acked = base;
	uint32_t l = MSG_LEN;

	memcpy(msg, &l, 4);
	while (dm_now_ns() < end || acked < base + sent) {
		if (dm_now_ns() < end) {
			write_full(fd, msg, sizeof(msg));
			sent++;
		}
		while (base + sent - acked >= WINDOW || (dm_now_ns() >= end && acked < base + sent)) {
			uint64_t c[64];
			ssize_t n = recv(fd, c, sizeof(c), 0);

			if (n < 8)
				die("plain ack", n < 0 ? errno : EPROTO);
			memcpy(&acked, (uint8_t *)c + ((size_t)n / 8 - 1) * 8, 8);
		}
	}
	base += sent;
	return (double)sent / ((double)(dm_now_ns() - t0) / 1e9);
}

static double xport_reads(struct xclient *xc, int batch, double dur, struct lat *lat)
{
	struct dm_rdma_wr wr[64];
	static unsigned seed = 1;
	uint64_t t0 = dm_now_ns(), end = t0 + (uint64_t)(dur * 1e9), n = 0;
	struct dm_wc wc;

	while (dm_now_ns() < end) {
		uint64_t t = dm_now_ns();
		int rc;

		for (int i = 0; i < batch; i++)
			wr[i] = (struct dm_rdma_wr){
				.wr_id = (uint64_t)i, .local = xc->local + (size_t)i * RLEN,
				.mr = xc->mr, .rkey = xc->rkey, .len = RLEN,
				.remote = xc->remote +
					  (uint64_t)(rand_r(&seed) % (REGION / RLEN)) * RLEN,
				/* Responses complete in order: signal the last one only. */
				.flags = i == batch - 1 ? DM_WR_SIGNALED : 0,
			};
		if ((rc = dm_conn_read_batch(xc->c, wr, batch)))
			die("read_batch", -rc);
		if ((rc = dm_conn_wait(xc->c, &wc, 1, 5000)) != 1 || wc.status)
			die("read completion", rc < 0 ? -rc : rc == 0 ? ETIMEDOUT : -wc.status);
		lat_add(lat, dm_now_ns() - t);
		n += (uint64_t)batch;
	}
	return (double)n / ((double)(dm_now_ns() - t0) / 1e9);
}

static double xport_sends(struct xclient *xc, double dur)
{
	uint8_t msg[MSG_LEN] = { 0 };
	uint64_t t0 = dm_now_ns(), end = t0 + (uint64_t)(dur * 1e9), sent = 0, signaled = 0;
	uint64_t done = 0;
	struct dm_wc wc[64];
	int rc;

	while (dm_now_ns() < end) {
		uint32_t fl = DM_WR_INLINE | (sent % 64 == 63 ? DM_WR_SIGNALED : 0);

		rc = dm_conn_send(xc->c, sent, msg, MSG_LEN, NULL, fl);
		if (rc == -EAGAIN) {
			rc = dm_conn_wait(xc->c, wc, 64, 1000);
			if (rc < 0)
				die("send wait", -rc);
			done += (uint64_t)rc;
			continue;
		}
		if (rc)
			die("send", -rc);
		sent++;
		signaled += (fl & DM_WR_SIGNALED) != 0;
	}
	/* Make the last message signaled so that the round ends with everything acked. */
	while ((rc = dm_conn_send(xc->c, sent, msg, MSG_LEN, NULL,
				  DM_WR_INLINE | DM_WR_SIGNALED)) == -EAGAIN) {
		rc = dm_conn_wait(xc->c, wc, 64, 1000);
		if (rc < 0)
			die("send wait", -rc);
		done += (uint64_t)rc;
	}
	if (rc)
		die("send", -rc);
	sent++;
	signaled++;
	while (done < signaled) {
		rc = dm_conn_wait(xc->c, wc, 64, 5000);
		if (rc <= 0)
			die("send drain", rc ? -rc : ETIMEDOUT);
		done += (uint64_t)rc;
	}
	return (double)sent / ((double)(dm_now_ns() - t0) / 1e9);
}

/* ---- driver: the two sides of a comparison alternate in rounds, so that load from other
 * processes on the machine hits both alike; the median round is reported ---- */

#define ROUNDS 9

static double median(double *v, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double t = v[j];

			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return v[n / 2];
}

int main(int argc, char **argv)
{
	static const int batches[] = { 1, 16, 64 };
	const char *const *names;
	const char *only = NULL;
	unsigned long dummy_addr;
	unsigned dummy_key;
	int pport, rfd, sfd;
	pid_t ppid;

	if (argc == 4 && !strcmp(argv[1], "--serve-xport")) {
		host = argv[3];
		xport_serve(argv[2]);
		return 0;
	}
	if (argc == 4 && !strcmp(argv[1], "--serve-plain")) {
		host = argv[3];
		plain_serve();
		return 0;
	}
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: %s [--secs S] [--host IPv4] [--backend NAME]\n\n"
			       "Transport micro-benchmark: batched 4 KiB READs and small SEND/RECV on\n"
			       "every available backend, each next to a plain-socket reference measured\n"
			       "in the same run (bench/xport.sh writes docs/benchmarks.md).\n", argv[0]);
			return 0;
		}
		if (!strcmp(argv[i], "--secs") && i + 1 < argc)
			secs = atof(argv[++i]);
		else if (!strcmp(argv[i], "--host") && i + 1 < argc)
			host = argv[++i];
		else if (!strcmp(argv[i], "--backend") && i + 1 < argc)
			only = argv[++i];
		else {
			fprintf(stderr, "usage: %s [--secs S] [--host IPv4] [--backend NAME]\n",
				argv[0]);
			return 2;
		}
	}
	if (secs <= 0)
		secs = 1.5;
	signal(SIGPIPE, SIG_IGN);

	ppid = spawn_server("--serve-plain", "-", &pport, &dummy_addr, &dummy_key);
	rfd = plain_connect(pport);
	write_full(rfd, "R", 1);
	sfd = plain_connect(pport);
	write_full(sfd, "S", 1);

	printf("| Operation | Backend | dmann: median / p99 latency, throughput | plain socket: same | ratio |\n");
	printf("|---|---|---|---|---|\n");
	names = dm_xport_backends();
	for (size_t i = 0; names[i]; i++) {
		struct xclient xc = { 0 };
		const char *why = NULL;
		double dur = secs / ROUNDS, xr[ROUNDS], pr[ROUNDS];
		unsigned long addr;
		unsigned rkey;
		int port;
		pid_t pid;

		if (only && strcmp(only, names[i]))
			continue;
		if (!dm_xport_available(names[i], &why)) {
			printf("| (skipped) | %s | %s | | |\n", names[i], why ? why : "not available");
			continue;
		}
		pid = spawn_server("--serve-xport", names[i], &port, &addr, &rkey);
		xclient_open(&xc, names[i], port, addr, rkey);
		for (size_t b = 0; b < DM_ARRAY_SIZE(batches); b++) {
			struct lat xl = { 0 }, pl = { 0 };
			double x, p;

			for (int r = 0; r < ROUNDS; r++) {
				pr[r] = plain_reads(rfd, batches[b], dur, &pl);
				xr[r] = xport_reads(&xc, batches[b], dur, &xl);
			}
			x = median(xr, ROUNDS) * RLEN / 1e9;
			p = median(pr, ROUNDS) * RLEN / 1e9;
			printf("| READ 4 KiB, batch %d | %s | %.1f / %.1f us, %.2f GB/s | %.1f / %.1f us, %.2f GB/s | %.2f |\n",
			       batches[b], names[i], lat_pct(&xl, 0.5), lat_pct(&xl, 0.99), x,
			       lat_pct(&pl, 0.5), lat_pct(&pl, 0.99), p, x / p);
			free(xl.v);
			free(pl.v);
		}
		for (int r = 0; r < ROUNDS; r++) {
			pr[r] = plain_sends(sfd, dur);
			xr[r] = xport_sends(&xc, dur);
		}
		double x = median(xr, ROUNDS), p = median(pr, ROUNDS);

		printf("| SEND %u B, window %d | %s | %.0f msg/s | %.0f msg/s | %.2f |\n", MSG_LEN,
		       WINDOW, names[i], x, p, x / p);
		xclient_close(&xc);
		reap(pid);
	}
	close(rfd);
	close(sfd);
	reap(ppid);
	return 0;
}
