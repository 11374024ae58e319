/* test_twoproc.c: the verbs backend between two processes, as dmann uses it: a server
 * process (the memory node's role) exports hugepage-backed registered memory, a client
 * process reads, writes and updates it with one-sided operations and talks to the server
 * with SEND/RECV, all through the dmann transport API. Runs inside the soft-RoCE VM
 * (deploy/rxe-vm); on a machine without an RDMA device it is skipped.
 *
 * What it checks: doorbell-batched READ chains with selective signaling (only the last WR
 * signaled, every byte verified), a full-depth READ batch, a WRITE batch (inline and not)
 * verified both by reading back and by the server looking at its own memory, CAS (failing
 * and succeeding) and 1000 back-to-back FAAs (more than the send queue holds, unsignaled
 * but the last), SEND/RECV echo of 1..3000-byte messages, the handshake refusing a wrong
 * secret, and a READ with a bad rkey completing with -EACCES and putting the connection in
 * error state (-ENOTCONN for later posts).
 */
#include <criterion/criterion.h>

#include "xport.h"
#include "mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CLUSTER  "rxe-twoproc"
#define SECRET   "two processes, one secret"
#define REGION   (8u << 20)
#define NRBUF    16
#define RBUF     4096
#define WAIT_MS  10000
#define MAGIC    0x70326f7774657872ull

enum { M_INFO = 1, M_ECHO, M_VERIFY, M_OK, M_BAD, M_BYE };

struct info {            /* server -> client, first message */
	uint64_t magic, addr, len;
	uint32_t rkey, huge;
};

struct verify {          /* client -> server: check [off, off+len) holds wpat(seed) */
	uint64_t off;
	uint32_t len, seed;
};

static const char *host(void)
{
	const char *h = getenv("DMANN_TEST_HOST");

	return h && *h ? h : "127.0.0.1";
}

static uint8_t pat(uint64_t off)
{
	return (uint8_t)(((off ^ (off >> 8) ^ (off >> 17)) * 167u + 13u) & 0xff);
}

static uint8_t wpat(uint64_t off, uint32_t seed)
{
	return (uint8_t)((off * 31u + seed * 7u + (off >> 11)) & 0xff);
}

static struct dm_xport *open_verbs(const char *secret)
{
	struct dm_xport_params p = {
		.backend = "verbs", .cluster = CLUSTER,
		.secret = (const uint8_t *)secret, .secret_len = strlen(secret),
	};

	return dm_xport_open(&p);
}

/* Receive buffers of one side. */
struct rbufs {
	uint8_t *mem;
	struct dm_mr *mr;
};

static int rbufs_init(struct rbufs *rb, struct dm_xport *x)
{
	rb->mem = aligned_alloc(4096, NRBUF * RBUF);
	if (!rb->mem || dm_xport_reg(x, rb->mem, NRBUF * RBUF, 0, &rb->mr))
		return -1;
	for (int i = 0; i < NRBUF; i++)
		if (dm_xport_post_recv(x, rb->mem + i * RBUF, RBUF, rb->mr, (uint64_t)i))
			return -1;
	return 0;
}

/* RECV completions that arrived while we waited for a SEND's completion: the peer's answer
 * can land before the ACK of our request does. One connection at a time per process. */
static struct dm_wc early[NRBUF];
static int nearly;

/* Wait for one completion of the given opcode (SEND or RECV); a RECV that overtakes the
 * SEND completion we wait for is kept for the next RECV wait. */
static int wait_one(struct dm_conn *c, struct dm_wc *wc, uint8_t opcode)
{
	if (opcode == DM_WC_RECV && nearly > 0) {
		*wc = early[0];
		memmove(early, early + 1, (size_t)--nearly * sizeof(*early));
		return wc->status;
	}
	for (;;) {
		int k = dm_conn_wait(c, wc, 1, WAIT_MS);

		if (k != 1)
			return k < 0 ? k : -ETIMEDOUT;
		if (wc->status)
			return wc->status;
		if (wc->opcode == opcode)
			return 0;
		if (wc->opcode != DM_WC_RECV || nearly == NRBUF)
			return -EPROTO;
		early[nearly++] = *wc;
	}
}

/* Send a small control message (inline) and wait for its completion. */
static int send_small(struct dm_conn *c, const void *msg, uint32_t len)
{
	struct dm_wc wc;
	int rc = dm_conn_send(c, 0, msg, len, NULL, DM_WR_INLINE | DM_WR_SIGNALED);

	return rc ? rc : wait_one(c, &wc, DM_WC_SEND);
}

