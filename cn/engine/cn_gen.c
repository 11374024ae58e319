/* cn_gen.c: a compute node's index view across generations (cn_refresh, protocol in
 * dgen.h), memory nodes marked down and brought back (read failover: the workers' side is
 * in cn_worker.c), and the cache sized from the cluster file's [cn] settings. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cn.h"
#include "dgen.h"

int cn_cache_apply(struct cn *cn)
{
	const struct dindex *d = cn->views[0].cur;   /* the cache holds graph 0's records */
	const struct dm_cn_cfg *cc = &cn->node->cnc;
	uint32_t rs = d ? d->rec_size : 64;
	uint64_t want = cn->cache_override ? cn->cache_bytes :
			dm_config_cache_bytes(cc, d ? d->index_bytes : 0);
	double admit = cn->cache_override ? cn->admit_prob : cc->cache_admit;

	if (!cn->cache_override && want == 0) {
		/* cache = 0 (off), or a share of an index that is not there yet. */
		dm_cache_free(cn->cache);
		cn->cache = NULL;
		cn->cache_bytes = 0;
		cn->admit_prob = admit;
	} else if (cn->cache && want == cn->cache_bytes && admit == cn->admit_prob &&
		   rs == cn->cache_rec_size) {
		dm_cache_clear(cn->cache);
	} else {
		struct dm_cache *nc = dm_cache_new(want, rs, admit, cn->node->id + 1);

		if (!nc)
			return -ENOMEM;
		dm_cache_free(cn->cache);
		cn->cache = nc;
		cn->cache_bytes = want;
		cn->cache_rec_size = rs;
		cn->admit_prob = admit;
	}
	cn->pin_level = d && cn->cache ? dindex_pin_level(d, cn->cache_bytes / d->rec_size) :
		       INT_MAX;
	return 0;
}

/* The oldest generation of graph g a view still in use belongs to: what we report. With
 * no view: 0 while the graph has a current generation (we are about to open it: that holds
 * every generation back until we have it), DM_GEN_NONE once the memory nodes said it has
 * none (dropped: its blocks are freed without waiting for our lease). Read lock held. */
static uint64_t oldest_in_use(struct cn *cn, uint32_t g)
{
	const struct cn_view *vw = &cn->views[g];
	uint64_t o = vw->cur ? vw->cur->gen : 0;
	bool any = vw->cur != NULL;

	for (int i = 0; i < CN_MAX_RETIRED; i++)
		if (vw->retired[i]) {
			if (!any || vw->retired[i]->gen < o)
				o = vw->retired[i]->gen;
			any = true;
		}
	return any ? o : vw->gone ? DM_GEN_NONE : 0;
}

/* Whether we hold any view of graph g (read lock held). */
static bool holds(const struct cn *cn, uint32_t g)
{
	if (cn->views[g].cur)
		return true;
	for (int i = 0; i < CN_MAX_RETIRED; i++)
		if (cn->views[g].retired[i])
			return true;
	return false;
}

/* Free the old views no worker uses any more. */
static void release_retired(struct cn *cn)
{
	bool any = false;

	pthread_rwlock_rdlock(&cn->lock);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
		for (int i = 0; i < CN_MAX_RETIRED; i++)
			if (cn->views[g].retired[i] && atomic_load(&cn->views[g].retired[i]->users) == 0)
				any = true;
	pthread_rwlock_unlock(&cn->lock);
	if (!any)
		return;
	pthread_rwlock_wrlock(&cn->lock);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
		for (int i = 0; i < CN_MAX_RETIRED; i++) {
			struct dindex *d = cn->views[g].retired[i];

			if (!d || atomic_load(&d->users))
				continue;
			dm_info("cn%u: graph %u generation %llu released", cn->node->id, g,
				(unsigned long long)d->gen);
			dindex_free(d);
			cn->views[g].retired[i] = NULL;
		}
	pthread_rwlock_unlock(&cn->lock);
}

/* Replace graph g's view by d (NULL: the graph is gone; write lock held): the old one is
 * kept while workers use it. false when there is no room to keep it (workers stuck on old
 * views: retry later). */
static bool switch_view(struct cn *cn, uint32_t g, struct dindex *d)
{
	struct cn_view *vw = &cn->views[g];
	struct dindex *old = vw->cur;

	if (old && atomic_load(&old->users)) {
		int i;

		for (i = 0; i < CN_MAX_RETIRED && vw->retired[i]; i++)
			;
		if (i == CN_MAX_RETIRED)
			return false;
		vw->retired[i] = old;
	} else {
		dindex_free(old);
	}
	vw->cur = d;
	return true;
}

