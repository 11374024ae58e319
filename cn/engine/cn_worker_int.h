/* cn_worker_int.h: what the compute-node worker's two files share (cn_worker.c: client
 * connection, query slots, routing, the loop; cn_read.c: READ posting and completions,
 * memory-node connections and read failover): the worker's state and the slots' states. */
#ifndef DM_CN_WORKER_INT_H
#define DM_CN_WORKER_INT_H

#include "cn.h"
#include "cn_insert.h"
#include "hnsw/hnsw_query.h"

#define DEPTH 32
#define SEND_SLOTS (2 * DEPTH)
#define SEND_SLOT_SIZE (DM_FWD_INNER_OFF + DM_WIRE_HDR_LEN + sizeof(struct dm_wire_q_result) + \
			16u * DM_Q_MAX_K)
#define MAX_REREADS 3           /* torn reads of a record from one replica, then the next */
#define READ_TIMEOUT_NS 5000000000ull   /* READs unanswered this long: their node is down */
#define SQ_LIMIT 200            /* READ work requests in flight per memory node */
#define PIECE 32                /* READs per read_batch call (fits any send queue) */
#define LOC_BLK_SLOTS 1024u     /* open-addressed set of a query's distinct blocks */
#define LOC_BLK_MAX 768u        /* ... which stops growing (saturates) at this many */

/* wr_id layout for READs: tag | last-of-piece | READs in the piece << 32 | slot << 16 |
 * memory node */
#define WR_READ_TAG (1ull << 62)
#define WR_LAST     (1ull << 61)
#define WR_SEND_TAG (1ull << 60)

/* Backlog entry: pool index | flags | length << 32. */
#define BL_FWD     (1u << 30)   /* SERVE: a FWD_QUERY (query at DM_FWD_INNER_OFF) */
#define BL_BOUNCED (1u << 31)   /* a FWD_BOUNCE of our own query: run it here */
#define BL_LOCAL   (1u << 29)   /* routed to this CN: decided once, kept while it waits */
#define BL_SPILLED (1u << 28)   /* with BL_LOCAL: this CN is not its top-ranked one */
#define BL_FLAGS   (BL_FWD | BL_BOUNCED | BL_LOCAL | BL_SPILLED)
#define BL_INDEX   0x0fffffffu

#define FWD_TRACK 512                    /* forwarded queries in flight per worker */
#define FWD_TIMEOUT_NS 25000000000ull    /* a forwarded query unanswered this long fails */

enum { S_FREE, S_ISSUE, S_WAIT, S_DONE };

struct qslot {
	int state;
	uint32_t g;                  /* its graph number: it runs on the worker's view v[g] */
	bool l2;                     /* its graph's metric is L2 (answers give the root) */
	struct hnsw_query *q;
	uint64_t qid, t0;
	uint32_t k;
	uint32_t pending;            /* pieces of READs outstanding */
	int err;
	uint8_t *stage;              /* one record per batch entry */
	uint8_t *remote;             /* per batch entry: 1 read remotely this time, 2 from the
				      * cache, 3 a READ still to post (send queue was full) */
	uint8_t *rrep;               /* per batch entry: the replica (block table column) it is
				      * read from */
	uint8_t *tried;              /* per batch entry: replicas that failed it (bit mask) */
	uint16_t pend_mn[DM_MAX_NODES];   /* pieces outstanding per memory node */
	uint64_t t_post;             /* last READ posted */
	bool repost;                 /* READs wait to be posted: room in a send queue, or
				      * failed over to another replica */
	uint32_t reads, round_trips, cache_hits, rereads, rereads_left;
	uint64_t bytes;
	/* Locality (cn_read.c loc_*): memory nodes the query's READs went to (bitmap), the
	 * sum over its round trips of their distinct memory nodes, its distinct blocks (set of
	 * block + 1, cleared when the query starts). */
	uint64_t loc_mn[DM_MAX_NODES / 64];
	uint32_t loc_rt_mns, loc_nblk;
	uint32_t *loc_blk;           /* LOC_BLK_SLOTS entries */
	int nhits;                   /* results, once S_DONE (-1: not extracted yet) */
	struct dm_hit *hits;         /* DM_Q_MAX_K entries */
	bool spilled;                /* runs here though another CN is its home */
	bool fwded;                  /* SERVE: answer with FWD_RESULT carrying fwd */
	struct dm_wire_fwd fwd;
};

