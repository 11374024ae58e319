/* config.c: cluster INI file loading and validation (inih does the lexing); the S3
 * identities are in config_s3.c. */
#include "config.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include "config_int.h"
#include "hnsw/hnsw.h"
#include "wire.h"

#include <ctype.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(struct parse_ctx *pc, const char *fmt, const char *a, const char *b)
{
	if (!pc->msg[0])
		snprintf(pc->msg, sizeof(pc->msg), fmt, a, b);
	return 0;   /* inih: stop and report this line */
}

int dm_cfg_fail(struct parse_ctx *pc, const char *fmt, const char *a, const char *b)
{
	return fail(pc, fmt, a, b);
}

static bool copy_str(char *dst, size_t cap, const char *v)
{
	size_t n = strlen(v);

	if (n == 0 || n >= cap)
		return false;
	memcpy(dst, v, n + 1);
	return true;
}

static bool parse_u64(const char *v, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long x;

	if (!*v || *v == '-')
		return false;
	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno || *end || x > max)
		return false;
	*out = x;
	return true;
}

static bool valid_addr(const char *v)
{
	const char *colon = strrchr(v, ':');
	uint64_t port;

	if (!colon || colon == v)
		return false;
	return parse_u64(colon + 1, 65535, &port);
}

/* ---- compute-node settings ([cn], [cn.N]) ----------------------------------------------- */

int dm_config_parse_cache(const char *v, bool *is_ratio, double *ratio, uint64_t *bytes)
{
	static const struct { const char *name; uint64_t mul; } units[] = {
		{ "B", 1 }, { "KiB", 1ull << 10 }, { "MiB", 1ull << 20 }, { "GiB", 1ull << 30 },
		{ "TiB", 1ull << 40 }, { "KB", 1000ull }, { "MB", 1000000ull },
		{ "GB", 1000000000ull }, { "TB", 1000000000000ull },
	};
	char *end;
	double d;

	if (!strcmp(v, "0")) {
		*is_ratio = false;
		*ratio = 0;
		*bytes = 0;
		return 0;
	}
	if (!*v || *v == '-' || *v == '+' || isspace((unsigned char)*v))
		return -EINVAL;
	errno = 0;
	d = strtod(v, &end);
	if (errno || end == v || !isfinite(d) || d < 0)
		return -EINVAL;
	while (*end == ' ')
		end++;
	if (!strcmp(end, "%")) {
		if (d > 100)
			return -EINVAL;
		*is_ratio = true;
		*ratio = d / 100;
		*bytes = 0;
		return 0;
	}
	for (size_t i = 0; i < DM_ARRAY_SIZE(units); i++)
		if (!strcmp(end, units[i].name)) {
			double b = d * (double)units[i].mul;

			if (b > (double)(1ull << 50) || (b < 1 && d != 0) || b != floor(b))
				return -EINVAL;
			*is_ratio = false;
			*ratio = 0;
			*bytes = (uint64_t)b;
			return 0;
		}
	return -EINVAL;
}

uint64_t dm_config_cache_bytes(const struct dm_cn_cfg *c, uint64_t index_bytes)
{
	if (c->cache_is_ratio)
		return (uint64_t)(c->cache_ratio * (double)index_bytes);
	return c->cache_bytes;
}

int dm_config_cn_key(struct dm_cn_cfg *c, bool per_node, const char *key, const char *v,
		     uint32_t *set, char *msg, size_t msglen)
{
	uint64_t u;

	if (!strcmp(key, "cache")) {
		if (dm_config_parse_cache(v, &c->cache_is_ratio, &c->cache_ratio, &c->cache_bytes)) {
			snprintf(msg, msglen, "cache '%s' must be 0, a share of the index like 10%% "
				 "(0..100%%), or bytes with a unit like 512MiB (B, KiB, MiB, GiB, TiB, "
				 "KB, MB, GB, TB; at most 1 PiB)", v);
			return -EINVAL;
		}
		*set |= DM_CN_SET_CACHE;
		return 1;
	}
	if (!strcmp(key, "cache_admit")) {
		char *end;
		double d;

		errno = 0;
		d = strtod(v, &end);
		if (errno || end == v || *end || !(d >= 0 && d <= 1)) {
			snprintf(msg, msglen, "cache_admit '%s' must be a number in 0..1", v);
			return -EINVAL;
		}
		c->cache_admit = d;
		*set |= DM_CN_SET_ADMIT;
		return 1;
	}
	if (strcmp(key, "refresh_ms") && strcmp(key, "lease_ms") && strcmp(key, "send_queue") &&
	    strcmp(key, "drain_ms") && strcmp(key, "call_threads") && strcmp(key, "ef_upper"))
		return 0;
	if (per_node) {
		snprintf(msg, msglen, "%s applies to every compute node: set it in [cn]", key);
		return -EINVAL;
	}
	if (!strcmp(key, "refresh_ms")) {
		if (!parse_u64(v, 60000, &u) || u < 50) {
			snprintf(msg, msglen, "refresh_ms '%s' must be 50..60000", v);
			return -EINVAL;
		}
		c->refresh_ms = (uint32_t)u;
	} else if (!strcmp(key, "lease_ms")) {
		if (!parse_u64(v, 3600000, &u) || u < 1000) {
			snprintf(msg, msglen, "lease_ms '%s' must be 1000..3600000", v);
			return -EINVAL;
		}
		c->lease_ms = (uint32_t)u;
	} else if (!strcmp(key, "drain_ms")) {
		if (!parse_u64(v, 600000, &u)) {
			snprintf(msg, msglen, "drain_ms '%s' must be 0..600000", v);
			return -EINVAL;
		}
		c->drain_ms = (uint32_t)u;
	} else if (!strcmp(key, "call_threads")) {
		if (!parse_u64(v, DM_CN_MAX_CALL_THREADS, &u) || u < 1) {
			snprintf(msg, msglen, "call_threads '%s' must be 1..%u", v,
				 DM_CN_MAX_CALL_THREADS);
			return -EINVAL;
		}
		c->call_threads = (uint32_t)u;
	} else if (!strcmp(key, "ef_upper")) {
		if (!parse_u64(v, HNSW_EF_UPPER_MAX, &u) || u < 1) {
			snprintf(msg, msglen, "ef_upper '%s' must be 1..%u", v, HNSW_EF_UPPER_MAX);
			return -EINVAL;
		}
		c->ef_upper = (uint32_t)u;
	} else {
		if (!parse_u64(v, 65536, &u) || u < 128) {
			snprintf(msg, msglen, "send_queue '%s' must be 128..65536", v);
			return -EINVAL;
		}
		c->send_queue = (uint32_t)u;
	}
	return 1;
}

