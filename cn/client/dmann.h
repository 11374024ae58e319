/* dmann.h: libdmann, the C client of a dmann cluster (ABI version 0, library 0.1.0).
 *
 * Data model: libdmann's indexes ARE the cluster's S3 Vectors indexes, named by a vector
 * bucket and an index name. A vector put here is found by the AWS SDK and vice versa, under
 * the same key, and every query returns the distance docs/api.md defines (euclidean: the
 * L2 distance, cosine: 1 - cosine similarity); queries are exact scans.
 *
 * Transport: the cluster transport (tcp or verbs, as the cluster file says) to the compute
 * nodes, authenticated with a CLIENT identity ([client.NAME] of the cluster file, its own
 * secret; never the cluster secret). Such a connection can query, put and delete; it gets
 * no remote memory access and every admin operation is refused with -EPERM. Each call is
 * one or more native C_CALL messages (common/wire.h) that the compute node runs through its
 * S3 gateway's code (the same functions the HTTP path calls).
 *
 * Conventions:
 *   - int functions return 0 (or a count, where stated) on success and a negative errno on
 *     failure; constructors return NULL and set errno.
 *   - dmann_errmsg() gives a human-readable message for the calling thread's last failure
 *     (the server's message for a refused request, e.g. a ValidationException's text).
 *   - Common errors of every call taking a handle: -EINVAL bad argument (NULL, a name that
 *     is empty or longer than 63 bytes for a bucket / index, a key that is empty or longer
 *     than 1024 bytes, wrong dimension, a NaN or Inf component, k outside 1..100), -ENOENT
 *     unknown bucket or index, -E2BIG more than DMANN_MAX_BATCH items, -EPERM refused
 *     (AccessDenied / admin operation), -EAGAIN the cluster is overloaded or a memory
 *     node is unreachable (ServiceUnavailable: retry later; a read, i.e. a get, list,
 *     describe or query call, has already been sent again five times, after 100 ms
 *     doubling to 1.6 s, before it fails so: a write is not sent again),
 *     -ENOSPC a write the memory nodes have no room for (ServiceQuotaExceeded: nothing of
 *     it was acknowledged; delete an index, or raise [mn] flat_max_mb),
 *     -ETIMEDOUT / -ECONNRESET / -ENOTCONN transport trouble, -EIO any other server error,
 *     -ENOMEM.
 *   - Thread-safety: a dmann_t may be used from several threads at once; calls on one
 *     handle are serialised by a mutex (a batch call keeps many requests in flight
 *     itself). For parallel callers, open one handle per thread.
 */
#ifndef DMANN_H
#define DMANN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DMANN_VERSION "0.1.0"
#define DMANN_MAX_BATCH  1000000u  /* items per put / get / delete / batch query call */
#define DMANN_MAX_KEY    1024u     /* bytes of a key */
#define DMANN_MAX_K      100u      /* results per query (the S3 Vectors topK limit) */
#define DMANN_MAX_DIM    4096u

typedef struct dmann dmann_t;

enum dmann_metric { DMANN_EUCLIDEAN = 0, DMANN_COSINE = 1 };

/* Connect to every compute node of a cluster file as client identity `client` (NULL or "":
 * $DMANN_CLIENT_NAME). Only that identity's secret file is read ($DMANN_CLIENT_SECRET_FILE
 * overrides its path). NULL + errno: ENOENT (file, or no [client.NAME] section), EINVAL
 * (bad file: dmann_errmsg() says where), EACCES (the compute nodes refused the identity),
 * ECONNREFUSED / ETIMEDOUT (no compute node reachable). Nodes that do not answer are
 * skipped as long as one does, and connected later (tried again with back-off, and at
 * once when the routing epoch changes: a compute node that joins is used). */
dmann_t *dmann_connect(const char *cluster_file, const char *client);

/* Connect without a cluster file: cluster name, n endpoints "host:port" (compute nodes'
 * native addresses), transport "tcp" or "verbs" (NULL: tcp), client identity and its
 * secret (16..64 bytes). NULL + errno as dmann_connect. */
