/* cn_call.c: the compute node's side of the native client ops with long answers: C_CALL
 * (wire.h: run the S3 Vectors operation through the gateway, cn->s3_call, i.e. cn_s3_call)
 * and Q_ROUTER (the router's oracle for client-side routing). Answers go out from the
 * connection's answer buffer (DM_C_MAX_RESP bytes, registered once). */
#include "cn.h"

#include <stdlib.h>
#include <string.h>

#include "router.h"
#include "wire.h"

/* Wait until the previous answer's SEND completed (other completions go to other()). */
static int wait_idle(struct cn_call *cc, struct dm_conn *conn,
		     bool (*other)(void *, const struct dm_wc *), void *arg)
{
	while (cc->busy) {
		struct dm_wc wc;
		int n = dm_conn_wait(conn, &wc, 1, 1000);

		if (n < 0)
			return n;
		if (n == 1 && wc.wr_id == CN_CALL_WR) {
			cc->busy = false;
			if (wc.status)
				return wc.status;
		} else if (n == 1 && !other(arg, &wc)) {
			return -ECONNRESET;
		}
	}
	return 0;
}

/* The answer buffer, allocated and registered on first use. 0 or -ENOMEM. */
static int ensure_buf(struct cn *cn, struct cn_call *cc)
{
	if (cc->buf)
		return 0;
	cc->buf = aligned_alloc(64, DM_C_MAX_RESP);
	if (!cc->buf || dm_xport_reg(cn->x, cc->buf, DM_C_MAX_RESP, 0, &cc->mr)) {
		free(cc->buf);
		cc->buf = NULL;
		return -ENOMEM;
	}
	return 0;
}

int cn_call_router(struct cn *cn, struct cn_call *cc, struct dm_conn *conn, uint64_t req_id,
		   bool (*other)(void *, const struct dm_wc *), void *arg)
{
	struct dm_wire_q_router h;
	uint32_t off = DM_WIRE_HDR_LEN + (uint32_t)sizeof(h), len = DM_WIRE_HDR_LEN;
	int n, rc = ensure_buf(cn, cc);

	if (rc)
		return rc;
	rc = wait_idle(cc, conn, other, arg);
	if (rc)
		return rc;
	n = cn->rt ? router_export(cn->rt, &h, cc->buf + off, DM_C_MAX_RESP - off) : -ENOSYS;
	if (n >= 0) {
		dm_wire_q_router_encode(cc->buf + DM_WIRE_HDR_LEN, &h);
		len = off + (uint32_t)n;
	}
	dm_wire_hdr_encode(cc->buf, DM_OP_Q_ROUTER + 1, len, n < 0 ? n : 0, req_id);
	rc = dm_conn_send(conn, CN_CALL_WR, cc->buf, len, cc->mr, DM_WR_SIGNALED);
	if (rc == 0)
		cc->busy = true;
	return rc;
}

int cn_call_run(struct cn *cn, struct cn_call *cc, struct dm_conn *conn, const uint8_t *msg,
		uint32_t len, bool (*other)(void *, const struct dm_wc *), void *arg)
{
	struct dm_wire_hdr h;
	struct dm_wire_c_call m, r = { 0 };
	const uint8_t *json;
	char *out = NULL;
	size_t olen = 0;
	int status = 0, err = 0, rc;

	if (dm_wire_hdr_decode(msg, len, &h) || dm_wire_c_check(&h, msg, len, &m, &json))
		return -EBADMSG;   /* checked on receipt already */
	if (ensure_buf(cn, cc))
		return -ENOMEM;
	if (!cn->s3_call) {
		err = -ENOSYS;
	} else {
		out = cn->s3_call(cn->s3_ctx, dm_c_op_name(m.op), (const char *)json, m.json_len,
				  &status, &olen);
		if (!out)
			err = -ENOMEM;
		else if (DM_WIRE_HDR_LEN + sizeof(r) + olen > DM_C_MAX_RESP)
			err = -EMSGSIZE;
	}
	rc = wait_idle(cc, conn, other, arg);
	if (rc) {
		free(out);
		return rc;
	}
	if (!err)
		r = (struct dm_wire_c_call){ .op = (uint32_t)status, .json_len = (uint32_t)olen };
	dm_wire_hdr_encode(cc->buf, DM_OP_C_CALL + 1,
			   (uint32_t)(DM_WIRE_HDR_LEN + sizeof(r) + r.json_len), err, h.req_id);
	dm_wire_c_call_encode(cc->buf + DM_WIRE_HDR_LEN, &r);
	if (r.json_len)
		memcpy(cc->buf + DM_WIRE_HDR_LEN + sizeof(r), out, r.json_len);
	free(out);
	rc = dm_conn_send(conn, CN_CALL_WR, cc->buf,
			  (uint32_t)(DM_WIRE_HDR_LEN + sizeof(r) + r.json_len), cc->mr,
			  DM_WR_SIGNALED);
	if (rc == 0)
		cc->busy = true;
	return rc;
}

void cn_call_fini(struct cn *cn, struct cn_call *cc)
{
	if (cc->mr)
		dm_xport_dereg(cn->x, cc->mr);
	free(cc->buf);
	memset(cc, 0, sizeof(*cc));
}