static int node_key(struct parse_ctx *pc, struct dm_node_cfg *n, const char *key,
		    const char *v)
{
	uint64_t u;

	if (n->role == DM_ROLE_CN) {
		int rc = dm_config_cn_key(&n->cnc, true, key, v, &n->cnc_set, pc->cnmsg,
					  sizeof(pc->cnmsg));

		if (rc < 0)
			return fail(pc, "%s%s", pc->cnmsg, "");
		if (rc > 0)
			return 1;
	}
	if (!strcmp(key, "address")) {
		if (!copy_str(n->address, sizeof(n->address), v) || !valid_addr(v))
			return fail(pc, "address '%s' is not host:port%s", v, "");
	} else if (!strcmp(key, "http") && n->role == DM_ROLE_CN) {
		if (!copy_str(n->http, sizeof(n->http), v) || !valid_addr(v))
			return fail(pc, "http '%s' is not host:port%s", v, "");
	} else if (!strcmp(key, "https") && n->role == DM_ROLE_CN) {
		if (!copy_str(n->https, sizeof(n->https), v) || !valid_addr(v))
			return fail(pc, "https '%s' is not host:port%s", v, "");
	} else if (!strcmp(key, "zone")) {
		if (!copy_str(n->zone, sizeof(n->zone), v))
			return fail(pc, "zone '%s' is empty or longer than 31 characters%s", v, "");
	} else if (!strcmp(key, "device")) {
		if (!copy_str(n->device, sizeof(n->device), v))
			return fail(pc, "device '%s' is empty or too long%s", v, "");
	} else if (!strcmp(key, "data_dir") && n->role == DM_ROLE_MN) {
		if (!copy_str(n->data_dir, sizeof(n->data_dir), v))
			return fail(pc, "data_dir '%s' is empty or too long%s", v, "");
	} else if (!strcmp(key, "metrics")) {
		if (!copy_str(n->metrics, sizeof(n->metrics), v) || !valid_addr(v))
			return fail(pc, "metrics '%s' is not host:port%s", v, "");
	} else if (!strcmp(key, "capacity")) {
		char *end;
		double d = strtod(v, &end);

		if (*end || !isfinite(d) || d <= 0 || d > 1e6)
			return fail(pc, "capacity '%s' must be a number in (0, 1e6]%s", v, "");
		n->capacity = d;
	} else if (!strcmp(key, "region_mb") && n->role == DM_ROLE_MN) {
		if (!parse_u64(v, 1u << 24, &u) || u == 0)
			return fail(pc, "region_mb '%s' must be an integer in 1..16777216%s", v, "");
		n->region_bytes = u << 20;
	} else if (!strcmp(key, "hugepages") && n->role == DM_ROLE_MN) {
		if (!strcmp(v, "auto"))
			n->hugepages = DM_HUGE_AUTO;
		else if (!strcmp(v, "on"))
			n->hugepages = DM_HUGE_ON;
		else if (!strcmp(v, "off"))
			n->hugepages = DM_HUGE_OFF;
		else
			return fail(pc, "hugepages '%s' must be auto, on or off%s", v, "");
	} else if (!strcmp(key, "numa_node") && n->role == DM_ROLE_MN) {
		char *end;
		long x = strtol(v, &end, 10);

		if (*end || !*v || x < -1 || x > 1023)
			return fail(pc, "numa_node '%s' must be -1..1023%s", v, "");
		n->numa_node = (int)x;
	} else {
		return fail(pc, "unknown key '%s' in a %s section", key,
			    n->role == DM_ROLE_MN ? "memory-node" : "compute-node");
	}
	return 1;
}

static struct dm_node_cfg *node_for_section(struct parse_ctx *pc, const char *section)
{
	struct dm_cluster_cfg *cfg = pc->cfg;
	enum dm_role role;
	uint64_t id;
	struct dm_node_cfg *n;

