/* flat_apply.c: the flat store's write path and replay of records. A PUT or DEL is
 * validated and everything it needs is allocated (row copies, key-map room, fragments)
 * before its record is logged; the writer then waits for a sync covering the record (group
 * commit, flat_wal.c) and the writers of an index apply in their log order, with steps that
 * cannot fail. So a logged write is always applied, and a write that fails is never logged:
 * replay reproduces exactly the acknowledged state. */
#include "flat_int.h"

#include <stdlib.h>
#include <string.h>

void flat_enc_put(struct dm_buf *b, const struct flat_index *ix, const struct flat_row_in *rows,
		  size_t n)
{
	dm_buf_str(b, ix->info.bucket);
	dm_buf_str(b, ix->info.name);
	dm_buf_u32(b, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		dm_buf_str(b, rows[i].key);
		dm_buf_put(b, rows[i].vec, (size_t)ix->info.dim * 4);
		dm_buf_bytes(b, rows[i].meta, rows[i].meta_len);
		dm_buf_bytes(b, rows[i].fmeta, rows[i].fmeta_len);
	}
}

static void prows_free(struct flat_prow *p, size_t n)
{
	if (!p)
		return;
	for (size_t i = 0; i < n; i++)
		flat_prow_free(&p[i]);
	free(p);
}

/* Reserve room and place n prepared rows (recovery: single-threaded, no waiting). */
static int place_all(struct flat_index *ix, struct flat_prow *p, size_t n)
{
	int rc = flat_reserve(ix, p, n);

	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++)
		flat_place(ix, &p[i]);
	return 0;
}

/* ---------------------------------------------------------------- replay ----------- */