/* Report to the memory nodes; the answers' send times renew the lease per node. */
static int report(struct cn *cn, struct dgen_view *v)
{
	uint64_t sent[DM_MAX_NODES] = { 0 }, g;
	int rc;

	pthread_rwlock_rdlock(&cn->lock);
	g = oldest_in_use(cn, 0);
	pthread_rwlock_unlock(&cn->lock);
	rc = dgen_report(cn->mns, 0, cn->node->id, g, v, sent);
	for (uint32_t m = 0; m < cn->mns->n; m++) {
		if (sent[m]) {
			atomic_store(&cn->report_ns[m], sent[m]);
			continue;
		}
		if (mn_set_retired(cn->mns, m))
			continue;   /* not reported to: it holds nothing */
		/* With a cluster state, a node it lists as up whose connection is intact is only
		 * slow (e.g. busy serving a re-replication): not a failure. Its READs still mark
		 * it down if they fail, and the lease fence keeps the generation protocol safe. */
		if (atomic_load(&cn->state_version) > 0 && !atomic_load(&cn->state_down[m]) &&
		    cn->mns->link[m].up) {
			dm_debug("cn%u: memory node %u did not answer a report in time", cn->node->id,
				 m);
			continue;
		}
		/* Silent: down until rejoin() brings it back (no reconnect of everything, which
		 * would fail the queries in flight). */
		mn_link_close(cn->mns, m);
		cn_mn_down(cn, m, atomic_load(&cn->mn_epoch[m]), -EHOSTDOWN);
	}
	return rc;
}

bool cn_mn_down(struct cn *cn, uint32_t m, unsigned seen, int why)
{
	if ((seen & 1) || !atomic_compare_exchange_strong(&cn->mn_epoch[m], &seen, seen + 1))
		return false;
	atomic_fetch_add(&cn->mn_downs, 1);
	dm_warn("cn%u: memory node %u marked down (%s): reads go to other replicas",
		cn->node->id, m, strerror(-why));
	return true;
}

/* Set the epochs from the links after the memory-node set was reopened (write lock). */
static void epochs_from_links(struct cn *cn)
{
	for (uint32_t m = 0; m < cn->mns->n; m++) {
		unsigned e = atomic_load(&cn->mn_epoch[m]);
		bool up = cn->mns->link[m].up && !atomic_load(&cn->state_down[m]);

		if (up == !(e & 1))
			continue;
		atomic_store(&cn->mn_epoch[m], e + 1);
		atomic_fetch_add(up ? &cn->mn_ups : &cn->mn_downs, 1);
		cn->rejoin_ms[m] = 0;
		cn->rejoin_at[m] = 0;
	}
}

/* A view's addresses are valid at the epochs of the nodes that are up now (write lock). A
 * node that is up but whose blocks could not all be looked up (a lookup timed out: the node
 * was busy, e.g. writing a snapshot) is marked down, so that rejoin() looks them up again;
 * otherwise those replicas would stay unknown while the node serves. */
static void view_epochs(struct cn *cn, struct dindex *d)
{
	for (uint32_t m = 0; m < cn->mns->n; m++) {
		unsigned e = atomic_load(&cn->mn_epoch[m]);
		bool missing = false;

		for (size_t i = 0; i < (size_t)d->nblocks * d->nrep && !missing; i++)
			missing = d->block_mn[i] == m && !d->block_addr[i];
		if (missing && !(e & 1) && cn->mns->link[m].up && !mn_set_retired(cn->mns, m) &&
		    cn_mn_down(cn, m, e, -ETIMEDOUT))
			e = atomic_load(&cn->mn_epoch[m]);
		d->mn_epoch[m] = (e & 1) || !cn->mns->link[m].up ? UINT32_MAX : e;
	}
}

/* Bring memory node m (down at epoch e) back: reconnect, report (its current generation of
 * every graph we serve must be our view's), look up our views' blocks on it and READ one of
 * each (dindex_rejoin), then mark it up with those addresses. 0 or -errno. */
