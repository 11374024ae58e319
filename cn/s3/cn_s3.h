/* cn_s3.h: the S3 Vectors gateway of a compute node (DESIGN §7, §8), the distributed path:
 *   - catalog and write operations go to the memory nodes holding the bucket (rendezvous
 *     placement of the bucket over the MNs, `redundancy` replicas) as FL RPCs; a write is
 *     answered only after every replica has it durable (WAL fdatasync on the MN);
 *   - QueryVectors: the ingress CN reads the index state from an MN, picks a replica group
 *     of W CNs (s3_plan), gives each member its share of the fragments; members scan their
 *     share exactly from fragments they cache (fetched from the MN once; sealed fragments
 *     are immutable, tombstones and the tail are refreshed by version) and return partial
 *     top-k lists, which the ingress merges. CN-to-CN sub-requests are SigV4-signed HTTP
 *     requests to the member's own gateway (`POST /_dmann/ScanShare`); a slow member is
 *     hedged to another CN after a small budget, a failed one retried once elsewhere.
 * Settings come from the [s3] section of the cluster file (common/config.h,
 * docs/operations.md); DMANN_S3_<KEY> environment variables override them for tests.
 * The parts are described in cn_s3_int.h.
 */
#ifndef DM_CN_S3_H
#define DM_CN_S3_H

#include <stdio.h>

#include "config.h"

struct cn_s3;

/* Start the gateway on node->http with the cluster's [s3] credentials. NULL + errno (a
 * message is logged); ENOENT: the node has no http address or the cluster no [s3] key. */
struct cn_s3 *cn_s3_start(const struct dm_cluster_cfg *cfg, const struct dm_node_cfg *node);
/* Answer admitted queries, stop, free. */
void cn_s3_stop(struct cn_s3 *s);
/* Run one S3 Vectors operation (name op, request body JSON) for a native client (C_CALL,
 * wire.h) through the same backend the HTTP path uses. Returns the response body (malloc'd,
 * *out_len bytes; an error carries "__type") and its HTTP status in *status; NULL + errno
 * ENOMEM. Blocks (MN round trips, the query fan-out): call it off any polling loop that
 * other connections depend on. */
char *cn_s3_call(struct cn_s3 *s, const char *op, const char *body, size_t len, int *status,
		 size_t *out_len);
/* The graph path (cn_s3_graph.c): what the gateway asks the compute node's view of the
 * HNSW index. Both calls are thread-safe and short (the view's lock). */
