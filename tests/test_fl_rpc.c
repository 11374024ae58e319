/* test_fl_rpc.c: the S3 flat-index RPC plumbing (wire.h FL section, fl_rpc.h): chunk
 * checks, the bounds-checked payload reader, and request/response streams of several
 * messages over the tcp transport (a payload far larger than one receive buffer, an empty
 * one, an error status), as mn_flat.c and cn_s3.c use them. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_rpc.h"
#include "wire.h"
#include "xport/xport.h"

#define SECRET "fl-test-secret"
#define CLUSTER "fl-test"

Test(fl_wire, chunk_check)
{
	uint8_t m[64];
	struct dm_wire_hdr h;
	struct dm_wire_fl_chunk c = { .total = 10, .off = 4 };

	dm_wire_hdr_encode(m, DM_OP_FL_STATE, DM_WIRE_HDR_LEN + 8 + 6, 0, 7);
	dm_wire_fl_chunk_encode(m + DM_WIRE_HDR_LEN, &c);
	cr_assert_eq(dm_wire_hdr_decode(m, DM_WIRE_HDR_LEN + 14, &h), 0);
	cr_assert_eq(dm_wire_fl_check(&h, m, DM_WIRE_HDR_LEN + 14), 0);
	/* 7 bytes at offset 4 overrun a 10-byte stream */
	dm_wire_hdr_encode(m, DM_OP_FL_STATE, DM_WIRE_HDR_LEN + 8 + 7, 0, 7);
	dm_wire_hdr_decode(m, DM_WIRE_HDR_LEN + 15, &h);
	cr_assert_eq(dm_wire_fl_check(&h, m, DM_WIRE_HDR_LEN + 15), -EBADMSG);
	/* an empty message in a non-empty stream makes no progress */
	dm_wire_hdr_encode(m, DM_OP_FL_STATE, DM_WIRE_HDR_LEN + 8, 0, 7);
	dm_wire_hdr_decode(m, DM_WIRE_HDR_LEN + 8, &h);
	cr_assert_eq(dm_wire_fl_check(&h, m, DM_WIRE_HDR_LEN + 8), -EBADMSG);
	/* a request with a status, a length mismatch, a foreign op */
	dm_wire_hdr_encode(m, DM_OP_FL_STATE, DM_WIRE_HDR_LEN + 14, -5, 7);
	dm_wire_hdr_decode(m, DM_WIRE_HDR_LEN + 14, &h);
	cr_assert_eq(dm_wire_fl_check(&h, m, DM_WIRE_HDR_LEN + 14), -EBADMSG);
	dm_wire_hdr_encode(m, DM_OP_FL_STATE + 1, DM_WIRE_HDR_LEN + 14, -5, 7);
	dm_wire_hdr_decode(m, DM_WIRE_HDR_LEN + 14, &h);
	cr_assert_eq(dm_wire_fl_check(&h, m, DM_WIRE_HDR_LEN + 14), 0);
	cr_assert_eq(dm_wire_fl_check(&h, m, DM_WIRE_HDR_LEN + 13), -EBADMSG);
	h.op = DM_OP_CTL_INFO;
	cr_assert_eq(dm_wire_fl_check(&h, m, DM_WIRE_HDR_LEN + 14), -EPROTO);
	c.total = DM_FL_MAX_STREAM + 1;
	c.off = 0;
	dm_wire_fl_chunk_encode(m + DM_WIRE_HDR_LEN, &c);
	dm_wire_hdr_encode(m, DM_OP_FL_CALL, DM_WIRE_HDR_LEN + 14, 0, 7);
	dm_wire_hdr_decode(m, DM_WIRE_HDR_LEN + 14, &h);
	cr_assert_eq(dm_wire_fl_check(&h, m, DM_WIRE_HDR_LEN + 14), -EBADMSG);
}

Test(fl_wire, reader_bounds)
{
	struct dm_buf w = { 0 };
	char s[8];
	uint32_t n;

	dm_buf_str(&w, "bucket");
	dm_buf_u64(&w, 0x1122334455667788ull);
	dm_buf_bytes(&w, "xyz", 3);
	dm_buf_u32(&w, 1000);            /* a length that runs past the end */
	cr_assert(!w.oom);
	struct dm_rbuf r = { .p = w.p, .n = w.n };

	cr_assert(dm_rbuf_str(&r, s, sizeof(s)));
	cr_assert_str_eq(s, "bucket");
	cr_assert_eq(dm_rbuf_u64(&r), 0x1122334455667788ull);
	cr_assert_eq(memcmp(dm_rbuf_bytes(&r, &n, 16), "xyz", 3), 0);
	cr_assert_eq(n, 3);
	cr_assert_null(dm_rbuf_bytes(&r, &n, 1u << 20));
	cr_assert(r.bad);
	cr_assert_eq(dm_rbuf_u32(&r), 0);   /* stays failed */
	cr_assert_leq(r.at, r.n);

	struct dm_rbuf r2 = { .p = w.p, .n = w.n };

	cr_assert(!dm_rbuf_str(&r2, s, 4));   /* "bucket" does not fit in 3 chars */
	cr_assert(r2.bad);
	free(w.p);
}