static int rejoin_one(struct cn *cn, uint32_t m, unsigned e)
{
	struct dm_wire_ctl_gen_state st;
	struct dindex *d[DM_MAX_GRAPHS];   /* change only under ctl_lock, which we hold */
	uint64_t sent = 0, o[DM_MAX_GRAPHS], *addr[DM_MAX_GRAPHS] = { NULL };
	uint64_t ctr[DM_MAX_GRAPHS] = { 0 };
	int rc;

	pthread_rwlock_rdlock(&cn->lock);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		d[g] = cn->views[g].cur;
		o[g] = oldest_in_use(cn, g);
	}
	pthread_rwlock_unlock(&cn->lock);
	struct dm_wire_ctl_info was = cn->mns->link[m].info;
	bool restarted;

	rc = mn_link_open(cn->mns, m, 1000);
	if (rc)
		return rc;
	/* a node that restarted maps and registers its region anew */
	restarted = cn->mns->link[m].info.region_addr != was.region_addr ||
		    cn->mns->link[m].info.rkey != was.rkey;
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		size_t n;

		if (g && !d[g])
			continue;
		/* graph 0 is always reported: its answer's send time renews the lease */
		rc = dgen_report_node(cn->mns, m, g, cn->node->id, o[g], &st, g ? NULL : &sent);
		if (rc)
			goto out_free;
		if (!d[g])
			continue;
		if (!(st.flags & DM_GEN_F_CURRENT) || st.current != d[g]->gen) {
			rc = -ESTALE;   /* another generation there: the generation switch handles it */
			goto out_free;
		}
		n = (size_t)d[g]->nblocks * d[g]->nrep;
		addr[g] = malloc((n ? n : 1) * sizeof(uint64_t));
		rc = addr[g] ? dindex_rejoin(cn->mns, d[g], m, addr[g]) : -ENOMEM;
		if (rc)
			goto out_free;
		/* the id counter, when it lives there (a restarted node's addresses moved) */
		rc = dindex_lookup_ctr(cn->mns, d[g], m, &ctr[g]);
		if (rc == -ENOENT)
			rc = 0;
		if (rc)
			goto out_free;
	}
	/* It may have missed inserts while it was down (this compute node's WRITEs to it
	 * failed or were skipped), or lost those after its last region snapshot (it restarted):
	 * then every graph that takes inserts and has a block on it is marked stale for it
	 * before it serves (cn_hcatchup.c); reads prefer the other replicas until the
	 * controller caught it up. (Another compute node that missed writes to it marks it
	 * when it brings it back itself.) */
	unsigned long missed = atomic_exchange(&cn->write_missed[m], 0);

	for (uint32_t g = 0; (restarted || missed) && g < DM_MAX_GRAPHS; g++) {
		bool holds = false;

		if (!d[g] || d[g]->cap <= d[g]->n)
			continue;
		for (size_t i = 0; i < (size_t)d[g]->nblocks * d[g]->nrep && !holds; i++)
			holds = d[g]->block_mn[i] == m;
		if (holds && (rc = cn_gstale_mark(cn, g, m))) {
			atomic_fetch_add(&cn->write_missed[m], missed ? missed : 1);   /* again */
			goto out_free;
		}
	}
	pthread_rwlock_wrlock(&cn->lock);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++) {
		if (!d[g])
			continue;
		for (size_t i = 0; i < (size_t)d[g]->nblocks * d[g]->nrep; i++)
			if (d[g]->block_mn[i] == m)
				d[g]->block_addr[i] = addr[g][i];
		if (ctr[g])
			d[g]->ctr_addr = ctr[g];
		d[g]->mn_epoch[m] = e + 1;
	}
	atomic_store(&cn->report_ns[m], sent);
	atomic_store_explicit(&cn->mn_epoch[m], e + 1, memory_order_release);
	pthread_rwlock_unlock(&cn->lock);
	atomic_fetch_add(&cn->mn_ups, 1);
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
		free(addr[g]);
	return 0;

out_free:
	for (uint32_t g = 0; g < DM_MAX_GRAPHS; g++)
		free(addr[g]);
	mn_link_close(cn->mns, m);
	return rc;
}

