/* dmann_int.h: libdmann's internals shared by dmann.c (connections, the pipelined C_CALL
 * exchange) and dmann_ops.c (the calls of dmann.h as S3 Vectors request bodies). */
#ifndef DMANN_INT_H
#define DMANN_INT_H

#include <pthread.h>
#include <stdbool.h>

#include "dmann.h"
#include "rpc.h"
#include "wire.h"
#include "xport/xport.h"

#define DMANN_MAX_CN 64
#define DMANN_WINDOW 32          /* C_CALLs in flight per compute node (CN's ctlq: 64) */

struct dmann_conn {
	struct dm_conn *conn;
	struct dm_rpc_chan ch;
	uint32_t inflight;
};

struct dmann {
	pthread_mutex_t mu;          /* serialises the calls on a handle */
	struct dm_xport *x;
	struct dm_msgpool *pool;     /* answers: DM_C_MAX_RESP bytes each */
	struct dmann_conn cn[DMANN_MAX_CN];
	uint32_t ncn;
	uint64_t next_id;
	uint32_t rr;                 /* first compute node of the next call */
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
};

/* Run n requests, up to DMANN_WINDOW in flight per compute node, spread over them. 0 or the
 * first -errno (a transport error, or a done() failure). */
int dmann_run(dmann_t *d, struct dmann_req *reqs, size_t n);
/* Set the calling thread's error message; returns err. */
int dmann_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dmann_clear_err(void);

#endif
