/* test_cluster.c: a local cluster (2 memory + 2 compute nodes, tcp, loopback) against the
 * local search of the same index. The same binary runs inside the soft-RoCE VM with
 * DMANN_CLUSTER_TRANSPORT=verbs, DMANN_TEST_HOST=<rxe0's address> and
 * DMANN_CLUSTER_NODES="1 1" (one memory node, one compute node):
 *   - the cluster returns exactly the ids of the local search (same index with RaBitQ
 *     neighbour codes, the build default; same ef), with the cache off and at 10%, and with
 *     a beam of 2 candidates per round trip;
 *   - an image whose nodes are numbered in VHash key order (dmann build --order vhash),
 *     placed in runs of 2 blocks, answers with the ids of the local search of that image:
 *     rows of the vector file, not node ids, and the locality counters reach /metrics;
 *   - a memory node killed during a query stream makes the affected queries fail with a
 *     clear error within a bounded time, nothing hangs, and once the node is back (it
 *     reloads its snapshot) the compute nodes serve again with the same answers. */
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

static char dir[128], dmann[300], dmann_mn[300];

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");
	const char *transport = getenv("DMANN_CLUSTER_TRANSPORT");
	const char *host = getenv("DMANN_TEST_HOST");
	const char *nodes = getenv("DMANN_CLUSTER_NODES");
	unsigned nmn = 2, ncn = 2;

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dmann_mn, sizeof(dmann_mn), "%s/mn/dmann-mn", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-cluster-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	cr_assert_eq(sh("%s gen --kind sift --n 8000 --nq 200 --seed 3 --out %s/data >/dev/null",
			dmann, dir), 0);
	cr_assert_eq(sh("%s build --base %s/data/base.fbin --metric l2 --M 12 --efc 80 --threads 1 "
			"--block-shift 10 --out %s/idx.hnsw >/dev/null", dmann, dir, dir), 0);
	if (nodes)
		cr_assert_eq(sscanf(nodes, "%u %u", &nmn, &ncn), 2, "DMANN_CLUSTER_NODES=\"MN CN\"");
	cr_assert_eq(sh("%s local up --mn %u --cn %u --dir %s/lc --region-mb 32 --transport %s "
			"--host %s", dmann, nmn, ncn, dir, transport ? transport : "tcp",
			host ? host : "127.0.0.1"), 0);
	cr_assert_eq(sh("%s load --config %s/lc/cluster.ini --index %s/idx.hnsw", dmann, dir, dir), 0);
}

static void teardown(void)
{
	sh("%s local down --dir %s/lc", dmann, dir);
	cluster_test_dir_done(dir);
}

/* Ids of the local search for every query of the data set. */
static int32_t *local_ids(uint32_t *nq, uint32_t beam)
{
	char idx[256], q[256];

	snprintf(idx, sizeof(idx), "%s/idx.hnsw", dir);
	snprintf(q, sizeof(q), "%s/data/query.fbin", dir);
	return local_search_ids_b(idx, q, K, EF, beam, true, nq);
}