	if (!strncmp(section, "mn.", 3))
		role = DM_ROLE_MN;
	else if (!strncmp(section, "cn.", 3))
		role = DM_ROLE_CN;
	else
		return NULL;
	if (!parse_u64(section + 3, DM_MAX_NODES - 1, &id))
		return NULL;
	n = role == DM_ROLE_MN ? &cfg->mn[id] : &cfg->cn[id];
	if (!n->defined) {
		n->defined = true;
		n->role = role;
		n->id = (uint32_t)id;
		n->capacity = 1.0;
		n->numa_node = -1;
		n->hugepages = DM_HUGE_AUTO;
		n->region_bytes = (uint64_t)256 << 20;
		if (role == DM_ROLE_MN)
			cfg->n_mn = DM_MAX(cfg->n_mn, (uint32_t)id + 1);
		else
			cfg->n_cn = DM_MAX(cfg->n_cn, (uint32_t)id + 1);
	}
	return n;
}

/* ---- [s3]: the gateway tunables (kept apart from the other sections) ---- */

static const struct s3_key {
	const char *name;
	uint64_t lo, hi;
	unsigned shift;              /* the value in the file is in units of 1 << shift bytes */
	size_t off;                  /* in struct dm_s3_cfg */
	bool u64;
	const char *unit;
} s3_keys[] = {
	{ "width", 0, DM_MAX_NODES, 0, offsetof(struct dm_s3_cfg, width), false, "" },
	{ "groups", 0, DM_MAX_NODES, 0, offsetof(struct dm_s3_cfg, groups), false, "" },
	{ "max_scan_mb", 1, 1u << 20, 20, offsetof(struct dm_s3_cfg, max_scan_bytes), true, " MiB" },
	{ "hedge_ms", 1, 60000, 0, offsetof(struct dm_s3_cfg, hedge_ms), false, " ms" },
	{ "cache_mb", 1, 1u << 24, 20, offsetof(struct dm_s3_cfg, cache_bytes), true, " MiB" },
	{ "frag_fetch_kb", 64, 32768, 10, offsetof(struct dm_s3_cfg, frag_fetch_bytes), false,
	  " KiB" },
	{ "queue_depth", 1, 1u << 20, 0, offsetof(struct dm_s3_cfg, queue_depth), false, "" },
	{ "search_threads", 0, 256, 0, offsetof(struct dm_s3_cfg, search_threads), false, "" },
	{ "http_threads", 1, 256, 0, offsetof(struct dm_s3_cfg, http_threads), false, "" },
	{ "graph_min_rows", 0, 1ull << 40, 0, offsetof(struct dm_s3_cfg, graph_min_rows), true,
	  "" },
	{ "graph_ef", 1, 65536, 0, offsetof(struct dm_s3_cfg, graph_ef), false, "" },
	{ "graph_beam", 1, 16, 0, offsetof(struct dm_s3_cfg, graph_beam), false, "" },
	{ "graph_filter_widen", 1, 100, 0, offsetof(struct dm_s3_cfg, graph_filter_widen), false,
	  "" },
	{ "index_interval_ms", 0, 3600000, 0, offsetof(struct dm_s3_cfg, index_interval_ms), false,
	  " ms" },
	{ "index_batch", 1, 8192, 0, offsetof(struct dm_s3_cfg, index_batch), false, "" },
	{ "index_threads", 1, 64, 0, offsetof(struct dm_s3_cfg, index_threads), false, "" },
	{ "index_ef", 1, 65536, 0, offsetof(struct dm_s3_cfg, index_ef), false, "" },
	{ "member_conns", 0, 256, 0, offsetof(struct dm_s3_cfg, member_conns), false, "" },
	{ "graph_auto", 0, 1, 0, offsetof(struct dm_s3_cfg, graph_auto), false, "" },
	{ "graph_room", 1000, 100000000, 0, offsetof(struct dm_s3_cfg, graph_room), false,
	  "" },
	{ "write_min_replicas", 1, DM_MAX_NODES, 0, offsetof(struct dm_s3_cfg, write_min_replicas),
	  false, "" },
	{ "bucket_shards", 1, 256, 0, offsetof(struct dm_s3_cfg, bucket_shards), false, "" },
	{ "scan_budget", 0, 4096, 0, offsetof(struct dm_s3_cfg, scan_budget), false, "" },
	{ "scan_regions", 8, 4096, 0, offsetof(struct dm_s3_cfg, scan_regions), false, "" },
	{ "scan_min_rows", 0, 1ull << 40, 0, offsetof(struct dm_s3_cfg, scan_min_rows), true, "" },
	{ "scan_widen", 0, 1, 0, offsetof(struct dm_s3_cfg, scan_widen), false, "" },
};

void dm_s3_cfg_defaults(struct dm_s3_cfg *s3)
{
	*s3 = (struct dm_s3_cfg){ .max_scan_bytes = 256ull << 20, .hedge_ms = 50,
		.cache_bytes = 2048ull << 20, .frag_fetch_bytes = 16u << 20, .queue_depth = 64,
		.http_threads = 8, .graph_min_rows = 20000, .graph_ef = 128,
		.graph_beam = 4, .graph_filter_widen = 10, .index_interval_ms = 1000,
		.index_batch = 2000, .index_threads = 4, .index_ef = 100, .member_conns = 8,
		.graph_auto = 1, .graph_room = 20000, .write_min_replicas = 1, .bucket_shards = 1,
		.scan_regions = 64, .scan_min_rows = 100000, .scan_widen = 1 };
}

