/* fwd_bench.c: forwarding rate of one memory node's forwarding thread, next to a plain-socket
 * relay measured the same way in the same process run.
 *
 *   fwd_bench --config C [--mn N] [--secs S] [--size B] [--window W]
 *
 * dmann: one connection announces itself to memory node N as the SERVE connection of a
 * made-up compute node 250, another as an ORIGIN of compute node 251; a sender thread keeps
 * W FWD_QUERY messages of B bytes (a Q_SEARCH inside, as the router sends them) in flight
 * towards CN 250, a receiver thread takes them off the SERVE connection; the memory node's
 * forwarding thread (one thread: one core) relays every message. Plain socket: the same
 * pattern through a minimal relay thread that reads length-prefixed frames from one TCP
 * socket and writes each to the other with one send(). Prints one JSON line. */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster.h"
#include "rpc.h"

#define FAKE_SERVE 250u
#define FAKE_ORIGIN 251u

static atomic_ulong sent, received, bounced;
static atomic_bool done;
static uint32_t msg_size, window;
static double secs = 3;

/* ---- dmann through the memory node ----------------------------------------------------- */

struct dside {
	struct dm_conn *c;
	struct dm_msgpool *pool;
	struct dm_mr *mr;
	uint8_t *buf;
};

static int hello(struct dm_xport *x, struct dm_msgpool *pool, const char *addr, uint32_t cn,
		 uint32_t role, struct dm_conn **out)
{
	struct dm_wire_fwd_hello h = { .cn = cn, .role = role };
	uint8_t b[sizeof(h)];
	struct dm_rpc_chan ch;
	int rc = dm_xport_connect(x, addr, 3000, out);

	if (rc)
		return rc;
	rc = dm_rpc_chan_init(&ch, *out, pool, 256, 3000);
	if (rc)
		return rc;
	dm_wire_fwd_hello_encode(b, &h);
	rc = dm_rpc_send(&ch, DM_OP_FWD_HELLO, 0, 0, b, sizeof(b));
	dm_rpc_chan_fini(&ch);
	return rc;
}

static void *d_sender(void *arg)
{
	struct dside *s = arg;
	uint64_t n = 0;

	while (!atomic_load(&done)) {
		struct dm_wc wc[64];
		int k = dm_conn_poll(s->c, wc, 64);

		if (k < 0)
			break;
		for (int i = 0; i < k; i++)
			if (wc[i].opcode == DM_WC_RECV) {
				/* FWD_BOUNCE: the SERVE connection was not adopted yet. */
				atomic_fetch_add(&bounced, 1);
				dm_msgpool_repost(s->pool, wc[i].wr_id);
			}
		if (n - atomic_load(&received) - atomic_load(&bounced) >= window) {
			if (!k)
				sched_yield();
			continue;
		}
		/* Inline-style send: the tcp backend copies at post time; unsignaled. */
		if (dm_conn_send(s->c, n, s->buf, msg_size, s->mr, (n % 64) == 63 ? DM_WR_SIGNALED : 0))
			break;
		n++;
		atomic_store(&sent, n);
	}
	return NULL;
}

static void *d_receiver(void *arg)
{
	struct dside *s = arg;

	while (!atomic_load(&done)) {
		struct dm_wc wc[64];
		int k = dm_conn_wait(s->c, wc, 64, 100);

		if (k < 0)
			break;
		for (int i = 0; i < k; i++)
			if (wc[i].opcode == DM_WC_RECV) {
				if (!wc[i].status)
					atomic_fetch_add(&received, 1);
				dm_msgpool_repost(s->pool, wc[i].wr_id);
			}
	}
	return NULL;
}