struct cn_s3_graph_info {
	uint64_t gen;                    /* the view's generation */
	uint32_t graph;                  /* its graph number (< DM_MAX_GRAPHS) */
	uint32_t metric, dim;            /* enum dm_metric, dimensions */
};
struct cn_s3_graph_ops {
	/* Whether a graph's view is bound to S3 index bucket/index (dindex_bind.h) and, tag
	 * not 0, is the one whose tag that is: 0 with *gi, -ENOENT otherwise. Graphs are
	 * numbered 0..DM_MAX_GRAPHS-1 (wire.h); the mark of an index served by generation
	 * gen of graph g carries dm_graph_tag(g, gen). */
	int (*info)(void *ctx, const char *bucket, const char *index, uint64_t tag,
		    struct cn_s3_graph_info *gi);
	/* The keys the binding gives node ids[0..n) in the view of generation gen: keys[i]
	 * malloc'd, or NULL for an id the binding has no key for (one the online indexer
	 * added: cn_s3_gkeys.c knows those). -ESTALE (the view is of another generation now),
	 * -ENOMEM (keys[] all NULL then). */
	int (*keys)(void *ctx, uint32_t graph, uint64_t gen, const uint64_t *ids, size_t n,
		    char **keys);
	/* The online indexer (cn_s3_index.c); NULL members: this compute node indexes nothing.
	 * bound: the S3 index graph `graph`'s view is bound to (bucket and index into room
	 * for FLAT_NAME_MAX + 1 bytes each: a shard's bucket "B#s" too) and its generation:
	 * 0, or -ENOENT. */
	int (*bound)(void *ctx, uint32_t graph, char *bucket, char *index, uint64_t *gen);
	/* The compute nodes that run the indexer now: those with a gateway that the cluster
	 * state does not declare down, ascending ids into cns (room for DM_MAX_NODES); their
	 * number. Each indexes the rows whose key it wins by rendezvous hashing among them
	 * (cn_s3_index.c). */
	uint32_t (*indexers)(void *ctx, uint32_t *cns);
	/* Insert vecs[0..n) (dim floats each) into graph's view of generation gen with up to
	 * nthreads threads at search breadth ef: ids[i] gets row i's node id, or UINT64_MAX
	 * for a row that was not inserted. The number inserted, or -errno when none was
	 * (-ESTALE another generation now, -ENOSPC the graph is full, ...). */
	int (*insert)(void *ctx, uint32_t graph, uint64_t gen, const float *vecs, uint32_t n,
		      uint32_t dim, uint32_t ef, uint32_t nthreads, uint64_t *ids);
	/* Make the graph durable: every reachable memory node snapshots its region. 0 or
	 * -errno. */
	int (*snapshot)(void *ctx);
	/* Drop every record this compute node caches (the indexer changed graph records). */
	void (*cache_clear)(void *ctx);
	/* Drop graph `graph` from every memory node (the S3 index it is bound to is gone):
	 * dindex_drop_graph; its memory is freed once the compute nodes let go of it. 0 or
	 * -errno. */
	int (*drop)(void *ctx, uint32_t graph);
	/* Build a graph of vecs[0..n) (dim floats each, metric an enum dm_metric) locally with
	 * nthreads threads (M 16, efConstruction ef, RaBitQ codes) and place it, bound to
	 * bucket/index with keys[i] for node i and room for `room` more rows, as generation 1
	 * of the lowest graph number no memory node uses: *graph and *gen get it. The graph
	 * is not durable until the next snapshot (which it makes a full one). 0 or -errno
	 * (-ENOSPC: every graph number is in use). */
	int (*seed)(void *ctx, const char *bucket, const char *index, uint32_t metric,
		    uint32_t dim, const float *vecs, char *const *keys, uint32_t n, uint32_t room,
		    uint32_t ef, uint32_t nthreads, uint32_t *graph, uint64_t *gen);
	/* Whether this compute node is the cluster's controller now (it runs the catch-up of
	 * stale bucket replicas, cn_s3_repl.c). NULL: never. */
	bool (*leader)(void *ctx);
	/* Whether the cluster state declares memory node mn down. NULL: never. */
	bool (*mn_down)(void *ctx, uint32_t mn);
	/* The placement of the cluster state this compute node follows: its version (0: none
	 * yet); with retired not NULL also the retired memory nodes (4 words). Buckets follow
	 * it (flat_bucket_mns_placed). NULL: none. */
	int64_t (*placement)(void *ctx, uint64_t *retired);
};
/* Give the gateway the compute node's graph (before the first request; ops stays valid);
 * starts the online indexer when ops has one and [s3] index_interval_ms is not 0. */
void cn_s3_set_graph(struct cn_s3 *s, const struct cn_s3_graph_ops *ops, void *ctx);
/* Before the controller publishes a placement that retires (or takes back) memory nodes:
 * every bucket replica the change adds (a node in a bucket's replicas under nx, not
 * under old) is marked stale, so that reads skip it and the catch-up fills it from the
 * bucket's other replicas (re-replication of buckets). The buckets are listed on every
 * reachable memory node. 0 or -errno (the placement must not be published then). */
int cn_s3_placement_prepare(struct cn_s3 *s, const uint64_t *old, const uint64_t *nx);
/* Write the gateway's counters in the Prometheus text format (s NULL: nothing). */
void cn_s3_metrics(struct cn_s3 *s, FILE *out);

#endif
