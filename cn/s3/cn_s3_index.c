/* cn_s3_index.c: the online indexer of a graph-bound index (docs/api.md, "Online
 * indexing"). Every compute node with a gateway that the cluster state does not declare
 * down runs it (cn_s3_graph_ops.indexers), each on the rows whose key it wins by
 * rendezvous hashing among those nodes (struct owners), so the compute nodes index in
 * parallel and no row twice while the set stays the same. Every [s3] index_interval_ms
 * each
 *   1. reads the index's state from the first reachable replica of its bucket (the
 *      primary) and, when rows past the graph mark exist, up to [s3] index_batch live
 *      rows it owns from the mark on (FL_FRAG), skipping rows it has handed over already;
 *   2. inserts them into the graph through the compute node's online insert engine
 *      (cn_insert.h: INSERT of Malkov & Yashunin against remote memory; records are locked
 *      one at a time, so indexers on several nodes share the graph) on [s3] index_threads
 *      threads at efConstruction [s3] index_ef;
 *   3. makes the graph durable: every memory node snapshots the ranges it wrote;
 *   4. hands the batch to every replica of the bucket (FL_GINDEX: node id, key, CRC32C of
 *      the vector per row; logged there), which moves each replica's mark over the rows it
 *      holds (the mark stops at the first row no indexer has handed over yet; rows past it
 *      stay in the scan set and are merged with the graph's by key).
 * A row is in the tail's scan set until step 4 reached its replica, and in the graph only
 * once the graph holding it is durable, so no acknowledged row is ever in neither, across
 * restarts too (a graph restored from an older snapshot lacks only nodes whose rows are
 * still past the mark). A batch whose snapshot or hand-over failed is kept and handed over
 * again (to the replicas that missed it) before anything new is inserted; rows whose
 * insert failed stay in the tail (a full graph: -ENOSPC, counted and logged once). A
 * compute node that dies mid-batch leaves nodes nobody has a key for: they route but are
 * never returned; once the cluster state declares it down its rows belong to the others,
 * which index them again (and, past the mark, also rows it had handed over: two nodes of
 * one key, merged at query time). */
#include "cn_s3_int.h"
#include "s3_scope.h"
#include "util/dm_hash.h"
#include "util/dm_u64set.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IX_PIECE_BYTES (8u << 20)     /* row bytes per FL_FRAG answer */
#define IX_FULL_WAIT_NS 30000000000ull /* a full graph is tried again after this */
#define SEED_EVERY_NS 3000000000ull    /* how often the first indexer looks for indexes
					* created through the API that need a graph */
#define SEED_RETRY_NS 60000000000ull   /* after a seed that failed */
#define SEED_MAX_ROWS 1000000u         /* rows a seeded graph is built of, at most (the
					* online indexer inserts the rest) */
#define SEED_MAX_BYTES (1ull << 30)    /* ... and at most this many bytes of vectors in the
					* compute node's memory (the build holds them again) */

/* A batch inserted into the graph and not yet handed over to every replica. */
struct ipend {
	bool have, durable;
	char b[NAME_MAX_ + 1], x[NAME_MAX_ + 1];
	uint32_t mn;                     /* the primary it was read from, at created */
	int64_t created;
	uint64_t tag;
	uint32_t n;
	uint64_t *ids;
	char **keys;
	uint32_t *vcrc;
	uint64_t acked;                  /* replicas (by memory node id) that took it */
};

/* Row versions handed over for the current index (key hash ^ vector CRC): rows past a row
 * the mark stops at are read again, and must not be inserted twice. */
struct handed {
	char b[NAME_MAX_ + 1], x[NAME_MAX_ + 1];
	uint32_t mn;                     /* as struct ipend */
	int64_t created;
	uint64_t tag;
	struct dm_u64set set;
};

/* The indexers now (ascending compute node ids) and this one's place among them. */
struct owners {
	uint32_t n, self;
	uint32_t cns[DM_MAX_NODES];
};

/* Whether key k (kl bytes) is this indexer's: rendezvous hashing, the highest
 * dm_hash64(key hash ^ node) wins. */
static bool owns(const struct owners *o, const char *k, uint32_t kl)
{
	uint64_t kh, best = 0;
	uint32_t win = 0;

	if (o->n < 2)
		return true;
	kh = dm_fnv1a64(DM_FNV64_INIT, k, kl);
	for (uint32_t i = 0; i < o->n; i++) {
		uint64_t h = dm_hash64(kh ^ ((uint64_t)(o->cns[i] + 1) * DM_GOLDEN64));

		if (i == 0 || h > best) {
			best = h;
			win = o->cns[i];
		}
	}
	return win == o->self;
}