dmann_t *dmann_connect_endpoints(const char *cluster, const char *const *endpoints, size_t n,
				 const char *transport, const char *client, const void *secret,
				 size_t secret_len);

/* Close all connections and free the handle (NULL: nothing). Not concurrently with other
 * calls on it. */
void dmann_close(dmann_t *d);

/* The calling thread's last error message ("" if none). Valid until the thread's next
 * libdmann call. */
const char *dmann_errmsg(void);

/* Create index `index` of `dim` float32 dimensions (1..4096) and `metric` in vector bucket
 * `bucket` (created first when missing). -EEXIST: the index exists. */
int dmann_create_index(dmann_t *d, const char *bucket, const char *index, uint32_t dim,
		       enum dmann_metric metric);

/* Dimension and metric of an index (either pointer may be NULL). -ENOENT: no such index. */
int dmann_describe_index(dmann_t *d, const char *bucket, const char *index, uint32_t *dim,
			 enum dmann_metric *metric);

/* Delete an index and all its vectors. -ENOENT: no such index. */
int dmann_drop_index(dmann_t *d, const char *bucket, const char *index);

/* Put n vectors (row-major n x dim float32; dim must be the index's, else -EINVAL "wrong
 * dimension") under keys[0..n-1]; a key that
 * exists is overwritten. metadata: NULL, or n JSON object texts (each NULL or e.g.
 * "{\"genre\":\"x\"}"). Acknowledged once durable on every replica. Returns 0; on failure
 * a prefix of the batch may have been written. */
int dmann_put(dmann_t *d, const char *bucket, const char *index, size_t n,
	      const char *const *keys, const float *vectors, uint32_t dim,
	      const char *const *metadata);

/* Fetch the vectors of n keys into out (n x dim floats, dim the index's; out may be NULL
 * to test presence);
 * found[i] (may be NULL) is set to 1 when keys[i] exists, 0 otherwise (its row of out is
 * zeroed). Returns the number found. */
int dmann_get(dmann_t *d, const char *bucket, const char *index, size_t n,
	      const char *const *keys, float *out, uint32_t dim, uint8_t *found);

/* Delete n keys (missing keys are ignored). 0 or -errno. */
int dmann_delete(dmann_t *d, const char *bucket, const char *index, size_t n,
		 const char *const *keys);

/* Exact k nearest neighbours of one vector (dim floats, the index's dimension): up to k results, nearest first,
 * into keys[0..] (each malloc'd; free with dmann_free_keys) and distances[0..]. Returns the
 * number of results (fewer than k when the index holds fewer vectors). */
int dmann_query(dmann_t *d, const char *bucket, const char *index, const float *vector,
		uint32_t dim, uint32_t k, char **keys, float *distances);

/* nq queries (row-major nq x dim) with up to 32 requests in flight per compute node:
 * results of query i in keys[i*k ..] and distances[i*k ..], counts[i] of them (the rest of
 * its row is NULL / +Inf). 0 or -errno (the first failure; others are not run further). */
int dmann_batch_query(dmann_t *d, const char *bucket, const char *index, const float *vectors,
		      size_t nq, uint32_t dim, uint32_t k, char **keys, float *distances,
		      uint32_t *counts);

/* Free n keys returned by dmann_query / dmann_batch_query (NULL entries are skipped) and
 * set them to NULL. */
void dmann_free_keys(char **keys, size_t n);

/* ---- the cluster's HNSW index: native search ------------------------------------------
 *
 * The index bulk-loaded with `dmann load` (and written by `dmann insert`) is searched by the
 * compute nodes over one-sided READs of the memory nodes (docs/architecture.md). Results
 * are node ids (the row numbers of the loaded file, then the ids inserts returned) and the
 * distance docs/api.md defines for the index's metric.
 *
 * Routing: with DMANN_ROUTE_CLIENT (the default) the handle holds the compute nodes'
 * oracle and partition owners (fetched with the first search and again, within the same
 * call once the queries in flight are answered, whenever an answer shows a new routing
 * epoch or strategy: a compute node joined or left, or the CNs re-clustered) and sends
 * each query straight to the compute node the router picks (docs/router.md "Client-side
 * routing"): nothing is relayed through a memory node unless that CN is too loaded to
 * take it. With DMANN_ROUTE_SERVER queries go round robin and
 * the receiving CN routes (relaying through a memory node). While the CNs route with
 * strategy none, or have no oracle yet, both behave as DMANN_ROUTE_SERVER. */
