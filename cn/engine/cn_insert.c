/* cn_insert.c: online inserts into the remote HNSW graph (cn_insert.h): the engine's
 * memory-node connections and synchronous one-sided operations, the level-0 search through
 * the resumable query, neighbour selection, the new record and the locked back-links. */
#include "cn_insert.h"

#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hnsw/hnsw_codes.h"
#include "hnsw/hnsw_query.h"
#include "cn_upper.h"
#include "rpc.h"
#include "wire.h"
#include "xport/xport.h"

#define INS_BEAM 32u           /* level-0 candidates expanded per READ round */
#define INS_REREADS 3u         /* torn reads of a record from one replica, then the next */
#define INS_WAIT_MS 5000
#define INS_TORN_WAIT_NS 5000000000ull   /* a record held or torn on every copy this long:
					    -EIO */

struct ins_cand {
	float d;                     /* raw score to the new node */
	uint32_t id;
};

struct cn_insert {
	struct cn *cn;
	struct dm_conn *mc[DM_MAX_NODES];
	uint64_t wr;                 /* wr_id counter */
	bool torn;                   /* test mode: records written in 64-byte pieces */
	bool mn_atomics;             /* the device has no atomics: CTL_ATOMIC to the MN's CPU */
	struct dm_rpc_chan ch[DM_MAX_NODES];   /* with mn_atomics: one per connection */
	bool has_ch[DM_MAX_NODES];
	uint64_t die_after, locks;   /* test mode: SIGKILL ourselves holding lock die_after */
	/* registered buffer: stage (stage_recs records) | rec (one record) | word (8 bytes) */
	uint8_t *buf;
	size_t buf_len;
	struct dm_mr *mr;
	uint32_t rec_size, stage_recs;
	uint8_t *stage, *rec;
	uint64_t *word;
	uint32_t *staged;            /* ids of the records in stage */
	uint32_t nstaged;
	struct hnsw_query *q;
	uint32_t qdim;
	struct hnsw_qest *qe;
	/* vectors of the records read by one insert's search: id -> row of kvec, and the
	 * header word each was read with (kword: the guess of link_back's first CAS) */
	uint32_t *kid, *khash;
	uint64_t *kword;
	float *kvec;
	uint32_t nk, kcap, khcap, kvdim;
	float *xbuf, *xr, *est;
	struct dm_hit *hits;
	struct ins_cand *w, *sel;
	uint32_t wcap, nsel;         /* nsel: x's own neighbours in sel (its back-links) */
	struct hnsw_src src;
	const struct dindex *d;
	struct cn_insert_stats *st;
	/* nodes of level >= 1 inserted by the current run: published at its end (cn_upper.h) */
	uint32_t *pub_id, *pub_lv;
	uint32_t npub, cappub;
	/* the dirty-range log (cn_insert_track) */
	bool track, track_lost;
	struct cn_insert_range *dirty;
	size_t ndirty, capdirty;
};

static void conn_failed(struct cn_insert *e, uint32_t m);

/* rc, with where it happened noted in the batch's stats (the innermost place only: the
 * callers that pass the error on keep the first reason). */
