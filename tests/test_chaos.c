/* test_chaos.c: writes and queries through libdmann while memory nodes are SIGKILLed and
 * restarted and a compute node is SIGKILLed once (issue 14's chaos test; the SDK half of
 * it is not here: only libdmann drives the cluster).
 *
 * A local cluster of 3 memory and 2 compute nodes, redundancy 2, with its etcd; the S3
 * index gets a graph once it holds 1,000 rows ([s3] graph_auto) and the online indexers
 * move later rows into it. Once the graph is there, for DMANN_CHAOS_SECONDS (120; CI's
 * sanitizer build 40):
 *   - a writer puts batches of 50 vectors (keys unique, about 250 a second), remembering
 *     what was acknowledged;
 *   - a reader queries (k 10) with an acknowledged vector plus noise, against a brute force
 *     over the vectors acknowledged before the query started: recall@10 per 10-second
 *     window; every failed query is counted;
 *   - every 10-20 s a memory node is SIGKILLed, and started again 3-5 s later, but only while
 *     no replica is marked stale and every node is up (R caught-up copies of everything:
 *     dmann status' stale list is empty, both compute nodes read from every memory node);
 *     at half time compute node cn1 is SIGKILLed (its indexer may hold insert locks) and
 *     started again.
 * At the end: every replica caught up within 60 s of the last kill; every acknowledged
 * vector is read back exactly and found first by its own vector (0 lost); 0 failed
 * queries; recall@10 >= 0.95 in every window. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_util.h"
#include "dmann.h"

#define D 32
#define BATCH 50
#define MAXV 400000
#define K 10
#define WINDOWS 64
#define BUCKET "chaos"
#define INDEX "live"

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
	/* a graph for the index from 2,000 rows on, looked at often */
	setenv("DMANN_S3_GRAPH_MIN_ROWS", "1000", 1);
	setenv("DMANN_S3_INDEX_INTERVAL_MS", "500", 1);
	setenv("DMANN_S3_GRAPH_ROOM", "200000", 1);
	cr_assert_eq(sh("%s local up --mn 3 --cn 2 --redundancy 2 --dir %s --region-mb 256 "
			"--member-lease 3", dmann, lc), 0);
	snprintf(cfgpath, sizeof(cfgpath), "%s/cluster.ini", lc);
}

static void teardown(void)
{
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
		usleep(200000);   /* about 250 rows/s: a live index the indexers keep up with */
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
		unsigned w = (unsigned)((t - t_start) / 10000000000ull);

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

Test(chaos, kills_under_writes_and_queries_lose_nothing)
{
	dmann_t *d;
	pthread_t tw, tr;
	uint64_t rng = 0x243f6a8885a308d3ull, last_kill = 0, next_kill;
	unsigned kills = 0, skipped = 0;
	bool cn_killed = false;

	vecs = malloc(sizeof(float) * (size_t)MAXV * D);
	cr_assert_not_null(vecs);
	for (uint64_t i = 0; i < MAXV; i++)
		for (uint32_t j = 0; j < D; j++)
			vecs[i * D + j] = val(i, j);
	d = dmann_connect(cfgpath, "local");
	cr_assert_not_null(d, "%s", dmann_errmsg());
	cr_assert_eq(dmann_create_index(d, BUCKET, INDEX, D, DMANN_EUCLIDEAN), 0, "%s",
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
	t_start = dm_now_ns();
	memset(win, 0, sizeof(win));
	next_kill = t_start + 5000000000ull;
	while (dm_now_ns() - t_start < (uint64_t)seconds * 1000000000ull) {
		uint64_t now = dm_now_ns();

		if (!cn_killed && now - t_start > (uint64_t)seconds * 500000000ull) {
			cr_assert_eq(sh("%s local kill --dir %s cn1", dmann, lc), 0);
			sleep(2);
			cr_assert_eq(sh("%s local start --dir %s cn1", dmann, lc), 0);
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
	fprintf(stderr, "chaos: writer and reader stopped; waiting for every replica\n");

	/* every replica caught up within 60 s of the last kill */
	int st = -1;

	while ((st = stale_count()) != 0 && dm_now_ns() - last_kill < 60000000000ull)
		usleep(500000);
	double caught = (double)(dm_now_ns() - last_kill) / 1e9;

	cr_assert_eq(st, 0, "%d replicas still stale %.0f s after the last kill", st, caught);

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
	for (unsigned at = 0; at < n; at += 1000) {
		unsigned q = DM_MIN(1000u, n - at);
		char **got = calloc(q, sizeof(char *));
		float *dist = malloc(sizeof(float) * q);
		uint32_t *cnt = calloc(q, sizeof(uint32_t));

		cr_assert_eq(dmann_batch_query(d, BUCKET, INDEX, vecs + (size_t)at * D, q, D, 1,
					       got, dist, cnt), 0, "%s", dmann_errmsg());
		for (unsigned i = 0; i < q; i++)
			first += cnt[i] == 1 && !strcmp(got[i], keys[at + i]);
		dmann_free_keys(got, q);
		free(got);
		free(dist);
		free(cnt);
	}
	long long gq = cluster_metric(lc, 0, "dmann_cn_s3_graph_queries_total") +
		       cluster_metric(lc, 1, "dmann_cn_s3_graph_queries_total");

	fprintf(stderr, "FIGURES chaos (%u s, libdmann only): %u memory-node kills (%u postponed "
		"while a replica was stale), cn1 SIGKILLed once; %u vectors acknowledged, %u "
		"puts failed (retried); %u queries, %u failed; all replicas caught up %.1f s after "
		"the last kill; %u of %u read back exactly, %u found first; %lld graph-path "
		"queries (graph built %.1f s after the first put)\n", seconds, kills, skipped, n,
		atomic_load(&put_fails),
		atomic_load(&queries), atomic_load(&q_fails), caught, found, n, first, gq, graph_s);
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
	cr_assert_eq(atomic_load(&q_fails), 0, "%u queries failed", atomic_load(&q_fails));
	cr_assert_geq(kills, 2);
	for (unsigned i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	free(out);
	free(vecs);
	dmann_close(d);
}
