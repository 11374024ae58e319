/* cn_read.c: a compute-node worker's READs: posting a query's batch to the memory nodes
 * (the replica of each record picked from the block table, one doorbell per memory node,
 * back-pressure), their completions, the worker's memory-node connections, and read
 * failover: a READ that fails (error completion, failed post, timeout, a record torn on
 * every try) goes to the next live replica inside the same query, and the memory node is
 * marked down (cn.h; cn_refresh brings it back). The loop and the queries are in
 * cn_worker.c. */
#include <stdio.h>
#include <string.h>

#include "cn_worker_int.h"
#include "util/dm_hash.h"

void cn_read_close(struct worker *w, uint32_t i)
{
	dm_conn_close(w->mc[i]);
	w->mc[i] = NULL;
	w->inflight[i] = 0;
	w->sq_full[i] = false;
	w->hello[i] = false;
	/* Answers would come back on this connection: fail those queries instead. */
	for (int j = 0; j < FWD_TRACK; j++)
		if (w->fq[j].used && w->fq[j].m == i)
			w->fq[j].failed = true;
	/* Closing flushed the sends on it (forwarded queries): their slots are free. */
	for (int s = 0; s < SEND_SLOTS; s++)
		if (!w->sfree[s] && w->sconn[s] == (int16_t)i)
			w->sfree[s] = true;
}

void cn_read_close_all(struct worker *w)
{
	for (uint32_t i = 0; i < w->nmn; i++)
		cn_read_close(w, i);
}

/* The memory node of batch entry j's replica r. */
static uint32_t rep_mn(const struct worker *w, const struct qslot *q, uint32_t j, uint32_t r)
{
	const struct dindex *d = slot_view(w, q);

	return d->block_mn[(size_t)(q->q->batch[j] >> d->p.block_shift) * d->nrep + r];
}

/* Read failover: the READs of every query that were posted to memory node m and not
 * completed go to their next replica (posted again by cn_read_issue(); the connection is closed
 * first, so no completion or late write into the staging buffers follows). */
static void abandon(struct worker *w, uint32_t m)
{
	cn_read_close(w, m);
	for (int i = 0; i < DEPTH; i++) {
		struct qslot *q = &w->slot[i];

		if (!q->pend_mn[m])
			continue;
		q->pending -= q->pend_mn[m];
		q->pend_mn[m] = 0;
		for (uint32_t j = 0; j < q->q->nbatch; j++)
			if (q->remote[j] == 1 && rep_mn(w, q, j, q->rrep[j]) == m) {
				q->tried[j] |= (uint8_t)(1u << q->rrep[j]);
				q->remote[j] = 3;
				q->repost = true;
				atomic_fetch_add_explicit(&w->cn->failovers, 1, memory_order_relaxed);
			}
		if (q->state == S_WAIT && q->pending == 0)
			q->state = q->err ? S_DONE : S_ISSUE;
	}
}

/* Memory node m failed under us (error completion, post error, timeout): mark it down
 * (if nobody did since we connected) and fail its READs over. */
void cn_read_failed(struct worker *w, uint32_t m, int err)
{
	cn_mn_down(w->cn, m, w->mepoch[m], err);
	abandon(w, m);
}

/* Follow the memory nodes' up/down epochs: drop connections of an older epoch (their READs
 * fail over), connect to the nodes that are up. */
void cn_read_sync(struct worker *w)
{
	struct cn *cn = w->cn;

	w->nmn = cn->cfg->n_mn;
	if (!w->reads)
		return;
	for (uint32_t m = 0; m < w->nmn; m++) {
		unsigned e = atomic_load_explicit(&cn->mn_epoch[m], memory_order_acquire);
		int rc;

		if (w->mepoch[m] == e && (w->mc[m] || (e & 1)))
			continue;
		if (w->mc[m])
			abandon(w, m);
		w->mepoch[m] = e;
		if (e & 1)
			continue;
		rc = dm_xport_connect(cn->x, cn->cfg->mn[m].address, 2000, &w->mc[m]);
		if (rc) {
			w->mc[m] = NULL;
			cn_mn_down(cn, m, e, rc);
		} else if (w->wake_on && dm_conn_notify(w->mc[m], &w->wake)) {
			w->wake_on = false;   /* cannot be woken by it: poll them all */
		}
	}
}

/* READs unanswered for READ_TIMEOUT_NS: their memory node counts as failed. */
void cn_read_timeouts(struct worker *w, uint64_t now)
{
	if (now - w->to_check < 100000000ull)
		return;
	w->to_check = now;
	for (int i = 0; i < DEPTH; i++) {
		struct qslot *q = &w->slot[i];

		if (!q->pending || now - q->t_post < READ_TIMEOUT_NS)
			continue;
		for (uint32_t m = 0; m < w->nmn; m++)
			if (q->pend_mn[m]) {
				dm_warn("cn%u: READs from memory node %u unanswered for %llu ms",
					w->cn->node->id, m,
					(unsigned long long)((now - q->t_post) / 1000000));
				cn_read_failed(w, m, -ETIMEDOUT);
			}
	}
}

