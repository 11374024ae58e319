/* test_reload.c: index generations and compute-node settings from the cluster file, on a
 * local cluster (2 memory + 2 compute nodes, tcp, loopback):
 *   - the compute nodes size their cache from [cn] cache alone (no Q_CONFIG from dmann
 *     bench: --cache-ratio keep) once `dmann load` ran, and answer like the local search;
 *   - `dmann load` of a different index B while a query stream runs on index A: every
 *     answer is the local search's answer on A or on B, none fails, and the stream ends on
 *     B; with the cache off and with [cn] cache = 10% (stale cache entries would mix
 *     generations);
 *   - a compute node whose transport send queue is smaller than the READs it wants in
 *     flight ([cn] send_queue = 128) retries the refused posts (-EAGAIN) instead of failing
 *     queries;
 *   - several graphs: B loaded as graph 3 beside A, listed, checked, dropped, loaded again,
 *     while graph 0 answers like A. */
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
#define NB 6000

static char dir[128], dmann[300];

/* Two different indexes over the same kind of data (A: seed 3, B: seed 5); queries of A. */
static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-reload-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	for (int i = 0; i < 2; i++) {
		char n = "ab"[i];

		cr_assert_eq(sh("%s gen --kind sift --n %d --nq 200 --seed %d --out %s/%c >/dev/null",
				dmann, NB, i ? 5 : 3, dir, n), 0);
		cr_assert_eq(sh("%s build --base %s/%c/base.fbin --metric l2 --M 12 --efc 80 "
				"--threads 1 --block-shift 10 --out %s/%c.hnsw >/dev/null", dmann, dir, n,
				dir, n), 0);
	}
}

static void teardown(void)
{
	sh("%s local down --dir %s/lc", dmann, dir);
	if (getenv("DMANN_KEEP_TEST_DIR"))
		return;
	sh("rm -rf %s", dir);
}

TestSuite(reload, .init = setup, .fini = teardown, .timeout = 900);

static void cluster_up(const char *cn_settings)
{
	cr_assert_eq(sh("%s local up --mn 2 --cn 2 --dir %s/lc --region-mb 32 %s", dmann, dir,
			cn_settings), 0);
}

/* The local search's ids on image c ('a' or 'b') for the queries of A. */
static int32_t *local_ids(char c, uint32_t *nq)
{
	char idx[256], q[256];

	snprintf(idx, sizeof(idx), "%s/%c.hnsw", dir, c);
	snprintf(q, sizeof(q), "%s/a/query.fbin", dir);
	return local_search_ids(idx, q, K, EF, nq);
}

/* Sum of a Prometheus sample over both compute nodes (their `metrics` addresses). */
static double cn_metric(const char *name)
{
	char p[256], line[256], addr[64], cmd[512];
	double sum = 0;
	bool in_cn = false;
	FILE *f, *m;

	snprintf(p, sizeof(p), "%s/lc/cluster.ini", dir);
	f = fopen(p, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f)) {
		if (line[0] == '[')
			in_cn = !strncmp(line, "[cn.", 4);
		if (!in_cn || sscanf(line, "metrics = %63s", addr) != 1)
			continue;
		snprintf(cmd, sizeof(cmd), "curl -s --max-time 10 http://%s/metrics", addr);
		m = popen(cmd, "r");
		cr_assert_not_null(m);
		while (fgets(line, sizeof(line), m)) {
			double v;
			size_t n = strlen(name);

			if (!strncmp(line, name, n) && line[n] == '{' &&
			    sscanf(strchr(line, '}') + 1, "%lf", &v) == 1)
				sum += v;
		}
		pclose(m);
	}
	fclose(f);
	return sum;
}

/* Wait until every compute node has an index view of generation gen (its periodic
 * refresh; nothing here asks it to). */
static void wait_generation(unsigned gen)
{
	uint64_t t0 = dm_now_ns();

	while (cn_metric("dmann_cn_index_generation") != 2.0 * gen) {
		cr_assert_lt(dm_now_ns() - t0, bound_s(30), "compute nodes did not pick up "
			     "generation %u", gen);
		usleep(100000);
	}
}

