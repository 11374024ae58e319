/* etcd.c: the etcd v3 JSON/HTTP gateway client (see etcd.h): the handle, the HTTP exchange
 * with endpoint failover (libcurl, opened by etcd_curl.c), the requests, and the key-value,
 * txn and lease calls.
 * Answers are parsed in etcd_json.c, watches are in etcd_watch.c. */
#include "etcd_int.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int dm_etcd_fail(struct dm_etcd *e, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(e->err, sizeof(e->err), fmt, ap);
	va_end(ap);
	return rc;
}

const char *dm_etcd_errmsg(const struct dm_etcd *e)
{
	return e ? e->err : "no etcd handle";
}

/* ---- the HTTP exchange ---- */
/* The handle's sockets, kept so that dm_etcd_abort can shut them down: opened and closed for
 * libcurl under sock_mu, so a slot never names an fd that was closed (and maybe reused). */
static curl_socket_t sock_open(void *ctx, curlsocktype purpose, struct curl_sockaddr *a)
{
	struct dm_etcd *e = ctx;
	curl_socket_t fd = CURL_SOCKET_BAD;

	(void)purpose;
	pthread_mutex_lock(&e->sock_mu);
	if (!e->aborted) {
		fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
		for (int i = 0; fd != CURL_SOCKET_BAD && i < DM_ETCD_SOCKS; i++)
			if (e->socks[i] < 0) {
				e->socks[i] = fd;
				break;
			}
	}
	pthread_mutex_unlock(&e->sock_mu);
	return fd;
}

static int sock_close(void *ctx, curl_socket_t fd)
{
	struct dm_etcd *e = ctx;
	int rc;

	pthread_mutex_lock(&e->sock_mu);
	for (int i = 0; i < DM_ETCD_SOCKS; i++)
		if (e->socks[i] == fd)
			e->socks[i] = -1;
	rc = close(fd);
	pthread_mutex_unlock(&e->sock_mu);
	return rc;
}

void dm_etcd_abort(struct dm_etcd *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->sock_mu);
	e->aborted = true;
	for (int i = 0; i < DM_ETCD_SOCKS; i++)
		if (e->socks[i] >= 0)
			shutdown(e->socks[i], SHUT_RDWR);
	pthread_mutex_unlock(&e->sock_mu);
}

static bool aborted(struct dm_etcd *e)
{
	bool a;

	pthread_mutex_lock(&e->sock_mu);
	a = e->aborted;
	pthread_mutex_unlock(&e->sock_mu);
	return a;
}

