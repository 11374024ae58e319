/* dindex.c: memory-node connections, placing an index on the memory nodes, and a compute
 * node's view of it (metadata + block table). */
#include "dindex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dgen.h"
#include "hnsw/hnsw_upq.h"
#include "placement.h"

_Static_assert(DM_GEN_KIND_META == DM_OBJ_HNSW_META && DM_GEN_KIND_BLOCK == DM_OBJ_HNSW_BLOCK,
	       "generation keys use the object kinds of cluster.h");

#define CHUNK (1u << 20)          /* one WRITE / READ work request */
#define CHUNKS_PER_BATCH 16

static uint32_t crc(const void *p, size_t len)
{
	return (uint32_t)crc32_z(0, p, len);
}

/* ---- connections ------------------------------------------------------------------------ */

int mn_link_open(struct mn_set *s, uint32_t i, int timeout_ms)
{
	struct mn_link *l = &s->link[i];
	uint8_t body[sizeof(struct dm_wire_ctl_info)];
	uint32_t blen;
	int rc;

	mn_link_close(s, i);
	rc = dm_xport_connect(s->x, s->cfg->mn[i].address, timeout_ms, &l->conn);
	if (rc)
		goto out_null;
	rc = dm_rpc_chan_init(&l->ch, l->conn, s->pool, 4096, timeout_ms);
	if (rc)
		goto out_close;
	rc = dm_rpc_call(&l->ch, DM_OP_CTL_INFO, NULL, 0, body, sizeof(body), &blen);
	if (!rc)
		rc = dm_wire_ctl_info_decode(body, blen, &l->info);
	if (rc)
		goto out_fini;
	l->up = true;
	return 0;

out_fini:
	dm_rpc_chan_fini(&l->ch);
out_close:
	dm_conn_close(l->conn);
out_null:
	l->conn = NULL;
	return rc;
}

void mn_link_close(struct mn_set *s, uint32_t i)
{
	struct mn_link *l = &s->link[i];

	if (l->conn) {
		dm_rpc_chan_fini(&l->ch);
		dm_conn_close(l->conn);
	}
	l->conn = NULL;
	l->up = false;
}

struct mn_set *mn_set_open(const struct dm_cluster_cfg *cfg, struct dm_xport *x,
			   struct dm_msgpool *pool, bool require_all, int timeout_ms)
{
	struct mn_set *s = calloc(1, sizeof(*s));
	uint32_t up = 0;

	if (!s)
		return NULL;
	s->cfg = cfg;
	s->x = x;
	s->n = cfg->n_mn;
	s->pool = pool;
	if (!pool) {
		s->pool = dm_msgpool_new(x, 16 + 4 * cfg->n_mn, 4096);
		s->own_pool = true;
	}
	if (!s->pool)
		goto err_free;
	for (uint32_t i = 0; i < s->n; i++) {
		int rc = mn_link_open(s, i, timeout_ms);

		if (rc) {
			dm_warn("memory node %u (%s) unreachable: %s", i, cfg->mn[i].address,
				strerror(-rc));
			if (require_all) {
				errno = -rc;
				goto err_close;
			}
			continue;
		}
		up++;
	}
	if (!up) {
		dm_err("no memory node reachable");
		errno = EHOSTUNREACH;
		goto err_close;
	}
	return s;

err_close:
	mn_set_close(s);
	return NULL;
err_free:
	free(s);
	return NULL;
}

void mn_set_close(struct mn_set *s)
{
	if (!s)
		return;
	for (uint32_t i = 0; i < s->n; i++)
		mn_link_close(s, i);
	if (s->own_pool)
		dm_msgpool_free(s->pool);
	free(s);
}

int mn_link_snapshot(struct mn_set *s, uint32_t i)
{
	int rc;

	if (i >= s->n || !s->link[i].up)
		return -EHOSTDOWN;
	/* A snapshot writes at most the region: allow 50 MB/s of it plus 30 s (a 3.5 GB
	 * region took longer than the channel's 5 s and the answer came late). */
	int was = s->link[i].ch.timeout_ms;
	uint64_t ms = 30000 + s->link[i].info.region_len / (50ull << 10);

	s->link[i].ch.timeout_ms = (int)DM_MIN(DM_MAX((uint64_t)was, ms), 3600000ull);
	rc = dm_rpc_call(&s->link[i].ch, DM_OP_CTL_SNAPSHOT, NULL, 0, NULL, 0, NULL);
	s->link[i].ch.timeout_ms = was;
	return rc;
}

int mn_set_snapshot(struct mn_set *s)
{
	int first = 0;

	for (uint32_t i = 0; i < s->n; i++) {
		int rc;

		if (!s->link[i].up)
			continue;
		rc = mn_link_snapshot(s, i);
		if (rc && !first)
			first = rc;
	}
	return first;
}

static int obj_call(struct mn_link *l, uint16_t op, struct dm_wire_ctl_obj *o)
{
	uint8_t buf[sizeof(*o)];
	uint32_t blen = 0;
	int rc;

	dm_wire_ctl_obj_encode(buf, o);
	rc = dm_rpc_call(&l->ch, op, buf, sizeof(buf), buf, sizeof(buf), &blen);
	if (rc)
		return rc;
	if (blen == sizeof(buf))
		return dm_wire_ctl_obj_decode(buf, blen, o);
	return blen == 0 ? 0 : -EBADMSG;
}

/* Wait for the one signaled completion of a batch; any error completion fails it. */
static int wait_batch(struct mn_link *l, uint64_t wr_id)
{
	for (;;) {
		struct dm_wc wc;
		int rc = dm_conn_wait(l->conn, &wc, 1, 30000);

		if (rc < 0)
			return rc;
		if (rc == 0)
			return -ETIMEDOUT;
		if (wc.status)
			return wc.status;
		if (wc.wr_id == wr_id && (wc.opcode == DM_WC_WRITE || wc.opcode == DM_WC_READ))
			return 0;
		if (wc.opcode == DM_WC_RECV)
			dm_msgpool_repost(l->ch.pool, wc.wr_id);
	}
}

/* One-sided transfer of len bytes between a registered local buffer and remote memory. */
static int xfer(struct mn_link *l, bool write, void *local, struct dm_mr *mr, uint64_t remote,
		uint64_t len, void (*progress)(void *, uint64_t), void *parg, uint64_t *done)
{
	struct dm_rdma_wr wr[CHUNKS_PER_BATCH];
	uint64_t off = 0;
	static _Thread_local uint64_t seq = 1;

	while (off < len) {
		int n = 0, rc;

		while (n < CHUNKS_PER_BATCH && off < len) {
			uint32_t c = (uint32_t)DM_MIN((uint64_t)CHUNK, len - off);

			wr[n] = (struct dm_rdma_wr){ .wr_id = seq++, .local = (char *)local + off,
						     .mr = mr, .remote = remote + off,
						     .rkey = l->info.rkey, .len = c };
			off += c;
			n++;
		}
		wr[n - 1].flags = DM_WR_SIGNALED;
		rc = write ? dm_conn_write_batch(l->conn, wr, n) : dm_conn_read_batch(l->conn, wr, n);
		if (rc)
			return rc;
		rc = wait_batch(l, wr[n - 1].wr_id);
		if (rc)
			return rc;
		if (progress) {
			*done += off - (wr[0].remote - remote);
			progress(parg, *done);
		}
	}
	return 0;
}

