/* cli_graph.c: the HNSW graphs the memory nodes hold (numbers 0..DM_MAX_GRAPHS-1):
 *   dmann graph list   every graph: current generation, nodes, dimension, M, capacity
 *   dmann graph drop   drop one (CTL_GEN_DROP on every memory node, dindex_drop_graph)
 *   dmann graph check  the health of one graph.
 * `check`, as an admin, opens the current generation's view (dindex_open), reads every block with
 * one-sided READs and reports: ids handed out (the insert id counter), records whole, torn
 * (a writer holds them, or died holding them) or empty (an id taken by an insert that never
 * wrote its record), neighbour ids out of range, level-0 edges, and the nodes no search can
 * reach: a breadth-first walk from the entry point over the upper lists and the level-0
 * lists, as HNSW's search descends and then expands (Malkov & Yashunin, Algorithms 2 and 5);
 * with --anchors also the nodes whose nearest in-link is far (anchors()).
 * Unreachable nodes are listed with their S3 keys where the binding names them (bulk-
 * imported ids; the keys of ids the online indexer added live in the flat stores' key logs).
 * `list` and `check` are read-only: they change nothing. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cluster.h"
#if DM_HAVE_ETCD
#include "cstate.h"
#include "etcd.h"
#include "idrange.h"
#include "upper.h"
#endif
#include "dgen.h"
#include "dindex.h"
#include "hnsw/hnsw_layout.h"

static void graph_usage(FILE *f)
{
	fprintf(f, "usage: dmann graph check --config C [--graph G] [--list N] [--anchors] [--json]\n"
		   "       dmann graph list --config C\n"
		   "       dmann graph drop --config C --graph G [--no-snapshot]\n\n"
		   "check: read every record of HNSW graph G placed on cluster C's memory nodes\n"
		   "(the current generation; one-sided READs as an admin, nothing is changed) and\n"
		   "report its health: records whole, torn or empty, neighbour ids out of range,\n"
		   "edges, and the nodes no search can reach from the entry point (HNSW's descent\n"
		   "through the upper levels, then level 0). Exit status 0 when the check ran\n"
		   "(whatever it found), 1 when it could not, 2 for bad usage.\n\n"
		   "list: one line per graph the memory nodes hold: its number, current\n"
		   "generation, nodes, dimension, M and capacity (and a generation still held\n"
		   "after a drop or a load). Exit status 0, or 1 when a memory node did not answer.\n\n"
		   "drop: remove graph G from every memory node (all of them but the retired ones\n"
		   "must be up): its metadata goes at once, its blocks once every compute node\n"
		   "released them (or its lease ran out); then the memory nodes snapshot, so\n"
		   "that a restart does not bring it back. `dmann load --graph G` may then place\n"
		   "a new one.\n\n"
		   "  --graph G     the graph number, 0..%u (default 0 for check)\n"
		   "  --list N      check: name at most N unreachable nodes (0..100000,\n"
		   "                default 20)\n"
		   "  --anchors     check: also read every stored vector and count the nodes\n"
		   "                whose nearest in-link is over 1.5x / 2x / 4x as far (by the\n"
		   "                index's score) as their nearest out-link: nodes a search\n"
		   "                for their own vector reaches only from afar (JSON:\n"
		   "                far_in_links; holds nodes x dimension floats in memory)\n"
		   "  --json        check: one JSON object with the figures\n"
		   "  --no-snapshot drop: do not ask the memory nodes to snapshot\n",
		   DM_MAX_GRAPHS - 1);
}

struct gcheck {
	uint64_t used;            /* ids handed out */
	uint64_t whole, torn, empty, bad_ids, edges, reached, unreached, no_inlink;
	uint64_t few_in[4];        /* whole nodes with exactly 0..3 level-0 in-links */
	uint32_t *adj;            /* used x 2M level-0 lists */
	uint16_t *n0;             /* per id: its list length */
	uint8_t *st;              /* per id: 0 empty, 1 whole, 2 torn */
	float *vec;               /* with --anchors: used x vdim stored vectors, else NULL */
	uint64_t far_in[3];       /* --anchors: nodes whose nearest in-link is over 1.5x / 2x /
				   * 4x as far as their nearest out-link */
};

