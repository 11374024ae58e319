/* verbs_int.h: internal structures of the rdma-core transport backend ("verbs"), shared by
 * verbs_ctx.c (context, memory registration, shared receive queue), verbs_cm.c (librdmacm
 * connection setup and the handshake) and verbs_data.c (the data path).
 *
 * Objects:
 *   verbs_xport    one per dm_xport: a device context chosen among rdma_cm's devices, one
 *                  PD, one SRQ that every connection's QP receives from;
 *   verbs_conn     one RC QP made by rdma_cm, its own CQ (send and receive completions) and
 *                  completion channel, its own rdma_cm event channel;
 *   verbs_listener a bound, listening rdma_cm id with its event channel.
 *
 * Threading: every entry point may be called from any thread. A connection's posting and
 * polling are serialized by its lock (uncontended in the usual one-thread-per-connection
 * use); the context's receive slots and MR list have their own locks. Closing a connection
 * or context must not race with its other uses.
 */
#ifndef DM_VERBS_INT_H
#define DM_VERBS_INT_H

#include "../xport_int.h"
#include "verbs_wire.h"

#include <pthread.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* Send-side wr_ids carry this bit; receive-side wr_ids are slot indices without it. */
#define VERBS_WRID_SEND (1ull << 63)

struct verbs_rslot {             /* one posted receive buffer */
	uint64_t wr_id;              /* the caller's */
	uint32_t next_free;
};

struct verbs_mr {                /* a registration: the caller sees .mr */
	struct dm_mr mr;             /* first: container_of; mr.priv is the ibv_mr */
	struct verbs_mr *prev, *next;
};

struct verbs_xport {
	struct dm_xport base;        /* first: container_of */
	struct dm_xport_ops ops;     /* per-context copy: caps depend on the device */
	struct ibv_context *ctx;     /* owned by librdmacm (rdma_get_devices) */
	char devname[64];
	struct ibv_pd *pd;
	struct ibv_srq *srq;
	uint32_t send_depth;         /* send queue depth of each QP */
	uint32_t srq_depth;
	uint32_t max_inline;         /* requested; each QP records what it got */
	uint8_t rd_atom;             /* outstanding READ/atomic per QP (initiator/responder) */
	uint32_t max_cqe;            /* device limit */

	pthread_mutex_t mlock;       /* registered memory list */
	struct verbs_mr *mrs;        /* deregistered at close if the caller did not */
	pthread_mutex_t rlock;       /* receive slot table */
	struct verbs_rslot *rslots;
	uint32_t rfree;              /* head of the free list, UINT32_MAX when empty */
};

enum verbs_slot_kind { VERBS_SK_USER = 0, VERBS_SK_HS };

struct verbs_sslot {             /* one posted send-queue work request */
	uint64_t wr_id;
	uint8_t opcode;              /* enum dm_wc_opcode */
	uint8_t user_signaled;       /* report success to the caller */
	uint8_t kind;                /* enum verbs_slot_kind */
};

struct verbs_conn {
	struct dm_conn base;         /* first: container_of */
	struct verbs_xport *vx;
	pthread_mutex_t lock;        /* posting, polling, the fields below */
	struct rdma_event_channel *ech;
	struct rdma_cm_id *id;
	struct ibv_comp_channel *chan;
	struct ibv_cq *cq;
	int cqe;
	bool qp_made;                /* rdma_create_qp succeeded */
	bool connected;              /* ESTABLISHED seen, not yet disconnected */
	bool error;                  /* error state: posts fail with -ENOTCONN */
	bool peer_gone;              /* DISCONNECTED seen: flushes report -ECONNRESET */
	uint32_t max_inline;         /* what the QP got */
	uint32_t unacked_events;     /* CQ events to acknowledge before destroying the CQ */

