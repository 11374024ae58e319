/* cn_s3_scope.c: scoped queries on the compute nodes (s3_scope.h, docs/api.md "Scoped
 * indexes"): the ingress keeps, of an index state whose fragments carry scope labels
 * (FL_STATE's trailer), only the fragments of the value a query's filter pins the scope
 * key to; the members check every row they read against that value and count the rows of
 * other scopes (always 0 unless two values share a label) on /metrics. */
#include "cn_s3_int.h"

#include <stdlib.h>
#include <string.h>

#include "s3_scope.h"

int scope_select(struct cn_s3 *s, const struct ixstate *st, const struct s3_qspec *q,
		 uint8_t **other)
{
	uint64_t kept = 0, skipped = 0;

	*other = NULL;
	/* An index without labels (unscoped, or a memory node without scopes): every row. */
	if (!q || !q->scoped || (!st->scope && st->nfrag))
		return 0;
	*other = calloc(st->nfrag + 1, 1);
	if (!*other)
		return -ENOMEM;
	for (uint32_t i = 0; i < st->nfrag; i++) {
		(*other)[i] = st->scope[i] != q->scope_label;
		skipped += (*other)[i];
		kept += !(*other)[i];
	}
	__atomic_add_fetch(&s->scope_queries, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&s->scope_frags, kept, __ATOMIC_RELAXED);
	__atomic_add_fetch(&s->scope_frags_skipped, skipped, __ATOMIC_RELAXED);
	return 0;
}

bool scope_row_other(const struct s3_qspec *q, const void *fmeta, uint32_t flen)
{
	const char *v;
	uint32_t vl;

	return s3_scope_value(fmeta, flen, q->scope_key, &v, &vl) != 1 ||
	       vl != q->scope_vlen || memcmp(v, q->scope_val, vl);
}