int dm_s3_cfg_key(struct dm_s3_cfg *s3, const char *key, const char *v, char *msg,
		  size_t msglen)
{
	for (size_t i = 0; i < DM_ARRAY_SIZE(s3_keys); i++) {
		const struct s3_key *k = &s3_keys[i];
		uint64_t u;

		if (strcmp(key, k->name))
			continue;
		if (!parse_u64(v, k->hi, &u) || u < k->lo) {
			snprintf(msg, msglen, "[s3] %s '%s' must be an integer in %llu..%llu%s",
				 key, v, (unsigned long long)k->lo, (unsigned long long)k->hi,
				 k->unit);
			return -ERANGE;
		}
		u <<= k->shift;
		if (k->u64)
			*(uint64_t *)((char *)s3 + k->off) = u;
		else
			*(uint32_t *)((char *)s3 + k->off) = (uint32_t)u;
		return 0;
	}
	return -ENOENT;
}

/* ---- [mn]: settings of every memory node (flat store) ---- */

static void mn_settings_default(struct dm_mn_settings *m)
{
	*m = (struct dm_mn_settings){ .flat_frag_rows = 4096, .wal_group_commit = true,
				      .flat_max_mb = DM_FLAT_MAX_AUTO };
}

static int mn_settings_key(struct parse_ctx *pc, const char *key, const char *v)
{
	struct dm_mn_settings *m = &pc->cfg->mn_set;
	uint64_t u;

	if (!strcmp(key, "flat_frag_rows")) {
		if (!parse_u64(v, 1u << 20, &u) || u < 16)
			return fail(pc, "flat_frag_rows '%s' must be an integer in 16..1048576%s", v, "");
		m->flat_frag_rows = (uint32_t)u;
	} else if (!strcmp(key, "flat_max_mb")) {
		if (!strcmp(v, "auto"))
			m->flat_max_mb = DM_FLAT_MAX_AUTO;
		else if (!parse_u64(v, 1u << 30, &u))
			return fail(pc, "flat_max_mb '%s' must be auto or an integer in "
				    "0..1073741824 (MiB; 0: no limit)%s", v, "");
		else
			m->flat_max_mb = u;
	} else if (!strcmp(key, "wal_group_commit")) {
		if (!strcmp(v, "yes") || !strcmp(v, "true") || !strcmp(v, "1"))
			m->wal_group_commit = true;
		else if (!strcmp(v, "no") || !strcmp(v, "false") || !strcmp(v, "0"))
			m->wal_group_commit = false;
		else
			return fail(pc, "wal_group_commit '%s' must be yes or no%s", v, "");
	} else {
		return fail(pc, "unknown key '%s' in section [%s]", key, "mn");
	}
	return 1;
}

/* ---- end of [mn] ---- */

/* [client.NAME]: a client identity (libdmann); its only key is secret_file. */
static int client_key(struct parse_ctx *pc, const char *name, const char *key, const char *v)
{
	struct dm_cluster_cfg *cfg = pc->cfg;
	struct dm_client_cfg *c = NULL;

	if (!dm_wire_client_name_ok(name))
		return fail(pc, "client name '%s' must be 1..63 of A-Z a-z 0-9 _ . -%s", name, "");
	if (!strcmp(name, DM_GATEWAY_CLIENT))
		return fail(pc, "client name '%s' is reserved (the compute nodes' own gateway "
			    "identity)%s", name, "");
	for (uint32_t i = 0; i < cfg->n_clients; i++)
		if (!strcmp(cfg->clients[i].name, name))
			c = &cfg->clients[i];
	if (!c) {
		if (cfg->n_clients == DM_MAX_CLIENTS)
			return fail(pc, "more than 32 [client.*] sections%s%s", "", "");
		c = &cfg->clients[cfg->n_clients++];
		snprintf(c->name, sizeof(c->name), "%s", name);
	}
	if (strcmp(key, "secret_file"))
		return fail(pc, "unknown key '%s' in a [client.*] section (only secret_file)%s",
			    key, "");
	if (!copy_str(c->secret_file, sizeof(c->secret_file), v))
		return fail(pc, "secret_file '%s' is empty or too long%s", v, "");
	return 1;
}

