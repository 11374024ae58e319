/* fuzz_flat_image.c: libFuzzer target for the install of a bucket image
 * (flat_bucket_install, common/index/flat_image.c) into a small store that holds bucket b
 * (an index with rows, a mark, attributes) and bucket k beside it. Input byte 0, bit 0
 * clear: the rest is the image as it is. Set: the rest is cut into records (u8 control |
 * u16 length | payload) framed with valid lengths and CRCs after the magic and the name b,
 * with the end record's count right, so that the record decoders are reached. Control
 * bits 0-2 pick the type (the six an image holds, a DEL, a second end), bit 3 puts str "b"
 * before the payload, bit 4 then str "i". After an install that succeeded, the image of
 * the bucket taken again must install again (an image we wrote must be accepted), and
 * bucket k must be as it was. The first run installs a real image. */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flat.h"
#include "flat_wal.h"

static struct flat_store *s;
static uint64_t k_rows;

static void put_rows(struct flat_index *ix, unsigned n, unsigned gen)
{
	for (unsigned i = 0; i < n; i++) {
		char key[16];
		float v[4] = { (float)i, (float)gen, 1, 2 };

		snprintf(key, sizeof(key), "key-%u", i);
		if (flat_put(ix, &(struct flat_row_in){ key, v, "{}", 2, "x", 1 }, 1))
			abort();
	}
}

/* Install the current image of b again: it must be accepted. */
static void reinstall(void)
{
	uint8_t *img;
	size_t len;
	int rc = flat_bucket_image(s, "b", &img, &len);

	if (rc == -ENOENT)
		return;
	if (rc || flat_bucket_install(s, "b", img, len))
		abort();
	free(img);
}

static void setup(void)
{
	static char dir[64];
	struct flat_opts o = { .frag_rows = 4, .no_sync = true };
	struct flat_index *ix;
	uint64_t rows;

	snprintf(dir, sizeof(dir), "/tmp/dmann-fuzz-img-XXXXXX");
	if (!mkdtemp(dir))
		abort();
	s = flat_open(dir, &o);
	if (!s || flat_bucket_create(s, "b", 1) || flat_bucket_create(s, "k", 2) ||
	    flat_index_create(s, "b", "i", 4, DM_METRIC_L2, "{}", 2, 3) ||
	    flat_index_create(s, "k", "i", 4, DM_METRIC_L2, NULL, 0, 4) ||
	    flat_attr_set(s, "b", NULL, FLAT_ATTR_TAGS, "{\"a\":\"1\"}", 9) ||
	    flat_attr_set(s, "b", "i", FLAT_ATTR_TAGS, "{}", 2))
		abort();
	ix = flat_index_get(s, "b", "i");
	put_rows(ix, 9, 1);
	flat_index_stats(ix, NULL, &rows, NULL);
	if (flat_mark_set(ix, rows, 5))
		abort();
	put_rows(ix, 3, 2);
	flat_index_put(ix);
	ix = flat_index_get(s, "k", "i");
	put_rows(ix, 6, 3);
	flat_index_stats(ix, NULL, &k_rows, NULL);
	flat_index_put(ix);
	reinstall();
}

static void check_k(void)
{
	struct flat_index *ix = flat_index_get(s, "k", "i");
	uint64_t live;

	if (!ix)
		abort();
	flat_index_stats(ix, &live, NULL, NULL);
	if (live != k_rows)
		abort();
	flat_index_put(ix);
}

/* The framed form of the input (see the top). */
static void framed(const uint8_t *data, size_t size, struct dm_buf *img)
{
	static const uint32_t types[8] = { FLAT_REC_BUCKET_CREATE, FLAT_REC_INDEX_CREATE,
		FLAT_REC_PUT, FLAT_REC_MARK, FLAT_REC_GINDEX, FLAT_REC_ATTR, FLAT_REC_DEL,
		FLAT_REC_SNAP_END };
	struct dm_buf r = { 0 };
	uint64_t n = 0;
	size_t off = 0;

	dm_buf_put(img, "DMFLIMG1", 8);
	dm_buf_str(img, "b");
	while (size - off >= 3) {
		uint8_t c = data[off];
		uint16_t len;

		memcpy(&len, data + off + 1, 2);
		off += 3;
		len = (uint16_t)(len > size - off ? size - off : len);
		flat_rec_begin(&r);
		if (c & 8)
			dm_buf_str(&r, "b");
		if ((c & 8) && (c & 16))
			dm_buf_str(&r, "i");
		dm_buf_put(&r, data + off, len);
		off += len;
		flat_rec_frame(&r, 0, types[c & 7], 0);
		dm_buf_put(img, r.p, r.n);
		n++;
	}
	flat_rec_begin(&r);
	dm_buf_u64(&r, n);
	flat_rec_frame(&r, 0, FLAT_REC_SNAP_END, 0);
	dm_buf_put(img, r.p, r.n);
	dm_buf_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dm_buf img = { 0 };
	int rc;

	if (!s)
		setup();
	if (!size)
		return 0;
	if (data[0] & 1) {
		framed(data + 1, size - 1, &img);
		if (img.oom)
			abort();
		rc = flat_bucket_install(s, "b", img.p, img.n);
	} else {
		/* an empty rest would drop the bucket: keep that for the framed form */
		rc = size > 1 ? flat_bucket_install(s, "b", data + 1, size - 1) : 0;
	}
	if (rc && rc != -EBADMSG)
		abort();
	if (!rc)
		reinstall();
	check_k();
	dm_buf_free(&img);
	return 0;
}
