/* flat.c: the flat-index storage engine (see flat.h): catalog, fragments + tail, key map,
 * tombstones, WAL append/fsync, snapshot + WAL recovery, exact scans. */
#include "flat.h"
#include "util/dm_hash.h"
#include "flat_wal.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define SNAP_MAGIC "DMFLSNP1"
#define SNAP_BATCH 256

/* One fragment: columns of up to cap rows. Sealed (n == cap) fragments never change; the
 * tombstone flags (dead) are the index's tombstone table, kept beside the columns. */
struct flat_frag {
	uint32_t n, cap;
	float *vec;            /* cap x dim, 64-byte aligned */
	float *norm2;          /* squared norms (sgemm, cosine) */
	uint64_t *khash;       /* flat_key_hash of each key */
	char **key;
	uint8_t **meta;        /* meta bytes then fmeta bytes, one allocation per row */
	uint32_t *meta_len, *fmeta_len;
	uint8_t *dead;
};

/* Open-addressing key -> row id map (linear probing, backward-shift deletion). */
struct keymap {
	struct km_slot { uint64_t hash, id; } *slot;   /* id UINT64_MAX = empty */
	size_t cap, n;
};

struct flat_index {
	struct flat_store *s;
	struct flat_index_info info;
	void *conf;
	int refs;
	bool deleted;                  /* under wmu */
	pthread_mutex_t wmu;           /* serialises writers: WAL order == apply order */
	pthread_rwlock_t rw;           /* readers vs applying writers */
	uint32_t frag_rows;
	struct flat_frag **frags;
	size_t nfrags, capfrags;
	uint64_t next_id, live;
	struct keymap map;
};

struct flat_store {
	char *dir;
	int lockfd, walfd;
	struct flat_opts o;
	pthread_rwlock_t cat;          /* catalog; order: cat -> index wmu -> walmu */
	pthread_mutex_t walmu;
	pthread_mutex_t ckmu;          /* one checkpoint at a time */
	struct flat_bucket_info *buckets;
	size_t nb, capb;
	struct flat_index **ix;
	size_t nix, capix;
	uint64_t lsn, wal_bytes;       /* under walmu */
};

/* ---------------------------------------------------------------- key map ---------- */

