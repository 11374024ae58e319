/* cli_cluster.c: CLI commands that talk to a running cluster.
 *   dmann load    place an index image on the memory nodes (as HNSW graph --graph G)
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
#if DM_HAVE_CLIENT
#include "cli_import.h"
#endif
#include "cluster.h"
#include "dgen.h"
#include "dindex.h"
#include "hnsw/hnsw.h"
#include "rpc.h"
#include "vecfile.h"
#if DM_HAVE_ETCD
#include "cstate.h"
#include "etcd.h"
#include "member.h"
#include "stale.h"
#endif

#define load_cfg dm_cli_load_cfg

/* ---- load ------------------------------------------------------------------------------- */

static void load_usage(FILE *f)
{
	fprintf(f, "usage: dmann load --config C --index INDEX [--graph G] [--spare N]\n"
		   "         [--place-run R] [--no-snapshot] [--no-wait]\n"
		   "         [--bucket B --name I [--keys FILE] [--metadata FILE]\n"
		   "          [--vectors FILE]]\n\n"
		   "Place the index image INDEX on the memory nodes of cluster C as the next\n"
		   "generation of HNSW graph G: every block on the memory nodes the placement\n"
		   "function picks for it, the metadata on all of them; then publish it, ask every\n"
		   "memory node to snapshot (so a restart keeps the index) and wait until every\n"
		   "compute node moved to it and the previous generation is freed (--no-wait: do\n"
		   "not wait; the memory nodes free it on their own). Compute nodes keep answering\n"
		   "queries throughout: each query runs on one generation.\n\n"
		   "  --graph G      the graph number, 0..%u (default 0; with --bucket the lowest\n"
		   "                 number no graph uses, so that every imported index keeps\n"
		   "                 its graph); another number places a graph beside the others\n"
		   "                 (see `dmann graph list`, `dmann graph drop`). Only graph 0\n"
		   "                 is cached and routed by the compute nodes\n"
		   "  --spare N      room for N more records, written online by `dmann insert` or,\n"
		   "                 with --bucket, by the online indexer (default 0: a read-only\n"
		   "                 index; with --bucket a quarter of the image's nodes, at least\n"
		   "                 10000: rows past it stay in the tail, scanned exactly)\n"
		   "  --bucket B --name I\n"
		   "                 bulk import: first create S3 Vectors index I in bucket B with\n"
		   "                 the image's dimension and metric (euclidean or cosine) and put\n"
		   "                 every vector of the image into it (key: the node id, or line i\n"
		   "                 of --keys; metadata: line i of --metadata, a JSON object or an\n"
		   "                 empty line), then place the graph bound to it and mark its rows\n"
		   "                 as indexed: QueryVectors on I then searches the graph for them\n"
		   "                 and scans only the rows written later (docs/api.md, \"The\n"
		   "                 graph path\"). I must not exist yet. A later load with the\n"
		   "                 same --graph replaces that graph (the index it served goes\n"
		   "                 back to the exact path)\n"
		   "  --keys FILE    one key per line (1..1024 bytes), as many as the image has vectors\n"
		   "  --metadata FILE  one JSON object (or an empty line) per vector\n"
		   "                 (an image built with --order vhash: its vectors keep the keys\n"
		   "                 and metadata of their rows in the vector file: node i's key is\n"
		   "                 its row number, or that line of --keys)\n"
		   "  --vectors FILE the vector file the image was built from (dmann build --base):\n"
		   "                 the rows put are its vectors exactly, as GetVectors then\n"
		   "                 returns them; each is checked against its node's vector in\n"
		   "                 the image (a file that does not match is refused). Without\n"
		   "                 it the rows are the image's vectors: rotated back when the\n"
		   "                 image has codes (within float rounding of the originals) and\n"
		   "                 normalised for cosine\n"
		   "  --place-run R  place runs of R consecutive blocks together (1..%u, default 1:\n"
		   "                 each block on its own replicas): with a key-ordered image\n"
		   "                 (dmann build --order vhash) neighbouring blocks are\n"
		   "                 neighbouring regions, and a run keeps a region's hops on the\n"
		   "                 same memory nodes. Kept in the graph's metadata, so compute\n"
		   "                 nodes and repairs place the blocks the same way\n",
		   DM_MAX_GRAPHS - 1, DINDEX_MAX_RUN);
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
		{ "bucket", required_argument, 0, 'b' }, { "name", required_argument, 0, 'N' },
		{ "keys", required_argument, 0, 'k' }, { "metadata", required_argument, 0, 'm' },
		{ "vectors", required_argument, 0, 'V' },
		{ "graph", required_argument, 0, 'g' },
		{ "place-run", required_argument, 0, 'r' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	const char *config = NULL, *index = NULL;
	struct dm_import im = { 0 };
	struct dm_cluster_cfg *cfg;
	struct hnsw_index *idx;
	struct dm_progress *prog;
	struct dm_xport *x;
	struct mn_set *s;
	bool snap = true, wait = true;
	char err[1024];
	uint64_t t0, gen = 0;
	unsigned long long spare = 0, graph = 0, run = 1;
	bool spare_set = false, graph_set = false;
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
			spare_set = true;
			break;
		case 'g':
			if (dm_cli_parse_u64("load", "--graph", optarg, 0, DM_MAX_GRAPHS - 1, &graph))
				return 2;
			graph_set = true;
			break;
		case 'r':
			if (dm_cli_parse_u64("load", "--place-run", optarg, 1, DINDEX_MAX_RUN, &run))
				return 2;
			break;
		case 'b': im.bucket = optarg; break;
		case 'N': im.index = optarg; break;
		case 'k': im.keys_file = optarg; break;
		case 'm': im.meta_file = optarg; break;
		case 'V': im.vec_file = optarg; break;
		case 'h': load_usage(stdout); return 0;
		default: dm_cli_bad_option("load", c, argv, optind); return 2;
		}
	}
	if (!config || !index || optind != argc) {
		load_usage(stderr);
		return 2;
	}
	if (!im.bucket != !im.index ||
	    (!im.bucket && (im.keys_file || im.meta_file || im.vec_file))) {
		fprintf(stderr, "dmann load: --bucket and --name go together (and --keys, "
			"--metadata and --vectors need them)\n");
		return 2;
	}
