/* fuzz_hnsw_image.c: libFuzzer target for the HNSW index image loader (hnsw_load). Random
 * bytes rarely get past the checksums, so every input has its checksums recomputed before
 * loading (bit 1 of the first byte: image sections and every record's CRC32C), which lets
 * the fuzzer reach the structural validation behind them. Two modes (bit 0): the rest of
 * the input is a whole image, or a list of (u16 offset, u8 xor) patches applied to a small
 * valid image built at start-up, with RaBitQ neighbour codes or without (bit 2), so that
 * the code section (kind, code geometry, quantizer blob) is mutated too. An accepted image
 * is then searched, so that ASan sees any out-of-bounds read the validation let through. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "hnsw/hnsw.h"

/* Offsets in the 160-byte image header (hnsw_image.c, struct img_hdr). */
#define H_REC_SIZE  44
#define H_NBLOCKS   52
#define H_UP_WORDS  64
#define H_BTAB_OFF  72
#define H_UP_OFF    80
#define H_BTAB_CRC  104
#define H_UP_CRC    108
#define H_Q_OFF     128
#define H_Q_LEN     136
#define H_Q_CRC     144
#define H_HDR_CRC   156
#define H_SIZE      160

static uint8_t *base_img[2];
static size_t base_len[2];
static int fd = -1;
static char path[64];

static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static uint32_t crc(const uint8_t *p, size_t len)
{
	return (uint32_t)crc32_z(crc32_z(0, Z_NULL, 0), p, len);
}

/* Recompute every checksum whose range lies inside the buffer. */
static void fix_crcs(uint8_t *b, size_t len)
{
	if (len < H_SIZE)
		return;
	uint64_t nblocks = rd32(b + H_NBLOCKS), btab = rd64(b + H_BTAB_OFF);
	uint64_t up = rd64(b + H_UP_OFF), upw = rd64(b + H_UP_WORDS), rec = rd32(b + H_REC_SIZE);
	if (btab <= len && nblocks <= (len - btab) / 16) {
		for (uint64_t i = 0; i < nblocks; i++) {
			uint8_t *e = b + btab + 16 * i;
			uint64_t off = rd64(e), nrec = rd32(e + 8);
			if (off <= len && rec >= sizeof(struct hnsw_rec_hdr) &&
			    nrec <= (len - off) / rec) {
				for (uint64_t r = 0; r < nrec; r++) {
					struct hnsw_rec_hdr *h = (void *)(b + off + r * rec);
					if (((uintptr_t)h & 3) == 0)
						h->crc = hnsw_rec_crc(h, (uint32_t)rec);
				}
				wr32(e + 12, crc(b + off, nrec * rec));
			}
		}
		wr32(b + H_BTAB_CRC, crc(b + btab, nblocks * 16));
	}
	if (up <= len && upw <= (len - up) / 4)
		wr32(b + H_UP_CRC, crc(b + up, upw * 4));
	uint64_t qo = rd64(b + H_Q_OFF), ql = rd64(b + H_Q_LEN);
	if (qo <= len && ql <= len - qo)
		wr32(b + H_Q_CRC, crc(b + qo, ql));
	wr32(b + H_HDR_CRC, crc(b, H_HDR_CRC));
}

/* A small valid image to mutate. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	enum { N = 60, D = 4 };
	float x[N * D];
	for (int i = 0; i < N * D; i++)
		x[i] = (float)((i * 37) % 23) - 11.0f;
	fd = memfd_create("fuzz_hnsw_image", MFD_CLOEXEC);
	if (fd < 0)
		abort();
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	for (int c = 0; c < 2; c++) {
		struct hnsw_params p = { .dim = D, .metric = DM_METRIC_L2, .M = 4,
					 .ef_construction = 16, .seed = 1, .block_shift = 6,
					 .codes = c ? HNSW_CODES_RABITQ : HNSW_CODES_NONE };
		char err[256];
		struct hnsw_index *idx = hnsw_build(&p, x, N, 1, NULL, NULL, err, sizeof(err));
		if (!idx)
			abort();
		char tmp[] = "/tmp/fuzz_hnsw_image.XXXXXX";
		int t = mkstemp(tmp);
		if (t < 0 || hnsw_save(idx, tmp, err, sizeof(err)) < 0)
			abort();
		FILE *f = fopen(tmp, "rb");
		fseek(f, 0, SEEK_END);
		base_len[c] = (size_t)ftell(f);
		fseek(f, 0, SEEK_SET);
		base_img[c] = malloc(base_len[c]);
		if (!base_img[c] || fread(base_img[c], 1, base_len[c], f) != base_len[c])
			abort();
		fclose(f);
		close(t);
		unlink(tmp);
		hnsw_free(idx);
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	uint8_t *b;
	size_t len;
	if (data[0] & 1) {
		len = size - 1;
		b = malloc(len ? len : 1);
		memcpy(b, data + 1, len);
	} else {
		int c = (data[0] >> 2) & 1;
		len = base_len[c];
		b = malloc(len);
		memcpy(b, base_img[c], len);
		for (size_t i = 1; i + 3 <= size; i += 3) {
			size_t off = (size_t)(data[i] | data[i + 1] << 8) % len;
			b[off] ^= data[i + 2];
		}
	}
	if (data[0] & 2)
		fix_crcs(b, len);
	if (ftruncate(fd, 0) != 0 || pwrite(fd, b, len, 0) != (ssize_t)len) {
		free(b);
		return 0;
	}
	char err[512] = "";
	struct hnsw_index *idx = hnsw_load(path, err, sizeof(err));
	if (idx) {
		struct hnsw_src src;
		hnsw_src_local(idx, &src);
		struct hnsw_searcher *s = hnsw_searcher_new(idx->n, idx->p.dim);
		float *q = calloc(idx->p.dim, sizeof(float));
		struct dm_hit h[8];
		if (s && q) {
			q[0] = 1.0f;   /* non-zero: valid under cos too */
			if (hnsw_search(&src, s, q, 8, 16, h) < 0 && idx->p.metric != DM_METRIC_COS)
				__builtin_trap();
		}
		free(q);
		hnsw_searcher_free(s);
		hnsw_free(idx);
	} else if (!strstr(err, path)) {
		__builtin_trap();   /* every refusal names the file */
	}
	free(b);
	return 0;
}
