/* flat_wal.h: record framing of the flat store's write-ahead log and snapshot files.
 * Payloads are built in a struct dm_buf and read with a struct dm_rbuf (util/dm_buf.h).
 * Internal to common/index (flat*.c) and the WAL fuzz target.
 *
 * A record on disk: u32 payload length | u32 crc32c(lsn, type word, payload) | u64 lsn |
 * u32 type word | payload, little-endian. The type word is the record type in its low 8
 * bits and, in the upper 24, `inflight`: how many records before this one were not yet
 * known durable when it was written (0 = every earlier record had been fdatasync'ed; the
 * only value written before group commit, so older logs read the same). Records lsn <=
 * lsn - 1 - inflight were durable when this one was written: recovery uses that to tell a
 * torn tail from corruption of records that had been acknowledged (flat_wal.c).
 */
#ifndef DM_FLAT_WAL_H
#define DM_FLAT_WAL_H

#include "dm.h"
#include "util/dm_buf.h"

#define FLAT_REC_HDR 20u
#define FLAT_REC_MAX (64u << 20)   /* largest payload accepted (written or read) */
#define FLAT_INFLIGHT_MAX 0xffffffu

enum flat_rec_type {
	FLAT_REC_BUCKET_CREATE = 1,
	FLAT_REC_BUCKET_DELETE = 2,
	FLAT_REC_INDEX_CREATE = 3,
	FLAT_REC_INDEX_DELETE = 4,
	FLAT_REC_PUT = 5,
	FLAT_REC_DEL = 6,
	FLAT_REC_SNAP_END = 7,         /* last record of a complete snapshot */
	FLAT_REC_ATTR = 8,             /* a catalog attribute set or cleared (flat_attr.c) */
	FLAT_REC_MARK = 9,             /* an index's graph mark (flat_mark.c) */
	FLAT_REC_GINDEX = 10,          /* nodes an indexer added to the graph (flat_gindex.c) */
};
#define FLAT_REC_LAST FLAT_REC_GINDEX

uint32_t flat_crc32c(uint32_t crc, const void *p, size_t n);

/* Start a record in b: forget its contents and reserve the header. */
void flat_rec_begin(struct dm_buf *b);
/* Write the header of the record in b (payload b->p[FLAT_REC_HDR..]). */
void flat_rec_frame(struct dm_buf *b, uint64_t lsn, uint32_t type, uint32_t inflight);

/* A parsed record; payload points into the parsed bytes. */
struct flat_rec {
	uint64_t lsn;
	uint32_t type, inflight;
	const uint8_t *payload;
	uint32_t len;
};

/* Parse the record at p[0..n): 1 and *r if a whole valid record is there, 0 if the bytes
 * end before the record does or its CRC fails, -EBADMSG if the header is impossible
 * (length over FLAT_REC_MAX). */
int flat_rec_parse(const uint8_t *p, size_t n, struct flat_rec *r);

/* A length-prefixed name of 1..FLAT_NAME_MAX bytes (or key of 1..FLAT_KEY_MAX) copied
 * NUL-terminated into out[max + 1]; false (r->bad set) otherwise. */
bool flat_rd_name(struct dm_rbuf *r, char *out, size_t max);

#endif
