/* test_mn_flat.c: the memory node's catch-up of a stale replica (mn/mn_catchup.c, wire.h
 * FL_IMAGE and FL_CATCHUP) through mn_flat_handle, on two stores S (caught up) and X
 * (stale) in temporary directories: S gets writes X misses, X begins a catch-up, writes
 * arrive on both (and one on X only), S's image goes to X in pieces, X installs it and runs
 * the logged writes again; then X answers GetIndex/GetVectors/ListVectors exactly as S,
 * its epoch changed, also after a restart. Ids unknown, replaced or expired give -ESTALE,
 * pieces out of order -EINVAL, images past the bound -EBUSY; an END with no bucket at the
 * source drops it; the counters count. A scoped index's FL_STATE carries its fragments'
 * scope labels, also on a replica caught up from an image. */
#include <criterion/criterion.h>

#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mn_flat_int.h"    /* the idle time's test hook */
#include "s3_scope.h"

static char tdir[64];

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st; (void)flag; (void)f;
	return remove(p);
}

static void setup(void)
{
	snprintf(tdir, sizeof(tdir), "/tmp/dmann-mnflat-XXXXXX");
	cr_assert_not_null(mkdtemp(tdir));
	setenv("DMANN_FLAT_FRAG_ROWS", "16", 1);       /* several fragments */
	mn_flat_idle_s = DM_FL_IMAGE_IDLE_S;
}

