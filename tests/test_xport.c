/* test_xport.c: transport conformance suite, run against every backend compiled in.
 *
 * Every test is parameterized over dm_xport_backends(); a backend that cannot run here
 * (verbs without an RDMA device) is skipped with the reason. Listen/connect host comes from
 * DMANN_TEST_HOST (default 127.0.0.1; the soft-RoCE VM sets its own address). All waits are
 * bounded, so a broken backend fails a test instead of hanging it.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "xport.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_MS 5000
#define CLUSTER "test-cluster"
#define SECRET  "correct horse battery staple"

struct bk {
	char name[16];
};

static struct bk bk_params[8];

/* Parameters: the backends compiled in. */
static size_t fill_params(void)
{
	const char *const *names = dm_xport_backends();
	size_t n = 0;

	for (; names[n] && n < DM_ARRAY_SIZE(bk_params); n++)
		snprintf(bk_params[n].name, sizeof(bk_params[n].name), "%s", names[n]);
	return n;
}

#define BACKEND_PARAMS(test) \
	ParameterizedTestParameters(xport, test) \
	{ \
		size_t n = fill_params(); \
		return cr_make_param_array(struct bk, bk_params, n); \
	}

static const char *test_host(void)
{
	const char *h = getenv("DMANN_TEST_HOST");

	return h && *h ? h : "127.0.0.1";
}

static void need_backend(const char *name)
{
	const char *why = NULL;

	if (!dm_xport_available(name, &why))
		cr_skip_test("%s: %s", name, why ? why : "not available");
}

static struct dm_xport *open_x(const char *backend, const char *cluster, const char *secret)
{
	struct dm_xport_params p = {
		.backend = backend,
		.cluster = cluster,
		.secret = (const uint8_t *)secret,
		.secret_len = strlen(secret),
	};
	struct dm_xport *x = dm_xport_open(&p);

	cr_assert(x, "dm_xport_open(%s): %s", backend, strerror(errno));
	return x;
}

/* ---- a connected pair: server context (holds the memory) and client context ---- */

struct pair {
	struct dm_xport *sx, *cx;
	struct dm_listener *l;
	struct dm_conn *sc, *cc;
	int src, crc;     /* accept / connect results */
};

static void *accept_main(void *arg)
{
	struct pair *p = arg;

	p->src = dm_listener_accept(p->l, WAIT_MS, &p->sc);
	return NULL;
}

/* Listen on the server context, connect the client context to it (both sides run the
 * handshake concurrently). Results in p->src / p->crc. */
static void pair_connect(struct pair *p)
{
	char addr[128];
	pthread_t t;
	int port;

	snprintf(addr, sizeof(addr), "%s:0", test_host());
	cr_assert_eq(dm_xport_listen(p->sx, addr, &p->l), 0, "listen on %s", addr);
	port = dm_listener_port(p->l);
	cr_assert_gt(port, 0);
	snprintf(addr, sizeof(addr), "%s:%d", test_host(), port);
	p->sc = p->cc = NULL;
	cr_assert_eq(pthread_create(&t, NULL, accept_main, p), 0);
	p->crc = dm_xport_connect(p->cx, addr, WAIT_MS, &p->cc);
	pthread_join(t, NULL);
}

static void pair_open(struct pair *p, const char *backend)
{
	memset(p, 0, sizeof(*p));
	p->sx = open_x(backend, CLUSTER, SECRET);
	p->cx = open_x(backend, CLUSTER, SECRET);
	pair_connect(p);
	cr_assert_eq(p->src, 0, "accept: %s", strerror(-p->src));
	cr_assert_eq(p->crc, 0, "connect: %s", strerror(-p->crc));
}

static void pair_close(struct pair *p)
{
	dm_conn_close(p->cc);
	dm_conn_close(p->sc);
	dm_listener_close(p->l);
	dm_xport_close(p->cx);
	dm_xport_close(p->sx);
}

/* Collect exactly n completions (bounded); returns how many arrived. */
static int wait_n(struct dm_conn *c, struct dm_wc *wc, int n)
{
	uint64_t deadline = dm_now_ns() + WAIT_MS * 1000000ull;
	int got = 0;

	while (got < n && dm_now_ns() < deadline) {
		int k = dm_conn_wait(c, wc + got, n - got, 100);

		if (k < 0)
			break;
		got += k;
	}
	return got;
}

/* A registered buffer filled with a deterministic pattern. */
struct region {
	uint8_t *buf;
	size_t len;
	struct dm_mr *mr;
};

static void region_init(struct region *r, struct dm_xport *x, size_t len, int access,
			unsigned seed)
{
	r->len = len;
	r->buf = aligned_alloc(4096, DM_ALIGN_UP(len, 4096));
	cr_assert(r->buf);
	for (size_t i = 0; i < len; i++)
		r->buf[i] = (uint8_t)((i * 131 + seed * 7 + (i >> 9)) & 0xff);
	cr_assert_eq(dm_xport_reg(x, r->buf, len, access, &r->mr), 0);
}

static void region_fini(struct region *r, struct dm_xport *x)
{
	cr_assert_eq(dm_xport_dereg(x, r->mr), 0);
	free(r->buf);
}

/* ---- handshake ---- */

BACKEND_PARAMS(handshake_ok)
ParameterizedTest(struct bk *b, xport, handshake_ok, .timeout = 30)
{
	struct pair p;

	need_backend(b->name);
	pair_open(&p, b->name);
	cr_assert(p.cc && p.sc);
	cr_assert_str_eq(dm_xport_name(p.cx), b->name);
	pair_close(&p);
}

