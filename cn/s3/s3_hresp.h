/* s3_hresp.h: the parser of one HTTP/1.1 response as the ingress's internal client reads it
 * from another compute node's gateway (cn_s3_hclient.c): status line, header (Content-Length,
 * Connection), body. One function over the bytes received so far; it never reads past them
 * and needs no terminating NUL. */
#ifndef DM_S3_HRESP_H
#define DM_S3_HRESP_H

#include <stdbool.h>
#include <stddef.h>

struct s3_hresp {
	int status;            /* 100..599 */
	size_t hdr_len;        /* bytes of status line + header + the empty line */
	long long clen;        /* Content-Length, -1 when absent */
	const char *body;      /* into the buffer */
	size_t blen;
	bool keep;             /* the connection may carry another request: HTTP/1.1 without
				* "Connection: close", a Content-Length, exactly that many body
				* bytes */
};

/* Parse the n bytes of buf received so far; eof: the connection has ended. Returns 1 when
 * the response is complete (r filled in), 0 when more bytes are needed (never with eof),
 * -EBADMSG when the bytes are no valid response (bad status line, bad or repeated
 * Content-Length, a body shorter than announced at eof, nothing at eof). With a
 * Content-Length the response is complete once that many body bytes are in (bytes past them
 * are not part of it and make keep false); without one, at eof. */
int s3_hresp_parse(const char *buf, size_t n, bool eof, struct s3_hresp *r);

#endif /* DM_S3_HRESP_H */