int dm_etcd_post(struct dm_etcd *e, CURL *c, const char *path, const char *req, long tmo_ms,
		 size_t (*wr)(char *, size_t, size_t, void *), void *ctx)
{
	char url[640], cerr[CURL_ERROR_SIZE];
	int rc = -ECONNREFUSED;

	for (size_t t = 0; t < e->nep; t++, e->cur = (e->cur + 1) % e->nep) {
		long sent = 0;
		CURLcode cc;

		if (aborted(e))
			return dm_etcd_fail(e, -ECANCELED, "the call was aborted (the caller stops)");

		snprintf(url, sizeof(url), "%s%s", e->ep[e->cur], path);
		cerr[0] = 0;
		e->cu->easy_setopt(c, CURLOPT_URL, url);
		e->cu->easy_setopt(c, CURLOPT_POSTFIELDS, req);
		e->cu->easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(req));
		e->cu->easy_setopt(c, CURLOPT_HTTPHEADER, e->hdrs);
		e->cu->easy_setopt(c, CURLOPT_WRITEFUNCTION, wr);
		e->cu->easy_setopt(c, CURLOPT_WRITEDATA, ctx);
		e->cu->easy_setopt(c, CURLOPT_TIMEOUT_MS, tmo_ms);
		e->cu->easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, DM_MIN(tmo_ms, (long)e->timeout_ms));
		e->cu->easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
		e->cu->easy_setopt(c, CURLOPT_NOPROXY, "*");
		e->cu->easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
		e->cu->easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, sock_open);
		e->cu->easy_setopt(c, CURLOPT_OPENSOCKETDATA, e);
		e->cu->easy_setopt(c, CURLOPT_CLOSESOCKETFUNCTION, sock_close);
		e->cu->easy_setopt(c, CURLOPT_CLOSESOCKETDATA, e);
		cc = e->cu->easy_perform(c);
		e->cu->easy_setopt(c, CURLOPT_ERRORBUFFER, NULL);
		if (cc == CURLE_OK)
			return 0;
		e->cu->easy_getinfo(c, CURLINFO_REQUEST_SIZE, &sent);
		rc = cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ? -ECONNREFUSED :
		     cc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT :
		     cc == CURLE_WRITE_ERROR ? -ECANCELED : -EIO;
		if (aborted(e))
			return dm_etcd_fail(e, -ECANCELED, "the call was aborted (the caller stops)");
		if (rc != -ECANCELED)         /* (else wr said why) */
			dm_etcd_fail(e, rc, "%s: %s", url, cerr[0] ? cerr : e->cu->easy_strerror(cc));
		if (rc != -ECONNREFUSED && !(rc == -ETIMEDOUT && sent == 0))
			return rc;                /* the request may have been sent: no retry */
	}
	return rc;
}

int dm_etcd_answer(struct dm_etcd *e, const char *path, long status, const void *body,
		   size_t n, json_t **ans)
{
	json_t *r;
	int rc;

	*ans = NULL;
	if (dm_etcd_load(body, n, &r))
		return dm_etcd_fail(e, status == 200 ? -EBADMSG : -EIO,
				    "%s: HTTP %ld, the answer is not a JSON object", path, status);
	if (status == 200 && !json_object_get(r, "error")) {
		*ans = r;
		return 0;
	}
	rc = dm_etcd_ans_error(r, e->err, sizeof(e->err));
	if (rc == -EBADMSG)
		dm_etcd_fail(e, rc, "%s: HTTP %ld, malformed error answer", path, status);
	json_decref(r);
	return rc;
}

static size_t body_wr(char *p, size_t sz, size_t nm, void *ctx)
{
	struct dm_buf *b = ctx;

	if (b->n + sz * nm > DM_ETCD_ANSWER_MAX)
		return 0;
	dm_buf_put(b, p, sz * nm);
	return b->oom ? 0 : sz * nm;
}

int dm_etcd_call(struct dm_etcd *e, const char *path, const char *req, json_t **ans)
{
	long status = 0;
	int rc;

	*ans = NULL;
	dm_buf_reset(&e->body);
	rc = dm_etcd_post(e, e->curl, path, req, e->timeout_ms, body_wr, &e->body);
	if (rc == -ECANCELED && !aborted(e))
		return dm_etcd_fail(e, e->body.oom ? -ENOMEM : -EBADMSG,
				    "%s: answer over %u bytes or out of memory", path,
				    DM_ETCD_ANSWER_MAX);
	if (rc)
		return rc;
	e->cu->easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &status);
	return dm_etcd_answer(e, path, status, e->body.p, e->body.n, ans);
}

/* ---- the handle ---- */
struct dm_etcd *dm_etcd_open(const char *endpoints, int timeout_ms)
{
	const struct dm_curl_api *cu;
	struct dm_etcd *e;
	char *list, *tok, *save;
	int err;

