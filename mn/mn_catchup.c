/* mn_catchup.c: the memory node's side of the catch-up of a stale replica of an S3 bucket
 * (wire.h FL_IMAGE, FL_CATCHUP; the store's side is common/index/flat_image.c).
 *
 * On a caught-up replica (the source), FL_IMAGE TAKE keeps an image of the bucket in memory
 * (at most MN_IMAGES_MAX at once) for READs in pieces, until DROP or DM_FL_IMAGE_IDLE_S
 * seconds without a READ (checked on every FL_IMAGE call). On the stale replica, FL_CATCHUP
 * BEGIN starts a log of every write request that names the bucket (appended after the
 * request ran, whatever its outcome: a write the stale store refused, e.g. to an index it
 * does not have yet, may apply once the image is in); DATA collects the image; END holds
 * every write of the store out (mn_flat.wlock, exclusive), installs the image, changes the
 * store's epoch (compute nodes cache fragments by it), runs the logged requests again in
 * their order through the same handlers, and lets writes go on. A catch-up idle for
 * DM_FL_IMAGE_IDLE_S, replaced by a new BEGIN of its bucket, aborted, ended (whatever the
 * outcome), or whose log could not grow is dropped: its id is unknown (-ESTALE) then. */
#include "mn_flat_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

unsigned mn_flat_idle_s = DM_FL_IMAGE_IDLE_S;

void mn_cu_init(struct mn_cu *c)
{
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->mu, NULL);
	if (getrandom(&c->next_id, sizeof(c->next_id), 0) != sizeof(c->next_id))
		c->next_id = dm_now_ns();
}

static void image_free(struct mn_image *im)
{
	free(im->p);
	memset(im, 0, sizeof(*im));
}

static void catchup_free(struct mn_catchup *cu)
{
	if (!cu)
		return;
	dm_buf_free(&cu->img);
	dm_buf_free(&cu->log);
	free(cu);
}

/* Take catch-up slot i out of the table (mu held); the caller frees it. */
static struct mn_catchup *catchup_take(struct mn_cu *c, size_t i)
{
	struct mn_catchup *cu = c->cu[i];

	c->cu[i] = NULL;
	__atomic_sub_fetch(&c->ncu, 1, __ATOMIC_SEQ_CST);
	return cu;
}

void mn_cu_fini(struct mn_cu *c)
{
	for (size_t i = 0; i < MN_IMAGES_MAX; i++)
		image_free(&c->img[i]);
	for (size_t i = 0; i < MN_CATCHUPS_MAX; i++)
		if (c->cu[i])
			catchup_free(catchup_take(c, i));
	pthread_mutex_destroy(&c->mu);
}

/* A new id (mu held): never 0. */
static uint64_t new_id(struct mn_cu *c)
{
	if (!++c->next_id)
		c->next_id = 1;
	return c->next_id;
}

/* Drop images and catch-ups idle too long (mu held). */
static void expire(struct mn_flat *f)
{
	struct mn_cu *c = &f->cu;
	uint64_t now = dm_now_ns(), idle = (uint64_t)mn_flat_idle_s * 1000000000ull;

	for (size_t i = 0; i < MN_IMAGES_MAX; i++)
		if (c->img[i].id && now > c->img[i].used_ns + idle) {
			dm_warn("mn%u: image %016llx of bucket %s idle for %u s: freed", f->node_id,
				(unsigned long long)c->img[i].id, c->img[i].bucket, mn_flat_idle_s);
			image_free(&c->img[i]);
		}
	for (size_t i = 0; i < MN_CATCHUPS_MAX; i++)
		if (c->cu[i] && now > c->cu[i]->used_ns + idle) {
			dm_warn("mn%u: catch-up %016llx of bucket %s idle for %u s: dropped",
				f->node_id, (unsigned long long)c->cu[i]->id, c->cu[i]->bucket,
				mn_flat_idle_s);
			catchup_free(catchup_take(c, i));
		}
}

static struct mn_image *image_find(struct mn_cu *c, uint64_t id)
{
	for (size_t i = 0; id && i < MN_IMAGES_MAX; i++)
		if (c->img[i].id == id)
			return &c->img[i];
	return NULL;
}

