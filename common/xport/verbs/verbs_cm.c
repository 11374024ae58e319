/* verbs_cm.c: connection setup for the rdma-core backend with librdmacm (address and route
 * resolution pick the device, GID and, on RoCE, the RoCE v2 GRH; nothing is LID-only), the
 * per-connection QP/CQ, and the dmann handshake run before a connection is returned.
 *
 * Handshake channel. The handshake (handshake.h) must finish before the caller sees the
 * connection, and it must not consume the caller's receive buffers: every QP receives from
 * the context's shared receive queue, so a SEND would land in whatever buffer the
 * application posted there. Instead each side keeps a small handshake area, registered for
 * remote READ only, whose address and key travel in the rdma_cm private data (REQ and REP).
 * A side "sends" handshake message k by writing it into its own slot k; the peer fetches it
 * with RDMA READs until the slot holds a complete message (magic, index, length and an
 * FNV-1a hash over them and the payload, so a READ racing the local write is detected and
 * retried). Only handshake messages, which are public (nonces and HMAC proofs), are ever
 * readable there; no key to application memory exists before the handshake succeeded.
 * The area stays registered for the connection's lifetime, so the client can still read
 * the server's HS_RESULT after accept returned. A side that refuses the peer writes its
 * HS_RESULT(-errno) and lingers until the peer disconnects (at most a second) so that the
 * peer can read why before the area goes away.
 */
#include "verbs_int.h"
#include "../handshake.h"
#include "verbs_wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VERBS_CONNECT_DEFAULT_MS 10000
#define VERBS_LINGER_MS  1000

static uint64_t ms_to_deadline(int ms)
{
	return dm_now_ns() + (uint64_t)ms * 1000000ull;
}

static int ms_left(uint64_t deadline)
{
	uint64_t now = dm_now_ns();

	return now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
}

static void sleep_us(long us)
{
	struct timespec ts = { .tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000 };

	nanosleep(&ts, NULL);
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* Wait for the next rdma_cm event on ch before the deadline. 0 (event in *ev, to be acked)
 * or -ETIMEDOUT / -errno. */
static int cm_next(struct rdma_event_channel *ch, uint64_t deadline, struct rdma_cm_event **ev)
{
	for (;;) {
		struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
		int n;

		if (rdma_get_cm_event(ch, ev) == 0)
			return 0;
		if (errno != EAGAIN && errno != EINTR)
			return -errno;
		n = poll(&pfd, 1, deadline == UINT64_MAX ? -1 : ms_left(deadline));
		if (n < 0 && errno != EINTR)
			return -errno;
		if (n == 0 && deadline != UINT64_MAX && dm_now_ns() >= deadline)
			return -ETIMEDOUT;
	}
}

/* Process one event that arrived on an established (or establishing) connection. */
static void cm_handle(struct verbs_conn *vc, const struct rdma_cm_event *ev)
{
	switch (ev->event) {
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		if (vc->connected || !vc->peer_gone)
			dm_debug("verbs: %s: %s", vc->base.peer, rdma_event_str(ev->event));
		vc->peer_gone = true;
		vc->error = true;
		if (vc->connected) {
			vc->connected = false;
			/* moves the QP to error: outstanding work flushes */
			rdma_disconnect(vc->id);
		}
		break;
	default:
		break;
	}
}

void verbs_cm_check(struct verbs_conn *vc)
{
	struct rdma_cm_event *ev;

	while (rdma_get_cm_event(vc->ech, &ev) == 0) {
		cm_handle(vc, ev);
		rdma_ack_cm_event(ev);
	}
}

/* Name a connection's peer "ip:port" for logs. */
static void peer_name(struct verbs_conn *vc)
{
	struct sockaddr *sa = rdma_get_peer_addr(vc->id);
	char ip[INET6_ADDRSTRLEN] = "?";
	int port = 0;

	if (sa->sa_family == AF_INET) {
		inet_ntop(AF_INET, &((struct sockaddr_in *)sa)->sin_addr, ip, sizeof(ip));
		port = ntohs(((struct sockaddr_in *)sa)->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)sa)->sin6_addr, ip, sizeof(ip));
		port = ntohs(((struct sockaddr_in6 *)sa)->sin6_port);
	}
	snprintf(vc->base.peer, sizeof(vc->base.peer), "%s%s%s:%d",
		 sa->sa_family == AF_INET6 ? "[" : "", ip, sa->sa_family == AF_INET6 ? "]" : "",
		 port);
}

