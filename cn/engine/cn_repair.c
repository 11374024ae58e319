/* cn_repair.c: re-replication, run by the compute node that is the controller in office
 * (common/etcd/cstate.h). Once a second it looks for memory nodes the up-set has declared
 * down for at least [cluster] replace_after_s that the placement has not retired yet. For
 * such a node m it makes the next placement (retired + m) complete before anybody uses it
 * (make before break):
 *   1. over its own connections (not the query path's), it reads the current generation's
 *      view of every graph the memory nodes hold (dgen_list) under the current placement;
 *   2. for every block, the replicas under the next placement are computed (weighted
 *      rendezvous over the nodes not retired: only the blocks m held change, each gets the
 *      next node in its order); every such node that does not hold the block gets a copy
 *      from a live replica, committed under the same key, read back and compared; the id
 *      counter of online inserts too, when its node changes and the old one is alive;
 *   3. the next placement is written to etcd, guarded by the leader key; every compute node
 *      reads its view again under it (cn_placement_apply, cn_refresh) and the blocks have R
 *      copies again;
 *   4. once the compute nodes have moved to it, the memory nodes snapshot one at a time (a
 *      snapshot blocks its node's store while it writes: before the move, the blocks whose
 *      only live replica it was would have been unreadable meanwhile). A copy made durable
 *      this late is lost if its node restarts in between (the block is then one copy short
 *      until the next repair of that node).
 * A repair that fails (a copy, etcd, lost office) is retried the next second from the start;
 * the copies already made are found and kept. Counters: dmann_cn_repair_*.
 *
 * A retired node that is up again for JOIN_STABLE_S joins the same way (the placement
 * without it retired): it is emptied, gets every graph's current metadata and its
 * publication (a graph dropped while it was away is dropped there too), then its share of
 * the blocks (about 1/n of them: weighted rendezvous moves
 * only the blocks whose top R now include it). A node that joins the cluster file for the
 * first time must be started retired (its id in the placement) to be filled this way.
 *
 * Not handled (issue 14): blocks written by online inserts while the copy runs (a record
 * changed after its block was copied is not in the copy); the copies a join makes
 * redundant stay on the nodes that had them (freeing them needs every CN to acknowledge the
 * new placement first, as one-sided WRITEs cannot be checked); the id counter is lost with
 * its node (online inserts then fail with -EHOSTUNREACH). */
#include "cn.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#if DM_HAVE_ETCD
#include "cstate.h"
#include "dgen.h"

#define JOIN_STABLE_S 3   /* a retired node up this long joins again */

struct cn_repair {
	struct cn *cn;
	pthread_t thread;
	atomic_bool stop;
};

static bool bit(const uint64_t *set, uint32_t i)
{
	return set[i / 64] >> (i % 64) & 1;
}

/* Keep the copies under [cluster] repair_mb_s: a copy READs the source and WRITEs and
 * READs back the target, and on tcp the memory nodes' CPUs move those bytes; unbounded,
 * they starve the queries and the generation reports of the same nodes. */
static void throttle(struct cn *cn, uint64_t bytes)
{
	uint64_t rate = (uint64_t)cn->cfg->repair_mb_s << 20;

	if (rate)
		usleep((useconds_t)DM_MIN(bytes * 1000000ull / rate, 10000000ull));
}

/* The node that is not in old[0..no) of next[0..nn), or UINT32_MAX. */
static uint32_t added(const uint32_t *old, int no, const uint32_t *next, int nn, int k)
{
	for (int j = 0, seen = 0; j < nn; j++) {
		bool in = false;

		for (int i = 0; i < no && !in; i++)
			in = old[i] == next[j];
		if (!in && seen++ == k)
			return next[j];
	}
	return UINT32_MAX;
}

/* Copy every block of generation gen of graph `graph` that has a new replica under `next`
 * from a live old replica (repair_pending counts this graph's copies). 0 or -errno (err
 * says why). */