#if !DM_HAVE_CLIENT
	if (im.bucket) {
		fprintf(stderr, "dmann load: --bucket needs libdmann (built without jansson)\n");
		return 2;
	}
#endif
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
	{
		/* The placement in the cluster state: retired memory nodes hold nothing (and
		 * may be gone for good), the others must all be reachable. */
		uint64_t retired[DM_MAX_NODES / 64] = { 0 };
		bool any = false;
#if DM_HAVE_ETCD
		struct dm_placement pl;

		if (cfg->etcd[0]) {
			rc = dm_placement_read(cfg->etcd, cfg->name, 3000, &pl, err, sizeof(err));
			if (rc && rc != -ENOENT) {
				fprintf(stderr, "dmann load: reading the placement: %s\n", err);
				goto out_x;
			}
			memcpy(retired, pl.retired, sizeof(retired));
			for (size_t i = 0; i < DM_ARRAY_SIZE(retired); i++)
				any |= retired[i] != 0;
		}
#endif
		s = mn_set_open(cfg, x, NULL, !any, 5000);
		if (!s) {
			fprintf(stderr, "dmann load: cannot reach every memory node of %s: %s\n",
				config, strerror(errno));
			goto out_x;
		}
		memcpy(s->retired, retired, sizeof(retired));
	}
	if (im.bucket && !graph_set) {
		/* a graph of its own: the lowest number no memory node has a generation of */
		struct dgen_graphs gl;

		rc = dgen_list(s, &gl);
		if (rc) {
			fprintf(stderr, "dmann load: listing the graphs: %s\n", strerror(-rc));
			goto out_s;
		}
		graph = dgen_free_graph(&gl);
		if (graph == DM_MAX_GRAPHS) {
			fprintf(stderr, "dmann load: all %u graphs are in use (dmann graph list; dmann "
				"graph drop --graph G frees one)\n", DM_MAX_GRAPHS);
			goto out_s;
		}
	}
	t0 = dm_now_ns();
	struct dindex_bind_in bind = { 0 };

#if DM_HAVE_CLIENT
	if (im.bucket) {
		prog = dm_progress_start("import", idx->n);
		im.progress = load_progress;
		im.parg = prog;
		im.s = s;
		rc = dm_import_rows(cfg, idx, &im, err, sizeof(err));
		dm_progress_end(prog);
		if (rc) {
			fprintf(stderr, "dmann load: import into %s/%s: %s\n", im.bucket, im.index, err);
			goto out_s;
		}
		printf("dmann load: %u vectors put into %s/%s, %.2f s\n", idx->n, im.bucket,
		       im.index, (double)(dm_now_ns() - t0) / 1e9);
		bind = (struct dindex_bind_in){ .bucket = im.bucket, .index = im.index,
						.keys = (const char *const *)im.keys, .n = im.n };
	}
