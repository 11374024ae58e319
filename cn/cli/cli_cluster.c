/* cli_cluster.c: CLI commands that talk to a running cluster.
 *   dmann load    place an index image on the memory nodes
 *   dmann bench   send a query stream to the compute nodes: recall, QPS, latency, cache
 *                 hit rate, READs / bytes / round trips per query
 *   dmann status  one line per node (or JSON): reachability, region, objects, cache */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cluster.h"
#include "dgen.h"
#include "dindex.h"
#include "hnsw/hnsw.h"
#include "rpc.h"
#include "vecfile.h"

static struct dm_cluster_cfg *load_cfg(const char *cmd, const char *path)
{
	struct dm_cluster_cfg *cfg = calloc(1, sizeof(*cfg));
	char err[1024];

	if (!cfg)
		return NULL;
	if (dm_config_load(path, cfg, err, sizeof(err))) {
		fprintf(stderr, "dmann %s: %s\n", cmd, err);
		free(cfg);
		return NULL;
	}
	return cfg;
}

/* ---- load ------------------------------------------------------------------------------- */

static void load_usage(FILE *f)
{
	fprintf(f, "usage: dmann load --config C --index INDEX [--spare N] [--no-snapshot] [--no-wait]\n\n"
		   "Place the index image INDEX on the memory nodes of cluster C as the index's next\n"
		   "generation: every block on the memory nodes the placement function picks for\n"
		   "it, the metadata on all of them; then publish it, ask every memory node to\n"
		   "snapshot (so a restart keeps the index) and wait until every compute node moved\n"
		   "to it and the previous generation is freed (--no-wait: do not wait; the memory\n"
		   "nodes free it on their own). Compute nodes keep answering queries throughout:\n"
		   "each query runs on one generation.\n\n"
		   "  --spare N      room for N more records, written online by `dmann insert`\n"
		   "                 (default 0: a read-only index)\n");
}

static void load_progress(void *arg, uint64_t done)
{
	dm_progress_update(arg, done);
}

int dm_cmd_load(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, 0, 'c' }, { "index", required_argument, 0, 'i' },
		{ "no-snapshot", no_argument, 0, 'n' }, { "no-wait", no_argument, 0, 'w' },
		{ "spare", required_argument, 0, 's' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	const char *config = NULL, *index = NULL;
	struct dm_cluster_cfg *cfg;
	struct hnsw_index *idx;
	struct dm_progress *prog;
	struct dm_xport *x;
	struct mn_set *s;
	bool snap = true, wait = true;
	char err[1024];
	uint64_t t0, gen = 0;
	unsigned long long spare = 0;
	struct dgen_view v;
	int c, rc, status = 1;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 'i': index = optarg; break;
		case 'n': snap = false; break;
		case 'w': wait = false; break;
		case 's':
			if (dm_cli_parse_u64("load", "--spare", optarg, 0, DINDEX_MAX_CAP, &spare))
				return 2;
			break;
		case 'h': load_usage(stdout); return 0;
		default: dm_cli_bad_option("load", c, argv, optind); return 2;
		}
	}
	if (!config || !index || optind != argc) {
		load_usage(stderr);
		return 2;
	}
	cfg = load_cfg("load", config);
	if (!cfg)
		return 1;
	idx = hnsw_load(index, err, sizeof(err));
	if (!idx) {
		fprintf(stderr, "dmann load: %s\n", err);
		goto out_cfg;
	}
	x = dm_cluster_xport(cfg, NULL);
	if (!x)
		goto out_idx;
	s = mn_set_open(cfg, x, NULL, true, 5000);
	if (!s) {
		fprintf(stderr, "dmann load: cannot reach every memory node of %s: %s\n", config,
			strerror(errno));
		goto out_x;
	}
	t0 = dm_now_ns();
	prog = dm_progress_start("load", (uint64_t)idx->n * idx->rec_size * cfg->redundancy);
	rc = dindex_load(s, idx, (uint32_t)spare, &gen, load_progress, prog, err, sizeof(err));
	dm_progress_end(prog);
	if (rc) {
		fprintf(stderr, "dmann load: %s\n", err);
		goto out_s;
	}
	if (snap && (rc = mn_set_snapshot(s)))
		fprintf(stderr, "dmann load: warning: snapshot failed: %s\n", strerror(-rc));
	printf("dmann load: generation %llu: %u records (%.1f MiB) in %llu blocks on %u memory "
	       "nodes, redundancy %u, room for %llu more, %.2f s\n", (unsigned long long)gen,
	       idx->n, (double)idx->n * idx->rec_size / 1048576.0,
	       (unsigned long long)(((uint64_t)idx->n + spare + (1ull << idx->p.block_shift) - 1) >>
				    idx->p.block_shift), cfg->n_mn, cfg->redundancy,
	       (unsigned long long)spare, (double)(dm_now_ns() - t0) / 1e9);
	status = 0;
	if (wait) {
		/* The compute nodes acknowledge within refresh_ms; one that is gone is given up
		 * after the lease. */
		t0 = dm_now_ns();
		rc = dgen_wait_released(s, cfg->cn_all.lease_ms + 5000, &v);
		if (rc)
			fprintf(stderr, "dmann load: warning: generation %llu is still held by %u "
				"compute nodes (%s); the memory nodes free it once they move on or their "
				"lease (%u ms) runs out\n", (unsigned long long)v.retired, v.waiting,
				strerror(-rc), v.lease_ms);
		else
			printf("dmann load: every compute node moved to generation %llu; the previous "
			       "one was freed after %.2f s\n", (unsigned long long)gen,
			       (double)(dm_now_ns() - t0) / 1e9);
	}
