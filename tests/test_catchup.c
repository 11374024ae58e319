/* test_catchup.c: writes go on while a replica of their bucket is down, and the replica is
 * caught up when it returns (issue 14: "a write that cannot reach R replicas is
 * acknowledged with the live ones and the missing replica is marked stale; a returning
 * replica catches up before it serves again").
 *
 * A local cluster of 3 memory and 2 compute nodes, redundancy 2, with its etcd. A writer
 * puts batches through libdmann (and re-puts and deletes some earlier keys) without a
 * pause. One replica A of the bucket is SIGKILLed: not one write fails, they are
 * acknowledged with the other replica B and A is marked stale. A is started again while
 * the writer goes on: the controller catches it up (the image of the bucket from B, the
 * writes A took meanwhile run again), and the stale mark goes. Then the writer stops and B
 * is SIGKILLed: every read now comes from A alone, and every acknowledged write is there:
 * each key's last acknowledged vector exactly, no deleted key, each found first by its own
 * vector. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_util.h"
#include "config.h"
#include "dmann.h"
#include "flat.h"
#include "vecfile.h"

#define D 16
#define BATCH 100
#define MAXK 200000
#define BUCKET "cbucket"
#define INDEX "cidx"

static char dir[128], lc[160], dmann[300], cfgpath[256];

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-catchup-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(lc, sizeof(lc), "%s/lc", dir);
	cr_assert_eq(sh("%s local up --mn 3 --cn 2 --redundancy 2 --dir %s --region-mb 64 "
			"--member-lease 3", dmann, lc), 0);
	snprintf(cfgpath, sizeof(cfgpath), "%s/cluster.ini", lc);
}

static void teardown(void)
{
	sh("%s local down --dir %s", dmann, lc);
	if (!getenv("DMANN_KEEP_TEST_DIR"))
		sh("rm -rf %s", dir);
}

TestSuite(catchup, .init = setup, .fini = teardown, .timeout = 400);

static float val(uint64_t key, uint32_t ver, uint32_t j)
{
	uint64_t s = key * 0x9e3779b97f4a7c15ull + j * 0xbf58476d1ce4e5b9ull + ver * 0x2545f491ull;

	s ^= s >> 31;
	s *= 0x94d049bb133111ebull;
	s ^= s >> 29;
	return (float)(s >> 40) / 16777216.0f - 0.5f;
}

/* The writer's view of what is acknowledged: per key, its version (0: never written) and
 * whether it is deleted. Only the writer thread writes it; readers look after the join. */
struct writer {
	atomic_int nkeys;             /* keys [0, nkeys) written at least once */
	atomic_int batches, fails;
	atomic_bool stop;
	int last_rc;
	uint32_t ver[MAXK];
	uint8_t dead[MAXK];
};

static void key_of(int k, char *out)
{
	snprintf(out, 16, "k%07d", k);
}

static void *write_loop(void *arg)
{
	struct writer *w = arg;
	dmann_t *d = dmann_connect(cfgpath, "local");
	static float v[BATCH * D];
	char *keys[BATCH];
	int next = 0;

	if (!d)
		return NULL;
	for (int i = 0; i < BATCH; i++)
		keys[i] = malloc(16);
	for (int b = 0; !atomic_load(&w->stop) && next + BATCH <= MAXK; b++) {
		int rc, ks[BATCH], n = 0;

		if (b % 4 == 3 && next >= 4 * BATCH) {
			/* re-put 50 earlier keys with a new version, delete 10 others */
			for (int i = 0; i < 50; i++) {
				int k = (int)(((uint64_t)b * 7919 + (uint64_t)i * 104729) %
					      (uint64_t)next), dup = 0;

				for (int j = 0; j < n; j++)
					dup |= ks[j] == k;
				if (!dup)
					ks[n++] = k;
			}
		} else {
			for (int i = 0; i < BATCH; i++)
				ks[n++] = next + i;
		}
		for (int i = 0; i < n; i++) {
			key_of(ks[i], keys[i]);
			for (uint32_t j = 0; j < D; j++)
				v[i * D + j] = val((uint64_t)ks[i], w->ver[ks[i]] + 1, j);
		}
		rc = dmann_put(d, BUCKET, INDEX, (size_t)n, (const char *const *)keys, v, D, NULL);
		if (rc) {
			w->last_rc = rc;
			atomic_fetch_add(&w->fails, 1);
			fprintf(stderr, "put of batch %d failed: %s\n", b, dmann_errmsg());
			if (atomic_load(&w->fails) >= 20)
				break;   /* the test has failed: stop writing */
			usleep(100000);
			continue;   /* not acknowledged: the expected state is unchanged */
		}
		for (int i = 0; i < n; i++) {
			w->ver[ks[i]]++;
			w->dead[ks[i]] = 0;
		}
		if (n == BATCH)
			next += BATCH;
		if (b % 4 == 3 && next >= 4 * BATCH) {
			int dk[10];

			for (int i = 0; i < 10; i++) {
				dk[i] = (int)(((uint64_t)b * 31 + (uint64_t)i * 7717) % (uint64_t)next);
				key_of(dk[i], keys[i]);
			}
			rc = dmann_delete(d, BUCKET, INDEX, 10, (const char *const *)keys);
			if (rc) {
				atomic_fetch_add(&w->fails, 1);
				fprintf(stderr, "delete in batch %d failed: %s\n", b, dmann_errmsg());
			} else {
				for (int i = 0; i < 10; i++)
					w->dead[dk[i]] = 1;
			}
		}
		atomic_store(&w->nkeys, next);
		atomic_store(&w->batches, b + 1);
	}
	for (int i = 0; i < BATCH; i++)
		free(keys[i]);
	dmann_close(d);
	return NULL;
}

