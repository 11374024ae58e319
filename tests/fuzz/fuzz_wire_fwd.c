/* fuzz_wire_fwd.c: libFuzzer target for the forwarded CN<->CN messages (wire.h, FWD section)
 * as a memory node's forwarding thread and a compute node's worker read them: the input is a
 * stream of messages framed by their headers; each is checked with dm_wire_fwd_check and,
 * when accepted, its body and inner query message decoded and re-encoded (round trip).
 * Decoders must reject bad input with -errno and never read outside the buffer (ASan). */
#include "wire.h"

#include <string.h>

#define ROUND_TRIP(type, dec, enc, body, len)                                      \
	do {                                                                           \
		struct type m_;                                                            \
		uint8_t o_[sizeof(m_)];                                                    \
		if (!dec(body, len, &m_)) {                                            \
			enc(o_, &m_);                                                      \
			if (memcmp(o_, body, sizeof(m_)))                                  \
				__builtin_trap();                                          \
		}                                                                          \
	} while (0)

static void one(const uint8_t *b, size_t len)
{
	struct dm_wire_hdr h, ih;
	const uint8_t *body = b + DM_WIRE_HDR_LEN;
	size_t blen = len - DM_WIRE_HDR_LEN;

	if (dm_wire_hdr_decode(b, len, &h) || dm_wire_fwd_check(&h, b, len))
		return;
	switch (h.op) {
	case DM_OP_FWD_HELLO:
		ROUND_TRIP(dm_wire_fwd_hello, dm_wire_fwd_hello_decode, dm_wire_fwd_hello_encode,
			   body, blen);
		break;
	case DM_OP_FWD_QUERY:
	case DM_OP_FWD_RESULT:
	case DM_OP_FWD_BOUNCE:
		ROUND_TRIP(dm_wire_fwd, dm_wire_fwd_decode, dm_wire_fwd_encode, body, blen);
		/* Accepted: the inner message must decode as what the worker reads. */
		if (dm_wire_hdr_decode(b + DM_FWD_INNER_OFF, len - DM_FWD_INNER_OFF, &ih) ||
		    ih.length != len - DM_FWD_INNER_OFF)
			__builtin_trap();
		if (h.op == DM_OP_FWD_RESULT) {
			struct dm_wire_q_result r;

			if (dm_wire_q_result_decode(b + DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN,
						    ih.length - DM_WIRE_HDR_LEN, &r))
				__builtin_trap();
		} else {
			struct dm_wire_q_search s;
			float v[64];

			if (dm_wire_q_search_decode(b + DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN,
						    ih.length - DM_WIRE_HDR_LEN, &s))
				__builtin_trap();
			if (s.dim <= 64)
				dm_wire_get_f32s(b + DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN + sizeof(s), v,
						 s.dim);
		}
		break;
	case DM_OP_FWD_STATE: {
		struct dm_wire_fwd_state s;

		ROUND_TRIP(dm_wire_fwd_state, dm_wire_fwd_state_decode, dm_wire_fwd_state_encode,
			   body, blen);
		dm_wire_fwd_state_decode(body, blen, &s);
		for (uint32_t i = 0; i < s.nsample; i++)
			(void)dm_get_le32(body + sizeof(s) + 4 * (size_t)i);
		break;
	}
	case DM_OP_FWD_STATE + 1:
		if (h.status == 0) {
			struct dm_wire_fwd_table t;

			ROUND_TRIP(dm_wire_fwd_table, dm_wire_fwd_table_decode,
				   dm_wire_fwd_table_encode, body, blen);
			dm_wire_fwd_table_decode(body, blen, &t);
			for (uint32_t i = 0; i < t.n; i++) {
				struct dm_wire_fwd_entry e;

				(void)dm_wire_fwd_entry_decode(body + sizeof(t) + sizeof(e) * (size_t)i,
							       sizeof(e), &e);
			}
		}
		break;
	case DM_OP_FWD_ROUTER:
		ROUND_TRIP(dm_wire_fwd_rcfg, dm_wire_fwd_rcfg_decode, dm_wire_fwd_rcfg_encode,
			   body, blen);
		break;
	case DM_OP_FWD_ROUTER + 1:
		if (h.status == 0)
			ROUND_TRIP(dm_wire_fwd_rstats, dm_wire_fwd_rstats_decode,
				   dm_wire_fwd_rstats_encode, body, blen);
		break;
	default:
		__builtin_trap();   /* fwd_check accepted an unknown op */
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* Messages framed by their header's length; each copied to an exact-size buffer so
	 * that ASan sees any read past its end. */
	while (size >= DM_WIRE_HDR_LEN) {
		uint32_t l = dm_get_le32(data + 8);
		uint8_t *m;

		if (l < DM_WIRE_HDR_LEN || l > size)
			l = (uint32_t)size;
		m = __builtin_malloc(l);
		if (!m)
			return 0;
		memcpy(m, data, l);
		one(m, l);
		__builtin_free(m);
		data += l;
		size -= l;
	}
	return 0;
}
