/* flat_image.c: the image of one bucket of a flat store and its installation (flat.h,
 * flat_bucket_image / flat_bucket_install), the store's side of the catch-up of a stale
 * replica: an image taken on a caught-up replica replaces the bucket on the stale one.
 *
 * An image: "DMFLIMG1", str bucket, then records in the snapshot's framing (flat_snap.c,
 * lsn 0): BUCKET_CREATE, per index INDEX_CREATE + PUT batches of its live rows (compacted,
 * as a snapshot numbers them) + MARK + GINDEX, then ATTR of the bucket and of its indexes,
 * then SNAP_END {u64 records before it}. It is taken with the catalog read-locked and the
 * writers of the bucket's indexes held out once their logged writes are applied, so every
 * write acknowledged before the call is in it; other buckets' writers go on.
 *
 * An install applies the image first to a scratch store in memory (no directory, no WAL)
 * with flat_apply_record, the replay code: that checks every record (framing, CRC, type,
 * the bucket it names, the order of creation, the end's count) and builds the bucket's
 * indexes without touching the store, and without holding anything (the rows are decoded
 * and allocated there). Then, with every writer held out as for a checkpoint, the old
 * bucket is dropped (its indexes as FLAT_REC_INDEX_DELETE replay drops them: handles held
 * by readers stay valid, their writes fail -ENOENT), the scratch store's bucket, indexes
 * and attributes move in (room for them is had first, so nothing can fail half-way), and a
 * checkpoint makes the store durable before the writers go on. */
#include "flat_int.h"

#include <stdlib.h>
#include <string.h>

#define IMG_MAGIC "DMFLIMG1"

static bool name_ok(const char *n)
{
	size_t l = n ? strnlen(n, FLAT_NAME_MAX + 1) : 0;

	return l >= 1 && l <= FLAT_NAME_MAX;
}

/* ---------------------------------------------------------------- image ------------ */

int flat_bucket_image(struct flat_store *s, const char *bucket, uint8_t **out, size_t *len)
{
	struct flat_snapw w = { .fd = -1 };
	ssize_t bi;
	int rc = 0;

	*out = NULL;
	*len = 0;
	if (!name_ok(bucket))
		return -EINVAL;
	pthread_rwlock_rdlock(&s->cat);
	bi = flat_bucket_find(s, bucket);
	if (bi < 0) {
		rc = -ENOENT;
		goto out_unlock_cat;
	}
	/* The catalog cannot change under the read lock, so the bucket's indexes are locked in
	 * catalog order (as a checkpoint locks them all) and unlocked the same way. */
	for (size_t i = 0; i < s->nix; i++) {
		if (strcmp(s->ix[i]->info.bucket, bucket))
			continue;
		pthread_mutex_lock(&s->ix[i]->wmu);
		flat_drain(s->ix[i]);
	}
	dm_buf_put(&w.out, IMG_MAGIC, 8);
	dm_buf_str(&w.out, bucket);
	flat_snap_bucket(&w, &s->buckets[bi]);
	for (size_t i = 0; i < s->nix; i++)
		if (!strcmp(s->ix[i]->info.bucket, bucket))
			flat_snap_index(&w, s->ix[i]);
	for (size_t i = 0; i < s->nattr; i++)
		if (!strcmp(s->attrs[i].bucket, bucket))
			flat_snap_attr(&w, &s->attrs[i]);
	flat_snap_end(&w);
	for (size_t i = 0; i < s->nix; i++)
		if (!strcmp(s->ix[i]->info.bucket, bucket))
			pthread_mutex_unlock(&s->ix[i]->wmu);
	rc = w.rc ? w.rc : (w.out.oom ? -ENOMEM : 0);
out_unlock_cat:
	pthread_rwlock_unlock(&s->cat);
	dm_buf_free(&w.rec);
	if (rc) {
		dm_buf_free(&w.out);
		return rc;
	}
	*out = w.out.p;
	*len = w.out.n;
	return 0;
}

/* ---------------------------------------------------------------- install ---------- */

static bool type_ok(uint32_t t)
{
	return t == FLAT_REC_BUCKET_CREATE || t == FLAT_REC_INDEX_CREATE || t == FLAT_REC_PUT ||
	       t == FLAT_REC_MARK || t == FLAT_REC_GINDEX || t == FLAT_REC_ATTR;
}

/* Every record type of an image starts with the name of its bucket. */
static bool names_bucket(const struct flat_rec *r, const char *bucket)
{
	struct dm_rbuf rd = { .p = r->payload, .n = r->len };
	char b[FLAT_NAME_MAX + 1];

	return flat_rd_name(&rd, b, FLAT_NAME_MAX) && !strcmp(b, bucket);
}

/* Apply the image to the scratch store sc: 0 once it holds exactly the image's bucket,
 * -EBADMSG or -ENOMEM. */
