/* hnsw_layout.h: the HNSW record layout. This is the disaggregated layout itself: the
 * memory nodes hold exactly these bytes and compute nodes read them with one-sided READs,
 * so every field has a fixed size and position (little-endian, no pointers).
 *
 *   record (rec_size bytes, a multiple of 64):
 *     struct hnsw_rec_hdr  (8 bytes: version, level, flags, n0)
 *     u32 nbr0[2M]          level-0 neighbour ids, the first n0 valid
 *     f32 vec[dim]          the vector (normalised for the cosine metric)
 *     zero padding
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

/* Layout version written in every record header; a reader refuses any other value (it is
 * also how a torn or garbage READ is recognised, together with the level/n0 bounds). */
#define HNSW_REC_VERSION 1u
#define HNSW_MAX_LEVEL   31u
#define HNSW_MAX_M       256u
#define HNSW_REC_ALIGN   64u

/* Record flags. */
#define HNSW_REC_DELETED 0x01u   /* tombstone: still traversed, never returned */

struct hnsw_rec_hdr {
	uint16_t version;   /* HNSW_REC_VERSION */
	uint8_t level;      /* top level of the node (0 = level 0 only) */
	uint8_t flags;      /* HNSW_REC_* */
	uint32_t n0;        /* number of valid level-0 neighbours, <= 2M */
};

_Static_assert(sizeof(struct hnsw_rec_hdr) == 8, "record header is 8 bytes on the wire");

/* Geometry of a record for given M and dim. */
static inline uint32_t hnsw_rec_nbr_off(void) { return sizeof(struct hnsw_rec_hdr); }
static inline uint32_t hnsw_rec_vec_off(uint32_t M) { return hnsw_rec_nbr_off() + 8u * M; }
static inline uint32_t hnsw_rec_size(uint32_t M, uint32_t dim)
{
	return DM_ALIGN_UP(hnsw_rec_vec_off(M) + 4u * dim, HNSW_REC_ALIGN);
}

static inline const uint32_t *hnsw_rec_nbrs(const struct hnsw_rec_hdr *r)
{
	return (const uint32_t *)((const char *)r + hnsw_rec_nbr_off());
}

static inline const float *hnsw_rec_vec(const struct hnsw_rec_hdr *r, uint32_t M)
{
	return (const float *)((const char *)r + hnsw_rec_vec_off(M));
}

/* Words of one upper-level list, and of a whole upper-area entry of a node of level L. */
static inline uint32_t hnsw_up_list_words(uint32_t M) { return 1u + M; }
static inline uint32_t hnsw_up_entry_words(uint32_t M, uint32_t level)
{
	return 2u + level * hnsw_up_list_words(M);
}

#endif
