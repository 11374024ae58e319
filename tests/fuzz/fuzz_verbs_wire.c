/* fuzz_verbs_wire.c: libFuzzer target for what the verbs backend parses from a peer before
 * the handshake authenticated it: rdma_cm private data and handshake slots (verbs_wire.h).
 * Checks that parsing never reads out of bounds and that what parses re-encodes to the
 * same meaning. */
#include "xport/verbs/verbs_wire.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct verbs_cm_priv p, q;
	uint8_t buf[VERBS_CM_PRIV_LEN];

	/* private data: exactly as delivered, any length */
	if (verbs_priv_decode(size ? data : NULL, size, &p) == 0) {
		verbs_priv_encode(buf, p.hs_addr, p.hs_rkey, p.hs_len);
		if (verbs_priv_decode(buf, sizeof(buf), &q) || q.hs_addr != p.hs_addr ||
		    q.hs_rkey != p.hs_rkey || q.hs_len != p.hs_len)
			abort();
	}
	/* a slot READ from the peer is always VERBS_HS_SLOT bytes: pad or cut the input */
	if (size > 0) {
		uint8_t *slot = calloc(1, VERBS_HS_SLOT), *again = calloc(1, VERBS_HS_SLOT);
		uint32_t idx = data[0] % (VERBS_HS_SLOTS + 1);
		size_t len = 0, len2 = 0;

		if (!slot || !again)
			abort();
		memcpy(slot, data + 1, DM_MIN(size - 1, (size_t)VERBS_HS_SLOT));
		if (verbs_slot_check(slot, idx, &len) == 0) {
			if (len > VERBS_HS_SLOT - VERBS_HS_HDR)
				abort();
			verbs_slot_put(again, idx, slot + VERBS_HS_HDR, len);
			if (verbs_slot_check(again, idx, &len2) || len2 != len ||
			    memcmp(again, slot, VERBS_HS_HDR + len))
				abort();
		}
		/* and a framed copy of arbitrary bytes always checks */
		len = DM_MIN(size - 1, (size_t)(VERBS_HS_SLOT - VERBS_HS_HDR));
		verbs_slot_put(again, idx, data + 1, len);
		if (verbs_slot_check(again, idx, &len2) || len2 != len)
			abort();
		free(again);
		free(slot);
	}
	return 0;
}