BACKEND_PARAMS(handshake_wrong_secret)
ParameterizedTest(struct bk *b, xport, handshake_wrong_secret, .timeout = 30)
{
	struct pair p = { 0 };

	need_backend(b->name);
	p.sx = open_x(b->name, CLUSTER, SECRET);
	p.cx = open_x(b->name, CLUSTER, "not the secret");
	pair_connect(&p);
	cr_assert_lt(p.crc, 0, "connect with a wrong secret succeeded");
	cr_assert_lt(p.src, 0, "accept of a peer with a wrong secret succeeded");
	cr_assert_eq(p.crc, -EACCES, "connect: %s", strerror(-p.crc));
	cr_assert_null(p.cc);
	cr_assert_null(p.sc);
	pair_close(&p);
}

BACKEND_PARAMS(handshake_wrong_cluster)
ParameterizedTest(struct bk *b, xport, handshake_wrong_cluster, .timeout = 30)
{
	struct pair p = { 0 };

	need_backend(b->name);
	p.sx = open_x(b->name, CLUSTER, SECRET);
	p.cx = open_x(b->name, "other-cluster", SECRET);
	pair_connect(&p);
	cr_assert_eq(p.crc, -EPERM, "connect: %s", strerror(-p.crc));
	cr_assert_eq(p.src, -EPERM, "accept: %s", strerror(-p.src));
	cr_assert_null(p.cc);
	cr_assert_null(p.sc);
	pair_close(&p);
}

/* ---- one-sided ---- */

BACKEND_PARAMS(read_batch)
ParameterizedTest(struct bk *b, xport, read_batch, .timeout = 30)
{
	enum { N = 64, SLOT = 16384, RLEN = 1 << 20 };
	struct dm_rdma_wr wr[N];
	struct dm_wc wc[N];
	struct region rem, loc;
	struct pair p;
	unsigned seed = 12345;

	need_backend(b->name);
	pair_open(&p, b->name);
	region_init(&rem, p.sx, RLEN, DM_MR_REMOTE_READ, 1);
	region_init(&loc, p.cx, (size_t)N * SLOT, 0, 2);
	memset(loc.buf, 0, loc.len);
	for (int i = 0; i < N; i++) {
		uint32_t len = 1 + (uint32_t)(rand_r(&seed) % SLOT);
		uint64_t off = (uint64_t)rand_r(&seed) % (RLEN - len + 1);

		wr[i] = (struct dm_rdma_wr){
			.wr_id = (uint64_t)i, .local = loc.buf + (size_t)i * SLOT, .mr = loc.mr,
			.remote = (uintptr_t)rem.buf + off, .rkey = rem.mr->rkey, .len = len,
			.flags = DM_WR_SIGNALED,
		};
	}
	cr_assert_eq(dm_conn_read_batch(p.cc, wr, N), 0);
	cr_assert_eq(wait_n(p.cc, wc, N), N);
	for (int i = 0; i < N; i++) {
		int j = (int)wc[i].wr_id;

		cr_assert(j >= 0 && j < N);
		cr_assert_eq(wc[i].status, 0, "read %d: %s", j, strerror(-wc[i].status));
		cr_assert_eq(wc[i].opcode, DM_WC_READ);
		cr_assert_eq(wc[i].byte_len, wr[j].len);
		cr_assert_eq(memcmp(wr[j].local, (void *)(uintptr_t)wr[j].remote, wr[j].len), 0,
			     "read %d differs", j);
	}
	region_fini(&loc, p.cx);
	region_fini(&rem, p.sx);
	pair_close(&p);
}

/* dm_conn_notify: a completion wakes the notifier's owner, a wake that comes between the
 * arm and the wait is not lost, nothing pending is a timeout, and the peer's close wakes
 * it too. Backends that cannot (-ENOSYS) are skipped: their users poll. */
