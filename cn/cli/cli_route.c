/* cli_route.c: dmann route, the compute nodes' router from the command line.
 *
 *   dmann route refresh --config C [--wait S] [--json]
 *   dmann route status --config C [--json]
 *
 * refresh asks every compute node for the next oracle epoch (FWD_ROUTER with refresh = the highest
 * epoch any of them runs or rolls out, plus one; or, while a rollout is in progress, that
 * rollout's epoch) and waits until each one it reached runs it (docs/router.md,
 * "Re-clustering and epoch refresh"); status shows where each compute node's router is
 * (the same FWD_ROUTER read, nothing changed). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cluster.h"
#include "rpc.h"

#define POLL_US 20000

static void route_usage(FILE *f)
{
	fprintf(f, "usage: dmann route refresh --config C [--wait S] [--json]\n"
		   "       dmann route status --config C [--json]\n\n"
		   "Move the compute nodes' router to a new oracle epoch now (the re-clustering\n"
		   "that a high cache split penalty starts by itself): every compute node builds\n"
		   "the oracle of the next epoch (seed + epoch, the same sample) in the background\n"
		   "while it routes with the current one, and all switch once all are ready, so\n"
		   "that clients routing with the current epoch are served throughout. While a\n"
		   "rollout is in progress, refresh waits for it instead of asking for another.\n\n"
		   "  --config C  the cluster file (admin: the cluster secret)\n"
		   "  --wait S    wait at most S seconds for every reachable compute node to run\n"
		   "              the new epoch (default 120; 0: ask and return)\n"
		   "  --json      one JSON object: from, to, compute nodes asked, the CLOCK_MONOTONIC\n"
		   "              times of the request and of the end (ns), seconds, done\n\n"
		   "status: each compute node's oracle epoch, the epoch being rolled out and where\n"
		   "it is in that rollout (idle, preparing, prepared), its routing epoch, partitions\n"
		   "and online CSP; one JSON object per compute node with --json. Read only: the\n"
		   "compute nodes connect to no memory node for it.\n\n"
		   "Exit status: 0 done (or asked, with --wait 0; status: every compute node\n"
		   "answered), 1 a compute node refused, did not get there in time, or was not\n"
		   "reachable, 2 usage.\n");
}

struct rconn {
	struct dm_conn *conn;
	struct dm_rpc_chan ch;
	bool up;
};

/* FWD_ROUTER on one compute node: apply c (refresh only) and read its state. 0 or -errno. */
static int router_call(struct rconn *rc, const struct dm_wire_fwd_rcfg *c,
		       struct dm_wire_fwd_rstats *st)
{
	uint8_t req[sizeof(*c)], body[sizeof(*st)];
	uint32_t blen = 0;
	int rc2;

	dm_wire_fwd_rcfg_encode(req, c);
	rc2 = dm_rpc_call(&rc->ch, DM_OP_FWD_ROUTER, req, sizeof(req), body, sizeof(body), &blen);
	if (!rc2)
		rc2 = dm_wire_fwd_rstats_decode(body, blen, st);
	return rc2;
}

/* Connect to every compute node and read its router's state (st[i]); cs[i].up for those
 * that answered. The number that did. */
static uint32_t connect_all(const struct dm_cluster_cfg *cfg, struct dm_xport *x,
			    struct dm_msgpool *pool, struct rconn *cs,
			    struct dm_wire_fwd_rstats *sts)
{
	uint32_t nup = 0;

	for (uint32_t i = 0; i < cfg->n_cn; i++) {
		struct dm_wire_fwd_rstats *st = &sts[i];
		int rc = dm_xport_connect(x, cfg->cn[i].address, 2000, &cs[i].conn);

		if (!rc) {
			rc = dm_rpc_chan_init(&cs[i].ch, cs[i].conn, pool, 256, 5000);
			if (rc) {
				dm_conn_close(cs[i].conn);
				cs[i].conn = NULL;
			}
		}
		if (!rc)
			rc = router_call(&cs[i], &(struct dm_wire_fwd_rcfg){ 0 }, st);
		if (rc) {
			fprintf(stderr, "dmann route: cn%u (%s): %s; left out\n", i, cfg->cn[i].address,
				strerror(-rc));
			continue;
		}
		cs[i].up = true;
		nup++;
	}
	return nup;
}

