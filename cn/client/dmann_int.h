/* dmann_int.h: libdmann's internals shared by dmann.c (connections, the pipelined C_CALL
 * exchange), dmann_ops.c (the calls of dmann.h as S3 Vectors request bodies), dmann_route.c
 * (client-side routing) and dmann_search.c (the native HNSW search). */
#ifndef DMANN_INT_H
#define DMANN_INT_H

#include <pthread.h>
#include <stdbool.h>

#include "dmann.h"
#include "oracle.h"
#include "rpc.h"
#include "wire.h"
#include "xport/xport.h"

#define DMANN_MAX_CN 64
#define DMANN_WINDOW 32          /* C_CALLs in flight per compute node (CN's ctlq: 64) */

#define DMANN_BUSY_TRIES 5       /* a read answered 503 (ServiceUnavailable: retry later) is
				  * sent again up to this many times, after 100 ms doubling to
				  * 1.6 s (3.1 s in all), as the AWS SDKs retry it */
#define DMANN_TRIES 2            /* a request whose compute node died is sent once more
				  * (a query answered -ECONNABORTED, relayed to a dead CN and
				  * not run, twice more on top) */

struct dmann_conn {
	struct dm_conn *conn;        /* NULL while dead */
	struct dm_rpc_chan ch;
	uint32_t inflight;
	char ep[128];                /* its endpoint (host:port) */
	bool dead;                   /* the connection failed: reconnected by dmann_revive */
	uint64_t retry_ns;           /* dead: next reconnection attempt */
	uint32_t backoff_ms;
};

/* Client-side routing (dmann_route.c): the compute nodes' oracle and strategy, fetched with
 * Q_ROUTER, and the router's per-batch state, run here as the CNs run it. */
struct dmann_route {
	bool ok;                     /* routes: an oracle of `epoch`, a strategy other than none */
	bool stale;                  /* an answer showed another epoch or strategy: refresh */
	/* The last refresh found the compute nodes disagreeing (an oracle epoch or owner
	 * change in progress) or one without an oracle yet: routing goes on with this state,
	 * which the CNs still admit (a CN runs a query of its previous routing epoch where it
	 * arrived), and it is fetched again every 100 ms in a call, answers of the other epoch
	 * notwithstanding. */
	bool kept;
	uint32_t epoch, strategy, batch, metric, k;
	uint64_t hash;
	struct dm_oracle *o;
	uint32_t *spill;             /* k x (k-1): ring spill order of each partition */
	uint32_t *owner;             /* k: the CN serving partition p (Q_ROUTER's owners) */
	uint32_t *cand;              /* scratch, 2k: candidate CNs in rank and ring order */
	int32_t conn_of[DM_MAX_NODES_WIRE]; /* node id -> connection index, -1 */
	uint32_t node_of[DMANN_MAX_CN];     /* connection index -> node id */
	uint32_t *hist, *limit, *want, *qlen, *cns, total;
	double *demand;
	float *qv;                   /* scratch: a normalised query */
};

struct dmann {
	pthread_mutex_t mu;          /* serialises the calls on a handle */
	struct dm_xport *x;
	struct dm_msgpool *pool;     /* answers: DM_C_MAX_RESP bytes each */
	struct dmann_conn cn[DMANN_MAX_CN];
	uint32_t ncn;
	uint64_t next_id;
	uint32_t rr;                 /* first compute node of the next call */
	struct dmann_route rt;
	uint64_t rt_checked_ns;      /* when the oracle was last fetched (or tried) */
	struct dmann_fetch *fetch;   /* an asynchronous refresh in progress (dmann_route.c) */
	uint64_t next_fetch;
	int ferr;                    /* dmann_run: the call's first failure, and its message */
	char fmsg[512];
};

/* One C_CALL: body is call{op, json_len} + JSON; done() parses the answer (status, JSON)
 * into the caller's output and returns 0 or -errno. */
