/* flat_wal.c: record framing (CRC32C) and payload encode/decode for the flat store's WAL
 * and snapshot files. */
#include "flat_wal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int j = 0; j < 8; j++)
			c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
		crc_table[i] = c;
	}
}

/* CRC32C (Castagnoli), table-driven; start with crc = 0. */
uint32_t flat_crc32c(uint32_t crc, const void *p, size_t n)
{
	const uint8_t *b = p;

	pthread_once(&crc_once, crc_init);
	crc = ~crc;
	while (n--)
		crc = crc_table[(crc ^ *b++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

void flat_buf_reset(struct flat_buf *b)
{
	b->n = 0;
	b->oom = false;
}

void flat_buf_free(struct flat_buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

void flat_buf_put(struct flat_buf *b, const void *p, size_t n)
{
	if (b->oom)
		return;
	if (b->n + n > b->cap) {
		size_t cap = DM_MAX(b->cap * 2, b->n + n + 256);
		uint8_t *np = realloc(b->p, cap);

		if (!np) {
			b->oom = true;
			return;
		}
		b->p = np;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, p, n);
	b->n += n;
}

void flat_buf_u32(struct flat_buf *b, uint32_t v)
{
	flat_buf_put(b, &v, 4);
}

void flat_buf_u64(struct flat_buf *b, uint64_t v)
{
	flat_buf_put(b, &v, 8);
}

void flat_buf_blob(struct flat_buf *b, const void *p, uint32_t n)
{
	flat_buf_u32(b, n);
	flat_buf_put(b, p, n);
}

void flat_buf_str(struct flat_buf *b, const char *s)
{
	flat_buf_blob(b, s, (uint32_t)strlen(s));
}

void flat_buf_frame(struct flat_buf *b, uint64_t lsn, uint32_t type)
{
	uint32_t plen = (uint32_t)(b->n - FLAT_REC_HDR), crc;

	memcpy(b->p + 8, &lsn, 8);
	memcpy(b->p + 16, &type, 4);
	crc = flat_crc32c(0, b->p + 8, b->n - 8);
	memcpy(b->p, &plen, 4);
	memcpy(b->p + 4, &crc, 4);
}

const void *flat_rd_raw(struct flat_rd *r, size_t n)
{
	const void *p;

	if (r->bad || n > r->n - r->off) {
		r->bad = true;
		return NULL;
	}
	p = r->p + r->off;
	r->off += n;
	return p;
}

uint32_t flat_rd_u32(struct flat_rd *r)
{
	const void *p = flat_rd_raw(r, 4);
	uint32_t v = 0;

	if (p)
		memcpy(&v, p, 4);
	return v;
}

uint64_t flat_rd_u64(struct flat_rd *r)
{
	const void *p = flat_rd_raw(r, 8);
	uint64_t v = 0;

	if (p)
		memcpy(&v, p, 8);
	return v;
}

const void *flat_rd_blob(struct flat_rd *r, uint32_t *len)
{
	uint32_t n = flat_rd_u32(r);
	const void *p = flat_rd_raw(r, n);

	*len = p ? n : 0;
	return p;
}

void flat_rd_str(struct flat_rd *r, char *out, size_t max)
{
	uint32_t n;
	const char *p = flat_rd_blob(r, &n);

	if (!p || n > max || memchr(p, 0, n)) {
		r->bad = true;
		out[0] = 0;
		return;
	}
	memcpy(out, p, n);
	out[n] = 0;
}

int flat_rec_parse(const uint8_t *p, size_t n, uint64_t *lsn, uint32_t *type,
		   const uint8_t **payload, uint32_t *plen)
{
	uint32_t len, crc;

	if (n < FLAT_REC_HDR)
		return 0;
	memcpy(&len, p, 4);
	memcpy(&crc, p + 4, 4);
	if (len > FLAT_REC_MAX)
		return -EBADMSG;
	if (n - FLAT_REC_HDR < len)
		return 0;
	if (flat_crc32c(0, p + 8, (size_t)len + 12) != crc)
		return 0;
	memcpy(lsn, p + 8, 8);
	memcpy(type, p + 16, 4);
	*payload = p + FLAT_REC_HDR;
	*plen = len;
	return 1;
}