out_s:
	mn_set_close(s);
out_x:
	dm_xport_close(x);
out_idx:
	hnsw_free(idx);
out_cfg:
	free(cfg);
	return status;
}

/* ---- bench ------------------------------------------------------------------------------ */

static void bench_usage(FILE *f)
{
	fprintf(f, "usage: dmann bench --config C --query F --gt F --k 10 --ef 64 --cache-ratio R\n"
		   "                   [--routing STRATEGY] [--zipf S] [--nq N] [--conns N] [--depth D]\n"
		   "                   [--admit P] [--warmup N] [--batch N] [--pause N]\n"
		   "                   [--spill-cache yes|no] [--only-cn I] [--beam B] [--cache-mib M]\n"
		   "                   [--out F] [--json]\n\n"
		   "Send a query stream to the compute nodes of cluster C and report recall@k\n"
		   "against the ground truth, throughput, client-side latency, the cache hit rate and\n"
		   "the remote READs, bytes and round trips per query.\n\n"
		   "  --cache-ratio R  cache size per compute node as a fraction of the index\n"
		   "                   (0..1, or a percentage like 5%%); the caches are cleared first\n"
		   "                   and keep that size until the next bench. keep: send no cache\n"
		   "                   setting (nor index refresh): the compute nodes keep theirs\n"
		   "                   (the cluster file's [cn] cache, or the last bench's)\n"
		   "  --cache-mib M    cache size per compute node in MiB instead (to compare\n"
		   "                   record layouts at equal bytes)\n"
		   "  --beam B         with neighbour codes: level-0 candidates expanded per round\n"
		   "                   trip (1..%u, default 1)\n"
		   "  --routing S      none: each query runs on the compute node it is sent to\n"
		   "                   (round robin); bestfit: the oracle's top-ranked node;\n"
		   "                   balanced: fixed equal limits per batch; adaptive: limits\n"
		   "                   from the nodes' queue lengths; adaptive-ring: adaptive with\n"
		   "                   overflow to the semantic ring neighbours (default none)\n"
		   "  --zipf S         draw the stream from the queries with Zipf(S) popularity\n"
		   "  --nq N           queries to send (default: the query file's count)\n"
		   "  --conns N        connections per compute node (default 2)\n"
		   "  --depth D        queries in flight per connection (default 8)\n"
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
		   "  --json           print one JSON object\n", DM_Q_MAX_BEAM);
}