static void close_all(const struct dm_cluster_cfg *cfg, struct dm_xport *x,
		      struct dm_msgpool *pool, struct rconn *cs)
{
	for (uint32_t i = 0; cs && i < cfg->n_cn; i++)
		if (cs[i].conn) {
			dm_rpc_chan_fini(&cs[i].ch);
			dm_conn_close(cs[i].conn);
		}
	free(cs);
	if (pool)
		dm_msgpool_free(pool);
	if (x)
		dm_xport_close(x);
}

static const char *rollout_name(uint32_t r)
{
	return r == DM_FWD_ROLLOUT_PREPARING ? "preparing" :
	       r == DM_FWD_ROLLOUT_PREPARED ? "prepared" : "idle";
}

/* The connections to every compute node and their routers' state (route_open). */
struct route_session {
	struct dm_xport *x;
	struct dm_msgpool *pool;
	struct rconn *cs;
	struct dm_wire_fwd_rstats *sts;
	uint32_t nup;              /* compute nodes that answered (cs[i].up) */
};

/* Connect to every compute node and read its router's state. 0, or -1 (message printed;
 * route_close it all the same). */
static int route_open(const struct dm_cluster_cfg *cfg, struct route_session *s)
{
	*s = (struct route_session){ .x = dm_cluster_xport(cfg, NULL) };
	s->pool = s->x ? dm_msgpool_new(s->x, 8, 4096) : NULL;
	s->cs = calloc(cfg->n_cn ? cfg->n_cn : 1, sizeof(*s->cs));
	s->sts = calloc(cfg->n_cn ? cfg->n_cn : 1, sizeof(*s->sts));
	if (!s->x || !s->pool || !s->cs || !s->sts) {
		fprintf(stderr, "dmann route: cannot set up the transport\n");
		return -1;
	}
	s->nup = connect_all(cfg, s->x, s->pool, s->cs, s->sts);
	return 0;
}

static void route_close(const struct dm_cluster_cfg *cfg, struct route_session *s)
{
	free(s->sts);
	close_all(cfg, s->x, s->pool, s->cs);
}

static int status(const struct dm_cluster_cfg *cfg, bool json)
{
	struct route_session rs;
	struct rconn *cs;
	struct dm_wire_fwd_rstats *sts;
	int ret = 1;

	if (route_open(cfg, &rs))
		goto out;
	cs = rs.cs;
	sts = rs.sts;
	for (uint32_t i = 0; i < cfg->n_cn; i++) {
		const struct dm_wire_fwd_rstats *st = &sts[i];
		char csp[32] = "n/a";

		if (!cs[i].up)
			continue;
		if (st->csp_ppm != DM_FWD_CSP_NONE)
			snprintf(csp, sizeof(csp), "%.4f", st->csp_ppm / 1e6);
		if (json)
			printf("{\"cn\": %u, \"epoch\": %u, \"next_epoch\": %u, \"rollout\": \"%s\", "
			       "\"route_epoch\": %u, \"strategy\": \"%s\", \"partitions\": %u, "
			       "\"centroid_hash\": \"%016llx\", \"csp\": %s, \"queue\": %u}\n", i,
			       st->epoch, st->next_epoch, rollout_name(st->rollout), st->route_epoch,
			       dm_route_name(st->strategy), st->k,
			       (unsigned long long)st->centroid_hash,
			       st->csp_ppm != DM_FWD_CSP_NONE ? csp : "null", st->qlen);
		else
			printf("cn%u: oracle epoch %u (next %u, %s), routing epoch %08x, %s routing, "
			       "%u partitions, centroid hash %016llx, CSP %s, %u queued\n", i,
			       st->epoch, st->next_epoch, rollout_name(st->rollout), st->route_epoch,
			       dm_route_name(st->strategy), st->k,
			       (unsigned long long)st->centroid_hash, csp, st->qlen);
	}
	ret = rs.nup == cfg->n_cn ? 0 : 1;
out:
	route_close(cfg, &rs);
	return ret;
}

