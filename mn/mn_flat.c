/* mn_flat.c: the memory node's S3 Vectors store and its FL RPC (see mn_flat.h). The MN
 * runs catalog and write operations (the S3 request is validated again here, so a bad or
 * hostile compute node cannot corrupt the store) and hands out index state and fragment
 * contents; the scans themselves run on the compute nodes. Bucket images and the catch-up
 * of a stale replica (FL_IMAGE, FL_CATCHUP) are in mn_catchup.c; every write request runs
 * under mn_flat.wlock (shared) and is logged there for a catch-up of its bucket. */
#include "mn_flat_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "fl_rpc.h"
#include "s3_scope.h"

#define FL_TIMEOUT_MS 10000

/* Rows per fragment from DMANN_FLAT_FRAG_ROWS, the documented test override of [mn]
 * flat_frag_rows (tests use small fragments to exercise the fan-out on small indexes). */
static uint32_t frag_rows_override(uint32_t node_id, uint32_t rows)
{
	const char *fr = getenv("DMANN_FLAT_FRAG_ROWS");
	char *end;
	unsigned long v;

	if (!fr || !*fr)
		return rows;
	errno = 0;
	v = strtoul(fr, &end, 10);
	if (errno || *end || v < 16 || v > (1u << 20)) {
		dm_warn("mn%u: ignoring DMANN_FLAT_FRAG_ROWS=%s (16..1048576)", node_id, fr);
		return rows;
	}
	dm_info("mn%u: DMANN_FLAT_FRAG_ROWS=%lu overrides flat_frag_rows = %u", node_id, v, rows);
	return (uint32_t)v;
}

/* [mn] flat_max_mb in bytes: auto is 3/4 of the machine's physical memory. */
static uint64_t flat_max_bytes(uint64_t mb)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	if (mb != DM_FLAT_MAX_AUTO)
		return mb << 20;
	if (pages <= 0 || psz <= 0)
		return 0;
	return (uint64_t)pages * (uint64_t)psz / 4 * 3;
}

struct mn_flat *mn_flat_open(const char *dir, uint32_t node_id,
			     const struct dm_mn_settings *set)
{
	struct mn_flat *f = calloc(1, sizeof(*f));
	/* lock_wait_ms: this node's previous process, SIGKILLed a moment ago, may hold the
	 * directory's lock until every copy of its descriptor is closed (seen under ASan). */
	struct flat_opts o = { .checkpoint_bytes = 256ull << 20, .frag_rows = 4096,
			       .lock_wait_ms = 5000 };

	if (!f) {
		errno = ENOMEM;
		return NULL;
	}
	f->node_id = node_id;
	pthread_rwlockattr_t rwa;

	pthread_rwlockattr_init(&rwa);
	pthread_rwlockattr_setkind_np(&rwa, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&f->wlock, &rwa);
	pthread_rwlockattr_destroy(&rwa);
	mn_cu_init(&f->cu);
	if (set) {
		o.frag_rows = set->flat_frag_rows;
		o.no_group_commit = !set->wal_group_commit;
	}
	o.max_bytes = flat_max_bytes(set ? set->flat_max_mb : DM_FLAT_MAX_AUTO);
	o.frag_rows = frag_rows_override(node_id, o.frag_rows);
	o.scope = &s3_scope_ops;        /* scoped indexes (s3_scope.h) */
	f->st = flat_open(dir, &o);
	if (!f->st) {
		int e = errno;

		dm_err("mn%u: cannot open the flat store in %s: %s%s", node_id, dir, strerror(e),
		       e == EBADMSG ? " (damaged WAL or snapshot, see above); not starting rather "
				      "than serving a store that lost acknowledged writes" : "");
		errno = e;
		goto err_free_f;
	}
	f->api = s3_api_new(f->st, NULL, NULL);
	if (!f->api) {
		flat_close(f->st);
		errno = ENOMEM;
		goto err_free_f;
	}
	/* The gateways store a bucket's shards s > 0 as buckets "B#s" (s3_api.h); only they
	 * reach this API (FL_CALL from cluster nodes), and they refuse '#' from users. */
	s3_api_shard_names(f->api, true);
	/* Row numbering is valid for one open of the store (a restart compacts rows): the
	 * epoch tells compute-node caches which numbering they hold. */
	if (getrandom(&f->epoch, sizeof(f->epoch), 0) != sizeof(f->epoch))
		f->epoch = dm_now_ns();
	uint64_t used, max;

	flat_store_usage(f->st, &used, &max);
	dm_info("mn%u: flat store %s open (epoch %016llx, %u rows per fragment, group commit %s, "
		"%llu MiB of rows, limit %s%llu MiB)", node_id, dir, (unsigned long long)f->epoch,
		o.frag_rows, o.no_group_commit ? "off" : "on", (unsigned long long)(used >> 20),
		max ? "" : "none, ", (unsigned long long)(max >> 20));
	if (max && used > max)
		dm_warn("mn%u: the flat store holds more than its limit ([mn] flat_max_mb): every "
			"put is refused until rows are freed", node_id);
	return f;

err_free_f:
	mn_cu_fini(&f->cu);
	pthread_rwlock_destroy(&f->wlock);
	free(f);
	return NULL;
}

