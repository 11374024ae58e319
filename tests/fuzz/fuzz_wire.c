/* fuzz_wire.c: libFuzzer target for the wire decoders (wire.h) and the handshake state
 * machine (handshake.h). The first input byte picks what to feed:
 *   0: a stream of messages framed by their headers, each checked and its body decoded;
 *   1: a server-side handshake fed the messages in turn;
 *   2: a client-side handshake fed the messages after its HELLO;
 *      (control messages through dm_wire_ctl_check and their decoders, CTL_GEN_LIST's
 *      variable-length answer among them; C_CALL, the native client data op, through
 *      dm_wire_c_check; the native query
 *      protocol Q_SEARCH..Q_INSERT through dm_wire_q_check, Q_ROUTER's owner table);
 *   3: an S3 flat-index RPC payload (wire.h, FL section; the second byte picks which one)
 *      read with the dm_rbuf reader along its grammar, as mn_flat.c / cn_s3.c read them.
 * Decoders must reject bad input with -errno and never read outside the buffer (ASan). */
#include "wire.h"
#include "handshake.h"

#include <string.h>

static struct dm_xport fake_x = { .cluster = "fuzz-cluster", .secret = "fuzz-secret",
				  .creds = { { .name = "fuzz", .secret = "fuzz-client-key!", .secret_len = 16 } },
				  .n_creds = 1,
				  .secret_len = 11 };

/* Decode one message's body according to its op. */
static void decode_body(const struct dm_wire_hdr *h, const uint8_t *body, size_t len)
{
	union {
		struct dm_wire_hs_hello hello;
		struct dm_wire_hs_hello_client hc;
		struct dm_wire_hs_reply reply;
		struct dm_wire_hs_auth auth;
		struct dm_wire_rw_req rw;
		struct dm_wire_cas_req cas;
		struct dm_wire_faa_req faa;
		struct dm_wire_atomic_resp at;
		struct dm_wire_ctl_info info;
		struct dm_wire_ctl_obj obj;
		struct dm_wire_ctl_gen gen;
		struct dm_wire_ctl_gen_state gst;
		struct dm_wire_ctl_atomic atomic;
		struct dm_wire_ctl_gen_list gl;
	} m;
	uint8_t out[DM_MAX(256, DM_WIRE_CTL_GEN_LIST_MAX)];

	switch (h->op) {
	case DM_OP_HS_HELLO:
		if (!dm_wire_hs_hello_decode(body, len, &m.hello)) {
			dm_wire_hs_hello_encode(out, &m.hello);
			if (memcmp(out, body, sizeof(m.hello)))
				__builtin_trap();   /* decode/encode must round-trip */
		}
		break;
	case DM_OP_HS_HELLO_CLIENT:
		if (!dm_wire_hs_hello_client_decode(body, len, &m.hc)) {
			dm_wire_hs_hello_client_encode(out, &m.hc);
			if (memcmp(out, body, sizeof(m.hc)))
				__builtin_trap();
		}
		break;
	case DM_OP_HS_REPLY:
		if (!dm_wire_hs_reply_decode(body, len, &m.reply)) {
			dm_wire_hs_reply_encode(out, &m.reply);
			if (memcmp(out, body, sizeof(m.reply)))
				__builtin_trap();
		}
		break;
	case DM_OP_HS_AUTH:
		(void)dm_wire_hs_auth_decode(body, len, &m.auth);
		break;
	case DM_OP_READ_REQ:
	case DM_OP_WRITE_REQ:
		if (!dm_wire_rw_req_decode(body, len, &m.rw)) {
			dm_wire_rw_req_encode(out, &m.rw);
			if (memcmp(out, body, sizeof(m.rw)))
				__builtin_trap();
		}
		break;
	case DM_OP_CAS_REQ:
		(void)dm_wire_cas_req_decode(body, len, &m.cas);
		break;
	case DM_OP_FAA_REQ:
		(void)dm_wire_faa_req_decode(body, len, &m.faa);
		break;
	case DM_OP_CAS_RESP:
	case DM_OP_FAA_RESP:
		(void)dm_wire_atomic_resp_decode(body, len, &m.at);
		break;
	case DM_OP_CTL_INFO + 1:
		(void)dm_wire_ctl_info_decode(body, len, &m.info);
		break;
	case DM_OP_CTL_GEN_PUBLISH:
	case DM_OP_CTL_GEN_REPORT:
	case DM_OP_CTL_GEN_DROP:
		if (!dm_wire_ctl_gen_decode(body, len, &m.gen)) {
			dm_wire_ctl_gen_encode(out, &m.gen);
			if (memcmp(out, body, sizeof(m.gen)))
				__builtin_trap();
		}
		break;
	case DM_OP_CTL_GEN_PUBLISH + 1:
	case DM_OP_CTL_GEN_REPORT + 1:
	case DM_OP_CTL_GEN_DROP + 1:
		if (!dm_wire_ctl_gen_state_decode(body, len, &m.gst)) {
			dm_wire_ctl_gen_state_encode(out, &m.gst);
			if (memcmp(out, body, sizeof(m.gst)))
				__builtin_trap();
		}
		break;
	case DM_OP_CTL_GEN_LIST + 1:
		if (!dm_wire_ctl_gen_list_decode(body, len, &m.gl)) {
			/* an accepted list is exactly as long as its entries, and round-trips */
			if (m.gl.count > DM_MAX_GRAPHS ||
			    dm_wire_ctl_gen_list_encode(out, &m.gl) != len || memcmp(out, body, len))
				__builtin_trap();
		}
		break;
	case DM_OP_CTL_ATOMIC:
	case DM_OP_CTL_ATOMIC + 1:
		if (!dm_wire_ctl_atomic_decode(body, len, &m.atomic)) {
			dm_wire_ctl_atomic_encode(out, &m.atomic);
			if (memcmp(out, body, sizeof(m.atomic)))
				__builtin_trap();   /* decode/encode must round-trip */
		}
		break;
	default:
		if (h->op >= DM_OP_CTL_FIRST && h->op <= DM_OP_CTL_LAST)
			(void)dm_wire_ctl_obj_decode(body, len, &m.obj);
		break;
	}
}

