/* fuzz_mn_flat.c: libFuzzer target for the memory node's FL request parsers (mn_flat_handle:
 * FL_STATE, FL_FRAG, FL_GET, FL_MARK, FL_GINDEX, FL_GKEYS, FL_IMAGE, FL_CATCHUP) over a real
 * flat store holding one index of a few rows, and of FL_SNAPDELTA (mn_snapdelta_parse, then
 * mn_store_snapshot_delta on a small store with a snapshot, addresses as region offsets).
 * The first input byte picks the op, the rest is the request payload; the first run also
 * sends well-formed requests so that the answers' paths are reached (an image taken, read
 * and installed again through a catch-up). Ids of images and catch-ups are random: for
 * FL_IMAGE and FL_CATCHUP, bit 7 of the first byte puts the last id a TAKE or BEGIN gave
 * (bit 6: of a catch-up) after the phase, so that the requests on a known id are reached.
 * A catch-up whose image or log grows past 1 MiB is aborted (the bound of the real one,
 * DM_FL_IMAGE_MAX, is far beyond a fuzzer's memory). FL_CALL (the S3 operations) has its
 * own target, fuzz_s3_request. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "mn_flat_int.h"     /* the catch-up table (to bound it) and the idle time */
#include "mn_store.h"
#include "util/dm_buf.h"
#include "wire.h"

static struct mn_flat *f;
static struct mn_store *ms;
static char snap[96];
static uint64_t last_img, last_cu;      /* the last ids TAKE and BEGIN gave */

static int call(uint16_t op, const void *p, size_t n, struct dm_buf *out)
{
	uint32_t msg = 0;

	dm_buf_reset(out);
	return mn_flat_handle(f, op, p, n, out, &msg);
}

static void s3(const char *op, const char *json)
{
	struct dm_buf w = { 0 }, out = { 0 };

	dm_buf_str(&w, op);
	dm_buf_bytes(&w, json, strlen(json));
	if (call(DM_OP_FL_CALL, w.p, w.n, &out))
		abort();
	dm_buf_free(&w);
	dm_buf_free(&out);
}

/* zlib crc32 of n zero bytes (a fresh region is zeroed). */
static uint32_t crc_zero(size_t n)
{
	static const uint8_t z[4096];
	uint32_t c = 0;

	for (size_t i = 0; i < n; i += sizeof(z)) {
		size_t k = n - i < sizeof(z) ? n - i : sizeof(z);

		c = (uint32_t)crc32_z(c, z, k);
	}
	return c;
}

/* A catch-up of bkt from this store's own image (TAKE, READ, BEGIN, DATA, END), then one
 * more image kept for the inputs (its id and the catch-up's in last_img, last_cu). */
static void catch_up_self(struct dm_buf *w, struct dm_buf *out)
{
	struct dm_buf img = { 0 };
	uint64_t id, len, cid;

	w->n = 0;
	dm_buf_u32(w, DM_FL_IMAGE_TAKE);
	dm_buf_str(w, "bkt");
	if (call(DM_OP_FL_IMAGE, w->p, w->n, out))
		abort();
	id = dm_get_le64(out->p);
	len = dm_get_le64(out->p + 8);
	while (img.n < len) {
		w->n = 0;
		dm_buf_u32(w, DM_FL_IMAGE_READ);
		dm_buf_u64(w, id);
		dm_buf_u64(w, img.n);
		dm_buf_u32(w, 100);
		if (call(DM_OP_FL_IMAGE, w->p, w->n, out))
			abort();
		dm_buf_put(&img, out->p + 4, out->n - 4);
	}
	w->n = 0;
	dm_buf_u32(w, DM_FL_CATCHUP_BEGIN);
	dm_buf_str(w, "bkt");
	if (call(DM_OP_FL_CATCHUP, w->p, w->n, out))
		abort();
	cid = dm_get_le64(out->p);
	w->n = 0;
	dm_buf_u32(w, DM_FL_CATCHUP_DATA);
	dm_buf_u64(w, cid);
	dm_buf_u64(w, 0);
	dm_buf_bytes(w, img.p, img.n);
	if (call(DM_OP_FL_CATCHUP, w->p, w->n, out))
		abort();
	w->n = 0;
	dm_buf_u32(w, DM_FL_CATCHUP_END);
	dm_buf_u64(w, cid);
	dm_buf_put(w, (uint8_t[]){ 1 }, 1);
	if (call(DM_OP_FL_CATCHUP, w->p, w->n, out))
		abort();               /* an image we took must install */
	w->n = 0;
	dm_buf_u32(w, DM_FL_IMAGE_TAKE);
	dm_buf_str(w, "bkt");
	if (call(DM_OP_FL_IMAGE, w->p, w->n, out))
		abort();
	last_img = dm_get_le64(out->p);
	w->n = 0;
	dm_buf_u32(w, DM_FL_CATCHUP_BEGIN);
	dm_buf_str(w, "bkt");
	if (call(DM_OP_FL_CATCHUP, w->p, w->n, out))
		abort();
	last_cu = dm_get_le64(out->p);
	dm_buf_free(&img);
}

/* Abort catch-ups grown past 1 MiB (image or log). */
static void bound_catchups(void)
{
	struct dm_buf w = { 0 }, out = { 0 };
	uint64_t big[MN_CATCHUPS_MAX];
	size_t n = 0;

	pthread_mutex_lock(&f->cu.mu);
	for (size_t i = 0; i < MN_CATCHUPS_MAX; i++)
		if (f->cu.cu[i] && f->cu.cu[i]->img.n + f->cu.cu[i]->log.n > (1u << 20))
			big[n++] = f->cu.cu[i]->id;
	pthread_mutex_unlock(&f->cu.mu);
	for (size_t i = 0; i < n; i++) {
		w.n = 0;
		dm_buf_u32(&w, DM_FL_CATCHUP_ABORT);
		dm_buf_u64(&w, big[i]);
		if (call(DM_OP_FL_CATCHUP, w.p, w.n, &out))
			abort();
	}
	dm_buf_free(&w);
	dm_buf_free(&out);
}