	if (!endpoints || timeout_ms <= 0) {
		errno = EINVAL;
		return NULL;
	}
	if (!(cu = dm_curl_get()))
		return NULL;   /* (errno set, the reason logged once) */
	if (!(e = calloc(1, sizeof(*e))))
		return NULL;
	e->cu = cu;
	pthread_mutex_init(&e->sock_mu, NULL);
	for (int i = 0; i < DM_ETCD_SOCKS; i++)
		e->socks[i] = -1;
	e->timeout_ms = timeout_ms;
	if (!(list = strdup(endpoints)))
		goto err_close_e;
	errno = EINVAL;
	for (tok = strtok_r(list, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		size_t l = strlen(tok);

		while (l && tok[l - 1] == '/')
			tok[--l] = 0;
		if (e->nep == DM_ETCD_EP_MAX || l > 512 ||
		    !(strncmp(tok, "http://", 7) == 0 ? l > 7 : strncmp(tok, "https://", 8) == 0 && l > 8))
			goto err_free_list;
		if (!(e->ep[e->nep] = strdup(tok)))
			goto err_free_list;
		e->nep++;
	}
	if (!e->nep)
		goto err_free_list;
	errno = ENOMEM;
	if (!(e->curl = e->cu->easy_init()) ||
	    !(e->hdrs = e->cu->slist_append(NULL, "Content-Type: application/json")) ||
	    !(e->hdrs = e->cu->slist_append(e->hdrs, "Expect:")))
		goto err_free_list;        /* (a failed append leaks nothing: close frees hdrs) */
	free(list);
	return e;
err_free_list:
	free(list);
err_close_e:
	err = errno;
	dm_etcd_close(e);
	errno = err;
	return NULL;
}

void dm_etcd_close(struct dm_etcd *e)
{
	if (!e)
		return;
	for (size_t i = 0; i < e->nep; i++)
		free(e->ep[i]);
	if (e->curl)
		e->cu->easy_cleanup(e->curl);
	if (e->wcurl)
		e->cu->easy_cleanup(e->wcurl);   /* (closes its sockets through sock_close) */
	if (e->hdrs)
		e->cu->slist_free_all(e->hdrs);
	dm_buf_free(&e->body);
	pthread_mutex_destroy(&e->sock_mu);
	free(e);
}

/* ---- calls ---- */
static int check_key(struct dm_etcd *e, const char *key, bool empty_ok)
{
	size_t l = key ? strlen(key) : 0;

	if (!key || (!l && !empty_ok) || l > DM_ETCD_KEY_MAX)
		return dm_etcd_fail(e, -EINVAL, "bad key (NULL, empty or over %d bytes)",
				    DM_ETCD_KEY_MAX);
	return 0;
}

static int check_kv(struct dm_etcd *e, const char *key, const void *val, size_t len, int64_t lease)
{
	if (check_key(e, key, false))
		return -EINVAL;
	if ((len && !val) || len > DM_ETCD_VAL_MAX || lease < 0)
		return dm_etcd_fail(e, -EINVAL, "bad value (NULL, over %u bytes) or lease",
				    DM_ETCD_VAL_MAX);
	return 0;
}

/* Append `"key":"..","value":".."[,"lease":".."]`. */
static void kv_req(struct dm_buf *q, const char *key, const void *val, size_t len, int64_t lease)
{
	dm_buf_printf(q, "\"key\":\"");
	dm_etcd_b64_put(q, key, strlen(key));
	dm_buf_printf(q, "\",\"value\":\"");
	dm_etcd_b64_put(q, val, len);
	dm_buf_printf(q, "\"");
	if (lease)
		dm_buf_printf(q, ",\"lease\":\"%lld\"", (long long)lease);
}

void dm_etcd_range_req(struct dm_buf *q, const char *prefix)
{
	size_t n = strlen(prefix), m = n;

	while (m && (unsigned char)prefix[m - 1] == 0xff)
		m--;
	dm_buf_printf(q, "\"key\":\"");
	dm_etcd_b64_put(q, n ? prefix : "", n ? n : 1);        /* "" -> "\0": from the start */
	dm_buf_printf(q, "\",\"range_end\":\"");
	if (m) {
		char end[DM_ETCD_KEY_MAX];      /* callers checked: strlen(prefix) <= KEY_MAX */

		memcpy(end, prefix, m);
		end[m - 1]++;
		dm_etcd_b64_put(q, end, m);
	} else {
		dm_etcd_b64_put(q, "", 1);   /* "\0": to the end of the key space */
	}
	dm_buf_printf(q, "\"");
}

/* Send q ({...} built by the caller), parse the answer as a write answer. */
static int write_call(struct dm_etcd *e, const char *path, struct dm_buf *q, int64_t *rev,
		      int64_t *deleted, bool *succeeded)
{
	json_t *a;
	int rc;

	if (q->oom)
		rc = dm_etcd_fail(e, -ENOMEM, "out of memory");
	else if (!(rc = dm_etcd_call(e, path, (char *)q->p, &a))) {
		if (dm_etcd_ans_write(a, rev, deleted, succeeded))
			rc = dm_etcd_fail(e, -EBADMSG, "%s: malformed answer", path);
		json_decref(a);
	}
	dm_buf_free(q);
	return rc;
}

int dm_etcd_put(struct dm_etcd *e, const char *key, const void *val, size_t len,
		int64_t lease, int64_t *revision)
{
	struct dm_buf q = { 0 };

	if (!e || check_kv(e, key, val, len, lease))
		return -EINVAL;
	dm_buf_printf(&q, "{");
	kv_req(&q, key, val, len, lease);
	dm_buf_printf(&q, "}");
	return write_call(e, "/v3/kv/put", &q, revision, NULL, NULL);
}

/* The compare-and-put txn of put_if / put_guarded (guard NULL: no second compare). */
static int put_txn(struct dm_etcd *e, const char *key, const void *val, size_t len,
		   int64_t lease, int64_t expect_mod_revision, const char *guard,
		   int64_t guard_create_revision, bool *succeeded, int64_t *revision)
{
	struct dm_buf q = { 0 };

	if (!e || check_kv(e, key, val, len, lease))
		return -EINVAL;
	if (!succeeded || expect_mod_revision < 0)
		return dm_etcd_fail(e, -EINVAL, "bad succeeded or expect_mod_revision");
	if (guard && (check_key(e, guard, false) || guard_create_revision <= 0))
		return dm_etcd_fail(e, -EINVAL, "bad guard key or guard_create_revision");
	dm_buf_printf(&q, "{\"compare\":[{\"target\":\"MOD\",\"result\":\"EQUAL\",\"key\":\"");
	dm_etcd_b64_put(&q, key, strlen(key));
	dm_buf_printf(&q, "\",\"mod_revision\":\"%lld\"}", (long long)expect_mod_revision);
	if (guard) {
		dm_buf_printf(&q, ",{\"target\":\"CREATE\",\"result\":\"EQUAL\",\"key\":\"");
		dm_etcd_b64_put(&q, guard, strlen(guard));
		dm_buf_printf(&q, "\",\"create_revision\":\"%lld\"}",
			      (long long)guard_create_revision);
	}
	dm_buf_printf(&q, "],\"success\":[{\"request_put\":{");
	kv_req(&q, key, val, len, lease);
	dm_buf_printf(&q, "}}]}");
	return write_call(e, "/v3/kv/txn", &q, revision, NULL, succeeded);
}

int dm_etcd_put_if(struct dm_etcd *e, const char *key, const void *val, size_t len,
		   int64_t lease, int64_t expect_mod_revision, bool *succeeded, int64_t *revision)
{
	return put_txn(e, key, val, len, lease, expect_mod_revision, NULL, 0, succeeded,
		       revision);
}

int dm_etcd_put_guarded(struct dm_etcd *e, const char *key, const void *val, size_t len,
			int64_t expect_mod_revision, const char *guard,
			int64_t guard_create_revision, bool *succeeded, int64_t *revision)
{
	if (!guard)
		return e ? dm_etcd_fail(e, -EINVAL, "no guard key") : -EINVAL;
	return put_txn(e, key, val, len, 0, expect_mod_revision, guard, guard_create_revision,
		       succeeded, revision);
}

int dm_etcd_delete(struct dm_etcd *e, const char *key_or_prefix, bool prefix, int64_t *deleted)
{
	struct dm_buf q = { 0 };

	if (!e || check_key(e, key_or_prefix, false))
		return -EINVAL;
	dm_buf_printf(&q, "{");
	if (prefix) {
		dm_etcd_range_req(&q, key_or_prefix);
	} else {
		dm_buf_printf(&q, "\"key\":\"");
		dm_etcd_b64_put(&q, key_or_prefix, strlen(key_or_prefix));
		dm_buf_printf(&q, "\"");
	}
	dm_buf_printf(&q, "}");
	return write_call(e, "/v3/kv/deleterange", &q, NULL, deleted, NULL);
}

int dm_etcd_delete_if(struct dm_etcd *e, const char *key, int64_t expect_mod_revision,
		      bool *succeeded)
{
	struct dm_buf q = { 0 };

	if (!e || check_key(e, key, false))
		return -EINVAL;
	if (!succeeded || expect_mod_revision <= 0)
		return dm_etcd_fail(e, -EINVAL, "bad succeeded or expect_mod_revision");
	dm_buf_printf(&q, "{\"compare\":[{\"target\":\"MOD\",\"result\":\"EQUAL\",\"key\":\"");
	dm_etcd_b64_put(&q, key, strlen(key));
	dm_buf_printf(&q, "\",\"mod_revision\":\"%lld\"}],\"success\":[{\"request_delete_range\":"
		      "{\"key\":\"", (long long)expect_mod_revision);
	dm_etcd_b64_put(&q, key, strlen(key));
	dm_buf_printf(&q, "\"}}]}");
	return write_call(e, "/v3/kv/txn", &q, NULL, NULL, succeeded);
}

/* A range read of q: the kvs, each of whose keys must start with (or be) key. */
static int range_call(struct dm_etcd *e, struct dm_buf *q, const char *key, bool exact,
		      struct dm_etcd_kv **kvs, size_t *n, int64_t *rev)
{
	size_t kl = strlen(key);
	json_t *a;
	int rc;

