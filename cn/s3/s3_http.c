/* s3_http.c: libmicrohttpd front end of the S3 Vectors gateway: body collection with the
 * payload limit, SigV4, routing, the bounded query admission queue and its search threads
 * (see s3_http.h). */
#include "s3_http.h"
#include "s3_gate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "util/dm_buf.h"

struct req {
	struct s3_http *h;
	struct MHD_Connection *conn;
	struct dm_buf body;              /* the request body */
	bool too_big;
	bool have_resp;
	struct s3_resp resp;
	struct req *qnext;
};

struct s3_http {
	struct s3_http_cfg cfg;
	char *tls_cert, *tls_key;        /* PEM contents (HTTPS) */
	struct MHD_Daemon *d;
	uint16_t port;
	pthread_mutex_t qmu;
	pthread_cond_t qcv;
	struct req *qhead, *qtail;
	unsigned admitted;             /* under qmu: queued + running queries */
	bool stopping;
	pthread_t *workers;
	unsigned nworkers;
	struct s3_http_stats st;       /* atomics */
};

static void stat_inc(uint64_t *c)
{
	__atomic_add_fetch(c, 1, __ATOMIC_RELAXED);
}

/* Keep URLs and arguments raw: SigV4 signs the encoded path. */
static size_t no_unescape(void *cls, struct MHD_Connection *c, char *s)
{
	(void)cls;
	(void)c;
	return strlen(s);
}

static const char *hdr(void *ctx, const char *lname)
{
	return MHD_lookup_connection_value(ctx, MHD_HEADER_KIND, lname);
}

static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind, const char *k,
			       const char *v)
{
	struct dm_buf *q = cls;

	(void)kind;
	dm_buf_printf(q, "%s%s=%s", q->n ? "&" : "", k, v ? v : "");
	if (q->oom)
		return MHD_NO;
	return MHD_YES;
}

/* Queue r's response on the connection (takes the body). */
static enum MHD_Result send_resp(struct MHD_Connection *c, struct s3_resp *r)
{
	struct MHD_Response *mr;
	enum MHD_Result ret;
	char rid[40];
	static uint64_t seq;