void mn_flat_close(struct mn_flat *f)
{
	if (!f)
		return;
	s3_api_free(f->api);
	flat_close(f->st);
	mn_cu_fini(&f->cu);
	pthread_rwlock_destroy(&f->wlock);
	free(f);
}

void mn_flat_metrics(struct mn_flat *f, FILE *out)
{
	struct flat_wal_stats ws;

	flat_wal_stats(f->st, &ws);
	fprintf(out, "# HELP dmann_mn_flat_wal_records_total WAL records appended since start.\n"
		     "# TYPE dmann_mn_flat_wal_records_total counter\n"
		     "dmann_mn_flat_wal_records_total{node=\"%u\"} %llu\n"
		     "# HELP dmann_mn_flat_wal_syncs_total fdatasync calls on the WAL since start "
		     "(below records: group commit at work).\n"
		     "# TYPE dmann_mn_flat_wal_syncs_total counter\n"
		     "dmann_mn_flat_wal_syncs_total{node=\"%u\"} %llu\n"
		     "# HELP dmann_mn_flat_wal_bytes Bytes in the WAL (a checkpoint empties it).\n"
		     "# TYPE dmann_mn_flat_wal_bytes gauge\n"
		     "dmann_mn_flat_wal_bytes{node=\"%u\"} %llu\n"
		     "# HELP dmann_mn_flat_wal_failed 1 once a WAL write or sync failed (the store "
		     "refuses writes until restarted).\n"
		     "# TYPE dmann_mn_flat_wal_failed gauge\n"
		     "dmann_mn_flat_wal_failed{node=\"%u\"} %d\n",
		f->node_id, (unsigned long long)ws.records, f->node_id,
		(unsigned long long)ws.syncs, f->node_id, (unsigned long long)ws.bytes, f->node_id,
		ws.error ? 1 : 0);

	uint64_t used, max;

	flat_store_usage(f->st, &used, &max);
	fprintf(out, "# HELP dmann_mn_flat_bytes Bytes of rows the flat store holds (deleted rows "
		     "until a restart compacts them).\n"
		     "# TYPE dmann_mn_flat_bytes gauge\n"
		     "dmann_mn_flat_bytes{node=\"%u\"} %llu\n"
		     "# HELP dmann_mn_flat_max_bytes Its limit ([mn] flat_max_mb; 0: none): puts past "
		     "it get ServiceQuotaExceededException.\n"
		     "# TYPE dmann_mn_flat_max_bytes gauge\n"
		     "dmann_mn_flat_max_bytes{node=\"%u\"} %llu\n",
		f->node_id, (unsigned long long)used, f->node_id, (unsigned long long)max);
	mn_catchup_metrics(f, out);
}

/* FL_CALL: run one S3 operation. */
static int do_call(struct mn_flat *f, struct dm_rbuf *in, struct dm_buf *out)
{
	char op[64];
	uint32_t jlen;
	const char *json;
	struct s3_resp r;

	if (!dm_rbuf_str(in, op, sizeof(op)))
		return -EBADMSG;
	json = dm_rbuf_bytes(in, &jlen, DM_FL_MAX_STREAM);
	if (in->bad || in->at != in->n)
		return -EBADMSG;
	s3_api_handle(f->api, op, json, jlen, &r);
	dm_buf_put(out, (uint8_t[2]){ (uint8_t)r.status, (uint8_t)(r.status >> 8) }, 2);
	dm_buf_str(out, r.errtype ? r.errtype : "");
	dm_buf_bytes(out, r.body ? r.body : "", r.body ? r.len : 0);
	s3_resp_free(&r);
	return 0;
}