/* Rows of the index (live and dead) in state st: the positions the mark counts. */
static uint64_t state_rows(const struct ixstate *st)
{
	uint64_t total = 0;

	for (uint32_t i = 0; i < st->nfrag; i++)
		total += st->fr[i].rows;
	return total;
}

/* Rows read from the tail. */
struct tail {
	uint32_t n, max, dim;
	float *vec;
	char **keys;
	uint32_t *vcrc;
};

/* Only a cost when it fails: such a row may be inserted twice. */
static void handed_add(struct handed *hd, uint64_t h)
{
	if (!dm_u64set_reserve(&hd->set, 1))
		dm_u64set_add(&hd->set, h);
}

static void pend_free(struct ipend *p)
{
	for (uint32_t i = 0; p->keys && i < p->n; i++)
		free(p->keys[i]);
	free(p->keys);
	free(p->ids);
	free(p->vcrc);
	memset(p, 0, sizeof(*p));
}

static void tail_free(struct tail *t)
{
	for (uint32_t i = 0; t->keys && i < t->n; i++)
		free(t->keys[i]);
	free(t->keys);
	free(t->vec);
	free(t->vcrc);
	memset(t, 0, sizeof(*t));
}

/* One FL_FRAG piece of fragment f from row `from` into t (live rows of ours not handed
 * over); *next gets the row after the piece. */
static int read_piece(struct cn_s3 *s, const char *b, const char *x, const struct ixstate *st,
		      uint64_t f, uint32_t from, const struct owners *o,
		      const struct handed *hd, struct tail *t, uint32_t *next)
{
	struct dm_buf w = { 0 };
	uint8_t *resp = NULL;
	size_t rlen;
	uint32_t rows;
	const uint8_t *dead;
	int rc;

	dm_buf_str(&w, b);
	dm_buf_str(&w, x);
	dm_buf_u64(&w, st->epoch);
	dm_buf_u64(&w, (uint64_t)st->created);
	dm_buf_u64(&w, f);
	dm_buf_u32(&w, from);
	dm_buf_u32(&w, MY_MSG);
	dm_buf_u32(&w, IX_PIECE_BYTES);
	rc = mn_call(s, st->mn, DM_OP_FL_FRAG, &w, &resp, &rlen);   /* frees w */
	if (rc)
		return rc;
	struct dm_rbuf rb = { .p = resp, .n = rlen };

	rows = dm_rbuf_u32(&rb);
	dead = dm_rbuf_get(&rb, rows);
	if (rb.bad || rows <= from || rows > st->frag_rows) {
		rc = -EBADMSG;
		goto out;
	}
	for (uint32_t r = from; r < rows && !rc; r++) {
		uint32_t kl, ml, fl;
		const char *k = dm_rbuf_bytes(&rb, &kl, FLAT_KEY_MAX);
		const void *v;

		(void)dm_rbuf_bytes(&rb, &ml, DM_FL_MAX_STREAM);
		(void)dm_rbuf_bytes(&rb, &fl, DM_FL_MAX_STREAM);
		v = dm_rbuf_get(&rb, (size_t)st->dim * sizeof(float));
		if (rb.bad || !kl || memchr(k, 0, kl)) {
			rc = -EBADMSG;
			break;
		}
		if (dead[r] || t->n == t->max || !owns(o, k, kl))
			continue;
		float *dst = t->vec + (size_t)t->n * st->dim;

		memcpy(dst, v, (size_t)st->dim * sizeof(float));
		char *key = strndup(k, kl);

		if (!key) {
			rc = -ENOMEM;
			break;
		}
		uint32_t crc = flat_vec_crc(dst, st->dim);

		if (dm_u64set_has(&hd->set, flat_row_version(key, crc))) {
			free(key);
			continue;
		}
		t->keys[t->n] = key;
		t->vcrc[t->n] = crc;
		t->n++;
	}
	if (!rc && rb.at != rb.n)
		rc = -EBADMSG;
	*next = rows;
out:
	free(resp);
	return rc;
}

/* Up to t->max live rows of ours from the mark on (primary's state st). */
static int read_tail(struct cn_s3 *s, const char *b, const char *x, const struct ixstate *st,
		     const struct owners *o, const struct handed *hd, struct tail *t)
{
	for (uint64_t f = st->mark / st->frag_rows; f < st->nfrag && t->n < t->max; f++) {
		uint32_t from = f == st->mark / st->frag_rows ?
				(uint32_t)(st->mark % st->frag_rows) : 0;

		while (from < st->fr[f].rows && t->n < t->max) {
			int rc = read_piece(s, b, x, st, f, from, o, hd, t, &from);

			if (rc)
				return rc;
		}
	}
	return 0;
}

/* FL_GINDEX of batch p (NULL: the advance alone) on memory node mn, in pieces of at most
 * DM_FL_GINDEX_MAX entries (a seeded graph's batch is all its rows), in row order: each
 * piece moves the mark on. A piece sent again after a failure is harmless (the key log
 * keeps a node's latest key). */
