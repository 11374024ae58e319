/* router_rollout.c: the two-phase rollout of a later oracle epoch (oracle/rollout.h) on a
 * compute node: phase 1 samples on the router thread and fits on a background thread at
 * SCHED_IDLE (with [cluster] etcd one CN fits each epoch and publishes it, the others take
 * it: router_etcd.h), phase 2 installs it once every live CN reports it prepared. */
#include "router_int.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#if DM_HAVE_ETCD
#include "router_etcd.h"
#endif

/* ---- the two-phase rollout of a new oracle epoch (oracle/rollout.h) ---------------------- */

#define ROLLOUT_FRESH_MS 2000u          /* reports older than this: a silent CN, not waited for */
#define ROLLOUT_WAIT_NS (30ull * 1000000000ull) /* prepared: switch anyway after this long */
#define ROLLOUT_RETRY_NS 1000000000ull  /* a failed prepare is tried again after this */
#define ROLLOUT_NICE 10                 /* the prepare thread's nice increment */

#define ROLLOUT_ETCD_WAIT_MS 60000u  /* at most this long for another CN's fit in etcd */

/* A rollout's oracle fitted here (not taken from etcd), from the current centroids or not. */
static void count_fit(struct router *r, const struct oracle_build *b)
{
	atomic_fetch_add(&r->fits_here, 1);
	if (b->init)
		atomic_fetch_add(&r->fits_warm, 1);
}

#if DM_HAVE_ETCD
/* Whether the prepare thread stops waiting for etcd: the router stops, or a later epoch
 * is rolled out. */
static bool prep_cancel(void *arg)
{
	struct router *r = arg;

	return atomic_load(&r->stop) || atomic_load(&r->cn->stopping) ||
	       atomic_load(&r->next_epoch) > r->prep->epoch;
}

/* Install the oracle another CN fitted (wire, len bytes; taken) into b as router_fit_oracle would
 * have: decoded with the validated decoder, checked against b (k, dim, algo) and against
 * the fitter's hash. 0 (b's sample freed) or -errno (b as it was, to fit here). */
static int take_oracle(struct oracle_build *b, uint8_t *wire, size_t len,
		       const struct router_etcd_meta *m)
{
	int rc = -EBADMSG;

	b->o = dm_oracle_decode(wire, len);
	if (!b->o) {
		rc = -errno;
		goto out;
	}
	if (b->o->k != b->ncn || b->o->dim != b->dim ||
	    (b->o->algo == DM_ORACLE_KEYRANGE) != b->keyrange || router_oracle_hash(b->o) != m->hash)
		goto out;
	rc = router_build_spill(b);
	if (rc)
		goto out;
	b->owire = wire;   /* re-encoding the decoded oracle gives these bytes back */
	b->owire_len = len;
	wire = NULL;
	b->hash = m->hash;
	free(b->sample);   /* not needed any more */
	b->sample = NULL;
	b->built_ns = dm_now_ns();
	rc = 0;
out:
	if (rc) {
		dm_oracle_free(b->o);
		b->o = NULL;
		free(b->spill);
		b->spill = NULL;
		free(b->qv);
		b->qv = NULL;
	}
	free(wire);
	return rc;
}

/* The oracle of b's epoch through etcd: claimed here (fit and publish it), or taken from
 * the CN that claimed it; any failure: fit here (prepare_fit). Returns whether b is done. */