/* Allocate a connection's host-side state: rings, stash, handshake area, cm channel. */
static struct verbs_conn *conn_alloc(struct verbs_xport *vx)
{
	struct verbs_conn *vc = calloc(1, sizeof(*vc));

	if (!vc)
		return NULL;
	vc->base.x = &vx->base;
	vc->vx = vx;
	pthread_mutex_init(&vc->lock, NULL);
	snprintf(vc->base.peer, sizeof(vc->base.peer), "?");
	vc->depth = vx->send_depth;
	vc->sig_every = DM_MAX(1u, vc->depth / 4);
	vc->qp_depth = vc->depth + vc->sig_every;
	/* worst case: every send WR and every shared receive buffer completes here */
	vc->cqe = (int)DM_MIN(vc->qp_depth + vx->srq_depth + 16, vx->max_cqe);
	vc->stash_cap = (uint32_t)vc->cqe + 16;
	vc->sslots = calloc(vc->qp_depth, sizeof(*vc->sslots));
	vc->wrs = calloc(vc->depth, sizeof(*vc->wrs));
	vc->sges = calloc(vc->depth, sizeof(*vc->sges));
	vc->stash = calloc(vc->stash_cap, sizeof(*vc->stash));
	vc->hs_buf = aligned_alloc(64, VERBS_HS_BYTES);
	if (!vc->sslots || !vc->wrs || !vc->sges || !vc->stash || !vc->hs_buf)
		goto err_free;
	memset(vc->hs_buf, 0, VERBS_HS_BYTES);
	vc->hs_mr = ibv_reg_mr(vx->pd, vc->hs_buf, VERBS_HS_BYTES,
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!vc->hs_mr) {
		dm_err("verbs: cannot register the handshake area: %s", strerror(errno));
		goto err_free;
	}
	vc->ech = rdma_create_event_channel();
	if (!vc->ech) {
		dm_err("verbs: rdma_create_event_channel: %s", strerror(errno));
		goto err_dereg;
	}
	if (set_nonblock(vc->ech->fd))
		goto err_destroy_ech;
	return vc;

err_destroy_ech:
	rdma_destroy_event_channel(vc->ech);
err_dereg:
	ibv_dereg_mr(vc->hs_mr);
err_free:
	free(vc->hs_buf);
	free(vc->stash);
	free(vc->sges);
	free(vc->wrs);
	free(vc->sslots);
	pthread_mutex_destroy(&vc->lock);
	free(vc);
	return NULL;
}

/* Until the peer has proved the cluster secret, its requests may only READ (the handshake
 * area is all it needs): the QP refuses remote WRITEs and atomics whatever key the peer
 * guesses. rdma_cm left the new QP in INIT with full remote access; INIT->INIT may change
 * the access flags. A device that refuses only loses this extra protection. */
static void conn_restrict(struct verbs_conn *vc)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT,
				 .qp_access_flags = IBV_ACCESS_REMOTE_READ };

	static bool warned;

	if (ibv_modify_qp(vc->id->qp, &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS) &&
	    !__atomic_exchange_n(&warned, true, __ATOMIC_RELAXED))
		dm_warn("verbs: %s cannot restrict remote access during the handshake (%s): "
			"unauthenticated peers can write memory whose key they guess",
			vc->vx->devname, strerror(errno));
}

/* The peer proved the secret: allow remote READ, WRITE and atomics (RTS->RTS). Also lower
 * the responder's RNR timer from rdma_cm's default (encoding 0 = 655 ms, which a sender
 * short of receive buffers at the peer would wait per retry) to 0.64 ms. */