static ssize_t catchup_find(struct mn_cu *c, uint64_t id)
{
	for (size_t i = 0; id && i < MN_CATCHUPS_MAX; i++)
		if (c->cu[i] && c->cu[i]->id == id)
			return (ssize_t)i;
	return -1;
}

/* A bucket name field: 1..FLAT_NAME_MAX bytes. */
static bool rd_bucket(struct dm_rbuf *in, char *b)
{
	return dm_rbuf_str(in, b, FLAT_NAME_MAX + 1) && b[0];
}

/* ---------------------------------------------------------------- FL_IMAGE --------- */

static int image_take(struct mn_flat *f, struct dm_rbuf *in, struct dm_buf *out)
{
	struct mn_cu *c = &f->cu;
	struct mn_image *slot = NULL;
	char b[FLAT_NAME_MAX + 1];
	uint8_t *img;
	size_t len;
	int rc;

	if (!rd_bucket(in, b) || in->at != in->n)
		return -EBADMSG;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; !slot && i < MN_IMAGES_MAX; i++)
		slot = c->img[i].id ? NULL : &c->img[i];
	pthread_mutex_unlock(&c->mu);
	if (!slot)
		return -EBUSY;
	/* Taken outside mu (it waits for the bucket's writers); a slot is looked for again. */
	rc = flat_bucket_image(f->st, b, &img, &len);
	if (rc)
		return rc;
	pthread_mutex_lock(&c->mu);
	slot = NULL;
	for (size_t i = 0; !slot && i < MN_IMAGES_MAX; i++)
		slot = c->img[i].id ? NULL : &c->img[i];
	if (slot) {
		*slot = (struct mn_image){ .id = new_id(c), .p = img, .len = len,
					   .used_ns = dm_now_ns() };
		snprintf(slot->bucket, sizeof(slot->bucket), "%s", b);
		dm_buf_u64(out, slot->id);
		dm_buf_u64(out, len);
		dm_info("mn%u: image %016llx of bucket %s taken (%zu bytes)", f->node_id,
			(unsigned long long)slot->id, b, len);
	}
	pthread_mutex_unlock(&c->mu);
	if (!slot) {
		free(img);
		return -EBUSY;
	}
	__atomic_add_fetch(&c->n_images, 1, __ATOMIC_RELAXED);
	return 0;
}