static bool prepare_etcd(struct router *r, struct oracle_build *b)
{
	struct router_etcd_meta want = {
		.epoch = b->epoch, .crc = b->crc, .ncn = b->ncn, .dim = b->dim,
		.metric = b->metric, .keyrange = b->keyrange, .regions = b->regions,
		.lv = (uint32_t)b->lv, .n = b->n, .fitter = r->self }, got;
	uint64_t t0 = dm_now_ns();
	uint8_t *wire = NULL;
	size_t len = 0, bytes = 0;
	int rc;

	if (!r->etcd) {
		r->etcd = router_etcd_open(r->cn->cfg->etcd, r->cn->cfg->name, r->self);
		if (!r->etcd) {
			dm_warn("cn%u: oracle epoch %u: no etcd handle (%s): fitting here", r->self,
				b->epoch, strerror(errno));
			return false;
		}
	}
	rc = router_etcd_obtain(r->etcd, &want, ROLLOUT_ETCD_WAIT_MS, prep_cancel, r, &wire,
				&len, &got);
	if (rc == 1) {
		rc = take_oracle(b, wire, len, &got);
		if (rc == 0) {
			b->taken = true;
			b->fitter = got.fitter;
			atomic_fetch_add(&r->fits_taken, 1);
			dm_info("cn%u: oracle epoch %u: taken from etcd (fitted by cn%u) in %llu ms",
				r->self, b->epoch, got.fitter,
				(unsigned long long)((dm_now_ns() - t0) / 1000000));
			return true;
		}
		dm_warn("cn%u: oracle epoch %u: the one in etcd (fitted by cn%u) is not usable "
			"(%s): fitting here", r->self, b->epoch, got.fitter, strerror(-rc));
		return false;
	}
	if (rc == -ECANCELED) {
		b->rc = rc;
		b->built_ns = dm_now_ns();
		return true;
	}
	if (rc < 0) {
		bool ours = rc == -ETIME || rc == -ENOTCONN || rc == -E2BIG || rc == -ESTALE;

		dm_warn("cn%u: oracle epoch %u: no hand-over through etcd (%s%s%s): fitting here",
			r->self, b->epoch, rc == -ETIME ? "waited too long for another compute "
			"node's fit" : strerror(-rc), ours ? "" : ": ",
			ours ? "" : router_etcd_errmsg(r->etcd));
		return false;
	}
	/* claimed: fit and publish */
	router_fit_oracle(b);
	count_fit(r, b);
	if (b->rc) {
		router_etcd_abandon(r->etcd, &want);
		return true;
	}
	want.hash = b->hash;
	rc = router_etcd_publish(r->etcd, &want, b->owire, b->owire_len, &bytes);
	if (rc) {
		/* let another CN claim it rather than wait for this one until its bound */
		dm_warn("cn%u: oracle epoch %u: fitted here, not published in etcd (%s: %s)",
			r->self, b->epoch, strerror(-rc), router_etcd_errmsg(r->etcd));
		router_etcd_abandon(r->etcd, &want);
	}
	else
		dm_info("cn%u: oracle epoch %u: fitted here, published in etcd (%zu bytes%s)",
			r->self, b->epoch, bytes, bytes > ROE_HDR_LEN ? "" :
			": too large for one value, the others fit it themselves");
	return true;
}
#endif

/* The first oracle of a CN (router_build_oracle), of an epoch > 0: taken from etcd when a
 * rollout published it for this index (one read, on the router thread, bounded by the
 * handle's 2 s). Returns whether b is done; otherwise (not published, any error) b is
 * fitted here as before. */
bool router_first_from_etcd(struct router *r, struct oracle_build *b)
{
#if DM_HAVE_ETCD
	struct router_etcd_meta want = {
		.epoch = b->epoch, .crc = b->crc, .ncn = b->ncn, .dim = b->dim,
		.metric = b->metric, .keyrange = b->keyrange, .regions = b->regions,
		.lv = (uint32_t)b->lv }, got;
	uint8_t *wire = NULL;
	size_t len = 0;
	int rc;

	if (!r->cn->cfg->etcd[0] || !b->epoch)
		return false;
	if (!r->etcd_first) {
		r->etcd_first = router_etcd_open(r->cn->cfg->etcd, r->cn->cfg->name, r->self);
		if (!r->etcd_first)
			return false;
	}
	rc = router_etcd_take(r->etcd_first, &want, &wire, &len, &got);
	if (rc == 1)
		rc = take_oracle(b, wire, len, &got);
	if (rc) {
		if (rc != -ENOENT && rc != -ESTALE)
			dm_info("cn%u: oracle epoch %u not taken from etcd (%s): fitting it here",
				r->self, b->epoch, strerror(-rc));
		return false;
	}
	b->taken = true;
	b->fitter = got.fitter;
	atomic_fetch_add(&r->fits_taken, 1);
	dm_info("cn%u: oracle epoch %u: taken from etcd (fitted by cn%u), not built here", r->self,
		b->epoch, got.fitter);
	return true;
#else
	(void)r;
	(void)b;
	return false;
#endif
}

/* Phase 1's fit on the prepare thread: through etcd when the cluster has one, else (or
 * when that fails) here. */
static void prepare_fit(struct router *r, struct oracle_build *b)
{
#if DM_HAVE_ETCD
	if (r->cn->cfg->etcd[0] && prepare_etcd(r, b))
		return;
#endif
	router_fit_oracle(b);
	count_fit(r, b);
}

