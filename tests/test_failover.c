/* test_failover.c: read failover (cluster suite). A local cluster of 3 memory nodes and 2
 * compute nodes (tcp, loopback) with an HNSW index:
 *   - redundancy 2: a memory node SIGKILLed in the middle of a stream of 30,000 queries
 *     (DMANN_FAILOVER_STREAM; 8,000 in the sanitizer build)
 *     through both compute nodes fails none of them and changes no answer (every one is
 *     the local search's ids); restarted, it is marked up again by both compute nodes and
 *     read from; with the cache off and at 10%;
 *   - a compute node SIGKILLed mid-stream: libdmann retries its queries on the other one,
 *     none fails, every answer is the local search's;
 *   - redundancy 1: the queries that need the dead node's blocks fail fast with a clear
 *     error (no hang), and the compute nodes serve again, with the same answers, once it is
 *     back. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster_util.h"

#define K 10
#define EF 48
/* Queries per stream: 30,000, or DMANN_FAILOVER_STREAM (the sanitizer build's suite sets a
 * shorter stream: every query there costs several times more CPU). */
static int stream_len(void)
{
	const char *e = getenv("DMANN_FAILOVER_STREAM");
	int n = e ? atoi(e) : 30000;

	cr_assert(n >= 4000 && n <= 1000000, "DMANN_FAILOVER_STREAM=%s", e);
	return n;
}
#define STREAM stream_len()

static char dir[128], dmann[300], dmann_mn[300];

/* mn memory nodes, cn compute nodes, redundancy r, more `local up` options, the index. */
static void setup_cluster(unsigned mn, unsigned cn, unsigned r, const char *extra)
{
	const char *root = getenv("DMANN_BUILD_ROOT");

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dmann_mn, sizeof(dmann_mn), "%s/mn/dmann-mn", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-failover-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	cr_assert_eq(sh("%s gen --kind sift --n 8000 --nq 200 --seed 3 --out %s/data >/dev/null",
			dmann, dir), 0);
	cr_assert_eq(sh("%s build --base %s/data/base.fbin --metric l2 --M 12 --efc 80 --threads 1 "
			"--block-shift 10 --out %s/idx.hnsw >/dev/null", dmann, dir, dir), 0);
	cr_assert_eq(sh("%s local up --mn %u --cn %u --redundancy %u --dir %s/lc --region-mb 32 %s",
			dmann, mn, cn, r, dir, extra), 0);
	cr_assert_eq(sh("%s load --config %s/lc/cluster.ini --index %s/idx.hnsw", dmann, dir, dir), 0);
}

static void setup_r(unsigned r)
{
	setup_cluster(3, 2, r, "");
}

static void setup_r2(void)
{
	setup_r(2);
}

static void setup_r1(void)
{
	setup_r(1);
}

static void teardown(void)
{
	sh("%s local down --dir %s/lc", dmann, dir);
	if (getenv("DMANN_KEEP_TEST_DIR"))
		return;
	sh("rm -rf %s", dir);
}

static pid_t pid_of(const char *node)
{
	char lc[160];

	snprintf(lc, sizeof(lc), "%s/lc", dir);
	return cluster_pid_of(lc, node);
}

/* A counter or gauge of compute node cn's /metrics; -1 when the node does not answer. */
static long long metric(unsigned cn, const char *name)
{
	char lc[160];

	snprintf(lc, sizeof(lc), "%s/lc", dir);
	return cluster_metric(lc, cn, name);
}

static long long metric_sum(const char *name)
{
	return metric(0, name) + metric(1, name);
}

/* Start dmann bench over both compute nodes in the background: STREAM queries, ids to
 * out_ids (may be NULL), its output to log. */
static const char *bench_extra = "";   /* more options of the next bench_start */
static int bench_nq;                    /* its stream length (0: STREAM) */

static pid_t bench_start(const char *ratio, const char *out_ids, const char *log)
{
	char cmd[2048], outopt[300] = "";
	pid_t b = fork();

	cr_assert_geq(b, 0);
	if (b)
		return b;
	if (out_ids)
		snprintf(outopt, sizeof(outopt), "--out %s", out_ids);
	snprintf(cmd, sizeof(cmd), "exec %s bench --config %s/lc/cluster.ini --query "
		 "%s/data/query.fbin --gt %s/data/gt.ibin --k %d --ef %d --cache-ratio %s "
		 "--nq %d %s %s >%s 2>&1", dmann, dir, dir, dir, K, EF, ratio,
		 bench_nq ? bench_nq : STREAM, outopt,
		 bench_extra, log);
	execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
	_exit(127);
}