static int handler(void *user, const char *section, const char *key, const char *v)
{
	struct parse_ctx *pc = user;
	struct dm_cluster_cfg *cfg = pc->cfg;
	struct dm_node_cfg *n;
	uint64_t u;

	if (!key)   /* a section with no keys yet (INI_CALL_HANDLER_ON_NEW_SECTION builds) */
		return 1;
	if (!strcmp(section, "cluster")) {
		if (!strcmp(key, "name")) {
			if (!copy_str(cfg->name, sizeof(cfg->name), v))
				return fail(pc, "cluster name '%s' is empty or longer than 63 characters%s", v, "");
		} else if (!strcmp(key, "secret_file")) {
			if (!copy_str(pc->secret_file, sizeof(pc->secret_file), v))
				return fail(pc, "secret_file '%s' is empty or too long%s", v, "");
		} else if (!strcmp(key, "transport")) {
			if (strcmp(v, "tcp") && strcmp(v, "verbs") && strcmp(v, "auto"))
				return fail(pc, "transport '%s' must be tcp, verbs or auto%s", v, "");
			snprintf(cfg->transport, sizeof(cfg->transport), "%s",
				 strcmp(v, "auto") ? v : "");
		} else if (!strcmp(key, "redundancy")) {
			if (!parse_u64(v, 16, &u) || u == 0)
				return fail(pc, "redundancy '%s' must be 1..16%s", v, "");
			cfg->redundancy = (uint32_t)u;
		} else if (!strcmp(key, "etcd")) {
			if ((strncmp(v, "http://", 7) && strncmp(v, "https://", 8)) ||
			    !copy_str(cfg->etcd, sizeof(cfg->etcd), v))
				return fail(pc, "etcd '%s' must be http(s)://host:port[,...] (at most "
					    "511 characters)%s", v, "");
		} else if (!strcmp(key, "member_lease_s")) {
			if (!parse_u64(v, 60, &u) || u < 2)
				return fail(pc, "member_lease_s '%s' must be 2..60%s", v, "");
			cfg->etcd_lease_s = (uint32_t)u;
		} else if (!strcmp(key, "takeover_grace_s")) {
			if (!parse_u64(v, 600, &u) || u < 1)
				return fail(pc, "takeover_grace_s '%s' must be 1..600%s", v, "");
			cfg->etcd_grace_s = (uint32_t)u;
		} else if (!strcmp(key, "replace_after_s")) {
			if (!parse_u64(v, 86400, &u) || u < 1)
				return fail(pc, "replace_after_s '%s' must be 1..86400%s", v, "");
			cfg->replace_after_s = (uint32_t)u;
		} else if (!strcmp(key, "repair_mb_s")) {
			if (!parse_u64(v, 1000000, &u))
				return fail(pc, "repair_mb_s '%s' must be 0..1000000%s", v, "");
			cfg->repair_mb_s = (uint32_t)u;
		} else {
			return fail(pc, "unknown key '%s' in section [%s]", key, section);
		}
		return 1;
	}
	if (!strcmp(section, "router")) {
		struct dm_router_cfg *r = &cfg->router;
		char *end;
		double d;
		int st;

		if (!strcmp(key, "strategy")) {
			st = dm_route_parse(v);
			if (st < 0)
				return fail(pc, "strategy '%s' must be none, bestfit, balanced, adaptive or "
					    "adaptive-ring%s", v, "");
			r->strategy = (uint32_t)st;
		} else if (!strcmp(key, "batch") || !strcmp(key, "pause_queue")) {
			if (!parse_u64(v, 1000000, &u) || u == 0)
				return fail(pc, "%s '%s' must be 1..1000000", key, v);
			*(!strcmp(key, "batch") ? &r->batch : &r->pause_queue) = (uint32_t)u;
		} else if (!strcmp(key, "exchange_ms")) {
			if (!parse_u64(v, 60000, &u) || u < 10)
				return fail(pc, "exchange_ms '%s' must be 10..60000%s", v, "");
			r->exchange_ms = (uint32_t)u;
		} else if (!strcmp(key, "sample_min_nodes")) {
			if (!parse_u64(v, 100000000, &u) || u == 0)
				return fail(pc, "sample_min_nodes '%s' must be 1..100000000%s", v, "");
			r->sample_min_nodes = (uint32_t)u;
		} else if (!strcmp(key, "fit_duty")) {
			if (!parse_u64(v, 100, &u) || u < 5)
				return fail(pc, "fit_duty '%s' must be 5..100 (percent)%s", v, "");
			r->fit_duty = (uint32_t)u;
		} else if (!strcmp(key, "recluster_secs")) {
			if (!parse_u64(v, 86400, &u))
				return fail(pc, "recluster_secs '%s' must be 0..86400%s", v, "");
			r->recluster_secs = (uint32_t)u;
		} else if (!strcmp(key, "recluster_csp")) {
			errno = 0;
			d = strtod(v, &end);
			if (errno || end == v || *end || !(d >= 0 && d <= 1))
				return fail(pc, "recluster_csp '%s' must be a number in 0..1%s", v, "");
			r->recluster_csp = d;
		} else if (!strcmp(key, "recluster_mass")) {
			errno = 0;
			d = strtod(v, &end);
			if (errno || end == v || *end || !(d >= 0 && d <= 100))
				return fail(pc, "recluster_mass '%s' must be a number in 0..100%s", v, "");
			r->recluster_mass = d;
		} else if (!strcmp(key, "csp_slice")) {
			if (!parse_u64(v, 64, &u) || u < 1 || (u & (u - 1)))
				return fail(pc, "csp_slice '%s' must be 1, 2, 4, 8, 16, 32 or 64%s", v, "");
			r->csp_slice = (uint32_t)u;
		} else if (!strcmp(key, "partitions")) {
			if (!strcmp(v, "kmeans"))
				r->keyrange = false;
			else if (!strcmp(v, "keyrange"))
				r->keyrange = true;
			else
				return fail(pc, "partitions '%s' must be kmeans or keyrange%s", v, "");
		} else if (!strcmp(key, "regions")) {
			if (!parse_u64(v, 65536, &u))
				return fail(pc, "regions '%s' must be 0 (auto) or 1..65536%s", v, "");
			r->regions = (uint32_t)u;
		} else if (!strcmp(key, "spill_cache")) {
			if (!strcmp(v, "yes") || !strcmp(v, "true") || !strcmp(v, "1"))
				r->spill_cache = true;
			else if (!strcmp(v, "no") || !strcmp(v, "false") || !strcmp(v, "0"))
				r->spill_cache = false;
			else
				return fail(pc, "spill_cache '%s' must be yes or no%s", v, "");
		} else {
			return fail(pc, "unknown key '%s' in section [%s]", key, section);
		}
		return 1;
	}
	if (!strcmp(section, "cn")) {
		uint32_t set = 0;
		int rc = dm_config_cn_key(&cfg->cn_all, false, key, v, &set, pc->cnmsg,
					  sizeof(pc->cnmsg));

		if (rc < 0)
			return fail(pc, "%s%s", pc->cnmsg, "");
		if (rc == 0)
			return fail(pc, "unknown key '%s' in section [%s]", key, section);
		return 1;
	}
	if (!strcmp(section, "s3")) {
		int rc = dm_s3_cfg_key(&cfg->s3, key, v, pc->msg, sizeof(pc->msg));

		if (rc == -ERANGE)
			return 0;            /* pc->msg says why */
		if (rc == 0)
			return 1;
		if (!strcmp(key, "access_key")) {
			if (!copy_str(cfg->s3_access_key, sizeof(cfg->s3_access_key), v))
				return fail(pc, "access_key '%s' is empty or too long%s", v, "");
		} else if (!strcmp(key, "secret_key_file")) {
			if (!copy_str(pc->s3_secret_file, sizeof(pc->s3_secret_file), v))
				return fail(pc, "secret_key_file '%s' is empty or too long%s", v, "");
		} else if (!strcmp(key, "policy_default")) {
			if (strcmp(v, "allow") && strcmp(v, "deny"))
				return fail(pc, "policy_default '%s' must be allow or deny%s", v, "");
			cfg->s3_policy_deny = !strcmp(v, "deny");
		} else if (!strcmp(key, "https_cert") || !strcmp(key, "https_key")) {
			char *dst = key[6] == 'c' ? cfg->s3_https_cert : cfg->s3_https_key;

			if (!dm_cfg_resolve_path(pc->base_dir, v, dst, sizeof(cfg->s3_https_cert)))
				return fail(pc, "%s '%s' is empty or too long", key, v);
			if (access(dst, R_OK))
				return fail(pc, "%s: cannot read '%.200s'", key, dst);
		} else {
			return fail(pc, "unknown key '%s' in section [%s]", key, section);
		}
		return 1;
	}
	if (!strncmp(section, "s3.identity.", 12))
		return dm_cfg_identity_key(pc, section + 12, key, v);
	if (!strcmp(section, "mn"))
		return mn_settings_key(pc, key, v);
	if (!strncmp(section, "client.", 7))
		return client_key(pc, section + 7, key, v);
	n = node_for_section(pc, section);
	if (!n)
		return fail(pc, "unknown section [%s] (expected cluster, cn, s3, router, mn, mn.N, cn.N with N < 256 or client.NAME)%s",
			    section, "");
	return node_key(pc, n, key, v);
}