static void teardown(void)
{
	nftw(tdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(mn_flat, .init = setup, .fini = teardown);

static struct mn_flat *open_mn(const char *name, uint32_t node)
{
	char dir[128];
	struct mn_flat *f;

	snprintf(dir, sizeof(dir), "%s/%s", tdir, name);
	f = mn_flat_open(dir, node, NULL);
	cr_assert_not_null(f, "mn_flat_open %s: %s", dir, strerror(errno));
	return f;
}

static int handle(struct mn_flat *f, uint16_t op, const struct dm_buf *req, struct dm_buf *out)
{
	uint32_t msg = 0;

	dm_buf_reset(out);
	return mn_flat_handle(f, op, req->p, req->n, out, &msg);
}

/* FL_CALL of an S3 operation with a printf-formatted body: the HTTP status; the response
 * body (malloc'ed, NUL-terminated) in *body if asked for. */
static int s3(struct mn_flat *f, char **body, const char *op, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int s3(struct mn_flat *f, char **body, const char *op, const char *fmt, ...)
{
	struct dm_buf req = { 0 }, out = { 0 };
	char err[128], *json;
	va_list ap;
	struct dm_rbuf rd;
	uint32_t n;
	const void *p;
	int status;

	va_start(ap, fmt);
	cr_assert_geq(vasprintf(&json, fmt, ap), 0);
	va_end(ap);
	dm_buf_str(&req, op);
	dm_buf_bytes(&req, json, strlen(json));
	cr_assert_eq(handle(f, DM_OP_FL_CALL, &req, &out), 0);
	rd = (struct dm_rbuf){ .p = out.p, .n = out.n };
	status = dm_rbuf_u16(&rd);
	cr_assert(dm_rbuf_str(&rd, err, sizeof(err)));
	p = dm_rbuf_bytes(&rd, &n, UINT32_MAX);
	cr_assert(!rd.bad && rd.at == rd.n);
	if (body)
		*body = strndup(p, n);
	free(json);
	dm_buf_free(&req);
	dm_buf_free(&out);
	return status;
}

#define IX "\"vectorBucketName\":\"bkt\",\"indexName\":\"idx\""

/* PutVectors of keys k<from>..k<to - 1> at generation gen. */
static void put(struct mn_flat *f, unsigned from, unsigned to, unsigned gen)
{
	struct dm_buf w = { 0 };

	dm_buf_printf(&w, "{" IX ",\"vectors\":[");
	for (unsigned k = from; k < to; k++)
		dm_buf_printf(&w, "%s{\"key\":\"k%u\",\"data\":{\"float32\":[%u,%u,%u.5,-1]},"
			      "\"metadata\":{\"gen\":%u,\"tag\":\"t%u\"}}", k > from ? "," : "",
			      k, gen, k, k, gen, k % 3);
	dm_buf_printf(&w, "]}");
	cr_assert_eq(s3(f, NULL, "PutVectors", "%s", (char *)w.p), 200);
	dm_buf_free(&w);
}

static void make_index(struct mn_flat *f)
{
	cr_assert_eq(s3(f, NULL, "CreateVectorBucket", "{\"vectorBucketName\":\"bkt\"}"), 200);
	cr_assert_eq(s3(f, NULL, "CreateIndex", "{" IX ",\"dataType\":\"float32\",\"dimension\":4,"
			"\"distanceMetric\":\"euclidean\",\"metadataConfiguration\":"
			"{\"nonFilterableMetadataKeys\":[\"tag\"]}}"), 200);
	put(f, 0, 20, 1);
}

/* GetIndex, GetVectors of k0..k39 and kx, ListVectors (one page) of f, as one string. */
static char *answers(struct mn_flat *f)
{
	struct dm_buf w = { 0 }, keys = { 0 };
	char *a, *g, *l;

	for (unsigned k = 0; k < 40; k++)
		dm_buf_printf(&keys, "\"k%u\",", k);
	dm_buf_printf(&keys, "\"kx\"");
	cr_assert_eq(s3(f, &a, "GetIndex", "{" IX "}"), 200);
	cr_assert_eq(s3(f, &g, "GetVectors", "{" IX ",\"keys\":[%s],\"returnData\":true,"
			"\"returnMetadata\":true}", (char *)keys.p), 200);
	cr_assert_eq(s3(f, &l, "ListVectors", "{" IX ",\"maxResults\":1000,\"returnData\":true,"
			"\"returnMetadata\":true}"), 200);
	cr_assert_null(strstr(l, "nextToken"));
	dm_buf_printf(&w, "%s\n%s\n%s", a, g, l);
	free(a); free(g); free(l);
	dm_buf_free(&keys);
	return (char *)w.p;
}

static uint64_t epoch_of(struct mn_flat *f)
{
	struct dm_buf req = { 0 }, out = { 0 };
	uint64_t e;

	dm_buf_str(&req, "bkt");
	dm_buf_str(&req, "idx");
	cr_assert_eq(handle(f, DM_OP_FL_STATE, &req, &out), 0);
	e = dm_get_le64(out.p);
	dm_buf_free(&req);
	dm_buf_free(&out);
	return e;
}

/* FL_IMAGE / FL_CATCHUP requests: phase, then fields as given by the format (u: u32,
 * U: u64, s: str, c: u8, y: bytes (pointer, length)). */
static int fl(struct mn_flat *f, uint16_t op, struct dm_buf *out, uint32_t phase,
	      const char *fmt, ...)
{
	struct dm_buf req = { 0 }, tmp = { 0 };
	va_list ap;
	int rc;

	dm_buf_u32(&req, phase);
	va_start(ap, fmt);
	for (const char *c = fmt; *c; c++) {
		switch (*c) {
		case 'u': dm_buf_u32(&req, va_arg(ap, uint32_t)); break;
		case 'U': dm_buf_u64(&req, va_arg(ap, uint64_t)); break;
		case 's': dm_buf_str(&req, va_arg(ap, const char *)); break;
		case 'c': dm_buf_put(&req, (uint8_t[]){ (uint8_t)va_arg(ap, int) }, 1); break;
		case 'y': {
			const void *p = va_arg(ap, const void *);

			dm_buf_bytes(&req, p, va_arg(ap, size_t));
			break;
		}
		}
	}
	va_end(ap);
	rc = handle(f, op, &req, out ? out : &tmp);
	dm_buf_free(&req);
	dm_buf_free(&tmp);
	return rc;
}

static uint64_t u64_at(const struct dm_buf *b, size_t off)
{
	cr_assert_geq(b->n, off + 8);
	return dm_get_le64(b->p + off);
}

/* Copy image id of S (len bytes) to catch-up cid of X in pieces of `piece` bytes. */
static void copy_image(struct mn_flat *s, uint64_t id, uint64_t len, struct mn_flat *x,
		       uint64_t cid, uint32_t piece)
{
	struct dm_buf out = { 0 };
	uint64_t off = 0;

	while (off < len) {
		uint32_t n;

		cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_READ, "UUu", id, off, piece), 0);
		n = dm_get_le32(out.p);
		cr_assert_eq(out.n, 4 + (size_t)n);
		cr_assert(n > 0 && n <= piece);
		cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_DATA, "UUy", cid, off,
				out.p + 4, (size_t)n), 0);
		if (off == 0)     /* the same piece again (a retry), and one ahead: out of order */
			cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_DATA, "UUy", cid,
					off, out.p + 4, (size_t)n), -EINVAL);
		off += n;
	}
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_READ, "UUu", id, len, piece), 0);
	cr_assert_eq(out.n, 4, "READ at the end: no bytes");
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_READ, "UUu", id, len + 1, piece),
		     -EINVAL, "READ past the end");
	dm_buf_free(&out);
}

