/* test_chaos.c: writes and queries through libdmann and the AWS SDK while memory nodes are
 * SIGKILLed and restarted and a compute node is SIGKILLed once (issue 14's chaos test).
 *
 * A local cluster of 3 memory and 2 compute nodes, redundancy 2, with its etcd; each S3
 * index gets a graph once it holds 500 rows ([s3] graph_auto) and the online indexers
 * move later rows into it. Once the graph is there, for DMANN_CHAOS_SECONDS (120):
 *   - a writer puts batches of 25 vectors (keys unique, about 25 a second), remembering
 *     what was acknowledged;
 *   - a reader queries (k 10, about 20 a second) with an acknowledged vector plus noise,
 *     against a brute force over the vectors acknowledged before the query started:
 *     recall@10 per 10-second window; every failed query is counted;
 *   - the AWS SDK for JavaScript (tests/s3sdk/chaos_sdk.js, run with node) puts and
 *     queries, in its own index of the same bucket, through both gateways (an operation
 *     whose attempt fails goes to the other gateway) and checks its rules at the end
 *     (every operation answered, no attempt over 10 s, attempts failed only on cn1 around
 *     its kill, at least one request in flight on cn1 when it died); its acknowledged rows
 *     are checked here with the others;
 *   - every 10-20 s a memory node is SIGKILLed, and started again 3-5 s later, but only while
 *     no replica is marked stale and every node is up (R caught-up copies of everything:
 *     dmann status' stale list is empty, both compute nodes read from every memory node);
 *     at half time compute node cn1 is SIGKILLed (once its indexer takes insert locks; it
 *     is frozen with SIGSTOP for 0.5 s just before, so that the SDK requests kept on it are
 *     in flight when it dies) and started again.
 * At the end: every replica caught up within 60 s of the last kill; the indexers drain the
 * tail (waited for up to 240 s, reported); every acknowledged vector (libdmann's and the
 * SDK's) is read back exactly and found first by its own vector (0 lost); 0 failed
 * libdmann queries; recall@10 >= 0.95 in every window; the SDK driver's
 * rules hold. Without node or the SDK's npm modules (ninja s3sdk-deps) the test fails. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster_util.h"
#include "dmann.h"

#define D 32
#define BATCH 25
#define MAXV 400000
#define K 10
#define WINDOWS 64
#define BUCKET "chaos"
#define INDEX "live"
#define SDK_INDEX "sdk"      /* the SDK driver's index (its rows are not in the brute force) */

static char dir[128], lc[160], dmann[300], cfgpath[256];
static unsigned seconds = 120;

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT"), *secs = getenv("DMANN_CHAOS_SECONDS");

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	if (secs && atoi(secs) >= 20)
		seconds = (unsigned)atoi(secs);
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-chaos-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(lc, sizeof(lc), "%s/lc", dir);
	/* a graph for an index from 500 rows on, looked at often */
	setenv("DMANN_S3_GRAPH_MIN_ROWS", "500", 1);
	setenv("DMANN_S3_INDEX_INTERVAL_MS", "500", 1);
	setenv("DMANN_S3_GRAPH_ROOM", "200000", 1);
	cr_assert_eq(sh("%s local up --mn 3 --cn 2 --redundancy 2 --dir %s --region-mb 256 "
			"--member-lease 3", dmann, lc), 0);
	snprintf(cfgpath, sizeof(cfgpath), "%s/cluster.ini", lc);
}

static pid_t sdk_pid;    /* the SDK driver while it runs */

static void teardown(void)
{
	if (sdk_pid > 0) {
		kill(sdk_pid, SIGKILL);
		waitpid(sdk_pid, NULL, 0);
	}
	sh("%s local down --dir %s", dmann, lc);
	if (!getenv("DMANN_KEEP_TEST_DIR"))
		sh("rm -rf %s", dir);
}

TestSuite(chaos, .init = setup, .fini = teardown, .timeout = 900);

