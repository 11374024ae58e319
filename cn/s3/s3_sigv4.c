/* s3_sigv4.c: AWS SigV4 canonical request, signing key, signature and verification
 * (OpenSSL HMAC-SHA256 and SHA-256). */
#include "s3_sigv4.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "util/dm_buf.h"

/* Append to a dm_buf kept NUL-terminated (a C string at every step; oom latches). */
static void sb_putn(struct dm_buf *b, const char *s, size_t n)
{
	dm_buf_put(b, s, n);
	if (dm_buf_reserve(b, 1))
		b->p[b->n] = 0;
}

static void sb_puts(struct dm_buf *b, const char *s)
{
	sb_putn(b, s, strlen(s));
}

static void sb_putc(struct dm_buf *b, char c)
{
	sb_putn(b, &c, 1);
}

static void hex_of(const unsigned char *d, size_t n, char *out)
{
	static const char hx[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = hx[d[i] >> 4];
		out[2 * i + 1] = hx[d[i] & 15];
	}
	out[2 * n] = 0;
}

void s3_sha256_hex(const void *p, size_t n, char hex[65])
{
	unsigned char md[32];
	unsigned int mdlen = 0;

	EVP_Digest(p, n, md, &mdlen, EVP_sha256(), NULL);
	hex_of(md, 32, hex);
}

static void hmac(const void *key, size_t klen, const char *msg, unsigned char out[32])
{
	unsigned int len = 32;

	HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg, strlen(msg), out, &len);
}

static bool unreserved(unsigned char c)
{
	return isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
}

/* AWS URI encoding of n bytes; '/' kept when keep_slash. */
static void uri_encode(struct dm_buf *b, const char *s, size_t n, bool keep_slash)
{
	static const char hx[] = "0123456789ABCDEF";

	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (unreserved(c) || (keep_slash && c == '/')) {
			sb_putc(b, (char)c);
		} else {
			char e[3] = { '%', hx[c >> 4], hx[c & 15] };

			sb_putn(b, e, 3);
		}
	}
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)tolower((unsigned char)c);
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Percent-decode s[0..n) into a new string ('+' stays '+', as AWS does). */
static char *uri_decode(const char *s, size_t n)
{
	char *o = malloc(n + 1);
	size_t j = 0;

	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
			o[j++] = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
			i += 2;
		} else {
			o[j++] = s[i];
		}
	}
	o[j] = 0;
	return o;
}

struct qparam {
	char *k, *v;       /* encoded canonically */
};

static int qparam_cmp(const void *a, const void *b)
{
	const struct qparam *x = a, *y = b;
	int c = strcmp(x->k, y->k);

	return c ? c : strcmp(x->v, y->v);
}

/* Canonical query string: decode each name/value, re-encode, sort by name then value. */
static int canonical_query(struct dm_buf *out, const char *q)
{
	size_t np = 0, cap = 0;
	struct qparam *ps = NULL;
	int rc = 0;

	while (q && *q) {
		const char *amp = strchr(q, '&'), *end = amp ? amp : q + strlen(q);
		const char *eq = memchr(q, '=', (size_t)(end - q));
		const char *ke = eq ? eq : end;
		char *kd = uri_decode(q, (size_t)(ke - q));
		char *vd = eq ? uri_decode(eq + 1, (size_t)(end - eq - 1)) : strdup("");
		struct dm_buf kb = { 0 }, vb = { 0 };

		if (end > q) {
			if (!kd || !vd) {
				rc = -ENOMEM;
			} else {
				uri_encode(&kb, kd, strlen(kd), false);
				uri_encode(&vb, vd, strlen(vd), false);
				sb_puts(&kb, "");
				sb_puts(&vb, "");
				if (np == cap) {
					cap = cap ? cap * 2 : 8;
					struct qparam *nps = realloc(ps, cap * sizeof(*ps));

					if (!nps)
						rc = -ENOMEM;
					else
						ps = nps;
				}
				if (!rc && !kb.oom && !vb.oom) {
					ps[np++] = (struct qparam){ (char *)kb.p, (char *)vb.p };
					kb.p = vb.p = NULL;
				} else {
					rc = -ENOMEM;
				}
			}
		}
		free(kb.p);
		free(vb.p);
		free(kd);
		free(vd);
		if (rc)
			break;
		q = amp ? amp + 1 : end;
	}
	if (!rc) {
		if (np)
			qsort(ps, np, sizeof(*ps), qparam_cmp);
		for (size_t i = 0; i < np; i++) {
			if (i)
				sb_putc(out, '&');
			sb_puts(out, ps[i].k);
			sb_putc(out, '=');
			sb_puts(out, ps[i].v);
		}
	}
	for (size_t i = 0; i < np; i++) {
		free(ps[i].k);
		free(ps[i].v);
	}
	free(ps);
	return rc;
}

