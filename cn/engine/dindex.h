/* dindex.h: an HNSW index placed on the memory nodes ("disaggregated index").
 *
 * On the memory nodes: every block of records is an object (DM_OBJ_HNSW_BLOCK, block
 * number) on the R nodes the placement function picks for it, and a metadata object
 * (DM_OBJ_HNSW_META) on every memory node holds the parameters, the entry point and the
 * upper-level lists, which compute nodes load whole at start. Every load is a new
 * generation of the index with its own keys (dm_gen_block_key, dm_gen_meta_key of wire.h;
 * the protocol is in dgen.h).
 *
 * Metadata object: header (struct dindex_meta_hdr, little-endian, crc32 of the rest of the
 * header in hdr_crc) | upper area (up_words u32: per node of level >= 1: id, level, then
 * level lists of 1 + M words), its crc32 in up_crc | the quantizer blob of the neighbour
 * codes (q_len bytes, crc32 in q_crc; none without codes) | the stored vectors (vdim f32,
 * rotated with codes) of the uv_nodes nodes of level >= 1, in the upper area's order (crc32
 * in uv_crc): compute nodes keep them, so that the descent through the upper levels needs no
 * READ (about 1/M of the vectors). The header carries the record layout version and the code
 * kind: a compute node refuses any other layout.
 *
 * Key-order trailer (optional, issue 15), before the S3 binding: char magic[8] "DMIDXKO1" |
 * u32 len (bytes after these 16) | u32 crc32 of them | u32 run | u32 nlabels | nlabels x u32.
 * run: the placement unit in blocks (block b is placed as item b / run: dindex_block_replicas;
 * 1 without the trailer); the labels: node id -> the row of the vector file it was built
 * from (a key-ordered image, `dmann build --order vhash`), a permutation of 0..n-1, which a
 * compute node puts in its answers instead of node ids (nlabels 0: answers are node ids;
 * so with an S3 binding, whose keys are given in node order). A compute node of an earlier
 * version refuses the metadata (not a binding), it never answers node ids for rows.
 *
 * An index loaded with spare capacity (capacity > n) has blocks for every id below
 * capacity (records past n zeroed), committed as mutable objects (online inserts WRITE
 * them), and an id counter: a 64-byte object (dm_gen_block_key(0, gen, DINDEX_CTR_BLOCK))
 * on the first placement node of that pseudo-block, whose first 8 bytes (u64, host order
 * of the memory node) are the next free id, taken with one FAA per insert.
 *
 * This module also holds the connections a process keeps to every memory node (a control
 * channel each) and the block table a compute node uses to turn a node id into
 * (memory node, remote address). */
#ifndef DM_CN_DINDEX_H
#define DM_CN_DINDEX_H

#include <stdatomic.h>

#include "cluster.h"
#include "dindex_bind.h"
#include "hnsw/hnsw.h"
#include "hnsw/hnsw_codes.h"
#include "rpc.h"

#define DINDEX_MAGIC "DMIDXMT1"
#define DINDEX_VERSION 2u         /* 1: record layout v1, no codes */
#define DINDEX_MAX_REP 8u         /* replicas per block a compute node tracks */
#define DINDEX_NO_MN 0xffu        /* block_mn of a replica that does not exist */
#define DINDEX_CTR_BLOCK 0xffffffffu   /* block number of the id counter object */
#define DINDEX_MAX_CAP 0x7fffffffu     /* records of an index (ids are u32) */
#define DINDEX_KO_MAGIC "DMIDXKO1"     /* key-order trailer of the metadata */
#define DINDEX_MAX_RUN 4096u           /* blocks per placement unit */