/* FL_STATE: index description and per-fragment (rows, dead). */
static int do_state(struct mn_flat *f, struct dm_rbuf *in, struct dm_buf *out)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	const struct flat_index_info *info;
	struct flat_index *ix;
	struct flat_frag_stat *fs = NULL;
	size_t n, cap = 64;

	if (!dm_rbuf_str(in, b, sizeof(b)) || !dm_rbuf_str(in, x, sizeof(x)) || in->at != in->n)
		return -EBADMSG;
	ix = flat_index_get(f->st, b, x);
	if (!ix)
		return -ENOENT;
	for (;;) {
		struct flat_frag_stat *nf = realloc(fs, cap * sizeof(*fs));

		if (!nf) {
			free(fs);
			flat_index_put(ix);
			return -ENOMEM;
		}
		fs = nf;
		n = flat_frag_stats(ix, fs, cap);
		if (n <= cap)
			break;
		cap = n + 16;
	}
	info = flat_index_info(ix);
	dm_buf_u64(out, __atomic_load_n(&f->epoch, __ATOMIC_ACQUIRE));
	dm_buf_u64(out, (uint64_t)info->created_ms);
	dm_buf_u32(out, info->dim);
	dm_buf_u32(out, (uint32_t)info->metric);
	dm_buf_bytes(out, info->conf, info->conf_len);
	dm_buf_u32(out, flat_frag_rows(ix));
	dm_buf_u32(out, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		dm_buf_u32(out, fs[i].rows);
		dm_buf_u32(out, fs[i].dead);
	}
	uint64_t mark, tag;

	flat_mark_get(ix, &mark, &tag);
	dm_buf_u64(out, mark);
	dm_buf_u64(out, tag);
	dm_buf_u64(out, flat_gindex_count(ix));
	/* A scoped index: its fragments' scope labels (an optional trailer, wire.h). */
	if (flat_index_scoped(ix))
		for (size_t i = 0; i < n; i++)
			dm_buf_u64(out, fs[i].scope);
	free(fs);
	flat_index_put(ix);
	return 0;
}

/* The index a request names, if it is still the one created at created_ms (FL_GET,
 * FL_MARK): a reference, or NULL with *rc = -ENOENT / -ESTALE. */
static struct flat_index *index_at(struct mn_flat *f, const char *b, const char *x,
				   int64_t created, int *rc)
{
	struct flat_index *ix = flat_index_get(f->st, b, x);

	*rc = ix ? 0 : -ENOENT;
	if (ix && flat_index_info(ix)->created_ms != created) {
		flat_index_put(ix);
		*rc = -ESTALE;
		return NULL;
	}
	return ix;
}

struct get_out {
	struct dm_buf *w;
	uint32_t dim, found;
};

static int emit_got(void *ctx, const struct flat_row *row)
{
	struct get_out *go = ctx;

	go->found++;
	dm_buf_str(go->w, row->key);
	dm_buf_bytes(go->w, row->meta, row->meta_len);
	dm_buf_bytes(go->w, row->fmeta, row->fmeta_len);
	dm_buf_put(go->w, row->vec, (size_t)go->dim * sizeof(float));
	return go->w->oom ? -1 : 0;
}

/* FL_GET: the current rows of up to DM_FL_GET_MAX keys (the graph path's candidates). */
static int do_get(struct mn_flat *f, struct dm_rbuf *in, struct dm_buf *out)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	struct dm_buf rows = { 0 };
	struct flat_index *ix;
	int64_t created;
	uint32_t n;
	char **keys;
	int rc = 0;

	if (!dm_rbuf_str(in, b, sizeof(b)) || !dm_rbuf_str(in, x, sizeof(x)))
		return -EBADMSG;
	created = (int64_t)dm_rbuf_u64(in);
	n = dm_rbuf_u32(in);
	if (in->bad || n > DM_FL_GET_MAX)
		return -EBADMSG;
	keys = calloc(n ? n : 1, sizeof(*keys));
	if (!keys)
		return -ENOMEM;
	for (uint32_t i = 0; i < n && !rc; i++) {
		uint32_t kl;
		const char *k = dm_rbuf_bytes(in, &kl, FLAT_KEY_MAX);

		if (in->bad || !kl || memchr(k, 0, kl))
			rc = -EBADMSG;
		else if (!(keys[i] = strndup(k, kl)))
			rc = -ENOMEM;
	}
	if (!rc && in->at != in->n)
		rc = -EBADMSG;
	ix = rc ? NULL : index_at(f, b, x, created, &rc);
	if (ix) {
		struct get_out go = { .w = &rows, .dim = flat_index_info(ix)->dim };

		flat_get(ix, (const char *const *)keys, n, emit_got, &go);
		flat_index_put(ix);
		if (rows.oom) {
			rc = -ENOMEM;
		} else {
			dm_buf_u32(out, go.found);
			dm_buf_put(out, rows.p, rows.n);
		}
	}
	for (uint32_t i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	free(rows.p);
	return rc;
}

