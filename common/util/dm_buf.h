/* dm_buf.h: the one growable byte buffer (struct dm_buf: append little-endian fields, length-
 * prefixed bytes and strings, printf) and the one bounds-checked reader (struct dm_rbuf) of
 * the tree: wire payloads, WAL records, filter encodings and HTTP messages use them.
 *
 * Writer: a failed allocation sets .oom and makes every later call a no-op; check .oom once
 * at the end. Reader: a read past the end (or a length over its bound) sets .bad and returns
 * zeros / NULL; check .bad once at the end. Not thread-safe: one buffer, one thread.
 */
#ifndef DM_UTIL_BUF_H
#define DM_UTIL_BUF_H

#include "dm.h"

/* ---- little-endian helpers ---- */
static inline void dm_put_le16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void dm_put_le32(uint8_t *p, uint32_t v)
{ for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void dm_put_le64(uint8_t *p, uint64_t v)
{ for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t dm_get_le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t dm_get_le32(const uint8_t *p)
{ uint32_t v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static inline uint64_t dm_get_le64(const uint8_t *p)
{ uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }

/* Zero-initialise (struct dm_buf b = {0}); dm_buf_free releases. */
struct dm_buf {
	uint8_t *p;
	size_t n, cap;
	bool oom;
};
/* Room for extra more bytes (false and .oom set if it cannot be had). */
bool dm_buf_reserve(struct dm_buf *w, size_t extra);
/* Forget the contents (keeps the allocation, clears .oom). */
void dm_buf_reset(struct dm_buf *w);
void dm_buf_free(struct dm_buf *w);
/* Append printf output (no NUL counted in .n; one is kept after the end). */
void dm_buf_printf(struct dm_buf *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dm_buf_put(struct dm_buf *w, const void *p, size_t n);
void dm_buf_u32(struct dm_buf *w, uint32_t v);
void dm_buf_u64(struct dm_buf *w, uint64_t v);
/* u32 length + bytes. */
void dm_buf_bytes(struct dm_buf *w, const void *p, size_t n);
void dm_buf_str(struct dm_buf *w, const char *s);

struct dm_rbuf {
	const uint8_t *p;
	size_t n, at;
	bool bad;
};
uint16_t dm_rbuf_u16(struct dm_rbuf *r);
uint32_t dm_rbuf_u32(struct dm_rbuf *r);
uint64_t dm_rbuf_u64(struct dm_rbuf *r);
/* n raw bytes (pointer into the buffer, NULL if short). */
const void *dm_rbuf_get(struct dm_rbuf *r, size_t n);
/* u32 length + bytes: pointer and length; NULL (bad set) if short or len > max. */
const void *dm_rbuf_bytes(struct dm_rbuf *r, uint32_t *len, uint32_t max);
/* A string field copied NUL-terminated into out (cap bytes); false (bad set) if it is
 * longer than cap - 1 or contains a NUL. */
bool dm_rbuf_str(struct dm_rbuf *r, char *out, size_t cap);

#endif