struct bconn {
	struct dm_conn *conn;
	struct dm_rpc_chan ch;
	uint32_t cn;
};

struct bench {
	struct dm_xport *x;
	struct dm_msgpool *pool;
	struct bconn *conns;
	uint32_t nconns, depth, k, ef, dim, beam;
	int only_cn;                 /* >= 0: the stream goes to this compute node only */
	const float *queries;
	const int32_t *gt;
	uint32_t gt_k;
	const uint32_t *stream;      /* query index of each position (warm-up, then measured) */
	uint64_t first;              /* stream position of this run's position 0 */
	uint64_t nstream;
	atomic_ulong next;           /* next stream position to send */
	/* results, per stream position */
	int32_t *out_ids;
	float *lat_us;
	double *recall;
	atomic_ulong reads, bytes, rtrips, hops, hits_q, errors, rereads;
	char first_err[256];
	pthread_mutex_t lock;
};

struct inflight {
	uint64_t pos;
	uint64_t t0;
	bool used;
};

struct bthread {
	struct bench *b;
	struct bconn *bc;
	bool started;
};

/* One connection: keep depth queries in flight until the stream is done. */
static void *bench_thread(void *arg)
{
	struct bthread *t = arg;
	struct bench *b = t->b;
	struct bconn *bc = t->bc;
	struct inflight *fl = calloc(b->depth, sizeof(*fl));
	uint32_t outstanding = 0;
	bool done_sending = false;
	uint8_t *msg = malloc(sizeof(struct dm_wire_q_search) + 4ull * b->dim);
	uint64_t seq = 0;

	if (!fl || !msg)
		goto out;
	for (;;) {
		struct dm_wc wc;
		int rc;

		/* Fill the window. */
		while (!done_sending && outstanding < b->depth) {
			uint64_t pos = atomic_fetch_add(&b->next, 1);
			struct dm_wire_q_search s;
			uint32_t slot;

			if (pos >= b->nstream) {
				done_sending = true;
				break;
			}
			for (slot = 0; fl[slot].used; slot++)
				;
			s = (struct dm_wire_q_search){ .qid = ((uint64_t)slot << 48) | pos, .k = b->k,
						       .ef = b->ef, .dim = b->dim,
						       .flags = b->beam > 1 ? b->beam : 0 };
			dm_wire_q_search_encode(msg, &s);
			dm_wire_put_f32s(msg + sizeof(s), b->queries + (size_t)b->stream[b->first + pos] * b->dim,
					 b->dim);
			fl[slot] = (struct inflight){ .pos = pos, .t0 = dm_now_ns(), .used = true };
			rc = dm_rpc_send(&bc->ch, DM_OP_Q_SEARCH, ++seq, 0, msg,
					 (uint32_t)(sizeof(s) + 4ull * b->dim));
			if (rc) {
				pthread_mutex_lock(&b->lock);
				if (!b->first_err[0])
					snprintf(b->first_err, sizeof(b->first_err),
						 "sending to compute node %u: %s", bc->cn, strerror(-rc));
				pthread_mutex_unlock(&b->lock);
				atomic_fetch_add(&b->errors, 1);
				goto out;
			}
			outstanding++;
		}
		if (done_sending && !outstanding)
			break;
		/* One answer. */
		{
			uint8_t *buf;
			uint32_t len;
			uint64_t wr_id;
			struct dm_wire_hdr h;
			struct dm_wire_q_result r;
			uint32_t slot;
			uint64_t pos;

			rc = dm_rpc_recv(&bc->ch, 30000, &buf, &len, &wr_id);
			if (rc <= 0) {
				pthread_mutex_lock(&b->lock);
				if (!b->first_err[0])
					snprintf(b->first_err, sizeof(b->first_err),
						 "compute node %u: %s", bc->cn,
						 rc ? strerror(-rc) : "no answer within 30 s");
				pthread_mutex_unlock(&b->lock);
				atomic_fetch_add(&b->errors, outstanding);
				goto out;
			}
			(void)wc;
			if (dm_wire_hdr_decode(buf, len, &h) || h.op != DM_OP_Q_SEARCH + 1 ||
			    dm_wire_q_check(&h, buf, len) ||
			    dm_wire_q_result_decode(buf + DM_WIRE_HDR_LEN, len - DM_WIRE_HDR_LEN, &r) ||
			    (slot = (uint32_t)(r.qid >> 48)) >= b->depth || !fl[slot].used ||
			    fl[slot].pos != (r.qid & 0xffffffffffffull)) {
				dm_msgpool_repost(b->pool, wr_id);
				pthread_mutex_lock(&b->lock);
				if (!b->first_err[0])
					snprintf(b->first_err, sizeof(b->first_err),
						 "compute node %u sent a malformed answer", bc->cn);
				pthread_mutex_unlock(&b->lock);
				atomic_fetch_add(&b->errors, outstanding);
				goto out;
			}
			pos = fl[slot].pos;
			b->lat_us[pos] = (float)((dm_now_ns() - fl[slot].t0) / 1e3);
			fl[slot].used = false;
			outstanding--;
			if (h.status) {
				atomic_fetch_add(&b->errors, 1);
				pthread_mutex_lock(&b->lock);
				if (!b->first_err[0])
					snprintf(b->first_err, sizeof(b->first_err),
						 "compute node %u: query failed: %s", bc->cn,
						 strerror(-h.status));
				pthread_mutex_unlock(&b->lock);
				b->recall[pos] = NAN;
				for (uint32_t i = 0; b->out_ids && i < b->k; i++)
					b->out_ids[pos * b->k + i] = -1;   /* failed */
			} else {
				uint32_t q = b->stream[b->first + pos], hit = 0;

				for (uint32_t i = 0; i < r.n && i < b->k; i++) {
					struct dm_wire_q_hit qh;

					dm_wire_q_hit_decode(buf + DM_WIRE_HDR_LEN + sizeof(r) + 16 * i, 16, &qh);
					if (b->out_ids)
						b->out_ids[pos * b->k + i] = (int32_t)qh.id;
					for (uint32_t g = 0; g < b->k && g < b->gt_k; g++)
						if (b->gt[(size_t)q * b->gt_k + g] == (int32_t)qh.id) {
							hit++;
							break;
						}
				}
				b->recall[pos] = (double)hit / b->k;
				atomic_fetch_add(&b->reads, r.reads);
				atomic_fetch_add(&b->bytes, r.bytes);
				atomic_fetch_add(&b->rtrips, r.round_trips);
				atomic_fetch_add(&b->hops, r.hops);
				atomic_fetch_add(&b->hits_q, r.cache_hits);
				atomic_fetch_add(&b->rereads, r.rereads);
			}
			dm_msgpool_repost(b->pool, wr_id);
		}
	}
out:
	free(fl);
	free(msg);
	return NULL;
}

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

