/* flat_snap.c: the flat store's files: snapshots (a compacted image of the catalog and the
 * live rows as WAL-format records, written to snapshot.tmp and renamed; the record writer is
 * shared with the bucket images of flat_image.c), checkpoints (snapshot, then truncate the
 * WAL, with every writer held out), and opening a store (lock, load the snapshot, replay the
 * WAL) and closing it. */
#include "flat_int.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define SNAP_MAGIC "DMFLSNP1"
#define SNAP_BATCH 256

int flat_write_all(int fd, const void *p, size_t n, off_t off)
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
int flat_read_file(const char *path, uint8_t **out, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;
	struct stat st;
	uint8_t *b;
	size_t off = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st)) {
		rc = -errno;
		goto out_close_fd;
	}
	b = malloc((size_t)st.st_size + 1);
	if (!b) {
		rc = -ENOMEM;
		goto out_close_fd;
	}
	while (off < (size_t)st.st_size) {
		ssize_t r = read(fd, b + off, (size_t)st.st_size - off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = r < 0 ? -errno : -EIO;
			free(b);
			goto out_close_fd;
		}
		off += (size_t)r;
	}
	*out = b;
	*len = off;
out_close_fd:
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

/* ---------------------------------------------------------------- snapshot write --- */

void flat_snap_emit(struct flat_snapw *w, uint32_t type)
{
	if (w->rc)
		return;
	if (w->rec.oom) {
		w->rc = -ENOMEM;
		return;
	}
	flat_rec_frame(&w->rec, 0, type, 0);
	dm_buf_put(&w->out, w->rec.p, w->rec.n);
	w->nrec++;
	if (w->out.oom) {
		w->rc = -ENOMEM;
	} else if (w->fd >= 0 && w->out.n >= (4u << 20)) {
		w->rc = flat_write_all(w->fd, w->out.p, w->out.n, w->off);
		w->off += (off_t)w->out.n;
		dm_buf_reset(&w->out);
	}
}

void flat_snap_bucket(struct flat_snapw *w, const struct flat_bucket_info *b)
{
	flat_rec_begin(&w->rec);
	dm_buf_str(&w->rec, b->name);
	dm_buf_u64(&w->rec, (uint64_t)b->created_ms);
	flat_snap_emit(w, FLAT_REC_BUCKET_CREATE);
}

void flat_snap_index(struct flat_snapw *w, struct flat_index *ix)
{
	struct flat_row_in rows[SNAP_BATCH];
	size_t nr = 0;

	flat_rec_begin(&w->rec);
	dm_buf_str(&w->rec, ix->info.bucket);
	dm_buf_str(&w->rec, ix->info.name);
	dm_buf_u32(&w->rec, ix->info.dim);
	dm_buf_u32(&w->rec, (uint32_t)ix->info.metric);
	dm_buf_u64(&w->rec, (uint64_t)ix->info.created_ms);
	dm_buf_bytes(&w->rec, ix->conf, ix->info.conf_len);
	flat_snap_emit(w, FLAT_REC_INDEX_CREATE);
	/* the live rows in id order, fragment by fragment (a scoped index's fragments have
	 * unfilled rows: flat.h) */
	for (size_t fi = 0; fi <= ix->nfrags && !w->rc; fi++) {
		uint32_t n = fi < ix->nfrags ? ix->frags[fi]->n : 0;

		for (uint32_t ri = 0; ri <= n && !w->rc; ri++) {
			uint64_t id = (uint64_t)fi * ix->frag_rows + ri;
			bool last = fi == ix->nfrags;

			if (ri < n && !flat_row_dead(ix, id)) {
				struct flat_row r;

				flat_fill_row(ix, id, &r);
				rows[nr++] = (struct flat_row_in){ r.key, r.vec, r.meta, r.meta_len,
								   r.fmeta, r.fmeta_len };
			}
			if (nr == SNAP_BATCH || (last && nr)) {
				flat_rec_begin(&w->rec);
				flat_enc_put(&w->rec, ix, rows, nr);
				flat_snap_emit(w, FLAT_REC_PUT);
				nr = 0;
			}
		}
	}
	flat_rec_begin(&w->rec);
	if (!w->rc && flat_mark_snap(ix, &w->rec)) {
		size_t at = 0;

		flat_snap_emit(w, FLAT_REC_MARK);
		/* the key log after its mark: replayed, it advances the mark as it did */
		while (!w->rc && (flat_rec_begin(&w->rec), flat_gindex_snap(ix, &at, &w->rec)))
			flat_snap_emit(w, FLAT_REC_GINDEX);
	}
}

