/* verbs_data.c: the rdma-core backend's data path: doorbell-batched READ/WRITE chains,
 * atomics, SEND (inline when small), selective signaling with send-queue accounting, and
 * completion polling with ibv status -> -errno mapping. */
#include "verbs_int.h"

#include <poll.h>
#include <string.h>

/* Map an ibv completion status to the transport's -errno convention. */
int verbs_status_errno(enum ibv_wc_status st, uint8_t opcode, bool peer_gone)
{
	switch (st) {
	case IBV_WC_SUCCESS:            return 0;
	case IBV_WC_LOC_LEN_ERR:        return -EMSGSIZE;
	case IBV_WC_LOC_QP_OP_ERR:      return -EINVAL;
	case IBV_WC_LOC_EEC_OP_ERR:     return -EINVAL;
	case IBV_WC_LOC_PROT_ERR:       return -EFAULT;
	case IBV_WC_WR_FLUSH_ERR:       return peer_gone ? -ECONNRESET : -ECANCELED;
	case IBV_WC_MW_BIND_ERR:        return -EACCES;
	case IBV_WC_BAD_RESP_ERR:       return -EPROTO;
	case IBV_WC_LOC_ACCESS_ERR:     return -EACCES;
	/* the responder refused the request: for a SEND the usual cause is a message larger
	 * than the posted receive buffer, for an atomic a misaligned address */
	case IBV_WC_REM_INV_REQ_ERR:    return opcode == DM_WC_SEND ? -EMSGSIZE : -EINVAL;
	case IBV_WC_REM_ACCESS_ERR:     return -EACCES;   /* bad rkey or outside the MR */
	case IBV_WC_REM_OP_ERR:         return -EREMOTEIO;
	case IBV_WC_RETRY_EXC_ERR:      return -ECONNRESET;
	case IBV_WC_RNR_RETRY_EXC_ERR:  return -ENOBUFS;
	case IBV_WC_LOC_RDD_VIOL_ERR:   return -EACCES;
	case IBV_WC_REM_INV_RD_REQ_ERR: return -EINVAL;
	case IBV_WC_REM_ABORT_ERR:      return -ECONNABORTED;
	case IBV_WC_INV_EECN_ERR:       return -EINVAL;
	case IBV_WC_INV_EEC_STATE_ERR:  return -EINVAL;
	case IBV_WC_FATAL_ERR:          return -EIO;
	case IBV_WC_RESP_TIMEOUT_ERR:   return -ETIMEDOUT;
	case IBV_WC_GENERAL_ERR:        return -EIO;
	default:                        return -EIO;
	}
}

static void stash_push(struct verbs_conn *vc, const struct dm_wc *wc)
{
	vc->stash[(vc->stash_head + vc->stash_n) % vc->stash_cap] = *wc;
	vc->stash_n++;
}

static int stash_pop(struct verbs_conn *vc, struct dm_wc *wc, int n)
{
	int got = 0;

	while (got < n && vc->stash_n > 0) {
		wc[got++] = vc->stash[vc->stash_head];
		vc->stash_head = (vc->stash_head + 1) % vc->stash_cap;
		vc->stash_n--;
	}
	return got;
}

/* Turn one ibv completion into a caller's completion. Returns true if the caller must see
 * it (signaled success, or any failure), false for internal bookkeeping completions. */
static bool translate(struct verbs_conn *vc, const struct ibv_wc *iw, struct dm_wc *out)
{
	memset(out, 0, sizeof(*out));
	if (iw->wr_id & VERBS_WRID_SEND) {
		uint64_t seq = iw->wr_id & ~VERBS_WRID_SEND;
		struct verbs_sslot *s = &vc->sslots[seq % vc->qp_depth];

		if (seq + 1 > vc->sq_done)
			vc->sq_done = seq + 1;
		out->status = verbs_status_errno(iw->status, s->opcode, vc->peer_gone);
		if (out->status)
			vc->error = true;
		if (s->kind == VERBS_SK_HS) {
			vc->hs_read_done = true;
			vc->hs_read_status = out->status;
			return false;
		}
		if (out->status == 0 && !s->user_signaled)
			return false;
		out->wr_id = s->wr_id;
		out->opcode = s->opcode;
		out->byte_len = iw->status == IBV_WC_SUCCESS ? iw->byte_len : 0;
		return true;
	}
	if (iw->wr_id >= vc->vx->srq_depth) {
		dm_err("verbs: %s: completion with unknown wr_id %#llx dropped", vc->base.peer,
		       (unsigned long long)iw->wr_id);
		return false;
	}
	out->wr_id = verbs_rslot_put(vc->vx, (uint32_t)iw->wr_id);
	out->opcode = DM_WC_RECV;
	out->status = verbs_status_errno(iw->status, DM_WC_RECV, vc->peer_gone);
	out->byte_len = iw->byte_len;
	if (out->status)
		vc->error = true;
	return true;
}