static int fail_at(struct cn_insert *e, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

struct cn_insert *cn_insert_new(struct cn *cn)
{
	struct cn_insert *e = calloc(1, sizeof(*e));

	if (!e) {
		errno = ENOMEM;
		return NULL;
	}
	e->cn = cn;
	/* Test-only (documented in docs/operations.md): every record WRITE in 64-byte pieces
	 * with a pause between, so that readers meet torn records. */
	e->torn = getenv("DMANN_TEST_TORN_WRITES") != NULL;
	/* Test-only: DMANN_TEST_DIE_HOLDING_LOCK=ID:N makes compute node ID kill itself right
	 * after it took its N-th record lock in one engine (a holder gone for good). */
	const char *die = getenv("DMANN_TEST_DIE_HOLDING_LOCK");
	unsigned did;
	unsigned long long n;

	if (die && sscanf(die, "%u:%llu", &did, &n) == 2 && did == cn->node->id && n)
		e->die_after = n;
	/* Without remote atomics (a device whose atomic_cap is NONE; DMANN_TEST_MN_ATOMICS
	 * forces it) every CAS and FAA goes to the memory node's CPU. Every compute node must
	 * then do so: a device's atomics are not atomic against a CPU's. */
	e->mn_atomics = !(dm_xport_caps(cn->x) & DM_XCAP_ATOMIC) ||
			getenv("DMANN_TEST_MN_ATOMICS") != NULL;
	if (e->mn_atomics)
		dm_warn("cn%u: %s: record locks and ids go through the memory nodes' CPUs "
			"(slower)", cn->node->id, getenv("DMANN_TEST_MN_ATOMICS") ?
			"DMANN_TEST_MN_ATOMICS" : "the transport has no remote atomics");
	if (e->torn)
		dm_warn("cn%u: DMANN_TEST_TORN_WRITES: records are written in 64-byte pieces "
			"(a test mode)", cn->node->id);
	return e;
}

static void free_buffers(struct cn_insert *e)
{
	if (e->mr)
		dm_xport_dereg(e->cn->x, e->mr);
	e->mr = NULL;
	free(e->buf);
	free(e->staged);
	free(e->kid);
	free(e->khash);
	free(e->kvec);
	free(e->kword);
	free(e->xbuf);
	free(e->xr);
	free(e->est);
	free(e->hits);
	free(e->w);
	free(e->sel);
	e->buf = NULL;
	e->staged = e->kid = e->khash = NULL;
	e->kvec = e->xbuf = e->xr = e->est = NULL;
	e->kword = NULL;
	e->nk = e->kcap = e->khcap = 0;
	e->hits = NULL;
	e->w = e->sel = NULL;
	e->rec_size = 0;
}

void cn_insert_free(struct cn_insert *e)
{
	if (!e)
		return;
	for (uint32_t m = 0; m < DM_MAX_NODES; m++)
		conn_failed(e, m);
	free_buffers(e);
	hnsw_query_free(e->q);
	hnsw_qest_free(e->qe);
	free(e->dirty);
	free(e->pub_id);
	free(e->pub_lv);
	free(e);
}

/* Buffers for the geometry of view d. 0 or -ENOMEM. */
static int fit(struct cn_insert *e, const struct dindex *d, uint32_t ef)
{
	uint32_t recs = DM_MAX(2 * d->p.M + 1, 64u);
	uint32_t wcap = DM_MAX(ef, 2 * d->p.M) + 1;

	if (e->rec_size != d->rec_size || e->stage_recs < recs || e->kvdim != d->vdim ||
	    e->wcap < wcap) {
		free_buffers(e);
		e->rec_size = d->rec_size;
		e->stage_recs = recs;
		e->kvdim = d->vdim;
		e->wcap = wcap;
		e->buf_len = (size_t)(recs + 1) * d->rec_size + 64;
		e->buf = aligned_alloc(64, DM_ALIGN_UP(e->buf_len, 64));
		e->staged = malloc(recs * sizeof(*e->staged));
		e->xbuf = malloc((size_t)DM_MAX(d->vdim, d->p.dim) * sizeof(float));
		e->xr = malloc((size_t)d->vdim * sizeof(float));
		e->est = malloc((size_t)4 * d->p.M * sizeof(float));   /* two lists */
		e->hits = malloc((size_t)wcap * sizeof(*e->hits));
		e->w = malloc((size_t)wcap * sizeof(*e->w));
		e->sel = malloc((size_t)wcap * sizeof(*e->sel));
		if (!e->buf || !e->staged || !e->xbuf || !e->xr || !e->est || !e->hits || !e->w ||
		    !e->sel)
			goto err_free;
		memset(e->buf, 0, e->buf_len);
		e->stage = e->buf;
		e->rec = e->buf + (size_t)recs * d->rec_size;
		e->word = (uint64_t *)(void *)(e->rec + d->rec_size + (64 - d->rec_size % 64) % 64);
		if ((uint8_t *)(e->word + 1) > e->buf + e->buf_len)
			goto err_free;
		if (dm_xport_reg(e->cn->x, e->buf, e->buf_len, 0, &e->mr))
			goto err_free;
	}
	if (!e->q || e->qdim != d->p.dim) {
		hnsw_query_free(e->q);
		e->q = hnsw_query_new(d->p.dim);
		e->qdim = d->p.dim;
		if (!e->q)
			return -ENOMEM;
	}
	if (d->quant && !hnsw_qest_fits(e->qe, d->quant, d->p.M)) {
		hnsw_qest_free(e->qe);
		e->qe = hnsw_qest_new(d->quant, d->p.M);
		if (!e->qe)
			return -ENOMEM;
	}
	return 0;

err_free:
	free_buffers(e);
	return -ENOMEM;
}

/* ---- memory-node connections and synchronous one-sided operations --------------------- */

static struct dm_conn *conn(struct cn_insert *e, uint32_t m)
{
	if (!e->mc[m] && dm_xport_connect(e->cn->x, e->cn->cfg->mn[m].address, 2000, &e->mc[m]))
		e->mc[m] = NULL;
	if (e->mc[m] && e->mn_atomics && !e->has_ch[m]) {
		if (dm_rpc_chan_init(&e->ch[m], e->mc[m], e->cn->pool, 256, INS_WAIT_MS)) {
			dm_conn_close(e->mc[m]);
			e->mc[m] = NULL;
		} else {
			e->has_ch[m] = true;
		}
	}
	return e->mc[m];
}

static void conn_failed(struct cn_insert *e, uint32_t m)
{
	if (e->has_ch[m])
		dm_rpc_chan_fini(&e->ch[m]);
	e->has_ch[m] = false;
	if (e->mc[m])
		dm_conn_close(e->mc[m]);
	e->mc[m] = NULL;
}

static int fail_at(struct cn_insert *e, int rc, const char *fmt, ...)
{
	va_list ap;

	if (!e->st || e->st->err_at[0])
		return rc;
	va_start(ap, fmt);
	vsnprintf(e->st->err_at, sizeof(e->st->err_at), fmt, ap);
	va_end(ap);
	return rc;
}

/* Wait for the completions of wr_ids first .. last on connection m (any order). */
static int wait_range(struct cn_insert *e, uint32_t m, uint64_t first, uint64_t last)
{
	uint64_t need = last - first + 1;
	int err = 0;

	while (need) {
		struct dm_wc wc;
		int n = dm_conn_wait(e->mc[m], &wc, 1, INS_WAIT_MS);

		if (n <= 0) {
			conn_failed(e, m);
			return fail_at(e, n < 0 ? n : -ETIMEDOUT, "completion from memory node %u", m);
		}
		if (wc.wr_id < first || wc.wr_id > last)
			continue;   /* a late completion of an abandoned operation */
		if (wc.status && !err)
			err = wc.status;
		need--;
	}
	if (err) {
		conn_failed(e, m);
		fail_at(e, err, "a READ/WRITE on memory node %u", m);
	}
	return err;
}

/* One READ or WRITE of len bytes between local and remote on memory node m; in the
 * torn-write test mode a WRITE of a whole record goes in 64-byte pieces with pauses. */
static int rw_piece(struct cn_insert *e, bool write, uint32_t m, void *local, uint64_t remote,
		    uint32_t rkey, uint32_t len);

/* Record that [remote, remote + len) on memory node m is written (tracking on). */
static void dirty_add(struct cn_insert *e, uint32_t m, uint64_t remote, uint32_t len)
{
	if (!e->track || e->track_lost)
		return;
	if (e->ndirty && e->dirty[e->ndirty - 1].mn == m &&
	    e->dirty[e->ndirty - 1].addr == remote && e->dirty[e->ndirty - 1].len >= len)
		return;                  /* the same record again (a header word after it) */
	if (e->ndirty == e->capdirty) {
		size_t cap = e->capdirty ? e->capdirty * 2 : 1024;
		struct cn_insert_range *nd = realloc(e->dirty, cap * sizeof(*nd));

		if (!nd) {
			e->track_lost = true;
			return;
		}
		e->dirty = nd;
		e->capdirty = cap;
	}
	e->dirty[e->ndirty++] = (struct cn_insert_range){ .mn = m, .len = len, .addr = remote };
}

void cn_insert_count(struct cn *cn, const struct cn_insert_stats *st)
{
	atomic_fetch_add(&cn->inserts, st->inserted);
	atomic_fetch_add(&cn->insert_links, st->links);
	atomic_fetch_add(&cn->insert_links_dropped, st->links_dropped);
	atomic_fetch_add(&cn->insert_links_forced, st->forced);
	atomic_fetch_add(&cn->insert_links_kept, st->kept);
	atomic_fetch_add(&cn->insert_rounds, st->rounds);
	atomic_fetch_add(&cn->insert_lock_retries, st->lock_retries);
	atomic_fetch_add(&cn->insert_locks_broken, st->locks_broken);
	atomic_fetch_add(&cn->salvaged, st->salvaged);
}

void cn_insert_track(struct cn_insert *e, bool on)
{
	e->track = on;
}

struct cn_insert_range *cn_insert_take_ranges(struct cn_insert *e, size_t *n, bool *lost)
{
	struct cn_insert_range *r = e->dirty;

	*n = e->ndirty;
	*lost = e->track_lost;
	e->dirty = NULL;
	e->ndirty = e->capdirty = 0;
	e->track_lost = false;
	return r;
}

static int rw(struct cn_insert *e, bool write, uint32_t m, void *local, uint64_t remote,
	      uint32_t rkey, uint32_t len)
{
	if (write)
		dirty_add(e, m, remote, len);
	if (write && e->torn && len > 64) {
		for (uint32_t o = 0; o < len; o += 64) {
			int rc = rw_piece(e, true, m, (uint8_t *)local + o, remote + o, rkey,
					  DM_MIN(64u, len - o));

			if (rc)
				return rc;
			sched_yield();
			usleep(100);
		}
		return 0;
	}
	return rw_piece(e, write, m, local, remote, rkey, len);
}

static int rw_piece(struct cn_insert *e, bool write, uint32_t m, void *local, uint64_t remote,
		    uint32_t rkey, uint32_t len)
{
	struct dm_conn *c = conn(e, m);
	struct dm_rdma_wr w = { .wr_id = ++e->wr, .local = local, .mr = e->mr, .remote = remote,
				.rkey = rkey, .len = len, .flags = DM_WR_SIGNALED };
	int rc;

	if (!c)
		return fail_at(e, -EHOSTUNREACH, "no connection to memory node %u", m);
	rc = write ? dm_conn_write_batch(c, &w, 1) : dm_conn_read_batch(c, &w, 1);
	e->st->rounds++;
	if (rc) {
		conn_failed(e, m);
		return fail_at(e, rc, "posting a %s to memory node %u", write ? "WRITE" : "READ", m);
	}
	return wait_range(e, m, w.wr_id, w.wr_id);
}

/* CAS (expect -> desired) or, with faa, FAA (+desired) of the 8 bytes at remote; the old
 * value in *old. */
static int atomic_op(struct cn_insert *e, bool faa, uint32_t m, uint64_t remote, uint32_t rkey,
		     uint64_t expect, uint64_t desired, uint64_t *old)
{
	struct dm_conn *c = conn(e, m);
	uint64_t id = ++e->wr;
	int rc;

	if (!c)
		return fail_at(e, -EHOSTUNREACH, "no connection to memory node %u (atomic)", m);
	dirty_add(e, m, remote, 8);
	e->st->rounds++;
	if (e->mn_atomics) {
		struct dm_wire_ctl_atomic a = { .addr = remote, .compare = expect, .value = desired,
						.op = faa ? DM_CTL_ATOMIC_FAA : DM_CTL_ATOMIC_CAS };
		uint8_t req[sizeof(a)], resp[sizeof(a)];
		uint32_t rlen = 0;

		(void)rkey;
		dm_wire_ctl_atomic_encode(req, &a);
		rc = dm_rpc_call(&e->ch[m], DM_OP_CTL_ATOMIC, req, sizeof(req), resp, sizeof(resp),
				 &rlen);
		if (!rc)
			rc = dm_wire_ctl_atomic_decode(resp, rlen, &a);
		if (rc) {
			if (rc != -EFAULT)
				conn_failed(e, m);
			return rc;
		}
		*old = a.compare;
		return 0;
	}
	rc = faa ? dm_conn_faa(c, id, e->word, e->mr, remote, rkey, desired, DM_WR_SIGNALED) :
		   dm_conn_cas(c, id, e->word, e->mr, remote, rkey, expect, desired,
			       DM_WR_SIGNALED);
	if (rc) {
		conn_failed(e, m);
		return rc;
	}
	rc = wait_range(e, m, id, id);
	*old = *e->word;
	return rc;
}

/* One WRITE of write_set. */
struct ins_wr {
	uint32_t m;
	void *local;
	uint64_t remote;
	uint32_t rkey, len;
};

/* WRITE w[0..n): the WRITEs to one memory node go in one batch and are applied in its
 * order (tcp: one stream; verbs: one RC queue pair, which executes WRITEs in order), every
 * node's side by side, and all are waited for: one round trip. In the torn-write test mode
 * one after the other, in pieces (rw). ok[i]: w[i] was done. 0, or the first error (the
 * failed node's connection is closed). */
static int write_set(struct cn_insert *e, const struct ins_wr *w, uint32_t n, bool *ok)
{
	struct dm_rdma_wr wr[4];
	uint64_t first[4];
	uint32_t ms[4], cnt[4], nm = 0;
	int err = 0;

	if (e->torn || n > DM_ARRAY_SIZE(wr)) {
		for (uint32_t i = 0; i < n; i++) {
			int rc = rw(e, true, w[i].m, w[i].local, w[i].remote, w[i].rkey, w[i].len);

			ok[i] = !rc;
			if (rc && !err)
				err = rc;
		}
		return err;
	}
	e->st->rounds++;
	for (uint32_t i = 0; i < n; i++) {
		bool seen = false;

		ok[i] = false;
		for (uint32_t k = 0; k < nm && !seen; k++)
			seen = ms[k] == w[i].m;
		if (!seen)
			ms[nm++] = w[i].m;
	}
	for (uint32_t k = 0; k < nm; k++) {
		struct dm_conn *c = conn(e, ms[k]);
		int rc;

		cnt[k] = 0;
		first[k] = e->wr + 1;
		for (uint32_t i = 0; i < n; i++) {
			if (w[i].m != ms[k])
				continue;
			dirty_add(e, w[i].m, w[i].remote, w[i].len);
			wr[cnt[k]++] = (struct dm_rdma_wr){ .wr_id = ++e->wr, .local = w[i].local,
				.mr = e->mr, .remote = w[i].remote, .rkey = w[i].rkey,
				.len = w[i].len, .flags = DM_WR_SIGNALED };
		}
		rc = c ? dm_conn_write_batch(c, wr, (int)cnt[k]) : -EHOSTUNREACH;
		if (rc) {
			if (c)
				conn_failed(e, ms[k]);
			first[k] = 0;
			if (!err)
				err = fail_at(e, rc, "posting a WRITE to memory node %u", ms[k]);
		}
	}
	for (uint32_t k = 0; k < nm; k++) {
		int rc;

		if (!first[k])
			continue;
		rc = wait_range(e, ms[k], first[k], first[k] + cnt[k] - 1);
		for (uint32_t i = 0; i < n; i++)
			if (w[i].m == ms[k])
				ok[i] = !rc;
		if (rc && !err)
			err = rc;
	}
	return err;
}

/* The CAS of the header word at remote (expect -> desired) and a READ of the record behind
 * it into e->rec, posted together on one connection and waited for together: one round
 * trip. The requests are executed in order (tcp: one stream; verbs: an RC queue pair's
 * responder), so when the CAS took the lock the READ shows the record under it. The old
 * word in *old. */
static int cas_read(struct cn_insert *e, uint32_t m, uint64_t remote, uint32_t rkey,
		    uint64_t expect, uint64_t desired, uint64_t *old)
{
	struct dm_conn *c = conn(e, m);
	uint64_t first = e->wr + 1;
	struct dm_rdma_wr w;
	int rc;

	if (!c)
		return fail_at(e, -EHOSTUNREACH, "no connection to memory node %u (atomic)", m);
	dirty_add(e, m, remote, 8);
	rc = dm_conn_cas(c, ++e->wr, e->word, e->mr, remote, rkey, expect, desired,
			 DM_WR_SIGNALED);
	e->st->rounds++;
	if (!rc) {
		w = (struct dm_rdma_wr){ .wr_id = ++e->wr, .local = e->rec, .mr = e->mr,
					 .remote = remote, .rkey = rkey, .len = e->d->rec_size,
					 .flags = DM_WR_SIGNALED };
		rc = dm_conn_read_batch(c, &w, 1);
	}
	if (rc) {
		conn_failed(e, m);
		return fail_at(e, rc, "posting a CAS and a READ to memory node %u", m);
	}
	rc = wait_range(e, m, first, e->wr);
	*old = *e->word;
	return rc;
}

/* Replica j of id's block, if its node is up and its address known: where writes go. */
static bool replica(struct cn_insert *e, uint32_t id, uint32_t j, uint32_t *m, uint64_t *addr,
		    uint32_t *rkey)
{
	dindex_locate_rep(e->d, e->cn->mns, id, j, m, addr, rkey);
	return *m != DINDEX_NO_MN && *addr && !cn_mn_is_down(e->cn, *m);
}

/* A WRITE to replica j of id's block did not happen (its node is down) or failed: the node
 * missed it, and is marked stale for the graph when it comes back (cn_gen.c). */
static void write_missed(struct cn_insert *e, uint32_t id, uint32_t j)
{
	uint32_t m, rk;
	uint64_t a;

	dindex_locate_rep(e->d, e->cn->mns, id, j, &m, &a, &rk);
	if (m != DINDEX_NO_MN && m < DM_MAX_NODES)
		atomic_fetch_add(&e->cn->write_missed[m], 1);
}

/* The same for reads and the lock: a replica marked stale for the graph (it missed
 * writes, cn_hcatchup.c) only when no other replica of the block is up. */
static bool replica_r(struct cn_insert *e, uint32_t id, uint32_t j, uint32_t *m,
		      uint64_t *addr, uint32_t *rkey)
{
	if (!replica(e, id, j, m, addr, rkey))
		return false;
	if (!cn_graph_stale(e->cn, e->d->graph, *m))
		return true;
	for (uint32_t k = 0; k < e->d->nrep; k++) {
		uint32_t m2, rk2;
		uint64_t a2;

		if (k != j && replica(e, id, k, &m2, &a2, &rk2) &&
		    !cn_graph_stale(e->cn, e->d->graph, m2))
			return false;
	}
	return true;
}

/* READ id's record into dst, validated, from its first replica that gives a stable copy
 * within INS_REREADS tries (*prim: that replica). 0, -EAGAIN (every copy held by a
 * writer or torn), -EHOSTUNREACH. */
static int read_rec_once(struct cn_insert *e, uint32_t id, uint8_t *dst, uint32_t *prim);

/* Record id torn on every copy for longer than the lease (its writer died holding it):
 * the first copy that READs, salvaged (hnsw_rec_salvage) into dst; its lock is broken by
 * the first back-link to it (break_lock). 0, or -EAGAIN. */
static int read_rec_salvaged(struct cn_insert *e, uint32_t id, uint8_t *dst, uint32_t *prim)
{
	struct hnsw_rec_hdr *h = (struct hnsw_rec_hdr *)dst;

	for (uint32_t j = 0; j < e->d->nrep; j++) {
		uint32_t m, rkey;
		uint64_t addr;

		if (!replica_r(e, id, j, &m, &addr, &rkey) ||
		    rw(e, false, m, dst, addr, rkey, e->d->rec_size))
			continue;
		e->st->reads++;
		if (!dindex_rec_ok(e->d, h)) {
			if (!hnsw_rec_salvage(h, e->d->p.M, e->d->rec_size, e->d->cap, id))
				continue;
			e->st->salvaged++;
		}
		*prim = j;
		return 0;
	}
	return -EAGAIN;
}

/* read_rec_once, waiting (with back-off, up to INS_TORN_WAIT_NS) while a writer holds
 * every copy; past the lease, the salvaged copy (read_rec_salvaged). */
static int read_rec_wait(struct cn_insert *e, uint32_t id, uint8_t *dst, uint32_t *prim)
{
	uint64_t t0 = dm_now_ns();
	int rc;

	for (uint32_t t = 0;; t++) {
		rc = read_rec_once(e, id, dst, prim);
		if (rc == -EAGAIN && dm_now_ns() - t0 > CN_INSERT_LOCK_LEASE_NS &&
		    !read_rec_salvaged(e, id, dst, prim))
			return 0;
		if (rc != -EAGAIN || dm_now_ns() - t0 > INS_TORN_WAIT_NS)
			return rc;
		usleep(20u << DM_MIN(t, 8u));
	}
}

static int read_rec_once(struct cn_insert *e, uint32_t id, uint8_t *dst, uint32_t *prim)
{
	int rc = -EHOSTUNREACH;

	for (uint32_t j = 0; j < e->d->nrep; j++) {
		uint32_t m, rkey;
		uint64_t addr;

		if (!replica_r(e, id, j, &m, &addr, &rkey))
			continue;
		for (uint32_t t = 0; t < INS_REREADS; t++) {
			int r = rw(e, false, m, dst, addr, rkey, e->d->rec_size);

			e->st->reads++;
			if (r) {
				rc = r;
				break;
			}
			if (dindex_rec_ok(e->d, (const struct hnsw_rec_hdr *)dst)) {
				*prim = j;
				return 0;
			}
			e->st->rereads++;
			rc = -EAGAIN;
		}
	}
	return rc == -EHOSTUNREACH ? fail_at(e, rc, "record %u: no replica up to read", id) : rc;
}

static inline uint64_t hdr_word(const uint8_t *r)
{
	uint64_t w;

	memcpy(&w, r, 8);
	return w;
}

/* ---- kept vectors of one insert's search ----------------------------------------------- */

static void keep_reset(struct cn_insert *e)
{
	e->nk = 0;
	if (e->khash)
		memset(e->khash, 0xff, (size_t)e->khcap * sizeof(*e->khash));
}

static const float *kept(const struct cn_insert *e, uint32_t id)
{
	if (!e->khcap)
		return NULL;
	for (uint32_t p = (id * 2654435761u) & (e->khcap - 1);; p = (p + 1) & (e->khcap - 1)) {
		uint32_t k = e->khash[p];

		if (k == UINT32_MAX)
			return NULL;
		if (e->kid[k] == id)
			return e->kvec + (size_t)k * e->kvdim;
	}
}

/* The header word record id was read with by this insert's search (false: not read). */
static bool kept_word(const struct cn_insert *e, uint32_t id, uint64_t *word)
{
	const float *v = kept(e, id);

	if (!v)
		return false;
	*word = e->kword[(size_t)(v - e->kvec) / e->kvdim];
	return true;
}

static int keep(struct cn_insert *e, uint32_t id, const float *v, uint64_t word)
{
	if (kept(e, id))
		return 0;
	if (e->nk == e->kcap) {
		uint32_t cap = e->kcap ? 2 * e->kcap : 256, hcap = 2 * cap;
		uint32_t *kid = realloc(e->kid, cap * sizeof(*kid));
		float *kvec = kid ? realloc(e->kvec, (size_t)cap * e->kvdim * sizeof(float)) : NULL;
		uint64_t *kw = kvec ? realloc(e->kword, cap * sizeof(*kw)) : NULL;
		uint32_t *kh = malloc(hcap * sizeof(*kh));

		if (kid)
			e->kid = kid;
		if (kvec)
			e->kvec = kvec;
		if (kw)
			e->kword = kw;
		if (!kid || !kvec || !kw || !kh) {
			free(kh);
			return -ENOMEM;
		}
		free(e->khash);
		e->khash = kh;
		e->kcap = cap;
		e->khcap = hcap;
		memset(kh, 0xff, hcap * sizeof(*kh));
		for (uint32_t k = 0; k < e->nk; k++) {
			uint32_t p = (e->kid[k] * 2654435761u) & (hcap - 1);

			while (kh[p] != UINT32_MAX)
				p = (p + 1) & (hcap - 1);
			kh[p] = k;
		}
	}
	uint32_t k = e->nk++, p = (id * 2654435761u) & (e->khcap - 1);

	e->kid[k] = id;
	e->kword[k] = word;
	memcpy(e->kvec + (size_t)k * e->kvdim, v, (size_t)e->kvdim * sizeof(float));
	while (e->khash[p] != UINT32_MAX)
		p = (p + 1) & (e->khcap - 1);
	e->khash[p] = k;
	return 0;
}

/* ---- the search --------------------------------------------------------------------------- */

static const struct hnsw_rec_hdr *stage_get(struct hnsw_src *s, uint32_t id)
{
	struct cn_insert *e = s->ctx;

	for (uint32_t j = 0; j < e->nstaged; j++)
		if (e->staged[j] == id)
			return (const struct hnsw_rec_hdr *)(e->stage + (size_t)j * e->rec_size);
	return NULL;
}

/* READ the records of the query's batch into the stage (one READ round: one batch per
 * memory node, all posted before any is waited for; then validated re-reads of the few that
 * fail) and keep their vectors. */
static int fetch(struct cn_insert *e, const uint32_t *ids, uint32_t n)
{
	struct dm_rdma_wr wr[64];
	uint32_t mn[64], node[64], cnt[64], nn = 0;
	uint64_t first[64];
	bool ok[64];
	int rc;

	if (n > e->stage_recs || n > 64)
		return -EINVAL;
	e->nstaged = 0;
	for (uint32_t j = 0; j < n; j++) {
		uint32_t m = DINDEX_NO_MN, rkey = 0;
		uint64_t addr = 0;

		ok[j] = false;
		mn[j] = DINDEX_NO_MN;
		e->staged[j] = ids[j];
		if (ids[j] >= e->d->cap)
			return -EIO;
		for (uint32_t r = 0; r < e->d->nrep && !replica_r(e, ids[j], r, &m, &addr, &rkey); r++)
			m = DINDEX_NO_MN;
		if (m == DINDEX_NO_MN || !conn(e, m))
			continue;   /* read alone below */
		mn[j] = m;
		wr[j] = (struct dm_rdma_wr){ .local = e->stage + (size_t)j * e->rec_size,
			.mr = e->mr, .remote = addr, .rkey = rkey, .len = e->rec_size,
			.flags = DM_WR_SIGNALED };
	}
	e->nstaged = n;
	e->st->rounds++;
	/* group by node: node[k]'s records are wr[] entries with mn == node[k] */
	for (uint32_t j = 0; j < n; j++) {
		uint32_t k = 0;

		if (mn[j] == DINDEX_NO_MN)
			continue;
		while (k < nn && node[k] != mn[j])
			k++;
		if (k == nn)
			node[nn++] = mn[j];
	}
	for (uint32_t k = 0; k < nn; k++) {
		struct dm_rdma_wr b[64];
		uint32_t m = node[k];

		cnt[k] = 0;
		first[k] = e->wr + 1;
		for (uint32_t j = 0; j < n; j++)
			if (mn[j] == m) {
				b[cnt[k]] = wr[j];
				b[cnt[k]++].wr_id = ++e->wr;
				ok[j] = true;   /* posted; validated below */
			}
		if (dm_conn_read_batch(e->mc[m], b, (int)cnt[k])) {
			conn_failed(e, m);
			for (uint32_t j = 0; j < n; j++)
				if (mn[j] == m)
					ok[j] = false;
			cnt[k] = 0;
		}
		e->st->reads += cnt[k];
	}
	for (uint32_t k = 0; k < nn; k++) {
		uint32_t m = node[k];

		if (!cnt[k] || !e->mc[m])
			continue;
		if (wait_range(e, m, first[k], first[k] + cnt[k] - 1))
			for (uint32_t j = 0; j < n; j++)
				if (mn[j] == m)
					ok[j] = false;
	}
	for (uint32_t j = 0; j < n; j++) {
		uint8_t *r = e->stage + (size_t)j * e->rec_size;
		uint32_t prim;

		if (!ok[j] || !dindex_rec_ok(e->d, (const struct hnsw_rec_hdr *)r)) {
			if (ok[j])
				e->st->rereads++;
			rc = read_rec_wait(e, ids[j], r, &prim);
			if (rc)
				return rc == -EAGAIN ? -EIO : rc;
		}
		rc = keep(e, ids[j], hnsw_rec_vec((const struct hnsw_rec_hdr *)r, e->d->vec_off),
			  hdr_word(r));
		if (rc)
			return rc;
	}
	return 0;
}

static int cand_cmp(const void *a, const void *b)
{
	const struct ins_cand *x = a, *y = b;

	return x->d < y->d ? -1 : x->d > y->d ? 1 : (x->id > y->id) - (x->id < y->id);
}

/* Algorithm 4 (as the local build's select_heuristic): c sorted ascending by distance to
 * the new node; keep one only if it is closer to the new node than to every kept one. */
static uint32_t select_neighbours(struct cn_insert *e, hnsw_kernel_fn kern,
				  const struct ins_cand *c, uint32_t nc, uint32_t M,
				  struct ins_cand *out)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < nc && n < M; i++) {
		const float *v = kept(e, c[i].id);
		bool good = v != NULL;

		for (uint32_t j = 0; j < n && good; j++)
			if (kern(v, kept(e, out[j].id), e->kvdim) < c[i].d)
				good = false;
		if (good)
			out[n++] = c[i];
	}
	return n;
}