BACKEND_PARAMS(notify_wakes)
ParameterizedTest(struct bk *b, xport, notify_wakes, .timeout = 30)
{
	enum { LEN = 4096 };
	struct dm_notify n;
	struct region rem, loc;
	struct dm_rdma_wr wr;
	struct dm_wc wc;
	struct pair p;
	uint64_t t0;
	int rc, got = 0;

	need_backend(b->name);
	pair_open(&p, b->name);
	cr_assert_eq(dm_notify_init(&n), 0);
	/* verbs has no completion notification yet and must say so (its users poll then); the
	 * notifier itself is checked all the same, the connection's wake-ups only where the
	 * backend offers them (a skip would fail the soft-RoCE VM's run) */
	rc = dm_conn_notify(p.cc, &n);
	cr_assert(rc == 0 || (rc == -ENOSYS && !strcmp(b->name, "verbs")), "%s: notify %d",
		  b->name, rc);
	/* Nothing pending: a timeout. */
	dm_notify_arm(&n);
	cr_assert_eq(dm_conn_poll(p.cc, &wc, 1), 0);
	t0 = dm_now_ns();
	cr_assert_eq(dm_notify_wait(&n, 50), 0);
	cr_assert_geq(dm_now_ns() - t0, 40000000ull);
	/* A wake between arm and wait: the wait returns at once. */
	dm_notify_arm(&n);
	dm_notify_wake(&n);
	cr_assert_eq(dm_notify_wait(&n, WAIT_MS), 1);
	/* Not armed: a wake costs nothing and leaves no wake-up behind. */
	dm_notify_wake(&n);
	dm_notify_arm(&n);
	cr_assert_eq(dm_notify_wait(&n, 20), 0);
	if (rc == -ENOSYS) {
		dm_notify_fini(&n);
		pair_close(&p);
		return;
	}
	/* A READ's completion wakes the sleeper. */
	region_init(&rem, p.sx, LEN, DM_MR_REMOTE_READ, 3);
	region_init(&loc, p.cx, LEN, 0, 4);
	wr = (struct dm_rdma_wr){ .wr_id = 7, .local = loc.buf, .mr = loc.mr,
				  .remote = (uintptr_t)rem.buf, .rkey = rem.mr->rkey, .len = LEN,
				  .flags = DM_WR_SIGNALED };
	dm_notify_arm(&n);
	cr_assert_eq(dm_conn_read_batch(p.cc, &wr, 1), 0);
	for (t0 = dm_now_ns(); !got && dm_now_ns() - t0 < WAIT_MS * 1000000ull;) {
		got = dm_conn_poll(p.cc, &wc, 1);
		if (!got) {
			dm_notify_wait(&n, WAIT_MS);
			dm_notify_arm(&n);
		}
	}
	cr_assert_eq(got, 1, "no READ completion");
	cr_assert_eq(wc.wr_id, 7u);
	cr_assert_eq(wc.status, 0);
	cr_assert_eq(memcmp(loc.buf, rem.buf, LEN), 0);
	/* The peer closes: the failure wakes the sleeper too. */
	dm_notify_wait(&n, 0);
	dm_notify_arm(&n);
	dm_conn_close(p.sc);
	p.sc = NULL;
	cr_assert_eq(dm_notify_wait(&n, WAIT_MS), 1, "the peer's close did not wake");
	cr_assert_eq(dm_conn_wait(p.cc, &wc, 1, 0), -ENOTCONN);
	cr_assert_eq(dm_conn_notify(p.cc, NULL), 0);
	region_fini(&loc, p.cx);
	region_fini(&rem, p.sx);
	pair_close(&p);
	dm_notify_fini(&n);
}

BACKEND_PARAMS(write_then_read)
ParameterizedTest(struct bk *b, xport, write_then_read, .timeout = 30)
{
	enum { LEN = 65536 };
	struct region rem, src, dst;
	struct dm_wc wc[2];
	struct pair p;

	need_backend(b->name);
	pair_open(&p, b->name);
	region_init(&rem, p.sx, LEN, DM_MR_REMOTE_READ | DM_MR_REMOTE_WRITE, 3);
	region_init(&src, p.cx, LEN, 0, 4);
	region_init(&dst, p.cx, LEN, 0, 5);
	struct dm_rdma_wr w = {
		.wr_id = 1, .local = src.buf + 100, .mr = src.mr,
		.remote = (uintptr_t)rem.buf + 1000, .rkey = rem.mr->rkey, .len = 40000,
		.flags = DM_WR_SIGNALED,
	};
	struct dm_rdma_wr r = {
		.wr_id = 2, .local = dst.buf, .mr = dst.mr,
		.remote = (uintptr_t)rem.buf + 1000, .rkey = rem.mr->rkey, .len = 40000,
		.flags = DM_WR_SIGNALED,
	};
	/* Posted back to back: RC ordering makes the READ see the WRITE. */
	cr_assert_eq(dm_conn_write_batch(p.cc, &w, 1), 0);
	cr_assert_eq(dm_conn_read_batch(p.cc, &r, 1), 0);
	cr_assert_eq(wait_n(p.cc, wc, 2), 2);
	cr_assert_eq(wc[0].wr_id, 1);
	cr_assert_eq(wc[0].status, 0);
	cr_assert_eq(wc[0].opcode, DM_WC_WRITE);
	cr_assert_eq(wc[1].wr_id, 2);
	cr_assert_eq(wc[1].status, 0);
	cr_assert_eq(memcmp(dst.buf, src.buf + 100, 40000), 0);
	cr_assert_eq(memcmp(rem.buf + 1000, src.buf + 100, 40000), 0);
	region_fini(&dst, p.cx);
	region_fini(&src, p.cx);
	region_fini(&rem, p.sx);
	pair_close(&p);
}

struct cas_arg {
	struct dm_xport *cx;
	const char *addr;
	uint64_t remote;
	uint32_t rkey;
	int iters;
	int done;
	int err;
};

/* Increment the remote counter iters times with CAS over its own connection. */
static void *cas_main(void *arg)
{
	struct cas_arg *a = arg;
	struct dm_conn *c = NULL;
	uint64_t *old = aligned_alloc(64, 64);
	struct dm_mr *mr = NULL;
	uint64_t guess = 0;
	struct dm_wc wc;

	if (!old || dm_xport_reg(a->cx, old, 64, 0, &mr) ||
	    dm_xport_connect(a->cx, a->addr, WAIT_MS, &c)) {
		a->err = -EIO;
		goto out;
	}
	while (a->done < a->iters) {
		if (dm_conn_cas(c, 7, old, mr, a->remote, a->rkey, guess, guess + 1,
				DM_WR_SIGNALED) || wait_n(c, &wc, 1) != 1 || wc.status) {
			a->err = -EIO;
			break;
		}
		if (*old == guess) {
			a->done++;
			guess++;
		} else {
			guess = *old;
		}
	}
out:
	dm_conn_close(c);
	if (mr)
		dm_xport_dereg(a->cx, mr);
	free(old);
	return NULL;
}

struct acc_arg {
	struct dm_listener *l;
	struct dm_conn *c[8];
	int n;
};

static void *accept_many(void *arg)
{
	struct acc_arg *a = arg;

	for (int i = 0; i < a->n; i++)
		if (dm_listener_accept(a->l, WAIT_MS, &a->c[i]))
			break;
	return NULL;
}