static int hand_over(struct cn_s3 *s, uint32_t mn, const char *b, const char *x,
		     int64_t created, uint64_t tag, const struct ipend *p)
{
	uint32_t at = 0;
	int rc;

	do {
		uint32_t n = p ? DM_MIN(p->n - at, DM_FL_GINDEX_MAX) : 0;
		struct dm_buf w = { 0 };
		uint8_t *resp = NULL;
		size_t rlen;

		dm_buf_str(&w, b);
		dm_buf_str(&w, x);
		dm_buf_u64(&w, (uint64_t)created);
		dm_buf_u64(&w, tag);
		dm_buf_u32(&w, n);
		for (uint32_t i = at; i < at + n; i++) {
			dm_buf_u64(&w, p->ids[i]);
			dm_buf_str(&w, p->keys[i]);
			dm_buf_u32(&w, p->vcrc[i]);
		}
		rc = mn_call(s, mn, DM_OP_FL_GINDEX, &w, &resp, &rlen);   /* frees w */
		free(resp);
		at += n;
	} while (!rc && p && at < p->n);
	return rc;
}

/* Insert the tail rows t into generation gen of graph g: the inserted ones become batch p
 * (its tag: dm_graph_tag(g, gen)). */
static void insert_batch(struct cn_s3 *s, uint32_t g, const char *b, const char *x,
			 const struct ixstate *st, uint64_t gen, struct tail *t, struct ipend *p)
{
	struct s3_indexer *ix = &s->ix;
	uint64_t *ids = malloc((size_t)t->n * sizeof(*ids));
	int rc;

	if (!ids)
		return;
	uint64_t t0 = dm_now_ns();

	rc = s->gops->insert(s->gctx, g, gen, t->vec, t->n, st->dim, ix->ef, ix->threads, ids);
	__atomic_add_fetch(&ix->insert_ns, dm_now_ns() - t0, __ATOMIC_RELAXED);
	if (rc < (int)t->n) {
		bool full = rc == -ENOSPC || rc == -ENOENT;

		__atomic_add_fetch(&ix->errors, 1, __ATOMIC_RELAXED);
		if (!full || !ix->full_until[g])
			dm_warn("cn%u: s3: indexer: %s/%s: %d of %u rows inserted into the graph%s%s; "
				"the others stay in the tail (scanned exactly)%s", s->node->id, b, x,
				rc > 0 ? rc : 0, t->n, rc < 0 ? ": " : "",
				rc == -ENOENT ? "the graph has no spare room (dmann load --spare)" :
				rc < 0 ? strerror(-rc) : "",
				full ? "; trying again every 30 s" : "");
		/* A full graph: try again later, not every round. */
		ix->full_until[g] = full ? dm_now_ns() + IX_FULL_WAIT_NS : 0;
	}
	if (rc <= 0) {
		free(ids);
		return;
	}
	*p = (struct ipend){ .have = true, .mn = st->mn, .created = st->created,
			     .tag = dm_graph_tag(g, gen),
			     .ids = calloc((size_t)rc, sizeof(uint64_t)),
			     .keys = calloc((size_t)rc, sizeof(char *)),
			     .vcrc = calloc((size_t)rc, sizeof(uint32_t)) };
	snprintf(p->b, sizeof(p->b), "%s", b);
	snprintf(p->x, sizeof(p->x), "%s", x);
	if (!p->ids || !p->keys || !p->vcrc) {
		pend_free(p);   /* the nodes stay keyless: the rows are indexed again later */
		free(ids);
		return;
	}
	for (uint32_t i = 0; i < t->n; i++) {
		if (ids[i] == UINT64_MAX)
			continue;
		p->ids[p->n] = ids[i];
		p->keys[p->n] = t->keys[i];
		p->vcrc[p->n] = t->vcrc[i];
		t->keys[i] = NULL;
		p->n++;
	}
	free(ids);
}

/* Drop the record caches of this and every other compute node with a gateway that the
 * cluster state does not declare down (the others through the internal CacheClear; one
 * that does not answer within 5 s is cut off and is warned about). */