/* Wait for the bench (at most limit_s seconds); its exit status. */
static int bench_wait(pid_t b, unsigned limit_s)
{
	uint64_t t0 = dm_now_ns();
	int st;

	for (;;) {
		if (waitpid(b, &st, WNOHANG) == b)
			break;
		cr_assert_lt(dm_now_ns() - t0, bound_s(limit_s), "bench hangs");
		usleep(50000);
	}
	cr_assert(WIFEXITED(st), "bench died (status %d)", st);
	return WEXITSTATUS(st);
}

static void read_log(const char *log, char *buf, size_t len)
{
	FILE *f = fopen(log, "r");
	size_t n;

	cr_assert_not_null(f);
	n = fread(buf, 1, len - 1, f);
	buf[n] = '\0';
	fclose(f);
}

/* SIGKILL node (mnN or cnN; a compute node frozen for 300 ms first) once the compute nodes
 * answered `after` more queries. */
static void kill_mid_stream(const char *node, pid_t bench, long long after)
{
	long long q0 = metric_sum("dmann_cn_queries_total");
	uint64_t t0 = dm_now_ns();
	int st;

	while (metric_sum("dmann_cn_queries_total") - q0 < after) {
		cr_assert_lt(dm_now_ns() - t0, bound_s(120), "the stream does not start");
		cr_assert_eq(waitpid(bench, &st, WNOHANG), 0, "bench ended before the kill");
		usleep(20000);
	}
	if (node[0] == 'c') {
		/* A compute node is frozen first, so that the stream has queries in flight on it
		 * when it dies (else a fast client may have none there at that instant and the
		 * resend would go untested: a CI run of 2026-12-05 under ASan had 0 resent). */
		cr_assert_eq(kill(pid_of(node), SIGSTOP), 0);
		usleep(300000);
	}
	cr_assert_eq(kill(pid_of(node), SIGKILL), 0);
	fprintf(stderr, "killed %s after %lld queries\n", node,
		metric_sum("dmann_cn_queries_total") - q0);
}

/* Restart mnN from its data directory (it reloads its snapshot). */
static void restart(const char *node)
{
	cr_assert_eq(sh("cd %s/lc && (setsid %s --config %s/lc/cluster.ini --id %c >>%s.log 2>&1 & "
			"echo \"$! %sb\" >>pids)", dir, dmann_mn, dir, node[2], node, node), 0);
}

/* Both compute nodes marked every memory node up again (ups counted at least `ups`). */
static void wait_all_up(long long ups)
{
	uint64_t t0 = dm_now_ns();

	while (metric(0, "dmann_cn_mn_down") != 0 || metric(1, "dmann_cn_mn_down") != 0 ||
	       metric_sum("dmann_cn_mn_marked_up_total") < ups) {
		cr_assert_lt(dm_now_ns() - t0, bound_s(60), "the memory node is not used again");
		usleep(200000);
	}
}

static unsigned compare_ids(const char *path, const int32_t *want, uint32_t nq, uint64_t n)
{
	return cluster_compare_ids(path, want, nq, n, K);
}

static int32_t *local_ids(uint32_t *nq)
{
	char idx[256], q[256];

	snprintf(idx, sizeof(idx), "%s/idx.hnsw", dir);
	snprintf(q, sizeof(q), "%s/data/query.fbin", dir);
	return local_search_ids_b(idx, q, K, EF, 1, true, nq);
}

TestSuite(failover, .init = setup_r2, .fini = teardown, .timeout = 1200);