/* Allocate, WRITE and commit one object on memory node l. */
static int put_object(struct mn_set *s, struct mn_link *l, uint64_t key, void *data,
		      uint64_t len, uint64_t cflags, void (*progress)(void *, uint64_t),
		      void *parg, uint64_t *done)
{
	struct dm_wire_ctl_obj o = { .key = key, .len = len };
	struct dm_mr *mr;
	int rc;

	rc = obj_call(l, DM_OP_CTL_ALLOC, &o);
	if (rc)
		return rc;
	if (o.addr < l->info.region_addr || o.addr - l->info.region_addr + len > l->info.region_len)
		return -EBADMSG;
	rc = dm_xport_reg(s->x, data, len, 0, &mr);
	if (rc)
		return rc;
	rc = xfer(l, true, data, mr, o.addr, len, progress, parg, done);
	dm_xport_dereg(s->x, mr);
	if (rc)
		return rc;
	o = (struct dm_wire_ctl_obj){ .key = key, .len = len, .aux = crc(data, len) | cflags };
	return obj_call(l, DM_OP_CTL_COMMIT, &o);
}

/* The memory nodes that hold block b, best first (placement over all configured nodes that
 * are not retired, so that a node being down does not change where the others look). The
 * placement unit is a run of `run` consecutive blocks (the graph's metadata says how many;
 * 1 for every graph loaded without --place-run): block b is placed as item b / run, so a
 * run's blocks share their replicas. The id counter's pseudo-block is placed as itself. */
static int block_replicas(const struct mn_set *s, uint32_t graph, uint32_t run, uint32_t b,
			  uint32_t r, uint32_t *out)
{
	struct dm_place_node nodes[DM_MAX_NODES];
	uint32_t unit = b == DINDEX_CTR_BLOCK || run <= 1 ? b : b / run;
	/* graph 0 keeps the placement it had before there were several graphs */
	uint64_t item = graph ? (uint64_t)graph << 32 | unit : unit;

	for (uint32_t i = 0; i < s->n; i++)
		nodes[i] = (struct dm_place_node){ .id = i, .capacity = s->cfg->mn[i].capacity,
						   .up = !(s->retired[i / 64] >> (i % 64) & 1) };
	return dm_place(item, nodes, s->n, r, out);
}

int dindex_block_replicas(const struct mn_set *s, uint32_t graph, uint32_t run, uint32_t b,
			  uint32_t r, uint32_t *out)
{
	return block_replicas(s, graph, run, b, r, out);
}

/* The key-order trailer (dindex.h) of idx loaded with placement runs of `run` blocks and
 * its label map (none with a binding: the keys name the rows then), appended to b. */
static void ko_encode(struct dm_buf *b, const struct hnsw_index *idx, uint32_t run,
		      bool labels)
{
	uint32_t nl = labels && idx->labels ? idx->n : 0, len = 8 + 4 * nl, c;
	size_t at = b->n;

	dm_buf_put(b, DINDEX_KO_MAGIC, 8);
	dm_buf_put(b, &len, 4);
	dm_buf_put(b, &len, 4);           /* the CRC, below */
	dm_buf_put(b, &run, 4);
	dm_buf_put(b, &nl, 4);
	if (nl)
		dm_buf_put(b, idx->labels, 4ull * nl);
	if (b->oom)
		return;
	c = crc(b->p + at + 16, len);
	memcpy(b->p + at + 12, &c, 4);
}