static uint64_t metric(struct mn_flat *f, const char *name)
{
	char *text = NULL, *at, want[128];
	size_t n = 0;
	FILE *m = open_memstream(&text, &n);
	unsigned long long v = ~0ull;

	mn_flat_metrics(f, m);
	fclose(m);
	snprintf(want, sizeof(want), "\n%s{node=", name);
	at = strstr(text, want);
	cr_assert_not_null(at, "%s missing", name);
	cr_assert_eq(sscanf(strchr(at, '}') + 1, "%llu", &v), 1);
	free(text);
	return v;
}

Test(mn_flat, catch_up_a_stale_replica)
{
	struct mn_flat *s = open_mn("S", 0), *x = open_mn("X", 1);
	struct dm_buf out = { 0 };
	uint64_t cid, old_cid, id, len, epoch;
	char *want, *got, *body;

	make_index(s);
	make_index(x);
	put(s, 39, 40, 1);                  /* kx's stand-in: k39 on both, deleted on S only */
	put(x, 39, 40, 1);
	cr_assert_eq(s3(x, NULL, "CreateVectorBucket", "{\"vectorBucketName\":\"other\"}"), 200);
	/* X is away: S gets more rows, deletes, a re-put. */
	put(s, 20, 30, 1);
	cr_assert_eq(s3(s, NULL, "DeleteVectors", "{" IX ",\"keys\":[\"k1\",\"k2\",\"k39\"]}"),
		     200);
	put(s, 5, 6, 2);
	cr_assert_eq(s3(s, NULL, "TagResource", "{\"resourceArn\":\"arn:aws:s3vectors:us-east-1:"
			"000000000000:bucket/bkt\",\"tags\":{\"t\":\"v\"}}"), 200);

	/* X begins; a BEGIN again replaces the first. */
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, &out, DM_FL_CATCHUP_BEGIN, "s", "bkt"), 0);
	old_cid = u64_at(&out, 0);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, &out, DM_FL_CATCHUP_BEGIN, "s", "bkt"), 0);
	cid = u64_at(&out, 0);
	cr_assert_neq(cid, old_cid);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_DATA, "UUy", old_cid, 0ull,
			"x", (size_t)1), -ESTALE, "a replaced catch-up");
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_BEGIN, "s", ""), -EBADMSG);
	/* Writes during the catch-up: k30 on both (before S's image is taken: in it and in
	 * X's log), k3 on X only (the image has k3 too: the log's order wins), one to
	 * another bucket (not logged). */
	put(s, 30, 31, 1);
	put(x, 30, 31, 1);
	put(x, 3, 4, 7);
	cr_assert_eq(s3(x, NULL, "TagResource", "{\"resourceArn\":\"arn:aws:s3vectors:us-east-1:"
			"000000000000:bucket/other\",\"tags\":{\"o\":\"v\"}}"), 200);

	/* S's image, to X in pieces. */
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_TAKE, "s", "nope"), -ENOENT);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_TAKE, "s", "bkt"), 0);
	id = u64_at(&out, 0);
	len = u64_at(&out, 8);
	cr_assert_gt(len, 1000);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_READ, "UUu", id + 1, 0ull, 100u),
		     -ESTALE, "an unknown image");
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_READ, "UUu", id, 0ull, 0u), -EINVAL);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_READ, "UUu", id, 0ull,
			DM_FL_IMAGE_CHUNK + 1), -EINVAL);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_DATA, "UUy", cid, 5ull, "x",
			(size_t)1), -EINVAL, "a piece ahead of the bytes received");
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_DATA, "UUy", cid + 1, 0ull, "x",
			(size_t)1), -ESTALE, "an unknown catch-up");
	copy_image(s, id, len, x, cid, 333);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_END, "Uc", cid + 1, 1),
		     -ESTALE);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_END, "Uc", cid, 2), -EBADMSG);
	epoch = epoch_of(x);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_END, "Uc", cid, 1), 0);
	cr_assert_neq(epoch_of(x), epoch, "the epoch did not change");
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_END, "Uc", cid, 1), -ESTALE,
		     "a catch-up ends once");

	/* The log ran after the image: X's k3 is the one X alone got. */
	cr_assert_eq(s3(x, &body, "GetVectors", "{" IX ",\"keys\":[\"k3\"],\"returnData\":true,"
			"\"returnMetadata\":true}"), 200);
	cr_assert_not_null(strstr(body, "\"gen\": 7") ? body : strstr(body, "\"gen\":7"),
			   "k3 is not the logged write's: %s", body);
	free(body);
	put(s, 3, 4, 7);                    /* now S has it too */
	want = answers(s);
	got = answers(x);
	cr_assert_str_eq(got, want);
	free(got);
	cr_assert_eq(s3(x, &body, "ListTagsForResource", "{\"resourceArn\":\"arn:aws:s3vectors:"
			"us-east-1:000000000000:bucket/bkt\"}"), 200);
	cr_assert_not_null(strstr(body, "\"t\""), "the bucket's tags: %s", body);
	free(body);
	cr_assert_eq(s3(x, NULL, "GetVectorBucket", "{\"vectorBucketName\":\"other\"}"), 200);

	cr_assert_eq(metric(s, "dmann_mn_flat_images_total"), 1);
	cr_assert_eq(metric(x, "dmann_mn_flat_catchups_total"), 1);
	cr_assert_eq(metric(x, "dmann_mn_flat_catchup_writes_total"), 2);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, NULL, DM_FL_IMAGE_DROP, "U", id), 0);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_READ, "UUu", id, 0ull, 10u), -ESTALE,
		     "a dropped image");
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, NULL, DM_FL_IMAGE_DROP, "U", id), 0);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_ABORT, "U", cid), 0);

	/* Durable: X restarted answers the same. */
	mn_flat_close(x);
	x = open_mn("X", 1);
	got = answers(x);
	cr_assert_str_eq(got, want);
	free(got);
	free(want);

	/* The source has no such bucket any more: END with exists 0 drops it. */
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, &out, DM_FL_CATCHUP_BEGIN, "s", "bkt"), 0);
	cid = u64_at(&out, 0);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_END, "Uc", cid, 0), 0);
	cr_assert_eq(s3(x, NULL, "GetVectorBucket", "{\"vectorBucketName\":\"bkt\"}"), 404);
	cr_assert_eq(s3(x, NULL, "GetVectorBucket", "{\"vectorBucketName\":\"other\"}"), 200);
	/* An image of nothing with exists 1, and a bad image: refused, nothing changed. */
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, &out, DM_FL_CATCHUP_BEGIN, "s", "other"), 0);
	cid = u64_at(&out, 0);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_END, "Uc", cid, 1), -EBADMSG);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, &out, DM_FL_CATCHUP_BEGIN, "s", "other"), 0);
	cid = u64_at(&out, 0);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_DATA, "UUy", cid, 0ull,
			"DMFLIMG1garbage", (size_t)15), 0);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_END, "Uc", cid, 1), -EBADMSG);
	cr_assert_eq(s3(x, NULL, "GetVectorBucket", "{\"vectorBucketName\":\"other\"}"), 200);
	cr_assert_eq(metric(x, "dmann_mn_flat_catchups_total"), 1, "after the restart");
	dm_buf_free(&out);
	mn_flat_close(x);
	mn_flat_close(s);
}