static double run_dmann(struct dm_cluster_cfg *cfg, uint32_t mn)
{
	struct dm_xport *x = dm_cluster_xport(cfg, NULL);
	struct dm_msgpool *pool;
	struct dside snd = { 0 }, rcv = { 0 };
	struct dm_wire_fwd f = { .target = FAKE_SERVE, .origin = FAKE_ORIGIN };
	struct dm_wire_q_search q = { .qid = 1, .k = 10, .ef = 10 };
	pthread_t t1, t2;
	uint64_t r0, t0;
	double rate;

	if (!x)
		return -1;
	pool = dm_msgpool_new(x, 1024, 16384);
	if (!pool)
		return -1;
	snd.pool = rcv.pool = pool;
	if (hello(x, pool, cfg->mn[mn].address, FAKE_SERVE, DM_FWD_ROLE_SERVE, &rcv.c) ||
	    hello(x, pool, cfg->mn[mn].address, FAKE_ORIGIN, DM_FWD_ROLE_ORIGIN, &snd.c)) {
		fprintf(stderr, "fwd_bench: cannot reach memory node %u\n", mn);
		return -1;
	}
	usleep(500000);   /* the forwarding thread adopts both connections */
	snd.buf = aligned_alloc(64, 16384);
	if (!snd.buf || dm_xport_reg(x, snd.buf, 16384, 0, &snd.mr))
		return -1;
	memset(snd.buf, 0, 16384);
	q.dim = (msg_size - DM_FWD_INNER_OFF - DM_WIRE_HDR_LEN - sizeof(q)) / 4;
	msg_size = DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN + (uint32_t)sizeof(q) + 4 * q.dim;
	dm_wire_hdr_encode(snd.buf, DM_OP_FWD_QUERY, msg_size, 0, 0);
	dm_wire_fwd_encode(snd.buf + DM_WIRE_HDR_LEN, &f);
	dm_wire_hdr_encode(snd.buf + DM_FWD_INNER_OFF, DM_OP_Q_SEARCH, msg_size - DM_FWD_INNER_OFF,
			   0, 1);
	dm_wire_q_search_encode(snd.buf + DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN, &q);
	atomic_store(&sent, 0);
	atomic_store(&received, 0);
	atomic_store(&bounced, 0);
	atomic_store(&done, false);
	pthread_create(&t2, NULL, d_receiver, &rcv);
	pthread_create(&t1, NULL, d_sender, &snd);
	usleep(500000);   /* warm-up */
	r0 = atomic_load(&received);
	t0 = dm_now_ns();
	usleep((useconds_t)(secs * 1e6));
	rate = (double)(atomic_load(&received) - r0) / ((double)(dm_now_ns() - t0) / 1e9);
	atomic_store(&done, true);
	pthread_join(t1, NULL);
	pthread_join(t2, NULL);
	dm_conn_close(snd.c);
	dm_conn_close(rcv.c);
	dm_xport_dereg(x, snd.mr);
	free(snd.buf);
	dm_msgpool_free(pool);
	dm_xport_close(x);
	return rate;
}

/* ---- plain-socket relay ---------------------------------------------------------------- */

static int lfd, relay_in, relay_out;

static bool read_full(int fd, void *b, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = recv(fd, (char *)b + got, n - got, 0);

		if (r <= 0)
			return false;
		got += (size_t)r;
	}
	return true;
}

static bool write_full(int fd, const void *b, size_t n)
{
	size_t put = 0;

	while (put < n) {
		ssize_t r = send(fd, (const char *)b + put, n - put, MSG_NOSIGNAL);

		if (r <= 0)
			return false;
		put += (size_t)r;
	}
	return true;
}

/* The relay: one thread, frames in from relay_in, each written to relay_out with one send. */
static void *p_relay(void *arg)
{
	uint8_t *buf = malloc(1 << 20);
	size_t have = 0, off = 0;

	(void)arg;
	while (buf && !atomic_load(&done)) {
		ssize_t r;

		if (off)
			memmove(buf, buf + off, have - off), have -= off, off = 0;
		r = recv(relay_in, buf + have, (1 << 20) - have, 0);
		if (r <= 0)
			break;
		have += (size_t)r;
		while (have - off >= 4) {
			uint32_t l;

			memcpy(&l, buf + off, 4);
			if (have - off < l)
				break;
			if (!write_full(relay_out, buf + off, l))
				goto out;
			off += l;
		}
	}
out:
	free(buf);
	return NULL;
}

static void *p_sender(void *arg)
{
	int fd = *(int *)arg;
	uint8_t *m = calloc(1, msg_size);
	uint64_t n = 0;

	memcpy(m, &msg_size, 4);
	while (m && !atomic_load(&done)) {
		if (n - atomic_load(&received) >= window) {
			sched_yield();
			continue;
		}
		if (!write_full(fd, m, msg_size))
			break;
		atomic_store(&sent, ++n);
	}
	free(m);
	return NULL;
}

