/* upper.c: the online upper levels' keys in etcd (upper.h): the key, its parser, the put
 * and the forget. */
#include "upper.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "etcd.h"
#include "wire.h"

int dm_upper_prefix(char *out, size_t cap, const char *cluster)
{
	int n = snprintf(out, cap, "/dmann/%s/upper/", cluster);

	return n < 0 || (size_t)n >= cap ? -EINVAL : n;
}

int dm_upper_put(struct dm_etcd *e, const char *cluster, uint32_t graph, uint64_t gen,
		 uint64_t tag, uint32_t id, uint32_t level)
{
	char key[256], v[8];
	int n, vl;

	if (!e || !cluster || graph >= DM_MAX_GRAPHS || level < 1 || level > 31)
		return -EINVAL;
	n = snprintf(key, sizeof(key), "/dmann/%s/upper/%u/%llu/%016llx/%u", cluster, graph,
		     (unsigned long long)gen, (unsigned long long)tag, id);
	if (n < 0 || (size_t)n >= sizeof(key))
		return -EINVAL;
	vl = snprintf(v, sizeof(v), "%u", level);
	return dm_etcd_put(e, key, v, (size_t)vl, 0, NULL);
}

/* A canonical unsigned number of base 10 (no leading zero but "0") or 16 (exactly 16
 * lower-case digits) from s[0..len), at most max. */
static bool num(const char *s, size_t len, int base, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;

	if (!len || len > (base == 16 ? 16u : 20u) || (base == 16 && len != 16) ||
	    (base == 10 && len > 1 && s[0] == '0'))
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned d;

		if (s[i] >= '0' && s[i] <= '9')
			d = (unsigned)(s[i] - '0');
		else if (base == 16 && s[i] >= 'a' && s[i] <= 'f')
			d = (unsigned)(s[i] - 'a' + 10);
		else
			return false;
		if (d > max || v > (max - d) / (uint64_t)base)
			return false;
		v = v * (uint64_t)base + d;
	}
	*out = v;
	return true;
}

int dm_upper_parse(const char *key, size_t key_len, size_t plen, const void *val, size_t len,
		   struct dm_upper_ent *out)
{
	const char *p, *end;
	uint64_t f[4], lv;
	int bases[4] = { 10, 10, 16, 10 };
	uint64_t maxes[4] = { DM_MAX_GRAPHS - 1, UINT64_MAX, UINT64_MAX, UINT32_MAX };

	if (!key || !out || key_len <= plen || !val)
		return -EBADMSG;
	p = key + plen;
	end = key + key_len;
	for (int i = 0; i < 4; i++) {
		const char *sl = memchr(p, '/', (size_t)(end - p));
		const char *e = i < 3 ? sl : end;

		if (!e || (i == 3 && sl) || !num(p, (size_t)(e - p), bases[i], maxes[i], &f[i]))
			return -EBADMSG;
		p = e + 1;
	}
	if (!num(val, len, 10, 31, &lv) || lv < 1)
		return -EBADMSG;
	*out = (struct dm_upper_ent){ (uint32_t)f[0], f[1], f[2], (uint32_t)f[3], (uint32_t)lv };
	return 0;
}

int dm_upper_forget(struct dm_etcd *e, const char *cluster, uint32_t graph, int64_t *deleted)
{
	char prefix[192];

	if (!e || !cluster)
		return -EINVAL;
	snprintf(prefix, sizeof(prefix), "/dmann/%s/upper/%u/", cluster, graph);
	return dm_etcd_delete(e, prefix, true, deleted);
}
