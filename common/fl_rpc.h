/* fl_rpc.h: streams of the S3 flat-index RPC (wire.h, FL section) over a dm_rpc_chan: a
 * payload larger than one message goes out as consecutive chunk messages and is
 * reassembled on the other side. Used by dmann-mn (mn/mn_flat.c) and the compute nodes'
 * S3 gateway (cn/cn_s3.c). */
#ifndef DM_FL_RPC_H
#define DM_FL_RPC_H

#include "rpc.h"

/* Send payload p (n bytes) as a stream of op messages with req_id and status, each at
 * most max_msg bytes (the receiver's buffer; also bounded by the channel's send buffer).
 * 0 or -errno. */
int dm_fl_send(struct dm_rpc_chan *ch, uint16_t op, uint64_t req_id, int32_t status,
	       const void *p, size_t n, uint32_t max_msg);

/* Reassemble a stream whose first message (buf0, len0, already checked with
 * dm_wire_fl_check; header h0) was received with wr_id wr0: reposts every buffer, waits at
 * most timeout_ms per message, and returns the payload (malloc'ed, *out; NULL when empty)
 * and its length. 0 or -errno (-EBADMSG: a malformed or out-of-order message). */
int dm_fl_recv_rest(struct dm_rpc_chan *ch, const struct dm_wire_hdr *h0, const uint8_t *buf0,
		    size_t len0, uint64_t wr0, int timeout_ms, uint8_t **out, size_t *outlen);

/* Request/response: sends the request stream, receives the op + 1 stream with the same
 * req_id. Returns the response status (0 or the peer's -errno) with the payload in
 * *resp (malloc'ed, free it), or a transport error / -ETIMEDOUT / -EBADMSG. */
int dm_fl_call(struct dm_rpc_chan *ch, uint16_t op, const void *p, size_t n,
	       uint32_t max_msg, int timeout_ms, uint8_t **resp, size_t *rlen);

#endif