/* One round: kill `victim` mid-stream at cache `ratio`, check, restart, check it is used. */
static void round_r2(const char *victim, const char *ratio, const int32_t *want, uint32_t nq,
		     long long *ups)
{
	char ids[256], log[256], buf[8192];
	long long fo0 = metric_sum("dmann_cn_read_failovers_total");
	long long dn0 = metric_sum("dmann_cn_mn_marked_down_total");
	long long q0 = metric_sum("dmann_cn_queries_total"), e0 = metric_sum("dmann_cn_query_errors_total");
	unsigned diff;
	pid_t b;
	int st;

	snprintf(ids, sizeof(ids), "%s/ids-%s.ibin", dir, victim);
	snprintf(log, sizeof(log), "%s/bench-%s.log", dir, victim);
	b = bench_start(ratio, ids, log);
	kill_mid_stream(victim, b, STREAM / 4);
	st = bench_wait(b, 300);
	read_log(log, buf, sizeof(buf));
	cr_assert_eq(st, 0, "queries failed although every block has a live replica: %s", buf);
	diff = compare_ids(ids, want, nq, STREAM);
	fprintf(stderr, "FIGURES r=2 cache=%s victim=%s: queries %d, failed %lld (cn errors), "
		"ids differing %u of %d, READs failed over %lld, marked down %lld\n", ratio, victim,
		STREAM, metric_sum("dmann_cn_query_errors_total") - e0, diff, STREAM * K,
		metric_sum("dmann_cn_read_failovers_total") - fo0,
		metric_sum("dmann_cn_mn_marked_down_total") - dn0);
	cr_assert_eq(diff, 0, "%u ids differ from the local search", diff);
	cr_assert_geq(metric_sum("dmann_cn_queries_total") - q0, STREAM);
	cr_assert_eq(metric_sum("dmann_cn_query_errors_total") - e0, 0);
	cr_assert_geq(metric_sum("dmann_cn_mn_marked_down_total") - dn0, 2,
		      "both compute nodes mark the dead node down");

	/* Back: both compute nodes mark it up and read from it again. */
	restart(victim);
	*ups += 2;
	wait_all_up(*ups);
	snprintf(ids, sizeof(ids), "%s/ids-%s-back.ibin", dir, victim);
	cr_assert_eq(sh("%s bench --config %s/lc/cluster.ini --query %s/data/query.fbin --gt "
			"%s/data/gt.ibin --k %d --ef %d --cache-ratio %s --out %s >/dev/null",
			dmann, dir, dir, dir, K, EF, ratio, ids), 0);
	cr_assert_eq(compare_ids(ids, want, nq, nq), 0);
	cr_assert_eq(metric_sum("dmann_cn_mn_down"), 0);
	fprintf(stderr, "FIGURES r=2 cache=%s victim=%s back: marked up %lld (total)\n", ratio,
		victim, metric_sum("dmann_cn_mn_marked_up_total"));
}

Test(failover, r2_no_query_fails_when_a_memory_node_dies)
{
	uint32_t nq;
	int32_t *want = local_ids(&nq);
	long long ups = metric_sum("dmann_cn_mn_marked_up_total");

	round_r2("mn1", "0", want, nq, &ups);
	round_r2("mn2", "10%", want, nq, &ups);
	free(want);
}

/* A compute node SIGKILLed mid-stream: libdmann sends the queries it had in flight to the
 * other one (once each); none fails, every answer is the local search's. */
Test(failover, no_libdmann_query_fails_when_a_compute_node_dies)
{
	uint32_t nq;
	int32_t *want = local_ids(&nq);
	char ids[256], log[256], buf[8192], lc[160];
	long long q0, retried;
	unsigned diff;
	pid_t b;
	int st;

	snprintf(ids, sizeof(ids), "%s/ids-cn1.ibin", dir);
	snprintf(log, sizeof(log), "%s/bench-cn1.log", dir);
	snprintf(lc, sizeof(lc), "%s/lc", dir);
	b = bench_start("0", ids, log);
	kill_mid_stream("cn1", b, STREAM / 4);
	q0 = metric(0, "dmann_cn_queries_total");
	st = bench_wait(b, 300);
	read_log(log, buf, sizeof(buf));
	cr_assert_eq(st, 0, "a query failed although another compute node is up: %s", buf);
	diff = compare_ids(ids, want, nq, STREAM);
	{
		const char *at = strstr(buf, " retried,");

		while (at > buf && at[-1] >= '0' && at[-1] <= '9')
			at--;
		retried = at ? atoll(at) : -1;
	}
	fprintf(stderr, "FIGURES cn1 SIGKILLed mid-stream: %d queries, 0 failed, %lld sent again, "
		"ids differing %u of %d, cn0 answered %lld after the kill\n", STREAM, retried, diff,
		STREAM * K, metric(0, "dmann_cn_queries_total") - q0);
	cr_assert_eq(diff, 0, "%u ids differ from the local search", diff);
	cr_assert_gt(retried, 0, "no query was in flight on the killed node: %s", buf);
	cr_assert_gt(metric(0, "dmann_cn_queries_total") - q0, 0);
	/* Back (the failure drill of the CLI): both serve again. */
	cr_assert_eq(sh("%s local start --dir %s cn1", dmann, lc), 0);
	snprintf(ids, sizeof(ids), "%s/ids-cn1-back.ibin", dir);
	q0 = metric(1, "dmann_cn_queries_total");
	cr_assert_eq(sh("%s bench --config %s/cluster.ini --query %s/data/query.fbin --gt "
			"%s/data/gt.ibin --k %d --ef %d --cache-ratio 0 --out %s >/dev/null",
			dmann, lc, dir, dir, K, EF, ids), 0);
	cr_assert_eq(compare_ids(ids, want, nq, nq), 0);
	cr_assert_gt(metric(1, "dmann_cn_queries_total") - q0, 0, "cn1 serves again");
	free(want);
}

/* The same with the compute nodes routing (adaptive, server side): the queries cn0 had
 * relayed to cn1 when it died are answered -ECONNABORTED once the cluster state declares
 * cn1 down (the router then sends it nothing more) and libdmann sends them again. */
