/* fuzz_tcp.c: libFuzzer target for the tcp backend's stream parser: the bytes a peer sends
 * after the handshake (requests it wants served against our MRs, responses to our own
 * requests, SENDs into the receive pool). Each input is written into one end of a socketpair
 * whose other end is a tcp connection with a few requests of ours outstanding; the peer end
 * is then closed, and the connection must end in error state with every op completed (the
 * wait is bounded: a hang aborts). ASan checks every access the target makes. */
#include "tcp/tcp.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static struct dm_xport *x;
static uint8_t *region, *local, *rbufs;
static struct dm_mr *mr, *lmr, *rmr;

static void setup(void)
{
	struct dm_xport_params p = { .backend = "tcp", .cluster = "fuzz",
				     .secret = (const uint8_t *)"s", .secret_len = 1,
				     .max_recv_wr = 16 };

	dm_log_set_level(DM_LOG_ERROR);
	x = dm_xport_open(&p);
	/* At a fixed address if possible (a hint), so that the fuzzer can learn it and the rkey. */
	region = mmap((void *)0x600000000000ul, 65536, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED)
		abort();
	local = aligned_alloc(4096, 65536);
	rbufs = aligned_alloc(4096, 16 * 256);
	if (!x || !region || !local || !rbufs ||
	    dm_xport_reg(x, region, 65536, DM_MR_REMOTE_ALL, &mr) ||
	    dm_xport_reg(x, local, 65536, 0, &lmr) || dm_xport_reg(x, rbufs, 16 * 256, 0, &rmr))
		abort();
	memset(region, 0, 65536);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tcp_xport *tx;
	struct tcp_conn *c;
	struct dm_wc wc[32];
	uint64_t deadline;
	int sv[2], rc;

	if (!x)
		setup();
	tx = container_of(x, struct tcp_xport, base);
	for (int i = 0; i < 16; i++)
		if (dm_xport_post_recv(x, rbufs + i * 256, 256, rmr, (uint64_t)i))
			break;   /* pool full */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv))
		abort();
	c = tcp_conn_new(tx, sv[0], "fuzz", NULL);
	if (!c)
		abort();
	pthread_mutex_lock(&tx->lock);
	c->next = tx->conns;
	if (tx->conns)
		tx->conns->prev = c;
	tx->conns = c;
	pthread_mutex_unlock(&tx->lock);

	/* Our requests outstanding: ids 0-1 READ, 2 WRITE, 3 CAS, 4 FAA, 5 SEND. */
	struct dm_rdma_wr wr[2] = {
		{ .wr_id = 0, .local = local, .mr = lmr, .remote = 0x1000, .rkey = 1, .len = 64,
		  .flags = DM_WR_SIGNALED },
		{ .wr_id = 1, .local = local + 64, .mr = lmr, .remote = 0x2000, .rkey = 1,
		  .len = 8, .flags = 0 },
	};
	struct dm_rdma_wr w = { .wr_id = 2, .local = local + 128, .mr = lmr, .remote = 0x3000,
				.rkey = 1, .len = 16, .flags = DM_WR_SIGNALED };
	if (dm_conn_read_batch(&c->base, wr, 2) || dm_conn_write_batch(&c->base, &w, 1) ||
	    dm_conn_cas(&c->base, 3, (uint64_t *)(local + 256), lmr, 0x4000, 1, 0, 1,
			DM_WR_SIGNALED) ||
	    dm_conn_faa(&c->base, 4, (uint64_t *)(local + 264), lmr, 0x4000, 1, 1, 0) ||
	    dm_conn_send(&c->base, 5, "hello", 5, NULL, DM_WR_INLINE | DM_WR_SIGNALED))
		abort();

	/* The peer: its bytes, then gone. */
	if (size && write(sv[1], data, size) < 0)
		abort();
	close(sv[1]);

	deadline = dm_now_ns() + 10000000000ull;
	while ((rc = dm_conn_wait(&c->base, wc, 32, 1000)) != -ENOTCONN) {
		if (rc < 0 || dm_now_ns() > deadline)
			abort();   /* a connection whose peer is gone must fail, not hang */
	}
	dm_conn_close(&c->base);
	return 0;
}
