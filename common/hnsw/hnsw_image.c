/* hnsw_image.c: the HNSW index image file. One file holds everything a memory node needs to
 * serve the index and a compute node needs to search it:
 *
 *   header (160 bytes): magic "DMANNHNW", format version, record layout version, code
 *                       kind, parameters, geometry, entry point, offsets, checksums of
 *                       block table, upper area and quantizer, and a CRC32 of the header
 *                       itself (last 4 bytes)
 *   block table:        per block {u64 file offset, u32 records, u32 CRC32 of its bytes}
 *   upper area:         the upper-level lists (format in hnsw_layout.h)
 *   quantizer:          the serialised quantizer of the neighbour codes (none without)
 *   label map:          format 3 only: n u32, node id -> label (the row of the vector
 *                       file it was built from: `dmann build --order vhash` numbers the
 *                       nodes in key order), a permutation of 0..n-1, CRC32 in the header
 *   blocks:             at a 4096-aligned offset, the records of each block back to back
 *
 * Format 1 (record layout v1: no seq, CRC or codes) is refused with the rebuild command.
 * Format 2 is format 3 without the label map (labels = node ids); an image without one is
 * still written as format 2, byte for byte what earlier versions wrote.
 *
 * All integers little-endian (the only byte order dmann runs on: x86-64 / aarch64 LE).
 * The loader checks every size, offset and checksum before trusting anything, then
 * validates the graph structure, so a truncated or corrupted image is refused with a message
 * and never crashes a reader. CRC32 is zlib's. */
#include "hnsw_int.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define IMG_MAGIC   "DMANNHNW"
#define IMG_FORMAT  2u      /* without a label map */
#define IMG_FORMAT_LABELS 3u   /* with one */
#define IMG_HDR     160u
#define IMG_ALIGN   4096u
#define IMG_MAX_QBLOB (64u << 20)

struct img_hdr {
	char magic[8];
	uint32_t format;
	uint32_t hdr_size;
	uint32_t dim, metric, M, efc;
	uint64_t seed;
	uint32_t block_shift, rec_size;
	uint32_t n, nblocks;
	uint32_t entry;
	int32_t max_level;
	uint64_t up_words;     /* words of the image's upper area (with id/level prefixes) */
	uint64_t btab_off, up_off, data_off, file_size;
	uint32_t btab_crc, up_crc;
	uint32_t layout;       /* HNSW_LAYOUT_VERSION */
	uint32_t codes;        /* enum hnsw_codes */
	uint32_t code_bytes, vdim;
	uint64_t q_off, q_len; /* quantizer blob (q_len 0 without codes) */
	uint32_t q_crc;
	uint32_t labels;       /* format 3: 1 (a label map of n u32 follows the quantizer);
				  format 2: 0 */
	uint32_t lab_crc;      /* its CRC32 */
	uint32_t hdr_crc;      /* CRC32 of the 156 bytes before it */
};
_Static_assert(sizeof(struct img_hdr) == IMG_HDR, "image header is 160 bytes");

struct img_block {
	uint64_t off;
	uint32_t nrec;
	uint32_t crc;
};
_Static_assert(sizeof(struct img_block) == 16, "block table entry is 16 bytes");

static uint32_t crc(const void *p, size_t len)
{
	return (uint32_t)crc32_z(crc32_z(0, Z_NULL, 0), p, len);
}

/* Records in block b of an index of n records. */
static uint32_t block_nrec(uint32_t n, uint32_t shift, uint32_t b)
{
	uint64_t per = 1ull << shift, first = (uint64_t)b * per;
	return (uint32_t)DM_MIN(per, n - first);
}

