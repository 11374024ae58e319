/* verbs_wire.h: the two byte formats the verbs backend exchanges with a peer before the
 * handshake has authenticated it (so both are parsed from untrusted input):
 *   - the rdma_cm private data of REQ/REP: where the sender's handshake area is;
 *   - a handshake slot in that area: one handshake message framed with magic, index,
 *     length and an FNV-1a hash that lets a reader tell a complete slot from one it READ
 *     while the owner was writing it.
 * Pure buffer functions, no verbs objects: fuzzed by tests/fuzz/fuzz_verbs_wire.c.
 *
 * Private data (24 bytes, little-endian; the receiver may see it zero-padded):
 *   0 magic "DMVB" | 4 version u16 | 6 reserved u16 | 8 area address u64 | 16 rkey u32 |
 *   20 area length u32
 * Slot (VERBS_HS_SLOT bytes):
 *   0 magic "DMHS" | 4 index u16 | 6 length u16 | 8 hash u64 | 16 payload (length bytes)
 */
#ifndef DM_VERBS_WIRE_H
#define DM_VERBS_WIRE_H

#include "../../dm.h"

#define VERBS_CM_MAGIC    0x42564d44u   /* "DMVB" little-endian */
#define VERBS_CM_VERSION  1
#define VERBS_CM_PRIV_LEN 24u
#define VERBS_HS_MAGIC    0x53484d44u   /* "DMHS" little-endian */
#define VERBS_HS_HDR      16u

/* The handshake area: slots of this size, the first VERBS_HS_SLOTS are the owner's
 * outgoing messages, the last one receives the peer's. */
#define VERBS_HS_SLOT   256u
#define VERBS_HS_SLOTS  4u
#define VERBS_HS_BYTES  (VERBS_HS_SLOT * (VERBS_HS_SLOTS + 1))

struct verbs_cm_priv {
	uint32_t magic;
	uint16_t version;
	uint64_t hs_addr;
	uint32_t hs_rkey;
	uint32_t hs_len;
};

/* Write private data describing a handshake area (VERBS_CM_PRIV_LEN bytes). */
void verbs_priv_encode(uint8_t *buf, uint64_t hs_addr, uint32_t hs_rkey, uint32_t hs_len);
/* Parse and validate a peer's private data: 0, -EBADMSG (short, bad magic, area too small
 * or wrapping) or -EPROTONOSUPPORT (other version). */
int verbs_priv_decode(const void *data, size_t len, struct verbs_cm_priv *p);

/* Frame message idx (len <= VERBS_HS_SLOT - VERBS_HS_HDR bytes) into slot. The header is
 * written after the payload, the hash last. */
void verbs_slot_put(uint8_t *slot, uint32_t idx, const uint8_t *msg, size_t len);
/* Check a slot READ from the peer for message idx: 0 with the payload length in *len (the
 * payload starts at slot + VERBS_HS_HDR), or -EAGAIN when it does not (yet) hold a complete
 * message numbered idx. */
int verbs_slot_check(const uint8_t *slot, uint32_t idx, size_t *len);

#endif