static void bench_and_compare(const char *ratio, const int32_t *want, uint32_t nq,
			      uint32_t beam)
{
	struct dm_vecs got;
	char p[256], err[512];
	unsigned diff = 0;

	cr_assert_eq(sh("%s bench --config %s/lc/cluster.ini --query %s/data/query.fbin "
			"--gt %s/data/gt.ibin --k %d --ef %d --cache-ratio %s --beam %u "
			"--out %s/ids.ibin", dmann, dir, dir, dir, K, EF, ratio, beam, dir), 0,
		     "bench failed (cache %s)", ratio);
	snprintf(p, sizeof(p), "%s/ids.ibin", dir);
	cr_assert_eq(dm_vecs_read(p, DM_VF_IBIN, &got, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(got.n, nq);
	cr_assert_eq(got.dim, K);
	for (uint64_t i = 0; i < (uint64_t)nq * K; i++)
		diff += ((int32_t *)got.data)[i] != want[i];
	cr_assert_eq(diff, 0, "cache %s beam %u: %u of %u ids differ from the local search", ratio,
		     beam, diff, nq * K);
	dm_vecs_free(&got);
}

static pid_t pid_of(const char *node)
{
	char lc[160];

	snprintf(lc, sizeof(lc), "%s/lc", dir);
	return cluster_pid_of(lc, node);
}

TestSuite(cluster, .init = setup, .fini = teardown, .timeout = 900);

/* GET /metrics of compute node 0. */
static void check_metrics(void)
{
	static char out[32768];
	char lc[160];

	snprintf(lc, sizeof(lc), "%s/lc", dir);
	cr_assert_eq(cluster_metrics(lc, 0, out, sizeof(out)), 0, "metrics: %s", strerror(errno));
	cr_assert_not_null(strstr(out, "200 OK"), "%s", out);
	cr_assert_not_null(strstr(out, "# TYPE dmann_cn_queries_total counter"), "%s", out);
	cr_assert_not_null(strstr(out, "dmann_cn_cache_hits_total{node=\"0\"}"), "%s", out);
	cr_assert_not_null(strstr(out, "dmann_cn_routed_total{node=\"0\",where=\"local\"}"), "%s",
			   out);
	cr_assert_null(strstr(out, "dmann_cn_queries_total{node=\"0\"} 0\n"),
		       "queries were answered but the counter is 0: %s", out);
}

Test(cluster, same_ids_as_local_search)
{
	uint32_t nq;
	int32_t *want = local_ids(&nq, 1);

	bench_and_compare("0", want, nq, 1);
	bench_and_compare("10%", want, nq, 1);
	check_metrics();
	free(want);
	want = local_ids(&nq, 2);
	bench_and_compare("10%", want, nq, 2);
	free(want);
}

/* A key-ordered image (nodes in VHash key order, the label map in the image and the
 * metadata) placed in runs of 2 blocks: the cluster answers rows of the vector file, the
 * same as the local search of the image, with the cache off and on, beam 1 and 4. */
Test(cluster, key_order_same_ids_as_local_search)
{
	static char out[65536];
	char idx[256], q[256], lc[160];
	uint32_t nq;
	int32_t *want;

	cr_assert_eq(sh("%s build --base %s/data/base.fbin --metric l2 --M 12 --efc 80 --threads 1 "
			"--block-shift 10 --order vhash --vhash-k 16 --out %s/key.hnsw >/dev/null",
			dmann, dir, dir), 0);
	cr_assert_eq(sh("%s load --config %s/lc/cluster.ini --index %s/key.hnsw --place-run 2",
			dmann, dir, dir), 0);
	snprintf(idx, sizeof(idx), "%s/key.hnsw", dir);
	snprintf(q, sizeof(q), "%s/data/query.fbin", dir);
	for (uint32_t beam = 1; beam <= 4; beam += 3) {
		unsigned same = 0;
		int32_t *ins = local_ids(&nq, beam);

		want = local_search_ids_b(idx, q, K, EF, beam, true, &nq);
		/* built with one thread: the same graph as the insertion-order image, renamed,
		 * so the same rows */
		for (uint64_t i = 0; i < (uint64_t)nq * K; i++)
			same += want[i] == ins[i];
		cr_assert_gt(same, nq * K * 99 / 100, "key order: %u of %u ids as in insertion "
			     "order", same, nq * K);
		bench_and_compare("0", want, nq, beam);
		bench_and_compare("10%", want, nq, beam);
		free(ins);
		free(want);
	}
	snprintf(lc, sizeof(lc), "%s/lc", dir);
	cr_assert_eq(cluster_metrics(lc, 0, out, sizeof(out)), 0, "metrics: %s", strerror(errno));
	cr_assert_not_null(strstr(out, "dmann_cn_locality_query_mns_total{node=\"0\"}"), "%s",
			   out);
	cr_assert_null(strstr(out, "dmann_cn_locality_queries_total{node=\"0\"} 0\n"), "%s", out);
}

Test(cluster, survives_a_memory_node_failure)
{
	uint32_t nq;
	int32_t *want = local_ids(&nq, 1);
	const char *nodes = getenv("DMANN_CLUSTER_NODES");
	const char *victim = nodes && nodes[0] == '1' ? "mn0" : "mn1";
	pid_t bench, mn;
	int st;
	uint64_t t0;
	char out[256], cmd[2048];
	FILE *f;

	/* Kill a memory node in the middle of a long stream: once the compute node has
	 * answered some of its queries (a fixed 2 s was not enough in a loaded soft-RoCE VM:
	 * the kill came while bench still configured the compute node). */
	char lc[160];
	long long q0;

	snprintf(lc, sizeof(lc), "%s/lc", dir);
	q0 = cluster_metric(lc, 0, "dmann_cn_queries_total");
	snprintf(out, sizeof(out), "%s/bench-fail.log", dir);
	bench = fork();
	cr_assert_geq(bench, 0);
	if (bench == 0) {
		snprintf(cmd, sizeof(cmd), "exec %s bench --config %s/lc/cluster.ini --query "
			 "%s/data/query.fbin --gt %s/data/gt.ibin --k %d --ef %d --cache-ratio 0 "
			 "--nq 200000 >%s 2>&1", dmann, dir, dir, dir, K, EF, out);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	t0 = dm_now_ns();
	while (cluster_metric(lc, 0, "dmann_cn_queries_total") < q0 + 100) {
		cr_assert_lt(dm_now_ns() - t0, bound_s(60), "the stream did not start");
		usleep(50000);
	}
	mn = pid_of(victim);
	cr_assert_eq(kill(mn, SIGKILL), 0);
	t0 = dm_now_ns();
	/* Bounded: every query touching the dead node fails fast; the stream then ends. */
	for (;;) {
		if (waitpid(bench, &st, WNOHANG) == bench)
			break;
		cr_assert_lt(dm_now_ns() - t0, bound_s(90), "bench hangs after the kill");
		usleep(100000);
	}
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1,
		  "bench must report failed queries (status %d)", st);
	f = fopen(out, "r");
	cr_assert_not_null(f);
	{
		char buf[8192] = "";
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);

		buf[n] = '\0';
		fclose(f);
		cr_assert(strstr(buf, "queries failed") && (strstr(buf, "Host is down") ||
							     strstr(buf, "Connection reset") ||
							     strstr(buf, "stale")),
			  "unclear error: %s", buf);
	}

	/* Restart it: it reloads its snapshot; the compute nodes reconnect and serve again. */
	cr_assert_eq(sh("cd %s/lc && (setsid %s --config %s/lc/cluster.ini --id %c >>%s.log 2>&1 & "
			"echo \"$! %sb\" >>pids)", dir, dmann_mn, dir, victim[2], victim, victim), 0);
	t0 = dm_now_ns();
	for (;;) {
		if (sh("%s status --config %s/lc/cluster.ini >/dev/null", dmann, dir) == 0)
			break;
		cr_assert_lt(dm_now_ns() - t0, bound_s(30), "%s did not come back", victim);
		usleep(200000);
	}
	/* The compute nodes re-read the block table within a second or so. */
	for (int attempt = 0;; attempt++) {
		if (sh("%s bench --config %s/lc/cluster.ini --query %s/data/query.fbin --gt "
		       "%s/data/gt.ibin --k %d --ef %d --cache-ratio 0 --nq 50 >/dev/null 2>&1",
		       dmann, dir, dir, dir, K, EF) == 0)
			break;
		cr_assert_lt(attempt, (int)(bound_s(20) / 1000000000ull),
			     "compute nodes do not serve after the memory node is back");
		sleep(1);
	}
	bench_and_compare("10%", want, nq, 1);
	free(want);
}

/* dmann bench of graph g with the queries of data dir qdir: its ids must equal want. */
static void bench_graph(unsigned g, const char *qdir, const int32_t *want, uint32_t nq,
			const char *tag)
{
	struct dm_vecs got;
	char p[256], err[512];
	unsigned diff = 0;

	cr_assert_eq(sh("%s bench --config %s/lc/cluster.ini --query %s/query.fbin --gt "
			"%s/gt.ibin --k %d --ef %d --cache-ratio 10%% --graph %u --out %s/ids-%s.ibin",
			dmann, dir, qdir, qdir, K, EF, g, dir, tag), 0, "bench of graph %u (%s) failed",
		     g, tag);
	snprintf(p, sizeof(p), "%s/ids-%s.ibin", dir, tag);
	cr_assert_eq(dm_vecs_read(p, DM_VF_IBIN, &got, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(got.n, nq);
	for (uint64_t i = 0; i < (uint64_t)nq * K; i++)
		diff += ((int32_t *)got.data)[i] != want[i];
	cr_assert_eq(diff, 0, "graph %u (%s): %u of %u ids differ from the local search", g, tag,
		     diff, nq * K);
	dm_vecs_free(&got);
}

/* Several graphs in one cluster: a second index (another dimension, metric and record
 * size) loaded as graph 1 next to graph 0; both searched, one after the other and at the
 * same time, each with the ids of its own local search; graph 0 unchanged by the load;
 * graph 1 dropped (its queries then fail with a clear error, graph 0 serves on) and
 * loaded again. */
Test(cluster, several_graphs)
{
	uint32_t nq0, nq1;
	int32_t *want0 = local_ids(&nq0, 1), *want1;
	char d0[200], d1[200], idx1[256], q1[256];
	pid_t b0, b1;
	int st0, st1;

	snprintf(d0, sizeof(d0), "%s/data", dir);
	snprintf(d1, sizeof(d1), "%s/data1", dir);
	cr_assert_eq(sh("%s gen --kind cos384 --n 3000 --nq 100 --seed 5 --out %s >/dev/null",
			dmann, d1), 0);
	snprintf(idx1, sizeof(idx1), "%s/idx1.hnsw", dir);
	cr_assert_eq(sh("%s build --base %s/base.fbin --metric cos --M 8 --efc 60 --threads 1 "
			"--block-shift 9 --out %s >/dev/null", dmann, d1, idx1), 0);
	snprintf(q1, sizeof(q1), "%s/query.fbin", d1);
	want1 = local_search_ids_b(idx1, q1, K, EF, 1, true, &nq1);

	/* graph 1 not loaded yet: a clear error, not a hang */
	cr_assert_neq(sh("%s bench --config %s/lc/cluster.ini --query %s/query.fbin --gt "
			 "%s/gt.ibin --k %d --ef %d --cache-ratio keep --graph 1 >%s/g1.log 2>&1",
			 dmann, dir, d1, d1, K, EF, dir), 0);
	cr_assert_eq(sh("grep -q 'no HNSW index is loaded as graph 1' %s/g1.log", dir), 0, "unclear error for a graph "
		     "not loaded");
	cr_assert_eq(sh("%s load --config %s/lc/cluster.ini --index %s --graph 1 >/dev/null",
			dmann, dir, idx1), 0);
	bench_graph(0, d0, want0, nq0, "g0");
	bench_graph(1, d1, want1, nq1, "g1");
	/* both at once, on the same compute nodes */
	b0 = fork();
	cr_assert_geq(b0, 0);
	if (b0 == 0)
		_exit(sh("%s bench --config %s/lc/cluster.ini --query %s/query.fbin --gt %s/gt.ibin "
			 "--k %d --ef %d --cache-ratio keep --nq 4000 --out %s/ids-c0.ibin >/dev/null",
			 dmann, dir, d0, d0, K, EF, dir) ? 1 : 0);
	b1 = fork();
	cr_assert_geq(b1, 0);
	if (b1 == 0)
		_exit(sh("%s bench --config %s/lc/cluster.ini --query %s/query.fbin --gt %s/gt.ibin "
			 "--k %d --ef %d --cache-ratio keep --graph 1 --nq 2000 --out %s/ids-c1.ibin "
			 ">/dev/null", dmann, dir, d1, d1, K, EF, dir) ? 1 : 0);
	cr_assert_eq(waitpid(b0, &st0, 0), b0);
	cr_assert_eq(waitpid(b1, &st1, 0), b1);
	cr_assert(WIFEXITED(st0) && WEXITSTATUS(st0) == 0, "graph 0 bench next to graph 1 failed");
	cr_assert(WIFEXITED(st1) && WEXITSTATUS(st1) == 0, "graph 1 bench next to graph 0 failed");
	for (unsigned g = 0; g < 2; g++) {
		struct dm_vecs got;
		char p[256], err[512];
		const int32_t *want = g ? want1 : want0;
		uint32_t nq = g ? nq1 : nq0;
		unsigned diff = 0;

		snprintf(p, sizeof(p), "%s/ids-c%u.ibin", dir, g);
		cr_assert_eq(dm_vecs_read(p, DM_VF_IBIN, &got, err, sizeof(err)), 0, "%s", err);
		for (uint64_t i = 0; i < got.n * K; i++)
			diff += ((int32_t *)got.data)[i] != want[(i / K) % nq * K + i % K];
		cr_assert_eq(diff, 0, "graph %u run next to the other: %u of %llu ids differ", g,
			     diff, (unsigned long long)got.n * K);
		dm_vecs_free(&got);
	}
	/* dropped: its queries fail clearly, graph 0 serves on; loaded again: served again */
	cr_assert_eq(sh("%s graph drop --config %s/lc/cluster.ini --graph 1 >/dev/null", dmann,
			dir), 0);
	for (int attempt = 0;; attempt++) {
		if (sh("%s bench --config %s/lc/cluster.ini --query %s/query.fbin --gt %s/gt.ibin "
		       "--k %d --ef %d --cache-ratio keep --graph 1 --nq 20 >%s/g1.log 2>&1", dmann,
		       dir, d1, d1, K, EF, dir) != 0)
			break;
		cr_assert_lt(attempt, 20, "graph 1 still served 10 s after its drop");
		usleep(500000);
	}
	cr_assert_eq(sh("grep -q 'no HNSW index is loaded as graph 1' %s/g1.log", dir), 0, "unclear error for a "
		     "dropped graph");
	bench_graph(0, d0, want0, nq0, "g0-after-drop");
	cr_assert_eq(sh("%s load --config %s/lc/cluster.ini --index %s --graph 1 >/dev/null",
			dmann, dir, idx1), 0);
	bench_graph(1, d1, want1, nq1, "g1-again");
	free(want0);
	free(want1);
}
