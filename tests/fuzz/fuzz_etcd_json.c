/* fuzz_etcd_json.c: libFuzzer target for the parsers of etcd's answers (common/etcd): any
 * input goes through the answer check (HTTP 200 and an error status, with the error
 * mapping), then the range, write, lease and watch-message parsers; what they accept must
 * hold their promises (non-empty NUL-terminated keys, ascending range keys, events in
 * revision order, positive lease ids). The strict base64 decoder and the up-set and
 * placement parsers (cstate.h) and a rollout oracle's value (router_etcd.h) run on the raw
 * input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cstate.h"
#include "etcd_int.h"
#include "idrange.h"
#include "router_etcd.h"
#include "upper.h"
#include "stale.h"
#include "wire.h"

static void check_kv(const struct dm_etcd_kv *kv)
{
	if (!kv->key || !kv->key_len || kv->key[kv->key_len] || !kv->val ||
	    ((char *)kv->val)[kv->len] || kv->mod_revision <= 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dm_etcd e = { .nep = 0 };
	struct dm_etcd_kv *kvs;
	struct dm_etcd_wmsg m;
	int64_t rev, del, id, ttl;
	size_t n, bl;
	json_t *a;
	bool ok;
	char *b;

	{
		/* The up-set value (cstate.h): what it accepts formats and parses back equal. */
		struct dm_upset u, v;

		if (dm_upset_parse(data, size, &u) == 0) {
			char *t = dm_upset_format(&u);

			if (u.version < 1 || u.time < 0 || !t || dm_upset_parse(t, strlen(t), &v) ||
			    v.version != u.version || memcmp(v.mn, u.mn, sizeof(u.mn)) ||
			    memcmp(v.cn, u.cn, sizeof(u.cn)) || strcmp(v.controller, u.controller))
				abort();
			free(t);
		}
	}
	{
		/* The placement value, the same way. */
		struct dm_placement p, q;

		if (dm_placement_parse(data, size, &p) == 0) {
			char *t = dm_placement_format(&p);

			if (p.version < 1 || p.time < 0 || !t || dm_placement_parse(t, strlen(t), &q) ||
			    q.version != p.version || memcmp(q.retired, p.retired, sizeof(p.retired)) ||
			    strcmp(q.by, p.by))
				abort();
			free(t);
		}
	}
	{
		/* A stale mark (stale.h), its key's rest taken from the value it names: what it
		 * accepts names a valid bucket and node. */
		struct dm_stale st;
		char rest[128];

		if (dm_stale_parse("x/0", data, size, &st) == 0 && (strcmp(st.bucket, "x") || st.mn))
			abort();
		if (size > 2 && size < 40 && data[0] != '/') {
			memcpy(rest, data, size);
			rest[size] = 0;
			if (!memchr(rest, 0, size) &&
			    dm_stale_parse(rest, "{\"bucket\":\"b\",\"mn\":1,\"since\":1,\"by\":\"cn0\","
					   "\"seq\":2}", 50, &st) == 0 && strcmp(rest, "b/1"))
				abort();
		}
	}
	{
		/* An id range value (idrange.h): what it accepts is digits only, at most 2^63,
		 * and prints back no longer (leading zeros are accepted). */
		uint64_t v;
		char t[24];

		if (dm_idrange_parse(data, size, &v) == 0) {
			if (v > UINT64_C(1) << 63 || size > 20)
				abort();
			for (size_t i = 0; i < size; i++)
				if (data[i] < '0' || data[i] > '9')
					abort();
			snprintf(t, sizeof(t), "%llu", (unsigned long long)v);
			if (strlen(t) > size)
				abort();
		}
	}
	{
		/* An upper-level node's key and value (upper.h): the input split at its first
		 * '=' into key (under a prefix of 7 bytes) and value; what it accepts prints
		 * back the same key and value. */
		const uint8_t *eq = memchr(data, '=', size);
		struct dm_upper_ent x;

		if (eq && dm_upper_parse((const char *)data, (size_t)(eq - data), 7, eq + 1,
					 size - (size_t)(eq - data) - 1, &x) == 0) {
			char k[160], v[8];
			int kl = snprintf(k, sizeof(k), "%u/%llu/%016llx/%u", x.graph,
					  (unsigned long long)x.gen, (unsigned long long)x.tag,
					  x.id);
			int vl = snprintf(v, sizeof(v), "%u", x.level);

			if (x.graph >= DM_MAX_GRAPHS || x.level < 1 || x.level > 31 ||
			    (size_t)kl != (size_t)(eq - data) - 7 || memcmp(k, data + 7, (size_t)kl) ||
			    (size_t)vl != size - (size_t)(eq - data) - 1 || memcmp(v, eq + 1, (size_t)vl))
				abort();
		}
	}
	{
		/* A rollout oracle's value (cn/router/router_etcd.h): what it accepts encodes
		 * back to the same bytes, its wire form inside the input. */
		struct router_etcd_meta om;
		const uint8_t *ow;
		size_t owl;

		if (router_etcd_parse(data, size, &om, &ow, &owl) == 0) {
			uint8_t *back = malloc(size);

			if (!back || size != ROE_HDR_LEN + owl || (owl && ow != data + ROE_HDR_LEN) ||
			    (!owl && ow) || om.ncn < 1 || om.ncn > DM_MAX_NODES)
				abort();
			router_etcd_encode(&om, ow, owl, back);
			if (memcmp(back, data, size))
				abort();
			free(back);
		}
	}
	if (dm_etcd_unb64((const char *)data, size, &b, &bl) == 0) {
		if (bl > size || b[bl])
			abort();
		free(b);
	}
	if (dm_etcd_answer(&e, "/fuzz", 400, data, size, &a) == 0 || a)
		abort();                           /* an error status never gives an answer */
	if (dm_etcd_answer(&e, "/fuzz", 200, data, size, &a))
		return 0;
	if (dm_etcd_ans_range(a, &kvs, &n, &rev) == 0) {
		for (size_t i = 0; i < n; i++) {
			check_kv(&kvs[i]);
			const struct dm_etcd_kv *p = &kvs[i - (i > 0)];
			int c = memcmp(p->key, kvs[i].key, DM_MIN(p->key_len, kvs[i].key_len));

			if (i && (c > 0 || (c == 0 && p->key_len >= kvs[i].key_len)))
				abort();
		}
		if (rev <= 0 || (n && !kvs) || (!n && kvs))
			abort();
		dm_etcd_kvs_free(kvs, n);
	}
	if (dm_etcd_ans_write(a, &rev, &del, &ok) == 0 && (rev <= 0 || del < 0))
		abort();
	if (dm_etcd_ans_lease(a, &id, &ttl) == 0 && (id <= 0 || ttl < 0))
		abort();
	if (dm_etcd_ans_watch(a, &m) == 0) {
		for (size_t i = 0; i < m.nev; i++) {
			check_kv(&m.ev[i].kv);
			if (i && m.ev[i].kv.mod_revision < m.ev[i - 1].kv.mod_revision)
				abort();
		}
		dm_etcd_wmsg_free(&m);
	}
	json_decref(a);
	return 0;
}
