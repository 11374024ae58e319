/* rabitq.c: RaBitQ quantizer (rotation training, serialisation) and neighbour-list codes.
 * Stub: the API of rabitq.h, implemented in following commits. */
#include "rabitq.h"

#include <stdlib.h>

struct rbq *rbq_train(uint32_t dim, const float *sample, size_t nsample, uint64_t seed)
{
	(void)dim; (void)sample; (void)nsample; (void)seed;
	errno = ENOSYS;
	return NULL;
}
void rbq_free(struct rbq *q) { free(q); }
uint32_t rbq_dim(const struct rbq *q) { (void)q; return 0; }
uint32_t rbq_dim_padded(const struct rbq *q) { (void)q; return 0; }
uint64_t rbq_seed(const struct rbq *q) { (void)q; return 0; }
size_t rbq_save_size(const struct rbq *q) { (void)q; return 0; }
int rbq_save(const struct rbq *q, void *buf, size_t len) { (void)q; (void)buf; (void)len; return -ENOSYS; }
int rbq_load(const void *buf, size_t len, struct rbq **out)
{
	(void)buf; (void)len;
	*out = NULL;
	return -ENOSYS;
}
void rbq_rotate(const struct rbq *q, const float *x, float *out) { (void)q; (void)x; (void)out; }
void rbq_unrotate(const struct rbq *q, const float *y, float *out) { (void)q; (void)y; (void)out; }
size_t rbq_list_bytes(const struct rbq *q, uint32_t cap) { (void)q; (void)cap; return 0; }
void rbq_list_clear(const struct rbq *q, uint8_t *list, uint32_t cap) { (void)q; (void)list; (void)cap; }
void rbq_list_set(const struct rbq *q, uint8_t *list, uint32_t cap, uint32_t slot,
		  const float *u_rot, const float *v_rot)
{
	(void)q; (void)list; (void)cap; (void)slot; (void)u_rot; (void)v_rot;
}
void rbq_list_move(const struct rbq *q, uint8_t *list, uint32_t cap, uint32_t dst, uint32_t src)
{
	(void)q; (void)list; (void)cap; (void)dst; (void)src;
}