uint64_t flat_key_hash(const char *key, size_t len)
{
	/* FNV-1a then a murmur finaliser: stable across builds and restarts. */
	uint64_t h = dm_fnv1a64(DM_FNV64_INIT, key, len);

	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

static inline struct flat_frag *frag_of(const struct flat_index *ix, uint64_t id, uint32_t *r)
{
	*r = (uint32_t)(id % ix->frag_rows);
	return ix->frags[id / ix->frag_rows];
}

static const char *key_of(const struct flat_index *ix, uint64_t id)
{
	uint32_t r;
	struct flat_frag *f = frag_of(ix, id, &r);

	return f->key[r];
}

/* Grow the map to twice its size (or 1024 slots). */
static int km_grow(struct keymap *m)
{
	size_t ncap = m->cap ? m->cap * 2 : 1024;
	struct km_slot *ns = malloc(ncap * sizeof(*ns));

	if (!ns)
		return -ENOMEM;
	for (size_t i = 0; i < ncap; i++)
		ns[i].id = UINT64_MAX;
	for (size_t i = 0; i < m->cap; i++) {
		if (m->slot[i].id == UINT64_MAX)
			continue;
		size_t j = m->slot[i].hash & (ncap - 1);

		while (ns[j].id != UINT64_MAX)
			j = (j + 1) & (ncap - 1);
		ns[j] = m->slot[i];
	}
	free(m->slot);
	m->slot = ns;
	m->cap = ncap;
	return 0;
}

/* Slot of key, or the empty slot where it would go. */
static size_t km_find(const struct flat_index *ix, uint64_t h, const char *key)
{
	const struct keymap *m = &ix->map;
	size_t j = h & (m->cap - 1);

	while (m->slot[j].id != UINT64_MAX) {
		if (m->slot[j].hash == h && !strcmp(key_of(ix, m->slot[j].id), key))
			return j;
		j = (j + 1) & (m->cap - 1);
	}
	return j;
}

static uint64_t km_get(const struct flat_index *ix, const char *key)
{
	if (!ix->map.cap)
		return UINT64_MAX;
	return ix->map.slot[km_find(ix, flat_key_hash(key, strlen(key)), key)].id;
}

static void km_del_slot(struct keymap *m, size_t j)
{
	size_t i = j;

	m->slot[j].id = UINT64_MAX;
	m->n--;
	for (;;) {
		i = (i + 1) & (m->cap - 1);
		if (m->slot[i].id == UINT64_MAX)
			return;
		size_t home = m->slot[i].hash & (m->cap - 1);
		/* Move slot i back to j unless its home lies cyclically in (j, i]. */
		bool stay = (j <= i) ? (home > j && home <= i) : (home > j || home <= i);

		if (!stay) {
			m->slot[j] = m->slot[i];
			m->slot[i].id = UINT64_MAX;
			j = i;
		}
	}
}

/* ---------------------------------------------------------------- rows ------------- */

static void frag_free(struct flat_frag *f)
{
	if (!f)
		return;
	for (uint32_t r = 0; r < f->n; r++) {
		free(f->key[r]);
		free(f->meta[r]);
	}
	free(f->vec);
	free(f->norm2);
	free(f->khash);
	free(f->key);
	free(f->meta);
	free(f->meta_len);
	free(f->fmeta_len);
	free(f->dead);
	free(f);
}

static struct flat_frag *frag_new(uint32_t cap, uint32_t dim)
{
	struct flat_frag *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->cap = cap;
	f->vec = aligned_alloc(64, DM_ALIGN_UP((size_t)cap * dim * sizeof(float), 64));
	f->norm2 = malloc(cap * sizeof(float));
	f->khash = malloc(cap * sizeof(uint64_t));
	f->key = calloc(cap, sizeof(char *));
	f->meta = calloc(cap, sizeof(uint8_t *));
	f->meta_len = calloc(cap, sizeof(uint32_t));
	f->fmeta_len = calloc(cap, sizeof(uint32_t));
	f->dead = calloc(cap, 1);
	if (!f->vec || !f->norm2 || !f->khash || !f->key || !f->meta || !f->meta_len ||
	    !f->fmeta_len || !f->dead) {
		frag_free(f);
		return NULL;
	}
	return f;
}

/* Tombstone row id (if live) and drop it from the key map. */
static void row_kill(struct flat_index *ix, uint64_t id)
{
	uint32_t r;
	struct flat_frag *f = frag_of(ix, id, &r);

	if (f->dead[r])
		return;
	f->dead[r] = 1;
	ix->live--;
	km_del_slot(&ix->map, km_find(ix, f->khash[r], f->key[r]));
}

/* Append one row in memory (no logging): tombstone any previous row of the key. */
static int row_append(struct flat_index *ix, const char *key, const float *vec,
		      const void *meta, uint32_t mlen, const void *fmeta, uint32_t flen)
{
	uint32_t dim = ix->info.dim, r;
	uint64_t h = flat_key_hash(key, strlen(key)), id = ix->next_id;
	struct flat_frag *f;
	char *k;
	uint8_t *m;

	if ((ix->map.n + 1) * 4 > ix->map.cap * 3 && km_grow(&ix->map))
		return -ENOMEM;
	if (id / ix->frag_rows == ix->nfrags) {
		if (ix->nfrags == ix->capfrags) {
			size_t nc = ix->capfrags ? ix->capfrags * 2 : 16;
			struct flat_frag **nf = realloc(ix->frags, nc * sizeof(*nf));

			if (!nf)
				return -ENOMEM;
			ix->frags = nf;
			ix->capfrags = nc;
		}
		f = frag_new(ix->frag_rows, dim);
		if (!f)
			return -ENOMEM;
		ix->frags[ix->nfrags++] = f;
	}
	k = strdup(key);
	m = malloc((size_t)mlen + flen + 1);
	if (!k || !m) {
		free(k);
		free(m);
		return -ENOMEM;
	}
	if (mlen)
		memcpy(m, meta, mlen);
	if (flen)
		memcpy(m + mlen, fmeta, flen);

	size_t j = km_find(ix, h, key);

	if (ix->map.slot[j].id != UINT64_MAX) {
		row_kill(ix, ix->map.slot[j].id);
		j = km_find(ix, h, key);
	}
	f = frag_of(ix, id, &r);
	memcpy(f->vec + (size_t)r * dim, vec, dim * sizeof(float));
	f->norm2[r] = dm_dot(vec, vec, dim);
	f->khash[r] = h;
	f->key[r] = k;
	f->meta[r] = m;
	f->meta_len[r] = mlen;
	f->fmeta_len[r] = flen;
	f->dead[r] = 0;
	f->n = r + 1;
	ix->map.slot[j].hash = h;
	ix->map.slot[j].id = id;
	ix->map.n++;
	ix->next_id++;
	ix->live++;
	return 0;
}

static void fill_row(const struct flat_index *ix, uint64_t id, struct flat_row *row)
{
	uint32_t r;
	struct flat_frag *f = frag_of(ix, id, &r);

	row->id = id;
	row->key = f->key[r];
	row->vec = f->vec + (size_t)r * ix->info.dim;
	row->meta = f->meta[r];
	row->meta_len = f->meta_len[r];
	row->fmeta = f->meta[r] + f->meta_len[r];
	row->fmeta_len = f->fmeta_len[r];
}

static bool row_dead(const struct flat_index *ix, uint64_t id)
{
	uint32_t r;
	struct flat_frag *f = frag_of(ix, id, &r);

	return f->dead[r];
}

/* ---------------------------------------------------------------- catalog ---------- */

static struct flat_index *index_new(struct flat_store *s, const char *bucket, const char *name,
				    uint32_t dim, enum dm_metric metric, const void *conf,
				    uint32_t conf_len, int64_t created)
{
	struct flat_index *ix = calloc(1, sizeof(*ix));

	if (!ix)
		return NULL;
	ix->s = s;
	snprintf(ix->info.bucket, sizeof(ix->info.bucket), "%s", bucket);
	snprintf(ix->info.name, sizeof(ix->info.name), "%s", name);
	ix->info.dim = dim;
	ix->info.metric = metric;
	ix->info.created_ms = created;
	ix->conf = malloc(conf_len + 1);
	if (!ix->conf) {
		free(ix);
		errno = ENOMEM;
		return NULL;
	}
	if (conf_len)
		memcpy(ix->conf, conf, conf_len);
	((char *)ix->conf)[conf_len] = 0;
	ix->info.conf = ix->conf;
	ix->info.conf_len = conf_len;
	ix->refs = 1;
	ix->frag_rows = s->o.frag_rows;
	pthread_mutex_init(&ix->wmu, NULL);
	pthread_rwlock_init(&ix->rw, NULL);
	return ix;
}

static void index_free(struct flat_index *ix)
{
	for (size_t i = 0; i < ix->nfrags; i++)
		frag_free(ix->frags[i]);
	free(ix->frags);
	free(ix->map.slot);
	free(ix->conf);
	pthread_mutex_destroy(&ix->wmu);
	pthread_rwlock_destroy(&ix->rw);
	free(ix);
}

void flat_index_put(struct flat_index *ix)
{
	if (ix && __atomic_sub_fetch(&ix->refs, 1, __ATOMIC_ACQ_REL) == 0)
		index_free(ix);
}

static ssize_t bucket_find(struct flat_store *s, const char *name)
{
	for (size_t i = 0; i < s->nb; i++)
		if (!strcmp(s->buckets[i].name, name))
			return (ssize_t)i;
	return -1;
}

static ssize_t index_find(struct flat_store *s, const char *bucket, const char *name)
{
	for (size_t i = 0; i < s->nix; i++)
		if (!strcmp(s->ix[i]->info.bucket, bucket) && !strcmp(s->ix[i]->info.name, name))
			return (ssize_t)i;
	return -1;
}

static bool name_ok(const char *n)
{
	size_t l = n ? strlen(n) : 0;

	return l >= 1 && l <= FLAT_NAME_MAX;
}

/* ---------------------------------------------------------------- apply ------------ */

/* Apply one record to memory (recovery and the live path share it). Catalog records need
 * the cat lock held for writing; PUT/DEL need the index's rw lock (recovery is single
 * threaded). */
static int apply_put(struct flat_index *ix, struct flat_rd *rd)
{
	uint32_t n = flat_rd_u32(rd), dim = ix->info.dim;
	char *key = malloc(FLAT_KEY_MAX + 1);
	int rc = 0;

	if (!key)
		return -ENOMEM;
	for (uint32_t i = 0; i < n && !rd->bad; i++) {
		uint32_t mlen, flen;
		const float *vec;
		const void *meta, *fmeta;
		float tmp[64];
		float *v;

		flat_rd_str(rd, key, FLAT_KEY_MAX);
		vec = flat_rd_raw(rd, (size_t)dim * 4);
		meta = flat_rd_blob(rd, &mlen);
		fmeta = flat_rd_blob(rd, &flen);
		if (rd->bad || !key[0])
			break;
		/* The payload is unaligned: copy the vector out. */
		v = dim <= 64 ? tmp : malloc((size_t)dim * 4);
		if (!v) {
			rc = -ENOMEM;
			break;
		}
		memcpy(v, vec, (size_t)dim * 4);
		rc = row_append(ix, key, v, meta, mlen, fmeta, flen);
		if (v != tmp)
			free(v);
		if (rc)
			break;
	}
	free(key);
	if (!rc && rd->bad)
		rc = -EBADMSG;
	return rc;
}

static int apply_del(struct flat_index *ix, struct flat_rd *rd)
{
	uint32_t n = flat_rd_u32(rd);
	char *key = malloc(FLAT_KEY_MAX + 1);

	if (!key)
		return -ENOMEM;
	for (uint32_t i = 0; i < n && !rd->bad; i++) {
		uint64_t id;

		flat_rd_str(rd, key, FLAT_KEY_MAX);
		if (rd->bad)
			break;
		id = km_get(ix, key);
		if (id != UINT64_MAX)
			row_kill(ix, id);
	}
	free(key);
	return rd->bad ? -EBADMSG : 0;
}

static int cat_add_index(struct flat_store *s, struct flat_index *ix)
{
	if (s->nix == s->capix) {
		size_t nc = s->capix ? s->capix * 2 : 16;
		struct flat_index **n = realloc(s->ix, nc * sizeof(*n));

		if (!n)
			return -ENOMEM;
		s->ix = n;
		s->capix = nc;
	}
	s->ix[s->nix++] = ix;
	return 0;
}

static int cat_add_bucket(struct flat_store *s, const char *name, int64_t created)
{
	if (s->nb == s->capb) {
		size_t nc = s->capb ? s->capb * 2 : 16;
		struct flat_bucket_info *n = realloc(s->buckets, nc * sizeof(*n));

		if (!n)
			return -ENOMEM;
		s->buckets = n;
		s->capb = nc;
	}
	snprintf(s->buckets[s->nb].name, sizeof(s->buckets[0].name), "%s", name);
	s->buckets[s->nb].created_ms = created;
	s->nb++;
	return 0;
}

/* Remove index i from the catalog and drop the catalog's reference. */
static void cat_drop_index(struct flat_store *s, size_t i)
{
	struct flat_index *ix = s->ix[i];

	s->ix[i] = s->ix[--s->nix];
	flat_index_put(ix);
}

/* Replay one record (recovery, single-threaded). */
static int apply_record(struct flat_store *s, uint32_t type, const uint8_t *p, uint32_t n)
{
	struct flat_rd rd = { .p = p, .n = n };
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	ssize_t i;
	int rc;

	switch (type) {
	case FLAT_REC_BUCKET_CREATE: {
		int64_t created;

		flat_rd_str(&rd, b, FLAT_NAME_MAX);
		created = (int64_t)flat_rd_u64(&rd);
		if (rd.bad || !b[0] || bucket_find(s, b) >= 0)
			return -EBADMSG;
		return cat_add_bucket(s, b, created);
	}
	case FLAT_REC_BUCKET_DELETE:
		flat_rd_str(&rd, b, FLAT_NAME_MAX);
		i = rd.bad ? -1 : bucket_find(s, b);
		if (i < 0)
			return -EBADMSG;
		s->buckets[i] = s->buckets[--s->nb];
		return 0;
	case FLAT_REC_INDEX_CREATE: {
		uint32_t dim, metric, clen;
		int64_t created;
		const void *conf;
		struct flat_index *ix;

		flat_rd_str(&rd, b, FLAT_NAME_MAX);
		flat_rd_str(&rd, x, FLAT_NAME_MAX);
		dim = flat_rd_u32(&rd);
		metric = flat_rd_u32(&rd);
		created = (int64_t)flat_rd_u64(&rd);
		conf = flat_rd_blob(&rd, &clen);
		if (rd.bad || !b[0] || !x[0] || dim < 1 || dim > FLAT_DIM_MAX || metric > 2 ||
		    bucket_find(s, b) < 0 || index_find(s, b, x) >= 0)
			return -EBADMSG;
		ix = index_new(s, b, x, dim, (enum dm_metric)metric, conf, clen, created);
		if (!ix)
			return -ENOMEM;
		rc = cat_add_index(s, ix);
		if (rc)
			index_free(ix);
		return rc;
	}
	case FLAT_REC_INDEX_DELETE:
		flat_rd_str(&rd, b, FLAT_NAME_MAX);
		flat_rd_str(&rd, x, FLAT_NAME_MAX);
		i = rd.bad ? -1 : index_find(s, b, x);
		if (i < 0)
			return -EBADMSG;
		s->ix[i]->deleted = true;
		cat_drop_index(s, (size_t)i);
		return 0;
	case FLAT_REC_PUT:
	case FLAT_REC_DEL:
		flat_rd_str(&rd, b, FLAT_NAME_MAX);
		flat_rd_str(&rd, x, FLAT_NAME_MAX);
		i = rd.bad ? -1 : index_find(s, b, x);
		if (i < 0)
			return -EBADMSG;
		rc = type == FLAT_REC_PUT ? apply_put(s->ix[i], &rd) : apply_del(s->ix[i], &rd);
		if (!rc && rd.off != rd.n)
			rc = -EBADMSG;
		return rc;
	default:
		return -EBADMSG;
	}
}

/* ---------------------------------------------------------------- files ------------ */

static int write_all(int fd, const void *p, size_t n, off_t off)
{
	const uint8_t *b = p;

	while (n) {
		ssize_t w = pwrite(fd, b, n, off);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		b += w;
		n -= (size_t)w;
		off += w;
	}
	return 0;
}

/* Read a whole file into a malloc'ed buffer; -ENOENT if missing. */
static int read_file(const char *path, uint8_t **out, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;
	struct stat st;
	uint8_t *b;
	size_t off = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		rc = -errno;
		goto err_close_fd;
	}
	b = malloc((size_t)st.st_size + 1);
	if (!b) {
		rc = -ENOMEM;
		goto err_close_fd;
	}
	while (off < (size_t)st.st_size) {
		ssize_t r = read(fd, b + off, (size_t)st.st_size - off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = r < 0 ? -errno : -EIO;
			free(b);
			goto err_close_fd;
		}
		off += (size_t)r;
	}
	*out = b;
	*len = off;
err_close_fd:
	close(fd);
	return rc;
}