/* Try to bring the memory nodes that are down back, each with its back-off (ctl_lock). */
static void rejoin(struct cn *cn)
{
	uint64_t now = dm_now_ns();

	for (uint32_t m = 0; m < cn->mns->n; m++) {
		unsigned e = atomic_load(&cn->mn_epoch[m]);
		int rc;

		if (!(e & 1) || now < cn->rejoin_at[m] || atomic_load(&cn->state_down[m]) ||
		    mn_set_retired(cn->mns, m))
			continue;   /* up, backing off, declared down by the cluster state, retired */
		rc = rejoin_one(cn, m, e);
		if (rc == 0) {
			dm_info("cn%u: memory node %u is up again: reads use it", cn->node->id, m);
			cn->rejoin_ms[m] = 0;
			continue;
		}
		cn->rejoin_ms[m] = cn->rejoin_ms[m] ? DM_MIN(2 * cn->rejoin_ms[m], 5000u) : 200;
		cn->rejoin_at[m] = now + cn->rejoin_ms[m] * 1000000ull;
		dm_debug("cn%u: memory node %u still down (%s); next try in %u ms", cn->node->id,
			 m, strerror(-rc), cn->rejoin_ms[m]);
	}
}

/* Follow graph g's state v (complete: every memory node that is up answered): open its
 * current generation when it is new to us (or when force or replace asks to read the block
 * table again) and switch new queries to it; a graph no memory node has any more is
 * dropped (queries in flight finish on the old view). ctl_lock held. 0, -ENOENT (no such
 * graph), or -errno. */
static int refresh_graph(struct cn *cn, uint32_t g, const struct dgen_view *v, bool complete,
			 bool force, bool replace)
{
	struct cn_view *vw = &cn->views[g];
	struct dindex *d = NULL;
	char err[512];
	int rc;

	if (!v->has_current) {
		vw->gone = complete && v->answered;
		if (vw->cur && complete && v->answered) {
			dm_info("cn%u: graph %u gone from the memory nodes", cn->node->id, g);
			pthread_rwlock_wrlock(&cn->lock);
			if (switch_view(cn, g, NULL) && g == 0 && cn_cache_apply(cn))
				dm_err("cn%u: out of memory for the cache", cn->node->id);
			pthread_rwlock_unlock(&cn->lock);
		}
		return v->answered ? -ENOENT : -EHOSTDOWN;
	}
	vw->gone = false;
	if (!force && !replace && vw->cur && vw->cur->gen == v->current)
		return 0;
	rc = dindex_open(cn->mns, g, v->current, &d, err, sizeof(err));
	if (rc) {
		if (rc != -ENOENT) {
			dm_warn("cn%u: graph %u generation %llu: %s", cn->node->id, g,
				(unsigned long long)v->current, err);
			/* Reading the view again under a new placement: the old view still
			 * serves; try again at the next refresh rather than reconnecting
			 * everything (which fails the queries in flight). */
			if (replace && vw->cur && vw->cur->gen == v->current)
				atomic_store(&cn->placement_dirty, true);
			else
				atomic_store(&cn->need_refresh, true);
		}
		return rc;
	}
	pthread_rwlock_wrlock(&cn->lock);
	if (force || !vw->cur || vw->cur->gen != d->gen || vw->cur->meta_crc != d->meta_crc ||
	    vw->cur->nblocks != d->nblocks || vw->cur->nrep != d->nrep ||
	    memcmp(vw->cur->block_addr, d->block_addr,
		   (size_t)d->nblocks * d->nrep * sizeof(uint64_t))) {
		bool changed = !vw->cur || vw->cur->gen != d->gen || vw->cur->meta_crc != d->meta_crc;
		uint64_t was = vw->cur ? vw->cur->gen : 0;
		bool had = vw->cur != NULL;

		view_epochs(cn, d);
		if (!switch_view(cn, g, d)) {
			pthread_rwlock_unlock(&cn->lock);
			dm_warn("cn%u: %d old views of graph %u still in use: generation %llu waits",
				cn->node->id, CN_MAX_RETIRED, g, (unsigned long long)d->gen);
			dindex_free(d);
			return 0;
		}
		d = vw->cur;
		if (force)
			atomic_fetch_add(&cn->gen, 1);   /* workers rebind to the new addresses */
		if (changed) {
			if (g == 0 && cn_cache_apply(cn))
				dm_err("cn%u: out of memory for the cache", cn->node->id);
			if (had)
				atomic_fetch_add(&cn->gen_switches, 1);
		}
		if (had && changed)
			dm_info("cn%u: graph %u generation %llu -> %llu: index of %u records (dim %u, "
				"M %u, %u blocks) ready", cn->node->id, g, (unsigned long long)was,
				(unsigned long long)d->gen, d->n, d->p.dim, d->p.M, d->nblocks);
		else if (changed)
			dm_info("cn%u: graph %u generation %llu: index of %u records (dim %u, M %u, "
				"%u blocks) ready", cn->node->id, g, (unsigned long long)d->gen, d->n,
				d->p.dim, d->p.M, d->nblocks);
		d = NULL;
	}
	pthread_rwlock_unlock(&cn->lock);
	dindex_free(d);
	return 0;
}