/* Walk data as a sequence of header-framed messages; call fn on each whole one. */
static void for_each_msg(const uint8_t *data, size_t size,
			 int (*fn)(void *, const uint8_t *, size_t), void *arg)
{
	while (size >= DM_WIRE_HDR_LEN) {
		struct dm_wire_hdr h;
		size_t take;

		if (dm_wire_hdr_decode(data, size, &h)) {
			/* Still let the consumer see a malformed header once. */
			fn(arg, data, DM_MIN(size, (size_t)DM_HS_MAX_MSG));
			return;
		}
		take = DM_MIN((size_t)h.length, size);
		if (fn(arg, data, take))
			return;
		data += take;
		size -= take;
	}
}

/* Read an FL payload (kind: 0-2 the requests CALL/STATE/FRAG, 3-5 their responses) along
 * its grammar; every read is bounds-checked, so only `bad` may result. */
static void fl_payload(unsigned kind, const uint8_t *p, size_t n)
{
	struct dm_rbuf r = { .p = p, .n = n };
	char name[1025];
	uint32_t len, rows, nfrag;

	switch (kind % 6) {
	case 0:
		dm_rbuf_str(&r, name, 64);
		(void)dm_rbuf_bytes(&r, &len, DM_FL_MAX_STREAM);
		break;
	case 1:
		dm_rbuf_str(&r, name, 64);
		dm_rbuf_str(&r, name, 64);
		break;
	case 2:
		dm_rbuf_str(&r, name, 64);
		dm_rbuf_str(&r, name, 64);
		(void)dm_rbuf_u64(&r);
		(void)dm_rbuf_u64(&r);
		(void)dm_rbuf_u64(&r);
		(void)dm_rbuf_u32(&r);
		(void)dm_rbuf_u32(&r);
		break;
	case 3:
		(void)dm_rbuf_u16(&r);
		dm_rbuf_str(&r, name, 64);
		(void)dm_rbuf_bytes(&r, &len, DM_FL_MAX_STREAM);
		break;
	case 4:
		(void)dm_rbuf_u64(&r);
		(void)dm_rbuf_u64(&r);
		(void)dm_rbuf_u32(&r);
		(void)dm_rbuf_u32(&r);
		(void)dm_rbuf_bytes(&r, &len, 1u << 20);
		(void)dm_rbuf_u32(&r);
		nfrag = dm_rbuf_u32(&r);
		for (uint32_t i = 0; i < nfrag && !r.bad; i++) {
			(void)dm_rbuf_u32(&r);
			(void)dm_rbuf_u32(&r);
		}
		break;
	case 5:
		rows = dm_rbuf_u32(&r);
		(void)dm_rbuf_get(&r, rows);
		while (!r.bad && r.at < r.n) {
			dm_rbuf_str(&r, name, sizeof(name));
			(void)dm_rbuf_bytes(&r, &len, DM_FL_MAX_STREAM);
			(void)dm_rbuf_bytes(&r, &len, DM_FL_MAX_STREAM);
			(void)dm_rbuf_get(&r, 4 * 4);
		}
		break;
	}
	if (r.at > r.n)
		__builtin_trap();   /* the reader went past the end */
}

