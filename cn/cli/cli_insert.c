/* cli_insert.c: `dmann insert`: online inserts of a vector file into the loaded index
 * through the compute nodes (Q_INSERT, cn/engine/cn_insert.h), in batches over C
 * connections per compute node, each its own thread; then (unless --no-snapshot) every
 * memory node snapshots its region, so that the rows are durable when the command succeeds;
 * prints the rate and writes the ids the rows got. */
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cluster.h"
#include "dindex.h"
#include "rpc.h"
#include "vecfile.h"

static void insert_usage(FILE *f)
{
	fprintf(f, "usage: dmann insert --config C --vectors F [--ef E] [--batch B] [--conns N]\n"
		   "                    [--only-cn I] [--graph G] [--out IDS] [--no-snapshot] [--json]\n\n"
		   "Insert every row of F (fbin, fvecs, ...) online into the index loaded on cluster\n"
		   "C (it needs spare room: dmann load --spare N). Batches go to the compute nodes in\n"
		   "turn, over N connections per compute node; each compute node links its rows\n"
		   "into the graph on the memory nodes (remote CAS locks and WRITEs) while queries\n"
		   "run. Then every memory node snapshots its region: the command succeeds (exit 0)\n"
		   "only once the inserted rows are on disk on every memory node, so they survive\n"
		   "a restart of the whole cluster. The snapshot copies whole regions: records that\n"
		   "other writers change meanwhile may be torn in it (see docs/operations.md).\n\n"
		   "  --ef E      efConstruction of the inserts' searches (1..65536, default 100)\n"
		   "  --graph G   the graph inserted into (dmann load --graph; 0..15, default 0)\n"
		   "  --batch B   rows per request (default: as many as fit one message, <= 256)\n"
		   "  --conns N   connections per compute node (1..16, default 2)\n"
		   "  --only-cn I send every batch to compute node I (as listed in C)\n"
		   "  --out IDS   write the id each row got (ibin, one column; -1 for a row not\n"
		   "              inserted when a request failed)\n"
		   "  --no-snapshot  no snapshot: the rows live in memory-node memory only until\n"
		   "              the next snapshot (dmann load, a memory node's SIGTERM, or a\n"
		   "              later dmann insert); a crash of every memory node loses them\n"
		   "  --json      one JSON object with the figures\n");
}

#define ENOENT_WAIT_NS 10000000000ull
#define SNAPSHOT_TIMEOUT_MS 120000   /* a snapshot writes a whole region */

struct ins_job {
	const struct dm_cluster_cfg *cfg;
	struct dm_xport *x;
	struct dm_msgpool *pool;   /* one per transport context (its receive queue is shared) */
	const float *data;
	uint32_t dim, batch, ef, graph;
	uint64_t n;
	atomic_ulong next;      /* next batch */
	int32_t *ids;
	atomic_ulong links, dropped, retries, rereads, reads, done;
	atomic_int err;
};

struct ins_thread {
	struct ins_job *j;
	uint32_t cn;
	pthread_t t;
};

static void *ins_main(void *arg)
{
	struct ins_thread *t = arg;
	struct ins_job *j = t->j;
	struct dm_msgpool *pool = j->pool;
	struct dm_conn *c = NULL;
	struct dm_rpc_chan ch;
	size_t rcap = sizeof(struct dm_wire_q_inserted) + 8u * j->batch;
	size_t qcap = sizeof(struct dm_wire_q_insert) + 4ull * j->batch * j->dim;
	uint8_t *req = malloc(qcap), *resp = malloc(rcap);
	int rc = pool && req && resp ? 0 : -ENOMEM;

	if (!rc)
		rc = dm_xport_connect(j->x, j->cfg->cn[t->cn].address, 5000, &c);
	if (!rc)
		rc = dm_rpc_chan_init(&ch, c, pool, (uint32_t)(qcap + DM_WIRE_HDR_LEN), 600000);
	while (!rc && !atomic_load(&j->err)) {
		uint64_t b = atomic_fetch_add(&j->next, 1), first = b * j->batch;
		struct dm_wire_q_insert m = { .dim = j->dim, .ef = j->ef, .graph = j->graph };
		struct dm_wire_q_inserted r;
		uint32_t rlen;

		if (first >= j->n)
			break;
		m.n = (uint32_t)DM_MIN((uint64_t)j->batch, j->n - first);
		dm_wire_q_insert_encode(req, &m);
		dm_wire_put_f32s(req + sizeof(m), j->data + first * j->dim, m.n * j->dim);
		/* right after `dmann load` a compute node may not have read the new index
		 * yet (it does within [cn] refresh_ms): -ENOENT is retried for a while */
		uint64_t t_enoent = dm_now_ns();

		do {
			rlen = 0;
			rc = dm_rpc_call(&ch, DM_OP_Q_INSERT, req,
					 (uint32_t)(sizeof(m) + 4ull * m.n * j->dim), resp,
					 (uint32_t)rcap, &rlen);
		} while (rc == -ENOENT && dm_now_ns() - t_enoent < ENOENT_WAIT_NS &&
			 !usleep(100000));
		if (rc && rlen == 0)
			break;
		/* a partial batch comes with the error that stopped it and the rows' ids */
		int st = rc;

		rc = dm_wire_q_inserted_decode(resp, rlen, &r);
		if (!rc && (r.n > m.n || (!st && r.n != m.n) || rlen != sizeof(r) + 8ull * r.n))
			rc = -EBADMSG;
		if (rc)
			break;
		for (uint32_t i = 0; i < r.n; i++)
			j->ids[first + i] = (int32_t)dm_get_le64(resp + sizeof(r) + 8 * i);
		atomic_fetch_add(&j->links, r.links);
		atomic_fetch_add(&j->dropped, r.links_dropped);
		atomic_fetch_add(&j->retries, r.lock_retries);
		atomic_fetch_add(&j->rereads, r.rereads);
		atomic_fetch_add(&j->reads, r.reads);
		atomic_fetch_add(&j->done, r.n);
		if (st) {
			rc = st;
			break;
		}
	}
	if (rc) {
		int zero = 0;

		if (atomic_compare_exchange_strong(&j->err, &zero, rc))
			fprintf(stderr, "dmann insert: compute node %u (%s): %s%s\n", t->cn,
				j->cfg->cn[t->cn].address, strerror(-rc),
				rc == -ENOSPC ? " (no spare room left: dmann load --spare N)" :
				rc == -ENOENT ? " (no index, or one loaded without --spare)" :
				rc == -EPERM ? " (inserting needs the cluster secret)" : "");
	}
	if (c) {
		dm_rpc_chan_fini(&ch);
		dm_conn_close(c);
	}
	free(req);
	free(resp);
	return NULL;
}