static int fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd))
		rc = -errno;
	close(fd);
	return rc;
}

static char *path_join(const char *dir, const char *name)
{
	char *p;

	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return NULL;
	return p;
}

/* Append a framed record (b starts with FLAT_REC_HDR reserved bytes) and make it durable. */
static int wal_append(struct flat_store *s, struct flat_buf *b, uint32_t type)
{
	int rc;

	if (b->oom)
		return -ENOMEM;
	if (b->n - FLAT_REC_HDR > FLAT_REC_MAX)
		return -E2BIG;
	pthread_mutex_lock(&s->walmu);
	flat_buf_frame(b, s->lsn + 1, type);
	rc = write_all(s->walfd, b->p, b->n, (off_t)s->wal_bytes);
	if (!rc && !s->o.no_sync && fdatasync(s->walfd))
		rc = -errno;
	if (rc) {
		/* Cut a partial record so that later appends stay parseable. */
		if (ftruncate(s->walfd, (off_t)s->wal_bytes))
			dm_err("flat: WAL truncate after failed append: %s", strerror(errno));
		dm_err("flat: WAL append failed: %s", strerror(-rc));
	} else {
		s->lsn++;
		s->wal_bytes += b->n;
	}
	pthread_mutex_unlock(&s->walmu);
	return rc;
}