/* ---- the back-link under the neighbour's lock --------------------------------------- */

/* Add id (rotated vector xr, raw score dx to e's node) to node nb's list. */
/* Break the lock of record nb on its primary (pm, paddr), whose header word has stayed
 * `word` (held, or torn) for longer than the lease: take it over (seq + 2, still odd, this
 * CN the holder), WRITE back a whole copy (the primary's own if its CRC matches, else a
 * replica's, else the primary's salvaged: hnsw_rec_salvage), release with seq + 3. 0
 * (also when someone else moved first: the caller retries), or -errno. */
static int break_lock(struct cn_insert *e, uint32_t nb, uint32_t j0, uint32_t pm,
		      uint64_t paddr, uint32_t prk, uint64_t word, uint32_t holder)
{
	const struct dindex *d = e->d;
	struct hnsw_rec_hdr *h = (struct hnsw_rec_hdr *)e->rec;
	uint32_t seq = (uint32_t)word | 1u;   /* a torn even word is taken over as held */
	uint64_t mine = (word & UINT64_C(0xffff000000000000)) |
			((uint64_t)(holder & 0xffff) << 32) | (uint32_t)(seq + 2), old;
	int rc = atomic_op(e, false, pm, paddr, prk, word, mine, &old);

	if (rc || old != word)
		return rc;
	if (!dindex_rec_ok(d, h)) {
		bool whole = false;

		for (uint32_t j = 0; j < d->nrep && !whole; j++) {
			uint32_t m, rk;
			uint64_t a;

			if (j == j0 || !replica_r(e, nb, j, &m, &a, &rk))
				continue;
			whole = !rw(e, false, m, e->rec, a, rk, d->rec_size) && dindex_rec_ok(d, h);
			e->st->reads++;
		}
		/* No whole copy (one replica, or all torn): salvage the primary's. */
		if (!whole && (d->nrep == 1 ||
			       !rw(e, false, pm, e->rec, paddr, prk, d->rec_size)) &&
		    hnsw_rec_salvage(h, d->p.M, d->rec_size, d->cap, nb)) {
			whole = true;
			e->st->salvaged++;
			dm_warn("cn%u: record %u: lock of a gone holder and no whole copy: the "
				"torn one salvaged", e->cn->node->id, nb);
		}
		if (!whole) {
			dm_warn("cn%u: record %u: lock of a gone holder, and no whole copy to "
				"restore; left held", e->cn->node->id, nb);
			return 0;
		}
	}
	h->seq = seq + 3;
	h->holder = 0;
	rc = rw(e, true, pm, e->rec + 8, paddr + 8, prk, d->rec_size - 8);
	if (!rc)
		rc = rw(e, true, pm, e->rec, paddr, prk, 8);
	if (!rc) {
		e->st->locks_broken++;
		dm_info("cn%u: record %u: broke the lock of gone holder %u (held over %u ms)",
			e->cn->node->id, nb, (unsigned)((word >> 32) & 0xffff) - 1,
			(unsigned)(CN_INSERT_LOCK_LEASE_NS / 1000000));
	}
	return rc;
}

