/* cn_worker.c: a compute node worker: serves one client connection with up to DEPTH
 * queries in flight, each an explicit state machine (hnsw_query). When a query expands a
 * candidate, the records of all its unvisited neighbours are taken from the shared cache
 * or, for the rest, READ from their memory nodes with one doorbell per memory node; the
 * worker then serves the other queries until those READs complete (posting, completions,
 * memory-node connections and read failover: cn_read.c). Records that fail validation are
 * read again. Per-query counters travel back with each result.
 *
 * Routing (router.h): a client's query may be sent to another compute node through a random
 * memory node (FWD_QUERY on the worker's connection to that node); its answer comes back on
 * the same connection and goes to the client. A worker in SERVE mode has a memory node's
 * SERVE connection as its client: it runs the forwarded queries that arrive there and sends
 * their answers back wrapped in FWD_RESULT. */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cn_worker_int.h"

static const struct hnsw_rec_hdr *stage_get(struct hnsw_src *s, uint32_t id)
{
	struct worker *w = s->ctx;
	struct qslot *q = w->cur;

	for (uint32_t j = 0; j < q->q->nbatch; j++)
		if (q->q->batch[j] == id)
			return (const struct hnsw_rec_hdr *)(q->stage +
							     (size_t)j * slot_view(w, q)->rec_size);
	return NULL;
}

/* ---- sending ---------------------------------------------------------------------------- */

static int send_slot(struct worker *w)
{
	for (int i = 0; i < SEND_SLOTS; i++)
		if (w->sfree[i])
			return i;
	return -1;
}

/* Send header + pre + body on conn from a free send slot; -EAGAIN when all are in flight. */
static int send_on(struct worker *w, struct dm_conn *conn, uint16_t op, uint64_t req_id,
		   int32_t status, const uint8_t *pre, uint32_t plen, const uint8_t *body,
		   uint32_t blen)
{
	int s = send_slot(w), rc;
	uint8_t *b;

	if (s < 0)
		return -EAGAIN;
	if (DM_WIRE_HDR_LEN + plen + blen > SEND_SLOT_SIZE)
		return -EMSGSIZE;
	b = w->sbuf + (size_t)s * SEND_SLOT_SIZE;
	dm_wire_hdr_encode(b, op, DM_WIRE_HDR_LEN + plen + blen, status, req_id);
	if (plen)
		memcpy(b + DM_WIRE_HDR_LEN, pre, plen);
	if (blen)
		memcpy(b + DM_WIRE_HDR_LEN + plen, body, blen);
	rc = dm_conn_send(conn, WR_SEND_TAG | (uint64_t)s, b, DM_WIRE_HDR_LEN + plen + blen,
			  w->smr, DM_WR_SIGNALED);
	if (rc == 0) {
		w->sfree[s] = false;
		w->sconn[s] = -1;
		for (uint32_t m = 0; conn != w->client && m < w->nmn; m++)
			if (w->mc[m] == conn)
				w->sconn[s] = (int16_t)m;
	}
	return rc;
}

/* Send header + body to the client; -EAGAIN when all send slots are in flight. */
static int send_msg(struct worker *w, uint16_t op, uint64_t req_id, int32_t status,
		    const uint8_t *body, uint32_t blen)
{
	return send_on(w, w->client, op, req_id, status, NULL, 0, body, blen);
}

/* Send a query's result (or its error); -EAGAIN keeps it for later. */
static int send_result(struct worker *w, struct qslot *q)
{
	uint8_t out[DM_FWD_INNER_OFF + sizeof(struct dm_wire_q_result) + 16 * DM_Q_MAX_K];
	uint8_t *body = out + DM_FWD_INNER_OFF;   /* room for FWD_RESULT's wrapping */
	struct dm_wire_q_result r = { .qid = q->qid, .reads = q->reads, .bytes = q->bytes,
				      .round_trips = q->round_trips, .cache_hits = q->cache_hits,
				      .rereads = q->rereads,
				      .latency_ns = dm_now_ns() - q->t0 };
	int rc;

	if (q->nhits < 0) {
		/* Extract once: the query's heap is consumed by it. */
		q->nhits = q->err ? 0 : hnsw_query_results(q->q, q->hits);
		if (q->nhits < 0) {
			q->err = q->nhits;
			q->nhits = 0;
		}
	}
	r.n = (uint32_t)q->nhits;
	r.hops = q->err ? 0 : (uint32_t)q->q->hops;
	/* What a client-side router follows: who ran it, the epoch, the queue. */
	r.cn = w->cn->node->id;
	r.qlen = atomic_load(&w->cn->qlen);
	{
		uint32_t strategy;

		r.rflags = (router_epoch(w->cn->rt, &r.epoch, &strategy) ? DM_Q_R_ORACLE : 0) |
			   (q->fwded ? DM_Q_R_RELAYED : 0) | strategy << DM_Q_R_STRATEGY_SHIFT;
	}
	dm_wire_q_result_encode(body, &r);
	for (int i = 0; i < q->nhits; i++) {
		/* The distance docs/api.md defines: L2 (the search ranks by its square), 1 - cos,
		 * the negated inner product. */
		float d = q->hits[i].dist;
		struct dm_wire_q_hit h = { .id = hnsw_label(slot_view(w, q)->labels,
							    slot_view(w, q)->nlabels,
							    q->hits[i].id),
					   .dist = q->l2 ?
						   sqrtf(d > 0 ? d : 0) : d };

		dm_wire_q_hit_encode(body + sizeof(r) + 16 * (size_t)i, &h);
	}
	if (q->fwded) {
		/* fwd | inner Q_SEARCH+1 message, back to the origin through the memory node. */
		uint32_t ilen = DM_WIRE_HDR_LEN + (uint32_t)(sizeof(r) + 16 * (size_t)q->nhits);

		dm_wire_fwd_encode(out, &q->fwd);
		dm_wire_hdr_encode(out + sizeof(q->fwd), DM_OP_Q_SEARCH + 1, ilen, q->err, q->qid);
		rc = send_msg(w, DM_OP_FWD_RESULT, q->qid, 0, out,
			      (uint32_t)sizeof(q->fwd) + ilen);
	} else {
		rc = send_msg(w, DM_OP_Q_SEARCH + 1, q->qid, q->err, body,
			      (uint32_t)(sizeof(r) + 16 * (size_t)q->nhits));
	}
	if (rc == -EAGAIN)
		return rc;
	if (rc)
		w->client_gone = true;
	atomic_fetch_add(&w->cn->queries, 1);
	if (q->err) {
		atomic_fetch_add(&w->cn->errors, 1);
	} else {
		uint32_t mns = 0;

		for (size_t i = 0; i < DM_ARRAY_SIZE(q->loc_mn); i++)
			mns += (uint32_t)__builtin_popcountll(q->loc_mn[i]);
		atomic_fetch_add_explicit(&w->cn->loc_queries, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&w->cn->loc_q_mns, mns, memory_order_relaxed);
		atomic_fetch_add_explicit(&w->cn->loc_q_blocks, q->loc_nblk, memory_order_relaxed);
		atomic_fetch_add_explicit(&w->cn->loc_rts, q->round_trips, memory_order_relaxed);
		atomic_fetch_add_explicit(&w->cn->loc_rt_mns, q->loc_rt_mns, memory_order_relaxed);
	}
	atomic_fetch_sub(&w->cn->qlen, 1);
	q->state = S_FREE;
	return 0;
}