static void clear_caches(struct cn_s3 *s)
{
	struct hcall calls[DM_MAX_NODES];
	uint32_t nc = 0, live[DM_MAX_NODES], nl;
	uint64_t until = dm_now_ns() + 5000000000ull;

	if (s->gops->cache_clear)
		s->gops->cache_clear(s->gctx);
	nl = s->gops->indexers(s->gctx, live);
	for (uint32_t i = 0; i < nl; i++) {
		uint32_t c = live[i];

		if (c == s->node->id)
			continue;
		if (hcall_start(s, &calls[nc], c, "CacheClear", "{}"))
			nc++;
		else
			dm_warn("cn%u: s3: indexer: cannot reach cn%u to drop its record cache",
				s->node->id, c);
	}
	for (;;) {
		struct pollfd pfd[DM_MAX_NODES];
		uint32_t np = 0, idx[DM_MAX_NODES];

		for (uint32_t i = 0; i < nc; i++)
			if (!calls[i].done) {
				pfd[np] = (struct pollfd){ .fd = calls[i].fd, .events = POLLIN |
					(calls[i].sent < calls[i].out.n ? POLLOUT : 0) };
				idx[np++] = i;
			}
		if (!np || dm_now_ns() >= until)
			break;
		if (poll(pfd, np, 100) < 0 && errno != EINTR)
			break;
		for (uint32_t k = 0; k < np; k++)
			if (pfd[k].revents)
				hcall_io(&calls[idx[k]], pfd[k].revents);
	}
	for (uint32_t i = 0; i < nc; i++) {
		if (!calls[i].done || calls[i].failed)
			dm_warn("cn%u: s3: indexer: cn%u did not drop its record cache (%s); its "
				"searches may miss the new rows until it does", s->node->id,
				calls[i].cn, calls[i].done ? "failed" : "no answer in 5 s");
		hcall_fini(&calls[i]);
	}
}

/* One round on the index graph g serves (if any); true when it handed over a full batch
 * (more rows may be waiting: the next round starts at once). */
