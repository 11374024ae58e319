/* rpc.h: request/response messaging over the two-sided channel of the transport, as used
 * by the control RPC (CN/CLI -> MN) and, later, query forwarding.
 *
 * A message pool is the receive side of a context (exactly one per context: the shared
 * receive queue mixes all connections' messages, and wr_ids name pool buffers): count buffers of size bytes in one
 * registered area, all posted to the context's shared receive queue; a RECV completion's
 * wr_id names its buffer, which must be reposted after use. A channel pairs a connection
 * with a registered send buffer; dm_rpc_call sends a request and waits for the response
 * with the same req_id (other messages that arrive meanwhile are dropped with a warning:
 * a channel has one caller at a time). */
#ifndef DM_RPC_H
#define DM_RPC_H

#include <pthread.h>

#include "wire.h"
#include "xport/xport.h"

#define DM_RPC_RECV_TAG (1ull << 63)

struct dm_msgpool {
	struct dm_xport *x;
	struct dm_mr *mr;
	uint8_t *mem;
	uint32_t count, size;
};

/* Constructor: allocates, registers and posts count buffers. NULL with errno. */
struct dm_msgpool *dm_msgpool_new(struct dm_xport *x, uint32_t count, uint32_t size);
void dm_msgpool_free(struct dm_msgpool *p);
/* Buffer of a RECV completion's wr_id, or NULL if the wr_id is not one of the pool's. */
uint8_t *dm_msgpool_buf(struct dm_msgpool *p, uint64_t wr_id);
/* Give a buffer back to the receive queue. 0 or -errno. */
int dm_msgpool_repost(struct dm_msgpool *p, uint64_t wr_id);

struct dm_rpc_chan {
	struct dm_conn *c;
	struct dm_msgpool *pool;
	struct dm_mr *smr;
	uint8_t *sbuf;
	uint32_t ssize;
	uint64_t next_id;
	int timeout_ms;
	/* RECVs polled while waiting for our own SEND completion (a pipelining caller has
	 * several answers in flight), handed out first by dm_rpc_recv. */
	uint32_t nstash;
	struct dm_wc stash[64];
};

/* Set up a channel on conn with a send buffer of ssize bytes. 0 or -errno. */
int dm_rpc_chan_init(struct dm_rpc_chan *ch, struct dm_conn *c, struct dm_msgpool *pool,
		     uint32_t ssize, int timeout_ms);
void dm_rpc_chan_fini(struct dm_rpc_chan *ch);

/* Send header(op, req_id, status) + body and wait for its send completion. 0 or -errno. */
int dm_rpc_send(struct dm_rpc_chan *ch, uint16_t op, uint64_t req_id, int32_t status,
		const void *body, uint32_t blen);

/* Wait up to timeout_ms for one incoming message: on success (1) buf, len and wr_id describe
 * it (repost wr_id when done); 0 on timeout; -errno on a transport error. */
int dm_rpc_recv(struct dm_rpc_chan *ch, int timeout_ms, uint8_t **buf, uint32_t *len,
		uint64_t *wr_id);

/* Request/response: sends op with body, waits for op+1 with the same req_id, copies the
 * response body (at most rcap bytes) to resp and its length to *rlen. Returns the response's
 * status (0 or -errno from the peer), -ETIMEDOUT, -EBADMSG for a malformed response, or a
 * transport error. */
int dm_rpc_call(struct dm_rpc_chan *ch, uint16_t op, const void *body, uint32_t blen,
		void *resp, uint32_t rcap, uint32_t *rlen);

#endif