/* ---- queries ---------------------------------------------------------------------------- */

/* Batch entry j has been torn on every replica for longer than a writer holds a record
 * (CN_INSERT_LOCK_LEASE_NS): its writer died holding it, and with one replica no whole copy
 * is left. Use the copy read last, salvaged (hnsw_rec_salvage: a mix of a back-link's old
 * and new fields) and cached, so that queries go on; the next insert that links to the
 * record writes it back whole (cn_insert.c break_lock). false: not salvageable. */
static bool salvage(struct worker *w, struct qslot *q, uint32_t j, uint64_t now)
{
	const struct dindex *d = slot_view(w, q);
	struct dm_cache *cache = d == w->cn->views[0].cur ? w->cn->cache : NULL;
	struct hnsw_rec_hdr *r = (struct hnsw_rec_hdr *)(q->stage + (size_t)j * d->rec_size);

	if (!hnsw_rec_salvage(r, d->p.M, d->rec_size, d->cap, q->q->batch[j]))
		return false;
	q->remote[j] = 0;
	atomic_fetch_add_explicit(&w->cn->salvaged, 1, memory_order_relaxed);
	if (now - w->salvage_log > 1000000000ull) {
		w->salvage_log = now;
		dm_warn("cn%u: record %u: still torn on every replica after %u ms of reading (a "
			"writer died holding it): read salvaged", w->cn->node->id,
			q->q->batch[j], (unsigned)(CN_INSERT_LOCK_LEASE_NS / 1000000));
	}
	if (cache && (r->level >= w->cn->pin_level || !q->spilled))
		dm_cache_put(cache, q->q->batch[j], r, r->level >= w->cn->pin_level);
	return true;
}

/* All READs of the batch are in: validate, cache, and run the query to its next fetch. */
void cn_worker_advance(struct worker *w, struct qslot *q)
{
	const struct dindex *d = slot_view(w, q);
	struct dm_cache *cache = d == w->cn->views[0].cur ? w->cn->cache : NULL;
	bool again = false;
	int rc;

	if (q->err) {
		q->state = S_DONE;
		return;
	}
	if (q->repost) {
		q->state = S_ISSUE;   /* READs of this batch still wait for a send queue */
		return;
	}
	for (uint32_t j = 0; j < q->q->nbatch; j++) {
		const struct hnsw_rec_hdr *r;

		if (q->remote[j] != 1)
			continue;
		r = (const struct hnsw_rec_hdr *)(q->stage + (size_t)j * d->rec_size);
		if (!dindex_rec_ok(d, r)) {
			/* Torn or garbage: read it again. */
			again = true;
			q->rereads++;
			atomic_fetch_add_explicit(&w->cn->rereads, 1, memory_order_relaxed);
			q->remote[j] = 3;
			continue;
		}
		q->remote[j] = 0;
		if (cache) {
			bool pin = r->level >= w->cn->pin_level;

			/* A spilled query still uses the cache but leaves the top levels alone. */
			if (pin || !q->spilled)
				dm_cache_put(cache, q->q->batch[j], r, pin);
		}
	}
	if (again) {
		if (q->rereads_left-- == 0) {
			/* Torn every time on this replica: the next one. */
			uint64_t now = dm_now_ns(), age = now - q->t0;
			bool young = age < READ_TIMEOUT_NS;

			again = false;
			for (uint32_t j = 0; j < q->q->nbatch; j++) {
				size_t b = (size_t)(q->q->batch[j] >> d->p.block_shift) * d->nrep;
				bool left = false;

				if (q->remote[j] != 3)
					continue;
				q->tried[j] |= (uint8_t)(1u << q->rrep[j]);
				atomic_fetch_add_explicit(&w->cn->failovers, 1,
							  memory_order_relaxed);
				for (uint32_t r = 0; r < d->nrep; r++)
					left |= d->block_mn[b + r] != DINDEX_NO_MN &&
						d->block_addr[b + r] && !((q->tried[j] >> r) & 1);
				if (!left && age >= CN_INSERT_LOCK_LEASE_NS &&
				    salvage(w, q, j, now))
					continue;
				/* Torn on every replica: a writer holds the record (an online
				 * insert's back-link); read it again from the first, for as long
				 * as a READ may take. */
				if (!left && young)
					q->tried[j] = 0;
				again = true;
			}
			q->rereads_left = MAX_REREADS;
		}
	}
	if (again) {
		q->repost = true;
		q->state = S_ISSUE;
		return;
	}
	w->cur = q;
	rc = hnsw_query_step(q->q, &w->v[q->g].src);
	if (rc == HNSW_Q_FETCH) {
		memset(q->remote, 0, q->q->nbatch);
		memset(q->tried, 0, q->q->nbatch);
		q->rereads_left = MAX_REREADS;
		q->state = S_ISSUE;
	} else {
		if (rc < 0)
			fail(q, rc);
		q->state = S_DONE;
	}
}

/* Start a query from a Q_SEARCH message into a free slot; spilled: it runs off its
 * top-ranked CN. */
