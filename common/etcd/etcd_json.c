/* etcd_json.c: the validating parsers of etcd's answers (see etcd_int.h): everything that
 * comes from etcd is outside input, so every JSON type, int64 string, base64 text, size and
 * order is checked before use (-EBADMSG). Also base64 both ways. Fuzzed by
 * tests/fuzz/fuzz_etcd_json.c. */
#include "etcd_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- base64 ---- */
static const char b64c[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void dm_etcd_b64_put(struct dm_buf *q, const void *p, size_t n)
{
	const uint8_t *s = p;
	char *o;

	if (!dm_buf_reserve(q, (n + 2) / 3 * 4 + 1))
		return;
	o = (char *)q->p + q->n;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t w = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
			     (i + 2 < n ? s[i + 2] : 0);

		*o++ = b64c[w >> 18];
		*o++ = b64c[(w >> 12) & 63];
		*o++ = i + 1 < n ? b64c[(w >> 6) & 63] : '=';
		*o++ = i + 2 < n ? b64c[w & 63] : '=';
	}
	*o = 0;
	q->n = (size_t)(o - (char *)q->p);
}

static int b64v(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	return c == '+' ? 62 : c == '/' ? 63 : -1;
}

int dm_etcd_unb64(const char *s, size_t sl, char **out, size_t *len)
{
	size_t pad = 0, n, o = 0;
	char *p;

	if (sl % 4)
		return -EBADMSG;
	pad = sl && s[sl - 1] == '=' ? (s[sl - 2] == '=' ? 2 : 1) : 0;
	n = sl / 4 * 3 - pad;
	if (!(p = malloc(n + 1)))
		return -ENOMEM;
	for (size_t i = 0; i < sl; i += 4) {
		uint32_t w = 0;

		for (size_t j = 0; j < 4; j++) {
			int v = i + j >= sl - pad ? 0 : b64v((unsigned char)s[i + j]);

			if (v < 0)
				goto err_free_p;
			w = w << 6 | (uint32_t)v;
		}
		if (i + 4 == sl && (w & (pad == 2 ? 0xffff : pad ? 0xff : 0)))
			goto err_free_p;      /* non-canonical: unused bits set */
		for (size_t k = 0; k < 3 && o < n; k++)
			p[o++] = (char)(w >> (16 - 8 * k));
	}
	p[n] = 0;
	*out = p;
	*len = n;
	return 0;
err_free_p:
	free(p);
	return -EBADMSG;
}

/* ---- parsers ---- */
int dm_etcd_load(const void *txt, size_t len, json_t **root)
{
	json_error_t je;

	*root = json_loadb(txt, len, JSON_REJECT_DUPLICATES, &je);
	if (*root && json_is_object(*root))
		return 0;
	json_decref(*root);
	*root = NULL;
	return -EBADMSG;
}

int dm_etcd_j64(const json_t *o, const char *name, int64_t *v)
{
	json_t *f = json_object_get(o, name);
	const char *s;
	char *end;
	size_t l;

	*v = 0;
	if (!f || json_is_null(f))
		return 0;
	if (json_is_integer(f)) {
		*v = json_integer_value(f);
		return 0;
	}
	if (!json_is_string(f))
		return -EBADMSG;
	s = json_string_value(f);
	l = json_string_length(f);
	if (l == 0 || l > 20 || (!isdigit((unsigned char)s[0]) && s[0] != '-'))
		return -EBADMSG;
	errno = 0;
	*v = strtoll(s, &end, 10);
	return errno || end != s + l ? -EBADMSG : 0;
}

/* Optional bool field: absent or null = false. */
static int jbool(const json_t *o, const char *name, bool *v)
{
	json_t *f = json_object_get(o, name);

	*v = json_is_true(f);
	return !f || json_is_boolean(f) || json_is_null(f) ? 0 : -EBADMSG;
}

/* The header's revision: > 0 when required, >= 0 otherwise. */
static int hdr_rev(const json_t *ans, int64_t *rev, bool required)
{
	json_t *h = json_object_get(ans, "header");
	int64_t r = 0;

	if (h ? !json_is_object(h) || dm_etcd_j64(h, "revision", &r) : required)
		return -EBADMSG;
	if (r < 0 || (required && r == 0))
		return -EBADMSG;
	if (rev)
		*rev = r;
	return 0;
}