struct worker {
	struct cn *cn;
	struct dm_conn *client;
	struct dm_mr *smr;
	uint8_t *sbuf;
	bool sfree[SEND_SLOTS];
	int16_t sconn[SEND_SLOTS];   /* connection of a busy slot: -1 client, else mc[] index */
	uint8_t *stage_mem;
	struct dm_mr *stage_mr;
	size_t stage_size;           /* bytes per slot: room for stage_recs records of the
				      * largest record size of the views bound */
	uint32_t stage_recs;
	struct qslot slot[DEPTH];
	uint64_t backlog[256];       /* RECV wr_ids of queries waiting for a slot */
	uint32_t nbacklog;
	struct dm_rdma_wr *wrs;      /* READ work requests of one batch, grouped by node */
	struct dm_conn *mc[DM_MAX_NODES];
	uint32_t inflight[DM_MAX_NODES];
	bool sq_full[DM_MAX_NODES];  /* a post to mc[m] got -EAGAIN: wait for its completions */
	unsigned mepoch[DM_MAX_NODES];   /* cn->mn_epoch[m] that mc[m] belongs to */
	uint64_t to_check;           /* last scan for READs past READ_TIMEOUT_NS */
	uint64_t noreplica_log;      /* last "no live replica" warning */
	uint64_t salvage_log;        /* last "read salvaged" warning */
	uint32_t nmn;
	unsigned gen;
	struct qslot *cur;           /* the slot being stepped (for src.get) */
	/* Per graph number: the view this worker's queries of that graph run on (counted in
	 * its users), its record source, and whether cn's view of the graph moved on (the
	 * graph's queries in flight finish, new ones wait, then it is bound again). */
	struct wview {
		struct dindex *d;
		struct hnsw_src src;
		bool draining;
	} v[DM_MAX_GRAPHS];
	bool restage;                /* a view needs larger staging: start nothing until every
				      * slot is free, then reallocate it */
	bool client_gone;
	struct ctl_req {
		uint64_t wr_id;
		uint32_t len;
	} ctlq[64];                  /* libdmann keeps up to 32 C_CALLs in flight */
	uint32_t nctl;
	struct cn_call call;         /* answer buffer of C_CALL */
	struct cn_insert *ins;       /* Q_INSERT engine (cn_insert.h), made on first use */
	bool serve;                  /* client is a memory node's SERVE connection */
	bool reads;                  /* connected to the memory nodes (cn_read_sync): from the
					first message that may READ; a client that only sends
					control requests (dmann route, dmann status) never is */
	bool hello[DM_MAX_NODES];    /* FWD_HELLO sent on mc[m] */
	uint32_t rng;
	uint64_t fres[256];          /* FWD_RESULTs waiting for a send slot to the client */
	uint32_t nfres;
	uint32_t fwd_out;            /* queries forwarded, answer not back yet */
	struct fwdq {                /* each of them: the client's qid, when, through which MN */
		uint64_t qid, t0;
		uint16_t m, target;  /* through which memory node, to which compute node */
		bool used, failed;   /* failed: its memory-node connection closed */
	} fq[FWD_TRACK];
	uint64_t fq_check;           /* last expiry scan */
	/* Waiting: with wake_on, every connection of the worker and its call threads wake
	 * `wake` (armed: the worker is about to sleep on it); otherwise the worker polls. */
	struct dm_notify wake;
	bool wake_on, armed;
};

/* The view a slot's query runs on. */
static inline const struct dindex *slot_view(const struct worker *w, const struct qslot *q)
{
	return w->v[q->g].d;
}

static inline void fail(struct qslot *q, int err)
{
	if (!q->err)
		q->err = err;
}

/* cn_worker.c: all READs of the slot's batch are in: validate, cache, step the query. */
void cn_worker_advance(struct worker *w, struct qslot *q);

/* cn_read.c */
/* Close the connection to memory node i (forwarded queries on it fail, its send slots are
 * free; its READs are not accounted: see cn_read_sync / the failover). */
void cn_read_close(struct worker *w, uint32_t i);
void cn_read_close_all(struct worker *w);
/* Follow the memory nodes' up/down epochs: drop connections of an older epoch (their READs
 * fail over), connect to the nodes that are up. */
void cn_read_sync(struct worker *w);
/* Memory node m failed under this worker (error completion, post or poll error, timeout):
 * mark it down (if nobody did since we connected) and fail its READs over. */
void cn_read_failed(struct worker *w, uint32_t m, int err);
/* READs unanswered for READ_TIMEOUT_NS: their memory node counts as failed. */
void cn_read_timeouts(struct worker *w, uint64_t now);
/* Post the READs of the slot's batch (see cn_read.c). */
void cn_read_issue(struct worker *w, struct qslot *q);
/* One READ completion. */
void cn_read_wc(struct worker *w, const struct dm_wc *wc);

#endif
