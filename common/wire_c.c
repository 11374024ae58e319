/* wire_c.c: encoders and the one validating decoder of the native client data ops
 * (C_CALL, wire.h 0x3100 range). */
#include "wire.h"

#include <string.h>

static const char *const c_names[] = {
	[DM_C_CREATE_BUCKET] = "CreateVectorBucket", [DM_C_GET_BUCKET] = "GetVectorBucket",
	[DM_C_DELETE_BUCKET] = "DeleteVectorBucket", [DM_C_LIST_BUCKETS] = "ListVectorBuckets",
	[DM_C_CREATE_INDEX] = "CreateIndex", [DM_C_GET_INDEX] = "GetIndex",
	[DM_C_DELETE_INDEX] = "DeleteIndex", [DM_C_LIST_INDEXES] = "ListIndexes",
	[DM_C_PUT_VECTORS] = "PutVectors", [DM_C_GET_VECTORS] = "GetVectors",
	[DM_C_DELETE_VECTORS] = "DeleteVectors", [DM_C_LIST_VECTORS] = "ListVectors",
	[DM_C_QUERY_VECTORS] = "QueryVectors",
};

const char *dm_c_op_name(uint32_t op)
{
	return op >= 1 && op <= DM_C_OP_MAX ? c_names[op] : NULL;
}

void dm_wire_c_call_encode(uint8_t *buf, const struct dm_wire_c_call *m)
{
	dm_put_le32(buf, m->op);
	dm_put_le32(buf + 4, m->json_len);
}

int dm_wire_c_check(const struct dm_wire_hdr *h, const uint8_t *buf, size_t buflen,
		    struct dm_wire_c_call *m, const uint8_t **json)
{
	bool resp = h->op & 1;
	size_t body;

	if ((h->op & ~1u) != DM_OP_C_CALL)
		return -EPROTO;
	if (!buf || buflen < DM_WIRE_HDR_LEN || h->length != buflen)
		return -EBADMSG;
	if (buflen > (resp ? DM_C_MAX_RESP : DM_C_MAX_REQ))
		return -EBADMSG;
	if (!resp && h->status)
		return -EBADMSG;
	body = buflen - DM_WIRE_HDR_LEN;
	if (body < sizeof(*m))
		return -EBADMSG;
	m->op = dm_get_le32(buf + DM_WIRE_HDR_LEN);
	m->json_len = dm_get_le32(buf + DM_WIRE_HDR_LEN + 4);
	if ((uint64_t)m->json_len != body - sizeof(*m))
		return -EBADMSG;
	if (!resp && !dm_c_op_name(m->op))
		return -EPROTO;
	if (resp && (h->status ? m->json_len != 0 || m->op != 0 : m->op < 200 || m->op > 599))
		return -EBADMSG;
	*json = buf + DM_WIRE_HDR_LEN + sizeof(*m);
	return 0;
}
