/* rabitq.h: RaBitQ neighbour codes for "one READ per hop" (DESIGN.md §4): a per-index
 * quantizer (a random orthogonal rotation) and, per adjacency list, 1-bit codes of the
 * neighbours' residuals laid out for FastScan, so that expanding node u scores all its listed
 * neighbours v from u's record alone, with an error bound usable for pruning.
 *
 * RaBitQ: J. Gao, C. Long, "RaBitQ: Quantizing High-Dimensional Vectors with a Theoretical
 * Error Bound for Approximate Nearest Neighbor Search", SIGMOD 2024; used per adjacency list
 * (code of v relative to u) as in SymphonyQG (Gou et al., SIGMOD 2025) and NGT-QG.
 *
 * Why RaBitQ and not 4-bit PQ FastScan:
 *   - an error bound per estimate (Theorem 3.2 of the paper), so a search can skip a
 *     neighbour whose lower bound exceeds its current worst result without ever reading it;
 *   - no codebook training: the quantizer is a seeded random rotation, data-independent,
 *     so it never goes stale when the data drifts and needs no retraining;
 *   - the code of v in u's list depends only on (u, v, quantizer), so an online insert
 *     computes the codes it writes from the two vectors it already has (the residual
 *     v - u), and a list that drops or reorders neighbours moves codes without recomputing.
 *
 * Model. D = dim rounded up to a multiple of 64; vectors are zero-padded to D and rotated
 * by the quantizer's orthogonal P (which keeps L2 distances and inner products; a seeded
 * structured rotation, sign flips + Walsh-Hadamard + Kac steps, see rabitq.c). The graph
 * stores vectors PRE-ROTATED (D floats, rbq_rotate); a query is rotated once. For the cosine
 * metric the caller normalises vectors (and the query) before rotating them.
 *
 * Code of neighbour v in u's list: r = v_rot - u_rot, o = r / |r|, x_b = sign bits of o
 * (D bits), o_bar = (2 x_b - 1) / sqrt(D), and two floats: |r| and <o_bar, o>.
 * For a query and a residual q' (below), RaBitQ's unbiased estimator
 *     <q', r> ~= |r| <o_bar, q'> / <o_bar, o>
 * has, with high probability, an error at most
 *     eps0 * |r| * |q'| * sqrt((1 - <o_bar,o>^2) / <o_bar,o>^2) / sqrt(D - 1)
 * (eps0 = 1.9 by default, the paper's value). The error is close to N(0, sigma^2) with
 * sigma = bound / eps0, so eps0 is a number of standard deviations: measured on Gaussian-
 * mixture data (test_rabitq, dims 128/384/784, l2/ip/cos) the exact value lies in
 * [est - bound, est + bound] for 94-96% of estimates at eps0 = 1.9, 99.1-99.5% at 2.6 and
 * 99.8-99.9% at 3.0; above the lower end alone (what pruning relies on) for ~97% at 1.9.
 * Fashion-MNIST (u a base row, v its 32 nearest rows, l2): 95.8%, 99.5%, 99.9%; 97.9%.
 * Choose eps0 per context (rbq_qctx_set_eps0) for the pruning risk wanted. The reported
 * bound also carries a term for the rounding of the u8 tables (below), eps0 times its
 * standard deviation; it is small next to RaBitQ's.
 * The distance of v then follows from the exact distance of u:
 *     l2:  q' = q - u   |q-v|^2 = |q-u|^2 + |r|^2 - 2 <q', r>        (bound x 2)
 *     cos: q' = q - u   1-<q,v> = 1-<q,u> + |r|^2/2 - <q', r>        (unit vectors, so
 *                                                   <u, r> = -|r|^2/2 exactly)
 *     ip:  q' = q       -<q,v>  = -<q,u> - <q', r>                   (<q,v> = <q,u> + <q,r>)
 * <o_bar, q'> is computed with FastScan: a vector x is turned into one 16-entry u8 look-up
 * table per 4 dimensions (LUT entries quantised with one scale and a per-table bias), the
 * codes of 32 neighbours are interleaved by 4-dimension groups, and one vpshufb per group
 * scores them all.
 * Format 2 (what rbq_train makes): the quantizer holds a centre c (the rotated mean of the
 * training sample, 0 without one) and each slot a third float w = <o_bar, u - c>, so that
 *     <o_bar, q - u> = <o_bar, q - c> - w
 * and the tables are built ONCE PER QUERY from x = q - c (l2, cos) or x = q (ip) instead
 * of once per expansion from q - u: rbq_prep costs ~3.5x a list estimate, so per-expansion
 * tables were most of the estimator's time. The price is a coarser table scale (the range
 * of q - c instead of q - u), part of the bound's table-rounding term, and 4 bytes per slot.
 * Format 1 (images built before; rbq_train_v1): tables per expansion from x = q - u, two
 * floats per slot. rbq_prep_per_query says which applies.
 *
 * List layout (rbq_list_bytes(cap) bytes, any alignment, 64 recommended), little-endian:
 *     codes:   ceil(cap/32) blocks of D/4 groups x 16 bytes; in block b, group g, byte j
 *              (j < 16): low nibble = dims 4g..4g+3 of slot 32b+j (bit k = dim 4g+k),
 *              high nibble = the same dims of slot 32b+16+j
 *     f32 norm[cap]     |r| of each slot
 *     f32 ip_ob[cap]    <o_bar, o> of each slot
 *     f32 w[cap]        format 2 only: <o_bar, u - c> of each slot
 * A list holds no validity state: the caller knows how many slots are filled (n0). Any bytes
 * are safe to estimate over (garbage gives garbage numbers, never a fault).
 *
 * SIMD: the table build and the accumulation loop have AVX-512BW, AVX2 and scalar versions
 * chosen once at run time (DMANN_ISA=scalar|avx2|avx512 forces a lower one, as for
 * distance.h). The tables are built with the same float operations in every version, the
 * integer LUT sums are exact, and the rest is shared SSE code (the x86-64-v2 baseline), so
 * every ISA gives bit-identical estimates.
 *
 * Cost (bench/quant_bench, AVX-512 machine, D = 832 for dim 784): rbq_rotate ~1.4 us per
 * query; rbq_prep ~0.29 us (format 1: per expansion; format 2: per query) and
 * rbq_list_estimate of 32 neighbours ~0.08 us, so an expansion costs ~0.36 us in format 1
 * and ~0.08 us in format 2, against ~0.88 us for 32 exact l2 distances over vectors the
 * search would first have to READ.
 *
 * Thread safety: a struct rbq is immutable after rbq_train/rbq_load and may be shared by any
 * number of threads; a struct rbq_qctx belongs to one thread at a time.
 *
 * Errors follow dm.h: int functions return 0 or -errno; constructors NULL + errno.
 */