static void start(struct worker *w, struct qslot *q, const uint8_t *msg, uint32_t len,
		  bool spilled)
{
	struct dm_wire_q_search s;
	float vec[DM_Q_MAX_DIM];
	const struct dindex *d;
	int rc;

	struct hnsw_query *hq = q->q;
	uint8_t *remote = q->remote, *rrep = q->rrep, *tried = q->tried;
	struct dm_hit *hits = q->hits;
	uint32_t *loc_blk = q->loc_blk;

	memset(q, 0, sizeof(*q));
	q->q = hq;
	q->remote = remote;
	q->rrep = rrep;
	q->tried = tried;
	q->hits = hits;
	q->loc_blk = loc_blk;
	if (loc_blk)
		memset(loc_blk, 0, LOC_BLK_SLOTS * sizeof(*loc_blk));
	q->nhits = -1;
	q->stage = w->stage_mem ? w->stage_mem + (size_t)(q - w->slot) * w->stage_size : NULL;
	q->t0 = dm_now_ns();
	dm_wire_q_search_decode(msg + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &s);
	q->qid = s.qid;
	q->k = s.k;
	q->state = S_DONE;
	q->rereads_left = MAX_REREADS;
	q->spilled = spilled && !router_spill_cache(w->cn->rt);
	q->g = s.graph;   /* < DM_MAX_GRAPHS: checked by the decoder */
	d = slot_view(w, q);
	if (!d) {
		q->err = -ENOENT;
		return;
	}
	if (s.dim != d->p.dim) {
		q->err = -EINVAL;
		return;
	}
	q->l2 = d->p.metric == DM_METRIC_L2;
	if (!q->q || q->q->dim != d->p.dim) {
		/* the slot's last query was of another graph's dimension */
		hnsw_query_free(q->q);
		q->q = hnsw_query_new(d->p.dim);
		if (!q->q) {
			q->err = -ENOMEM;
			return;
		}
	}
	dm_wire_get_f32s(msg + DM_WIRE_HDR_LEN + sizeof(s), vec, s.dim);
	for (uint32_t i = 0; i < s.dim; i++)
		if (!(vec[i] == vec[i]) || vec[i] > 3e38f || vec[i] < -3e38f) {
			q->err = -EINVAL;
			return;
		}
	rc = hnsw_query_start_b(q->q, &w->v[q->g].src, vec, s.k, s.ef ? s.ef : s.k,
				DM_MAX(1u, s.flags & DM_Q_BEAM_MASK));
	if (rc) {
		q->err = rc;
		return;
	}
	w->cur = q;
	rc = hnsw_query_step(q->q, &w->v[q->g].src);
	if (rc == HNSW_Q_FETCH) {
		memset(q->remote, 0, q->q->nbatch);
		memset(q->tried, 0, q->q->nbatch);
		q->state = S_ISSUE;
	} else if (rc < 0) {
		q->err = rc;
	}
}

/* ---- the loop --------------------------------------------------------------------------- */

/* Staging for the views bound: per slot, room for the largest batch (2M + 1 records, or a
 * beam) of the largest record size among them. */
static void stage_need(const struct worker *w, uint32_t *recs, size_t *size)
{
	uint32_t rs = 0;

	*recs = DM_Q_MAX_BEAM;
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		const struct dindex *d = w->v[g].d;

		if (!d)
			continue;
		*recs = DM_MAX(*recs, 2 * d->p.M + 1);
		rs = DM_MAX(rs, d->rec_size);
	}
	*size = (size_t)*recs * rs;
}

/* (Re)allocate the staging buffers and the per-slot arrays sized by them (every slot free,
 * no READ outstanding). 0 or -errno. */
static int restage(struct worker *w)
{
	struct cn *cn = w->cn;
	uint32_t recs;
	size_t size;

	stage_need(w, &recs, &size);
	w->restage = false;
	if (!size || (w->stage_mem && recs <= w->stage_recs && size <= w->stage_size))
		return 0;
	if (w->stage_mr) {
		dm_xport_dereg(cn->x, w->stage_mr);
		w->stage_mr = NULL;
	}
	free(w->stage_mem);
	free(w->wrs);
	w->stage_recs = recs;
	w->stage_size = DM_ALIGN_UP(size, 64);
	w->stage_mem = aligned_alloc(64, DEPTH * w->stage_size);
	w->wrs = calloc(w->stage_recs, sizeof(*w->wrs));
	if (!w->stage_mem || !w->wrs)
		goto out_nomem;
	for (int i = 0; i < DEPTH; i++) {
		struct qslot *q = &w->slot[i];

		free(q->remote);
		free(q->rrep);
		free(q->tried);
		q->remote = calloc(w->stage_recs, 1);
		q->rrep = calloc(w->stage_recs, 1);
		q->tried = calloc(w->stage_recs, 1);
		if (!q->hits)
			q->hits = malloc(DM_Q_MAX_K * sizeof(struct dm_hit));
		if (!q->loc_blk)
			q->loc_blk = calloc(LOC_BLK_SLOTS, sizeof(*q->loc_blk));
		if (!q->remote || !q->rrep || !q->tried || !q->hits || !q->loc_blk)
			goto out_nomem;
	}
	return dm_xport_reg(cn->x, w->stage_mem, DEPTH * w->stage_size, 0, &w->stage_mr);

out_nomem:
	/* nothing starts until a later restage succeeds */
	free(w->stage_mem);
	w->stage_mem = NULL;
	w->stage_size = 0;
	w->restage = true;
	return -ENOMEM;
}

/* Bind graph g to cn's current view of it. The view counts its workers: cn_refresh frees
 * an old one when none is left. */
static void bind_graph(struct worker *w, uint32_t g)
{
	struct dindex *d = w->cn->views[g].cur;
	struct wview *v = &w->v[g];

	if (v->d)
		atomic_fetch_sub(&v->d->users, 1);
	if (d)
		atomic_fetch_add(&d->users, 1);
	v->d = d;
	v->draining = false;
	if (d) {
		dindex_src(d, &v->src);
		if (w->cn->node && w->cn->node->cnc.ef_upper)
			v->src.ef_upper = w->cn->node->cnc.ef_upper;   /* [cn] ef_upper */
		v->src.get = stage_get;
		v->src.ctx = w;
	}
}

/* Follow cn's views (read lock held): a graph with no query in flight is bound to its new
 * view at once; one with queries in flight drains first (they finish on the old view, new
 * ones wait). Staging grows once every slot is free. */
static void sync_views(struct worker *w)
{
	bool busy[DM_MAX_GRAPHS] = { false }, any = false;
	uint32_t recs;
	size_t size;

	for (int i = 0; i < DEPTH; i++)
		if (w->slot[i].state != S_FREE) {
			busy[w->slot[i].g] = true;
			any = true;
		}
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		if (w->v[g].d == w->cn->views[g].cur)
			w->v[g].draining = false;
		else if (busy[g])
			w->v[g].draining = true;
		else
			bind_graph(w, g);
	}
	stage_need(w, &recs, &size);
	w->restage = size && (!w->stage_mem || recs > w->stage_recs || size > w->stage_size);
	if (w->restage && !any && restage(w))
		dm_err("cn%u: out of memory for a worker's staging buffers", w->cn->node->id);
}

/* Whether cn's views differ from the worker's (read lock held). */
static bool views_moved(const struct worker *w)
{
	if (w->restage)
		return true;
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
		if (w->v[g].d != w->cn->views[g].cur)
			return true;
	return false;
}