	if (!r->body) {
		r->body = strdup("{}");
		r->len = r->body ? 2 : 0;
	}
	mr = MHD_create_response_from_buffer(r->len, r->body, MHD_RESPMEM_MUST_FREE);
	if (!mr) {
		s3_resp_free(r);
		return MHD_NO;
	}
	r->body = NULL;
	r->len = 0;
	MHD_add_response_header(mr, "Content-Type", "application/json");
	snprintf(rid, sizeof(rid), "%016llx%08llx", (unsigned long long)dm_now_ns(),
		 (unsigned long long)__atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
	MHD_add_response_header(mr, "x-amzn-RequestId", rid);
	if (r->errtype)
		MHD_add_response_header(mr, "x-amzn-ErrorType", r->errtype);
	ret = MHD_queue_response(c, (unsigned)r->status, mr);
	MHD_destroy_response(mr);
	return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, int status, const char *type,
				  const char *msg)
{
	struct s3_resp r = { 0 };

	s3_resp_error(&r, status, type, "%s", msg);
	return send_resp(c, &r);
}

/* Authenticate rq against auth (query: the raw query string); fills an error response and
 * returns false if refused, else *who is the signing credential. */
static bool authenticate(struct s3_http *h, const struct s3_sigv4_cfg *auth, struct req *rq,
			 const char *url, const char *method, const char *query, size_t *who)
{
	char msg[256];
	int rc;
	struct s3_sigv4_req sr = {
		.method = method, .path = url, .query = query,
		.header = hdr, .hctx = rq->conn, .body = (const char *)rq->body.p,
		.body_len = rq->body.n,
	};

	rc = s3_sigv4_verify_who(auth, &sr, time(NULL), who, msg, sizeof(msg));
	if (rc) {
		stat_inc(&h->st.auth_failures);
		s3_resp_error(&rq->resp, 403, s3_sigv4_errtype(rc), "%s", msg);
		return false;
	}
	return true;
}

/* Run a (non-query) operation where this gateway runs them. */
static void run_op(void *ctx, const char *op, const char *body, size_t len, struct s3_resp *r)
{
	struct s3_http *h = ctx;

	memset(r, 0, sizeof(*r));
	if (h->cfg.backend)
		h->cfg.backend->handle(h->cfg.backend->ctx, op, body, len, r);
	else
		s3_api_handle(h->cfg.api, op, body, len, r);
}

/* Admit a query: false if the queue is full (or the server stops). */
static bool admit(struct s3_http *h, struct req *rq)
{
	bool ok;

	pthread_mutex_lock(&h->qmu);
	ok = !h->stopping && h->admitted < h->cfg.queue_depth;
	if (ok) {
		h->admitted++;
		/* Suspend before a worker can see it, so that its resume always follows. */
		MHD_suspend_connection(rq->conn);
		rq->qnext = NULL;
		if (h->qtail)
			h->qtail->qnext = rq;
		else
			h->qhead = rq;
		h->qtail = rq;
		pthread_cond_signal(&h->qcv);
	}
	pthread_mutex_unlock(&h->qmu);
	return ok;
}

#define BATCH_CAP 64

/* Search thread: take up to batch_max queued queries, run them as one batch. */
static void *search_worker(void *arg)
{
	struct s3_http *h = arg;
	struct req *batch[BATCH_CAP];
	struct s3_query *qs[BATCH_CAP];
	struct s3_resp rs[BATCH_CAP];
	size_t pos[BATCH_CAP];

	for (;;) {
		size_t n = 0, nq = 0;

		pthread_mutex_lock(&h->qmu);
		while (!h->qhead && !h->stopping)
			pthread_cond_wait(&h->qcv, &h->qmu);
		if (!h->qhead) {
			pthread_mutex_unlock(&h->qmu);
			break;
		}
		while (h->qhead && n < h->cfg.batch_max) {
			batch[n++] = h->qhead;
			h->qhead = h->qhead->qnext;
			if (!h->qhead)
				h->qtail = NULL;
		}
		pthread_mutex_unlock(&h->qmu);
		for (size_t i = 0; i < n && h->cfg.backend; i++) {
			memset(&batch[i]->resp, 0, sizeof(batch[i]->resp));
			h->cfg.backend->query(h->cfg.backend->ctx, (const char *)batch[i]->body.p, batch[i]->body.n,
					      &batch[i]->resp);
		}
		for (size_t i = 0; i < n && !h->cfg.backend; i++) {
			memset(&batch[i]->resp, 0, sizeof(batch[i]->resp));
			if (s3_api_query_prepare(h->cfg.api, (const char *)batch[i]->body.p, batch[i]->body.n, &qs[nq],
						 &batch[i]->resp) == 0)
				pos[nq++] = i;
		}
		if (nq) {
			memset(rs, 0, nq * sizeof(rs[0]));
			s3_api_query_run(h->cfg.api, qs, nq, rs);
			for (size_t j = 0; j < nq; j++)
				batch[pos[j]]->resp = rs[j];
			stat_inc(&h->st.batches);
		}
		for (size_t i = 0; i < n; i++) {
			batch[i]->have_resp = true;
			stat_inc(&h->st.queries);
			pthread_mutex_lock(&h->qmu);
			h->admitted--;
			pthread_mutex_unlock(&h->qmu);
			MHD_resume_connection(batch[i]->conn);
		}
	}
	return NULL;
}

/* Last path segment of the URL: the operation name (a path prefix is allowed). */
static const char *op_of(const char *url)
{
	const char *s = strrchr(url, '/');

	return s ? s + 1 : url;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version,
				  const char *upload, size_t *upload_size, void **con_cls)
{
	struct s3_http *h = cls;
	struct req *rq = *con_cls;
	const char *op;

	(void)version;
	if (!rq) {
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
							     MHD_HTTP_HEADER_CONTENT_LENGTH);

		rq = calloc(1, sizeof(*rq));
		if (!rq)
			return MHD_NO;
		rq->h = h;
		rq->conn = c;
		*con_cls = rq;
		if (cl && strtoull(cl, NULL, 10) > S3_MAX_PAYLOAD)
			rq->too_big = true;
		return MHD_YES;
	}
	if (*upload_size) {
		if (!rq->too_big && rq->body.n + *upload_size > S3_MAX_PAYLOAD)
			rq->too_big = true;
		if (!rq->too_big) {
			dm_buf_put(&rq->body, upload, *upload_size);
			if (rq->body.oom)
				return MHD_NO;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	stat_inc(&h->st.requests);
	if (rq->have_resp)                       /* resumed after a search */
		return send_resp(c, &rq->resp);
	if (rq->too_big)
		return send_error(c, 413, "ValidationException",
				  "The request payload exceeds the 20 MiB limit");
	struct dm_buf q = { 0 };
	size_t who = 0;
	bool ok;

	MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, add_arg, &q);
	if (q.oom) {
		dm_buf_free(&q);
		return send_error(c, 500, "InternalServerException", "out of memory");
	}
	op = op_of(url);
	if (h->cfg.backend && h->cfg.backend->internal && strstr(url, "/_dmann/")) {
		/* Cluster-internal: only the internal key (not the S3 users' keys) may call. */
		ok = !strcmp(method, "POST") && h->cfg.backend->internal_auth &&
		     authenticate(h, h->cfg.backend->internal_auth, rq, url, method,
				  q.p ? (const char *)q.p : "", &who);
		dm_buf_free(&q);
		if (!ok && !rq->resp.status)
			s3_resp_error(&rq->resp, 403, "AccessDeniedException", "internal path");
		if (ok)
			h->cfg.backend->internal(h->cfg.backend->ctx, op, (const char *)rq->body.p,
						 rq->body.n, &rq->resp);
		return send_resp(c, &rq->resp);
	}
	ok = authenticate(h, &h->cfg.auth, rq, url, method, q.p ? (const char *)q.p : "", &who);
	if (ok) {
		/* REST tag calls become JSON operations (after SigV4 saw the request as sent). */
		char *nbody = NULL;
		size_t nlen = 0;
		int rc = s3g_tag_call(url, method, q.p ? (const char *)q.p : "",
				      (const char *)rq->body.p, rq->body.n, &op, &nbody, &nlen,
				      &rq->resp);

		if (rc < 0) {
			ok = false;
		} else if (rc > 0) {
			dm_buf_free(&rq->body);
			rq->body = (struct dm_buf){ .p = (uint8_t *)nbody, .n = nlen, .cap = nlen };
		}
	}
	dm_buf_free(&q);
	if (!ok)
		return send_resp(c, &rq->resp);
	if (strcmp(method, "POST") && !strstr(url, "/tags/"))
		return send_error(c, 405, "ValidationException",
				  "S3 Vectors operations are POST /<OperationName>");
	if (!s3_api_known_op(op))
		return send_error(c, 404, "UnknownOperationException",
				  "Unknown or unsupported operation");
	char principal[320];
	struct s3g_authz z = {
		.principal = principal, .region = h->cfg.arn_region ? h->cfg.arn_region : "us-east-1",
		.account = h->cfg.arn_account ? h->cfg.arn_account : "000000000000",
		.default_deny = h->cfg.policy_default_deny, .run = run_op, .ctx = h,
	};

	s3_cred_principal(&h->cfg.auth.creds[who], principal, sizeof(principal));
	if (!s3g_authorize(&z, op, (const char *)rq->body.p, rq->body.n, &rq->resp))
		return send_resp(c, &rq->resp);
	if (!strcmp(op, "QueryVectors")) {
		if (admit(h, rq))
			return MHD_YES;
		stat_inc(&h->st.rejected);
		return send_error(c, 503, "ServiceUnavailableException",
				  "The search queue is full; retry later");
	}
	run_op(h, op, (const char *)rq->body.p, rq->body.n, &rq->resp);
	return send_resp(c, &rq->resp);
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls,
		    enum MHD_RequestTerminationCode code)
{
	struct req *rq = *con_cls;