static void *prepare_main(void *arg)
{
	struct router *r = arg;
	pid_t tid = (pid_t)syscall(SYS_gettid);

	/* The fit competes with this node's query workers for the CPU: it yields to them
	 * (SCHED_IDLE: a waking worker preempts it at once; with nice +10, a worker waking
	 * on a READ's completion could wait out the fit's slice, and a query waits on some
	 * 60 of them: the fitting node's slowest queries ran 2.1-2.7x the p99 while it
	 * fitted, bench/epoch/run.sh). Where SCHED_IDLE is refused, nice +10. Best effort:
	 * it runs as it is if neither is allowed. The fit's pace (fit_duty) bounds what it
	 * takes from the other processes. */
	struct sched_param sp = { 0 };

	if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp)) {
		errno = 0;
		int cur = getpriority(PRIO_PROCESS, (id_t)tid);

		if (errno == 0 && cur + ROLLOUT_NICE <= 19)
			(void)setpriority(PRIO_PROCESS, (id_t)tid, cur + ROLLOUT_NICE);
	}
	prepare_fit(r, r->prep);
	atomic_store(&r->prep_done, true);
	pthread_mutex_lock(&r->mu);
	r->batch_done = true;   /* report "prepared" now */
	pthread_cond_signal(&r->wake);
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

/* Drop the prepared oracle (or wait for its thread first). */
void router_prepare_drop(struct router *r)
{
	if (!r->prep)
		return;
	if (r->prep_running) {
		pthread_join(r->prep_thread, NULL);
		r->prep_running = false;
	}
	router_build_free(r->prep);
	r->prep = NULL;
	atomic_store(&r->prep_done, false);
}

/* A rollout's fit through etcd starts from the current epoch's centroids (the VHash
 * regions, or the k-means partitions) when they are of the same index and shape: on a
 * sample that moved little it converges in a few iterations instead of k-means++ and
 * Lloyd from scratch (a VHash of 6161 x 100 and 96 regions on the same sample: 0.04 s of
 * CPU instead of 0.10), and its ranges stay where they were, so the caches stay warm
 * (cold, a new seed moved about two thirds of the rows to another CN). Only through etcd,
 * where one CN fits an epoch and the others take it: without etcd every CN fits each epoch
 * itself and they must agree, and a CN that starts later has no previous epoch to start
 * from. Router thread (the only writer of r->o). */
static void warm_start(struct router *r, struct oracle_build *b)
{
	const struct dm_oracle *o = r->o;
	uint32_t want = b->keyrange ? router_fit_regions(b) : b->ncn;

	if (!o || !atomic_load(&r->ready) || r->crc != b->crc || o->dim != b->dim ||
	    o->k != b->ncn || (o->algo == DM_ORACLE_KEYRANGE) != b->keyrange ||
	    (!b->keyrange && o->algo != DM_ORACLE_CONSTRAINED) || o->nfine != want)
		return;
	b->init = malloc((size_t)want * b->dim * sizeof(float));
	if (!b->init)
		return;   /* cold */
	memcpy(b->init, o->fine, (size_t)want * b->dim * sizeof(float));
	if (!b->keyrange)
		return;   /* k-means partitions keep their numbers: centroid j starts as j */
	/* Key ranges: the key order and the runs' CNs are kept where they serve
	 * (dm_oracle_keyrange_fit); without them, a refit on a moved sample orders the
	 * regions anew and most rows change CN. A copy: r->o may be replaced meanwhile. */
	b->prev_cn = malloc(want * sizeof(uint32_t));
	if (b->prev_cn)   /* else the regions only */
		memcpy(b->prev_cn, o->fine_group, want * sizeof(uint32_t));
}

/* Phase 1: sample here, fit on the prepare thread (or here if it cannot start). */
static void prepare_start(struct router *r, uint32_t target, bool reseed)
{
	bool etcd = r->cn->cfg->etcd[0] != 0;
	int rc = router_gather_sample(r, target, etcd, &r->prep);

	if (rc) {
		if (rc != -ENOENT)
			dm_warn("cn%u: cannot prepare oracle epoch %u: %s", r->self, target,
				strerror(-rc));
		r->prep_retry_ns = dm_now_ns() + ROLLOUT_RETRY_NS;
		return;
	}
	if (etcd && !reseed)
		warm_start(r, r->prep);
	atomic_store(&r->prep_done, false);
	dm_info("cn%u: preparing oracle epoch %u (routing with epoch %u meanwhile%s)", r->self,
		target, atomic_load(&r->epoch), r->prep->init ? "; the fit starts from its "
		"centroids" : "");
	if (pthread_create(&r->prep_thread, NULL, prepare_main, r) == 0) {
		r->prep_running = true;
		return;
	}
	prepare_fit(r, r->prep);
	atomic_store(&r->prep_done, true);
}