/* ---- server process ---- */

#define SFAIL(...) do { fprintf(stderr, "server: " __VA_ARGS__); fputc('\n', stderr); \
			return 1; } while (0)

static int serve(struct dm_xport *x, struct dm_conn *c, struct rbufs *rb, struct dm_region *r,
		 struct dm_mr *rmr)
{
	struct info in = { .magic = MAGIC, .addr = (uintptr_t)r->addr, .len = r->len,
			   .rkey = rmr->rkey, .huge = r->huge };
	uint8_t hdr[1 + sizeof(in)];
	struct dm_wc wc;
	int rc;

	hdr[0] = M_INFO;
	memcpy(hdr + 1, &in, sizeof(in));
	if ((rc = send_small(c, hdr, sizeof(hdr))))
		SFAIL("INFO send: %s", strerror(-rc));
	for (;;) {
		uint8_t *m, type;

		if ((rc = wait_one(c, &wc, DM_WC_RECV)))
			SFAIL("recv: %s", strerror(-rc));
		m = rb->mem + wc.wr_id * RBUF;
		type = m[0];
		if (type == M_ECHO) {
			/* echo from the receive buffer itself: a registered, non-inline SEND
			 * when large */
			rc = dm_conn_send(c, 1, m, wc.byte_len, rb->mr, DM_WR_SIGNALED);
			if (rc || (rc = wait_one(c, &wc, DM_WC_SEND)))
				SFAIL("echo: %s", strerror(-rc));
		} else if (type == M_VERIFY && wc.byte_len == 1 + sizeof(struct verify)) {
			struct verify v;
			uint8_t ans = M_OK;

			memcpy(&v, m + 1, sizeof(v));
			if (v.off > r->len || v.len > r->len - v.off)
				ans = M_BAD;
			for (uint64_t i = 0; ans == M_OK && i < v.len; i++)
				if (((uint8_t *)r->addr)[v.off + i] != wpat(v.off + i, v.seed))
					ans = M_BAD;
			if ((rc = send_small(c, &ans, 1)))
				SFAIL("verify answer: %s", strerror(-rc));
		} else if (type == M_BYE) {
			uint8_t ans = M_BYE;

			if ((rc = send_small(c, &ans, 1)))
				SFAIL("bye: %s", strerror(-rc));
			break;
		} else {
			SFAIL("unexpected message type %u (%u bytes)", type, wc.byte_len);
		}
		/* the buffer whose completion we just handled goes back to the pool */
		if (dm_xport_post_recv(x, m, RBUF, rb->mr, (uint64_t)((m - rb->mem) / RBUF)))
			SFAIL("repost failed");
	}
	return 0;
}

static int server_main(int wfd)
{
	struct dm_listener *l;
	struct dm_conn *c;
	struct dm_region r;
	struct dm_mr *rmr;
	struct rbufs rb;
	struct dm_xport *x;
	char addr[128];
	int rc, port;

	x = open_verbs(SECRET);
	if (!x)
		SFAIL("open: %s", strerror(errno));
	if ((rc = dm_region_alloc(&r, REGION, -1, DM_HUGE_AUTO)))
		SFAIL("region: %s", strerror(-rc));
	if (!r.huge)
		fprintf(stderr, "server: WARNING: no hugepages, region on ordinary pages\n");
	for (uint64_t i = 0; i < r.len; i++)
		((uint8_t *)r.addr)[i] = pat(i);
	if ((rc = dm_xport_reg(x, r.addr, r.len, DM_MR_REMOTE_ALL, &rmr)))
		SFAIL("reg: %s", strerror(-rc));
	if (rbufs_init(&rb, x))
		SFAIL("receive buffers");
	snprintf(addr, sizeof(addr), "%s:0", host());
	if ((rc = dm_xport_listen(x, addr, &l)))
		SFAIL("listen %s: %s", addr, strerror(-rc));
	port = dm_listener_port(l);
	if (write(wfd, &port, sizeof(port)) != sizeof(port))
		SFAIL("pipe");
	close(wfd);

	/* 1: the main session */
	if ((rc = dm_listener_accept(l, WAIT_MS, &c)))
		SFAIL("accept: %s", strerror(-rc));
	if (serve(x, c, &rb, &r, rmr))
		return 1;
	dm_conn_close(c);
	/* 2: a client with the wrong secret must be refused */
	rc = dm_listener_accept(l, WAIT_MS, &c);
	if (rc != -EACCES)
		SFAIL("accept of a wrong-secret client returned %d (%s), want -EACCES", rc,
		      strerror(-rc));
	/* 3: a session the client breaks with a bad rkey; wait for it to hang up */
	if ((rc = dm_listener_accept(l, WAIT_MS, &c)))
		SFAIL("accept 3: %s", strerror(-rc));
	for (uint64_t t0 = dm_now_ns(); dm_now_ns() - t0 < WAIT_MS * 1000000ull;) {
		struct dm_wc wc;

		rc = dm_conn_wait(c, &wc, 1, 100);
		if (rc < 0)
			break;   /* -ENOTCONN: the peer is gone */
	}
	dm_conn_close(c);
	dm_listener_close(l);
	dm_xport_close(x);   /* deregisters what is left */
	dm_region_free(&r);
	free(rb.mem);
	return rc == -ENOTCONN ? 0 : (fprintf(stderr, "server: session 3 end: %d\n", rc), 1);
}