int dm_cmd_insert(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, 0, 'c' }, { "vectors", required_argument, 0, 'v' },
		{ "ef", required_argument, 0, 'e' }, { "batch", required_argument, 0, 'b' },
		{ "conns", required_argument, 0, 'n' }, { "out", required_argument, 0, 'o' },
		{ "json", no_argument, 0, 'j' }, { "only-cn", required_argument, 0, 'O' },
		{ "no-snapshot", no_argument, 0, 'S' }, { "graph", required_argument, 0, 'G' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	const char *config = NULL, *vecs = NULL, *out = NULL;
	unsigned long long ef = 100, batch = 0, conns = 2, only = ~0ull, graph = 0;
	struct dm_cluster_cfg *cfg = NULL;
	struct dm_vecs v = { 0 };
	struct ins_thread *th = NULL;
	struct ins_job j = { 0 };
	bool json = false, snap = true;
	double snap_s = 0;
	int snap_rc = 0;
	char err[1024];
	int c, status = 1;
	uint32_t nt = 0;
	uint64_t t0;
	double s;

	optind = 1;
	while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 'v': vecs = optarg; break;
		case 'e': if (dm_cli_parse_u64("insert", "--ef", optarg, 1, 65536, &ef)) return 2; break;
		case 'b': if (dm_cli_parse_u64("insert", "--batch", optarg, 1, DM_Q_MAX_INSERT, &batch)) return 2; break;
		case 'n': if (dm_cli_parse_u64("insert", "--conns", optarg, 1, 16, &conns)) return 2; break;
		case 'o': out = optarg; break;
		case 'O': if (dm_cli_parse_u64("insert", "--only-cn", optarg, 0, DM_MAX_NODES - 1, &only)) return 2; break;
		case 'j': json = true; break;
		case 'S': snap = false; break;
		case 'G': if (dm_cli_parse_u64("insert", "--graph", optarg, 0, DM_MAX_GRAPHS - 1, &graph)) return 2; break;
		case 'h': insert_usage(stdout); return 0;
		default: dm_cli_bad_option("insert", c, argv, optind); return 2;
		}
	}
	if (!config || !vecs || optind != argc) {
		insert_usage(stderr);
		return 2;
	}
	cfg = calloc(1, sizeof(*cfg));
	if (!cfg || dm_config_load(config, cfg, err, sizeof(err))) {
		fprintf(stderr, "dmann insert: %s\n", cfg ? err : "out of memory");
		goto out;
	}
	if (!cfg->n_cn) {
		fprintf(stderr, "dmann insert: %s lists no compute node\n", config);
		goto out;
	}
	if (only != ~0ull && only >= cfg->n_cn) {
		fprintf(stderr, "dmann insert: --only-cn %llu: %s has %u compute nodes\n", only,
			config, cfg->n_cn);
		status = 2;
		goto out;
	}
	if (dm_vecs_read(vecs, DM_VF_AUTO, &v, err, sizeof(err))) {
		fprintf(stderr, "dmann insert: %s\n", err);
		goto out;
	}
	if (v.type != DM_VT_F32 || v.dim == 0 || v.dim > DM_Q_MAX_DIM || v.n == 0 ||
	    v.n > INT32_MAX) {
		fprintf(stderr, "dmann insert: %s: need 1..%u-dimensional vectors, at least one\n",
			vecs, DM_Q_MAX_DIM);
		goto out;
	}
	/* a request must fit the compute node's receive buffers */
	uint64_t fit = (DM_CN_RECV_BUF - DM_WIRE_HDR_LEN - sizeof(struct dm_wire_q_insert)) / (4ull * v.dim);

	if (!fit) {
		fprintf(stderr, "dmann insert: %u dimensions do not fit one request\n", v.dim);
		goto out;
	}
	if (!batch)
		batch = DM_MIN(fit, (uint64_t)DM_Q_MAX_INSERT);
	if (batch > fit) {
		fprintf(stderr, "dmann insert: --batch %llu: at most %llu rows of %u dimensions fit "
			"one request\n", batch, (unsigned long long)fit, v.dim);
		status = 2;
		goto out;
	}
	j.cfg = cfg;
	j.x = dm_cluster_xport(cfg, NULL);
	j.data = v.data;
	j.dim = v.dim;
	j.n = v.n;
	j.batch = (uint32_t)batch;
	j.ef = (uint32_t)ef;
	j.graph = (uint32_t)graph;
	j.ids = malloc(v.n * sizeof(*j.ids));
	th = calloc((size_t)cfg->n_cn * conns, sizeof(*th));
	if (j.x)
		j.pool = dm_msgpool_new(j.x, (uint32_t)(8 * cfg->n_cn * conns), 4096);
	if (!j.x || !j.ids || !th || !j.pool) {
		fprintf(stderr, "dmann insert: %s\n", j.x ? "out of memory" : strerror(errno));
		goto out;
	}
	memset(j.ids, 0xff, v.n * sizeof(*j.ids));   /* -1: not inserted */
	t0 = dm_now_ns();
	for (uint32_t k = 0; k < conns; k++)
		for (uint32_t i = 0; i < cfg->n_cn; i++) {
			if (only != ~0ull && i != only)
				continue;
			th[nt] = (struct ins_thread){ .j = &j, .cn = i };
			if (pthread_create(&th[nt].t, NULL, ins_main, &th[nt]) == 0)
				nt++;
		}
	for (uint32_t i = 0; i < nt; i++)
		pthread_join(th[i].t, NULL);
	s = (double)(dm_now_ns() - t0) / 1e9;
	/* Durability: every memory node writes its region (with the rows just inserted) to
	 * its snapshot; the rows a failed request did write are snapshotted too. */
	if (snap && atomic_load(&j.done)) {
		uint64_t t1 = dm_now_ns();
		struct mn_set *ms = mn_set_open(cfg, j.x, j.pool, true, SNAPSHOT_TIMEOUT_MS);

		snap_rc = ms ? mn_set_snapshot(ms) : -errno;
		if (ms)
			mn_set_close(ms);
		snap_s = (double)(dm_now_ns() - t1) / 1e9;
		if (snap_rc)
			fprintf(stderr, "dmann insert: the rows are inserted but NOT durable: the "
				"snapshot of the memory nodes failed (%s); they are lost if every "
				"memory node stops before its next snapshot\n", strerror(-snap_rc));
	}
	if (json)
		printf("{\"inserted\": %lu, \"rows\": %llu, \"seconds\": %.3f, \"rate\": %.1f, "
		       "\"links\": %lu, \"links_dropped\": %lu, \"lock_retries\": %lu, "
		       "\"rereads\": %lu, \"reads\": %lu, \"compute_nodes\": %u, \"conns\": %llu, "
		       "\"ef\": %llu, \"durable\": %s, \"snapshot_seconds\": %.3f}\n",
		       atomic_load(&j.done), (unsigned long long)v.n, s,
		       atomic_load(&j.done) / s, atomic_load(&j.links), atomic_load(&j.dropped),
		       atomic_load(&j.retries), atomic_load(&j.rereads), atomic_load(&j.reads),
		       cfg->n_cn, conns, ef, snap && !snap_rc ? "true" : "false", snap_s);
	else
		printf("dmann insert: %lu of %llu rows in %.2f s (%.0f rows/s) through %u compute "
		       "nodes x %llu connections; back-links %lu made, %lu dropped; lock retries "
		       "%lu; records read %lu (%lu again after a torn read); %s\n",
		       atomic_load(&j.done), (unsigned long long)v.n, s, atomic_load(&j.done) / s,
		       cfg->n_cn, conns, atomic_load(&j.links), atomic_load(&j.dropped),
		       atomic_load(&j.retries), atomic_load(&j.reads), atomic_load(&j.rereads),
		       !snap ? "not snapshotted (--no-snapshot)" :
		       snap_rc ? "snapshot FAILED" : "snapshotted on every memory node");
	/* the ids of what was inserted even when something failed (-1: a row that was not) */
	if (out && dm_vecs_write(out, DM_VF_AUTO, j.ids, DM_VT_I32, v.n, 1)) {
		fprintf(stderr, "dmann insert: writing %s: %s\n", out, strerror(errno));
		goto out;
	}
	status = atomic_load(&j.err) || snap_rc ? 1 : 0;
out:
	if (j.pool)
		dm_msgpool_free(j.pool);
	if (j.x)
		dm_xport_close(j.x);
	free(j.ids);
	free(th);
	dm_vecs_free(&v);
	free(cfg);
	return status;
}