/* One step of the rollout after a report (router thread): rep = every CN's freshest report.
 * Returns whether to report again soon (prepared, waiting for the others). */
bool router_rollout_step(struct router *r, const struct dm_rollout_cn *rep)
{
	uint32_t cur = atomic_load(&r->epoch), target, crc;
	bool up[DM_MAX_NODES];
	uint64_t now = dm_now_ns();
	struct oracle_build *b;

	if (!atomic_load(&r->ready)) {
		/* No oracle yet: the first one is of the epoch the others run. */
		r->cluster_epoch = dm_rollout_current(rep, r->ncn);
		return false;
	}
	target = dm_rollout_target(rep, r->ncn, DM_MAX(cur, atomic_load(&r->want_epoch)));
	atomic_store(&r->next_epoch, target);
	if (target <= cur) {
		if (r->prep && atomic_load(&r->prep_done))
			router_prepare_drop(r);
		atomic_store(&r->rollout, DM_FWD_ROLLOUT_IDLE);
		return false;
	}
	if (!r->prep) {
		bool reseed = atomic_load(&r->reseed_epoch) == target;

		for (uint32_t c = 0; c < r->ncn; c++)
			reseed |= rep[c].valid && rep[c].next == target && rep[c].reseed;
		if (now >= r->prep_retry_ns)
			prepare_start(r, target, reseed);
		atomic_store(&r->rollout, DM_FWD_ROLLOUT_PREPARING);
		return false;
	}
	if (!atomic_load(&r->prep_done))
		return false;   /* still fitting */
	if (r->prep_running) {
		pthread_join(r->prep_thread, NULL);
		r->prep_running = false;
	}
	b = r->prep;
	pthread_rwlock_rdlock(&r->cn->lock);
	crc = r->cn->views[0].cur ? r->cn->views[0].cur->meta_crc : 0;
	pthread_rwlock_unlock(&r->cn->lock);
	if (b->rc || b->epoch != target || b->crc != crc) {
		/* failed, overtaken by a later epoch, or of an index replaced meanwhile */
		bool failed = b->rc && b->rc != -ECANCELED;   /* not a wait given up */

		if (failed)
			dm_warn("cn%u: cannot prepare oracle epoch %u: %s", r->self, b->epoch,
				strerror(-b->rc));
		r->prep_retry_ns = failed ? now + ROLLOUT_RETRY_NS : 0;
		router_prepare_drop(r);
		atomic_store(&r->rollout, DM_FWD_ROLLOUT_PREPARING);
		return false;
	}
	if (atomic_load(&r->rollout) != DM_FWD_ROLLOUT_PREPARED) {
		atomic_store(&r->rollout, DM_FWD_ROLLOUT_PREPARED);
		router_log_built(r, b, "prepared");
		return true;    /* report it before looking at the others */
	}
	/* Phase 2: switch once every live CN has it (or after ROLLOUT_WAIT_NS anyway). */
	for (uint32_t c = 0; c < r->ncn; c++)
		up[c] = router_cn_ok(r, c);
	bool all = dm_rollout_may_activate(rep, up, r->ncn, r->self, target,
					   DM_MAX(ROLLOUT_FRESH_MS, 10 * r->p.exchange_ms));

	if (!all && now - b->built_ns < ROLLOUT_WAIT_NS)
		return true;
	r->prep = NULL;
	atomic_store(&r->prep_done, false);
	dm_info("cn%u: oracle epoch %u active (was %u): sampled and %s in %.2f s, waited "
		"%.2f s for the other compute nodes%s; at %.6f s monotonic", r->self, b->epoch, cur,
		b->taken ? "taken from etcd" : "fitted", (b->built_ns - b->t0_ns) / 1e9, (now - b->built_ns) / 1e9,
		all ? "" : " (not all of them had it: switched after the wait)", now / 1e9);
	router_install_oracle(r, b);
	atomic_fetch_add(&r->reclusters, 1);
	atomic_store(&r->rollout, DM_FWD_ROLLOUT_IDLE);
	r->csp_high_since = 0;
	return false;
}
