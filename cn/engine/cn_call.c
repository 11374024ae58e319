/* cn_call.c: the compute node's side of the native client ops with long answers: C_CALL
 * (wire.h: run the S3 Vectors operation through the gateway, cn->s3_call, i.e. cn_s3_call)
 * and Q_ROUTER (the router's oracle for client-side routing). A connection's C_CALLs run on
 * its call threads ([cn] call_threads), so that several of its calls run at once; their
 * answers go out from the worker thread (the connection's owner) through registered answer
 * slots of DM_C_MAX_RESP bytes, one per thread. Q_ROUTER is answered at once from the
 * connection's own answer buffer. */
#include "cn.h"

#include <pthread.h>
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

/* ---- C_CALL: call threads per connection ---- */

struct call_job {
	struct call_job *next;
	uint64_t req_id;
	uint8_t *msg;                 /* the request (a copy) */
	uint32_t len;
	bool write;                   /* not Get*, List* or QueryVectors */
	char *out;                    /* the answer's JSON */
	size_t olen;
	int status, err;
};

struct cn_call_pool {
	struct cn *cn;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct call_job *todo, *todo_tail, *done, *done_tail;
	uint32_t nth, pending;        /* threads; calls submitted, not answered */
	uint32_t running;             /* calls running ... */
	bool wrunning;                /* ... one of them a write */
	bool stop;
	pthread_t th[DM_CN_MAX_CALL_THREADS];
	uint32_t nslots;              /* answer slots: one per thread */
	uint8_t *abuf;                /* nslots x DM_C_MAX_RESP, registered */
	struct dm_mr *amr;
	bool busy[DM_CN_MAX_CALL_THREADS];
	struct dm_notify *wake;       /* the worker's: an answer is ready */
};

static void job_run(struct cn *cn, struct call_job *j)
{
	struct dm_wire_hdr h;
	struct dm_wire_c_call m;
	const uint8_t *json;

	if (dm_wire_hdr_decode(j->msg, j->len, &h) || dm_wire_c_check(&h, j->msg, j->len, &m,
								       &json)) {
		j->err = -EBADMSG;        /* checked on receipt already */
		return;
	}
	j->req_id = h.req_id;
	if (!cn->s3_call) {
		j->err = -ENOSYS;
		return;
	}
	j->out = cn->s3_call(cn->s3_ctx, dm_c_op_name(m.op), (const char *)json, m.json_len,
			     &j->status, &j->olen);
	if (!j->out)
		j->err = -ENOMEM;
	else if (DM_WIRE_HDR_LEN + sizeof(struct dm_wire_c_call) + j->olen > DM_C_MAX_RESP)
		j->err = -EMSGSIZE;
}

/* Whether the oldest waiting call may start: calls start in the order they came, reads
 * (Get*, List*, QueryVectors) side by side, a write only once every earlier call finished
 * and nothing after it until it finished: the connection's order of writes and of reads
 * against writes is kept (a put split into several calls applies as a prefix, last
 * version of a key wins), while its queries run concurrently. */
static bool may_start(const struct cn_call_pool *p)
{
	return p->todo && !p->wrunning && (!p->todo->write || !p->running);
}