static int conn_open_access(struct verbs_conn *vc)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTS,
		.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_ATOMIC,
		.min_rnr_timer = 12,
	};

	if (ibv_modify_qp(vc->id->qp, &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS |
			  IBV_QP_MIN_RNR_TIMER) == 0)
		return 0;
	dm_debug("verbs: %s: RTS->RTS with the RNR timer failed (%s), access flags only",
		 vc->base.peer, strerror(errno));
	if (ibv_modify_qp(vc->id->qp, &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS) == 0)
		return 0;
	dm_err("verbs: %s: cannot enable remote access after the handshake: %s", vc->base.peer,
	       strerror(errno));
	return -EIO;
}

/* Completion channel, CQ and the RC QP (receiving from the context's SRQ) on vc->id. */
static int conn_setup_qp(struct verbs_conn *vc)
{
	struct verbs_xport *vx = vc->vx;
	struct ibv_qp_init_attr qa;
	uint32_t inl = vx->max_inline;
	int err;

	vc->chan = ibv_create_comp_channel(vx->ctx);
	if (!vc->chan)
		return -(errno ? errno : EIO);
	if ((err = set_nonblock(vc->chan->fd)))
		goto err_destroy_chan;
	vc->cq = ibv_create_cq(vx->ctx, vc->cqe, vc, vc->chan, 0);
	if (!vc->cq) {
		err = -(errno ? errno : EIO);
		dm_err("verbs: ibv_create_cq(%d): %s", vc->cqe, strerror(-err));
		goto err_destroy_chan;
	}
	/* The device may support less inline data than asked: retry with less. */
	for (;;) {
		memset(&qa, 0, sizeof(qa));
		qa.send_cq = vc->cq;
		qa.recv_cq = vc->cq;
		qa.srq = vx->srq;
		qa.qp_type = IBV_QPT_RC;
		qa.sq_sig_all = 0;
		qa.cap.max_send_wr = vc->qp_depth;
		qa.cap.max_send_sge = 1;
		qa.cap.max_inline_data = inl;
		if (rdma_create_qp(vc->id, vx->pd, &qa) == 0)
			break;
		err = -(errno ? errno : EIO);
		if (inl == 0) {
			dm_err("verbs: rdma_create_qp (send depth %u) failed: %s", vc->qp_depth,
			       strerror(-err));
			goto err_destroy_cq;
		}
		inl /= 2;
	}
	vc->qp_made = true;
	vc->max_inline = qa.cap.max_inline_data;
	conn_restrict(vc);
	return 0;

err_destroy_cq:
	ibv_destroy_cq(vc->cq);
	vc->cq = NULL;
err_destroy_chan:
	ibv_destroy_comp_channel(vc->chan);
	vc->chan = NULL;
	return err;
}

/* Tear down everything conn_alloc/conn_setup_qp made; disconnects first if needed. */
static void conn_free(struct verbs_conn *vc)
{
	if (vc->connected)
		rdma_disconnect(vc->id);
	if (vc->qp_made)
		rdma_destroy_qp(vc->id);
	if (vc->cq) {
		if (vc->unacked_events)
			ibv_ack_cq_events(vc->cq, vc->unacked_events);
		if (ibv_destroy_cq(vc->cq))
			dm_warn("verbs: %s: ibv_destroy_cq failed", vc->base.peer);
	}
	if (vc->chan)
		ibv_destroy_comp_channel(vc->chan);
	if (vc->id)
		rdma_destroy_id(vc->id);
	rdma_destroy_event_channel(vc->ech);
	ibv_dereg_mr(vc->hs_mr);
	free(vc->hs_buf);
	free(vc->stash);
	free(vc->sges);
	free(vc->wrs);
	free(vc->sslots);
	pthread_mutex_destroy(&vc->lock);
	free(vc);
}

void verbs_conn_close(struct dm_conn *c)
{
	conn_free(to_vc(c));
}

/* ---- handshake channel ---- */

/* Publish our handshake message number idx in our own slot idx. */
static void hs_put(struct verbs_conn *vc, uint32_t idx, const uint8_t *msg, size_t len)
{
	verbs_slot_put(vc->hs_buf + (size_t)idx * VERBS_HS_SLOT, idx, msg, len);
}

/* Fetch the peer's message number idx: READ its slot until it holds a complete message.
 * 0 (message in msg, its length in len), -ETIMEDOUT, -ECONNRESET, or the READ's error. */
