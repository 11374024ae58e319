/* test_flat.c: the flat-index storage engine (common/index/flat*): catalog,
 * put/get/overwrite/delete, WAL recovery after a simulated crash (a torn tail is dropped, a
 * damaged record that later records show was durable refuses the open), a write that fails
 * before it is logged never comes back, group commit (concurrent writers share fdatasyncs,
 * every acknowledged write survives), snapshot + WAL, exact scans against brute force
 * (single query, sgemm batch, filter, shares merged with dm_topk_merge), ListVectors-style
 * paging with segments. */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "flat.h"
#include "flat_int.h"      /* the fault hook, record framing (tests of recovery) */
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
	snprintf(tdir, sizeof(tdir), "/tmp/dmann-flat-XXXXXX");
	cr_assert_not_null(mkdtemp(tdir));
}

static void teardown(void)
{
	nftw(tdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(flat, .init = setup, .fini = teardown);

static struct flat_store *open_store(uint32_t frag_rows)
{
	struct flat_opts o = { .frag_rows = frag_rows };
	struct flat_store *s = flat_open(tdir, &o);

	cr_assert_not_null(s, "flat_open: %s", strerror(errno));
	return s;
}

struct seen {
	unsigned gen;
	uint32_t dim;
	int bad;
	int n;
};

static int check_row(void *ctx, const struct flat_row *r)
{
	struct seen *s = ctx;
	unsigned k;
	char want[48];
	float v[64];

	if (sscanf(r->key, "key-%u", &k) != 1) {
		s->bad++;
		return 0;
	}
	snprintf(want, sizeof(want), "{\"n\":%u,\"gen\":%u}", k, s->gen);
	vec_of(k, s->gen, v, s->dim);
	if (r->meta_len != strlen(want) || memcmp(r->meta, want, r->meta_len) ||
	    memcmp(r->vec, v, s->dim * sizeof(float)))
		s->bad++;
	s->n++;
	return 0;
}

/* Every key in [from, to) is present with generation gen. */
static void expect_range(struct flat_index *ix, unsigned from, unsigned to, unsigned gen)
{
	struct seen s = { .gen = gen, .dim = flat_index_info(ix)->dim };

	for (unsigned k = from; k < to; k++) {
		char key[32];
		const char *kp = key;

		snprintf(key, sizeof(key), "key-%u", k);
		cr_assert_eq(flat_get(ix, &kp, 1, check_row, &s), 1, "key-%u missing", k);
	}
	cr_assert_eq(s.bad, 0, "%d rows differ", s.bad);
}

static void expect_absent(struct flat_index *ix, unsigned from, unsigned to)
{
	struct seen s = { 0 };

	for (unsigned k = from; k < to; k++) {
		char key[32];
		const char *kp = key;

		snprintf(key, sizeof(key), "key-%u", k);
		cr_assert_eq(flat_get(ix, &kp, 1, check_row, &s), 0, "key-%u present", k);
	}
}

Test(flat, catalog)
{
	struct flat_store *s = open_store(0);
	struct flat_bucket_info bi[4];
	char names[4][FLAT_NAME_MAX + 1];
	bool more;

	cr_assert_eq(flat_bucket_create(s, "b2", 2), 0);
	cr_assert_eq(flat_bucket_create(s, "b1", 1), 0);
	cr_assert_eq(flat_bucket_create(s, "c1", 3), 0);
	cr_assert_eq(flat_bucket_create(s, "b1", 1), -EEXIST);
	cr_assert_eq(flat_bucket_list(s, "b", NULL, 1, bi, &more), 1);
	cr_assert_str_eq(bi[0].name, "b1");
	cr_assert(more);
	cr_assert_eq(flat_bucket_list(s, "b", "b1", 4, bi, &more), 1);
	cr_assert_str_eq(bi[0].name, "b2");
	cr_assert(!more);
	cr_assert_eq(flat_index_create(s, "nope", "i", 4, DM_METRIC_L2, NULL, 0, 0), -ENOENT);
	cr_assert_eq(flat_index_create(s, "b1", "i2", 4, DM_METRIC_L2, "{}", 2, 5), 0);
	cr_assert_eq(flat_index_create(s, "b1", "i1", 8, DM_METRIC_COS, NULL, 0, 6), 0);
	cr_assert_eq(flat_index_create(s, "b1", "i1", 8, DM_METRIC_COS, NULL, 0, 6), -EEXIST);
	cr_assert_eq(flat_index_create(s, "b1", "i0", 0, DM_METRIC_COS, NULL, 0, 6), -EINVAL);
	cr_assert_eq(flat_index_list(s, "b1", NULL, NULL, 4, names, &more), 2);
	cr_assert_str_eq(names[0], "i1");
	cr_assert_str_eq(names[1], "i2");
	cr_assert_eq(flat_bucket_delete(s, "b1"), -ENOTEMPTY);

	struct flat_index *ix = flat_index_get(s, "b1", "i2");

	cr_assert_not_null(ix);
	cr_assert_eq(flat_index_info(ix)->conf_len, 2);
	cr_assert_eq(flat_index_delete(s, "b1", "i2"), 0);
	/* The handle outlives the delete; writes through it fail. */
	float v[4] = { 1, 2, 3, 4 };
	struct flat_row_in r = { "k", v, NULL, 0, NULL, 0 };

	cr_assert_eq(flat_put(ix, &r, 1), -ENOENT);
	flat_index_put(ix);
	cr_assert_eq(flat_index_delete(s, "b1", "i1"), 0);
	cr_assert_eq(flat_bucket_delete(s, "b1"), 0);
	cr_assert_eq(flat_bucket_get(s, "b1", NULL), -ENOENT);
	flat_close(s);

	s = open_store(0);
	cr_assert_eq(flat_bucket_list(s, NULL, NULL, 4, bi, &more), 2);
	cr_assert_str_eq(bi[0].name, "b2");
	cr_assert_eq(bi[0].created_ms, 2);
	flat_close(s);
}

Test(flat, put_overwrite_delete)
{
	struct flat_store *s = open_store(64);
	struct flat_index *ix;
	uint64_t live, rows, frags;

	flat_bucket_create(s, "b", 0);
	flat_index_create(s, "b", "i", 16, DM_METRIC_L2, NULL, 0, 0);
	ix = flat_index_get(s, "b", "i");
	put_range(ix, 0, 300, 1);
	put_range(ix, 100, 200, 2);            /* overwrite */
	const char *del[] = { "key-0", "key-1", "key-150", "no-such" };

	cr_assert_eq(flat_delete(ix, del, 4), 0);
	flat_index_stats(ix, &live, &rows, &frags);
	cr_assert_eq(live, 297);
	cr_assert_eq(rows, 400);
	cr_assert_eq(frags, 7);
	expect_range(ix, 2, 100, 1);
	expect_range(ix, 100, 150, 2);
	expect_range(ix, 151, 200, 2);
	expect_range(ix, 200, 300, 1);
	expect_absent(ix, 0, 2);
	expect_absent(ix, 150, 151);

	/* Repeated key in one call: the last wins. */
	float a[16] = { 1 }, b[16] = { 2 };
	struct flat_row_in two[2] = { { "dup", a, "x", 1, NULL, 0 }, { "dup", b, "y", 1, NULL, 0 } };
	struct flat_row_in bad = { "", a, NULL, 0, NULL, 0 };

	cr_assert_eq(flat_put(ix, two, 2), 0);
	cr_assert_eq(flat_put(ix, &bad, 1), -EINVAL);
	flat_index_stats(ix, &live, NULL, NULL);
	cr_assert_eq(live, 298);
	flat_index_put(ix);
	flat_close(s);
}

/* Crash without close: every acknowledged write is recovered from the WAL alone. */
Test(flat, wal_recovery_after_crash)
{
	struct flat_store *s = open_store(50);
	struct flat_index *ix;
	uint64_t live;

	flat_bucket_create(s, "b", 0);
	flat_index_create(s, "b", "i", 8, DM_METRIC_COS, "{\"c\":1}", 7, 42);
	ix = flat_index_get(s, "b", "i");
	put_range(ix, 0, 200, 1);
	put_range(ix, 50, 80, 2);
	const char *del[] = { "key-10", "key-60" };

	flat_delete(ix, del, 2);
	flat_index_put(ix);
	cr_assert_gt(flat_wal_bytes(s), 0);
	flat_abandon(s);

	s = open_store(50);
	ix = flat_index_get(s, "b", "i");
	cr_assert_not_null(ix);
	cr_assert_eq(flat_index_info(ix)->metric, DM_METRIC_COS);
	cr_assert_eq(flat_index_info(ix)->created_ms, 42);
	cr_assert_eq(memcmp(flat_index_info(ix)->conf, "{\"c\":1}", 7), 0);
	flat_index_stats(ix, &live, NULL, NULL);
	cr_assert_eq(live, 198);
	expect_range(ix, 0, 10, 1);
	expect_range(ix, 11, 50, 1);
	expect_range(ix, 50, 60, 2);
	expect_range(ix, 61, 80, 2);
	expect_range(ix, 80, 200, 1);
	expect_absent(ix, 10, 11);
	flat_index_put(ix);
	flat_abandon(s);
}

/* A record torn mid-write (crash during the append, never acknowledged) is dropped, the
 * records before it survive, and the log stays appendable. */
Test(flat, wal_torn_tail)
{
	struct flat_store *s = open_store(0);
	struct flat_index *ix;
	char wal[128];
	struct stat st;
	uint64_t before;

	flat_bucket_create(s, "b", 0);
	flat_index_create(s, "b", "i", 8, DM_METRIC_L2, NULL, 0, 0);
	ix = flat_index_get(s, "b", "i");
	put_range(ix, 0, 100, 1);
	before = flat_wal_bytes(s);
	put_range(ix, 100, 150, 1);            /* this record gets torn below */
	flat_index_put(ix);
	flat_abandon(s);

	snprintf(wal, sizeof(wal), "%s/wal", tdir);
	cr_assert_eq(stat(wal, &st), 0);
	cr_assert_gt((uint64_t)st.st_size, before + 100);
	cr_assert_eq(truncate(wal, (off_t)(before + (st.st_size - before) / 2)), 0);

	s = open_store(0);
	ix = flat_index_get(s, "b", "i");
	cr_assert_not_null(ix);
	expect_range(ix, 0, 100, 1);
	expect_absent(ix, 100, 150);
	cr_assert_eq(flat_wal_bytes(s), before);
	put_range(ix, 200, 220, 3);
	flat_index_put(ix);
	flat_abandon(s);

	/* Garbage (a torn header) at the tail is dropped the same way. */
	FILE *f = fopen(wal, "ab");

	fwrite("\x13\x00\x00", 1, 3, f);
	fclose(f);
	s = open_store(0);
	ix = flat_index_get(s, "b", "i");
	expect_range(ix, 0, 100, 1);
	expect_range(ix, 200, 220, 3);
	flat_index_put(ix);
	flat_close(s);
}

/* Snapshot + WAL; and a crash between the snapshot rename and the WAL truncate (old
 * records still in the WAL) replays nothing twice. */
Test(flat, snapshot_then_wal)
{
	struct flat_store *s = open_store(32);
	struct flat_index *ix;
	char wal[128], *old = NULL;
	size_t oldn = 0;
	uint64_t live;
	FILE *f;

	flat_bucket_create(s, "b", 0);
	flat_index_create(s, "b", "i", 8, DM_METRIC_L2, NULL, 0, 0);
	ix = flat_index_get(s, "b", "i");
	put_range(ix, 0, 100, 1);
	const char *del[] = { "key-5" };

	flat_delete(ix, del, 1);
	snprintf(wal, sizeof(wal), "%s/wal", tdir);
	f = fopen(wal, "rb");
	old = malloc(1 << 20);
	oldn = fread(old, 1, 1 << 20, f);
	fclose(f);
	cr_assert_eq(flat_checkpoint(s), 0);
	cr_assert_eq(flat_wal_bytes(s), 0);
	flat_index_put(ix);
	flat_abandon(s);

	/* Put the pre-snapshot records back, as if the truncate had not happened. */
	f = fopen(wal, "wb");
	fwrite(old, 1, oldn, f);
	fclose(f);
	free(old);
	s = open_store(32);
	ix = flat_index_get(s, "b", "i");
	put_range(ix, 100, 120, 1);
	const char *del2[] = { "key-6" };

	flat_delete(ix, del2, 1);
	flat_index_put(ix);
	flat_abandon(s);

	s = open_store(32);
	ix = flat_index_get(s, "b", "i");
	flat_index_stats(ix, &live, NULL, NULL);
	cr_assert_eq(live, 118);
	expect_range(ix, 0, 5, 1);
	expect_range(ix, 7, 120, 1);
	expect_absent(ix, 5, 7);
	flat_index_put(ix);
	flat_close(s);
}

Test(flat, busy_dir)
{
	struct flat_store *s = open_store(0);
	struct flat_store *t = flat_open(tdir, NULL);

	cr_assert_null(t);
	cr_assert_eq(errno, EBUSY);
	flat_close(s);
}

static void *close_later(void *p)
{
	usleep(300000);
	flat_close(p);
	return NULL;
}

/* lock_wait_ms: a lock still held after it fails with EBUSY; one released meanwhile (the
 * previous process of a restarted memory node going away) is taken. */
Test(flat, busy_dir_waits_for_the_lock)
{
	struct flat_store *s = open_store(0);
	struct timespec a, b;
	pthread_t th;

	clock_gettime(CLOCK_MONOTONIC, &a);
	cr_assert_null(flat_open(tdir, &(struct flat_opts){ .lock_wait_ms = 200 }));
	cr_assert_eq(errno, EBUSY);
	clock_gettime(CLOCK_MONOTONIC, &b);
	cr_assert_geq((b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000, 200);
	cr_assert_eq(pthread_create(&th, NULL, close_later, s), 0);
	s = flat_open(tdir, &(struct flat_opts){ .lock_wait_ms = 5000 });
	pthread_join(th, NULL);
	cr_assert_not_null(s, "the lock was released after 300 ms: %s", strerror(errno));
	flat_close(s);
}

/* ---- WAL damage, failed writes, group commit --------------------------------------- */

/* Offsets of the records in the WAL file (at most max). */
static size_t wal_offsets(const char *wal, size_t *offs, size_t max, size_t *len)
{
	uint8_t *b;
	size_t n, off = 0, k = 0;
	struct flat_rec r;

	cr_assert_eq(flat_read_file(wal, &b, &n), 0);
	while (off < n && flat_rec_parse(b + off, n - off, &r) == 1 && k < max) {
		offs[k++] = off;
		off += FLAT_REC_HDR + r.len;
	}
	free(b);
	*len = n;
	return k;
}

static void flip_byte(const char *path, size_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t c;

	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, &c, 1, (off_t)off), 1);
	c ^= 0x5a;
	cr_assert_eq(pwrite(fd, &c, 1, (off_t)off), 1);
	close(fd);
}

static off_t file_size(const char *path)
{
	struct stat st;

	cr_assert_eq(stat(path, &st), 0);
	return st.st_size;
}

/* Bucket "b", index "i" (dim, L2) in s, and a handle to it. */
static struct flat_index *make_index(struct flat_store *s, uint32_t dim)
{
	cr_assert_eq(flat_bucket_create(s, "b", 0), 0);
	cr_assert_eq(flat_index_create(s, "b", "i", dim, DM_METRIC_L2, NULL, 0, 0), 0);
	return flat_index_get(s, "b", "i");
}

/* bucket + index + 4 PUT records of 20 rows, then a crash. Returns the WAL path. */
static void four_puts(char *wal, size_t cap)
{
	struct flat_store *s = open_store(0);
	struct flat_index *ix = make_index(s, 8);

	for (unsigned i = 0; i < 4; i++)
		put_range(ix, i * 20, i * 20 + 20, 1);
	flat_index_put(ix);
	flat_abandon(s);
	snprintf(wal, cap, "%s/wal", tdir);
}

/* A record damaged in the middle of the log, with acknowledged records after it: the open
 * fails (EBADMSG, the log names file and offset) and the WAL is left as it was; it does not
 * silently drop the later writes. Damage to the payload and to the length field alike. */
Test(flat, wal_mid_log_corruption_refuses_open)
{
	char wal[128];
	size_t offs[8], len;
	off_t size;

	four_puts(wal, sizeof(wal));
	cr_assert_eq(wal_offsets(wal, offs, 8, &len), 6);
	size = file_size(wal);
	flip_byte(wal, offs[3] + FLAT_REC_HDR + 40);          /* 2nd PUT's payload */
	cr_assert_null(flat_open(tdir, &(struct flat_opts){ 0 }));
	cr_assert_eq(errno, EBADMSG);
	cr_assert_eq(file_size(wal), size, "a refused open must not cut the log");
	flip_byte(wal, offs[3] + FLAT_REC_HDR + 40);          /* repair: opens again */
	flip_byte(wal, offs[3] + 1);                          /* length field */
	cr_assert_null(flat_open(tdir, &(struct flat_opts){ 0 }));
	cr_assert_eq(errno, EBADMSG);
	flip_byte(wal, offs[3] + 1);

	struct flat_store *s = open_store(0);
	struct flat_index *ix = flat_index_get(s, "b", "i");

	expect_range(ix, 0, 80, 1);
	flat_index_put(ix);
	flat_close(s);
}

/* The last record's CRC fails and nothing follows: a torn tail, cut as before. */
Test(flat, wal_bad_last_record_is_torn_tail)
{
	char wal[128];
	size_t offs[8], len;

	four_puts(wal, sizeof(wal));
	cr_assert_eq(wal_offsets(wal, offs, 8, &len), 6);
	flip_byte(wal, offs[5] + FLAT_REC_HDR + 40);
	struct flat_store *s = open_store(0);
	struct flat_index *ix = flat_index_get(s, "b", "i");

	expect_range(ix, 0, 60, 1);
	expect_absent(ix, 60, 80);
	cr_assert_eq(flat_wal_bytes(s), offs[5]);
	put_range(ix, 100, 110, 2);
	flat_index_put(ix);
	flat_abandon(s);
	s = open_store(0);
	ix = flat_index_get(s, "b", "i");
	expect_range(ix, 100, 110, 2);
	flat_index_put(ix);
	flat_close(s);
}

/* Append a PUT record of key k (lsn, inflight given) to the WAL; returns its offset. */
static size_t append_put(struct flat_index *ix, const char *wal, unsigned k, uint64_t lsn,
			 uint32_t inflight)
{
	struct dm_buf b = { 0 };
	char key[32];
	float v[8];
	struct flat_row_in r = { key, v, "{}", 2, NULL, 0 };
	int fd = open(wal, O_WRONLY | O_APPEND);
	off_t at = file_size(wal);

	snprintf(key, sizeof(key), "key-%u", k);
	vec_of(k, 1, v, 8);
	flat_rec_begin(&b);
	flat_enc_put(&b, ix, &r, 1);
	flat_rec_frame(&b, lsn, FLAT_REC_PUT, inflight);
	cr_assert_eq(write(fd, b.p, b.n), (ssize_t)b.n);
	close(fd);
	dm_buf_free(&b);
	return (size_t)at;
}

/* Group commit leaves several records unsynced at once, so a crash can keep a later one and
 * lose an earlier one: records written while the damaged one was not yet durable (inflight
 * covers it) are a torn tail and dropped with it; a record written after it was durable
 * (inflight 0) proves corruption. */
Test(flat, wal_unsynced_window_vs_corruption)
{
	struct flat_store *s = open_store(0);
	struct flat_index *ix = make_index(s, 8);
	char wal[128];
	struct flat_wal_stats ws;
	size_t bad;

	put_range(ix, 0, 10, 1);
	flat_wal_stats(s, &ws);
	snprintf(wal, sizeof(wal), "%s/wal", tdir);
	/* lsn+1 damaged, lsn+2 and lsn+3 written while lsn+1 was in flight. */
	bad = append_put(ix, wal, 50, ws.lsn + 1, 0);
	append_put(ix, wal, 51, ws.lsn + 2, 1);
	append_put(ix, wal, 52, ws.lsn + 3, 2);
	flat_index_put(ix);
	flat_abandon(s);
	flip_byte(wal, bad + FLAT_REC_HDR + 12);
	s = open_store(0);
	ix = flat_index_get(s, "b", "i");
	expect_range(ix, 0, 10, 1);
	expect_absent(ix, 50, 53);
	cr_assert_eq(flat_wal_bytes(s), bad);

	/* Same damage, but lsn+3 was written once lsn+1 had been synced (inflight 1: only
	 * lsn+2 was in flight). */
	bad = append_put(ix, wal, 50, ws.lsn + 1, 0);
	append_put(ix, wal, 51, ws.lsn + 2, 1);
	append_put(ix, wal, 52, ws.lsn + 3, 1);
	flat_index_put(ix);
	flat_abandon(s);
	flip_byte(wal, bad + FLAT_REC_HDR + 12);
	cr_assert_null(flat_open(tdir, &(struct flat_opts){ 0 }));
	cr_assert_eq(errno, EBADMSG);
}

/* A PUT whose memory cannot be had fails before anything is logged: after a restart the
 * row is absent and the writes after it are present. Every allocation of the write path is
 * failed in turn (row copies, a new fragment, key-map growth, the fragment table). */
Test(flat, failed_put_is_not_logged)
{
	struct flat_store *s = open_store(16);
	struct flat_index *ix = make_index(s, 8);
	int failures = 0;

	put_range(ix, 0, 16, 1);                /* a full fragment: the next put needs one */
	for (int at = 1; at <= 64; at++) {
		uint64_t before = flat_wal_bytes(s);
		float v[8];
		char key[32];
		struct flat_row_in r = { key, v, "{}", 2, "x", 1 };
		int rc;

		snprintf(key, sizeof(key), "key-%u", 1000 + at);
		vec_of(1000 + at, 1, v, 8);
		flat_fault_alloc = at;
		rc = flat_put(ix, &r, 1);
		flat_fault_alloc = 0;
		if (rc == 0) {
			/* fault point past this put's allocations: undo for the check below */
			const char *kp = key;

			cr_assert_eq(flat_delete(ix, &kp, 1), 0);
			break;
		}
		cr_assert_eq(rc, -ENOMEM);
		cr_assert_eq(flat_wal_bytes(s), before, "a failed put was logged");
		expect_absent(ix, 1000 + at, 1001 + at);
		failures++;
	}
	cr_assert_geq(failures, 3);
	put_range(ix, 16, 40, 2);
	flat_index_put(ix);
	flat_abandon(s);

	s = open_store(16);
	ix = flat_index_get(s, "b", "i");
	expect_absent(ix, 1001, 1001 + failures + 1);
	expect_range(ix, 0, 16, 1);
	expect_range(ix, 16, 40, 2);
	flat_index_put(ix);
	flat_close(s);
}

/* The bytes put_range(from, to, gen) adds (flat_row_bytes of each row). */
static uint64_t range_bytes(uint32_t dim, unsigned from, unsigned to, unsigned gen)
{
	uint64_t b = 0;

	for (unsigned k = from; k < to; k++) {
		char key[32], meta[48];

		snprintf(key, sizeof(key), "key-%u", k);
		snprintf(meta, sizeof(meta), "{\"n\":%u,\"gen\":%u}", k, gen);
		b += flat_row_bytes(dim, strlen(key), (uint32_t)strlen(meta), 1);
	}
	return b;
}

static struct flat_store *open_limited(uint64_t max)
{
	struct flat_opts o = { .frag_rows = 64, .max_bytes = max };
	struct flat_store *s = flat_open(tdir, &o);

	cr_assert_not_null(s, "flat_open: %s", strerror(errno));
	return s;
}

static int put_one(struct flat_index *ix, unsigned k, unsigned gen)
{
	uint32_t d = flat_index_info(ix)->dim;
	float v[64];
	char key[32], meta[48];

	snprintf(key, sizeof(key), "key-%u", k);
	snprintf(meta, sizeof(meta), "{\"n\":%u,\"gen\":%u}", k, gen);
	vec_of(k, gen, v, d);
	return flat_put(ix, &(struct flat_row_in){ key, v, meta, (uint32_t)strlen(meta),
						   &meta[5], 1 }, 1);
}

/* Capacity (flat_opts.max_bytes): a put past the limit fails with -ENOSPC and is neither
 * applied nor logged; deleted rows hold their bytes until a reopen compacts them; a deleted
 * index gives its bytes back at once; replay at open is never refused, even past a limit
 * lowered since. */
Test(flat, capacity_limit)
{
	uint64_t full = range_bytes(16, 0, 300, 1), used, max, wal;
	struct flat_store *s = open_limited(full + 10);   /* 300 rows, not one more */
	struct flat_index *ix = make_index(s, 16);
	const char *del[] = { "key-0", "key-1", "key-2" };

	put_range(ix, 0, 300, 1);
	flat_store_usage(s, &used, &max);
	cr_assert_eq(used, full);
	cr_assert_eq(max, full + 10);
	wal = flat_wal_bytes(s);
	cr_assert_eq(put_one(ix, 300, 1), -ENOSPC);
	cr_assert_eq(put_one(ix, 5, 2), -ENOSPC, "a re-put needs room too (the old row stays)");
	cr_assert_eq(flat_wal_bytes(s), wal, "a refused put was logged");
	expect_absent(ix, 300, 301);
	expect_range(ix, 0, 300, 1);
	cr_assert_eq(flat_delete(ix, del, 3), 0, "deletes are never refused");
	cr_assert_eq(put_one(ix, 300, 1), -ENOSPC, "deleted rows hold their bytes until a reopen");

	/* A second index shares the store's limit. */
	cr_assert_eq(flat_index_create(s, "b", "j", 16, DM_METRIC_L2, NULL, 0, 0), 0);
	struct flat_index *jx = flat_index_get(s, "b", "j");

	cr_assert_eq(put_one(jx, 0, 1), -ENOSPC);
	flat_index_put(ix);
	flat_index_put(jx);
	flat_close(s);

	/* Reopened: the three deleted rows are compacted away, three rows fit again. */
	s = open_limited(full + 10);
	ix = flat_index_get(s, "b", "i");
	jx = flat_index_get(s, "b", "j");
	flat_store_usage(s, &used, &max);
	cr_assert_eq(used, full - range_bytes(16, 0, 3, 1));
	expect_absent(ix, 0, 3);
	expect_absent(ix, 300, 301);
	expect_range(ix, 3, 300, 1);
	cr_assert_eq(put_one(jx, 0, 1), 0);
	cr_assert_eq(put_one(jx, 1, 1), 0);
	cr_assert_eq(put_one(jx, 2, 1), 0);
	cr_assert_eq(put_one(jx, 3, 1), -ENOSPC);

	/* A deleted index gives its rows' bytes back at once. */
	flat_index_put(ix);
	cr_assert_eq(flat_index_delete(s, "b", "i"), 0);
	flat_store_usage(s, &used, &max);
	cr_assert_eq(used, range_bytes(16, 0, 3, 1));
	for (unsigned k = 3; k < 200; k++)
		cr_assert_eq(put_one(jx, k, 1), 0, "key-%u", k);
	flat_index_put(jx);
	flat_abandon(s);         /* a crash: the rows come back from the WAL */

	/* Replay past a lower limit: every acknowledged row is back, new puts refused. */
	s = open_limited(1000);
	jx = flat_index_get(s, "b", "j");
	flat_store_usage(s, &used, &max);
	cr_assert_eq(used, range_bytes(16, 0, 200, 1));
	expect_range(jx, 0, 200, 1);
	cr_assert_eq(put_one(jx, 200, 1), -ENOSPC);
	flat_index_put(jx);
	flat_close(s);
}

/* A failed fdatasync: that write and every later one fail (the store cannot know what
 * reached the disk), the counters say so; after a reopen the store works again, and the
 * write that failed may or may not be there afterwards (its outcome is unknown, as after a
 * timeout; not checked). With group commit off the same. */
static void failed_sync_run(bool off)
{
	struct flat_opts o = { .no_group_commit = off };
	struct flat_store *s = flat_open(tdir, &o);
	struct flat_index *ix = make_index(s, 8);
	struct flat_wal_stats ws;
	const char *k0 = "key-0";

	put_range(ix, 0, 10, 1);
	flat_fault_sync = 1;
	{
		float v[8];
		struct flat_row_in r = { "key-100", v, "{}", 2, NULL, 0 };

		vec_of(100, 1, v, 8);
		cr_assert_eq(flat_put(ix, &r, 1), -EIO);
		cr_assert_eq(flat_put(ix, &r, 1), -EIO);
	}
	flat_fault_sync = 0;
	cr_assert_eq(flat_delete(ix, &k0, 1), -EIO);
	cr_assert_eq(flat_bucket_create(s, "c", 0), -EIO);
	flat_wal_stats(s, &ws);
	cr_assert_eq(ws.error, -EIO);
	cr_assert_lt(ws.durable_lsn, ws.lsn);
	expect_absent(ix, 100, 101);            /* never visible: it was not durable */
	cr_assert_neq(flat_checkpoint(s), 0);
	flat_index_put(ix);
	flat_abandon(s);

	s = flat_open(tdir, &o);
	cr_assert_not_null(s);
	ix = flat_index_get(s, "b", "i");
	expect_range(ix, 0, 10, 1);
	put_range(ix, 10, 20, 1);
	flat_index_put(ix);
	flat_close(s);
}

Test(flat, failed_sync_refuses_writes)
{
	failed_sync_run(false);
}

Test(flat, failed_sync_refuses_writes_no_group_commit)
{
	failed_sync_run(true);
}

#define GC_WRITERS 8
#define GC_WRITES 40

struct gc_arg {
	struct flat_index *ix;
	unsigned id;
	int failed;
};

static void *gc_writer(void *p)
{
	struct gc_arg *a = p;

	for (unsigned w = 0; w < GC_WRITES; w++) {
		unsigned k = a->id * 1000 + w;
		char key[32], meta[48];
		float v[16];
		struct flat_row_in r = { key, v, meta, 0, NULL, 0 };

		snprintf(key, sizeof(key), "key-%u", k);
		snprintf(meta, sizeof(meta), "{\"n\":%u,\"gen\":1}", k);
		r.meta_len = (uint32_t)strlen(meta);
		vec_of(k, 1, v, 16);
		if (flat_put(a->ix, &r, 1))
			a->failed++;
	}
	return NULL;
}

/* 8 concurrent writers on one index, with checkpoints happening under them: every write
 * acknowledged survives a crash and reopen, and they shared fdatasyncs (the store's
 * counters). With group commit off each write has its own fdatasync. */
static void group_commit_run(bool off)
{
	struct flat_opts o = { .frag_rows = 64, .checkpoint_bytes = 32 << 10,
			       .no_group_commit = off };
	struct flat_store *s = flat_open(tdir, &o);
	struct flat_index *ix;
	struct gc_arg a[GC_WRITERS];
	pthread_t t[GC_WRITERS];
	struct flat_wal_stats ws;
	uint64_t live;

	cr_assert_not_null(s);
	ix = make_index(s, 16);
	for (unsigned i = 0; i < GC_WRITERS; i++) {
		a[i] = (struct gc_arg){ .ix = ix, .id = i };
		cr_assert_eq(pthread_create(&t[i], NULL, gc_writer, &a[i]), 0);
	}
	for (unsigned i = 0; i < GC_WRITERS; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(a[i].failed, 0);
	}
	flat_wal_stats(s, &ws);
	cr_assert_eq(ws.records, 2 + GC_WRITERS * GC_WRITES);
	if (off)
		cr_assert_eq(ws.syncs, ws.records);
	else
		cr_assert_lt(ws.syncs, ws.records, "%llu fdatasyncs for %llu writes",
			     (unsigned long long)ws.syncs, (unsigned long long)ws.records);
	cr_assert_eq(ws.durable_lsn, ws.lsn);
	flat_index_put(ix);
	flat_abandon(s);

	s = flat_open(tdir, &o);
	cr_assert_not_null(s);
	ix = flat_index_get(s, "b", "i");
	flat_index_stats(ix, &live, NULL, NULL);
	cr_assert_eq(live, GC_WRITERS * GC_WRITES);
	for (unsigned i = 0; i < GC_WRITERS; i++)
		expect_range(ix, i * 1000, i * 1000 + GC_WRITES, 1);
	flat_index_put(ix);
	flat_close(s);
}

Test(flat, group_commit_concurrent_writers)
{
	group_commit_run(false);
}

Test(flat, group_commit_off_one_sync_per_write)
{
	group_commit_run(true);
}

/* ---- scans ---------------------------------------------------------------------- */

#define DIM 24
#define NV 3000

static bool odd_only(void *ctx, const void *fmeta, uint32_t len)
{
	(void)ctx;
	return len == 1 && (((const char *)fmeta)[0] - '0') % 2 == 1;
}

struct bf { float d; uint64_t k; };

static int bf_cmp(const void *a, const void *b)
{
	const struct bf *x = a, *y = b;

	return x->d < y->d ? -1 : x->d > y->d ? 1 : 0;
}

/* Reference distances: double precision. */
static float ref_dist(enum dm_metric m, const float *a, const float *b)
{
	double dot = 0, na = 0, nb = 0, l2 = 0;

	for (int j = 0; j < DIM; j++) {
		dot += (double)a[j] * b[j];
		na += (double)a[j] * a[j];
		nb += (double)b[j] * b[j];
		l2 += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
	}
	return m == DM_METRIC_L2 ? (float)l2 : (float)(1.0 - dot / sqrt(na * nb));
}

/* Live key numbers after the scan fixture's writes. */
static bool fixture_live(unsigned k)
{
	return k % 7 != 3;
}

static struct flat_index *scan_fixture(struct flat_store *s, enum dm_metric m)
{
	struct flat_index *ix;
	const char *del[NV / 7 + 1];
	char (*keys)[32] = malloc((NV / 7 + 1) * 32);
	size_t nd = 0;

	flat_bucket_create(s, "b", 0);
	flat_index_create(s, "b", "i", DIM, m, NULL, 0, 0);
	ix = flat_index_get(s, "b", "i");
	put_range(ix, 0, NV, 1);
	put_range(ix, 1000, 1500, 2);          /* overwrites: the old rows are tombstones */
	for (unsigned k = 3; k < NV; k += 7) {
		snprintf(keys[nd], 32, "key-%u", k);
		del[nd] = keys[nd];
		nd++;
	}
	flat_delete(ix, del, nd);
	free(keys);
	return ix;
}

/* Check a scan result list against brute force over the model of live rows. */
static void check_hits(struct flat_index *ix, enum dm_metric m, const float *q,
		       const struct dm_hit *h, size_t n, size_t k, bool odd)
{
	struct bf *all = malloc(NV * sizeof(*all));
	size_t na = 0;
	float v[DIM];

	for (unsigned key = 0; key < NV; key++) {
		if (!fixture_live(key))
			continue;
		if (odd) {
			/* fmeta is the 6th char of the meta text: the first digit of n */
			char meta[48];

			snprintf(meta, sizeof(meta), "{\"n\":%u", key);
			if ((meta[5] - '0') % 2 != 1)
				continue;
		}
		vec_of(key, key >= 1000 && key < 1500 ? 2 : 1, v, DIM);
		all[na++] = (struct bf){ ref_dist(m, q, v), key };
	}
	qsort(all, na, sizeof(*all), bf_cmp);
	cr_assert_eq(n, DM_MIN(k, na));
	for (size_t i = 0; i < n; i++) {
		struct seen sn = { 0 };
		float tol = 1e-4f * (1 + fabsf(all[i].d));

		/* The i-th distance equals brute force; the row it names has that distance. */
		cr_assert(fabsf(h[i].dist - all[i].d) <= tol, "rank %zu: %g vs %g", i,
			  h[i].dist, all[i].d);
		cr_assert_eq(flat_get_ids(ix, &h[i].id, 1, check_row, &sn), 1);
		if (i)
			cr_assert(h[i - 1].dist <= h[i].dist);
	}
	free(all);
}

static void scan_vs_bruteforce(enum dm_metric m)
{
	struct flat_store *s = open_store(256);
	struct flat_index *ix = scan_fixture(s, m);
	enum { NQ = 5, K = 10 };
	float q[NQ * DIM];
	struct dm_hit one[K], batch[NQ * K];
	size_t n1, nb[NQ];

	for (int i = 0; i < NQ; i++)
		vec_of(100000 + i, 9, q + i * DIM, DIM);
	for (int i = 0; i < NQ; i++) {
		struct flat_scan sc = { .q = q + i * DIM, .nq = 1, .k = K };

		cr_assert_eq(flat_search(ix, &sc, one, &n1), 0);
		check_hits(ix, m, q + i * DIM, one, n1, K, false);
	}
	struct flat_scan sb = { .q = q, .nq = NQ, .k = K };

	cr_assert_eq(flat_search(ix, &sb, batch, nb), 0);
	for (int i = 0; i < NQ; i++)
		check_hits(ix, m, q + i * DIM, batch + i * K, nb[i], K, false);

	/* Filter: only rows whose fmeta digit is odd. */
	void *ctx[NQ];

	for (int i = 0; i < NQ; i++)
		ctx[i] = (void *)1;
	struct flat_scan sf = { .q = q, .nq = 1, .k = K, .match = odd_only, .match_ctx = ctx };

	cr_assert_eq(flat_search(ix, &sf, one, &n1), 0);
	check_hits(ix, m, q, one, n1, K, true);
	sf.nq = NQ;
	cr_assert_eq(flat_search(ix, &sf, batch, nb), 0);
	for (int i = 0; i < NQ; i++)
		check_hits(ix, m, q + i * DIM, batch + i * K, nb[i], K, true);

	/* Shares on 3 "CNs", merged at the ingress, equal the full scan. */
	struct dm_hit part[3][K], merged[K];
	const struct dm_hit *lists[3] = { part[0], part[1], part[2] };
	size_t lens[3];

	for (uint32_t w = 0; w < 3; w++) {
		struct flat_scan ss = { .q = q, .nq = 1, .k = K, .share_count = 3,
					.share_index = w };

		cr_assert_eq(flat_search(ix, &ss, part[w], &lens[w]), 0);
	}
	size_t nm = dm_topk_merge(lists, lens, 3, K, merged);

	check_hits(ix, m, q, merged, nm, K, false);
	struct flat_scan bad = { .q = q, .nq = 1, .k = 0 };

	cr_assert_eq(flat_search(ix, &bad, one, &n1), -EINVAL);
	flat_index_put(ix);
	flat_close(s);
}

Test(flat, scan_l2_vs_bruteforce)
{
	scan_vs_bruteforce(DM_METRIC_L2);
}

Test(flat, scan_cosine_vs_bruteforce)
{
	scan_vs_bruteforce(DM_METRIC_COS);
}

static int count_key(void *ctx, const struct flat_row *r)
{
	unsigned k;
	uint8_t *seen = ctx;

	cr_assert_eq(sscanf(r->key, "key-%u", &k), 1);
	cr_assert_lt(k, NV);
	cr_assert_eq(seen[k], 0, "key-%u listed twice", k);
	seen[k] = 1;
	return 0;
}

/* Paging through 4 segments visits each live key exactly once. */
Test(flat, list_segments_paging)
{
	struct flat_store *s = open_store(256);
	struct flat_index *ix = scan_fixture(s, DM_METRIC_L2);
	uint8_t *seen = calloc(NV, 1);

	for (uint32_t seg = 0; seg < 4; seg++) {
		uint64_t at = 0, next;
		int pages = 0;

		do {
			int n = flat_list(ix, at, 4, seg, 97, count_key, seen, &next);

			cr_assert_geq(n, 0);
			cr_assert_leq(n, 97);
			cr_assert(n > 0 || next == UINT64_MAX);
			at = next;
			pages++;
		} while (at != UINT64_MAX);
		cr_assert_gt(pages, 1);
	}
	for (unsigned k = 0; k < NV; k++)
		cr_assert_eq(seen[k], fixture_live(k), "key-%u", k);
	free(seen);
	uint64_t nx;

	cr_assert_eq(flat_list(ix, 0, 4, 4, 10, count_key, NULL, &nx), -EINVAL);
	flat_index_put(ix);
	flat_close(s);
}

struct fr_seen {
	unsigned n;
	uint64_t first;
};

static int count_row(void *ctx, const struct flat_row *r)
{
	struct fr_seen *s = ctx;

	if (!s->n)
		s->first = r->id;
	s->n++;
	cr_assert_eq(strncmp(r->key, "key-", 4), 0);
	return 0;
}

/* Fragment-level reads (what memory nodes hand to compute-node caches): per-fragment row
 * and tombstone counts only grow, and a read returns the flags and the rows from `from`. */
Test(flat, fragment_stats_and_reads)
{
	struct flat_store *s = open_store(64);
	struct flat_index *ix;
	struct flat_frag_stat st[8];
	struct fr_seen seen = { 0 };
	uint8_t dead[64];
	const char *del[] = { "key-3", "key-70" };

	flat_bucket_create(s, "b", 0);
	flat_index_create(s, "b", "i", 8, DM_METRIC_L2, NULL, 0, 0);
	ix = flat_index_get(s, "b", "i");
	cr_assert_eq(flat_frag_rows(ix), 64);
	put_range(ix, 0, 100, 1);
	cr_assert_eq(flat_frag_stats(ix, st, 8), 2);
	cr_assert_eq(st[0].rows, 64);
	cr_assert_eq(st[0].dead, 0);
	cr_assert_eq(st[1].rows, 36);
	put_range(ix, 10, 11, 2);              /* overwrite: tombstone in 0, append in 1 */
	cr_assert_eq(flat_delete(ix, del, 2), 0);
	cr_assert_eq(flat_frag_stats(ix, st, 1), 2);   /* count even when out is short */
	cr_assert_eq(st[0].dead, 2);
	cr_assert_eq(flat_frag_stats(ix, st, 8), 2);
	cr_assert_eq(st[1].rows, 37);
	cr_assert_eq(st[1].dead, 1);

	cr_assert_eq(flat_frag_read(ix, 0, 60, dead, sizeof(dead), count_row, &seen), 64);
	cr_assert_eq(seen.n, 4);
	cr_assert_eq(seen.first, 60);
	cr_assert(dead[3] && dead[10] && !dead[4]);
	memset(&seen, 0, sizeof(seen));
	cr_assert_eq(flat_frag_read(ix, 1, 36, dead, sizeof(dead), count_row, &seen), 37);
	cr_assert_eq(seen.n, 1);
	cr_assert_eq(seen.first, 64 + 36);
	cr_assert(dead[70 - 64] && !dead[36]);
	cr_assert_eq(flat_frag_read(ix, 2, 0, dead, sizeof(dead), count_row, &seen), -ENOENT);
	cr_assert_eq(flat_frag_read(ix, 0, 0, dead, 10, count_row, &seen), -EINVAL);
	flat_index_put(ix);
	flat_close(s);
}

/* Catalog attributes (the gateway's tags and policies): set, replace, clear, kept across a
 * WAL replay (crash) and a snapshot (clean close), dropped with their bucket or index. */
static void expect_attr(struct flat_store *s, const char *b, const char *x, uint32_t kind,
			const char *want)
{
	char *v;
	uint32_t n;

	cr_assert_eq(flat_attr_get(s, b, x, kind, &v, &n), 0);
	if (!want) {
		cr_assert_null(v);
		return;
	}
	cr_assert_not_null(v);
	cr_assert_str_eq(v, want);
	cr_assert_eq(n, strlen(want));
	free(v);
}

Test(flat, catalog_attributes)
{
	struct flat_store *s = open_store(0);
	char *v;
	uint32_t n;

	cr_assert_eq(flat_bucket_create(s, "b1", 1), 0);
	cr_assert_eq(flat_bucket_create(s, "b2", 1), 0);
	cr_assert_eq(flat_index_create(s, "b1", "i1", 4, DM_METRIC_L2, NULL, 0, 1), 0);
	cr_assert_eq(flat_attr_set(s, "b1", NULL, FLAT_ATTR_TAGS, "{\"a\":\"1\"}", 9), 0);
	cr_assert_eq(flat_attr_set(s, "b1", NULL, FLAT_ATTR_POLICY, "P1", 2), 0);
	cr_assert_eq(flat_attr_set(s, "b1", NULL, FLAT_ATTR_POLICY, "P2", 2), 0);
	cr_assert_eq(flat_attr_set(s, "b1", "i1", FLAT_ATTR_TAGS, "{}", 2), 0);
	cr_assert_eq(flat_attr_set(s, "b2", NULL, FLAT_ATTR_POLICY, "Q", 1), 0);
	cr_assert_eq(flat_attr_set(s, "b2", NULL, FLAT_ATTR_POLICY, NULL, 0), 0);
	cr_assert_eq(flat_attr_set(s, "nope", NULL, FLAT_ATTR_TAGS, "x", 1), -ENOENT);
	cr_assert_eq(flat_attr_set(s, "b1", "nope", FLAT_ATTR_TAGS, "x", 1), -ENOENT);
	cr_assert_eq(flat_attr_set(s, "b1", NULL, 9, "x", 1), -EINVAL);
	cr_assert_eq(flat_attr_set(s, "b1", NULL, FLAT_ATTR_TAGS, "x", FLAT_ATTR_MAX + 1),
		     -EINVAL);
	cr_assert_eq(flat_attr_get(s, "nope", NULL, FLAT_ATTR_TAGS, &v, &n), -ENOENT);
	expect_attr(s, "b1", NULL, FLAT_ATTR_POLICY, "P2");
	flat_abandon(s);                          /* crash: everything from the WAL */

	s = open_store(0);
	expect_attr(s, "b1", NULL, FLAT_ATTR_TAGS, "{\"a\":\"1\"}");
	expect_attr(s, "b1", NULL, FLAT_ATTR_POLICY, "P2");
	expect_attr(s, "b1", "i1", FLAT_ATTR_TAGS, "{}");
	expect_attr(s, "b1", "i1", FLAT_ATTR_POLICY, NULL);
	expect_attr(s, "b2", NULL, FLAT_ATTR_POLICY, NULL);
	flat_close(s);                            /* snapshot */

	s = open_store(0);
	expect_attr(s, "b1", NULL, FLAT_ATTR_POLICY, "P2");
	expect_attr(s, "b1", "i1", FLAT_ATTR_TAGS, "{}");
	/* Dropped with the index and the bucket: a new one of the same name has none. */
	cr_assert_eq(flat_index_delete(s, "b1", "i1"), 0);
	cr_assert_eq(flat_index_create(s, "b1", "i1", 4, DM_METRIC_L2, NULL, 0, 1), 0);
	expect_attr(s, "b1", "i1", FLAT_ATTR_TAGS, NULL);
	cr_assert_eq(flat_index_delete(s, "b1", "i1"), 0);
	cr_assert_eq(flat_bucket_delete(s, "b1"), 0);
	cr_assert_eq(flat_bucket_create(s, "b1", 1), 0);
	expect_attr(s, "b1", NULL, FLAT_ATTR_POLICY, NULL);
	flat_abandon(s);

	s = open_store(0);                        /* the same after a replay */
	expect_attr(s, "b1", NULL, FLAT_ATTR_POLICY, NULL);
	expect_attr(s, "b1", NULL, FLAT_ATTR_TAGS, NULL);
	flat_close(s);
}

static int check_key_cb(void *ctx, const struct flat_row *r)
{
	snprintf(ctx, 32, "%s", r->key);
	return 0;
}

/* The graph mark: set only at the exact row count, survives a crash (WAL) and a snapshot,
 * where it is renumbered with the rows (deleted rows below it are compacted away), and is
 * dropped with its index. */
Test(flat, graph_mark)
{
	struct flat_store *s = open_store(32);
	struct flat_index *ix;
	uint64_t mark, tag, rows;
	const char *del[] = { "key-3", "key-10", "key-60" };

	flat_bucket_create(s, "b", 0);
	flat_index_create(s, "b", "i", 8, DM_METRIC_L2, NULL, 0, 0);
	ix = flat_index_get(s, "b", "i");
	flat_mark_get(ix, &mark, &tag);
	cr_assert_eq(mark, 0);
	put_range(ix, 0, 50, 1);
	cr_assert_eq(flat_mark_set(ix, 49, 7), -EBUSY, "a mark below the row count");
	cr_assert_eq(flat_mark_set(ix, 51, 7), -EBUSY, "a mark past the row count");
	cr_assert_eq(flat_mark_set(ix, 50, 7), 0);
	put_range(ix, 50, 70, 1);            /* the tail */
	flat_delete(ix, del, 3);             /* two below the mark, one above */
	flat_index_put(ix);
	flat_abandon(s);                     /* a crash: the WAL replays the mark */

	s = open_store(32);
	ix = flat_index_get(s, "b", "i");
	flat_mark_get(ix, &mark, &tag);
	cr_assert_eq(mark, 50, "mark after WAL replay: %llu", (unsigned long long)mark);
	cr_assert_eq(tag, 7);
	cr_assert_eq(flat_checkpoint(s), 0);
	flat_index_put(ix);
	flat_abandon(s);

	s = open_store(32);                  /* from the snapshot: rows compacted */
	ix = flat_index_get(s, "b", "i");
	flat_mark_get(ix, &mark, &tag);
	flat_index_stats(ix, NULL, &rows, NULL);
	cr_assert_eq(rows, 67);
	cr_assert_eq(mark, 48, "mark after the snapshot: %llu", (unsigned long long)mark);
	cr_assert_eq(tag, 7);
	/* The rows below the mark are exactly the marked ones that are still alive. */
	for (uint64_t id = 0; id < rows; id++) {
		char key[32];
		unsigned k;
		int found;

		found = flat_get_ids(ix, &id, 1, check_key_cb, key);
		cr_assert_eq(found, 1);
		cr_assert_eq(sscanf(key, "key-%u", &k), 1);
		cr_assert_eq(id < mark, k < 50, "row %llu holds key-%u", (unsigned long long)id, k);
	}
	cr_assert_eq(flat_mark_set(ix, 67, 8), 0);
	flat_index_put(ix);
	cr_assert_eq(flat_index_delete(s, "b", "i"), 0);
	cr_assert_eq(flat_index_create(s, "b", "i", 8, DM_METRIC_L2, NULL, 0, 1), 0);
	ix = flat_index_get(s, "b", "i");
	flat_mark_get(ix, &mark, &tag);
	cr_assert_eq(mark, 0, "a re-created index has no mark");
	flat_index_put(ix);
	flat_close(s);
}

/* Entries for keys key-<from>..key-<to - 1> at generation gen's vectors (vcrc as the
 * indexer computes it), node ids 1000 + k. */
static size_t gentries(struct flat_gentry *e, char (*keys)[32], unsigned from, unsigned to,
		       unsigned gen, uint32_t dim)
{
	float v[64];

	for (unsigned k = from; k < to; k++) {
		size_t i = k - from;

		snprintf(keys[i], 32, "key-%u", k);
		vec_of(k, gen, v, dim);
		e[i] = (struct flat_gentry){ .id = 1000 + k, .key = keys[i],
					     .vcrc = flat_vec_crc(v, dim) };
	}
	return to - from;
}

static int gkey_cb(void *ctx, uint64_t id, const char *key)
{
	unsigned *n = ctx;
	unsigned k;

	cr_assert_eq(sscanf(key, "key-%u", &k), 1);
	cr_assert_eq(id, 1000 + k, "node %llu holds %s", (unsigned long long)id, key);
	(*n)++;
	return 0;
}

/* Online indexing: the mark moves over rows the entries hold (by key and vector, in row
 * order, dead rows passed), not past a row no entry holds or one re-put with another
 * vector; the key log and the mark survive a crash (WAL) and a snapshot (renumbered); a
 * new import empties the log. */
Test(flat, graph_gindex)
{
	struct flat_store *s = open_store(32);
	struct flat_gentry e[64];
	char keys[64][32];
	struct flat_index *ix;
	uint64_t mark, tag;
	unsigned got = 0;
	size_t n;

	flat_bucket_create(s, "b", 0);
	flat_index_create(s, "b", "i", 8, DM_METRIC_L2, NULL, 0, 0);
	ix = flat_index_get(s, "b", "i");
	put_range(ix, 0, 50, 1);
	n = gentries(e, keys, 50, 55, 1, 8);
	cr_assert_eq(flat_gindex_add(ix, 7, e, n, &mark), -ESTALE, "no mark yet");
	cr_assert_eq(flat_mark_set(ix, 50, 7), 0);
	put_range(ix, 50, 70, 1);            /* the tail: rows 50..69 */
	cr_assert_eq(flat_gindex_add(ix, 8, e, n, &mark), -ESTALE, "another generation");
	e[0].key = "";
	cr_assert_eq(flat_gindex_add(ix, 7, e, n, &mark), -EINVAL, "an empty key");
	n = gentries(e, keys, 55, 60, 1, 8);
	cr_assert_eq(flat_gindex_add(ix, 7, e, n, &mark), 0);
	cr_assert_eq(mark, 50, "row 50 is not held yet: %llu", (unsigned long long)mark);
	n = gentries(e, keys, 50, 55, 1, 8);
	cr_assert_eq(flat_gindex_add(ix, 7, e, n, &mark), 0);
	cr_assert_eq(mark, 60, "rows 50..59 held: %llu", (unsigned long long)mark);
	put_range(ix, 61, 62, 2);            /* key-61 re-put: row 61 dead, row 70 new */
	n = gentries(e, keys, 60, 62, 1, 8); /* key-61 at its old vector */
	cr_assert_eq(flat_gindex_add(ix, 7, e, n, &mark), 0);
	cr_assert_eq(mark, 62, "row 61 is dead: %llu", (unsigned long long)mark);
	n = gentries(e, keys, 62, 70, 2, 8); /* the wrong vectors */
	cr_assert_eq(flat_gindex_add(ix, 7, e, n, &mark), 0);
	cr_assert_eq(mark, 62, "vectors differ: %llu", (unsigned long long)mark);
	n = gentries(e, keys, 62, 71, 1, 8); /* key-70 before it exists */
	cr_assert_eq(flat_gindex_add(ix, 7, e, n, &mark), 0);
	cr_assert_eq(mark, 70, "row 70 (key-61 at gen 2) is not held: %llu",
		     (unsigned long long)mark);
	n = gentries(e, keys, 61, 62, 2, 8);
	e[0].id = 1061;
	cr_assert_eq(flat_gindex_add(ix, 7, e, n, &mark), 0);
	cr_assert_eq(mark, 71, "%llu", (unsigned long long)mark);
	put_range(ix, 70, 71, 1);            /* row 71: key-70, held already */
	cr_assert_eq(flat_gindex_add(ix, 7, NULL, 0, &mark), 0);
	cr_assert_eq(mark, 72, "the advance alone: %llu", (unsigned long long)mark);
	cr_assert_eq(flat_gindex_count(ix), 5 + 5 + 2 + 8 + 9 + 1);
	flat_index_put(ix);
	flat_abandon(s);                     /* a crash: the WAL replays it */

	s = open_store(32);
	ix = flat_index_get(s, "b", "i");
	flat_mark_get(ix, &mark, &tag);
	cr_assert_eq(mark, 72, "after WAL replay: %llu", (unsigned long long)mark);
	cr_assert_eq(flat_gindex_count(ix), 30);
	cr_assert_eq(flat_checkpoint(s), 0);
	flat_index_put(ix);
	flat_abandon(s);

	s = open_store(32);                  /* from the snapshot: row 61 compacted away */
	ix = flat_index_get(s, "b", "i");
	flat_mark_get(ix, &mark, &tag);
	cr_assert_eq(mark, 71, "after the snapshot: %llu", (unsigned long long)mark);
	cr_assert_eq(tag, 7);
	cr_assert_eq(flat_gindex_read(ix, 0, 1000, gkey_cb, &got), 30);
	cr_assert_eq(got, 30);
	got = 0;
	cr_assert_eq(flat_gindex_read(ix, 27, 5, gkey_cb, &got), 30);
	cr_assert_eq(got, 3, "a piece of the log");
	cr_assert_eq(flat_mark_set(ix, 71, 9), 0);
	cr_assert_eq(flat_gindex_count(ix), 0, "a new generation has an empty log");
	flat_index_put(ix);
	flat_close(s);
}