static void *call_thread(void *arg)
{
	struct cn_call_pool *p = arg;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		struct call_job *j;

		while (!may_start(p) && !(p->stop && !p->todo))
			pthread_cond_wait(&p->cv, &p->mu);
		if (!may_start(p))
			break;            /* stopping with nothing to start */
		j = p->todo;
		p->todo = j->next;
		p->running++;
		p->wrunning = j->write;
		if (may_start(p))
			pthread_cond_signal(&p->cv);
		pthread_mutex_unlock(&p->mu);
		job_run(p->cn, j);
		free(j->msg);
		j->msg = NULL;
		j->next = NULL;
		pthread_mutex_lock(&p->mu);
		p->running--;
		if (j->write)
			p->wrunning = false;
		if (p->done_tail)
			p->done_tail->next = j;
		else
			p->done = j;
		p->done_tail = j;
		pthread_cond_broadcast(&p->cv);
		if (p->wake)
			dm_notify_wake(p->wake);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static struct cn_call_pool *pool_new(struct cn *cn, struct dm_notify *wake)
{
	struct cn_call_pool *p = calloc(1, sizeof(*p));
	uint32_t n = cn->node->cnc.call_threads ? cn->node->cnc.call_threads : 8;

	if (!p)
		return NULL;
	n = DM_MIN(n, DM_CN_MAX_CALL_THREADS);
	p->cn = cn;
	p->wake = wake;
	p->nslots = n;
	p->abuf = aligned_alloc(64, (size_t)n * DM_C_MAX_RESP);
	if (!p->abuf || dm_xport_reg(cn->x, p->abuf, (size_t)n * DM_C_MAX_RESP, 0, &p->amr))
		goto err_free;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	for (; p->nth < n; p->nth++)
		if (pthread_create(&p->th[p->nth], NULL, call_thread, p))
			break;
	if (!p->nth) {
		pthread_cond_destroy(&p->cv);
		pthread_mutex_destroy(&p->mu);
		dm_xport_dereg(cn->x, p->amr);
		goto err_free;
	}
	return p;
err_free:
	free(p->abuf);
	free(p);
	return NULL;
}

int cn_call_submit(struct cn *cn, struct cn_call *cc, const uint8_t *msg, uint32_t len)
{
	struct call_job *j;

	if (!cc->pool && !(cc->pool = pool_new(cn, cc->wake)))
		return -ENOMEM;
	j = calloc(1, sizeof(*j));
	if (!j || !(j->msg = malloc(len))) {
		free(j);
		return -ENOMEM;
	}
	memcpy(j->msg, msg, len);
	j->len = len;
	{
		struct dm_wire_hdr h;
		struct dm_wire_c_call m;
		const uint8_t *json;
		const char *op = NULL;

		if (!dm_wire_hdr_decode(msg, len, &h) && !dm_wire_c_check(&h, msg, len, &m, &json))
			op = dm_c_op_name(m.op);
		j->write = !op || !(!strncmp(op, "Get", 3) || !strncmp(op, "List", 4) ||
				    !strcmp(op, "QueryVectors"));
	}
	struct cn_call_pool *p = cc->pool;

	pthread_mutex_lock(&p->mu);
	if (p->todo_tail && p->todo)
		p->todo_tail->next = j;
	else
		p->todo = j;
	p->todo_tail = j;
	p->pending++;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	return 0;
}

int cn_call_flush(struct cn_call *cc, struct dm_conn *conn)
{
	struct cn_call_pool *p = cc->pool;
	int rc = 0;

	if (!p)
		return 0;
	for (;;) {
		struct call_job *j = NULL;
		uint32_t slot;

		pthread_mutex_lock(&p->mu);
		for (slot = 0; slot < p->nslots && p->busy[slot]; slot++)
			;
		if (p->done && slot < p->nslots) {
			j = p->done;
			p->done = j->next;
			if (!p->done)
				p->done_tail = NULL;
			p->busy[slot] = true;
			p->pending--;
		}
		uint32_t pending = p->pending;

		pthread_mutex_unlock(&p->mu);
		if (!j)
			return (int)pending;
		uint8_t *buf = p->abuf + (size_t)slot * DM_C_MAX_RESP;
		struct dm_wire_c_call r = { 0 };

		if (!j->err)
			r = (struct dm_wire_c_call){ .op = (uint32_t)(j->status ? j->status : 200),
						     .json_len = (uint32_t)j->olen };
		dm_wire_hdr_encode(buf, DM_OP_C_CALL + 1,
				   (uint32_t)(DM_WIRE_HDR_LEN + sizeof(r) + r.json_len), j->err,
				   j->req_id);
		dm_wire_c_call_encode(buf + DM_WIRE_HDR_LEN, &r);
		if (r.json_len)
			memcpy(buf + DM_WIRE_HDR_LEN + sizeof(r), j->out, r.json_len);
		free(j->out);
		free(j);
		rc = dm_conn_send(conn, CN_CALL_ASYNC_WR | slot, buf,
				  (uint32_t)(DM_WIRE_HDR_LEN + sizeof(r) + r.json_len), p->amr,
				  DM_WR_SIGNALED);
		if (rc)
			return rc;
	}
}

void cn_call_sent(struct cn_call *cc, uint32_t slot)
{
	struct cn_call_pool *p = cc->pool;

	if (!p || slot >= p->nslots)
		return;
	pthread_mutex_lock(&p->mu);
	p->busy[slot] = false;
	pthread_mutex_unlock(&p->mu);
}

static void pool_free(struct cn *cn, struct cn_call_pool *p)
{
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (uint32_t i = 0; i < p->nth; i++)
		pthread_join(p->th[i], NULL);
	for (struct call_job *l[2] = { p->todo, p->done }, **q = l; q < l + 2; q++)
		while (*q) {
			struct call_job *j = *q;

			*q = j->next;
			free(j->msg);
			free(j->out);
			free(j);
		}
	dm_xport_dereg(cn->x, p->amr);
	free(p->abuf);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

void cn_call_fini(struct cn *cn, struct cn_call *cc)
{
	if (cc->pool)
		pool_free(cn, cc->pool);
	if (cc->mr)
		dm_xport_dereg(cn->x, cc->mr);
	free(cc->buf);
	memset(cc, 0, sizeof(*cc));
}