static float val(uint64_t key, uint32_t j)
{
	uint64_t s = key * 0x9e3779b97f4a7c15ull + j * 0xbf58476d1ce4e5b9ull;

	s ^= s >> 31;
	s *= 0x94d049bb133111ebull;
	s ^= s >> 29;
	return (float)(s >> 40) / 16777216.0f - 0.5f;
}

static void key_of(uint64_t k, char *out)
{
	snprintf(out, 16, "v%08llu", (unsigned long long)k);
}

static float *vecs;                 /* MAXV x D: vector of key k */
static atomic_uint acked;           /* vectors [0, acked) are acknowledged */
static atomic_bool stop;
static atomic_uint put_fails, q_fails, queries;
static uint64_t t_start;
struct window { atomic_uint n; _Atomic double sum; };
static struct window win[WINDOWS];

static void *writer(void *arg)
{
	dmann_t *d = dmann_connect(cfgpath, "local");
	char *keys[BATCH];
	unsigned next = 0;

	(void)arg;
	if (!d)
		return NULL;
	for (int i = 0; i < BATCH; i++)
		keys[i] = malloc(16);
	while (!atomic_load(&stop) && next + BATCH <= MAXV) {
		for (int i = 0; i < BATCH; i++)
			key_of(next + i, keys[i]);
		if (dmann_put(d, BUCKET, INDEX, BATCH, (const char *const *)keys,
			      vecs + (size_t)next * D, D, NULL)) {
			atomic_fetch_add(&put_fails, 1);
			fprintf(stderr, "chaos: put of %u..%u failed: %s\n", next, next + BATCH - 1,
				dmann_errmsg());
			usleep(100000);
			continue;     /* the same keys again: a retry is an overwrite */
		}
		next += BATCH;
		atomic_store(&acked, next);
		usleep(1000000);  /* about 25 rows/s: a live index that two compute nodes of a
				   * loaded 2-core machine index as it grows (the queries' tails
				   * stay short), and a self-find of every row at the end that
				   * fits CI (QueryVectors answer about 20 a second there) */
	}
	for (int i = 0; i < BATCH; i++)
		free(keys[i]);
	dmann_close(d);
	return NULL;
}

static void *reader(void *arg)
{
	dmann_t *d = dmann_connect(cfgpath, "local");
	float q[D], dist[K];
	char *got[K];
	uint64_t rng = 88172645463325252ull;

	(void)arg;
	if (!d)
		return NULL;
	while (!atomic_load(&stop)) {
		unsigned n = atomic_load(&acked), src;
		int r;

		if (n < 100) {
			usleep(50000);
			continue;
		}
		rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
		src = (unsigned)(rng % n);
		for (int j = 0; j < D; j++)
			q[j] = vecs[(size_t)src * D + j] + 0.01f * (float)((int)((rng >> j) & 7) - 3);
		uint64_t t = dm_now_ns();

		r = dmann_query(d, BUCKET, INDEX, q, D, K, got, dist);
		atomic_fetch_add(&queries, 1);
		usleep(50000);    /* at most about 20 queries a second */
		if (r < 0) {
			atomic_fetch_add(&q_fails, 1);
			fprintf(stderr, "chaos: query failed: %s\n", dmann_errmsg());
			continue;
		}
		/* brute force over the vectors acknowledged before the query: its K nearest */
		float bd[K];
		unsigned bi[K], nb = 0, hit = 0;

		for (unsigned i = 0; i < n; i++) {
			float s = 0;
			int p;

			for (int j = 0; j < D; j++) {
				float e = vecs[(size_t)i * D + j] - q[j];

				s += e * e;
			}
			if (nb == K && s >= bd[K - 1])
				continue;
			p = nb < K ? (int)nb++ : K - 1;
			for (; p > 0 && bd[p - 1] > s; p--) {
				bd[p] = bd[p - 1];
				bi[p] = bi[p - 1];
			}
			bd[p] = s;
			bi[p] = i;
		}
		for (int a = 0; a < r; a++) {
			for (unsigned b = 0; b < nb; b++) {
				char k[16];

				key_of(bi[b], k);
				if (got[a] && !strcmp(got[a], k)) {
					hit++;
					break;
				}
			}
		}
		dmann_free_keys(got, (size_t)r);
		uint64_t t0 = t_start;
		unsigned w = t >= t0 ? (unsigned)((t - t0) / 10000000000ull) : WINDOWS;

		/* the few queries started in the last moment after the chaos count in its last
		 * window (a window of 2 queries says nothing about recall) */
		if (w != WINDOWS && w >= seconds / 10)
			w = seconds / 10 - 1;
		if (w < WINDOWS) {
			atomic_fetch_add(&win[w].n, 1);
			double cur = atomic_load(&win[w].sum);

			while (!atomic_compare_exchange_weak(&win[w].sum, &cur,
							     cur + (double)hit / K))
				;
		}
	}
	dmann_close(d);
	return NULL;
}