static int copy_blocks(struct cn *cn, struct mn_set *s, uint32_t graph, uint64_t gen,
		       const uint64_t *next, char *err, size_t errlen)
{
	struct dindex *d = NULL;
	uint64_t cur[DM_MAX_NODES / 64];
	uint32_t ncopies = 0, r;
	int rc;

	rc = dindex_open(s, graph, gen, &d, err, errlen);
	if (rc)
		return rc;
	r = d->nrep;
	memcpy(cur, s->retired, sizeof(cur));
	/* Count the copies to make (for the pending gauge), then make them. */
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t b = 0; b <= d->nblocks; b++) {
			uint32_t blk = b < d->nblocks ? b : DINDEX_CTR_BLOCK;
			uint32_t o[DINDEX_MAX_REP], n[DINDEX_MAX_REP], nr = blk == DINDEX_CTR_BLOCK ? 1 : r;
			int no, nn;

			if (blk == DINDEX_CTR_BLOCK && d->cap <= d->n)
				break;   /* no online inserts: no counter */
			memcpy(s->retired, cur, sizeof(cur));
			no = dindex_block_replicas(s, graph, d->run, blk, nr, o);
			memcpy(s->retired, next, sizeof(cur));
			nn = dindex_block_replicas(s, graph, d->run, blk, nr, n);
			memcpy(s->retired, cur, sizeof(cur));
			for (int k = 0;; k++) {
				uint32_t to = added(o, no, n, nn, k), from = UINT32_MAX;
				uint64_t bytes = 0;

				if (to == UINT32_MAX)
					break;
				if (pass == 0) {
					ncopies++;
					continue;
				}
				rc = dindex_has_block(s, d, blk, to);
				if (rc == 1) {   /* copied by an earlier, interrupted repair */
					atomic_fetch_sub(&cn->repair_pending, 1);
					continue;
				}
				/* A live old replica with the block. */
				rc = -EHOSTUNREACH;
				for (int i = 0; i < no && rc; i++)
					if (s->link[o[i]].up && !atomic_load(&cn->state_down[o[i]])) {
						from = o[i];
						rc = dindex_copy_block(s, d, blk, from, to, &bytes);
					}
				if (rc) {
					snprintf(err, errlen, "%s%.0u%s%s %u to mn%u: %s",
						 graph ? "graph " : "", graph, graph ? ": " : "",
						 blk == DINDEX_CTR_BLOCK ? "id counter" : "block",
						 blk == DINDEX_CTR_BLOCK ? 0 : blk, to,
						 rc == -EHOSTUNREACH ? "no live replica left" :
						 strerror(-rc));
					if (blk == DINDEX_CTR_BLOCK && rc == -EHOSTUNREACH) {
						dm_err("cn%u: repair: the id counter of online inserts "
						       "was on a lost node: inserts fail until the "
						       "next load", cn->node->id);
						continue;
					}
					dindex_free(d);
					return rc;
				}
				atomic_fetch_add(&cn->repair_blocks, 1);
				atomic_fetch_add(&cn->repair_bytes, bytes);
				atomic_fetch_sub(&cn->repair_pending, 1);
				throttle(cn, bytes);
			}
		}
		if (pass == 0)
			atomic_store(&cn->repair_pending, ncopies);
	}
	dindex_free(d);
	return 0;
}

/* A retired memory node that is up again joins the placement (empty): everything of every
 * graph it may still hold is dropped, each graph's current generation's metadata (gl)
 * copied and published there, its old generation released (its keys could name the new
 * blocks), a graph dropped meanwhile dropped there too; then its share of the blocks is
 * copied to it. 0 or -errno (err says why). */