#endif
	/* A bulk import is written online afterwards: room for the indexer by default. */
	if (im.bucket && !spare_set)
		spare = DM_MIN(DM_MAX((unsigned long long)idx->n / 4, 10000ull),
			       (unsigned long long)DINDEX_MAX_CAP - idx->n);
	prog = dm_progress_start("load", (uint64_t)idx->n * idx->rec_size * cfg->redundancy);
	rc = dindex_load(s, (uint32_t)graph, idx, (uint32_t)spare, (uint32_t)run,
			 im.bucket ? &bind : NULL, &gen,
			 load_progress, prog, err, sizeof(err));
	dm_progress_end(prog);
	if (rc) {
		fprintf(stderr, "dmann load: %s\n", err);
		goto out_s;
	}
#if DM_HAVE_CLIENT
	if (im.bucket) {
		rc = dm_import_mark(cfg, s, &im, dm_graph_tag((uint32_t)graph, gen), err,
				    sizeof(err));
		if (rc) {
			fprintf(stderr, "dmann load: the graph of %s/%s is placed but not marked, so "
				"the exact path serves the index: %s\n", im.bucket, im.index, err);
			goto out_s;
		}
		printf("dmann load: %s/%s: rows 0..%u are in graph %llu, generation %llu\n",
		       im.bucket, im.index, im.n - 1, graph, (unsigned long long)gen);
	}