/* Fail everything in flight (the memory-node set changed underneath) and reconnect. */
static void rebind(struct worker *w)
{
	for (int i = 0; i < DEPTH; i++)
		if (w->slot[i].state != S_FREE && w->slot[i].state != S_DONE) {
			fail(&w->slot[i], -ESTALE);
			w->slot[i].state = S_DONE;
		}
	/* Closing flushes outstanding READs before their staging memory is reused. */
	cn_read_close_all(w);
	for (int i = 0; i < DEPTH; i++)
		if (w->slot[i].state == S_DONE)
			send_result(w, &w->slot[i]);
	w->gen = atomic_load(&w->cn->gen);
	/* new addresses: every graph is bound again (the failed slots still waiting for a
	 * send slot hold no view) */
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		if (w->v[g].d)
			atomic_fetch_sub(&w->v[g].d->users, 1);
		w->v[g].d = NULL;
	}
	sync_views(w);
	cn_read_sync(w);
}

/* Answers of forwarded queries waiting for the client: send what the send slots allow. */
static bool send_fres(struct worker *w)
{
	struct cn *cn = w->cn;
	uint32_t done = 0;

	while (done < w->nfres) {
		uint64_t wr = (w->fres[done] & BL_INDEX) | DM_RPC_RECV_TAG;
		uint8_t *in = dm_msgpool_buf(cn->pool, wr) + DM_FWD_INNER_OFF;
		struct dm_wire_hdr ih;
		int rc;

		dm_wire_hdr_decode(in, (uint32_t)(w->fres[done] >> 32) - DM_FWD_INNER_OFF, &ih);
		rc = send_msg(w, ih.op, ih.req_id, ih.status, in + DM_WIRE_HDR_LEN,
			      ih.length - DM_WIRE_HDR_LEN);
		if (rc == -EAGAIN)
			break;
		if (rc)
			w->client_gone = true;
		dm_msgpool_repost(cn->pool, wr);
		done++;
	}
	memmove(w->fres, w->fres + done, (w->nfres - done) * sizeof(uint64_t));
	w->nfres -= done;
	return done > 0;
}

static void take_search(struct worker *w, uint64_t wr_id, uint32_t len, bool can_start,
			uint32_t fl);

/* Answer forwarded queries that will not come back (connection closed, their compute node
 * declared down by the cluster state, or no answer within FWD_TIMEOUT_NS) with
 * -ECONNABORTED: the query was not run here, the client may send it again (libdmann does,
 * once, to a CN the router no longer sends to a dead one). */
static void fail_lost_forwards(struct worker *w)
{
	uint64_t now = dm_now_ns();

	if (!w->fwd_out || now - w->fq_check < 100000000ull)
		return;
	w->fq_check = now;
	for (int j = 0; j < FWD_TRACK; j++) {
		struct fwdq *f = &w->fq[j];
		struct dm_wire_q_result r = { 0 };
		uint8_t body[sizeof(r)];
		int err;

		if (!f->used || (!f->failed && now - f->t0 < FWD_TIMEOUT_NS &&
				 !atomic_load(&w->cn->state_cn_down[f->target])))
			continue;
		err = -ECONNABORTED;
		r.qid = f->qid;
		r.cn = w->cn->node->id;
		dm_wire_q_result_encode(body, &r);
		if (send_msg(w, DM_OP_Q_SEARCH + 1, f->qid, err, body, sizeof(body)) == -EAGAIN)
			return;
		dm_warn("cn%u: forwarded query %llu lost (%s): answered %s", w->cn->node->id,
			(unsigned long long)f->qid, f->failed ? "its memory-node connection closed" :
			now - f->t0 >= FWD_TIMEOUT_NS ? "no answer in time" :
			"its compute node is declared down", strerror(-err));
		atomic_fetch_add(&w->cn->errors, 1);
		f->used = false;
		w->fwd_out--;
	}
}

/* A message from a memory node: the answer of a query we forwarded, or the query itself
 * when the memory node could not deliver it. */
static void on_mn_recv(struct worker *w, const struct dm_wc *wc)
{
	struct cn *cn = w->cn;
	uint8_t *buf = dm_msgpool_buf(cn->pool, wc->wr_id);
	struct dm_wire_hdr h;

	if (!buf)
		return;
	if (wc->status || dm_wire_hdr_decode(buf, wc->byte_len, &h) ||
	    dm_wire_fwd_check(&h, buf, wc->byte_len) ||
	    (h.op != DM_OP_FWD_RESULT && h.op != DM_OP_FWD_BOUNCE)) {
		if (!wc->status)
			dm_warn("cn%u: unexpected message from a memory node dropped", cn->node->id);
		dm_msgpool_repost(cn->pool, wc->wr_id);
		return;
	}
	{
		/* Match the answer with its forwarded query; one that already failed (timeout,
		 * closed connection) was answered with an error: drop it. */
		const uint8_t *in = buf + DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN;
		uint64_t qid = dm_get_le64(in);   /* first field of both search and result */
		int j;

		for (j = 0; j < FWD_TRACK; j++)
			if (w->fq[j].used && !w->fq[j].failed && w->fq[j].qid == qid)
				break;
		if (j == FWD_TRACK) {
			dm_msgpool_repost(cn->pool, wc->wr_id);
			return;
		}
		w->fq[j].used = false;
		w->fwd_out--;
	}
	if (h.op == DM_OP_FWD_BOUNCE) {
		router_count(cn->rt, RC_BOUNCED);
		take_search(w, wc->wr_id, wc->byte_len, true, BL_BOUNCED);
		return;
	}
	if (w->nfres == DM_ARRAY_SIZE(w->fres) && !send_fres(w)) {
		dm_warn("cn%u: too many forwarded answers waiting for client %s; one dropped",
			cn->node->id, w->client->peer);
		dm_msgpool_repost(cn->pool, wc->wr_id);
		return;
	}
	w->fres[w->nfres++] = (wc->wr_id & BL_INDEX) | ((uint64_t)wc->byte_len << 32);
	send_fres(w);
}

/* Send a client's query (the whole message in buf) to the CN the router picks, through a
 * random memory node. false: it runs here, *spilled telling whether this CN is not its
 * top-ranked one. */