void flat_snap_attr(struct flat_snapw *w, const struct flat_attr *a)
{
	flat_rec_begin(&w->rec);
	flat_attr_enc(&w->rec, a);
	flat_snap_emit(w, FLAT_REC_ATTR);
}

void flat_snap_end(struct flat_snapw *w)
{
	flat_rec_begin(&w->rec);
	dm_buf_u64(&w->rec, w->nrec);
	flat_snap_emit(w, FLAT_REC_SNAP_END);
}

/* Write the whole store as records into fd (writers held out: flat_writers_hold). */
static int snap_write(struct flat_store *s, int fd, uint64_t lsn)
{
	struct flat_snapw w = { .fd = fd };

	dm_buf_put(&w.out, SNAP_MAGIC, 8);
	dm_buf_u64(&w.out, lsn);
	for (size_t i = 0; i < s->nb; i++)
		flat_snap_bucket(&w, &s->buckets[i]);
	for (size_t i = 0; i < s->nix; i++)
		flat_snap_index(&w, s->ix[i]);
	for (size_t i = 0; i < s->nattr; i++)
		flat_snap_attr(&w, &s->attrs[i]);
	flat_snap_end(&w);
	if (!w.rc && w.out.n)
		w.rc = flat_write_all(fd, w.out.p, w.out.n, w.off);
	dm_buf_free(&w.out);
	dm_buf_free(&w.rec);
	return w.rc;
}

void flat_writers_hold(struct flat_store *s)
{
	pthread_rwlock_wrlock(&s->cat);
	/* Hold every index's writers out, once the writes they logged are applied: then the
	 * state in memory is exactly the log up to s->lsn. */
	for (size_t i = 0; i < s->nix; i++) {
		pthread_mutex_lock(&s->ix[i]->wmu);
		flat_drain(s->ix[i]);
	}
}

void flat_writers_release(struct flat_store *s)
{
	for (size_t i = 0; i < s->nix; i++)
		pthread_mutex_unlock(&s->ix[i]->wmu);
	pthread_rwlock_unlock(&s->cat);
}

int flat_checkpoint_held(struct flat_store *s)
{
	char *tmp = path_join(s->dir, "snapshot.tmp"), *fin = path_join(s->dir, "snapshot");
	int fd, rc;
	uint64_t lsn;

	if (!tmp || !fin) {
		rc = -ENOMEM;
		goto out_free_paths;
	}
	pthread_mutex_lock(&s->walmu);
	lsn = s->lsn;
	rc = s->wal_err;
	pthread_mutex_unlock(&s->walmu);
	if (rc)
		goto out_log;

	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out_log;
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
		goto out_log;
	}
	/* The snapshot covers every record up to lsn: the WAL can start over. A crash before
	 * the truncate is harmless (replay skips lsn <= the snapshot's). */
	pthread_mutex_lock(&s->walmu);
	if (ftruncate(s->walfd, 0) || (!s->o.no_sync && fdatasync(s->walfd))) {
		rc = -errno;
	} else {
		s->wal_bytes = 0;
		s->durable_lsn = lsn;
	}
	pthread_mutex_unlock(&s->walmu);
out_log:
	if (rc)
		dm_err("flat: checkpoint of %s failed: %s", s->dir, strerror(-rc));
out_free_paths:
	free(tmp);
	free(fin);
	return rc;
}

/* Snapshot + WAL truncate, ckmu held. */
static int checkpoint_locked(struct flat_store *s)
{
	int rc;

	flat_writers_hold(s);
	rc = flat_checkpoint_held(s);
	flat_writers_release(s);
	return rc;
}

int flat_checkpoint(struct flat_store *s)
{
	int rc;

	pthread_mutex_lock(&s->ckmu);
	rc = checkpoint_locked(s);
	pthread_mutex_unlock(&s->ckmu);
	return rc;
}

void flat_maybe_checkpoint(struct flat_store *s)
{
	if (!s->o.checkpoint_bytes || flat_wal_bytes(s) <= s->o.checkpoint_bytes)
		return;
	/* One writer checkpoints; the others go on (and the WAL size is checked again under
	 * ckmu, so writers that saw the same large WAL do not checkpoint one after another). */
	if (pthread_mutex_trylock(&s->ckmu) == 0) {
		if (flat_wal_bytes(s) > s->o.checkpoint_bytes)
			checkpoint_locked(s);
		pthread_mutex_unlock(&s->ckmu);
	}
}