BACKEND_PARAMS(cas_contention)
ParameterizedTest(struct bk *b, xport, cas_contention, .timeout = 60)
{
	enum { T = 4, ITERS = 300 };
	struct dm_xport *sx, *cx;
	struct dm_listener *l;
	struct acc_arg acc = { .n = T };
	struct cas_arg a[T];
	pthread_t at, t[T];
	struct region rem;
	char addr[128];

	need_backend(b->name);
	sx = open_x(b->name, CLUSTER, SECRET);
	cx = open_x(b->name, CLUSTER, SECRET);
	region_init(&rem, sx, 4096, DM_MR_REMOTE_ALL, 6);
	memset(rem.buf, 0, 4096);
	snprintf(addr, sizeof(addr), "%s:0", test_host());
	cr_assert_eq(dm_xport_listen(sx, addr, &l), 0);
	snprintf(addr, sizeof(addr), "%s:%d", test_host(), dm_listener_port(l));
	acc.l = l;
	pthread_create(&at, NULL, accept_many, &acc);
	for (int i = 0; i < T; i++) {
		a[i] = (struct cas_arg){ .cx = cx, .addr = addr, .remote = (uintptr_t)rem.buf + 64,
					 .rkey = rem.mr->rkey, .iters = ITERS };
		pthread_create(&t[i], NULL, cas_main, &a[i]);
	}
	for (int i = 0; i < T; i++)
		pthread_join(t[i], NULL);
	pthread_join(at, NULL);
	for (int i = 0; i < T; i++) {
		cr_assert_eq(a[i].err, 0, "thread %d failed", i);
		cr_assert_eq(a[i].done, ITERS);
	}
	cr_assert_eq(__atomic_load_n((uint64_t *)(rem.buf + 64), __ATOMIC_SEQ_CST),
		     (uint64_t)T * ITERS);
	for (int i = 0; i < T; i++)
		dm_conn_close(acc.c[i]);
	dm_listener_close(l);
	region_fini(&rem, sx);
	dm_xport_close(cx);
	dm_xport_close(sx);
}

BACKEND_PARAMS(faa_selective_signaling)
ParameterizedTest(struct bk *b, xport, faa_selective_signaling, .timeout = 30)
{
	enum { N = 100 };
	struct region rem, loc;
	struct dm_wc wc[N];
	struct pair p;
	uint64_t *cnt;
	int got;

	need_backend(b->name);
	pair_open(&p, b->name);
	region_init(&rem, p.sx, 4096, DM_MR_REMOTE_ATOMIC, 7);
	region_init(&loc, p.cx, (size_t)N * 8, 0, 8);
	cnt = (uint64_t *)(rem.buf + 8);
	*cnt = 1000;
	/* Every 10th signaled: exactly those complete. */
	for (int i = 0; i < N; i++)
		cr_assert_eq(dm_conn_faa(p.cc, (uint64_t)i, (uint64_t *)loc.buf + i, loc.mr,
					 (uintptr_t)cnt, rem.mr->rkey, 3,
					 i % 10 == 9 ? DM_WR_SIGNALED : 0), 0);
	got = wait_n(p.cc, wc, N / 10);
	cr_assert_eq(got, N / 10);
	cr_assert_eq(dm_conn_wait(p.cc, wc + got, 1, 200), 0, "unsignaled FAA completed");
	for (int i = 0; i < N / 10; i++) {
		cr_assert_eq(wc[i].status, 0);
		cr_assert_eq(wc[i].opcode, DM_WC_FAA);
		cr_assert_eq(wc[i].wr_id, (uint64_t)(i * 10 + 9));
	}
	/* FAAs from one connection are applied in order: op i saw 1000 + 3i. */
	for (int i = 0; i < N; i++)
		cr_assert_eq(((uint64_t *)loc.buf)[i], 1000u + 3u * (uint64_t)i);
	cr_assert_eq(__atomic_load_n(cnt, __ATOMIC_SEQ_CST), 1000u + 3u * N);
	region_fini(&loc, p.cx);
	region_fini(&rem, p.sx);
	pair_close(&p);
}

/* ---- two-sided ---- */

struct rx_arg {
	struct dm_xport *x;
	struct dm_conn *c;
	struct region *bufs;
	uint32_t slot;
	uint64_t expect;     /* messages to receive */
	uint64_t got;
	int err;
};

/* Receive messages in order, checking their sequence numbers, reposting each buffer. */
static void *rx_main(void *arg)
{
	struct rx_arg *a = arg;
	struct dm_wc wc[64];
	uint64_t idle_since = dm_now_ns();

	while (a->got < a->expect) {
		int k = dm_conn_wait(a->c, wc, 64, 100);

		if (k < 0) {
			a->err = k;
			return NULL;
		}
		if (k == 0 && dm_now_ns() - idle_since > WAIT_MS * 1000000ull) {
			a->err = -ETIMEDOUT;
			return NULL;
		}
		for (int i = 0; i < k; i++) {
			uint8_t *buf = a->bufs->buf + wc[i].wr_id * a->slot;
			uint64_t seq;

			if (wc[i].status || wc[i].opcode != DM_WC_RECV || wc[i].byte_len < 8) {
				a->err = -EBADMSG;
				return NULL;
			}
			memcpy(&seq, buf, 8);
			if (seq != a->got || buf[wc[i].byte_len - 1] != (uint8_t)seq) {
				a->err = -EILSEQ;
				return NULL;
			}
			a->got++;
			if (dm_xport_post_recv(a->x, buf, a->slot, a->bufs->mr, wc[i].wr_id)) {
				a->err = -EIO;
				return NULL;
			}
			idle_since = dm_now_ns();
		}
	}
	return NULL;
}

