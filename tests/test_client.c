/* test_client.c: client identities on a local cluster (2 MN + 2 CN, `dmann local up`, which
 * writes the identity [client.local]): a connection made with a client credential may
 * query and read counters, and is refused every admin operation (Q_CONFIG cache size /
 * index reload, FWD_ROUTER routing change) with -EPERM; memory nodes refuse a client
 * identity in the handshake (so a client can neither load an index nor reach remote
 * memory); a wrong client secret or an unknown identity is refused. */
#include <math.h>
#include <string.h>
#include <time.h>

#include "cluster_util.h"
#include "config.h"
#include "rpc.h"
#include "wire.h"
#include "xport/xport.h"

static char dir[128], dmann[300], cfgpath[256];
static struct dm_cluster_cfg cfg;

static void setup(void)
{
	const char *root = getenv("DMANN_BUILD_ROOT");
	char err[512];

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-client-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	/* the compute nodes answer QueryVectors 503 while dir/busy exists (a test hook) */
	snprintf(cfgpath, sizeof(cfgpath), "%s/busy", dir);
	setenv("DMANN_S3_TEST_BUSY_FILE", cfgpath, 1);
	/* exact answers are asserted: no graph for the API-created index ([s3] graph_auto) */
	cr_assert_eq(sh("%s local up --mn 2 --cn 2 --dir %s/lc --region-mb 32 --transport tcp "
			"--s3-set graph_auto=0", dmann, dir), 0);
	unsetenv("DMANN_S3_TEST_BUSY_FILE");
	snprintf(cfgpath, sizeof(cfgpath), "%s/lc/cluster.ini", dir);
	cr_assert_eq(dm_config_load_client(cfgpath, "local", &cfg, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(cfg.secret_len, 0, "a client must not read the cluster secret");
}

static void teardown(void)
{
	sh("%s local down --dir %s/lc", dmann, dir);
	if (!getenv("DMANN_KEEP_TEST_DIR"))
		sh("rm -rf %s", dir);
}

/* A transport context for client identity name with secret (len bytes). */
static struct dm_xport *client_xport(const char *name, const uint8_t *secret, size_t len)
{
	struct dm_xport_params p = { .backend = "tcp", .cluster = cfg.name, .secret = secret,
				     .secret_len = len, .client = name };
	struct dm_xport *x = dm_xport_open(&p);

	cr_assert_not_null(x, "open: %s", strerror(errno));
	return x;
}

static const struct dm_client_cfg *me(void)
{
	const struct dm_client_cfg *c = dm_config_client(&cfg, "local");

	cr_assert_not_null(c);
	cr_assert_geq(c->secret_len, 16);
	return c;
}

TestSuite(client, .init = setup, .fini = teardown, .timeout = 240);

Test(client, admin_ops_refused_queries_allowed)
{
	const struct dm_client_cfg *c = me();
	struct dm_xport *x = client_xport(c->name, c->secret, c->secret_len);
	struct dm_msgpool *pool = dm_msgpool_new(x, 16, 4096);

	cr_assert_not_null(pool);
	for (uint32_t n = 0; n < cfg.n_cn; n++) {
		struct dm_conn *conn;
		struct dm_rpc_chan ch;
		uint8_t resp[256], body[64];
		uint32_t rlen = 0;
		struct dm_wire_q_config qc = { .cache_bytes = 1 << 20, .admit_ppm = 100000,
					       .flags = DM_Q_CONFIG_CLEAR };
		struct dm_wire_fwd_rcfg rc = { .set = 1, .strategy = DM_ROUTE_ADAPTIVE };

		cr_assert_eq(dm_xport_connect(x, cfg.cn[n].address, 5000, &conn), 0,
			     "cn%u accepts the client identity", n);
		cr_assert_eq(dm_rpc_chan_init(&ch, conn, pool, 4096, 10000), 0);
		/* Counters: allowed. */
		cr_assert_eq(dm_rpc_call(&ch, DM_OP_Q_STATS, NULL, 0, resp, sizeof(resp), &rlen), 0);
		cr_assert_eq(rlen, sizeof(struct dm_wire_q_stats));
		/* Cache size / clear / index reload: refused. */
		dm_wire_q_config_encode(body, &qc);
		cr_assert_eq(dm_rpc_call(&ch, DM_OP_Q_CONFIG, body, sizeof(qc), NULL, 0, NULL),
			     -EPERM, "Q_CONFIG from a client must be -EPERM");
		/* Routing change: refused, and reading the router's state too (same op). */
		dm_wire_fwd_rcfg_encode(body, &rc);
		cr_assert_eq(dm_rpc_call(&ch, DM_OP_FWD_ROUTER, body, sizeof(rc), resp,
					 sizeof(resp), &rlen), -EPERM,
			     "FWD_ROUTER from a client must be -EPERM");
		/* The router's oracle (client-side routing): allowed; none without an index. */
		cr_assert_eq(dm_rpc_call(&ch, DM_OP_Q_ROUTER, NULL, 0, resp, sizeof(resp), &rlen),
			     -EAGAIN, "Q_ROUTER before any index: no oracle yet");
		/* The connection is still usable afterwards. */
		cr_assert_eq(dm_rpc_call(&ch, DM_OP_Q_STATS, NULL, 0, resp, sizeof(resp), &rlen), 0);
		dm_rpc_chan_fini(&ch);
		dm_conn_close(conn);
	}
	dm_msgpool_free(pool);
	dm_xport_close(x);
}

Test(client, memory_nodes_refuse_clients)
{
	const struct dm_client_cfg *c = me();
	struct dm_xport *x = client_xport(c->name, c->secret, c->secret_len);

	for (uint32_t n = 0; n < cfg.n_mn; n++) {
		struct dm_conn *conn = NULL;

		cr_assert_eq(dm_xport_connect(x, cfg.mn[n].address, 5000, &conn), -EACCES,
			     "mn%u must refuse a client identity", n);
	}
	/* So nothing that talks to the memory nodes (`dmann load`) can run as a client. */
	dm_xport_close(x);
}

Test(client, wrong_secret_or_unknown_identity_refused)
{
	const struct dm_client_cfg *c = me();
	uint8_t bad[64];
	struct dm_xport *x;
	struct dm_conn *conn = NULL;

	memcpy(bad, c->secret, c->secret_len);
	bad[0] ^= 1;
	x = client_xport(c->name, bad, c->secret_len);
	cr_assert_eq(dm_xport_connect(x, cfg.cn[0].address, 5000, &conn), -EACCES);
	dm_xport_close(x);
	x = client_xport("nobody", c->secret, c->secret_len);
	cr_assert_eq(dm_xport_connect(x, cfg.cn[0].address, 5000, &conn), -EACCES);
	dm_xport_close(x);
}

/* ---- libdmann on the same cluster: the S3 Vectors indexes through native C_CALLs ---- */
#include "dmann.h"

#include <math.h>

#define NV 20000
#define DIM 64
#define NQ 200
#define KK 10

/* dmann_search (the HNSW index's native search): bad input and no index, clear errors. */
Test(client, search_bad_input_and_no_index)
{
	dmann_t *d = dmann_connect(cfgpath, "local");
	struct dmann_search_params p = { .k = 10 };
	float v[8] = { 0 };
	uint64_t ids[20];
	uint32_t cnt[2];

	cr_assert_not_null(d, "%s", dmann_errmsg());
	v[3] = NAN;
	cr_assert_eq(dmann_search(d, v, 1, 8, &p, ids, NULL, cnt, NULL), -EINVAL);
	cr_assert(strstr(dmann_errmsg(), "component 3 is not finite"), "%s", dmann_errmsg());
	v[3] = 0;
	p.k = 0;
	cr_assert_eq(dmann_search(d, v, 1, 8, &p, ids, NULL, cnt, NULL), -EINVAL);
	cr_assert(strstr(dmann_errmsg(), "k 0"), "%s", dmann_errmsg());
	p.k = 10;
	cr_assert_eq(dmann_search(d, v, 1, 5000, &p, ids, NULL, cnt, NULL), -EINVAL);
	cr_assert(strstr(dmann_errmsg(), "too many dimensions"), "%s", dmann_errmsg());
	cr_assert_eq(dmann_search(d, v, 1, 8, &p, ids, NULL, cnt, NULL), -ENOENT);
	cr_assert(strstr(dmann_errmsg(), "no HNSW index is loaded"), "%s", dmann_errmsg());
	cr_assert_eq(ids[0], UINT64_MAX);
	cr_assert_eq(cnt[0], 0);
	dmann_close(d);
}

static float rnd(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((*s >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

Test(client, libdmann_put_query_delete_exact, .timeout = 600)
{
	dmann_t *d = dmann_connect(cfgpath, "local");
	float *v = malloc(sizeof(float) * NV * DIM), *q = malloc(sizeof(float) * NQ * DIM);
	char **keys = malloc(sizeof(char *) * NV), **got = calloc(NQ * KK, sizeof(char *));
	float *dist = malloc(sizeof(float) * NQ * KK);
	uint32_t *cnt = calloc(NQ, sizeof(uint32_t)), dim = 0;
	uint64_t s = 42;
	FILE *f;
	char path[300];

	cr_assert_not_null(d, "connect: %s", dmann_errmsg());
	for (size_t i = 0; i < (size_t)NV * DIM; i++)
		v[i] = rnd(&s);
	for (size_t i = 0; i < (size_t)NQ * DIM; i++)
		q[i] = rnd(&s);
	for (int i = 0; i < NV; i++) {
		keys[i] = malloc(16);
		snprintf(keys[i], 16, "v%05d", i);
	}
	cr_assert_eq(dmann_create_index(d, "cbucket", "cidx", DIM, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	cr_assert_eq(dmann_describe_index(d, "cbucket", "cidx", &dim, NULL), 0);
	cr_assert_eq(dim, DIM);
	uint64_t t0 = dm_now_ns();

	cr_assert_eq(dmann_put(d, "cbucket", "cidx", NV, (const char *const *)keys, v, DIM, NULL), 0,
		     "%s", dmann_errmsg());
	fprintf(stderr, "put %d x %d-d: %.2f s\n", NV, DIM, (dm_now_ns() - t0) / 1e9);
	/* Delete the first 1000, then batch-query. */
	cr_assert_eq(dmann_delete(d, "cbucket", "cidx", 1000, (const char *const *)keys), 0);
	t0 = dm_now_ns();
	cr_assert_eq(dmann_batch_query(d, "cbucket", "cidx", q, NQ, DIM, KK, got, dist, cnt), 0, "%s",
		     dmann_errmsg());
	fprintf(stderr, "C batch query: %d queries in %.3f s = %.1f q/s\n", NQ,
		(dm_now_ns() - t0) / 1e9, NQ / ((dm_now_ns() - t0) / 1e9));
	/* Brute force over the remaining vectors: same keys, |distance difference| <= 1e-5. */
	for (int i = 0; i < NQ; i++) {
		float best[KK];
		int bi[KK];

		for (int j = 0; j < KK; j++) {
			best[j] = INFINITY;
			bi[j] = -1;
		}
		for (int r = 1000; r < NV; r++) {
			double acc = 0;

			for (int e = 0; e < DIM; e++) {
				double df = (double)v[(size_t)r * DIM + e] - q[(size_t)i * DIM + e];

				acc += df * df;
			}
			float dd = (float)sqrt(acc);
			int p = KK;

			while (p > 0 && dd < best[p - 1])
				p--;
			if (p < KK) {
				memmove(best + p + 1, best + p, (KK - 1 - p) * sizeof(float));
				memmove(bi + p + 1, bi + p, (KK - 1 - p) * sizeof(int));
				best[p] = dd;
				bi[p] = r;
			}
		}
		cr_assert_eq(cnt[i], KK);
		for (int j = 0; j < KK; j++) {
			cr_assert_str_eq(got[i * KK + j], keys[bi[j]], "query %d rank %d", i, j);
			cr_assert_leq(fabsf(dist[i * KK + j] - best[j]), 1e-5f * fmaxf(1, best[j]),
				      "query %d rank %d: %g vs %g", i, j, dist[i * KK + j], best[j]);
		}
	}
	/* get: present and deleted keys. */
	float back[2 * DIM];
	uint8_t found[2];
	const char *gk[2] = { keys[5], keys[5000] };

	cr_assert_eq(dmann_get(d, "cbucket", "cidx", 2, gk, back, DIM, found), 1, "%s", dmann_errmsg());
	cr_assert_eq(found[0], 0);
	cr_assert_eq(found[1], 1);
	cr_assert_eq(memcmp(back + DIM, v + 5000 * DIM, DIM * sizeof(float)), 0,
		     "float32 must round-trip exactly");
	/* The same queries through the AWS SDK (tests/s3sdk/query_file.js) against cn0's
	 * gateway: same keys, distances within 1e-5. */
	{
		const char *root = getenv("DMANN_BUILD_ROOT"), *src = getenv("DMANN_SOURCE_ROOT");
		char http[DM_ADDR_MAX] = "", line[256];
		int row = 0;

		snprintf(path, sizeof(path), "%s/q.f32", dir);
		f = fopen(path, "wb");
		cr_assert_eq(fwrite(q, sizeof(float), (size_t)NQ * DIM, f), (size_t)NQ * DIM);
		fclose(f);
		cluster_http(cfgpath, http);
		cr_assert_eq(sh("node --no-warnings %s/tests/s3sdk/query_file.js %s/s3sdk-cache/"
				"node_modules http://%s DMANNLOCALTEST %s/lc/s3.secret cbucket cidx "
				"%s/q.f32 %d %d > %s/sdk.txt", src, root, http, dir, dir, DIM, KK, dir),
			     0, "the SDK comparison needs node and `ninja s3sdk-deps`");
		snprintf(path, sizeof(path), "%s/sdk.txt", dir);
		f = fopen(path, "r");
		cr_assert_not_null(f);
		while (fgets(line, sizeof(line), f)) {
			char key[64];
			double dd;

			cr_assert_eq(sscanf(line, "%63s %lf", key, &dd), 2);
			cr_assert_lt(row, NQ * KK);
			cr_assert_str_eq(key, got[row], "SDK row %d", row);
			cr_assert_leq(fabs(dd - dist[row]), 1e-5, "SDK row %d: %g vs %g", row, dd,
				      dist[row]);
			row++;
		}
		fclose(f);
		cr_assert_eq(row, NQ * KK, "SDK returned %d results", row);
	}

	/* Bad input: clear errors, never a crash. */
	float bad[DIM] = { 0 };
	char *k1[KK];
	float d1[KK];
	const char *badkey[1] = { "" };

	bad[3] = NAN;
	cr_assert_eq(dmann_query(d, "cbucket", "cidx", bad, DIM, KK, k1, d1), -EINVAL);
	cr_assert(strstr(dmann_errmsg(), "NaN or Inf"), "%s", dmann_errmsg());
	bad[3] = INFINITY;
	cr_assert_eq(dmann_put(d, "cbucket", "cidx", 1, (const char *const *)keys, bad, DIM, NULL),
		     -EINVAL);
	bad[3] = 0;
	cr_assert_eq(dmann_query(d, "cbucket", "nosuch", bad, DIM, KK, k1, d1), -ENOENT);
	cr_assert(strstr(dmann_errmsg(), "nosuch"), "%s", dmann_errmsg());
	cr_assert_eq(dmann_query(d, "cbucket", "cidx", bad, DIM, 0, k1, d1), -EINVAL);
	cr_assert_eq(dmann_query(d, "cbucket", "cidx", bad, DIM, 1000, k1, d1), -EINVAL);
	cr_assert_eq(dmann_put(d, "cbucket", "cidx", 1, badkey, bad, DIM, NULL), -EINVAL);
	cr_assert(strstr(dmann_errmsg(), "key 0"), "%s", dmann_errmsg());
	cr_assert_eq(dmann_batch_query(d, "cbucket", "cidx", q, DMANN_MAX_BATCH + 1, DIM, KK,
				       got, dist, cnt), -E2BIG);
	cr_assert_eq(dmann_query(d, "cbucket", "cidx", bad, DIM - 1, KK, k1, d1), -EINVAL);
	cr_assert(strstr(dmann_errmsg(), "wrong dimension"), "%s", dmann_errmsg());
	cr_assert_eq(dmann_create_index(d, "cbucket", "cidx", DIM, DMANN_EUCLIDEAN), -EEXIST);
	cr_assert_eq(dmann_create_index(d, "cbucket", "x", 0, DMANN_EUCLIDEAN), -EINVAL);
	cr_assert_eq(dmann_query(NULL, "cbucket", "cidx", bad, DIM, KK, k1, d1), -EINVAL);

	dmann_free_keys(got, NQ * KK);
	for (int i = 0; i < NV; i++)
		free(keys[i]);
	free(keys);
	free(got);
	free(dist);
	free(cnt);
	free(v);
	free(q);
	dmann_close(d);
}

/* A compute node SIGKILLed in the middle of a large put and of a query batch: libdmann sends
 * the requests it had in flight there to the other compute node (once each); both calls
 * succeed and every acknowledged vector is there. */
Test(client, libdmann_calls_survive_a_compute_node_kill, .timeout = 300)
{
	enum { N = 120000, D = 16, Q = 2000 };
	dmann_t *d = dmann_connect(cfgpath, "local");
	float *v = malloc(sizeof(float) * N * D), *out = malloc(sizeof(float) * N * D);
	float *dist = malloc(sizeof(float) * Q * 4);
	char **keys = malloc(sizeof(char *) * N), **got = calloc((size_t)Q * 4, sizeof(char *));
	uint32_t *cnt = calloc(Q, sizeof(uint32_t));
	uint8_t *found = calloc(N, 1);
	uint64_t s = 7, t0;
	int nf;

	cr_assert_not_null(d, "connect: %s", dmann_errmsg());
	for (size_t i = 0; i < (size_t)N * D; i++)
		v[i] = rnd(&s);
	for (int i = 0; i < N; i++) {
		keys[i] = malloc(16);
		snprintf(keys[i], 16, "k%05d", i);
	}
	cr_assert_eq(dmann_create_index(d, "kbucket", "kidx", D, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	cr_assert_eq(dmann_put(d, "kbucket", "kidx", 1000, (const char *const *)keys, v, D, NULL),
		     0, "%s", dmann_errmsg());
	t0 = dm_now_ns();
	/* The kill lands while the put below runs (it takes seconds): the kill's wall time
	 * (before the SIGKILL) is logged and must fall inside the put. */
	cr_assert_eq(sh("(sleep 0.3; date +%%s.%%N >%s/kill.t; %s local kill --dir %s/lc cn1 "
			">%s/kill.log 2>&1) &", dir, dmann, dir, dir), 0);
	cr_assert_eq(dmann_put(d, "kbucket", "kidx", N - 1000, (const char *const *)keys + 1000,
			       v + 1000 * D, D, NULL), 0, "put failed though cn0 is up: %s",
		     dmann_errmsg());
	{
		struct timespec ts;
		double end, kt = 0;
		char p[300];
		FILE *f;

		clock_gettime(CLOCK_REALTIME, &ts);
		end = ts.tv_sec + ts.tv_nsec / 1e9;
		fprintf(stderr, "FIGURES put of %d vectors across a compute node kill: %.2f s\n",
			N - 1000, (dm_now_ns() - t0) / 1e9);
		for (int i = 0; i < 100 && sh("grep -q 'killed cn1' %s/kill.log 2>/dev/null", dir);
		     i++)
			usleep(100000);
		cr_assert_eq(sh("grep -q 'killed cn1' %s/kill.log", dir), 0, "the kill did not happen");
		snprintf(p, sizeof(p), "%s/kill.t", dir);
		f = fopen(p, "r");
		cr_assert_not_null(f);
		cr_assert_eq(fscanf(f, "%lf", &kt), 1);
		fclose(f);
		cr_assert_lt(kt, end, "the put ended before the kill: nothing was in flight on cn1");
	}
	/* Every acknowledged vector is there, exactly. */
	nf = dmann_get(d, "kbucket", "kidx", N, (const char *const *)keys, out, D, found);
	cr_assert_eq(nf, N, "%d of %d found: %s", nf, N, dmann_errmsg());
	cr_assert_arr_eq(out, v, sizeof(float) * N * D);
	/* Queries on the survivor: each stored vector finds itself. */
	cr_assert_eq(dmann_batch_query(d, "kbucket", "kidx", v, Q, D, 4, got, dist, cnt), 0, "%s",
		     dmann_errmsg());
	for (int i = 0; i < Q; i++)
		cr_assert(cnt[i] >= 1 && got[i * 4] && !strcmp(got[i * 4], keys[i]) &&
			  dist[i * 4] == 0.0f, "query %d found %s", i, got[i * 4]);
	dmann_free_keys(got, (size_t)Q * 4);
	for (int i = 0; i < N; i++)
		free(keys[i]);
	free(keys);
	free(got);
	free(v);
	free(out);
	free(dist);
	free(cnt);
	free(found);
	dmann_close(d);
}

/* A read answered 503 (ServiceUnavailable, "retry later") is sent again after a back-off,
 * 100 ms doubling, up to DMANN_BUSY_TRIES (5) more times, about 3.1 s in all: a query
 * during a half-second busy spell succeeds with the right answer; one while the cluster
 * stays busy fails with -EAGAIN and the server's message, after the back-offs. */
Test(client, libdmann_sends_busy_reads_again, .timeout = 120)
{
	enum { N = 10, D = 8 };
	dmann_t *d = dmann_connect(cfgpath, "local");
	float v[N * D], dist[4];
	char *keys[N], *got[4] = { 0 };
	uint64_t s = 11, t0;
	double took;
	int rc;

	cr_assert_not_null(d, "connect: %s", dmann_errmsg());
	for (int i = 0; i < N * D; i++)
		v[i] = rnd(&s);
	for (int i = 0; i < N; i++) {
		keys[i] = malloc(16);
		snprintf(keys[i], 16, "b%d", i);
	}
	cr_assert_eq(dmann_create_index(d, "bbucket", "bidx", D, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	cr_assert_eq(dmann_put(d, "bbucket", "bidx", N, (const char *const *)keys, v, D, NULL),
		     0, "%s", dmann_errmsg());
	/* a busy spell of 0.5 s: the sends at 0, 0.1 and 0.3 s are refused, 0.7 s is served */
	cr_assert_eq(sh("touch %s/busy; (sleep 0.5; rm -f %s/busy) &", dir, dir), 0);
	t0 = dm_now_ns();
	rc = dmann_query(d, "bbucket", "bidx", v + 3 * D, D, 4, got, dist);
	took = (double)(dm_now_ns() - t0) / 1e9;
	cr_assert_eq(rc, 4, "query during a short busy spell: %d (%s)", rc, dmann_errmsg());
	cr_assert_str_eq(got[0], "b3");
	cr_assert_eq(dist[0], 0.0f);
	cr_assert_geq(took, 0.1, "answered after %.2f s: was it ever refused?", took);
	dmann_free_keys(got, 4);
	/* busy all along: refused six times, then -EAGAIN */
	cr_assert_eq(sh("touch %s/busy", dir), 0);
	t0 = dm_now_ns();
	rc = dmann_query(d, "bbucket", "bidx", v, D, 4, got, dist);
	took = (double)(dm_now_ns() - t0) / 1e9;
	cr_assert_eq(rc, -EAGAIN, "query while busy: %d (%s)", rc, dmann_errmsg());
	cr_assert(strstr(dmann_errmsg(), "ServiceUnavailable"), "%s", dmann_errmsg());
	cr_assert_geq(took, 3.0, "gave up after %.2f s, before the back-offs (3.1 s)", took);
	cr_assert_eq(sh("rm -f %s/busy", dir), 0);
	cr_assert_eq(dmann_query(d, "bbucket", "bidx", v, D, 4, got, dist), 4, "%s",
		     dmann_errmsg());
	dmann_free_keys(got, 4);
	for (int i = 0; i < N; i++)
		free(keys[i]);
	dmann_close(d);
}

/* Every compute node SIGKILLed: calls fail at once with "Host is down", none hangs. */
Test(client, libdmann_fails_fast_without_compute_nodes, .timeout = 120)
{
	dmann_t *d = dmann_connect(cfgpath, "local");
	const char *key = "a";
	float v[8] = { 1 };
	uint64_t ids[10], t0;
	struct dmann_search_params p = { .k = 10 };
	int rc;

	cr_assert_not_null(d, "connect: %s", dmann_errmsg());
	cr_assert_eq(dmann_create_index(d, "zbucket", "zidx", 8, DMANN_EUCLIDEAN), 0, "%s",
		     dmann_errmsg());
	cr_assert_eq(sh("%s local kill --dir %s/lc cn0 && %s local kill --dir %s/lc cn1", dmann,
			dir, dmann, dir), 0);
	t0 = dm_now_ns();
	rc = dmann_put(d, "zbucket", "zidx", 1, &key, v, 8, NULL);
	cr_assert_eq(rc, -EHOSTDOWN, "put: %d (%s)", rc, dmann_errmsg());
	rc = dmann_search(d, v, 1, 8, &p, ids, NULL, NULL, NULL);
	cr_assert_eq(rc, -EHOSTDOWN, "search: %d (%s)", rc, dmann_errmsg());
	cr_assert(strstr(dmann_errmsg(), "no compute node is reachable"), "%s", dmann_errmsg());
	fprintf(stderr, "FIGURES both CNs dead: put and search failed in %.2f s\n",
		(dm_now_ns() - t0) / 1e9);
	cr_assert_lt(dm_now_ns() - t0, 10ull * 1000000000ull, "calls without a CN took too long");
	dmann_close(d);
}