	(void)cls;
	(void)c;
	(void)code;
	if (!rq)
		return;
	s3_resp_free(&rq->resp);
	dm_buf_free(&rq->body);
	free(rq);
	*con_cls = NULL;
}

static void stop_workers(struct s3_http *h)
{
	pthread_mutex_lock(&h->qmu);
	h->stopping = true;
	pthread_cond_broadcast(&h->qcv);
	pthread_mutex_unlock(&h->qmu);
	for (unsigned i = 0; i < h->nworkers; i++)
		pthread_join(h->workers[i], NULL);
	h->nworkers = 0;
}

/* A PEM file's contents (at most 1 MiB), malloc'ed and NUL-terminated; NULL + errno. */
static char *read_pem(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *p;
	size_t n;

	if (!f)
		return NULL;
	p = malloc((1u << 20) + 1);
	if (!p) {
		fclose(f);
		errno = ENOMEM;
		return NULL;
	}
	n = fread(p, 1, 1u << 20, f);
	fclose(f);
	if (!n || n == (1u << 20) || !strstr(p, "-----BEGIN")) {
		free(p);
		errno = EINVAL;
		return NULL;
	}
	p[n] = 0;
	return p;
}

/* The certificate and key of HTTPS into h (0, or -errno with the reason logged). */
static int tls_load(struct s3_http *h)
{
	if (!h->cfg.tls_cert && !h->cfg.tls_key)
		return 0;
	if (!h->cfg.tls_cert || !h->cfg.tls_key) {
		dm_err("s3: HTTPS needs both a certificate and a key file");
		return -EINVAL;
	}
	if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
		dm_err("s3: this libmicrohttpd is built without TLS (GnuTLS): HTTPS unavailable");
		return -ENOTSUP;
	}
	h->tls_cert = read_pem(h->cfg.tls_cert);
	if (!h->tls_cert) {
		dm_err("s3: cannot read the PEM certificate %s: %s", h->cfg.tls_cert,
		       strerror(errno));
		return -EINVAL;
	}
	h->tls_key = read_pem(h->cfg.tls_key);
	if (!h->tls_key) {
		dm_err("s3: cannot read the PEM key %s: %s", h->cfg.tls_key, strerror(errno));
		return -EINVAL;
	}
	return 0;
}

