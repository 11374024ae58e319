/* cn_upper.h: online upper levels on the compute node (issue 13: "upper levels stay
 * current on every CN").
 *
 * An online insert (cn_insert.h) draws the new node's level as Algorithm 1 does (at most
 * the graph's top level, so the entry point never changes). Level-0 records live on the
 * memory nodes; the upper levels live in every compute node's view (dindex.h: upl, uvec,
 * upq), loaded with the graph. A node of level >= 1 is therefore published to the cluster
 * state (common/etcd/upper.h: one key, node id -> level) at the end of the insert run that
 * wrote its record, and every compute node's replay thread follows those keys: for each
 * node of the current view of a graph, not yet in its upper levels, it READs the node's
 * record (its stored vector; an empty record, lost with a memory node's memory, is passed
 * over), plans the node's upper lists and its neighbours' new ones (hnsw_upper.h: greedy
 * descent, SEARCH-LAYER, Algorithm 4) while queries go on, and applies the plan under the
 * view's up_lock (a copy of a few lists), which a query holds for reading only while it
 * descends the upper levels (hnsw_src.uplock). Each compute node builds its own copy
 * in the order it learns the nodes; copies may differ slightly (orders, races with a
 * generation switch): upper levels only guide the descent to level 0, so every copy is a
 * valid index. A new view of the graph (a reload, a restart) replays every key of its
 * generation again.
 *
 * Without a cluster state ([cluster] etcd) nothing is published: online nodes stay level 0.
 * Counters: dmann_cn_upper_{published,added,skipped}_total. */
#ifndef DM_CN_UPPER_H
#define DM_CN_UPPER_H

#include "cn.h"
#include "dindex.h"

#define CN_UPPER_SALT 0x7570706572ull   /* level draws: meta_crc ^ salt, by id */
#define CN_UPPER_EF 100u                /* SEARCH-LAYER width on the upper levels */

/* Whether online inserts publish upper-level nodes (a cluster state is configured). */
static inline bool cn_upper_on(const struct cn *cn)
{
	return DM_HAVE_ETCD && cn->cfg->etcd[0] != 0;
}

/* Start / stop the replay thread (stop joins it: before the views are freed). Without a
 * cluster state both do nothing. */
void cn_upper_start(struct cn *cn);
void cn_upper_stop(struct cn *cn);
/* Publish nodes ids[0..n) of levels lv[0..n) (>= 1) of view d, whose records are written.
 * Failures are counted and logged: such a node stays level 0 on every compute node. */
void cn_upper_publish(struct cn *cn, const struct dindex *d, const uint32_t *ids,
		      const uint32_t *lv, uint32_t n);

#endif