/* ---- client (the test process) ---- */

struct cli {
	struct dm_xport *x;
	struct dm_conn *c;
	struct rbufs rb;
	uint8_t *loc;
	struct dm_mr *lmr;
	struct info in;
};

#define LOCAL (4u << 20)

/* Receive one message into *out (copied), reposting the buffer. Returns its length. */
static uint32_t recv_msg(struct cli *k, uint8_t *out, uint32_t cap)
{
	struct dm_wc wc;
	uint8_t *m;
	int rc = wait_one(k->c, &wc, DM_WC_RECV);

	cr_assert_eq(rc, 0, "recv: %s", strerror(-rc));
	cr_assert_leq(wc.byte_len, cap);
	m = k->rb.mem + wc.wr_id * RBUF;
	memcpy(out, m, wc.byte_len);
	cr_assert_eq(dm_xport_post_recv(k->x, m, RBUF, k->rb.mr, wc.wr_id), 0);
	return wc.byte_len;
}

static void check_remote_pattern(const uint8_t *buf, uint64_t raddr, uint32_t len,
				 const struct cli *k, const char *what)
{
	uint64_t off = raddr - k->in.addr;

	for (uint32_t i = 0; i < len; i++)
		if (buf[i] != pat(off + i))
			cr_assert_fail("%s: byte %u of %u at remote offset %lu is %u, want %u", what, i,
				 len, (unsigned long)off, buf[i], pat(off + i));
}

/* A: 128 READs of random sizes in one chain, only the last signaled. */
static void step_read_chain(struct cli *k)
{
	enum { N = 128, SLOT = 16384 };
	static struct dm_rdma_wr wr[N];
	unsigned seed = 7;
	struct dm_wc wc;

	memset(k->loc, 0, (size_t)N * SLOT);
	for (int i = 0; i < N; i++) {
		uint32_t len = 1 + (uint32_t)rand_r(&seed) % SLOT;

		wr[i] = (struct dm_rdma_wr){
			.wr_id = 100 + (uint64_t)i, .local = k->loc + (size_t)i * SLOT, .mr = k->lmr,
			.remote = k->in.addr + (uint64_t)rand_r(&seed) % (k->in.len - len),
			.rkey = k->in.rkey, .len = len, .flags = i == N - 1 ? DM_WR_SIGNALED : 0,
		};
	}
	cr_assert_eq(dm_conn_read_batch(k->c, wr, N), 0);
	cr_assert_eq(wait_one(k->c, &wc, DM_WC_READ), 0);
	cr_assert_eq(wc.wr_id, 100 + N - 1, "only the last READ was signaled");
	cr_assert_eq(dm_conn_poll(k->c, &wc, 1), 0, "an unsignaled READ completed");
	/* RC completes in order: the last READ done means all are done */
	for (int i = 0; i < N; i++)
		check_remote_pattern(wr[i].local, wr[i].remote, wr[i].len, k, "read chain");
}