#ifndef DM_QUANT_RABITQ_H
#define DM_QUANT_RABITQ_H

#include "dm.h"
#include "distance.h"

#define RBQ_MAX_DIM       4096u  /* largest dim (and padded dim D) supported */
#define RBQ_DIM_ALIGN     64u    /* D = dim rounded up to this */
#define RBQ_BLOCK         32u    /* slots per FastScan block */
#define RBQ_EPS0_DEFAULT  1.9f   /* confidence parameter of the error bound */

struct rbq;       /* the quantizer: immutable, shareable */
struct rbq_qctx;  /* per-thread, per-expansion scratch (LUT, residual, norms) */

/* ---- quantizer ------------------------------------------------------------------------ */

/* Train the quantizer of an index of dimension dim (1..RBQ_MAX_DIM) from a sample of its
 * first rows (nsample row-major vectors of dim floats; may be 0/NULL) with a fixed seed.
 * Deterministic: the same (dim, seed) gives identical bytes (rbq_save) on every machine
 * and ISA. RaBitQ's rotation is data-independent, so today the sample is only checked
 * (finite values; -EINVAL otherwise); it is part of the API so that a data-dependent
 * variant needs no caller change. NULL + errno (EINVAL, ENOMEM). */
struct rbq *rbq_train(uint32_t dim, const float *sample, size_t nsample, uint64_t seed);
/* The same quantizer in format 1 (no centre, tables per expansion): what images built
 * before format 2 carry; for tests of that path. */
struct rbq *rbq_train_v1(uint32_t dim, const float *sample, size_t nsample, uint64_t seed);
void rbq_free(struct rbq *q);

uint32_t rbq_dim(const struct rbq *q);         /* dim of the original vectors */
uint32_t rbq_dim_padded(const struct rbq *q);  /* D: floats of a rotated vector */
uint64_t rbq_seed(const struct rbq *q);
uint32_t rbq_version(const struct rbq *q);     /* serialised format, 1 or 2 */

