/* etcd_int.h: internals of the etcd client shared by etcd.c (HTTP, calls), etcd_json.c
 * (parsers, base64) and etcd_watch.c, and exposed to the tests and the fuzz target: the
 * handle, the HTTP exchange, base64, and the validating parsers of etcd's answers (each
 * takes the parsed JSON object; dm_etcd_load parses text). */
#ifndef DM_ETCD_INT_H
#define DM_ETCD_INT_H

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>

#include "etcd.h"
#include "etcd_curl.h"
#include "util/dm_buf.h"

#define DM_ETCD_EP_MAX 16
#define DM_ETCD_ANSWER_MAX (64u << 20)   /* bytes of one answer / one watch message */
#define DM_ETCD_SOCKS 16                 /* connections of one handle dm_etcd_abort reaches */

struct dm_etcd {
	char *ep[DM_ETCD_EP_MAX];
	size_t nep, cur;                 /* cur: the endpoint that answered last */
	int timeout_ms;
	const struct dm_curl_api *cu;    /* libcurl's calls (etcd_curl.h) */
	CURL *curl;                      /* unary calls (keeps its connection) */
	CURL *wcurl;                     /* watch polls (created on first use) */
	struct curl_slist *hdrs;
	struct dm_buf body;              /* the last unary answer */
	char err[256];
	/* dm_etcd_abort: the sockets of both easy handles' connections (opened and closed
	 * through callbacks under sock_mu, so that an abort never shuts down a reused fd) */
	pthread_mutex_t sock_mu;
	bool aborted;                    /* under sock_mu; calls fail with -ECANCELED */
	int socks[DM_ETCD_SOCKS];        /* -1: free slot */
};

/* Record the reason of a failure in e->err; returns rc. */
int dm_etcd_fail(struct dm_etcd *e, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* POST req to path on the current endpoint (then the next ones while no connection can be
 * made), body bytes to wr(ctx). 0, or -ECONNREFUSED, -ETIMEDOUT, -ECANCELED (wr stopped
 * the transfer), -EIO; e->err set on failure. */
int dm_etcd_post(struct dm_etcd *e, CURL *c, const char *path, const char *req, long tmo_ms,
		 size_t (*wr)(char *, size_t, size_t, void *), void *ctx);
/* Interpret an answer (HTTP status, body): a JSON object in *ans (json_decref it) for a
 * 200 without "error", else the error mapped to -errno (e->err set). */
int dm_etcd_answer(struct dm_etcd *e, const char *path, long status, const void *body,
		   size_t n, json_t **ans);
/* A unary call: dm_etcd_post + dm_etcd_answer. */
int dm_etcd_call(struct dm_etcd *e, const char *path, const char *req, json_t **ans);
/* Append `"key":"<b64>","range_end":"<b64>"` for the keys under prefix. */
void dm_etcd_range_req(struct dm_buf *q, const char *prefix);
/* Append the base64 of n bytes. */
void dm_etcd_b64_put(struct dm_buf *q, const void *p, size_t n);
/* Strict base64 (standard alphabet, padded): *out malloc'd, NUL-terminated. -EBADMSG. */
int dm_etcd_unb64(const char *s, size_t sl, char **out, size_t *len);

/* ---- parsers (outside input: every type, size and range checked; -EBADMSG, -ENOMEM) ---- */
/* Text to a JSON object. */
int dm_etcd_load(const void *txt, size_t len, json_t **root);
/* An error answer ({"error","message","code"}, or the stream form {"error":{"grpc_code",
 * "message"}}): the gRPC code mapped to -errno, the message into msg. */
int dm_etcd_ans_error(const json_t *ans, char *msg, size_t cap);
/* An optional int64 field: a decimal string (or a JSON integer); absent or null = 0. */
int dm_etcd_j64(const json_t *o, const char *name, int64_t *v);
/* One mvccpb.KeyValue (key non-empty, mod_revision > 0); nothing allocated on failure. */
int dm_etcd_kv_parse(const json_t *o, struct dm_etcd_kv *kv);
/* A range answer: the kvs (keys strictly ascending) and the header revision. */
int dm_etcd_ans_range(const json_t *ans, struct dm_etcd_kv **kvs, size_t *n, int64_t *revision);
/* A put / deleterange / txn / revoke answer: header revision (> 0), "deleted", "succeeded"
 * (each pointer may be NULL). */
int dm_etcd_ans_write(const json_t *ans, int64_t *revision, int64_t *deleted, bool *succeeded);
/* A lease grant or keepalive ({"result":{...}}) answer: ID and TTL (0: expired). */
int dm_etcd_ans_lease(const json_t *ans, int64_t *id, int64_t *ttl);
/* One watch stream message ({"result":{...}}, not an error). */
struct dm_etcd_wmsg {
	bool created, canceled;
	int64_t revision, compact_revision;
	char reason[128];                /* cancel_reason */
	struct dm_etcd_event *ev;        /* in revision order */
	size_t nev;
};
int dm_etcd_ans_watch(const json_t *ans, struct dm_etcd_wmsg *m);
void dm_etcd_wmsg_free(struct dm_etcd_wmsg *m);

#endif /* DM_ETCD_INT_H */