/* How link_back treats a full list. */
enum lb_mode {
	LB_SHRINK,                   /* x takes a slot when the shrink rule below gives it one */
	LB_FORCE,                    /* x takes one even when it is the farthest (a new node
					none of its neighbours linked to would be unreachable) */
	LB_ROOM,                     /* only a free slot (nothing is pushed out) */
};

/* The back-link nb -> id under nb's record lock; *evicted (optional) gets the neighbour
 * whose slot x took, or UINT32_MAX. */
static int link_back(struct cn_insert *e, hnsw_kernel_fn kern, uint32_t nb, uint32_t id,
		     const float *xr, enum lb_mode mode, uint32_t *evicted)
{
	bool force = mode == LB_FORCE;

	const struct dindex *d = e->d;
	uint32_t M = d->p.M, holder = e->cn->node->id + 1;
	uint64_t held_word = 0, held_since = 0;

	/* The word nb was read with by this insert's search: when nothing changed nb since,
	 * one CAS from it takes the lock, and the READ posted behind the CAS gets the record:
	 * one round trip instead of two. (Not with the memory nodes' atomics: their CAS is an
	 * RPC, not ordered with READs.) */
	uint64_t guess = 0;
	bool try_guess = !e->mn_atomics && kept_word(e, nb, &guess) && !(guess & 1u);

	/* CN_INSERT_LOCK_TRIES attempts, and longer while one held word is waited out */
	for (uint32_t t = 0; t < CN_INSERT_LOCK_TRIES || held_since; t++) {
		struct hnsw_rec_hdr *h = (struct hnsw_rec_hdr *)e->rec;
		uint32_t j0, pm, prk, seq;
		uint64_t paddr, word, want, old;
		int rc;

		if (t)
			usleep(20u << DM_MIN(t, 8u));
		/* The lock lives on the primary: the first replica whose node is up. */
		for (j0 = 0; j0 < d->nrep && !replica_r(e, nb, j0, &pm, &paddr, &prk); j0++)
			;
		if (j0 == d->nrep)
			return fail_at(e, -EHOSTUNREACH, "record %u: no replica up to lock", nb);
		if (try_guess) {
			try_guess = false;
			want = (guess & ~UINT64_C(0xffffffffffff)) |
			       ((uint64_t)(holder & 0xffff) << 32) | (uint32_t)((uint32_t)guess + 1);
			rc = cas_read(e, pm, paddr, prk, guess, want, &old);
			e->st->reads++;
			if (rc)
				return rc;
			if (old == guess && !dindex_rec_ok(d, h)) {
				/* locked, but the body is torn (a writer died in the middle of a
				 * WRITE of an unlocked copy): restored under our lock as a gone
				 * holder's would be, then tried again */
				rc = break_lock(e, nb, j0, pm, paddr, prk, want, holder);
				if (rc)
					return rc;
				t = DM_MIN(t, CN_INSERT_LOCK_TRIES - 1);
				continue;
			}
			if (old == guess) {
				word = guess;
				seq = (uint32_t)word;
				goto locked;
			}
			/* the CAS failed: the READ behind it is the current record */
			e->st->lock_retries++;
		} else {
			rc = rw(e, false, pm, e->rec, paddr, prk, d->rec_size);
			e->st->reads++;
			if (rc)
				return rc;
		}
		if (!hnsw_rec_stable(h, d->rec_size) || !dindex_rec_ok(d, h)) {
			/* held by another writer (or one that died holding it), or torn: the
			 * same word for longer than the lease is a gone holder's */
			uint64_t now = dm_now_ns();

			word = hdr_word(e->rec);
			e->st->lock_retries++;
			if (word != held_word || !held_since) {
				held_word = word;
				held_since = now;
			} else if (now - held_since > CN_INSERT_LOCK_LEASE_NS) {
				rc = break_lock(e, nb, j0, pm, paddr, prk, word, holder);
				if (rc)
					return rc;
				held_since = 0;
				if (t >= CN_INSERT_LOCK_TRIES)
					t = CN_INSERT_LOCK_TRIES - 1;   /* one more try */
			}
			continue;
		}
		held_since = 0;
		/* the CAS must see exactly the stable word just read */
		word = hdr_word(e->rec);
		seq = (uint32_t)word;
		want = (word & ~UINT64_C(0xffffffffffff)) | ((uint64_t)(holder & 0xffff) << 32) |
		       (uint32_t)(seq + 1);
		rc = atomic_op(e, false, pm, paddr, prk, word, want, &old);
		if (rc)
			return rc;
		if (old != word) {
			e->st->lock_retries++;
			continue;
		}
locked:
		if (dm_unlikely(e->die_after) && ++e->locks == e->die_after) {
			dm_warn("cn%u: DMANN_TEST_DIE_HOLDING_LOCK: killing myself holding the lock of "
				"record %u", e->cn->node->id, nb);
			raise(SIGKILL);
		}
		/* Locked: the record read is the current one (every writer bumps seq). */
		uint32_t *ids = (uint32_t *)(e->rec + hnsw_rec_nbr_off());
		uint32_t cnt = DM_MIN(h->n0, 2 * M), slot = UINT32_MAX;
		const float *ev = hnsw_rec_vec(h, d->vec_off);
		bool dup = false;

		for (uint32_t j = 0; j < cnt; j++)
			dup |= ids[j] == id;
		if (!dup && cnt < 2 * M) {
			slot = cnt;
		} else if (!dup && mode == LB_ROOM) {
			slot = UINT32_MAX;
		} else if (!dup && d->quant) {
			/* Full: the list shrinks by one as SELECT-NEIGHBORS-HEURISTIC (Malkov &
			 * Yashunin, Algorithm 4) would shrink it with x added, preferring to drop
			 * a neighbour c that stays reachable through x: first (farthest from u
			 * first) one farther from u than x that x links to itself, then one
			 * farther from u than x and nearer to x than to u (covered by x: a
			 * search near c likely passes x); with neither, x takes the farthest
			 * neighbour's slot if it is nearer (a plain cut at 2M). Replacing the
			 * farthest one alone left 43 of 54,795 rows of the SDK test without an
			 * in-link (unreachable) once the graph had grown 10x around them.
			 * Distances from u's own codes: d(u, c) with u as the query (|r|^2 up to
			 * the rounding of the query tables), d(x, c) with x as the query. */
			const uint8_t *codes = hnsw_rec_codes(h, M);
			float *du = e->est, *dxc = e->est + cnt, dx = kern(ev, xr, d->vdim);
			uint32_t far = 0, cov = UINT32_MAX, own = UINT32_MAX;

			hnsw_qest_query(e->qe, ev);
			hnsw_qest_list(e->qe, ev, kern(ev, ev, d->vdim), codes, cnt, du, NULL);
			hnsw_qest_query(e->qe, xr);
			hnsw_qest_list(e->qe, ev, dx, codes, cnt, dxc, NULL);
			for (uint32_t j = 0; j < cnt; j++) {
				bool linked = false;

				if (du[j] > du[far])
					far = j;
				if (du[j] <= dx)
					continue;
				for (uint32_t k = 0; k < e->nsel && !linked; k++)
					linked = e->sel[k].id == ids[j];
				if (linked && (own == UINT32_MAX || du[j] > du[own]))
					own = j;
				if (dxc[j] < du[j] && (cov == UINT32_MAX || du[j] > du[cov]))
					cov = j;
			}
			if (own != UINT32_MAX)
				slot = own;
			else if (cov != UINT32_MAX)
				slot = cov;
			else if (force || dx < du[far])
				slot = far;
		} else if (!dup && force) {
			slot = cnt - 1;         /* no codes to rank by: the last one */
		}
		h->seq = seq + 2;
		h->holder = 0;
		if (evicted)
			*evicted = slot < cnt ? ids[slot] : UINT32_MAX;
		if (slot != UINT32_MAX) {
			ids[slot] = id;
			if (d->quant)
				hnsw_quant_set_slot(d->quant, M, e->rec + hnsw_rec_code_off(M), slot,
						    ev, xr);
			if (slot == cnt)
				h->n0 = cnt + 1;
			h->crc = hnsw_rec_crc(h, d->rec_size);
		}
		/* the other replicas whole (stable at once), side by side; then the primary's
		 * body and last its header word, the release, in one batch (applied in order) */
		struct ins_wr wv[4];
		uint32_t wj[4], nwv = 0;
		bool ok[4];

		for (uint32_t j = 0; j < d->nrep && slot != UINT32_MAX; j++) {
			uint32_t m, rk;
			uint64_t a;

			if (j == j0)
				continue;
			if (!replica(e, nb, j, &m, &a, &rk) ||
			    (nwv == DM_ARRAY_SIZE(wv) && rw(e, true, m, e->rec, a, rk, d->rec_size))) {
				write_missed(e, nb, j);
				continue;
			}
			if (nwv == DM_ARRAY_SIZE(wv))
				continue;       /* written alone just above */
			wj[nwv] = j;
			wv[nwv++] = (struct ins_wr){ m, e->rec, a, rk, d->rec_size };
		}
		if (nwv)
			(void)write_set(e, wv, nwv, ok);
		for (uint32_t k = 0; k < nwv; k++)
			if (!ok[k])
				write_missed(e, nb, wj[k]);
		nwv = 0;
		if (slot != UINT32_MAX)
			wv[nwv++] = (struct ins_wr){ pm, e->rec + 8, paddr + 8, prk, d->rec_size - 8 };
		wv[nwv++] = (struct ins_wr){ pm, e->rec, paddr, prk, 8 };
		rc = write_set(e, wv, nwv, ok);
		if (rc)
			return rc;
		if (slot == UINT32_MAX)
			e->st->links_dropped++;
		else
			e->st->links++;
		return 0;
	}
	e->st->links_dropped++;
	return 0;
}