/* Read a secret file: whole contents minus a trailing newline; 16..64 bytes. */
int dm_cfg_read_secret(const char *base_dir, const char *file, uint8_t *out, size_t cap,
		       size_t *len, char *msg, size_t msglen)
{
	char path[520];
	struct stat st;
	size_t n;
	FILE *f;

	int pn;

	if (file[0] == '/' || !base_dir)
		pn = snprintf(path, sizeof(path), "%s", file);
	else
		pn = snprintf(path, sizeof(path), "%s/%s", base_dir, file);
	if (pn < 0 || (size_t)pn >= sizeof(path)) {
		snprintf(msg, msglen, "secret file path is longer than %zu bytes", sizeof(path) - 1);
		return -ENAMETOOLONG;
	}
	f = fopen(path, "rb");
	if (!f) {
		snprintf(msg, msglen, "cannot open secret file '%s': %s", path, strerror(errno));
		return -errno;
	}
	if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
		dm_warn("config: secret file '%s' is readable by group/others (chmod 600 it)", path);
	uint8_t buf[256];

	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		n--;
	if (n > cap) {
		snprintf(msg, msglen, "secret file '%s' is longer than %zu bytes", path, cap);
		return -EINVAL;
	}
	memcpy(out, buf, n);
	memset(buf, 0, sizeof(buf));
	if (n < 16) {
		snprintf(msg, msglen, "secret file '%s' holds %zu bytes; at least 16 are needed",
			 path, n);
		return -EINVAL;
	}
	*len = n;
	return 0;
}

