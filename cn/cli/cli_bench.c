/* cli_bench.c: dmann bench, a query stream against the cluster's HNSW index through
 * libdmann (dmann_search: client-side routing by default, --client-routing no for the
 * compute nodes' relayed routing), reporting recall@k against the ground truth,
 * throughput, client-side latency, the cache hit rate, the relayed share and the remote
 * READs, bytes and round trips per query. Cache sizes, routing strategy and counters are
 * set and read over an admin connection per compute node (cluster secret); the queries
 * go as the client identity --client (a [client.NAME] of the cluster file). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cluster.h"
#include "dmann.h"
#include "rpc.h"
#include "vecfile.h"

#define load_cfg dm_cli_load_cfg
#define CHUNK 65536u   /* stream positions per dmann_search call */

static void bench_usage(FILE *f)
{
	fprintf(f, "usage: dmann bench --config C --query F --gt F --k 10 --ef 64 --cache-ratio R\n"
		   "                   [--routing STRATEGY] [--zipf S] [--nq N] [--conns N] [--depth D]\n"
		   "                   [--admit P] [--warmup N] [--batch N] [--pause N]\n"
		   "                   [--spill-cache yes|no] [--only-cn I] [--beam B] [--cache-mib M]\n"
		   "                   [--client NAME] [--client-routing yes|no] [--graph G]\n"
		   "                   [--out F] [--trace F] [--json]\n\n"
		   "Send a query stream to the compute nodes of cluster C through libdmann and\n"
		   "report recall@k against the ground truth, throughput, client-side latency, the\n"
		   "cache hit rate, the relayed share and the remote READs, bytes and round trips\n"
		   "per query, and where the READs went: the distinct memory nodes per query and\n"
		   "per round trip (one batch of READs) and the distinct blocks per query (the\n"
		   "compute nodes' locality counters over the measured queries).\n\n"
		   "  --cache-ratio R  cache size per compute node as a fraction of the index\n"
		   "                   (0..1, or a percentage like 5%%); the caches are cleared first\n"
		   "                   and keep that size until the next bench. keep: send no cache\n"
		   "                   setting (nor index refresh): the compute nodes keep theirs\n"
		   "                   (the cluster file's [cn] cache, or the last bench's)\n"
		   "  --cache-mib M    cache size per compute node in MiB instead (to compare\n"
		   "                   record layouts at equal bytes)\n"
		   "  --graph G        the HNSW graph searched (dmann load --graph; 0..%u, default\n"
		   "                   0). Only graph 0 is cached and routed: with another graph\n"
		   "                   --routing must be none and the cache settings apply to\n"
		   "                   graph 0\n"
		   "  --beam B         with neighbour codes: level-0 candidates expanded per round\n"
		   "                   trip (1..%u, default 1)\n"
		   "  --routing S      none: each query runs on the compute node it is sent to\n"
		   "                   (round robin); bestfit: the oracle's top-ranked node;\n"
		   "                   balanced: fixed equal limits per batch; adaptive: limits\n"
		   "                   from the nodes' queue lengths; adaptive-ring: adaptive with\n"
		   "                   overflow to the semantic ring neighbours (default none)\n"
		   "  --client-routing Y  yes (default): the client holds the oracle and sends each\n"
		   "                   query to the compute node the router picks; no: round robin,\n"
		   "                   the receiving node routes (relaying through a memory node)\n"
		   "  --client NAME    client identity the queries go as (default: the cluster\n"
		   "                   file's first [client.NAME])\n"
		   "  --zipf S         draw the stream from the queries with Zipf(S) popularity\n"
		   "  --nq N           queries to send (default: the query file's count)\n"
		   "  --conns N        with --depth: queries in flight = N x D per compute node\n"
		   "  --depth D        (defaults 2 and 8: 16 per node, at most 32)\n"
		   "  --admit P        cache admission probability once full (default 0.1)\n"
		   "  --warmup N       queries sent (and not measured) before the run (default 0):\n"
		   "                   the stream's first N positions, the run the next ones (so\n"
		   "                   it measures queries it did not warm with when N + the\n"
		   "                   run fit the query file; --json: warmed_queries)\n"
		   "  --batch N        routing batch: queries a compute node routes between two\n"
		   "                   limit updates (default: the nodes' [router] batch, 1000)\n"
		   "  --pause N        local queue length that pauses routing (default: the\n"
		   "                   nodes' [router] pause_queue, 1000)\n"
		   "  --spill-cache Y  whether queries the limits send to a compute node other than\n"
		   "                   their top-ranked one fill its cache (default: the nodes'\n"
		   "                   [router] spill_cache, no)\n"
		   "  --only-cn I      send every query to compute node I (e.g. the single-node\n"
		   "                   reference of the offline cache split penalty)\n"
		   "  --out F          write the result ids (ibin, nq x k) in stream order\n"
		   "  --trace F        write one line per measured query: stream position, when\n"
		   "                   it was (last) sent (CLOCK_MONOTONIC ns), latency (us),\n"
		   "                   status, the node it was sent to and the one that ran it,\n"
		   "                   the routing epoch it was routed with (0: not client-routed)\n"
		   "                   and that of the node that ran it (hex), DMANN_SI_* flags\n"
		   "  --json           print one JSON object\n", DM_MAX_GRAPHS - 1, DM_Q_MAX_BEAM);
}