/* Run stream positions [first, first + nstream) of b over all connections; returns seconds. */
static double run_stream(struct bench *b, uint64_t first, uint64_t nstream)
{
	pthread_t *th = calloc(b->nconns, sizeof(*th));
	struct bthread *bt = calloc(b->nconns, sizeof(*bt));
	uint64_t t0;

	b->first = first;
	b->nstream = nstream;
	atomic_store(&b->next, 0);
	t0 = dm_now_ns();
	for (uint32_t i = 0; i < b->nconns; i++) {
		bt[i] = (struct bthread){ .b = b, .bc = &b->conns[i] };
		if (b->only_cn < 0 || b->conns[i].cn == (uint32_t)b->only_cn)
			bt[i].started = pthread_create(&th[i], NULL, bench_thread, &bt[i]) == 0;
	}
	for (uint32_t i = 0; i < b->nconns; i++)
		if (bt[i].started)
			pthread_join(th[i], NULL);
	free(th);
	free(bt);
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
		{ 0, 0, 0, 0 },
	};
	const char *config = NULL, *qpath = NULL, *gtpath = NULL, *outpath = NULL;
	unsigned long long k = 10, ef = 64, nq = 0, conns = 2, depth = 8, warmup = 0;
	uint64_t warmed = 0;   /* measured stream positions whose query the warm-up sent */
	unsigned long long rbatch = 0, rpause = 0;   /* 0: keep the compute nodes' setting */
	unsigned long long only_cn = ~0ull, beam = 1;
	double cache_mib = -1;
	uint32_t spill = DM_FWD_SPILL_KEEP;
	double ratio = -1, zipf = 0, admit = 0.1;
	int routing = DM_ROUTE_NONE;
	bool json = false, keep = false;
	struct dm_cluster_cfg *cfg;
	struct dm_vecs qv = { 0 }, gv = { 0 };
	struct bench b = { .lock = PTHREAD_MUTEX_INITIALIZER, .only_cn = -1 };
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
	b.only_cn = only_cn == ~0ull ? -1 : (int)only_cn;
	if (!nq)
		nq = qv.n;
	b.k = (uint32_t)k;
	b.ef = (uint32_t)ef;
	b.beam = (uint32_t)beam;
	b.dim = qv.dim;
	b.depth = (uint32_t)depth;
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
	b.x = dm_cluster_xport(cfg, NULL);
	if (!stream || !b.lat_us || !b.recall || (outpath && !b.out_ids) || !b.x)
		goto out;
	b.nconns = (uint32_t)(cfg->n_cn * conns);
	b.conns = calloc(b.nconns, sizeof(*b.conns));
	b.pool = dm_msgpool_new(b.x, b.nconns * ((uint32_t)depth + 4), 16384 + 64);
	if (!b.conns || !b.pool)
		goto out;
	/* Connections round-robin over the compute nodes: query i goes to CN i mod n (with
	 * --only-cn only that one's connections are opened and used). */