enum dmann_routing { DMANN_ROUTE_CLIENT = 0, DMANN_ROUTE_SERVER = 1 };

struct dmann_search_params {
	uint32_t k;                  /* results per query, 1..1024 */
	uint32_t ef;                 /* search list size (0: 64), at most 65536 */
	uint32_t beam;               /* level-0 candidates per round trip (0: 1), at most 16 */
	uint32_t inflight;           /* queries in flight in all (0: 16 per compute node);
				      * at most 32 per compute node */
	enum dmann_routing routing;
	uint32_t graph;              /* the HNSW graph searched (`dmann load --graph`), 0..15;
				      * 0 is the default one. The router's partitions are graph
				      * 0's: queries of other graphs go round robin and run where
				      * they arrive (no routing) */
};

#define DMANN_SI_ROUTED  1u          /* the client routed it (client-side routing) */
#define DMANN_SI_SPILLED 2u          /* ... to a compute node other than its top-ranked one */
#define DMANN_SI_RELAYED 4u          /* a compute node relayed it through a memory node */
#define DMANN_SI_RETRIED 8u          /* sent again: the compute node it was on died */

struct dmann_search_info {           /* per query (optional) */
	uint64_t latency_ns;         /* sent to answered, at the client */
	uint64_t bytes;              /* bytes READ from the memory nodes */
	uint32_t reads, round_trips, hops, cache_hits, rereads;
	uint32_t sent_to;            /* node id of the CN it was sent to (routing client-side;
				      * otherwise the index of its connection) */
	uint32_t ran_on;             /* node id of the CN that ran it */
	uint32_t flags;              /* DMANN_SI_* */
	int32_t status;              /* 0 answered, -errno its failure, -ECANCELED not run
				      * (or lost with its connection) after a failure */
	uint32_t epoch;              /* the routing epoch it was routed with client-side (0:
				      * not routed here) */
	uint32_t ran_epoch;          /* the routing epoch of the CN that ran it (0: it routes
				      * with no oracle) */
	uint64_t sent_ns;            /* when it was (last) sent: CLOCK_MONOTONIC, ns */
};

/* Search nq query vectors (row-major nq x dim float32, dim the index's) with up to
 * p->inflight queries in flight: query i's ids in ids[i*k ..] and distances in
 * distances[i*k ..] (distances may be NULL), counts[i] of them (may be NULL; the rest of
 * the row is UINT64_MAX / +Inf), info[i] (may be NULL). Errors: -EINVAL (see above; also
 * a dim over what a compute node's receive buffer holds, "too many dimensions"), -ENOENT
 * (no HNSW index loaded as that graph), -EAGAIN (overloaded), -EHOSTDOWN (no live replica of a block;
 * or no compute node reachable; or a query lost twice with its compute node). A compute
 * node whose connection fails is closed and its queries in flight are sent once more to
 * the others (DMANN_SI_RETRIED; queries are read-only, so a retry is safe), and so is a
 * query a compute node answers -ECONNABORTED (it had relayed it to a compute node that
 * died); later calls
 * try to reconnect it (after 1 s, backing off to 10 s). On the first failed query nothing
 * more is sent, the rest in flight are collected and the error is returned. Thread-safety: as every call on a handle (serialised). */
int dmann_search(dmann_t *d, const float *vectors, size_t nq, uint32_t dim,
		 const struct dmann_search_params *p, uint64_t *ids, float *distances,
		 uint32_t *counts, struct dmann_search_info *info);

#ifdef __cplusplus
}
#endif

#endif /* DMANN_H */