static int refresh(const struct dm_cluster_cfg *cfg, unsigned long long wait_s, bool json)
{
	struct route_session rs;
	struct rconn *cs;
	struct dm_wire_fwd_rstats *sts;
	uint32_t from = 0, to = 0, nup, asked = 0, done_n = 0;
	uint64_t t_req = 0, t_end = 0;
	bool progress = false, done = false;
	int ret = 1;

	/* Where every compute node is: the highest epoch run or rolled out. */
	if (route_open(cfg, &rs))
		goto out;
	cs = rs.cs;
	sts = rs.sts;
	nup = rs.nup;
	for (uint32_t i = 0; i < cfg->n_cn; i++) {
		if (!cs[i].up)
			continue;
		from = DM_MAX(from, sts[i].epoch);
		to = DM_MAX(to, sts[i].next_epoch);
		progress = progress || sts[i].next_epoch > sts[i].epoch;
	}
	if (!nup) {
		fprintf(stderr, "dmann route: no compute node reachable\n");
		goto out;
	}
	if (!progress) {
		if (to == UINT32_MAX) {
			fprintf(stderr, "dmann route: the oracle epoch is at its maximum\n");
			goto out;
		}
		to++;   /* the next epoch; else the one being rolled out */
	}
	t_req = dm_now_ns();
	for (uint32_t i = 0; i < cfg->n_cn; i++) {
		struct dm_wire_fwd_rstats st;
		int rc;

		if (!cs[i].up)
			continue;
		rc = router_call(&cs[i], &(struct dm_wire_fwd_rcfg){ .refresh = to }, &st);
		if (rc) {
			fprintf(stderr, "dmann route: cn%u refused epoch %u: %s\n", i, to, strerror(-rc));
			cs[i].up = false;
			continue;
		}
		asked++;
	}
	if (!asked)
		goto out;
	/* Wait until every compute node asked runs the new epoch. */
	for (;;) {
		done_n = 0;
		for (uint32_t i = 0; i < cfg->n_cn; i++) {
			struct dm_wire_fwd_rstats st;

			if (cs[i].up && router_call(&cs[i], &(struct dm_wire_fwd_rcfg){ 0 }, &st) == 0 &&
			    st.epoch >= to)
				done_n++;
		}
		t_end = dm_now_ns();
		done = done_n == asked;
		if (done || !wait_s || t_end - t_req >= wait_s * 1000000000ull)
			break;
		usleep(POLL_US);
	}
	ret = done || !wait_s ? 0 : 1;
	if (json)
		printf("{\"from\": %u, \"to\": %u, \"compute_nodes\": %u, \"asked\": %u, "
		       "\"on_new_epoch\": %u, \"requested_ns\": %llu, \"end_ns\": %llu, "
		       "\"seconds\": %.3f, \"done\": %s}\n", from, to, cfg->n_cn, asked, done_n,
		       (unsigned long long)t_req, (unsigned long long)t_end, (t_end - t_req) / 1e9,
		       done ? "true" : "false");
	else if (!wait_s)
		printf("oracle epoch %u -> %u asked of %u of %u compute nodes\n", from, to, asked,
		       cfg->n_cn);
	else if (done)
		printf("oracle epoch %u -> %u: %u of %u compute nodes on epoch %u after %.2f s\n",
		       from, to, done_n, cfg->n_cn, to, (t_end - t_req) / 1e9);
	else
		fprintf(stderr, "dmann route: epoch %u: only %u of %u compute nodes asked run it "
			"after %llu s (dmann status shows where each is)\n", to, done_n, asked, wait_s);
out:
	route_close(cfg, &rs);
	return ret;
}

int dm_cmd_route(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, 0, 'c' }, { "wait", required_argument, 0, 'w' },
		{ "json", no_argument, 0, 'j' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	const char *config = NULL;
	unsigned long long wait_s = 120;
	struct dm_cluster_cfg *cfg;
	bool json = false;
	int c, rc;

	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		route_usage(stdout);
		return 0;
	}
	if (argc < 2 || (strcmp(argv[1], "refresh") && strcmp(argv[1], "status"))) {
		route_usage(stderr);
		return 2;
	}
	const char *sub = argv[1];
	char what[32];

	snprintf(what, sizeof(what), "route %s", sub);
	argc--;
	argv++;
	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 'w':
			if (strcmp(sub, "refresh")) {
				fprintf(stderr, "dmann route status: --wait is an option of "
					"route refresh\n");
				return 2;
			}
			if (dm_cli_parse_u64(what, "--wait", optarg, 0, 86400, &wait_s))
				return 2;
			break;
		case 'j': json = true; break;
		case 'h': route_usage(stdout); return 0;
		default: dm_cli_bad_option(what, c, argv, optind); return 2;
		}
	}
	if (!config || optind != argc) {
		route_usage(stderr);
		return 2;
	}
	cfg = dm_cli_load_cfg(what, config);
	if (!cfg)
		return 1;
	dm_log_set_level(DM_LOG_ERROR);
	rc = strcmp(sub, "status") ? refresh(cfg, wait_s, json) : status(cfg, json);
	free(cfg);
	return rc;
}
