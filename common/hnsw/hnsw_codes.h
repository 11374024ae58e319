/* hnsw_codes.h: the neighbour codes of the HNSW records, over the RaBitQ quantizer of
 * common/quant (internal to common/hnsw; the index and the compute node hold a struct
 * hnsw_quant, the search a struct hnsw_qest per query).
 *
 * A node u's record holds, next to its level-0 ids, the code list of its 2M slots: the
 * code of neighbour v in slot j is the RaBitQ code of v_rot - u_rot, so it depends only on
 * (v, u, the quantizer) and an online insert can write it next to the id. Expanding u
 * prepares the query against u (q_rot - u_rot) once and then estimates every slot of the
 * list in one SIMD pass. Estimates are in the graph's raw score units (l2 squared, or
 * -dot for ip/cos) so that they compare with exact scores. */
#ifndef DM_HNSW_CODES_H
#define DM_HNSW_CODES_H

#include "hnsw.h"

/* Rows the quantizer is trained on (the first ones of the data). */
#define HNSW_QUANT_TRAIN_ROWS 10000u

/* Train the quantizer of an index of dim dimensions on n rows (already normalised for cos).
 * NULL + errno, message in err. */
struct hnsw_quant *hnsw_quant_train(const float *rows, uint32_t n, uint32_t dim,
				    enum dm_metric metric, uint64_t seed, char *err, size_t errlen);
void hnsw_quant_free(struct hnsw_quant *q);

/* Bytes of the code list of a record (2M slots). */
uint32_t hnsw_quant_list_bytes(const struct hnsw_quant *q, uint32_t M);
/* Floats of a stored (rotated, padded) vector: the quantizer's D >= dim. */
uint32_t hnsw_quant_vdim(const struct hnsw_quant *q);

/* out (vdim floats) = R in (dim floats, zero-padded); and the inverse: out (vdim floats,
 * the first dim the original vector) from a stored one. */
void hnsw_quant_rotate(const struct hnsw_quant *q, const float *in, float *out);
void hnsw_quant_unrotate(const struct hnsw_quant *q, const float *in, float *out);

/* Encode the code list of u (rotated vector u_rot) for its n neighbours v_rot[0..n) into
 * list (hnsw_quant_list_bytes bytes, the 2M slots; slots >= n zeroed). */
void hnsw_quant_encode_list(const struct hnsw_quant *q, uint32_t M, const float *u_rot,
			    const float *const *v_rot, uint32_t n, uint8_t *list);

/* Write the code of neighbour v_rot into slot (< 2M) of u's list, touching only that slot
 * (an online insert under the record's lock); and copy slot src to slot dst. */
void hnsw_quant_set_slot(const struct hnsw_quant *q, uint32_t M, uint8_t *list, uint32_t slot,
			 const float *u_rot, const float *v_rot);
void hnsw_quant_move_slot(const struct hnsw_quant *q, uint32_t M, uint8_t *list, uint32_t dst,
			  uint32_t src);

/* Serialised quantizer (the index metadata / image carries it). */
size_t hnsw_quant_blob_size(const struct hnsw_quant *q);
void hnsw_quant_blob(const struct hnsw_quant *q, void *out);
/* Parse and validate a blob for an index of (dim, metric, M) whose code area is
 * code_bytes: NULL + errno (EINVAL) with a message on any inconsistency. */
struct hnsw_quant *hnsw_quant_from_blob(const void *blob, size_t len, uint32_t dim,
					enum dm_metric metric, uint32_t M, uint32_t code_bytes,
					char *err, size_t errlen);

/* A copy of q that outlives it (the router unrotates a sample after it let go of the index
 * view that owns q). NULL + errno. */
struct hnsw_quant *hnsw_quant_dup(const struct hnsw_quant *q);

/* Per-query estimator state (owned by one thread; bound to one quantizer and M). */
struct hnsw_qest;
struct hnsw_qest *hnsw_qest_new(const struct hnsw_quant *q, uint32_t M);
void hnsw_qest_free(struct hnsw_qest *e);
/* Whether e serves quantizer q with lists of 2M slots. */
bool hnsw_qest_fits(const struct hnsw_qest *e, const struct hnsw_quant *q, uint32_t M);
/* Start a query: q_rot (rotated, kept by pointer until the next call) is the query every
 * hnsw_qest_list scores against until the next hnsw_qest_query. With a format-2 quantizer
 * (or ip) this builds the look-up tables once for the whole query. */
void hnsw_qest_query(struct hnsw_qest *e, const float *q_rot);
/* Estimate the raw scores of the n first slots of u's code list for the query of
 * hnsw_qest_query (u_rot: u's stored vector, d_qu: the exact raw score of u) into
 * est[0..n), and their lower bounds into lb (may be NULL). */
void hnsw_qest_list(struct hnsw_qest *e, const float *u_rot, float d_qu, const uint8_t *list,
		    uint32_t n, float *est, float *lb);

#endif