static void rec_begin(struct flat_buf *b)
{
	uint8_t z[FLAT_REC_HDR] = { 0 };

	flat_buf_reset(b);
	flat_buf_put(b, z, sizeof(z));
}

/* Encode rows [from, to) of a PUT for ix into b (after rec_begin). */
static void enc_put_rows(struct flat_buf *b, const struct flat_index *ix,
			 const struct flat_row_in *rows, size_t n)
{
	flat_buf_str(b, ix->info.bucket);
	flat_buf_str(b, ix->info.name);
	flat_buf_u32(b, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		flat_buf_str(b, rows[i].key);
		flat_buf_put(b, rows[i].vec, (size_t)ix->info.dim * 4);
		flat_buf_blob(b, rows[i].meta, rows[i].meta_len);
		flat_buf_blob(b, rows[i].fmeta, rows[i].fmeta_len);
	}
}

/* Snapshot writer: accumulates framed records and writes them in large chunks. */
struct snapw {
	int fd;
	off_t off;
	struct flat_buf out, rec;
	uint64_t nrec;
	int rc;
};

static void snap_emit(struct snapw *w, uint32_t type)
{
	if (w->rc)
		return;
	if (w->rec.oom) {
		w->rc = -ENOMEM;
		return;
	}
	flat_buf_frame(&w->rec, 0, type);
	flat_buf_put(&w->out, w->rec.p, w->rec.n);
	w->nrec++;
	if (w->out.oom)
		w->rc = -ENOMEM;
	else if (w->out.n >= (4u << 20)) {
		w->rc = write_all(w->fd, w->out.p, w->out.n, w->off);
		w->off += (off_t)w->out.n;
		flat_buf_reset(&w->out);
	}
}

/* Write the whole store as records into fd (cat write lock and every wmu held). */
static int snap_write(struct flat_store *s, int fd, uint64_t lsn)
{
	struct snapw w = { .fd = fd };

	flat_buf_put(&w.out, SNAP_MAGIC, 8);
	flat_buf_u64(&w.out, lsn);
	for (size_t i = 0; i < s->nb; i++) {
		rec_begin(&w.rec);
		flat_buf_str(&w.rec, s->buckets[i].name);
		flat_buf_u64(&w.rec, (uint64_t)s->buckets[i].created_ms);
		snap_emit(&w, FLAT_REC_BUCKET_CREATE);
	}
	for (size_t i = 0; i < s->nix; i++) {
		struct flat_index *ix = s->ix[i];
		struct flat_row_in rows[SNAP_BATCH];
		size_t nr = 0;

		rec_begin(&w.rec);
		flat_buf_str(&w.rec, ix->info.bucket);
		flat_buf_str(&w.rec, ix->info.name);
		flat_buf_u32(&w.rec, ix->info.dim);
		flat_buf_u32(&w.rec, (uint32_t)ix->info.metric);
		flat_buf_u64(&w.rec, (uint64_t)ix->info.created_ms);
		flat_buf_blob(&w.rec, ix->conf, ix->info.conf_len);
		snap_emit(&w, FLAT_REC_INDEX_CREATE);
		for (uint64_t id = 0; id <= ix->next_id && !w.rc; id++) {
			if (id < ix->next_id && !row_dead(ix, id)) {
				struct flat_row r;

				fill_row(ix, id, &r);
				rows[nr++] = (struct flat_row_in){ r.key, r.vec, r.meta, r.meta_len,
								   r.fmeta, r.fmeta_len };
			}
			if (nr == SNAP_BATCH || (id == ix->next_id && nr)) {
				rec_begin(&w.rec);
				enc_put_rows(&w.rec, ix, rows, nr);
				snap_emit(&w, FLAT_REC_PUT);
				nr = 0;
			}
		}
	}
	rec_begin(&w.rec);
	flat_buf_u64(&w.rec, w.nrec);
	snap_emit(&w, FLAT_REC_SNAP_END);
	if (!w.rc && w.out.n)
		w.rc = write_all(fd, w.out.p, w.out.n, w.off);
	flat_buf_free(&w.out);
	flat_buf_free(&w.rec);
	return w.rc;
}

int flat_checkpoint(struct flat_store *s)
{
	char *tmp = path_join(s->dir, "snapshot.tmp"), *fin = path_join(s->dir, "snapshot");
	int fd, rc;
	uint64_t lsn;

	if (!tmp || !fin) {
		rc = -ENOMEM;
		goto err_free_paths;
	}
	pthread_mutex_lock(&s->ckmu);
	pthread_rwlock_wrlock(&s->cat);
	for (size_t i = 0; i < s->nix; i++)
		pthread_mutex_lock(&s->ix[i]->wmu);
	pthread_mutex_lock(&s->walmu);
	lsn = s->lsn;
	pthread_mutex_unlock(&s->walmu);

	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto err_unlock;
	}
	rc = snap_write(s, fd, lsn);
	if (!rc && !s->o.no_sync && fsync(fd))
		rc = -errno;
	close(fd);
	if (!rc && rename(tmp, fin))
		rc = -errno;
	if (!rc && !s->o.no_sync)
		rc = fsync_dir(s->dir);
	if (rc) {
		unlink(tmp);
		goto err_unlock;
	}
	/* The snapshot covers every record up to lsn: the WAL can start over. A crash before
	 * the truncate is harmless (replay skips lsn <= the snapshot's). */
	pthread_mutex_lock(&s->walmu);
	if (ftruncate(s->walfd, 0) || (!s->o.no_sync && fdatasync(s->walfd)))
		rc = -errno;
	else
		s->wal_bytes = 0;
	pthread_mutex_unlock(&s->walmu);
err_unlock:
	for (size_t i = 0; i < s->nix; i++)
		pthread_mutex_unlock(&s->ix[i]->wmu);
	pthread_rwlock_unlock(&s->cat);
	pthread_mutex_unlock(&s->ckmu);
	if (rc)
		dm_err("flat: checkpoint of %s failed: %s", s->dir, strerror(-rc));
