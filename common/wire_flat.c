/* wire_flat.c: codecs of the S3 flat-index RPC (wire.h, FL section): the chunk prefix that
 * lets a request or response span several messages, and the bounds-checked payload
 * writer/reader used by both ends. */
#include "wire.h"

#include <stdlib.h>
#include <string.h>

int dm_wire_fl_check(const struct dm_wire_hdr *h, const uint8_t *buf, size_t buflen)
{
	struct dm_wire_fl_chunk c;
	uint32_t bytes;

	if (h->op < DM_OP_FL_FIRST || h->op > DM_OP_FL_LAST)
		return -EPROTO;
	if (!(h->op & 1) && h->status != 0)
		return -EBADMSG;
	if (h->length != buflen || buflen < DM_WIRE_HDR_LEN + sizeof(c))
		return -EBADMSG;
	dm_wire_fl_chunk_decode(buf + DM_WIRE_HDR_LEN, buflen - DM_WIRE_HDR_LEN, &c);
	bytes = (uint32_t)(buflen - DM_WIRE_HDR_LEN - sizeof(c));
	if (c.total > DM_FL_MAX_STREAM || c.off > c.total || bytes > c.total - c.off)
		return -EBADMSG;
	/* Only an empty stream may have an empty message (no progress otherwise). */
	if (!bytes && c.total)
		return -EBADMSG;
	return 0;
}

void dm_wire_fl_chunk_encode(uint8_t *buf, const struct dm_wire_fl_chunk *m)
{
	dm_put_le32(buf, m->total);
	dm_put_le32(buf + 4, m->off);
}

int dm_wire_fl_chunk_decode(const uint8_t *buf, size_t len, struct dm_wire_fl_chunk *m)
{
	if (len < sizeof(*m))
		return -EBADMSG;
	m->total = dm_get_le32(buf);
	m->off = dm_get_le32(buf + 4);
	return 0;
}

/* ---------------------------------------------------------------- writer ----------- */

void dm_wbuf_put(struct dm_wbuf *w, const void *p, size_t n)
{
	if (w->oom)
		return;
	if (w->n + n > w->cap) {
		size_t cap = DM_MAX(w->cap * 2, w->n + n + 256);
		uint8_t *np = realloc(w->p, cap);

		if (!np) {
			w->oom = true;
			return;
		}
		w->p = np;
		w->cap = cap;
	}
	if (n)
		memcpy(w->p + w->n, p, n);
	w->n += n;
}

void dm_wbuf_u32(struct dm_wbuf *w, uint32_t v)
{
	uint8_t b[4];

	dm_put_le32(b, v);
	dm_wbuf_put(w, b, 4);
}

void dm_wbuf_u64(struct dm_wbuf *w, uint64_t v)
{
	uint8_t b[8];

	dm_put_le64(b, v);
	dm_wbuf_put(w, b, 8);
}

void dm_wbuf_bytes(struct dm_wbuf *w, const void *p, size_t n)
{
	if (n > UINT32_MAX) {
		w->oom = true;
		return;
	}
	dm_wbuf_u32(w, (uint32_t)n);
	dm_wbuf_put(w, p, n);
}

void dm_wbuf_str(struct dm_wbuf *w, const char *s)
{
	dm_wbuf_bytes(w, s, strlen(s));
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