/* Header value canonical form: trimmed, runs of spaces collapsed. */
static void canonical_value(struct dm_buf *b, const char *v)
{
	bool space = false;

	while (*v == ' ' || *v == '\t')
		v++;
	for (; *v; v++) {
		if (*v == ' ' || *v == '\t') {
			space = true;
			continue;
		}
		if (space)
			sb_putc(b, ' ');
		space = false;
		sb_putc(b, *v);
	}
}

char *s3_sigv4_canonical_request(const struct s3_sigv4_req *r, const char *signed_headers,
				 const char *payload_hash)
{
	struct dm_buf b = { 0 };
	const char *h = signed_headers;

	sb_puts(&b, r->method);
	sb_putc(&b, '\n');
	/* Non-S3 services sign the path URI-encoded once more (the wire path is encoded). */
	if (!r->path || !r->path[0])
		sb_putc(&b, '/');
	else
		uri_encode(&b, r->path, strlen(r->path), true);
	sb_putc(&b, '\n');
	if (canonical_query(&b, r->query))
		goto err_free;
	sb_putc(&b, '\n');
	while (*h) {
		const char *semi = strchr(h, ';'), *end = semi ? semi : h + strlen(h);
		char name[128];
		const char *v;
		size_t n = (size_t)(end - h);

		if (!n || n >= sizeof(name))
			goto err_inval;
		memcpy(name, h, n);
		name[n] = 0;
		for (size_t i = 0; i < n; i++)
			if (name[i] != tolower((unsigned char)name[i]))
				goto err_inval;
		v = r->header(r->hctx, name);
		if (!v)
			goto err_inval;
		sb_puts(&b, name);
		sb_putc(&b, ':');
		canonical_value(&b, v);
		sb_putc(&b, '\n');
		h = semi ? semi + 1 : end;
	}
	sb_putc(&b, '\n');
	sb_puts(&b, signed_headers);
	sb_putc(&b, '\n');
	sb_puts(&b, payload_hash);
	if (b.oom)
		goto err_free;
	return (char *)b.p;

err_inval:
	free(b.p);
	errno = EINVAL;
	return NULL;
err_free:
	free(b.p);
	errno = ENOMEM;
	return NULL;
}

void s3_sigv4_signature(const char *secret, const char *amz_date, const char *region,
			const char *service, const char *canonical_request, char sig[65])
{
	char date8[9], hash[65], *k0, *sts;
	unsigned char k[32], out[32];

	snprintf(date8, sizeof(date8), "%.8s", amz_date);
	s3_sha256_hex(canonical_request, strlen(canonical_request), hash);
	if (asprintf(&sts, "AWS4-HMAC-SHA256\n%s\n%s/%s/%s/aws4_request\n%s", amz_date, date8,
		     region, service, hash) < 0 ||
	    asprintf(&k0, "AWS4%s", secret) < 0) {
		sig[0] = 0;   /* matches nothing */
		return;
	}
	hmac(k0, strlen(k0), date8, k);
	hmac(k, 32, region, k);
	hmac(k, 32, service, k);
	hmac(k, 32, "aws4_request", k);
	hmac(k, 32, sts, out);
	hex_of(out, 32, sig);
	OPENSSL_cleanse(k0, strlen(k0));
	OPENSSL_cleanse(k, sizeof(k));
	free(k0);
	free(sts);
}

