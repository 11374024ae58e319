/* hnsw_int.h: internals shared by the hnsw_*.c files: candidate heaps, the visited set with
 * epoch tags, node spinlocks, the quantizer interface (hnsw_codes.h). Not part of the public interface. */
#ifndef DM_HNSW_INT_H
#define DM_HNSW_INT_H

#include "hnsw.h"
#include "hnsw_codes.h"
#include "util/dm_heap.h"

#include <sched.h>
#include <stdatomic.h>
#include <string.h>

struct hnsw_cand {
	float d;
	uint32_t id;
};

/* Binary heap of candidates; min-heap or max-heap by the functions used on it. */
struct hnsw_heap {
	struct hnsw_cand *a;
	uint32_t n, cap;
};

int hnsw_heap_init(struct hnsw_heap *h, uint32_t cap);
void hnsw_heap_fini(struct hnsw_heap *h);
/* Grow so that at least need entries fit; 0 or -ENOMEM. */
int hnsw_heap_reserve(struct hnsw_heap *h, uint32_t need);

/* The sift rules of every HNSW heap (util/dm_heap.h): by distance only, so that the local
 * and the resumable searches visit nodes in the same order. They apply to any entry type
 * with a float field d (struct hnsw_cand here, struct hnsw_qcand in hnsw_query.c). */
#define HNSW_NEARER(p, q) ((p)->d < (q)->d)
#define HNSW_FARTHER(p, q) ((p)->d > (q)->d)
DM_HEAP_DEFINE(hnsw_minh, struct hnsw_cand, uint32_t, HNSW_NEARER)
DM_HEAP_DEFINE(hnsw_maxh, struct hnsw_cand, uint32_t, HNSW_FARTHER)

static inline void hnsw_minheap_push(struct hnsw_heap *h, float d, uint32_t id)
{
	hnsw_minh_push(h->a, &h->n, (struct hnsw_cand){ .d = d, .id = id });
}

static inline struct hnsw_cand hnsw_minheap_pop(struct hnsw_heap *h)
{
	return hnsw_minh_pop(h->a, &h->n);
}

static inline void hnsw_maxheap_push(struct hnsw_heap *h, float d, uint32_t id)
{
	hnsw_maxh_push(h->a, &h->n, (struct hnsw_cand){ .d = d, .id = id });
}

static inline struct hnsw_cand hnsw_maxheap_pop(struct hnsw_heap *h)
{
	return hnsw_maxh_pop(h->a, &h->n);
}

/* Insertion sort ascending by (d, id): for short lists (a neighbour list and one more). */
static inline void hnsw_sort_cands(struct hnsw_cand *a, uint32_t n)
{
	for (uint32_t i = 1; i < n; i++) {
		struct hnsw_cand x = a[i];
		uint32_t j = i;

		while (j > 0 && (a[j - 1].d > x.d || (a[j - 1].d == x.d && a[j - 1].id > x.id))) {
			a[j] = a[j - 1];
			j--;
		}
		a[j] = x;
	}
}

/* Algorithm 4: SELECT-NEIGHBORS-HEURISTIC, as hnswlib (no extension, no kept pruned
 * connections). c is sorted ascending by distance to the base element; a candidate is kept
 * only if it is nearer to the base than to every kept one; with at most M candidates all
 * are kept. vec(ctx, id) is a candidate's stored vector (dim floats). The one heuristic of
 * the offline build (hnsw_insert.c) and the online upper levels (hnsw_upper.c). */
static inline uint32_t hnsw_select_heuristic(const struct hnsw_cand *c, uint32_t nc,
					     uint32_t M, hnsw_kernel_fn kern, size_t dim,
					     const float *(*vec)(const void *ctx, uint32_t id),
					     const void *ctx, struct hnsw_cand *out)
{
	uint32_t n = 0;

	if (nc <= M) {
		memcpy(out, c, (size_t)nc * sizeof(*c));
		return nc;
	}
	for (uint32_t i = 0; i < nc && n < M; i++) {
		const float *v = vec(ctx, c[i].id);
		bool good = true;

		for (uint32_t j = 0; j < n && good; j++)
			good = kern(v, vec(ctx, out[j].id), dim) >= c[i].d;
		if (good)
			out[n++] = c[i];
	}
	return n;
}

/* Visited set: one 16-bit tag per node; a node is visited when its tag equals the current
 * epoch, so clearing between searches is one increment (a full memset every 65535). */
struct hnsw_visited {
	uint16_t *tag;
	uint32_t n;
	uint16_t epoch;
};

int hnsw_visited_init(struct hnsw_visited *v, uint32_t n);
void hnsw_visited_fini(struct hnsw_visited *v);
/* Make room for n nodes (new tags unvisited); 0 or -ENOMEM. */
int hnsw_visited_reserve(struct hnsw_visited *v, uint32_t n);

static inline void hnsw_visited_next(struct hnsw_visited *v)
{
	if (dm_unlikely(++v->epoch == 0)) {
		memset(v->tag, 0, (size_t)v->n * sizeof(*v->tag));
		v->epoch = 1;
	}
}

/* Prefetch a whole vector: distances over records not in cache are bound by memory
 * latency, and prefetching the next vectors in full keeps many lines in flight. */
static inline void hnsw_prefetch_vec(const float *v, size_t dim)
{
	const char *c = (const char *)v;
	for (size_t o = 0; o < dim * sizeof(float); o += 64)
		__builtin_prefetch(c + o);
}

/* Vectors prefetched ahead of the one being scored (measured best on Fashion-MNIST). */
#define HNSW_PF_AHEAD 2u

/* Node spinlocks (one byte each): short critical sections only, never two held at once. */
static inline void hnsw_lock(uint8_t *l)
{
	_Atomic uint8_t *a = (_Atomic uint8_t *)l;
	for (;;) {
		if (!atomic_exchange_explicit(a, 1, memory_order_acquire))
			return;
		unsigned spins = 0;
		while (atomic_load_explicit(a, memory_order_relaxed)) {
			if (++spins > 64) {
				sched_yield();
				spins = 0;
			} else {
				__builtin_ia32_pause();
			}
		}
	}
}

static inline void hnsw_unlock(uint8_t *l)
{
	atomic_store_explicit((_Atomic uint8_t *)l, 0, memory_order_release);
}

#endif
