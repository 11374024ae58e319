/* hnsw_layout.h: the HNSW record layout (v2). This is the disaggregated layout itself: the
 * memory nodes hold exactly these bytes and compute nodes read them with one-sided READs,
 * so every field has a fixed size and position (little-endian, no pointers).
 *
 *   record (rec_size bytes, a multiple of 64):
 *     struct hnsw_rec_hdr  (16 bytes)
 *       u32 seq              seqlock word: even = stable, odd = a writer holds the record
 *                            (a build writes 0)
 *       u16 holder           CN id of the writer holding it (0 when free)
 *       u8  level            top level of the node (0 = level 0 only)
 *       u8  flags            HNSW_REC_*
 *       u32 n0               number of valid level-0 neighbours, <= 2M
 *       u32 crc              CRC32C of the body: n0, then bytes 16 .. rec_size
 *     u32 nbr0[2M]          level-0 neighbour ids, the first n0 valid
 *     u8  codes[code_bytes] neighbour code list (quantized codes of the 2M list slots, in
 *                           the quantizer's list layout; code_bytes = 0 without codes)
 *     f32 vec[dim]          at vec_off (16-aligned): the vector, pre-rotated by the index's
 *                           quantizer rotation when it has one (and normalised for cos)
 *     zero padding
 *
 * The first 8 bytes are the record's lock and seqlock word (DESIGN §4): a writer takes it
 * with one CAS, WRITEs the body and its CRC, releases with one WRITE of seq + 1; a reader
 * accepts a record only with an even seq and a matching CRC. The layout version and the
 * code kind live in the index metadata (image header, memory-node metadata), not here.
 *
 * Records of consecutive node ids are grouped in blocks of 2^block_shift records:
 * node id -> (block = id >> block_shift, slot = id & mask), record at block base +
 * slot * rec_size. Upper-level neighbour lists (levels >= 1, about 1/M of the nodes) live in
 * a separate small area that readers load whole:
 *
 *   upper area (u32 words): for each node with level >= 1, in increasing id order:
 *     id, level, then level lists of (1 + M) words: count, then M ids (unused = 0)
 */
#ifndef DM_HNSW_LAYOUT_H
#define DM_HNSW_LAYOUT_H

#include "dm.h"

/* Record layout version, kept in the index metadata; 1 was the 8-byte header without seq,
 * CRC and codes (refused by this version). */
#define HNSW_LAYOUT_VERSION 2u
#define HNSW_MAX_LEVEL   31u
#define HNSW_MAX_M       256u
#define HNSW_REC_ALIGN   64u

/* Record flags. */
#define HNSW_REC_DELETED 0x01u   /* tombstone: still traversed, never returned */

/* Kinds of neighbour codes (index metadata). */
enum hnsw_codes {
	HNSW_CODES_NONE = 0,     /* no code area: every neighbour is read to be scored */
	HNSW_CODES_RABITQ = 1,   /* RaBitQ 1-bit codes of v_rot - u_rot (common/quant) */
};

struct hnsw_rec_hdr {
	uint32_t seq;       /* even: stable; odd: held by a writer */
	uint16_t holder;    /* CN id of the holder */
	uint8_t level;
	uint8_t flags;      /* HNSW_REC_* */
	uint32_t n0;        /* number of valid level-0 neighbours, <= 2M */
	uint32_t crc;       /* CRC32C of n0 and bytes 16 .. rec_size */
};

_Static_assert(sizeof(struct hnsw_rec_hdr) == 16, "record header is 16 bytes on the wire");

/* Geometry of a record for given M, dim and code area size. */
static inline uint32_t hnsw_rec_nbr_off(void) { return sizeof(struct hnsw_rec_hdr); }
static inline uint32_t hnsw_rec_code_off(uint32_t M) { return hnsw_rec_nbr_off() + 8u * M; }
static inline uint32_t hnsw_rec_vec_off(uint32_t M, uint32_t code_bytes)
{
	return DM_ALIGN_UP(hnsw_rec_code_off(M) + code_bytes, 16u);
}
static inline uint32_t hnsw_rec_size(uint32_t M, uint32_t dim, uint32_t code_bytes)
{
	return DM_ALIGN_UP(hnsw_rec_vec_off(M, code_bytes) + 4u * dim, HNSW_REC_ALIGN);
}

static inline const uint32_t *hnsw_rec_nbrs(const struct hnsw_rec_hdr *r)
{
	return (const uint32_t *)((const char *)r + hnsw_rec_nbr_off());
}

static inline const uint8_t *hnsw_rec_codes(const struct hnsw_rec_hdr *r, uint32_t M)
{
	return (const uint8_t *)r + hnsw_rec_code_off(M);
}

static inline const float *hnsw_rec_vec(const struct hnsw_rec_hdr *r, uint32_t vec_off)
{
	return (const float *)((const char *)r + vec_off);
}

/* CRC32C (Castagnoli) of len bytes continuing from crc (0 to start); SSE4.2 instruction
 * when compiled for it (x86-64-v2), a table otherwise. */
uint32_t hnsw_crc32c(uint32_t crc, const void *p, size_t len);

/* CRC of a record's body (n0 and bytes 16 .. rec_size). */
static inline uint32_t hnsw_rec_crc(const struct hnsw_rec_hdr *r, uint32_t rec_size)
{
	uint32_t c = hnsw_crc32c(0, &r->n0, sizeof(r->n0));
	return hnsw_crc32c(c, (const char *)r + sizeof(*r), rec_size - sizeof(*r));
}

/* A record at rest: stable (even seq) and intact (images, a writer's lock test). */
static inline bool hnsw_rec_stable(const struct hnsw_rec_hdr *r, uint32_t rec_size)
{
	return !(r->seq & 1u) && hnsw_rec_crc(r, rec_size) == r->crc;
}

/* A remote reader's acceptance test of a record it READ: intact, whatever seq says. A
 * writer changes only the body (and its CRC) while it holds the lock, so a held record
 * whose CRC matches is a whole old or new version; a torn one fails the CRC and is read
 * again. This keeps a record readable when its writer died holding the lock. */
static inline bool hnsw_rec_intact(const struct hnsw_rec_hdr *r, uint32_t rec_size)
{
	return hnsw_rec_crc(r, rec_size) == r->crc;
}

/* Salvage record r (node id self) that stays torn after its writer died holding it (a
 * lease passed): a back-link WRITE changes only n0, one list slot, its code and the CRC
 * (the vector and level are rewritten with the bytes they had), so a torn copy is a mix of
 * the old and the new values of those fields. Level and n0 must be in range (else false:
 * garbage, not a torn back-link); a list id outside 0 .. cap-1 (a slot half written) is
 * replaced by self, which every search has visited already; the CRC is recomputed. */
static inline bool hnsw_rec_salvage(struct hnsw_rec_hdr *r, uint32_t M, uint32_t rec_size,
				    uint32_t cap, uint32_t self)
{
	uint32_t *ids = (uint32_t *)((char *)r + hnsw_rec_nbr_off());

	if (r->level > HNSW_MAX_LEVEL || r->n0 > 2u * M || self >= cap)
		return false;
	for (uint32_t i = 0; i < r->n0; i++)
		if (ids[i] >= cap)
			ids[i] = self;
	r->crc = hnsw_rec_crc(r, rec_size);
	return true;
}

/* Words of one upper-level list, and of a whole upper-area entry of a node of level L. */
static inline uint32_t hnsw_up_list_words(uint32_t M) { return 1u + M; }
static inline uint32_t hnsw_up_entry_words(uint32_t M, uint32_t level)
{
	return 2u + level * hnsw_up_list_words(M);
}

#endif