struct dindex_meta_hdr {
	char magic[8];
	uint32_t version;
	uint32_t dim, metric, M, n, rec_size, block_shift, nblocks, entry;
	int32_t max_level;
	uint32_t redundancy;
	uint64_t up_words;
	uint32_t up_crc;
	uint32_t layout;           /* HNSW_LAYOUT_VERSION */
	uint32_t codes;            /* enum hnsw_codes */
	uint32_t code_bytes, vdim;
	uint32_t q_crc;
	uint64_t q_len;            /* quantizer blob after the upper area */
	uint32_t uv_nodes;         /* upper-level vectors after the blob */
	uint32_t uv_crc;
	uint32_t capacity;         /* records the blocks have room for (>= n; 0: n): ids
				      n .. capacity-1 are taken by online inserts (cn_insert.h) */
	uint32_t hdr_crc;          /* crc32 of the bytes before it */
};
_Static_assert(sizeof(struct dindex_meta_hdr) == 112, "meta header layout");

/* One process's connections to the memory nodes. */
struct mn_link {
	struct dm_conn *conn;
	struct dm_rpc_chan ch;
	struct dm_wire_ctl_info info;
	bool up;
};

struct mn_set {
	const struct dm_cluster_cfg *cfg;
	struct dm_xport *x;
	struct dm_msgpool *pool;
	bool own_pool;
	uint32_t n;
	/* Memory nodes the placement retired (cstate.h dm_placement): they hold no block, the
	 * next nodes in rendezvous order take their place. Set by the caller after open. */
	uint64_t retired[DM_MAX_NODES / 64];
	struct mn_link link[DM_MAX_NODES];
};

/* Whether the placement retired memory node i (it holds nothing: loads, publications and
 * generation reports leave it out). */
static inline bool mn_set_retired(const struct mn_set *s, uint32_t i)
{
	return s->retired[i / 64] >> (i % 64) & 1;
}

/* Connect to every memory node (control channel + INFO). With require_all, a node that
 * cannot be reached within timeout_ms is an error; otherwise it is marked down. pool is
 * the context's message pool (a context's receive queue is shared, so it has exactly one
 * pool), or NULL to create one. NULL + errno; the reason is logged. */
struct mn_set *mn_set_open(const struct dm_cluster_cfg *cfg, struct dm_xport *x,
			   struct dm_msgpool *pool, bool require_all, int timeout_ms);
void mn_set_close(struct mn_set *s);
/* (Re)connect link i (control channel + INFO): 0 (up) or -errno (down). */
int mn_link_open(struct mn_set *s, uint32_t i, int timeout_ms);
/* Close link i and mark it down. */
void mn_link_close(struct mn_set *s, uint32_t i);
/* Ask every reachable memory node to snapshot its region. 0 or the first error. */
int mn_set_snapshot(struct mn_set *s);
/* The same on memory node i alone. 0 or -errno (-EHOSTDOWN: its link is not up). */
int mn_link_snapshot(struct mn_set *s, uint32_t i);

/* Place an index image on the memory nodes as the next generation of the index (dgen.h)
 * (in placement units of `run` consecutive blocks, 1..DINDEX_MAX_RUN; with run > 1 or a
 * label map in idx, the metadata gets the key-order trailer; the label map only without
 * bind)
 * (bound to an S3 index when bind is not NULL: dindex_bind.h, one key per vector):
 * blocks on their R replicas, metadata everywhere, each object written with one-sided
 * WRITEs and committed with its checksum, then published; the previous generation stays
 * until every compute node released it (waits first for an older one to be released:
 * -EBUSY after the lease). *gen_out (may be NULL) gets the new generation. progress (may
 * be NULL) gets bytes written. 0 or -errno with a message in err. */
int dindex_load(struct mn_set *s, uint32_t graph, const struct hnsw_index *idx, uint32_t spare,
		uint32_t run, const struct dindex_bind_in *bind, uint64_t *gen_out,
		void (*progress)(void *, uint64_t), void *parg, char *err, size_t errlen);

