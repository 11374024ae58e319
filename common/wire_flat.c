/* wire_flat.c: codecs of the S3 flat-index RPC (wire.h, FL section): the chunk prefix that
 * lets a request or response span several messages, and the bounds-checked payload
 * writer/reader used by both ends. */
#include "wire.h"

#include <stdlib.h>
#include <string.h>

int dm_wire_fl_check(const struct dm_wire_hdr *h, const uint8_t *buf, size_t buflen)
{
	struct dm_wire_fl_chunk c;
	uint32_t bytes;

	if (h->op < DM_OP_FL_FIRST || h->op > DM_OP_FL_LAST)
		return -EPROTO;
	if (!(h->op & 1) && h->status != 0)
		return -EBADMSG;
	if (h->length != buflen || buflen < DM_WIRE_HDR_LEN + sizeof(c))
		return -EBADMSG;
	dm_wire_fl_chunk_decode(buf + DM_WIRE_HDR_LEN, buflen - DM_WIRE_HDR_LEN, &c);
	bytes = (uint32_t)(buflen - DM_WIRE_HDR_LEN - sizeof(c));
	if (c.total > DM_FL_MAX_STREAM || c.off > c.total || bytes > c.total - c.off)
		return -EBADMSG;
	/* Only an empty stream may have an empty message (no progress otherwise). */
	if (!bytes && c.total)
		return -EBADMSG;
	return 0;
}

void dm_wire_fl_chunk_encode(uint8_t *buf, const struct dm_wire_fl_chunk *m)
{
	dm_put_le32(buf, m->total);
	dm_put_le32(buf + 4, m->off);
}

int dm_wire_fl_chunk_decode(const uint8_t *buf, size_t len, struct dm_wire_fl_chunk *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->total = dm_get_le32(buf);
	m->off = dm_get_le32(buf + 4);
	return 0;
}
