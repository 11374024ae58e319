/* fl_rpc.c: chunked request/response streams of the S3 flat-index RPC (see fl_rpc.h). */
#include "fl_rpc.h"

#include <stdlib.h>
#include <string.h>

int dm_fl_send(struct dm_rpc_chan *ch, uint16_t op, uint64_t req_id, int32_t status,
	       const void *p, size_t n, uint32_t max_msg)
{
	uint32_t room = DM_MIN(max_msg, ch->ssize);
	uint8_t *tmp;
	size_t off = 0;
	int rc = 0;

	if (room <= DM_WIRE_HDR_LEN + sizeof(struct dm_wire_fl_chunk) || n > DM_FL_MAX_STREAM)
		return -EINVAL;
	room -= DM_WIRE_HDR_LEN + sizeof(struct dm_wire_fl_chunk);
	tmp = malloc(sizeof(struct dm_wire_fl_chunk) + room);
	if (!tmp)
		return -ENOMEM;
	do {
		size_t b = DM_MIN(room, n - off);
		struct dm_wire_fl_chunk c = { .total = (uint32_t)n, .off = (uint32_t)off };

		dm_wire_fl_chunk_encode(tmp, &c);
		if (b)
			memcpy(tmp + sizeof(c), (const uint8_t *)p + off, b);
		rc = dm_rpc_send(ch, op, req_id, status, tmp, (uint32_t)(sizeof(c) + b));
		off += b;
	} while (!rc && off < n);
	free(tmp);
	return rc;
}

int dm_fl_recv_rest(struct dm_rpc_chan *ch, const struct dm_wire_hdr *h0, const uint8_t *buf0,
		    size_t len0, uint64_t wr0, int timeout_ms, uint8_t **out, size_t *outlen)
{
	struct dm_wire_fl_chunk c;
	uint8_t *pay = NULL;
	size_t have;
	int rc = 0;

	*out = NULL;
	*outlen = 0;
	dm_wire_fl_chunk_decode(buf0 + DM_WIRE_HDR_LEN, len0 - DM_WIRE_HDR_LEN, &c);
	if (c.off != 0) {
		dm_msgpool_repost(ch->pool, wr0);
		return -EBADMSG;
	}
	if (c.total) {
		pay = malloc(c.total);
		if (!pay) {
			dm_msgpool_repost(ch->pool, wr0);
			return -ENOMEM;
		}
	}
	have = len0 - DM_WIRE_HDR_LEN - sizeof(c);
	if (have)
		memcpy(pay, buf0 + DM_WIRE_HDR_LEN + sizeof(c), have);
	dm_msgpool_repost(ch->pool, wr0);
	while (have < c.total) {
		struct dm_wire_hdr h;
		struct dm_wire_fl_chunk ci;
		uint8_t *buf;
		uint32_t len;
		uint64_t wr;
		size_t b;

		rc = dm_rpc_recv(ch, timeout_ms, &buf, &len, &wr);
		if (rc == 0)
			rc = -ETIMEDOUT;
		if (rc < 0)
			break;
		rc = dm_wire_hdr_decode(buf, len, &h);
		if (!rc)
			rc = dm_wire_fl_check(&h, buf, len);
		if (!rc) {
			dm_wire_fl_chunk_decode(buf + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &ci);
			b = len - DM_WIRE_HDR_LEN - sizeof(ci);
			if (h.op != h0->op || h.req_id != h0->req_id || ci.total != c.total ||
			    ci.off != have)
				rc = -EBADMSG;
			else
				memcpy(pay + have, buf + DM_WIRE_HDR_LEN + sizeof(ci), b);
			have += b;
		}
		dm_msgpool_repost(ch->pool, wr);
		if (rc)
			break;
	}
	if (rc) {
		free(pay);
		return rc < 0 ? rc : -EBADMSG;
	}
	*out = pay;
	*outlen = c.total;
	return 0;
}

int dm_fl_call(struct dm_rpc_chan *ch, uint16_t op, const void *p, size_t n,
	       uint32_t max_msg, int timeout_ms, uint8_t **resp, size_t *rlen)
{
	uint64_t id = ch->next_id++;
	uint64_t deadline;
	int rc;

	*resp = NULL;
	*rlen = 0;
	rc = dm_fl_send(ch, op, id, 0, p, n, max_msg);
	if (rc)
		return rc;
	deadline = dm_now_ns() + (uint64_t)timeout_ms * 1000000;
	for (;;) {
		struct dm_wire_hdr h;
		uint8_t *buf;
		uint32_t len;
		uint64_t wr;
		uint64_t now = dm_now_ns();

		if (now >= deadline)
			return -ETIMEDOUT;
		rc = dm_rpc_recv(ch, (int)((deadline - now) / 1000000) + 1, &buf, &len, &wr);
		if (rc < 0)
			return rc;
		if (rc == 0)
			continue;
		rc = dm_wire_hdr_decode(buf, len, &h);
		if (!rc)
			rc = dm_wire_fl_check(&h, buf, len);
		if (!rc && (h.op != op + 1 || h.req_id != id)) {
			dm_warn("fl rpc: %s answered op 0x%x id %llu, expected 0x%x id %llu; dropped",
				ch->c->peer, h.op, (unsigned long long)h.req_id, op + 1,
				(unsigned long long)id);
			dm_msgpool_repost(ch->pool, wr);
			continue;
		}
		if (rc) {
			dm_msgpool_repost(ch->pool, wr);
			return rc;
		}
		rc = dm_fl_recv_rest(ch, &h, buf, len, wr, timeout_ms, resp, rlen);
		return rc ? rc : h.status;
	}
}