/* Replicas marked stale now (buckets and graphs), as dmann status lists them; -1 when it
 * cannot be read. With `settled`, also -1 unless every node is up in the cluster state and
 * both compute nodes read from every memory node (a node a compute node has not brought
 * back yet is marked stale only when it does). */
static int stale_count_if(bool settled)
{
	char cmd[600], line[1024];
	FILE *f;
	int n = -1, cns_all_up = 0;
	bool all_up = false;

	snprintf(cmd, sizeof(cmd), "%s status --config %s 2>/dev/null", dmann, cfgpath);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		int k;

		if (sscanf(line, " stale bucket replicas: %d", &k) == 1)
			n = k;
		if (strstr(line, "every node up"))
			all_up = true;
		if (strstr(line, ", 0 down now"))
			cns_all_up++;
	}
	pclose(f);
	return settled && (!all_up || cns_all_up < 2) ? -1 : n;
}

static int stale_count(void)
{
	return stale_count_if(false);
}

/* How many of rows v[0..n) (keys[i] each) of index ix come back first for their own
 * vector (QueryVectors, k 1, in batches of 1,000). */
static unsigned self_find(dmann_t *d, const char *ix, const float *v, char *const *keys,
			  unsigned n)
{
	unsigned first = 0;

	for (unsigned at = 0; at < n; at += 1000) {
		unsigned q = DM_MIN(1000u, n - at);
		char **got = calloc(q, sizeof(char *));
		float *dist = malloc(sizeof(float) * q);
		uint32_t *cnt = calloc(q, sizeof(uint32_t));

		cr_assert(got && dist && cnt);
		cr_assert_eq(dmann_batch_query(d, BUCKET, ix, v + (size_t)at * D, q, D, 1, got,
					       dist, cnt), 0, "%s", dmann_errmsg());
		for (unsigned i = 0; i < q; i++)
			first += cnt[i] == 1 && !strcmp(got[i], keys[at + i]);
		dmann_free_keys(got, q);
		free(got);
		free(dist);
		free(cnt);
	}
	return first;
}

/* ---- the AWS SDK half: tests/s3sdk/chaos_sdk.js ---------------------------------------- */

static pid_t sdk_start(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT"), *src = getenv("DMANN_SOURCE_ROOT");
	char mods[300], script[300], out[300];
	pid_t pid;

	cr_assert_not_null(src, "DMANN_SOURCE_ROOT must point at the source tree");
	snprintf(mods, sizeof(mods), "%s/s3sdk-cache/node_modules", root);
	snprintf(script, sizeof(script), "%s/tests/s3sdk/chaos_sdk.js", src);
	snprintf(out, sizeof(out), "%s/sdk.out", dir);
	cr_assert_eq(sh("command -v node >/dev/null"), 0,
		     "node is not installed (Debian: apt-get install nodejs npm)");
	cr_assert_eq(sh("test -d %s/@aws-sdk/client-s3vectors", mods), 0,
		     "the AWS SDK modules are not in %s: run ninja -C %s s3sdk-deps", mods, root);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		setenv("S3SDK_NODE_MODULES", mods, 1);
		setenv("CHAOS_DIR", lc, 1);
		setenv("CHAOS_BUCKET", BUCKET, 1);
		setenv("CHAOS_INDEX", SDK_INDEX, 1);
		execlp("node", "node", "--no-warnings", script, (char *)NULL);
		_exit(127);
	}
	return pid;
}

