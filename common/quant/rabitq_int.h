/* rabitq_int.h: internals shared by rabitq.c (quantizer, lists) and rabitq_scan.c
 * (per-query context, FastScan estimators). Not for users: include "quant/rabitq.h". */
#ifndef DM_QUANT_RABITQ_INT_H
#define DM_QUANT_RABITQ_INT_H

#include "rabitq.h"

#include <string.h>

#define RBQ_ROUNDS   4u   /* sign flip + FWHT (+ Kac step) rounds of the rotation */
#define RBQ_ROT_FHT_KAC 1u /* rotation kind in the serialised form */

struct rbq {
	uint32_t version;  /* serialised format: 1 = tables per expansion, 2 = per query */
	uint32_t dim;      /* original dimension */
	uint32_t D;        /* padded dimension, multiple of 64 */
	uint32_t L;        /* largest power of two <= D: the FWHT window */
	uint64_t seed;
	uint8_t *bits;     /* RBQ_ROUNDS * D/8 bytes: sign bit (1 = flip) of dim i, round t
			      at bit i of bits[t * D/8 ...] (LSB first) */
	float *sign;       /* RBQ_ROUNDS * D floats: +1 / -1 from bits */
	float *center;     /* format 2: D floats, the rotated centre c (sample mean); NULL in 1 */
};

/* Geometry of a list of cap slots. */
static inline uint32_t rbq_nblocks(uint32_t cap) { return (cap + RBQ_BLOCK - 1) / RBQ_BLOCK; }
/* Bytes of one block of 32 codes: D/4 groups of 16 bytes. */
static inline size_t rbq_block_bytes(const struct rbq *q) { return (size_t)q->D * 4u; }
static inline size_t rbq_norm_off(const struct rbq *q, uint32_t cap)
{
	return rbq_nblocks(cap) * rbq_block_bytes(q);
}
static inline size_t rbq_ipob_off(const struct rbq *q, uint32_t cap)
{
	return rbq_norm_off(q, cap) + 4u * (size_t)cap;
}

/* Format 2: f32 w[cap] = <o_bar, u - c> of each slot. */
static inline size_t rbq_w_off(const struct rbq *q, uint32_t cap)
{
	return rbq_ipob_off(q, cap) + 4u * (size_t)cap;
}

/* Unaligned little-endian float access (lists may sit at any offset of a record). */
static inline float rbq_ldf(const uint8_t *p)
{
	float f;
	memcpy(&f, p, 4);
	return f;
}
static inline void rbq_stf(uint8_t *p, float f) { memcpy(p, &f, 4); }

#endif