static long long stale_now(void)
{
	long long a = cluster_metric(lc, 0, "dmann_cn_s3_stale_replicas");
	long long b = cluster_metric(lc, 1, "dmann_cn_s3_stale_replicas");

	return (a < 0 ? 0 : a) + (b < 0 ? 0 : b);
}

static long long sum_metric(const char *name)
{
	long long a = cluster_metric(lc, 0, name), b = cluster_metric(lc, 1, name);

	return (a < 0 ? 0 : a) + (b < 0 ? 0 : b);
}

static void wait_batches(struct writer *w, int more)
{
	int to = atomic_load(&w->batches) + more;

	for (int i = 0; i < 600 && atomic_load(&w->batches) < to; i++)
		usleep(50000);
	cr_assert_geq(atomic_load(&w->batches), to, "the writer is stuck at %d batches",
		      atomic_load(&w->batches));
}

/* Every acknowledged write of w, read back through libdmann while only memory node
 * `alone` of the bucket's replicas is up: each key at its last acknowledged version, no
 * deleted key, a sample found first by its own vector. Returns the sample size. */
static int verify_alone(struct writer *w)
{
	dmann_t *d = dmann_connect(cfgpath, "local");

	cr_assert_not_null(d, "%s", dmann_errmsg());
	int n = atomic_load(&w->nkeys), found = -1, live = 0;
	char **keys = malloc(sizeof(char *) * (size_t)n);
	float *out = malloc(sizeof(float) * (size_t)n * D);
	uint8_t *fnd = malloc((size_t)n);

	for (int i = 0; i < n; i++) {
		keys[i] = malloc(16);
		key_of(i, keys[i]);
		live += !w->dead[i];
	}
	for (int i = 0; i < 100 && found != live; i++) {
		found = dmann_get(d, BUCKET, INDEX, (size_t)n, (const char *const *)keys, out, D, fnd);
		if (found != live)
			usleep(200000);
	}
	cr_assert_eq(found, live, "%d keys found, %d acknowledged and not deleted: %s", found, live,
		     dmann_errmsg());
	for (int i = 0; i < n; i++) {
		cr_assert_eq(fnd[i], !w->dead[i], "key %d: found %d, deleted %d", i, fnd[i],
			     w->dead[i]);
		for (uint32_t j = 0; fnd[i] && j < D; j++)
			cr_assert_eq(out[(size_t)i * D + j], val((uint64_t)i, w->ver[i], j),
				     "key %d is not at its last acknowledged version %u", i, w->ver[i]);
	}
	/* each found first by its own vector (a sample) */
	int q = 0, step = n / 500 > 0 ? n / 500 : 1;
	float *qv = malloc(sizeof(float) * 500 * D);
	int *qk = malloc(sizeof(int) * 500);

	for (int i = 0; i < n && q < 500; i += step)
		if (!w->dead[i]) {
			memcpy(qv + (size_t)q * D, out + (size_t)i * D, sizeof(float) * D);
			qk[q++] = i;
		}
	char **got = calloc((size_t)q, sizeof(char *));
	float *dist = malloc(sizeof(float) * (size_t)q);
	uint32_t *cnt = calloc((size_t)q, sizeof(uint32_t));

	cr_assert_eq(dmann_batch_query(d, BUCKET, INDEX, qv, (size_t)q, D, 1, got, dist, cnt), 0,
		     "%s", dmann_errmsg());
	for (int i = 0; i < q; i++)
		cr_assert(cnt[i] == 1 && !strcmp(got[i], keys[qk[i]]) && dist[i] == 0.0f,
			  "key %d found %s", qk[i], got[i] ? got[i] : "nothing");
	dmann_free_keys(got, (size_t)q);
	free(got);
	free(dist);
	free(cnt);
	free(qv);
	free(qk);
	for (int i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	free(out);
	free(fnd);
	dmann_close(d);
	return q;
}

Test(catchup, a_replica_down_misses_writes_and_is_caught_up_when_back)
{
	static struct writer w;
	struct dm_cluster_cfg cfg;
	char err[256], a[8], b[8];
	uint32_t mns[DM_MAX_NODES];
	dmann_t *d = dmann_connect(cfgpath, "local");
	pthread_t t;
	uint64_t t0;
	double down_s, catch_s;

	cr_assert_not_null(d, "%s", dmann_errmsg());
	cr_assert_eq(dm_config_load(cfgpath, &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(flat_bucket_mns(&cfg, BUCKET, mns), 2);
	snprintf(a, sizeof(a), "mn%u", mns[0]);    /* the primary: the first written to */
	snprintf(b, sizeof(b), "mn%u", mns[1]);
	cr_assert_eq(dmann_create_index(d, BUCKET, INDEX, D, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	dmann_close(d);
	memset(&w, 0, sizeof(w));
	cr_assert_eq(pthread_create(&t, NULL, write_loop, &w), 0);
	wait_batches(&w, 10);

	/* A down: the writes go on with B alone, A marked stale. */
	cr_assert_eq(sh("%s local kill --dir %s %s", dmann, lc, a), 0);
	t0 = dm_now_ns();
	wait_batches(&w, 30);
	while (dm_now_ns() - t0 < 3000000000ull)    /* a few seconds of writes it misses */
		usleep(50000);
	for (int i = 0; i < 100 && stale_now() < 1; i++)
		usleep(50000);
	cr_assert_geq(stale_now(), 1, "no compute node knows the stale replica");
	cr_assert_gt(sum_metric("dmann_cn_s3_degraded_writes_total"), 0);
	cr_assert_eq(atomic_load(&w.fails), 0, "writes failed with a replica down");
	down_s = (double)(dm_now_ns() - t0) / 1e9;

	/* A back, under writes: caught up, the mark gone. */
	cr_assert_eq(sh("%s local start --dir %s %s", dmann, lc, a), 0);
	t0 = dm_now_ns();
	for (int i = 0; i < 1200 && stale_now() > 0; i++)
		usleep(50000);
	catch_s = (double)(dm_now_ns() - t0) / 1e9;
	cr_assert_eq(stale_now(), 0, "replica %s still stale %.0f s after its restart", a, catch_s);
	cr_assert_geq(sum_metric("dmann_cn_s3_catchups_total"), 1);
	wait_batches(&w, 10);            /* writes to both again after the catch-up */
	atomic_store(&w.stop, true);
	pthread_join(t, NULL);
	cr_assert_eq(atomic_load(&w.fails), 0, "%d writes failed (last: %d)", atomic_load(&w.fails),
		     w.last_rc);

	/* B down for good: A alone must hold every acknowledged write. */
	cr_assert_eq(sh("%s local kill --dir %s %s", dmann, lc, b), 0);
	int q = verify_alone(&w), n = atomic_load(&w.nkeys), live = 0;

	for (int i = 0; i < n; i++)
		live += !w.dead[i];
	fprintf(stderr, "FIGURES catch-up: %s down %.1f s under writes (0 failed), caught up "
		"%.1f s after its restart (%lld catch-up(s), %lld bytes, %lld degraded writes, "
		"%lld stale marks); %d keys (%d live) written, all at their last acknowledged "
		"version on %s alone, %d of %d found first\n", a, down_s, catch_s,
		sum_metric("dmann_cn_s3_catchups_total"), sum_metric("dmann_cn_s3_catchup_bytes_total"),
		sum_metric("dmann_cn_s3_degraded_writes_total"),
		sum_metric("dmann_cn_s3_stale_marks_total"), n, live, a, q, q);
}

/* A replica gone for good: declared down, retired after replace_after_s, and its buckets'
 * new replica C (the next node in the bucket's order) is marked stale before the placement
 * is published, then filled by the catch-up from the survivor B while the writes go on.
 * Then B is SIGKILLed too: C alone holds every acknowledged write. */
Test(catchup, a_replica_gone_for_good_is_replaced)
{
	static struct writer w;
	struct dm_cluster_cfg cfg;
	char err[256], a[8], b[8], c[8];
	uint32_t mns[DM_MAX_NODES];
	dmann_t *d;
	pthread_t t;
	uint64_t t0;
	double repl_s;

	cr_assert_eq(sh("sed -i 's/^member_lease_s = .*/&\\nreplace_after_s = 4/' %s", cfgpath), 0);
	cr_assert_eq(sh("for c in cn0 cn1; do %s local stop --dir %s $c && %s local start --dir %s "
			"$c || exit 1; done", dmann, lc, dmann, lc), 0);
	cr_assert_eq(dm_config_load(cfgpath, &cfg, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(flat_bucket_mns(&cfg, BUCKET, mns), 2);
	snprintf(a, sizeof(a), "mn%u", mns[0]);
	snprintf(b, sizeof(b), "mn%u", mns[1]);
	snprintf(c, sizeof(c), "mn%u", 3 - mns[0] - mns[1]);   /* the third of mn0..mn2 */
	d = NULL;
	for (int i = 0; i < 100 && !d; i++)
		if (!(d = dmann_connect(cfgpath, "local")))
			usleep(100000);
	cr_assert_not_null(d, "%s", dmann_errmsg());
	for (int i = 0; i < 100; i++) {
		if (!dmann_create_index(d, BUCKET, INDEX, D, DMANN_EUCLIDEAN))
			break;
		usleep(100000);      /* the gateways may still be starting */
	}
	dmann_close(d);
	memset(&w, 0, sizeof(w));
	cr_assert_eq(pthread_create(&t, NULL, write_loop, &w), 0);
	wait_batches(&w, 10);

	cr_assert_eq(sh("%s local kill --dir %s %s", dmann, lc, a), 0);
	t0 = dm_now_ns();
	/* retired (lease 3 s + replace_after_s 4 s), C filled, every mark gone */
	for (int i = 0; i < 1200; i++) {
		if (!sh("%s status --config %s 2>/dev/null | grep -q 'retired: %s'", dmann, cfgpath, a) &&
		    stale_now() == 0)
			break;
		usleep(100000);
	}
	repl_s = (double)(dm_now_ns() - t0) / 1e9;
	cr_assert_eq(sh("%s status --config %s | grep -q 'retired: %s'", dmann, cfgpath, a), 0,
		     "%s not retired %.0f s after its kill", a, repl_s);
	cr_assert_eq(stale_now(), 0, "replicas still stale %.0f s after the kill", repl_s);
	cr_assert_geq(sum_metric("dmann_cn_s3_catchups_total"), 1);
	wait_batches(&w, 10);
	atomic_store(&w.stop, true);
	pthread_join(t, NULL);
	cr_assert_eq(atomic_load(&w.fails), 0, "%d writes failed (last: %d)", atomic_load(&w.fails),
		     w.last_rc);

	cr_assert_eq(sh("%s local kill --dir %s %s", dmann, lc, b), 0);
	int q = verify_alone(&w), n = atomic_load(&w.nkeys);

	fprintf(stderr, "FIGURES re-replication of a bucket: %s SIGKILLed for good under writes "
		"(0 failed), retired and its bucket copied to %s from %s within %.1f s of the kill "
		"(%lld bytes); %d keys, all at their last acknowledged version on %s alone, %d of "
		"%d found first\n", a, c, b, repl_s,
		sum_metric("dmann_cn_s3_catchup_bytes_total"), n, c, q, q);
}

/* ---- graph replicas (cn_hcatchup.c) ---- */

static double json_num(const char *path, const char *key)
{
	char buf[8192], pat[64];
	double x = -1;
	FILE *f = fopen(path, "r");
	size_t n;
	char *s;

	cr_assert_not_null(f, "%s", path);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	s = strstr(buf, pat);
	cr_assert_not_null(s, "%s has no %s: %s", path, key, buf);
	cr_assert_eq(sscanf(s + strlen(pat), "%lf", &x), 1);
	return x;
}

/* The share of the vectors of file q (in dir) found first, under ids file gt. */
static double self_find(const char *q, const char *gt)
{
	char out[256];

	snprintf(out, sizeof(out), "%s/self-%s.json", dir, q);
	cr_assert_eq(sh("%s bench --config %s --query %s/%s --gt %s/%s --k 1 --ef 64 "
			"--cache-ratio keep --json >%s", dmann, cfgpath, dir, q, dir, gt, out), 0,
		     "dmann bench failed (queries failed?)");
	cr_assert_eq(json_num(out, "errors"), 0, "queries failed");
	return json_num(out, "recall");
}

/* Online inserts into an HNSW index while one memory node X is down: its copies miss them.
 * When X is back, each compute node marks it stale for the graph before it reads from it
 * again, and the controller writes X every record it lacks. Then another memory node Y is
 * SIGKILLed: the blocks X and Y shared are read from X alone, and every row inserted while
 * X was down still finds itself first. (Without the catch-up, those queries fail: X's
 * copies of the new records are empty.) */
Test(catchup, a_memory_node_back_gets_the_graph_records_it_missed)
{
	struct dm_vecs v;
	char p[300], err[256];
	uint64_t t0;
	double s1, s2, secs;

	cr_assert_eq(sh("%s gen --kind sift --n 5000 --nq 10 --seed 5 --out %s/g >/dev/null", dmann,
			dir), 0);
	snprintf(p, sizeof(p), "%s/g/base.fbin", dir);
	cr_assert_eq(dm_vecs_read(p, DM_VF_AUTO, &v, err, sizeof(err)), 0, "%s", err);
	const char *part[3] = { "a.fbin", "b1.fbin", "b2.fbin" };
	const uint64_t at[4] = { 0, 3000, 4000, 5000 };

	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, part[i]);
		cr_assert_eq(dm_vecs_write(p, DM_VF_FBIN, (float *)v.data + at[i] * v.dim,
					   DM_VT_F32, at[i + 1] - at[i], v.dim), 0);
	}
	dm_vecs_free(&v);
	cr_assert_eq(sh("%s build --base %s/a.fbin --metric l2 --M 16 --efc 100 --threads 2 "
			"--block-shift 7 --out %s/a.hnsw >/dev/null", dmann, dir, dir), 0);
	cr_assert_eq(sh("%s load --config %s --index %s/a.hnsw --spare 2500 >/dev/null", dmann,
			cfgpath, dir), 0);
	t0 = dm_now_ns();
	while (sh("%s bench --config %s --query %s/g/query.fbin --gt %s/g/gt.ibin --k 1 --ef 64 "
		  "--cache-ratio keep --json 2>/dev/null | grep -q '\"errors\": 0,'", dmann, cfgpath,
		  dir, dir))
		cr_assert_lt(dm_now_ns() - t0, 30000000000ull, "the index is not served");
	cr_assert_eq(sh("%s insert --config %s --vectors %s/b1.fbin --out %s/ids1.ibin >/dev/null",
			dmann, cfgpath, dir, dir), 0);

	/* X down: the next rows go to the other replicas only */
	cr_assert_eq(sh("%s local kill --dir %s mn1", dmann, lc), 0);
	cr_assert_eq(sh("%s insert --config %s --vectors %s/b2.fbin --no-snapshot --json "
			"--out %s/ids2.ibin >%s/ins2.json", dmann, cfgpath, dir, dir, dir), 0);
	snprintf(p, sizeof(p), "%s/ins2.json", dir);
	cr_assert_eq(json_num(p, "inserted"), 1000, "rows not inserted with mn1 down");

	/* X back: marked stale, caught up */
	cr_assert_eq(sh("%s local start --dir %s mn1", dmann, lc), 0);
	t0 = dm_now_ns();
	for (int i = 0; i < 600 && sum_metric("dmann_cn_graph_catchups_total") < 1; i++)
		usleep(100000);
	for (int i = 0; i < 300 && sum_metric("dmann_cn_graph_stale_replicas") > 0; i++)
		usleep(100000);
	secs = (double)(dm_now_ns() - t0) / 1e9;
	cr_assert_geq(sum_metric("dmann_cn_graph_stale_marks_total"), 1, "mn1 was not marked stale");
	cr_assert_geq(sum_metric("dmann_cn_graph_catchups_total"), 1, "no catch-up %.0f s after "
		      "the restart", secs);
	cr_assert_eq(sum_metric("dmann_cn_graph_stale_replicas"), 0);
	cr_assert_gt(sum_metric("dmann_cn_graph_catchup_records_total"), 0);

	/* Y down: mn1's copies serve the blocks they share */
	cr_assert_eq(sh("%s local kill --dir %s mn2", dmann, lc), 0);
	s1 = self_find("b1.fbin", "ids1.ibin");
	s2 = self_find("b2.fbin", "ids2.ibin");
	fprintf(stderr, "FIGURES graph catch-up: 1,000 rows inserted while mn1 was down; mn1 "
		"caught up %.1f s after its restart (%lld records written); with mn2 down then, "
		"self-find %.4f of the rows inserted before and %.4f of those inserted while mn1 "
		"was down\n", secs, sum_metric("dmann_cn_graph_catchup_records_total"), s1, s2);
	cr_assert_geq(s1, 0.999, "self-find %.4f", s1);
	cr_assert_geq(s2, 0.999, "self-find %.4f", s2);
}