Test(failover, no_query_fails_when_a_compute_node_dies_under_server_routing)
{
	uint32_t nq;
	int32_t *want = local_ids(&nq);
	char ids[256], log[256], buf[8192];
	unsigned diff;
	pid_t b;
	int st;

	snprintf(ids, sizeof(ids), "%s/ids-srv.ibin", dir);
	snprintf(log, sizeof(log), "%s/bench-srv.log", dir);
	bench_extra = "--routing adaptive --client-routing no";
	b = bench_start("0", ids, log);
	bench_extra = "";
	kill_mid_stream("cn1", b, STREAM / 4);
	st = bench_wait(b, 300);
	read_log(log, buf, sizeof(buf));
	cr_assert_eq(st, 0, "a query failed although another compute node is up: %s", buf);
	diff = compare_ids(ids, want, nq, STREAM);
	fprintf(stderr, "FIGURES cn1 SIGKILLed mid-stream, server-side adaptive routing: %d "
		"queries, 0 failed, ids differing %u; %s\n", STREAM, diff, buf);
	cr_assert_eq(diff, 0, "%u ids differ from the local search", diff);
	{
		const char *at = strstr(buf, "% relayed)");
		double rel = -1;

		while (at && at > buf && at[-1] != '(')
			at--;
		if (at)
			rel = atof(at);
		cr_assert_gt(rel, 0, "no query was relayed: %s", buf);
	}
	free(want);
}

TestSuite(failover_r1, .init = setup_r1, .fini = teardown, .timeout = 900);

Test(failover_r1, queries_on_a_dead_node_fail_fast_and_recover)
{
	uint32_t nq;
	int32_t *want = local_ids(&nq);
	char log[256], ids[256], buf[8192];
	long long ups = metric_sum("dmann_cn_mn_marked_up_total");
	uint64_t t0;
	pid_t b;
	int st;

	snprintf(log, sizeof(log), "%s/bench-r1.log", dir);
	b = bench_start("0", NULL, log);
	kill_mid_stream("mn1", b, STREAM / 4);
	t0 = dm_now_ns();
	st = bench_wait(b, 120);
	read_log(log, buf, sizeof(buf));
	fprintf(stderr, "FIGURES r=1: bench ended %.1f s after the kill, status %d\n",
		(double)(dm_now_ns() - t0) / 1e9, st);
	cr_assert_eq(st, 1, "bench must report failed queries: %s", buf);
	cr_assert(strstr(buf, "queries failed") && strstr(buf, "Host is down"), "unclear error: %s",
		  buf);
	restart("mn1");
	wait_all_up(ups + 2);
	snprintf(ids, sizeof(ids), "%s/ids-r1.ibin", dir);
	cr_assert_eq(sh("%s bench --config %s/lc/cluster.ini --query %s/data/query.fbin --gt "
			"%s/data/gt.ibin --k %d --ef %d --cache-ratio 10%% --out %s >/dev/null",
			dmann, dir, dir, dir, K, EF, ids), 0);
	cr_assert_eq(compare_ids(ids, want, nq, nq), 0);
	free(want);
}

/* ---- compute nodes leaving and joining: new routing epochs, no failed query ----------- */

/* 2 memory nodes, 3 compute nodes routing adaptively (the cluster file's strategy, so that
 * a compute node that starts again routes as the others). */
static void setup_3cn(void)
{
	setup_cluster(2, 3, 2, "--router strategy=adaptive");
}

/* The owner compute node cn reports for partition p, -1 if it does not answer. */
static long long owner_of(unsigned cn, unsigned p)
{
	static char out[65536];
	char lc[160], key[96], *at;

	snprintf(lc, sizeof(lc), "%s/lc", dir);
	if (cluster_metrics(lc, cn, out, sizeof(out)))
		return -1;
	snprintf(key, sizeof(key), "\ndmann_cn_route_owner{node=\"%u\",partition=\"%u\"} ", cn, p);
	at = strstr(out, key);
	return at ? atoll(at + strlen(key)) : -1;
}

/* Wait until the compute nodes in `live` (a bit mask) report one routing epoch other than
 * `not` (or equal to `want` when want >= 0), and partitions_moved `moved`; returns it. */