/* ---- one insert ------------------------------------------------------------------------ */

/* FAA (faa: +desired) or CAS (expect -> desired) on the id counter object: its value
 * before, in *old. */
static int ctr_op(struct cn_insert *e, bool faa, uint64_t expect, uint64_t desired,
		  uint64_t *old)
{
	const struct dindex *d = e->d;

	if (!d->ctr_addr || cn_mn_is_down(e->cn, d->ctr_mn))
		return fail_at(e, -EHOSTUNREACH, "the id counter's memory node %u %s", d->ctr_mn,
			       d->ctr_addr ? "is down" : "has no address for it");
	return atomic_op(e, faa, d->ctr_mn, d->ctr_addr, e->cn->mns->link[d->ctr_mn].info.rkey,
			 expect, desired, old);
}

/* The first id of a generation's ranges (cn_ids_next): where the id counter object is (a
 * graph that took inserts before the cluster had a state), at least the imported rows. */
static int ctr_value(void *ctx, uint64_t *base)
{
	struct cn_insert *e = ctx;
	uint64_t v = 0;
	int rc = ctr_op(e, true, 0, 0, &v);

	*base = DM_MAX(v, (uint64_t)e->d->n);
	return rc;
}

/* A range [.., hi) was taken (cn_ids_next): the counter object raised to hi with CAS (best
 * effort: skipped while its node is down), so that the next ranges of a cluster whose
 * state was lost start past every id handed out (ctr_value). Recorded as written: the
 * snapshot of the inserts' batch holds it. */