struct bconn {                  /* admin connection to one compute node */
	struct dm_conn *conn;
	struct dm_rpc_chan ch;
	uint32_t cn;
};

struct bench {
	struct dm_xport *x;
	struct dm_msgpool *pool;
	struct bconn *conns;         /* one per compute node */
	dmann_t *client;             /* the query stream */
	struct dmann_search_params sp;
	uint32_t k, dim;
	const float *queries;
	const int32_t *gt;
	uint32_t gt_k;
	const uint32_t *stream;      /* query index of each position (warm-up, then measured) */
	/* results of the measured run, per stream position */
	int32_t *out_ids;
	float *lat_us;
	double *recall;
	uint64_t reads, bytes, rtrips, hops, hits_q, errors, rereads, relayed, routed, spilled;
	uint64_t retried;            /* sent again after their compute node died */
	FILE *trace;                 /* --trace: one line per measured query */
	char first_err[512];
	/* scratch of one dmann_search call */
	float *vec;
	uint64_t *ids;
	uint32_t *counts;
	struct dmann_search_info *info;
};

/* FWD_ROUTER on compute node bc->cn: set (c->set) and read the router's state. */
static int router_call(struct bconn *bc, const struct dm_wire_fwd_rcfg *c,
		       struct dm_wire_fwd_rstats *st)
{
	uint8_t req[sizeof(*c)], body[sizeof(*st)];
	uint32_t blen;
	int rc;

	dm_wire_fwd_rcfg_encode(req, c);
	rc = dm_rpc_call(&bc->ch, DM_OP_FWD_ROUTER, req, sizeof(req), body, sizeof(body), &blen);
	if (!rc)
		rc = dm_wire_fwd_rstats_decode(body, blen, st);
	return rc;
}

