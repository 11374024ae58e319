/* test_member.c: node membership in the cluster state (etcd, common/etcd/member.c) on a
 * local cluster (`dmann local up` starts the etcd): every node registers under a lease; a
 * SIGKILLed memory node's key vanishes within the lease TTL and comes back when it is
 * restarted; a node stopped with SIGTERM revokes its lease (its key goes at once); with etcd
 * frozen for longer than the TTL (SIGSTOP) the nodes keep serving and register again with
 * new leases once it is back. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_util.h"
#include "config.h"
#include "member.h"

#define TTL 3   /* member_lease_s of the test cluster */

static char dir[128], lcdir[160], dmann[300], dmann_mn[300], cfgpath[256];
static struct dm_cluster_cfg cfg;

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");
	char err[512];

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dmann_mn, sizeof(dmann_mn), "%s/mn/dmann-mn", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-member-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	cr_assert_eq(sh("%s local up --mn 2 --cn 1 --dir %s/lc --region-mb 16 --member-lease %d",
			dmann, dir, TTL), 0,
		     "local up (with its etcd) failed: is etcd-server installed?");
	snprintf(cfgpath, sizeof(cfgpath), "%s/lc/cluster.ini", dir);
	snprintf(lcdir, sizeof(lcdir), "%s/lc", dir);
	cr_assert_eq(dm_config_load(cfgpath, &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(cfg.etcd_lease_s, TTL);
	cr_assert_neq(cfg.etcd[0], 0, "local up names its etcd in the cluster file");
}

static void teardown(void)
{
	sh("%s local down --dir %s/lc >/dev/null 2>&1", dmann, dir);
	sh("rm -rf %s", dir);
}

TestSuite(member, .init = setup, .fini = teardown, .timeout = 180);

/* Whether node role+id is registered now. */
static bool registered(const char *role, uint32_t id)
{
	struct dm_member_info *mi;
	size_t n;
	char err[256];
	bool found = false;

	if (dm_members_list(cfg.etcd, cfg.name, 2000, &mi, &n, err, sizeof(err)))
		return false;
	for (size_t i = 0; i < n; i++)
		found |= mi[i].id == id && !strcmp(mi[i].role, role);
	free(mi);
	return found;
}

/* Wait up to ms for node role+id to be (want) registered; the time it took, or -1. */
static long wait_member(const char *role, uint32_t id, bool want, long ms)
{
	for (long t = 0; t <= ms; t += 100) {
		if (registered(role, id) == want)
			return t;
		usleep(100000);
	}
	return -1;
}

Test(member, heartbeat_leases_show_who_is_up)
{
	long t;

	cr_assert_geq(wait_member("mn", 0, true, 10000), 0, "mn0 never registered");
	cr_assert_geq(wait_member("mn", 1, true, 10000), 0, "mn1 never registered");
	cr_assert_geq(wait_member("cn", 0, true, 10000), 0, "cn0 never registered");

	/* SIGKILL: the key goes when the lease runs out (TTL + one keepalive period). */
	cr_assert_eq(kill(cluster_pid_of(lcdir, "mn1"), SIGKILL), 0);
	t = wait_member("mn", 1, false, (TTL + 3) * 1000);
	fprintf(stderr, "FIGURES mn1 SIGKILLed: unregistered after %ld ms (lease %d s)\n", t, TTL);
	cr_assert_geq(t, 0, "a killed node is still registered after its lease");
	cr_assert(registered("mn", 0) && registered("cn", 0), "the others stay registered");
	cr_assert_eq(sh("%s status --config %s >%s/st.txt; grep -q 'not registered: mn1' %s/st.txt",
			dmann, cfgpath, dir, dir), 0, "dmann status names the missing node");

	/* Restarted: registered again. */
	cr_assert_eq(sh("cd %s/lc && (setsid %s --config %s --id 1 >>mn1.log 2>&1 & echo \"$! mn1\" "
			">>pids)", dir, dmann_mn, cfgpath), 0);
	cr_assert_geq(wait_member("mn", 1, true, 15000), 0, "mn1 did not register after restart");

	/* SIGTERM: the node leaves and revokes its lease: the key goes well before the TTL. */
	cr_assert_eq(kill(cluster_pid_of(lcdir, "cn0"), SIGTERM), 0);
	t = wait_member("cn", 0, false, 10000);
	fprintf(stderr, "FIGURES cn0 SIGTERMed: unregistered after %ld ms\n", t);
	cr_assert_geq(t, 0, "a stopped node is still registered");
}

Test(member, nodes_register_again_after_an_etcd_outage)
{
	pid_t etcd = 0;

	cr_assert_geq(wait_member("mn", 0, true, 10000), 0);
	cr_assert_geq(wait_member("cn", 0, true, 10000), 0);
	etcd = cluster_etcd_pid(lcdir);
	/* Frozen for 2 x TTL: every lease expires once etcd resumes. */
	cr_assert_eq(kill(etcd, SIGSTOP), 0);
	sleep(2 * TTL);
	cr_assert_neq(sh("%s status --config %s >/dev/null 2>&1", dmann, cfgpath), 0,
		      "status reports an unreachable etcd");
	/* The memory node still serves while etcd is gone. */
	cr_assert_eq(sh("%s status --config %s 2>&1 | grep -q 'mn0 .* up '", dmann, cfgpath), 0,
		     "mn0 must keep serving without etcd");
	cr_assert_eq(kill(etcd, SIGCONT), 0);
	/* Leases granted before the freeze expire; the nodes register with new ones. */
	sleep(TTL + 1);
	cr_assert_geq(wait_member("mn", 0, true, 15000), 0, "mn0 did not register again");
	cr_assert_geq(wait_member("mn", 1, true, 15000), 0, "mn1 did not register again");
	cr_assert_geq(wait_member("cn", 0, true, 15000), 0, "cn0 did not register again");
	cr_assert_eq(sh("grep -q 'registered in etcd again\\|registering again' %s/lc/mn0.log",
			dir), 0, "mn0's log says it re-registered");
}