static void ctr_raise(void *ctx, uint64_t hi)
{
	struct cn_insert *e = ctx;
	uint64_t cur = e->d->n, old;   /* a guess: each failed CAS tells the value */

	for (int t = 0; t < 16 && cur < hi; t++) {
		if (ctr_op(e, false, cur, hi, &old) || old == cur)
			return;
		cur = old;
	}
}

static void pub_level(struct cn_insert *e, uint32_t id);

static int insert_one(struct cn_insert *e, const float *x, uint32_t ef, uint64_t *out_id)
{
	const struct dindex *d = e->d;
	hnsw_kernel_fn kern = hnsw_kernel_for(d->p.metric);
	uint32_t M = d->p.M, dim = d->p.dim, vdim = d->vdim, nw = 0, ns;
	uint64_t id;
	int rc, nh;

	/* the stored form of x: normalised for cos, rotated with codes */
	memcpy(e->xbuf, x, (size_t)dim * sizeof(float));
	for (uint32_t i = 0; i < dim; i++)
		if (!isfinite(e->xbuf[i]))
			return -EINVAL;
	if (d->p.metric == DM_METRIC_COS && dm_normalize(e->xbuf, dim) < 0)
		return -EINVAL;
	if (d->quant)
		hnsw_quant_rotate(d->quant, e->xbuf, e->xr);
	else
		memcpy(e->xr, e->xbuf, (size_t)dim * sizeof(float));

	/* 1. the id: from this compute node's range of the cluster state, or one FAA on the
	 * id counter object */
	if (cn_ids_on(e->cn)) {
		rc = cn_ids_next(e->cn, d->graph, d->gen, dindex_ids_tag(d), d->n, d->cap,
				 ctr_value, ctr_raise, e, &id);
		if (rc)
			return rc == -ENOSPC ? rc : fail_at(e, rc, "a range of ids from etcd");
	} else {
		rc = ctr_op(e, true, 0, 1, &id);
		if (rc)
			return rc;
	}
	if (id >= d->cap)
		return -ENOSPC;

	/* 2. SEARCH-LAYER on level 0, ef = efConstruction */
	keep_reset(e);
	rc = hnsw_query_start_b(e->q, &e->src, x, ef, ef, d->quant ? INS_BEAM : 1);
	while (!rc) {
		rc = hnsw_query_step(e->q, &e->src);
		if (rc == HNSW_Q_FETCH)
			rc = fetch(e, e->q->batch, e->q->nbatch);
		else if (rc == HNSW_Q_DONE)
			break;
	}
	if (rc < 0)
		return rc;
	nh = hnsw_query_results(e->q, e->hits);
	for (int i = 0; i < nh && nw < e->wcap; i++) {
		const float *v = kept(e, (uint32_t)e->hits[i].id);

		if (v)
			e->w[nw++] = (struct ins_cand){ kern(e->xr, v, vdim), (uint32_t)e->hits[i].id };
	}
	qsort(e->w, nw, sizeof(*e->w), cand_cmp);

	/* 3. neighbours */
	ns = select_neighbours(e, kern, e->w, nw, M, e->sel);

	/* 4. x's record, on every replica of its block */
	struct hnsw_rec_hdr *h = (struct hnsw_rec_hdr *)e->rec;
	uint32_t *ids = (uint32_t *)(e->rec + hnsw_rec_nbr_off());
	const float *vp[2 * HNSW_MAX_M];
	uint32_t written = 0;

	memset(e->rec, 0, d->rec_size);
	h->n0 = ns;
	for (uint32_t j = 0; j < ns; j++) {
		ids[j] = e->sel[j].id;
		vp[j] = kept(e, e->sel[j].id);
	}
	if (d->quant)
		hnsw_quant_encode_list(d->quant, M, e->xr, vp, ns, e->rec + hnsw_rec_code_off(M));
	memcpy(e->rec + d->vec_off, e->xr, (size_t)vdim * sizeof(float));
	h->crc = hnsw_rec_crc(h, d->rec_size);
	struct ins_wr wv[4];
	uint32_t wj[4], nwv = 0;
	bool ok[4];

	for (uint32_t j = 0; j < d->nrep; j++) {
		uint32_t m, rk;
		uint64_t a;

		if (!replica(e, (uint32_t)id, j, &m, &a, &rk))
			write_missed(e, (uint32_t)id, j);
		else if (nwv < DM_ARRAY_SIZE(wv)) {
			wj[nwv] = j;
			wv[nwv++] = (struct ins_wr){ m, e->rec, a, rk, d->rec_size };
		} else if (!rw(e, true, m, e->rec, a, rk, d->rec_size))
			written++;      /* past the batch: alone */
		else
			write_missed(e, (uint32_t)id, j);
	}
	if (nwv)
		(void)write_set(e, wv, nwv, ok);
	for (uint32_t k = 0; k < nwv; k++) {
		if (ok[k])
			written++;
		else
			write_missed(e, (uint32_t)id, wj[k]);
	}
	if (!written)
		return fail_at(e, -EHOSTUNREACH, "record %llu: no replica took it",
			       (unsigned long long)id);

	/* 5. back-links, nearest first */
	float xcopy[vdim];

	memcpy(xcopy, e->xr, (size_t)vdim * sizeof(float));
	uint64_t links0 = e->st->links;

	uint32_t vict[HNSW_MAX_M + 1], nv = 0;

	e->nsel = ns;
	for (uint32_t j = 0; j <= ns; j++) {
		uint32_t ev = UINT32_MAX;

		if (j < ns) {
			rc = link_back(e, kern, e->sel[j].id, (uint32_t)id, xcopy, LB_SHRINK, &ev);
		} else if (ns && e->st->links == links0) {
			/* None of them took x (each list full of nearer nodes): the nearest one
			 * must, or no search could reach x. */
			rc = link_back(e, kern, e->sel[0].id, (uint32_t)id, xcopy, LB_FORCE, &ev);
			e->st->forced++;
		} else {
			break;
		}
		if (rc)
			return rc;
		bool mine = false;

		for (uint32_t k = 0; k < ns && ev != UINT32_MAX && !mine; k++)
			mine = e->sel[k].id == ev;
		if (ev != UINT32_MAX && !mine && nv < DM_ARRAY_SIZE(vict))
			vict[nv++] = ev;
	}
	/* A neighbour c that x pushed out of u's list may have lost its last in-link: x links
	 * to it in one of its own free slots (u -> c became u -> x -> c), so that every node
	 * stays reachable as the graph grows around it (without this, 7-43 of 54,795 rows of
	 * the SDK test could not be found by their own vector). */
	for (uint32_t v = 0; v < nv; v++) {
		uint32_t prim;
		float cv[vdim];

		if (read_rec_wait(e, vict[v], e->rec, &prim))
			continue;       /* unreadable now: c keeps only its other in-links */
		memcpy(cv, hnsw_rec_vec((const struct hnsw_rec_hdr *)e->rec, d->vec_off),
		       (size_t)vdim * sizeof(float));
		uint64_t l0 = e->st->links;

		rc = link_back(e, kern, (uint32_t)id, vict[v], cv, LB_ROOM, NULL);
		if (rc)
			return rc;
		if (e->st->links > l0) {
			e->st->links--;         /* counted apart */
			e->st->kept++;
		}
	}
	*out_id = id;
	pub_level(e, (uint32_t)id);
	return 0;
}