BACKEND_PARAMS(send_recv_100k)
ParameterizedTest(struct bk *b, xport, send_recv_100k, .timeout = 60)
{
	enum { MSGS = 100000, SLOT = 64, NBUF = 512 };
	struct rx_arg ra = { 0 };
	struct region bufs;
	struct dm_wc wc[64];
	uint8_t msg[48];
	struct pair p;
	pthread_t t;
	uint64_t signaled = 0, completed = 0;

	need_backend(b->name);
	pair_open(&p, b->name);
	region_init(&bufs, p.sx, (size_t)NBUF * SLOT, 0, 9);
	for (int i = 0; i < NBUF; i++)
		cr_assert_eq(dm_xport_post_recv(p.sx, bufs.buf + (size_t)i * SLOT, SLOT, bufs.mr,
						(uint64_t)i), 0);
	ra = (struct rx_arg){ .x = p.sx, .c = p.sc, .bufs = &bufs, .slot = SLOT,
			      .expect = MSGS };
	pthread_create(&t, NULL, rx_main, &ra);
	for (uint64_t i = 0; i < MSGS; i++) {
		uint32_t len = 9 + (uint32_t)(i % 39);
		uint32_t fl = DM_WR_INLINE | (i % 64 == 63 ? DM_WR_SIGNALED : 0);
		uint64_t deadline = dm_now_ns() + WAIT_MS * 1000000ull;
		int rc;

		memcpy(msg, &i, 8);
		msg[len - 1] = (uint8_t)i;
		while ((rc = dm_conn_send(p.cc, i, msg, len, NULL, fl)) == -EAGAIN &&
		       dm_now_ns() < deadline) {
			int k = dm_conn_wait(p.cc, wc, 64, 10);

			cr_assert_geq(k, 0);
			for (int j = 0; j < k; j++)
				cr_assert_eq(wc[j].status, 0);
			completed += (uint64_t)k;
		}
		cr_assert_eq(rc, 0, "send %lu: %s", (unsigned long)i, strerror(-rc));
		signaled += (fl & DM_WR_SIGNALED) != 0;
	}
	while (completed < signaled) {
		int k = wait_n(p.cc, wc, 1);

		cr_assert_eq(k, 1, "send completions missing");
		cr_assert_eq(wc[0].status, 0);
		completed++;
	}
	pthread_join(t, NULL);
	cr_assert_eq(ra.err, 0, "receiver: %s", strerror(-ra.err));
	cr_assert_eq(ra.got, MSGS);
	pair_close(&p);
	free(bufs.buf);   /* deregistered with its context */
}

BACKEND_PARAMS(send_backpressure)
ParameterizedTest(struct bk *b, xport, send_backpressure, .timeout = 30)
{
	enum { N = 10, SLOT = 64 };
	struct region bufs;
	struct dm_wc wc[N];
	struct pair p;
	uint64_t v;

	need_backend(b->name);
	pair_open(&p, b->name);
	region_init(&bufs, p.sx, (size_t)N * SLOT, 0, 10);
	for (v = 0; v < N; v++)
		cr_assert_eq(dm_conn_send(p.cc, v, &v, 8, NULL, DM_WR_INLINE | DM_WR_SIGNALED), 0);
	/* No buffer posted: nothing may be delivered, nothing dropped, nothing failed. */
	cr_assert_eq(dm_conn_wait(p.sc, wc, N, 200), 0);
	cr_assert_eq(dm_conn_poll(p.cc, wc, N), 0);
	for (int i = 0; i < N; i++)
		cr_assert_eq(dm_xport_post_recv(p.sx, bufs.buf + (size_t)i * SLOT, SLOT, bufs.mr,
						(uint64_t)i), 0);
	cr_assert_eq(wait_n(p.sc, wc, N), N);
	for (int i = 0; i < N; i++) {
		uint64_t seq;

		cr_assert_eq(wc[i].status, 0);
		cr_assert_eq(wc[i].opcode, DM_WC_RECV);
		cr_assert_eq(wc[i].byte_len, 8);
		memcpy(&seq, bufs.buf + wc[i].wr_id * SLOT, 8);
		cr_assert_eq(seq, (uint64_t)i, "message %d out of order", i);
	}
	cr_assert_eq(wait_n(p.cc, wc, N), N);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(wc[i].status, 0);
		cr_assert_eq(wc[i].opcode, DM_WC_SEND);
	}
	pair_close(&p);
	free(bufs.buf);
}

BACKEND_PARAMS(send_too_large)
ParameterizedTest(struct bk *b, xport, send_too_large, .timeout = 30)
{
	struct region bufs, src;
	struct dm_wc wc;
	struct pair p;

	need_backend(b->name);
	pair_open(&p, b->name);
	region_init(&bufs, p.sx, 64, 0, 11);
	region_init(&src, p.cx, 4096, 0, 12);
	cr_assert_eq(dm_xport_post_recv(p.sx, bufs.buf, 64, bufs.mr, 77), 0);
	cr_assert_eq(dm_conn_send(p.cc, 5, src.buf, 1000, src.mr, DM_WR_SIGNALED), 0);
	cr_assert_eq(wait_n(p.sc, &wc, 1), 1);
	cr_assert_eq(wc.wr_id, 77);
	cr_assert_eq(wc.opcode, DM_WC_RECV);
	cr_assert_lt(wc.status, 0, "oversized message was accepted");
	cr_assert_eq(wait_n(p.cc, &wc, 1), 1);
	cr_assert_eq(wc.wr_id, 5);
	cr_assert_lt(wc.status, 0, "oversized SEND completed successfully");
	region_fini(&src, p.cx);
	pair_close(&p);
	free(bufs.buf);
}