static void tls_free(struct s3_http *h)
{
	free(h->tls_cert);
	if (h->tls_key)
		memset(h->tls_key, 0, strlen(h->tls_key));
	free(h->tls_key);
}

struct s3_http *s3_http_start(const struct s3_http_cfg *cfg)
{
	struct s3_http *h;
	struct sockaddr_storage ss = { 0 };
	struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO |
			 MHD_ALLOW_SUSPEND_RESUME;
	const union MHD_DaemonInfo *di;
	int err;

	if (!cfg || (!cfg->api && (!cfg->backend || !cfg->backend->handle ||
				   !cfg->backend->query)) || !cfg->auth.ncreds || !cfg->auth.service) {
		errno = EINVAL;
		return NULL;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		errno = ENOMEM;
		return NULL;
	}
	h->cfg = *cfg;
	if (!h->cfg.http_threads)
		h->cfg.http_threads = 4;
	if (!h->cfg.search_threads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		h->cfg.search_threads = n > 0 ? (unsigned)n : 1;
	}
	if (!h->cfg.queue_depth)
		h->cfg.queue_depth = 64;
	if (!h->cfg.batch_max)
		h->cfg.batch_max = 16;
	h->cfg.batch_max = DM_MIN(h->cfg.batch_max, BATCH_CAP);
	pthread_mutex_init(&h->qmu, NULL);
	pthread_cond_init(&h->qcv, NULL);