/* Move completions from the CQ into the stash while it has room. */
int verbs_reap(struct verbs_conn *vc)
{
	struct ibv_wc iw[16];
	struct dm_wc wc;

	while (vc->stash_n + DM_ARRAY_SIZE(iw) <= vc->stash_cap) {
		int k = ibv_poll_cq(vc->cq, (int)DM_ARRAY_SIZE(iw), iw);

		if (k < 0) {
			vc->error = true;
			return -EIO;
		}
		for (int i = 0; i < k; i++)
			if (translate(vc, &iw[i], &wc))
				stash_push(vc, &wc);
		if (k < (int)DM_ARRAY_SIZE(iw))
			break;
	}
	return 0;
}

/* Non-blocking poll, lock held: stashed completions first, then the CQ. */
static int poll_locked(struct verbs_conn *vc, struct dm_wc *wc, int n)
{
	struct ibv_wc iw[32];
	int got;

	got = stash_pop(vc, wc, n);
	while (got < n) {
		int want = DM_MIN(n - got, (int)DM_ARRAY_SIZE(iw));
		int k = ibv_poll_cq(vc->cq, want, iw);

		if (k < 0) {
			vc->error = true;
			return got ? got : -EIO;
		}
		for (int i = 0; i < k; i++)
			if (translate(vc, &iw[i], &wc[got]))
				got++;
		if (k < want)
			break;
	}
	/* A peer that closed is only noticed through rdma_cm: look now and then. */
	if (got == 0 && ++vc->idle_polls >= 1024) {
		vc->idle_polls = 0;
		verbs_cm_check(vc);
	}
	return got;
}

int verbs_poll(struct dm_conn *c, struct dm_wc *wc, int n)
{
	struct verbs_conn *vc = to_vc(c);
	int got;

	if (n <= 0 || !wc)
		return n == 0 ? 0 : -EINVAL;
	pthread_mutex_lock(&vc->lock);
	got = poll_locked(vc, wc, n);
	pthread_mutex_unlock(&vc->lock);
	return got;
}

/* Blocking poll through the completion channel (and the cm channel for disconnects). The
 * lock is not held while sleeping; with several waiters on one connection the one that did
 * not consume the wakeup looks again after at most 20 ms. */
int verbs_wait(struct dm_conn *c, struct dm_wc *wc, int n, int timeout_ms)
{
	struct verbs_conn *vc = to_vc(c);
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX :
		dm_now_ns() + (uint64_t)timeout_ms * 1000000ull;

	if (n <= 0 || !wc)
		return n == 0 ? 0 : -EINVAL;
	for (;;) {
		struct pollfd pfd[2];
		int got, ms;

		pthread_mutex_lock(&vc->lock);
		got = poll_locked(vc, wc, n);
		if (!got && ibv_req_notify_cq(vc->cq, 0)) {
			vc->error = true;
			got = -EIO;
		}
		if (!got)
			got = poll_locked(vc, wc, n);
		if (!got) {
			verbs_cm_check(vc);
			/* nothing can complete any more: everything posted has completed */
			if (vc->error && vc->sq_head == vc->sq_done && vc->stash_n == 0)
				got = -ENOTCONN;
		}
		pthread_mutex_unlock(&vc->lock);
		if (got)
			return got;
		ms = 20;
		if (deadline != UINT64_MAX) {
			uint64_t now = dm_now_ns();

			if (now >= deadline)
				return 0;
			ms = (int)DM_MIN((deadline - now + 999999) / 1000000, 20u);
		}
		pfd[0].fd = vc->chan->fd;
		pfd[0].events = POLLIN;
		pfd[1].fd = vc->ech->fd;
		pfd[1].events = POLLIN;
		if (poll(pfd, 2, ms) < 0 && errno != EINTR)
			return -errno;
		if (pfd[0].revents & POLLIN) {
			struct ibv_cq *ecq;
			void *ectx;

			/* the fd is non-blocking: EAGAIN means another waiter consumed it */
			pthread_mutex_lock(&vc->lock);
			if (ibv_get_cq_event(vc->chan, &ecq, &ectx) == 0 &&
			    ++vc->unacked_events >= 64) {
				ibv_ack_cq_events(vc->cq, vc->unacked_events);
				vc->unacked_events = 0;
			}
			pthread_mutex_unlock(&vc->lock);
		}
	}
}

