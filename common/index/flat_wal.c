/* flat_wal.c: the flat store's write-ahead log: record framing (CRC32C), appends with group
 * commit (writers frame and write their records under walmu; one of the writers waiting for
 * durability runs fdatasync for all records written so far, the others wait for its result),
 * and replay at open, which tells a torn tail from corruption of acknowledged records. */
#include "flat_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int flat_fault_sync;

/* fdatasync of the WAL (or the test hook's failure). */
static int wal_sync(struct flat_store *s)
{
	if (__atomic_load_n(&flat_fault_sync, __ATOMIC_RELAXED) > 0 &&
	    __atomic_sub_fetch(&flat_fault_sync, 1, __ATOMIC_RELAXED) == 0)
		return -EIO;
	return fdatasync(s->walfd) ? -errno : 0;
}

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int j = 0; j < 8; j++)
			c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
		crc_table[i] = c;
	}
}

/* CRC32C (Castagnoli), table-driven; start with crc = 0. */
uint32_t flat_crc32c(uint32_t crc, const void *p, size_t n)
{
	const uint8_t *b = p;

	pthread_once(&crc_once, crc_init);
	crc = ~crc;
	while (n--)
		crc = crc_table[(crc ^ *b++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

/* ---------------------------------------------------------------- framing ---------- */

void flat_rec_begin(struct dm_buf *b)
{
	static const uint8_t z[FLAT_REC_HDR];

	dm_buf_reset(b);
	dm_buf_put(b, z, sizeof(z));
}

void flat_rec_frame(struct dm_buf *b, uint64_t lsn, uint32_t type, uint32_t inflight)
{
	uint32_t plen = (uint32_t)(b->n - FLAT_REC_HDR);

	dm_put_le64(b->p + 8, lsn);
	dm_put_le32(b->p + 16, type | (DM_MIN(inflight, FLAT_INFLIGHT_MAX) << 8));
	dm_put_le32(b->p, plen);
	dm_put_le32(b->p + 4, flat_crc32c(0, b->p + 8, b->n - 8));
}

int flat_rec_parse(const uint8_t *p, size_t n, struct flat_rec *r)
{
	uint32_t len, tw;

	if (n < FLAT_REC_HDR)
		return 0;
	len = dm_get_le32(p);
	if (len > FLAT_REC_MAX)
		return -EBADMSG;
	if (n - FLAT_REC_HDR < len)
		return 0;
	if (flat_crc32c(0, p + 8, (size_t)len + 12) != dm_get_le32(p + 4))
		return 0;
	tw = dm_get_le32(p + 16);
	r->lsn = dm_get_le64(p + 8);
	r->type = tw & 0xff;
	r->inflight = tw >> 8;
	r->payload = p + FLAT_REC_HDR;
	r->len = len;
	return 1;
}

bool flat_rd_name(struct dm_rbuf *r, char *out, size_t max)
{
	if (!dm_rbuf_str(r, out, max + 1) || !out[0]) {
		r->bad = true;
		return false;
	}
	return true;
}

/* ---------------------------------------------------------------- append ----------- */

int flat_wal_write(struct flat_store *s, struct dm_buf *b, uint32_t type, uint64_t *lsn)
{
	uint64_t l;
	int rc;

	if (b->oom)
		return -ENOMEM;
	if (b->n - FLAT_REC_HDR > FLAT_REC_MAX)
		return -E2BIG;
	pthread_mutex_lock(&s->walmu);
	rc = s->wal_err;
	if (rc)
		goto out_unlock;
	l = s->lsn + 1;
	flat_rec_frame(b, l, type, (uint32_t)DM_MIN(l - 1 - s->durable_lsn, FLAT_INFLIGHT_MAX));
	rc = flat_write_all(s->walfd, b->p, b->n, (off_t)s->wal_bytes);
	if (rc) {
		/* Cut the partial record so that later appends stay parseable; if even that
		 * fails the log's end is unknown and the store takes no more writes. */
		dm_err("flat: WAL %s: append at offset %llu failed: %s", s->wal_path,
		       (unsigned long long)s->wal_bytes, strerror(-rc));
		if (ftruncate(s->walfd, (off_t)s->wal_bytes)) {
			dm_err("flat: WAL %s: cannot cut the failed append: %s; refusing writes",
			       s->wal_path, strerror(errno));
			s->wal_err = rc;
		}
		goto out_unlock;
	}
	s->lsn = l;
	s->wal_bytes += b->n;
	s->n_records++;
	if (s->o.no_sync) {
		s->durable_lsn = l;
	} else if (s->o.no_group_commit) {
		/* One fdatasync per record, under walmu (the behaviour before group commit). */
		s->n_syncs++;
		rc = wal_sync(s);
		if (rc) {
			s->wal_err = rc;
			dm_err("flat: WAL %s: fdatasync failed: %s; refusing writes", s->wal_path,
			       strerror(-rc));
			goto out_unlock;
		}
		s->durable_lsn = l;
	}
	*lsn = l;
out_unlock:
	pthread_mutex_unlock(&s->walmu);
	return rc;
}

int flat_wal_wait(struct flat_store *s, uint64_t lsn)
{
	int rc;

	pthread_mutex_lock(&s->walmu);
	for (;;) {
		if (s->durable_lsn >= lsn) {
			rc = 0;
			break;
		}
		if (s->wal_err) {
			rc = s->wal_err;
			break;
		}
		if (s->syncing) {
			pthread_cond_wait(&s->walcv, &s->walmu);
			continue;
		}
		/* Leader: one fdatasync covers every record written so far. */
		uint64_t upto = s->lsn;

		s->syncing = true;
		pthread_mutex_unlock(&s->walmu);
		rc = wal_sync(s);
		pthread_mutex_lock(&s->walmu);
		s->syncing = false;
		s->n_syncs++;
		if (rc) {
			/* What reached the disk is unknown now (the kernel may have dropped the
			 * dirty pages): take no more writes until the store is reopened. */
			s->wal_err = rc;
			dm_err("flat: WAL %s: fdatasync failed: %s; refusing writes", s->wal_path,
			       strerror(-rc));
		} else if (upto > s->durable_lsn) {
			s->durable_lsn = upto;
		}
		pthread_cond_broadcast(&s->walcv);
	}
	pthread_mutex_unlock(&s->walmu);
	return rc;
}

int flat_wal_append(struct flat_store *s, struct dm_buf *b, uint32_t type)
{
	uint64_t lsn;
	int rc = flat_wal_write(s, b, type, &lsn);

	return rc ? rc : flat_wal_wait(s, lsn);
}

uint64_t flat_wal_bytes(struct flat_store *s)
{
	uint64_t n;

	pthread_mutex_lock(&s->walmu);
	n = s->wal_bytes;
	pthread_mutex_unlock(&s->walmu);
	return n;
}

void flat_wal_stats(struct flat_store *s, struct flat_wal_stats *out)
{
	pthread_mutex_lock(&s->walmu);
	*out = (struct flat_wal_stats){ .bytes = s->wal_bytes, .records = s->n_records,
		.syncs = s->n_syncs, .lsn = s->lsn, .durable_lsn = s->durable_lsn,
		.error = s->wal_err };
	pthread_mutex_unlock(&s->walmu);
}

/* ---------------------------------------------------------------- replay ----------- */

/* The log does not parse at off (the record after lsn prev). A torn tail is what a crash
 * leaves: records written after the last sync, any of them incomplete or missing, possibly
 * followed by later ones that did reach the disk. None of those was acknowledged, so
 * dropping them all is right. But a later valid record written when the damaged one was
 * already durable (its lsn - 1 - inflight >= the damaged lsn) proves that the damaged
 * record, and possibly more after it, had been acknowledged: that is corruption, and
 * opening would silently lose acknowledged writes, so refuse. With group commit off every
 * record is written after the previous one is durable, so any valid record after a damaged
 * one means corruption. */
static int wal_tail(struct flat_store *s, const uint8_t *b, size_t n, size_t off,
		    uint64_t prev, uint64_t snap_lsn)
{
	uint64_t expect = (prev ? prev : snap_lsn) + 1, later = 0;
	uint64_t hi = DM_MAX(prev, snap_lsn) + 1 + (n - off) / FLAT_REC_HDR;
	size_t q = off + 1;

	while (q < n && n - q >= FLAT_REC_HDR) {
		uint64_t l = dm_get_le64(b + q + 8);
		uint32_t t = b[q + 16];
		struct flat_rec r;

		/* Cheap filters before the CRC: a plausible type and lsn. */
		if (t < FLAT_REC_BUCKET_CREATE || t > FLAT_REC_LAST || t == FLAT_REC_SNAP_END || l <= prev || l > hi ||
		    flat_rec_parse(b + q, n - q, &r) != 1) {
			q++;
			continue;
		}
		if (r.lsn - 1 - DM_MIN(r.inflight, r.lsn - 1) >= expect) {
			dm_err("flat: WAL %s: the record at offset %zu (lsn %llu) is corrupt, but the "
			       "record at offset %zu (lsn %llu) was written after it was durable: "
			       "acknowledged writes would be lost. Refusing to open %s (restore it "
			       "from a replica or backup, or move the WAL away to accept the loss)",
			       s->wal_path, off, (unsigned long long)expect, q,
			       (unsigned long long)r.lsn, s->dir);
			return -EBADMSG;
		}
		later++;
		q += FLAT_REC_HDR + r.len;
	}
	dm_warn("flat: WAL %s: dropping a torn tail of %zu bytes at offset %zu (lsn %llu on; "
		"%llu complete records after it were never durable)", s->wal_path, n - off, off,
		(unsigned long long)expect, (unsigned long long)later);
	if (truncate(s->wal_path, (off_t)off))
		return -errno;
	return 0;
}

int flat_wal_replay(struct flat_store *s, uint64_t snap_lsn)
{
	uint8_t *b = NULL;
	size_t n = 0, off = 0;
	uint64_t replayed = 0, prev = 0;
	int rc = flat_read_file(s->wal_path, &b, &n);

	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	while (off < n) {
		struct flat_rec r;

		if (flat_rec_parse(b + off, n - off, &r) != 1)
			break;
		if (r.lsn > snap_lsn) {
			if (r.lsn <= s->lsn) {
				rc = -EBADMSG;
				dm_err("flat: WAL %s: lsn %llu at offset %zu out of order", s->wal_path,
				       (unsigned long long)r.lsn, off);
				break;
			}
			rc = flat_apply_record(s, r.type, r.payload, r.len);
			if (rc) {
				dm_err("flat: WAL %s: record lsn %llu at offset %zu does not apply: %s",
				       s->wal_path, (unsigned long long)r.lsn, off, strerror(-rc));
				break;
			}
			s->lsn = r.lsn;
			replayed++;
		}
		prev = r.lsn;
		off += FLAT_REC_HDR + r.len;
	}
	if (!rc && off < n)
		rc = wal_tail(s, b, n, off, prev, snap_lsn);
	if (!rc) {
		s->wal_bytes = off;
		dm_info("flat: %s: replayed %llu WAL records", s->dir, (unsigned long long)replayed);
	}
	free(b);
	return rc;
}