static int finish(struct parse_ctx *pc, const char *name, char *err, size_t errlen)
{
	struct dm_cluster_cfg *cfg = pc->cfg;
	char msg[700] = "";
	size_t dummy;
	int rc;

	if (!cfg->name[0]) {
		snprintf(err, errlen, "%s: [cluster] name is missing", name);
		return -EINVAL;
	}
	if (!pc->secret_file[0]) {
		snprintf(err, errlen, "%s: [cluster] secret_file is missing", name);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < cfg->n_clients; i++) {
		struct dm_client_cfg *c = &cfg->clients[i];

		if (!c->secret_file[0]) {
			snprintf(err, errlen, "%s: [client.%s] has no secret_file", name, c->name);
			return -EINVAL;
		}
		if (pc->only_client && strcmp(c->name, pc->only_client))
			continue;
		rc = dm_cfg_read_secret(pc->base_dir, c->secret_file, c->secret, sizeof(c->secret),
				 &c->secret_len, msg, sizeof(msg));
		if (rc) {
			snprintf(err, errlen, "%s: [client.%s]: %s", name, c->name, msg);
			return rc;
		}
	}
	if (pc->only_client)
		goto nodes;   /* a client holds neither the cluster secret nor the [s3] key */
	rc = dm_cfg_read_secret(pc->base_dir, pc->secret_file, cfg->secret, sizeof(cfg->secret),
			 &cfg->secret_len, msg, sizeof(msg));
	if (rc) {
		snprintf(err, errlen, "%s: %s", name, msg);
		return rc;
	}
	if (pc->s3_secret_file[0]) {
		rc = dm_cfg_read_secret(pc->base_dir, pc->s3_secret_file, (uint8_t *)cfg->s3_secret_key,
				 sizeof(cfg->s3_secret_key) - 1, &dummy, msg, sizeof(msg));
		if (rc) {
			snprintf(err, errlen, "%s: %s", name, msg);
			return rc;
		}
		cfg->s3_secret_key[dummy] = '\0';
	}
	rc = dm_cfg_identities_finish(pc, name, err, errlen);
	if (rc)
		return rc;
nodes:
	for (int r = 0; r < 2; r++) {
		struct dm_node_cfg *arr = r ? cfg->cn : cfg->mn;
		uint32_t cnt = r ? cfg->n_cn : cfg->n_mn;

		for (uint32_t i = 0; i < cnt; i++) {
			if (!arr[i].defined) {
				snprintf(err, errlen, "%s: [%s.%u] is missing (node ids must be 0..%u without gaps)",
					 name, r ? "cn" : "mn", i, cnt - 1);
				return -EINVAL;
			}
			if (!r && !arr[i].data_dir[0])
				snprintf(arr[i].data_dir, sizeof(arr[i].data_dir), "mn%u", i);
			if (r) {
				/* [cn] settings, with what this node's section set itself. */
				struct dm_cn_cfg own = arr[i].cnc;

				arr[i].cnc = cfg->cn_all;
				if (arr[i].cnc_set & DM_CN_SET_CACHE) {
					arr[i].cnc.cache_is_ratio = own.cache_is_ratio;
					arr[i].cnc.cache_ratio = own.cache_ratio;
					arr[i].cnc.cache_bytes = own.cache_bytes;
				}
				if (arr[i].cnc_set & DM_CN_SET_ADMIT)
					arr[i].cnc.cache_admit = own.cache_admit;
			}
			if (!arr[i].address[0]) {
				snprintf(err, errlen, "%s: [%s.%u] has no address", name,
					 r ? "cn" : "mn", i);
				return -EINVAL;
			}
		}
	}
	if (cfg->redundancy > cfg->n_mn && cfg->n_mn > 0) {
		snprintf(err, errlen, "%s: redundancy %u exceeds the %u memory nodes", name,
			 cfg->redundancy, cfg->n_mn);
		return -EINVAL;
	}
	return 0;
}

static int parse_text(const char *text, const char *name, const char *base_dir,
		      const char *only_client, struct dm_cluster_cfg *cfg, char *err,
		      size_t errlen)
{
	struct parse_ctx *pcp = calloc(1, sizeof(*pcp));
	int rc;

	if (!pcp) {
		snprintf(err, errlen, "%s: out of memory", name);
		return -ENOMEM;
	}
	pcp->cfg = cfg;
	pcp->base_dir = base_dir;
	pcp->only_client = only_client;
	int line;

	memset(cfg, 0, sizeof(*cfg));
	cfg->redundancy = 1;
	cfg->etcd_lease_s = 5;
	cfg->replace_after_s = 30;
	cfg->repair_mb_s = 100;
	cfg->router = (struct dm_router_cfg){ .strategy = DM_ROUTE_NONE, .batch = 1000,
		.pause_queue = 1000, .exchange_ms = 200, .sample_min_nodes = 1000,
		.fit_duty = 10, .recluster_secs = 60, .recluster_csp = 0.5,
		.recluster_mass = 0.5, .csp_slice = 64 };
	dm_s3_cfg_defaults(&cfg->s3);
	mn_settings_default(&cfg->mn_set);
	cfg->cn_all = (struct dm_cn_cfg){ .cache_admit = 0.1, .refresh_ms = 1000,
		.lease_ms = 20000, .send_queue = 256, .drain_ms = 5000,
		.ef_upper = HNSW_EF_UPPER_DEFAULT,
		.call_threads = 8 };
	snprintf(cfg->path, sizeof(cfg->path), "%s", name);
	snprintf(cfg->dir, sizeof(cfg->dir), "%s", base_dir ? base_dir : ".");
	line = ini_parse_string(text, handler, pcp);
	if (line != 0) {
		if (line < 0)
			snprintf(err, errlen, "%s: cannot parse (%d)", name, line);
		else if (pcp->msg[0])
			snprintf(err, errlen, "%s:%d: %s", name, line, pcp->msg);
		else
			snprintf(err, errlen, "%s:%d: syntax error (expected [section] or key = value)",
				 name, line);
		rc = -EINVAL;
	} else {
		rc = finish(pcp, name, err, errlen);
	}
	memset(pcp, 0, sizeof(*pcp));               /* the identities' secrets */
	free(pcp);
	return rc;
}