static int image_build(struct flat_store *sc, const char *bucket, const uint8_t *img,
		       size_t len)
{
	struct dm_rbuf rd = { .p = img, .n = len };
	char name[FLAT_NAME_MAX + 1];
	uint64_t nrec = 0;
	size_t off;

	if (len < 8 || memcmp(img, IMG_MAGIC, 8))
		return -EBADMSG;
	rd.at = 8;
	if (!flat_rd_name(&rd, name, FLAT_NAME_MAX) || strcmp(name, bucket))
		return -EBADMSG;
	off = rd.at;
	for (;;) {
		struct flat_rec r;
		int rc;

		if (flat_rec_parse(img + off, len - off, &r) != 1)
			return -EBADMSG;
		off += FLAT_REC_HDR + r.len;
		if (r.type == FLAT_REC_SNAP_END) {
			struct dm_rbuf e = { .p = r.payload, .n = r.len };
			uint64_t want = dm_rbuf_u64(&e);

			return !e.bad && e.at == e.n && want == nrec && off == len && sc->nb == 1 ?
			       0 : -EBADMSG;
		}
		if (!type_ok(r.type) || !names_bucket(&r, bucket))
			return -EBADMSG;
		nrec++;
		rc = flat_apply_record(sc, r.type, r.payload, r.len);
		if (rc)
			return rc == -ENOMEM ? rc : -EBADMSG;
	}
}

/* Room in s's arrays for n more entries of elem bytes (*arr, *cap): 0 or -ENOMEM. */
static int room_for(void **arr, size_t used, size_t n, size_t *cap, size_t elem)
{
	while (*cap < used + n)
		if (flat_grow(arr, *cap, cap, elem))
			return -ENOMEM;
	return 0;
}

/* Room for everything sc holds (writers held out): nothing is dropped before this. */
static int install_room(struct flat_store *s, struct flat_store *sc)
{
	if (!sc)
		return 0;
	if (room_for((void **)&s->ix, s->nix, sc->nix, &s->capix, sizeof(*s->ix)) ||
	    room_for((void **)&s->buckets, s->nb, 1, &s->capb, sizeof(*s->buckets)))
		return -ENOMEM;
	return flat_attr_reserve_n(s, sc->nattr);
}

/* Drop the bucket, its indexes and its attributes (writers held out). An index leaves the
 * held set (its wmu unlocked) before the catalog lets go of it. */
static void bucket_drop(struct flat_store *s, const char *bucket)
{
	ssize_t bi;

	for (size_t i = s->nix; i-- > 0;) {
		struct flat_index *ix = s->ix[i];

		if (strcmp(ix->info.bucket, bucket))
			continue;
		ix->deleted = true;
		pthread_mutex_unlock(&ix->wmu);
		flat_cat_drop_index(s, i);  /* moves the last entry (already seen) to i */
	}
	flat_attr_drop_bucket(s, bucket);
	bi = flat_bucket_find(s, bucket);
	if (bi >= 0)
		s->buckets[bi] = s->buckets[--s->nb];
}

/* Move sc's bucket, indexes (their bytes now counted in s) and attributes into s (room
 * had, writers held out: the new indexes join the held set). */
static void bucket_move(struct flat_store *s, struct flat_store *sc)
{
	flat_cat_add_bucket(s, sc->buckets[0].name, sc->buckets[0].created_ms);
	for (size_t i = 0; i < sc->nix; i++) {
		struct flat_index *ix = sc->ix[i];

		ix->s = s;
		__atomic_sub_fetch(&sc->bytes, ix->bytes, __ATOMIC_RELAXED);
		__atomic_add_fetch(&s->bytes, ix->bytes, __ATOMIC_RELAXED);
		pthread_mutex_lock(&ix->wmu);
		flat_cat_add_index(s, ix);
	}
	sc->nix = 0;
	flat_attr_move(s, sc);
}

int flat_bucket_install(struct flat_store *s, const char *bucket, const uint8_t *img,
			size_t len)
{
	struct flat_store *sc = NULL;
	int rc;

	if (!name_ok(bucket) || (len && !img))
		return -EINVAL;
	if (len) {
		sc = flat_store_new(&s->o);
		if (!sc)
			return -ENOMEM;
		rc = image_build(sc, bucket, img, len);
		if (rc)
			goto out_free_scratch;
	}
	pthread_mutex_lock(&s->ckmu);
	flat_writers_hold(s);
	pthread_mutex_lock(&s->walmu);
	rc = s->wal_err;                /* a failed store takes nothing: not even this */
	pthread_mutex_unlock(&s->walmu);
	if (!rc)
		rc = install_room(s, sc);
	if (rc || (!sc && flat_bucket_find(s, bucket) < 0))
		goto out_release;
	bucket_drop(s, bucket);
	if (sc)
		bucket_move(s, sc);
	rc = flat_checkpoint_held(s);
	if (rc) {
		/* Memory holds the image, the disk the old bucket: take no more writes, a
		 * restart brings the old bucket back (and the catch-up can run again). */
		pthread_mutex_lock(&s->walmu);
		if (!s->wal_err)
			s->wal_err = rc;
		pthread_cond_broadcast(&s->walcv);
		pthread_mutex_unlock(&s->walmu);
		dm_err("flat: %s: the install of bucket %s could not be made durable: %s; "
		       "refusing writes", s->dir, bucket, strerror(-rc));
	}
out_release:
	flat_writers_release(s);
	pthread_mutex_unlock(&s->ckmu);
out_free_scratch:
	flat_store_free(sc);
	return rc;
}