/* Drop graph `graph` (< DM_MAX_GRAPHS) from the memory nodes (CTL_GEN_DROP on each, with
 * its current generation; every node but the retired ones must be up): its metadata goes
 * at once, its blocks once the compute nodes released them (dgen.h). Waits first (up to the
 * lease) for an older generation of it to be released. Not loaded: -ENOENT; dropped before
 * and still being released: 0. 0 or -errno with a message in err. The drop is durable once
 * the memory nodes snapshot (mn_set_snapshot). */
int dindex_drop_graph(struct mn_set *s, uint32_t graph, char *err, size_t errlen);

/* A compute node's view of the placed index. */
struct dindex {
	struct hnsw_params p;
	uint32_t n, rec_size, nblocks, entry;
	uint32_t code_bytes, vec_off, vdim;  /* record geometry (hnsw_layout.h) */
	struct hnsw_quant *quant;  /* neighbour codes, or NULL */
	float *uv_store;           /* stored vectors of the level >= 1 nodes */
	const float **uvec;        /* per node: its vector in uv_store, or NULL (level 0) */
	struct hnsw_upq *upq;      /* with codes: SQ8 codes of uvec (hnsw_upq.h), as built
				      locally from the same vectors */
	int max_level;
	uint32_t *up_store;
	uint32_t **upl;            /* per node: upper lists or NULL */
	uint32_t meta_crc;         /* identifies this load of the index */
	uint64_t gen;              /* its generation (dgen.h) */
	uint32_t graph;            /* its graph number (< DM_MAX_GRAPHS; 0: the default one) */
	atomic_uint users;         /* compute node: workers bound to this view */
	uint32_t nrep;             /* replicas per block (the metadata's redundancy) */
	uint8_t *block_mn;         /* [block * nrep + j]: memory node of replica j, placement
				    * order (DINDEX_NO_MN: fewer memory nodes than nrep) */
	uint64_t *block_addr;      /* [block * nrep + j]: its remote address of record 0, 0
				    * when unknown (node down when the view was read) */
	/* Compute node: per memory node, the CN's up/down epoch (cn.h mn_epoch) at which this
	 * view's addresses on it were read; a worker reads from node m only while they match. */
	uint32_t mn_epoch[DM_MAX_NODES];
	uint64_t index_bytes;      /* n * rec_size */
	uint32_t cap;              /* ids below it have a record slot (n without spare room) */
	uint32_t ctr_mn;           /* cap > n: the id counter's memory node and address */
	uint64_t ctr_addr;
	uint32_t at_level[HNSW_MAX_LEVEL + 1];   /* nodes of level >= l (l >= 1; [0] unused) */
	struct dindex_bind *bind;  /* the S3 index it serves and its nodes' keys, or NULL */
	uint32_t run;              /* placement unit in blocks (key-order trailer; 1 without) */
	uint32_t *labels;          /* node id -> label put in answers (nlabels of them), or
				      NULL: node ids (hnsw_label) */
	uint32_t nlabels;
	/* Online upper levels (cn_upper.c): with room for inserts (cap > n) upl, uvec and upq
	 * have room for every id below cap; a node inserted online whose level is >= 1 is
	 * added to them by the compute node's replay thread under up_lock (each its own
	 * allocation in up_extra). up_done: entries of the graph's list in
	 * the cluster state applied or passed over, up_added: nodes added. */
	pthread_rwlock_t up_lock;  /* readers of upl/uvec/upq/at_level while it changes
				      (hnsw_src.uplock); the replay thread writes under it */
	void **up_extra;
	uint32_t n_extra, cap_extra;
	uint32_t up_done, up_added;
	uint32_t up_epoch;         /* the replay's follow epoch up_done counts in */
};

/* The level of node id in view d (0: level 0 only, or out of range). */
static inline uint32_t dindex_level(const struct dindex *d, uint32_t id)
{
	return id < d->cap && d->upl[id] ? d->upl[id][-1] : 0;
}