/* Reserve n send-queue entries; reaps completions (into the stash) to free them. */
static int sq_reserve(struct verbs_conn *vc, uint32_t n)
{
	uint64_t deadline = 0;

	if (dm_unlikely(vc->error || !vc->connected))
		return -ENOTCONN;
	if (n > vc->depth)
		return -EINVAL;
	while (vc->qp_depth - (uint32_t)(vc->sq_head - vc->sq_done) < n) {
		int rc;

		if (vc->stash_n + 16 > vc->stash_cap)
			return -EAGAIN;   /* the caller must poll first */
		rc = verbs_reap(vc);
		if (rc)
			return rc;
		if (vc->error)
			return -ENOTCONN;
		/* the forced signaled WRs complete within a round trip: wait a little for them
		 * rather than bouncing -EAGAIN to the caller at once */
		if (!deadline)
			deadline = dm_now_ns() + 50 * 1000000ull;
		else if (dm_now_ns() > deadline)
			return -EAGAIN;
	}
	return 0;
}

/* Fill the bookkeeping slot for the next WR and decide whether it is signaled. */
static void sq_take(struct verbs_conn *vc, struct ibv_send_wr *w, uint64_t wr_id,
		    uint8_t opcode, bool user_signaled, uint8_t kind)
{
	uint64_t seq = vc->sq_head++;
	struct verbs_sslot *s = &vc->sslots[seq % vc->qp_depth];
	bool sig = user_signaled || kind != VERBS_SK_USER || ++vc->unsig_run >= vc->sig_every;

	s->wr_id = wr_id;
	s->opcode = opcode;
	s->user_signaled = user_signaled;
	s->kind = kind;
	w->wr_id = seq | VERBS_WRID_SEND;
	if (sig) {
		w->send_flags |= IBV_SEND_SIGNALED;
		vc->unsig_run = 0;
	}
}

/* One ibv_post_send (one doorbell) for a chain of n WRs starting at vc->wrs[0]. */
static int post_chain(struct verbs_conn *vc, int n)
{
	struct ibv_send_wr *bad = NULL;
	uint64_t first = vc->sq_head - (uint64_t)n;
	int rc;

	vc->wrs[n - 1].next = NULL;
	rc = ibv_post_send(vc->id->qp, vc->wrs, &bad);
	if (dm_likely(rc == 0))
		return 0;
	/* WRs before *bad were posted and will complete; the rest were not. */
	if (bad && bad == vc->wrs) {
		vc->sq_head = first;
	} else {
		dm_err("verbs: %s: ibv_post_send failed part-way (%s): connection unusable",
		       vc->base.peer, strerror(rc));
		if (bad)
			vc->sq_head = first + (uint64_t)(bad - vc->wrs);
		vc->error = true;
	}
	return rc > 0 ? -rc : -EIO;
}

static bool in_mr(const struct dm_mr *mr, const void *p, size_t len)
{
	return mr && (const char *)p >= (const char *)mr->addr &&
	       len <= mr->len && (size_t)((const char *)p - (const char *)mr->addr) <= mr->len - len;
}