/* ---- errors ---- */

/* Post one READ (remote, rkey) and return its completion status; the connection is in error
 * state afterwards if it failed. */
static int read_status(const char *backend, int64_t off, uint32_t len, uint32_t key_xor,
		       int access)
{
	struct region rem, loc;
	struct dm_wc wc;
	struct pair p;
	int st;

	pair_open(&p, backend);
	region_init(&rem, p.sx, 8192, access, 13);
	region_init(&loc, p.cx, 65536, 0, 14);
	struct dm_rdma_wr wr = {
		.wr_id = 9, .local = loc.buf, .mr = loc.mr,
		.remote = (uint64_t)((intptr_t)rem.buf + off), .rkey = rem.mr->rkey ^ key_xor,
		.len = len, .flags = DM_WR_SIGNALED,
	};
	cr_assert_eq(dm_conn_read_batch(p.cc, &wr, 1), 0);
	cr_assert_eq(wait_n(p.cc, &wc, 1), 1, "no completion for a bad READ");
	cr_assert_eq(wc.wr_id, 9);
	st = wc.status;
	if (st) {
		/* RC semantics: the connection is now in error state. */
		uint64_t deadline = dm_now_ns() + WAIT_MS * 1000000ull;
		int rc;

		while ((rc = dm_conn_read_batch(p.cc, &wr, 1)) == -EAGAIN &&
		       dm_now_ns() < deadline)
			usleep(1000);
		if (rc == 0) {
			cr_assert_eq(wait_n(p.cc, &wc, 1), 1);
			cr_assert_lt(wc.status, 0, "READ after an error succeeded");
		} else {
			cr_assert_eq(rc, -ENOTCONN);
		}
	}
	region_fini(&loc, p.cx);
	region_fini(&rem, p.sx);
	pair_close(&p);
	return st;
}

/* Out of bounds is -EFAULT where the target can tell (tcp); an RNIC reports bad key and bad
 * bounds alike (remote access error), so verbs may say -EACCES. */
static void assert_oob(const char *backend, int st)
{
	if (!strcmp(backend, "tcp"))
		cr_assert_eq(st, -EFAULT, "out-of-bounds READ: %s", strerror(-st));
	else
		cr_assert(st == -EFAULT || st == -EACCES, "out-of-bounds READ: %s", strerror(-st));
}

BACKEND_PARAMS(read_errors)
ParameterizedTest(struct bk *b, xport, read_errors, .timeout = 30)
{
	need_backend(b->name);
	cr_assert_eq(read_status(b->name, 0, 8192, 0, DM_MR_REMOTE_READ), 0);
	assert_oob(b->name, read_status(b->name, 4096, 4097, 0, DM_MR_REMOTE_READ));
	assert_oob(b->name, read_status(b->name, -64, 64, 0, DM_MR_REMOTE_READ));
	cr_assert_eq(read_status(b->name, 0, 64, 0x5a00, DM_MR_REMOTE_READ), -EACCES);
	cr_assert_eq(read_status(b->name, 0, 64, 0, DM_MR_REMOTE_WRITE), -EACCES);
}

BACKEND_PARAMS(atomic_errors)
ParameterizedTest(struct bk *b, xport, atomic_errors, .timeout = 30)
{
	struct region rem, loc;
	struct dm_wc wc;
	struct pair p;

	need_backend(b->name);
	pair_open(&p, b->name);
	region_init(&rem, p.sx, 4096, DM_MR_REMOTE_READ, 15);
	region_init(&loc, p.cx, 64, 0, 16);
	/* No atomic access on this MR. */
	cr_assert_eq(dm_conn_faa(p.cc, 1, (uint64_t *)loc.buf, loc.mr, (uintptr_t)rem.buf,
				 rem.mr->rkey, 1, DM_WR_SIGNALED), 0);
	cr_assert_eq(wait_n(p.cc, &wc, 1), 1);
	cr_assert_eq(wc.status, -EACCES);
	region_fini(&loc, p.cx);
	region_fini(&rem, p.sx);
	pair_close(&p);

	pair_open(&p, b->name);
	region_init(&rem, p.sx, 4096, DM_MR_REMOTE_ATOMIC, 15);
	region_init(&loc, p.cx, 64, 0, 16);
	cr_assert_eq(dm_conn_cas(p.cc, 2, (uint64_t *)loc.buf, loc.mr, (uintptr_t)rem.buf + 4,
				 rem.mr->rkey, 0, 1, DM_WR_SIGNALED), 0);
	cr_assert_eq(wait_n(p.cc, &wc, 1), 1);
	cr_assert_lt(wc.status, 0, "misaligned CAS succeeded");
	region_fini(&loc, p.cx);
	region_fini(&rem, p.sx);
	pair_close(&p);
}

/* ---- peer death ---- */

#define PEER_ENV "DMANN_TEST_XPORT_PEER"

/* In the re-executed child: serve memory to one peer until killed. Runs before Criterion's
 * main, from a constructor, when PEER_ENV names the backend. */
