/* dm_heap.h: the tree's one binary heap, as a typed template (like BSD's <sys/tree.h>):
 *
 *   DM_HEAP_DEFINE(name, T, N, BEFORE)
 *
 * defines static inline functions over an array T a[] holding *n entries (count type N):
 *   name_push(a, &n, x)        insert x (the caller guarantees room)
 *   name_pop(a, &n)            remove and return the root (n > 0)
 *   name_sift_down(a, n, i, x) place x into the hole at i, moving it towards the leaves
 *   name_sift_up(a, i, x)      place x into the hole at i, moving it towards the root
 * BEFORE(p, q) (p, q: const T *) is true when p belongs nearer the root than q: a strict
 * "less" gives a min-heap, a strict "greater" a max-heap. Equal entries never move past each
 * other's parent, so the order of operations is deterministic (the HNSW searches depend on
 * it: local and remote searches must visit nodes in the same order).
 * Not thread-safe; no allocation.
 */
#ifndef DM_UTIL_HEAP_H
#define DM_UTIL_HEAP_H

#define DM_HEAP_DEFINE(name, T, N, BEFORE)                                                  \
	static inline __attribute__((unused)) void name##_sift_up(T *a, N i, T x)                                   \
	{                                                                                   \
		while (i > 0) {                                                             \
			N p = (N)((i - 1) / 2);                                             \
			if (!(BEFORE(&x, &a[p])))                                           \
				break;                                                      \
			a[i] = a[p];                                                        \
			i = p;                                                              \
		}                                                                           \
		a[i] = x;                                                                   \
	}                                                                                   \
	static inline __attribute__((unused)) void name##_sift_down(T *a, N n, N i, T x)                            \
	{                                                                                   \
		for (;;) {                                                                  \
			N c = (N)(2 * i + 1);                                               \
			if (c >= n)                                                         \
				break;                                                      \
			if (c + 1 < n && (BEFORE(&a[c + 1], &a[c])))                        \
				c++;                                                        \
			if (!(BEFORE(&a[c], &x)))                                           \
				break;                                                      \
			a[i] = a[c];                                                        \
			i = c;                                                              \
		}                                                                           \
		a[i] = x;                                                                   \
	}                                                                                   \
	static inline __attribute__((unused)) void name##_push(T *a, N *n, T x)                                     \
	{                                                                                   \
		name##_sift_up(a, (*n)++, x);                                               \
	}                                                                                   \
	static inline __attribute__((unused)) T name##_pop(T *a, N *n)                                              \
	{                                                                                   \
		T top = a[0], last = a[--*n];                                               \
		if (*n)                                                                     \
			name##_sift_down(a, *n, 0, last);                                   \
		return top;                                                                 \
	}

#endif