/* READ or WRITE batch as one chain. */
static int rw_batch(struct dm_conn *c, const struct dm_rdma_wr *wr, int n, bool write)
{
	struct verbs_conn *vc = to_vc(c);
	int rc;

	if (n <= 0)
		return n == 0 ? 0 : -EINVAL;
	for (int i = 0; i < n; i++)
		if (!in_mr(wr[i].mr, wr[i].local, wr[i].len))
			return -EINVAL;
	rc = sq_reserve(vc, (uint32_t)n);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *w = &vc->wrs[i];
		struct ibv_sge *s = &vc->sges[i];

		memset(w, 0, sizeof(*w));
		s->addr = (uintptr_t)wr[i].local;
		s->length = wr[i].len;
		s->lkey = wr[i].mr->lkey;
		w->sg_list = s;
		w->num_sge = 1;
		w->opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
		w->wr.rdma.remote_addr = wr[i].remote;
		w->wr.rdma.rkey = wr[i].rkey;
		if (write && wr[i].len <= vc->max_inline && wr[i].len > 0)
			w->send_flags |= IBV_SEND_INLINE;
		sq_take(vc, w, wr[i].wr_id, write ? DM_WC_WRITE : DM_WC_READ,
			wr[i].flags & DM_WR_SIGNALED, VERBS_SK_USER);
		if (i + 1 < n)
			w->next = &vc->wrs[i + 1];
	}
	return post_chain(vc, n);
}

int verbs_read_batch(struct dm_conn *c, const struct dm_rdma_wr *wr, int n)
{
	struct verbs_conn *vc = to_vc(c);
	int rc;

	pthread_mutex_lock(&vc->lock);
	rc = rw_batch(c, wr, n, false);
	pthread_mutex_unlock(&vc->lock);
	return rc;
}

int verbs_write_batch(struct dm_conn *c, const struct dm_rdma_wr *wr, int n)
{
	struct verbs_conn *vc = to_vc(c);
	int rc;

	pthread_mutex_lock(&vc->lock);
	rc = rw_batch(c, wr, n, true);
	pthread_mutex_unlock(&vc->lock);
	return rc;
}

/* Fail a WR the device refused at post time for a reason the responder would have refused
 * it for (rxe checks atomic alignment in ibv_post_send): report it as the error completion
 * an RNIC would produce and put the connection in error state, like RC does. */
static int fail_as_completion(struct verbs_conn *vc, uint64_t wr_id, uint8_t opcode, int status)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	struct dm_wc wc = { .wr_id = wr_id, .status = status, .opcode = opcode };
	int rc = verbs_reap(vc);   /* earlier completions first */

	if (rc)
		return rc;
	if (vc->stash_n >= vc->stash_cap)
		return -EAGAIN;
	stash_push(vc, &wc);
	vc->error = true;
	if (ibv_modify_qp(vc->id->qp, &a, IBV_QP_STATE))
		dm_warn("verbs: %s: cannot move the QP to error: %s", vc->base.peer, strerror(errno));
	return 0;
}

/* One 8-byte atomic (compare-and-swap or fetch-and-add); the old value lands in *local. */
static int atomic_op(struct verbs_conn *vc, bool cas, uint64_t wr_id, uint64_t *local,
		     struct dm_mr *mr, uint64_t remote, uint32_t rkey, uint64_t a, uint64_t b,
		     uint32_t flags)
{
	struct ibv_send_wr *w = &vc->wrs[0];
	struct ibv_sge *s = &vc->sges[0];
	int rc;

	/* a misaligned remote address fails as a completion (-EINVAL), not at post time,
	 * as the responder would refuse it */
	if (!in_mr(mr, local, 8) || ((uintptr_t)local & 7))
		return -EINVAL;
	rc = sq_reserve(vc, 1);
	if (rc)
		return rc;
	if (remote & 7)
		return fail_as_completion(vc, wr_id, cas ? DM_WC_CAS : DM_WC_FAA, -EINVAL);
	memset(w, 0, sizeof(*w));
	s->addr = (uintptr_t)local;
	s->length = 8;
	s->lkey = mr->lkey;
	w->sg_list = s;
	w->num_sge = 1;
	w->opcode = cas ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
	w->wr.atomic.remote_addr = remote;
	w->wr.atomic.rkey = rkey;
	w->wr.atomic.compare_add = a;
	w->wr.atomic.swap = b;
	sq_take(vc, w, wr_id, cas ? DM_WC_CAS : DM_WC_FAA, flags & DM_WR_SIGNALED, VERBS_SK_USER);
	return post_chain(vc, 1);
}

