/* verbs_wire.c: rdma_cm private data and handshake slot framing of the verbs backend
 * (formats in verbs_wire.h). */
#include "verbs_wire.h"
#include "../../wire.h"
#include "util/dm_hash.h"

#include <string.h>

void verbs_priv_encode(uint8_t *b, uint64_t hs_addr, uint32_t hs_rkey, uint32_t hs_len)
{
	memset(b, 0, VERBS_CM_PRIV_LEN);
	dm_put_le32(b, VERBS_CM_MAGIC);
	dm_put_le16(b + 4, VERBS_CM_VERSION);
	dm_put_le64(b + 8, hs_addr);
	dm_put_le32(b + 16, hs_rkey);
	dm_put_le32(b + 20, hs_len);
}

int verbs_priv_decode(const void *data, size_t len, struct verbs_cm_priv *p)
{
	const uint8_t *b = data;

	if (!b || len < VERBS_CM_PRIV_LEN)
		return -EBADMSG;
	p->magic = dm_get_le32(b);
	p->version = dm_get_le16(b + 4);
	p->hs_addr = dm_get_le64(b + 8);
	p->hs_rkey = dm_get_le32(b + 16);
	p->hs_len = dm_get_le32(b + 20);
	if (p->magic != VERBS_CM_MAGIC)
		return -EBADMSG;
	if (p->version != VERBS_CM_VERSION)
		return -EPROTONOSUPPORT;
	if (p->hs_len < VERBS_HS_SLOT * VERBS_HS_SLOTS || p->hs_addr > UINT64_MAX - p->hs_len)
		return -EBADMSG;
	return 0;
}

/* Hash over the first 8 header bytes (magic, index, length) and the payload. */
static uint64_t slot_hash(const uint8_t *slot, size_t len)
{
	return dm_fnv1a64(dm_fnv1a64(DM_FNV64_INIT, slot, 8), slot + VERBS_HS_HDR, len);
}

void verbs_slot_put(uint8_t *slot, uint32_t idx, const uint8_t *msg, size_t len)
{
	if (len)
		memcpy(slot + VERBS_HS_HDR, msg, len);
	dm_put_le32(slot, VERBS_HS_MAGIC);
	dm_put_le16(slot + 4, (uint16_t)idx);
	dm_put_le16(slot + 6, (uint16_t)len);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	dm_put_le64(slot + 8, slot_hash(slot, len));
	__atomic_thread_fence(__ATOMIC_RELEASE);
}

int verbs_slot_check(const uint8_t *slot, uint32_t idx, size_t *len)
{
	size_t l = dm_get_le16(slot + 6);

	if (dm_get_le32(slot) != VERBS_HS_MAGIC || dm_get_le16(slot + 4) != idx ||
	    l > VERBS_HS_SLOT - VERBS_HS_HDR || dm_get_le64(slot + 8) != slot_hash(slot, l))
		return -EAGAIN;
	*len = l;
	return 0;
}