/* Read generation gen's metadata and block table from the memory nodes: -ENOENT when it
 * is not there, -EBADMSG for corrupt metadata (message in err), or another -errno. */
int dindex_open(struct mn_set *s, uint32_t graph, uint64_t gen, struct dindex **out, char *err, size_t errlen);
void dindex_free(struct dindex *d);
/* The lowest level L >= 1 whose nodes (level >= L) fit in a quarter of a cache of slots
 * records: the compute node pins those records (max_level + 1: pin none). Pinning every
 * upper-level node instead filled a 5% cache with them (1/M of all nodes) and every CN held
 * the same ones. */
int dindex_pin_level(const struct dindex *d, uint64_t slots);
/* The memory node, remote address and rkey of node id's record on replica j of its block
 * (*mn = DINDEX_NO_MN or *addr = 0 when that replica is unknown). */
static inline void dindex_locate_rep(const struct dindex *d, const struct mn_set *s,
				     uint32_t id, uint32_t j, uint32_t *mn, uint64_t *addr,
				     uint32_t *rkey)
{
	size_t b = (size_t)(id >> d->p.block_shift) * d->nrep + j;
	uint32_t mask = (1u << d->p.block_shift) - 1;

	*mn = d->block_mn[b];
	*addr = 0;
	*rkey = 0;
	if (*mn == DINDEX_NO_MN || !d->block_addr[b])
		return;
	*addr = d->block_addr[b] + (uint64_t)(id & mask) * d->rec_size;
	*rkey = s->link[*mn].info.rkey;
}

/* The same on the first replica whose address is known (the block has at least one). */
static inline void dindex_locate(const struct dindex *d, const struct mn_set *s, uint32_t id,
				 uint32_t *mn, uint64_t *addr, uint32_t *rkey)
{
	*mn = DINDEX_NO_MN;
	*addr = 0;
	*rkey = 0;
	for (uint32_t j = 0; j < d->nrep; j++) {
		dindex_locate_rep(d, s, id, j, mn, addr, rkey);
		if (*addr)
			return;
	}
}

/* A memory node comes back: the addresses of d's blocks on node m (per block table entry,
 * d->nblocks * d->nrep, 0 where the replica is on another node) looked up on link m, then
 * one record READ from it and validated (the probe). 0 or -errno. */
int dindex_rejoin(struct mn_set *s, const struct dindex *d, uint32_t m, uint64_t *addr);
/* The id counter's address on memory node m, when m holds d's counter (a node that
 * restarted maps its region elsewhere: every address it hands out changes). 0, -ENOENT
 * (not its node, or d takes no inserts), or -errno. */
int dindex_lookup_ctr(struct mn_set *s, const struct dindex *d, uint32_t m, uint64_t *addr);

/* Parse the key-order trailer at t (tail bytes, starting with DINDEX_KO_MAGIC) of the
 * metadata of an index of n nodes into d->run, d->labels and d->nlabels (a permutation of
 * 0..n-1, or none; d->labels malloc'd: dindex_free frees it). Its length in bytes, or
 * -EBADMSG (CRC, run, length or map wrong) / -ENOMEM with a message in err. Outside input
 * (read from the memory nodes): fuzzed by fuzz_dindex_bind. */
int dindex_ko_parse(struct dindex *d, const uint8_t *t, size_t tail, uint32_t n, char *err,
		    size_t errlen);

/* The memory nodes that hold block b of graph `graph` placed in runs of `run` blocks (the
 * view's d->run) under s's placement (the cluster file's nodes minus the retired ones,
 * weighted rendezvous of the run b / run), best first: their count (<= r). The one
 * function every loader, compute node view and repair places blocks with. */
int dindex_block_replicas(const struct mn_set *s, uint32_t graph, uint32_t run, uint32_t b,
			  uint32_t r, uint32_t *out);