/* Q_STATS of compute node bc->cn. */
static int get_stats(struct bconn *bc, struct dm_wire_q_stats *st)
{
	uint8_t body[sizeof(*st)];
	uint32_t blen;
	int rc = dm_rpc_call(&bc->ch, DM_OP_Q_STATS, NULL, 0, body, sizeof(body), &blen);

	if (!rc)
		rc = dm_wire_q_stats_decode(body, blen, st);
	return rc;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

/* Zipf(s) over n items: a permutation so that popularity is not tied to file order. */
static uint32_t *zipf_stream(uint32_t nq, uint64_t len, double s, uint64_t seed)
{
	uint32_t *perm = malloc(nq * sizeof(*perm)), *out = malloc(len * sizeof(*out));
	double *cdf = malloc(nq * sizeof(*cdf)), sum = 0;
	uint64_t x = seed;

	if (!perm || !out || !cdf) {
		free(perm);
		free(out);
		free(cdf);
		return NULL;
	}
	for (uint32_t i = 0; i < nq; i++) {
		perm[i] = i;
		sum += 1.0 / pow(i + 1, s);
		cdf[i] = sum;
	}
	for (uint32_t i = nq - 1; i > 0; i--) {
		uint32_t j;

		x = x * 6364136223846793005ull + 1442695040888963407ull;
		j = (uint32_t)((x >> 33) % (i + 1));
		uint32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	for (uint64_t p = 0; p < len; p++) {
		double u;
		uint32_t lo = 0, hi = nq - 1;

		x = x * 6364136223846793005ull + 1442695040888963407ull;
		u = (double)(x >> 11) / 9007199254740992.0 * sum;
		while (lo < hi) {
			uint32_t mid = (lo + hi) / 2;

			if (cdf[mid] < u)
				lo = mid + 1;
			else
				hi = mid;
		}
		out[p] = perm[lo];
	}
	free(perm);
	free(cdf);
	return out;
}

/* Run stream positions [first, first + nstream) through libdmann in calls of CHUNK
 * positions; returns seconds. Positions whose query failed (or was not run after a
 * failure) get recall NaN and ids -1; b->errors counts them, b->first_err says why. */
static double run_stream(struct bench *b, uint64_t first, uint64_t nstream)
{
	uint64_t t0 = dm_now_ns();

	for (uint64_t c0 = 0; c0 < nstream; c0 += CHUNK) {
		size_t n = (size_t)DM_MIN((uint64_t)CHUNK, nstream - c0);
		int rc;

		for (size_t i = 0; i < n; i++)
			memcpy(b->vec + i * b->dim,
			       b->queries + (size_t)b->stream[first + c0 + i] * b->dim,
			       b->dim * sizeof(float));
		rc = dmann_search(b->client, b->vec, n, b->dim, &b->sp, b->ids, NULL, b->counts,
				  b->info);
		if (rc && !b->first_err[0])
			snprintf(b->first_err, sizeof(b->first_err), "%s", dmann_errmsg());
		for (size_t i = 0; i < n; i++) {
			const struct dmann_search_info *in = &b->info[i];
			uint64_t pos = c0 + i;
			uint32_t q = b->stream[first + pos], hit = 0;

			if (b->trace)
				fprintf(b->trace, "%llu %llu %.1f %d %u %u %08x %08x %u\n",
					(unsigned long long)pos, (unsigned long long)in->sent_ns,
					in->status ? -1.0 : in->latency_ns / 1e3, in->status,
					in->sent_to, in->ran_on, in->epoch, in->ran_epoch, in->flags);
			if (in->status) {
				b->errors++;
				b->recall[pos] = NAN;
				for (uint32_t j = 0; b->out_ids && j < b->k; j++)
					b->out_ids[pos * b->k + j] = -1;
				continue;
			}
			for (uint32_t j = 0; j < b->counts[i] && j < b->k; j++) {
				uint64_t id = b->ids[i * b->k + j];

				if (b->out_ids)
					b->out_ids[pos * b->k + j] = (int32_t)id;
				for (uint32_t g = 0; g < b->k && g < b->gt_k; g++)
					if (b->gt[(size_t)q * b->gt_k + g] == (int32_t)id) {
						hit++;
						break;
					}
			}
			for (uint32_t j = b->counts[i]; b->out_ids && j < b->k; j++)
				b->out_ids[pos * b->k + j] = -1;
			b->recall[pos] = (double)hit / b->k;
			b->lat_us[pos] = (float)(in->latency_ns / 1e3);
			b->reads += in->reads;
			b->bytes += in->bytes;
			b->rtrips += in->round_trips;
			b->hops += in->hops;
			b->hits_q += in->cache_hits;
			b->rereads += in->rereads;
			b->relayed += !!(in->flags & DMANN_SI_RELAYED);
			b->routed += !!(in->flags & DMANN_SI_ROUTED);
			b->spilled += !!(in->flags & DMANN_SI_SPILLED);
			b->retried += !!(in->flags & DMANN_SI_RETRIED);
		}
		if (rc) {
			b->errors += nstream - c0 - n;   /* the rest of the stream is not run */
			for (uint64_t pos = c0 + n; pos < nstream; pos++) {
				b->recall[pos] = NAN;
				for (uint32_t j = 0; b->out_ids && j < b->k; j++)
					b->out_ids[pos * b->k + j] = -1;
			}
			break;
		}
	}
	return (double)(dm_now_ns() - t0) / 1e9;
}

int dm_cmd_bench(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, 0, 'c' }, { "query", required_argument, 0, 'q' },
		{ "gt", required_argument, 0, 'g' },     { "k", required_argument, 0, 'k' },
		{ "ef", required_argument, 0, 'e' },     { "cache-ratio", required_argument, 0, 'r' },
		{ "routing", required_argument, 0, 'R' }, { "zipf", required_argument, 0, 'z' },
		{ "nq", required_argument, 0, 'n' },     { "conns", required_argument, 0, 'C' },
		{ "depth", required_argument, 0, 'd' },  { "admit", required_argument, 0, 'a' },
		{ "warmup", required_argument, 0, 'w' }, { "out", required_argument, 0, 'o' },
		{ "json", no_argument, 0, 'j' },         { "help", no_argument, 0, 'h' },
		{ "batch", required_argument, 0, 'B' },  { "pause", required_argument, 0, 'P' },
		{ "spill-cache", required_argument, 0, 'S' }, { "only-cn", required_argument, 0, 'O' },
		{ "beam", required_argument, 0, 'b' },   { "cache-mib", required_argument, 0, 'M' },
		{ "client", required_argument, 0, 'i' }, { "client-routing", required_argument, 0, 'x' },
		{ "graph", required_argument, 0, 'G' },  { "trace", required_argument, 0, 'T' },
		{ 0, 0, 0, 0 },
	};
	const char *config = NULL, *qpath = NULL, *gtpath = NULL, *outpath = NULL, *cname = NULL;
	const char *tracepath = NULL;
	bool client_routing = true;
	unsigned long long k = 10, ef = 64, nq = 0, conns = 2, depth = 8, warmup = 0;
	uint64_t warmed = 0;   /* measured stream positions whose query the warm-up sent */
	unsigned long long rbatch = 0, rpause = 0;   /* 0: keep the compute nodes' setting */
	unsigned long long only_cn = ~0ull, beam = 1, graph = 0;
	double cache_mib = -1;
	uint32_t spill = DM_FWD_SPILL_KEEP;
	double ratio = -1, zipf = 0, admit = 0.1;
	int routing = DM_ROUTE_NONE;
	bool json = false, keep = false;
	struct dm_cluster_cfg *cfg;
	struct dm_vecs qv = { 0 }, gv = { 0 };
	struct bench b = { 0 };
	int only = -1;   /* --only-cn */
	int first = -1;  /* the first compute node with an admin connection */
	uint32_t nconn = 0;   /* compute nodes with one */
	struct dm_wire_q_stats *st0 = NULL, *st1 = NULL;
	uint32_t *stream = NULL;
	char err[1024];
	int c, rc, status = 1;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 'q': qpath = optarg; break;
		case 'g': gtpath = optarg; break;
		case 'o': outpath = optarg; break;
		case 'T': tracepath = optarg; break;
		case 'i': cname = optarg; break;
		case 'x':
			if (strcmp(optarg, "yes") && strcmp(optarg, "no")) {
				fprintf(stderr, "dmann bench: --client-routing %s: must be yes or no\n",
					optarg);
				return 2;
			}
			client_routing = !strcmp(optarg, "yes");
			break;
		case 'j': json = true; break;
		case 'k': if (dm_cli_parse_u64("bench", "--k", optarg, 1, 100, &k)) return 2; break;
		case 'e': if (dm_cli_parse_u64("bench", "--ef", optarg, 1, DM_Q_MAX_EF, &ef)) return 2; break;
		case 'n': if (dm_cli_parse_u64("bench", "--nq", optarg, 1, 100000000, &nq)) return 2; break;
		case 'C': if (dm_cli_parse_u64("bench", "--conns", optarg, 1, 64, &conns)) return 2; break;
		case 'd': if (dm_cli_parse_u64("bench", "--depth", optarg, 1, 32, &depth)) return 2; break;
		case 'w': if (dm_cli_parse_u64("bench", "--warmup", optarg, 0, 100000000, &warmup)) return 2; break;
		case 'B': if (dm_cli_parse_u64("bench", "--batch", optarg, 1, 1000000, &rbatch)) return 2; break;
		case 'P': if (dm_cli_parse_u64("bench", "--pause", optarg, 1, 1000000, &rpause)) return 2; break;
		case 'O': if (dm_cli_parse_u64("bench", "--only-cn", optarg, 0, DM_MAX_NODES - 1, &only_cn)) return 2; break;
		case 'b': if (dm_cli_parse_u64("bench", "--beam", optarg, 1, DM_Q_MAX_BEAM, &beam)) return 2; break;
		case 'G': if (dm_cli_parse_u64("bench", "--graph", optarg, 0, DM_MAX_GRAPHS - 1, &graph)) return 2; break;
		case 'M': if (dm_cli_parse_double("bench", "--cache-mib", optarg, 0, 1e7, &cache_mib)) return 2;
			  ratio = 0; break;
		case 'S':
			if (!strcmp(optarg, "yes")) {
				spill = DM_FWD_SPILL_YES;
			} else if (!strcmp(optarg, "no")) {
				spill = DM_FWD_SPILL_NO;
			} else {
				fprintf(stderr, "dmann bench: --spill-cache %s: must be yes or no\n", optarg);
				return 2;
			}
			break;
		case 'z': if (dm_cli_parse_double("bench", "--zipf", optarg, 0, 10, &zipf)) return 2; break;
		case 'a': if (dm_cli_parse_double("bench", "--admit", optarg, 0, 1, &admit)) return 2; break;
		case 'r': {
			size_t l = strlen(optarg);

			if (!strcmp(optarg, "keep")) {
				keep = true;
				ratio = 0;
			} else if (l && optarg[l - 1] == '%') {
				char tmp[32];

				snprintf(tmp, sizeof(tmp), "%.*s", (int)(l - 1), optarg);
				if (dm_cli_parse_double("bench", "--cache-ratio", tmp, 0, 100, &ratio))
					return 2;
				ratio /= 100;
			} else if (dm_cli_parse_double("bench", "--cache-ratio", optarg, 0, 1, &ratio)) {
				return 2;
			}
			break;
		}
		case 'R':
			routing = dm_route_parse(optarg);
			if (routing < 0) {
				fprintf(stderr, "dmann bench: --routing %s: must be none, bestfit, balanced, "
					"adaptive or adaptive-ring\n", optarg);
				return 2;
			}
			break;
		case 'h': bench_usage(stdout); return 0;
		default: dm_cli_bad_option("bench", c, argv, optind); return 2;
		}
	}
	if (!config || !qpath || !gtpath || ratio < 0 || optind != argc) {
		if (ratio < 0 && config)
			fprintf(stderr, "dmann bench: --cache-ratio is required\n");
		bench_usage(stderr);
		return 2;
	}
	cfg = load_cfg("bench", config);
	if (!cfg)
		return 1;
	if (cfg->n_cn == 0) {
		fprintf(stderr, "dmann bench: %s defines no compute node\n", config);
		goto out;
	}
	if ((rc = dm_vecs_read(qpath, DM_VF_AUTO, &qv, err, sizeof(err))) ||
	    (rc = dm_vecs_read(gtpath, DM_VF_AUTO, &gv, err, sizeof(err)))) {
		fprintf(stderr, "dmann bench: %s\n", err);
		goto out;
	}
	if (qv.type != DM_VT_F32 || gv.type != DM_VT_I32 || gv.n != qv.n || gv.dim < k) {
		fprintf(stderr, "dmann bench: %s must hold %llu rows of at least k=%llu ids for the "
			"%llu queries of %s\n", gtpath, (unsigned long long)gv.n, k,
			(unsigned long long)qv.n, qpath);
		goto out;
	}
	if (only_cn != ~0ull && only_cn >= cfg->n_cn) {
		fprintf(stderr, "dmann bench: --only-cn %llu: %s has %u compute nodes\n", only_cn,
			config, cfg->n_cn);
		goto out;
	}
	only = only_cn == ~0ull ? -1 : (int)only_cn;
	if (graph && routing != DM_ROUTE_NONE) {
		fprintf(stderr, "dmann bench: --graph %llu: only graph 0 is routed (use --routing "
			"none)\n", graph);
		goto out;
	}
	if (!nq)
		nq = qv.n;
	if (conns * depth > 32) {
		fprintf(stderr, "dmann bench: --conns x --depth = %llu queries in flight per compute "
			"node: at most 32\n", conns * depth);
		goto out;
	}
	b.k = (uint32_t)k;
	b.dim = qv.dim;
	b.sp = (struct dmann_search_params){
		.k = (uint32_t)k, .ef = (uint32_t)ef, .beam = (uint32_t)beam,
		.inflight = (uint32_t)(conns * depth * (only >= 0 ? 1 : cfg->n_cn)),
		.routing = client_routing ? DMANN_ROUTE_CLIENT : DMANN_ROUTE_SERVER,
		.graph = (uint32_t)graph };
	b.queries = qv.data;
	b.gt = gv.data;
	b.gt_k = gv.dim;
	if (zipf > 0) {
		stream = zipf_stream((uint32_t)qv.n, warmup + nq, zipf, 12345);
	} else {
		stream = malloc((warmup + nq) * sizeof(*stream));
		for (uint64_t i = 0; stream && i < warmup + nq; i++)
			stream[i] = (uint32_t)(i % qv.n);
	}
	/* The warm-up is the stream's first `warmup` positions and the run the next nq: with a
	 * uniform stream and warmup + nq <= the queries, no measured query was warmed with;
	 * otherwise the JSON's warmed_queries says how many were. */
	if (stream && warmup) {
		uint8_t *seen = calloc(qv.n, 1);

		for (uint64_t i = 0; seen && i < warmup; i++)
			seen[stream[i]] = 1;
		for (uint64_t i = 0; seen && i < nq; i++)
			warmed += seen[stream[warmup + i]];
		free(seen);
	}
	b.stream = stream;
	b.lat_us = calloc(DM_MAX(nq, warmup), sizeof(float));
	b.recall = calloc(DM_MAX(nq, warmup), sizeof(double));
	if (outpath)
		b.out_ids = calloc(nq * k, sizeof(int32_t));
	{
		size_t chunk = DM_MIN((uint64_t)CHUNK, DM_MAX(nq, warmup));

		b.vec = malloc(chunk * qv.dim * sizeof(float));
		b.ids = malloc(chunk * k * sizeof(uint64_t));
		b.counts = malloc(chunk * sizeof(uint32_t));
		b.info = malloc(chunk * sizeof(*b.info));
	}
	if (tracepath) {
		b.trace = fopen(tracepath, "w");
		if (!b.trace) {
			fprintf(stderr, "dmann bench: --trace %s: %s\n", tracepath, strerror(errno));
			goto out;
		}
		fprintf(b.trace, "# pos sent_ns latency_us status sent_to ran_on epoch ran_epoch "
			"flags\n");
	}
	b.x = dm_cluster_xport(cfg, NULL);
	if (!stream || !b.lat_us || !b.recall || (outpath && !b.out_ids) || !b.x || !b.vec ||
	    !b.ids || !b.counts || !b.info)
		goto out;
	b.conns = calloc(cfg->n_cn, sizeof(*b.conns));
	b.pool = dm_msgpool_new(b.x, cfg->n_cn * 4, 16384 + 64);
	if (!b.conns || !b.pool)
		goto out;
	/* The query stream's client: the compute nodes (or --only-cn's) as a client identity. */
	{
		const struct dm_client_cfg *cc = cname ? dm_config_client(cfg, cname) :
						 cfg->n_clients ? &cfg->clients[0] : NULL;
		const char *eps[DM_MAX_NODES];
		uint32_t ne = 0;

		if (!cc) {
			fprintf(stderr, "dmann bench: %s has no client identity %s%s(the queries go "
				"through libdmann as a [client.NAME] of the cluster file)\n", config,
				cname ? cname : "", cname ? " " : "");
			goto out;
		}
		for (uint32_t i = 0; i < cfg->n_cn; i++)
			if (only < 0 || (int)i == only)
				eps[ne++] = cfg->cn[i].address;
		b.client = dmann_connect_endpoints(cfg->name, eps, ne,
						   cfg->transport[0] ? cfg->transport : NULL,
						   cc->name, cc->secret, cc->secret_len);
		if (!b.client) {
			fprintf(stderr, "dmann bench: connecting as client %s: %s\n", cc->name,
				dmann_errmsg());
			goto out;
		}
	}
	/* Admin connections, one per compute node (with --only-cn only to that one). A compute
	 * node that cannot be reached is left out of the set-up and the counters (the stream
	 * goes to the others; it may join later): a warning, an error only with --only-cn or
	 * when none is reachable. */
