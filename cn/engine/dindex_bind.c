/* dindex_bind.c: the S3 binding trailer of the index metadata (dindex_bind.h): encoding
 * for dmann load, a checked parser for the compute nodes. */
#include "dindex_bind.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static bool name_ok(const char *s)
{
	size_t n = s ? strnlen(s, DINDEX_BIND_NAME_MAX + 1) : 0;

	return n >= 1 && n <= DINDEX_BIND_NAME_MAX;
}

int dindex_bind_encode(struct dm_buf *b, const struct dindex_bind_in *in)
{
	size_t start = b->n, total = 0;
	uint32_t crc;

	if (!name_ok(in->bucket) || !name_ok(in->index))
		return -EINVAL;
	for (uint32_t i = 0; i < in->n; i++) {
		size_t kl = in->keys[i] ? strnlen(in->keys[i], DINDEX_BIND_KEY_MAX + 1) : 0;

		if (kl < 1 || kl > DINDEX_BIND_KEY_MAX)
			return -EINVAL;
		total += kl;
		if (total > UINT32_MAX)
			return -E2BIG;
	}
	dm_buf_put(b, DINDEX_BIND_MAGIC, 8);
	dm_buf_u32(b, 0);                       /* len, crc: filled in below */
	dm_buf_u32(b, 0);
	dm_buf_str(b, in->bucket);
	dm_buf_str(b, in->index);
	dm_buf_u32(b, in->n);
	total = 0;
	dm_buf_u32(b, 0);
	for (uint32_t i = 0; i < in->n; i++) {
		total += strlen(in->keys[i]);
		dm_buf_u32(b, (uint32_t)total);
	}
	for (uint32_t i = 0; i < in->n; i++)
		dm_buf_put(b, in->keys[i], strlen(in->keys[i]));
	if (b->oom)
		return -ENOMEM;
	uint32_t len = (uint32_t)(b->n - start - 16);

	crc = (uint32_t)crc32(0L, b->p + start + 16, len);
	memcpy(b->p + start + 8, &len, 4);      /* little-endian hosts only (wire.h) */
	memcpy(b->p + start + 12, &crc, 4);
	return 0;
}

struct dindex_bind *dindex_bind_parse(const uint8_t *p, size_t len, uint32_t n, char *err,
				      size_t errlen)
{
	struct dindex_bind *bd;
	struct dm_rbuf r;
	uint32_t blen, crc, nk;
	const uint32_t *off;
	size_t kbytes;

	if (len < 16 || memcmp(p, DINDEX_BIND_MAGIC, 8)) {
		snprintf(err, errlen, "index metadata: %zu bytes after the vectors that are not an "
			 "S3 binding", len);
		errno = EBADMSG;
		return NULL;
	}
	memcpy(&blen, p + 8, 4);
	memcpy(&crc, p + 12, 4);
	if (blen != len - 16 || (uint32_t)crc32(0L, p + 16, blen) != crc) {
		snprintf(err, errlen, "index metadata: S3 binding length or checksum");
		errno = EBADMSG;
		return NULL;
	}
	bd = calloc(1, sizeof(*bd));
	if (!bd) {
		errno = ENOMEM;
		return NULL;
	}
	r = (struct dm_rbuf){ .p = p + 16, .n = blen };
	if (!dm_rbuf_str(&r, bd->bucket, sizeof(bd->bucket)) ||
	    !dm_rbuf_str(&r, bd->index, sizeof(bd->index)) || !bd->bucket[0] || !bd->index[0])
		goto bad;
	nk = dm_rbuf_u32(&r);
	if (r.bad || nk != n || (uint64_t)nk + 1 > (r.n - r.at) / 4)
		goto bad;
	off = dm_rbuf_get(&r, ((size_t)nk + 1) * 4);
	if (!off)
		goto bad;
	kbytes = r.n - r.at;
	bd->off = malloc(((size_t)nk + 1) * 4);
	bd->keys = malloc(kbytes ? kbytes : 1);
	if (!bd->off || !bd->keys) {
		dindex_bind_free(bd);
		errno = ENOMEM;
		return NULL;
	}
	memcpy(bd->off, off, ((size_t)nk + 1) * 4);
	memcpy(bd->keys, p + 16 + r.at, kbytes);
	if (bd->off[0] != 0 || bd->off[nk] != kbytes)
		goto bad;
	for (uint32_t i = 0; i < nk; i++) {
		uint32_t kl = bd->off[i + 1] - bd->off[i];

		if (bd->off[i + 1] < bd->off[i] || bd->off[i + 1] > kbytes || kl < 1 ||
		    kl > DINDEX_BIND_KEY_MAX ||
		    memchr(bd->keys + bd->off[i], 0, kl))
			goto bad;
	}
	bd->nkeys = nk;
	return bd;
bad:
	snprintf(err, errlen, "index metadata: malformed S3 binding");
	dindex_bind_free(bd);
	errno = EBADMSG;
	return NULL;
}

void dindex_bind_free(struct dindex_bind *bd)
{
	if (!bd)
		return;
	free(bd->off);
	free(bd->keys);
	free(bd);
}