int dm_config_parse(const char *text, const char *name, const char *base_dir,
		    struct dm_cluster_cfg *cfg, char *err, size_t errlen)
{
	return parse_text(text, name, base_dir, NULL, cfg, err, errlen);
}

static int load(const char *path, const char *only_client, struct dm_cluster_cfg *cfg,
		char *err, size_t errlen)
{
	char dir[512], *slash;
	char *text;
	long sz;
	FILE *f;
	int rc;

	f = fopen(path, "rb");
	if (!f) {
		rc = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
		return rc;
	}
	if (fseek(f, 0, SEEK_END) || (sz = ftell(f)) < 0 || sz > (1 << 20) || fseek(f, 0, SEEK_SET)) {
		fclose(f);
		snprintf(err, errlen, "%s: not a regular file of at most 1 MiB", path);
		return -EINVAL;
	}
	text = malloc((size_t)sz + 1);
	if (!text) {
		fclose(f);
		snprintf(err, errlen, "%s: out of memory", path);
		return -ENOMEM;
	}
	if (fread(text, 1, (size_t)sz, f) != (size_t)sz) {
		free(text);
		fclose(f);
		snprintf(err, errlen, "%s: read error", path);
		return -EIO;
	}
	fclose(f);
	text[sz] = '\0';
	if (strlen(text) != (size_t)sz) {
		free(text);
		snprintf(err, errlen, "%s: contains a NUL byte", path);
		return -EINVAL;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	rc = parse_text(text, path, dir, only_client, cfg, err, errlen);
	free(text);
	return rc;
}

int dm_config_load(const char *path, struct dm_cluster_cfg *cfg, char *err, size_t errlen)
{
	return load(path, NULL, cfg, err, errlen);
}

int dm_config_load_client(const char *path, const char *client, struct dm_cluster_cfg *cfg,
			  char *err, size_t errlen)
{
	const char *env_name = getenv("DMANN_CLIENT_NAME");
	const char *env_file = getenv("DMANN_CLIENT_SECRET_FILE");
	const struct dm_client_cfg *c;
	int rc;

	if (!client || !*client)
		client = env_name && *env_name ? env_name : NULL;
	if (!client) {
		snprintf(err, errlen, "%s: no client identity given (nor DMANN_CLIENT_NAME)", path);
		return -EINVAL;
	}
	rc = load(path, env_file && *env_file ? "" : client, cfg, err, errlen);
	if (rc)
		return rc;
	c = dm_config_client(cfg, client);
	if (env_file && *env_file) {
		char msg[700];
		struct dm_client_cfg *w;

		if (!c && cfg->n_clients == DM_MAX_CLIENTS) {
			snprintf(err, errlen, "%s: too many clients", path);
			return -EINVAL;
		}
		w = c ? (struct dm_client_cfg *)c : &cfg->clients[cfg->n_clients++];
		if (!dm_wire_client_name_ok(client)) {
			snprintf(err, errlen, "client name '%s' is not valid", client);
			return -EINVAL;
		}
		snprintf(w->name, sizeof(w->name), "%s", client);
		snprintf(w->secret_file, sizeof(w->secret_file), "%s", env_file);
		rc = dm_cfg_read_secret(NULL, env_file, w->secret, sizeof(w->secret), &w->secret_len, msg,
				 sizeof(msg));
		if (rc) {
			snprintf(err, errlen, "DMANN_CLIENT_SECRET_FILE: %s", msg);
			return rc;
		}
		return 0;
	}
	if (!c) {
		snprintf(err, errlen, "%s: no [client.%s] section", path, client);
		return -ENOENT;
	}
	return 0;
}

int dm_config_gateway_client(const struct dm_cluster_cfg *cfg, struct dm_client_cfg *out)
{
	static const char label[] = "dmann gateway client v1";
	unsigned int len = 0;

	memset(out, 0, sizeof(*out));
	if (!cfg->secret_len)
		return -EACCES;
	snprintf(out->name, sizeof(out->name), "%s", DM_GATEWAY_CLIENT);
	if (!HMAC(EVP_sha256(), cfg->secret, (int)cfg->secret_len, (const unsigned char *)label,
		  sizeof(label) - 1, out->secret, &len) || len != 32)
		return -EIO;
	out->secret_len = len;
	return 0;
}

const struct dm_client_cfg *dm_config_client(const struct dm_cluster_cfg *cfg, const char *name)
{
	for (uint32_t i = 0; i < cfg->n_clients; i++)
		if (!strcmp(cfg->clients[i].name, name))
			return &cfg->clients[i];
	return NULL;
}

const struct dm_node_cfg *dm_config_node(const struct dm_cluster_cfg *cfg, enum dm_role role,
					 uint32_t id)
{
	if (role == DM_ROLE_MN)
		return id < cfg->n_mn ? &cfg->mn[id] : NULL;
	return id < cfg->n_cn ? &cfg->cn[id] : NULL;
}