	if (cfg->addr && strchr(cfg->addr, ':')) {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(cfg->port);
		if (inet_pton(AF_INET6, cfg->addr, &s6->sin6_addr) != 1) {
			err = EINVAL;
			goto err_free_h;
		}
		flags |= MHD_USE_IPv6;
	} else {
		s4->sin_family = AF_INET;
		s4->sin_port = htons(cfg->port);
		if (inet_pton(AF_INET, cfg->addr ? cfg->addr : "0.0.0.0", &s4->sin_addr) != 1) {
			err = EINVAL;
			goto err_free_h;
		}
	}
	err = -tls_load(h);
	if (err)
		goto err_free_tls;
	struct MHD_OptionItem tls_opts[] = {
		{ MHD_OPTION_HTTPS_MEM_CERT, 0, h->tls_cert },
		{ MHD_OPTION_HTTPS_MEM_KEY, 0, h->tls_key },
		{ MHD_OPTION_END, 0, NULL },
	};

	if (h->tls_cert)
		flags |= MHD_USE_TLS;
	h->workers = calloc(h->cfg.search_threads, sizeof(pthread_t));
	if (!h->workers) {
		err = ENOMEM;
		goto err_free_tls;
	}
	for (unsigned i = 0; i < h->cfg.search_threads; i++) {
		err = pthread_create(&h->workers[i], NULL, search_worker, h);
		if (err)
			goto err_stop_workers;
		h->nworkers++;
	}
	h->d = MHD_start_daemon(flags, cfg->port, NULL, NULL, on_request, h,
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
				MHD_OPTION_THREAD_POOL_SIZE, h->cfg.http_threads,
				MHD_OPTION_UNESCAPE_CALLBACK, no_unescape, NULL,
				MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL,
				MHD_OPTION_CONNECTION_TIMEOUT, 120u,
				MHD_OPTION_ARRAY, h->tls_cert ? tls_opts : tls_opts + 2,
				MHD_OPTION_END);
	if (!h->d) {
		err = errno ? errno : EADDRINUSE;
		dm_err("s3: cannot listen on %s:%u", cfg->addr ? cfg->addr : "0.0.0.0",
		       cfg->port);
		goto err_stop_workers;
	}
	di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	h->port = di ? di->port : cfg->port;
	return h;

err_stop_workers:
	stop_workers(h);
	free(h->workers);
err_free_tls:
	tls_free(h);
err_free_h:
	pthread_mutex_destroy(&h->qmu);
	pthread_cond_destroy(&h->qcv);
	free(h);
	errno = err;
	return NULL;
}

uint16_t s3_http_port(const struct s3_http *h)
{
	return h->port;
}

void s3_http_stats(const struct s3_http *h, struct s3_http_stats *out)
{
	out->requests = __atomic_load_n(&h->st.requests, __ATOMIC_RELAXED);
	out->auth_failures = __atomic_load_n(&h->st.auth_failures, __ATOMIC_RELAXED);
	out->queries = __atomic_load_n(&h->st.queries, __ATOMIC_RELAXED);
	out->rejected = __atomic_load_n(&h->st.rejected, __ATOMIC_RELAXED);
	out->batches = __atomic_load_n(&h->st.batches, __ATOMIC_RELAXED);
}

void s3_http_stop(struct s3_http *h)
{
	if (!h)
		return;
	/* Stop accepting, let the search threads answer every admitted query, then stop. */
	MHD_quiesce_daemon(h->d);
	stop_workers(h);
	MHD_stop_daemon(h->d);
	free(h->workers);
	tls_free(h);
	pthread_mutex_destroy(&h->qmu);
	pthread_cond_destroy(&h->qcv);
	free(h);
}
