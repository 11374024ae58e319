/* test_router.c: the router on a local cluster (4 compute + 2 memory nodes, tcp, loopback).
 *   - every compute node process builds the oracle from the index on the memory nodes and
 *     they all end up with bit-identical centroids (same FNV-1a hash of the centroids,
 *     reported by each process through FWD_ROUTER / `dmann status --json`);
 *   - 100,000 queries sent round-robin to the compute nodes with --routing bestfit, most of
 *     them forwarded through the memory nodes, get every answer exactly once (the bench
 *     fails on a missing answer after 30 s and on any answer it does not expect: a duplicate
 *     or a wrong qid), and the answers equal those of the same stream without routing;
 *   - with a pause threshold of 1 routing pauses and every query is still answered;
 *   - with re-clustering at CSP > 0 after 1 s, the compute nodes move to a new oracle epoch
 *     and again agree on the centroids;
 *   - mass drift: a static index never re-clusters for mass; online inserts that all land in
 *     one region do, and the compute nodes agree on the new epoch. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cluster_util.h"

static char dir[128], dmann[300];

static char *capture(const char *cmd)
{
	FILE *f = popen(cmd, "r");
	char *out = calloc(1, 1 << 16);
	size_t n;

	if (!f || !out) {
		if (f)
			pclose(f);
		free(out);
		return NULL;
	}
	n = fread(out, 1, (1 << 16) - 1, f);
	out[n] = 0;
	if (pclose(f)) {
		free(out);
		return NULL;
	}
	return out;
}

/* A cluster of 4 CNs + 2 MNs (`dmann local up` options `extra`) with a 4,000-row index,
 * loaded with `spare` rows of room for online inserts (0: none). */
static void setup_cluster(const char *extra, int spare)
{
	const char *root = getenv("DMANN_BUILD_ROOT");

	cr_assert_not_null(root, "DMANN_BUILD_ROOT must point at the build directory");
	snprintf(dmann, sizeof(dmann), "%s/cn/dmann", root);
	snprintf(dir, sizeof(dir), "/tmp/dmann-router-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	cr_assert_eq(sh("%s gen --kind deep --n 4000 --nq 1000 --seed 5 --out %s/data >/dev/null",
			dmann, dir), 0);
	cr_assert_eq(sh("%s build --base %s/data/base.fbin --metric l2 --M 8 --efc 60 --threads 1 "
			"--block-shift 9 --out %s/idx.hnsw >/dev/null", dmann, dir, dir), 0);
	cr_assert_eq(sh("%s local up --mn 2 --cn 4 --dir %s/lc --region-mb %d --transport tcp "
			"--host 127.0.0.1 %s", dmann, dir, spare ? 32 : 16, extra), 0);
	cr_assert_eq(sh("%s load --config %s/lc/cluster.ini --index %s/idx.hnsw --spare %d",
			dmann, dir, dir, spare), 0);
}

static void setup_with(const char *extra)
{
	setup_cluster(extra, 0);
}

static void setup(void)
{
	setup_with("");
}

static void teardown(void)
{
	sh("%s local down --dir %s/lc", dmann, dir);
	if (getenv("DMANN_KEEP_TEST_DIR"))
		return;
	sh("rm -rf %s", dir);
}

/* The oracle epochs and centroid hashes the 4 compute nodes report. */
static int epochs(unsigned long long h[4], unsigned e[4])
{
	char cmd[512], *out, *p, *q;
	int n = 0;

	snprintf(cmd, sizeof(cmd), "%s status --config %s/lc/cluster.ini --json", dmann, dir);
	out = capture(cmd);
	if (!out)
		return -1;
	for (p = out; n < 4 && (p = strstr(p, "\"centroid_hash\": \"")); n++) {
		p += strlen("\"centroid_hash\": \"");
		h[n] = strtoull(p, NULL, 16);
		q = strstr(p, "\"oracle_epoch\": ");
		e[n] = q ? (unsigned)strtoul(q + strlen("\"oracle_epoch\": "), NULL, 10) : ~0u;
	}
	free(out);
	return n;
}

/* The centroid hashes the 4 compute nodes report (0 until a node built its oracle). */
static int centroid_hashes(unsigned long long h[4])
{
	unsigned e[4];

	return epochs(h, e);
}