/* Upper area (hnsw_layout.h): [id, level, lists...] for every node of level >= 1. */
uint32_t *hnsw_upper_serialize(const struct hnsw_index *idx, uint64_t *words)
{
	uint32_t M = idx->p.M;
	uint64_t w = 0;
	for (uint32_t id = 0; id < idx->n; id++) {
		uint32_t lv = hnsw_rec(idx, id)->level;
		if (lv)
			w += hnsw_up_entry_words(M, lv);
	}
	uint32_t *a = calloc(w ? w : 1, sizeof(*a));
	if (!a)
		return NULL;
	uint64_t o = 0;
	for (uint32_t id = 0; id < idx->n; id++) {
		uint32_t lv = hnsw_rec(idx, id)->level;
		if (!lv)
			continue;
		a[o++] = id;
		a[o++] = lv;
		memcpy(a + o, idx->upl[id], (size_t)lv * hnsw_up_list_words(M) * sizeof(*a));
		o += (uint64_t)lv * hnsw_up_list_words(M);
	}
	*words = w;
	return a;
}

static int write_all(int fd, const void *p, size_t len)
{
	const char *c = p;
	while (len) {
		ssize_t w = write(fd, c, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		c += w;
		len -= (size_t)w;
	}
	return 0;
}

/* Save the index image atomically (tmp file + fsync + rename). */
int hnsw_save(const struct hnsw_index *idx, const char *path, char *err, size_t errlen)
{
	int rc;
	if (idx->n == 0 || idx->max_level < 0) {
		snprintf(err, errlen, "%s: refusing to save an empty index", path);
		return -EINVAL;
	}
	uint64_t up_words;
	uint32_t *up = hnsw_upper_serialize(idx, &up_words);
	if (!up) {
		snprintf(err, errlen, "%s: out of memory", path);
		return -ENOMEM;
	}
	struct img_block *bt = calloc(idx->nblocks, sizeof(*bt));
	size_t qlen = idx->quant ? hnsw_quant_blob_size(idx->quant) : 0;
	void *qb = malloc(qlen ? qlen : 1);
	if (!bt || !qb) {
		snprintf(err, errlen, "%s: out of memory", path);
		rc = -ENOMEM;
		free(qb);
		goto err_free_up;
	}
	if (idx->quant)
		hnsw_quant_blob(idx->quant, qb);
	struct img_hdr h;
	memset(&h, 0, sizeof(h));
	memcpy(h.magic, IMG_MAGIC, 8);
	h.format = idx->labels ? IMG_FORMAT_LABELS : IMG_FORMAT;
	h.hdr_size = IMG_HDR;
	h.dim = idx->p.dim;
	h.metric = (uint32_t)idx->p.metric;
	h.M = idx->p.M;
	h.efc = idx->p.ef_construction;
	h.seed = idx->p.seed;
	h.block_shift = idx->p.block_shift;
	h.rec_size = idx->rec_size;
	h.n = idx->n;
	h.nblocks = idx->nblocks;
	h.entry = idx->entry;
	h.max_level = idx->max_level;
	h.up_words = up_words;
	h.layout = HNSW_LAYOUT_VERSION;
	h.codes = (uint32_t)idx->p.codes;
	h.code_bytes = idx->code_bytes;
	h.vdim = idx->vdim;
	h.btab_off = IMG_HDR;
	h.up_off = h.btab_off + (uint64_t)idx->nblocks * sizeof(*bt);
	h.q_off = h.up_off + up_words * 4;
	h.q_len = qlen;
	h.q_crc = crc(qb, qlen);
	uint64_t llen = idx->labels ? (uint64_t)idx->n * 4 : 0;

	h.labels = idx->labels != NULL;
	h.lab_crc = idx->labels ? crc(idx->labels, llen) : 0;
	h.data_off = DM_ALIGN_UP(h.q_off + qlen + llen, IMG_ALIGN);
	uint64_t off = h.data_off;
	for (uint32_t b = 0; b < idx->nblocks; b++) {
		uint32_t nr = block_nrec(idx->n, idx->p.block_shift, b);
		bt[b].off = off;
		bt[b].nrec = nr;
		bt[b].crc = crc(idx->blocks[b], (size_t)nr * idx->rec_size);
		off += (uint64_t)nr * idx->rec_size;
	}
	h.file_size = off;
	h.btab_crc = crc(bt, (size_t)idx->nblocks * sizeof(*bt));
	h.up_crc = crc(up, up_words * 4);
	h.hdr_crc = crc(&h, offsetof(struct img_hdr, hdr_crc));

	char tmp[4096];
	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) {
		snprintf(err, errlen, "%s: path too long", path);
		rc = -ENAMETOOLONG;
		goto err_free_bt;
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
		goto err_free_bt;
	}
	static const char zeros[IMG_ALIGN];
	uint64_t pad = h.data_off - (h.q_off + qlen + llen);
	if ((rc = write_all(fd, &h, sizeof(h))) < 0 ||
	    (rc = write_all(fd, bt, (size_t)idx->nblocks * sizeof(*bt))) < 0 ||
	    (rc = write_all(fd, up, up_words * 4)) < 0 || (rc = write_all(fd, qb, qlen)) < 0 ||
	    (llen && (rc = write_all(fd, idx->labels, llen)) < 0) ||
	    (rc = write_all(fd, zeros, pad)) < 0)
		goto err_write;
	for (uint32_t b = 0; b < idx->nblocks; b++)
		if ((rc = write_all(fd, idx->blocks[b], (size_t)bt[b].nrec * idx->rec_size)) < 0)
			goto err_write;
	if (fsync(fd) < 0) {
		rc = -errno;
		goto err_write;
	}
	if (close(fd) < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: close: %s", tmp, strerror(-rc));
		goto err_unlink;
	}
	if (rename(tmp, path) < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: rename to %s: %s", tmp, path, strerror(-rc));
		goto err_unlink;
	}
	free(qb);
	free(bt);
	free(up);
	return 0;

err_write:
	snprintf(err, errlen, "%s: write: %s", tmp, strerror(-rc));
	close(fd);
err_unlink:
	unlink(tmp);
err_free_bt:
	free(qb);
	free(bt);
err_free_up:
	free(up);
	return rc;
}