/* ---------------------------------------------------------------- recovery --------- */

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
	rc = flat_read_file(path, &b, &n);
	free(path);
	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	if (n < 16 || memcmp(b, SNAP_MAGIC, 8)) {
		rc = -EBADMSG;
		goto out_free;
	}
	*lsn = dm_get_le64(b + 8);
	for (;;) {
		struct flat_rec r;

		if (flat_rec_parse(b + off, n - off, &r) != 1) {
			rc = -EBADMSG;
			break;
		}
		off += FLAT_REC_HDR + r.len;
		if (r.type == FLAT_REC_SNAP_END) {
			struct dm_rbuf rd = { .p = r.payload, .n = r.len };

			rc = (dm_rbuf_u64(&rd) == nrec && !rd.bad && off == n) ? 0 : -EBADMSG;
			break;
		}
		nrec++;
		rc = flat_apply_record(s, r.type, r.payload, r.len);
		if (rc)
			break;
	}
out_free:
	if (rc)
		dm_err("flat: snapshot in %s is corrupt (%s, at offset %zu)", s->dir, strerror(-rc),
		       off);
	free(b);
	return rc;
}

void flat_store_free(struct flat_store *s)
{
	if (!s)
		return;
	while (s->nix)
		flat_cat_drop_index(s, s->nix - 1);
	free(s->ix);
	flat_attr_free_all(s);
	free(s->buckets);
	if (s->walfd >= 0)
		close(s->walfd);
	if (s->lockfd >= 0)
		close(s->lockfd);
	pthread_rwlock_destroy(&s->cat);
	pthread_mutex_destroy(&s->walmu);
	pthread_cond_destroy(&s->walcv);
	pthread_mutex_destroy(&s->ckmu);
	free(s->wal_path);
	free(s->dir);
	free(s);
}

struct flat_store *flat_store_new(const struct flat_opts *opts)
{
	struct flat_store *s = calloc(1, sizeof(*s));

	if (!s) {
		errno = ENOMEM;
		return NULL;
	}
	s->lockfd = s->walfd = -1;
	pthread_rwlock_init(&s->cat, NULL);
	pthread_mutex_init(&s->walmu, NULL);
	pthread_cond_init(&s->walcv, NULL);
	pthread_mutex_init(&s->ckmu, NULL);
	if (opts)
		s->o = *opts;
	else
		s->o.checkpoint_bytes = 256ull << 20;
	if (!s->o.frag_rows)
		s->o.frag_rows = 4096;
	return s;
}

struct flat_store *flat_open(const char *dir, const struct flat_opts *opts)
{
	struct flat_store *s = flat_store_new(opts);
	char *lock = NULL, *tmp = NULL;
	uint64_t snap_lsn;
	int rc;

	if (!s)
		return NULL;
	s->dir = strdup(dir);
	s->wal_path = path_join(dir, "wal");
	lock = path_join(dir, "LOCK");
	tmp = path_join(dir, "snapshot.tmp");
	if (!s->dir || !lock || !s->wal_path || !tmp) {
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
	for (uint32_t waited = 0; flock(s->lockfd, LOCK_EX | LOCK_NB); waited += 100) {
		rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
		if (rc != -EBUSY || waited >= s->o.lock_wait_ms) {
			dm_err("flat: %s is in use by another process", dir);
			goto err_free_store;
		}
		if (!waited)
			dm_warn("flat: %s is locked by another process; trying again for %u ms", dir,
				s->o.lock_wait_ms);
		usleep(100000);
	}
	unlink(tmp);
	rc = load_snapshot(s, &snap_lsn);
	if (rc)
		goto err_free_store;
	s->lsn = snap_lsn;
	rc = flat_wal_replay(s, snap_lsn);
	if (rc)
		goto err_free_store;
	s->walfd = open(s->wal_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (s->walfd < 0) {
		rc = -errno;
		dm_err("flat: cannot open %s: %s", s->wal_path, strerror(errno));
		goto err_free_store;
	}
	/* What was replayed may sit in the page cache only (a process crash): make it durable
	 * before later records count on it (their inflight field). */
	if (!s->o.no_sync && (fdatasync(s->walfd) || fsync_dir(dir))) {
		rc = -errno;
		dm_err("flat: cannot sync %s: %s", s->wal_path, strerror(errno));
		goto err_free_store;
	}
	s->durable_lsn = s->lsn;
	free(lock);
	free(tmp);
	return s;

err_free_store:
	free(lock);
	free(tmp);
	flat_store_free(s);
	errno = -rc;
	return NULL;
}

void flat_close(struct flat_store *s)
{
	if (!s)
		return;
	flat_checkpoint(s);
	flat_store_free(s);
}

void flat_abandon(struct flat_store *s)
{
	if (s)
		flat_store_free(s);
}