static bool round_once(struct cn_s3 *s, uint32_t g, struct ipend *p, struct handed *hd)
{
	struct s3_indexer *ix = &s->ix;
	bool more = false;
	char b[NAME_MAX_ + 1], x[NAME_MAX_ + 1];
	uint32_t mns[DM_MAX_NODES];
	struct ixstate st;
	struct owners own = { .self = s->node->id };
	uint64_t gen, tag, total;
	int nm, pi = -1;
	bool in = false;

	ix->glag[g] = 0;
	if (s->gops->bound(s->gctx, g, b, x, &gen))
		return false;
	tag = dm_graph_tag(g, gen);
	own.n = s->gops->indexers(s->gctx, own.cns);
	for (uint32_t i = 0; i < own.n; i++)
		in |= own.cns[i] == own.self;
	if (!in)
		return false;
	nm = bucket_mns(s, b, mns);
	int gone = 0, asked = 0;

	for (int i = 0; i < nm && pi < 0; i++) {
		int rc;

		if (replica_stale(s, b, mns[i]))
			continue;         /* not caught up: neither the state nor "gone" from it */
		asked++;
		rc = mn_is_down(s, mns[i]) ? -EHOSTDOWN : ixstate_fetch(s, mns[i], b, x, &st);
		if (rc == 0)
			pi = i;
		gone += rc == -ENOENT;
	}
	if (pi < 0 && asked > 0 && gone == asked && own.cns[0] == own.self && s->gops->drop) {
		/* Every replica says the index is gone (DeleteIndex, DeleteVectorBucket: an
		 * import creates its index before it places the graph, so this is not one in
		 * progress): its graph is freed. The first indexer does it; a memory node that
		 * restarts from an older snapshot brings the graph back, and it is dropped
		 * again here. */
		int rc = s->gops->drop(s->gctx, g);

		dm_info("cn%u: s3: index %s/%s is gone: graph %u %s", s->node->id, b, x, g,
			rc ? "could not be dropped yet" : "dropped");
		if (!rc)
			__atomic_add_fetch(&ix->graphs_dropped, 1, __ATOMIC_RELAXED);
		pend_free(p);
	}
	if (pi < 0)
		return false;
	if (st.mark_tag != tag) {
		/* The index is not (or no longer) this graph's. Another graph number serves
		 * it (an import while a graph was seeded for it; the import's mark wins): this
		 * graph is dropped by the first indexer. (The same number with another
		 * generation is a reload our view has not caught up with yet.) */
		if (st.mark_tag && (st.mark_tag >> 32) != g && own.cns[0] == own.self &&
		    s->gops->drop) {
			dm_info("cn%u: s3: graph %u of %s/%s is superseded by graph %llu: dropped",
				s->node->id, g, b, x, (unsigned long long)(st.mark_tag >> 32));
			if (!s->gops->drop(s->gctx, g))
				__atomic_add_fetch(&ix->graphs_dropped, 1, __ATOMIC_RELAXED);
			pend_free(p);
		}
		goto out;
	}
	if (!st.mark && own.cns[0] != own.self && !p->have)
		goto out;   /* a graph just seeded: the first indexer hands its rows over first */
	/* Another index, generation or incarnation (each replica has its own creation time:
	 * compared on the same memory node only) starts afresh. */
	if (strcmp(hd->b, b) || strcmp(hd->x, x) || hd->tag != tag ||
	    (hd->mn == st.mn && hd->created != st.created)) {
		dm_u64set_free(&hd->set);
		*hd = (struct handed){ .tag = tag };
		snprintf(hd->b, sizeof(hd->b), "%s", b);
		snprintf(hd->x, sizeof(hd->x), "%s", x);
	}
	hd->mn = st.mn;
	hd->created = st.created;
	if (p->have && (strcmp(p->b, b) || strcmp(p->x, x) || p->tag != tag ||
			(p->mn == st.mn && p->created != st.created)))
		pend_free(p);           /* re-created or imported again meanwhile */
	total = state_rows(&st);
	ix->glag[g] = total > st.mark ? total - st.mark : 0;
	if (!p->have && total > st.mark && dm_now_ns() >= ix->full_until[g]) {
		struct tail t = { .max = ix->batch, .dim = st.dim };

		t.vec = malloc((size_t)t.max * st.dim * sizeof(float));
		t.keys = calloc(t.max, sizeof(char *));
		t.vcrc = calloc(t.max, sizeof(uint32_t));
		if (t.vec && t.keys && t.vcrc && read_tail(s, b, x, &st, &own, hd, &t) == 0 && t.n)
			insert_batch(s, g, b, x, &st, gen, &t, p);
		tail_free(&t);
	}
	if (p->have && !p->durable) {
		uint64_t t0 = dm_now_ns();
		int rc = s->gops->snapshot(s->gctx);

		__atomic_add_fetch(&ix->snapshots, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&ix->snapshot_ns, dm_now_ns() - t0, __ATOMIC_RELAXED);
		if (rc) {
			__atomic_add_fetch(&ix->errors, 1, __ATOMIC_RELAXED);
			dm_warn("cn%u: s3: indexer: the snapshot of the graph failed (%s); %u rows "
				"wait in the tail", s->node->id, strerror(-rc), p->n);
			goto out;
		}
		p->durable = true;
		/* Compute nodes cache records: the ones these inserts back-linked are stale in
		 * their caches, and a search through a stale copy cannot reach the new nodes.
		 * Every cache is dropped before the rows leave the tail. */
		clear_caches(s);
	}
	/* The hand-over to every replica of the bucket (or, with nothing new, the advance
	 * alone: rows that reached a replica after the entries that hold them). */
	bool all = true;
	uint32_t unreached[DM_MAX_NODES], nun = 0;

	for (int i = 0; i < nm; i++) {
		uint64_t bit = 1ull << (mns[i] % 64);
		int rc;

		if (p->have && (p->acked & bit))
			continue;
		if (replica_stale(s, b, mns[i])) {
			/* a catch-up brings it the mark (and logs what it gets meanwhile) */
			if (!mn_is_down(s, mns[i]))
				hand_over(s, mns[i], b, x, st.created, tag, p->have ? p : NULL);
			continue;
		}
		if (mn_is_down(s, mns[i])) {
			all = false;
			if (p->have)
				unreached[nun++] = mns[i];
			continue;
		}
		/* Each replica created its copy of the index at its own instant: requests name
		 * that replica's creation time. */
		int64_t created = st.created;

		if (i != pi) {
			struct ixstate rs;

			rc = ixstate_fetch(s, mns[i], b, x, &rs);
			if (!rc) {
				created = rs.created;
				ixstate_fini(&rs);
			} else if (rc != -ENOENT) {
				if (p->have) {
					all = false;
					__atomic_add_fetch(&ix->errors, 1, __ATOMIC_RELAXED);
					if (rc == -EHOSTDOWN)
						unreached[nun++] = mns[i];
				}
				continue;
			}
		}
		rc = hand_over(s, mns[i], b, x, created, tag, p->have ? p : NULL);
		if (!rc && p->have)
			p->acked |= bit;
		if (rc && rc != -ENOENT && rc != -ESTALE && p->have) {
			all = false;
			__atomic_add_fetch(&ix->errors, 1, __ATOMIC_RELAXED);
			if (rc == -EHOSTDOWN)
				unreached[nun++] = mns[i];
		}
	}
	/* Replicas that cannot be reached while the others took the batch (the primary, whose
	 * rows these are, among them): marked stale, the batch counts as handed over (their
	 * catch-up brings them the mark). Other failures keep the batch for the next round. */
	if (p->have && !all && nun && (p->acked & (1ull << (st.mn % 64))) && repl_marks(s)) {
		uint32_t failed = 0;

		for (int i = 0; i < nm; i++)
			if (!(p->acked & (1ull << (mns[i] % 64))) && !replica_stale(s, b, mns[i]))
				failed++;
		if (failed == nun) {
			bool marked = true;

			for (uint32_t i = 0; i < nun && marked; i++)
				marked = mark_stale(s, b, unreached[i]) == 0;
			all = marked;
		}
	}
	if (p->have && all) {
		dm_info("cn%u: s3: indexer: %u rows of %s/%s handed over to the graph (%llu rows "
			"were past the mark)", s->node->id, p->n, b, x,
			(unsigned long long)(total - st.mark));
		for (uint32_t i = 0; i < p->n; i++)
			handed_add(hd, flat_row_version(p->keys[i], p->vcrc[i]));
		__atomic_add_fetch(&ix->rows, p->n, __ATOMIC_RELAXED);
		__atomic_add_fetch(&ix->batches, 1, __ATOMIC_RELAXED);
		more = p->n >= ix->batch;
		pend_free(p);
	}
out:
	ixstate_fini(&st);
	return more;
}