err_free_paths:
	free(tmp);
	free(fin);
	return rc;
}

/* Checkpoint if the WAL has grown past the threshold (called with no locks held). */
static void maybe_checkpoint(struct flat_store *s)
{
	uint64_t n;

	if (!s->o.checkpoint_bytes)
		return;
	pthread_mutex_lock(&s->walmu);
	n = s->wal_bytes;
	pthread_mutex_unlock(&s->walmu);
	if (n > s->o.checkpoint_bytes && pthread_mutex_trylock(&s->ckmu) == 0) {
		pthread_mutex_unlock(&s->ckmu);
		flat_checkpoint(s);
	}
}

uint64_t flat_wal_bytes(struct flat_store *s)
{
	uint64_t n;

	pthread_mutex_lock(&s->walmu);
	n = s->wal_bytes;
	pthread_mutex_unlock(&s->walmu);
	return n;
}

/* Load the snapshot, if any: returns its lsn in *lsn. */
static int load_snapshot(struct flat_store *s, uint64_t *lsn)
{
	char *path = path_join(s->dir, "snapshot");
	uint8_t *b = NULL;
	size_t n = 0, off = 16;
	uint64_t nrec = 0;
	int rc;

	*lsn = 0;
	if (!path)
		return -ENOMEM;
	rc = read_file(path, &b, &n);
	free(path);
	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	if (n < 16 || memcmp(b, SNAP_MAGIC, 8)) {
		rc = -EBADMSG;
		goto out;
	}
	memcpy(lsn, b + 8, 8);
	for (;;) {
		uint64_t rl;
		uint32_t type, plen;
		const uint8_t *p;

		if (flat_rec_parse(b + off, n - off, &rl, &type, &p, &plen) != 1) {
			rc = -EBADMSG;
			break;
		}
		off += FLAT_REC_HDR + plen;
		if (type == FLAT_REC_SNAP_END) {
			struct flat_rd rd = { .p = p, .n = plen };

			rc = (flat_rd_u64(&rd) == nrec && !rd.bad && off == n) ? 0 : -EBADMSG;
			break;
		}
		nrec++;
		rc = apply_record(s, type, p, plen);
		if (rc)
			break;
	}
out:
	if (rc)
		dm_err("flat: snapshot in %s is corrupt (%s)", s->dir, strerror(-rc));
	free(b);
	return rc;
}

/* Replay the WAL after the snapshot; cut a torn tail. */
static int replay_wal(struct flat_store *s, const char *path, uint64_t snap_lsn)
{
	uint8_t *b = NULL;
	size_t n = 0, off = 0;
	int rc = read_file(path, &b, &n);
	uint64_t replayed = 0;

	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	while (off < n) {
		uint64_t lsn;
		uint32_t type, plen;
		const uint8_t *p;

		if (flat_rec_parse(b + off, n - off, &lsn, &type, &p, &plen) != 1)
			break;
		if (lsn > snap_lsn) {
			if (lsn <= s->lsn) {
				rc = -EBADMSG;
				dm_err("flat: WAL %s: lsn %llu out of order", path,
				       (unsigned long long)lsn);
				break;
			}
			rc = apply_record(s, type, p, plen);
			if (rc) {
				dm_err("flat: WAL %s: record lsn %llu does not apply: %s", path,
				       (unsigned long long)lsn, strerror(-rc));
				break;
			}
			s->lsn = lsn;
			replayed++;
		}
		off += FLAT_REC_HDR + plen;
	}
	if (!rc && off < n) {
		dm_warn("flat: WAL %s: dropping a torn tail of %zu bytes at offset %zu", path,
			n - off, off);
		if (truncate(path, (off_t)off))
			rc = -errno;
	}
	if (!rc)
		s->wal_bytes = off;
	dm_info("flat: %s: replayed %llu WAL records", s->dir, (unsigned long long)replayed);
	free(b);
	return rc;
}

static void store_free(struct flat_store *s)
{
	while (s->nix)
		cat_drop_index(s, s->nix - 1);
	free(s->ix);
	free(s->buckets);
	if (s->walfd >= 0)
		close(s->walfd);
	if (s->lockfd >= 0)
		close(s->lockfd);
	pthread_rwlock_destroy(&s->cat);
	pthread_mutex_destroy(&s->walmu);
	pthread_mutex_destroy(&s->ckmu);
	free(s->dir);
	free(s);
}

struct flat_store *flat_open(const char *dir, const struct flat_opts *opts)
{
	struct flat_store *s = calloc(1, sizeof(*s));
	char *lock = NULL, *wal = NULL, *tmp = NULL;
	uint64_t snap_lsn;
	int rc;