#define OTHER_CN(i) (b.only_cn >= 0 && (uint32_t)(i) != (uint32_t)b.only_cn)
	for (uint32_t i = 0; i < b.nconns; i++) {
		struct bconn *bc = &b.conns[i];

		bc->cn = i % cfg->n_cn;
		if (OTHER_CN(bc->cn))
			continue;   /* --only-cn: the others may be down */
		rc = dm_xport_connect(b.x, cfg->cn[bc->cn].address, 5000, &bc->conn);
		if (!rc)
			rc = dm_rpc_chan_init(&bc->ch, bc->conn, b.pool,
					      (uint32_t)(DM_WIRE_HDR_LEN + sizeof(struct dm_wire_q_search) +
							 4ull * qv.dim + 64), 30000);
		if (rc) {
			fprintf(stderr, "dmann bench: compute node %u (%s): %s\n", bc->cn,
				cfg->cn[bc->cn].address, strerror(-rc));
			goto out;
		}
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
		if (!rc && !st0[i].index_bytes)
			rc = -ENOENT;
		if (!rc && keep) {
			ratio += (double)st0[i].capacity_bytes / (double)st0[i].index_bytes /
				 (b.only_cn >= 0 ? 1 : cfg->n_cn);
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

		b.out_ids = NULL;
		run_stream(&b, 0, warmup);
		b.out_ids = out_ids;
		if (atomic_load(&b.errors)) {
			fprintf(stderr, "dmann bench: warm-up failed: %s\n", b.first_err);
			goto out;
		}
		atomic_store(&b.reads, 0);
		atomic_store(&b.bytes, 0);
		atomic_store(&b.rtrips, 0);
		atomic_store(&b.hops, 0);
		atomic_store(&b.hits_q, 0);
		atomic_store(&b.rereads, 0);
	}
	for (uint32_t i = 0; i < cfg->n_cn; i++)
		if (!OTHER_CN(i) && (rc = get_stats(&b.conns[i], &st0[i]))) {
			fprintf(stderr, "dmann bench: stats of compute node %u: %s\n", i, strerror(-rc));
			goto out;
		}
	{
		double secs = run_stream(&b, warmup, nq), rsum = 0, hits = 0, lookups = 0;
		uint64_t ok = 0, errs = atomic_load(&b.errors), fwd = 0, ran = 0, pauses = 0;
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
			if (router_call(&b.conns[b.only_cn >= 0 ? b.only_cn : 0],
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
			       "\"warmup\": %llu, \"warmed_queries\": %llu}\n",
			       recall, qps, p50, p99, hr, csp_s, ran ? (double)fwd / ran : 0.0,
			       atomic_load(&b.reads) / dq,
			       atomic_load(&b.bytes) / dq, atomic_load(&b.rtrips) / dq,
			       atomic_load(&b.hops) / dq, ratio, k, ef, (unsigned long long)ok,
			       (unsigned long long)errs, cfg->n_cn, cfg->n_mn,
			       dm_route_name((uint32_t)routing), zipf, (unsigned long long)pauses,
			       spill_on ? "true" : "false", b.only_cn, beam,
			       cache_mib >= 0 ? cache_mib :
			       ratio * (double)st0[b.only_cn >= 0 ? b.only_cn : 0].index_bytes / 1048576.0,
			       (unsigned long long)st0[b.only_cn >= 0 ? b.only_cn : 0].index_bytes,
			       atomic_load(&b.rereads), warmup, (unsigned long long)warmed);
		else
			printf("recall@%llu %.4f  qps %.1f  p50 %.0f us  p99 %.0f us  hit rate %.3f  "
			       "csp %s  routing %s (%.1f%% forwarded)  "
			       "reads/q %.1f  KiB/q %.1f  round trips/q %.1f  hops/q %.1f  (%llu queries, "
			       "%llu errors, cache %.1f%%, ef %llu)\n", k, recall, qps, p50, p99, hr,
			       csp_s, dm_route_name((uint32_t)routing),
			       ran ? 100.0 * (double)fwd / ran : 0.0,
			       atomic_load(&b.reads) / dq, atomic_load(&b.bytes) / dq / 1024,
			       atomic_load(&b.rtrips) / dq, atomic_load(&b.hops) / dq,
			       (unsigned long long)ok, (unsigned long long)errs, ratio * 100, ef);
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
	for (uint32_t i = 0; b.conns && i < b.nconns; i++)
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

/* ---- status ----------------------------------------------------------------------------- */

static void status_usage(FILE *f)
{
	fprintf(f, "usage: dmann status --config C [--json]\n\n"
		   "Ask every node of cluster C how it is: memory nodes report their region and\n"
		   "objects, compute nodes their index, cache and query counters.\n");
}

int dm_cmd_status(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, 0, 'c' }, { "json", no_argument, 0, 'j' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	const char *config = NULL;
	struct dm_cluster_cfg *cfg;
	struct dm_msgpool *pool = NULL;
	struct dm_xport *x;
	bool json = false, first = true;
	int c, down = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 'j': json = true; break;
		case 'h': status_usage(stdout); return 0;
		default: dm_cli_bad_option("status", c, argv, optind); return 2;
		}
	}
	if (!config || optind != argc) {
		status_usage(stderr);
		return 2;
	}
	cfg = load_cfg("status", config);
	if (!cfg)
		return 1;
	dm_log_set_level(DM_LOG_ERROR);
	x = dm_cluster_xport(cfg, NULL);
	if (x)
		pool = dm_msgpool_new(x, 8, 4096);
	if (!x || !pool) {
		free(cfg);
		return 1;
	}
	if (json)
		printf("{\"cluster\": \"%s\", \"nodes\": [", cfg->name);
	else
		printf("cluster %s: %u memory nodes, %u compute nodes\n", cfg->name, cfg->n_mn,
		       cfg->n_cn);
	for (uint32_t r = 0; r < 2; r++) {
		uint32_t cnt = r ? cfg->n_cn : cfg->n_mn;

		for (uint32_t i = 0; i < cnt; i++) {
			const struct dm_node_cfg *n = r ? &cfg->cn[i] : &cfg->mn[i];
			struct dm_conn *conn = NULL;
			struct dm_rpc_chan ch;
			struct dm_wire_fwd_rstats rst = { .csp_ppm = DM_FWD_CSP_NONE };
			struct dm_wire_ctl_gen_state gst = { 0 };
			uint8_t body[128];
			uint32_t blen = 0;
			int rc = dm_xport_connect(x, n->address, 2000, &conn);

			if (!rc)
				rc = dm_rpc_chan_init(&ch, conn, pool, 256, 3000);
			if (!rc) {
				rc = dm_rpc_call(&ch, r ? DM_OP_Q_STATS : DM_OP_CTL_INFO, NULL, 0, body,
						 sizeof(body), &blen);
				/* The router's state: CSP estimate, strategy, forwarding counters. */
				if (!rc && r) {
					uint8_t req[sizeof(struct dm_wire_fwd_rcfg)] = { 0 }, rb[128];
					uint32_t rl = 0;

					if (dm_rpc_call(&ch, DM_OP_FWD_ROUTER, req, sizeof(req), rb,
							sizeof(rb), &rl) ||
					    dm_wire_fwd_rstats_decode(rb, rl, &rst))
						memset(&rst, 0, sizeof(rst)), rst.csp_ppm = DM_FWD_CSP_NONE;
				}
				/* The memory node's index generations (read only). */
				if (!rc && !r) {
					struct dm_wire_ctl_gen g = { .cn = DM_GEN_NO_CN };
					uint8_t req[sizeof(g)], gb[sizeof(gst)];
					uint32_t gl = 0;

					dm_wire_ctl_gen_encode(req, &g);
					if (dm_rpc_call(&ch, DM_OP_CTL_GEN_REPORT, req, sizeof(req), gb,
							sizeof(gb), &gl) ||
					    dm_wire_ctl_gen_state_decode(gb, gl, &gst))
						memset(&gst, 0, sizeof(gst));
				}
				dm_rpc_chan_fini(&ch);
			}
			if (conn)
				dm_conn_close(conn);
			if (json)
				printf("%s{\"role\": \"%s\", \"id\": %u, \"address\": \"%s\", \"up\": %s",
				       first ? "" : ", ", r ? "cn" : "mn", i, n->address,
				       rc ? "false" : "true");
			first = false;
			if (rc) {
				down++;
				if (json)
					printf(", \"error\": \"%s\"}", strerror(-rc));
				else
					printf("  %s%u %-21s DOWN (%s)\n", r ? "cn" : "mn", i, n->address,
					       strerror(-rc));
				continue;
			}
			if (!r) {
				struct dm_wire_ctl_info in;

				dm_wire_ctl_info_decode(body, blen, &in);
				char gcur[24] = "null", gret[24] = "null";

				if (gst.flags & DM_GEN_F_CURRENT)
					snprintf(gcur, sizeof(gcur), "%llu", (unsigned long long)gst.current);
				if (gst.flags & DM_GEN_F_RETIRED)
					snprintf(gret, sizeof(gret), "%llu", (unsigned long long)gst.retired);
				if (json)
					printf(", \"region_bytes\": %llu, \"used_bytes\": %llu, "
					       "\"objects\": %u, \"hugepages\": %s, \"numa_node\": %d, "
					       "\"generation\": %s, \"retired_generation\": %s, "
					       "\"retired_waiting_cns\": %u}",
					       (unsigned long long)in.region_len,
					       (unsigned long long)in.used, in.objects,
					       in.huge ? "true" : "false", in.numa_node, gcur, gret,
					       gst.waiting);
				else
					printf("  mn%u %-21s up  region %.0f MiB (%s, NUMA %d), %.1f MiB "
					       "used, %u objects, generation %s%s%s%s\n", i, n->address,
					       in.region_len / 1048576.0, in.huge ? "hugepages" : "4k pages",
					       in.numa_node, in.used / 1048576.0, in.objects,
					       gst.flags & DM_GEN_F_CURRENT ? gcur : "none",
					       gst.flags & DM_GEN_F_RETIRED ? " (" : "",
					       gst.flags & DM_GEN_F_RETIRED ? gret : "",
					       gst.flags & DM_GEN_F_RETIRED ? " still held)" : "");
			} else {
				struct dm_wire_q_stats s;
				char csp[32] = "null";
				double hr;

				dm_wire_q_stats_decode(body, blen, &s);
				hr = s.hits + s.misses ? (double)s.hits / (double)(s.hits + s.misses) : 0;
				if (rst.csp_ppm != DM_FWD_CSP_NONE)
					snprintf(csp, sizeof(csp), "%.4f", rst.csp_ppm / 1e6);
				if (json)
					printf(", \"index_bytes\": %llu, \"cache_bytes\": %llu, "
					       "\"cache_capacity\": %llu, \"hit_rate\": %.4f, "
					       "\"queries\": %llu, \"errors\": %llu, \"csp\": %s, "
					       "\"csp_age_ms\": %llu, \"routing\": \"%s\", "
					       "\"forwarded\": %llu, \"received\": %llu, "
					       "\"centroid_hash\": \"%016llx\", \"oracle_epoch\": %u, "
					       "\"read_failovers\": %llu, \"mn_marked_down\": %llu, "
					       "\"mn_marked_up\": %llu, \"mn_down\": %u}",
					       (unsigned long long)s.index_bytes,
					       (unsigned long long)s.cache_bytes,
					       (unsigned long long)s.capacity_bytes, hr,
					       (unsigned long long)s.queries, (unsigned long long)s.errors,
					       csp, (unsigned long long)rst.csp_age_ms,
					       dm_route_name(rst.strategy),
					       (unsigned long long)rst.forwarded,
					       (unsigned long long)rst.received,
					       (unsigned long long)rst.centroid_hash, rst.epoch,
					       (unsigned long long)s.failovers,
					       (unsigned long long)s.mn_downs,
					       (unsigned long long)s.mn_ups, s.mn_down);
				else
					printf("  cn%u %-21s up  index %.1f MiB, cache %.1f/%.1f MiB, hit "
					       "rate %.3f, %llu queries, %llu errors, csp %s, routing %s, "
					       "oracle %016llx, READs failed over %llu, memory nodes marked "
					       "down %llu / up %llu, %u down now\n", i, n->address,
					       s.index_bytes / 1048576.0, s.cache_bytes / 1048576.0,
					       s.capacity_bytes / 1048576.0, hr,
					       (unsigned long long)s.queries, (unsigned long long)s.errors,
					       csp, dm_route_name(rst.strategy),
					       (unsigned long long)rst.centroid_hash,
					       (unsigned long long)s.failovers,
					       (unsigned long long)s.mn_downs,
					       (unsigned long long)s.mn_ups, s.mn_down);
			}
		}
	}
	if (json)
		printf("], \"down\": %d}\n", down);
	dm_msgpool_free(pool);
	dm_xport_close(x);
	free(cfg);
	return down ? 1 : 0;
}