static int hs_get(struct verbs_conn *vc, uint32_t idx, uint8_t *msg, size_t cap, size_t *len,
		  uint64_t deadline)
{
	const uint8_t *land = vc->hs_buf + VERBS_HS_SLOT * VERBS_HS_SLOTS;
	long backoff = 20;
	int rc;

	if (idx >= VERBS_HS_SLOTS)
		return -EPROTO;
	for (;;) {
		size_t l;

		rc = verbs_post_hs_read(vc, vc->peer_hs_addr + (uint64_t)idx * VERBS_HS_SLOT,
					VERBS_HS_SLOT);
		if (rc)
			return vc->peer_gone ? -ECONNRESET : rc;
		for (unsigned spins = 0; !vc->hs_read_done; spins++) {
			rc = verbs_reap(vc);
			if (rc)
				return rc;
			if (vc->hs_read_done)
				break;
			if (dm_now_ns() >= deadline)
				return -ETIMEDOUT;
			/* a peer that gave up hangs up: stop waiting for its RNIC to answer */
			if (spins % 64 == 63) {
				verbs_cm_check(vc);
				if (vc->peer_gone)
					return -ECONNRESET;
			}
			sleep_us(10);
		}
		if (vc->hs_read_status)
			return vc->peer_gone ? -ECONNRESET : vc->hs_read_status;
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (verbs_slot_check(land, idx, &l) == 0) {
			if (l > cap)
				return -EMSGSIZE;
			memcpy(msg, land + VERBS_HS_HDR, l);
			*len = l;
			return 0;
		}
		verbs_cm_check(vc);
		if (vc->peer_gone)
			return -ECONNRESET;
		if (dm_now_ns() >= deadline)
			return -ETIMEDOUT;
		sleep_us(backoff);
		backoff = DM_MIN(backoff * 2, 2000);
	}
}

/* After refusing the peer: give it up to a second to read our HS_RESULT and hang up. */
static void hs_linger(struct verbs_conn *vc)
{
	uint64_t deadline = ms_to_deadline(VERBS_LINGER_MS);

	while (!vc->peer_gone && dm_now_ns() < deadline) {
		struct rdma_cm_event *ev;

		if (cm_next(vc->ech, deadline, &ev))
			break;
		cm_handle(vc, ev);
		rdma_ack_cm_event(ev);
	}
}

/* Run the dmann handshake (handshake.h) over the handshake channel. 0 or -errno. */
static int verbs_handshake(struct verbs_conn *vc, enum dm_hs_role role, uint64_t deadline)
{
	uint8_t in[DM_HS_MAX_MSG], out[DM_HS_MAX_MSG];
	size_t inlen = 0, outlen = 0;
	uint32_t mine = 0, theirs = 0;
	struct dm_hs hs;
	int rc;

	_Static_assert(DM_HS_MAX_MSG <= VERBS_HS_SLOT - VERBS_HS_HDR, "handshake slot too small");
	rc = dm_hs_init(&hs, &vc->vx->base, role, vc->base.peer);
	if (rc)
		return rc;
	if (role == DM_HS_CLIENT) {
		rc = dm_hs_step(&hs, NULL, 0, out, &outlen);
		if (rc < 0)
			goto out_clear;
		hs_put(vc, mine++, out, outlen);
	}
	for (;;) {
		rc = hs_get(vc, theirs++, in, sizeof(in), &inlen, deadline);
		if (rc) {
			dm_warn("verbs: handshake with %s failed: %s", vc->base.peer, strerror(-rc));
			goto out_clear;
		}
		rc = dm_hs_step(&hs, in, inlen, out, &outlen);
		/* The peer has just proved the secret when the client accepted the server's
		 * REPLY (its first message) or the server accepted AUTH: open our memory to it
		 * before the message that lets it go ahead (AUTH, RESULT) is published.
		 * A client identity's connection never gets remote access (wire.h). */
		if (((role == DM_HS_CLIENT && rc == 0 && theirs == 1) ||
		     (role == DM_HS_SERVER && rc == 1)) && !hs.client[0]) {
			int orc = conn_open_access(vc);

			if (orc) {
				rc = orc;
				outlen = 0;
				break;
			}
		}
		if (outlen) {
			if (mine >= VERBS_HS_SLOTS - 1) {
				rc = -EPROTO;
				goto out_clear;
			}
			hs_put(vc, mine++, out, outlen);
		}
		if (rc != 0)
			break;
	}
	if (rc < 0) {
		if (outlen)
			hs_linger(vc);
		goto out_clear;
	}
	rc = 0;
	if (role == DM_HS_SERVER)
		snprintf(vc->base.client, sizeof(vc->base.client), "%s", hs.client);
out_clear:
	dm_hs_clear(&hs);
	return rc;
}

