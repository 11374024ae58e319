/* tcp.h: internals of the tcp backend (RDMA RC semantics over stream sockets).
 *
 * One progress thread per context runs an epoll loop over all connections of the context.
 * It serves the peer's one-sided requests against the context's MR table (key, access and
 * bounds checked like an RNIC), places incoming SENDs into the shared receive pool, and
 * completes this side's requests when their responses arrive. Posting threads append
 * encoded requests to the connection's output buffer and write it at once (the doorbell);
 * whatever the socket does not take is written by the progress thread on EPOLLOUT.
 *
 * Responses come back in request order (the target serves a connection's requests in
 * order), so outstanding work is a FIFO ring indexed by request id.
 */
#ifndef DM_TCP_H
#define DM_TCP_H

#include "../xport_int.h"
#include "../../wire.h"

#include <pthread.h>

struct tcp_buf {                 /* bytes [off, len) are pending */
	uint8_t *data;
	size_t off, len, cap;
};

struct tcp_seg {                 /* response data sent straight from an MR (no copy) */
	size_t at;               /* position in the output buffer where it belongs */
	const uint8_t *ptr;
	uint32_t len;
};
#define TCP_MAX_SEGS 256

struct tcp_mr {
	struct dm_mr mr;
	int access;
};

struct tcp_recv {                /* a posted receive buffer */
	void *buf;
	uint32_t len;
	uint64_t wr_id;
};

struct tcp_op {                  /* an outstanding request of this side */
	uint64_t wr_id;
	void *local;             /* READ: destination; CAS/FAA: where the old value goes */
	uint32_t len;
	uint8_t opcode;          /* enum dm_wc_opcode */
	bool signaled;
};

enum tcp_pl_kind {               /* what the payload being received belongs to */
	TCP_PL_NONE,
	TCP_PL_DISCARD,
	TCP_PL_READ_RESP,        /* into the head op's local buffer */
	TCP_PL_WRITE_REQ,        /* into our MR */
	TCP_PL_SEND,             /* into a posted receive buffer */
};

struct tcp_xport;

struct tcp_conn {
	struct dm_conn base;
	struct tcp_xport *tx;
	int fd;
	struct tcp_conn *next, *prev;      /* context's list (under tx->lock) */

	/* Under lock: output, outstanding ops, completion queue, state. */
	pthread_mutex_t lock;
	pthread_cond_t cond;               /* completions arrived / failed */
	int waiters;
	struct dm_notify *notify;          /* woken with every completion (dm_conn_notify) */
	bool failed;
	bool ev_in, ev_out;                /* what the fd is registered for in epoll */
	struct tcp_buf out;
	struct tcp_op *ops;                /* ring of cap_ops, index id % cap_ops */
	uint32_t cap_ops;
	uint64_t head_id, next_id;         /* outstanding = next_id - head_id */
	struct dm_wc *cq;                  /* growable ring */
	uint32_t cq_cap, cq_head, cq_len;

	/* Progress thread only: input parsing. */
	uint8_t *rx;
	size_t rx_off, rx_len, rx_cap;
	enum tcp_pl_kind pl_kind;
	uint8_t *pl_dst;                   /* NULL: discard */
	size_t pl_left;
	uint32_t pl_total;
	int32_t pl_status;
	uint64_t pl_req_id;
	uint32_t pl_rkey;                  /* WRITE_REQ: MR rechecked per chunk */
	struct tcp_recv pl_recv;           /* SEND: the buffer being filled */
	bool rx_blocked;                   /* waiting for a receive buffer */
	bool rx_discard;                   /* sent an error response: ignore further input */
	bool ack_owed;
	uint64_t ack_id;
	bool removed;                      /* taken out of epoll by the progress thread */
	struct tcp_seg *segs;              /* zero-copy READ responses of this parse batch */
	uint32_t nseg;
	bool zc;                           /* output was empty: zero-copy allowed */
	struct tcp_conn *blk_next;         /* blocked list (under tx->pool_lock) */
	bool on_blocked;
	/* Input may be driven by the progress thread or, while it waits, by the application
	 * thread (saving a thread hand-off per round trip): rx_lock says who. */
	pthread_mutex_t rx_lock;
	bool user_rx;                      /* under lock: EPOLLIN off, the waiter reads */
	bool closing;
};

struct tcp_listener {
	struct dm_listener base;
	int fd;
	int port;
};

struct tcp_xport {
	struct dm_xport base;
	uint32_t max_send_wr, max_recv_wr, max_inline;

	int epfd;
	int evfd;                          /* wakes the progress thread */
	pthread_t thread;
	bool thread_started;

	/* Context lock: connection list, commands to the progress thread. */
	pthread_mutex_t lock;
	pthread_cond_t cmd_cond;
	struct tcp_conn *conns;
	bool stop;
	struct tcp_conn *close_req;        /* one conn_close at a time */
	bool close_done;

	/* MR table: rkey = (index + 1) << 8 | 8 random bits. */
	pthread_rwlock_t mr_lock;
	struct tcp_mr **mrs;
	uint32_t n_mrs;

	/* Shared receive pool (SRQ). */
	pthread_mutex_t pool_lock;
	struct tcp_recv *pool;             /* ring of max_recv_wr */
	uint32_t pool_head, pool_len;
	bool pool_waiters;                 /* a connection is blocked on an empty pool */

	struct tcp_conn *blocked;          /* blocked on the pool (under pool_lock) */
};

/* tcp.c */
struct tcp_mr *tcp_mr_lookup(struct tcp_xport *tx, uint32_t rkey);
bool tcp_pool_pop(struct tcp_xport *tx, struct tcp_recv *out, struct tcp_conn *c);
void tcp_wake(struct tcp_xport *tx);

/* tcp_conn.c */
struct tcp_conn *tcp_conn_new(struct tcp_xport *tx, int fd, const char *peer,
			      const char *client);
void tcp_conn_free(struct tcp_conn *c);
void tcp_conn_on_event(struct tcp_conn *c, uint32_t events);
void tcp_conn_resume(struct tcp_conn *c);
void tcp_conn_detach(struct tcp_conn *c);
int tcp_read_batch(struct dm_conn *dc, const struct dm_rdma_wr *wr, int n);
int tcp_write_batch(struct dm_conn *dc, const struct dm_rdma_wr *wr, int n);
int tcp_cas(struct dm_conn *dc, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
	    uint64_t remote, uint32_t rkey, uint64_t expect, uint64_t desired, uint32_t flags);
int tcp_faa(struct dm_conn *dc, uint64_t wr_id, uint64_t *local, struct dm_mr *mr,
	    uint64_t remote, uint32_t rkey, uint64_t add, uint32_t flags);
int tcp_send(struct dm_conn *dc, uint64_t wr_id, const void *buf, uint32_t len,
	     struct dm_mr *mr, uint32_t flags);
int tcp_poll(struct dm_conn *dc, struct dm_wc *wc, int n);
int tcp_wait(struct dm_conn *dc, struct dm_wc *wc, int n, int timeout_ms);
int tcp_notify(struct dm_conn *dc, struct dm_notify *n);

#endif /* DM_TCP_H */
