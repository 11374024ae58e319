/* fuzz_flat_wal.c: libFuzzer target for the flat store's recovery: the input is cut into
 * records (u8 control | u16 length | payload), framed with valid lengths and CRCs so that
 * the payload decoders are reached, written as a WAL, and the store is opened (replay) and
 * closed again. Control byte: bits 0-2 the record type (0: leave the rest as a torn tail;
 * with bit 5 set, 7 more: the attribute and graph-mark records and unknown types), bits 3-4
 * the record's inflight count, bit 7 damage the record after framing (a CRC
 * failure in the middle of the log: replay must either cut it as a torn tail or refuse the
 * open, depending on the records after it). */
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flat.h"
#include "flat_wal.h"
#include "s3_scope.h"

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st; (void)flag; (void)f;
	return remove(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char dir[64], wal[96];
	struct dm_buf b = { 0 };
	/* with the scope hooks: a replayed index that declares a scope (s3_scope.h) places
	 * its rows in per-scope fragments */
	struct flat_opts o = { .frag_rows = 2, .no_sync = true, .scope = &s3_scope_ops };
	struct flat_store *s;
	size_t off = 0;
	uint64_t lsn = 0;
	int fd;

	snprintf(dir, sizeof(dir), "/tmp/dmann-fuzz-wal-XXXXXX");
	if (!mkdtemp(dir))
		abort();
	snprintf(wal, sizeof(wal), "%s/wal", dir);
	fd = open(wal, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		abort();
	while (size - off >= 3) {
		uint8_t type = data[off] & 7, inflight = (data[off] >> 3) & 3;

		if (type && (data[off] & 0x20))
			type = (uint8_t)(type + 7);       /* 8.. (FLAT_REC_ATTR, FLAT_REC_MARK, ..) */
		bool damage = data[off] & 0x80;
		uint16_t len;

		memcpy(&len, data + off + 1, 2);
		off += 3;
		len = (uint16_t)(len > size - off ? size - off : len);
		flat_rec_begin(&b);
		dm_buf_put(&b, data + off, len);
		off += len;
		/* a record type 0 stands for "leave the rest as a torn tail" */
		if (!type) {
			if (write(fd, b.p, b.n / 2) < 0)
				abort();
			break;
		}
		flat_rec_frame(&b, ++lsn, type, inflight);
		if (damage)
			b.p[b.n - 1 - (len ? data[off - 1] % len : 0)] ^= 0x20;
		if (write(fd, b.p, b.n) != (ssize_t)b.n)
			abort();
	}
	close(fd);
	dm_buf_free(&b);
	s = flat_open(dir, &o);
	if (s)
		flat_close(s);           /* also writes (and on the next open would read) a snapshot */
	if (s) {
		s = flat_open(dir, &o);
		if (!s)
			abort();           /* a snapshot we wrote must load */
		flat_abandon(s);
	}
	nftw(dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
	return 0;
}