Test(mn_flat, image_bound_and_idle_expiry)
{
	struct mn_flat *s = open_mn("S", 0);
	struct dm_buf out = { 0 };
	uint64_t ids[MN_IMAGES_MAX], id, cid;

	make_index(s);
	for (unsigned i = 0; i < MN_IMAGES_MAX; i++) {
		cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_TAKE, "s", "bkt"), 0);
		ids[i] = u64_at(&out, 0);
	}
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_TAKE, "s", "bkt"), -EBUSY);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, NULL, DM_FL_IMAGE_DROP, "U", ids[1]), 0);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_TAKE, "s", "bkt"), 0);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, 7, ""), -EBADMSG, "an unknown phase");
	cr_assert_eq(fl(s, DM_OP_FL_CATCHUP, &out, 9, ""), -EBADMSG);

	/* Idle images and catch-ups go (1 s here); a READ keeps an image. */
	mn_flat_idle_s = 1;
	cr_assert_eq(fl(s, DM_OP_FL_CATCHUP, &out, DM_FL_CATCHUP_BEGIN, "s", "bkt"), 0);
	cid = u64_at(&out, 0);
	usleep(700000);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_READ, "UUu", ids[0], 0ull, 8u), 0);
	usleep(700000);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_READ, "UUu", ids[0], 0ull, 8u), 0,
		     "read 0.7 s ago: kept");
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_READ, "UUu", ids[2], 0ull, 8u),
		     -ESTALE, "idle 1.4 s: freed");
	cr_assert_eq(fl(s, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_DATA, "UUy", cid, 0ull, "x",
			(size_t)1), -ESTALE, "an idle catch-up is dropped");
	for (unsigned i = 0; i < MN_IMAGES_MAX - 1; i++)
		cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_TAKE, "s", "bkt"), 0,
			     "room again");
	id = u64_at(&out, 0);
	cr_assert_neq(id, 0);
	dm_buf_free(&out);
	mn_flat_close(s);
}

