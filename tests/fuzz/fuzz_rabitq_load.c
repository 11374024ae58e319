/* fuzz_rabitq_load.c: libFuzzer target for the RaBitQ quantizer loader (rbq_load). Inputs
 * as fuzz_patch.h: raw images, or patches of a small valid serialised quantizer (format 2
 * with a centre when the mode byte is odd, format 1 when even) with the checksum
 * recomputed. An accepted quantizer must save back to the same bytes and is exercised
 * (rotate, a list, an estimate) so that ASan sees any size the loader let through. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_patch.h"
#include "quant/rabitq.h"

static uint8_t *base[2];   /* [0]: format 1, [1]: format 2 */
static size_t base_len[2];

static void init(void)
{
	float sample[2 * 70];
	for (int i = 0; i < 2 * 70; i++)
		sample[i] = (float)(i % 5) + 0.5f;
	for (int f = 0; f < 2; f++) {
		struct rbq *q = f ? rbq_train(70, sample, 2, 3) : rbq_train_v1(70, NULL, 0, 3);
		if (!q)
			abort();   /* D = 128 */
		base_len[f] = rbq_save_size(q);
		base[f] = malloc(base_len[f]);
		if (!base[f] || rbq_save(q, base[f], base_len[f]) != 0)
			abort();
		rbq_free(q);
	}
}

static void exercise(const struct rbq *q, const uint8_t *img, size_t len)
{
	uint32_t dim = rbq_dim(q), D = rbq_dim_padded(q);
	uint8_t *again = malloc(len);
	if (!again || rbq_save(q, again, len) != 0 || memcmp(again, img, len) != 0)
		abort();   /* accepted bytes must be exactly what save writes */
	free(again);
	float *x = calloc(D, sizeof(float)), *u = calloc(D, sizeof(float));
	float *v = calloc(D, sizeof(float)), est[3], low[3];
	size_t lb = rbq_list_bytes(q, 3);
	uint8_t *list = malloc(lb);
	struct rbq_qctx *ctx = rbq_qctx_new(q);
	if (!x || !u || !v || !list || !ctx)
		abort();
	for (uint32_t i = 0; i < dim; i++)
		x[i] = (float)(i % 7) - 3.0f;
	rbq_rotate(q, x, u);
	rbq_unrotate(q, u, v);
	rbq_rotate(q, x, v);
	v[0] += 1.0f;
	rbq_list_clear(q, list, 3);
	rbq_list_set(q, list, 3, 2, u, v);
	rbq_list_move(q, list, 3, 0, 2);
	if (rbq_prep(q, ctx, v, u, DM_METRIC_L2) != 0)
		abort();
	rbq_list_estimate(q, ctx, list, 3, 3, 1.0f, est, low);
	rbq_qctx_free(ctx);
	free(list);
	free(x);
	free(u);
	free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rbq *q = NULL;
	uint8_t *img;
	size_t len;

	if (!base[0])
		init();
	if (size == 0)
		return 0;
	img = fuzz_patch_image(data, size, base[data[0] & 1], base_len[data[0] & 1], &len);
	int rc = rbq_load(img, len, &q);
	if (rc == 0) {
		exercise(q, img, len);
		rbq_free(q);
	} else if (rc != -EINVAL || q != NULL) {
		abort();
	}
	free(img);
	return 0;
}