enum { ST_EMPTY, ST_WHOLE, ST_TORN };

static bool rec_zero(const uint8_t *r, uint32_t len)
{
	for (uint32_t i = 0; i < len; i++)
		if (r[i])
			return false;
	return true;
}

/* Read every block (a block with torn records is read again, up to 3 more times). */
static int read_records(struct mn_set *s, const struct dindex *d, struct gcheck *g)
{
	uint32_t bs = 1u << d->p.block_shift, M2 = 2 * d->p.M;
	uint64_t nb = (g->used + bs - 1) / bs;
	uint8_t *buf = aligned_alloc(64, DM_ALIGN_UP((size_t)bs * d->rec_size, 64));
	int rc = buf ? 0 : -ENOMEM;

	for (uint64_t b = 0; b < nb && !rc; b++) {
		uint64_t len = 0, first = b * bs;
		uint32_t torn = 0;

		for (int t = 0; t < 4; t++) {
			rc = dindex_read_block(s, d, (uint32_t)b, buf, &len);
			if (rc)
				break;
			torn = 0;
			for (uint64_t id = first; id < DM_MIN(first + bs, g->used); id++) {
				const uint8_t *r = buf + (id - first) * d->rec_size;
				const struct hnsw_rec_hdr *h = (const struct hnsw_rec_hdr *)r;

				if ((id - first + 1) * d->rec_size > len)
					g->st[id] = ST_EMPTY;
				else if (rec_zero(r, d->rec_size))
					g->st[id] = ST_EMPTY;
				else if (!dindex_rec_ok(d, h))   /* as readers take it */
					g->st[id] = ST_TORN, torn++;
				else
					g->st[id] = ST_WHOLE;
				if (g->st[id] == ST_WHOLE) {
					const uint32_t *ids = hnsw_rec_nbrs(h);

					g->n0[id] = (uint16_t)h->n0;
					memcpy(g->adj + id * M2, ids, h->n0 * sizeof(uint32_t));
					if (g->vec)
						memcpy(g->vec + id * d->vdim, hnsw_rec_vec(h, d->vec_off),
						       (size_t)d->vdim * sizeof(float));
				} else {
					g->n0[id] = 0;
				}
			}
			if (!torn)
				break;
		}
	}
	free(buf);
	return rc;
}

/* Breadth-first from the entry point over upper and level-0 lists. */
static int walk(const struct dindex *d, struct gcheck *g, uint8_t *seen)
{
	uint32_t M2 = 2 * d->p.M, *q = malloc(g->used * sizeof(uint32_t));
	uint32_t *inl = calloc(g->used, sizeof(uint32_t));
	uint64_t head = 0, tail = 0;

	if (!q || !inl) {
		free(q);
		free(inl);
		return -ENOMEM;
	}
	for (uint64_t id = 0; id < g->used; id++) {
		if (g->st[id] == ST_WHOLE)
			g->whole++;
		else if (g->st[id] == ST_TORN)
			g->torn++;
		else
			g->empty++;
		for (uint32_t j = 0; j < g->n0[id]; j++) {
			uint32_t v = g->adj[id * M2 + j];

			if (v >= g->used) {
				g->bad_ids++;
				continue;
			}
			g->edges++;
			if (v != id)
				inl[v]++;
		}
	}
	if (d->entry < g->used) {
		seen[d->entry] = 1;
		q[tail++] = d->entry;
	}
	while (head < tail) {
		uint32_t u = q[head++];

		if (u < d->n && d->upl[u]) {
			uint32_t lv = dindex_level(d, u);

			for (uint32_t l = 0; l < lv; l++) {
				const uint32_t *w = d->upl[u] + (size_t)l * hnsw_up_list_words(d->p.M);

				for (uint32_t j = 0; j < w[0]; j++)
					if (w[1 + j] < g->used && !seen[w[1 + j]]) {
						seen[w[1 + j]] = 1;
						q[tail++] = w[1 + j];
					}
			}
		}
		for (uint32_t j = 0; j < g->n0[u]; j++) {
			uint32_t v = g->adj[(uint64_t)u * M2 + j];

			if (v < g->used && !seen[v]) {
				seen[v] = 1;
				q[tail++] = v;
			}
		}
	}
	for (uint64_t id = 0; id < g->used; id++) {
		if (g->st[id] != ST_WHOLE)
			continue;
		if (seen[id])
			g->reached++;
		else
			g->unreached++;
		if (!inl[id] && id != d->entry && !(id < d->n && d->upl[id]))
			g->no_inlink++;
		if (inl[id] < DM_ARRAY_SIZE(g->few_in))
			g->few_in[inl[id]]++;
	}
	free(q);
	free(inl);
	return 0;
}