/* FL_MARK: set the graph mark (dmann load, after it placed the graph). */
static int do_mark(struct mn_flat *f, struct dm_rbuf *in)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	struct flat_index *ix;
	int64_t created;
	uint64_t rows, tag;
	int rc;

	if (!dm_rbuf_str(in, b, sizeof(b)) || !dm_rbuf_str(in, x, sizeof(x)))
		return -EBADMSG;
	created = (int64_t)dm_rbuf_u64(in);
	rows = dm_rbuf_u64(in);
	tag = dm_rbuf_u64(in);
	if (in->bad || in->at != in->n)
		return -EBADMSG;
	ix = index_at(f, b, x, created, &rc);
	if (!ix)
		return rc;
	rc = flat_mark_set(ix, rows, tag);
	flat_index_put(ix);
	if (!rc)
		dm_info("mn%u: %s/%s: graph mark %llu (graph generation %llu)", f->node_id, b, x,
			(unsigned long long)rows, (unsigned long long)tag);
	return rc;
}

/* FL_GINDEX: the online indexer's batch (flat_gindex_add). */
static int do_gindex(struct mn_flat *f, struct dm_rbuf *in, struct dm_buf *out)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	struct flat_gentry *e = NULL;
	char **keys = NULL;
	struct flat_index *ix;
	int64_t created;
	uint64_t tag, mark = 0;
	uint32_t n;
	int rc = 0;

	if (!dm_rbuf_str(in, b, sizeof(b)) || !dm_rbuf_str(in, x, sizeof(x)))
		return -EBADMSG;
	created = (int64_t)dm_rbuf_u64(in);
	tag = dm_rbuf_u64(in);
	n = dm_rbuf_u32(in);
	if (in->bad || n > DM_FL_GINDEX_MAX || n > (in->n - in->at) / 17)
		return -EBADMSG;
	e = calloc(n ? n : 1, sizeof(*e));
	keys = calloc(n ? n : 1, sizeof(*keys));
	if (!e || !keys) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n && !rc; i++) {
		uint32_t kl;
		const char *k;

		e[i].id = dm_rbuf_u64(in);
		k = dm_rbuf_bytes(in, &kl, FLAT_KEY_MAX);
		e[i].vcrc = dm_rbuf_u32(in);
		if (in->bad || !kl || memchr(k, 0, kl))
			rc = -EBADMSG;
		else if (!(keys[i] = strndup(k, kl)))
			rc = -ENOMEM;
		e[i].key = keys[i];
	}
	if (!rc && in->at != in->n)
		rc = -EBADMSG;
	ix = rc ? NULL : index_at(f, b, x, created, &rc);
	if (ix) {
		rc = flat_gindex_add(ix, tag, e, n, &mark);
		flat_index_put(ix);
		if (!rc)
			dm_buf_u64(out, mark);
	}
out:
	for (uint32_t i = 0; keys && i < n; i++)
		free(keys[i]);
	free(keys);
	free(e);
	return rc;
}

struct gkeys_out {
	struct dm_buf *w;
	uint32_t n;
};

static int emit_gkey(void *ctx, uint64_t id, const char *key)
{
	struct gkeys_out *go = ctx;

	dm_buf_u64(go->w, id);
	dm_buf_str(go->w, key);
	go->n++;
	return go->w->oom ? 1 : 0;
}