static bool route_away(struct worker *w, const uint8_t *buf, uint32_t len, bool *spilled)
{
	struct cn *cn = w->cn;
	struct dm_wire_q_search s;
	struct dm_wire_fwd f = { .origin = cn->node->id };
	uint8_t pre[sizeof(f)];
	float vec[DM_Q_MAX_DIM];
	uint32_t m0, m, top;

	*spilled = false;
	dm_wire_q_search_decode(buf + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &s);
	/* the router's partitions are graph 0's: other graphs' queries run where they arrive */
	if (s.graph || !w->v[0].d || s.dim != w->v[0].d->p.dim ||
	    DM_FWD_INNER_OFF + len > SEND_SLOT_SIZE ||
	    w->fwd_out == FWD_TRACK)
		return false;
	dm_wire_get_f32s(buf + DM_WIRE_HDR_LEN + sizeof(s), vec, s.dim);
	for (uint32_t i = 0; i < s.dim; i++)
		if (!(vec[i] == vec[i]) || vec[i] > 3e38f || vec[i] < -3e38f)
			return false;   /* start() reports the error */
	if (s.flags & DM_Q_F_ROUTED) {
		f.target = router_admit(cn->rt, vec, s.dim, s.epoch, s.flags & DM_Q_F_SPILLED,
					&top, spilled);
	} else {
		f.target = router_route(cn->rt, vec, s.dim, &top);
		*spilled = top != cn->node->id;
	}
	if (f.target == cn->node->id || w->nmn == 0)
		return false;
	f.flags = (f.target != top ? DM_FWD_F_SPILLED : 0) |
		  (top == cn->node->id ? DM_FWD_F_ORIGIN_TOP : 0);
	w->rng = w->rng * 1103515245u + 12345u;
	m0 = (w->rng >> 16) % w->nmn;
	for (uint32_t i = 0; i < w->nmn; i++) {
		m = (m0 + i) % w->nmn;
		if (!w->mc[m])
			continue;
		if (!w->hello[m]) {
			struct dm_wire_fwd_hello h = { .cn = cn->node->id, .role = DM_FWD_ROLE_ORIGIN };
			uint8_t hb[sizeof(h)];

			dm_wire_fwd_hello_encode(hb, &h);
			if (send_on(w, w->mc[m], DM_OP_FWD_HELLO, 0, 0, NULL, 0, hb, sizeof(hb)))
				continue;
			w->hello[m] = true;
		}
		dm_wire_fwd_encode(pre, &f);
		if (send_on(w, w->mc[m], DM_OP_FWD_QUERY, 0, 0, pre, sizeof(pre), buf, len))
			continue;
		router_count(cn->rt, RC_FORWARDED);
		for (int j = 0; j < FWD_TRACK; j++)
			if (!w->fq[j].used) {
				w->fq[j] = (struct fwdq){ .qid = s.qid, .t0 = dm_now_ns(),
							  .m = (uint16_t)m,
							  .target = (uint16_t)f.target,
							  .used = true };
				break;
			}
		w->fwd_out++;
		return true;
	}
	return false;
}

/* Route a query or start it in a free slot; true when its buffer was consumed (reposted).
 * A query routed here that finds no free slot gets BL_LOCAL (+ BL_SPILLED) in *flp, so that
 * it is not routed (and counted in the batch) again when it is retried. */
static bool dispatch(struct worker *w, uint64_t wr_id, uint32_t len, uint32_t *flp)
{
	struct cn *cn = w->cn;
	uint8_t *buf = dm_msgpool_buf(cn->pool, wr_id);
	uint32_t fl = *flp, off = fl & (BL_FWD | BL_BOUNCED) ? DM_FWD_INNER_OFF : 0;
	struct dm_wire_fwd f = { 0 };
	bool spilled = fl & BL_SPILLED;
	struct dm_wire_q_search s;

	/* Its graph (the message was checked on receipt). A new generation of it: start
	 * nothing on the old view; larger staging needed: start nothing at all. */
	dm_wire_q_search_decode(buf + off + DM_WIRE_HDR_LEN, len - off - DM_WIRE_HDR_LEN, &s);
	if (w->restage || w->v[s.graph].draining)
		return false;
	if (!off && !(fl & BL_LOCAL) && !w->serve && router_active(cn->rt)) {
		if (router_paused(cn->rt))
			return false;   /* routing pauses: the query waits in the intake */
		if (route_away(w, buf, len, &spilled)) {
			dm_msgpool_repost(cn->pool, wr_id);
			return true;
		}
		*flp = fl | BL_LOCAL | (spilled ? BL_SPILLED : 0);
	}
	if (off) {
		/* A forwarded query: spilled here unless this CN is its top-ranked one; one of
		 * our own coming back undelivered: spilled unless we are. */
		dm_wire_fwd_decode(buf + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &f);
		spilled = fl & BL_FWD ? (f.flags & DM_FWD_F_SPILLED) != 0 :
			  !(f.flags & DM_FWD_F_ORIGIN_TOP);
	}
	for (int i = 0; i < DEPTH; i++)
		if (w->slot[i].state == S_FREE) {
			struct qslot *q = &w->slot[i];

			start(w, q, buf + off, len - off, spilled);
			if (fl & BL_FWD) {
				q->fwd = f;
				q->fwded = true;
				router_count(cn->rt, RC_RECEIVED);
			} else if (!(fl & BL_BOUNCED)) {
				router_count(cn->rt, RC_LOCAL);
			}
			atomic_fetch_add(&cn->qlen, 1);
			dm_msgpool_repost(cn->pool, wr_id);
			return true;
		}
	return false;
}

/* A search message into a free slot (or to another CN), or the backlog (its buffer is then
 * held: the client runs out of receive credit, which is the back-pressure). can_start is
 * false when the caller does not hold the read lock. */
static void take_search(struct worker *w, uint64_t wr_id, uint32_t len, bool can_start,
			uint32_t fl)
{
	if (can_start && !w->nbacklog && dispatch(w, wr_id, len, &fl))
		return;
	if (w->nbacklog == DM_ARRAY_SIZE(w->backlog)) {
		dm_warn("cn%u: client %s exceeds %zu queries in flight; closing",
			w->cn->node->id, w->client->peer, DM_ARRAY_SIZE(w->backlog) + DEPTH);
		dm_msgpool_repost(w->cn->pool, wr_id);
		w->client_gone = true;
		return;
	}
	/* The local queue counts queries assigned to this CN (forwarded here, bounced back or
	 * routed here), not those still to be routed. */
	if (fl)
		atomic_fetch_add(&w->cn->qlen, 1);
	w->backlog[w->nbacklog++] = (wr_id & BL_INDEX) | fl | ((uint64_t)len << 32);
}