/* Serialisation: rbq_save_size bytes, written by rbq_save (0, or -ENOSPC when len is too
 * small). rbq_load validates everything (magic, version, sizes, checksum: a fuzzable
 * loader) and returns 0 with *out set, -EINVAL for anything malformed or truncated, or
 * -ENOMEM. The format is little-endian and self-describing (see rabitq.c). */
size_t rbq_save_size(const struct rbq *q);
int rbq_save(const struct rbq *q, void *buf, size_t len);
int rbq_load(const void *buf, size_t len, struct rbq **out);

/* Rotate: x (dim floats) -> out (D floats), zero-padded then rotated by P. out may equal x
 * when the buffer holds D floats. */
void rbq_rotate(const struct rbq *q, const float *x, float *out);
/* Inverse: y (D floats, rotated) -> out (D floats; the first dim are the original vector,
 * the rest ~0). out may equal y. */
void rbq_unrotate(const struct rbq *q, const float *y, float *out);

/* ---- neighbour lists ------------------------------------------------------------------ */

/* Bytes of a list of cap slots (cap >= 1); a multiple of 4. */
size_t rbq_list_bytes(const struct rbq *q, uint32_t cap);
/* Zero a whole list (all codes and factors). */
void rbq_list_clear(const struct rbq *q, uint8_t *list, uint32_t cap);
/* Write the code and factors of slot (< cap) from u_rot and v_rot (D floats each, rotated);
 * touches only that slot's nibbles and floats (safe for online inserts into a live list,
 * given the caller's record lock: slots j and j+16 share bytes, so one writer per list).
 * A v equal to u gets |r| = 0 and estimates exactly. */
void rbq_list_set(const struct rbq *q, uint8_t *list, uint32_t cap, uint32_t slot,
		  const float *u_rot, const float *v_rot);
/* Copy slot src to slot dst of the same list (codes depend only on u and v, so pruning or
 * reordering a list needs no vector). */
void rbq_list_move(const struct rbq *q, uint8_t *list, uint32_t cap, uint32_t dst,
		   uint32_t src);

/* ---- estimation ----------------------------------------------------------------------- */

/* Per-thread context, preallocated for q (no allocation afterwards). NULL + errno. */
struct rbq_qctx *rbq_qctx_new(const struct rbq *q);
void rbq_qctx_free(struct rbq_qctx *ctx);
/* Confidence parameter of the bounds that rbq_list_estimate reports (default 1.9); 0 makes
 * lower == est. -EINVAL for a negative or non-finite value. */
int rbq_qctx_set_eps0(struct rbq_qctx *ctx, float eps0);

/* Prepare the expansion of node u for query q (both rotated, D floats): the vector x of
 * the tables (format 1: q - u for l2 and cos; format 2: q - c; ip: q), its norm and its
 * quantised FastScan LUT. 0, or -EINVAL (ctx of another quantizer, unknown metric,
 * non-finite input). When rbq_prep_per_query(q, m) (format 2, or ip) the tables do not
 * depend on u: one rbq_prep per query then serves every expansion (u_rot is not read and
 * may be NULL). */
bool rbq_prep_per_query(const struct rbq *q, enum dm_metric m);
int rbq_prep(const struct rbq *q, struct rbq_qctx *ctx, const float *q_rot,
	     const float *u_rot, enum dm_metric m);

/* Estimated distances of the first n (<= cap) slots of u's list, in distance.h's
 * convention for the metric given to rbq_prep (l2: squared L2; ip: -<q,v>; cos:
 * 1 - <q,v> of normalised vectors), written to est[0..n-1]; lower (may be NULL) gets
 * est - bound, the lower end of the error bound at the context's eps0 (the upper end is
 * est + bound = 2 est - lower). dist_qu is the exact distance of u to the query in the SAME
 * convention (|q-u|^2 for l2, -<q,u> for ip, 1 - <q,u> for cos), as the search has it
 * from u's full vector. Estimates are not clamped (an l2 estimate can be < 0). */
void rbq_list_estimate(const struct rbq *q, const struct rbq_qctx *ctx, const uint8_t *list,
		       uint32_t cap, uint32_t n, float dist_qu, float *est, float *lower);

/* ISA of the estimator kernels ("avx512", "avx2", "scalar"); rbq_set_isa forces one for
 * tests (0, -EINVAL unknown, -ENOTSUP when the CPU lacks it). Not thread-safe. */
const char *rbq_isa(void);
int rbq_set_isa(const char *isa);

#endif