static int prepare_join(struct cn *cn, struct mn_set *s, uint32_t m,
			const struct dgen_graphs *gl, char *err, size_t errlen)
{
	struct dm_wire_ctl_gen_state st;
	struct dindex *d[DM_MAX_GRAPHS] = { NULL };
	uint64_t t0;
	int rc = 0;

	(void)cn;
	for (uint32_t g = 0; g < DM_MAX_GRAPHS && !rc; g++)
		if (gl->mask >> g & 1)
			rc = dindex_open(s, g, gl->current[g], &d[g], err, errlen);
	if (rc)
		goto out_free;
	rc = dindex_drop_all(s, m);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS && !rc; g++) {
		if (!(gl->mask >> g & 1)) {
			/* not held by the others (dropped while m was away): its entry goes too */
			rc = dgen_report_node(s, m, g, DM_GEN_NO_CN, 0, &st, NULL);
			if (!rc && (st.flags & DM_GEN_F_CURRENT)) {
				rc = dgen_drop_node(s, m, g, st.current);
				if (rc == -ENOENT)
					rc = 0;
			}
			continue;
		}
		for (uint32_t f = 0; !rc && f < s->n; f++) {
			if (f == m || mn_set_retired(s, f) || !s->link[f].up)
				continue;
			rc = dindex_copy_meta(s, d[g], f, m);
			break;
		}
		if (!rc)
			rc = dgen_publish_node(s, m, g, gl->current[g]);
		t0 = dm_now_ns();
		while (!rc) {
			rc = dgen_report_node(s, m, g, DM_GEN_NO_CN, 0, &st, NULL);
			if (rc || !(st.flags & DM_GEN_F_RETIRED))
				break;
			if (dm_now_ns() - t0 > (uint64_t)(st.lease_ms + 5000) * 1000000ull) {
				rc = -EBUSY;
				break;
			}
			usleep(200000);
		}
		if (rc)
			snprintf(err, errlen, "preparing mn%u to join%s%.0u%s: %s", m,
				 g ? " (graph " : "", g, g ? ")" : "", strerror(-rc));
	}
out_free:
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
		dindex_free(d[g]);
	return rc;
}

/* One look: retire the nodes that have been down for long enough; let retired nodes that
 * are up again join. */