static void *p_receiver(void *arg)
{
	int fd = *(int *)arg;
	uint8_t *m = malloc(msg_size);

	while (m && !atomic_load(&done) && read_full(fd, m, msg_size))
		atomic_fetch_add(&received, 1);
	free(m);
	return NULL;
}

static int tcp_connect(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)))
		return -1;
	return fd;
}

static double run_plain(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	int sfd, rfd, one = 1;
	pthread_t t0, t1, t2;
	uint64_t r0, ts;
	double rate;

	lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) || listen(lfd, 4) ||
	    getsockname(lfd, (struct sockaddr *)&a, &al))
		return -1;
	sfd = tcp_connect(ntohs(a.sin_port));
	relay_in = accept(lfd, NULL, NULL);
	rfd = tcp_connect(ntohs(a.sin_port));
	relay_out = accept(lfd, NULL, NULL);
	if (sfd < 0 || rfd < 0 || relay_in < 0 || relay_out < 0)
		return -1;
	setsockopt(relay_out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	atomic_store(&sent, 0);
	atomic_store(&received, 0);
	atomic_store(&done, false);
	pthread_create(&t0, NULL, p_relay, NULL);
	pthread_create(&t2, NULL, p_receiver, &rfd);
	pthread_create(&t1, NULL, p_sender, &sfd);
	usleep(500000);
	r0 = atomic_load(&received);
	ts = dm_now_ns();
	usleep((useconds_t)(secs * 1e6));
	rate = (double)(atomic_load(&received) - r0) / ((double)(dm_now_ns() - ts) / 1e9);
	atomic_store(&done, true);
	shutdown(sfd, SHUT_RDWR);
	shutdown(rfd, SHUT_RDWR);
	shutdown(relay_in, SHUT_RDWR);
	shutdown(relay_out, SHUT_RDWR);
	pthread_join(t1, NULL);
	pthread_join(t2, NULL);
	pthread_join(t0, NULL);
	close(sfd);
	close(rfd);
	close(relay_in);
	close(relay_out);
	close(lfd);
	return rate;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, 0, 'c' }, { "mn", required_argument, 0, 'm' },
		{ "secs", required_argument, 0, 's' },   { "size", required_argument, 0, 'b' },
		{ "window", required_argument, 0, 'w' }, { "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	struct dm_cluster_cfg *cfg = calloc(1, sizeof(*cfg));
	const char *config = NULL;
	char err[512];
	uint32_t mn = 0;
	double d, p;
	int c;

	msg_size = 3232;
	window = 64;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 'm': mn = (uint32_t)atoi(optarg); break;
		case 's': secs = atof(optarg); break;
		case 'b': msg_size = (uint32_t)atoi(optarg); break;
		case 'w': window = (uint32_t)atoi(optarg); break;
		case 'h':
			printf("usage: fwd_bench --config C [--mn N] [--secs S] [--size 96..16000] "
			       "[--window 1..512]\n\nForwarding rate of one memory node's forwarding "
			       "thread next to a plain-socket relay (bench/router/run.sh).\n");
			free(cfg);
			return 0;
		default: return 2;
		}
	}
	if (!cfg || !config || secs <= 0 || secs > 600 || window < 1 || window > 512 ||
	    msg_size < DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN + sizeof(struct dm_wire_q_search) ||
	    msg_size > 16000) {
		fprintf(stderr, "usage: fwd_bench --config C [--mn N] [--secs S] [--size 96..16000] "
			"[--window 1..512]\n");
		return 2;
	}
	dm_log_set_level(DM_LOG_WARN);
	if (dm_config_load(config, cfg, err, sizeof(err)) || mn >= cfg->n_mn) {
		fprintf(stderr, "fwd_bench: %s\n", err[0] ? err : "no such memory node");
		return 1;
	}
	d = run_dmann(cfg, mn);
	p = run_plain();
	printf("{\"size\": %u, \"window\": %u, \"dmann_msgs_per_s\": %.0f, \"plain_msgs_per_s\": "
	       "%.0f, \"ratio\": %.3f, \"bounced\": %lu}\n", msg_size, window, d, p,
	       p > 0 ? d / p : 0, atomic_load(&bounced));
	free(cfg);
	return d > 0 && p > 0 ? 0 : 1;
}