/* B: a full-depth batch (256 READs of 4 KiB, all signaled). */
static void step_read_full(struct cli *k)
{
	enum { N = 256, LEN = 4096 };
	static struct dm_rdma_wr wr[N];
	static struct dm_wc wc[N];
	bool seen[N] = { false };
	int got = 0;

	for (int i = 0; i < N; i++)
		wr[i] = (struct dm_rdma_wr){
			.wr_id = (uint64_t)i, .local = k->loc + (size_t)i * LEN, .mr = k->lmr,
			.remote = k->in.addr + (uint64_t)i * 8192 + 4, .rkey = k->in.rkey, .len = LEN,
			.flags = DM_WR_SIGNALED,
		};
	cr_assert_eq(dm_conn_read_batch(k->c, wr, N), 0);
	while (got < N) {
		int n = dm_conn_wait(k->c, wc + got, N - got, WAIT_MS);

		cr_assert_gt(n, 0, "full batch: %d of %d completions (%d)", got, N, n);
		got += n;
	}
	for (int i = 0; i < N; i++) {
		cr_assert_eq(wc[i].status, 0, "READ %lu: %s", (unsigned long)wc[i].wr_id,
			     strerror(-wc[i].status));
		cr_assert_lt(wc[i].wr_id, (uint64_t)N);
		cr_assert(!seen[wc[i].wr_id], "duplicate completion");
		seen[wc[i].wr_id] = true;
	}
	for (int i = 0; i < N; i++)
		check_remote_pattern(wr[i].local, wr[i].remote, LEN, k, "full batch");
}

/* C: 64 WRITEs (inline-sized and large) in one chain, read back, then checked by the server
 * in its own memory. */
static void step_write(struct cli *k)
{
	enum { N = 64, SLOT = 8192 };
	const uint32_t seed = 99;
	const uint64_t base = REGION / 2;
	static struct dm_rdma_wr wr[N], rd[N];
	struct dm_wc wc;
	uint8_t msg[1 + sizeof(struct verify)], ans;
	struct verify v = { .off = base, .len = N * SLOT, .seed = seed };
	int rc;
	uint8_t *src = k->loc, *back = k->loc + (size_t)N * SLOT;

	for (uint32_t i = 0; i < N * SLOT; i++)
		src[i] = wpat(base + i, seed);
	/* slots of varying fill: WRITEs of 8..SLOT bytes; the gaps are written by a second
	 * chain so that the server can verify one contiguous range */
	for (int i = 0; i < N; i++) {
		uint32_t len = i % 4 == 0 ? 8 + (uint32_t)i : SLOT;   /* small ones go inline */

		wr[i] = (struct dm_rdma_wr){
			.wr_id = 1000 + (uint64_t)i, .local = src + (size_t)i * SLOT, .mr = k->lmr,
			.remote = k->in.addr + base + (uint64_t)i * SLOT, .rkey = k->in.rkey,
			.len = len, .flags = (i % 16 == 15) ? DM_WR_SIGNALED : 0,
		};
	}
	cr_assert_eq(dm_conn_write_batch(k->c, wr, N), 0);
	for (int s = 0; s < N / 16; s++) {
		cr_assert_eq(wait_one(k->c, &wc, DM_WC_WRITE), 0);
		cr_assert_eq(wc.wr_id, 1000 + (uint64_t)(s * 16 + 15));
	}
	for (int i = 0; i < N; i += 4) {   /* fill the rest of the small slots */
		wr[i].local = (uint8_t *)wr[i].local + wr[i].len;
		wr[i].remote += wr[i].len;
		wr[i].len = SLOT - wr[i].len;
		wr[i].flags = 0;
	}
	for (int i = 0, j = 0; i < N; i += 4)
		rd[j++] = wr[i];
	rd[N / 4 - 1].flags = DM_WR_SIGNALED;
	cr_assert_eq(dm_conn_write_batch(k->c, rd, N / 4), 0);
	cr_assert_eq(wait_one(k->c, &wc, DM_WC_WRITE), 0);
	/* read the whole range back in one chain */
	for (int i = 0; i < N; i++)
		rd[i] = (struct dm_rdma_wr){
			.wr_id = 2000 + (uint64_t)i, .local = back + (size_t)i * SLOT, .mr = k->lmr,
			.remote = k->in.addr + base + (uint64_t)i * SLOT, .rkey = k->in.rkey,
			.len = SLOT, .flags = i == N - 1 ? DM_WR_SIGNALED : 0,
		};
	cr_assert_eq(dm_conn_read_batch(k->c, rd, N), 0);
	cr_assert_eq(wait_one(k->c, &wc, DM_WC_READ), 0);
	cr_assert_eq(memcmp(back, src, (size_t)N * SLOT), 0, "written data read back differs");
	msg[0] = M_VERIFY;
	memcpy(msg + 1, &v, sizeof(v));
	rc = send_small(k->c, msg, sizeof(msg));
	cr_assert_eq(rc, 0, "VERIFY send: %d (%s)", rc, strerror(-rc));
	cr_assert_eq(recv_msg(k, &ans, 1), 1);
	cr_assert_eq(ans, M_OK, "the server does not see the written data in its memory");
}