/* ---- listener ---- */

static int resolve(const char *addr, bool passive, struct addrinfo **res)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
	char host[256], port[16];
	int rc;

	if (!addr || dm_addr_split(addr, host, sizeof(host), port, sizeof(port)))
		return -EINVAL;
	if (passive)
		hints.ai_flags |= AI_PASSIVE;
	rc = getaddrinfo(passive && (!host[0] || !strcmp(host, "*")) ? NULL : host, port,
			 &hints, res);
	if (rc) {
		dm_warn("verbs: cannot resolve %s: %s", addr, gai_strerror(rc));
		return passive ? -EADDRNOTAVAIL : -EHOSTUNREACH;
	}
	return 0;
}

int verbs_listen(struct dm_xport *x, const char *addr, struct dm_listener **out)
{
	struct verbs_xport *vx = to_vx(x);
	struct verbs_listener *vl;
	struct addrinfo *res, *ai;
	int rc;

	if (!out)
		return -EINVAL;
	rc = resolve(addr, true, &res);
	if (rc)
		return rc;
	vl = calloc(1, sizeof(*vl));
	if (!vl) {
		rc = -ENOMEM;
		goto err_free_res;
	}
	vl->base.x = x;
	vl->vx = vx;
	vl->ech = rdma_create_event_channel();
	if (!vl->ech) {
		rc = -(errno ? errno : EIO);
		goto err_free_vl;
	}
	if ((rc = set_nonblock(vl->ech->fd)))
		goto err_destroy_ech;
	rc = -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		if (rdma_create_id(vl->ech, &vl->id, vl, RDMA_PS_TCP)) {
			rc = -errno;
			continue;
		}
		if (rdma_bind_addr(vl->id, ai->ai_addr) == 0 && rdma_listen(vl->id, 128) == 0)
			break;
		rc = -errno;
		rdma_destroy_id(vl->id);
		vl->id = NULL;
	}
	if (!vl->id) {
		dm_warn("verbs: cannot listen on %s: %s", addr, strerror(-rc));
		goto err_destroy_ech;
	}
	/* bound to one address: that address must be on our device */
	if (vl->id->verbs && vl->id->verbs != vx->ctx) {
		dm_err("verbs: %s belongs to RDMA device %s, but this context uses %s", addr,
		       ibv_get_device_name(vl->id->verbs->device), vx->devname);
		rc = -ENODEV;
		goto err_destroy_id;
	}
	freeaddrinfo(res);
	*out = &vl->base;
	return 0;

err_destroy_id:
	rdma_destroy_id(vl->id);
err_destroy_ech:
	rdma_destroy_event_channel(vl->ech);
err_free_vl:
	free(vl);
err_free_res:
	freeaddrinfo(res);
	return rc;
}

int verbs_listener_port(struct dm_listener *l)
{
	return ntohs(rdma_get_src_port(to_vl(l)->id));
}

void verbs_listener_close(struct dm_listener *l)
{
	struct verbs_listener *vl = to_vl(l);

	rdma_destroy_id(vl->id);
	rdma_destroy_event_channel(vl->ech);
	free(vl);
}

/* Accept one connection request: QP, REP with our handshake area, ESTABLISHED, then the
 * server side of the handshake. A peer that fails is dropped and the error returned. */
