/* cn_s3_mn.c: the compute node's calls to the memory nodes for the S3 gateway: a pool of
 * FL connections per MN (replaced once when a pooled one fails; an MN that cannot be
 * reached is skipped for reads for a second), the placement of a bucket on the MNs, an S3
 * operation run on one MN (FL_CALL) and the index state read (FL_STATE). */
#include "cn_s3_int.h"

#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "flat.h"
#include "placement.h"

void mnconn_free(struct mnconn *mc)
{
	dm_rpc_chan_fini(&mc->ch);
	dm_conn_close(mc->c);
	free(mc);
}

static struct mnconn *mn_connect(struct cn_s3 *s, uint32_t mn)
{
	struct mnconn *mc = calloc(1, sizeof(*mc));
	int rc;

	if (!mc)
		return NULL;
	rc = dm_xport_connect(s->x, s->cfg->mn[mn].address, MN_CONNECT_MS, &mc->c);
	if (rc) {
		dm_debug("s3: cannot connect to mn%u (%s): %s", mn, s->cfg->mn[mn].address,
			 strerror(-rc));
		free(mc);
		return NULL;
	}
	/* Requests as large as the MN's receive buffers (fewer messages per PutVectors). */
	uint8_t *resp = NULL;
	size_t rlen;
	uint32_t max = MN_MSG;

	rc = dm_rpc_chan_init(&mc->ch, mc->c, s->pool, MN_MSG, FL_TIMEOUT_MS);
	if (!rc)
		rc = dm_fl_call(&mc->ch, DM_OP_FL_INFO, NULL, 0, MN_MSG, FL_TIMEOUT_MS, &resp,
				&rlen);
	if (!rc && rlen == 4)
		max = DM_MAX(DM_MIN(dm_get_le32(resp), DM_FL_MAX_MSG), MN_MSG);
	free(resp);
	if (!rc && max > MN_MSG) {
		dm_rpc_chan_fini(&mc->ch);
		rc = dm_rpc_chan_init(&mc->ch, mc->c, s->pool, max, FL_TIMEOUT_MS);
	}
	if (rc) {
		if (mc->ch.sbuf)
			dm_rpc_chan_fini(&mc->ch);
		dm_conn_close(mc->c);
		free(mc);
		return NULL;
	}
	mc->max_msg = max;
	return mc;
}

bool mn_is_down(struct cn_s3 *s, uint32_t mn)
{
	return __atomic_load_n(&s->mn[mn].down_until, __ATOMIC_RELAXED) > dm_now_ns();
}

/* One FL call to memory node mn. A pooled connection that fails (the MN restarted) is
 * replaced by a fresh one once. Returns the peer status or -EHOSTDOWN when the MN cannot
 * be reached (the request was then not served by it, or its fate is unknown). */
static int mn_call1(struct cn_s3 *s, uint32_t mn, uint16_t op, const struct dm_buf *req,
		    uint8_t **resp, size_t *rlen, int timeout_ms)
{
	struct mnslot *sl = &s->mn[mn];

	*resp = NULL;
	*rlen = 0;
	if (req->oom)
		return -ENOMEM;
	for (int attempt = 0; attempt < 2; attempt++) {
		struct mnconn *mc;
		bool pooled;
		int rc;

		pthread_mutex_lock(&sl->mu);
		mc = sl->idle;
		if (mc)
			sl->idle = mc->next;
		pthread_mutex_unlock(&sl->mu);
		pooled = mc != NULL;
		if (!mc)
			mc = mn_connect(s, mn);
		if (!mc) {
			__atomic_store_n(&sl->down_until, dm_now_ns() + MN_DOWN_NS,
					 __ATOMIC_RELAXED);
			return -EHOSTDOWN;
		}
		rc = dm_fl_call(&mc->ch, op, req->p, req->n, mc->max_msg, timeout_ms, resp,
				rlen);
		if (rc == 0 || rc == -ENOENT || rc == -ESTALE || rc == -EINVAL ||
		    rc == -EBADMSG || rc == -ENOMEM) {
			pthread_mutex_lock(&sl->mu);
			mc->next = sl->idle;
			sl->idle = mc;
			pthread_mutex_unlock(&sl->mu);
			__atomic_store_n(&sl->down_until, 0, __ATOMIC_RELAXED);
			return rc;
		}
		mnconn_free(mc);
		free(*resp);
		*resp = NULL;
		if (!pooled) {
			__atomic_store_n(&sl->down_until, dm_now_ns() + MN_DOWN_NS,
					 __ATOMIC_RELAXED);
			return -EHOSTDOWN;
		}
	}
	return -EHOSTDOWN;
}

int mn_call(struct cn_s3 *s, uint32_t mn, uint16_t op, struct dm_buf *req,
	    uint8_t **resp, size_t *rlen)
{
	int rc = mn_call1(s, mn, op, req, resp, rlen, FL_TIMEOUT_MS);

	dm_buf_free(req);
	return rc;
}

int mn_call_timeout(struct cn_s3 *s, uint32_t mn, uint16_t op, struct dm_buf *req,
		    uint8_t **resp, size_t *rlen, int timeout_ms)
{
	int rc = mn_call1(s, mn, op, req, resp, rlen, timeout_ms);

	dm_buf_free(req);
	return rc;
}