static void repair_once(struct cn *cn)
{
	const struct dm_cluster_cfg *cfg = cn->cfg;
	uint64_t now = dm_now_ns(), after = cfg->replace_after_s * 1000000000ull;
	struct dm_placement pl, nx;
	struct dgen_graphs gl;
	struct mn_set *s;
	char err[512], list[256] = "", jlist[256] = "";
	uint32_t alive = 0, retiring = 0, joining = 0, join[DM_MAX_NODES];
	bool ok;
	int rc;

	rc = dm_placement_read(cfg->etcd, cfg->name, 2000, &pl, err, sizeof(err));
	if (rc && rc != -ENOENT)
		return;
	nx = pl;
	for (uint32_t m = 0; m < cfg->n_mn; m++) {
		bool gone = atomic_load(&cn->state_down[m]) &&
			    now - atomic_load(&cn->state_down_ns[m]) >= after;

		if (bit(pl.retired, m)) {
			uint64_t up = atomic_load(&cn->state_up_ns[m]);

			/* Up in the up-set for JOIN_STABLE_S: it joins. */
			if (!atomic_load(&cn->state_down[m]) && up &&
			    now - up >= JOIN_STABLE_S * 1000000000ull) {
				dm_upset_set(nx.retired, m, false);
				join[joining++] = m;
				snprintf(jlist + strlen(jlist), sizeof(jlist) - strlen(jlist),
					 " mn%u", m);
			}
			continue;
		}
		if (!gone) {
			alive++;
			continue;
		}
		dm_upset_set(nx.retired, m, true);
		retiring++;
		snprintf(list + strlen(list), sizeof(list) - strlen(list), " mn%u", m);
	}
	if (!retiring && !joining)
		return;
	if (alive + joining < 1) {
		dm_warn("cn%u: repair: no memory node left to copy to", cn->node->id);
		return;
	}
	if (retiring)
		dm_warn("cn%u: repair: retiring%s (declared down for %u s or more): copying its "
			"blocks to the next nodes", cn->node->id, list, cfg->replace_after_s);
	if (joining)
		dm_warn("cn%u: repair:%s up again: joins the placement; copying its share of the "
			"blocks to it", cn->node->id, jlist);
	s = mn_set_open(cfg, cn->x, cn->pool, false, 2000);
	if (!s)
		return;
	memcpy(s->retired, pl.retired, sizeof(s->retired));
	dgen_list(s, &gl);   /* every graph the memory nodes hold (those that answer) */
	rc = 0;
	for (uint32_t i = 0; i < joining && !rc; i++) {
		/* A joining node is still retired in s: its link is opened for the copies. */
		rc = s->link[join[i]].up ? 0 : mn_link_open(s, join[i], 2000);
		if (!rc && gl.mask)
			rc = prepare_join(cn, s, join[i], &gl, err, sizeof(err));
		else if (rc)
			snprintf(err, sizeof(err), "mn%u: %s", join[i], strerror(-rc));
	}
	for (uint32_t g = 0; g < DM_MAX_GRAPHS && !rc; g++)
		if (gl.mask >> g & 1)
			rc = copy_blocks(cn, s, g, gl.current[g], nx.retired, err, sizeof(err));
	if (!rc && !cn->s3_placement)
		for (uint32_t c = 0; c < cfg->n_cn; c++)
			if (cfg->cn[c].http[0]) {
				dm_warn("cn%u: repair: this controller runs no S3 gateway: the "
					"buckets' new replicas are not marked stale (gateways read "
					"them before they are filled)", cn->node->id);
				break;
			}
	if (!rc && cn->s3_placement) {
		/* S3 buckets: the replicas the new placement adds are marked stale first (the
		 * catch-up fills them from the survivors; reads skip them until then). */
		rc = cn->s3_placement(cn->s3_ctx, pl.retired, nx.retired);
		if (rc)
			snprintf(err, sizeof(err), "bucket replicas: %s", strerror(-rc));
	}
	if (!rc) {
		memcpy(s->retired, nx.retired, sizeof(s->retired));
		nx.version = pl.version + 1;
		nx.time = time(NULL);
		snprintf(nx.by, sizeof(nx.by), "cn%u", cn->node->id);
		rc = dm_placement_write(cn->ctl, &nx, &ok, err, sizeof(err));
		if (!rc && !ok)
			rc = -EAGAIN;
	}
	if (!rc) {
		/* Then the copies go to disk, one memory node at a time. A snapshot holds its
		 * node's store for as long as it writes (seconds for a GB), and compute nodes
		 * stop reading a node whose reports go unanswered for half the lease: done
		 * after the compute nodes moved to the new placement, every block has another
		 * live replica while one node snapshots. */
		sleep(2 + cfg->cn_all.refresh_ms / 1000);
		mn_set_snapshot(s);
	}
	mn_set_close(s);
	if (rc) {
		atomic_fetch_add(&cn->repair_failed, 1);
		dm_warn("cn%u: repair of%s%s failed (%s): retrying", cn->node->id, list, jlist, err);
		return;
	}
	atomic_fetch_add(&cn->repair_rounds, 1);
	dm_warn("cn%u: repair: placement version %lld%s%s%s%s; every block has its replicas "
		"(%lu copies, %.1f MiB in all so far)", cn->node->id, (long long)nx.version,
		retiring ? " retires" : "", list, joining ? " takes back" : "", jlist,
		atomic_load(&cn->repair_blocks), atomic_load(&cn->repair_bytes) / 1048576.0);
}

static void *repair_thread(void *arg)
{
	struct cn_repair *r = arg;

	while (!atomic_load(&r->stop)) {
		for (int i = 0; i < 10 && !atomic_load(&r->stop); i++)
			usleep(100000);
		if (!atomic_load(&r->stop) && dm_ctl_leader(r->cn->ctl)) {
			repair_once(r->cn);
			cn_hcatchup_round(r->cn);   /* graph replicas that missed writes */
		}
	}
	return NULL;
}

struct cn_repair *cn_repair_start(struct cn *cn)
{
	struct cn_repair *r;
	int err;

	if (!cn->ctl) {
		errno = 0;
		return NULL;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		errno = ENOMEM;
		return NULL;
	}
	r->cn = cn;
	err = pthread_create(&r->thread, NULL, repair_thread, r);
	if (err) {
		free(r);
		errno = err;
		return NULL;
	}
	return r;
}

void cn_repair_stop(struct cn_repair *r)
{
	if (!r)
		return;
	atomic_store(&r->stop, true);
	pthread_join(r->thread, NULL);
	free(r);
}
#endif