static int check_one(void *arg, const uint8_t *msg, size_t len)
{
	struct dm_wire_hdr h;
	int body;

	(void)arg;
	if (dm_wire_hdr_decode(msg, len, &h))
		return 1;
	if (h.length != len)
		return 1;
	if (h.op >= DM_OP_FL_FIRST && h.op <= DM_OP_FL_LAST) {
		struct dm_wire_fl_chunk c;

		if (!dm_wire_fl_check(&h, msg, len)) {
			dm_wire_fl_chunk_decode(msg + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &c);
			if (c.off > c.total || len - DM_WIRE_HDR_LEN - sizeof(c) > c.total - c.off)
				__builtin_trap();   /* fl_check accepted a chunk past its stream */
			fl_payload((unsigned)(h.op - DM_OP_FL_FIRST) / 2 + (h.op & 1) * 3,
				   msg + DM_WIRE_HDR_LEN + sizeof(c), len - DM_WIRE_HDR_LEN - sizeof(c));
		}
		return 0;
	}
	if ((h.op & ~1u) >= DM_OP_Q_SEARCH && (h.op & ~1u) <= DM_OP_Q_ROUTER) {
		/* the native query protocol: an accepted message's counts match its length */
		if (!dm_wire_q_check(&h, msg, len) && h.op == DM_OP_Q_INSERT) {
			struct dm_wire_q_insert qi;

			if (dm_wire_q_insert_decode(msg + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN,
						    &qi) ||
			    len != DM_WIRE_HDR_LEN + sizeof(qi) + 4ull * qi.n * qi.dim)
				__builtin_trap();
		}
		if (!dm_wire_q_check(&h, msg, len) && h.op == DM_OP_Q_ROUTER + 1 && !h.status) {
			/* an accepted Q_ROUTER answer has room for its owner table, each < ncn */
			struct dm_wire_q_router qr;
			uint32_t own[DM_MAX_NODES_WIRE];
			const uint8_t *b = msg + DM_WIRE_HDR_LEN;
			size_t bl = len - DM_WIRE_HDR_LEN;

			if (dm_wire_q_router_decode(b, bl, &qr))
				__builtin_trap();
			if (!dm_wire_q_router_owners(b, bl, &qr, own))
				for (uint32_t p = 0; p < qr.ncn; p++)
					if (own[p] >= qr.ncn)
						__builtin_trap();
		}
		return 0;
	}
	if (h.op >= DM_OP_C_FIRST && h.op <= DM_OP_C_LAST) {
		struct dm_wire_c_call cm;
		const uint8_t *json;

		if (!dm_wire_c_check(&h, msg, len, &cm, &json) &&
		    (json + cm.json_len != msg + len || (!(h.op & 1) && !dm_c_op_name(cm.op))))
			__builtin_trap();   /* c_check accepted a length or op it should not */
		return 0;
	}
	if (h.op >= DM_OP_CTL_FIRST && h.op <= DM_OP_CTL_LAST) {
		if (!dm_wire_ctl_check(&h, len))
			decode_body(&h, msg + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN);
		return 0;
	}
	if (dm_wire_check_len(&h))
		return 0;
	body = dm_wire_body_len(h.op, h.status);
	if (body < 0 || (size_t)body > len - DM_WIRE_HDR_LEN)
		__builtin_trap();   /* check_len accepted a message shorter than its body */
	decode_body(&h, msg + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN);
	return 0;
}

static int hs_one(void *arg, const uint8_t *msg, size_t len)
{
	struct dm_hs *hs = arg;
	uint8_t out[DM_HS_MAX_MSG];
	size_t outlen = 0;
	int rc = dm_hs_step(hs, msg, len, out, &outlen);

	if (outlen > sizeof(out))
		__builtin_trap();
	return rc != 0;   /* stop when done or failed */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool quiet;
	struct dm_hs hs;
	uint8_t out[DM_HS_MAX_MSG];
	size_t outlen;

	if (!quiet) {
		dm_log_set_level(DM_LOG_ERROR);
		quiet = true;
	}
	if (size < 1)
		return 0;
	switch (data[0] % 4) {
	case 0:
		for_each_msg(data + 1, size - 1, check_one, NULL);
		break;
	case 1:
		if (!dm_hs_init(&hs, &fake_x, DM_HS_SERVER, "fuzz"))
			for_each_msg(data + 1, size - 1, hs_one, &hs);
		break;
	case 2:
		if (!dm_hs_init(&hs, &fake_x, DM_HS_CLIENT, "fuzz") &&
		    dm_hs_step(&hs, NULL, 0, out, &outlen) == 0)
			for_each_msg(data + 1, size - 1, hs_one, &hs);
		break;
	case 3:
		if (size >= 2)
			fl_payload(data[1], data + 2, size - 2);
		break;
	}
	return 0;
}
