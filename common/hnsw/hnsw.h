/* hnsw.h: the HNSW graph index (Malkov & Yashunin, "Efficient and robust approximate nearest
 * neighbor search using Hierarchical Navigable Small World graphs", TPAMI 2018).
 *
 * The index stores its nodes in the disaggregated record layout of hnsw_layout.h (blocks of
 * fixed-size records + a small upper-level area), so the bytes built here are the bytes the
 * memory nodes serve. Files by phase:
 *   hnsw_build.c   multi-threaded offline build (levels, vectors, parallel inserts)
 *   hnsw_insert.c  INSERT (Algorithm 1), SEARCH-LAYER for construction (Algorithm 2),
 *                  SELECT-NEIGHBORS-HEURISTIC (Algorithm 4)
 *   hnsw_search.c  K-NN-SEARCH (Algorithm 5) over a record source (struct hnsw_src)
 *   hnsw_util.c    allocation, distance kernels, visited set, heaps
 *   hnsw_codes.c   neighbour codes: the index's quantizer (common/quant RaBitQ), filling
 *                  the code lists after a build, the per-expansion estimator
 *   hnsw_l0.h      the level-0 search with codes shared by hnsw_search and hnsw_query
 *   hnsw_image.c   index image file (save/load, checksums, validation)
 *
 * Distances follow distance.h (smaller is closer; l2 squared, ip negated, cos = 1 - cos).
 * For the cosine metric the stored vectors and the queries are normalised and scored by
 * inner product. With codes the stored vectors are pre-rotated by the quantizer's
 * orthogonal rotation (distances unchanged) and queries are rotated once per search.
 */
#ifndef DM_HNSW_H
#define DM_HNSW_H

#include "dm.h"
#include "distance.h"
#include "topk.h"
#include "hnsw_layout.h"

#include <pthread.h>

#define HNSW_DEFAULT_M           16u
#define HNSW_DEFAULT_EFC         200u
#define HNSW_DEFAULT_BLOCK_SHIFT 12u   /* 4096 records per block */

struct hnsw_params {
	uint32_t dim;
	enum dm_metric metric;
	uint32_t M;               /* links per node on levels >= 1; 2M on level 0 */
	uint32_t ef_construction;
	uint64_t seed;            /* level draws */
	uint32_t block_shift;     /* log2(records per block), 6..20 */
	enum hnsw_codes codes;    /* neighbour codes (HNSW_CODES_NONE: no code area) */
};

struct hnsw_quant;           /* the index's quantizer (hnsw_codes.c) */
struct hnsw_upq;             /* upper-level descent codes (hnsw_upq.h) */

/* Distance kernel used by the graph: the raw score (l2sq, or -dot for ip/cos). */
typedef float (*hnsw_kernel_fn)(const float *a, const float *b, size_t dim);

struct hnsw_index {
	struct hnsw_params p;
	uint32_t n;               /* nodes 0..n-1 present */
	uint32_t rec_size;
	uint32_t code_bytes;      /* code area of a record (0 without codes) */
	uint32_t vec_off;         /* vector offset in a record */
	uint32_t vdim;            /* floats of a stored vector: dim, or the quantizer's padded
				     dimension D (rotated vectors) */
	struct hnsw_quant *quant; /* NULL without codes */
	struct hnsw_upq *upq;     /* with codes: SQ8 codes of the upper-level nodes (derived from
				     the records by hnsw_upq_attach, not stored in the image) */
	uint32_t nblocks;
	uint8_t **blocks;         /* nblocks bases of (1 << block_shift) records (the last one
				     only as many as exist) */
	uint32_t **upl;           /* per node: its upper lists (level * (1+M) words), or NULL */
	uint32_t *up_store;       /* storage behind upl (one allocation) */
	size_t up_words;          /* words in up_store */
	uint32_t entry;           /* entry point (valid when max_level >= 0) */
	int max_level;            /* -1 when empty */
	uint32_t *labels;         /* NULL, or n labels: node id -> the row of the vector file it
				     was built from (hnsw_build_ordered: nodes numbered in another
				     order, e.g. VHash key order); a permutation of 0..n-1 */
	hnsw_kernel_fn kern;
	/* build-time state */
	uint8_t *locks;           /* one spinlock byte per node */
	pthread_mutex_t glock;    /* entry point / max level */
};

/* Check params (dim, M, metric, efc, block_shift); 0 or -EINVAL with a message in err. */
int hnsw_params_check(const struct hnsw_params *p, char *err, size_t errlen);

/* Allocate an empty index with room for n nodes (records zeroed). With quant (codes), the
 * records have its code area and rotated vectors, and the index owns quant on success (on
 * failure the caller still does). NULL + errno. */
struct hnsw_index *hnsw_alloc(const struct hnsw_params *p, uint32_t n, struct hnsw_quant *quant);
void hnsw_free(struct hnsw_index *idx);