static long long wait_epoch(unsigned live, long long want, long long not, long long moved)
{
	uint64_t t0 = dm_now_ns();

	for (;;) {
		long long e = -1;
		bool same = true;

		for (unsigned c = 0; c < 3 && same; c++) {
			long long ec, mc;

			if (!(live >> c & 1))
				continue;
			ec = metric(c, "dmann_cn_route_epoch");
			mc = metric(c, "dmann_cn_route_partitions_moved");
			same = ec >= 0 && mc == moved && (e < 0 || ec == e);
			e = ec;
		}
		if (same && e >= 0 && e != not && (want < 0 || e == want))
			return e;
		cr_assert_lt(dm_now_ns() - t0, bound_s(60), "the compute nodes do not agree on a new "
			     "routing epoch (last %lld, not %lld, want %lld)", e, not, want);
		usleep(100000);
	}
}

/* Once the compute nodes answered `after` more queries of the stream, run the drill
 * `what` (stop/start) on node. */
static void drill_mid_stream(const char *what, const char *node, pid_t bench, long long after)
{
	long long q0 = metric(0, "dmann_cn_queries_total") + metric(1, "dmann_cn_queries_total");
	uint64_t t0 = dm_now_ns();
	int st;

	while (metric(0, "dmann_cn_queries_total") + metric(1, "dmann_cn_queries_total") - q0 <
	       after) {
		cr_assert_lt(dm_now_ns() - t0, bound_s(120), "the stream does not start");
		cr_assert_eq(waitpid(bench, &st, WNOHANG), 0, "bench ended before the drill");
		usleep(20000);
	}
	cr_assert_eq(sh("%s local %s --dir %s/lc %s", dmann, what, dir, node), 0);
	fprintf(stderr, "%s %s mid-stream\n", what, node);
}

/* The relayed share a bench printed ("(N% relayed)"), -1 if absent. */
static double relayed_pct(const char *buf)
{
	const char *at = strstr(buf, "% relayed)");

	while (at && at > buf && at[-1] != '(')
		at--;
	return at ? atof(at) : -1;
}

/* The stream ends: 0 failed (while a compute node `what`), answers equal to the local
 * search; its output into buf. */
static void stream_done(pid_t b, const char *log, const char *what, const char *ids,
			const int32_t *want, uint32_t nq, char *buf, size_t len)
{
	int st = bench_wait(b, 300);

	read_log(log, buf, len);
	cr_assert_eq(st, 0, "a query failed while a compute node %s: %s", what, buf);
	cr_assert_eq(compare_ids(ids, want, nq, STREAM), 0, "answers differ from the local search");
}

TestSuite(repartition, .init = setup_3cn, .fini = teardown, .timeout = 900);

/* cn2 leaves (SIGTERM) and joins again in the middle of client-routed streams: its
 * partition goes to a ring neighbour under a new routing epoch on which the others agree,
 * then back to it under the first epoch; libdmann follows; no query fails and every answer
 * is the local search's; the leaving node drains (no query had to be sent again). */
Test(repartition, a_compute_node_leaving_and_joining_changes_the_routing_epoch)
{
	uint32_t nq;
	int32_t *want = local_ids(&nq);
	char ids[256], log[256], buf[8192];
	long long e0, e1, q2, n0, n1;
	pid_t b;

	/* Routing on: the bench sets the strategy on every compute node, then routes itself. */
	bench_extra = "--routing adaptive";
	snprintf(ids, sizeof(ids), "%s/ids-warm.ibin", dir);
	snprintf(log, sizeof(log), "%s/bench-warm.log", dir);
	b = bench_start("0", ids, log);
	cr_assert_eq(bench_wait(b, 300), 0);
	e0 = wait_epoch(7, -1, -1, 0);
	for (unsigned p = 0; p < 3; p++)
		cr_assert_eq(owner_of(0, p), p, "every compute node serves its own partition");

	/* Leave. */
	snprintf(ids, sizeof(ids), "%s/ids-leave.ibin", dir);
	snprintf(log, sizeof(log), "%s/bench-leave.log", dir);
	b = bench_start("0", ids, log);
	drill_mid_stream("stop", "cn2", b, STREAM / 4);
	e1 = wait_epoch(3, -1, e0, 1);
	n0 = metric(0, "dmann_cn_queries_total");
	n1 = metric(1, "dmann_cn_queries_total");
	stream_done(b, log, "left", ids, want, nq, buf, sizeof(buf));
	fprintf(stderr, "FIGURES cn2 left: routing epoch %08llx -> %08llx, partition 2 served by "
		"cn%lld (both agree), queries after the new epoch cn0 %lld cn1 %lld; %s\n", e0, e1,
		owner_of(0, 2), metric(0, "dmann_cn_queries_total") - n0,
		metric(1, "dmann_cn_queries_total") - n1, buf);
	cr_assert_eq(owner_of(0, 2), owner_of(1, 2), "cn0 and cn1 disagree on partition 2");
	cr_assert(owner_of(0, 2) == 0 || owner_of(0, 2) == 1);
	cr_assert_eq(owner_of(0, 0), 0);
	cr_assert_eq(owner_of(1, 1), 1);
	cr_assert_geq(metric(0, "dmann_cn_route_owner_changes_total"), 1);
	/* The client took the new owners within the call (a client on the old epoch would
	 * have its queries relayed by the compute nodes: 29% were before it did). */
	cr_assert(relayed_pct(buf) >= 0 && relayed_pct(buf) < 5, "relayed: %s", buf);
	/* SIGTERM drains: cn2 answered what was sent to it until the others had its
	 * partition, so no query had to be sent again. */
	cr_assert_not_null(strstr(buf, " 0 retried"), "queries lost with the leaving node: %s",
			   buf);

	/* Join: the owners and the epoch are the first ones again, cn2 serves its partition. */
	snprintf(ids, sizeof(ids), "%s/ids-join.ibin", dir);
	snprintf(log, sizeof(log), "%s/bench-join.log", dir);
	b = bench_start("0", ids, log);
	drill_mid_stream("start", "cn2", b, STREAM / 4);
	cr_assert_eq(wait_epoch(7, e0, -1, 0), e0, "the first epoch again after the join");
	q2 = metric(2, "dmann_cn_queries_total");
	stream_done(b, log, "joined", ids, want, nq, buf, sizeof(buf));
	fprintf(stderr, "FIGURES cn2 joined: routing epoch back to %08llx on all three, cn2 ran "
		"%lld queries of the stream after it; %s\n", e0,
		metric(2, "dmann_cn_queries_total") - q2, buf);
	for (unsigned p = 0; p < 3; p++)
		cr_assert_eq(owner_of(2, p), p);
	cr_assert_gt(metric(2, "dmann_cn_queries_total") - q2, 0,
		     "the client routes to the compute node that joined");
	cr_assert(relayed_pct(buf) >= 0 && relayed_pct(buf) < 5, "relayed: %s", buf);
	bench_extra = "";
	free(want);
}