/* FL_MARK rows 0 with tag on every replica of b/x: the graph is bound to the index with
 * nothing below its mark yet. 0 or -errno. */
static int mark_bind(struct cn_s3 *s, const char *b, const char *x, uint64_t tag)
{
	uint32_t mns[DM_MAX_NODES], all[DM_MAX_NODES];
	int nm = bucket_read_mns(s, b, mns), na = bucket_mns(s, b, all);
	int64_t created0 = 0;

	for (int i = 0; i < nm; i++) {
		struct ixstate rs;
		struct dm_buf w = { 0 };
		uint8_t *resp = NULL;
		size_t rlen;
		int rc = ixstate_fetch(s, mns[i], b, x, &rs);

		if (rc)
			return rc;
		if (!i)
			created0 = rs.created;
		dm_buf_str(&w, b);
		dm_buf_str(&w, x);
		dm_buf_u64(&w, (uint64_t)rs.created);
		dm_buf_u64(&w, 0);
		dm_buf_u64(&w, tag);
		ixstate_fini(&rs);
		rc = mn_call(s, mns[i], DM_OP_FL_MARK, &w, &resp, &rlen);   /* frees w */
		free(resp);
		if (rc)
			return rc;
	}
	/* Stale replicas last, best effort, named by the first caught-up replica's creation
	 * time: refused by their old copy, but a catch-up in progress logs it and runs it
	 * again once the image (with that creation time) is installed. */
	for (int i = 0; nm > 0 && i < na; i++) {
		struct dm_buf w = { 0 };
		uint8_t *resp = NULL;
		size_t rlen;

		if (!replica_stale(s, b, all[i]) || mn_is_down(s, all[i]))
			continue;
		dm_buf_str(&w, b);
		dm_buf_str(&w, x);
		dm_buf_u64(&w, (uint64_t)created0);
		dm_buf_u64(&w, 0);
		dm_buf_u64(&w, tag);
		mn_call(s, all[i], DM_OP_FL_MARK, &w, &resp, &rlen);   /* frees w */
		free(resp);
	}
	return nm > 0 ? 0 : -EHOSTDOWN;
}

/* Seed a graph for index b/x (created through the API, never bound; state st from its
 * primary): read its live rows (at most SEED_MAX_ROWS), build and place a graph of them
 * (gops->seed), bind it (mark_bind), and leave the rows as the graph's pending batch pg so
 * that the graph's own round makes it durable and hands them over (the mark then moves
 * over them on every replica, by key and vector). */
static void seed_one(struct cn_s3 *s, const char *b, const char *x, const struct ixstate *st,
		     struct ipend *pall)
{
	struct s3_indexer *ix = &s->ix;
	struct owners all = { .n = 1, .self = s->node->id };
	struct handed none = { 0 };
	struct tail t = { .dim = st->dim };
	uint64_t total = state_rows(st), gen = 0, t0 = dm_now_ns();
	uint32_t g = 0;
	int rc;

	t.max = (uint32_t)DM_MIN(DM_MIN(total, (uint64_t)SEED_MAX_ROWS),
				 SEED_MAX_BYTES / ((uint64_t)st->dim * sizeof(float)));
	all.cns[0] = s->node->id;
	t.vec = malloc((size_t)t.max * st->dim * sizeof(float));
	t.keys = calloc(t.max, sizeof(char *));
	t.vcrc = calloc(t.max, sizeof(uint32_t));
	rc = t.vec && t.keys && t.vcrc ? read_tail(s, b, x, st, &all, &none, &t) : -ENOMEM;
	if (!rc && t.n < 2)
		rc = -ENODATA;   /* nearly everything deleted: wait for more rows */
	if (!rc)
		rc = s->gops->seed(s->gctx, b, x, st->metric, st->dim, t.vec, t.keys, t.n,
				   ix->seed_room, ix->ef, ix->threads, &g, &gen);
	if (!rc)
		rc = mark_bind(s, b, x, dm_graph_tag(g, gen));
	if (rc) {
		/* logged where it failed; tried again after SEED_RETRY_NS */
		if (rc != -ENODATA) {
			dm_warn("cn%u: s3: no graph for %s/%s yet (%s); the exact path serves it, "
				"next try in %llu s", s->node->id, b, x, strerror(-rc),
				SEED_RETRY_NS / 1000000000ull);
			ix->seed_next = dm_now_ns() + SEED_RETRY_NS;
		}
		/* a graph placed but not bound: the round of graph g sees no mark of its
		 * tag and leaves it; the next seeding takes another number */
		tail_free(&t);
		return;
	}
	struct ipend *p = &pall[g];