int dindex_load(struct mn_set *s, uint32_t graph, const struct hnsw_index *idx, uint32_t spare,
		uint32_t run, const struct dindex_bind_in *bind, uint64_t *gen_out,
		void (*progress)(void *, uint64_t), void *parg, char *err, size_t errlen)
{
	uint32_t r = s->cfg->redundancy ? s->cfg->redundancy : 1;
	uint64_t done = 0, up_words = 0;
	struct dindex_meta_hdr *h;
	uint32_t *up;
	size_t mlen;
	uint8_t *meta;
	int rc = 0;

	struct dgen_view v;
	uint64_t gen;

	for (uint32_t i = 0; i < s->n; i++)
		if (!s->link[i].up && !mn_set_retired(s, i)) {
			snprintf(err, errlen, "memory node %u is down: loading needs all of them "
				 "(but the retired ones)", i);
			return -EHOSTUNREACH;
		}
	/* Index generations (dgen.h): the previous load's old generation must be released
	 * first (its compute nodes acknowledge within refresh_ms; a silent one is given up
	 * after the lease), so that at most two generations exist. */
	rc = dgen_wait_released(s, graph, 0, &v);
	if (rc == -ETIMEDOUT) {
		dm_info("load: waiting for the compute nodes to release generation %llu",
			(unsigned long long)v.retired);
		rc = dgen_wait_released(s, graph, v.lease_ms + 5000, &v);
	}
	if (rc) {
		snprintf(err, errlen, "generation %llu of the previous load is still held by %u "
			 "compute nodes: %s", (unsigned long long)v.retired, v.waiting, strerror(-rc));
		return rc == -ETIMEDOUT ? -EBUSY : rc;
	}
	if (v.has_current && !v.agree) {
		/* An interrupted load published on some nodes only: finish that publication
		 * (its objects were all written before the first publish). A node that cannot
		 * (it lost its objects) gets the new generation below like the others. */
		rc = dgen_publish(s, graph, v.current, err, errlen);
		if (rc)
			dm_warn("load: memory nodes disagree on the current generation (%llu..%llu) "
				"and %s; loading generation %llu everywhere",
				(unsigned long long)v.min_current, (unsigned long long)v.current, err,
				(unsigned long long)v.current + 1);
		else
			return dindex_load(s, graph, idx, spare, run, bind, gen_out, progress, parg,
					   err, errlen);
	}
	gen = v.has_current ? v.current + 1 : 1;
	/* Leftovers of an interrupted load of this generation (never published). The current
	 * generation has the other parity, so its blocks are not touched. */
	for (uint32_t i = 0; i < s->n; i++) {
		struct dm_wire_ctl_obj o = { .key = dm_gen_meta_key(graph, gen), .aux = ~0ull };

		if (mn_set_retired(s, i))
			continue;
		rc = obj_call(&s->link[i], DM_OP_CTL_DROP, &o);
		if (!rc) {
			o = (struct dm_wire_ctl_obj){ .key = dm_gen_block_key(graph, gen, 0),
						      .aux = DM_GEN_BLOCK_MASK };
			rc = obj_call(&s->link[i], DM_OP_CTL_DROP, &o);
		}
		if (rc) {
			snprintf(err, errlen, "memory node %u: dropping leftovers of generation %llu: %s",
				 i, (unsigned long long)gen, strerror(-rc));
			return rc;
		}
	}
	uint64_t cap = (uint64_t)idx->n + spare;
	uint64_t bsz = 1ull << idx->p.block_shift;
	uint32_t nblocks = (uint32_t)((cap + bsz - 1) >> idx->p.block_shift);
	uint64_t cflags = spare ? DM_CTL_COMMIT_MUTABLE : 0;
	uint8_t *blk = NULL;

	if (run < 1 || run > DINDEX_MAX_RUN) {
		snprintf(err, errlen, "placement run of %u blocks: 1..%u", run, DINDEX_MAX_RUN);
		return -EINVAL;
	}
	if (cap > DINDEX_MAX_CAP) {
		snprintf(err, errlen, "%llu records with the spare room: more than %u",
			 (unsigned long long)cap, DINDEX_MAX_CAP);
		return -EINVAL;
	}
	if (spare) {
		blk = calloc(bsz, idx->rec_size);
		if (!blk) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	}
	for (uint32_t b = 0; b < nblocks; b++) {
		uint32_t reps[16];
		uint64_t first = (uint64_t)b << idx->p.block_shift;
		uint64_t nrec = DM_MIN(bsz, cap - first);
		uint64_t have = first < idx->n ? DM_MIN(bsz, idx->n - first) : 0;
		int nr = block_replicas(s, graph, run, b, r, reps);
		void *data = b < idx->nblocks ? idx->blocks[b] : NULL;

		if (have < nrec) {
			/* room for online inserts: the records that exist, then zeroes */
			memset(blk, 0, nrec * idx->rec_size);
			if (have)
				memcpy(blk, idx->blocks[b], have * idx->rec_size);
			data = blk;
		}
		for (int j = 0; j < nr; j++) {
			rc = put_object(s, &s->link[reps[j]], dm_gen_block_key(graph, gen, b), data,
					nrec * idx->rec_size, cflags, progress, parg, &done);
			if (rc) {
				snprintf(err, errlen, "block %u on memory node %u: %s%s", b, reps[j],
					 strerror(-rc), rc == -ENOSPC ?
					 " (region too small: raise region_mb)" : "");
				free(blk);
				return rc;
			}
		}
	}
	free(blk);
	if (spare) {
		/* the id counter, on the first placement node of its pseudo-block */
		uint64_t ctr[8] = { idx->n };
		uint32_t cm;

		block_replicas(s, graph, run, DINDEX_CTR_BLOCK, 1, &cm);
		rc = put_object(s, &s->link[cm], dm_gen_block_key(graph, gen, DINDEX_CTR_BLOCK), ctr,
				sizeof(ctr), DM_CTL_COMMIT_MUTABLE, NULL, NULL, &done);
		if (rc) {
			snprintf(err, errlen, "id counter on memory node %u: %s", cm, strerror(-rc));
			return rc;
		}
	}
	up = hnsw_upper_serialize(idx, &up_words);
	size_t qlen = idx->quant ? hnsw_quant_blob_size(idx->quant) : 0;
	uint32_t uvn = 0;

	for (uint32_t id = 0; id < idx->n; id++)
		uvn += hnsw_rec(idx, id)->level > 0;
	size_t uvlen = (size_t)uvn * idx->vdim * sizeof(float);
	struct dm_buf bt = { 0 };           /* the key-order and S3 binding trailers */

	if (run > 1 || idx->labels)
		ko_encode(&bt, idx, run, !bind);
	if (bind) {
		rc = bind->n == idx->n ? dindex_bind_encode(&bt, bind) : -EINVAL;
		if (!rc && bt.oom)
			rc = -ENOMEM;
		if (rc) {
			free(up);
			dm_buf_free(&bt);
			snprintf(err, errlen, "S3 binding: %s", rc == -EINVAL ?
				 "bad bucket or index name, a bad key, or not one key per vector" :
				 strerror(-rc));
			return rc;
		}
	}
	mlen = sizeof(*h) + up_words * 4 + qlen + uvlen + bt.n;
	meta = calloc(1, mlen);
	if (!up || !meta) {
		free(up);
		free(meta);
		dm_buf_free(&bt);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (bt.n)
		memcpy(meta + mlen - bt.n, bt.p, bt.n);
	dm_buf_free(&bt);
	h = (struct dindex_meta_hdr *)meta;
	memcpy(h->magic, DINDEX_MAGIC, 8);
	h->version = DINDEX_VERSION;
	h->dim = idx->p.dim;
	h->metric = (uint32_t)idx->p.metric;
	h->M = idx->p.M;
	h->n = idx->n;
	h->rec_size = idx->rec_size;
	h->block_shift = idx->p.block_shift;
	h->nblocks = nblocks;
	h->capacity = (uint32_t)cap;
	h->entry = idx->entry;
	h->max_level = idx->max_level;
	h->redundancy = r;
	h->up_words = up_words;
	h->layout = HNSW_LAYOUT_VERSION;
	h->codes = (uint32_t)idx->p.codes;
	h->code_bytes = idx->code_bytes;
	h->vdim = idx->vdim;
	h->q_len = qlen;
	memcpy(meta + sizeof(*h), up, up_words * 4);
	if (idx->quant)
		hnsw_quant_blob(idx->quant, meta + sizeof(*h) + up_words * 4);
	h->q_crc = crc(meta + sizeof(*h) + up_words * 4, qlen);
	h->up_crc = crc(up, up_words * 4);
	{
		float *uv = (float *)(meta + sizeof(*h) + up_words * 4 + qlen);

		for (uint32_t id = 0, j = 0; id < idx->n; id++) {
			const struct hnsw_rec_hdr *r = hnsw_rec(idx, id);

			if (!r->level)
				continue;
			memcpy(uv + (size_t)j * idx->vdim, hnsw_rec_vec(r, idx->vec_off),
			       (size_t)idx->vdim * sizeof(float));
			j++;
		}
		h->uv_nodes = uvn;
		h->uv_crc = crc(uv, uvlen);
	}
	h->hdr_crc = crc(h, offsetof(struct dindex_meta_hdr, hdr_crc));
	free(up);
	/* Metadata last, then the publication: a compute node that sees generation gen sees
	 * a complete index; the previous generation stays intact until it is released. */
	for (uint32_t i = 0; i < s->n && !rc; i++) {
		if (mn_set_retired(s, i))
			continue;
		rc = put_object(s, &s->link[i], dm_gen_meta_key(graph, gen), meta, mlen, 0, NULL, NULL,
				&done);
		if (rc)
			snprintf(err, errlen, "metadata on memory node %u: %s", i, strerror(-rc));
	}
	free(meta);
	if (!rc)
		rc = dgen_publish(s, graph, gen, err, errlen);
	if (rc)
		dgen_abandon(s, graph, gen);
	if (!rc && gen_out)
		*gen_out = gen;
	return rc;
}

int dindex_drop_graph(struct mn_set *s, uint32_t graph, char *err, size_t errlen)
{
	struct dgen_view v;
	int rc;

	if (graph >= DM_MAX_GRAPHS) {
		snprintf(err, errlen, "graph %u: graph numbers are 0..%u", graph, DM_MAX_GRAPHS - 1);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < s->n; i++)
		if (!s->link[i].up && !mn_set_retired(s, i)) {
			snprintf(err, errlen, "memory node %u is down: dropping a graph needs all of "
				 "them (but the retired ones)", i);
			return -EHOSTUNREACH;
		}
	rc = dgen_report(s, graph, DM_GEN_NO_CN, 0, &v, NULL);
	if (rc) {
		snprintf(err, errlen, "a memory node did not answer: %s", strerror(-rc));
		return rc;
	}
	if (!v.has_current) {
		if (v.has_retired)
			return 0;   /* dropped before; its blocks are being released */
		snprintf(err, errlen, "graph %u is not loaded", graph);
		return -ENOENT;
	}
	/* One retired generation at a time: an older one of the last load goes first. */
	if (v.has_retired) {
		dm_info("drop: waiting for the compute nodes to release generation %llu of graph %u",
			(unsigned long long)v.retired, graph);
		rc = dgen_wait_released(s, graph, v.lease_ms + 5000, &v);
		if (rc) {
			snprintf(err, errlen, "generation %llu of graph %u is still held by %u compute "
				 "nodes: %s", (unsigned long long)v.retired, graph, v.waiting,
				 strerror(-rc));
			return rc == -ETIMEDOUT ? -EBUSY : rc;
		}
	}
	/* Each node drops its own current generation (after an interrupted load they may
	 * differ: every one of them goes). */
	for (uint32_t i = 0; i < s->n; i++) {
		struct dm_wire_ctl_gen_state st;

		if (mn_set_retired(s, i))
			continue;
		rc = dgen_report_node(s, i, graph, DM_GEN_NO_CN, 0, &st, NULL);
		if (!rc && !(st.flags & DM_GEN_F_CURRENT))
			continue;
		if (!rc)
			rc = dgen_drop_node(s, i, graph, st.current);
		if (rc) {
			snprintf(err, errlen, "dropping graph %u on memory node %u: %s", graph, i,
				 strerror(-rc));
			return rc;
		}
	}
	return 0;
}

/* ---- compute node view ------------------------------------------------------------------ */

void dindex_free(struct dindex *d)
{
	if (!d)
		return;
	free(d->up_store);
	free(d->upl);
	for (uint32_t i = 0; i < d->n_extra; i++)
		free(d->up_extra[i]);
	free(d->up_extra);
	pthread_rwlock_destroy(&d->up_lock);
	free(d->block_mn);
	free(d->block_addr);
	hnsw_quant_free(d->quant);
	free(d->uv_store);
	free(d->uvec);
	hnsw_upq_free(d->upq);
	dindex_bind_free(d->bind);
	free(d->labels);
	free(d);
}

void dindex_src(const struct dindex *d, struct hnsw_src *src)
{
	memset(src, 0, sizeof(*src));
	src->dim = d->p.dim;
	src->M = d->p.M;
	src->rec_size = d->rec_size;
	src->vec_off = d->vec_off;
	src->vdim = d->vdim;
	src->quant = d->quant;
	src->block_shift = d->p.block_shift;
	src->n = d->cap;
	src->metric = d->p.metric;
	src->upl = d->upl;
	src->uvec = d->uvec;
	src->upq = d->upq;
	src->entry = d->entry;
	src->max_level = d->max_level;
	src->ef_upper = HNSW_EF_UPPER_DEFAULT;
	/* online upper levels change the view's upper levels (cn_upper.h) */
	src->uplock = d->cap > d->n ? (pthread_rwlock_t *)&d->up_lock : NULL;
}

void dindex_rec_vector(const struct dindex *d, const struct hnsw_rec_hdr *r, float *out)
{
	dindex_stored_vector(d, hnsw_rec_vec(r, d->vec_off), out);
}

void dindex_stored_vector(const struct dindex *d, const float *v, float *out)
{
	if (!d->quant) {
		memcpy(out, v, d->p.dim * sizeof(float));
		return;
	}
	float tmp[d->vdim];

	hnsw_quant_unrotate(d->quant, v, tmp);
	memcpy(out, tmp, d->p.dim * sizeof(float));
}

/* The stored vector of a level >= 1 node (hnsw_upq_build's source). */
static const float *uvec_of(void *arg, uint32_t id)
{
	const struct dindex *d = arg;

	return d->uvec[id];
}

/* The key-order trailer at t (tail bytes left, n nodes): d->run and d->labels. Its length,
 * or -EBADMSG / -ENOMEM with a message. */
int dindex_ko_parse(struct dindex *d, const uint8_t *t, size_t tail, uint32_t n, char *err,
		    size_t errlen)
{
	uint32_t len, c, run, nl;
	uint8_t *seen;

	if (tail < 24)
		goto bad;
	memcpy(&len, t + 8, 4);
	memcpy(&c, t + 12, 4);
	memcpy(&run, t + 16, 4);
	memcpy(&nl, t + 20, 4);
	if (len < 8 || len > tail - 16 || crc(t + 16, len) != c || run < 1 ||
	    run > DINDEX_MAX_RUN || (nl && nl != n) || len != 8 + 4ull * nl)
		goto bad;
	d->run = run;
	if (!nl)
		return (int)(16 + len);
	d->labels = malloc(4ull * nl);
	seen = calloc(nl, 1);
	if (!d->labels || !seen) {
		free(seen);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memcpy(d->labels, t + 24, 4ull * nl);
	for (uint32_t i = 0; i < nl; i++)
		if (d->labels[i] >= nl || seen[d->labels[i]]++) {
			free(seen);
			goto bad;
		}
	free(seen);
	d->nlabels = nl;
	return (int)(16 + len);
bad:
	snprintf(err, errlen, "index metadata: malformed key-order trailer (placement run, "
		 "label map)");
	return -EBADMSG;
}

/* Validate the header and upper area and build the upper-list pointers. */
static int parse_meta(struct dindex *d, uint8_t *meta, size_t len, char *err, size_t errlen)
{
	struct dindex_meta_hdr h;
	struct hnsw_params p;
	uint64_t o = 0;

	if (len < sizeof(h)) {
		snprintf(err, errlen, "index metadata: %zu bytes, shorter than its header", len);
		return -EBADMSG;
	}
	memcpy(&h, meta, sizeof(h));
	if (!memcmp(h.magic, DINDEX_MAGIC, 8) && h.version == 1) {
		snprintf(err, errlen, "index metadata of record layout v1: rebuild the index "
			 "(dmann build --codes rabitq|none) and dmann load it again");
		return -EBADMSG;
	}
	if (memcmp(h.magic, DINDEX_MAGIC, 8) || h.version != DINDEX_VERSION ||
	    crc(&h, offsetof(struct dindex_meta_hdr, hdr_crc)) != h.hdr_crc) {
		snprintf(err, errlen, "index metadata: bad magic, version or header checksum");
		return -EBADMSG;
	}
	p = (struct hnsw_params){ .dim = h.dim, .metric = (enum dm_metric)h.metric, .M = h.M,
				  .ef_construction = 1, .block_shift = h.block_shift,
				  .codes = (enum hnsw_codes)h.codes };
	if (h.layout != HNSW_LAYOUT_VERSION) {
		snprintf(err, errlen, "index metadata: record layout %u, this dmann reads %u",
			 h.layout, HNSW_LAYOUT_VERSION);
		return -EBADMSG;
	}
	if (hnsw_params_check(&p, err, errlen))
		return -EBADMSG;
	bool codes = h.codes == HNSW_CODES_RABITQ;
	if ((!codes && (h.code_bytes || h.vdim != h.dim || h.q_len)) ||
	    (codes && (!h.q_len || h.q_len > len || h.vdim < h.dim || h.vdim > h.dim + 4096 ||
		       h.code_bytes > (64u << 20))) ||
	    h.rec_size != hnsw_rec_size(h.M, h.vdim, h.code_bytes) || h.n == 0 ||
	    (h.capacity && (h.capacity < h.n || h.capacity > DINDEX_MAX_CAP)) ||
	    h.nblocks != ((uint64_t)(h.capacity ? h.capacity : h.n) + (1ull << h.block_shift) - 1) >>
			 h.block_shift ||
	    h.entry >= h.n || h.max_level < 0 || h.max_level > (int)HNSW_MAX_LEVEL ||
	    h.up_words > (len - sizeof(h)) / 4 || h.uv_nodes > h.n ||
	    len < sizeof(h) + h.up_words * 4 + h.q_len + (uint64_t)h.uv_nodes * h.vdim * 4 ||
	    crc(meta + sizeof(h), h.up_words * 4) != h.up_crc ||
	    crc(meta + sizeof(h) + h.up_words * 4, h.q_len) != h.q_crc) {
		snprintf(err, errlen, "index metadata: inconsistent geometry or checksum");
		return -EBADMSG;
	}
	if (codes) {
		d->quant = hnsw_quant_from_blob(meta + sizeof(h) + h.up_words * 4, h.q_len, h.dim,
						p.metric, h.M, h.code_bytes, err, errlen);
		if (!d->quant)
			return -EBADMSG;
		if (hnsw_quant_vdim(d->quant) != h.vdim) {
			snprintf(err, errlen, "index metadata: quantizer dimension mismatch");
			return -EBADMSG;
		}
	}
	{
		const uint8_t *uv = meta + sizeof(h) + h.up_words * 4 + h.q_len;
		size_t uvlen = (size_t)h.uv_nodes * h.vdim * 4;

		if (crc(uv, uvlen) != h.uv_crc) {
			snprintf(err, errlen, "index metadata: upper-level vectors checksum");
			return -EBADMSG;
		}
		d->uv_store = malloc(uvlen ? uvlen : 4);
		/* room for every id below the capacity: online upper levels (cn_upper.c) */
		d->uvec = calloc(h.capacity > h.n ? h.capacity : h.n, sizeof(*d->uvec));
		if (!d->uv_store || !d->uvec) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		memcpy(d->uv_store, uv, uvlen);
		/* The rest, if any: the key-order trailer, then the S3 binding (dindex_bind.h). */
		const uint8_t *t = uv + uvlen;
		size_t tail = len - (size_t)(t - meta);

		d->run = 1;
		if (tail >= 8 && !memcmp(t, DINDEX_KO_MAGIC, 8)) {
			int rc = dindex_ko_parse(d, t, tail, h.n, err, errlen);

			if (rc < 0)
				return rc;
			t += rc;
			tail -= (size_t)rc;
		}
		if (tail) {
			d->bind = dindex_bind_parse(t, tail, h.n, err, errlen);
			if (!d->bind)
				return -errno;
		}
	}
	d->code_bytes = h.code_bytes;
	d->vdim = h.vdim;
	d->vec_off = hnsw_rec_vec_off(h.M, h.code_bytes);
	d->p = p;
	d->n = h.n;
	d->cap = h.capacity ? h.capacity : h.n;
	d->rec_size = h.rec_size;
	d->nblocks = h.nblocks;
	d->entry = h.entry;
	d->max_level = h.max_level;
	d->index_bytes = (uint64_t)h.n * h.rec_size;
	d->up_store = malloc((h.up_words ? h.up_words : 1) * 4);
	d->upl = calloc(d->cap, sizeof(*d->upl));
	d->nrep = DM_MAX(1u, DM_MIN(h.redundancy, DINDEX_MAX_REP));
	d->block_mn = calloc((size_t)h.nblocks * d->nrep, 1);
	d->block_addr = calloc((size_t)h.nblocks * d->nrep, sizeof(*d->block_addr));
	if (!d->up_store || !d->upl || !d->block_mn || !d->block_addr) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memcpy(d->up_store, meta + sizeof(h), h.up_words * 4);
	while (o < h.up_words) {
		uint32_t id, lv;

		if (h.up_words - o < 2)
			goto bad_up;
		id = d->up_store[o];
		lv = d->up_store[o + 1];
		if (id >= h.n || lv == 0 || lv > (uint32_t)h.max_level || d->upl[id] ||
		    h.up_words - o - 2 < (uint64_t)lv * hnsw_up_list_words(h.M))
			goto bad_up;
		d->upl[id] = d->up_store + o + 2;
		for (uint32_t l = 1; l <= lv; l++)
			d->at_level[l]++;
		for (uint32_t l = 0; l < lv; l++) {
			const uint32_t *w = d->upl[id] + (size_t)l * hnsw_up_list_words(h.M);

			if (w[0] > h.M)
				goto bad_up;
			for (uint32_t j = 0; j < w[0]; j++)
				if (w[1 + j] >= h.n)
					goto bad_up;
		}
		o += 2 + (uint64_t)lv * hnsw_up_list_words(h.M);
	}
	if (h.max_level > 0 && !d->upl[h.entry])
		goto bad_up;
	/* upper-level vectors: one per node of the upper area, in its (id) order */
	{
		uint32_t j = 0;

		for (uint32_t id = 0; id < h.n; id++) {
			if (!d->upl[id])
				continue;
			if (j >= h.uv_nodes)
				goto bad_up;
			d->uvec[id] = d->uv_store + (size_t)j++ * h.vdim;
		}
		if (j != h.uv_nodes)
			goto bad_up;
	}
	if (d->quant) {
		d->upq = hnsw_upq_build(h.n, h.vdim, p.metric, uvec_of, d);
		if (d->upq && hnsw_upq_reserve_ids(d->upq, d->cap)) {
			hnsw_upq_free(d->upq);
			d->upq = NULL;
			errno = ENOMEM;
		}
		if (!d->upq) {
			snprintf(err, errlen, errno == ENOMEM ? "out of memory" :
				 "index metadata: non-finite upper-level vector");
			return -(errno == ENOMEM ? ENOMEM : EBADMSG);
		}
	}
	/* Every node an upper list names must itself have upper lists down to that level. */
	for (uint32_t id = 0; id < h.n; id++) {
		if (!d->upl[id])
			continue;
		for (uint32_t l = 0; l < dindex_level(d, id); l++) {
			const uint32_t *w = d->upl[id] + (size_t)l * hnsw_up_list_words(h.M);

			for (uint32_t j = 0; j < w[0]; j++)
				if (dindex_level(d, w[1 + j]) < l + 1)
					goto bad_up;
		}
	}
	return 0;
bad_up:
	snprintf(err, errlen, "index metadata: malformed upper-level lists");
	return -EBADMSG;
}

int dindex_pin_level(const struct dindex *d, uint64_t slots)
{
	int l = 1;

	while (l <= d->max_level && d->at_level[l] > slots / 4)
		l++;
	return l;
}

/* The address of generation d->gen's block b on memory node m (its object looked up and
 * checked against the node's region). 0 or -errno. */
static int lookup_block(struct mn_set *s, const struct dindex *d, uint32_t b, uint32_t m,
			uint64_t *addr)
{
	struct mn_link *bl = &s->link[m];
	uint64_t first = (uint64_t)b << d->p.block_shift;
	uint64_t want = DM_MIN(1ull << d->p.block_shift, d->cap - first) * d->rec_size;
	struct dm_wire_ctl_obj o = { .key = dm_gen_block_key(d->graph, d->gen, b) };
	int rc = obj_call(bl, DM_OP_CTL_LOOKUP, &o);

	if (!rc && (o.len != want || o.addr < bl->info.region_addr ||
		    o.addr - bl->info.region_addr + o.len > bl->info.region_len))
		rc = -EBADMSG;
	if (!rc)
		*addr = o.addr;
	return rc;
}

/* The key and length of block b of d (b = DINDEX_CTR_BLOCK: the id counter). */
static void block_obj(const struct dindex *d, uint32_t b, uint64_t *key, uint64_t *len)
{
	uint64_t first = (uint64_t)b << d->p.block_shift;

	*key = dm_gen_block_key(d->graph, d->gen, b);
	*len = b == DINDEX_CTR_BLOCK ? 64 :
	       DM_MIN(1ull << d->p.block_shift, d->cap - first) * d->rec_size;
}

/* Look block b up on m: its address and commit word (aux). 0, -ENOENT, -EBADMSG. */
static int lookup_obj(struct mn_set *s, const struct dindex *d, uint32_t b, uint32_t m,
		      uint64_t *addr, uint64_t *aux)
{
	struct mn_link *l = &s->link[m];
	uint64_t key, len;
	struct dm_wire_ctl_obj o;
	int rc;

	block_obj(d, b, &key, &len);
	o = (struct dm_wire_ctl_obj){ .key = key };
	rc = obj_call(l, DM_OP_CTL_LOOKUP, &o);
	if (!rc && (o.len != len || o.addr < l->info.region_addr ||
		    o.addr - l->info.region_addr + o.len > l->info.region_len))
		rc = -EBADMSG;
	if (!rc) {
		*addr = o.addr;
		*aux = o.aux;
	}
	return rc;
}

int dindex_has_block(struct mn_set *s, const struct dindex *d, uint32_t b, uint32_t m)
{
	uint64_t addr, aux;
	int rc;

	if (m >= s->n || !s->link[m].up)
		return -EHOSTDOWN;
	rc = lookup_obj(s, d, b, m, &addr, &aux);
	return rc == 0 ? 1 : rc == -ENOENT ? 0 : rc;
}

/* Copy the committed object key (len bytes, at addr on `from`, committed with crc32 aux;
 * mutable objects' CRC is not checked: online inserts write them) to `to`, read it back and
 * compare. 0 or -errno. */
static int copy_obj(struct mn_set *s, uint64_t key, uint64_t len, uint64_t addr, uint64_t aux,
		    bool mutable, uint32_t from, uint32_t to)
{
	struct dm_wire_ctl_obj o;
	struct dm_mr *mr = NULL;
	uint8_t *buf, *back;
	uint64_t done = 0;
	int rc;

	buf = aligned_alloc(64, DM_ALIGN_UP(len, 64));
	back = buf ? aligned_alloc(64, DM_ALIGN_UP(len, 64)) : NULL;
	if (!buf || !back) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = dm_xport_reg(s->x, buf, len, 0, &mr);
	if (rc)
		goto out_free;
	rc = xfer(&s->link[from], false, buf, mr, addr, len, NULL, NULL, &done);
	dm_xport_dereg(s->x, mr);
	if (rc)
		goto out_free;
	/* An object that is not written online must arrive as it was committed. */
	if (!mutable && crc(buf, len) != (uint32_t)aux) {
		rc = -EBADMSG;
		goto out_free;
	}
	/* Leftovers of an interrupted copy (allocated, never committed) go first. */
	o = (struct dm_wire_ctl_obj){ .key = key, .aux = ~0ull };
	obj_call(&s->link[to], DM_OP_CTL_DROP, &o);
	rc = put_object(s, &s->link[to], key, buf, len, mutable ? DM_CTL_COMMIT_MUTABLE : 0, NULL,
			NULL, &done);
	if (rc)
		goto out_free;
	/* Verify: read the new copy back. */
	o = (struct dm_wire_ctl_obj){ .key = key };
	rc = obj_call(&s->link[to], DM_OP_CTL_LOOKUP, &o);
	if (!rc && (o.len != len || o.addr < s->link[to].info.region_addr ||
		    o.addr - s->link[to].info.region_addr + len > s->link[to].info.region_len))
		rc = -EBADMSG;
	if (rc)
		goto out_free;
	rc = dm_xport_reg(s->x, back, len, 0, &mr);
	if (rc)
		goto out_free;
	rc = xfer(&s->link[to], false, back, mr, o.addr, len, NULL, NULL, &done);
	dm_xport_dereg(s->x, mr);
	if (!rc && memcmp(buf, back, len))
		rc = -EIO;
out_free:
	free(buf);
	free(back);
	return rc;
}

int dindex_read_block(struct mn_set *s, const struct dindex *d, uint32_t b, void *buf,
		      uint64_t *len)
{
	uint64_t first = (uint64_t)b << d->p.block_shift, done = 0;
	uint64_t want = DM_MIN(1ull << d->p.block_shift, (uint64_t)d->cap - first) * d->rec_size;
	int rc = -EHOSTDOWN;

	if (b >= d->nblocks)
		return -EINVAL;
	for (uint32_t j = 0; j < d->nrep; j++) {
		size_t i = (size_t)b * d->nrep + j;
		uint32_t m = d->block_mn[i];
		struct dm_mr *mr;

		if (m == DINDEX_NO_MN || !d->block_addr[i] || !s->link[m].up)
			continue;
		rc = dm_xport_reg(s->x, buf, want, 0, &mr);
		if (rc)
			return rc;
		rc = xfer(&s->link[m], false, buf, mr, d->block_addr[i], want, NULL, NULL, &done);
		dm_xport_dereg(s->x, mr);
		if (!rc) {
			*len = want;
			return 0;
		}
	}
	return rc;
}

int dindex_read_ctr(struct mn_set *s, const struct dindex *d, uint64_t *next)
{
	uint64_t done = 0, *buf;
	struct dm_mr *mr;
	int rc;

	if (d->cap <= d->n || !d->ctr_addr) {
		*next = d->n;
		return d->cap <= d->n ? 0 : -EHOSTDOWN;
	}
	if (!s->link[d->ctr_mn].up)
		return -EHOSTDOWN;
	buf = aligned_alloc(64, 64);
	if (!buf)
		return -ENOMEM;
	rc = dm_xport_reg(s->x, buf, 64, 0, &mr);
	if (!rc) {
		rc = xfer(&s->link[d->ctr_mn], false, buf, mr, d->ctr_addr, 64, NULL, NULL, &done);
		dm_xport_dereg(s->x, mr);
	}
	if (!rc)
		*next = buf[0];
	free(buf);
	return rc;
}

int dindex_copy_block(struct mn_set *s, const struct dindex *d, uint32_t b, uint32_t from,
		      uint32_t to, uint64_t *bytes)
{
	uint64_t key, len, addr, aux;
	bool mutable = b == DINDEX_CTR_BLOCK || d->cap > d->n;   /* as dindex_load commits */
	int rc;

	if (from >= s->n || to >= s->n || !s->link[from].up || !s->link[to].up)
		return -EHOSTDOWN;
	block_obj(d, b, &key, &len);
	rc = lookup_obj(s, d, b, from, &addr, &aux);
	if (!rc)
		rc = copy_obj(s, key, len, addr, aux, mutable, from, to);
	if (!rc && bytes)
		*bytes = len;
	return rc;
}

int dindex_copy_meta(struct mn_set *s, const struct dindex *d, uint32_t from, uint32_t to)
{
	struct dm_wire_ctl_obj o = { .key = dm_gen_meta_key(d->graph, d->gen) };
	struct mn_link *l;
	int rc;

	if (from >= s->n || to >= s->n || !s->link[from].up || !s->link[to].up)
		return -EHOSTDOWN;
	l = &s->link[from];
	rc = obj_call(l, DM_OP_CTL_LOOKUP, &o);
	if (!rc && (o.addr < l->info.region_addr ||
		    o.addr - l->info.region_addr + o.len > l->info.region_len))
		rc = -EBADMSG;
	return rc ? rc : copy_obj(s, o.key, o.len, o.addr, o.aux, false, from, to);
}

int dindex_drop_all(struct mn_set *s, uint32_t m)
{
	/* every graph's metadata and blocks: the key kind alone */
	struct dm_wire_ctl_obj o[2] = {
		{ .key = dm_gen_meta_key(0, 0), .aux = 0xffull << 56 },
		{ .key = dm_gen_block_key(0, 0, 0), .aux = 0xffull << 56 },
	};
	int rc = 0;

	for (int i = 0; i < 2 && !rc; i++)
		rc = obj_call(&s->link[m], DM_OP_CTL_DROP, &o[i]);
	return rc;
}

int dindex_rejoin(struct mn_set *s, const struct dindex *d, uint32_t m, uint64_t *addr)
{
	uint32_t probe = UINT32_MAX;
	struct dm_mr *mr = NULL;
	uint8_t *rec = NULL;
	uint64_t done = 0;
	int rc = 0;

	for (size_t i = 0; i < (size_t)d->nblocks * d->nrep && !rc; i++) {
		addr[i] = 0;
		if (d->block_mn[i] != m)
			continue;
		rc = lookup_block(s, d, (uint32_t)(i / d->nrep), m, &addr[i]);
		if (!rc && probe == UINT32_MAX)
			probe = (uint32_t)i;
	}
	if (rc || probe == UINT32_MAX)
		return rc;
	/* A probe READ of the first record of one of its blocks, validated. */
	rec = aligned_alloc(64, DM_ALIGN_UP(d->rec_size, 64));
	if (!rec)
		return -ENOMEM;
	rc = dm_xport_reg(s->x, rec, d->rec_size, 0, &mr);
	if (rc)
		goto out_free;
	rc = xfer(&s->link[m], false, rec, mr, addr[probe], d->rec_size, NULL, NULL, &done);
	if (!rc && !dindex_rec_ok(d, (const struct hnsw_rec_hdr *)rec))
		rc = -EBADMSG;
	dm_xport_dereg(s->x, mr);
out_free:
	free(rec);
	return rc;
}

int dindex_lookup_ctr(struct mn_set *s, const struct dindex *d, uint32_t m, uint64_t *addr)
{
	struct dm_wire_ctl_obj o = { .key = dm_gen_block_key(d->graph, d->gen, DINDEX_CTR_BLOCK) };
	int rc;

	if (d->cap <= d->n || d->ctr_mn != m)
		return -ENOENT;
	if (m >= s->n || !s->link[m].up)
		return -EHOSTDOWN;
	rc = obj_call(&s->link[m], DM_OP_CTL_LOOKUP, &o);
	if (!rc && (o.len != 64 || o.addr < s->link[m].info.region_addr ||
		    o.addr - s->link[m].info.region_addr + 64 > s->link[m].info.region_len))
		rc = -EBADMSG;
	if (!rc)
		*addr = o.addr;
	return rc;
}

int dindex_sync_block(struct mn_set *s, const struct dindex *d, uint32_t b, uint32_t from,
		      uint32_t to, int passes, uint32_t *written)
{
	uint64_t first = (uint64_t)b << d->p.block_shift, done = 0, fa, ta;
	uint64_t nrec = DM_MIN(1ull << d->p.block_shift, (uint64_t)d->cap - first);
	size_t len = (size_t)(nrec * d->rec_size);
	uint8_t *src = NULL, *dst = NULL;
	struct dm_mr *smr = NULL, *dmr = NULL;
	uint32_t pending = 0;
	int rc;

	*written = 0;
	if (b >= d->nblocks || from >= s->n || to >= s->n || !s->link[from].up || !s->link[to].up)
		return b >= d->nblocks ? -EINVAL : -EHOSTDOWN;
	rc = lookup_block(s, d, b, from, &fa);
	if (!rc)
		rc = lookup_block(s, d, b, to, &ta);
	if (rc)
		return rc;
	src = aligned_alloc(64, DM_ALIGN_UP(len, 64));
	dst = aligned_alloc(64, DM_ALIGN_UP(len, 64));
	if (!src || !dst) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = dm_xport_reg(s->x, src, len, 0, &smr);
	if (!rc)
		rc = dm_xport_reg(s->x, dst, len, 0, &dmr);
	for (int pass = 0; !rc && pass < passes; pass++) {
		uint32_t before = *written;

		/* the stale copy first: a record a writer changes meanwhile shows as a difference
		 * on the source's newer version, written in this pass or the next */
		rc = xfer(&s->link[to], false, dst, dmr, ta, len, NULL, NULL, &done);
		if (!rc)
			rc = xfer(&s->link[from], false, src, smr, fa, len, NULL, NULL, &done);
		pending = 0;
		for (uint64_t i = 0; !rc && i < nrec;) {
			const struct hnsw_rec_hdr *r = (const void *)(src + i * d->rec_size);
			uint64_t j = i;

			/* a run of records that differ and are whole on the source (a held one
			 * whose body is whole too: its writer may be gone, and the lock word is
			 * only ever used on the primary) */
			while (j < nrec && memcmp(src + j * d->rec_size, dst + j * d->rec_size,
						  d->rec_size) &&
			       hnsw_rec_intact((const void *)(src + j * d->rec_size), d->rec_size))
				j++;
			if (j > i) {
				rc = xfer(&s->link[to], true, src + i * d->rec_size, smr,
					  ta + i * d->rec_size, (j - i) * d->rec_size, NULL, NULL,
					  &done);
				*written += (uint32_t)(j - i);
				i = j;
				continue;
			}
			/* differs but torn on the source (a writer is between its WRITEs, and
			 * writes this copy too): the next pass; one still torn after the passes
			 * (its writer died) keeps the copy it has, as a reader would */
			if (memcmp(src + i * d->rec_size, dst + i * d->rec_size, d->rec_size) &&
			    (r->seq || r->crc || r->n0))
				pending++;
			i++;
		}
		if (!rc && !pending && *written == before)
			break;   /* a pass with nothing left to write */
		if (!rc && pending)
			usleep(20000);
	}
	if (!rc && pending)
		dm_warn("block %u of graph %u: %u record(s) torn on mn%u through %d passes: mn%u "
			"keeps its copies of them", b, d->graph, pending, from, passes, to);
out_free:
	if (dmr)
		dm_xport_dereg(s->x, dmr);
	if (smr)
		dm_xport_dereg(s->x, smr);
	free(src);
	free(dst);
	return rc;
}

int dindex_open(struct mn_set *s, uint32_t graph, uint64_t gen, struct dindex **out, char *err, size_t errlen)
{
	struct dm_wire_ctl_obj o = { 0 };
	struct dindex *d = NULL;
	struct mn_link *l = NULL;
	struct dm_mr *mr = NULL;
	uint8_t *meta = NULL;
	uint64_t done = 0;
	uint32_t r;
	int rc = -ENOENT;

	/* The metadata lives on every memory node: use the first that answers. */
	for (uint32_t i = 0; i < s->n && rc; i++) {
		if (!s->link[i].up)
			continue;
		o = (struct dm_wire_ctl_obj){ .key = dm_gen_meta_key(graph, gen) };
		rc = obj_call(&s->link[i], DM_OP_CTL_LOOKUP, &o);
		if (!rc)
			l = &s->link[i];
	}
	if (rc) {
		snprintf(err, errlen, rc == -ENOENT ? "no index loaded (dmann load first)" :
			 "metadata lookup failed: %s", strerror(-rc));
		return rc;
	}
	if (o.len > (1ull << 32) || o.len < sizeof(struct dindex_meta_hdr)) {
		snprintf(err, errlen, "index metadata has an implausible size (%llu bytes)",
			 (unsigned long long)o.len);
		return -EBADMSG;
	}
	meta = malloc(o.len);
	d = calloc(1, sizeof(*d));
	if (!meta || !d) {
		rc = -ENOMEM;
		goto out;
	}
	pthread_rwlock_init(&d->up_lock, NULL);
	rc = dm_xport_reg(s->x, meta, o.len, 0, &mr);
	if (rc)
		goto out;
	rc = xfer(l, false, meta, mr, o.addr, o.len, NULL, NULL, &done);
	dm_xport_dereg(s->x, mr);
	if (rc) {
		snprintf(err, errlen, "reading the index metadata: %s", strerror(-rc));
		goto out;
	}
	if (crc(meta, o.len) != (uint32_t)o.aux) {
		snprintf(err, errlen, "index metadata changed while it was read");
		rc = -EAGAIN;
		goto out;
	}
	rc = parse_meta(d, meta, o.len, err, errlen);
	if (rc)
		goto out;
	d->meta_crc = (uint32_t)o.aux;
	d->gen = gen;
	d->graph = graph;
	r = d->nrep;
	for (uint32_t b = 0; b < d->nblocks; b++) {
		uint32_t reps[DINDEX_MAX_REP];
		int nr = block_replicas(s, graph, d->run, b, r, reps), found = 0;

		/* Every replica in placement order; those not reachable now keep address 0
		 * (filled in when their memory node comes back, dindex_rejoin). */
		rc = -EHOSTUNREACH;
		for (int j = 0; j < nr; j++) {
			d->block_mn[(size_t)b * r + j] = (uint8_t)reps[j];
			if (!s->link[reps[j]].up)
				continue;
			rc = lookup_block(s, d, b, reps[j], &d->block_addr[(size_t)b * r + j]);
			found += rc == 0;
		}
		for (int j = nr; j < (int)r; j++)
			d->block_mn[(size_t)b * r + j] = DINDEX_NO_MN;
		if (!found) {
			snprintf(err, errlen, "block %u: no replica available (%s)", b, strerror(-rc));
			rc = rc ? rc : -EHOSTUNREACH;
			goto out;
		}
	}
	if (d->cap > d->n) {
		/* the id counter of online inserts (a reader can do without it: inserts then
		 * fail with -EHOSTUNREACH until the view is read again) */
		uint32_t cm;

		block_replicas(s, graph, d->run, DINDEX_CTR_BLOCK, 1, &cm);
		d->ctr_mn = cm;
		o = (struct dm_wire_ctl_obj){ .key = dm_gen_block_key(graph, gen, DINDEX_CTR_BLOCK) };
		if (s->link[cm].up && !obj_call(&s->link[cm], DM_OP_CTL_LOOKUP, &o) &&
		    o.len == 64 && o.addr >= s->link[cm].info.region_addr &&
		    o.addr - s->link[cm].info.region_addr + 64 <= s->link[cm].info.region_len)
			d->ctr_addr = o.addr;
	}
	rc = 0;
	*out = d;
	d = NULL;
out:
	free(meta);
	dindex_free(d);
	return rc;
}