/* ---- an oracle epoch refresh and key-range partitions under a stream (issue 15) -------- */

/* 2 memory nodes, 3 compute nodes whose partitions are key ranges (range g is cn g's, the
 * key ring runs 0-1-2), routing adaptively. The oracle's sample is HNSW level 1 (about 670
 * nodes; the default 1000 would take all 8,000 of level 0): its fit takes 12-15 s under
 * ASan with the 125 regions of 8,000 points, longer than the sanitizer build's stream.
 * fit_duty 100: the fit runs unpaced (paced to 25% it would take 4x as long under ASan;
 * the pace is bench/epoch/run.sh's subject and test_oracle's pace_called_and_model_unchanged's). */
static void setup_keyrange(void)
{
	setup_cluster(2, 3, 2, "--router strategy=adaptive --router partitions=keyrange "
		      "--router sample_min_nodes=500 --router fit_duty=100");
}

/* What a `dmann bench --trace` file shows: queries, failed ones, those not routed by the
 * client once it routed one, relayed ones, and those routed with oracle epoch `old` or
 * `new` (the routing epoch's top byte). */
struct trace_sum {
	unsigned long n, failed, unrouted, relayed, old_ep, new_ep;
};

static struct trace_sum trace_read(const char *path, unsigned old, unsigned new)
{
	struct trace_sum t = { 0 };
	char line[256];
	bool routed = false;
	FILE *f = fopen(path, "r");

	cr_assert_not_null(f, "%s", path);
	while (fgets(line, sizeof(line), f)) {
		unsigned long long pos, sent;
		unsigned to, on, ep, rep, fl;
		double lat;
		int st;

		if (line[0] == '#')
			continue;
		cr_assert_eq(sscanf(line, "%llu %llu %lf %d %u %u %x %x %u", &pos, &sent, &lat, &st,
				    &to, &on, &ep, &rep, &fl), 9, "trace line: %s", line);
		t.n++;
		t.failed += st != 0;
		t.relayed += !!(fl & 4u);   /* DMANN_SI_RELAYED (dmann.h) */
		if (ep)
			routed = true;
		else if (routed)
			t.unrouted++;
		t.old_ep += ep && ep >> 24 == (old & 0xffu);
		t.new_ep += ep && ep >> 24 == (new & 0xffu);
	}
	fclose(f);
	return t;
}

/* Every compute node in `live` (bit mask) runs oracle epoch e. */
static void assert_oracle_epoch(unsigned live, long long e)
{
	for (unsigned c = 0; c < 3; c++)
		if (live >> c & 1)
			cr_assert_eq(metric(c, "dmann_cn_oracle_epoch"), e, "cn%u's oracle epoch", c);
}

TestSuite(epoch, .init = setup_keyrange, .fini = teardown, .timeout = 600);