/* --anchors: for every whole node with in- and out-links, its nearest in-link (the node
 * nearest to it among those that link to it) against its nearest out-link, by the index's
 * own score (squared l2, or 1 - cos): a node a search for its own vector reaches only
 * through nodes much farther than its neighbourhood is found by chance (the SDK test's row
 * t21933 of 2026-12-07: one in-link, 1.7x as far as its nearest out-link). */
static int anchors(const struct dindex *d, struct gcheck *g)
{
	hnsw_kernel_fn kern = hnsw_kernel_for(d->p.metric);
	uint32_t M2 = 2 * d->p.M;
	float *in = malloc(g->used * sizeof(float)), *out = malloc(g->used * sizeof(float));

	if (!in || !out) {
		free(in);
		free(out);
		return -ENOMEM;
	}
	for (uint64_t id = 0; id < g->used; id++)
		in[id] = out[id] = INFINITY;
	for (uint64_t u = 0; u < g->used; u++) {
		for (uint32_t j = 0; j < g->n0[u]; j++) {
			uint32_t v = g->adj[u * M2 + j];
			float dv;

			if (v >= g->used || v == u || g->st[v] != ST_WHOLE)
				continue;
			dv = kern(g->vec + u * d->vdim, g->vec + (uint64_t)v * d->vdim, d->vdim);
			out[u] = DM_MIN(out[u], dv);
			in[v] = DM_MIN(in[v], dv);
		}
	}
	for (uint64_t id = 0; id < g->used; id++) {
		static const float lim[3] = { 1.5f, 2.0f, 4.0f };

		if (g->st[id] != ST_WHOLE || !isfinite(in[id]) || !isfinite(out[id]))
			continue;
		for (uint32_t k = 0; k < 3; k++)
			if (in[id] > lim[k] * out[id])
				g->far_in[k]++;
	}
	free(in);
	free(out);
	return 0;
}