	pend_free(p);
	*p = (struct ipend){ .have = true, .mn = st->mn, .created = st->created,
			     .tag = dm_graph_tag(g, gen), .n = t.n,
			     .ids = calloc(t.n, sizeof(uint64_t)), .keys = t.keys, .vcrc = t.vcrc };
	snprintf(p->b, sizeof(p->b), "%s", b);
	snprintf(p->x, sizeof(p->x), "%s", x);
	t.keys = NULL;
	t.vcrc = NULL;
	if (!p->ids) {
		pend_free(p);   /* not handed over: the online indexer inserts the rows */
	} else {
		for (uint32_t i = 0; i < p->n; i++)
			p->ids[i] = i;
	}
	__atomic_add_fetch(&ix->seeded, 1, __ATOMIC_RELAXED);
	dm_info("cn%u: s3: %s/%s: a graph of its %u rows built and placed as graph %u in %.1f s; "
		"the online indexer keeps it current", s->node->id, b, x, t.n, g,
		(double)(dm_now_ns() - t0) / 1e9);
	tail_free(&t);
}

/* One look at the indexes jx (a ListIndexes answer) of bucket b (a bucket of one shard or
 * a shard's bucket "B#s"): the first that needs a graph gets one, or an unbound graph is
 * dropped at its second look. true when it did something (one index per look). */
static bool seed_look(struct cn_s3 *s, const char *b, json_t *jx, struct ipend *p)
{
	struct s3_indexer *ix = &s->ix;
	json_t *xe;
	size_t xi;
	bool done = false;
	uint32_t mns[DM_MAX_NODES];
	int nm = bucket_read_mns(s, b, mns);

	json_array_foreach(json_object_get(jx, "indexes"), xi, xe) {
		const char *x = json_string_value(json_object_get(xe, "indexName"));
		struct cn_s3_graph_info gi;
		struct ixstate st;
		uint64_t total;
		int got = -1;

		if (!x || done)
			continue;
		for (int i = 0; i < nm && got; i++)
			if (!mn_is_down(s, mns[i]))
				got = ixstate_fetch(s, mns[i], b, x, &st);
		if (got)
			continue;
		total = state_rows(&st);
		char sk[S3_SCOPE_KEY_MAX + 1];

		if (s3_scope_conf_key(st.conf, st.conf_len, sk) == 1) {
			/* a scoped index: no graph (docs/status.md), its queries stay exact */
		} else if (st.mark_tag) {
			/* imported or seeded: a graph serves it */
		} else if (!s->gops->info(s->gctx, b, x, 0, &gi)) {
			/* A graph placed for it but never bound (a seed or an import whose mark
			 * failed): seen so at two looks in a row (an import marks right after it
			 * places), it is dropped, and the next look seeds the index again. */
			uint64_t tg = dm_graph_tag(gi.graph, gi.gen) + 1;

			if (ix->unbound_seen == tg) {
				dm_info("cn%u: s3: graph %u of %s/%s was never bound: dropped",
					s->node->id, gi.graph, b, x);
				s->gops->drop(s->gctx, gi.graph);
				tg = 0;
			}
			ix->unbound_seen = tg;
			done = true;
		} else if (total >= DM_MAX(s->graph_min_rows, 2ull)) {
			seed_one(s, b, x, &st, p);
			done = true;
		}
		ixstate_fini(&st);
	}
	return done;
}

/* Every SEED_EVERY_NS on the first indexer: an index created through the API that holds
 * graph_min_rows rows, has no graph (no mark tag: neither imported nor seeded) gets one
 * (seed_one; one index per look). In a bucket of several shards each shard's index (in
 * bucket "B#s", created with the index) is an index of its own on the memory nodes and
 * gets its own graph, indexed online like any; the gateway queries every shard's graph
 * and merges (cn_s3_query.c). */