__attribute__((constructor)) static void peer_main(void)
{
	const char *backend = getenv(PEER_ENV);
	struct dm_xport_params prm = {
		.cluster = CLUSTER, .secret = (const uint8_t *)SECRET, .secret_len = strlen(SECRET),
	};
	struct dm_listener *l;
	struct dm_conn *c;
	struct dm_xport *x;
	struct dm_mr *mr;
	char addr[128];
	void *mem;

	if (!backend)
		return;
	prm.backend = backend;
	x = dm_xport_open(&prm);
	mem = calloc(1, 1 << 20);
	snprintf(addr, sizeof(addr), "%s:0", test_host());
	if (!x || !mem || dm_xport_reg(x, mem, 1 << 20, DM_MR_REMOTE_ALL, &mr) ||
	    dm_xport_listen(x, addr, &l))
		_exit(2);
	printf("%d %lu %u\n", dm_listener_port(l), (unsigned long)(uintptr_t)mem, mr->rkey);
	fflush(stdout);
	if (dm_listener_accept(l, WAIT_MS, &c))
		_exit(3);
	for (;;)
		pause();
}

BACKEND_PARAMS(peer_killed)
ParameterizedTest(struct bk *b, xport, peer_killed, .timeout = 30)
{
	enum { DEPTH = 32, LEN = 4096 };
	struct dm_wc wc[DEPTH];
	struct dm_xport *x;
	struct dm_conn *c;
	struct region loc;
	char addr[128];
	unsigned long remote;
	unsigned rkey;
	int pfd[2], port, outstanding = 0, errors = 0, ok = 0, rc = 0;
	uint64_t posted = 0, deadline;
	pid_t pid;
	FILE *f;

	need_backend(b->name);
	/* The environment for the child is built before fork: between fork and exec only
	 * async-signal-safe calls (Criterion's runner has threads). */
	size_t ne = 0;
	while (environ[ne])
		ne++;
	char **envp = calloc(ne + 2, sizeof(*envp));
	char peer_env[64];
	cr_assert(envp);
	snprintf(peer_env, sizeof(peer_env), "%s=%s", PEER_ENV, b->name);
	envp[0] = peer_env;
	memcpy(envp + 1, environ, ne * sizeof(*envp));
	cr_assert_eq(pipe(pfd), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		dup2(pfd[1], 1);
		close(pfd[0]);
		execle("/proc/self/exe", "test_xport_peer", (char *)NULL, envp);
		_exit(127);
	}
	free(envp);
	close(pfd[1]);
	f = fdopen(pfd[0], "r");
	cr_assert(f);
	cr_assert_eq(fscanf(f, "%d %lu %u", &port, &remote, &rkey), 3, "peer did not start");
	fclose(f);

	x = open_x(b->name, CLUSTER, SECRET);
	region_init(&loc, x, (size_t)DEPTH * LEN, 0, 17);
	snprintf(addr, sizeof(addr), "%s:%d", test_host(), port);
	cr_assert_eq(dm_xport_connect(x, addr, WAIT_MS, &c), 0);

	/* Keep DEPTH READs in flight; kill the peer after some have completed. */
	deadline = dm_now_ns() + 20000ull * 1000000ull;
	while (dm_now_ns() < deadline) {
		rc = 0;
		while (outstanding < DEPTH) {
			struct dm_rdma_wr wr = {
				.wr_id = posted, .local = loc.buf + (posted % DEPTH) * LEN,
				.mr = loc.mr, .remote = remote + (posted % 256) * LEN, .rkey = rkey,
				.len = LEN, .flags = DM_WR_SIGNALED,
			};

			rc = dm_conn_read_batch(c, &wr, 1);
			if (rc)
				break;
			posted++;
			outstanding++;
		}
		if (rc == -ENOTCONN && outstanding == 0)
			break;
		cr_assert(rc == 0 || rc == -EAGAIN || rc == -ENOTCONN, "post: %s", strerror(-rc));
		int k = dm_conn_wait(c, wc, DEPTH, 100);

		if (k == -ENOTCONN && outstanding == 0)
			break;
		cr_assert_geq(k, 0, "wait: %s", strerror(-k));
		for (int i = 0; i < k; i++) {
			outstanding--;
			if (wc[i].status == 0) {
				ok++;
			} else {
				cr_assert(wc[i].status == -ECONNRESET || wc[i].status == -ECANCELED,
					  "unexpected status %s", strerror(-wc[i].status));
				errors++;
			}
		}
		if (ok >= 500 && pid > 0) {
			/* Freeze the peer so that the reads in flight cannot be served, then kill
			 * it: they must complete with errors. */
			kill(pid, SIGSTOP);
			waitpid(pid, NULL, WUNTRACED);
			for (; outstanding < DEPTH; outstanding++, posted++) {
				struct dm_rdma_wr wr = {
					.wr_id = posted, .local = loc.buf + (posted % DEPTH) * LEN,
					.mr = loc.mr, .remote = remote, .rkey = rkey, .len = LEN,
					.flags = DM_WR_SIGNALED,
				};

				cr_assert_eq(dm_conn_read_batch(c, &wr, 1), 0);
			}
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			pid = 0;
		}
	}
	cr_assert_eq(pid, 0, "peer was not killed (only %d reads completed)", ok);
	cr_assert_eq(outstanding, 0, "%d reads never completed", outstanding);
	cr_assert_gt(errors, 0, "no error completion after the peer died");
	struct dm_rdma_wr wr = { .wr_id = 1, .local = loc.buf, .mr = loc.mr, .remote = remote,
				 .rkey = rkey, .len = LEN, .flags = DM_WR_SIGNALED };
	cr_assert_eq(dm_conn_read_batch(c, &wr, 1), -ENOTCONN);
	dm_conn_close(c);
	region_fini(&loc, x);
	dm_xport_close(x);
}