	if (q->oom)
		rc = dm_etcd_fail(e, -ENOMEM, "out of memory");
	else if (!(rc = dm_etcd_call(e, "/v3/kv/range", (char *)q->p, &a))) {
		if ((rc = dm_etcd_ans_range(a, kvs, n, rev)))
			dm_etcd_fail(e, rc, "/v3/kv/range: malformed answer or out of memory");
		for (size_t i = 0; !rc && i < *n; i++)
			if ((*kvs)[i].key_len < kl || memcmp((*kvs)[i].key, key, kl) ||
			    (exact && ((*kvs)[i].key_len != kl || *n != 1))) {
				dm_etcd_kvs_free(*kvs, *n);
				*kvs = NULL;
				*n = 0;
				rc = dm_etcd_fail(e, -EBADMSG, "/v3/kv/range: a key out of the range");
			}
		json_decref(a);
	}
	dm_buf_free(q);
	return rc;
}

static int get_key(struct dm_etcd *e, const char *key, void **val, size_t *len,
		   int64_t *mod_revision, bool serializable)
{
	struct dm_buf q = { 0 };
	struct dm_etcd_kv *kv;
	size_t n;
	int rc;

	if (!e || !val || !len || check_key(e, key, false))
		return e ? dm_etcd_fail(e, -EINVAL, "bad arguments") : -EINVAL;
	dm_buf_printf(&q, "{\"key\":\"");
	dm_etcd_b64_put(&q, key, strlen(key));
	dm_buf_printf(&q, serializable ? "\",\"serializable\":true}" : "\"}");
	if ((rc = range_call(e, &q, key, true, &kv, &n, NULL)))
		return rc;
	if (!n)
		return dm_etcd_fail(e, -ENOENT, "%s: no such key", key);
	*val = kv->val;
	*len = kv->len;
	if (mod_revision)
		*mod_revision = kv->mod_revision;
	free(kv->key);
	free(kv);
	return 0;
}

int dm_etcd_get(struct dm_etcd *e, const char *key, void **val, size_t *len,
		int64_t *mod_revision)
{
	return get_key(e, key, val, len, mod_revision, false);
}

int dm_etcd_get_serial(struct dm_etcd *e, const char *key, void **val, size_t *len,
		       int64_t *mod_revision)
{
	return get_key(e, key, val, len, mod_revision, true);
}

int dm_etcd_range(struct dm_etcd *e, const char *prefix, struct dm_etcd_kv **kvs, size_t *n,
		  int64_t *revision)
{
	struct dm_buf q = { 0 };

	if (!e || !kvs || !n || check_key(e, prefix, true))
		return e ? dm_etcd_fail(e, -EINVAL, "bad arguments") : -EINVAL;
	dm_buf_printf(&q, "{");
	dm_etcd_range_req(&q, prefix);
	dm_buf_printf(&q, "}");
	return range_call(e, &q, prefix, false, kvs, n, revision);
}

/* A lease call: {"ID"|"TTL": v} to path; the answer's ID and TTL. */
static int lease_call(struct dm_etcd *e, const char *path, const char *field, int64_t v,
		      int64_t *id, int64_t *ttl)
{
	char req[64];
	json_t *a;
	int rc;

	snprintf(req, sizeof(req), "{\"%s\":\"%lld\"}", field, (long long)v);
	if ((rc = dm_etcd_call(e, path, req, &a)))
		return rc;
	if (dm_etcd_ans_lease(a, id, ttl))
		rc = dm_etcd_fail(e, -EBADMSG, "%s: malformed answer", path);
	json_decref(a);
	return rc;
}

int dm_etcd_lease_grant(struct dm_etcd *e, int ttl_s, int64_t *lease)
{
	int64_t ttl;
	int rc;

	if (!e || !lease || ttl_s < 1 || ttl_s > 1000000000)
		return e ? dm_etcd_fail(e, -EINVAL, "bad arguments") : -EINVAL;
	if ((rc = lease_call(e, "/v3/lease/grant", "TTL", ttl_s, lease, &ttl)))
		return rc;
	return ttl > 0 ? 0 : dm_etcd_fail(e, -EBADMSG, "/v3/lease/grant: no TTL granted");
}

int dm_etcd_lease_keepalive(struct dm_etcd *e, int64_t lease, int *ttl_left)
{
	int64_t id, ttl;
	int rc;

	if (!e || lease <= 0)
		return e ? dm_etcd_fail(e, -EINVAL, "bad lease") : -EINVAL;
	if ((rc = lease_call(e, "/v3/lease/keepalive", "ID", lease, &id, &ttl)))
		return rc;
	if (id != lease)
		return dm_etcd_fail(e, -EBADMSG, "/v3/lease/keepalive: answer for another lease");
	if (ttl == 0)
		return dm_etcd_fail(e, -ENOENT, "lease %lld expired", (long long)lease);
	if (ttl_left)
		*ttl_left = (int)DM_MIN(ttl, INT32_MAX);
	return 0;
}

int dm_etcd_lease_revoke(struct dm_etcd *e, int64_t lease)
{
	struct dm_buf q = { 0 };

	if (!e || lease <= 0)
		return e ? dm_etcd_fail(e, -EINVAL, "bad lease") : -EINVAL;
	dm_buf_printf(&q, "{\"ID\":\"%lld\"}", (long long)lease);
	return write_call(e, "/v3/lease/revoke", &q, NULL, NULL, NULL);
}
