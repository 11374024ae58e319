/* s3_hresp.c: the parser of the internal client's HTTP responses (s3_hresp.h). */
#include "s3_hresp.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

/* Header line [l, e) (without CRLF) named name (case-insensitive, followed by ':'): its
 * value with leading blanks skipped, else NULL. */
static const char *hval(const char *l, const char *e, const char *name)
{
	size_t nl = strlen(name);

	if ((size_t)(e - l) <= nl || strncasecmp(l, name, nl) || l[nl] != ':')
		return NULL;
	l += nl + 1;
	while (l < e && (*l == ' ' || *l == '\t'))
		l++;
	return l;
}

int s3_hresp_parse(const char *buf, size_t n, bool eof, struct s3_hresp *r)
{
	const char *end, *l, *e, *v;
	bool close_ = false, v11;
	int status = 0;

	memset(r, 0, sizeof(*r));
	r->clen = -1;
	end = n >= 4 ? memmem(buf, n, "\r\n\r\n", 4) : NULL;
	if (!end)
		return eof ? -EBADMSG : 0;
	r->hdr_len = (size_t)(end - buf) + 4;
	/* "HTTP/1.x DDD ..." */
	if (r->hdr_len < 16 || memcmp(buf, "HTTP/1.", 7) || (buf[7] != '0' && buf[7] != '1') ||
	    buf[8] != ' ')
		return -EBADMSG;
	v11 = buf[7] == '1';
	for (int i = 9; i < 12; i++) {
		if (buf[i] < '0' || buf[i] > '9')
			return -EBADMSG;
		status = status * 10 + (buf[i] - '0');
	}
	if (status < 100 || status > 599 || (buf[12] != ' ' && buf[12] != '\r'))
		return -EBADMSG;
	r->status = status;
	l = memchr(buf, '\n', r->hdr_len);
	for (l = l ? l + 1 : end; l < end; l = e + 2) {
		e = memmem(l, (size_t)(end + 2 - l), "\r\n", 2);
		if (!e)
			return -EBADMSG;
		if ((v = hval(l, e, "Content-Length"))) {
			long long c = 0;

			if (r->clen >= 0 || v == e)
				return -EBADMSG;   /* repeated or empty */
			for (; v < e && *v >= '0' && *v <= '9'; v++) {
				if (c > (INT64_MAX - 9) / 10)
					return -EBADMSG;
				c = c * 10 + (*v - '0');
			}
			while (v < e && (*v == ' ' || *v == '\t'))
				v++;
			if (v != e)
				return -EBADMSG;
			r->clen = c;
		} else if ((v = hval(l, e, "Connection"))) {
			close_ = (size_t)(e - v) >= 5 && !strncasecmp(v, "close", 5);
		}
	}
	r->body = buf + r->hdr_len;
	r->blen = n - r->hdr_len;
	if (r->clen >= 0) {
		if (r->blen < (unsigned long long)r->clen)
			return eof ? -EBADMSG : 0;
		r->keep = v11 && !close_ && !eof && r->blen == (unsigned long long)r->clen;
		r->blen = (size_t)r->clen;
		return 1;
	}
	return eof ? 1 : 0;
}