/* `dmann route refresh` in the middle of a client-routed stream: every compute node moves
 * to oracle epoch 1 (prepared in the background, switched together), no query fails, none
 * goes unrouted (round robin) or gets relayed more than the usual few, the client routes
 * with both epochs in the one stream, every answer is the local search's. Then cn2, the end
 * of the key ring, leaves (SIGTERM) and joins again in one stream: only its range moves, to
 * cn1 (its only key neighbour), and back; the node that joins runs epoch 1 again (the
 * cluster's, not epoch 0), taken from etcd; nothing fails. With etcd one compute node fits
 * epoch 1 and the others take it from there (router_etcd.h). */
Test(epoch, refresh_and_a_leave_under_a_stream_move_only_what_they_must)
{
	uint32_t nq;
	int32_t *want = local_ids(&nq);
	char ids[256], log[256], trace[256], extra[512], buf[8192];
	long long e0, e1, e2, q0, fits0[3], warm0[3], taken0[3];
	struct trace_sum t;
	uint64_t t0;
	pid_t b;
	int st, n;

	/* Every compute node built its key-range oracle (routing epochs are non-zero then). */
	e0 = wait_epoch(7, -1, 0, 0);
	assert_oracle_epoch(7, 0);
	for (unsigned p = 0; p < 3; p++)
		cr_assert_eq(owner_of(0, p), p, "every compute node serves its own range");

	/* Refresh a tenth into the stream (the test checks that the stream outlasted the
	 * switch). */
	n = STREAM;
	bench_nq = n;
	snprintf(trace, sizeof(trace), "%s/trace-refresh.txt", dir);
	snprintf(extra, sizeof(extra), "--routing adaptive --trace %s", trace);
	bench_extra = extra;
	snprintf(ids, sizeof(ids), "%s/ids-refresh.ibin", dir);
	snprintf(log, sizeof(log), "%s/bench-refresh.log", dir);
	b = bench_start("10%", ids, log);
	q0 = metric(0, "dmann_cn_queries_total") + metric(1, "dmann_cn_queries_total");
	t0 = dm_now_ns();
	while (metric(0, "dmann_cn_queries_total") + metric(1, "dmann_cn_queries_total") - q0 <
	       n / 10) {
		cr_assert_lt(dm_now_ns() - t0, bound_s(120), "the stream does not start");
		cr_assert_eq(waitpid(b, &st, WNOHANG), 0, "bench ended before the refresh");
		usleep(20000);
	}
	for (unsigned c = 0; c < 3; c++) {
		fits0[c] = metric(c, "dmann_cn_oracle_fits_total");
		warm0[c] = metric(c, "dmann_cn_oracle_warm_fits_total");
		taken0[c] = metric(c, "dmann_cn_oracle_taken_total");
	}
	cr_assert_eq(sh("%s route refresh --config %s/lc/cluster.ini --wait 60", dmann, dir), 0);
	cr_assert_eq(waitpid(b, &st, WNOHANG), 0, "the stream ended before every compute node "
		     "switched: the test shows nothing (a longer stream is needed here)");
	e1 = wait_epoch(7, -1, e0, 0);
	assert_oracle_epoch(7, 1);
	/* One compute node fitted epoch 1 (it claimed the fit in etcd), the others took its
	 * oracle from etcd; all route with the same oracle (the routing epochs agree). */
	unsigned fitters = 0, takers = 0;

	for (unsigned c = 0; c < 3; c++) {
		long long f = metric(c, "dmann_cn_oracle_fits_total") - fits0[c];
		long long tk = metric(c, "dmann_cn_oracle_taken_total") - taken0[c];

		cr_assert(f + tk == 1, "cn%u: fitted %lld, taken %lld oracles", c, f, tk);
		/* through etcd the fit starts from epoch 0's centroids */
		cr_assert_eq(metric(c, "dmann_cn_oracle_warm_fits_total") - warm0[c], f,
			     "cn%u: the fit did not start from the current epoch's centroids", c);
		fitters += f == 1;
		takers += tk == 1;
	}
	fprintf(stderr, "FIGURES epoch refresh: oracle epoch 1 fitted by %u compute node(s), "
		"taken from etcd by %u\n", fitters, takers);
	cr_assert_eq(fitters, 1, "exactly one compute node fits the new epoch");
	cr_assert_eq(takers, 2, "the others take it from etcd");
	cr_assert_eq(bench_wait(b, 300), 0, "a query failed during the refresh");
	read_log(log, buf, sizeof(buf));
	cr_assert_eq(compare_ids(ids, want, nq, (uint64_t)n), 0, "answers differ from the local search");
	t = trace_read(trace, 0, 1);
	fprintf(stderr, "FIGURES epoch refresh: routing epoch %08llx -> %08llx; %lu queries, %lu "
		"failed, %lu not routed by the client, %lu relayed, %lu routed with epoch 0 and %lu "
		"with epoch 1; %s\n", e0, e1, t.n, t.failed, t.unrouted, t.relayed, t.old_ep,
		t.new_ep, buf);
	cr_assert_eq(t.n, (unsigned long)n);
	cr_assert_eq(t.failed, 0);
	cr_assert_eq(t.unrouted, 0, "queries went round robin during the switch");
	cr_assert(t.old_ep > 0 && t.new_ep > 0, "the client did not switch within the stream");
	cr_assert_lt(t.relayed, (unsigned long)n / 20, "relayed: %lu", t.relayed);

	/* cn2 leaves and joins in one stream (twice the usual, to outlast both). */
	n = 2 * STREAM;
	bench_nq = n;
	bench_extra = "--routing adaptive";
	snprintf(ids, sizeof(ids), "%s/ids-leave-join.ibin", dir);
	snprintf(log, sizeof(log), "%s/bench-leave-join.log", dir);
	b = bench_start("10%", ids, log);
	drill_mid_stream("stop", "cn2", b, n / 10);
	e2 = wait_epoch(3, -1, e1, 1);
	for (unsigned c = 0; c < 2; c++) {
		cr_assert_eq(owner_of(c, 0), 0, "cn%u: range 0 stays with cn0", c);
		cr_assert_eq(owner_of(c, 1), 1, "cn%u: range 1 stays with cn1", c);
		cr_assert_eq(owner_of(c, 2), 1, "cn%u: range 2 goes to its key neighbour cn1", c);
	}
	cr_assert_eq(sh("%s local start --dir %s/lc cn2", dmann, dir), 0);
	cr_assert_eq(waitpid(b, &st, WNOHANG), 0, "the stream ended before cn2 joined: the test "
		     "shows nothing (a longer stream is needed here)");
	cr_assert_eq(wait_epoch(7, e1, -1, 0), e1, "epoch 1's owners again after the join");
	assert_oracle_epoch(7, 1);
	cr_assert_eq(metric(2, "dmann_cn_oracle_taken_total"), 1, "cn2 took epoch 1's oracle "
		     "from etcd when it started again");
	for (unsigned p = 0; p < 3; p++)
		cr_assert_eq(owner_of(2, p), p);
	cr_assert_eq(bench_wait(b, 300), 0, "a query failed while cn2 left or joined");
	read_log(log, buf, sizeof(buf));
	cr_assert_eq(compare_ids(ids, want, nq, (uint64_t)n), 0, "answers differ from the local search");
	fprintf(stderr, "FIGURES epoch leave/join: routing epoch %08llx -> %08llx (cn2 left, range 2 "
		"served by cn1) -> %08llx (back); %s\n", e1, e2, e1, buf);
	bench_nq = 0;
	bench_extra = "";
	free(want);
}