#endif
	if (snap && (rc = mn_set_snapshot(s)))
		fprintf(stderr, "dmann load: warning: snapshot failed: %s\n", strerror(-rc));
	printf("dmann load: %s%.0llu%sgeneration %llu: %u records (%.1f MiB) in %llu blocks on %u "
	       "memory nodes, redundancy %u, room for %llu more, %.2f s\n", graph ? "graph " : "",
	       graph, graph ? ", " : "", (unsigned long long)gen,
	       idx->n, (double)idx->n * idx->rec_size / 1048576.0,
	       (unsigned long long)(((uint64_t)idx->n + spare + (1ull << idx->p.block_shift) - 1) >>
				    idx->p.block_shift), cfg->n_mn, cfg->redundancy,
	       (unsigned long long)spare, (double)(dm_now_ns() - t0) / 1e9);
	{
		/* What each memory node holds of the graph's blocks (the balance of the placement,
		 * runs or not): the same placement function the load used. */
		uint64_t per[DM_MAX_NODES] = { 0 }, cap = (uint64_t)idx->n + spare;
		uint32_t nb = (uint32_t)((cap + (1ull << idx->p.block_shift) - 1) >>
					 idx->p.block_shift), r = cfg->redundancy ? cfg->redundancy : 1;

		for (uint32_t b = 0; b < nb; b++) {
			uint32_t reps[DINDEX_MAX_REP];
			uint64_t first = (uint64_t)b << idx->p.block_shift;
			uint64_t recs = DM_MIN(1ull << idx->p.block_shift, cap - first);
			int nr = dindex_block_replicas(s, (uint32_t)graph, (uint32_t)run, b,
						       DM_MIN(r, DINDEX_MAX_REP), reps);

			for (int j = 0; j < nr; j++)
				per[reps[j]] += recs * idx->rec_size;
		}
		printf("dmann load: block bytes per memory node:");
		for (uint32_t i = 0; i < cfg->n_mn; i++)
			printf(" %llu", (unsigned long long)per[i]);
		printf("\n");
	}
	status = 0;
	if (wait) {
		/* The compute nodes acknowledge within refresh_ms; one that is gone is given up
		 * after the lease. */
		t0 = dm_now_ns();
		if (dgen_report(s, (uint32_t)graph, DM_GEN_NO_CN, 0, &v, NULL) == 0 &&
		    !v.has_retired) {
			/* Nothing to release: no compute node has acknowledged anything yet. */
			printf("dmann load: no previous generation; the compute nodes pick up "
			       "generation %llu within their refresh period ([cn] refresh_ms = %u ms)\n",
			       (unsigned long long)gen, cfg->cn_all.refresh_ms);
			goto out_s;
		}
		rc = dgen_wait_released(s, (uint32_t)graph, cfg->cn_all.lease_ms + 5000, &v);
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
#if DM_HAVE_CLIENT
	dm_import_fini(&im);
#endif
	hnsw_free(idx);
out_cfg:
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

#if DM_HAVE_ETCD
/* The controller and the up-set of the cluster state (JSON: fields inside "etcd"). */
static void upset_show(const struct dm_cluster_cfg *cfg, bool json)
{
	struct dm_upset u;
	char ctl[32], err[512], down[1024] = "";
	int rc = dm_upset_read(cfg->etcd, cfg->name, 3000, &u, ctl, sizeof(ctl), err, sizeof(err));

	if (rc && rc != -ENOENT) {
		if (json)
			printf(", \"upset_error\": \"%s\"", strerror(-rc));
		else
			printf("  cluster state: not read (%s)\n", err);
		return;
	}
	for (uint32_t r = 0; !rc && r < 2; r++)
		for (uint32_t id = 0; id < (r ? cfg->n_cn : cfg->n_mn); id++)
			if (!dm_upset_has(r ? u.cn : u.mn, id))
				snprintf(down + strlen(down), sizeof(down) - strlen(down), "%s%s%s%u%s",
					 down[0] ? (json ? ", " : " ") : "", json ? "\"" : "",
					 r ? "cn" : "mn", id, json ? "\"" : "");
	if (json) {
		printf(", \"controller\": \"%s\"", ctl);
		if (!rc)
			printf(", \"upset\": {\"version\": %lld, \"by\": \"%s\", \"time\": %lld, "
			       "\"down\": [%s]}", (long long)u.version, u.controller,
			       (long long)u.time, down);
	}
	{
		struct dm_placement pl;
		char ret[1024] = "";
		int prc = dm_placement_read(cfg->etcd, cfg->name, 3000, &pl, err, sizeof(err));

		for (uint32_t id = 0; !prc && id < cfg->n_mn; id++)
			if (dm_upset_has(pl.retired, id))
				snprintf(ret + strlen(ret), sizeof(ret) - strlen(ret), "%s%smn%u%s",
					 ret[0] ? (json ? ", " : " ") : "", json ? "\"" : "", id,
					 json ? "\"" : "");
		if (json && !prc)
			printf(", \"placement\": {\"version\": %lld, \"by\": \"%s\", "
			       "\"retired\": [%s]}", (long long)pl.version, pl.by, ret);
		else if (!json && !prc)
			printf("  placement: version %lld (by %s), retired: %s\n",
			       (long long)pl.version, pl.by, ret);
	}
	{
		/* Bucket replicas that missed writes (reads skip them until caught up). */
		struct dm_etcd *e = dm_etcd_open(cfg->etcd, 3000);
		struct dm_stale *st = NULL;
		size_t ns = 0;
		char list[1024] = "";

		if (e && !dm_stale_list(e, cfg->name, &st, &ns)) {
			for (size_t i = 0; i < ns; i++)
				snprintf(list + strlen(list), sizeof(list) - strlen(list),
					 "%s%s%s/mn%u%s", i ? (json ? ", " : " ") : "",
					 json ? "\"" : "", st[i].bucket, st[i].mn, json ? "\"" : "");
			if (json)
				printf(", \"stale_replicas\": [%s]", list);
			else
				printf("  stale bucket replicas: %zu%s%s\n", ns, ns ? " (caught up by the "
				       "controller once up): " : "", list);
		}
		free(st);
		dm_etcd_close(e);
	}
	if (json)
		return;
	if (rc)
		printf("  cluster state: no up-set yet; controller %s\n", ctl[0] ? ctl : "none");
	else
		printf("  cluster state: up-set version %lld (written by %s), controller %s, %s%s\n",
		       (long long)u.version, u.controller, ctl[0] ? ctl : "none",
		       down[0] ? "declared down: " : "every node up", down);
}
#endif

/* The members registered in the cluster state (etcd), when the cluster file names one:
 * which nodes hold a live lease, which do not. Returns the count of nodes not registered
 * (or 1 when etcd cannot be read). */
static int etcd_members(const struct dm_cluster_cfg *cfg, bool json)
{
	if (!cfg->etcd[0])
		return 0;
#if DM_HAVE_ETCD
	struct dm_member_info *mi = NULL;
	size_t n = 0;
	char err[512], missing[1024] = "";
	int rc = dm_members_list(cfg->etcd, cfg->name, 3000, &mi, &n, err, sizeof(err)), gone = 0;

	if (rc) {
		if (json)
			printf(", \"etcd\": {\"endpoints\": \"%s\", \"error\": \"%s\"}", cfg->etcd,
			       strerror(-rc));
		else
			printf("  etcd %s: UNREACHABLE (%s)\n", cfg->etcd, err);
		free(mi);
		return 1;
	}
	if (json)
		printf(", \"etcd\": {\"endpoints\": \"%s\", \"members\": [", cfg->etcd);
	for (size_t i = 0; i < n; i++)
		if (json)
			printf("%s{\"role\": \"%s\", \"id\": %u, \"address\": \"%s\", "
			       "\"pid\": %lld, \"since\": %lld}", i ? ", " : "", mi[i].role,
			       mi[i].id, mi[i].address, (long long)mi[i].pid, (long long)mi[i].since);
	for (uint32_t r = 0; r < 2; r++)
		for (uint32_t id = 0; id < (r ? cfg->n_cn : cfg->n_mn); id++) {
			bool found = false;

			for (size_t i = 0; i < n && !found; i++)
				found = mi[i].id == id && !strcmp(mi[i].role, r ? "cn" : "mn");
			if (!found) {
				gone++;
				snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing),
					 "%s%s%u", missing[0] ? (json ? "\", \"" : " ") : "",
					 r ? "cn" : "mn", id);
			}
		}
	if (json)
		printf("], \"missing\": [%s%s%s]", missing[0] ? "\"" : "", missing,
		       missing[0] ? "\"" : "");
	else
		printf("  etcd %s: %zu members registered (lease alive)%s%s\n", cfg->etcd, n,
		       gone ? ", not registered: " : "", missing);
	free(mi);
	upset_show(cfg, json);
	if (json)
		printf("}");
	return gone;