int verbs_cas(struct dm_conn *c, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
	      uint64_t remote, uint32_t rkey, uint64_t expect, uint64_t desired,
	      uint32_t flags)
{
	struct verbs_conn *vc = to_vc(c);
	int rc;

	pthread_mutex_lock(&vc->lock);
	rc = atomic_op(vc, true, wr_id, local, mr, remote, rkey, expect, desired, flags);
	pthread_mutex_unlock(&vc->lock);
	return rc;
}

int verbs_faa(struct dm_conn *c, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
	      uint64_t remote, uint32_t rkey, uint64_t add, uint32_t flags)
{
	struct verbs_conn *vc = to_vc(c);
	int rc;

	pthread_mutex_lock(&vc->lock);
	rc = atomic_op(vc, false, wr_id, local, mr, remote, rkey, add, 0, flags);
	pthread_mutex_unlock(&vc->lock);
	return rc;
}

/* Two-sided SEND; copied at post time when small (inline) so the buffer is free at once. */
static int send_locked(struct verbs_conn *vc, uint64_t wr_id, const void *buf, uint32_t len,
		       struct dm_mr *mr, uint32_t flags)
{
	struct ibv_send_wr *w = &vc->wrs[0];
	struct ibv_sge *s = &vc->sges[0];
	bool inl = len <= vc->max_inline && ((flags & DM_WR_INLINE) || !mr);
	int rc;

	if (len > 0 && !buf)
		return -EINVAL;
	if (!inl && !in_mr(mr, buf, len))
		return (flags & DM_WR_INLINE) && !mr ? -EMSGSIZE : -EINVAL;
	rc = sq_reserve(vc, 1);
	if (rc)
		return rc;
	memset(w, 0, sizeof(*w));
	s->addr = (uintptr_t)buf;
	s->length = len;
	s->lkey = inl ? 0 : mr->lkey;
	w->sg_list = s;
	w->num_sge = len ? 1 : 0;
	w->opcode = IBV_WR_SEND;
	if (inl && len)
		w->send_flags |= IBV_SEND_INLINE;
	sq_take(vc, w, wr_id, DM_WC_SEND, flags & DM_WR_SIGNALED, VERBS_SK_USER);
	return post_chain(vc, 1);
}

int verbs_send(struct dm_conn *c, uint64_t wr_id, const void *buf, uint32_t len,
	       struct dm_mr *mr, uint32_t flags)
{
	struct verbs_conn *vc = to_vc(c);
	int rc;

	pthread_mutex_lock(&vc->lock);
	rc = send_locked(vc, wr_id, buf, len, mr, flags);
	pthread_mutex_unlock(&vc->lock);
	return rc;
}

/* Internal signaled READ of len bytes of the peer's handshake area into our landing slot. */
int verbs_post_hs_read(struct verbs_conn *vc, uint64_t remote, uint32_t len)
{
	struct ibv_send_wr *w = &vc->wrs[0];
	struct ibv_sge *s = &vc->sges[0];
	int rc;

	rc = sq_reserve(vc, 1);
	if (rc)
		return rc;
	memset(w, 0, sizeof(*w));
	s->addr = (uintptr_t)(vc->hs_buf + VERBS_HS_SLOT * VERBS_HS_SLOTS);
	s->length = len;
	s->lkey = vc->hs_mr->lkey;
	w->sg_list = s;
	w->num_sge = 1;
	w->opcode = IBV_WR_RDMA_READ;
	w->wr.rdma.remote_addr = remote;
	w->wr.rdma.rkey = vc->peer_hs_rkey;
	vc->hs_read_done = false;
	sq_take(vc, w, 0, DM_WC_READ, false, VERBS_SK_HS);
	return post_chain(vc, 1);
}