static int image_read(struct mn_flat *f, struct dm_rbuf *in, struct dm_buf *out)
{
	struct mn_cu *c = &f->cu;
	struct mn_image *im;
	uint64_t id = dm_rbuf_u64(in), off = dm_rbuf_u64(in);
	uint32_t max = dm_rbuf_u32(in);
	int rc = 0;

	if (in->bad || in->at != in->n)
		return -EBADMSG;
	if (!max || max > DM_FL_IMAGE_CHUNK)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	im = image_find(c, id);
	if (!im) {
		rc = -ESTALE;
	} else if (off > im->len) {
		rc = -EINVAL;
	} else {
		dm_buf_bytes(out, im->p + off, DM_MIN((uint64_t)max, im->len - off));
		im->used_ns = dm_now_ns();
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int mn_image_handle(struct mn_flat *f, const uint8_t *req, size_t len, struct dm_buf *out)
{
	struct dm_rbuf in = { .p = req, .n = len };
	uint32_t phase = dm_rbuf_u32(&in);
	struct mn_image *im;
	uint64_t id;

	if (in.bad)
		return -EBADMSG;
	pthread_mutex_lock(&f->cu.mu);
	expire(f);
	pthread_mutex_unlock(&f->cu.mu);
	switch (phase) {
	case DM_FL_IMAGE_TAKE:
		return image_take(f, &in, out);
	case DM_FL_IMAGE_READ:
		return image_read(f, &in, out);
	case DM_FL_IMAGE_DROP:
		id = dm_rbuf_u64(&in);
		if (in.bad || in.at != in.n)
			return -EBADMSG;
		pthread_mutex_lock(&f->cu.mu);
		im = image_find(&f->cu, id);
		if (im)
			image_free(im);
		pthread_mutex_unlock(&f->cu.mu);
		return 0;
	default:
		return -EBADMSG;
	}
}

/* ---------------------------------------------------------------- FL_CATCHUP ------- */

static int catchup_begin(struct mn_flat *f, struct dm_rbuf *in, struct dm_buf *out)
{
	struct mn_cu *c = &f->cu;
	struct mn_catchup *cu, *old = NULL;
	char b[FLAT_NAME_MAX + 1];
	ssize_t slot = -1;

	if (!rd_bucket(in, b) || in->at != in->n)
		return -EBADMSG;
	cu = calloc(1, sizeof(*cu));
	if (!cu)
		return -ENOMEM;
	snprintf(cu->bucket, sizeof(cu->bucket), "%s", b);
	cu->used_ns = dm_now_ns();
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < MN_CATCHUPS_MAX; i++) {
		if (c->cu[i] && !strcmp(c->cu[i]->bucket, b)) {
			old = catchup_take(c, i);       /* one catch-up per bucket */
			slot = (ssize_t)i;
			break;
		}
		if (!c->cu[i] && slot < 0)
			slot = (ssize_t)i;
	}
	if (slot >= 0) {
		cu->id = new_id(c);
		c->cu[slot] = cu;
		__atomic_add_fetch(&c->ncu, 1, __ATOMIC_SEQ_CST);
		dm_buf_u64(out, cu->id);
		dm_info("mn%u: catch-up %016llx of bucket %s begun: its writes are logged%s",
			f->node_id, (unsigned long long)cu->id, b,
			old ? " (it replaces an older one)" : "");
	}
	pthread_mutex_unlock(&c->mu);
	catchup_free(old);
	if (slot < 0) {
		free(cu);
		return -EBUSY;
	}
	return 0;
}

static int catchup_data(struct mn_flat *f, struct dm_rbuf *in)
{
	struct mn_cu *c = &f->cu;
	uint64_t id = dm_rbuf_u64(in), off = dm_rbuf_u64(in);
	uint32_t n;
	const void *p = dm_rbuf_bytes(in, &n, DM_FL_IMAGE_CHUNK);
	struct mn_catchup *cu;
	ssize_t i;
	int rc = 0;

	if (in->bad || in->at != in->n)
		return -EBADMSG;
	pthread_mutex_lock(&c->mu);
	i = catchup_find(c, id);
	cu = i >= 0 ? c->cu[i] : NULL;
	if (!cu) {
		rc = -ESTALE;
	} else if (off != cu->img.n) {
		rc = -EINVAL;
	} else if (cu->img.n + n > DM_FL_IMAGE_MAX) {
		rc = -EFBIG;
	} else {
		dm_buf_put(&cu->img, p, n);
		if (cu->img.oom) {
			cu->img.oom = false;    /* the bytes so far stay: the piece may come again */
			rc = -ENOMEM;
		}
		cu->used_ns = dm_now_ns();
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

/* The bucket's indexes and live rows (for the log line). */
static void bucket_counts(struct mn_flat *f, const char *b, uint64_t *nix, uint64_t *rows)
{
	char names[64][FLAT_NAME_MAX + 1], after[FLAT_NAME_MAX + 1] = "";
	bool more = true;

	*nix = *rows = 0;
	while (more) {
		int n = flat_index_list(f->st, b, NULL, after[0] ? after : NULL, 64, names, &more);

		for (int i = 0; i < n; i++) {
			struct flat_index *ix = flat_index_get(f->st, b, names[i]);
			uint64_t live = 0;

			if (ix) {
				flat_index_stats(ix, &live, NULL, NULL);
				flat_index_put(ix);
			}
			(*nix)++;
			*rows += live;
		}
		if (n <= 0)
			break;
		memcpy(after, names[n - 1], sizeof(after));
	}
}

/* Run the logged requests again in their order (wlock held exclusive): how many, and how
 * many of them failed (an error, or an S3 error status). */
static void rerun(struct mn_flat *f, const struct mn_catchup *cu, uint64_t *failed)
{
	struct dm_rbuf rd = { .p = cu->log.p, .n = cu->log.n };
	struct dm_buf out = { 0 };

	*failed = 0;
	while (rd.at < rd.n) {
		uint16_t op = dm_rbuf_u16(&rd);
		uint32_t len = dm_rbuf_u32(&rd), msg = 0;
		const uint8_t *req = dm_rbuf_get(&rd, len);
		int rc;

		if (rd.bad)
			break;                  /* cannot be: the log is ours */
		dm_buf_reset(&out);
		rc = mn_flat_run(f, op, req, len, &out, &msg);
		if (rc || (op == DM_OP_FL_CALL && (out.n < 2 || dm_get_le16(out.p) >= 300)))
			(*failed)++;
	}
	dm_buf_free(&out);
}

static int catchup_end(struct mn_flat *f, struct dm_rbuf *in)
{
	struct mn_cu *c = &f->cu;
	uint64_t id = dm_rbuf_u64(in), epoch, nix, rows, failed = 0;
	const uint8_t *ex = dm_rbuf_get(in, 1);
	struct mn_catchup *cu = NULL;
	ssize_t i;
	int rc;

	if (in->bad || in->at != in->n || *ex > 1)
		return -EBADMSG;
	pthread_rwlock_wrlock(&f->wlock);
	pthread_mutex_lock(&c->mu);
	expire(f);
	i = catchup_find(c, id);
	if (i >= 0)
		cu = catchup_take(c, i);       /* ended, whatever the outcome */
	pthread_mutex_unlock(&c->mu);
	if (!cu) {
		rc = -ESTALE;
		goto out_unlock;
	}
	if (*ex && !cu->img.n)
		rc = -EBADMSG;                  /* an image of nothing: no bucket record */
	else
		rc = flat_bucket_install(f->st, cu->bucket, *ex ? cu->img.p : NULL,
					 *ex ? cu->img.n : 0);
	if (rc) {
		dm_err("mn%u: catch-up %016llx of bucket %s: the image (%zu bytes) was not "
		       "installed: %s", f->node_id, (unsigned long long)id, cu->bucket, cu->img.n,
		       strerror(-rc));
		goto out_unlock;
	}
	/* The bucket's rows are numbered anew: compute nodes must not mix them with fragments
	 * cached before (the logged writes below are ordinary appends). */
	do {
		if (getrandom(&epoch, sizeof(epoch), 0) != sizeof(epoch))
			epoch = dm_now_ns();
	} while (epoch == __atomic_load_n(&f->epoch, __ATOMIC_ACQUIRE));
	__atomic_store_n(&f->epoch, epoch, __ATOMIC_RELEASE);
	bucket_counts(f, cu->bucket, &nix, &rows);
	rerun(f, cu, &failed);
	__atomic_add_fetch(&c->n_installed, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&c->n_rerun, cu->nlog, __ATOMIC_RELAXED);
	dm_info("mn%u: catch-up %016llx of bucket %s installed: %s%zu bytes, %llu indexes, %llu "
		"rows; %llu logged writes run again (%llu failed); epoch %016llx", f->node_id,
		(unsigned long long)id, cu->bucket, *ex ? "" : "no such bucket at the source, ",
		cu->img.n, (unsigned long long)nix, (unsigned long long)rows,
		(unsigned long long)cu->nlog, (unsigned long long)failed,
		(unsigned long long)epoch);
out_unlock:
	pthread_rwlock_unlock(&f->wlock);
	catchup_free(cu);
	return rc;
}

int mn_catchup_handle(struct mn_flat *f, const uint8_t *req, size_t len, struct dm_buf *out)
{
	struct dm_rbuf in = { .p = req, .n = len };
	uint32_t phase = dm_rbuf_u32(&in);
	struct mn_catchup *cu = NULL;
	uint64_t id;
	ssize_t i;

	if (in.bad)
		return -EBADMSG;
	if (phase != DM_FL_CATCHUP_END) {
		pthread_mutex_lock(&f->cu.mu);
		expire(f);
		pthread_mutex_unlock(&f->cu.mu);
	}
	switch (phase) {
	case DM_FL_CATCHUP_BEGIN:
		return catchup_begin(f, &in, out);
	case DM_FL_CATCHUP_DATA:
		return catchup_data(f, &in);
	case DM_FL_CATCHUP_END:
		return catchup_end(f, &in);
	case DM_FL_CATCHUP_ABORT:
		id = dm_rbuf_u64(&in);
		if (in.bad || in.at != in.n)
			return -EBADMSG;
		pthread_mutex_lock(&f->cu.mu);
		i = catchup_find(&f->cu, id);
		if (i >= 0)
			cu = catchup_take(&f->cu, i);
		pthread_mutex_unlock(&f->cu.mu);
		if (cu)
			dm_info("mn%u: catch-up %016llx of bucket %s aborted", f->node_id,
				(unsigned long long)id, cu->bucket);
		catchup_free(cu);
		return 0;
	default:
		return -EBADMSG;
	}
}

/* The bucket a write request names ("" when none). */
static void req_bucket(uint16_t op, const uint8_t *req, size_t len, char *b)
{
	struct dm_rbuf in = { .p = req, .n = len };
	char name[64];
	uint32_t jlen;
	const char *json;

	b[0] = 0;
	if (op != DM_OP_FL_CALL) {              /* FL_MARK, FL_GINDEX: str bucket first */
		if (!rd_bucket(&in, b))
			b[0] = 0;
		return;
	}
	if (!dm_rbuf_str(&in, name, sizeof(name)))
		return;
	json = dm_rbuf_bytes(&in, &jlen, DM_FL_MAX_STREAM);
	if (!in.bad && s3_api_req_bucket(json, jlen, b))
		b[0] = 0;
}

void mn_catchup_note(struct mn_flat *f, uint16_t op, const uint8_t *req, size_t len)
{
	struct mn_cu *c = &f->cu;
	struct mn_catchup *drop = NULL;
	char b[FLAT_NAME_MAX + 1];

	if (!__atomic_load_n(&c->ncu, __ATOMIC_SEQ_CST))
		return;
	req_bucket(op, req, len, b);
	if (!b[0])
		return;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < MN_CATCHUPS_MAX; i++) {
		struct mn_catchup *cu = c->cu[i];
		uint8_t hdr[6];

		if (!cu || strcmp(cu->bucket, b))
			continue;
		dm_put_le16(hdr, op);
		dm_put_le32(hdr + 2, (uint32_t)len);
		if (cu->log.n + sizeof(hdr) + len > DM_FL_IMAGE_MAX)
			cu->log.oom = true;
		dm_buf_put(&cu->log, hdr, sizeof(hdr));
		dm_buf_put(&cu->log, req, len);
		if (cu->log.oom)
			drop = catchup_take(c, i);  /* a write missing from the log: no catch-up */
		else
			cu->nlog++;
		break;
	}
	pthread_mutex_unlock(&c->mu);
	if (drop)
		dm_err("mn%u: catch-up %016llx of bucket %s dropped: its log of writes cannot "
		       "grow (%zu bytes)", f->node_id, (unsigned long long)drop->id, drop->bucket,
		       drop->log.n);
	catchup_free(drop);
}

void mn_catchup_metrics(struct mn_flat *f, FILE *out)
{
	struct mn_cu *c = &f->cu;

	fprintf(out, "# HELP dmann_mn_flat_images_total Bucket images taken for the catch-up of "
		     "another replica (FL_IMAGE).\n"
		     "# TYPE dmann_mn_flat_images_total counter\n"
		     "dmann_mn_flat_images_total{node=\"%u\"} %llu\n"
		     "# HELP dmann_mn_flat_catchups_total Catch-ups of a bucket installed on this "
		     "replica (FL_CATCHUP END).\n"
		     "# TYPE dmann_mn_flat_catchups_total counter\n"
		     "dmann_mn_flat_catchups_total{node=\"%u\"} %llu\n"
		     "# HELP dmann_mn_flat_catchup_writes_total Writes logged during catch-ups and "
		     "run again after the install.\n"
		     "# TYPE dmann_mn_flat_catchup_writes_total counter\n"
		     "dmann_mn_flat_catchup_writes_total{node=\"%u\"} %llu\n",
		f->node_id, (unsigned long long)__atomic_load_n(&c->n_images, __ATOMIC_RELAXED),
		f->node_id, (unsigned long long)__atomic_load_n(&c->n_installed, __ATOMIC_RELAXED),
		f->node_id, (unsigned long long)__atomic_load_n(&c->n_rerun, __ATOMIC_RELAXED));
}
