/* hnsw_upper.h: online upper levels: the levels >= 1 of INSERT (Algorithm 1 of Malkov &
 * Yashunin) over a graph's local upper lists, so that every compute node adds the nodes of
 * level >= 1 that any compute node inserted online to its own copy of the upper levels
 * (cn/engine/cn_upper.c). Level 0 lives on the memory nodes and is written by the inserter
 * itself (cn/engine/cn_insert.c); the upper levels are small (about 1/M of the nodes) and
 * every compute node keeps them, with their vectors, in its index view.
 *
 * The graph is what struct hnsw_src holds locally: upl[id] (NULL below level 1; the node's
 * level in upl[id][-1], then per level l = 1..level a list of 1 + M words: count, ids) and
 * the stored vectors uvec[id]. For a node x of level L with stored vector v:
 *   1. greedy descent (SEARCH-LAYER with ef = 1) from the entry point down to level L + 1;
 *   2. per level L..1: SEARCH-LAYER (Algorithm 2) with ef, SELECT-NEIGHBORS-HEURISTIC
 *      (Algorithm 4, as hnswlib) of M: x's list; for every selected neighbour e, e's list
 *      with x added, re-selected by Algorithm 4 when it would pass M.
 * The result is a plan, the lists to write; planning only reads the graph. So the one
 * writer of a copy (a compute node's replay thread) plans while queries read the graph and
 * takes their lock only to apply the plan (the caller copies the lists in). Distances are
 * exact (the kernel of the metric on the stored vectors); L is at most the graph's
 * max_level (the entry point and top level never change online).
 *
 * Thread-safety: a scratch is used by one thread at a time; the graph must not change
 * during hnsw_upper_plan. */
#ifndef DM_HNSW_UPPER_H
#define DM_HNSW_UPPER_H

#include "hnsw.h"

/* The upper levels of a graph, as read by the planner. */
struct hnsw_upper_graph {
	uint32_t M, vdim;
	uint32_t n;                      /* ids are below it */
	uint32_t *const *upl;
	const float *const *uvec;
	hnsw_kernel_fn kern;
	uint32_t entry;
	int max_level;
};

/* One list to write: node's list at level (1-based): w[0] = count, w[1..count] = ids. */
struct hnsw_upper_list {
	uint32_t node, level;
	uint32_t *w;                     /* 1 + M words (in the plan's storage) */
};

/* A plan: x's own lists first (node == id, levels level..1), then its neighbours'. */
struct hnsw_upper_plan {
	uint32_t id, level;
	uint32_t nlists;
	struct hnsw_upper_list *lists;
};

struct hnsw_upper_scratch;

/* A scratch for graphs of up to n ids, M links, SEARCH-LAYER width ef. NULL + ENOMEM. */
struct hnsw_upper_scratch *hnsw_upper_scratch_new(uint32_t n, uint32_t M, uint32_t ef);
void hnsw_upper_scratch_free(struct hnsw_upper_scratch *s);

/* Plan the insertion of node id (< g->n, not yet in the upper levels: g->upl[id] NULL) at
 * level (1..g->max_level) with stored vector v (g->vdim floats) into g. *plan points into
 * s (valid until its next use). 0, -EINVAL (bad id, level or a graph without upper levels),
 * -EIO (a list names a node without upper lists at that level or out of range: a corrupt
 * graph), -ENOMEM. */
int hnsw_upper_plan(const struct hnsw_upper_graph *g, struct hnsw_upper_scratch *s, uint32_t id,
		    uint32_t level, const float *v, struct hnsw_upper_plan *plan);

#endif