TestSuite(router, .init = setup, .fini = teardown, .timeout = 300);

Test(router, identical_centroids_in_every_cn_process)
{
	unsigned long long h[4] = { 0 };
	int n = 0;

	/* Each compute node builds its oracle right after it found the index. */
	for (int i = 0; i < 300; i++) {
		n = centroid_hashes(h);
		if (n == 4 && h[0] && h[1] && h[2] && h[3])
			break;
		usleep(100000);
	}
	cr_assert_eq(n, 4, "status reports 4 compute nodes");
	cr_assert_neq(h[0], 0, "compute node 0 built an oracle");
	for (int i = 1; i < 4; i++)
		cr_expect_eq(h[i], h[0], "cn%d centroid hash %016llx differs from cn0's %016llx", i,
			     h[i], h[0]);
}

/* A field of the one-line JSON bench output. */
static double json_num(const char *js, const char *key)
{
	char k[64];
	const char *p;

	snprintf(k, sizeof(k), "\"%s\": ", key);
	p = strstr(js, k);
	return p ? strtod(p + strlen(k), NULL) : -1;
}

/* Wait until the 4 compute nodes have their oracle, then write the reference answers of
 * the stream without routing (none.ibin). */
static void reference_answers(void)
{
	unsigned long long h[4] = { 0 };

	for (int i = 0; i < 300; i++)
		if (centroid_hashes(h) == 4 && h[0] && h[1] && h[2] && h[3])
			break;
		else
			usleep(100000);
	cr_assert_eq(sh("%s bench --config %s/lc/cluster.ini --query %s/data/query.fbin --gt "
			"%s/data/gt.ibin --k 10 --ef 16 --cache-ratio 10%% --nq 1000 --out %s/none.ibin",
			dmann, dir, dir, dir, dir), 0);
}

/* Every answer in DIR/name is the reference answer (none.ibin) of its query (answer i of
 * query i % 1000); what names the run in a failure. */
static void same_as_unrouted(const char *name, const char *what)
{
	struct dm_vecs a = { 0 }, b = { 0 };
	char p[256], err[256];

	snprintf(p, sizeof(p), "%s/none.ibin", dir);
	cr_assert_eq(dm_vecs_read(p, DM_VF_AUTO, &a, err, sizeof(err)), 0, "%s", err);
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	cr_assert_eq(dm_vecs_read(p, DM_VF_AUTO, &b, err, sizeof(err)), 0, "%s", err);
	for (size_t i = 0; i < b.n; i++)
		cr_assert_eq(memcmp((const int32_t *)b.data + i * 10,
				    (const int32_t *)a.data + (i % 1000) * 10, 10 * sizeof(int32_t)),
			     0, "%s: answer %zu is not the answer of query %zu", what, i, i % 1000);
	dm_vecs_free(&a);
	dm_vecs_free(&b);
}

