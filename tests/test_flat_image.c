/* test_flat_image.c: a bucket's image and its installation (common/index/flat_image.c, the
 * store's side of the catch-up of a stale replica): an image of a bucket with two indexes,
 * deletes, re-puts, attributes, a graph mark and key log, installed into a store with an
 * older version of the bucket and into one without it, answers like the source (rows by
 * key, lists, mark and key log, attributes), leaves the other buckets alone, counts its
 * bytes, survives a clean close and a crash; an install of nothing drops the bucket; a
 * damaged, cut or foreign image is refused with nothing changed; an image holds every
 * write acknowledged before it was taken; a failed checkpoint makes the store refuse writes.
 * (A file of its own: test_flat.c is long enough.) */
#include <criterion/criterion.h>

#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flat.h"
#include "flat_int.h"      /* record framing (hand-made images) */
#include "util/dm_hash.h"
#include "flat_test_util.h"

static char tdir[64];

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st; (void)flag; (void)f;
	return remove(p);
}

static void setup(void)
{
	snprintf(tdir, sizeof(tdir), "/tmp/dmann-flatimg-XXXXXX");
	cr_assert_not_null(mkdtemp(tdir));
}

static void teardown(void)
{
	nftw(tdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(flat_image, .init = setup, .fini = teardown);

static struct flat_store *open_at(const char *name, uint32_t frag_rows)
{
	char dir[128];
	struct flat_opts o = { .frag_rows = frag_rows };
	struct flat_store *s;

	snprintf(dir, sizeof(dir), "%s/%s", tdir, name);
	s = flat_open(dir, &o);
	cr_assert_not_null(s, "flat_open %s: %s", dir, strerror(errno));
	return s;
}

static void delete_keys(struct flat_index *ix, const unsigned *k, size_t n)
{
	char keys[16][32];
	const char *kp[16];

	for (size_t i = 0; i < n; i++) {
		snprintf(keys[i], 32, "key-%u", k[i]);
		kp[i] = keys[i];
	}
	cr_assert_eq(flat_delete(ix, kp, n), 0);
}

/* ---- what an index answers, to compare two stores ---- */

struct rowcopy {
	char key[32];
	float vec[16];
	char meta[64], fmeta[8];
	uint32_t mlen, flen;
};

struct rows {
	struct rowcopy r[512];
	size_t n;
	uint32_t dim;
	uint64_t bytes;         /* flat_row_bytes of every row seen */
};

static int copy_row(void *ctx, const struct flat_row *row)
{
	struct rows *rs = ctx;
	struct rowcopy *c = &rs->r[rs->n++];

	cr_assert_leq(rs->n, 512);
	cr_assert_lt(strlen(row->key), sizeof(c->key));
	cr_assert_leq(row->meta_len, sizeof(c->meta));
	cr_assert_leq(row->fmeta_len, sizeof(c->fmeta));
	snprintf(c->key, sizeof(c->key), "%s", row->key);
	memcpy(c->vec, row->vec, rs->dim * sizeof(float));
	memcpy(c->meta, row->meta, row->meta_len);
	memcpy(c->fmeta, row->fmeta, row->fmeta_len);
	c->mlen = row->meta_len;
	c->flen = row->fmeta_len;
	rs->bytes += flat_row_bytes(rs->dim, strlen(row->key), row->meta_len, row->fmeta_len);
	return 0;
}

/* Every live row in list order. */
static void list_rows(struct flat_index *ix, struct rows *rs)
{
	uint64_t next = 0;

	memset(rs, 0, sizeof(*rs));
	rs->dim = flat_index_info(ix)->dim;
	while (next != UINT64_MAX)
		flat_list(ix, next, 0, 0, 7, copy_row, rs, &next);   /* in pages of 7 */
}

static bool row_eq(const struct rowcopy *a, const struct rowcopy *b, uint32_t dim)
{
	return !strcmp(a->key, b->key) && !memcmp(a->vec, b->vec, dim * sizeof(float)) &&
	       a->mlen == b->mlen && !memcmp(a->meta, b->meta, a->mlen) && a->flen == b->flen &&
	       !memcmp(a->fmeta, b->fmeta, a->flen);
}

struct glog {
	uint64_t id[256];
	char key[256][32];
	size_t n;
};

static int copy_gkey(void *ctx, uint64_t id, const char *key)
{
	struct glog *g = ctx;

	cr_assert_lt(g->n, 256);
	g->id[g->n] = id;
	snprintf(g->key[g->n++], 32, "%s", key);
	return 0;
}

/* The keys of the live rows below the mark, in row order. */
static size_t marked_keys(struct flat_index *ix, char (*keys)[32], size_t max)
{
	uint64_t mark, tag, rows;
	size_t n = 0;

	flat_mark_get(ix, &mark, &tag);
	flat_index_stats(ix, NULL, &rows, NULL);
	for (uint64_t id = 0; id < mark && id < rows; id++) {
		struct rows one = { .dim = flat_index_info(ix)->dim };

		if (flat_get_ids(ix, &id, 1, copy_row, &one) == 1) {
			cr_assert_lt(n, max);
			snprintf(keys[n++], 32, "%s", one.r[0].key);
		}
	}
	return n;
}

/* Index bucket/x of t answers like that of s: description, rows by key and in list order,
 * the mark's tag and the rows below it, the key log, the index's tags. */
static void same_index(struct flat_store *s, struct flat_store *t, const char *b, const char *x)
{
	struct flat_index *a = flat_index_get(s, b, x), *c = flat_index_get(t, b, x);
	static struct rows ra, rc;
	static struct glog ga, gc;
	static char ka[512][32], kc[512][32];
	const struct flat_index_info *ia, *ic;
	uint64_t ma, ta, mc, tc;
	size_t na, nc;
	char *va, *vc;
	uint32_t la, lc;

	cr_assert_not_null(a, "%s/%s in the source", b, x);
	cr_assert_not_null(c, "%s/%s not installed", b, x);
	ia = flat_index_info(a);
	ic = flat_index_info(c);
	cr_assert_eq(ia->dim, ic->dim);
	cr_assert_eq(ia->metric, ic->metric);
	cr_assert_eq(ia->created_ms, ic->created_ms);
	cr_assert_eq(ia->conf_len, ic->conf_len);
	cr_assert_eq(memcmp(ia->conf, ic->conf, ia->conf_len), 0);
	list_rows(a, &ra);
	list_rows(c, &rc);
	cr_assert_eq(ra.n, rc.n, "%s/%s: %zu rows, %zu installed", b, x, ra.n, rc.n);
	for (size_t i = 0; i < ra.n; i++) {
		struct rows one = { .dim = ia->dim };
		const char *kp = ra.r[i].key;

		cr_assert(row_eq(&ra.r[i], &rc.r[i], ia->dim), "%s/%s: row %zu of the list differs",
			  b, x, i);
		cr_assert_eq(flat_get(c, &kp, 1, copy_row, &one), 1, "%s missing", kp);
		cr_assert(row_eq(&ra.r[i], &one.r[0], ia->dim), "%s differs by key", kp);
	}
	flat_mark_get(a, &ma, &ta);
	flat_mark_get(c, &mc, &tc);
	cr_assert_eq(ta, tc, "mark tags %llu, %llu", (unsigned long long)ta, (unsigned long long)tc);
	na = marked_keys(a, ka, 512);
	nc = marked_keys(c, kc, 512);
	cr_assert_eq(na, nc, "%zu rows below the mark, %zu installed", na, nc);
	cr_assert_eq(mc, nc, "the installed mark counts its live rows");
	for (size_t i = 0; i < na; i++)
		cr_assert_str_eq(ka[i], kc[i]);
	ga.n = gc.n = 0;
	cr_assert_eq(flat_gindex_read(a, 0, 256, copy_gkey, &ga),
		     flat_gindex_read(c, 0, 256, copy_gkey, &gc));
	for (size_t i = 0; i < ga.n; i++) {
		cr_assert_eq(ga.id[i], gc.id[i]);
		cr_assert_str_eq(ga.key[i], gc.key[i]);
	}
	for (uint32_t kind = FLAT_ATTR_TAGS; kind <= FLAT_ATTR_POLICY; kind++) {
		cr_assert_eq(flat_attr_get(s, b, x, kind, &va, &la), 0);
		cr_assert_eq(flat_attr_get(t, b, x, kind, &vc, &lc), 0);
		cr_assert_eq(!va, !vc);
		cr_assert(!va || (la == lc && !memcmp(va, vc, la)));
		free(va);
		free(vc);
	}
	flat_index_put(a);
	flat_index_put(c);
}

/* Bucket b of t is that of s: creation time, index names, each index, the attributes. */
static void same_bucket(struct flat_store *s, struct flat_store *t, const char *b)
{
	struct flat_bucket_info bs, bt;
	char ns[8][FLAT_NAME_MAX + 1], nt[8][FLAT_NAME_MAX + 1];
	bool more;
	int n;
	char *va, *vc;
	uint32_t la, lc;

	cr_assert_eq(flat_bucket_get(s, b, &bs), 0);
	cr_assert_eq(flat_bucket_get(t, b, &bt), 0, "bucket %s not installed", b);
	cr_assert_eq(bs.created_ms, bt.created_ms);
	n = flat_index_list(s, b, NULL, NULL, 8, ns, &more);
	cr_assert_eq(flat_index_list(t, b, NULL, NULL, 8, nt, &more), n);
	for (int i = 0; i < n; i++) {
		cr_assert_str_eq(ns[i], nt[i]);
		same_index(s, t, b, ns[i]);
	}
	for (uint32_t kind = FLAT_ATTR_TAGS; kind <= FLAT_ATTR_POLICY; kind++) {
		cr_assert_eq(flat_attr_get(s, b, NULL, kind, &va, &la), 0);
		cr_assert_eq(flat_attr_get(t, b, NULL, kind, &vc, &lc), 0);
		cr_assert_eq(!va, !vc);
		cr_assert(!va || (la == lc && !memcmp(va, vc, la)));
		free(va);
		free(vc);
	}
}

static uint64_t index_bytes(struct flat_store *s, const char *b, const char *x)
{
	struct flat_index *ix = flat_index_get(s, b, x);
	static struct rows rs;

	cr_assert_not_null(ix);
	list_rows(ix, &rs);
	flat_index_put(ix);
	return rs.bytes;
}

static uint64_t usage(struct flat_store *s)
{
	uint64_t used, max;

	flat_store_usage(s, &used, &max);
	return used;
}

/* The source: bucket b (indexes i1 with deletes, re-puts, a mark and a key log, i2 with a
 * delete, attributes on both levels) and bucket o beside it. */
static struct flat_store *make_source(void)
{
	struct flat_store *s = open_at("src", 16);
	struct flat_gentry e[8];
	char keys[8][32];
	float v[8];
	uint64_t mark, rows;
	struct flat_index *ix;

	cr_assert_eq(flat_bucket_create(s, "b", 11), 0);
	cr_assert_eq(flat_bucket_create(s, "o", 12), 0);
	cr_assert_eq(flat_index_create(s, "b", "i1", 8, DM_METRIC_L2, "{\"c\":1}", 7, 21), 0);
	cr_assert_eq(flat_index_create(s, "b", "i2", 4, DM_METRIC_COS, NULL, 0, 22), 0);
	cr_assert_eq(flat_index_create(s, "o", "i1", 8, DM_METRIC_L2, NULL, 0, 23), 0);
	ix = flat_index_get(s, "b", "i1");
	put_range(ix, 0, 60, 1);
	delete_keys(ix, (unsigned[]){ 3, 10 }, 2);
	put_range(ix, 20, 26, 2);                       /* re-puts: rows 20..25 dead */
	flat_index_stats(ix, NULL, &rows, NULL);
	cr_assert_eq(flat_mark_set(ix, rows, 7), 0);
	put_range(ix, 60, 70, 1);                       /* the tail */
	for (unsigned k = 60; k < 66; k++) {
		snprintf(keys[k - 60], 32, "key-%u", k);
		vec_of(k, 1, v, 8);
		e[k - 60] = (struct flat_gentry){ .id = 500 + k, .key = keys[k - 60],
						  .vcrc = flat_vec_crc(v, 8) };
	}
	cr_assert_eq(flat_gindex_add(ix, 7, e, 6, &mark), 0);
	cr_assert_eq(mark, rows + 6);
	delete_keys(ix, (unsigned[]){ 5, 62 }, 2);      /* one below the mark, one in the log */
	flat_index_put(ix);
	ix = flat_index_get(s, "b", "i2");
	put_range(ix, 0, 30, 3);
	delete_keys(ix, (unsigned[]){ 0 }, 1);
	flat_index_put(ix);
	ix = flat_index_get(s, "o", "i1");
	put_range(ix, 0, 5, 5);
	flat_index_put(ix);
	cr_assert_eq(flat_attr_set(s, "b", NULL, FLAT_ATTR_TAGS, "{\"t\":\"1\"}", 9), 0);
	cr_assert_eq(flat_attr_set(s, "b", NULL, FLAT_ATTR_POLICY, "P", 1), 0);
	cr_assert_eq(flat_attr_set(s, "b", "i1", FLAT_ATTR_TAGS, "{}", 2), 0);
	cr_assert_eq(flat_attr_set(s, "o", NULL, FLAT_ATTR_TAGS, "{\"o\":\"1\"}", 9), 0);
	return s;
}

/* The stale target: an older bucket b (i1 with other rows, an extra index, a policy that
 * the source cleared since) and bucket keep that the image must not touch. */
static struct flat_store *make_target(void)
{
	struct flat_store *t = open_at("dst", 32);
	struct flat_index *ix;

	cr_assert_eq(flat_bucket_create(t, "b", 11), 0);
	cr_assert_eq(flat_bucket_create(t, "keep", 13), 0);
	cr_assert_eq(flat_index_create(t, "b", "i1", 8, DM_METRIC_L2, "{\"c\":1}", 7, 21), 0);
	cr_assert_eq(flat_index_create(t, "b", "old", 2, DM_METRIC_L2, NULL, 0, 9), 0);
	cr_assert_eq(flat_index_create(t, "keep", "k", 8, DM_METRIC_L2, NULL, 0, 14), 0);
	ix = flat_index_get(t, "b", "i1");
	put_range(ix, 0, 100, 9);
	flat_index_put(ix);
	ix = flat_index_get(t, "b", "old");
	put_range(ix, 0, 10, 9);
	flat_index_put(ix);
	ix = flat_index_get(t, "keep", "k");
	put_range(ix, 0, 20, 4);
	flat_index_put(ix);
	cr_assert_eq(flat_attr_set(t, "b", "old", FLAT_ATTR_TAGS, "{\"x\":\"y\"}", 9), 0);
	cr_assert_eq(flat_attr_set(t, "b", "i1", FLAT_ATTR_POLICY, "stale", 5), 0);
	cr_assert_eq(flat_attr_set(t, "keep", NULL, FLAT_ATTR_TAGS, "{\"k\":\"1\"}", 9), 0);
	return t;
}

/* Bucket keep of t is as make_target left it. */
static void keep_intact(struct flat_store *t)
{
	struct flat_index *ix = flat_index_get(t, "keep", "k");
	static struct rows rs;
	char *v;
	uint32_t n;

	cr_assert_not_null(ix, "bucket keep lost its index");
	list_rows(ix, &rs);
	cr_assert_eq(rs.n, 20);
	for (unsigned k = 0; k < 20; k++) {
		float want[8];

		vec_of(k, 4, want, 8);
		cr_assert_eq(memcmp(rs.r[k].vec, want, sizeof(want)), 0);
	}
	flat_index_put(ix);
	cr_assert_eq(flat_attr_get(t, "keep", NULL, FLAT_ATTR_TAGS, &v, &n), 0);
	cr_assert_not_null(v);
	cr_assert_str_eq(v, "{\"k\":\"1\"}");
	free(v);
}

Test(flat_image, install_replaces_a_stale_bucket)
{
	struct flat_store *s = make_source(), *t = make_target(), *u;
	uint64_t b_bytes, keep_bytes, img_bytes;
	struct flat_index *old;
	uint8_t *img;
	size_t len;
	char *v;
	uint32_t n;

	cr_assert_eq(flat_bucket_image(s, "nope", &img, &len), -ENOENT);
	cr_assert_eq(flat_bucket_image(s, "b", &img, &len), 0);
	cr_assert_gt(len, 8);
	cr_assert_eq(memcmp(img, "DMFLIMG1", 8), 0);
	keep_bytes = index_bytes(t, "keep", "k");
	img_bytes = index_bytes(s, "b", "i1") + index_bytes(s, "b", "i2");

	/* A reader's handle to the old index stays readable; its writes fail. */
	old = flat_index_get(t, "b", "i1");
	cr_assert_eq(flat_bucket_install(t, "b", img, len), 0);
	same_bucket(s, t, "b");
	cr_assert_null(flat_index_get(t, "b", "old"), "the extra index survived");
	cr_assert_eq(errno, ENOENT);
	cr_assert_eq(flat_attr_get(t, "b", "i1", FLAT_ATTR_POLICY, &v, &n), 0);
	cr_assert_null(v, "the stale attribute survived");
	cr_assert_eq(flat_bucket_get(t, "o", NULL), -ENOENT, "another bucket of the source came");
	keep_intact(t);
	cr_assert_eq(flat_put(old, &(struct flat_row_in){ "z", (float[8]){ 0 }, NULL, 0, NULL, 0 },
			      1), -ENOENT);
	{
		const char *kp = "key-99";
		struct rows one = { .dim = 8 };

		cr_assert_eq(flat_get(old, &kp, 1, copy_row, &one), 1, "the old handle reads");
	}
	cr_assert_gt(usage(t), keep_bytes + img_bytes, "the old index's bytes while held");
	flat_index_put(old);
	cr_assert_eq(usage(t), keep_bytes + img_bytes, "usage %llu, want %llu",
		     (unsigned long long)usage(t), (unsigned long long)(keep_bytes + img_bytes));

	/* Durable: a crash right after the install, then a clean close, then writes again. */
	flat_abandon(t);
	t = open_at("dst", 32);
	same_bucket(s, t, "b");
	keep_intact(t);
	cr_assert_eq(usage(t), keep_bytes + img_bytes);
	flat_close(t);
	t = open_at("dst", 32);
	same_bucket(s, t, "b");
	keep_intact(t);
	{
		struct flat_index *a = flat_index_get(s, "b", "i2"), *c = flat_index_get(t, "b", "i2");

		put_range(a, 100, 105, 6);
		put_range(c, 100, 105, 6);
		flat_index_put(a);
		flat_index_put(c);
	}
	flat_abandon(t);                        /* the write after the install from the WAL */
	t = open_at("dst", 32);
	same_bucket(s, t, "b");

	/* Into a store without the bucket; the source's usage once compacted is the same. */
	free(img);
	cr_assert_eq(flat_bucket_image(s, "b", &img, &len), 0);
	u = open_at("new", 8);
	cr_assert_eq(flat_bucket_install(u, "b", img, len), 0);
	same_bucket(s, u, "b");
	b_bytes = usage(u);
	cr_assert_eq(b_bytes, index_bytes(s, "b", "i1") + index_bytes(s, "b", "i2"));
	flat_close(u);
	u = open_at("new", 8);
	same_bucket(s, u, "b");
	cr_assert_eq(usage(u), b_bytes);

	/* An install of nothing drops the bucket (and is a no-op without one). */
	cr_assert_eq(flat_bucket_install(t, "b", NULL, 0), 0);
	cr_assert_eq(flat_bucket_get(t, "b", NULL), -ENOENT);
	cr_assert_eq(flat_attr_get(t, "b", NULL, FLAT_ATTR_TAGS, &v, &n), -ENOENT);
	cr_assert_eq(usage(t), keep_bytes);
	cr_assert_eq(flat_bucket_install(t, "b", NULL, 0), 0);
	flat_abandon(t);
	t = open_at("dst", 32);
	cr_assert_eq(flat_bucket_get(t, "b", NULL), -ENOENT);
	keep_intact(t);
	cr_assert_eq(usage(t), keep_bytes);
	free(img);
	flat_close(t);
	flat_close(u);
	flat_close(s);
}

/* A catalog snapshot of t: bucket names, index names and row counts, usage, WAL bytes. */
static void fingerprint(struct flat_store *t, char *out, size_t cap)
{
	struct flat_bucket_info bi[8];
	size_t at = 0;
	bool more;
	int nb = flat_bucket_list(t, NULL, NULL, 8, bi, &more);

	at += (size_t)snprintf(out + at, cap - at, "%llu %llu|", (unsigned long long)usage(t),
			       (unsigned long long)flat_wal_bytes(t));
	for (int i = 0; i < nb; i++) {
		char names[8][FLAT_NAME_MAX + 1];
		int nx = flat_index_list(t, bi[i].name, NULL, NULL, 8, names, &more);

		at += (size_t)snprintf(out + at, cap - at, "%s:", bi[i].name);
		for (int j = 0; j < nx; j++) {
			struct flat_index *ix = flat_index_get(t, bi[i].name, names[j]);
			uint64_t live, rows, mark, tag;

			flat_index_stats(ix, &live, &rows, NULL);
			flat_mark_get(ix, &mark, &tag);
			at += (size_t)snprintf(out + at, cap - at, "%s=%llu/%llu/%llu ", names[j],
					       (unsigned long long)live, (unsigned long long)rows,
					       (unsigned long long)mark);
			flat_index_put(ix);
		}
	}
}

/* Hand-made images: magic, name, the records (type, bucket named first, then a u64). */
static size_t craft(uint8_t *out, const char *name, const uint32_t *types,
		    const char *const *buckets, size_t n, uint64_t end)
{
	struct dm_buf w = { 0 }, r = { 0 };
	size_t len;

	dm_buf_put(&w, "DMFLIMG1", 8);
	dm_buf_str(&w, name);
	for (size_t i = 0; i < n; i++) {
		flat_rec_begin(&r);
		dm_buf_str(&r, buckets[i]);
		if (types[i] == FLAT_REC_DEL) {
			dm_buf_str(&r, "i");
			dm_buf_u32(&r, 0);
		} else {
			dm_buf_u64(&r, 5);
		}
		flat_rec_frame(&r, 0, types[i], 0);
		dm_buf_put(&w, r.p, r.n);
	}
	flat_rec_begin(&r);
	dm_buf_u64(&r, end);
	flat_rec_frame(&r, 0, FLAT_REC_SNAP_END, 0);
	dm_buf_put(&w, r.p, r.n);
	len = w.n;
	memcpy(out, w.p, len);
	dm_buf_free(&w);
	dm_buf_free(&r);
	return len;
}

Test(flat_image, bad_images_change_nothing)
{
	struct flat_store *s = make_source(), *t = make_target();
	static char before[4096], after[4096];
	uint8_t *img, *bad, hand[512];
	size_t len, n, tried = 0;

	cr_assert_eq(flat_bucket_image(s, "b", &img, &len), 0);
	bad = malloc(len);
	fingerprint(t, before, sizeof(before));
	/* Every byte flipped (a stride through the image: every field kind is hit). */
	for (size_t at = 0; at < len; at += 1 + at % 13, tried++) {
		memcpy(bad, img, len);
		bad[at] ^= (uint8_t)(1u << (at % 8));
		cr_assert_eq(flat_bucket_install(t, "b", bad, len), -EBADMSG, "byte %zu flipped", at);
	}
	cr_assert_gt(tried, 200);
	/* Cut short anywhere, or longer. */
	for (size_t cut = 1; cut < len; cut += 1 + cut / 3)
		cr_assert_eq(flat_bucket_install(t, "b", img, cut), -EBADMSG, "cut at %zu", cut);
	bad = realloc(bad, len + 1);
	memcpy(bad, img, len);
	bad[len] = 0;
	cr_assert_eq(flat_bucket_install(t, "b", bad, len + 1), -EBADMSG, "a byte past the end");
	/* The image of b installed as another bucket. */
	cr_assert_eq(flat_bucket_install(t, "keep", img, len), -EBADMSG);
	cr_assert_eq(flat_bucket_install(t, "c", img, len), -EBADMSG);
	cr_assert_eq(flat_bucket_install(t, "", img, len), -EINVAL);
	/* Well-framed records that an image may not hold: another bucket, a delete, a count
	 * off by one, a second bucket record, no bucket record. */
	n = craft(hand, "b", (uint32_t[]){ FLAT_REC_BUCKET_CREATE, FLAT_REC_BUCKET_CREATE },
		  (const char *[]){ "b", "x" }, 2, 2);
	cr_assert_eq(flat_bucket_install(t, "b", hand, n), -EBADMSG, "a record of bucket x");
	n = craft(hand, "b", (uint32_t[]){ FLAT_REC_BUCKET_CREATE, FLAT_REC_DEL },
		  (const char *[]){ "b", "b" }, 2, 2);
	cr_assert_eq(flat_bucket_install(t, "b", hand, n), -EBADMSG, "a DEL record");
	n = craft(hand, "b", (uint32_t[]){ FLAT_REC_BUCKET_CREATE }, (const char *[]){ "b" }, 1,
		  2);
	cr_assert_eq(flat_bucket_install(t, "b", hand, n), -EBADMSG, "the count");
	n = craft(hand, "b", (uint32_t[]){ FLAT_REC_BUCKET_CREATE, FLAT_REC_BUCKET_CREATE },
		  (const char *[]){ "b", "b" }, 2, 2);
	cr_assert_eq(flat_bucket_install(t, "b", hand, n), -EBADMSG, "two bucket records");
	n = craft(hand, "b", NULL, NULL, 0, 0);
	cr_assert_eq(flat_bucket_install(t, "b", hand, n), -EBADMSG, "no bucket record");
	fingerprint(t, after, sizeof(after));
	cr_assert_str_eq(before, after);
	keep_intact(t);
	/* The smallest good image: an empty bucket (created at 5). */
	n = craft(hand, "b", (uint32_t[]){ FLAT_REC_BUCKET_CREATE }, (const char *[]){ "b" }, 1,
		  1);
	cr_assert_eq(flat_bucket_install(t, "b", hand, n), 0);
	{
		struct flat_bucket_info bi;
		char names[2][FLAT_NAME_MAX + 1];
		bool more;

		cr_assert_eq(flat_bucket_get(t, "b", &bi), 0);
		cr_assert_eq(bi.created_ms, 5);
		cr_assert_eq(flat_index_list(t, "b", NULL, NULL, 2, names, &more), 0);
	}
	cr_assert_eq(usage(t), index_bytes(t, "keep", "k"));
	free(bad);
	free(img);
	flat_close(t);
	flat_close(s);
}

/* An image holds every write acknowledged before it was taken, while writers go on (the
 * bucket's own and another bucket's). */
struct writer {
	struct flat_index *ix;
	unsigned acked;                 /* keys key-0..acked-1 are acknowledged */
	bool stop;
};

static void *write_loop(void *p)
{
	struct writer *w = p;

	for (unsigned k = 0; !__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE) && k < 100000; k++) {
		put_range(w->ix, k, k + 1, 1);
		__atomic_store_n(&w->acked, k + 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static int count_rows(void *ctx, const struct flat_row *r)
{
	(void)r;
	++*(unsigned *)ctx;
	return 0;
}

Test(flat_image, image_holds_every_acknowledged_write)
{
	struct flat_opts o = { .frag_rows = 64, .no_sync = true };
	char dir[128];
	struct flat_store *s, *t;
	struct writer w[2] = { 0 };
	pthread_t th[2];

	snprintf(dir, sizeof(dir), "%s/src", tdir);
	s = flat_open(dir, &o);
	cr_assert_not_null(s);
	t = open_at("dst", 16);
	cr_assert_eq(flat_bucket_create(s, "b", 1), 0);
	cr_assert_eq(flat_bucket_create(s, "o", 1), 0);
	cr_assert_eq(flat_index_create(s, "b", "i", 4, DM_METRIC_L2, NULL, 0, 1), 0);
	cr_assert_eq(flat_index_create(s, "o", "i", 4, DM_METRIC_L2, NULL, 0, 1), 0);
	w[0].ix = flat_index_get(s, "b", "i");
	w[1].ix = flat_index_get(s, "o", "i");
	for (int i = 0; i < 2; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, write_loop, &w[i]), 0);
	for (int round = 0; round < 20; round++) {
		unsigned acked = __atomic_load_n(&w[0].acked, __ATOMIC_ACQUIRE), found = 0;
		uint64_t next = 0;
		struct flat_index *ix;
		uint8_t *img;
		size_t len;

		cr_assert_eq(flat_bucket_image(s, "b", &img, &len), 0);
		cr_assert_eq(flat_bucket_install(t, "b", img, len), 0);
		free(img);
		ix = flat_index_get(t, "b", "i");
		while (next != UINT64_MAX)
			flat_list(ix, next, 0, 0, 100000, count_rows, &found, &next);
		for (unsigned k = 0; k < acked; k++) {
			char key[32];
			const char *kp = key;

			snprintf(key, sizeof(key), "key-%u", k);
			cr_assert_eq(flat_get(ix, &kp, 1, count_rows, &(unsigned){ 0 }), 1,
				     "round %d: acknowledged %s missing", round, key);
		}
		cr_assert_geq(found, acked);
		flat_index_put(ix);
		usleep(2000);
	}
	for (int i = 0; i < 2; i++) {
		__atomic_store_n(&w[i].stop, true, __ATOMIC_RELEASE);
		pthread_join(th[i], NULL);
		flat_index_put(w[i].ix);
	}
	flat_close(t);
	flat_close(s);
}

/* A checkpoint that fails after the bucket was swapped in memory (a directory where the
 * snapshot's temporary file goes): the install returns the error and the store refuses
 * every later write; reopened, it has the old bucket again (what the disk held). */
Test(flat_image, failed_checkpoint_refuses_writes)
{
	struct flat_store *s = make_source(), *t = make_target();
	struct flat_wal_stats ws;
	struct flat_index *ix;
	char tmp[160];
	uint8_t *img;
	size_t len;
	uint64_t rows;

	cr_assert_eq(flat_bucket_image(s, "b", &img, &len), 0);
	snprintf(tmp, sizeof(tmp), "%s/dst/snapshot.tmp", tdir);
	cr_assert_eq(mkdir(tmp, 0755), 0);
	cr_assert_eq(flat_bucket_install(t, "b", img, len), -EISDIR);
	flat_wal_stats(t, &ws);
	cr_assert_eq(ws.error, -EISDIR);
	ix = flat_index_get(t, "keep", "k");
	cr_assert_eq(flat_put(ix, &(struct flat_row_in){ "z", (float[8]){ 0 }, NULL, 0, NULL, 0 },
			      1), -EISDIR, "a write after the failed install");
	flat_index_put(ix);
	cr_assert_eq(flat_bucket_create(t, "new", 1), -EISDIR);
	cr_assert_eq(flat_bucket_install(t, "b", img, len), -EISDIR, "a failed store takes none");
	flat_abandon(t);
	cr_assert_eq(rmdir(tmp), 0);
	t = open_at("dst", 32);
	ix = flat_index_get(t, "b", "old");
	cr_assert_not_null(ix, "the old bucket is back");
	flat_index_put(ix);
	ix = flat_index_get(t, "b", "i1");
	flat_index_stats(ix, NULL, &rows, NULL);
	cr_assert_eq(rows, 100);
	flat_index_put(ix);
	keep_intact(t);
	cr_assert_eq(flat_bucket_install(t, "b", img, len), 0, "and takes the image now");
	same_bucket(s, t, "b");
	free(img);
	flat_close(t);
	flat_close(s);
}