/* One completion of the client connection. Control requests are queued in ctlq. */
static bool on_client_wc(struct worker *w, const struct dm_wc *wc, bool can_start)
{
	struct dm_wire_hdr h;
	uint8_t *buf;
	bool bad;

	if (wc->status) {
		w->client_gone = true;
		return false;
	}
	if (wc->opcode == DM_WC_SEND) {
		if (wc->wr_id == CN_CALL_WR)
			w->call.busy = false;
		if (wc->wr_id & CN_CALL_ASYNC_WR && !(wc->wr_id & WR_SEND_TAG)) {
			cn_call_sent(&w->call, (uint32_t)(wc->wr_id & 0xff));
			return true;
		}
		if ((wc->wr_id & WR_SEND_TAG) && (wc->wr_id & 0xffff) < SEND_SLOTS)
			w->sfree[wc->wr_id & 0xffff] = true;
		return true;
	}
	if (wc->opcode != DM_WC_RECV)
		return true;
	buf = dm_msgpool_buf(w->cn->pool, wc->wr_id);
	bad = !buf || dm_wire_hdr_decode(buf, wc->byte_len, &h);
	if (!bad) {
		/* A client sends queries, C_CALLs and FWD_ROUTER; a SERVE connection only
		 * FWD_QUERY. */
		bool fwd = h.op >= DM_OP_FWD_FIRST && h.op <= DM_OP_FWD_LAST;
		bool call = h.op >= DM_OP_C_FIRST && h.op <= DM_OP_C_LAST;
		struct dm_wire_c_call cm;
		const uint8_t *cj;

		bad = (fwd ? dm_wire_fwd_check(&h, buf, wc->byte_len) :
		       call ? dm_wire_c_check(&h, buf, wc->byte_len, &cm, &cj) :
		       dm_wire_q_check(&h, buf, wc->byte_len)) || (h.op & 1) ||
		      (w->serve && call) ||
		      (w->serve ? h.op != DM_OP_FWD_QUERY : fwd && h.op != DM_OP_FWD_ROUTER);
	}
	if (bad) {
		dm_warn("cn%u: malformed message from client %s; closing", w->cn->node->id,
			w->client->peer);
		if (buf)
			dm_msgpool_repost(w->cn->pool, wc->wr_id);
		w->client_gone = true;
		return false;
	}
	/* The memory nodes are connected to for the first message that may READ or forward,
	 * before it runs (here under the read lock; otherwise it waits in the backlog and the
	 * loop connects first). A control connection (a CLI's FWD_ROUTER, Q_STATS, Q_CONFIG;
	 * a client's Q_ROUTER) does not connect. */
	if (!w->reads && h.op != DM_OP_FWD_ROUTER && h.op != DM_OP_Q_STATS &&
	    h.op != DM_OP_Q_CONFIG && h.op != DM_OP_Q_ROUTER) {
		w->reads = true;
		if (can_start)
			cn_read_sync(w);
	}
	if (h.op == DM_OP_Q_SEARCH || h.op == DM_OP_FWD_QUERY) {
		take_search(w, wc->wr_id, wc->byte_len, can_start,
			    h.op == DM_OP_FWD_QUERY ? BL_FWD : 0);
	} else if (w->nctl < DM_ARRAY_SIZE(w->ctlq)) {
		w->ctlq[w->nctl++] = (struct ctl_req){ wc->wr_id, wc->byte_len };
	} else {
		dm_msgpool_repost(w->cn->pool, wc->wr_id);
		w->client_gone = true;
	}
	return true;
}

/* Reap client completions (send credits) while a control reply waits for a send slot. */
static int send_ctl(struct worker *w, uint16_t op, uint64_t req_id, int32_t status,
		    const uint8_t *body, uint32_t blen)
{
	for (;;) {
		struct dm_wc wc;
		int rc = send_msg(w, op, req_id, status, body, blen);

		if (rc != -EAGAIN)
			return rc;
		rc = dm_conn_wait(w->client, &wc, 1, 1000);
		if (rc < 0)
			return rc;
		if (rc == 1 && !on_client_wc(w, &wc, false))
			return -ECONNRESET;
	}
}

static void reply_stats(struct worker *w, uint64_t req_id)
{
	struct cn *cn = w->cn;
	struct dm_cache_stats cs = { 0 };
	struct dm_wire_q_stats st = { 0 };
	uint8_t body[sizeof(st)];

	pthread_rwlock_rdlock(&cn->lock);
	if (cn->cache)
		dm_cache_stats(cn->cache, &cs);
	st.index_bytes = cn->views[0].cur ? cn->views[0].cur->index_bytes : 0;   /* the cached graph */
	pthread_rwlock_unlock(&cn->lock);
	st.hits = cs.hits;
	st.misses = cs.misses;
	st.evictions = cs.evictions;
	st.entries = cs.entries;
	st.cache_bytes = cs.bytes;
	st.capacity_bytes = cs.capacity_bytes;
	st.queries = atomic_load(&cn->queries);
	st.errors = atomic_load(&cn->errors);
	st.node_id = cn->node->id;
	st.workers = atomic_load(&cn->workers);
	st.failovers = atomic_load(&cn->failovers);
	st.mn_downs = atomic_load(&cn->mn_downs);
	st.mn_ups = atomic_load(&cn->mn_ups);
	st.loc_queries = atomic_load(&cn->loc_queries);
	st.loc_q_mns = atomic_load(&cn->loc_q_mns);
	st.loc_q_blocks = atomic_load(&cn->loc_q_blocks);
	st.loc_rts = atomic_load(&cn->loc_rts);
	st.loc_rt_mns = atomic_load(&cn->loc_rt_mns);
	for (uint32_t m = 0; m < cn->cfg->n_mn; m++)
		st.mn_down += cn_mn_is_down(cn, m);
	dm_wire_q_stats_encode(body, &st);
	send_ctl(w, DM_OP_Q_STATS + 1, req_id, 0, body, sizeof(body));
}

/* FWD_ROUTER: routing strategy for benchmarks, and the router's counters and CSP. */
static void reply_router(struct worker *w, const uint8_t *buf, uint32_t len, uint64_t req_id)
{
	struct dm_wire_fwd_rcfg c;
	struct dm_wire_fwd_rstats st;
	uint8_t body[sizeof(st)];
	int rc;

	rc = dm_wire_fwd_rcfg_decode(buf + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &c);
	if (rc == 0)
		rc = w->cn->rt ? router_config(w->cn->rt, &c, &st) : -ENOSYS;
	if (rc == 0)
		dm_wire_fwd_rstats_encode(body, &st);
	send_ctl(w, DM_OP_FWD_ROUTER + 1, req_id, rc, rc ? NULL : body, rc ? 0 : sizeof(body));
}

/* Q_CONFIG: pick up a newly loaded index and resize / clear the shared cache (the size
 * then stays what dmann bench asked for, instead of the cluster file's [cn] cache). */
/* Q_INSERT (admin): online inserts into the current index view, synchronously on this
 * worker's thread (a client that inserts and queries uses two connections). */
