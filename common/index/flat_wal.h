/* flat_wal.h: record framing of the flat store's write-ahead log and snapshot, and a
 * bounds-checked reader/writer of record payloads. Internal to mn/flat.
 *
 * A record on disk: u32 payload length | u32 crc32c(lsn, type, payload) | u64 lsn |
 * u32 type | payload. Little-endian (x86-64 only, like the rest of dmann).
 */
#ifndef DM_FLAT_WAL_H
#define DM_FLAT_WAL_H

#include "dm.h"

#define FLAT_REC_HDR 20u
#define FLAT_REC_MAX (64u << 20)   /* largest payload accepted when reading */

enum flat_rec_type {
	FLAT_REC_BUCKET_CREATE = 1,
	FLAT_REC_BUCKET_DELETE = 2,
	FLAT_REC_INDEX_CREATE = 3,
	FLAT_REC_INDEX_DELETE = 4,
	FLAT_REC_PUT = 5,
	FLAT_REC_DEL = 6,
	FLAT_REC_SNAP_END = 7,         /* last record of a complete snapshot */
};

uint32_t flat_crc32c(uint32_t crc, const void *p, size_t n);

/* Growable payload buffer. */
struct flat_buf {
	uint8_t *p;
	size_t n, cap;
	bool oom;
};

void flat_buf_reset(struct flat_buf *b);
void flat_buf_free(struct flat_buf *b);
void flat_buf_put(struct flat_buf *b, const void *p, size_t n);
void flat_buf_u32(struct flat_buf *b, uint32_t v);
void flat_buf_u64(struct flat_buf *b, uint64_t v);
void flat_buf_str(struct flat_buf *b, const char *s);
void flat_buf_blob(struct flat_buf *b, const void *p, uint32_t n);
/* Prepend-ready frame: writes the header for payload b->p[FLAT_REC_HDR..] (callers reserve
 * FLAT_REC_HDR bytes at the front first). */
void flat_buf_frame(struct flat_buf *b, uint64_t lsn, uint32_t type);

/* Payload reader; any read past the end sets bad and returns zeros / NULL. */
struct flat_rd {
	const uint8_t *p;
	size_t n, off;
	bool bad;
};

uint32_t flat_rd_u32(struct flat_rd *r);
uint64_t flat_rd_u64(struct flat_rd *r);
/* A length-prefixed string of at most max bytes copied NUL-terminated into out[max + 1]. */
void flat_rd_str(struct flat_rd *r, char *out, size_t max);
/* A length-prefixed blob; returns a pointer into the payload. */
const void *flat_rd_blob(struct flat_rd *r, uint32_t *len);
const void *flat_rd_raw(struct flat_rd *r, size_t n);

/* Parse the record at p[0..n): 1 and the fields if a whole valid record is there, 0 if the
 * bytes end before the record does or its CRC fails (a torn tail), -EBADMSG if the header
 * is impossible (length over FLAT_REC_MAX). */
int flat_rec_parse(const uint8_t *p, size_t n, uint64_t *lsn, uint32_t *type,
		   const uint8_t **payload, uint32_t *plen);

#endif