static void kv_free(struct dm_etcd_kv *kv)
{
	free(kv->key);
	free(kv->val);
}

void dm_etcd_kvs_free(struct dm_etcd_kv *kvs, size_t n)
{
	for (size_t i = 0; kvs && i < n; i++)
		kv_free(&kvs[i]);
	free(kvs);
}

int dm_etcd_kv_parse(const json_t *o, struct dm_etcd_kv *kv)
{
	json_t *k = json_object_get(o, "key"), *v = json_object_get(o, "value");
	int rc;

	memset(kv, 0, sizeof(*kv));
	if (!json_is_object(o) || !json_is_string(k) || (v && !json_is_string(v) && !json_is_null(v)))
		return -EBADMSG;
	if (dm_etcd_j64(o, "create_revision", &kv->create_revision) ||
	    dm_etcd_j64(o, "mod_revision", &kv->mod_revision) ||
	    dm_etcd_j64(o, "version", &kv->version) || dm_etcd_j64(o, "lease", &kv->lease) ||
	    kv->create_revision < 0 || kv->mod_revision <= 0 || kv->version < 0 || kv->lease < 0)
		return -EBADMSG;
	if ((rc = dm_etcd_unb64(json_string_value(k), json_string_length(k), &kv->key, &kv->key_len)))
		return rc;
	if (!kv->key_len)
		rc = -EBADMSG;
	else if (json_is_string(v))
		rc = dm_etcd_unb64(json_string_value(v), json_string_length(v), (char **)&kv->val, &kv->len);
	else
		rc = dm_etcd_unb64("", 0, (char **)&kv->val, &kv->len);
	if (rc) {
		kv_free(kv);
		memset(kv, 0, sizeof(*kv));
	}
	return rc;
}

int dm_etcd_ans_range(const json_t *ans, struct dm_etcd_kv **kvs, size_t *n, int64_t *revision)
{
	json_t *a = json_object_get(ans, "kvs");
	int64_t count;
	size_t cnt;
	int rc;

	*kvs = NULL;
	*n = 0;
	if (hdr_rev(ans, revision, true) || (a && !json_is_array(a)) || dm_etcd_j64(ans, "count", &count))
		return -EBADMSG;
	cnt = json_array_size(a);       /* 0 when absent */
	if (count < 0 || (uint64_t)count < cnt)
		return -EBADMSG;
	if (!cnt)
		return 0;
	if (!(*kvs = calloc(cnt, sizeof(**kvs))))
		return -ENOMEM;
	for (size_t i = 0; i < cnt; i++) {
		struct dm_etcd_kv *kv = &(*kvs)[i], *pk = kv - 1;

		if ((rc = dm_etcd_kv_parse(json_array_get(a, i), kv)))
			goto err_free_kvs;
		if (i) {                 /* strictly ascending keys */
			int c = memcmp(pk->key, kv->key, DM_MIN(pk->key_len, kv->key_len));

			if (c > 0 || (c == 0 && pk->key_len >= kv->key_len)) {
				rc = -EBADMSG;
				goto err_free_kvs;
			}
		}
	}
	*n = cnt;
	return 0;
err_free_kvs:
	dm_etcd_kvs_free(*kvs, cnt);
	*kvs = NULL;
	return rc;
}

int dm_etcd_ans_write(const json_t *ans, int64_t *revision, int64_t *deleted, bool *succeeded)
{
	int64_t d;
	bool s;

	if (hdr_rev(ans, revision, true) || dm_etcd_j64(ans, "deleted", &d) || d < 0 ||
	    jbool(ans, "succeeded", &s))
		return -EBADMSG;
	if (deleted)
		*deleted = d;
	if (succeeded)
		*succeeded = s;
	return 0;
}

int dm_etcd_ans_lease(const json_t *ans, int64_t *id, int64_t *ttl)
{
	json_t *r = json_object_get(ans, "result");

	if (r && !json_is_object(r))
		return -EBADMSG;
	if (r)
		ans = r;
	if (hdr_rev(ans, NULL, true) || dm_etcd_j64(ans, "ID", id) || dm_etcd_j64(ans, "TTL", ttl) ||
	    *id <= 0 || *ttl < 0)
		return -EBADMSG;
	return 0;
}