/* FL_GKEYS: a piece of the key log (the gateways' node id -> key map). */
static int do_gkeys(struct mn_flat *f, struct dm_rbuf *in, struct dm_buf *out)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	struct dm_buf w = { 0 };
	struct flat_index *ix;
	int64_t created;
	uint64_t tag, from, mark, cur, total;
	uint32_t max;
	int rc;

	if (!dm_rbuf_str(in, b, sizeof(b)) || !dm_rbuf_str(in, x, sizeof(x)))
		return -EBADMSG;
	created = (int64_t)dm_rbuf_u64(in);
	tag = dm_rbuf_u64(in);
	from = dm_rbuf_u64(in);
	max = dm_rbuf_u32(in);
	if (in->bad || in->at != in->n || max > DM_FL_GKEYS_MAX)
		return -EBADMSG;
	ix = index_at(f, b, x, created, &rc);
	if (!ix)
		return rc;
	flat_mark_get(ix, &mark, &cur);
	if (!cur || cur != tag) {
		flat_index_put(ix);
		return -ESTALE;
	}
	struct gkeys_out go = { .w = &w };

	total = flat_gindex_read(ix, from, max, emit_gkey, &go);
	flat_index_put(ix);
	if (w.oom) {
		free(w.p);
		return -ENOMEM;
	}
	dm_buf_u64(out, total);
	dm_buf_u32(out, go.n);
	dm_buf_put(out, w.p, w.n);
	free(w.p);
	return 0;
}

struct frag_out {
	struct dm_buf *w;
	uint32_t dim;
	uint32_t rows;                  /* rows emitted */
	size_t max_bytes;               /* row bytes per answer */
	bool stopped;                   /* at max_bytes: the answer ends early */
};

static int emit_row(void *ctx, const struct flat_row *row)
{
	struct frag_out *fo = ctx;

	/* A bounded answer (FL_FRAG max_bytes): stop before the row that would pass it; the
	 * requester asks again from the next row. At least one row per answer. */
	if (fo->rows && fo->w->n + (size_t)fo->dim * sizeof(float) + row->meta_len +
	    row->fmeta_len + strlen(row->key) + 12 > fo->max_bytes) {
		fo->stopped = true;
		return 1;
	}
	fo->rows++;
	dm_buf_str(fo->w, row->key);
	dm_buf_bytes(fo->w, row->meta, row->meta_len);
	dm_buf_bytes(fo->w, row->fmeta, row->fmeta_len);
	/* f32 on the wire are little-endian, as on every host we run (see wire.h). */
	dm_buf_put(fo->w, row->vec, (size_t)fo->dim * sizeof(float));
	return fo->w->oom ? 1 : 0;
}

/* FL_FRAG: tombstones and rows from `from` of one fragment, at most max_bytes of rows per
 * answer (see wire.h). */
static int do_frag(struct mn_flat *f, struct dm_rbuf *in, struct dm_buf *out,
		   uint32_t *resp_msg)
{
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	struct dm_buf rows = { 0 };
	struct flat_index *ix;
	uint64_t epoch, frag;
	int64_t created;
	uint32_t from, fr, max_bytes;
	uint8_t *dead;
	int n;

	if (!dm_rbuf_str(in, b, sizeof(b)) || !dm_rbuf_str(in, x, sizeof(x)))
		return -EBADMSG;
	epoch = dm_rbuf_u64(in);
	created = (int64_t)dm_rbuf_u64(in);
	frag = dm_rbuf_u64(in);
	from = dm_rbuf_u32(in);
	*resp_msg = dm_rbuf_u32(in);
	max_bytes = in->at + 4 <= in->n ? dm_rbuf_u32(in) : DM_FL_FRAG_MAX_BYTES;
	if (in->bad || in->at != in->n)
		return -EBADMSG;
	if (epoch != __atomic_load_n(&f->epoch, __ATOMIC_ACQUIRE))
		return -ESTALE;
	ix = flat_index_get(f->st, b, x);
	if (!ix)
		return -ENOENT;
	if (flat_index_info(ix)->created_ms != created) {
		flat_index_put(ix);
		return -ESTALE;
	}
	fr = flat_frag_rows(ix);
	dead = malloc(fr);
	if (!dead) {
		flat_index_put(ix);
		return -ENOMEM;
	}
	struct frag_out fo = { .w = &rows, .dim = flat_index_info(ix)->dim,
			       .max_bytes = DM_MIN(DM_MAX(max_bytes, 1u), DM_FL_FRAG_MAX_BYTES) };

	n = flat_frag_read(ix, frag, from, dead, fr, emit_row, &fo);
	flat_index_put(ix);
	if (n >= 0 && fo.stopped)
		n = (int)(from + fo.rows);      /* a piece: rows [from, from + fo.rows) */
	if (n >= 0 && (uint32_t)n < from)
		n = -EINVAL;
	if (n >= 0 && rows.oom)
		n = -ENOMEM;
	if (n >= 0) {
		dm_buf_u32(out, (uint32_t)n);
		dm_buf_put(out, dead, (size_t)n);
		dm_buf_put(out, rows.p, rows.n);
	}
	free(dead);
	free(rows.p);
	return n < 0 ? n : 0;
}