static void seed_round(struct cn_s3 *s, struct ipend *p)
{
	struct s3_indexer *ix = &s->ix;
	struct owners own = { .self = s->node->id };
	struct s3_resp rb = { 0 };
	json_t *jb = NULL;
	uint64_t now = dm_now_ns();
	bool done = false;

	if (!ix->seed_auto || !s->gops->seed || now < ix->seed_next)
		return;
	ix->seed_next = now + SEED_EVERY_NS;
	own.n = s->gops->indexers(s->gctx, own.cns);
	if (!own.n || own.cns[0] != own.self)
		return;
	static const char lb[] = "{\"maxResults\":500}";

	be_handle(s, "ListVectorBuckets", lb, sizeof(lb) - 1, &rb);
	if (rb.status == 200)
		jb = json_loadb(rb.body, rb.len, 0, NULL);
	s3_resp_free(&rb);
	json_t *bl = json_object_get(jb, "vectorBuckets"), *be;
	size_t bi;

	json_array_foreach(bl, bi, be) {
		const char *b = json_string_value(json_object_get(be, "vectorBucketName"));
		struct s3_resp rx = { 0 };
		json_t *jx = NULL;
		char body[FLAT_NAME_MAX + 64], sb[NAME_MAX_ + 1];
		uint32_t nsh = 1;
		int bl_len;

		if (!b || done)
			continue;
		if (bucket_shards(s, b, false, &nsh, &rx)) {
			s3_resp_free(&rx);
			continue;
		}
		s3_resp_free(&rx);
		bl_len = snprintf(body, sizeof(body), "{\"vectorBucketName\":\"%s\",\"maxResults\":500}",
				  b);
		be_handle(s, "ListIndexes", body, (size_t)bl_len, &rx);
		if (rx.status == 200)
			jx = json_loadb(rx.body, rx.len, 0, NULL);
		s3_resp_free(&rx);
		for (uint32_t sh = 0; sh < nsh && !done; sh++)
			if (!s3_shard_name(b, sh, sb))
				done = seed_look(s, sb, jx, p);
		json_decref(jx);
	}
	json_decref(jb);
}

/* A round on every graph; true when one of them handed over a full batch. */
static bool rounds(struct cn_s3 *s, struct ipend *p, struct handed *hd)
{
	uint64_t lag = 0;
	bool more = false;

	seed_round(s, p);

	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		more |= round_once(s, g, &p[g], &hd[g]);
		lag += s->ix.glag[g];
	}
	__atomic_store_n(&s->ix.lag, lag, __ATOMIC_RELAXED);
	return more;
}

static void *indexer_main(void *arg)
{
	struct cn_s3 *s = arg;
	struct s3_indexer *ix = &s->ix;
	/* per graph number: the batch not yet handed over, the rows handed over */
	struct ipend *p = calloc(DM_MAX_GRAPHS, sizeof(*p));
	struct handed *hd = calloc(DM_MAX_GRAPHS, sizeof(*hd));
	bool more = false;

	if (!p || !hd) {
		dm_warn("cn%u: s3: no online indexer: out of memory", s->node->id);
		free(p);
		free(hd);
		return NULL;
	}

	pthread_mutex_lock(&ix->mu);
	while (!ix->stop) {
		struct timespec ts;

		if (more) {             /* a full batch went: rows may be waiting */
			pthread_mutex_unlock(&ix->mu);
			more = rounds(s, p, hd);
			pthread_mutex_lock(&ix->mu);
			continue;
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += ix->interval_ms / 1000;
		ts.tv_nsec += (long)(ix->interval_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&ix->cv, &ix->mu, &ts);
		if (ix->stop)
			break;
		pthread_mutex_unlock(&ix->mu);
		more = rounds(s, p, hd);
		pthread_mutex_lock(&ix->mu);
	}
	pthread_mutex_unlock(&ix->mu);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		pend_free(&p[g]);
		dm_u64set_free(&hd[g].set);
	}
	free(p);
	free(hd);
	return NULL;
}

void indexer_start(struct cn_s3 *s)
{
	struct s3_indexer *ix = &s->ix;

	if (ix->started || !s->gops || !s->gops->insert || !ix->interval_ms)
		return;
	pthread_mutex_init(&ix->mu, NULL);
	pthread_cond_init(&ix->cv, NULL);
	ix->stop = false;
	if (pthread_create(&ix->t, NULL, indexer_main, s)) {
		dm_warn("cn%u: s3: no online indexer: %s", s->node->id, strerror(errno));
		pthread_cond_destroy(&ix->cv);
		pthread_mutex_destroy(&ix->mu);
		return;
	}
	ix->started = true;
}

void indexer_stop(struct cn_s3 *s)
{
	struct s3_indexer *ix = &s->ix;

	if (!ix->started)
		return;
	pthread_mutex_lock(&ix->mu);
	ix->stop = true;
	pthread_cond_signal(&ix->cv);
	pthread_mutex_unlock(&ix->mu);
	pthread_join(ix->t, NULL);
	pthread_cond_destroy(&ix->cv);
	pthread_mutex_destroy(&ix->mu);
	ix->started = false;
}
