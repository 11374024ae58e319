/* cn_s3_write.c: every S3 operation but QueryVectors on the compute node's gateway:
 * routed by the bucket it names to the memory nodes holding that bucket; reads go to the
 * first replica that answers, writes to every replica in placement order and succeed only
 * once all of them have the write durable (replication of writes). */
#include "cn_s3_int.h"

#include <string.h>

/* Every operation but QueryVectors: route by bucket; writes to every replica. */
void be_handle(void *ctx, const char *op, const char *body, size_t len,
		      struct s3_resp *r)
{
	struct cn_s3 *s = ctx;
	uint32_t mns[DM_MAX_NODES];
	char bucket[NAME_MAX_ + 8];
	int n, rc;

	memset(r, 0, sizeof(*r));
	if (!strcmp(op, "ListVectorBuckets")) {
		list_buckets(s, body, len, r);
		return;
	}
	if (s3_api_req_bucket(body, len, bucket)) {
		/* No bucket named: invalid; any MN answers the ValidationException. */
		for (uint32_t mn = 0; mn < s->cfg->n_mn; mn++)
			if (!mn_s3(s, mn, op, body, len, r))
				return;
		unavailable(r, op, 0);
		return;
	}
	n = bucket_mns(s, bucket, mns);
	if (n <= 0) {
		unavailable(r, op, 0);
		return;
	}
	if (!s3_api_is_write(op)) {
		/* Reads: the first replica that answers (every replica has every ack'ed write). */
		for (int i = 0; i < n; i++) {
			if (i + 1 < n && mn_is_down(s, mns[i]))
				continue;
			rc = mn_s3(s, mns[i], op, body, len, r);
			if (!rc)
				return;
		}
		unavailable(r, op, mns[n - 1]);
		return;
	}
	/* Writes: every replica, in placement order; success only when all have it durable.
	 * A replica that cannot be reached fails the write (503) rather than leave it on
	 * fewer replicas than configured: there is no catch-up of a returning MN yet. */
	for (int i = 0; i < n; i++) {
		struct s3_resp one;

		rc = mn_s3(s, mns[i], op, body, len, &one);
		if (rc) {
			s3_resp_free(&one);
			unavailable(r, op, mns[i]);
			return;
		}
		if (i == 0) {
			*r = one;
			if (r->status != 200)
				return;               /* validation / conflict: nothing written */
		} else if (one.status != r->status) {
			/* A replica refused what the first one took (e.g. it is full: 402): not
			 * durable on every replica, so not acknowledged; the client gets that
			 * replica's error (a retry overwrites the first replica's copy). */
			dm_warn("s3: %s: mn%u answered %d, mn%u %d", op, mns[0], r->status, mns[i],
				one.status);
			s3_resp_free(r);
			*r = one;
			if (r->status != 200)
				return;
		} else {
			s3_resp_free(&one);
		}
	}
}
