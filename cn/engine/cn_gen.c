/* cn_gen.c: a compute node's index view across generations (cn_refresh, protocol in
 * dgen.h) and the cache sized from the cluster file's [cn] settings. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cn.h"
#include "dgen.h"

int cn_cache_apply(struct cn *cn)
{
	const struct dindex *d = cn->idx;
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

/* The oldest generation a view still in use belongs to: what we report (0: no view, which
 * holds every generation back until we have one). Read lock held. */
static uint64_t oldest_in_use(struct cn *cn)
{
	uint64_t g = cn->idx ? cn->idx->gen : 0;

	for (int i = 0; i < CN_MAX_RETIRED; i++)
		if (cn->retired[i] && cn->retired[i]->gen < g)
			g = cn->retired[i]->gen;
	return g;
}

/* Free the old views no worker uses any more. */
static void release_retired(struct cn *cn)
{
	bool any = false;

	pthread_rwlock_rdlock(&cn->lock);
	for (int i = 0; i < CN_MAX_RETIRED; i++)
		if (cn->retired[i] && atomic_load(&cn->retired[i]->users) == 0)
			any = true;
	pthread_rwlock_unlock(&cn->lock);
	if (!any)
		return;
	pthread_rwlock_wrlock(&cn->lock);
	for (int i = 0; i < CN_MAX_RETIRED; i++)
		if (cn->retired[i] && atomic_load(&cn->retired[i]->users) == 0) {
			dm_info("cn%u: generation %llu released", cn->node->id,
				(unsigned long long)cn->retired[i]->gen);
			dindex_free(cn->retired[i]);
			cn->retired[i] = NULL;
		}
	pthread_rwlock_unlock(&cn->lock);
}

/* Replace the view by d (write lock held): the old one is kept while workers use it.
 * false when there is no room to keep it (workers stuck on old views: retry later). */
static bool switch_view(struct cn *cn, struct dindex *d)
{
	struct dindex *old = cn->idx;

	if (old && atomic_load(&old->users)) {
		int i;

		for (i = 0; i < CN_MAX_RETIRED && cn->retired[i]; i++)
			;
		if (i == CN_MAX_RETIRED)
			return false;
		cn->retired[i] = old;
	} else {
		dindex_free(old);
	}
	cn->idx = d;
	return true;
}

/* Report to the memory nodes; the answers' send times renew the lease per node. */
static int report(struct cn *cn, struct dgen_view *v)
{
	uint64_t sent[DM_MAX_NODES] = { 0 }, g;
	int rc;

	pthread_rwlock_rdlock(&cn->lock);
	g = oldest_in_use(cn);
	pthread_rwlock_unlock(&cn->lock);
	rc = dgen_report(cn->mns, cn->node->id, g, v, sent);
	for (uint32_t m = 0; m < cn->mns->n; m++)
		if (sent[m])
			atomic_store(&cn->report_ns[m], sent[m]);
	return rc;
}

int cn_refresh(struct cn *cn, bool force)
{
	struct dindex *d = NULL;
	struct dgen_view v;
	struct mn_set *s;
	char err[512];
	bool partial;
	int rc;

	pthread_mutex_lock(&cn->ctl_lock);
	if (force || !cn->mns) {
		s = mn_set_open(cn->cfg, cn->x, cn->pool, false, 2000);
		if (!s) {
			rc = -errno;
			goto out_unlock;
		}
		pthread_rwlock_wrlock(&cn->lock);
		mn_set_close(cn->mns);
		cn->mns = s;
		atomic_fetch_add(&cn->gen, 1);
		pthread_rwlock_unlock(&cn->lock);
	}
	release_retired(cn);
	rc = report(cn, &v);
	if (rc && !v.answered && !force) {
		/* A control connection broke (a memory node restarted): reconnect and retry. */
		pthread_mutex_unlock(&cn->ctl_lock);
		return cn_refresh(cn, true);
	}
	partial = rc != 0;
	if (partial)
		atomic_store(&cn->need_refresh, true);   /* some node did not answer: reconnect */
	if (!v.has_current) {
		rc = v.answered ? -ENOENT : rc;
		if (cn->idx && v.answered)
			dm_info("cn%u: index gone from the memory nodes", cn->node->id);
		goto out_unlock;
	}
	if (!force && cn->idx && cn->idx->gen == v.current) {
		rc = 0;
		goto out_unlock;
	}
	rc = dindex_open(cn->mns, v.current, &d, err, sizeof(err));
	if (rc) {
		if (rc != -ENOENT) {
			dm_warn("cn%u: generation %llu: %s", cn->node->id,
				(unsigned long long)v.current, err);
			atomic_store(&cn->need_refresh, true);
		}
		goto out_unlock;
	}
	pthread_rwlock_wrlock(&cn->lock);
	if (force || !cn->idx || cn->idx->gen != d->gen || cn->idx->meta_crc != d->meta_crc ||
	    cn->idx->nblocks != d->nblocks ||
	    memcmp(cn->idx->block_addr, d->block_addr, d->nblocks * sizeof(uint64_t))) {
		bool changed = !cn->idx || cn->idx->gen != d->gen || cn->idx->meta_crc != d->meta_crc;
		uint64_t was = cn->idx ? cn->idx->gen : 0;
		bool had = cn->idx != NULL;

		if (!switch_view(cn, d)) {
			pthread_rwlock_unlock(&cn->lock);
			dm_warn("cn%u: %d old views still in use: generation %llu waits",
				cn->node->id, CN_MAX_RETIRED, (unsigned long long)d->gen);
			goto out_unlock;
		}
		d = NULL;
		if (force)
			atomic_fetch_add(&cn->gen, 1);   /* workers rebind to the new addresses */
		if (changed) {
			if (cn_cache_apply(cn))
				dm_err("cn%u: out of memory for the cache", cn->node->id);
			if (had)
				atomic_fetch_add(&cn->gen_switches, 1);
		}
		if (had && changed)
			dm_info("cn%u: generation %llu -> %llu: index of %u records (dim %u, M %u, "
				"%u blocks) ready", cn->node->id, (unsigned long long)was,
				(unsigned long long)cn->idx->gen, cn->idx->n, cn->idx->p.dim,
				cn->idx->p.M, cn->idx->nblocks);
		else if (changed)
			dm_info("cn%u: generation %llu: index of %u records (dim %u, M %u, %u blocks) "
				"ready", cn->node->id, (unsigned long long)cn->idx->gen, cn->idx->n,
				cn->idx->p.dim, cn->idx->p.M, cn->idx->nblocks);
	}
	pthread_rwlock_unlock(&cn->lock);
	atomic_store(&cn->need_refresh, partial);
	/* No worker used the old view: acknowledge the new generation at once. */
	release_retired(cn);
	report(cn, &v);
out_unlock:
	pthread_mutex_unlock(&cn->ctl_lock);
	dindex_free(d);
	return rc;
}