#else
	if (json)
		printf(", \"etcd\": {\"endpoints\": \"%s\", \"error\": \"built without the "
		       "etcd client\"}", cfg->etcd);
	else
		printf("  etcd %s: not read (dmann built without the etcd client: libcurl)\n",
		       cfg->etcd);
	return 1;
#endif
}

/* dm_wire_fwd_rstats.rollout as dmann status shows it */
static const char *rollout_name(uint32_t r)
{
	return r == DM_FWD_ROLLOUT_PREPARING ? "preparing" :
	       r == DM_FWD_ROLLOUT_PREPARED ? "prepared" : "idle";
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
			uint8_t body[256];    /* Q_STATS (152 bytes) or CTL_INFO */
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
				char csp[32] = "null", roll[48] = "";
				double hr;

				dm_wire_q_stats_decode(body, blen, &s);
				hr = s.hits + s.misses ? (double)s.hits / (double)(s.hits + s.misses) : 0;
				if (rst.csp_ppm != DM_FWD_CSP_NONE)
					snprintf(csp, sizeof(csp), "%.4f", rst.csp_ppm / 1e6);
				if (rst.next_epoch > rst.epoch)
					snprintf(roll, sizeof(roll), ", %s epoch %u",
						 rollout_name(rst.rollout), rst.next_epoch);
				if (json)
					printf(", \"index_bytes\": %llu, \"cache_bytes\": %llu, "
					       "\"cache_capacity\": %llu, \"hit_rate\": %.4f, "
					       "\"queries\": %llu, \"errors\": %llu, \"csp\": %s, "
					       "\"csp_age_ms\": %llu, \"routing\": \"%s\", "
					       "\"forwarded\": %llu, \"received\": %llu, "
					       "\"centroid_hash\": \"%016llx\", \"oracle_epoch\": %u, "
					       "\"oracle_next_epoch\": %u, \"rollout\": \"%s\", "
					       "\"route_epoch\": \"%08x\", "
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
					       rst.next_epoch, rollout_name(rst.rollout),
					       rst.route_epoch, (unsigned long long)s.failovers,
					       (unsigned long long)s.mn_downs,
					       (unsigned long long)s.mn_ups, s.mn_down);
				else
					printf("  cn%u %-21s up  index %.1f MiB, cache %.1f/%.1f MiB, hit "
					       "rate %.3f, %llu queries, %llu errors, csp %s, routing %s, "
					       "oracle %016llx (epoch %u%s), routing epoch %08x, READs "
					       "failed over %llu, "
					       "memory nodes marked "
					       "down %llu / up %llu, %u down now\n", i, n->address,
					       s.index_bytes / 1048576.0, s.cache_bytes / 1048576.0,
					       s.capacity_bytes / 1048576.0, hr,
					       (unsigned long long)s.queries, (unsigned long long)s.errors,
					       csp, dm_route_name(rst.strategy),
					       (unsigned long long)rst.centroid_hash, rst.epoch, roll,
					       rst.route_epoch,
					       (unsigned long long)s.failovers,
					       (unsigned long long)s.mn_downs,
					       (unsigned long long)s.mn_ups, s.mn_down);
			}
		}
	}
	if (json)
		printf("]");
	down += etcd_members(cfg, json);
	if (json)
		printf(", \"down\": %d}\n", down);
	dm_msgpool_free(pool);
	dm_xport_close(x);
	free(cfg);
	return down ? 1 : 0;
}
