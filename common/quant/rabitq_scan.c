/* rabitq_scan.c: RaBitQ per-query context and FastScan list estimators.
 * Stub: the API of rabitq.h, implemented in following commits. */
#include "rabitq.h"

struct rbq_qctx *rbq_qctx_new(const struct rbq *q) { (void)q; errno = ENOSYS; return NULL; }
void rbq_qctx_free(struct rbq_qctx *ctx) { (void)ctx; }
int rbq_qctx_set_eps0(struct rbq_qctx *ctx, float eps0) { (void)ctx; (void)eps0; return -ENOSYS; }
int rbq_prep(const struct rbq *q, struct rbq_qctx *ctx, const float *q_rot,
	     const float *u_rot, enum dm_metric m)
{
	(void)q; (void)ctx; (void)q_rot; (void)u_rot; (void)m;
	return -ENOSYS;
}
void rbq_list_estimate(const struct rbq *q, const struct rbq_qctx *ctx, const uint8_t *list,
		       uint32_t cap, uint32_t n, float dist_qu, float *est, float *lower)
{
	(void)q; (void)ctx; (void)list; (void)cap; (void)n; (void)dist_qu; (void)est; (void)lower;
}
const char *rbq_isa(void) { return "scalar"; }
int rbq_set_isa(const char *isa) { (void)isa; return -ENOSYS; }