/* ---- an oracle epoch refresh without etcd: every compute node fits it itself ---------- */

static void setup_keyrange_no_etcd(void)
{
	setup_cluster(2, 3, 2, "--no-etcd --router strategy=adaptive --router partitions=keyrange "
		      "--router sample_min_nodes=500 --router fit_duty=100");
}

TestSuite(epoch_no_etcd, .init = setup_keyrange_no_etcd, .fini = teardown, .timeout = 300);

/* Without [cluster] etcd a refresh is as before the hand-over: each of the 3 compute nodes
 * fits epoch 1 itself (no etcd handle, no wait), and all end on the same oracle (the same
 * routing epoch). */
Test(epoch_no_etcd, every_compute_node_fits_the_new_epoch)
{
	long long e0, e1;

	e0 = wait_epoch(7, -1, 0, 0);
	assert_oracle_epoch(7, 0);
	cr_assert_eq(sh("%s route refresh --config %s/lc/cluster.ini --wait 60", dmann, dir), 0);
	e1 = wait_epoch(7, -1, e0, 0);
	assert_oracle_epoch(7, 1);
	for (unsigned c = 0; c < 3; c++) {
		cr_assert_eq(metric(c, "dmann_cn_oracle_fits_total"), 1, "cn%u fitted epoch 1", c);
		cr_assert_eq(metric(c, "dmann_cn_oracle_taken_total"), 0, "cn%u: nothing taken", c);
		/* without etcd every CN fits from scratch, so that they agree */
		cr_assert_eq(metric(c, "dmann_cn_oracle_warm_fits_total"), 0, "cn%u: warm", c);
	}
	fprintf(stderr, "FIGURES epoch refresh without etcd: routing epoch %08llx -> %08llx, "
		"3 of 3 compute nodes fitted epoch 1\n", e0, e1);
}