struct dmann_req {
	uint8_t *body;
	uint32_t blen;
	int (*done)(struct dmann_req *r, int status, const char *json, size_t len);
	void *ctx;                   /* the caller's */
	size_t index;                /* e.g. the query number */
	int err;
	bool finished;
	uint32_t on;                 /* dmann_run: connection it is in flight on + 1 */
	uint32_t tries;              /* dmann_run: times sent */
	bool read;                   /* a read (Get/List/Query): safe to send again */
	uint32_t busy;               /* dmann_run: 503 answers taken (DMANN_BUSY_TRIES) */
	uint64_t not_before;         /* dmann_run: a busy request's next send, CLOCK_MONOTONIC */
};

/* Connection c failed: close it and mark it dead (its requests in flight are the caller's
 * to retry). The routing state goes stale (its node is unreachable). */
void dmann_conn_lost(dmann_t *d, uint32_t c);
/* At the start of a call (d->mu held): reconnect the dead connections whose back-off passed
 * (1 s, doubling to 10 s). The number of live connections. */
uint32_t dmann_revive(dmann_t *d);
/* The next live connection with fewer than window in flight, round robin from *rr; -1. */
int dmann_live_pick(dmann_t *d, uint32_t *rr, const uint32_t *window, uint32_t all);

/* Run n requests, up to DMANN_WINDOW in flight per compute node, spread over them; a
 * request whose compute node dies (its connection fails) is sent once more to another one,
 * a read answered 503 up to DMANN_BUSY_TRIES more times after a back-off; when every
 * connection has failed, each dead one is connected again once, back-off notwithstanding,
 * before the call fails with "no compute node is reachable".
 * 0 or the first -errno (a transport error twice, no live compute node, or a done()
 * failure). */
int dmann_run(dmann_t *d, struct dmann_req *reqs, size_t n);
/* Client-side routing (caller holds d->mu, nothing in flight). refresh: fetch the oracle
 * and strategy from the compute nodes (Q_ROUTER); 0 when routing client-side now,
 * -EAGAIN when not (no oracle yet, strategy none, CNs that disagree: the CNs route), other
 * -errno on a transport failure. */
int dmann_route_refresh(dmann_t *d);
/* The same without waiting for the queries in flight (dmann_search, which has a state to
 * route with meanwhile): Q_ROUTER is sent on every live connection (counted in its
 * inflight; *sent of them) with request id DMANN_FETCH_ID | n, and the answers are taken
 * with the queries' (dmann_route_fetch_answer; dmann_route_fetch_lost when a connection
 * with one pending fails). The last one settles it as dmann_route_refresh does. start: 0,
 * -ENOMEM, -EHOSTDOWN (nothing could be sent); 0 and nothing sent while one is in
 * progress. answer: 0 (more pending), 1 (settled), -EBADMSG (no such request pending on c).
 * lost: 1 when that settled it. */
#define DMANN_FETCH_ID (1ull << 63)
struct dm_wire_hdr;
bool dmann_route_fetching(const dmann_t *d);
int dmann_route_fetch_start(dmann_t *d, uint32_t *sent);
int dmann_route_fetch_answer(dmann_t *d, uint32_t c, const struct dm_wire_hdr *h,
			     const uint8_t *body, uint32_t len);
int dmann_route_fetch_lost(dmann_t *d, uint32_t c);
/* Forget a refresh in progress (dmann_close). */
void dmann_route_fetch_cancel(dmann_t *d);
/* The connection for query vector v: the router's pick (strategy, batch limits) among
 * connections with fewer than window[c] in flight, else the next in rank order with
 * room (*flags DM_Q_F_ROUTED [| DM_Q_F_SPILLED]). -1 when every candidate is full. */
int dmann_route_pick(dmann_t *d, const float *v, const uint32_t *window, uint32_t *flags);
/* Follow an answer from connection c: the queue length of the CN that ran it, and stale
 * when its epoch or strategy differ from ours. */
void dmann_route_answer(dmann_t *d, const struct dm_wire_q_result *r);
void dmann_route_free(struct dmann_route *rt);

/* Set the calling thread's error message; returns err. */
int dmann_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dmann_clear_err(void);

#endif
