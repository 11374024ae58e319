/* distance.h: distance kernels. Squared L2, inner product and cosine over float32, with
 * AVX-512 / AVX2+FMA / scalar implementations chosen once at run time from the CPU's
 * features; batched distances (many queries x many vectors) through OpenBLAS sgemm.
 *
 * Conventions: every "distance" is smaller-is-closer.
 *   l2:  sum (a_i - b_i)^2            (squared, no sqrt)
 *   ip:  -sum a_i b_i                 (negated inner product)
 *   cos: 1 - a.b / (|a| |b|)          (0 for identical directions; callers usually
 *                                      normalise once and use ip + 1 instead)
 */
#ifndef DM_DISTANCE_H
#define DM_DISTANCE_H

#include "dm.h"

enum dm_metric { DM_METRIC_L2 = 0, DM_METRIC_IP = 1, DM_METRIC_COS = 2 };

typedef float (*dm_dist_fn)(const float *a, const float *b, size_t dim);

/* Raw kernels of the best ISA available (selected on first use). */
float dm_l2sq(const float *a, const float *b, size_t dim);
float dm_dot(const float *a, const float *b, size_t dim);
float dm_norm(const float *a, size_t dim);          /* sqrt(dot(a,a)) */

/* Distance of a metric as defined above. */
float dm_distance(enum dm_metric m, const float *a, const float *b, size_t dim);
/* Function pointer for the hot path (no switch per call). For COS it returns the
 * IP distance + 1, i.e. it expects both vectors normalised. */
dm_dist_fn dm_dist_fn_for(enum dm_metric m);

/* Normalise v in place to unit length; returns -EINVAL for a zero or non-finite vector. */
int dm_normalize(float *v, size_t dim);

/* Name of the ISA the kernels use ("avx512", "avx2", "scalar"); DMANN_ISA=scalar|avx2|avx512
 * in the environment forces a lower one (for tests). */
const char *dm_kernel_isa(void);
/* Force an ISA for tests: 0 or -ENOTSUP if the CPU lacks it. */
int dm_kernel_set_isa(const char *isa);

/* Batched: out[i*nb + j] = distance(q_i, b_j) for nq queries and nb vectors, through
 * OpenBLAS sgemm (norms computed once). bnorm2 may be NULL or the precomputed squared norms
 * of b. For COS, vectors need not be normalised. */
void dm_distance_batch(enum dm_metric m, const float *q, size_t nq, const float *b,
		       size_t nb, size_t dim, const float *bnorm2, float *out);

/* For the node processes (dmann-cn, dmann-mn, dmann-s3): one OpenBLAS thread per sgemm
 * call unless OPENBLAS_NUM_THREADS is set in the environment. A node runs its own worker
 * threads, and OpenBLAS's pool, sized to the cores, keeps its workers spinning on
 * sched_yield for about 0.1 s after each call: an oracle fit paced to 25% of a CPU took
 * 127% of one that way (0.45 s of process CPU against 0.11 s of the fitting thread, 6161 x
 * 100, k = 96) and slowed every query of its node; and the pool's threads, started with
 * the process, spin until they time out even then, so they are stopped (OpenBLAS's
 * blas_thread_shutdown_). Returns the thread count in effect. Call once at start, before
 * other threads. The dmann CLI calls it too, but for the commands that run large sgemms. */
int dm_blas_node_threads(void);

enum dm_metric dm_metric_from_name(const char *s, bool *ok);
const char *dm_metric_name(enum dm_metric m);

#endif