#define OTHER_CN(i) (!b.conns[i].conn)
	for (uint32_t i = 0; i < cfg->n_cn; i++) {
		struct bconn *bc = &b.conns[i];

		bc->cn = i;
		if (only >= 0 && i != (uint32_t)only)
			continue;   /* --only-cn: the others may be down */
		rc = dm_xport_connect(b.x, cfg->cn[bc->cn].address, 5000, &bc->conn);
		if (!rc) {
			rc = dm_rpc_chan_init(&bc->ch, bc->conn, b.pool,
					      (uint32_t)(DM_WIRE_HDR_LEN + sizeof(struct dm_wire_q_search) +
							 4ull * qv.dim + 64), 30000);
			if (rc) {
				dm_conn_close(bc->conn);
				bc->conn = NULL;
			}
		}
		if (rc) {
			fprintf(stderr, "dmann bench: %scompute node %u (%s): %s%s\n",
				only >= 0 ? "" : "warning: ", bc->cn, cfg->cn[bc->cn].address,
				strerror(-rc), only >= 0 ? "" : " (left out; the queries go to the "
				"others)");
			if (only >= 0)
				goto out;
		} else {
			nconn++;
			if (first < 0)
				first = (int)i;
		}
	}
	if (first < 0) {
		fprintf(stderr, "dmann bench: no compute node can be reached\n");
		goto out;
	}
	/* Configure every compute node's cache (cleared), from the index size it reports. */
	st0 = calloc(cfg->n_cn, sizeof(*st0));
	st1 = calloc(cfg->n_cn, sizeof(*st1));
	for (uint32_t i = 0; i < cfg->n_cn; i++) {
		struct dm_wire_q_config qc;

		if (OTHER_CN(i))
			continue;
		uint8_t body[sizeof(qc)];

		rc = keep ? 0 : dm_rpc_call(&b.conns[i].ch, DM_OP_Q_CONFIG, (uint8_t[16]){ 0 }, 16,
					    NULL, 0, NULL);
		if (!rc)
			rc = get_stats(&b.conns[i], &st0[i]);
		if (!rc && !st0[i].index_bytes) {
			/* the cache holds graph 0: with no graph 0, nothing to size (another
			 * graph's queries say whether it is there) */
			if (graph)
				continue;
			rc = -ENOENT;
		}
		if (!rc && keep) {
			ratio += (double)st0[i].capacity_bytes / (double)st0[i].index_bytes /
				 nconn;
		} else if (!rc) {
			qc = (struct dm_wire_q_config){
				.cache_bytes = cache_mib >= 0 ? (uint64_t)(cache_mib * 1048576.0) :
					       (uint64_t)(ratio * (double)st0[i].index_bytes),
				.admit_ppm = (uint32_t)(admit * 1e6), .flags = DM_Q_CONFIG_CLEAR };
			dm_wire_q_config_encode(body, &qc);
			rc = dm_rpc_call(&b.conns[i].ch, DM_OP_Q_CONFIG, body, sizeof(body), NULL, 0, NULL);
		}
		if (rc) {
			fprintf(stderr, "dmann bench: configuring compute node %u: %s\n", i,
				rc == -ENOENT ? "it has no index (dmann load first)" : strerror(-rc));
			goto out;
		}
	}
	/* Routing strategy on every compute node (counters reset). */
	for (uint32_t i = 0; i < cfg->n_cn; i++) {
		struct dm_wire_fwd_rcfg rc_cfg = { .set = 1, .strategy = (uint32_t)routing,
						   .batch = (uint32_t)rbatch, .pause = (uint32_t)rpause,
						   .spill_cache = spill };
		struct dm_wire_fwd_rstats rs;

		if (OTHER_CN(i))
			continue;
		rc = router_call(&b.conns[i], &rc_cfg, &rs);
		if (rc) {
			fprintf(stderr, "dmann bench: setting routing %s on compute node %u: %s\n",
				dm_route_name((uint32_t)routing), i, strerror(-rc));
			goto out;
		}
		if (rs.k != cfg->n_cn && routing != DM_ROUTE_NONE && !json)
			fprintf(stderr, "dmann bench: warning: compute node %u has no oracle yet (it "
				"runs its queries itself)\n", i);
	}
	if (warmup) {
		int32_t *out_ids = b.out_ids;   /* sized for the measured run only */

		FILE *trace = b.trace;          /* the measured run only */

		b.out_ids = NULL;
		b.trace = NULL;
		run_stream(&b, 0, warmup);
		b.out_ids = out_ids;
		b.trace = trace;
		if (b.errors) {
			fprintf(stderr, "dmann bench: warm-up failed: %s\n", b.first_err);
			goto out;
		}
		b.reads = b.bytes = b.rtrips = b.hops = b.hits_q = b.rereads = 0;
		b.relayed = b.routed = b.spilled = b.retried = 0;
	}
	for (uint32_t i = 0; i < cfg->n_cn; i++)
		if (!OTHER_CN(i) && (rc = get_stats(&b.conns[i], &st0[i]))) {
			fprintf(stderr, "dmann bench: stats of compute node %u: %s\n", i, strerror(-rc));
			goto out;
		}
	{
		double secs = run_stream(&b, warmup, nq), rsum = 0, hits = 0, lookups = 0;
		/* locality of the READs (Q_STATS loc_*, summed over the compute nodes) */
		double lq = 0, lqm = 0, lqb = 0, lrt = 0, lrtm = 0;
		uint64_t ok = 0, errs = b.errors, fwd = 0, ran = 0, pauses = 0;
		int spill_on = 0;
		uint64_t t_end = dm_now_ns();
		double csp = -1;
		char csp_s[32] = "null";
		struct dm_wire_fwd_rstats rs;

		/* Forwarding counters, and a CSP estimate made after the run ended (the compute
		 * nodes exchange cache samples every half second). */
		for (uint32_t i = 0; i < cfg->n_cn; i++)
			if (!OTHER_CN(i) && !router_call(&b.conns[i], &(struct dm_wire_fwd_rcfg){ 0 }, &rs)) {
				fwd += rs.forwarded;
				ran += rs.local + rs.forwarded;
				pauses += rs.paused;
				spill_on |= (int)rs.spill_cache;
			}
		for (int tries = 0; tries < 40; tries++) {
			if (router_call(&b.conns[first],
					&(struct dm_wire_fwd_rcfg){ 0 }, &rs))
				break;
			if (rs.csp_ppm != DM_FWD_CSP_NONE &&
			    rs.csp_age_ms * 1000000 < dm_now_ns() - t_end) {
				csp = rs.csp_ppm / 1e6;
				snprintf(csp_s, sizeof(csp_s), "%.4f", csp);
				break;
			}
			usleep(100000);
		}
		float *lat = malloc(nq * sizeof(float));
		size_t nl = 0;

		for (uint32_t i = 0; i < cfg->n_cn; i++)
			if (!OTHER_CN(i) && !get_stats(&b.conns[i], &st1[i])) {
				hits += (double)(st1[i].hits - st0[i].hits);
				lookups += (double)(st1[i].hits - st0[i].hits + st1[i].misses - st0[i].misses);
				lq += (double)(st1[i].loc_queries - st0[i].loc_queries);
				lqm += (double)(st1[i].loc_q_mns - st0[i].loc_q_mns);
				lqb += (double)(st1[i].loc_q_blocks - st0[i].loc_q_blocks);
				lrt += (double)(st1[i].loc_rts - st0[i].loc_rts);
				lrtm += (double)(st1[i].loc_rt_mns - st0[i].loc_rt_mns);
			}
		for (uint64_t p = 0; p < nq; p++)
			if (!isnan(b.recall[p])) {
				rsum += b.recall[p];
				ok++;
				if (lat)
					lat[nl++] = b.lat_us[p];
			}
		if (lat)
			qsort(lat, nl, sizeof(float), cmp_float);
		double recall = ok ? rsum / (double)ok : 0, qps = (double)ok / secs;
		double p50 = nl ? lat[nl / 2] : 0, p99 = nl ? lat[DM_MIN(nl - 1, nl * 99 / 100)] : 0;
		double hr = lookups > 0 ? hits / lookups : 0, dq = ok ? (double)ok : 1;

		if (json)
			printf("{\"recall\": %.4f, \"qps\": %.1f, \"p50_us\": %.1f, \"p99_us\": %.1f, "
			       "\"hit_rate\": %.4f, \"csp\": %s, \"forwarded\": %.4f, \"reads_per_query\": %.2f, "
			       "\"bytes_per_query\": %.0f, \"round_trips_per_query\": %.2f, "
			       "\"hops_per_query\": %.2f, \"cache_ratio\": %.4f, \"k\": %llu, \"ef\": %llu, "
			       "\"queries\": %llu, \"errors\": %llu, \"compute_nodes\": %u, "
			       "\"memory_nodes\": %u, \"routing\": \"%s\", \"zipf\": %.2f, "
			       "\"pauses\": %llu, \"spill_cache\": %s, \"only_cn\": %d, \"beam\": %llu, "
			       "\"cache_mib\": %.1f, \"index_bytes\": %llu, \"rereads\": %lu, "
			       "\"warmup\": %llu, \"warmed_queries\": %llu, \"client_routing\": %s, "
			       "\"relayed\": %.4f, \"client_routed\": %.4f, \"client_spilled\": %.4f, "
			       "\"retried\": %llu, \"mns_per_query\": %.3f, \"blocks_per_query\": %.2f, "
			       "\"mns_per_round_trip\": %.3f, \"round_trips_per_query_cn\": %.3f}\n",
			       recall, qps, p50, p99, hr, csp_s, ran ? (double)fwd / ran : 0.0,
			       b.reads / dq,
			       b.bytes / dq, b.rtrips / dq,
			       b.hops / dq, ratio, k, ef, (unsigned long long)ok,
			       (unsigned long long)errs, cfg->n_cn, cfg->n_mn,
			       dm_route_name((uint32_t)routing), zipf, (unsigned long long)pauses,
			       spill_on ? "true" : "false", only, beam,
			       cache_mib >= 0 ? cache_mib :
			       ratio * (double)st0[first].index_bytes / 1048576.0,
			       (unsigned long long)st0[first].index_bytes,
			       b.rereads, warmup, (unsigned long long)warmed,
			       client_routing ? "true" : "false", b.relayed / dq, b.routed / dq,
			       b.spilled / dq, (unsigned long long)b.retried, lq ? lqm / lq : 0.0,
			       lq ? lqb / lq : 0.0, lrt ? lrtm / lrt : 0.0, lq ? lrt / lq : 0.0);
		else
			printf("recall@%llu %.4f  qps %.1f  p50 %.0f us  p99 %.0f us  hit rate %.3f  "
			       "csp %s  routing %s%s (%.1f%% relayed)  "
			       "reads/q %.1f  KiB/q %.1f  round trips/q %.1f  hops/q %.1f  "
			       "MNs/q %.2f  blocks/q %.1f  MNs/round trip %.2f  (%llu queries, "
			       "%llu errors, %llu retried, cache %.1f%%, ef %llu)\n", k, recall, qps, p50, p99, hr,
			       csp_s, dm_route_name((uint32_t)routing),
			       client_routing && routing != DM_ROUTE_NONE ? " client-side" : "",
			       100.0 * b.relayed / dq,
			       b.reads / dq, b.bytes / dq / 1024,
			       b.rtrips / dq, b.hops / dq, lq ? lqm / lq : 0.0, lq ? lqb / lq : 0.0,
			       lrt ? lrtm / lrt : 0.0, (unsigned long long)ok, (unsigned long long)errs,
			       (unsigned long long)b.retried, ratio * 100, ef);
		free(lat);
		if (errs)
			fprintf(stderr, "dmann bench: %llu queries failed; first error: %s\n",
				(unsigned long long)errs, b.first_err);
		if (outpath && (rc = dm_vecs_write(outpath, DM_VF_IBIN, b.out_ids, DM_VT_I32, nq,
						   (uint32_t)k))) {
			fprintf(stderr, "dmann bench: writing %s: %s\n", outpath, strerror(-rc));
			goto out;
		}
		status = errs ? 1 : 0;
	}
out:
	if (b.trace && (ferror(b.trace) | fclose(b.trace))) {
		fprintf(stderr, "dmann bench: writing %s failed\n", tracepath);
		status = 1;
	}
	dmann_close(b.client);
	free(b.vec);
	free(b.ids);
	free(b.counts);
	free(b.info);
	for (uint32_t i = 0; b.conns && i < cfg->n_cn; i++)
		if (b.conns[i].conn) {
			dm_rpc_chan_fini(&b.conns[i].ch);
			dm_conn_close(b.conns[i].conn);
		}
	free(b.conns);
	dm_msgpool_free(b.pool);
	if (b.x)
		dm_xport_close(b.x);
	free(stream);
	free(b.lat_us);
	free(b.recall);
	free(b.out_ids);
	free(st0);
	free(st1);
	dm_vecs_free(&qv);
	dm_vecs_free(&gv);
	free(cfg);
	return status;
}
