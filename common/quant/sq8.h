/* sq8.h: 8-bit scalar quantizer (SQ8): every dimension i of a vector is stored as one byte
 * c_i with x_i ~= lo_i + step_i * c_i, lo and step trained per dimension as the minimum and
 * (max - min) / 255 of a training set. Scores are computed against a float query without
 * decoding, in scalar, AVX2+FMA and AVX-512F kernels chosen with the distance kernels' ISA
 * (distance.h, DMANN_ISA).
 *
 * Error bound: for a training vector (or any vector inside the trained ranges) every
 * |x_i - x^_i| <= step_i / 2; values outside are clamped to the range.
 *
 * Scores follow the graph's kernels (hnsw_kernel_fn): l2 gives sum (q_i - x^_i)^2, ip and
 * cos give -sum q_i x^_i (cos expects normalised vectors, as the graph stores them).
 *
 * Thread-safety: a trained quantizer is read-only; encode, query preparation and scoring
 * may run from any number of threads. */
#ifndef DM_QUANT_SQ8_H
#define DM_QUANT_SQ8_H

#include "distance.h"

struct dm_sq8 {
	uint32_t dim;
	bool l2;            /* l2 scores, else negated inner products */
	float *lo;          /* dim minima */
	float *step;        /* dim steps (> 0) */
};

/* Score of a code against a prepared query (aux of dm_sq8_query). */
typedef float (*dm_sq8_fn)(const float *aux, const uint8_t *code, uint32_t dim);

/* Train on n vectors vecs[0..n) of dim floats for metric m. 0, -EINVAL (dim 0, a non-finite
 * value), -ENOMEM. n = 0 gives a quantizer of zero ranges (every code decodes to 0). */
int dm_sq8_train(struct dm_sq8 *sq, enum dm_metric m, uint32_t dim, const float *const *vecs,
		 uint32_t n);
void dm_sq8_fini(struct dm_sq8 *sq);

/* Code of x (dim bytes). */
void dm_sq8_encode(const struct dm_sq8 *sq, const float *x, uint8_t *code);
/* Decoded vector of a code (dim floats), for tests and checks. */
void dm_sq8_decode(const struct dm_sq8 *sq, const uint8_t *code, float *x);

/* Floats of aux a query needs: dm_sq8_aux_len(dim). */
static inline size_t dm_sq8_aux_len(uint32_t dim)
{
	return 2 * (size_t)dim + 1;
}
/* Prepare query q (dim floats, normalised for cos) into aux. */
void dm_sq8_query(const struct dm_sq8 *sq, const float *q, float *aux);
/* The scoring kernel of sq's metric for the active ISA. */
dm_sq8_fn dm_sq8_kernel(const struct dm_sq8 *sq);

#endif