int verbs_accept(struct dm_listener *l, int timeout_ms, struct dm_conn **out)
{
	struct verbs_listener *vl = to_vl(l);
	struct verbs_xport *vx = vl->vx;
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : ms_to_deadline(timeout_ms);
	struct rdma_conn_param cp = { 0 };
	uint8_t priv[VERBS_CM_PRIV_LEN];
	struct verbs_cm_priv peer;
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct verbs_conn *vc;
	int rc, prc;

	if (!out)
		return -EINVAL;
	for (;;) {
		rc = cm_next(vl->ech, deadline, &ev);
		if (rc)
			return rc;
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST)
			break;
		dm_debug("verbs: listener: ignoring %s", rdma_event_str(ev->event));
		rdma_ack_cm_event(ev);
	}
	id = ev->id;
	prc = verbs_priv_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, &peer);
	rdma_ack_cm_event(ev);
	if (prc) {
		dm_warn("verbs: connection request without a valid dmann header: %s", strerror(-prc));
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		return prc;
	}
	if (id->verbs != vx->ctx) {
		dm_warn("verbs: connection request arrived on %s, this context uses %s",
			ibv_get_device_name(id->verbs->device), vx->devname);
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		return -ENODEV;
	}
	vc = conn_alloc(vx);
	if (!vc) {
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		return -ENOMEM;
	}
	if (rdma_migrate_id(id, vc->ech)) {
		rc = -errno;
		rdma_reject(id, NULL, 0);
		rdma_destroy_id(id);
		conn_free(vc);
		return rc;
	}
	vc->id = id;
	id->context = vc;
	peer_name(vc);
	vc->peer_hs_addr = peer.hs_addr;
	vc->peer_hs_rkey = peer.hs_rkey;
	rc = conn_setup_qp(vc);
	if (rc) {
		rdma_reject(id, NULL, 0);
		goto err_free_vc;
	}
	verbs_priv_encode(priv, (uintptr_t)vc->hs_buf, vc->hs_mr->rkey, VERBS_HS_BYTES);
	cp.private_data = priv;
	cp.private_data_len = sizeof(priv);
	cp.responder_resources = vx->rd_atom;
	cp.initiator_depth = vx->rd_atom;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;   /* wait for receive buffers as long as it takes */
	if (rdma_accept(id, &cp)) {
		rc = -errno;
		dm_warn("verbs: rdma_accept from %s: %s", vc->base.peer, strerror(-rc));
		goto err_free_vc;
	}
	/* The handshake gets its own deadline, whatever the accept timeout was. */
	deadline = ms_to_deadline(DM_HS_TIMEOUT_MS);
	rc = cm_next(vc->ech, deadline, &ev);
	if (rc == 0) {
		if (ev->event != RDMA_CM_EVENT_ESTABLISHED) {
			dm_warn("verbs: %s: expected ESTABLISHED, got %s (status %d)", vc->base.peer,
				rdma_event_str(ev->event), ev->status);
			rc = -ECONNABORTED;
		}
		rdma_ack_cm_event(ev);
	}
	if (rc)
		goto err_free_vc;
	vc->connected = true;
	rc = verbs_handshake(vc, DM_HS_SERVER, deadline);
	if (rc)
		goto err_free_vc;
	dm_debug("verbs: accepted %s (inline %u)", vc->base.peer, vc->max_inline);
	*out = &vc->base;
	return 0;

err_free_vc:
	conn_free(vc);
	return rc;
}

/* ---- active side ---- */

/* Map a failed connection attempt's event to an errno. */
static int connect_event_errno(const struct rdma_cm_event *ev)
{
	switch (ev->event) {
	case RDMA_CM_EVENT_REJECTED:     return -ECONNREFUSED;
	case RDMA_CM_EVENT_UNREACHABLE:  return ev->status == -ETIMEDOUT ? -ETIMEDOUT : -EHOSTUNREACH;
	case RDMA_CM_EVENT_CONNECT_ERROR: return -ECONNREFUSED;
	case RDMA_CM_EVENT_ADDR_ERROR:   return -EHOSTUNREACH;
	case RDMA_CM_EVENT_ROUTE_ERROR:  return -ENETUNREACH;
	default:                         return -ECONNABORTED;
	}
}

