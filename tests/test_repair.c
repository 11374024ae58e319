/* test_repair.c: re-replication (cn/engine/cn_repair.c) on a local cluster of 3 memory and 2
 * compute nodes, redundancy 2, with its etcd: a memory node SIGKILLed for good in the middle
 * of a query stream is declared down, retired after replace_after_s, and its blocks are
 * copied from the surviving replicas to the next nodes in placement order while the stream
 * goes on (no query fails, every answer is the local search's). Then a second memory node is
 * killed: with 2 of 3 nodes gone, queries still succeed with the same answers, which they
 * could not if the first node's blocks had not been copied (each block was on 2 of the 3).
 * The same image is also placed as graph 3 (which no compute node serves): its blocks are
 * copied too, so `dmann graph check --graph 3` reads every record from the one node left. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster_util.h"
#include "config.h"
#include "cstate.h"

#define K 10
#define EF 48
#define STREAM 40000
#define TTL 3
#define REPLACE 4

static char dir[128], lc[160], dmann[300];
static struct dm_cluster_cfg cfg;

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");
	char err[512], path[256];

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-repair-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(lc, sizeof(lc), "%s/lc", dir);
	cr_assert_eq(sh("%s gen --kind sift --n 20000 --nq 200 --seed 3 --out %s/data >/dev/null",
			dmann, dir), 0);
	cr_assert_eq(sh("%s build --base %s/data/base.fbin --metric l2 --M 12 --efc 80 --threads 1 "
			"--block-shift 8 --out %s/idx.hnsw >/dev/null", dmann, dir, dir), 0);
	cr_assert_eq(sh("%s local up --mn 3 --cn 2 --redundancy 2 --dir %s --region-mb 64 "
			"--member-lease %d", dmann, lc, TTL), 0);
	snprintf(path, sizeof(path), "%s/cluster.ini", lc);
	cr_assert_eq(sh("sed -i 's/^member_lease_s = .*/&\\nreplace_after_s = %d/' %s", REPLACE,
			path), 0);
	cr_assert_eq(dm_config_load(path, &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(cfg.replace_after_s, REPLACE);
	/* The compute nodes read the setting at start. */
	cr_assert_eq(sh("for c in cn0 cn1; do %s local stop --dir %s $c && %s local start --dir %s "
			"$c || exit 1; done", dmann, lc, dmann, lc), 0);
	cr_assert_eq(sh("%s load --config %s --index %s/idx.hnsw", dmann, path, dir), 0);
	cr_assert_eq(sh("%s load --config %s --index %s/idx.hnsw --graph 3", dmann, path, dir), 0);
}

static void teardown(void)
{
	sh("%s local down --dir %s", dmann, lc);
	if (!getenv("DMANN_KEEP_TEST_DIR"))
		sh("rm -rf %s", dir);
}

TestSuite(repair, .init = setup, .fini = teardown, .timeout = 600);



static long long queries(void)
{
	return cluster_metric(lc, 0, "dmann_cn_queries_total") +
	       cluster_metric(lc, 1, "dmann_cn_queries_total");
}

static pid_t bench_start(int nq, const char *ids, const char *log)
{
	pid_t b = fork();
	char cmd[2048];

	cr_assert_geq(b, 0);
	if (b)
		return b;
	snprintf(cmd, sizeof(cmd), "exec %s bench --config %s/cluster.ini --query %s/data/query.fbin "
		 "--gt %s/data/gt.ibin --k %d --ef %d --cache-ratio 0 --nq %d --out %s >%s 2>&1",
		 dmann, lc, dir, dir, K, EF, nq, ids, log);
	execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
	_exit(127);
}

static int bench_wait(pid_t b, unsigned limit_s, const char *log)
{
	uint64_t t0 = dm_now_ns();
	char buf[4096] = "";
	FILE *f;
	int st;

	while (waitpid(b, &st, WNOHANG) != b) {
		cr_assert_lt(dm_now_ns() - t0, bound_s(limit_s), "bench hangs");
		usleep(50000);
	}
	f = fopen(log, "r");
	if (f) {
		buf[fread(buf, 1, sizeof(buf) - 1, f)] = '\0';
		fclose(f);
	}
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "queries failed: %s", buf);
	return 0;
}

/* Wait up to ms until the placement retires mn m: the ms it took, or -1. */
static long wait_retired(uint32_t m, long ms)
{
	for (long t = 0; t <= ms; t += 100) {
		struct dm_placement p;
		char err[256];

		if (dm_placement_read(cfg.etcd, cfg.name, 2000, &p, err, sizeof(err)) == 0 &&
		    dm_upset_has(p.retired, m))
			return t;
		usleep(100000);
	}
	return -1;
}