/* D: CAS (failing, then succeeding), then 1000 FAAs with only the last signaled. */
static void step_atomics(struct cli *k)
{
	enum { N = 1000 };
	const uint64_t off = 0x100;
	uint64_t *res = (uint64_t *)k->loc, orig = 0;
	struct dm_wc wc;
	uint64_t raddr = k->in.addr + off;

	for (int i = 0; i < 8; i++)
		orig |= (uint64_t)pat(off + (uint64_t)i) << (8 * i);
	cr_assert_eq(dm_conn_cas(k->c, 1, res, k->lmr, raddr, k->in.rkey, orig + 1, 5,
				 DM_WR_SIGNALED), 0);
	cr_assert_eq(wait_one(k->c, &wc, DM_WC_CAS), 0);
	cr_assert_eq(*res, orig, "CAS returned %#lx, memory holds %#lx", (unsigned long)*res,
		     (unsigned long)orig);
	cr_assert_eq(dm_conn_cas(k->c, 2, res, k->lmr, raddr, k->in.rkey, orig, 1000,
				 DM_WR_SIGNALED), 0);
	cr_assert_eq(wait_one(k->c, &wc, DM_WC_CAS), 0);
	cr_assert_eq(*res, orig, "the second CAS did not see the unchanged value");
	memset(res, 0xff, (size_t)N * 8);
	for (int i = 0; i < N; i++) {
		int rc;

		/* more FAAs than the send queue holds: the backend reaps its own internally
		 * signaled WRs to make room, or asks us to come back (-EAGAIN) */
		while ((rc = dm_conn_faa(k->c, 10 + (uint64_t)i, res + i, k->lmr, raddr,
					 k->in.rkey, 5, i == N - 1 ? DM_WR_SIGNALED : 0)) == -EAGAIN)
			cr_assert_eq(dm_conn_poll(k->c, &wc, 1), 0, "unsignaled FAA completed");
		cr_assert_eq(rc, 0, "FAA %d: %s", i, strerror(-rc));
	}
	cr_assert_eq(wait_one(k->c, &wc, DM_WC_FAA), 0);
	cr_assert_eq(wc.wr_id, 10 + (uint64_t)N - 1);
	for (int i = 0; i < N; i++)
		cr_assert_eq(res[i], 1000 + 5 * (uint64_t)i, "FAA %d saw %lu", i,
			     (unsigned long)res[i]);
	struct dm_rdma_wr r = { .wr_id = 3, .local = k->loc + 65536, .mr = k->lmr,
				.remote = raddr, .rkey = k->in.rkey, .len = 8,
				.flags = DM_WR_SIGNALED };
	cr_assert_eq(dm_conn_read_batch(k->c, &r, 1), 0);
	cr_assert_eq(wait_one(k->c, &wc, DM_WC_READ), 0);
	cr_assert_eq(*(uint64_t *)(k->loc + 65536), 1000 + 5 * (uint64_t)N);
}

/* E: SEND/RECV echo of 1..3000-byte messages (small ones inline). */
static void step_echo(struct cli *k)
{
	static uint8_t back[RBUF];
	uint8_t *msg = k->loc + (1u << 20);

	for (uint32_t n = 0; n < 200; n++) {
		uint32_t len = 1 + (n * 37) % 3000;
		struct dm_wc wc;
		int rc;

		msg[0] = M_ECHO;
		for (uint32_t i = 1; i < len; i++)
			msg[i] = (uint8_t)(n + i * 3);
		cr_assert_eq(dm_conn_send(k->c, n, msg, len, k->lmr,
					  len <= 64 ? DM_WR_INLINE | DM_WR_SIGNALED : DM_WR_SIGNALED), 0);
		rc = wait_one(k->c, &wc, DM_WC_SEND);
		cr_assert_eq(rc, 0, "echo %u (%u bytes): SEND completion %d (%s)", n, len, rc,
			     strerror(-rc));
		cr_assert_eq(wc.wr_id, n);
		cr_assert_eq(recv_msg(k, back, sizeof(back)), len, "echo %u: length", n);
		cr_assert_eq(memcmp(back, msg, len), 0, "echo %u: content", n);
	}
}

