/* test_config.c: the cluster INI file: a valid file loads; each kind of mistake is refused
 * with a message that names the file and line. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

static char dir[64];

static void setup(void)
{
	FILE *f;

	snprintf(dir, sizeof(dir), "/tmp/dmann-cfg-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	char p[128];

	snprintf(p, sizeof(p), "%s/secret", dir);
	f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs("0123456789abcdef0123456789abcdef\n", f);
	fclose(f);
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(config, .init = setup, .fini = teardown);

static const char good[] =
	"[cluster]\nname = demo\nsecret_file = secret\ntransport = tcp\nredundancy = 2\n"
	"[mn.0]\naddress = 127.0.0.1:7000\nregion_mb = 64\nhugepages = off\n"
	"[mn.1]\naddress = 127.0.0.1:7001\ncapacity = 2.5\nzone = b\n"
	"[cn.0]\naddress = 127.0.0.1:7100\nhttp = 127.0.0.1:8100\n";

Test(config, valid)
{
	struct dm_cluster_cfg *c = calloc(1, sizeof(*c));
	char err[256] = "";

	cr_assert_eq(dm_config_parse(good, "c.ini", dir, c, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(c->name, "demo");
	cr_assert_str_eq(c->transport, "tcp");
	cr_assert_eq(c->redundancy, 2);
	cr_assert_eq(c->n_mn, 2);
	cr_assert_eq(c->n_cn, 1);
	cr_assert_eq(c->secret_len, 32);
	cr_assert_eq(c->mn[0].region_bytes, 64ull << 20);
	cr_assert_eq(c->mn[0].hugepages, DM_HUGE_OFF);
	cr_assert_float_eq(c->mn[1].capacity, 2.5, 1e-9);
	cr_assert_str_eq(c->mn[1].zone, "b");
	cr_assert_str_eq(c->cn[0].http, "127.0.0.1:8100");
	cr_assert_eq(dm_config_node(c, DM_ROLE_MN, 1), &c->mn[1]);
	cr_assert_null(dm_config_node(c, DM_ROLE_CN, 1));
	free(c);
}

static void expect_error(const char *text, const char *needle)
{
	struct dm_cluster_cfg *c = calloc(1, sizeof(*c));
	char err[512] = "";

	cr_assert_lt(dm_config_parse(text, "c.ini", dir, c, err, sizeof(err)), 0,
		     "accepted: %s", text);
	cr_assert_not_null(strstr(err, needle), "message '%s' lacks '%s'", err, needle);
	cr_assert_not_null(strstr(err, "c.ini"), "message '%s' lacks the file name", err);
	free(c);
}

#define HDR "[cluster]\nname = x\nsecret_file = secret\n"

Test(config, errors)
{
	expect_error(HDR "bogus = 1\n", "c.ini:4: unknown key 'bogus'");
	expect_error(HDR "[mn.0]\naddress = nope\n", "c.ini:5: address 'nope'");
	expect_error(HDR "[mn.0]\naddress = h:70000\n", "c.ini:5");
	expect_error(HDR "[mn.0]\naddress = h:1\nregion_mb = -3\n", "c.ini:6: region_mb");
	expect_error(HDR "[mn.0]\naddress = h:1\ncapacity = nan\n", "capacity");
	expect_error(HDR "[mn.0]\naddress = h:1\nhttp = h:2\n", "unknown key 'http'");
	expect_error(HDR "[xx]\na = b\n", "unknown section [xx]");
	expect_error(HDR "[mn.1]\naddress = h:1\n", "[mn.0] is missing");
	expect_error(HDR "[cn.0]\nzone = a\n", "[cn.0] has no address");
	expect_error(HDR "transport = carrier-pigeon\n", "transport");
	expect_error(HDR "redundancy = 3\n[mn.0]\naddress = h:1\n", "redundancy 3 exceeds");
	expect_error("[cluster]\nname = x\n", "secret_file is missing");
	expect_error("[cluster]\nsecret_file = secret\n", "name is missing");
	expect_error("[cluster]\nname = x\nsecret_file = nothere\n", "cannot open secret file");
	expect_error("[cluster\nname = x\n", "c.ini:1");
}

/* [mn] settings of the memory nodes' flat stores: defaults, values, range errors. */
Test(config, mn_flat_settings)
{
	struct dm_cluster_cfg *c = calloc(1, sizeof(*c));
	char err[256] = "";

	cr_assert_eq(dm_config_parse(good, "c.ini", dir, c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c->mn_set.flat_frag_rows, 4096);
	cr_assert(c->mn_set.wal_group_commit);
	cr_assert_eq(c->mn_set.flat_max_mb, DM_FLAT_MAX_AUTO);
	cr_assert_eq(dm_config_parse(HDR "[mn]\nflat_frag_rows = 64\nwal_group_commit = no\n"
				     "flat_max_mb = 512\n"
				     "[mn.0]\naddress = h:1\n", "c.ini", dir, c, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(c->mn_set.flat_frag_rows, 64);
	cr_assert(!c->mn_set.wal_group_commit);
	cr_assert_eq(c->mn_set.flat_max_mb, 512);
	cr_assert_eq(dm_config_parse(HDR "[mn]\nflat_max_mb = 0\n[mn.0]\naddress = h:1\n",
				     "c.ini", dir, c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c->mn_set.flat_max_mb, 0);
	free(c);
	expect_error(HDR "[mn]\nflat_max_mb = lots\n", "c.ini:5: flat_max_mb 'lots' must be");
	expect_error(HDR "[mn]\nflat_max_mb = 1073741825\n", "c.ini:5: flat_max_mb");
	expect_error(HDR "[mn]\nflat_frag_rows = 15\n", "c.ini:5: flat_frag_rows '15' must be");
	expect_error(HDR "[mn]\nflat_frag_rows = 1048577\n", "c.ini:5: flat_frag_rows");
	expect_error(HDR "[mn]\nflat_frag_rows = 4k\n", "c.ini:5: flat_frag_rows");
	expect_error(HDR "[mn]\nwal_group_commit = maybe\n", "c.ini:5: wal_group_commit 'maybe'");
	expect_error(HDR "[mn]\nregion_mb = 4\n", "c.ini:5: unknown key 'region_mb' in section [mn]");
}

Test(config, short_secret)
{
	char p[128];
	FILE *f;

	snprintf(p, sizeof(p), "%s/short", dir);
	f = fopen(p, "w");
	fputs("tooshort\n", f);
	fclose(f);
	expect_error("[cluster]\nname = x\nsecret_file = short\n", "at least 16");
}

Test(config, load_file)
{
	struct dm_cluster_cfg *c = calloc(1, sizeof(*c));
	char p[128], err[256] = "";
	FILE *f;

	snprintf(p, sizeof(p), "%s/cluster.ini", dir);
	f = fopen(p, "w");
	fputs(good, f);
	fclose(f);
	cr_assert_eq(dm_config_load(p, c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c->n_mn, 2);
	cr_assert_lt(dm_config_load("/nonexistent/x.ini", c, err, sizeof(err)), 0);
	cr_assert_not_null(strstr(err, "/nonexistent/x.ini: cannot open"));
	free(c);
}

static void s3_eq(const struct dm_s3_cfg *got, const struct dm_s3_cfg *want)
{
	cr_assert_eq(got->width, want->width);
	cr_assert_eq(got->groups, want->groups);
	cr_assert_eq(got->max_scan_bytes, want->max_scan_bytes);
	cr_assert_eq(got->hedge_ms, want->hedge_ms);
	cr_assert_eq(got->cache_bytes, want->cache_bytes);
	cr_assert_eq(got->frag_fetch_bytes, want->frag_fetch_bytes);
	cr_assert_eq(got->queue_depth, want->queue_depth);
	cr_assert_eq(got->search_threads, want->search_threads);
	cr_assert_eq(got->http_threads, want->http_threads);
}

/* [s3]: the gateway tunables, their defaults, every bad value an error naming file:line. */
Test(config, s3_section)
{
	struct dm_cluster_cfg *c = calloc(1, sizeof(*c));
	char err[256] = "", text[1024];

	cr_assert_eq(dm_config_parse(good, "c.ini", dir, c, err, sizeof(err)), 0, "%s", err);
	s3_eq(&c->s3, &(struct dm_s3_cfg){ .max_scan_bytes = 256ull << 20, .hedge_ms = 50,
		.cache_bytes = 2048ull << 20, .frag_fetch_bytes = 16u << 20, .queue_depth = 64,
		.http_threads = 8 });

	snprintf(text, sizeof(text), "%s[s3]\naccess_key = AK\nwidth = 2\ngroups = 3\n"
		 "max_scan_mb = 64\nhedge_ms = 20\ncache_mb = 100\nfrag_fetch_kb = 64\n"
		 "queue_depth = 5\nsearch_threads = 4\nhttp_threads = 2\n", good);
	cr_assert_eq(dm_config_parse(text, "c.ini", dir, c, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(c->s3_access_key, "AK");
	s3_eq(&c->s3, &(struct dm_s3_cfg){ .width = 2, .groups = 3, .max_scan_bytes = 64ull << 20,
		.hedge_ms = 20, .cache_bytes = 100ull << 20, .frag_fetch_bytes = 64u << 10,
		.queue_depth = 5, .search_threads = 4, .http_threads = 2 });

	static const struct {
		const char *line, *msg;
	} bad[] = {
		{ "width = 257", "[s3] width '257' must be an integer in 0..256" },
		{ "groups = -1", "[s3] groups '-1' must be an integer in 0..256" },
		{ "max_scan_mb = 0", "[s3] max_scan_mb '0' must be an integer in 1..1048576 MiB" },
		{ "hedge_ms = 60001", "[s3] hedge_ms '60001' must be an integer in 1..60000 ms" },
		{ "cache_mb = lots", "[s3] cache_mb 'lots' must be an integer in 1..16777216 MiB" },
		{ "frag_fetch_kb = 63", "[s3] frag_fetch_kb '63' must be an integer in 64..32768 KiB" },
		{ "queue_depth = 0", "[s3] queue_depth '0' must be an integer in 1..1048576" },
		{ "search_threads = 1000", "[s3] search_threads '1000' must be an integer in 0..256" },
		{ "http_threads = 2x", "[s3] http_threads '2x' must be an integer in 1..256" },
		{ "hedge = 5", "unknown key 'hedge' in section [s3]" },
	};
	/* good has 16 lines; [s3] is line 17, the bad key line 19. */
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char want[256];

		snprintf(text, sizeof(text), "%s[s3]\naccess_key = AK\n%s\n", good, bad[i].line);
		cr_assert_eq(dm_config_parse(text, "c.ini", dir, c, err, sizeof(err)), -EINVAL,
			     "%s accepted", bad[i].line);
		snprintf(want, sizeof(want), "c.ini:19: %s", bad[i].msg);
		cr_assert_str_eq(err, want);
	}
	/* The same validation for one key at a time (the environment overrides use it). */
	struct dm_s3_cfg s3;
	char msg[160];

	dm_s3_cfg_defaults(&s3);
	cr_assert_eq(dm_s3_cfg_key(&s3, "hedge_ms", "7", msg, sizeof(msg)), 0);
	cr_assert_eq(s3.hedge_ms, 7);
	cr_assert_eq(dm_s3_cfg_key(&s3, "hedge_ms", "0", msg, sizeof(msg)), -ERANGE);
	cr_assert_eq(s3.hedge_ms, 7);
	cr_assert_eq(dm_s3_cfg_key(&s3, "access_key", "x", msg, sizeof(msg)), -ENOENT);
	free(c);
}
/* [cn]: cache sizes (units, ratios, off), admission, the generation poll and lease, the
 * send queue; [cn.N] overrides the per-node keys, before or after [cn]. */
Test(config, compute_node_settings)
{
	struct dm_cluster_cfg *c = calloc(1, sizeof(*c));
	char err[512] = "";

	cr_assert_eq(dm_config_parse(HDR "[mn.0]\naddress = h:1\n[cn.0]\naddress = h:2\n", "c.ini",
				     dir, c, err, sizeof(err)), 0, "%s", err);
	/* Defaults: no cache, admission 0.1, 1 s poll, 20 s lease, 256 work requests. */
	cr_assert(!c->cn[0].cnc.cache_is_ratio);
	cr_assert_eq(c->cn[0].cnc.cache_bytes, 0);
	cr_assert_float_eq(c->cn[0].cnc.cache_admit, 0.1, 1e-12);
	cr_assert_eq(c->cn[0].cnc.refresh_ms, 1000);
	cr_assert_eq(c->cn[0].cnc.lease_ms, 20000);
	cr_assert_eq(c->cn[0].cnc.send_queue, 256);
	cr_assert_eq(c->cn[0].cnc.drain_ms, 5000);
	cr_assert_eq(c->cn[0].cnc.ef_upper, 64);
	cr_assert_eq(dm_config_cache_bytes(&c->cn[0].cnc, 1000000), 0);

	cr_assert_eq(dm_config_parse(HDR "[mn.0]\naddress = h:1\n"
				     "[cn.1]\naddress = h:3\ncache = 512MiB\ncache_admit = 1\n"
				     "[cn]\ncache = 10%\ncache_admit = 0.25\nrefresh_ms = 50\n"
				     "lease_ms = 1000\nsend_queue = 128\ndrain_ms = 0\nef_upper = 1\n"
				     "[cn.0]\naddress = h:2\n[cn.2]\naddress = h:4\ncache = 0\n",
				     "c.ini", dir, c, err, sizeof(err)), 0, "%s", err);
	cr_assert(c->cn[0].cnc.cache_is_ratio);
	cr_assert_float_eq(c->cn[0].cnc.cache_ratio, 0.10, 1e-12);
	cr_assert_eq(dm_config_cache_bytes(&c->cn[0].cnc, 1000000), 100000);
	cr_assert_float_eq(c->cn[0].cnc.cache_admit, 0.25, 1e-12);
	cr_assert_eq(c->cn[0].cnc.refresh_ms, 50);
	cr_assert_eq(c->cn[0].cnc.lease_ms, 1000);
	cr_assert_eq(c->cn[0].cnc.send_queue, 128);
	cr_assert_eq(c->cn[0].cnc.drain_ms, 0);
	cr_assert_eq(c->cn[0].cnc.ef_upper, 1);
	cr_assert_eq(c->cn[2].cnc.ef_upper, 1);
	/* cn.1 set its own cache and admission before [cn]; the rest comes from [cn]. */
	cr_assert(!c->cn[1].cnc.cache_is_ratio);
	cr_assert_eq(dm_config_cache_bytes(&c->cn[1].cnc, 1000000), 512ull << 20);
	cr_assert_float_eq(c->cn[1].cnc.cache_admit, 1.0, 1e-12);
	cr_assert_eq(c->cn[1].cnc.lease_ms, 1000);
	cr_assert_eq(dm_config_cache_bytes(&c->cn[2].cnc, 1000000), 0);
	cr_assert_float_eq(c->cn[2].cnc.cache_admit, 0.25, 1e-12);
	free(c);
}

Test(config, cache_units)
{
	static const struct { const char *v; bool ratio; double r; uint64_t b; } ok[] = {
		{ "0", false, 0, 0 },          { "100%", true, 1, 0 },      { "0.5%", true, 0.005, 0 },
		{ "0%", true, 0, 0 },          { "1B", false, 0, 1 },       { "4KiB", false, 0, 4096 },
		{ "1.5MiB", false, 0, 1572864 }, { "2 GiB", false, 0, 2ull << 30 },
		{ "1TiB", false, 0, 1ull << 40 }, { "3KB", false, 0, 3000 }, { "7MB", false, 0, 7000000 },
		{ "1GB", false, 0, 1000000000 }, { "1TB", false, 0, 1000000000000ull },
	};
	static const char *const bad[] = {
		"", "-1%", "101%", "10", "0.5", "1.5B", "5PiB", "2000TiB", "10 %x", "MiB", "1 mib",
		"nan%", "inf%", "1e400KiB", " 1KiB", "+1KiB",
	};

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		bool ratio = !ok[i].ratio;
		double r = -1;
		uint64_t b = 99;

		cr_assert_eq(dm_config_parse_cache(ok[i].v, &ratio, &r, &b), 0, "%s refused", ok[i].v);
		cr_assert_eq(ratio, ok[i].ratio, "%s", ok[i].v);
		cr_assert_float_eq(r, ok[i].r, 1e-12, "%s", ok[i].v);
		cr_assert_eq(b, ok[i].b, "%s: %llu", ok[i].v, (unsigned long long)b);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		bool ratio;
		double r;
		uint64_t b;

		cr_assert_eq(dm_config_parse_cache(bad[i], &ratio, &r, &b), -EINVAL, "'%s' accepted",
			     bad[i]);
	}
}

Test(config, compute_node_errors)
{
	expect_error(HDR "[cn]\ncache = 10\n", "c.ini:5: cache '10' must be");
	expect_error(HDR "[cn]\ncache = 150%\n", "c.ini:5: cache '150%'");
	expect_error(HDR "[cn]\ncache_admit = 1.5\n", "c.ini:5: cache_admit '1.5' must be");
	expect_error(HDR "[cn]\ncache_admit = x\n", "c.ini:5: cache_admit");
	expect_error(HDR "[cn]\nrefresh_ms = 10\n", "c.ini:5: refresh_ms '10' must be 50..60000");
	expect_error(HDR "[cn]\nlease_ms = 999\n", "c.ini:5: lease_ms");
	expect_error(HDR "[cn]\nsend_queue = 100\n", "c.ini:5: send_queue '100' must be 128..65536");
	expect_error(HDR "[cn]\ndrain_ms = 600001\n", "c.ini:5: drain_ms '600001' must be 0..600000");
	expect_error(HDR "[cn]\nef_upper = 0\n", "c.ini:5: ef_upper '0' must be 1..256");
	expect_error(HDR "[cn]\nef_upper = 257\n", "c.ini:5: ef_upper '257' must be 1..256");
	expect_error(HDR "[cn.0]\naddress = h:2\nef_upper = 8\n",
		     "c.ini:6: ef_upper applies to every compute node: set it in [cn]");
	expect_error(HDR "[cn.0]\naddress = h:2\ndrain_ms = 1\n",
		     "c.ini:6: drain_ms applies to every compute node: set it in [cn]");
	expect_error(HDR "[cn]\naddress = h:1\n", "c.ini:5: unknown key 'address' in section [cn]");
	expect_error(HDR "[cn.0]\naddress = h:1\nlease_ms = 5000\n",
		     "c.ini:6: lease_ms applies to every compute node: set it in [cn]");
	expect_error(HDR "[cn.0]\naddress = h:1\ncache = lots\n", "c.ini:6: cache 'lots'");
	expect_error(HDR "[mn.0]\naddress = h:1\ncache = 1MiB\n", "c.ini:6: unknown key 'cache'");
}

static void write_in_dir(const char *name, const char *text)
{
	char p[128];
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

/* S3 identities: the [s3] key is identity "default", then [s3.identity.NAME] in file order,
 * each with its secret file and principal; policy_default and HTTPS files. */
Test(config, s3_identities)
{
	struct dm_cluster_cfg *c = calloc(1, sizeof(*c));
	char err[512] = "", text[2048];

	write_in_dir("s3.secret", "default-secret-0123456789\n");
	write_in_dir("a.secret", "alice-secret-0123456789\n");
	write_in_dir("b.secret", "bob-secret-0123456789");
	write_in_dir("c.pem", "-----BEGIN CERTIFICATE-----\n");
	snprintf(text, sizeof(text), "%s[s3]\naccess_key = AKDEF\nsecret_key_file = s3.secret\n"
		 "policy_default = deny\nhttps_cert = c.pem\nhttps_key = c.pem\n"
		 "[s3.identity.alice]\naccess_key = AKALICE\nsecret_key_file = a.secret\n"
		 "[s3.identity.bob]\nsecret_key_file = b.secret\naccess_key = AKBOB\n"
		 "principal = arn:aws:iam::123456789012:user/robert\n"
		 "[cn.1]\naddress = 127.0.0.1:7101\nhttps = 127.0.0.1:8443\n", good);
	cr_assert_eq(dm_config_parse(text, "c.ini", dir, c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c->n_s3_ids, 3);
	cr_assert_str_eq(c->s3_ids[0].name, "default");
	cr_assert_str_eq(c->s3_ids[0].access_key, "AKDEF");
	cr_assert_str_eq(c->s3_ids[0].secret, "default-secret-0123456789");
	cr_assert_str_eq(c->s3_ids[0].principal, "arn:aws:iam::000000000000:user/default");
	cr_assert_str_eq(c->s3_ids[1].access_key, "AKALICE");
	cr_assert_str_eq(c->s3_ids[1].secret, "alice-secret-0123456789");
	cr_assert_str_eq(c->s3_ids[1].principal, "arn:aws:iam::000000000000:user/alice");
	cr_assert_str_eq(c->s3_ids[2].secret, "bob-secret-0123456789");
	cr_assert_str_eq(c->s3_ids[2].principal, "arn:aws:iam::123456789012:user/robert");
	cr_assert(c->s3_policy_deny);
	cr_assert_not_null(strstr(c->s3_https_cert, "/c.pem"));
	cr_assert_str_eq(c->cn[1].https, "127.0.0.1:8443");
	/* Identities alone (no [s3] key); defaults: policy allow, no HTTPS. */
	snprintf(text, sizeof(text), "%s[s3.identity.x.y@z]\naccess_key = AK1\n"
		 "secret_key_file = a.secret\n", good);
	cr_assert_eq(dm_config_parse(text, "c.ini", dir, c, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(c->n_s3_ids, 1);
	cr_assert_str_eq(c->s3_ids[0].principal, "arn:aws:iam::000000000000:user/x.y@z");
	cr_assert(!c->s3_policy_deny);
	cr_assert_str_eq(c->s3_https_cert, "");
	free(c);

#define ID "[s3.identity.alice]\n"
	expect_error(HDR ID "access_key = AK1\nsecret_key_file = nothere\n",
		     "c.ini:6: cannot open secret file");
	expect_error(HDR ID "access_key = AK1\naccess_key = AK2\n", "c.ini:6: access_key given twice");
	expect_error(HDR ID "access_key = A-K\n", "c.ini:5: access_key 'A-K' must be");
	expect_error(HDR ID "access_key = AK1\n[s3.identity.bob]\naccess_key = AK1\n",
		     "c.ini:7: access_key 'AK1' is already identity 'alice'");
	expect_error(HDR "[s3]\naccess_key = AK1\n" ID "access_key = AK1\n",
		     "c.ini:7: access_key 'AK1' is already the [s3] access_key");
	expect_error(HDR ID "access_key = AK1\n", "[s3.identity.alice] needs access_key and "
		     "secret_key_file");
	expect_error(HDR "[s3.identity.a b]\naccess_key = AK1\n", "c.ini:5: identity name 'a b'");
	expect_error(HDR ID "principal = bob\n", "c.ini:5: principal 'bob' must be");
	expect_error(HDR ID "colour = red\n", "c.ini:5: unknown key 'colour' in section "
		     "[s3.identity.alice]");
	expect_error(HDR "[s3]\npolicy_default = maybe\n", "c.ini:5: policy_default 'maybe'");
	expect_error(HDR "[s3]\nhttps_cert = none.pem\n", "c.ini:5: https_cert: cannot read");
	expect_error(HDR "[s3]\nhttps_cert = c.pem\n", "https_cert and https_key go together");
	expect_error(HDR "[mn.0]\naddress = h:1\n[cn.0]\naddress = h:2\nhttps = h:3\n",
		     "[cn.0] https needs [s3] https_cert");
#undef ID
}