static void print_key(const struct dindex *d, uint64_t id, bool json)
{
	uint32_t kl;
	const char *k = dindex_bind_key(d->bind, id, &kl);

	if (!k) {
		printf(json ? "null" : "(added online: see the key log)");
		return;
	}
	putchar('"');
	for (uint32_t i = 0; i < kl; i++) {
		unsigned char c = (unsigned char)k[i];

		if (json && (c == '"' || c == '\\'))
			printf("\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

/* The memory nodes of the cluster file at config, over a new transport (*x), every one that
 * answers; the placement's retired ones (they hold nothing) marked so when the cluster file
 * names a cluster state. NULL after a message. */
static struct mn_set *open_mns(const char *cmd, const char *config, struct dm_cluster_cfg **cfg,
			       struct dm_xport **x)
{
	struct mn_set *s;

	*cfg = dm_cli_load_cfg(cmd, config);
	if (!*cfg)
		return NULL;
	*x = dm_cluster_xport(*cfg, NULL);
	if (!*x)
		goto err_cfg;
	s = mn_set_open(*cfg, *x, NULL, false, 5000);
	if (!s) {
		fprintf(stderr, "dmann %s: cannot reach the memory nodes of %s: %s\n", cmd, config,
			strerror(errno));
		goto err_x;
	}
#if DM_HAVE_ETCD
	if ((*cfg)->etcd[0]) {
		struct dm_placement pl;
		char err[512];
		int rc = dm_placement_read((*cfg)->etcd, (*cfg)->name, 3000, &pl, err, sizeof(err));

		if (rc && rc != -ENOENT) {
			fprintf(stderr, "dmann %s: reading the placement: %s\n", cmd, err);
			goto err_s;
		}
		if (!rc)
			memcpy(s->retired, pl.retired, sizeof(s->retired));
	}
#endif
	return s;

#if DM_HAVE_ETCD
err_s:
	mn_set_close(s);
#endif
err_x:
	dm_xport_close(*x);
err_cfg:
	free(*cfg);
	return NULL;
}

static void close_mns(struct mn_set *s, struct dm_xport *x, struct dm_cluster_cfg *cfg)
{
	mn_set_close(s);
	dm_xport_close(x);
	free(cfg);
}

static int graph_check(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' }, { "list", required_argument, NULL, 'l' },
		{ "json", no_argument, NULL, 'j' }, { "graph", required_argument, NULL, 'g' },
		{ "anchors", no_argument, NULL, 'a' }, { "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *config = NULL;
	unsigned long long list = 20, graph = 0;
	bool json = false, anch = false;
	struct dm_cluster_cfg *cfg;
	struct dm_xport *x;
	struct mn_set *s;
	struct dindex *d = NULL;
	struct dgen_view v;
	struct gcheck g = { 0 };
	uint8_t *seen = NULL;
	uint64_t next = 0;
	char err[512];
	int c, rc, status = 1;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 'l':
			if (dm_cli_parse_u64("graph check", "--list", optarg, 0, 100000, &list))
				return 2;
			break;
		case 'j': json = true; break;
		case 'a': anch = true; break;
		case 'g':
			if (dm_cli_parse_u64("graph check", "--graph", optarg, 0, DM_MAX_GRAPHS - 1,
					     &graph))
				return 2;
			break;
		case 'h': graph_usage(stdout); return 0;
		default: dm_cli_bad_option("graph check", c, argv, optind); return 2;
		}
	}
	if (!config || optind != argc) {
		graph_usage(stderr);
		return 2;
	}
	/* Under the placement: blocks the re-replication copied are read where they are. */
	s = open_mns("graph check", config, &cfg, &x);
	if (!s)
		return 1;
	/* A memory node that is down is no obstacle: the blocks are read from their replicas
	 * on the others. */
	rc = dgen_report(s, (uint32_t)graph, DM_GEN_NO_CN, 0, &v, NULL);
	if ((rc && !v.answered) || !v.has_current) {
		if (rc && !v.answered)
			fprintf(stderr, "dmann graph check: %s\n", strerror(-rc));
		else
			fprintf(stderr, "dmann graph check: graph %llu is not loaded on the memory "
				"nodes (dmann load --graph %llu)\n", graph, graph);
		goto out_s;
	}
	rc = dindex_open(s, (uint32_t)graph, v.current, &d, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dmann graph check: graph %llu generation %llu: %s\n", graph,
			(unsigned long long)v.current, rc == -EBADMSG ? err : strerror(-rc));
		goto out_s;
	}
	rc = dindex_read_ctr(s, d, &next);
#if DM_HAVE_ETCD
	/* With a cluster state the ids are handed out in ranges from etcd (idrange.h): the
	 * first id no range has; the counter object counts the inserts from before. */
	if (cfg->etcd[0] && d->cap > d->n) {
		struct dm_etcd *e = dm_etcd_open(cfg->etcd, 5000);
		uint64_t rnext = 0;
		int r = e ? dm_idrange_read(e, cfg->name, (uint32_t)graph, d->gen,
						  dindex_ids_tag(d), &rnext) : -errno;

		if (r && r != -ENOENT) {
			fprintf(stderr, "dmann graph check: the id ranges in etcd: %s\n",
				e ? dm_etcd_errmsg(e) : strerror(-r));
			dm_etcd_close(e);
			goto out_d;
		}
		dm_etcd_close(e);
		if (!r && rc)
			next = 0, rc = 0;   /* the counter's node is down: the ranges say enough */
		next = DM_MAX(next, rnext);
	}
#endif
	if (rc) {
		fprintf(stderr, "dmann graph check: the id counter: %s\n", strerror(-rc));
		goto out_d;
	}
	g.used = DM_MIN(DM_MAX(next, (uint64_t)d->n), (uint64_t)d->cap);
	g.adj = malloc(g.used * 2 * d->p.M * sizeof(uint32_t));
	g.n0 = calloc(g.used, sizeof(*g.n0));
	g.st = calloc(g.used, 1);
	seen = calloc(g.used, 1);
	if (anch)
		g.vec = malloc(g.used * d->vdim * sizeof(float));
	if (!g.adj || !g.n0 || !g.st || !seen || (anch && !g.vec)) {
		fprintf(stderr, "dmann graph check: out of memory for %llu nodes\n",
			(unsigned long long)g.used);
		goto out_g;
	}
	rc = read_records(s, d, &g);
	if (!rc)
		rc = walk(d, &g, seen);
	if (!rc && anch)
		rc = anchors(d, &g);
	if (rc) {
		fprintf(stderr, "dmann graph check: reading the records: %s\n", strerror(-rc));
		goto out_g;
	}
	if (json)
		printf("{\"graph\":%llu,\"generation\":%llu,\"capacity\":%u,\"imported\":%u,\"ids\":%llu,"
		       "\"whole\":%llu,\"torn\":%llu,\"empty\":%llu,\"bad_ids\":%llu,\"edges\":%llu,"
		       "\"reachable\":%llu,\"unreachable\":%llu,\"no_inlink\":%llu,"
		       "\"level0_inlinks\":[%llu,%llu,%llu,%llu],\"unreachable_nodes\":[", graph, (unsigned long long)d->gen, d->cap, d->n,
		       (unsigned long long)g.used, (unsigned long long)g.whole,
		       (unsigned long long)g.torn, (unsigned long long)g.empty,
		       (unsigned long long)g.bad_ids, (unsigned long long)g.edges,
		       (unsigned long long)g.reached, (unsigned long long)g.unreached,
		       (unsigned long long)g.no_inlink, (unsigned long long)g.few_in[0],
		       (unsigned long long)g.few_in[1], (unsigned long long)g.few_in[2],
		       (unsigned long long)g.few_in[3]);
	else
		printf("graph %llu generation %llu: %llu ids handed out (%u imported, room for %u): %llu "
		       "records whole, %llu torn, %llu empty; %llu level-0 edges, %llu neighbour ids "
		       "out of range\nreachable from the entry point: %llu; unreachable: %llu (of "
		       "which %llu have no in-link at all)\nwhole nodes with 0 / 1 / 2 / 3 level-0 "
		       "in-links: %llu / %llu / %llu / %llu\n", graph, (unsigned long long)d->gen,
		       (unsigned long long)g.used, d->n, d->cap, (unsigned long long)g.whole,
		       (unsigned long long)g.torn, (unsigned long long)g.empty,
		       (unsigned long long)g.edges, (unsigned long long)g.bad_ids,
		       (unsigned long long)g.reached, (unsigned long long)g.unreached,
		       (unsigned long long)g.no_inlink, (unsigned long long)g.few_in[0],
		       (unsigned long long)g.few_in[1], (unsigned long long)g.few_in[2],
		       (unsigned long long)g.few_in[3]);
	for (uint64_t id = 0, shown = 0; id < g.used && shown < list; id++) {
		if (g.st[id] != ST_WHOLE || seen[id])
			continue;
		if (json) {
			printf("%s{\"id\":%llu,\"n0\":%u,\"key\":", shown ? "," : "",
			       (unsigned long long)id, g.n0[id]);
			print_key(d, id, true);
			printf("}");
		} else {
			printf("  unreachable: id %llu (%s, %u out-links), key ", (unsigned long long)id,
			       id < d->n ? "imported" : "added online", g.n0[id]);
			print_key(d, id, false);
			printf("\n");
		}
		shown++;
	}
	if (json && anch)
		printf("],\"far_in_links\":[%llu,%llu,%llu]}\n", (unsigned long long)g.far_in[0],
		       (unsigned long long)g.far_in[1], (unsigned long long)g.far_in[2]);
	else if (json)
		printf("]}\n");
	else if (anch)
		printf("whole nodes whose nearest in-link is over 1.5x / 2x / 4x as far as their "
		       "nearest out-link: %llu / %llu / %llu\n", (unsigned long long)g.far_in[0],
		       (unsigned long long)g.far_in[1], (unsigned long long)g.far_in[2]);
	status = 0;
out_g:
	free(g.vec);
	free(seen);
	free(g.adj);
	free(g.n0);
	free(g.st);
out_d:
	dindex_free(d);
out_s:
	close_mns(s, x, cfg);
	return status;
}

/* Options of list and drop: --config; --graph and --no-snapshot for drop (graph and snap
 * not NULL). -1 to go on, else the exit status. */
static int list_drop_args(const char *cmd, int argc, char **argv, const char **config,
			  unsigned long long *graph, bool *snap)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' }, { "graph", required_argument, NULL, 'g' },
		{ "no-snapshot", no_argument, NULL, 'n' }, { "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool graph_set = false;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'c': *config = optarg; break;
		case 'g':
			if (!graph) {
				fprintf(stderr, "dmann %s: --graph: every graph is listed\n", cmd);
				return 2;
			}
			if (dm_cli_parse_u64(cmd, "--graph", optarg, 0, DM_MAX_GRAPHS - 1, graph))
				return 2;
			graph_set = true;
			break;
		case 'n':
			if (!snap) {
				fprintf(stderr, "dmann %s: --no-snapshot: nothing is written\n", cmd);
				return 2;
			}
			*snap = false;
			break;
		case 'h': graph_usage(stdout); return 0;
		default: dm_cli_bad_option(cmd, c, argv, optind); return 2;
		}
	}
	if (!*config || optind != argc) {
		graph_usage(stderr);
		return 2;
	}
	if (graph && !graph_set) {
		fprintf(stderr, "dmann %s: which graph? --graph G (0..%u; see dmann graph list)\n",
			cmd, DM_MAX_GRAPHS - 1);
		return 2;
	}
	return -1;
}