static void sdk_event(const char *what)
{
	struct timespec ts;
	FILE *f;
	char p[200];

	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(p, sizeof(p), "%s/sdk.events", lc);
	f = fopen(p, "a");
	cr_assert_not_null(f);
	fprintf(f, "%s %lld\n", what, (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
	fclose(f);
}

/* Tell the driver to stop, wait for it (at most 240 s), print what it said: its exit
 * status (0: its rules held). */
static int sdk_stop(pid_t pid)
{
	int st = 0;
	pid_t r = 0;

	sh("touch %s/sdk.stop", lc);
	for (int i = 0; i < 2400 && (r = waitpid(pid, &st, WNOHANG)) == 0; i++)
		usleep(100000);
	if (r == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		fprintf(stderr, "chaos: the SDK driver did not end within 240 s\n");
		return -1;
	}
	sh("cat %s/sdk.out >&2", dir);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Every row the SDK driver acknowledged (sdk.keys, sdk.fbin): read back exactly through
 * libdmann and found first by its own vector. */
static void sdk_check_rows(dmann_t *d, unsigned *n_out, unsigned *first_out)
{
	char p[200], line[64];
	unsigned n = 0, first = 0;
	int32_t hdr[2];
	FILE *f;

	snprintf(p, sizeof(p), "%s/sdk.fbin", lc);
	f = fopen(p, "rb");
	cr_assert_not_null(f, "the SDK driver left no sdk.fbin");
	cr_assert_eq(fread(hdr, sizeof(hdr), 1, f), 1);
	cr_assert(hdr[0] >= 0 && hdr[1] == D);
	n = (unsigned)hdr[0];
	float *v = malloc(sizeof(float) * ((size_t)n * D + 1)), *out = malloc(sizeof(float) *
									      ((size_t)n * D + 1));
	char **keys = calloc(n + 1, sizeof(char *));

	cr_assert(v && out && keys);
	cr_assert_eq(fread(v, sizeof(float) * D, n, f), n);
	fclose(f);
	snprintf(p, sizeof(p), "%s/sdk.keys", lc);
	f = fopen(p, "r");
	cr_assert_not_null(f);
	for (unsigned i = 0; i < n; i++) {
		cr_assert_not_null(fgets(line, sizeof(line), f));
		line[strcspn(line, "\n")] = 0;
		keys[i] = strdup(line);
	}
	fclose(f);
	if (n) {
		int got = dmann_get(d, BUCKET, SDK_INDEX, n, (const char *const *)keys, out, D,
				    NULL);

		cr_assert_eq(got, (int)n, "%d of %u SDK-acknowledged vectors read back: %s", got,
			     n, dmann_errmsg());
		cr_assert_arr_eq(out, v, sizeof(float) * (size_t)n * D, "an SDK vector changed");
	}
	first = self_find(d, SDK_INDEX, v, keys, n);
	for (unsigned i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	free(v);
	free(out);
	*n_out = n;
	*first_out = first;
}

Test(chaos, kills_under_writes_and_queries_lose_nothing)
{
	dmann_t *d;
	pthread_t tw, tr;
	uint64_t rng = 0x243f6a8885a308d3ull, last_kill = 0, next_kill;
	unsigned kills = 0, skipped = 0;
	bool cn_killed = false, cn1_inserting = false;

	vecs = malloc(sizeof(float) * (size_t)MAXV * D);
	cr_assert_not_null(vecs);
	for (uint64_t i = 0; i < MAXV; i++)
		for (uint32_t j = 0; j < D; j++)
			vecs[i * D + j] = val(i, j);
	d = dmann_connect(cfgpath, "local");
	cr_assert_not_null(d, "%s", dmann_errmsg());
	cr_assert_eq(dmann_create_index(d, BUCKET, INDEX, D, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	cr_assert_eq(dmann_create_index(d, BUCKET, SDK_INDEX, D, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	t_start = dm_now_ns();
	cr_assert_eq(pthread_create(&tw, NULL, writer, NULL), 0);
	cr_assert_eq(pthread_create(&tr, NULL, reader, NULL), 0);
	/* the chaos starts once the index has its graph (built from its first 1,000 rows) */
	for (int i = 0; i < 600; i++) {
		if (cluster_metric(lc, 0, "dmann_cn_s3_index_graphs_seeded_total") +
		    cluster_metric(lc, 1, "dmann_cn_s3_index_graphs_seeded_total") > 0)
			break;
		usleep(100000);
	}
	double graph_s = (double)(dm_now_ns() - t_start) / 1e9;

	cr_assert_gt(cluster_metric(lc, 0, "dmann_cn_s3_index_graphs_seeded_total") +
		     cluster_metric(lc, 1, "dmann_cn_s3_index_graphs_seeded_total"), 0,
		     "no graph for the index after %.0f s", graph_s);
	pid_t sdk = sdk_pid = sdk_start();

	t_start = dm_now_ns();
	memset(win, 0, sizeof(win));
	next_kill = t_start + 5000000000ull;
	while (dm_now_ns() - t_start < (uint64_t)seconds * 1000000000ull) {
		uint64_t now = dm_now_ns();

		if (!cn_killed && now - t_start > (uint64_t)seconds * 500000000ull) {
			/* while its indexer inserts (its back-link count moves: it takes record
			 * locks), and while the SDK driver keeps requests in flight on it */
			long long l0 = cluster_metric(lc, 1, "dmann_cn_insert_links_total"), l1 = l0;

			sdk_event("prekill");
			for (int i = 0; i < 200 && l1 == l0; i++) {
				usleep(100000);
				l1 = cluster_metric(lc, 1, "dmann_cn_insert_links_total");
			}
			cn1_inserting = l1 != l0;
			/* Frozen (SIGSTOP) for 0.5 s first, so that the requests the driver's
			 * loops keep on it are certainly in flight when it dies: on a loaded
			 * machine a round trip is a few ms and node's event loop can stall
			 * longer than that (a run without the freeze had none in flight). */
			sdk_event("kill");
			cr_assert_eq(kill(cluster_pid_of(lc, "cn1"), SIGSTOP), 0);
			usleep(500000);
			cr_assert_eq(sh("%s local kill --dir %s cn1", dmann, lc), 0);
			sdk_event("killed");
			sleep(2);
			cr_assert_eq(sh("%s local start --dir %s cn1", dmann, lc), 0);
			sdk_event("up");
			cn_killed = true;
		}
		if (now >= next_kill) {
			if (stale_count_if(true) != 0) {
				skipped++;           /* not every replica caught up yet: later */
				next_kill = now + 1000000000ull;
				continue;
			}
			rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
			unsigned m = (unsigned)(rng % 3);

			cr_assert_eq(sh("%s local kill --dir %s mn%u", dmann, lc, m), 0);
			last_kill = dm_now_ns();
			kills++;
			sleep(3 + (unsigned)(rng >> 8) % 3);
			cr_assert_eq(sh("%s local start --dir %s mn%u", dmann, lc, m), 0);
			next_kill = dm_now_ns() + (10 + (rng >> 16) % 11) * 1000000000ull;
		}
		usleep(200000);
	}
	fprintf(stderr, "chaos: %u s of chaos done; stopping the writer and the reader\n", seconds);
	atomic_store(&stop, true);
	pthread_join(tw, NULL);
	pthread_join(tr, NULL);
	int sdk_rc = sdk_stop(sdk);

	sdk_pid = 0;
	fprintf(stderr, "chaos: writer and reader stopped; waiting for every replica\n");

	/* every replica caught up within 60 s of the last kill */
	int st = -1;

	while ((st = stale_count()) != 0 && dm_now_ns() - last_kill < 60000000000ull)
		usleep(500000);
	double caught = (double)(dm_now_ns() - last_kill) / 1e9;

	cr_assert_eq(st, 0, "%d replicas still stale %.0f s after the last kill", st, caught);

	/* the indexers drain the tail (bounded: the self-find below works either way, the
	 * exact scan of a long tail only makes it slower) */
	uint64_t t_drain = dm_now_ns();
	long long lag = -1;

	while (dm_now_ns() - t_drain < 240000000000ull) {
		long long l0 = cluster_metric(lc, 0, "dmann_cn_s3_index_lag_rows"),
			  l1 = cluster_metric(lc, 1, "dmann_cn_s3_index_lag_rows");

		lag = l0 < 0 || l1 < 0 ? -1 : DM_MAX(l0, l1);
		if (lag == 0)
			break;
		sleep(1);
	}
	double drain = (double)(dm_now_ns() - t_drain) / 1e9;

	fprintf(stderr, "chaos: tail rows left %lld, %.0f s after the writes stopped\n", lag,
		drain);

	/* every acknowledged vector: read back exactly, found first by its own vector */
	unsigned n = atomic_load(&acked), found = 0, first = 0;
	char **keys = malloc(sizeof(char *) * n);
	float *out = malloc(sizeof(float) * (size_t)n * D);

	for (unsigned i = 0; i < n; i++) {
		keys[i] = malloc(16);
		key_of(i, keys[i]);
	}
	fprintf(stderr, "chaos: reading back %u vectors\n", n);
	found = (unsigned)dmann_get(d, BUCKET, INDEX, n, (const char *const *)keys, out, D, NULL);
	cr_assert_eq(found, n, "%u of %u acknowledged vectors read back: %s", found, n,
		     dmann_errmsg());
	cr_assert_arr_eq(out, vecs, sizeof(float) * (size_t)n * D, "a vector changed");
	fprintf(stderr, "chaos: each vector by its own\n");
	first = self_find(d, INDEX, vecs, (char *const *)keys, n);
	unsigned sdk_n = 0, sdk_first = 0;

	fprintf(stderr, "chaos: the SDK's rows\n");
	sdk_check_rows(d, &sdk_n, &sdk_first);
	long long gq = cluster_metric(lc, 0, "dmann_cn_s3_graph_queries_total") +
		       cluster_metric(lc, 1, "dmann_cn_s3_graph_queries_total");

	fprintf(stderr, "FIGURES chaos (%u s): %u memory-node kills (%u postponed "
		"while a replica was stale), cn1 SIGKILLed once; %u vectors acknowledged, %u "
		"puts failed (retried); %u queries, %u failed; all replicas caught up %.1f s after "
		"the last kill; tail drained to %lld rows in %.0f s; %u of %u read back exactly, "
		"%u found first; SDK rows: %u of %u found first; %lld graph-path queries (graph "
		"built %.1f s after the first put); cn1 killed while its indexer inserted: %s\n",
		seconds, kills, skipped, n,
		atomic_load(&put_fails), atomic_load(&queries), atomic_load(&q_fails), caught, lag,
		drain, found, n, first, sdk_first, sdk_n, gq, graph_s, cn1_inserting ? "yes" : "no");
	cr_assert_gt(gq, 0, "no query was served by the graph");
	for (unsigned w = 0; w < WINDOWS; w++) {
		unsigned c = atomic_load(&win[w].n);

		if (!c)
			continue;
		fprintf(stderr, "FIGURES chaos window %u (%u-%u s): %u queries, recall@10 %.4f\n", w,
			w * 10, w * 10 + 10, c, atomic_load(&win[w].sum) / c);
		cr_expect_geq(atomic_load(&win[w].sum) / c, 0.95, "window %u: recall@10 %.4f", w,
			      atomic_load(&win[w].sum) / c);
	}
	cr_assert_eq(first, n, "%u of %u acknowledged vectors not found first", n - first, n);
	cr_assert_eq(sdk_first, sdk_n, "%u of %u SDK-acknowledged vectors not found first",
		     sdk_n - sdk_first, sdk_n);
	cr_assert_eq(sdk_rc, 0, "the SDK driver's rules did not hold (exit %d; its output above)",
		     sdk_rc);
	cr_assert_eq(atomic_load(&q_fails), 0, "%u queries failed", atomic_load(&q_fails));
	cr_assert_geq(kills, 2);
	for (unsigned i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	free(out);
	free(vecs);
	dmann_close(d);
}