Test(repair, a_lost_memory_node_is_replaced_under_queries)
{
	char idx[256], q[256], ids[256], log[256];
	uint32_t nq;
	int32_t *want;
	long long q0, copies;
	uint64_t t0;
	long t;
	unsigned diff;
	pid_t b;

	snprintf(idx, sizeof(idx), "%s/idx.hnsw", dir);
	snprintf(q, sizeof(q), "%s/data/query.fbin", dir);
	want = local_search_ids_b(idx, q, K, EF, 1, true, &nq);
	snprintf(ids, sizeof(ids), "%s/ids1.ibin", dir);
	snprintf(log, sizeof(log), "%s/bench1.log", dir);
	q0 = queries();
	b = bench_start(STREAM, ids, log);
	t0 = dm_now_ns();
	while (queries() - q0 < STREAM / 8) {
		cr_assert_lt(dm_now_ns() - t0, bound_s(120), "the stream does not start");
		usleep(20000);
	}
	t0 = dm_now_ns();
	cr_assert_eq(sh("%s local kill --dir %s mn1", dmann, lc), 0);
	t = wait_retired(1, (TTL + REPLACE + 60) * 1000);
	cr_assert_geq(t, 0, "mn1 was never retired");
	t = (long)((dm_now_ns() - t0) / 1000000);
	bench_wait(b, 600, log);
	diff = cluster_compare_ids(ids, want, nq, STREAM, K);
	copies = cluster_metric(lc, 0, "dmann_cn_repair_copies_total") +
		 cluster_metric(lc, 1, "dmann_cn_repair_copies_total");
	fprintf(stderr, "FIGURES mn1 SIGKILLed for good mid-stream: retired and its blocks copied "
		"%ld ms after the kill (lease %d s, replace_after_s %d), %lld block copies; %d "
		"queries, 0 failed, ids differing %u\n", t, TTL, REPLACE, copies, STREAM, diff);
	cr_assert_eq(diff, 0, "%u ids differ from the local search", diff);
	cr_assert_gt(copies, 0, "no block was copied");
	cr_assert_eq(cluster_metric(lc, 0, "dmann_cn_repair_pending") +
		     cluster_metric(lc, 1, "dmann_cn_repair_pending"), 0);
	for (unsigned c = 0; c < 2; c++) {
		for (int i = 0; i < 100 && cluster_metric(lc, c, "dmann_cn_placement_version") < 1; i++)
			usleep(100000);
		cr_assert_geq(cluster_metric(lc, c, "dmann_cn_placement_version"), 1,
			      "cn%u ignores the placement", c);
	}
	cr_assert_eq(sh("%s status --config %s/cluster.ini | grep -q 'retired: mn1'", dmann, lc), 0);

	/* A second memory node lost: every block still has a live copy (mn0). */
	cr_assert_eq(sh("%s local kill --dir %s mn2", dmann, lc), 0);
	snprintf(ids, sizeof(ids), "%s/ids2.ibin", dir);
	snprintf(log, sizeof(log), "%s/bench2.log", dir);
	b = bench_start(4000, ids, log);
	bench_wait(b, 300, log);
	cr_assert_eq(cluster_compare_ids(ids, want, nq, 4000, K), 0);
	/* Graph 3's blocks were copied as well: every record is read from mn0 alone. */
	cr_assert_eq(sh("%s graph check --config %s/cluster.ini --graph 3 --json | grep -q "
			"'\"graph\":3,.*\"whole\":20000,\"torn\":0,\"empty\":0,'", dmann, lc), 0,
		     "graph 3 is not whole on the node left");
	free(want);
}

/* ---- a memory node joins: about 1/n of the block replicas move to it ---- */

#define JOIN_BLOCKS 2048
#define JOIN_STREAM 20000

