/* rpc.c: message pools and request/response channels over the transport. */
#include "rpc.h"

#include <stdlib.h>
#include <string.h>

struct dm_msgpool *dm_msgpool_new(struct dm_xport *x, uint32_t count, uint32_t size)
{
	struct dm_msgpool *p;
	int rc;

	if (count == 0 || size < DM_WIRE_HDR_LEN) {
		errno = EINVAL;
		return NULL;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->x = x;
	p->count = count;
	p->size = size;
	p->mem = aligned_alloc(64, DM_ALIGN_UP((size_t)count * size, 64));
	if (!p->mem)
		goto err_free_p;
	rc = dm_xport_reg(x, p->mem, (size_t)count * size, 0, &p->mr);
	if (rc)
		goto err_free_mem_rc;
	for (uint32_t i = 0; i < count; i++) {
		rc = dm_xport_post_recv(x, p->mem + (size_t)i * size, size, p->mr,
					DM_RPC_RECV_TAG | i);
		if (rc)
			goto err_dereg_rc;
	}
	return p;

err_dereg_rc:
	dm_xport_dereg(x, p->mr);
err_free_mem_rc:
	free(p->mem);
	free(p);
	errno = -rc;
	return NULL;
err_free_p:
	free(p);
	errno = ENOMEM;
	return NULL;
}

void dm_msgpool_free(struct dm_msgpool *p)
{
	if (!p)
		return;
	dm_xport_dereg(p->x, p->mr);
	free(p->mem);
	free(p);
}

uint8_t *dm_msgpool_buf(struct dm_msgpool *p, uint64_t wr_id)
{
	uint64_t i = wr_id & ~DM_RPC_RECV_TAG;

	if (!(wr_id & DM_RPC_RECV_TAG) || i >= p->count)
		return NULL;
	return p->mem + i * p->size;
}

int dm_msgpool_repost(struct dm_msgpool *p, uint64_t wr_id)
{
	uint8_t *b = dm_msgpool_buf(p, wr_id);

	if (!b)
		return -EINVAL;
	return dm_xport_post_recv(p->x, b, p->size, p->mr, wr_id);
}

int dm_rpc_chan_init(struct dm_rpc_chan *ch, struct dm_conn *c, struct dm_msgpool *pool,
		     uint32_t ssize, int timeout_ms)
{
	int rc;

	memset(ch, 0, sizeof(*ch));
	ch->c = c;
	ch->pool = pool;
	ch->ssize = ssize;
	ch->timeout_ms = timeout_ms > 0 ? timeout_ms : 10000;
	ch->next_id = 1;
	ch->sbuf = aligned_alloc(64, DM_ALIGN_UP(ssize, 64));
	if (!ch->sbuf)
		return -ENOMEM;
	rc = dm_xport_reg(c->x, ch->sbuf, ssize, 0, &ch->smr);
	if (rc) {
		free(ch->sbuf);
		ch->sbuf = NULL;
	}
	return rc;
}

void dm_rpc_chan_fini(struct dm_rpc_chan *ch)
{
	if (!ch->sbuf)
		return;
	dm_xport_dereg(ch->c->x, ch->smr);
	free(ch->sbuf);
	ch->sbuf = NULL;
}

/* Handle a completion that is not the one being waited for: a RECV nobody expects is
 * dropped (and its buffer reposted); anything else is ignored. */
static void stray(struct dm_rpc_chan *ch, const struct dm_wc *wc)
{
	if (wc->opcode == DM_WC_RECV && wc->status == 0) {
		dm_warn("rpc: unexpected message from %s dropped", ch->c->peer);
		dm_msgpool_repost(ch->pool, wc->wr_id);
	}
}

static int remaining_ms(uint64_t deadline)
{
	uint64_t now = dm_now_ns();

	return now >= deadline ? 0 : (int)((deadline - now) / 1000000) + 1;
}

int dm_rpc_send(struct dm_rpc_chan *ch, uint16_t op, uint64_t req_id, int32_t status,
		const void *body, uint32_t blen)
{
	uint64_t deadline = dm_now_ns() + (uint64_t)ch->timeout_ms * 1000000;
	uint32_t len = DM_WIRE_HDR_LEN + blen;
	struct dm_wc wc;
	int rc;

	if (len > ch->ssize)
		return -EMSGSIZE;
	dm_wire_hdr_encode(ch->sbuf, op, len, status, req_id);
	if (blen)
		memcpy(ch->sbuf + DM_WIRE_HDR_LEN, body, blen);
	rc = dm_conn_send(ch->c, req_id, ch->sbuf, len, ch->smr, DM_WR_SIGNALED);
	if (rc)
		return rc;
	/* The send buffer is reused by the next call: wait until the transport is done. */
	for (;;) {
		int left = remaining_ms(deadline);

		if (!left)
			return -ETIMEDOUT;
		rc = dm_conn_wait(ch->c, &wc, 1, left);
		if (rc < 0)
			return rc;
		if (rc == 0)
			continue;
		if (wc.opcode == DM_WC_SEND && wc.wr_id == req_id)
			return wc.status;
		if (wc.status && wc.opcode != DM_WC_RECV)
			return wc.status;
		if (wc.opcode == DM_WC_RECV && wc.status)
			return wc.status;
		/* Answers may be polled before our own send completion: keep them for recv. */
		if (wc.opcode == DM_WC_RECV && ch->nstash < DM_ARRAY_SIZE(ch->stash))
			ch->stash[ch->nstash++] = wc;
		else
			stray(ch, &wc);
	}
}

int dm_rpc_recv(struct dm_rpc_chan *ch, int timeout_ms, uint8_t **buf, uint32_t *len,
		uint64_t *wr_id)
{
	struct dm_wc wc;
	int rc;

	for (;;) {
		if (ch->nstash) {
			wc = ch->stash[0];
			memmove(ch->stash, ch->stash + 1, --ch->nstash * sizeof(wc));
			rc = 1;
		} else {
			rc = dm_conn_wait(ch->c, &wc, 1, timeout_ms);
		}
		if (rc <= 0)
			return rc;
		if (wc.status)
			return wc.status;
		if (wc.opcode != DM_WC_RECV)
			continue;
		*buf = dm_msgpool_buf(ch->pool, wc.wr_id);
		if (!*buf)
			return -EINVAL;
		*len = wc.byte_len;
		*wr_id = wc.wr_id;
		return 1;
	}
}

int dm_rpc_call(struct dm_rpc_chan *ch, uint16_t op, const void *body, uint32_t blen,
		void *resp, uint32_t rcap, uint32_t *rlen)
{
	uint64_t id = ch->next_id++;
	uint64_t deadline;
	struct dm_wire_hdr h;
	uint8_t *buf;
	uint32_t len;
	uint64_t wr_id;
	int rc;

	rc = dm_rpc_send(ch, op, id, 0, body, blen);
	if (rc)
		return rc;
	deadline = dm_now_ns() + (uint64_t)ch->timeout_ms * 1000000;
	for (;;) {
		int left = remaining_ms(deadline);

		if (!left)
			return -ETIMEDOUT;
		rc = dm_rpc_recv(ch, left, &buf, &len, &wr_id);
		if (rc < 0)
			return rc;
		if (rc == 0)
			continue;
		rc = dm_wire_hdr_decode(buf, len, &h);
		if (rc == 0 && (h.length != len || h.req_id != id || h.op != op + 1)) {
			dm_warn("rpc: %s answered op 0x%x id %llu, expected 0x%x id %llu; dropped",
				ch->c->peer, h.op, (unsigned long long)h.req_id, op + 1,
				(unsigned long long)id);
			dm_msgpool_repost(ch->pool, wr_id);
			continue;
		}
		if (rc == 0) {
			uint32_t b = len - DM_WIRE_HDR_LEN;

			if (b > rcap) {
				rc = -EBADMSG;
			} else {
				if (b)
					memcpy(resp, buf + DM_WIRE_HDR_LEN, b);
				if (rlen)
					*rlen = b;
				rc = h.status;
			}
		}
		dm_msgpool_repost(ch->pool, wr_id);
		return rc;
	}
}