int s3_sigv4_authorization(const struct s3_sigv4_req *r, const char *access_key,
			   const char *secret, const char *amz_date, const char *region,
			   const char *service, const char *signed_headers,
			   const char *payload_hash, char *out, size_t outlen)
{
	char *creq = s3_sigv4_canonical_request(r, signed_headers, payload_hash);
	char sig[65];
	int n;

	if (!creq)
		return -errno;
	s3_sigv4_signature(secret, amz_date, region, service, creq, sig);
	free(creq);
	n = snprintf(out, outlen,
		     "AWS4-HMAC-SHA256 Credential=%s/%.8s/%s/%s/aws4_request, SignedHeaders=%s, "
		     "Signature=%s", access_key, amz_date, region, service, signed_headers, sig);
	return n > 0 && (size_t)n < outlen ? 0 : -EINVAL;
}

/* Parse "YYYYMMDDTHHMMSSZ"; -1 if malformed. */
static time_t parse_amz_date(const char *s)
{
	struct tm tm = { 0 };
	const char *end;

	if (strlen(s) != 16 || s[8] != 'T' || s[15] != 'Z')
		return -1;
	for (int i = 0; i < 15; i++)
		if (i != 8 && !isdigit((unsigned char)s[i]))
			return -1;
	end = strptime(s, "%Y%m%dT%H%M%SZ", &tm);
	if (!end || *end)
		return -1;
	return timegm(&tm);
}

/* Copy the value of "Name=value" component out of an Authorization header. */
static bool auth_field(const char *authz, const char *name, char *out, size_t outlen)
{
	size_t nl = strlen(name);
	const char *p = authz;

	while ((p = strstr(p, name))) {
		bool at_start = p == authz || p[-1] == ' ' || p[-1] == ',';

		if (at_start && p[nl] == '=') {
			const char *v = p + nl + 1, *e = v;

			while (*e && *e != ',' && *e != ' ')
				e++;
			if ((size_t)(e - v) >= outlen)
				return false;
			memcpy(out, v, (size_t)(e - v));
			out[e - v] = 0;
			return true;
		}
		p += nl;
	}
	return false;
}

/* Whether the ';'-separated list contains name as a whole item. */
static bool list_has(const char *list, const char *name)
{
	size_t nl = strlen(name);

	for (const char *p = list; (p = strstr(p, name)); p += nl)
		if ((p == list || p[-1] == ';') && (p[nl] == ';' || !p[nl]))
			return true;
	return false;
}

#define DENY(...) DENY_RC(-EACCES, __VA_ARGS__)
#define DENY_RC(rc, ...) do { snprintf(msg, msglen, __VA_ARGS__); return (rc); } while (0)

int s3_sigv4_verify(const struct s3_sigv4_cfg *cfg, const struct s3_sigv4_req *r, time_t now,
		    char *msg, size_t msglen)
{
	size_t who;

	return s3_sigv4_verify_who(cfg, r, now, &who, msg, msglen) ? -EACCES : 0;
}

const char *s3_sigv4_errtype(int rc)
{
	if (rc == -ENOKEY)
		return "UnrecognizedClientException";
	if (rc == -EKEYREJECTED)
		return "InvalidSignatureException";
	return "AccessDeniedException";
}

void s3_cred_principal(const struct s3_cred *c, char *out, size_t outlen)
{
	if (c->principal)
		snprintf(out, outlen, "%s", c->principal);
	else
		snprintf(out, outlen, "arn:aws:iam::000000000000:user/%s", c->access_key);
}