static void setup_join(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");
	char err[512], path[256];
	struct dm_placement p;
	long t;

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-join-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(lc, sizeof(lc), "%s/lc", dir);
	/* 131,072 rows in blocks of 64: 2,048 blocks */
	cr_assert_eq(sh("%s gen --kind deep --n %d --nq 200 --seed 5 --out %s/data >/dev/null",
			dmann, JOIN_BLOCKS * 64, dir), 0);
	cr_assert_eq(sh("%s build --base %s/data/base.fbin --metric l2 --M 8 --efc 60 --threads 2 "
			"--block-shift 6 --out %s/idx.hnsw >/dev/null", dmann, dir, dir), 0);
	cr_assert_eq(sh("%s local up --mn 4 --cn 2 --redundancy 2 --dir %s --region-mb 192 "
			"--member-lease %d", dmann, lc, TTL), 0);
	snprintf(path, sizeof(path), "%s/cluster.ini", lc);
	cr_assert_eq(sh("sed -i 's/^member_lease_s = .*/&\\nreplace_after_s = 1/' %s", path), 0);
	cr_assert_eq(dm_config_load(path, &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(sh("for c in cn0 cn1; do %s local stop --dir %s $c && %s local start --dir %s "
			"$c || exit 1; done", dmann, lc, dmann, lc), 0);
	/* mn3 is not there yet: the cluster retires it, then the index is loaded on 3 nodes. */
	cr_assert_eq(sh("%s local kill --dir %s mn3", dmann, lc), 0);
	t = wait_retired(3, (TTL + 15) * 1000);
	cr_assert_geq(t, 0, "mn3 was never retired");
	cr_assert_eq(dm_placement_read(cfg.etcd, cfg.name, 2000, &p, err, sizeof(err)), 0);
	cr_assert_eq(sh("%s load --config %s --index %s/idx.hnsw", dmann, path, dir), 0);
}

TestSuite(join, .init = setup_join, .fini = teardown, .timeout = 600);

Test(join, a_memory_node_joins_and_gets_its_share)
{
	char idx[256], q[256], ids[256], log[256];
	long long b0, rb, ib;
	uint32_t nq;
	int32_t *want;
	double frac;
	long t;
	pid_t b;

	snprintf(idx, sizeof(idx), "%s/idx.hnsw", dir);
	snprintf(q, sizeof(q), "%s/data/query.fbin", dir);
	want = local_search_ids_b(idx, q, K, EF, 1, true, &nq);
	for (int i = 0; i < 100 && cluster_metric(lc, 0, "dmann_cn_index_bytes") <= 0; i++)
		usleep(100000);
	ib = cluster_metric(lc, 0, "dmann_cn_index_bytes");
	cr_assert_gt(ib, 0, "cn0 serves no index");
	b0 = cluster_metric(lc, 0, "dmann_cn_repair_bytes_total") +
	     cluster_metric(lc, 1, "dmann_cn_repair_bytes_total");
	snprintf(ids, sizeof(ids), "%s/ids-join.ibin", dir);
	snprintf(log, sizeof(log), "%s/bench-join.log", dir);
	b = bench_start(JOIN_STREAM, ids, log);
	sleep(1);
	cr_assert_eq(sh("%s local start --dir %s mn3", dmann, lc), 0);
	/* Back in the placement once its share is copied. */
	for (t = 0; t < 60000; t += 100) {
		struct dm_placement p;
		char err[256];

		if (dm_placement_read(cfg.etcd, cfg.name, 2000, &p, err, sizeof(err)) == 0 &&
		    !dm_upset_has(p.retired, 3))
			break;
		usleep(100000);
	}
	cr_assert_lt(t, 60000, "mn3 never joined");
	bench_wait(b, 600, log);
	rb = cluster_metric(lc, 0, "dmann_cn_repair_bytes_total") +
	     cluster_metric(lc, 1, "dmann_cn_repair_bytes_total") - b0;
	frac = (double)rb / (2.0 * (double)ib);
	fprintf(stderr, "FIGURES mn3 joins an index of %d blocks (R=2, %lld bytes of records): "
		"%lld bytes copied = %.4f of the block replicas' bytes (1/4 = 0.25; bound 0.275); "
		"joined %ld ms after its start; %d queries meanwhile, 0 failed\n", JOIN_BLOCKS, ib,
		rb, frac, t, JOIN_STREAM);
	cr_assert_leq(frac, 1.1 / 4, "a join moved %.4f of the data", frac);
	cr_assert_geq(frac, 0.5 / 4, "a join moved only %.4f of the data", frac);
	cr_assert_eq(cluster_compare_ids(ids, want, nq, JOIN_STREAM, K), 0);
	/* mn3 holds its share now (its objects: blocks + the metadata). */
	{
		char st[300], line[1024];
		unsigned long objs = 0;
		FILE *f;

		snprintf(st, sizeof(st), "%s/status.txt", dir);
		cr_assert_eq(sh("%s status --config %s/cluster.ini >%s", dmann, lc, st), 0,
			     "dmann status reports a problem");
		f = fopen(st, "r");
		cr_assert_not_null(f);
		while (fgets(line, sizeof(line), f)) {
			char *o = strstr(line, " objects");

			if (!strncmp(line, "  mn3 ", 6) && o) {
				while (o > line && o[-1] >= '0' && o[-1] <= '9')
					o--;
				objs = strtoul(o, NULL, 10);
			}
		}
		fclose(f);
		fprintf(stderr, "FIGURES mn3 holds %lu objects after the join\n", objs);
		cr_assert_geq(objs, JOIN_BLOCKS * 2 / 4 / 2, "mn3 holds %lu objects", objs);
		cr_assert_eq(sh("grep -q 'retired: $' %s", st), 0, "the placement still retires a "
			     "node");
	}
	free(want);
}