static int read_at(int fd, void *p, size_t len, uint64_t off)
{
	char *c = p;
	while (len) {
		ssize_t r = pread(fd, c, len, (off_t)off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return -EIO;
		c += r;
		len -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* Check the header fields against each other and the file size. */
static int check_header(const struct img_hdr *h, uint64_t fsize, char *err, size_t errlen)
{
	if (memcmp(h->magic, IMG_MAGIC, 8)) {
		snprintf(err, errlen, "not a dmann HNSW image (bad magic)");
		return -EINVAL;
	}
	if (h->format == 1) {
		snprintf(err, errlen, "image format 1 (record layout v1, without seq/CRC/neighbour "
			 "codes) is no longer read; rebuild the index: dmann build --base VECTORS "
			 "--out INDEX [--codes rabitq|none]");
		return -EINVAL;
	}
	if ((h->format != IMG_FORMAT && h->format != IMG_FORMAT_LABELS) || h->hdr_size != IMG_HDR) {
		snprintf(err, errlen, "unsupported image format %u (header %u bytes); this dmann "
			 "reads formats %u and %u", h->format, h->hdr_size, IMG_FORMAT,
			 IMG_FORMAT_LABELS);
		return -EINVAL;
	}
	if (crc(h, offsetof(struct img_hdr, hdr_crc)) != h->hdr_crc) {
		snprintf(err, errlen, "header checksum mismatch (corrupted header)");
		return -EINVAL;
	}
	if (h->file_size != fsize) {
		snprintf(err, errlen, "file is %llu bytes, header says %llu (%s)",
			 (unsigned long long)fsize, (unsigned long long)h->file_size,
			 fsize < h->file_size ? "truncated" : "trailing garbage");
		return -EINVAL;
	}
	struct hnsw_params p = { .dim = h->dim, .metric = (enum dm_metric)h->metric, .M = h->M,
				 .ef_construction = h->efc, .seed = h->seed,
				 .block_shift = h->block_shift };
	char msg[160];
	if (h->metric > DM_METRIC_COS || hnsw_params_check(&p, msg, sizeof(msg)) < 0) {
		snprintf(err, errlen, "bad parameters in header: %s",
			 h->metric > DM_METRIC_COS ? "unknown metric" : msg);
		return -EINVAL;
	}
	if (h->layout != HNSW_LAYOUT_VERSION) {
		snprintf(err, errlen, "record layout %u; this dmann reads layout %u (rebuild the "
			 "index with dmann build)", h->layout, HNSW_LAYOUT_VERSION);
		return -EINVAL;
	}
	bool codes = h->codes == HNSW_CODES_RABITQ;
	if ((h->codes != HNSW_CODES_NONE && !codes) ||
	    (!codes && (h->code_bytes || h->vdim != h->dim || h->q_len)) ||
	    (codes && (!h->code_bytes || h->vdim < h->dim || h->vdim > h->dim + 4096 ||
		       !h->q_len || h->q_len > IMG_MAX_QBLOB))) {
		snprintf(err, errlen, "bad code section (kind %u, %u code bytes, vector %u floats, "
			 "quantizer %llu bytes)", h->codes, h->code_bytes, h->vdim,
			 (unsigned long long)h->q_len);
		return -EINVAL;
	}
	if (h->code_bytes > (64u << 20) || h->rec_size != hnsw_rec_size(h->M, h->vdim, h->code_bytes)) {
		snprintf(err, errlen, "record size %u does not match M=%u dim=%u codes %u", h->rec_size,
			 h->M, h->vdim, h->code_bytes);
		return -EINVAL;
	}
	uint64_t per = 1ull << h->block_shift;
	if (h->n == 0 || h->n == UINT32_MAX || h->nblocks != (h->n + per - 1) / per) {
		snprintf(err, errlen, "inconsistent node count %u / block count %u", h->n, h->nblocks);
		return -EINVAL;
	}
	if (h->max_level < 0 || h->max_level > (int32_t)HNSW_MAX_LEVEL || h->entry >= h->n) {
		snprintf(err, errlen, "bad entry point %u / max level %d", h->entry, h->max_level);
		return -EINVAL;
	}
	if (h->labels != (h->format == IMG_FORMAT_LABELS ? 1u : 0u) ||
	    (!h->labels && h->lab_crc)) {
		snprintf(err, errlen, "format %u with label map flag %u", h->format, h->labels);
		return -EINVAL;
	}
	uint64_t llen = h->labels ? (uint64_t)h->n * 4 : 0;
	uint64_t max_words = (uint64_t)h->n * hnsw_up_entry_words(h->M, HNSW_MAX_LEVEL);
	uint64_t up_off = IMG_HDR + (uint64_t)h->nblocks * sizeof(struct img_block);
	if (h->up_words > max_words || h->btab_off != IMG_HDR || h->up_off != up_off ||
	    h->q_off != up_off + h->up_words * 4 ||
	    h->data_off != DM_ALIGN_UP(h->q_off + h->q_len + llen, IMG_ALIGN) ||
	    h->file_size != h->data_off + (uint64_t)h->n * h->rec_size) {
		snprintf(err, errlen, "inconsistent section offsets in header");
		return -EINVAL;
	}
	return 0;
}

/* Rebuild upl/up_store from the image's upper area; checks entries against the records. */
static int upper_parse(struct hnsw_index *idx, const uint32_t *a, uint64_t words, char *err,
		       size_t errlen)
{
	uint32_t M = idx->p.M, lw = hnsw_up_list_words(M);
	uint64_t store = 0, o = 0;
	int64_t last = -1;
	while (o < words) {
		if (words - o < 2) {
			snprintf(err, errlen, "upper area: entry header cut at word %llu", (unsigned long long)o);
			return -EINVAL;
		}
		uint32_t id = a[o], lv = a[o + 1];
		if ((int64_t)id <= last || id >= idx->n || lv == 0 || lv > HNSW_MAX_LEVEL ||
		    lv != hnsw_rec(idx, id)->level || words - o - 2 < (uint64_t)lv * lw) {
			snprintf(err, errlen, "upper area: bad entry at word %llu (node %u level %u)",
				 (unsigned long long)o, id, lv);
			return -EINVAL;
		}
		last = id;
		store += (uint64_t)lv * lw;
		o += 2 + (uint64_t)lv * lw;
	}
	idx->up_words = store;
	idx->up_store = calloc(store ? store : 1, sizeof(uint32_t));
	if (!idx->up_store) {
		snprintf(err, errlen, "out of memory for the upper area");
		return -ENOMEM;
	}
	uint64_t s = 0;
	for (o = 0; o < words;) {
		uint32_t id = a[o], lv = a[o + 1];
		idx->upl[id] = idx->up_store + s;
		memcpy(idx->upl[id], a + o + 2, (size_t)lv * lw * sizeof(uint32_t));
		s += (uint64_t)lv * lw;
		o += 2 + (uint64_t)lv * lw;
	}
	return 0;
}

struct hnsw_index *hnsw_load(const char *path, char *err, size_t errlen)
{
	char msg[256] = "";
	int rc;
	struct hnsw_index *idx = NULL;
	uint32_t *up = NULL;
	struct img_block *bt = NULL;
	struct hnsw_quant *quant = NULL;
	uint32_t *labels = NULL;   /* the label map until idx owns it */
	void *qb = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
		errno = -rc;
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		snprintf(msg, sizeof(msg), "stat: %s", strerror(errno));
		goto err_close;
	}
	struct img_hdr h;
	if ((uint64_t)st.st_size < IMG_HDR) {
		snprintf(msg, sizeof(msg), "file is %lld bytes, shorter than the %u-byte header (truncated)",
			 (long long)st.st_size, IMG_HDR);
		rc = -EINVAL;
		goto err_close;
	}
	if ((rc = read_at(fd, &h, sizeof(h), 0)) < 0) {
		snprintf(msg, sizeof(msg), "read header: %s", strerror(-rc));
		goto err_close;
	}
	if ((rc = check_header(&h, (uint64_t)st.st_size, msg, sizeof(msg))) < 0)
		goto err_close;

	bt = malloc((size_t)h.nblocks * sizeof(*bt));
	up = malloc(h.up_words ? h.up_words * 4 : 4);
	if (!bt || !up) {
		rc = -ENOMEM;
		snprintf(msg, sizeof(msg), "out of memory");
		goto err_free;
	}
	if ((rc = read_at(fd, bt, (size_t)h.nblocks * sizeof(*bt), h.btab_off)) < 0 ||
	    (rc = read_at(fd, up, h.up_words * 4, h.up_off)) < 0) {
		snprintf(msg, sizeof(msg), "read: %s", strerror(-rc));
		goto err_free;
	}
	if (crc(bt, (size_t)h.nblocks * sizeof(*bt)) != h.btab_crc) {
		rc = -EINVAL;
		snprintf(msg, sizeof(msg), "block table checksum mismatch (corrupted)");
		goto err_free;
	}
	if (crc(up, h.up_words * 4) != h.up_crc) {
		rc = -EINVAL;
		snprintf(msg, sizeof(msg), "upper area checksum mismatch (corrupted)");
		goto err_free;
	}
	if (h.codes != HNSW_CODES_NONE) {
		qb = malloc(h.q_len);
		if (!qb) {
			rc = -ENOMEM;
			snprintf(msg, sizeof(msg), "out of memory");
			goto err_free;
		}
		if ((rc = read_at(fd, qb, h.q_len, h.q_off)) < 0) {
			snprintf(msg, sizeof(msg), "read: %s", strerror(-rc));
			goto err_free;
		}
		if (crc(qb, h.q_len) != h.q_crc) {
			rc = -EINVAL;
			snprintf(msg, sizeof(msg), "quantizer checksum mismatch (corrupted)");
			goto err_free;
		}
		quant = hnsw_quant_from_blob(qb, h.q_len, h.dim, (enum dm_metric)h.metric, h.M,
					     h.code_bytes, msg, sizeof(msg));
		if (!quant) {
			rc = -EINVAL;
			goto err_free;
		}
		if (hnsw_quant_vdim(quant) != h.vdim) {
			rc = -EINVAL;
			snprintf(msg, sizeof(msg), "quantizer dimension %u != stored vectors' %u",
				 hnsw_quant_vdim(quant), h.vdim);
			goto err_free;
		}
	}
	if (h.labels) {
		/* the label map: checksum, then a permutation of 0..n-1 */
		uint8_t *seen = calloc(h.n, 1);

		labels = malloc((size_t)h.n * 4);
		if (!seen || !labels) {
			free(seen);
			rc = -ENOMEM;
			snprintf(msg, sizeof(msg), "out of memory");
			goto err_free;
		}
		rc = read_at(fd, labels, (size_t)h.n * 4, h.q_off + h.q_len);
		if (rc < 0)
			snprintf(msg, sizeof(msg), "read: %s", strerror(-rc));
		else if (crc(labels, (size_t)h.n * 4) != h.lab_crc) {
			rc = -EINVAL;
			snprintf(msg, sizeof(msg), "label map checksum mismatch (corrupted)");
		}
		for (uint32_t i = 0; rc == 0 && i < h.n; i++) {
			if (labels[i] >= h.n || seen[labels[i]]++) {
				rc = -EINVAL;
				snprintf(msg, sizeof(msg), "label map: node %u's label %u is %s", i,
					 labels[i], labels[i] >= h.n ? "out of range" : "repeated");
			}
		}
		free(seen);
		if (rc < 0)
			goto err_free;
	}
	/* the padding before the blocks is covered by no checksum: it must be zeros */
	uint64_t pad_off = h.q_off + h.q_len + (h.labels ? (uint64_t)h.n * 4 : 0);
	uint64_t pad = h.data_off - pad_off;
	unsigned char padbuf[IMG_ALIGN];
	if ((rc = read_at(fd, padbuf, pad, pad_off)) < 0) {
		snprintf(msg, sizeof(msg), "read: %s", strerror(-rc));
		goto err_free;
	}
	for (uint64_t i = 0; i < pad; i++) {
		if (padbuf[i]) {
			rc = -EINVAL;
			snprintf(msg, sizeof(msg), "non-zero padding at offset %llu (corrupted)",
				 (unsigned long long)(pad_off + i));
			goto err_free;
		}
	}
	uint64_t off = h.data_off;
	for (uint32_t b = 0; b < h.nblocks; b++) {
		uint32_t nr = block_nrec(h.n, h.block_shift, b);
		if (bt[b].off != off || bt[b].nrec != nr) {
			rc = -EINVAL;
			snprintf(msg, sizeof(msg), "block table entry %u inconsistent", b);
			goto err_free;
		}
		off += (uint64_t)nr * h.rec_size;
	}

	struct hnsw_params p = { .dim = h.dim, .metric = (enum dm_metric)h.metric, .M = h.M,
				 .ef_construction = h.efc, .seed = h.seed,
				 .block_shift = h.block_shift, .codes = (enum hnsw_codes)h.codes };
	idx = hnsw_alloc(&p, h.n, quant);
	if (idx) {
		quant = NULL;   /* owned by idx */
		idx->labels = labels;
		labels = NULL;
	}
	if (!idx) {
		rc = -ENOMEM;
		snprintf(msg, sizeof(msg), "out of memory for %u records", h.n);
		goto err_free;
	}
	for (uint32_t b = 0; b < h.nblocks; b++) {
		size_t len = (size_t)bt[b].nrec * h.rec_size;
		if ((rc = read_at(fd, idx->blocks[b], len, bt[b].off)) < 0) {
			snprintf(msg, sizeof(msg), "read block %u: %s", b, strerror(-rc));
			goto err_free;
		}
		if (crc(idx->blocks[b], len) != bt[b].crc) {
			rc = -EINVAL;
			snprintf(msg, sizeof(msg), "block %u checksum mismatch (corrupted)", b);
			goto err_free;
		}
	}
	idx->entry = h.entry;
	idx->max_level = h.max_level;
	/* Record levels must be checked before upper_parse trusts them. */
	for (uint32_t id = 0; id < h.n; id++) {
		const struct hnsw_rec_hdr *r = hnsw_rec(idx, id);
		if (r->level > (uint32_t)h.max_level) {
			rc = -EINVAL;
			snprintf(msg, sizeof(msg), "record %u: level %u above the top %d", id,
				 r->level, h.max_level);
			goto err_free;
		}
	}
	if ((rc = upper_parse(idx, up, h.up_words, msg, sizeof(msg))) < 0)
		goto err_free;
	if ((rc = hnsw_validate(idx, msg, sizeof(msg))) < 0)
		goto err_free;
	if ((rc = hnsw_upq_attach(idx)) < 0) {
		snprintf(msg, sizeof(msg), "out of memory (upper-level codes)");
		goto err_free;
	}
	free(qb);
	free(up);
	free(bt);
	close(fd);
	return idx;

err_free:
	free(labels);
	hnsw_free(idx);
	hnsw_quant_free(quant);
	free(qb);
	free(up);
	free(bt);
err_close:
	close(fd);
	snprintf(err, errlen, "%s: %s", path, msg);
	errno = -rc;
	return NULL;
}

/* Structural validation: everything a search trusts without checking. */
int hnsw_validate(const struct hnsw_index *idx, char *err, size_t errlen)
{
	uint32_t n = idx->n, M = idx->p.M;
	if (idx->max_level < 0 || idx->entry >= n ||
	    hnsw_rec(idx, idx->entry)->level != (uint32_t)idx->max_level) {
		snprintf(err, errlen, "entry point %u is not a node of the top level %d", idx->entry,
			 idx->max_level);
		return -EINVAL;
	}
	for (uint32_t id = 0; id < n; id++) {
		const struct hnsw_rec_hdr *r = hnsw_rec(idx, id);
		if ((r->seq & 1u) || r->flags != 0 || r->n0 > 2 * M ||
		    r->level > (uint32_t)idx->max_level) {
			snprintf(err, errlen, "record %u: bad header (seq %u level %u flags %u n0 %u)",
				 id, r->seq, r->level, r->flags, r->n0);
			return -EINVAL;
		}
		const uint32_t *nb = hnsw_rec_nbrs(r);
		for (uint32_t j = 0; j < r->n0; j++) {
			if (nb[j] >= n) {
				snprintf(err, errlen, "record %u: level-0 neighbour %u out of range", id, nb[j]);
				return -EINVAL;
			}
		}
		if ((r->level > 0) != (idx->upl[id] != NULL)) {
			snprintf(err, errlen, "node %u: level %u but %s upper lists", id, r->level,
				 idx->upl[id] ? "has" : "no");
			return -EINVAL;
		}
		for (uint32_t l = 1; l <= r->level; l++) {
			const uint32_t *w = hnsw_up_list(idx, id, l);
			if (w[0] > M) {
				snprintf(err, errlen, "node %u level %u: %u neighbours > M=%u", id, l, w[0], M);
				return -EINVAL;
			}
			for (uint32_t j = 0; j < w[0]; j++) {
				if (w[1 + j] >= n || hnsw_rec(idx, w[1 + j])->level < l) {
					snprintf(err, errlen, "node %u level %u: neighbour %u invalid", id, l,
						 w[1 + j]);
					return -EINVAL;
				}
			}
		}
		if (hnsw_rec_crc(r, idx->rec_size) != r->crc) {
			snprintf(err, errlen, "record %u: CRC32C mismatch (corrupted record)", id);
			return -EINVAL;
		}
	}
	return 0;
}
