/* test_restart.c: a full-cluster restart loses no acknowledged write (issue 14, point 4, on
 * the S3 data path). A local cluster of 3 memory and 2 compute nodes, redundancy 2, with its
 * etcd: a writer puts batches of vectors through libdmann while every process of the
 * cluster (the memory nodes, the compute nodes and etcd) is SIGKILLed at once; after all of
 * them are started again (`dmann local start`, memory nodes from their data directories,
 * etcd from its own), every vector of every acknowledged batch is read back exactly and
 * found first by its own vector. (The HNSW path's counterpart, every node SIGKILLed after
 * `dmann insert`, is in test_insert.c.) */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_util.h"
#include "dmann.h"

#define D 16
#define BATCH 200
#define MAXB 2000

static char dir[128], lc[160], dmann[300], cfgpath[256];

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-restart-XXXXXX");
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

TestSuite(restart, .init = setup, .fini = teardown, .timeout = 300);

static float val(uint64_t key, uint32_t j)
{
	uint64_t s = key * 0x9e3779b97f4a7c15ull + j * 0xbf58476d1ce4e5b9ull;

	s ^= s >> 31;
	s *= 0x94d049bb133111ebull;
	s ^= s >> 29;
	return (float)(s >> 40) / 16777216.0f - 0.5f;
}

struct writer {
	atomic_int acked;             /* batches acknowledged */
	atomic_bool started;
	int last_rc;
};

static void *write_loop(void *arg)
{
	struct writer *w = arg;
	dmann_t *d = dmann_connect(cfgpath, "local");
	static float v[BATCH * D];
	char *keys[BATCH];

	if (!d)
		return NULL;
	for (int i = 0; i < BATCH; i++)
		keys[i] = malloc(16);
	for (int b = 0; b < MAXB; b++) {
		for (int i = 0; i < BATCH; i++) {
			snprintf(keys[i], 16, "w%07d", b * BATCH + i);
			for (uint32_t j = 0; j < D; j++)
				v[i * D + j] = val((uint64_t)b * BATCH + i, j);
		}
		w->last_rc = dmann_put(d, "rbucket", "ridx", BATCH, (const char *const *)keys, v, D,
				       NULL);
		if (w->last_rc)
			break;
		atomic_store(&w->acked, b + 1);
		atomic_store(&w->started, true);
	}
	for (int i = 0; i < BATCH; i++)
		free(keys[i]);
	dmann_close(d);
	return NULL;
}

Test(restart, a_full_cluster_sigkill_loses_no_acknowledged_write)
{
	struct writer w = { 0 };
	dmann_t *d = dmann_connect(cfgpath, "local");
	pthread_t t;
	int acked, n, found;
	char **keys;
	float *out, *want, *dist;
	char **got;
	uint32_t *cnt;

	cr_assert_not_null(d, "%s", dmann_errmsg());
	cr_assert_eq(dmann_create_index(d, "rbucket", "ridx", D, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	dmann_close(d);
	cr_assert_eq(pthread_create(&t, NULL, write_loop, &w), 0);
	for (int i = 0; i < 200 && atomic_load(&w.acked) < 5; i++)
		usleep(50000);
	cr_assert_geq(atomic_load(&w.acked), 5, "the writer does not write");
	usleep(500000);
	/* Every process of the cluster at once: nodes and etcd. */
	cr_assert_eq(sh("kill -9 $(awk '$1 == \"etcd\" {print $2; next} $1 ~ /^[0-9]+$/ {print $1}' "
			"%s/pids) 2>/dev/null; true", lc), 0);
	pthread_join(t, NULL);
	acked = atomic_load(&w.acked);
	fprintf(stderr, "FIGURES full-cluster SIGKILL: %d batches (%d vectors) acknowledged, the "
		"write in flight failed with %d\n", acked, acked * BATCH, w.last_rc);
	cr_assert_neq(w.last_rc, 0, "the writer wrote %d batches without noticing the kill", MAXB);

	/* Everything again, from its own data. */
	cr_assert_eq(sh("%s local start --dir %s etcd && for n in mn0 mn1 mn2 cn0 cn1; do %s local "
			"start --dir %s $n || exit 1; done", dmann, lc, dmann, lc), 0);
	d = NULL;
	for (int i = 0; i < 100 && !d; i++) {
		d = dmann_connect(cfgpath, "local");
		if (!d)
			usleep(100000);
	}
	cr_assert_not_null(d, "%s", dmann_errmsg());
	n = acked * BATCH;
	keys = malloc(sizeof(char *) * n);
	out = malloc(sizeof(float) * n * D);
	want = malloc(sizeof(float) * n * D);
	for (int i = 0; i < n; i++) {
		keys[i] = malloc(16);
		snprintf(keys[i], 16, "w%07d", i);
		for (uint32_t j = 0; j < D; j++)
			want[(size_t)i * D + j] = val((uint64_t)i, j);
	}
	found = -1;
	for (int i = 0; i < 100 && found != n; i++) {   /* the gateways may still be starting */
		found = dmann_get(d, "rbucket", "ridx", n, (const char *const *)keys, out, D, NULL);
		if (found != n)
			usleep(200000);
	}
	cr_assert_eq(found, n, "%d of %d acknowledged vectors after the restart: %s", found, n,
		     dmann_errmsg());
	cr_assert_arr_eq(out, want, sizeof(float) * n * D, "a vector changed");
	/* ... and each is found first by its own vector (a sample of up to 1,000). */
	{
		int q = n < 1000 ? n : 1000, step = n / q;
		float *qv = malloc(sizeof(float) * q * D);

		got = calloc((size_t)q, sizeof(char *));
		dist = malloc(sizeof(float) * q);
		cnt = calloc(q, sizeof(uint32_t));
		for (int i = 0; i < q; i++)
			memcpy(qv + (size_t)i * D, want + (size_t)i * step * D, sizeof(float) * D);
		cr_assert_eq(dmann_batch_query(d, "rbucket", "ridx", qv, q, D, 1, got, dist, cnt), 0,
			     "%s", dmann_errmsg());
		for (int i = 0; i < q; i++)
			cr_assert(cnt[i] == 1 && !strcmp(got[i], keys[i * step]) && dist[i] == 0.0f,
				  "vector %d found %s", i * step, got[i] ? got[i] : "nothing");
		dmann_free_keys(got, q);
		free(got);
		free(dist);
		free(cnt);
		free(qv);
	}
	for (int i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	free(out);
	free(want);
	dmann_close(d);
}