/* The replica to read batch entry j from: the first in placement order that has not failed
 * it, whose memory node is up, connected, known to this view and not fenced (dgen.h).
 * -EHOSTDOWN when none is left (-ESTALE when only fenced ones are). */
static int pick(struct worker *w, const struct qslot *q, uint32_t j, uint64_t now)
{
	const struct dindex *d = slot_view(w, q);
	size_t b = (size_t)(q->q->batch[j] >> d->p.block_shift) * d->nrep;
	int err = -EHOSTDOWN;

	/* A replica marked stale for the graph (it missed writes: cn_hcatchup.c) only when
	 * no other one can serve. */
	for (uint32_t r = 0; r < 2 * d->nrep; r++) {
		uint32_t m = d->block_mn[b + r % d->nrep];
		unsigned e;

		if (m == DINDEX_NO_MN || m >= w->nmn || ((q->tried[j] >> (r % d->nrep)) & 1) ||
		    !d->block_addr[b + r % d->nrep] ||
		    (r < d->nrep) == cn_graph_stale(w->cn, d->graph, m))
			continue;
		e = atomic_load_explicit(&w->cn->mn_epoch[m], memory_order_acquire);
		if ((e & 1) || d->mn_epoch[m] != e || w->mepoch[m] != e || !w->mc[m])
			continue;
		if (cn_fenced(w->cn, m, now)) {
			/* No report reached it for half the lease: it may free what we read. */
			err = -ESTALE;
			continue;
		}
		return (int)(r % d->nrep);
	}
	return err;
}

/* Locality: block b (of the slot's view) had a READ of this query; a set of b + 1 in
 * open addressing (linear probing), which saturates at LOC_BLK_MAX distinct blocks. */
static void loc_block(struct qslot *q, uint32_t b)
{
	uint32_t key = b + 1, h = (uint32_t)(dm_hash64(b) & (LOC_BLK_SLOTS - 1));

	if (!q->loc_blk || q->loc_nblk >= LOC_BLK_MAX)
		return;
	while (q->loc_blk[h] && q->loc_blk[h] != key)
		h = (h + 1) & (LOC_BLK_SLOTS - 1);
	if (!q->loc_blk[h]) {
		q->loc_blk[h] = key;
		q->loc_nblk++;
	}
}

/* Set remote[] of the batch entries whose READs are wr[0..n) to v. */
static void mark_reads(struct worker *w, struct qslot *q, const struct dm_rdma_wr *wr, uint32_t n,
		       uint8_t v)
{
	for (uint32_t i = 0; i < n; i++)
		q->remote[((uint8_t *)wr[i].local - q->stage) / slot_view(w, q)->rec_size] = v;
}

/* Post READs for the records of the slot's batch that the cache does not hold; one
 * doorbell per memory node and PIECE READs. Leaves the slot in S_ISSUE if a send queue is
 * full (the READs not posted are posted again once the worker has polled completions:
 * back-pressure, never a failed query), S_WAIT with pending pieces, or steps on at once
 * when everything was cached. The cache holds records of the current view only: a query
 * finishing on an older one (a generation switch) neither reads nor fills it. */