	if (!s) {
		errno = ENOMEM;
		return NULL;
	}
	s->lockfd = s->walfd = -1;
	pthread_rwlock_init(&s->cat, NULL);
	pthread_mutex_init(&s->walmu, NULL);
	pthread_mutex_init(&s->ckmu, NULL);
	if (opts)
		s->o = *opts;
	else
		s->o.checkpoint_bytes = 256ull << 20;
	if (!s->o.frag_rows)
		s->o.frag_rows = 4096;
	s->dir = strdup(dir);
	lock = path_join(dir, "LOCK");
	wal = path_join(dir, "wal");
	tmp = path_join(dir, "snapshot.tmp");
	if (!s->dir || !lock || !wal || !tmp) {
		rc = -ENOMEM;
		goto err_free_store;
	}
	if (mkdir(dir, 0755) && errno != EEXIST) {
		rc = -errno;
		dm_err("flat: cannot create %s: %s", dir, strerror(errno));
		goto err_free_store;
	}
	s->lockfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (s->lockfd < 0) {
		rc = -errno;
		dm_err("flat: cannot open %s: %s", lock, strerror(errno));
		goto err_free_store;
	}
	if (flock(s->lockfd, LOCK_EX | LOCK_NB)) {
		rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
		dm_err("flat: %s is in use by another process", dir);
		goto err_free_store;
	}
	unlink(tmp);
	rc = load_snapshot(s, &snap_lsn);
	if (rc)
		goto err_free_store;
	s->lsn = snap_lsn;
	rc = replay_wal(s, wal, snap_lsn);
	if (rc)
		goto err_free_store;
	s->walfd = open(wal, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (s->walfd < 0) {
		rc = -errno;
		goto err_free_store;
	}
	if (!s->o.no_sync)
		fsync_dir(dir);
	free(lock);
	free(wal);
	free(tmp);
	return s;

err_free_store:
	free(lock);
	free(wal);
	free(tmp);
	store_free(s);
	errno = -rc;
	return NULL;
}

void flat_close(struct flat_store *s)
{
	if (!s)
		return;
	flat_checkpoint(s);
	store_free(s);
}

void flat_abandon(struct flat_store *s)
{
	if (s)
		store_free(s);
}

/* ---------------------------------------------------------------- catalog API ------ */

int flat_bucket_create(struct flat_store *s, const char *name, int64_t created_ms)
{
	struct flat_buf b = { 0 };
	int rc;

	if (!name_ok(name))
		return -EINVAL;
	pthread_rwlock_wrlock(&s->cat);
	if (bucket_find(s, name) >= 0) {
		rc = -EEXIST;
		goto out;
	}
	rec_begin(&b);
	flat_buf_str(&b, name);
	flat_buf_u64(&b, (uint64_t)created_ms);
	rc = wal_append(s, &b, FLAT_REC_BUCKET_CREATE);
	if (!rc)
		rc = cat_add_bucket(s, name, created_ms);
out:
	pthread_rwlock_unlock(&s->cat);
	flat_buf_free(&b);
	return rc;
}

int flat_bucket_get(struct flat_store *s, const char *name, struct flat_bucket_info *out)
{
	ssize_t i;

	pthread_rwlock_rdlock(&s->cat);
	i = name ? bucket_find(s, name) : -1;
	if (i >= 0 && out)
		*out = s->buckets[i];
	pthread_rwlock_unlock(&s->cat);
	return i >= 0 ? 0 : -ENOENT;
}

int flat_bucket_delete(struct flat_store *s, const char *name)
{
	struct flat_buf b = { 0 };
	ssize_t i;
	int rc = 0;

	pthread_rwlock_wrlock(&s->cat);
	i = name ? bucket_find(s, name) : -1;
	if (i < 0) {
		rc = -ENOENT;
		goto out;
	}
	for (size_t j = 0; j < s->nix; j++)
		if (!strcmp(s->ix[j]->info.bucket, name)) {
			rc = -ENOTEMPTY;
			goto out;
		}
	rec_begin(&b);
	flat_buf_str(&b, name);
	rc = wal_append(s, &b, FLAT_REC_BUCKET_DELETE);
	if (!rc)
		s->buckets[i] = s->buckets[--s->nb];
out:
	pthread_rwlock_unlock(&s->cat);
	flat_buf_free(&b);
	return rc;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

static bool list_take(const char *name, const char *prefix, const char *after)
{
	if (prefix && strncmp(name, prefix, strlen(prefix)))
		return false;
	return !after || strcmp(name, after) > 0;
}

int flat_bucket_list(struct flat_store *s, const char *prefix, const char *after, size_t max,
		     struct flat_bucket_info *out, bool *more)
{
	struct flat_bucket_info *all;
	size_t n = 0, k = 0;

	*more = false;
	pthread_rwlock_rdlock(&s->cat);
	all = malloc((s->nb + 1) * sizeof(*all));
	if (!all) {
		pthread_rwlock_unlock(&s->cat);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->nb; i++)
		if (list_take(s->buckets[i].name, prefix, after))
			all[n++] = s->buckets[i];
	pthread_rwlock_unlock(&s->cat);
	qsort(all, n, sizeof(*all), name_cmp);   /* name is the first member */
	k = DM_MIN(n, max);
	memcpy(out, all, k * sizeof(*all));
	*more = n > k;
	free(all);
	return (int)k;
}

int flat_index_create(struct flat_store *s, const char *bucket, const char *name, uint32_t dim,
		      enum dm_metric metric, const void *conf, uint32_t conf_len,
		      int64_t created_ms)
{
	struct flat_buf b = { 0 };
	struct flat_index *ix;
	int rc;

	if (!name_ok(bucket) || !name_ok(name) || dim < 1 || dim > FLAT_DIM_MAX ||
	    (unsigned)metric > 2 || (conf_len && !conf))
		return -EINVAL;
	pthread_rwlock_wrlock(&s->cat);
	if (bucket_find(s, bucket) < 0) {
		rc = -ENOENT;
		goto out;
	}
	if (index_find(s, bucket, name) >= 0) {
		rc = -EEXIST;
		goto out;
	}
	ix = index_new(s, bucket, name, dim, metric, conf, conf_len, created_ms);
	if (!ix) {
		rc = -ENOMEM;
		goto out;
	}
	rc = cat_add_index(s, ix);
	if (rc) {
		index_free(ix);
		goto out;
	}
	rec_begin(&b);
	flat_buf_str(&b, bucket);
	flat_buf_str(&b, name);
	flat_buf_u32(&b, dim);
	flat_buf_u32(&b, (uint32_t)metric);
	flat_buf_u64(&b, (uint64_t)created_ms);
	flat_buf_blob(&b, conf, conf_len);
	rc = wal_append(s, &b, FLAT_REC_INDEX_CREATE);
	if (rc)
		cat_drop_index(s, s->nix - 1);
out:
	pthread_rwlock_unlock(&s->cat);
	flat_buf_free(&b);
	return rc;
}

int flat_index_delete(struct flat_store *s, const char *bucket, const char *name)
{
	struct flat_buf b = { 0 };
	struct flat_index *ix;
	ssize_t i;
	int rc;

	pthread_rwlock_wrlock(&s->cat);
	i = (bucket && name) ? index_find(s, bucket, name) : -1;
	if (i < 0) {
		rc = -ENOENT;
		goto out;
	}
	ix = s->ix[i];
	pthread_mutex_lock(&ix->wmu);
	rec_begin(&b);
	flat_buf_str(&b, bucket);
	flat_buf_str(&b, name);
	rc = wal_append(s, &b, FLAT_REC_INDEX_DELETE);
	if (!rc)
		ix->deleted = true;
	pthread_mutex_unlock(&ix->wmu);
	if (!rc)
		cat_drop_index(s, (size_t)i);
out:
	pthread_rwlock_unlock(&s->cat);
	flat_buf_free(&b);
	return rc;
}

int flat_index_list(struct flat_store *s, const char *bucket, const char *prefix,
		    const char *after, size_t max, char (*names)[FLAT_NAME_MAX + 1], bool *more)
{
	char (*all)[FLAT_NAME_MAX + 1];
	size_t n = 0, k;

	*more = false;
	pthread_rwlock_rdlock(&s->cat);
	if (!bucket || bucket_find(s, bucket) < 0) {
		pthread_rwlock_unlock(&s->cat);
		return -ENOENT;
	}
	all = malloc((s->nix + 1) * sizeof(*all));
	if (!all) {
		pthread_rwlock_unlock(&s->cat);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->nix; i++)
		if (!strcmp(s->ix[i]->info.bucket, bucket) &&
		    list_take(s->ix[i]->info.name, prefix, after))
			memcpy(all[n++], s->ix[i]->info.name, FLAT_NAME_MAX + 1);
	pthread_rwlock_unlock(&s->cat);
	qsort(all, n, sizeof(*all), name_cmp);
	k = DM_MIN(n, max);
	memcpy(names, all, k * sizeof(*all));
	*more = n > k;
	free(all);
	return (int)k;
}

struct flat_index *flat_index_get(struct flat_store *s, const char *bucket, const char *name)
{
	struct flat_index *ix = NULL;
	ssize_t i;

	pthread_rwlock_rdlock(&s->cat);
	i = (bucket && name) ? index_find(s, bucket, name) : -1;
	if (i >= 0) {
		ix = s->ix[i];
		__atomic_add_fetch(&ix->refs, 1, __ATOMIC_ACQ_REL);
	}
	pthread_rwlock_unlock(&s->cat);
	if (!ix)
		errno = ENOENT;
	return ix;
}

const struct flat_index_info *flat_index_info(const struct flat_index *ix)
{
	return &ix->info;
}

void flat_index_stats(struct flat_index *ix, uint64_t *live, uint64_t *rows, uint64_t *frags)
{
	pthread_rwlock_rdlock(&ix->rw);
	if (live)
		*live = ix->live;
	if (rows)
		*rows = ix->next_id;
	if (frags)
		*frags = ix->nfrags;
	pthread_rwlock_unlock(&ix->rw);
}

/* ---------------------------------------------------------------- data API --------- */

static bool key_ok(const char *k)
{
	size_t l = k ? strnlen(k, FLAT_KEY_MAX + 1) : 0;

	return l >= 1 && l <= FLAT_KEY_MAX;
}

int flat_put(struct flat_index *ix, const struct flat_row_in *rows, size_t n)
{
	struct flat_buf b = { 0 };
	struct flat_rd rd;
	int rc;

	if (!n)
		return 0;
	if (n > UINT32_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!key_ok(rows[i].key) || !rows[i].vec ||
		    (rows[i].meta_len && !rows[i].meta) || (rows[i].fmeta_len && !rows[i].fmeta))
			return -EINVAL;
	rec_begin(&b);
	enc_put_rows(&b, ix, rows, n);
	pthread_mutex_lock(&ix->wmu);
	if (ix->deleted) {
		rc = -ENOENT;
		goto out;
	}
	rc = wal_append(ix->s, &b, FLAT_REC_PUT);
	if (rc)
		goto out;
	/* Apply the very bytes that were logged, so that replay reproduces this state. */
	rd = (struct flat_rd){ .p = b.p + FLAT_REC_HDR, .n = b.n - FLAT_REC_HDR };
	flat_rd_raw(&rd, 8 + strlen(ix->info.bucket) + strlen(ix->info.name));
	pthread_rwlock_wrlock(&ix->rw);
	rc = apply_put(ix, &rd);
	pthread_rwlock_unlock(&ix->rw);
	if (rc)
		dm_err("flat: %s/%s: logged PUT failed to apply in memory: %s", ix->info.bucket,
		       ix->info.name, strerror(-rc));
out:
	pthread_mutex_unlock(&ix->wmu);
	flat_buf_free(&b);
	if (!rc)
		maybe_checkpoint(ix->s);
	return rc;
}

int flat_delete(struct flat_index *ix, const char *const *keys, size_t n)
{
	struct flat_buf b = { 0 };
	struct flat_rd rd;
	int rc;

	if (!n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!key_ok(keys[i]))
			return -EINVAL;
	rec_begin(&b);
	flat_buf_str(&b, ix->info.bucket);
	flat_buf_str(&b, ix->info.name);
	flat_buf_u32(&b, (uint32_t)n);
	for (size_t i = 0; i < n; i++)
		flat_buf_str(&b, keys[i]);
	pthread_mutex_lock(&ix->wmu);
	if (ix->deleted) {
		rc = -ENOENT;
		goto out;
	}
	rc = wal_append(ix->s, &b, FLAT_REC_DEL);
	if (rc)
		goto out;
	rd = (struct flat_rd){ .p = b.p + FLAT_REC_HDR, .n = b.n - FLAT_REC_HDR };
	flat_rd_raw(&rd, 8 + strlen(ix->info.bucket) + strlen(ix->info.name));
	pthread_rwlock_wrlock(&ix->rw);
	rc = apply_del(ix, &rd);
	pthread_rwlock_unlock(&ix->rw);
out:
	pthread_mutex_unlock(&ix->wmu);
	flat_buf_free(&b);
	if (!rc)
		maybe_checkpoint(ix->s);
	return rc;
}

int flat_get(struct flat_index *ix, const char *const *keys, size_t n, flat_row_fn fn,
	     void *ctx)
{
	int found = 0;

	pthread_rwlock_rdlock(&ix->rw);
	for (size_t i = 0; i < n; i++) {
		uint64_t id = key_ok(keys[i]) ? km_get(ix, keys[i]) : UINT64_MAX;
		struct flat_row r;

		if (id == UINT64_MAX)
			continue;
		fill_row(ix, id, &r);
		int c = fn(ctx, &r);

		if (c < 0)
			break;
		found++;
		if (c > 0)
			break;
	}
	pthread_rwlock_unlock(&ix->rw);
	return found;
}

int flat_get_ids(struct flat_index *ix, const uint64_t *ids, size_t n, flat_row_fn fn,
		 void *ctx)
{
	int found = 0;

	pthread_rwlock_rdlock(&ix->rw);
	for (size_t i = 0; i < n; i++) {
		struct flat_row r;

		if (ids[i] >= ix->next_id || row_dead(ix, ids[i]))
			continue;
		fill_row(ix, ids[i], &r);
		int c = fn(ctx, &r);

		if (c < 0)
			break;
		found++;
		if (c > 0)
			break;
	}
	pthread_rwlock_unlock(&ix->rw);
	return found;
}

size_t flat_fragments(struct flat_index *ix, uint64_t *bytes, size_t max)
{
	size_t n;

	pthread_rwlock_rdlock(&ix->rw);
	n = ix->nfrags;
	for (size_t i = 0; i < DM_MIN(n, max); i++)
		bytes[i] = (uint64_t)ix->frags[i]->n * ix->info.dim * sizeof(float);
	pthread_rwlock_unlock(&ix->rw);
	return n;
}

uint32_t flat_frag_rows(const struct flat_index *ix)
{
	return ix->frag_rows;
}

size_t flat_frag_stats(struct flat_index *ix, struct flat_frag_stat *out, size_t max)
{
	size_t n;

	pthread_rwlock_rdlock(&ix->rw);
	n = ix->nfrags;
	for (size_t i = 0; i < DM_MIN(n, max); i++) {
		const struct flat_frag *f = ix->frags[i];
		uint32_t d = 0;

		for (uint32_t r = 0; r < f->n; r++)
			d += f->dead[r];
		out[i] = (struct flat_frag_stat){ .rows = f->n, .dead = d };
	}
	pthread_rwlock_unlock(&ix->rw);
	return n;
}

int flat_frag_read(struct flat_index *ix, uint64_t frag, uint32_t from, uint8_t *dead,
		   size_t dead_cap, flat_row_fn fn, void *ctx)
{
	const struct flat_frag *f;
	int rc;

	if (dead_cap < ix->frag_rows)
		return -EINVAL;
	pthread_rwlock_rdlock(&ix->rw);
	if (frag >= ix->nfrags) {
		pthread_rwlock_unlock(&ix->rw);
		return -ENOENT;
	}
	f = ix->frags[frag];
	memcpy(dead, f->dead, f->n);
	rc = (int)f->n;
	for (uint32_t r = from; r < f->n; r++) {
		struct flat_row row;

		fill_row(ix, frag * ix->frag_rows + r, &row);
		if (fn(ctx, &row))
			break;
	}
	pthread_rwlock_unlock(&ix->rw);
	return rc;
}

static bool in_segment(const struct flat_index *ix, uint64_t id, uint32_t cnt, uint32_t idx)
{
	uint32_t r;
	struct flat_frag *f;

	if (cnt <= 1)
		return true;
	f = frag_of(ix, id, &r);
	return f->khash[r] % cnt == idx;
}

int flat_list(struct flat_index *ix, uint64_t start, uint32_t seg_count, uint32_t seg_index,
	      size_t max, flat_row_fn fn, void *ctx, uint64_t *next)
{
	int n = 0;
	uint64_t id;

	*next = UINT64_MAX;
	if (seg_count > 1 && seg_index >= seg_count)
		return -EINVAL;
	pthread_rwlock_rdlock(&ix->rw);
	for (id = start; id < ix->next_id; id++) {
		struct flat_row r;
		int c;

		if (row_dead(ix, id) || !in_segment(ix, id, seg_count, seg_index))
			continue;
		if ((size_t)n == max) {
			*next = id;        /* the next page starts at the next live row */
			break;
		}
		fill_row(ix, id, &r);
		c = fn(ctx, &r);
		if (c < 0) {
			*next = id;
			break;
		}
		n++;
		if (c > 0) {
			*next = id + 1;
			break;
		}
	}
	pthread_rwlock_unlock(&ix->rw);
	return n;
}

/* ---------------------------------------------------------------- scan ------------- */

/* Offer row (f, r) with distance d to topk t if it passes the filter. The filter runs only
 * for rows that would enter the heap (rows are scanned in ascending id order, so a tie
 * with the bound loses and can be skipped). */
static inline void offer(struct dm_topk *t, const struct flat_frag *f, uint32_t r, uint64_t id,
			 float d, flat_match_fn match, void *mctx)
{
	if (t->n == t->k && !(d < dm_topk_bound(t)))
		return;
	if (mctx && !match(mctx, f->meta[r] + f->meta_len[r], f->fmeta_len[r]))
		return;
	dm_topk_push(t, d, id);
}

int flat_search(struct flat_index *ix, const struct flat_scan *sc, struct dm_hit *out,
		size_t *nout)
{
	uint32_t dim = ix->info.dim;
	enum dm_metric m = ix->info.metric;
	struct dm_topk **tk;
	float *dist = NULL, *qn = NULL;
	int rc = 0;

	if (!sc || !sc->q || !sc->nq || !sc->k || !out || !nout ||
	    (sc->share_count && sc->share_index >= sc->share_count))
		return -EINVAL;
	tk = calloc(sc->nq, sizeof(*tk));
	qn = malloc(sc->nq * sizeof(float));
	if (!tk || !qn) {
		rc = -ENOMEM;
		goto err_free;
	}
	for (size_t i = 0; i < sc->nq; i++) {
		tk[i] = dm_topk_new(sc->k);
		if (!tk[i]) {
			rc = -ENOMEM;
			goto err_free;
		}
		qn[i] = sqrtf(dm_dot(sc->q + i * dim, sc->q + i * dim, dim));
	}
	if (sc->nq > 1) {
		dist = malloc(sc->nq * (size_t)ix->frag_rows * sizeof(float));
		if (!dist) {
			rc = -ENOMEM;
			goto err_free;
		}
	}

	pthread_rwlock_rdlock(&ix->rw);
	for (size_t fi = 0; fi < ix->nfrags; fi++) {
		const struct flat_frag *f = ix->frags[fi];
		uint64_t base = (uint64_t)fi * ix->frag_rows;

		if (sc->frag_sel ? !sc->frag_sel(sc->frag_ctx, fi) :
		    (sc->share_count && fi % sc->share_count != sc->share_index))
			continue;
		if (sc->nq == 1) {
			const float *q = sc->q;
			void *mctx = sc->match && sc->match_ctx ? sc->match_ctx[0] : NULL;

			for (uint32_t r = 0; r < f->n; r++) {
				const float *v = f->vec + (size_t)r * dim;
				float d;

				if (f->dead[r])
					continue;
				if (m == DM_METRIC_L2) {
					d = dm_l2sq(q, v, dim);
				} else if (m == DM_METRIC_IP) {
					d = -dm_dot(q, v, dim);
				} else {
					float den = qn[0] * sqrtf(f->norm2[r]);

					d = den > 0 ? 1.0f - dm_dot(q, v, dim) / den : 1.0f;
				}
				offer(tk[0], f, r, base + r, d, sc->match, mctx);
			}
			continue;
		}
		/* Several queries: one sgemm for the fragment, then the same selection. */
		dm_distance_batch(m, sc->q, sc->nq, f->vec, f->n, dim, f->norm2, dist);
		for (size_t i = 0; i < sc->nq; i++) {
			void *mctx = sc->match && sc->match_ctx ? sc->match_ctx[i] : NULL;
			const float *drow = dist + i * f->n;

			for (uint32_t r = 0; r < f->n; r++) {
				float d = drow[r];

				if (f->dead[r])
					continue;
				if (m == DM_METRIC_L2 && d < 0)
					d = 0;     /* sgemm rounding */
				offer(tk[i], f, r, base + r, d, sc->match, mctx);
			}
		}
	}
	pthread_rwlock_unlock(&ix->rw);
	for (size_t i = 0; i < sc->nq; i++)
		nout[i] = dm_topk_drain(tk[i], out + i * sc->k);
err_free:
	if (tk)
		for (size_t i = 0; i < sc->nq; i++)
			dm_topk_free(tk[i]);
	free(tk);
	free(qn);
	free(dist);
	return rc;
}