static int graph_list(int argc, char **argv)
{
	const char *config = NULL;
	struct dm_cluster_cfg *cfg;
	struct dm_xport *x;
	struct mn_set *s;
	struct dgen_graphs gl;
	char err[512];
	int rc, status;

	status = list_drop_args("graph list", argc, argv, &config, NULL, NULL);
	if (status >= 0)
		return status;
	s = open_mns("graph list", config, &cfg, &x);
	if (!s)
		return 1;
	rc = dgen_list(s, &gl);
	if (rc)
		fprintf(stderr, "dmann graph list: %u memory nodes answered, some did not: the list "
			"may be short\n", gl.answered);
	status = rc ? 1 : 0;
	if (!gl.mask && !gl.retired_mask) {
		printf("no graph is loaded on the memory nodes (dmann load --graph G)\n");
		goto out;
	}
	printf("%-5s %-10s %10s %5s %4s %10s  %s\n", "graph", "generation", "nodes", "dim", "M",
	       "capacity", "note");
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		struct dindex *d = NULL;
		char note[128] = "";

		if (!((gl.mask | gl.retired_mask) >> g & 1))
			continue;
		if (gl.retired_mask >> g & 1)
			snprintf(note, sizeof(note), "generation %llu still held",
				 (unsigned long long)gl.retired[g]);
		if (!(gl.mask >> g & 1)) {
			printf("%-5u %-10s %10s %5s %4s %10s  dropped; %s\n", g, "-", "-", "-", "-",
			       "-", note);
			continue;
		}
		rc = dindex_open(s, g, gl.current[g], &d, err, sizeof(err));
		if (rc) {
			printf("%-5u %-10llu %10s %5s %4s %10s  %s%s%s\n", g,
			       (unsigned long long)gl.current[g], "?", "?", "?", "?",
			       rc == -EBADMSG ? err : strerror(-rc), note[0] ? "; " : "", note);
			status = 1;
			continue;
		}
		printf("%-5u %-10llu %10u %5u %4u %10u  %s\n", g, (unsigned long long)d->gen, d->n,
		       d->p.dim, d->p.M, d->cap, note);
		dindex_free(d);
	}