/* With codes: (re)build idx->upq from the stored vectors of the nodes of level >= 1 (a
 * search then descends the upper levels on them); without codes a no-op. Called by
 * hnsw_build and hnsw_load; call again after the upper levels changed. 0 or -ENOMEM. */
int hnsw_upq_attach(struct hnsw_index *idx);

/* Record of node id (local index). */
static inline struct hnsw_rec_hdr *hnsw_rec(const struct hnsw_index *idx, uint32_t id)
{
	uint32_t mask = (1u << idx->p.block_shift) - 1;
	return (struct hnsw_rec_hdr *)(idx->blocks[id >> idx->p.block_shift] +
				       (size_t)(id & mask) * idx->rec_size);
}

/* Upper list of node id at level l >= 1: word 0 is the count, then M ids. */
static inline uint32_t *hnsw_up_list(const struct hnsw_index *idx, uint32_t id, uint32_t l)
{
	return idx->upl[id] + (size_t)(l - 1) * hnsw_up_list_words(idx->p.M);
}

/* Level drawn for node id: floor(-ln(U) * mL), mL = 1/ln(M), U from (seed, id). Pure
 * function, so a build is deterministic whatever the insertion order. */
uint32_t hnsw_draw_level(uint64_t seed, uint32_t id, uint32_t M);

/* Best raw kernel for the metric on this CPU (AVX+FMA when available). */
hnsw_kernel_fn hnsw_kernel_for(enum dm_metric m);
/* Convert a raw kernel score into the metric's distance (adds 1 for cosine). */
static inline float hnsw_score_to_dist(enum dm_metric m, float s)
{
	return m == DM_METRIC_COS ? s + 1.0f : s;
}

/* ---- build (hnsw_build.c) --------------------------------------------------------------- */

/* Progress callback: called from the build threads with the number of nodes inserted. */
typedef void (*hnsw_progress_fn)(void *arg, uint64_t done);

/* Build an index over n row-major vectors with nthreads threads. With nthreads == 1 the
 * result depends only on (params, data). For cos, vectors are normalised (a zero vector is
 * an error). With codes: the quantizer is trained on the first rows (seeded by p->seed),
 * vectors are stored rotated, the graph is built with exact distances, then every node's
 * code list is filled (nthreads threads). Every record's CRC is set, seq = 0. NULL +
 * errno on failure, with a message in err. */
struct hnsw_index *hnsw_build(const struct hnsw_params *p, const float *data, uint32_t n,
			      unsigned nthreads, hnsw_progress_fn progress, void *parg,
			      char *err, size_t errlen);

/* The same with the nodes numbered in another order: node i holds row labels[i] of data
 * (labels a permutation of 0..n-1, copied into idx->labels and saved with the image).
 * Everything else is as hnsw_build over the rows in file order: the quantizer is trained on
 * the first rows of data, a node's level is drawn from its label, and the nodes are
 * inserted in row order; so with one thread the graph is the one hnsw_build makes over
 * data, its node ids renamed (node i of this one is node labels[i] of that one). NULL +
 * errno (EINVAL for labels that are not a permutation, message in err). */
struct hnsw_index *hnsw_build_ordered(const struct hnsw_params *p, const float *data,
				      uint32_t n, const uint32_t *labels, unsigned nthreads,
				      hnsw_progress_fn progress, void *parg, char *err,
				      size_t errlen);

/* The label of node id: the row of the vector file it was built from (id itself without a
 * label map, and for ids past the map: nodes online inserts added). */
static inline uint64_t hnsw_label(const uint32_t *labels, uint32_t nlabels, uint64_t id)
{
	return labels && id < nlabels ? labels[id] : id;
}

/* ---- insert (hnsw_insert.c) ------------------------------------------------------------- */

struct hnsw_scratch;   /* per-thread construction/search scratch */
struct hnsw_scratch *hnsw_scratch_new(uint32_t nodes, uint32_t M, uint32_t ef);
void hnsw_scratch_free(struct hnsw_scratch *s);

/* Algorithm 1: link node id (its record already holds vector and level) into the graph.
 * Thread-safe against concurrent inserts of other ids. */
void hnsw_insert(struct hnsw_index *idx, struct hnsw_scratch *s, uint32_t id);

/* ---- search (hnsw_search.c) ------------------------------------------------------------- */

/* A source of records. Local indexes read their blocks directly (blocks != NULL, the
 * inline fast path); a remote reader (the compute node) sets blocks = NULL and provides
 * fetch (make the records of a batch of ids available: one doorbell of READs, cache
 * lookups...) and get (the validated record of an id, or NULL). hnsw_search calls get for
 * ids of the last batch and for candidates it expands later (fetched in earlier batches of
 * the same query), so its get must serve those too (e.g. from the cache); a reader that
 * keeps only the last batch uses the resumable hnsw_query.h instead. */