/* FL_CALL of an S3 operation on one MN: fills r from the MN's answer. */
int mn_s3(struct cn_s3 *s, uint32_t mn, const char *op, const char *body, size_t len,
		 struct s3_resp *r)
{
	struct dm_buf w = { 0 };
	uint8_t *resp;
	size_t rlen;
	int rc;

	memset(r, 0, sizeof(*r));
	dm_buf_str(&w, op);
	dm_buf_bytes(&w, body ? body : "", body ? len : 0);
	rc = mn_call(s, mn, DM_OP_FL_CALL, &w, &resp, &rlen);   /* frees w */
	if (rc)
		return rc;
	struct dm_rbuf rb = { .p = resp, .n = rlen };
	char et[64];
	uint32_t blen;
	uint16_t st = dm_rbuf_u16(&rb);
	const char *b;

	dm_rbuf_str(&rb, et, sizeof(et));
	b = dm_rbuf_bytes(&rb, &blen, DM_FL_MAX_STREAM);
	if (rb.bad || st < 100 || st > 599) {
		free(resp);
		return -EBADMSG;
	}
	r->status = st;
	r->body = malloc(blen + 1);
	if (!r->body) {
		free(resp);
		return -ENOMEM;
	}
	memcpy(r->body, b, blen);
	r->body[blen] = 0;
	r->len = blen;
	/* errtype must outlive the response: map it to the static names s3_http sends. */
	static const char *const types[] = { "ValidationException", "NotFoundException",
		"ConflictException", "ServiceUnavailableException", "AccessDeniedException",
		"InternalServerException", "UnknownOperationException",
		"ServiceQuotaExceededException" };
	r->errtype = NULL;
	for (size_t i = 0; et[0] && i < DM_ARRAY_SIZE(types); i++)
		if (!strcmp(et, types[i]))
			r->errtype = types[i];
	if (et[0] && !r->errtype)
		r->errtype = "InternalServerException";
	free(resp);
	return 0;
}

void unavailable(struct s3_resp *r, const char *what, uint32_t mn)
{
	s3_resp_free(r);
	s3_resp_error(r, 503, "ServiceUnavailableException",
		      "%s: memory node %u is unreachable; retry later", what, mn);
}

void ixstate_fini(struct ixstate *st)
{
	free(st->conf);
	free(st->fr);
	free(st->scope);
	memset(st, 0, sizeof(*st));
}

int ixstate_fetch(struct cn_s3 *s, uint32_t mn, const char *b, const char *x,
			 struct ixstate *st)
{
	struct dm_buf w = { 0 };
	uint8_t *resp;
	size_t rlen;
	const void *conf;
	int rc;

	memset(st, 0, sizeof(*st));
	dm_buf_str(&w, b);
	dm_buf_str(&w, x);
	rc = mn_call(s, mn, DM_OP_FL_STATE, &w, &resp, &rlen);   /* frees w */
	if (rc)
		return rc;
	struct dm_rbuf rb = { .p = resp, .n = rlen };

	st->mn = mn;
	st->epoch = dm_rbuf_u64(&rb);
	st->created = (int64_t)dm_rbuf_u64(&rb);
	st->dim = dm_rbuf_u32(&rb);
	st->metric = dm_rbuf_u32(&rb);
	conf = dm_rbuf_bytes(&rb, &st->conf_len, 1u << 20);
	st->frag_rows = dm_rbuf_u32(&rb);
	st->nfrag = dm_rbuf_u32(&rb);
	if (rb.bad || !st->dim || st->dim > FLAT_DIM_MAX || !st->frag_rows ||
	    st->nfrag > (rlen - rb.at) / 8 || (st->metric != DM_METRIC_L2 &&
					       st->metric != DM_METRIC_COS)) {
		free(resp);
		return -EBADMSG;
	}
	st->conf = malloc(st->conf_len + 1);
	st->fr = calloc(st->nfrag ? st->nfrag : 1, sizeof(*st->fr));
	if (!st->conf || !st->fr) {
		free(resp);
		ixstate_fini(st);
		return -ENOMEM;
	}
	memcpy(st->conf, conf, st->conf_len);
	st->conf[st->conf_len] = 0;
	for (uint32_t i = 0; i < st->nfrag; i++) {
		st->fr[i].rows = dm_rbuf_u32(&rb);
		st->fr[i].dead = dm_rbuf_u32(&rb);
		if (st->fr[i].rows > st->frag_rows || st->fr[i].dead > st->fr[i].rows)
			rb.bad = true;
	}
	st->mark = dm_rbuf_u64(&rb);
	st->mark_tag = dm_rbuf_u64(&rb);
	st->gkeys = dm_rbuf_u64(&rb);
	/* A scoped index's fragment labels (wire.h: the optional trailer). */
	if (!rb.bad && rb.at < rb.n && rb.n - rb.at == (size_t)st->nfrag * 8) {
		st->scope = calloc(st->nfrag + 1, sizeof(*st->scope));
		for (uint32_t i = 0; st->scope && i < st->nfrag; i++)
			st->scope[i] = dm_rbuf_u64(&rb);
		if (!st->scope) {
			free(resp);
			ixstate_fini(st);
			return -ENOMEM;
		}
	}
	if (rb.at != rb.n || st->mark > (uint64_t)st->nfrag * st->frag_rows)
		rb.bad = true;
	free(resp);
	if (rb.bad) {
		ixstate_fini(st);
		return -EBADMSG;
	}
	return 0;
}