int s3_sigv4_verify_who(const struct s3_sigv4_cfg *cfg, const struct s3_sigv4_req *r,
			time_t now, size_t *who, char *msg, size_t msglen)
{
	const char *authz = r->header(r->hctx, "authorization");
	const char *amz_date = r->header(r->hctx, "x-amz-date");
	const char *chash = r->header(r->hctx, "x-amz-content-sha256");
	char cred[512], sh[1024], sig[128], want[65], body_hash[65];
	char *parts[5], *save = NULL, *tok, *creq;
	const char *secret = NULL;
	time_t t;
	int np = 0;

	if (!authz)
		DENY("Missing Authentication Token");
	if (strncmp(authz, "AWS4-HMAC-SHA256 ", 17))
		DENY("Unsupported authorization scheme (only AWS4-HMAC-SHA256)");
	if (!auth_field(authz + 17, "Credential", cred, sizeof(cred)) ||
	    !auth_field(authz + 17, "SignedHeaders", sh, sizeof(sh)) ||
	    !auth_field(authz + 17, "Signature", sig, sizeof(sig)))
		DENY("Authorization header requires Credential, SignedHeaders and Signature");
	for (tok = strtok_r(cred, "/", &save); tok && np < 5; tok = strtok_r(NULL, "/", &save))
		parts[np++] = tok;
	if (np != 5 || tok || strcmp(parts[4], "aws4_request"))
		DENY("Credential must be <key>/<date>/<region>/<service>/aws4_request");
	for (size_t i = 0; i < cfg->ncreds && !secret; i++)
		if (!strcmp(cfg->creds[i].access_key, parts[0])) {
			secret = cfg->creds[i].secret_key;
			*who = i;
		}
	if (!secret)
		DENY_RC(-ENOKEY, "The security token included in the request is invalid");
	if (strcmp(parts[3], cfg->service))
		DENY("Credential should be scoped to correct service: '%s'", cfg->service);
	if (cfg->region && strcmp(parts[2], cfg->region))
		DENY("Credential should be scoped to a valid region: '%s'", cfg->region);
	if (!amz_date || (t = parse_amz_date(amz_date)) < 0)
		DENY("Missing or malformed x-amz-date header");
	if (strncmp(parts[1], amz_date, 8) || strlen(parts[1]) != 8)
		DENY("Credential date does not match x-amz-date");
	if (now - t > cfg->max_skew_s || t - now > cfg->max_skew_s)
		DENY("Signature expired: request time %s is more than %d s from the server time",
		     amz_date, cfg->max_skew_s);
	if (!list_has(sh, "host") || !list_has(sh, "x-amz-date"))
		DENY("SignedHeaders must include host and x-amz-date");
	s3_sha256_hex(r->body ? r->body : "", r->body_len, body_hash);
	if (chash && strcmp(chash, body_hash))
		DENY("x-amz-content-sha256 does not match the request body");
	creq = s3_sigv4_canonical_request(r, sh, body_hash);
	if (!creq)
		DENY("A signed header is missing from the request or SignedHeaders is malformed");
	s3_sigv4_signature(secret, amz_date, parts[2], parts[3], creq, want);
	free(creq);
	if (strlen(sig) != 64 || CRYPTO_memcmp(sig, want, 64))
		DENY_RC(-EKEYREJECTED, "The request signature we calculated does not match the signature you "
		     "provided. Check your AWS Secret Access Key and signing method.");
	return 0;
}

const char *s3_sigv4_client_header(void *ctx, const char *lname)
{
	const struct s3_sigv4_client_hdrs *h = ctx;

	if (!strcmp(lname, "host"))
		return h->host;
	if (!strcmp(lname, "x-amz-date"))
		return h->date;
	if (!strcmp(lname, "x-amz-content-sha256"))
		return h->sha;
	if (!strcmp(lname, "content-type"))
		return h->ctype;
	return NULL;
}