out:
	close_mns(s, x, cfg);
	return status;
}

static int graph_drop(int argc, char **argv)
{
	const char *config = NULL;
	unsigned long long graph = 0;
	bool snap = true;
	struct dm_cluster_cfg *cfg;
	struct dm_xport *x;
	struct mn_set *s;
	char err[1024];
	int rc, status;

	status = list_drop_args("graph drop", argc, argv, &config, &graph, &snap);
	if (status >= 0)
		return status;
	/* The nodes that are not retired must all be up (dindex_drop_graph checks). */
	s = open_mns("graph drop", config, &cfg, &x);
	if (!s)
		return 1;
	status = 1;
	rc = dindex_drop_graph(s, (uint32_t)graph, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "dmann graph drop: %s\n", err);
		goto out;
	}
	if (snap && (rc = mn_set_snapshot(s)))
		fprintf(stderr, "dmann graph drop: warning: snapshot failed (a memory node that "
			"restarts before its next snapshot brings graph %llu back): %s\n", graph,
			strerror(-rc));
#if DM_HAVE_ETCD
	if (cfg->etcd[0]) {   /* its online insert ids (idrange.h) and upper nodes (upper.h) */
		struct dm_etcd *e = dm_etcd_open(cfg->etcd, 5000);

		rc = e ? dm_idrange_forget(e, cfg->name, (uint32_t)graph, NULL) : -errno;
		if (!rc)
			rc = dm_upper_forget(e, cfg->name, (uint32_t)graph, NULL);
		if (rc)
			fprintf(stderr, "dmann graph drop: warning: its id ranges or upper-level "
				"nodes stay in the cluster state: %s\n", e ? dm_etcd_errmsg(e) : strerror(-rc));
		dm_etcd_close(e);
	}
#endif
	printf("dmann graph drop: graph %llu dropped; the memory nodes free its blocks once the "
	       "compute nodes released them (at most [cn] lease_ms = %u ms)\n", graph,
	       cfg->cn_all.lease_ms);
	status = 0;
out:
	close_mns(s, x, cfg);
	return status;
}

int dm_cmd_graph(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "check"))
		return graph_check(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "list"))
		return graph_list(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "drop"))
		return graph_drop(argc - 1, argv + 1);

	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		graph_usage(stdout);
		return 0;
	}
	graph_usage(stderr);
	return 2;
}