/* Node id was inserted: with online upper levels (cn_upper.h) its level is drawn (Algorithm
 * 1's mL = 1 / ln M, by id, at most the graph's top level), and a node of level >= 1 is kept
 * to be published once the run ends. Without room to keep it the node stays level 0. */
static void pub_level(struct cn_insert *e, uint32_t id)
{
	const struct dindex *d = e->d;
	uint32_t lv;

	if (!cn_upper_on(e->cn) || d->max_level < 1)
		return;
	lv = DM_MIN(hnsw_draw_level(d->meta_crc ^ CN_UPPER_SALT, id, d->p.M),
		    (uint32_t)d->max_level);
	if (!lv)
		return;
	if (e->npub == e->cappub) {
		uint32_t cap = e->cappub ? 2 * e->cappub : 64;
		uint32_t *a = realloc(e->pub_id, cap * sizeof(*a));

		if (!a)
			return;
		e->pub_id = a;
		a = realloc(e->pub_lv, cap * sizeof(*a));
		if (!a)
			return;
		e->pub_lv = a;
		e->cappub = cap;
	}
	e->pub_id[e->npub] = id;
	e->pub_lv[e->npub++] = lv;
}

int cn_insert_read_stored(struct cn_insert *e, const struct dindex *d, uint32_t id, float *out)
{
	struct cn_insert_stats st = { 0 };
	const struct hnsw_rec_hdr *h;
	uint32_t prim;
	int rc;

	if (id >= d->cap)
		return -EINVAL;
	rc = fit(e, d, CN_INSERT_EF_DEFAULT);
	if (rc)
		return rc;
	e->d = d;
	e->st = &st;
	/* A record that reads all zero was never written (or was lost with a memory node's
	 * memory): no wait for a writer that will not come. */
	rc = read_rec_once(e, id, e->rec, &prim);
	if (rc == -EAGAIN) {
		bool zero = true;

		for (uint32_t i = 0; i < d->rec_size && zero; i++)
			zero = !e->rec[i];
		rc = zero ? -ENODATA : read_rec_wait(e, id, e->rec, &prim);
	}
	e->st = NULL;
	if (rc)
		return rc;
	h = (const struct hnsw_rec_hdr *)e->rec;
	if (!h->n0)
		return -ENODATA;
	memcpy(out, hnsw_rec_vec(h, d->vec_off), (size_t)d->vdim * sizeof(float));
	for (uint32_t i = 0; i < d->vdim; i++)
		if (!isfinite(out[i]))
			return -ENODATA;
	return 0;
}

int cn_insert_run(struct cn_insert *e, const struct dindex *d, const float *vecs, uint32_t n,
		  uint32_t dim, uint32_t ef, uint64_t *ids, struct cn_insert_stats *st)
{
	uint32_t i;
	int rc;

	if (d->cap <= d->n)
		return -ENOENT;
	if (dim != d->p.dim)
		return -EINVAL;
	if (!ef)
		ef = CN_INSERT_EF_DEFAULT;
	rc = fit(e, d, ef);
	if (rc)
		return rc;
	e->d = d;
	e->st = st;
	dindex_src(d, &e->src);
	e->src.get = stage_get;
	e->src.ctx = e;
	e->npub = 0;
	for (i = 0; i < n; i++) {
		st->err_at[0] = 0;
		rc = insert_one(e, vecs + (size_t)i * dim, ef, &ids[i]);
		if (rc) {
			st->err = rc;
			break;
		}
		st->inserted++;
	}
	if (e->npub)
		cn_upper_publish(e->cn, d, e->pub_id, e->pub_lv, e->npub);
	e->npub = 0;
	return i ? (int)i : rc;
}