/* FL_STATE of a scoped index (s3_scope.h): its fragments' labels in the trailer, each
 * fragment of one scope value; a replica caught up from an image groups its rows the same
 * way (the labels are recomputed from the rows). Rows k0..k39 have tag t0..t2. */
static void scoped_state(struct mn_flat *f, uint64_t *per_label_rows)
{
	struct dm_buf req = { 0 }, out = { 0 };
	struct dm_rbuf rd;
	uint32_t nfrag, clen, rows[64];

	dm_buf_str(&req, "bkt");
	dm_buf_str(&req, "idx");
	cr_assert_eq(handle(f, DM_OP_FL_STATE, &req, &out), 0);
	rd = (struct dm_rbuf){ .p = out.p, .n = out.n };
	dm_rbuf_u64(&rd);
	dm_rbuf_u64(&rd);
	cr_assert_eq(dm_rbuf_u32(&rd), 4);
	dm_rbuf_u32(&rd);
	dm_rbuf_bytes(&rd, &clen, UINT32_MAX);
	cr_assert_eq(dm_rbuf_u32(&rd), 16);
	nfrag = dm_rbuf_u32(&rd);
	cr_assert(nfrag >= 3 && nfrag <= 64, "%u fragments", nfrag);
	for (uint32_t i = 0; i < nfrag; i++) {
		rows[i] = dm_rbuf_u32(&rd);
		dm_rbuf_u32(&rd);
	}
	dm_rbuf_u64(&rd);
	dm_rbuf_u64(&rd);
	dm_rbuf_u64(&rd);
	cr_assert_eq(rd.n - rd.at, (size_t)nfrag * 8, "the labels' trailer");
	memset(per_label_rows, 0, 3 * sizeof(uint64_t));
	for (uint32_t i = 0; i < nfrag; i++) {
		uint64_t l = dm_rbuf_u64(&rd);
		int t = -1;

		for (int k = 0; k < 3; k++) {
			char v[4];

			snprintf(v, sizeof(v), "t%d", k);
			if (l == s3_scope_label(v, 2))
				t = k;
		}
		cr_assert_geq(t, 0, "fragment %u: a label of no tag", i);
		per_label_rows[t] += rows[i];
	}
	cr_assert(!rd.bad && rd.at == rd.n);
	dm_buf_free(&req);
	dm_buf_free(&out);
}

Test(mn_flat, scoped_index_state_and_catch_up)
{
	struct mn_flat *s = open_mn("S", 0), *x = open_mn("X", 1);
	struct dm_buf out = { 0 };
	uint64_t cid, id, len, on_s[3], on_x[3];

	for (int i = 0; i < 2; i++) {
		struct mn_flat *f = i ? x : s;

		cr_assert_eq(s3(f, NULL, "CreateVectorBucket", "{\"vectorBucketName\":\"bkt\"}"),
			     200);
		cr_assert_eq(s3(f, NULL, "CreateIndex", "{" IX ",\"dataType\":\"float32\","
				"\"dimension\":4,\"distanceMetric\":\"euclidean\",\"tags\":{"
				"\"dmann:scope\":\"tag\"}}"), 200);
	}
	put(s, 0, 40, 1);           /* 40 rows over t0..t2: 14, 13, 13 */
	scoped_state(s, on_s);
	cr_assert(on_s[0] == 14 && on_s[1] == 13 && on_s[2] == 13);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, &out, DM_FL_CATCHUP_BEGIN, "s", "bkt"), 0);
	cid = u64_at(&out, 0);
	cr_assert_eq(fl(s, DM_OP_FL_IMAGE, &out, DM_FL_IMAGE_TAKE, "s", "bkt"), 0);
	id = u64_at(&out, 0);
	len = u64_at(&out, 8);
	copy_image(s, id, len, x, cid, 4096);
	cr_assert_eq(fl(x, DM_OP_FL_CATCHUP, NULL, DM_FL_CATCHUP_END, "Uc", cid, 1), 0);
	scoped_state(x, on_x);
	cr_assert(on_x[0] == 14 && on_x[1] == 13 && on_x[2] == 13);
	dm_buf_free(&out);
	mn_flat_close(x);
	mn_flat_close(s);
}