/* About 2 minutes on an idle 2-core machine; much longer under ASan on a loaded one. */
Test(router, every_forwarded_answer_exactly_once, .timeout = 1200)
{
	char cmd[1024], *out;
	struct dm_vecs a = { 0 }, b = { 0 };
	char err[256], p[256];
	/* Queries in the stream: 100,000, or DMANN_ROUTER_STREAM (a multiple of 1,000; the
	 * sanitizer build's suite runs 25,000). */
	const char *e = getenv("DMANN_ROUTER_STREAM");
	const unsigned stream = e ? (unsigned)atoi(e) : 100000;

	cr_assert(stream >= 10000 && stream <= 1000000 && stream % 1000 == 0,
		  "DMANN_ROUTER_STREAM=%s", e);
	reference_answers();
	/* The 1000 queries stream / 1000 times over, 16 in flight per compute node, sent
	 * round robin: the receiving compute node routes (relays). */
	snprintf(cmd, sizeof(cmd), "%s bench --config %s/lc/cluster.ini --query %s/data/query.fbin "
		 "--gt %s/data/gt.ibin --k 10 --ef 16 --cache-ratio 10%% --nq %u --conns 1 "
		 "--depth 16 --routing bestfit --client-routing no --out %s/fwd.ibin --json", dmann,
		 dir, dir, dir, stream, dir);
	fprintf(stderr, "+ %s\n", cmd);
	out = capture(cmd);
	cr_assert_not_null(out, "the bench with forwarding failed (a lost, duplicate or wrong "
			   "answer fails it)");
	fprintf(stderr, "%s", out);
	cr_expect_eq(json_num(out, "queries"), (double)stream, "every query answered");
	cr_expect_eq(json_num(out, "errors"), 0.0, "no query failed");
	cr_expect_gt(json_num(out, "forwarded"), 0.5, "most queries were forwarded");
	free(out);

	/* The answers are those of the same queries run without routing. */
	snprintf(p, sizeof(p), "%s/none.ibin", dir);
	cr_assert_eq(dm_vecs_read(p, DM_VF_AUTO, &a, err, sizeof(err)), 0, "%s", err);
	snprintf(p, sizeof(p), "%s/fwd.ibin", dir);
	cr_assert_eq(dm_vecs_read(p, DM_VF_AUTO, &b, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(a.n, 1000);
	cr_assert_eq(b.n, stream);
	for (size_t i = 0; i < b.n; i++)
		cr_assert_eq(memcmp((const int32_t *)b.data + i * 10,
				    (const int32_t *)a.data + (i % 1000) * 10, 10 * sizeof(int32_t)), 0,
			     "answer %zu is not the answer of query %zu", i, i % 1000);
	dm_vecs_free(&a);
	dm_vecs_free(&b);

	/* Every forwarded query ran exactly once on its target: sum(forwarded) == sum(received). */
	snprintf(cmd, sizeof(cmd), "%s status --config %s/lc/cluster.ini --json", dmann, dir);
	out = capture(cmd);
	cr_assert_not_null(out);
	{
		unsigned long long fw = 0, rc = 0;
		const char *q = out;

		while ((q = strstr(q, "\"forwarded\": "))) {
			fw += strtoull(q + 13, NULL, 10);
			q = strstr(q, "\"received\": ");
			cr_assert_not_null(q);
			rc += strtoull(q + 12, NULL, 10);
		}
		cr_expect_gt(fw, stream / 2, "forwarded %llu of %u", fw, stream);
		cr_expect_eq(fw, rc, "forwarded %llu, received %llu", fw, rc);
	}
	free(out);
}

/* Client-side routing (libdmann holds the oracle): the same answers as without routing,
 * each query sent straight to the compute node the router picks, almost none relayed. */
Test(router, client_side_routing_sends_queries_straight, .timeout = 1200)
{
	char cmd[1024], *out;

	reference_answers();
	for (int st = 0; st < 2; st++) {
		const char *strategy = st ? "adaptive" : "bestfit";

		snprintf(cmd, sizeof(cmd), "%s bench --config %s/lc/cluster.ini --query "
			 "%s/data/query.fbin --gt %s/data/gt.ibin --k 10 --ef 16 --cache-ratio 10%% "
			 "--nq 20000 --routing %s --batch 100 --out %s/cli.ibin --json", dmann, dir,
			 dir, dir, strategy, dir);
		fprintf(stderr, "+ %s\n", cmd);
		out = capture(cmd);
		cr_assert_not_null(out, "the bench with client-side routing failed");
		fprintf(stderr, "%s", out);
		cr_expect_eq(json_num(out, "queries"), 20000.0, "%s: every query answered", strategy);
		cr_expect_eq(json_num(out, "errors"), 0.0, "%s: no query failed", strategy);
		cr_expect_gt(json_num(out, "client_routed"), 0.99, "%s: the client routed them",
			     strategy);
		cr_expect_lt(json_num(out, "relayed"), 0.10, "%s: at most 10%% relayed", strategy);
		cr_expect_lt(json_num(out, "forwarded"), 0.10, "%s: the CNs forwarded few",
			     strategy);
		free(out);
		same_as_unrouted("cli.ibin", strategy);
	}
}

/* Wait (at most 30 s) until the 4 compute nodes run one epoch >= 1 with one centroid hash;
 * h and e receive what they report. */
static void agree_on_new_epoch(unsigned long long h[4], unsigned e[4])
{
	bool agreed = false;

	for (int i = 0; i < 300 && !agreed; i++) {
		agreed = epochs(h, e) == 4 && e[0] >= 1 && e[0] != ~0u;
		for (int c = 1; agreed && c < 4; c++)
			agreed = e[c] == e[0] && h[c] == h[0];
		if (!agreed)
			usleep(100000);
	}
	cr_assert(agreed, "epochs %u %u %u %u, hashes %016llx %016llx %016llx %016llx", e[0], e[1],
		  e[2], e[3], h[0], h[1], h[2], h[3]);
}

/* ---- pause threshold and re-clustering (their own cluster: re-clustering on at CSP > 0
 * after 1 s, so that it happens within the test) -------------------------------------------- */

static void setup_policy(void)
{
	setup_with("--router recluster_csp=0 --router recluster_secs=1");
}

Test(router_policy, pause_threshold_and_reclustering, .init = setup_policy, .fini = teardown,
     .timeout = 600)
{
	char cmd[1024], *out;
	unsigned long long h[4] = { 0 }, h0;
	unsigned e[4] = { 0 };
	bool moved = false;

	for (int i = 0; i < 300; i++)
		if (epochs(h, e) == 4 && h[0] && h[1] && h[2] && h[3])
			break;
		else
			usleep(100000);
	cr_assert(h[0] && h[0] == h[1] && h[0] == h[2] && h[0] == h[3], "one oracle at start");
	h0 = h[0];

	/* Pause threshold 1: routing pauses whenever more than one query is queued on a CN;
	 * queries wait in the intake, and every one is still answered exactly once. */
	snprintf(cmd, sizeof(cmd), "%s bench --config %s/lc/cluster.ini --query %s/data/query.fbin "
		 "--gt %s/data/gt.ibin --k 10 --ef 16 --cache-ratio 40%% --spill-cache yes "
		 "--nq 3000 --conns 1 --depth 16 --routing adaptive --batch 100 --pause 1 --json",
		 dmann, dir, dir, dir);
	fprintf(stderr, "+ %s\n", cmd);
	out = capture(cmd);
	cr_assert_not_null(out, "the bench with --pause 1 failed");
	fprintf(stderr, "%s", out);
	cr_expect_eq(json_num(out, "queries"), 3000.0, "every query answered");
	cr_expect_eq(json_num(out, "errors"), 0.0);
	cr_expect_gt(json_num(out, "pauses"), 0.0, "routing paused");
	free(out);

	/* The CSP estimate is a Prometheus metric too (compute node 0's /metrics). */
	snprintf(cmd, sizeof(cmd), "python3 -c \"import sys, urllib.request; print(urllib.request."
		 "urlopen('http://' + sys.argv[1] + '/metrics', timeout=10).read().decode())\" "
		 "$(awk '/^\\[/ { c = ($0 == \"[cn.0]\") } c && $1 == \"metrics\" { print $3 }' "
		 "%s/lc/cluster.ini)", dir);
	out = capture(cmd);
	cr_assert_not_null(out, "GET /metrics of cn0 failed");
	cr_expect_not_null(strstr(out, "dmann_cn_cache_split_penalty{node=\"0\"} "), "%s", out);
	cr_expect_not_null(strstr(out, "dmann_cn_routing_pauses_total{node=\"0\"} "), "%s", out);
	free(out);

	/* The CSP of routed caches is above 0 for longer than 1 s: the CNs move to epoch 1+
	 * (next seed) and again agree on the centroids without exchanging them. (The caches are
	 * large, 40%, and spilled queries fill them, so that duplicates are there to be seen in
	 * the CSP's 1/64 sample: with neighbour codes the compute nodes keep the upper levels
	 * themselves, and well-routed caches of level-0 records barely overlap.) */
	for (int i = 0; i < 300 && !moved; i++) {
		if (epochs(h, e) == 4)
			for (int c = 0; c < 4; c++)
				moved |= e[c] >= 1 && e[c] != ~0u;
		if (!moved)
			usleep(100000);
	}
	cr_assert(moved, "no compute node re-clustered within 30 s");
	/* Stop routing (re-clustering only runs while routing is on); the others follow the
	 * highest epoch the memory nodes report. */
	cr_assert_eq(sh("%s bench --config %s/lc/cluster.ini --query %s/data/query.fbin --gt "
			"%s/data/gt.ibin --k 10 --ef 16 --cache-ratio 10%% --nq 10 --routing none "
			">/dev/null", dmann, dir, dir, dir), 0);
	agree_on_new_epoch(h, e);
	cr_expect_neq(h[0], h0, "a new epoch gives new centroids");
}

/* ---- partitions as key ranges ([router] partitions = keyrange) ---------------------------- */

static void setup_keyrange(void)
{
	setup_with("--router partitions=keyrange");
}

/* The 4 compute nodes fit the same VHash and cut the same key ranges (equal centroid hashes,
 * the log says so); client-side routing on them (adaptive-ring: spills to the neighbouring
 * key ranges) gives the answers of the unrouted queries and sends them straight. */
Test(router_keyrange, same_key_ranges_everywhere_and_routed_answers, .init = setup_keyrange,
     .fini = teardown, .timeout = 1200)
{
	unsigned long long h[4] = { 0 };
	char cmd[1024], *out;

	reference_answers();
	cr_assert_eq(centroid_hashes(h), 4);
	for (int i = 1; i < 4; i++)
		cr_expect_eq(h[i], h[0], "cn%d centroid hash %016llx differs from cn0's %016llx", i,
			     h[i], h[0]);
	cr_assert_eq(sh("grep -q 'key ranges from' %s/lc/cn0.log", dir), 0,
		     "cn0 did not build key-range partitions");
	snprintf(cmd, sizeof(cmd), "%s bench --config %s/lc/cluster.ini --query %s/data/query.fbin "
		 "--gt %s/data/gt.ibin --k 10 --ef 16 --cache-ratio 10%% --nq 10000 --routing "
		 "adaptive-ring --batch 100 --out %s/kr.ibin --json", dmann, dir, dir, dir, dir);
	fprintf(stderr, "+ %s\n", cmd);
	out = capture(cmd);
	cr_assert_not_null(out, "the bench with key-range routing failed");
	fprintf(stderr, "%s", out);
	cr_expect_eq(json_num(out, "queries"), 10000.0, "every query answered");
	cr_expect_eq(json_num(out, "errors"), 0.0, "no query failed");
	cr_expect_gt(json_num(out, "client_routed"), 0.99, "the client routed them");
	cr_expect_lt(json_num(out, "relayed"), 0.10, "at most 10%% relayed");
	free(out);
	same_as_unrouted("kr.ibin", "adaptive-ring on key ranges");
}

/* ---- mass drift ([router] recluster_mass) ----------------------------------------------- */

/* A metric of compute node c (its /metrics), -1 when absent. */
static double cn_metric(int c, const char *name)
{
	char cmd[1024], key[128], *out, *p;
	double v = -1;

	snprintf(cmd, sizeof(cmd), "python3 -c \"import sys, urllib.request; print(urllib.request."
		 "urlopen('http://' + sys.argv[1] + '/metrics', timeout=10).read().decode())\" "
		 "$(awk '/^\\[/ { c = ($0 == \"[cn.%d]\") } c && $1 == \"metrics\" { print $3 }' "
		 "%s/lc/cluster.ini)", c, dir);
	out = capture(cmd);
	if (!out)
		return -1;
	snprintf(key, sizeof(key), "%s{node=\"%d\"} ", name, c);
	p = strstr(out, key);
	if (p)
		v = strtod(p + strlen(key), NULL);
	free(out);
	return v;
}

/* 4,000 rows with room for 5,000 more; a second set of 4,000 rows drawn from one mixture
 * component (they all land in one region of the index); routing on (the mass check runs
 * while it is), the sample at level 1 (about 500 nodes: the level-0 sample would be READ,
 * and the mass check does not READ), re-clustering after 1 s of drift above 0.2 (the
 * inserts raise the largest partition from about 1.1 to about 1.5 fair shares), and CSP
 * re-clustering off (the CSP is never above 1). */
static void setup_mass(void)
{
	setup_cluster("--router strategy=adaptive --router recluster_secs=1 "
		      "--router recluster_csp=1 --router recluster_mass=0.2 "
		      "--router sample_min_nodes=100", 5000);
	cr_assert_eq(sh("%s gen --kind deep --n 4000 --nq 10 --seed 11 --clusters 1 --out %s/skew "
			">/dev/null", dmann, dir), 0);
}

Test(router_mass, inserts_in_one_region_recluster, .init = setup_mass, .fini = teardown,
     .timeout = 600)
{
	unsigned long long h[4] = { 0 };
	unsigned e[4] = { 0 };
	double base = -1, before;
	bool moved = false;

	for (int i = 0; i < 300; i++)
		if (epochs(h, e) == 4 && h[0] && h[1] && h[2] && h[3])
			break;
		else
			usleep(100000);
	cr_assert(h[0] && h[0] == h[1] && h[0] == h[2] && h[0] == h[3], "one oracle at start");
	/* the first pass measures what the fit left */
	for (int i = 0; i < 300 && base < 0; i++) {
		base = cn_metric(0, "dmann_cn_route_mass_ratio_at_fit");
		if (base < 0)
			usleep(100000);
	}
	cr_assert_geq(base, 1.0, "cn0 measured no mass ratio in 30 s");
	cr_assert_leq(base, 2.0, "a fresh fit leaves the largest partition at %.3f fair shares",
		      base);
	/* A static index: passes every 5 s, 12 s of them, no re-clustering */
	sleep(12);
	cr_assert_eq(epochs(h, e), 4);
	for (int c = 0; c < 4; c++)
		cr_assert_eq(e[c], 0, "cn%d re-clustered (epoch %u) without drift", c, e[c]);
	cr_assert_gt(cn_metric(0, "dmann_cn_route_mass_passes_total"), 1.0);
	before = cn_metric(0, "dmann_cn_route_mass_ratio");
	cr_expect_float_eq(before, base, 1e-6, "the same sample, the same ratio");

	/* 4,000 rows of one component: the level-1 sample grows by about 500 nodes, all of
	 * them in one partition */
	cr_assert_eq(sh("%s insert --config %s/lc/cluster.ini --vectors %s/skew/base.fbin "
			"--no-snapshot --json", dmann, dir, dir), 0);
	double drifted = 0;

	for (int i = 0; i < 600 && !moved; i++) {
		if (epochs(h, e) == 4)
			for (int c = 0; c < 4; c++)
				moved |= e[c] >= 1 && e[c] != ~0u;
		if (!moved && i % 20 == 0) {
			double m = cn_metric(0, "dmann_cn_route_mass_ratio");

			drifted = m > drifted ? m : drifted;
			fprintf(stderr, "cn0: mass ratio %.3f (%.3f after the fit), %.0f upper-level "
				"nodes added\n", m, cn_metric(0, "dmann_cn_route_mass_ratio_at_fit"),
				cn_metric(0, "dmann_cn_upper_added_total"));
		}
		if (!moved)
			usleep(100000);
	}
	cr_assert(moved, "no compute node re-clustered within 60 s of the inserts");
	cr_assert_eq(sh("grep -q 'largest partition holds' %s/lc/cn*.log", dir), 0,
		     "no mass re-clustering in the compute nodes' logs");
	sh("grep -h 'largest partition holds\\|oracle epoch .* active' %s/lc/cn*.log >&2", dir);
	agree_on_new_epoch(h, e);
	/* The new epoch was fitted on a sample with the inserted nodes: it balances them. */
	double refit = -1;

	for (int i = 0; i < 300; i++) {
		unsigned ec = 0;

		epochs(h, e);
		ec = e[0];
		/* the epoch of the last measure first: its base is set before it */
		double me = cn_metric(0, "dmann_cn_route_mass_epoch");

		refit = cn_metric(0, "dmann_cn_route_mass_ratio_at_fit");
		if (ec >= 1 && ec != ~0u && me == (double)ec && refit > 0)
			break;
		refit = -1;
		usleep(100000);
	}
	fprintf(stderr, "cn0: mass ratio %.3f before the re-clustering, %.3f after the new fit\n",
		drifted, refit);
	cr_expect_gt(refit, 0.0, "no mass measure of the new epoch");
	cr_expect_lt(refit, drifted, "the new fit did not rebalance: %.3f after, %.3f before",
		     refit, drifted);
}