void cn_read_issue(struct worker *w, struct qslot *q)
{
	const struct dindex *d = slot_view(w, q);
	struct dm_rdma_wr *wr = w->wrs;
	uint32_t nb = q->q->nbatch, cnt[DM_MAX_NODES] = { 0 }, first[DM_MAX_NODES], pos = 0;
	struct dm_cache *cache = d == w->cn->views[0].cur ? w->cn->cache : NULL;
	uint8_t want = q->repost ? 3 : 1;   /* the entries to post this time */
	uint64_t now = dm_now_ns();
	bool again = false, bad[DM_MAX_NODES] = { false }, anybad = false;

	if (!q->repost) {
		/* Cache first. */
		for (uint32_t j = 0; j < nb; j++) {
			uint32_t id = q->q->batch[j];
			uint8_t *dst = q->stage + (size_t)j * d->rec_size;

			if (!q->remote[j] && cache && dm_cache_get(cache, id, dst)) {
				q->cache_hits++;
				q->remote[j] = 2;     /* served from the cache: nothing to validate */
				continue;
			}
			q->remote[j] = 1;
		}
	}
	/* The replica of each READ; count them per memory node. */
	for (uint32_t j = 0; j < nb; j++) {
		int r;

		if (q->remote[j] != want)
			continue;
		r = pick(w, q, j, now);
		if (r < 0) {
			if (now - w->noreplica_log > 1000000000ull) {
				w->noreplica_log = now;
				dm_warn("cn%u: record %u: no live replica of block %u (%s; tried %#x "
					"of %u); query fails", w->cn->node->id, q->q->batch[j],
					q->q->batch[j] >> d->p.block_shift, strerror(-r), q->tried[j],
					d->nrep);
			}
			fail(q, r);
			break;
		}
		q->rrep[j] = (uint8_t)r;
		cnt[rep_mn(w, q, j, (uint32_t)r)]++;
	}
	if (q->err) {
		/* Nothing more is posted; what is in flight completes, then it is answered. */
		q->repost = false;
		q->state = S_WAIT;
		return;
	}
	/* Keep at most SQ_LIMIT READs in flight per memory node (a batch alone may pass it). */
	for (uint32_t m = 0; m < w->nmn; m++) {
		if (cnt[m] && w->inflight[m] && w->inflight[m] + cnt[m] > SQ_LIMIT) {
			for (uint32_t j = 0; j < nb && !q->repost; j++)
				if (q->remote[j] == 1)
					q->remote[j] = 0;
			return;
		}
		first[m] = pos;
		pos += cnt[m];
		cnt[m] = 0;
	}
	for (uint32_t j = 0; j < nb; j++) {
		uint32_t mn, rkey;
		uint64_t addr;

		if (q->remote[j] != want)
			continue;
		q->remote[j] = 3;                /* 1 once posted */
		dindex_locate_rep(d, w->cn->mns, q->q->batch[j], q->rrep[j], &mn, &addr, &rkey);
		wr[first[mn] + cnt[mn]++] = (struct dm_rdma_wr){
			.wr_id = WR_READ_TAG | ((uint64_t)(q - w->slot) << 16) | mn,
			.local = q->stage + (size_t)j * d->rec_size, .mr = w->stage_mr,
			.remote = addr, .rkey = rkey, .len = d->rec_size };
	}
	uint32_t rt_mns = 0;

	for (uint32_t m = 0; m < w->nmn; m++) {
		struct dm_rdma_wr *g = wr + first[m];
		int rc = 0;
		uint32_t posted = 0;

		if (!cnt[m])
			continue;
		for (uint32_t o = 0; o < cnt[m]; o += PIECE) {
			uint32_t n = DM_MIN(PIECE, cnt[m] - o);
			struct dm_rdma_wr *p = g + o;

			p[n - 1].wr_id |= WR_LAST | ((uint64_t)n << 32);
			p[n - 1].flags = DM_WR_SIGNALED;
			rc = w->sq_full[m] ? -EAGAIN : dm_conn_read_batch(w->mc[m], p, (int)n);
			if (rc)
				break;
			mark_reads(w, q, p, n, 1);
			posted += n;
			w->inflight[m] += n;
			q->pend_mn[m]++;
			q->pending++;
			q->reads += n;
			q->bytes += (uint64_t)n * d->rec_size;
			q->t_post = now;
		}
		if (posted) {
			rt_mns++;
			q->loc_mn[m / 64] |= 1ull << (m % 64);
			for (uint32_t i = 0; i < posted; i++) {
				uint32_t j = (uint32_t)(((uint8_t *)g[i].local - q->stage) /
							d->rec_size);

				loc_block(q, q->q->batch[j] >> d->p.block_shift);
			}
		}
		if (rc == -EAGAIN) {
			/* The send queue is full: the rest stays 3, posted once the connection's
			 * completions were polled (no retry before: that would only spin). */
			if (!w->sq_full[m])
				atomic_fetch_add_explicit(&w->cn->sq_full, 1, memory_order_relaxed);
			w->sq_full[m] = true;
			again = true;
		} else if (rc) {
			/* The connection is broken: everything for m goes to other replicas. */
			bad[m] = anybad = again = true;
			dm_warn("cn%u: READ post to memory node %u failed: %s", w->cn->node->id, m,
				strerror(-rc));
		}
	}
	for (uint32_t m = 0; anybad && m < w->nmn; m++) {
		if (!bad[m])
			continue;
		for (uint32_t j = 0; j < nb; j++)
			if (q->remote[j] == 3 && rep_mn(w, q, j, q->rrep[j]) == m) {
				q->tried[j] |= (uint8_t)(1u << q->rrep[j]);
				atomic_fetch_add_explicit(&w->cn->failovers, 1, memory_order_relaxed);
			}
		cn_read_failed(w, m, -EHOSTDOWN);
	}
	q->repost = again;
	if (q->pending) {
		q->round_trips++;
		q->loc_rt_mns += rt_mns;
	}
	q->state = q->repost && !q->pending ? S_ISSUE : S_WAIT;
}

void cn_read_wc(struct worker *w, const struct dm_wc *wc)
{
	uint32_t si = (uint32_t)(wc->wr_id >> 16) & 0xffff, mn = (uint32_t)wc->wr_id & 0xffff;
	struct qslot *q;

	if (si >= DEPTH || mn >= w->nmn || !w->mc[mn])
		return;   /* mc[mn] closed: its READs were failed over already */
	q = &w->slot[si];
	if (wc->status) {
		dm_warn("cn%u: READ from memory node %u failed: %s; reading other replicas",
			w->cn->node->id, mn, strerror(-wc->status));
		cn_read_failed(w, mn, wc->status);
		return;
	}
	if (!(wc->wr_id & WR_LAST))
		return;
	w->inflight[mn] -= (uint32_t)(wc->wr_id >> 32) & 0xffff;
	q->pend_mn[mn]--;
	if (q->state == S_WAIT && --q->pending == 0)
		cn_worker_advance(w, q);
}