/* ---- wire format and handshake on buffers (backend-independent) ---- */

#include "handshake.h"

static struct dm_xport fake_ctx(const char *cluster, const char *secret)
{
	struct dm_xport x = { 0 };

	snprintf(x.cluster, sizeof(x.cluster), "%s", cluster);
	x.secret_len = strlen(secret);
	memcpy(x.secret, secret, x.secret_len);
	return x;
}

Test(wire, header_roundtrip_and_rejects)
{
	uint8_t b[DM_WIRE_HDR_LEN];
	struct dm_wire_hdr h;

	dm_wire_hdr_encode(b, DM_OP_READ_RESP, 4096 + DM_WIRE_HDR_LEN, -EFAULT, 0x0102030405060708ull);
	cr_assert_eq(b[0], 'D');   /* little-endian magic spells DMAN */
	cr_assert_eq(b[3], 'N');
	cr_assert_eq(dm_wire_hdr_decode(b, sizeof(b), &h), 0);
	cr_assert_eq(h.op, DM_OP_READ_RESP);
	cr_assert_eq(h.status, -EFAULT);
	cr_assert_eq(h.req_id, 0x0102030405060708ull);
	cr_assert_eq(b[16], 0x08, "req_id is little-endian");
	cr_assert_eq(dm_wire_check_len(&h), -EBADMSG, "error READ_RESP carries no data");
	cr_assert_eq(dm_wire_hdr_decode(b, sizeof(b) - 1, &h), -EBADMSG);
	b[4] = DM_WIRE_VERSION + 1;
	cr_assert_eq(dm_wire_hdr_decode(b, sizeof(b), &h), -EPROTO);
	b[4] = DM_WIRE_VERSION;
	b[0] ^= 1;
	cr_assert_eq(dm_wire_hdr_decode(b, sizeof(b), &h), -EBADMSG);
	b[0] ^= 1;
	dm_put_le32(b + 8, 10);    /* length shorter than a header */
	cr_assert_eq(dm_wire_hdr_decode(b, sizeof(b), &h), -EBADMSG);
}

/* Drive both sides of a handshake in memory; returns the client's final result and puts
 * the server's in *srv. tamper: flip a bit of the n-th message (1-based) on the way. */
static int hs_pair(struct dm_xport *cx, struct dm_xport *sx, int tamper, int *srv)
{
	struct dm_hs c, s;
	uint8_t a[DM_HS_MAX_MSG], b[DM_HS_MAX_MSG];
	size_t alen, blen;
	int rc, n = 0;

	cr_assert_eq(dm_hs_init(&c, cx, DM_HS_CLIENT, "server"), 0);
	cr_assert_eq(dm_hs_init(&s, sx, DM_HS_SERVER, "client"), 0);
	*srv = 0;
	rc = dm_hs_step(&c, NULL, 0, a, &alen);
	while (rc == 0) {
		if (++n == tamper)
			a[alen - 1] ^= 0x40;               /* AUTH ends with its proof */
		*srv = dm_hs_step(&s, a, alen, b, &blen);
		if (blen == 0)
			break;
		if (++n == tamper)
			b[DM_WIRE_HDR_LEN + 40] ^= 0x40;   /* inside REPLY's proof */
		rc = dm_hs_step(&c, b, blen, a, &alen);
		if (rc != 0 && alen) {   /* client refuses: the server hears why */
			*srv = dm_hs_step(&s, a, alen, b, &blen);
			break;
		}
		if (*srv != 0)
			break;
	}
	dm_hs_clear(&c);
	dm_hs_clear(&s);
	return rc;
}

Test(wire, handshake_buffers)
{
	struct dm_xport a = fake_ctx("c1", "secret"), b = fake_ctx("c1", "secret");
	struct dm_xport wrong = fake_ctx("c1", "Secret"), other = fake_ctx("c2", "secret");
	int srv;

	cr_assert_eq(hs_pair(&a, &b, 0, &srv), 1);
	cr_assert_eq(srv, 1);
	cr_assert_eq(hs_pair(&a, &wrong, 0, &srv), -EACCES);   /* server cannot prove */
	cr_assert_eq(srv, -EACCES);
	cr_assert_eq(hs_pair(&a, &other, 0, &srv), -EPERM);
	cr_assert_eq(srv, -EPERM);
	/* A flipped bit in the server's proof or the client's proof is caught. */
	cr_assert_eq(hs_pair(&a, &b, 2, &srv), -EACCES);
	cr_assert_lt(hs_pair(&a, &b, 3, &srv), 0);
	cr_assert_eq(srv, -EACCES);
}

Test(wire, handshake_version_mismatch)
{
	struct dm_xport x = fake_ctx("c1", "secret");
	uint8_t a[DM_HS_MAX_MSG], b[DM_HS_MAX_MSG];
	size_t alen, blen;
	struct dm_hs c, s;

	cr_assert_eq(dm_hs_init(&c, &x, DM_HS_CLIENT, "server"), 0);
	cr_assert_eq(dm_hs_init(&s, &x, DM_HS_SERVER, "client"), 0);
	cr_assert_eq(dm_hs_step(&c, NULL, 0, a, &alen), 0);
	a[4] = DM_WIRE_VERSION + 1;   /* a peer from the future */
	cr_assert_eq(dm_hs_step(&s, a, alen, b, &blen), -EPROTONOSUPPORT);
	cr_assert_gt(blen, 0, "the peer is told why");
	cr_assert_eq(dm_hs_step(&c, b, blen, a, &alen), -EPROTONOSUPPORT);
}
