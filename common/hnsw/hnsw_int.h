/* hnsw_int.h: internals shared by the hnsw_*.c files: candidate heaps, the visited set with
 * epoch tags, node spinlocks, the quantizer interface (hnsw_codes.h). Not part of the public interface. */
#ifndef DM_HNSW_INT_H
#define DM_HNSW_INT_H

#include "hnsw.h"
#include "hnsw_codes.h"

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

static inline void hnsw_minheap_push(struct hnsw_heap *h, float d, uint32_t id)
{
	uint32_t i = h->n++;
	struct hnsw_cand *a = h->a;
	while (i > 0) {
		uint32_t p = (i - 1) >> 1;
		if (a[p].d <= d)
			break;
		a[i] = a[p];
		i = p;
	}
	a[i].d = d;
	a[i].id = id;
}

static inline struct hnsw_cand hnsw_minheap_pop(struct hnsw_heap *h)
{
	struct hnsw_cand *a = h->a, top = a[0], last = a[--h->n];
	uint32_t n = h->n, i = 0;
	for (;;) {
		uint32_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && a[c + 1].d < a[c].d)
			c++;
		if (last.d <= a[c].d)
			break;
		a[i] = a[c];
		i = c;
	}
	if (n)
		a[i] = last;
	return top;
}

static inline void hnsw_maxheap_push(struct hnsw_heap *h, float d, uint32_t id)
{
	uint32_t i = h->n++;
	struct hnsw_cand *a = h->a;
	while (i > 0) {
		uint32_t p = (i - 1) >> 1;
		if (a[p].d >= d)
			break;
		a[i] = a[p];
		i = p;
	}
	a[i].d = d;
	a[i].id = id;
}

static inline struct hnsw_cand hnsw_maxheap_pop(struct hnsw_heap *h)
{
	struct hnsw_cand *a = h->a, top = a[0], last = a[--h->n];
	uint32_t n = h->n, i = 0;
	for (;;) {
		uint32_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && a[c + 1].d > a[c].d)
			c++;
		if (last.d >= a[c].d)
			break;
		a[i] = a[c];
		i = c;
	}
	if (n)
		a[i] = last;
	return top;
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