	/* send queue accounting: WRs are numbered; completion of a signaled WR frees it and
	 * every earlier one (RC completes in order). */
	uint32_t depth;              /* largest batch */
	uint32_t sig_every;          /* force a signaled WR at least this often */
	uint32_t qp_depth;           /* depth + sig_every: an unsignaled tail never blocks a
				      * full batch once the signaled WRs before it complete */
	uint32_t unsig_run;
	uint64_t sq_head;            /* next sequence number */
	uint64_t sq_done;            /* all below are completed */
	struct verbs_sslot *sslots;  /* qp_depth entries, index seq % qp_depth */
	struct ibv_send_wr *wrs;     /* depth entries: batch scratch */
	struct ibv_sge *sges;

	/* completions reaped while posting or during the handshake, delivered first */
	struct dm_wc *stash;
	uint32_t stash_cap, stash_head, stash_n;
	uint32_t idle_polls;         /* empty polls since the last cm event check */

	/* handshake area: our messages (readable by the peer) and a landing slot */
	uint8_t *hs_buf;
	struct ibv_mr *hs_mr;
	uint64_t peer_hs_addr;
	uint32_t peer_hs_rkey;
	bool hs_read_done;
	int hs_read_status;
};

struct verbs_listener {
	struct dm_listener base;     /* first: container_of */
	struct verbs_xport *vx;
	struct rdma_event_channel *ech;
	struct rdma_cm_id *id;
};

static inline struct verbs_xport *to_vx(struct dm_xport *x)
{ return container_of(x, struct verbs_xport, base); }
static inline struct verbs_conn *to_vc(struct dm_conn *c)
{ return container_of(c, struct verbs_conn, base); }
static inline struct verbs_listener *to_vl(struct dm_listener *l)
{ return container_of(l, struct verbs_listener, base); }

/* verbs_ctx.c */
int verbs_rslot_get(struct verbs_xport *vx, uint64_t wr_id, uint32_t *idx);
uint64_t verbs_rslot_put(struct verbs_xport *vx, uint32_t idx);

/* verbs_cm.c */
int verbs_listen(struct dm_xport *x, const char *addr, struct dm_listener **out);
int verbs_accept(struct dm_listener *l, int timeout_ms, struct dm_conn **out);
void verbs_listener_close(struct dm_listener *l);
int verbs_listener_port(struct dm_listener *l);
int verbs_connect(struct dm_xport *x, const char *addr, int timeout_ms, struct dm_conn **out);
void verbs_conn_close(struct dm_conn *c);
/* Non-blocking: consume pending rdma_cm events of a connection (disconnects). */
void verbs_cm_check(struct verbs_conn *vc);

/* verbs_data.c */
int verbs_status_errno(enum ibv_wc_status st, uint8_t opcode, bool peer_gone);
int verbs_read_batch(struct dm_conn *c, const struct dm_rdma_wr *wr, int n);
int verbs_write_batch(struct dm_conn *c, const struct dm_rdma_wr *wr, int n);
int verbs_cas(struct dm_conn *c, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
	      uint64_t remote, uint32_t rkey, uint64_t expect, uint64_t desired,
	      uint32_t flags);
int verbs_faa(struct dm_conn *c, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
	      uint64_t remote, uint32_t rkey, uint64_t add, uint32_t flags);
int verbs_send(struct dm_conn *c, uint64_t wr_id, const void *buf, uint32_t len,
	       struct dm_mr *mr, uint32_t flags);
int verbs_poll(struct dm_conn *c, struct dm_wc *wc, int n);
int verbs_wait(struct dm_conn *c, struct dm_wc *wc, int n, int timeout_ms);
/* Post one internal signaled READ of the peer's handshake slot into our landing slot. */
int verbs_post_hs_read(struct verbs_conn *vc, uint64_t remote, uint32_t len);
/* Reap the CQ into the stash (handshake progress); -errno on a CQ failure. */
int verbs_reap(struct verbs_conn *vc);

#endif /* DM_VERBS_INT_H */