/* Report graph g >= 1 (oldest_in_use) and fill v; listed: whether the memory nodes list
 * a current generation of it (else it is gone for us: DM_GEN_NONE when we hold nothing). */
static int report_graph(struct cn *cn, uint32_t g, bool listed, struct dgen_view *v)
{
	uint64_t o;

	if (!listed)
		cn->views[g].gone = true;
	pthread_rwlock_rdlock(&cn->lock);
	o = oldest_in_use(cn, g);
	pthread_rwlock_unlock(&cn->lock);
	return dgen_report(cn->mns, g, cn->node->id, o, v, NULL);
}

int cn_refresh(struct cn *cn, bool force)
{
	struct dgen_view v;
	struct mn_set *s;
	bool replace, switched = false;
	int rc, rc0;

	cn_gstale_sync(cn);      /* the stale graph replicas the cluster state knows of */
	pthread_mutex_lock(&cn->ctl_lock);
	if (force || !cn->mns) {
		s = mn_set_open(cn->cfg, cn->x, cn->pool, false, 2000);
		if (!s) {
			rc = -errno;
			goto out_unlock;
		}
		memcpy(s->retired, cn->retired_mn, sizeof(s->retired));
		pthread_rwlock_wrlock(&cn->lock);
		mn_set_close(cn->mns);
		cn->mns = s;
		epochs_from_links(cn);
		atomic_fetch_add(&cn->gen, 1);
		pthread_rwlock_unlock(&cn->lock);
	}
	release_retired(cn);
	rc = report(cn, &v);
	if (rc && !v.answered && !force) {
		/* A control connection broke (a memory node restarted): reconnect and retry.
		 * (Skipping this with a cluster state left a CN whose only memory node had
		 * restarted without any answering node to rejoin through: the soft-RoCE VM's
		 * 1+1 cluster never served again.) */
		pthread_mutex_unlock(&cn->ctl_lock);
		return cn_refresh(cn, true);
	}
	/* A node that did not answer was marked down by report(); rejoin() brings it back.
	 * A new placement: read the block tables again under it (the retired nodes' blocks
	 * now live on other nodes). */
	replace = atomic_exchange(&cn->placement_dirty, false);
	if (replace)
		memcpy(cn->mns->retired, cn->retired_mn, sizeof(cn->retired_mn));
	{
		uint64_t was = cn->views[0].cur ? cn->views[0].cur->gen : 0;

		rc0 = refresh_graph(cn, 0, &v, rc == 0, force, replace);
		switched |= cn->views[0].cur && cn->views[0].cur->gen != was;
	}
	/* The other graphs the memory nodes list or we hold (each reported on its own: its
	 * generations are released by its own reports). */
	struct dgen_graphs gl;
	int lrc = dgen_list(cn->mns, &gl);

	for (uint32_t g = 1; g < DM_MAX_GRAPHS; g++) {
		struct dgen_view vg;
		uint64_t was = cn->views[g].cur ? cn->views[g].cur->gen : 0;
		bool h;
		int grc;

		pthread_rwlock_rdlock(&cn->lock);
		h = holds(cn, g);
		pthread_rwlock_unlock(&cn->lock);
		if (!h && (lrc && !gl.answered ? true :
			   !((gl.mask | gl.retired_mask) >> g & 1)))
			continue;   /* nothing of it here or there */
		grc = report_graph(cn, g, lrc || (gl.mask >> g & 1), &vg);

		if (grc && !vg.answered)
			continue;
		if (refresh_graph(cn, g, &vg, grc == 0, force, replace) == 0 &&
		    cn->views[g].cur && cn->views[g].cur->gen != was)
			switched = true;
	}
	rc = rc0;
	if (rc == 0 || rc == -ENOENT)
		atomic_store(&cn->need_refresh, false);
	if (switched) {
		/* No worker used the old views: acknowledge the new generations at once. */
		release_retired(cn);
		report(cn, &v);
		for (uint32_t g = 1; g < DM_MAX_GRAPHS; g++) {
			struct dgen_view vg;

			if (cn->views[g].cur)
				report_graph(cn, g, true, &vg);
		}
	}
	rejoin(cn);
out_unlock:
	pthread_mutex_unlock(&cn->ctl_lock);
	return rc;
}
