/* test_cstate.c: the cluster state's up-set and its controller (common/etcd/cstate.c) on a
 * local cluster of 3 memory and 2 compute nodes with its etcd, driven by the failure drills
 * of the CLI (`dmann local kill|start|stop`):
 *   - a SIGKILLed memory node is declared down once its lease expires, and both compute
 *     nodes stop reading from it (marked down by the cluster state); restarted, it is
 *     declared up again and both use it again;
 *   - the controller SIGKILLed: the other compute node takes office when the leader key's
 *     lease expires, and declares the dead one down only after its takeover grace;
 *   - etcd frozen for twice the lease time (every lease expires at once when it resumes):
 *     no node is declared down, because the controller waits the grace period after an
 *     outage and the nodes register again meanwhile;
 *   - the up-set parser refuses malformed values. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_util.h"
#include "config.h"
#include "cstate.h"

#define TTL 3     /* member_lease_s of the test cluster */
#define GRACE 6   /* takeover_grace_s (the default would be TTL + 3 as well) */

static char dir[128], lcdir[160], dmann[300], cfgpath[256];
static struct dm_cluster_cfg cfg;

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");
	char err[512];

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-cstate-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(lcdir, sizeof(lcdir), "%s/lc", dir);
	cr_assert_eq(sh("%s local up --mn 3 --cn 2 --redundancy 2 --dir %s --region-mb 16 "
			"--member-lease %d", dmann, lcdir, TTL), 0,
		     "local up (with its etcd) failed: is etcd-server installed?");
	snprintf(cfgpath, sizeof(cfgpath), "%s/cluster.ini", lcdir);
	/* The grace as a cluster-file setting (read by the nodes at start: restart them). */
	cr_assert_eq(sh("sed -i 's/^member_lease_s = .*/&\\ntakeover_grace_s = %d/' %s", GRACE,
			cfgpath), 0);
	cr_assert_eq(dm_config_load(cfgpath, &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(cfg.etcd_grace_s, GRACE);
	cr_assert_eq(sh("%s local stop --dir %s cn0 && %s local start --dir %s cn0 && "
			"%s local stop --dir %s cn1 && %s local start --dir %s cn1", dmann, lcdir,
			dmann, lcdir, dmann, lcdir, dmann, lcdir), 0);
	sleep(GRACE + 1);   /* the controller that took office declares nothing down before */
}

static void teardown(void)
{
	sh("%s local down --dir %s >/dev/null 2>&1", dmann, lcdir);
	sh("rm -rf %s", dir);
}

TestSuite(cstate, .init = setup, .fini = teardown, .timeout = 240);


/* The up-set now (false when there is none or etcd does not answer). */
static bool upset(struct dm_upset *u, char *ctl, size_t cap)
{
	char err[512];

	return dm_upset_read(cfg.etcd, cfg.name, 2000, u, ctl, cap, err, sizeof(err)) == 0;
}

/* Wait up to ms until node role/id has state up == want in the up-set (and, when ctl_want
 * is set, the controller is ctl_want): the ms it took, or -1. */
static long wait_state(bool mn, uint32_t id, bool want, const char *ctl_want, long ms)
{
	for (long t = 0; t <= ms; t += 100) {
		struct dm_upset u;
		char ctl[32];

		if (upset(&u, ctl, sizeof(ctl)) && dm_upset_has(mn ? u.mn : u.cn, id) == want &&
		    (!ctl_want || !strcmp(ctl, ctl_want)))
			return t;
		usleep(100000);
	}
	return -1;
}

/* Wait up to ms until compute node cn's metric name equals v. */
static bool wait_metric(unsigned cn, const char *name, long long v, long ms)
{
	for (long t = 0; t <= ms; t += 100) {
		if (cluster_metric(lcdir, cn, name) == v)
			return true;
		usleep(100000);
	}
	return false;
}

static void all_up(void)
{
	for (uint32_t i = 0; i < 3; i++)
		cr_assert_geq(wait_state(true, i, true, NULL, 20000), 0, "mn%u never up", i);
	for (uint32_t i = 0; i < 2; i++)
		cr_assert_geq(wait_state(false, i, true, NULL, 20000), 0, "cn%u never up", i);
}

Test(cstate, a_killed_memory_node_is_declared_down_and_up_again)
{
	struct dm_upset u0, u1;
	char ctl[32];
	long t;

	all_up();
	cr_assert(upset(&u0, ctl, sizeof(ctl)));
	cr_assert(ctl[0], "a controller is in office");
	cr_assert_eq(sh("%s local kill --dir %s mn1", dmann, lcdir), 0);
	t = wait_state(true, 1, false, NULL, (TTL + 4) * 1000);
	fprintf(stderr, "FIGURES mn1 SIGKILLed: declared down after %ld ms (lease %d s)\n", t, TTL);
	cr_assert_geq(t, 0, "a killed memory node is not declared down after its lease");
	cr_assert(upset(&u1, ctl, sizeof(ctl)));
	cr_assert_gt(u1.version, u0.version, "the up-set's version grows with a change");
	cr_assert(dm_upset_has(u1.mn, 0) && dm_upset_has(u1.mn, 2) && dm_upset_has(u1.cn, 0) &&
		  dm_upset_has(u1.cn, 1), "only mn1 is down");
	for (unsigned c = 0; c < 2; c++) {
		cr_assert(wait_metric(c, "dmann_cn_state_mn_down", 1, 5000),
			  "cn%u does not follow the up-set", c);
		cr_assert_eq(cluster_metric(lcdir, c, "dmann_cn_state_version"), u1.version);
		cr_assert_geq(cluster_metric(lcdir, c, "dmann_cn_mn_down"), 1, "cn%u still reads mn1", c);
	}
	cr_assert_eq(sh("%s status --config %s | grep -q 'declared down: mn1'", dmann, cfgpath), 0,
		     "dmann status shows the up-set");

	cr_assert_eq(sh("%s local start --dir %s mn1", dmann, lcdir), 0);
	t = wait_state(true, 1, true, NULL, 10000);
	fprintf(stderr, "FIGURES mn1 restarted: declared up after %ld ms\n", t);
	cr_assert_geq(t, 0, "a restarted memory node is not declared up");
	for (unsigned c = 0; c < 2; c++) {
		cr_assert(wait_metric(c, "dmann_cn_state_mn_down", 0, 5000));
		cr_assert(wait_metric(c, "dmann_cn_mn_down", 0, 15000),
			  "cn%u does not read mn1 again", c);
	}
}

Test(cstate, the_controller_fails_over)
{
	struct dm_upset u;
	char ctl[32], other[8], cmd[64];
	uint64_t t0;
	long t, tdown;
	unsigned dead;

	all_up();
	cr_assert(upset(&u, ctl, sizeof(ctl)));
	cr_assert(!strcmp(ctl, "cn0") || !strcmp(ctl, "cn1"), "controller '%s'", ctl);
	dead = ctl[2] - '0';
	snprintf(other, sizeof(other), "cn%u", 1 - dead);
	snprintf(cmd, sizeof(cmd), "%s", ctl);
	t0 = dm_now_ns();
	cr_assert_eq(sh("%s local kill --dir %s %s", dmann, lcdir, cmd), 0);
	/* The leader key goes with its lease; the other candidate takes office. */
	t = wait_state(false, 1 - dead, true, other, (TTL + 4) * 1000);
	cr_assert_geq(t, 0, "%s did not take office", other);
	t = (long)((dm_now_ns() - t0) / 1000000);
	/* ... and declares the killed one down, but not before its grace. */
	cr_assert_geq(wait_state(false, dead, false, NULL, (TTL + GRACE + 5) * 1000), 0,
		      "the killed controller is never declared down");
	tdown = (long)((dm_now_ns() - t0) / 1000000);
	fprintf(stderr, "FIGURES controller %s SIGKILLed: %s in office after %ld ms, %s declared "
		"down after %ld ms (lease %d s, grace %d s)\n", cmd, other, t, cmd, tdown, TTL,
		GRACE);
	cr_assert_geq(tdown, (GRACE - 1) * 1000, "declared down before the new controller's grace");
	cr_assert(upset(&u, ctl, sizeof(ctl)));
	cr_assert_str_eq(u.controller, other, "the up-set is written by the new controller");
	cr_assert(dm_upset_has(u.mn, 0) && dm_upset_has(u.mn, 1) && dm_upset_has(u.mn, 2));
	/* Restarted: a candidate again, declared up by the controller in office. */
	cr_assert_eq(sh("%s local start --dir %s %s", dmann, lcdir, cmd), 0);
	cr_assert_geq(wait_state(false, dead, true, other, 10000), 0);
}

Test(cstate, no_node_is_declared_down_after_an_etcd_outage)
{
	struct dm_upset before, u;
	char ctl[32];
	pid_t etcd;

	all_up();
	sleep(GRACE + 1);   /* past the first controller's own grace */
	cr_assert(upset(&before, ctl, sizeof(ctl)));
	etcd = cluster_etcd_pid(lcdir);
	/* Frozen for 2 x TTL: when it resumes, every lease (the nodes' and the controller's)
	 * has expired at once. */
	cr_assert_eq(kill(etcd, SIGSTOP), 0);
	sleep(2 * TTL);
	cr_assert_eq(kill(etcd, SIGCONT), 0);
	/* Watch the up-set through the grace and a little more: nobody is declared down. */
	for (int i = 0; i < (GRACE + 4) * 5; i++) {
		if (upset(&u, ctl, sizeof(ctl)))
			for (uint32_t m = 0; m < 3; m++)
				cr_assert(dm_upset_has(u.mn, m) && (m > 1 || dm_upset_has(u.cn, m)),
					  "%s%u declared down after the outage (version %lld)",
					  dm_upset_has(u.mn, m) ? "cn" : "mn", m,
					  (long long)u.version);
		usleep(200000);
	}
	cr_assert(upset(&u, ctl, sizeof(ctl)));
	fprintf(stderr, "FIGURES etcd frozen %d s: up-set version %lld before, %lld after, "
		"controller %s\n", 2 * TTL, (long long)before.version, (long long)u.version, ctl);
	/* Still a working controller: a kill now is seen. */
	cr_assert_eq(sh("%s local kill --dir %s mn2", dmann, lcdir), 0);
	cr_assert_geq(wait_state(true, 2, false, NULL, (TTL + GRACE + 4) * 1000), 0,
		      "the controller does not work after the outage");
}

Test(cstate, the_upset_parser_refuses_malformed_values)
{
	static const char *bad[] = {
		"", "[]", "{}", "null",
		"{\"version\":0,\"time\":1,\"controller\":\"cn0\",\"mn\":[],\"cn\":[]}",
		"{\"version\":1,\"time\":-1,\"controller\":\"cn0\",\"mn\":[],\"cn\":[]}",
		"{\"version\":1,\"time\":1,\"controller\":\"cn0\",\"mn\":[256],\"cn\":[]}",
		"{\"version\":1,\"time\":1,\"controller\":\"cn0\",\"mn\":[-1],\"cn\":[]}",
		"{\"version\":1,\"time\":1,\"controller\":\"cn0\",\"mn\":[1,1],\"cn\":[]}",
		"{\"version\":1,\"time\":1,\"controller\":\"cn0\",\"mn\":[\"1\"],\"cn\":[]}",
		"{\"version\":1,\"time\":1,\"controller\":\"cn0\",\"mn\":{},\"cn\":[]}",
		"{\"version\":1,\"time\":1,\"controller\":\"cn0\",\"mn\":[]}",
		"{\"version\":1,\"time\":1,\"controller\":\"a-very-long-controller\",\"mn\":[],\"cn\":[]}",
		"{\"version\":1,\"version\":2,\"time\":1,\"controller\":\"cn0\",\"mn\":[],\"cn\":[]}",
		"{\"version\":1.5,\"time\":1,\"controller\":\"cn0\",\"mn\":[],\"cn\":[]}",
	};
	struct dm_upset u = { .version = 7, .time = 9 }, v;
	char *s;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(dm_upset_parse(bad[i], strlen(bad[i]), &v), -EBADMSG, "accepted %s",
			     bad[i]);
	snprintf(u.controller, sizeof(u.controller), "cn3");
	dm_upset_set(u.mn, 0, true);
	dm_upset_set(u.mn, 200, true);
	dm_upset_set(u.cn, 63, true);
	dm_upset_set(u.cn, 64, true);
	s = dm_upset_format(&u);
	cr_assert_not_null(s);
	cr_assert_eq(dm_upset_parse(s, strlen(s), &v), 0, "%s", s);
	free(s);
	cr_assert_eq(v.version, 7);
	cr_assert_eq(v.time, 9);
	cr_assert_str_eq(v.controller, "cn3");
	cr_assert_arr_eq(v.mn, u.mn, sizeof(u.mn));
	cr_assert_arr_eq(v.cn, u.cn, sizeof(u.cn));
	/* The placement: the same checks, and a round trip. */
	{
		static const char *pbad[] = {
			"{}", "{\"version\":1,\"time\":1,\"by\":\"cn0\"}",
			"{\"version\":0,\"time\":1,\"by\":\"cn0\",\"retired\":[]}",
			"{\"version\":1,\"time\":1,\"by\":\"cn0\",\"retired\":[3,3]}",
			"{\"version\":1,\"time\":1,\"by\":\"cn0\",\"retired\":[300]}",
			"{\"version\":1,\"time\":1,\"by\":7,\"retired\":[]}",
		};
		struct dm_placement p = { .version = 3, .time = 4 }, q;

		for (size_t i = 0; i < sizeof(pbad) / sizeof(pbad[0]); i++)
			cr_assert_eq(dm_placement_parse(pbad[i], strlen(pbad[i]), &q), -EBADMSG,
				     "accepted %s", pbad[i]);
		snprintf(p.by, sizeof(p.by), "cn1");
		dm_upset_set(p.retired, 5, true);
		s = dm_placement_format(&p);
		cr_assert_not_null(s);
		cr_assert_eq(dm_placement_parse(s, strlen(s), &q), 0, "%s", s);
		free(s);
		cr_assert(q.version == 3 && q.time == 4 && !strcmp(q.by, "cn1") &&
			  dm_upset_has(q.retired, 5) && !dm_upset_has(q.retired, 4));
	}
}