int dm_etcd_ans_error(const json_t *ans, char *msg, size_t cap)
{
	json_t *er = json_object_get(ans, "error"), *m = json_object_get(ans, "message");
	json_t *c = json_object_get(ans, "code");
	long long code;

	if (json_is_object(er)) {                 /* a stream's error */
		m = json_object_get(er, "message");
		c = json_object_get(er, "grpc_code");
	} else if (json_is_string(er) && !m) {
		m = er;
	}
	if ((m && !json_is_string(m)) || (c && !json_is_integer(c)) || (!m && !c))
		return -EBADMSG;
	code = c ? json_integer_value(c) : 2;
	snprintf(msg, cap, "etcd: %s (code %lld)", m ? json_string_value(m) : "?", code);
	switch (code) {
	case 1: return -ECANCELED;
	case 3: return -EINVAL;
	case 4: return -ETIMEDOUT;
	case 5: return -ENOENT;
	case 6: return -EEXIST;
	case 7: case 16: return -EACCES;
	case 8: case 14: return -EAGAIN;     /* resource exhausted, unavailable (no leader) */
	case 11: return -ESTALE;             /* out of range: compacted revision */
	default: return code > 0 ? -EIO : -EBADMSG;
	}
}

/* ---- watch stream messages ---- */
void dm_etcd_wmsg_free(struct dm_etcd_wmsg *m)
{
	for (size_t i = 0; m->ev && i < m->nev; i++) {
		free(m->ev[i].kv.key);
		free(m->ev[i].kv.val);
	}
	free(m->ev);
	m->ev = NULL;
	m->nev = 0;
}

int dm_etcd_ans_watch(const json_t *ans, struct dm_etcd_wmsg *m)
{
	json_t *r = json_object_get(ans, "result"), *h, *evs, *reason;
	int rc;

	memset(m, 0, sizeof(*m));
	if (!json_is_object(r))
		return -EBADMSG;
	h = json_object_get(r, "header");
	evs = json_object_get(r, "events");
	reason = json_object_get(r, "cancel_reason");
	if ((h && !json_is_object(h)) || (evs && !json_is_array(evs)) ||
	    (reason && !json_is_string(reason)))
		return -EBADMSG;
	if ((h && dm_etcd_j64(h, "revision", &m->revision)) ||
	    dm_etcd_j64(r, "compact_revision", &m->compact_revision))
		return -EBADMSG;
	m->created = json_is_true(json_object_get(r, "created"));
	m->canceled = json_is_true(json_object_get(r, "canceled"));
	snprintf(m->reason, sizeof(m->reason), "%s", reason ? json_string_value(reason) : "");
	if (m->revision < 0 || m->compact_revision < 0)
		return -EBADMSG;
	if (!json_array_size(evs))
		return 0;
	if (!(m->ev = calloc(json_array_size(evs), sizeof(*m->ev))))
		return -ENOMEM;
	for (size_t i = 0; i < json_array_size(evs); i++) {
		json_t *ev = json_array_get(evs, i), *t = json_object_get(ev, "type");
		struct dm_etcd_event *d = &m->ev[i];
		const char *ts = json_string_value(t);

		rc = -EBADMSG;
		if (!json_is_object(ev) || (t && !ts))
			goto err_free_m;
		if (!ts || strcmp(ts, "PUT") == 0)
			d->type = DM_ETCD_PUT;
		else if (strcmp(ts, "DELETE") == 0)
			d->type = DM_ETCD_DELETE;
		else
			goto err_free_m;
		if ((rc = dm_etcd_kv_parse(json_object_get(ev, "kv"), &d->kv)))
			goto err_free_m;
		m->nev++;
		if (i && d->kv.mod_revision < d[-1].kv.mod_revision) {
			rc = -EBADMSG;         /* events come in revision order */
			goto err_free_m;
		}
	}
	return 0;
err_free_m:
	dm_etcd_wmsg_free(m);
	return rc;
}