bool mn_flat_is_write(uint16_t op, const uint8_t *req, size_t len)
{
	struct dm_rbuf in = { .p = req, .n = len };
	char name[64];

	if (op == DM_OP_FL_MARK || op == DM_OP_FL_GINDEX)
		return true;
	return op == DM_OP_FL_CALL && dm_rbuf_str(&in, name, sizeof(name)) &&
	       s3_api_is_write(name);
}

int mn_flat_handle(struct mn_flat *f, uint16_t op, const uint8_t *req, size_t len,
		   struct dm_buf *out, uint32_t *resp_msg)
{
	bool w;
	int rc;

	if (op == DM_OP_FL_IMAGE)
		return mn_image_handle(f, req, len, out);
	if (op == DM_OP_FL_CATCHUP)
		return mn_catchup_handle(f, req, len, out);
	w = mn_flat_is_write(op, req, len);
	if (w)
		pthread_rwlock_rdlock(&f->wlock);
	rc = mn_flat_run(f, op, req, len, out, resp_msg);
	if (w) {
		mn_catchup_note(f, op, req, len);
		pthread_rwlock_unlock(&f->wlock);
	}
	return rc;
}

int mn_flat_run(struct mn_flat *f, uint16_t op, const uint8_t *req, size_t len,
		struct dm_buf *out, uint32_t *resp_msg)
{
	struct dm_rbuf in = { .p = req, .n = len };

	switch (op) {
	case DM_OP_FL_CALL: return do_call(f, &in, out);
	case DM_OP_FL_STATE: return do_state(f, &in, out);
	case DM_OP_FL_FRAG: return do_frag(f, &in, out, resp_msg);
	case DM_OP_FL_GET: return do_get(f, &in, out);
	case DM_OP_FL_MARK: return do_mark(f, &in);
	case DM_OP_FL_GINDEX: return do_gindex(f, &in, out);
	case DM_OP_FL_GKEYS: return do_gkeys(f, &in, out);
	default: return -EPROTO;
	}
}

int mn_flat_serve(struct mn_flat *f, struct dm_rpc_chan *ch, const struct dm_wire_hdr *h,
		  const uint8_t *buf, uint32_t len, uint64_t wr_id)
{
	struct dm_buf out = { 0 };
	uint32_t resp_msg = DM_FL_MIN_MSG;
	uint8_t *req;
	size_t rlen;
	int rc, st;

	rc = dm_wire_fl_check(h, buf, len);
	if (rc || (h->op & 1)) {
		dm_msgpool_repost(ch->pool, wr_id);
		return rc ? rc : -EPROTO;
	}
	rc = dm_fl_recv_rest(ch, h, buf, len, wr_id, FL_TIMEOUT_MS, &req, &rlen);
	if (rc)
		return rc;
	if (h->op == DM_OP_FL_INFO) {
		st = rlen ? -EBADMSG : 0;
		dm_buf_u32(&out, ch->pool->size);
	} else {
		st = mn_flat_handle(f, h->op, req, rlen, &out, &resp_msg);
	}
	free(req);
	if (!st && out.oom)
		st = -ENOMEM;
	resp_msg = DM_MAX(DM_MIN(resp_msg, DM_FL_MAX_MSG), DM_FL_MIN_MSG);
	if (!st && out.n > 16 * ch->ssize && resp_msg > ch->ssize) {
		/* A large answer (a fragment) to a requester with large buffers: send it through
		 * a channel with a send buffer that large (same connection), not in ssize steps. */
		struct dm_rpc_chan big;

		if (dm_rpc_chan_init(&big, ch->c, ch->pool, resp_msg, FL_TIMEOUT_MS) == 0) {
			rc = dm_fl_send(&big, h->op + 1, h->req_id, 0, out.p, out.n, resp_msg);
			dm_rpc_chan_fini(&big);
			free(out.p);
			return rc;
		}
	}
	rc = dm_fl_send(ch, h->op + 1, h->req_id, st, st ? NULL : out.p, st ? 0 : out.n,
			resp_msg);
	free(out.p);
	return rc;
}