/* Read block b of view d (its records, ids b << block_shift on, up to the capacity) from
 * the first replica whose address d knows and whose node is up into buf (room for
 * 2^block_shift records; registered here for the READ): *len gets the bytes read. Records a
 * writer holds meanwhile may be torn (check them with dindex_rec_ok). 0 or -errno. */
int dindex_read_block(struct mn_set *s, const struct dindex *d, uint32_t b, void *buf,
		      uint64_t *len);
/* The id counter of an index with spare room: the next id an insert takes (*next; ids
 * below it were handed out). Without spare room *next = d->n. 0 or -errno. */
int dindex_read_ctr(struct mn_set *s, const struct dindex *d, uint64_t *next);
/* Re-replication: copy block b of view d (or the id counter, b = DINDEX_CTR_BLOCK) from
 * memory node `from` (whose address of it is known to d, or looked up) to memory node `to`,
 * committed with the same key, length and mutability, then read back and compared (the
 * copy serves only once whole). *bytes (may be NULL) gets its size. 0 or -errno. */
int dindex_copy_block(struct mn_set *s, const struct dindex *d, uint32_t b, uint32_t from,
		      uint32_t to, uint64_t *bytes);
/* Catch-up of block b of view d on memory node `to` (a replica that missed writes) from
 * memory node `from`: both copies are READ and every record that differs and is whole on
 * the source (its CRC matches, held or not) is written to `to`, in runs; repeated until a
 * pass writes nothing (a writer may change records meanwhile), at most `passes` passes;
 * a record torn on the source through every pass (its writer died) is left as `to` has
 * it (warned). *written: records written. 0 or -errno. */
int dindex_sync_block(struct mn_set *s, const struct dindex *d, uint32_t b, uint32_t from,
		      uint32_t to, int passes, uint32_t *written);
/* The same for view d's metadata object (a joining node needs it before its generation
 * can be published there). 0 or -errno. */
int dindex_copy_meta(struct mn_set *s, const struct dindex *d, uint32_t from, uint32_t to);
/* Drop every object of every HNSW graph on memory node m, every generation (a retired node
 * that joins again starts empty). 0 or -errno. */
int dindex_drop_all(struct mn_set *s, uint32_t m);
/* Whether memory node m holds block b of d (a committed object of its key and size):
 * 1, 0, or -errno. */
int dindex_has_block(struct mn_set *s, const struct dindex *d, uint32_t b, uint32_t m);

/* Check a record read from a memory node: CRC32C of the body (hnsw_rec_intact: a record
 * held by a writer is accepted while its body is whole), level and neighbour count bounds.
 * A torn or half-written record fails and is read again. */
static inline bool dindex_rec_ok(const struct dindex *d, const struct hnsw_rec_hdr *r)
{
	return r->level <= HNSW_MAX_LEVEL && r->n0 <= 2 * d->p.M &&
	       hnsw_rec_intact(r, d->rec_size);
}

/* A remote record source over view d (hnsw.h struct hnsw_src: geometry, quantizer, upper
 * lists and vectors, upper-level codes; n = the capacity, so that online inserts' ids are in
 * range); the caller sets get and ctx. */
void dindex_src(const struct dindex *d, struct hnsw_src *src);

/* The original vector (dim floats) of a record's stored one (rotated with codes). */
void dindex_rec_vector(const struct dindex *d, const struct hnsw_rec_hdr *r, float *out);
/* The same from a stored vector v (vdim floats: a record's, or uvec's of a level >= 1 node). */
void dindex_stored_vector(const struct dindex *d, const float *v, float *out);

/* What tells this load of the index from another of the same graph and generation number
 * (a graph dropped and loaded again): its metadata's CRC, rows and capacity (the key of its
 * id ranges in the cluster state, common/etcd/idrange.h). */
static inline uint64_t dindex_ids_tag(const struct dindex *d)
{
	return (uint64_t)d->meta_crc << 32 ^ (uint64_t)d->n * 0x9e3779b97f4a7c15ull ^ d->cap;
}

#endif
