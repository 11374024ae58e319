/* dm_buf.c: the growable byte buffer (writer) and the bounds-checked reader of common/util,
 * little-endian fields; the one buffer every payload encoder and decoder uses. */
#include "util/dm_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dm_buf_reset(struct dm_buf *w)
{
	w->n = 0;
	w->oom = false;
}

void dm_buf_free(struct dm_buf *w)
{
	free(w->p);
	memset(w, 0, sizeof(*w));
}

bool dm_buf_reserve(struct dm_buf *w, size_t extra)
{
	if (w->oom)
		return false;
	if (extra > SIZE_MAX / 2 - w->n) {
		w->oom = true;
		return false;
	}
	if (w->n + extra > w->cap) {
		size_t cap = DM_MAX(w->cap * 2, w->n + extra + 64);
		uint8_t *np = realloc(w->p, cap);

		if (!np) {
			w->oom = true;
			return false;
		}
		w->p = np;
		w->cap = cap;
	}
	return true;
}

/* ---------------------------------------------------------------- writer ----------- */

void dm_buf_put(struct dm_buf *w, const void *p, size_t n)
{
	if (!dm_buf_reserve(w, n))
		return;
	if (n)
		memcpy(w->p + w->n, p, n);
	w->n += n;
}

void dm_buf_u32(struct dm_buf *w, uint32_t v)
{
	uint8_t b[4];

	dm_put_le32(b, v);
	dm_buf_put(w, b, 4);
}

void dm_buf_u64(struct dm_buf *w, uint64_t v)
{
	uint8_t b[8];

	dm_put_le64(b, v);
	dm_buf_put(w, b, 8);
}

void dm_buf_bytes(struct dm_buf *w, const void *p, size_t n)
{
	if (n > UINT32_MAX) {
		w->oom = true;
		return;
	}
	dm_buf_u32(w, (uint32_t)n);
	dm_buf_put(w, p, n);
}

void dm_buf_str(struct dm_buf *w, const char *s)
{
	dm_buf_bytes(w, s, strlen(s));
}

/* ---------------------------------------------------------------- reader ----------- */

const void *dm_rbuf_get(struct dm_rbuf *r, size_t n)
{
	const void *p;

	if (r->bad || n > r->n - r->at) {
		r->bad = true;
		return NULL;
	}
	p = r->p + r->at;
	r->at += n;
	return p;
}

uint16_t dm_rbuf_u16(struct dm_rbuf *r)
{
	const uint8_t *p = dm_rbuf_get(r, 2);

	return p ? dm_get_le16(p) : 0;
}

uint32_t dm_rbuf_u32(struct dm_rbuf *r)
{
	const uint8_t *p = dm_rbuf_get(r, 4);

	return p ? dm_get_le32(p) : 0;
}

uint64_t dm_rbuf_u64(struct dm_rbuf *r)
{
	const uint8_t *p = dm_rbuf_get(r, 8);

	return p ? dm_get_le64(p) : 0;
}

const void *dm_rbuf_bytes(struct dm_rbuf *r, uint32_t *len, uint32_t max)
{
	uint32_t n = dm_rbuf_u32(r);
	const void *p;

	*len = 0;
	if (r->bad || n > max) {
		r->bad = true;
		return NULL;
	}
	p = dm_rbuf_get(r, n);
	if (p)
		*len = n;
	return p ? p : NULL;
}

bool dm_rbuf_str(struct dm_rbuf *r, char *out, size_t cap)
{
	uint32_t n;
	const char *p = dm_rbuf_bytes(r, &n, cap ? (uint32_t)DM_MIN(cap - 1, UINT32_MAX) : 0);

	out[0] = 0;
	if (!p || memchr(p, 0, n)) {
		r->bad = true;
		return false;
	}
	memcpy(out, p, n);
	out[n] = 0;
	return true;
}

void dm_buf_printf(struct dm_buf *w, const char *fmt, ...)
{
	va_list ap;
	int need;

	va_start(ap, fmt);
	need = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (need < 0 || !dm_buf_reserve(w, (size_t)need + 1)) {
		w->oom = true;
		return;
	}
	va_start(ap, fmt);
	vsnprintf((char *)w->p + w->n, (size_t)need + 1, fmt, ap);
	va_end(ap);
	w->n += (size_t)need;
}
