/* fuzz_oracle_wire.c: libFuzzer target for the wire form of the oracle's predictor
 * (dm_oracle_decode, oracle/oracle.h). The format has no checksum, so fuzz_patch.h (which
 * recomputes a trailing CRC) does not fit; the same scheme without the CRC: the first input
 * byte picks a mode: 0, the rest is the image as is; otherwise the rest is a list of
 * (u16 offset, u8 xor) patches applied to a small valid image (8 dims, k = 4; CONSTRAINED,
 * or DOUBLING when mode & 0x40), truncated by (mode & 0x3f) bytes when mode & 0x80. An
 * accepted oracle must encode back to the same bytes and is exercised (rank, best, spill
 * order, ring neighbours) so that ASan and UBSan see any size or value the decoder let
 * through. */
#include <stdlib.h>
#include <string.h>

#include "oracle.h"

#define DIM 8
#define K 4

static uint8_t *base[2];
static size_t base_len[2];

static void init(void)
{
	float sample[64 * DIM];
	struct dm_oracle_params p;

	for (int i = 0; i < 64 * DIM; i++)
		sample[i] = (float)((i * 37 + (i / DIM) * 11) % 23) - 11.0f + (float)(i / (16 * DIM)) * 9.0f;
	for (int a = 0; a < 2; a++) {
		dm_oracle_params_default(&p, K);
		p.algo = a ? DM_ORACLE_DOUBLING : DM_ORACLE_CONSTRAINED;
		p.max_doublings = 2;
		struct dm_oracle *o = dm_oracle_build(sample, 64, DIM, &p);
		if (!o)
			abort();
		base_len[a] = dm_oracle_wire_size(o);
		base[a] = malloc(base_len[a]);
		if (!base[a] || dm_oracle_encode(o, base[a], base_len[a]) != (long)base_len[a])
			abort();
		dm_oracle_free(o);
	}
}

static uint8_t *image(const uint8_t *data, size_t size, size_t *len)
{
	int a = (data[0] & 0x40) != 0;
	uint8_t *img;

	*len = data[0] ? base_len[a] : size - 1;
	img = malloc(*len ? *len : 1);
	if (!img)
		abort();
	if (data[0] == 0) {
		memcpy(img, data + 1, *len);
		return img;
	}
	memcpy(img, base[a], *len);
	for (size_t i = 1; i + 2 < size; i += 3)
		img[(data[i] | (size_t)data[i + 1] << 8) % *len] ^= data[i + 2];
	if (data[0] & 0x80)
		*len -= data[0] & 0x3f;
	return img;
}

static void exercise(const struct dm_oracle *o, const uint8_t *img, size_t len)
{
	uint8_t *again = malloc(len);
	if (!again || dm_oracle_wire_size(o) != len || dm_oracle_encode(o, again, len) != (long)len ||
	    memcmp(again, img, len) != 0)
		abort();   /* accepted bytes must be exactly what encode writes */
	free(again);
	uint32_t k = o->k, cns[k], seen[k];
	float dist[k], *q = calloc(o->dim, sizeof(float));
	if (!q)
		abort();
	for (int t = 0; t < 3; t++) {
		for (uint32_t i = 0; i < o->dim; i++)
			q[i] = (float)((int)((i + 3 * t) % 7) - 3) * (float)(t + 1) * 4.0f;
		if (dm_oracle_rank(o, q, cns, dist) != (int)k || dm_oracle_best(o, q) >= k)
			abort();
		memset(seen, 0, sizeof(seen));
		for (uint32_t i = 0; i < k; i++) {
			if (cns[i] >= k || seen[cns[i]]++ || (i && dist[i] < dist[i - 1]))
				abort();   /* not a permutation, or not sorted */
		}
	}
	for (uint32_t c = 0; c < k; c++) {
		int p = dm_oracle_ring_prev(o, c), n = dm_oracle_ring_next(o, c);
		if (dm_oracle_spill_order(o, c, cns) != (int)k - 1 || p >= (int)k || n >= (int)k ||
		    (p < 0 && n < 0 && k > 1))
			abort();
	}
	free(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dm_oracle *o;
	uint8_t *img;
	size_t len;

	if (!base[0])
		init();
	if (size == 0)
		return 0;
	img = image(data, size, &len);
	errno = 0;
	o = dm_oracle_decode(img, len);
	if (o) {
		exercise(o, img, len);
		dm_oracle_free(o);
	} else if (errno != EBADMSG && errno != ENOMEM) {
		abort();
	}
	free(img);
	return 0;
}
