/* cn_s3_write.c: every S3 operation but QueryVectors on the compute node's gateway:
 * routed by the bucket it names to the memory nodes holding that bucket; reads go to the
 * first caught-up replica that answers, writes to every replica (caught-up ones first)
 * and succeed once the caught-up ones have the write durable, or, when one cannot be
 * reached, once [s3] write_min_replicas did and the missed ones are marked stale
 * (replication of writes; stale replicas and their catch-up: cn_s3_repl.c). */
#include "cn_s3_int.h"

#include <string.h>

/* A write to the n replicas of bucket: the caught-up ones first, in placement order, then
 * the stale ones (a catch-up in progress logs what they get: cn_s3_repl.c). Acknowledged
 * when every caught-up replica took it, or, with a cluster state to mark them in, when at
 * least [s3] write_min_replicas did and each one it missed is marked stale first. The
 * first replica's answer decides (validation, conflict: nothing written); a replica that
 * answers otherwise (e.g. full: 402) makes the write fail with its answer. */
static void write_replicas(struct cn_s3 *s, const char *op, const char *body, size_t len,
			   const char *bucket, const uint32_t *mns, int n, struct s3_resp *r)
{
	uint32_t missed[DM_MAX_NODES], stale[DM_MAX_NODES];
	int nmiss = 0, nstale = 0, ok = 0, rc;
	bool marks = repl_marks(s), have = false;

	for (int i = 0; i < n; i++) {
		struct s3_resp one;

		if (marks && replica_stale(s, bucket, mns[i])) {
			stale[nstale++] = mns[i];
			continue;
		}
		rc = mn_s3(s, mns[i], op, body, len, &one);
		if (rc) {
			s3_resp_free(&one);
			if (!marks) {
				/* No cluster state to mark it in: a write on fewer replicas than
				 * configured would be lost to a reader of the missing one. */
				if (have)
					s3_resp_free(r);
				unavailable(r, op, mns[i]);
				return;
			}
			missed[nmiss++] = mns[i];
			continue;
		}
		if (!have) {
			*r = one;
			have = true;
			if (r->status != 200)
				return;               /* validation / conflict: nothing written */
		} else if (one.status != r->status) {
			/* A replica refused what the first one took (e.g. it is full: 402): not
			 * durable where it should be, so not acknowledged; the client gets that
			 * replica's error (a retry overwrites the first replica's copy). */
			dm_warn("s3: %s: replicas of %s answered %d and %d (mn%u)", op, bucket,
				r->status, one.status, mns[i]);
			s3_resp_free(r);
			*r = one;
			if (r->status != 200)
				return;
		} else {
			s3_resp_free(&one);
		}
		ok++;
	}
	if (!have || (uint32_t)ok < DM_MIN(s->repl.write_min, (uint32_t)n)) {
		if (have)
			s3_resp_free(r);
		if (!have && !nmiss && nstale)
			s3_resp_error(r, 503, "ServiceUnavailableException",
				      "%s: every replica of bucket %s is being caught up; retry "
				      "later", op, bucket);
		else
			unavailable(r, op, nmiss ? missed[0] : mns[0]);
		return;
	}
	/* The stale replicas: whatever they answer does not count, but one that cannot be
	 * reached is marked again (a catch-up running now must not end as if it had it). */
	for (int i = 0; i < nstale; i++) {
		struct s3_resp one;

		rc = mn_is_down(s, stale[i]) ? -EHOSTDOWN : mn_s3(s, stale[i], op, body, len, &one);
		if (rc)
			missed[nmiss++] = stale[i];
		else
			s3_resp_free(&one);
	}
	for (int i = 0; i < nmiss; i++)
		if (mark_stale(s, bucket, missed[i])) {
			s3_resp_free(r);
			s3_resp_error(r, 503, "ServiceUnavailableException",
				      "%s: replica mn%u of bucket %s missed the write and the cluster "
				      "state cannot record it; retry later", op, missed[i], bucket);
			return;
		}
	if (ok < n)
		__atomic_add_fetch(&s->repl.degraded_writes, 1, __ATOMIC_RELAXED);
}

/* Every operation but QueryVectors: route by bucket; writes to every replica. */
void be_handle(void *ctx, const char *op, const char *body, size_t len,
		      struct s3_resp *r)
{
	struct cn_s3 *s = ctx;
	char bucket[NAME_MAX_ + 8];

	memset(r, 0, sizeof(*r));
	if (s3_api_user_bucket(body, len, r))
		return;                 /* "B#s" names a shard: never a user's bucket */
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
	if (shard_op(s, op, body, len, bucket, r))
		return;                 /* a bucket of several shards (cn_s3_shard.c) */
	bucket_op(s, op, body, len, bucket, !s3_api_is_write(op), r);
}

void bucket_op(struct cn_s3 *s, const char *op, const char *body, size_t len,
	       const char *bucket, bool read, struct s3_resp *r)
{
	uint32_t mns[DM_MAX_NODES];
	int n, rc;

	memset(r, 0, sizeof(*r));
	n = bucket_mns(s, bucket, mns);
	if (n <= 0) {
		unavailable(r, op, 0);
		return;
	}
	if (read) {
		/* Reads: the first caught-up replica that answers (each has every acknowledged
		 * write; a stale one is skipped until the controller caught it up). */
		uint32_t last = mns[n - 1];

		n = bucket_read_mns(s, bucket, mns);
		for (int i = 0; i < n; i++) {
			if (i + 1 < n && mn_is_down(s, mns[i]))
				continue;
			rc = mn_s3(s, mns[i], op, body, len, r);
			if (!rc)
				return;
		}
		if (n <= 0) {
			s3_resp_error(r, 503, "ServiceUnavailableException",
				      "%s: no caught-up replica of bucket %s is reachable; retry later",
				      op, bucket);
			return;
		}
		unavailable(r, op, n > 0 ? mns[n - 1] : last);
		return;
	}
	write_replicas(s, op, body, len, bucket, mns, n, r);
}