static void reply_insert(struct worker *w, const uint8_t *buf, uint32_t len, uint64_t req_id)
{
	struct cn *cn = w->cn;
	struct dm_wire_q_insert m;
	struct dm_wire_q_inserted r = { 0 };
	struct cn_insert_stats st = { 0 };
	uint64_t ids[DM_Q_MAX_INSERT], t0 = dm_now_ns();
	uint8_t body[sizeof(r) + 8 * DM_Q_MAX_INSERT];
	float *v;
	int rc;

	if (dm_wire_q_insert_decode(buf + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &m)) {
		send_ctl(w, DM_OP_Q_INSERT + 1, req_id, -EBADMSG, NULL, 0);
		return;
	}
	v = malloc((size_t)m.n * m.dim * sizeof(float));
	if (!w->ins)
		w->ins = cn_insert_new(cn);
	if (!v || !w->ins) {
		free(v);
		send_ctl(w, DM_OP_Q_INSERT + 1, req_id, -ENOMEM, NULL, 0);
		return;
	}
	dm_wire_get_f32s(buf + DM_WIRE_HDR_LEN + sizeof(m), v, m.n * m.dim);
	pthread_rwlock_rdlock(&cn->lock);
	rc = cn->views[m.graph].cur ?
	     cn_insert_run(w->ins, cn->views[m.graph].cur, v, m.n, m.dim, m.ef, ids, &st) : -ENOENT;
	pthread_rwlock_unlock(&cn->lock);
	free(v);
	cn_insert_count(cn, &st);
	if (rc <= 0) {
		if (rc < 0 && rc != -ENOSPC && rc != -ENOENT)
			dm_warn("cn%u: insert failed: %s", cn->node->id, strerror(-rc));
		send_ctl(w, DM_OP_Q_INSERT + 1, req_id, rc ? rc : -EIO, NULL, 0);
		return;
	}
	r = (struct dm_wire_q_inserted){ .n = (uint32_t)rc, .links = (uint32_t)st.links,
		.links_dropped = (uint32_t)st.links_dropped,
		.lock_retries = (uint32_t)st.lock_retries, .rereads = (uint32_t)st.rereads,
		.reads = (uint32_t)st.reads, .latency_ns = dm_now_ns() - t0 };
	dm_wire_q_inserted_encode(body, &r);
	for (uint32_t i = 0; i < r.n; i++)
		dm_put_le64(body + sizeof(r) + 8 * i, ids[i]);
	/* rows inserted before an error are acknowledged with their ids and that error */
	send_ctl(w, DM_OP_Q_INSERT + 1, req_id, r.n < m.n ? st.err : 0, body,
		 (uint32_t)(sizeof(r) + 8 * r.n));
}

static void reply_config(struct worker *w, const uint8_t *buf, uint32_t len, uint64_t req_id)
{
	struct cn *cn = w->cn;
	struct dm_wire_q_config c;
	int rc;

	dm_wire_q_config_decode(buf + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &c);
	rc = cn_refresh(cn, false);
	if (rc == 0 || rc == -ENOENT) {
		double admit = c.admit_ppm / 1e6;

		pthread_rwlock_wrlock(&cn->lock);
		if (c.cache_bytes != cn->cache_bytes || (c.flags & DM_Q_CONFIG_CLEAR) ||
		    admit != cn->admit_prob || !cn->cache || !cn->cache_override) {
			cn->cache_override = true;
			cn->cache_bytes = c.cache_bytes;
			cn->admit_prob = admit;
			dm_cache_free(cn->cache);
			cn->cache = NULL;
			if (cn_cache_apply(cn))
				rc = -ENOMEM;
		}
		pthread_rwlock_unlock(&cn->lock);
	}
	send_ctl(w, DM_OP_Q_CONFIG + 1, req_id, rc == -ENOENT ? 0 : rc, NULL, 0);
}

/* Client completions seen while a C_CALL answer waits for its buffer. */
static bool call_other(void *arg, const struct dm_wc *wc)
{
	return on_client_wc(arg, wc, false);
}