struct hnsw_src {
	uint32_t dim, M, rec_size, block_shift, n;
	uint32_t vec_off;             /* vector offset in a record */
	uint32_t vdim;                /* floats of a stored vector (kernel length) */
	enum dm_metric metric;
	const struct hnsw_quant *quant;   /* neighbour codes, or NULL: exact scoring */
	uint8_t *const *blocks;
	uint32_t *const *upl;         /* upper lists, always local */
	const float *const *uvec;     /* optional: local stored vectors of the nodes of level >= 1
					 (NULL entries for the others); with it the resumable
					 query descends the upper levels without fetching */
	const struct hnsw_upq *upq;   /* optional, with codes only: the upper-level descent on
					 SQ8 codes (local search and resumable query alike) */
	uint32_t entry;
	int max_level;
	/* with upq: the search list size on level 1 (hnsw_upq.h); 0 or 1: the greedy descent of
	 * the paper and hnswlib, E (2..HNSW_EF_UPPER_MAX): SEARCH-LAYER with ef = E there and
	 * its best ceil(E / 4) nodes (at most 16) seed level 0. No effect without upq. */
	uint32_t ef_upper;
	/* optional: held for reading while the upper levels (upl, uvec, upq) are read, when a
	 * writer may change them meanwhile (a compute node's online upper levels) */
	pthread_rwlock_t *uplock;
	int (*fetch)(struct hnsw_src *s, const uint32_t *ids, size_t nids);
	const struct hnsw_rec_hdr *(*get)(struct hnsw_src *s, uint32_t id);
	void *ctx;
	/* counters (per source): hops = expanded nodes, dist_evals = exact distances,
	 * est_evals = code estimates */
	uint64_t hops, dist_evals, est_evals;
};

/* ef_upper: the default of local sources (hnsw_src_local) and compute nodes, and its bound.
 * 64: the worst case of level-0 expansions (a remote query's READs) near the p99 on the
 * SPACEV-shaped set (docs/benchmarks.md "The level-1 search list"); level 1 is local CPU. */
#define HNSW_EF_UPPER_DEFAULT 64u
#define HNSW_EF_UPPER_MAX 256u

/* The one accessor the search uses to read a record. */
static inline const struct hnsw_rec_hdr *hnsw_get(struct hnsw_src *s, uint32_t id)
{
	if (dm_likely(s->blocks != NULL)) {
		uint32_t mask = (1u << s->block_shift) - 1;
		return (const struct hnsw_rec_hdr *)(s->blocks[id >> s->block_shift] +
						     (size_t)(id & mask) * s->rec_size);
	}
	return s->get(s, id);
}

/* A local source over idx. */
void hnsw_src_local(const struct hnsw_index *idx, struct hnsw_src *src);

struct hnsw_searcher;  /* per-thread query scratch: visited tags, heaps, batch buffer */
struct hnsw_searcher *hnsw_searcher_new(uint32_t nodes, uint32_t dim);
void hnsw_searcher_free(struct hnsw_searcher *s);

/* Algorithm 5: the k nearest of q (ef >= k candidates on level 0). Writes up to k hits,
 * ascending, into out; returns their number or -errno (-EIO when a remote fetch fails,
 * -EINVAL for a zero query under cos). */
int hnsw_search(struct hnsw_src *src, struct hnsw_searcher *s, const float *q, size_t k,
		size_t ef, struct dm_hit *out);
/* The same with beam b >= 1: with codes, each step expands the best b unexpanded
 * candidates (one fetch of b records; b = 1 is hnsw_search). Without codes b is ignored. */
int hnsw_search_b(struct hnsw_src *src, struct hnsw_searcher *s, const float *q, size_t k,
		  size_t ef, uint32_t b, struct dm_hit *out);

/* ---- image (hnsw_image.c) --------------------------------------------------------------- */

/* Write the index image to path (path.tmp, fsync, rename). 0 or -errno (message in err). */
int hnsw_save(const struct hnsw_index *idx, const char *path, char *err, size_t errlen);
/* The upper area of idx in the layout of hnsw_layout.h (as images and index metadata hold
 * it): *words u32 words, malloc'ed (free()); NULL + errno. */
uint32_t *hnsw_upper_serialize(const struct hnsw_index *idx, uint64_t *words);
/* Read and validate an image; a truncated or corrupted file is refused (NULL, errno =
 * EINVAL/EIO...) with a message naming the file and the problem in err. */
struct hnsw_index *hnsw_load(const char *path, char *err, size_t errlen);

/* Structural check of a whole index (record seq and CRC, levels, counts, id bounds, upper
 * lists); 0 or -EINVAL with a message. */
int hnsw_validate(const struct hnsw_index *idx, char *err, size_t errlen);

#endif