Test(rxe, twoproc, .timeout = 150)
{
	struct cli k = { 0 };
	char addr[128], hdr[1 + sizeof(struct info)];
	const char *why = NULL;
	int pfd[2], port, status, rc;
	uint8_t bye = M_BYE;
	pid_t pid;

	if (!dm_xport_available("verbs", &why))
		cr_skip_test("verbs: %s", why ? why : "not available");
	/* fork before either side opens a device: verbs state is not fork-safe */
	cr_assert_eq(pipe(pfd), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		_exit(server_main(pfd[1]));
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &port, sizeof(port)), (ssize_t)sizeof(port),
		     "the server process did not start");
	close(pfd[0]);

	k.x = open_verbs(SECRET);
	cr_assert(k.x, "open: %s", strerror(errno));
	k.loc = aligned_alloc(4096, LOCAL);
	cr_assert(k.loc);
	cr_assert_eq(dm_xport_reg(k.x, k.loc, LOCAL, 0, &k.lmr), 0);
	cr_assert_eq(rbufs_init(&k.rb, k.x), 0);
	snprintf(addr, sizeof(addr), "%s:%d", host(), port);
	rc = dm_xport_connect(k.x, addr, WAIT_MS, &k.c);
	cr_assert_eq(rc, 0, "connect %s: %s", addr, strerror(-rc));
	cr_assert_eq(recv_msg(&k, (uint8_t *)hdr, sizeof(hdr)), sizeof(hdr));
	cr_assert_eq(hdr[0], M_INFO);
	memcpy(&k.in, hdr + 1, sizeof(k.in));
	cr_assert_eq(k.in.magic, MAGIC);
	cr_assert_geq(k.in.len, REGION);
	if (!k.in.huge)
		cr_log_warn("the server's region is not on hugepages");
	/* In the VM hugepages are reserved: insist that the memory-node path used them. */
	if (getenv("DMANN_TEST_HOST") && !strcmp(getenv("DMANN_TEST_HOST"), "10.0.2.15"))
		cr_assert(k.in.huge, "hugepages are reserved in the VM but the region is not on them");

	step_read_chain(&k);
	step_read_full(&k);
	step_write(&k);
	step_atomics(&k);
	step_echo(&k);
	cr_assert_eq(send_small(k.c, &bye, 1), 0);
	cr_assert_eq(recv_msg(&k, &bye, 1), 1);
	cr_assert_eq(bye, M_BYE);
	dm_conn_close(k.c);

	/* a client that does not know the secret is refused */
	{
		struct dm_xport *bad = open_verbs("not the secret");
		struct dm_conn *bc = NULL;

		cr_assert(bad);
		rc = dm_xport_connect(bad, addr, WAIT_MS, &bc);
		cr_assert_eq(rc, -EACCES, "wrong secret: connect returned %d (%s)", rc,
			     strerror(-rc));
		cr_assert_null(bc);
		dm_xport_close(bad);
	}

	/* a READ with a bad rkey: -EACCES completion, then the connection is in error state */
	{
		struct dm_rdma_wr r = { .wr_id = 77, .local = k.loc, .mr = k.lmr,
					.remote = k.in.addr, .rkey = k.in.rkey ^ 0x5a5a00,
					.len = 64, .flags = DM_WR_SIGNALED };
		struct dm_wc wc;

		rc = dm_xport_connect(k.x, addr, WAIT_MS, &k.c);
		cr_assert_eq(rc, 0, "connect 3: %s", strerror(-rc));
		cr_assert_eq(dm_conn_read_batch(k.c, &r, 1), 0);
		cr_assert_eq(dm_conn_wait(k.c, &wc, 1, WAIT_MS), 1);
		cr_assert_eq(wc.wr_id, 77);
		cr_assert_eq(wc.status, -EACCES, "bad rkey: status %d (%s)", wc.status,
			     strerror(-wc.status));
		cr_assert_eq(dm_conn_read_batch(k.c, &r, 1), -ENOTCONN);
		dm_conn_close(k.c);
	}

	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "the server process failed (status %#x)", status);
	dm_xport_close(k.x);
	free(k.rb.mem);
	free(k.loc);
}