/* Wait for one expected event on the connection's channel; anything else is a failure. */
static int conn_expect(struct verbs_conn *vc, enum rdma_cm_event_type want, uint64_t deadline,
		       struct verbs_cm_priv *priv)
{
	struct rdma_cm_event *ev;
	int rc = cm_next(vc->ech, deadline, &ev);

	if (rc)
		return rc;
	if (ev->event == RDMA_CM_EVENT_ESTABLISHED)
		vc->connected = true;
	if (ev->event != want) {
		rc = connect_event_errno(ev);
		dm_debug("verbs: connect %s: %s (status %d)", vc->base.peer,
			 rdma_event_str(ev->event), ev->status);
	} else if (priv) {
		rc = verbs_priv_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, priv);
		if (rc)
			dm_warn("verbs: %s accepted without a valid dmann header", vc->base.peer);
	}
	rdma_ack_cm_event(ev);
	return rc;
}

int verbs_connect(struct dm_xport *x, const char *addr, int timeout_ms, struct dm_conn **out)
{
	struct verbs_xport *vx = to_vx(x);
	struct rdma_conn_param cp = { 0 };
	uint8_t priv[VERBS_CM_PRIV_LEN];
	struct verbs_cm_priv peer;
	struct verbs_conn *vc;
	struct addrinfo *res;
	uint64_t deadline;
	int rc;

	if (!out)
		return -EINVAL;
	if (timeout_ms <= 0)
		timeout_ms = VERBS_CONNECT_DEFAULT_MS;
	deadline = ms_to_deadline(timeout_ms);
	rc = resolve(addr, false, &res);
	if (rc)
		return rc;
	vc = conn_alloc(vx);
	if (!vc) {
		freeaddrinfo(res);
		return -ENOMEM;
	}
	snprintf(vc->base.peer, sizeof(vc->base.peer), "%s", addr);
	if (rdma_create_id(vc->ech, &vc->id, vc, RDMA_PS_TCP)) {
		rc = -errno;
		freeaddrinfo(res);
		goto err_free_vc;
	}
	rc = rdma_resolve_addr(vc->id, NULL, res->ai_addr, DM_MAX(ms_left(deadline), 1)) ?
		-errno : 0;
	freeaddrinfo(res);
	if (!rc)
		rc = conn_expect(vc, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, NULL);
	if (rc) {
		dm_debug("verbs: cannot resolve %s to an RDMA device: %s", addr, strerror(-rc));
		goto err_free_vc;
	}
	if (vc->id->verbs != vx->ctx) {
		dm_err("verbs: the route to %s goes through RDMA device %s, but this context uses %s",
		       addr, ibv_get_device_name(vc->id->verbs->device), vx->devname);
		rc = -ENETUNREACH;
		goto err_free_vc;
	}
	rc = rdma_resolve_route(vc->id, DM_MAX(ms_left(deadline), 1)) ? -errno : 0;
	if (!rc)
		rc = conn_expect(vc, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, NULL);
	if (rc)
		goto err_free_vc;
	rc = conn_setup_qp(vc);
	if (rc)
		goto err_free_vc;
	verbs_priv_encode(priv, (uintptr_t)vc->hs_buf, vc->hs_mr->rkey, VERBS_HS_BYTES);
	cp.private_data = priv;
	cp.private_data_len = sizeof(priv);
	cp.responder_resources = vx->rd_atom;
	cp.initiator_depth = vx->rd_atom;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (rdma_connect(vc->id, &cp)) {
		rc = -errno;
		goto err_free_vc;
	}
	rc = conn_expect(vc, RDMA_CM_EVENT_ESTABLISHED, deadline, &peer);
	if (rc) {
		dm_debug("verbs: connect to %s: %s", addr, strerror(-rc));
		goto err_free_vc;
	}
	vc->peer_hs_addr = peer.hs_addr;
	vc->peer_hs_rkey = peer.hs_rkey;
	rc = verbs_handshake(vc, DM_HS_CLIENT, deadline);
	if (rc)
		goto err_free_vc;
	dm_debug("verbs: connected to %s (inline %u)", vc->base.peer, vc->max_inline);
	*out = &vc->base;
	return 0;

err_free_vc:
	conn_free(vc);
	return rc;
}