/* The rows of a PUT record (after bucket and index name), prepared. */
static int dec_put(struct flat_index *ix, struct dm_rbuf *rd)
{
	uint32_t n = dm_rbuf_u32(rd), dim = ix->info.dim;
	size_t min_row = 4 + 1 + (size_t)dim * 4 + 8;
	struct flat_prow *p;
	char key[FLAT_KEY_MAX + 1];
	int rc = 0;

	if (rd->bad || n > (rd->n - rd->at) / min_row)
		return -EBADMSG;
	p = calloc(n ? n : 1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	for (uint32_t i = 0; i < n && !rc; i++) {
		uint32_t mlen, flen;
		const void *vec, *meta, *fmeta;

		flat_rd_name(rd, key, FLAT_KEY_MAX);
		vec = dm_rbuf_get(rd, (size_t)dim * 4);
		meta = dm_rbuf_bytes(rd, &mlen, UINT32_MAX);
		fmeta = dm_rbuf_bytes(rd, &flen, UINT32_MAX);
		rc = rd->bad ? -EBADMSG : flat_prow_init(&p[i], key, vec, meta, mlen, fmeta, flen);
		if (!rc)
			p[i].scope = flat_scope_row(ix, fmeta, flen);
	}
	if (!rc)
		rc = place_all(ix, p, n);
	prows_free(p, n);
	return rc;
}

static int dec_del(struct flat_index *ix, struct dm_rbuf *rd)
{
	uint32_t n = dm_rbuf_u32(rd);
	char key[FLAT_KEY_MAX + 1];

	for (uint32_t i = 0; i < n && !rd->bad; i++) {
		uint64_t id;

		if (!flat_rd_name(rd, key, FLAT_KEY_MAX))
			break;
		id = flat_km_get(ix, key);
		if (id != UINT64_MAX)
			flat_row_kill(ix, id);
	}
	return rd->bad ? -EBADMSG : 0;
}

int flat_apply_record(struct flat_store *s, uint32_t type, const uint8_t *p, uint32_t n)
{
	struct dm_rbuf rd = { .p = p, .n = n };
	char b[FLAT_NAME_MAX + 1], x[FLAT_NAME_MAX + 1];
	ssize_t i;
	int rc;

	switch (type) {
	case FLAT_REC_BUCKET_CREATE: {
		int64_t created;

		flat_rd_name(&rd, b, FLAT_NAME_MAX);
		created = (int64_t)dm_rbuf_u64(&rd);
		if (rd.bad || rd.at != rd.n || flat_bucket_find(s, b) >= 0)
			return -EBADMSG;
		rc = flat_cat_reserve(s);
		if (!rc)
			flat_cat_add_bucket(s, b, created);
		return rc;
	}
	case FLAT_REC_BUCKET_DELETE:
		flat_rd_name(&rd, b, FLAT_NAME_MAX);
		i = rd.bad || rd.at != rd.n ? -1 : flat_bucket_find(s, b);
		if (i < 0)
			return -EBADMSG;
		flat_attr_drop(s, b, NULL);
		s->buckets[i] = s->buckets[--s->nb];
		return 0;
	case FLAT_REC_INDEX_CREATE: {
		uint32_t dim, metric, clen;
		int64_t created;
		const void *conf;
		struct flat_index *ix;

		flat_rd_name(&rd, b, FLAT_NAME_MAX);
		flat_rd_name(&rd, x, FLAT_NAME_MAX);
		dim = dm_rbuf_u32(&rd);
		metric = dm_rbuf_u32(&rd);
		created = (int64_t)dm_rbuf_u64(&rd);
		conf = dm_rbuf_bytes(&rd, &clen, UINT32_MAX);
		if (rd.bad || rd.at != rd.n || dim < 1 || dim > FLAT_DIM_MAX || metric > 2 ||
		    flat_bucket_find(s, b) < 0 || flat_index_find(s, b, x) >= 0)
			return -EBADMSG;
		ix = flat_index_new(s, b, x, dim, (enum dm_metric)metric, conf, clen, created);
		if (!ix)
			return -ENOMEM;
		rc = flat_cat_reserve(s);
		if (rc) {
			flat_index_free(ix);
			return rc;
		}
		flat_cat_add_index(s, ix);
		return 0;
	}
	case FLAT_REC_INDEX_DELETE:
		flat_rd_name(&rd, b, FLAT_NAME_MAX);
		flat_rd_name(&rd, x, FLAT_NAME_MAX);
		i = rd.bad || rd.at != rd.n ? -1 : flat_index_find(s, b, x);
		if (i < 0)
			return -EBADMSG;
		s->ix[i]->deleted = true;
		flat_attr_drop(s, b, x);
		flat_cat_drop_index(s, (size_t)i);
		return 0;
	case FLAT_REC_ATTR:
		return flat_attr_apply(s, p, n);
	case FLAT_REC_MARK:
		return flat_mark_apply(s, p, n);
	case FLAT_REC_GINDEX:
		return flat_gindex_apply(s, p, n);
	case FLAT_REC_PUT:
	case FLAT_REC_DEL:
		flat_rd_name(&rd, b, FLAT_NAME_MAX);
		flat_rd_name(&rd, x, FLAT_NAME_MAX);
		i = rd.bad ? -1 : flat_index_find(s, b, x);
		if (i < 0)
			return -EBADMSG;
		rc = type == FLAT_REC_PUT ? dec_put(s->ix[i], &rd) : dec_del(s->ix[i], &rd);
		if (!rc && rd.at != rd.n)
			rc = -EBADMSG;
		return rc;
	default:
		return -EBADMSG;
	}
}

/* ---------------------------------------------------------------- live writes ------ */

void flat_drain(struct flat_index *ix)
{
	while (ix->qhead)
		pthread_cond_wait(&ix->apply_cv, &ix->wmu);
}

/* Log the record in b for ix and queue pw (wmu held by the caller), reserving rows. */
static int log_locked(struct flat_index *ix, struct dm_buf *b, uint32_t type,
		      struct flat_pending *pw)
{
	int rc;

	if (ix->deleted)
		return -ENOENT;
	rc = flat_reserve(ix, pw->rows, pw->nrows);
	if (rc)
		return rc;
	rc = flat_wal_write(ix->s, b, type, &pw->lsn);
	if (rc) {
		flat_unreserve(ix, pw->nrows);
		return rc;
	}
	pw->next = NULL;
	if (ix->qtail)
		ix->qtail->next = pw;
	else
		ix->qhead = pw;
	ix->qtail = pw;
	return 0;
}

static void apply_one(struct flat_index *ix, struct flat_pending *pw)
{
	for (size_t i = 0; i < pw->nrows; i++)
		flat_place(ix, &pw->rows[i]);
	for (size_t i = 0; i < pw->nkeys; i++) {
		uint64_t id = flat_km_get(ix, pw->keys[i]);

		if (id != UINT64_MAX)
			flat_row_kill(ix, id);
	}
}

static void pop_head(struct flat_index *ix)
{
	ix->qhead->done = true;
	ix->qhead = ix->qhead->next;
	if (!ix->qhead)
		ix->qtail = NULL;
}

/* Wait for pw's record to be durable, then apply the queue up to pw (unless a writer back
 * earlier did); on a failed sync drop pw once it is first in the queue (the writes before
 * it were durable and are applied by their writers; the store refuses later writes). */
static int commit(struct flat_index *ix, struct flat_pending *pw)
{
	int rc = flat_wal_wait(ix->s, pw->lsn);

	pthread_mutex_lock(&ix->wmu);
	if (!rc && !pw->done) {
		struct flat_pending *q;

		pthread_rwlock_wrlock(&ix->rw);
		do {
			q = ix->qhead;
			apply_one(ix, q);
			pop_head(ix);
		} while (q != pw);
		pthread_rwlock_unlock(&ix->rw);
		pthread_cond_broadcast(&ix->apply_cv);
	} else if (rc) {
		while (ix->qhead != pw)
			pthread_cond_wait(&ix->apply_cv, &ix->wmu);
		flat_unreserve(ix, pw->nrows);
		pop_head(ix);
		pthread_cond_broadcast(&ix->apply_cv);
	}
	pthread_mutex_unlock(&ix->wmu);
	return rc;
}

/* Log the record in b, wait for its durability and apply: the rest of a PUT or DEL. */
static int log_and_commit(struct flat_index *ix, struct dm_buf *b, uint32_t type,
			  struct flat_pending *pw)
{
	int rc;

	pthread_mutex_lock(&ix->wmu);
	rc = log_locked(ix, b, type, pw);
	pthread_mutex_unlock(&ix->wmu);
	if (!rc)
		rc = commit(ix, pw);
	if (!rc)
		flat_maybe_checkpoint(ix->s);
	return rc;
}

static bool key_ok(const char *k)
{
	size_t l = k ? strnlen(k, FLAT_KEY_MAX + 1) : 0;

	return l >= 1 && l <= FLAT_KEY_MAX;
}

int flat_put(struct flat_index *ix, const struct flat_row_in *rows, size_t n)
{
	struct dm_buf b = { 0 };
	struct flat_prow *p;
	struct flat_pending pw = { .nrows = n };
	struct flat_store *s = ix->s;
	uint64_t max = s->o.max_bytes, need = 0;
	size_t np = 0;
	int rc;

	if (!n)
		return 0;
	if (n > UINT32_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!key_ok(rows[i].key) || !rows[i].vec ||
		    (rows[i].meta_len && !rows[i].meta) || (rows[i].fmeta_len && !rows[i].fmeta))
			return -EINVAL;
	p = calloc(n, sizeof(*p));
	if (!p)
		return -ENOMEM;
	for (; np < n; np++) {
		rc = flat_prow_init(&p[np], rows[np].key, rows[np].vec, rows[np].meta,
				    rows[np].meta_len, rows[np].fmeta, rows[np].fmeta_len);
		if (rc)
			goto out_free;
		p[np].scope = flat_scope_row(ix, rows[np].fmeta, rows[np].fmeta_len);
		if (max)
			need += flat_row_bytes(ix->info.dim, p[np].key_len, p[np].meta_len,
					       p[np].fmeta_len);
	}
	/* Capacity: the rows' bytes are admitted before anything is logged (and given back
	 * once they are placed, when they count in s->bytes instead). */
	if (max && __atomic_load_n(&s->bytes, __ATOMIC_RELAXED) +
			   __atomic_add_fetch(&s->admitted, need, __ATOMIC_RELAXED) > max) {
		rc = -ENOSPC;
		goto out_unadmit;
	}
	flat_rec_begin(&b);
	flat_enc_put(&b, ix, rows, n);
	pw.rows = p;
	rc = log_and_commit(ix, &b, FLAT_REC_PUT, &pw);
out_unadmit:
	if (max)
		__atomic_sub_fetch(&s->admitted, need, __ATOMIC_RELAXED);
out_free:
	prows_free(p, np);
	dm_buf_free(&b);
	return rc;
}

int flat_delete(struct flat_index *ix, const char *const *keys, size_t n)
{
	struct dm_buf b = { 0 };
	struct flat_pending pw = { .keys = keys, .nkeys = n };
	int rc;

	for (size_t i = 0; i < n; i++)
		if (!key_ok(keys[i]))
			return -EINVAL;
	if (!n || n > UINT32_MAX)
		return n ? -EINVAL : 0;
	flat_rec_begin(&b);
	dm_buf_str(&b, ix->info.bucket);
	dm_buf_str(&b, ix->info.name);
	dm_buf_u32(&b, (uint32_t)n);
	for (size_t i = 0; i < n; i++)
		dm_buf_str(&b, keys[i]);
	rc = log_and_commit(ix, &b, FLAT_REC_DEL, &pw);
	dm_buf_free(&b);
	return rc;
}
