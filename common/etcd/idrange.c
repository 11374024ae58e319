/* idrange.c: ranges of node ids of a graph's online inserts in etcd (idrange.h): the key,
 * its value's parser, the guarded take. */
#include "idrange.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd.h"

#define IDR_TRIES 32

static void key_of(char *out, size_t cap, const char *cluster, uint32_t graph, uint64_t gen,
		   uint64_t tag)
{
	snprintf(out, cap, "/dmann/%s/ids/%u/%llu/%016llx", cluster, graph, (unsigned long long)gen,
		 (unsigned long long)tag);
}

int dm_idrange_parse(const void *val, size_t len, uint64_t *next)
{
	const char *s = val;
	uint64_t v = 0;

	if (!s || !len || len > 20)
		return -EBADMSG;
	for (size_t i = 0; i < len; i++) {
		unsigned d = (unsigned char)s[i] - '0';

		if (d > 9 || v > (UINT64_C(1) << 63) / 10)
			return -EBADMSG;
		v = v * 10 + d;
		if (v > UINT64_C(1) << 63)
			return -EBADMSG;
	}
	*next = v;
	return 0;
}

int dm_idrange_read(struct dm_etcd *e, const char *cluster, uint32_t graph, uint64_t gen,
		    uint64_t tag, uint64_t *next)
{
	char key[256];
	void *val = NULL;
	size_t len = 0;
	int rc;

	if (!e || !cluster || !next)
		return -EINVAL;
	key_of(key, sizeof(key), cluster, graph, gen, tag);
	rc = dm_etcd_get(e, key, &val, &len, NULL);
	if (!rc)
		rc = dm_idrange_parse(val, len, next);
	free(val);
	return rc;
}

int dm_idrange_forget(struct dm_etcd *e, const char *cluster, uint32_t graph,
		      int64_t *deleted)
{
	char prefix[192];

	if (!e || !cluster)
		return -EINVAL;
	/* (the trailing slash: graph 1's prefix is not graph 10's) */
	snprintf(prefix, sizeof(prefix), "/dmann/%s/ids/%u/", cluster, graph);
	return dm_etcd_delete(e, prefix, true, deleted);
}

int dm_idrange_take(struct dm_etcd *e, const char *cluster, uint32_t graph, uint64_t gen,
		    uint64_t tag, uint64_t first, uint64_t want, uint64_t share, uint64_t cap,
		    dm_idrange_seed_fn seed, void *ctx, uint64_t *lo, uint64_t *hi)
{
	char key[256], v[24];

	if (!e || !cluster || !want || !share || !lo || !hi || cap > UINT64_C(1) << 62)
		return -EINVAL;
	key_of(key, sizeof(key), cluster, graph, gen, tag);
	for (int t = 0; t < IDR_TRIES; t++) {
		void *val = NULL;
		size_t len = 0;
		int64_t rev = 0;
		uint64_t next, n;
		bool ok = false;
		int rc = dm_etcd_get(e, key, &val, &len, &rev);

		if (rc == -ENOENT) {
			rev = 0;        /* create it: the put below expects it absent */
			rc = seed ? seed(ctx, &next) : -EINVAL;
		} else if (!rc) {
			rc = dm_idrange_parse(val, len, &next);
		}
		free(val);
		if (rc)
			return rc;
		next = DM_MAX(next, first);
		if (next >= cap)
			return -ENOSPC;
		n = DM_MIN(want, DM_MAX((cap - next) / share, 1));
		snprintf(v, sizeof(v), "%llu", (unsigned long long)(next + n));
		rc = dm_etcd_put_if(e, key, v, strlen(v), 0, rev, &ok, NULL);
		if (rc)
			return rc;
		if (ok) {
			*lo = next;
			*hi = next + n;
			return 0;
		}
	}
	return -EAGAIN;
}