static void setup(void)
{
	static char dir[64];
	struct dm_buf w = { 0 }, out = { 0 };

	snprintf(dir, sizeof(dir), "/tmp/dmann-fuzz-mnflat-XXXXXX");
	if (!mkdtemp(dir))
		abort();
	setenv("DMANN_FLAT_FRAG_ROWS", "16", 1);   /* small fragments for the indexes images make */
	mn_flat_idle_s = 5;
	f = mn_flat_open(dir, 0, NULL);
	if (!f)
		abort();
	/* The store of FL_SNAPDELTA: one mutable and one immutable object, a full snapshot. */
	uint64_t off;

	ms = mn_store_new(1 << 20, -1, DM_HUGE_OFF);
	snprintf(snap, sizeof(snap), "%s/region.snap", dir);
	if (!ms || mn_store_alloc(ms, 1, 65536, &off) ||
	    mn_store_commit(ms, 1, 65536, crc_zero(65536), MN_OBJ_MUTABLE) ||
	    mn_store_alloc(ms, 2, 4096, &off) || mn_store_commit(ms, 2, 4096, crc_zero(4096), 0) ||
	    mn_store_snapshot(ms, snap))
		abort();
	s3("CreateVectorBucket", "{\"vectorBucketName\":\"bkt\"}");
	s3("CreateIndex", "{\"vectorBucketName\":\"bkt\",\"indexName\":\"idx\",\"dataType\":"
	   "\"float32\",\"dimension\":2,\"distanceMetric\":\"euclidean\"}");
	s3("PutVectors", "{\"vectorBucketName\":\"bkt\",\"indexName\":\"idx\",\"vectors\":["
	   "{\"key\":\"a\",\"data\":{\"float32\":[1,2]},\"metadata\":{\"c\":\"x\"}},"
	   "{\"key\":\"b\",\"data\":{\"float32\":[3,4]}}]}");
	/* Well-formed requests: the state (for the creation time), a get, a mark. */
	dm_buf_str(&w, "bkt");
	dm_buf_str(&w, "idx");
	if (call(DM_OP_FL_STATE, w.p, w.n, &out))
		abort();
	struct dm_rbuf rb = { .p = out.p, .n = out.n };
	(void)dm_rbuf_u64(&rb);
	uint64_t created = dm_rbuf_u64(&rb);

	dm_buf_u64(&w, created);
	dm_buf_u32(&w, 2);
	dm_buf_str(&w, "a");
	dm_buf_str(&w, "zz");
	if (call(DM_OP_FL_GET, w.p, w.n, &out))
		abort();
	w.n = 0;
	dm_buf_str(&w, "bkt");
	dm_buf_str(&w, "idx");
	dm_buf_u64(&w, created);
	dm_buf_u64(&w, 2);
	dm_buf_u64(&w, 1);
	if (call(DM_OP_FL_MARK, w.p, w.n, &out))
		abort();
	w.n = 0;
	dm_buf_str(&w, "bkt");
	dm_buf_str(&w, "idx");
	dm_buf_u64(&w, created);
	dm_buf_u64(&w, 1);
	dm_buf_u32(&w, 1);
	dm_buf_u64(&w, 7);
	dm_buf_str(&w, "a");
	dm_buf_u32(&w, 0);
	if (call(DM_OP_FL_GINDEX, w.p, w.n, &out))
		abort();
	catch_up_self(&w, &out);
	dm_buf_free(&w);
	dm_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint16_t ops[] = { DM_OP_FL_STATE, DM_OP_FL_FRAG, DM_OP_FL_GET,
					DM_OP_FL_MARK, DM_OP_FL_GINDEX, DM_OP_FL_GKEYS,
					DM_OP_FL_IMAGE, DM_OP_FL_CATCHUP };
	struct dm_buf out = { 0 };
	uint16_t op;
	int rc;

	if (!f)
		setup();
	if (!size)
		return 0;
	if ((data[0] & 0x3f) % (DM_ARRAY_SIZE(ops) + 1) == DM_ARRAY_SIZE(ops)) {
		struct mn_range *r;
		uint32_t n;
		bool full;

		if (!mn_snapdelta_parse(data + 1, size - 1, 0, &r, &n)) {
			(void)mn_store_snapshot_delta(ms, snap, r, n, &full);
			free(r);
		}
		return 0;
	}
	op = ops[(data[0] & 0x3f) % (DM_ARRAY_SIZE(ops) + 1)];
	if ((op == DM_OP_FL_IMAGE || op == DM_OP_FL_CATCHUP) && (data[0] & 0x80) && size >= 13) {
		/* a known id after the phase */
		uint8_t *req = malloc(size - 1);

		if (!req)
			abort();
		memcpy(req, data + 1, size - 1);
		dm_put_le64(req + 4, (data[0] & 0x40) ? last_cu : last_img);
		rc = call(op, req, size - 1, &out);
		free(req);
	} else {
		rc = call(op, data + 1, size - 1, &out);
	}
	/* Remember the ids TAKE and BEGIN give (u64 id first in the answer). */
	if (!rc && size >= 5 && out.n >= 8 && dm_get_le32(data + 1) == 0) {
		if (op == DM_OP_FL_IMAGE)
			last_img = dm_get_le64(out.p);
		else if (op == DM_OP_FL_CATCHUP)
			last_cu = dm_get_le64(out.p);
	}
	bound_catchups();
	dm_buf_free(&out);
	return 0;
}