void *cn_worker(void *arg)
{
	struct cn_worker_arg *a = arg;
	struct worker *w = calloc(1, sizeof(*w));
	struct cn *cn = a->cn;
	bool idle = false;
	int calls = 0;

	if (!w)
		goto out_close;
	w->cn = cn;
	w->client = a->client;
	w->serve = a->serve;
	w->reads = a->serve;   /* forwarded queries from the first message */
	w->rng = (uint32_t)(uintptr_t)w ^ (uint32_t)dm_now_ns();
	atomic_fetch_add(&cn->workers, 1);
	w->sbuf = aligned_alloc(64, DM_ALIGN_UP((size_t)SEND_SLOTS * SEND_SLOT_SIZE, 64));
	if (!w->sbuf || dm_xport_reg(cn->x, w->sbuf, (size_t)SEND_SLOTS * SEND_SLOT_SIZE, 0,
				     &w->smr))
		goto out_free;
	for (int i = 0; i < SEND_SLOTS; i++)
		w->sfree[i] = true;
	/* Sleep until a completion or a finished call wakes us, if the transport can. */
	w->wake.fd = -1;
	w->wake_on = !dm_notify_init(&w->wake) && !dm_conn_notify(w->client, &w->wake);
	w->call.wake = w->wake_on ? &w->wake : NULL;
	pthread_rwlock_rdlock(&cn->lock);
	w->gen = atomic_load(&cn->gen);
	sync_views(w);
	cn_read_sync(w);
	pthread_rwlock_unlock(&cn->lock);

	while (!atomic_load(&cn->stopping) && !w->client_gone) {
		struct dm_wc wc[32];
		bool progress = false, busy = false;
		int n;

		pthread_rwlock_rdlock(&cn->lock);
		if (atomic_load(&cn->gen) != w->gen) {
			rebind(w);
		} else if (views_moved(w)) {
			/* A new generation of a graph (or a graph new or gone): its queries in
			 * flight finish on the old view (its objects stay until every worker
			 * left it); new ones wait, then run on the new view. */
			sync_views(w);
		}
		cn_read_sync(w);
		cn_read_timeouts(w, dm_now_ns());
		/* Answers of finished C_CALLs out; while calls run, an idle wait is short (their
		 * answers are sent from here). */
		calls = cn_call_flush(&w->call, w->client);
		if (calls < 0) {
			dm_warn("cn%u: client %s: C_CALL answer: %s; closing", cn->node->id,
				w->client->peer, strerror(-calls));
			w->client_gone = true;
		}
		/* Client: queries in, send credits back. Idle with no call running, block on it
		 * (its input is read by this thread then); otherwise look, and sleep below. */
		if (idle && (!calls || !w->wake_on))
			n = dm_conn_wait(w->client, wc, 32, calls > 0 ? 1 : 50);
		else
			n = w->wake_on ? dm_conn_wait(w->client, wc, 32, 0) :
			    dm_conn_poll(w->client, wc, 32);
		if (n < 0)
			w->client_gone = true;
		for (int i = 0; i < n; i++) {
			progress = true;
			if (!on_client_wc(w, &wc[i], true))
				break;
		}
		/* Backlogged queries: routed or into free slots, oldest first. */
		while (w->nbacklog) {
			uint64_t e = w->backlog[0];
			uint32_t was = (uint32_t)e & BL_FLAGS, fl = was;

			if (!dispatch(w, (e & BL_INDEX) | DM_RPC_RECV_TAG, (uint32_t)(e >> 32), &fl)) {
				if (fl && !was)
					atomic_fetch_add(&cn->qlen, 1);   /* routed here just now */
				w->backlog[0] = (e & ~(uint64_t)BL_FLAGS) | fl;
				break;
			}
			memmove(w->backlog, w->backlog + 1, --w->nbacklog * sizeof(uint64_t));
			if (was)
				atomic_fetch_sub(&cn->qlen, 1);
			progress = true;
		}
		/* Memory nodes: READ completions, forwarded answers and their send credits. */
		for (uint32_t m = 0; m < w->nmn; m++) {
			if (!w->mc[m])
				continue;
			n = dm_conn_poll(w->mc[m], wc, 32);
			if (n < 0) {
				cn_read_failed(w, m, n);
				continue;
			}
			if (n != 0)
				w->sq_full[m] = false;   /* room again (or an error to see) */
			for (int i = 0; i < n; i++) {
				progress = true;
				if (wc[i].wr_id & WR_READ_TAG)
					cn_read_wc(w, &wc[i]);
				else if (wc[i].wr_id & DM_RPC_RECV_TAG)
					on_mn_recv(w, &wc[i]);
				else if ((wc[i].wr_id & WR_SEND_TAG) && (wc[i].wr_id & 0xffff) < SEND_SLOTS)
					w->sfree[wc[i].wr_id & 0xffff] = true;
			}
		}
		if (w->nfres && send_fres(w))
			progress = true;
		fail_lost_forwards(w);
		/* Queries: post what needs posting, send what is done. */
		for (int i = 0; i < DEPTH; i++) {
			struct qslot *q = &w->slot[i];

			if (q->state == S_ISSUE) {
				uint32_t was = q->pending;

				cn_read_issue(w, q);
				if (q->state == S_WAIT && q->pending == 0)
					cn_worker_advance(w, q);
				/* Only waiting for send-queue room is no progress. */
				if (q->state != S_ISSUE || q->pending != was || !q->repost)
					progress = true;
			}
			if (q->state == S_DONE && send_result(w, q) == 0)
				progress = true;
			if (q->state != S_FREE)
				busy = true;
		}
		pthread_rwlock_unlock(&cn->lock);

		/* Control requests, outside the read lock (CONFIG takes the write lock), oldest
		 * first; answering one may queue more (completions reaped while it waits for a
		 * send slot), so each is taken off the queue before it runs. */
		while (w->nctl && !w->client_gone) {
			struct ctl_req cr = w->ctlq[0];
			uint8_t *b = dm_msgpool_buf(cn->pool, cr.wr_id);
			struct dm_wire_hdr h;

			memmove(w->ctlq, w->ctlq + 1, --w->nctl * sizeof(w->ctlq[0]));
			dm_wire_hdr_decode(b, cr.len, &h);
			/* A client identity's connection may query and read counters only: cache
			 * size, routing and index reload are the cluster's (admin) business. */
			if (h.op == DM_OP_C_CALL) {
				int crc = cn_call_submit(cn, &w->call, b, cr.len);

				if (crc) {
					dm_warn("cn%u: client %s: C_CALL: %s; closing", cn->node->id,
						w->client->peer, strerror(-crc));
					w->client_gone = true;
				}
			} else if (h.op == DM_OP_Q_ROUTER) {
				int crc = cn_call_router(cn, &w->call, w->client, h.req_id,
							 call_other, w);

				if (crc) {
					dm_warn("cn%u: client %s: Q_ROUTER: %s; closing", cn->node->id,
						w->client->peer, strerror(-crc));
					w->client_gone = true;
				}
			} else if (w->client->client[0] && h.op != DM_OP_Q_STATS)
				send_ctl(w, (uint16_t)(h.op + 1), h.req_id, -EPERM, NULL, 0);
			else if (h.op == DM_OP_Q_CONFIG)
				reply_config(w, b, cr.len, h.req_id);
			else if (h.op == DM_OP_Q_INSERT)
				reply_insert(w, b, cr.len, h.req_id);
			else if (h.op == DM_OP_FWD_ROUTER)
				reply_router(w, b, cr.len, h.req_id);
			else
				reply_stats(w, h.req_id);
			dm_msgpool_repost(cn->pool, cr.wr_id);
			progress = true;
		}
		if (w->fwd_out || w->nfres)
			busy = true;   /* answers come back on the memory-node connections */
		idle = !progress && !busy;
		if (progress || (idle && !calls))
			continue;
		if (!w->wake_on) {
			if (busy)
				usleep(20);   /* waiting for READs: give the CPU away, not spin */
		} else if (!w->armed) {
			/* Armed, every source is looked at once more before the sleep. */
			dm_notify_arm(&w->wake);
			w->armed = true;
		} else {
			/* READ completions, queries, call answers wake us; the timeout only
			 * bounds what nothing signals (READ timeouts, forwards given up). */
			dm_notify_wait(&w->wake, busy ? 1 : 50);
			w->armed = false;
		}
	}
	dm_conn_notify(w->client, NULL);   /* w goes away before the connection */
	/* Close memory-node connections first: that flushes READs aimed at our buffers. */
	pthread_rwlock_rdlock(&cn->lock);
	cn_read_close_all(w);
	pthread_rwlock_unlock(&cn->lock);
	for (uint32_t i = 0; i < w->nbacklog; i++) {
		if (w->backlog[i] & BL_FLAGS)
			atomic_fetch_sub(&cn->qlen, 1);
		dm_msgpool_repost(cn->pool, (w->backlog[i] & BL_INDEX) | DM_RPC_RECV_TAG);
	}
	for (uint32_t i = 0; i < w->nfres; i++)
		dm_msgpool_repost(cn->pool, (w->fres[i] & BL_INDEX) | DM_RPC_RECV_TAG);
	for (uint32_t i = 0; i < w->nctl; i++)
		dm_msgpool_repost(cn->pool, w->ctlq[i].wr_id);
	for (int i = 0; i < DEPTH; i++) {
		if (w->slot[i].state != S_FREE)
			atomic_fetch_sub(&cn->qlen, 1);
		hnsw_query_free(w->slot[i].q);
		free(w->slot[i].remote);
		free(w->slot[i].rrep);
		free(w->slot[i].tried);
		free(w->slot[i].hits);
		free(w->slot[i].loc_blk);
	}
	if (w->stage_mr)
		dm_xport_dereg(cn->x, w->stage_mr);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
		if (w->v[g].d)
			atomic_fetch_sub(&w->v[g].d->users, 1);
	free(w->stage_mem);
	free(w->wrs);
	dm_xport_dereg(cn->x, w->smr);
	cn_call_fini(cn, &w->call);
	dm_notify_fini(&w->wake);
	cn_insert_free(w->ins);
out_free:
	free(w->sbuf);
	atomic_fetch_sub(&cn->workers, 1);
	free(w);
out_close:
	dm_conn_close(a->client);
	if (a->alive)
		atomic_store(a->alive, false);   /* the router opens a new SERVE connection */
	free(a);
	return NULL;
}