/* ---- streams over tcp ---- */

struct srv {
	struct dm_xport *x;
	struct dm_listener *l;
	struct dm_msgpool *pool;
	int served;
};

/* Echo server: answers each FL stream with its payload reversed; FL_FRAG gets -ESTALE. */
static void *srv_main(void *arg)
{
	struct srv *s = arg;
	struct dm_conn *c;
	struct dm_rpc_chan ch;

	if (dm_listener_accept(s->l, 5000, &c))
		return NULL;
	cr_assert_eq(dm_rpc_chan_init(&ch, c, s->pool, 4096, 5000), 0);
	for (;;) {
		struct dm_wire_hdr h;
		uint8_t *buf, *pay;
		uint32_t len;
		uint64_t wr;
		size_t n;

		if (dm_rpc_recv(&ch, 2000, &buf, &len, &wr) != 1)
			break;
		cr_assert_eq(dm_wire_hdr_decode(buf, len, &h), 0);
		cr_assert_eq(dm_wire_fl_check(&h, buf, len), 0);
		cr_assert_eq(dm_fl_recv_rest(&ch, &h, buf, len, wr, 2000, &pay, &n), 0);
		for (size_t i = 0; i < n / 2; i++) {
			uint8_t t = pay[i];

			pay[i] = pay[n - 1 - i];
			pay[n - 1 - i] = t;
		}
		if (h.op == DM_OP_FL_FRAG)
			cr_assert_eq(dm_fl_send(&ch, h.op + 1, h.req_id, -ESTALE, NULL, 0, 4096), 0);
		else
			cr_assert_eq(dm_fl_send(&ch, h.op + 1, h.req_id, 0, pay, n, 4096), 0);
		free(pay);
		s->served++;
	}
	dm_rpc_chan_fini(&ch);
	dm_conn_close(c);
	return NULL;
}

static struct dm_xport *open_tcp(void)
{
	struct dm_xport_params p = { .backend = "tcp", .cluster = CLUSTER,
				     .secret = (const uint8_t *)SECRET,
				     .secret_len = strlen(SECRET) };
	struct dm_xport *x = dm_xport_open(&p);

	cr_assert(x);
	return x;
}

Test(fl_rpc, streams_over_tcp)
{
	struct srv s = { 0 };
	struct dm_xport *cx;
	struct dm_msgpool *cpool;
	struct dm_conn *c;
	struct dm_rpc_chan ch;
	pthread_t t;
	char addr[64];
	size_t big = 300000, n;
	uint8_t *payload = malloc(big), *resp;

	s.x = open_tcp();
	s.pool = dm_msgpool_new(s.x, 64, 4096);
	cr_assert(s.pool);
	cr_assert_eq(dm_xport_listen(s.x, "127.0.0.1:0", &s.l), 0);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", dm_listener_port(s.l));
	cr_assert_eq(pthread_create(&t, NULL, srv_main, &s), 0);
	cx = open_tcp();
	cpool = dm_msgpool_new(cx, 64, 65536);
	cr_assert(cpool);
	cr_assert_eq(dm_xport_connect(cx, addr, 5000, &c), 0);
	cr_assert_eq(dm_rpc_chan_init(&ch, c, cpool, 4096, 5000), 0);

	for (size_t i = 0; i < big; i++)
		payload[i] = (uint8_t)(i * 7 + 3);
	/* ~75 messages each way through 4 KiB buffers */
	cr_assert_eq(dm_fl_call(&ch, DM_OP_FL_CALL, payload, big, 4096, 5000, &resp, &n), 0);
	cr_assert_eq(n, big);
	for (size_t i = 0; i < big; i++)
		cr_assert_eq(resp[i], payload[big - 1 - i], "byte %zu", i);
	free(resp);
	/* empty payload */
	cr_assert_eq(dm_fl_call(&ch, DM_OP_FL_STATE, NULL, 0, 4096, 5000, &resp, &n), 0);
	cr_assert_eq(n, 0);
	cr_assert_null(resp);
	/* an error status with no payload */
	cr_assert_eq(dm_fl_call(&ch, DM_OP_FL_FRAG, payload, 5000, 4096, 5000, &resp, &n), -ESTALE);
	cr_assert_null(resp);
	/* the channel is still in step after all that */
	cr_assert_eq(dm_fl_call(&ch, DM_OP_FL_CALL, "abc", 3, 4096, 5000, &resp, &n), 0);
	cr_assert_eq(n, 3);
	cr_assert_eq(memcmp(resp, "cba", 3), 0);
	free(resp);

	dm_rpc_chan_fini(&ch);
	dm_conn_close(c);
	pthread_join(t, NULL);
	cr_assert_eq(s.served, 4);
	dm_msgpool_free(cpool);
	dm_xport_close(cx);
	dm_listener_close(s.l);
	dm_msgpool_free(s.pool);
	dm_xport_close(s.x);
	free(payload);
}
