/* fuzz_dindex_bind.c: libFuzzer target for the trailers of the index metadata: the S3
 * binding (cn/engine/dindex_bind.h) and the key-order trailer (dindex_ko_parse, dindex.h):
 * the first 4 input bytes are the index's node count, the rest the trailer; the CRC is
 * recomputed when a magic is there, so that the field checks are reached. A parsed binding
 * must give every node a key of 1..1024 bytes; a parsed key-order trailer a run within
 * 1..DINDEX_MAX_RUN and a label map that is a permutation of the nodes (or none). Also
 * checks that an encoded binding parses back. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dindex.h"
#include "dindex_bind.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static bool once;
	struct dindex_bind *bd;
	char err[256];
	uint32_t n;
	uint8_t *p;

	if (!once) {
		const char *keys[] = { "a", "bb", "ccc" };
		struct dindex_bind_in in = { .bucket = "bkt", .index = "idx", .keys = keys, .n = 3 };
		struct dm_buf b = { 0 };

		once = true;
		if (dindex_bind_encode(&b, &in) || b.oom)
			abort();
		bd = dindex_bind_parse(b.p, b.n, 3, err, sizeof(err));
		if (!bd || bd->nkeys != 3)
			abort();
		dindex_bind_free(bd);
		dm_buf_free(&b);
	}
	if (size < 4)
		return 0;
	memcpy(&n, data, 4);
	n %= 1u << 16;
	size -= 4;
	p = malloc(size ? size : 1);
	if (!p)
		return 0;
	memcpy(p, data + 4, size);
	if (size >= 16 && !memcmp(p, DINDEX_KO_MAGIC, 8)) {
		uint32_t len = (uint32_t)(size - 16), crc = (uint32_t)crc32(0L, p + 16, len);
		struct dindex d = { 0 };
		int rc;

		memcpy(p + 8, &len, 4);
		memcpy(p + 12, &crc, 4);
		rc = dindex_ko_parse(&d, p, size, n, err, sizeof(err));
		if (rc > (int)size || (rc >= 0 && (d.run < 1 || d.run > DINDEX_MAX_RUN ||
						   (d.nlabels && d.nlabels != n))))
			abort();
		for (uint32_t i = 0; rc >= 0 && i < d.nlabels; i++)
			if (d.labels[i] >= n)
				abort();
		free(d.labels);
	}
	if (size >= 16 && !memcmp(p, DINDEX_BIND_MAGIC, 8)) {
		uint32_t len = (uint32_t)(size - 16), crc = (uint32_t)crc32(0L, p + 16, len);

		memcpy(p + 8, &len, 4);
		memcpy(p + 12, &crc, 4);
	}
	bd = dindex_bind_parse(p, size, n, err, sizeof(err));
	if (bd) {
		for (uint32_t i = 0; i < bd->nkeys; i++) {
			uint32_t kl;
			const char *k = dindex_bind_key(bd, i, &kl);

			if (!k || kl < 1 || kl > DINDEX_BIND_KEY_MAX || k + kl > bd->keys +
			    bd->off[bd->nkeys])
				abort();
		}
		dindex_bind_free(bd);
	}
	free(p);
	return 0;
}
