/* fuzz_vhash_load.c: libFuzzer target for the VHash loader (dm_vhash_load, oracle/vhash.h).
 * Inputs as fuzz_patch.h: raw images, or patches of a small valid serialised VHash (8 dims,
 * 4 regions, 5 knots) with the checksum recomputed. An accepted model must save back to the
 * same bytes and is exercised (key, key -> region, ranking, gap) so that ASan and UBSan see
 * any size or value the loader let through. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_patch.h"
#include "vhash.h"

#define DIM 8

static uint8_t *base;
static size_t base_len;

static void init(void)
{
	float sample[64 * DIM];
	struct dm_vhash_opts o;

	for (int i = 0; i < 64 * DIM; i++)
		sample[i] = (float)((i * 37 + (i / DIM) * 11) % 23) - 11.0f + (float)(i / (16 * DIM)) * 9.0f;
	dm_vhash_opts_default(&o);
	o.knots = 5;
	struct dm_vhash *vh = dm_vhash_fit(sample, 64, DIM, 4, 7, &o);
	if (!vh)
		abort();
	vh->epoch = 3;
	base_len = dm_vhash_save_size(vh);
	base = malloc(base_len);
	if (!base || dm_vhash_save(vh, base, base_len) != 0)
		abort();
	dm_vhash_free(vh);
}

static void exercise(const struct dm_vhash *vh, const uint8_t *img, size_t len)
{
	uint8_t *again = malloc(len);
	if (!again || dm_vhash_save_size(vh) != len || dm_vhash_save(vh, again, len) != 0 ||
	    memcmp(again, img, len) != 0)
		abort();   /* accepted bytes must be exactly what save writes */
	free(again);
	uint32_t dim = vh->dim, k = vh->k, r, regions[4];
	double dist[4];
	float *x = calloc(dim, sizeof(float));
	if (!x)
		abort();
	for (uint32_t i = 0; i < dim; i++)
		x[i] = (float)(i % 5) - 2.0f;
	uint64_t key = dm_vhash_key(vh, x, &r);
	if (r >= k || key < vh->lo[r] || key > vh->hi[r] || dm_vhash_key_region(vh, key) != r)
		abort();
	int m = dm_vhash_rank(vh, x, regions, dist, 4);
	if (m < 1 || m > 4)
		abort();
	(void)dm_vhash_gap(dist, (uint32_t)m, NULL);
	(void)dm_vhash_cdf(vh, r, 1.0);
	free(x);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dm_vhash *vh = NULL;
	uint8_t *img;
	size_t len;

	if (!base)
		init();
	if (size == 0)
		return 0;
	img = fuzz_patch_image(data, size, base, base_len, &len);
	int rc = dm_vhash_load(img, len, &vh);
	if (rc == 0) {
		exercise(vh, img, len);
		dm_vhash_free(vh);
	} else if (rc != -EINVAL || vh != NULL) {
		abort();
	}
	free(img);
	return 0;
}