static struct dm_vecs read_ids(const char *name)
{
	struct dm_vecs got;
	char p[256], err[512];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	cr_assert_eq(dm_vecs_read(p, DM_VF_IBIN, &got, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(got.dim, K);
	return got;
}

static bool row_eq(const int32_t *a, const int32_t *b)
{
	return !memcmp(a, b, K * sizeof(*a));
}

Test(reload, cache_size_from_the_cluster_file)
{
	uint32_t nq;
	int32_t *want = local_ids('a', &nq);
	struct dm_vecs got;
	unsigned diff = 0;
	double cap, index_bytes;

	cluster_up("--cn-set cache=10% --cn-set cache_admit=0.5 --cn-set refresh_ms=200");
	cr_assert_eq(sh("%s load --config %s/lc/cluster.ini --index %s/a.hnsw", dmann, dir, dir), 0);
	wait_generation(1);
	/* No Q_CONFIG: the cache is the cluster file's. */
	cr_assert_eq(sh("%s bench --config %s/lc/cluster.ini --query %s/a/query.fbin --gt "
			"%s/a/gt.ibin --k %d --ef %d --cache-ratio keep --out %s/ids.ibin --json "
			">%s/bench.json", dmann, dir, dir, dir, K, EF, dir, dir), 0);
	got = read_ids("ids.ibin");
	cr_assert_eq(got.n, nq);
	for (uint64_t i = 0; i < (uint64_t)nq * K; i++)
		diff += ((int32_t *)got.data)[i] != want[i];
	cr_assert_eq(diff, 0, "%u of %u ids differ from the local search", diff, nq * K);
	dm_vecs_free(&got);
	cap = cn_metric("dmann_cn_cache_capacity_bytes");
	index_bytes = cn_metric("dmann_cn_index_bytes");
	fprintf(stderr, "cache capacity %.0f of index %.0f bytes (both CNs), hits %.0f\n", cap,
		index_bytes, cn_metric("dmann_cn_cache_hits_total"));
	/* 10% of the index, rounded down to whole records per cache shard. */
	cr_assert(cap > 0.09 * index_bytes && cap <= 0.1 * index_bytes + 1,
		  "cache capacity %.0f is not 10%% of %.0f", cap, index_bytes);
	cr_assert_gt(cn_metric("dmann_cn_cache_hits_total"), 0);
	cr_assert_eq(sh("%s status --config %s/lc/cluster.ini --json | grep -q "
			"'\"cache_capacity\": [1-9]'", dmann, dir), 0);
	free(want);
}

/* Load A, stream queries through both compute nodes, load B in the middle of it. */
static void reload_under_queries(const char *cn_settings)
{
	uint32_t nq, nb;
	int32_t *a = local_ids('a', &nq), *b = local_ids('b', &nb);
	const uint64_t stream = 24000;
	uint64_t n_a = 0, n_b = 0, failed = 0, other = 0, tail_a = 0, t0;
	struct dm_vecs got;
	char cmd[2048];
	pid_t bench;
	int st;

	uint32_t same = 0;

	cr_assert_eq(nq, nb);
	for (uint32_t q = 0; q < nq; q++)
		same += row_eq(a + (size_t)q * K, b + (size_t)q * K);
	cr_assert_eq(same, 0, "indexes A and B answer %u queries alike: the test could not tell "
		     "them apart", same);
	cluster_up(cn_settings);
	cr_assert_eq(sh("%s load --config %s/lc/cluster.ini --index %s/a.hnsw", dmann, dir, dir), 0);
	wait_generation(1);
	bench = fork();
	cr_assert_geq(bench, 0);
	if (bench == 0) {
		snprintf(cmd, sizeof(cmd), "exec %s bench --config %s/lc/cluster.ini --query "
			 "%s/a/query.fbin --gt %s/a/gt.ibin --k %d --ef %d --cache-ratio keep --nq %llu "
			 "--out %s/stream.ibin >%s/stream.log 2>&1", dmann, dir, dir, dir, K, EF,
			 (unsigned long long)stream, dir, dir);
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	/* Once the stream runs: B replaces A (the load waits until A is released). */
	t0 = dm_now_ns();
	while (cn_metric("dmann_cn_queries_total") < 1000) {
		cr_assert_lt(dm_now_ns() - t0, bound_s(60), "the query stream does not start");
		cr_assert_eq(waitpid(bench, &st, WNOHANG), 0, "the stream ended before the reload");
		usleep(50000);
	}
	cr_assert_eq(sh("%s load --config %s/lc/cluster.ini --index %s/b.hnsw", dmann, dir, dir), 0);
	cr_assert_eq(waitpid(bench, &st, WNOHANG), 0,
		     "the stream ended before the reload finished: make it longer");
	t0 = dm_now_ns();
	for (;;) {
		if (waitpid(bench, &st, WNOHANG) == bench)
			break;
		cr_assert_lt(dm_now_ns() - t0, bound_s(600), "the stream hangs");
		usleep(100000);
	}
	sh("cat %s/stream.log >&2", dir);
	got = read_ids("stream.ibin");
	cr_assert_eq(got.n, stream);
	for (uint64_t p = 0; p < stream; p++) {
		const int32_t *row = (const int32_t *)got.data + p * K;
		uint32_t q = (uint32_t)(p % nq);

		if (row[0] == -1)
			failed++;
		else if (row_eq(row, a + (size_t)q * K))
			n_a++, tail_a += p >= stream - 2000;
		else if (row_eq(row, b + (size_t)q * K))
			n_b++;
		else
			other++;
	}
	fprintf(stderr, "reload (%s): %llu queries, %llu answers of A, %llu of B, %llu failed, "
		"%llu neither; generation switches %.0f, READ posts refused %.0f\n", cn_settings,
		(unsigned long long)stream, (unsigned long long)n_a, (unsigned long long)n_b,
		(unsigned long long)failed, (unsigned long long)other,
		cn_metric("dmann_cn_generation_switches_total"),
		cn_metric("dmann_cn_read_queue_full_total"));
	cr_assert_eq(other, 0, "%llu answers are neither A's nor B's", (unsigned long long)other);
	cr_assert_eq(failed, 0, "%llu queries failed", (unsigned long long)failed);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "bench failed (status %d)", st);
	cr_assert_gt(n_a, 0);
	cr_assert_gt(n_b, 0);
	cr_assert_eq(tail_a, 0, "answers from A after the reload had finished");
	cr_assert_eq(cn_metric("dmann_cn_generation_switches_total"), 2);
	cr_assert_eq(cn_metric("dmann_cn_retired_views"), 0);
	dm_vecs_free(&got);
	free(a);
	free(b);
}

Test(reload, different_index_under_a_query_stream)
{
	reload_under_queries("--cn-set refresh_ms=200");
}

Test(reload, different_index_under_a_query_stream_cached)
{
	reload_under_queries("--cn-set refresh_ms=200 --cn-set cache=10%");
}

/* 128 work requests per connection, while a worker keeps up to 200 READs in flight per
 * memory node: posts are refused with -EAGAIN and must be retried, not fail queries. The
 * image is A built without neighbour codes (layout v2, --codes none): an expansion then READs
 * every unvisited neighbour in one batch, which is what fills the queue (with codes a query
 * has one READ in flight per expansion). */
Test(reload, full_send_queue_is_back_pressure)
{
	uint32_t nq;
	int32_t *want;
	struct dm_vecs got;
	unsigned diff = 0;

	cr_assert_eq(sh("%s build --base %s/a/base.fbin --metric l2 --M 12 --efc 80 --threads 1 "
			"--block-shift 10 --codes none --out %s/n.hnsw >/dev/null", dmann, dir, dir),
		     0);
	want = local_ids('n', &nq);
	cluster_up("--cn-set send_queue=128");
	cr_assert_eq(sh("%s load --config %s/lc/cluster.ini --index %s/n.hnsw", dmann, dir, dir), 0);
	cr_assert_eq(sh("%s bench --config %s/lc/cluster.ini --query %s/a/query.fbin --gt "
			"%s/a/gt.ibin --k %d --ef %d --cache-ratio 0 --conns 1 --depth 32 --nq %u "
			"--out %s/ids.ibin", dmann, dir, dir, dir, K, EF, nq * 5, dir), 0,
		     "queries failed with a full send queue");
	got = read_ids("ids.ibin");
	for (uint64_t p = 0; p < got.n; p++)
		diff += !row_eq((const int32_t *)got.data + p * K, want + (p % nq) * K);
	fprintf(stderr, "send_queue 128: READ posts refused and retried: %.0f\n",
		cn_metric("dmann_cn_read_queue_full_total"));
	cr_assert_eq(diff, 0, "%u answers differ from the local search", diff);
	cr_assert_gt(cn_metric("dmann_cn_read_queue_full_total"), 0,
		     "the send queue never filled: the test does not test back-pressure");
	/* The router still samples the index with batches that fit the queue. */
	cr_assert_eq(sh("grep -q 'cannot build the oracle' %s/lc/cn*.log", dir), 1,
		     "the router's oracle failed with this send queue");
	dm_vecs_free(&got);
	free(want);
}

/* Several graphs: B placed as graph 3 beside A (graph 0) while the compute nodes serve A;
 * `dmann graph list` shows both; `dmann graph drop --graph 3` removes it from every memory
 * node (no compute node reads graph 3: released at once, the objects freed) and a new load
 * of graph 3 starts again at generation 1; queries on graph 0 answer like A throughout; bad
 * graph numbers are refused. */
Test(reload, graphs_side_by_side)
{
	const char *ini;
	char cfg[256];
	uint32_t nq;
	int32_t *want = local_ids('a', &nq);
	struct dm_vecs got;
	unsigned diff = 0;

	snprintf(cfg, sizeof(cfg), "%s/lc/cluster.ini", dir);
	ini = cfg;
	cluster_up("--cn-set refresh_ms=200");
	cr_assert_eq(sh("%s load --config %s --index %s/a.hnsw", dmann, ini, dir), 0);
	wait_generation(1);
	cr_assert_eq(sh("%s load --config %s --index %s/b.hnsw --graph 3 > %s/load3.txt", dmann,
			ini, dir, dir), 0);
	cr_assert_eq(sh("grep -q 'graph 3, generation 1:' %s/load3.txt", dir), 0);
	cr_assert_eq(sh("%s graph list --config %s > %s/list.txt", dmann, ini, dir), 0);
	cr_assert_eq(sh("grep -Eq '^0 +1 +%d +128 +12 +%d' %s/list.txt", NB, NB, dir), 0);
	cr_assert_eq(sh("grep -Eq '^3 +1 +%d +128 +12 +%d' %s/list.txt", NB, NB, dir), 0);
	cr_assert_eq(sh("%s graph check --config %s --graph 3 --json | grep -q "
			"'\"graph\":3,\"generation\":1,.*\"unreachable\":0,'", dmann, ini), 0);
	cr_assert_eq(sh("%s graph check --config %s --graph 3 --json --anchors | grep -Eq "
			"'\"far_in_links\":\\[[0-9]+,[0-9]+,[0-9]+\\]}$'", dmann, ini), 0);
	cr_assert_eq(sh("%s graph check --config %s --graph 3 --anchors | grep -q "
			"'nearest in-link is over 1.5x'", dmann, ini), 0);
	/* Bad numbers and combinations: usage errors (2). */
	cr_assert_eq(sh("%s load --config %s --index %s/b.hnsw --graph 16", dmann, ini, dir), 2);
	cr_assert_eq(sh("%s load --config %s --index %s/b.hnsw --graph x", dmann, ini, dir), 2);
	cr_assert_eq(sh("%s graph drop --config %s", dmann, ini), 2, "which graph?");
	cr_assert_eq(sh("%s graph drop --config %s --graph 5", dmann, ini), 1, "not loaded");
	/* Drop graph 3: gone from the list, its objects freed (graph 0's stay). */
	cr_assert_eq(sh("%s graph drop --config %s --graph 3", dmann, ini), 0);
	uint64_t t0 = dm_now_ns();

	while (sh("%s graph list --config %s | grep -Eq '^3 '", dmann, ini) == 0) {
		cr_assert_lt(dm_now_ns() - t0, bound_s(30), "graph 3 was not released");
		usleep(200000);
	}
	cr_assert_eq(sh("%s graph list --config %s | grep -Eq '^0 +1 '", dmann, ini), 0);
	cr_assert_eq(sh("%s graph check --config %s --graph 3", dmann, ini), 1);
	/* Loaded again: generation 1 again, under the same keys as the dropped one. */
	cr_assert_eq(sh("%s load --config %s --index %s/b.hnsw --graph 3 > %s/load3.txt", dmann,
			ini, dir, dir), 0);
	cr_assert_eq(sh("grep -q 'graph 3, generation 1:' %s/load3.txt", dir), 0);
	cr_assert_eq(sh("%s graph check --config %s --graph 3 --json | grep -q "
			"'\"generation\":1,.*\"torn\":0,.*\"unreachable\":0,'", dmann, ini), 0);
	/* Graph 0 still answers like A. */
	cr_assert_eq(sh("%s bench --config %s --query %s/a/query.fbin --gt %s/a/gt.ibin --k %d "
			"--ef %d --cache-ratio keep --conns 1 --depth 8 --nq %u --out %s/ids.ibin",
			dmann, ini, dir, dir, K, EF, nq, dir), 0);
	got = read_ids("ids.ibin");
	for (uint64_t p = 0; p < got.n; p++)
		diff += !row_eq((const int32_t *)got.data + p * K, want + (p % nq) * K);
	cr_assert_eq(diff, 0, "%u answers of graph 0 differ from the local search on A", diff);
	dm_vecs_free(&got);
	free(want);
}
