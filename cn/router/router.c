/* router.c: routing decisions, SERVE connections, the state exchange through the memory
 * nodes, the CSP estimate, the mass-drift pass and the router thread of a compute node (see
 * router.h; an oracle's sample and fit: router_oracle.c; the rollout of later epochs:
 * router_rollout.c). */
#include "router_int.h"
#include "util/dm_hash.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if DM_HAVE_ETCD
#include "router_etcd.h"
#endif

#define CSP_PERIOD_NS 500000000ull

/* ---- routing decisions ------------------------------------------------------------------- */

/* Forget the learned demand: equal shares (caller holds mu). */
void router_reset_demand(struct router *r)
{
	for (uint32_t c = 0; c < r->ncn; c++) {
		r->demand[c] = 1.0 / r->ncn;
		r->want[c] = 0;
	}
	r->total = 0;
}

/* New limits for the next batch (caller holds mu). Adaptive (route_limits.h): a CN's share
 * follows the demand for it, scaled down while its queue is over the band. The first
 * version gave equal shares whenever the queues were equal; under a skewed workload that
 * spilled the hot partition onto every CN although nobody was busy, and cached it
 * everywhere (Fashion-MNIST Zipf 1.0 at 5% cache: CSP 16-42%). */
void router_set_limits(struct router *r)
{
	uint32_t s = atomic_load(&r->strategy);

	r->qlen[r->self] = atomic_load(&r->cn->qlen);
	route_demand_update(r->ncn, r->demand, r->want, r->total);
	route_limits_owned(r->ncn, r->p.batch, s != DM_ROUTE_BALANCED, r->demand, r->qlen,
			   r->owner, r->limit);
	for (uint32_t c = 0; c < r->ncn; c++) {
		r->hist[c] = 0;
		r->want[c] = 0;
	}
	r->total = 0;
}

/* r->cns = the partitions ranked for vec (normalised first for a cosine index; caller
 * holds mu). */
static void rank(struct router *r, const float *vec, uint32_t dim)
{
	if (r->cn->views[0].cur && r->cn->views[0].cur->p.metric == DM_METRIC_COS) {
		memcpy(r->qv, vec, dim * sizeof(float));
		dm_normalize(r->qv, dim);
		vec = r->qv;
	}
	dm_oracle_rank(r->o, vec, r->cns, NULL);
}

/* Whether queries may go to compute node c: one the cluster state does not declare down.
 * This one too, unless the up-set leaves it out (it left and drains, or it has just
 * started and is not in yet): its owner table is then the one the others compute. */
bool router_cn_ok(const struct router *r, uint32_t c)
{
	if (c == r->self)
		return !atomic_load_explicit(&r->cn->state_self_down, memory_order_relaxed);
	return !atomic_load_explicit(&r->cn->state_cn_down[c], memory_order_relaxed);
}

/* Re-partition after a CN joined or left (caller holds mu, an oracle exists): the owners
 * of the live set the cluster state gives, a new routing epoch when they changed (or with
 * force, after a new oracle). The batch starts afresh: a partition's queue is its new
 * owner's. */
void router_set_owners(struct router *r, bool force)
{
	bool up[DM_MAX_NODES];
	uint32_t own[DM_MAX_NODES];
	int moved;

	for (uint32_t c = 0; c < r->ncn; c++)
		up[c] = router_cn_ok(r, c);
	moved = dm_oracle_owners(r->o, up, own);
	if (moved < 0)
		return;
	if (!force && !memcmp(own, r->owner, r->ncn * sizeof(*own)))
		return;
	memcpy(r->owner, own, r->ncn * sizeof(*own));
	if (!force) {
		atomic_store(&r->prev_repoch, atomic_load(&r->repoch));
		atomic_store(&r->prev_ok, true);
	}
	atomic_store(&r->moved, (unsigned)moved);
	atomic_store(&r->repoch, dm_oracle_route_epoch(atomic_load(&r->epoch), own, r->ncn));
	if (!force) {
		char list[8 * DM_MAX_NODES] = "", *p = list;

		atomic_fetch_add(&r->owner_changes, 1);
		for (uint32_t c = 0; c < r->ncn && p < list + sizeof(list) - 12; c++)
			p += sprintf(p, "%s%u", c ? " " : "", own[c]);
		dm_info("cn%u: routing epoch %08x: partition owners [%s] (%d served by a "
			"neighbour)", r->self, atomic_load(&r->repoch), list, moved);
	}
	router_set_limits(r);
}

uint32_t router_route(struct router *r, const float *vec, uint32_t dim, uint32_t *top)
{
	uint32_t s = atomic_load(&r->strategy), target = r->self, k = r->ncn, n;

	*top = r->self;
	pthread_mutex_lock(&r->mu);
	if (!r->o || dim != r->o->dim || s == DM_ROUTE_NONE)
		goto out;
	rank(r, vec, dim);
	n = route_owner_order(r->owner, r->cns, k, r->cand);
	*top = r->cand[0];
	r->want[*top]++;
	if (s == DM_ROUTE_BESTFIT) {
		/* The best partition's owner, or the next one in rank order while it is declared
		 * down (before the owners follow). */
		for (uint32_t i = 0; i < n; i++)
			if (router_cn_ok(r, r->cand[i])) {
				target = r->cand[i];
				break;
			}
		goto out;
	}
	/* Candidates: the owners in rank order, or of the best partition then of its ring
	 * neighbours. */
	if (s == DM_ROUTE_ADAPTIVE_RING) {
		r->ring_seq[0] = r->cns[0];
		memcpy(r->ring_seq + 1, r->spill + (size_t)r->cns[0] * (k - 1), (k - 1) * sizeof(uint32_t));
		n = route_owner_order(r->owner, r->ring_seq, k, r->cand);
	}
	target = r->self;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t c = r->cand[i];

		if (r->hist[c] < r->limit[c] && router_cn_ok(r, c)) {
			target = c;
			break;
		}
	}
	r->hist[target]++;
	if (++r->total >= r->p.batch) {
		if (s != DM_ROUTE_BALANCED) {
			r->batch_done = true;
			pthread_cond_signal(&r->wake);
		}
		router_set_limits(r);
	}
out:
	pthread_mutex_unlock(&r->mu);
	return target;
}

/* The admission band of client-routed queries over the known queues, with this CN's own
 * queue refreshed (caller holds mu). */
static double admit_band(struct router *r)
{
	double sum = 0;
	uint32_t n = 0;

	r->qlen[r->self] = atomic_load(&r->cn->qlen);
	for (uint32_t c = 0; c < r->ncn; c++)
		if (router_cn_ok(r, c)) {
			sum += r->qlen[c];
			n++;
		}
	return ROUTE_ADMIT_BAND * sum / DM_MAX(n, 1u) + ROUTE_ADMIT_ADD;
}

uint32_t router_admit(struct router *r, const float *vec, uint32_t dim, uint32_t epoch,
		      bool client_spilled, uint32_t *top, bool *spilled)
{
	uint32_t s = atomic_load(&r->strategy), target;

	pthread_mutex_lock(&r->mu);
	/* The current routing epoch, or the one before it: a client that has not seen the
	 * switch yet (an oracle epoch rollout, a CN joining or leaving) routed it as this CN
	 * did a moment ago, and running it here beats relaying it. */
	if (r->o && dim == r->o->dim && s != DM_ROUTE_NONE &&
	    (epoch == atomic_load(&r->repoch) ||
	     (atomic_load(&r->prev_ok) && epoch == atomic_load(&r->prev_repoch)))) {
		double band = admit_band(r);

		/* Bestfit follows the oracle alone. */
		if (s == DM_ROUTE_BESTFIT || r->qlen[r->self] <= band) {
			pthread_mutex_unlock(&r->mu);
			atomic_fetch_add(&r->cnt[RC_ADMITTED], 1);
			*top = r->self;   /* not ranked: the client did */
			*spilled = client_spilled;
			return r->self;
		}
		/* Overloaded: the first owner in rank order whose queue is under the band. */
		rank(r, vec, dim);
		uint32_t n = route_owner_order(r->owner, r->cns, r->ncn, r->cand);

		*top = r->cand[0];
		target = r->self;
		for (uint32_t i = 0; i < n; i++) {
			uint32_t c = r->cand[i];

			if (c != r->self && r->qlen[c] <= band && router_cn_ok(r, c)) {
				target = c;
				break;
			}
		}
		pthread_mutex_unlock(&r->mu);
		*spilled = target != *top;
		return target;
	}
	pthread_mutex_unlock(&r->mu);
	/* Another epoch (the client's oracle or owners are stale) or no oracle: route it as
	 * any query. */
	target = router_route(r, vec, dim, top);
	*spilled = *top != target;
	return target;
}

bool router_epoch(struct router *r, uint32_t *epoch, uint32_t *strategy)
{
	*strategy = r ? atomic_load(&r->strategy) : DM_ROUTE_NONE;
	if (!router_active(r))
		return false;
	*epoch = atomic_load(&r->repoch);
	return true;
}

int router_export(struct router *r, struct dm_wire_q_router *h, uint8_t *buf, size_t cap)
{
	long n;

	if (!r || !atomic_load(&r->ready))
		return -EAGAIN;   /* no oracle yet */
	pthread_mutex_lock(&r->mu);
	*h = (struct dm_wire_q_router){ .epoch = atomic_load(&r->repoch),
					.strategy = atomic_load(&r->strategy),
					.batch = r->p.batch, .ncn = r->ncn, .self = r->self,
					.metric = r->metric, .centroid_hash = r->hash };
	n = !r->owire ? -ENOMEM : 4 * (size_t)r->ncn + r->owire_len > cap ? -E2BIG :
		(long)(4 * (size_t)r->ncn + r->owire_len);
	if (n > 0) {
		for (uint32_t p = 0; p < r->ncn; p++)
			dm_put_le32(buf + 4 * (size_t)p, r->owner[p]);
		memcpy(buf + 4 * (size_t)r->ncn, r->owire, r->owire_len);
	}
	pthread_mutex_unlock(&r->mu);
	return (int)n;
}

void router_partitions(struct router *r, uint32_t *route_epoch, uint32_t *moved,
		       uint64_t *changes, uint32_t *owner)
{
	*route_epoch = r ? atomic_load(&r->repoch) : 0;
	*moved = r ? atomic_load(&r->moved) : 0;
	*changes = r ? atomic_load(&r->owner_changes) : 0;
	if (r && owner) {
		pthread_mutex_lock(&r->mu);
		memcpy(owner, r->owner, r->ncn * sizeof(*owner));
		pthread_mutex_unlock(&r->mu);
	}
}

uint64_t router_csp_truncated(struct router *r)
{
	return r ? atomic_load(&r->csp_truncated) : 0;
}

void router_oracle_sources(struct router *r, uint64_t *fitted, uint64_t *warm,
			   uint64_t *taken)
{
	*fitted = r ? atomic_load(&r->fits_here) : 0;
	*warm = r ? atomic_load(&r->fits_warm) : 0;
	*taken = r ? atomic_load(&r->fits_taken) : 0;
}

bool router_mass(struct router *r, double *ratio, double *base, uint32_t *epoch,
		 uint64_t *passes)
{
	*passes = r ? atomic_load(&r->mass_passes) : 0;
	*epoch = r ? atomic_load(&r->mass_measured) : 0;
	*ratio = r ? atomic_load(&r->mass_ppm) / 1e6 : 0;
	*base = r ? atomic_load(&r->mass_base_ppm) / 1e6 : 0;
	return *passes > 0;
}

bool router_spill_cache(struct router *r)
{
	return !r || atomic_load(&r->spill_cache);
}

bool router_active(struct router *r)
{
	return r && r->ncn > 1 && atomic_load(&r->strategy) != DM_ROUTE_NONE &&
	       atomic_load(&r->ready);
}

bool router_paused(struct router *r)
{
	bool p = atomic_load(&r->cn->qlen) > r->p.pause;

	if (p != atomic_load(&r->paused) && atomic_exchange(&r->paused, p) != p && p)
		atomic_fetch_add(&r->pauses, 1);
	return p;
}

void router_count(struct router *r, enum router_counter c)
{
	if (r)
		atomic_fetch_add(&r->cnt[c], 1);
}

int router_config(struct router *r, const struct dm_wire_fwd_rcfg *c,
		  struct dm_wire_fwd_rstats *st)
{
	uint32_t csp;

	if (c->refresh) {
		/* dmann route refresh: move to oracle epoch c->refresh, at most one past the
		 * highest epoch known here (an operator asks for the next one, not any one). */
		uint32_t known = DM_MAX(DM_MAX(atomic_load(&r->epoch), atomic_load(&r->want_epoch)),
					atomic_load(&r->seen_epoch));

		if (c->refresh > known + 1 || known == UINT32_MAX)
			return -ERANGE;
		if (c->refresh > atomic_load(&r->epoch)) {
			uint32_t w = atomic_load(&r->want_epoch);

			while (w < c->refresh &&
			       !atomic_compare_exchange_weak(&r->want_epoch, &w, c->refresh))
				;
			dm_info("cn%u: oracle epoch %u asked for (now %u)", r->self, c->refresh,
				atomic_load(&r->epoch));
			pthread_mutex_lock(&r->mu);
			r->batch_done = true;   /* tell the others now, not at the next period */
			pthread_cond_signal(&r->wake);
			pthread_mutex_unlock(&r->mu);
		}
	}
	if (c->set) {
		pthread_mutex_lock(&r->mu);
		atomic_store(&r->strategy, c->strategy);
		if (c->batch)
			r->p.batch = c->batch;
		if (c->pause)
			r->p.pause = c->pause;
		if (c->spill_cache)
			atomic_store(&r->spill_cache, c->spill_cache == DM_FWD_SPILL_YES);
		router_reset_demand(r);
		router_set_limits(r);
		pthread_mutex_unlock(&r->mu);
		for (int i = 0; i < RC_COUNT; i++)
			atomic_store(&r->cnt[i], 0);
		atomic_store(&r->pauses, 0);
		dm_info("cn%u: routing %s, batch %u, pause at %u queued, spilled queries %s the "
			"cache", r->self, dm_route_name(c->strategy), r->p.batch, r->p.pause,
			atomic_load(&r->spill_cache) ? "fill" : "do not fill");
	}
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&r->mu);
	st->strategy = atomic_load(&r->strategy);
	st->k = r->o ? r->o->k : 0;
	st->batch = r->p.batch;
	st->pause = r->p.pause;
	st->centroid_hash = r->o ? r->hash : 0;
	st->sample_level = r->sample_level;
	pthread_mutex_unlock(&r->mu);
	st->local = atomic_load(&r->cnt[RC_LOCAL]);
	st->forwarded = atomic_load(&r->cnt[RC_FORWARDED]);
	st->received = atomic_load(&r->cnt[RC_RECEIVED]);
	st->bounced = atomic_load(&r->cnt[RC_BOUNCED]);
	st->admitted = atomic_load(&r->cnt[RC_ADMITTED]);
	csp = atomic_load(&r->csp_ppm);
	st->csp_ppm = csp;
	st->csp_cns = atomic_load(&r->csp_cns);
	st->csp_age_ms = csp == DM_FWD_CSP_NONE ? 0 :
		(dm_now_ns() - atomic_load(&r->csp_t_ns)) / 1000000;
	st->epoch = atomic_load(&r->epoch);
	st->route_epoch = atomic_load(&r->repoch);
	st->reclusters = atomic_load(&r->reclusters);
	st->next_epoch = DM_MAX(st->epoch, atomic_load(&r->next_epoch));
	st->rollout = atomic_load(&r->rollout);
	if (st->next_epoch == st->epoch)
		st->rollout = DM_FWD_ROLLOUT_IDLE;
	st->qlen = atomic_load(&r->cn->qlen);
	st->paused = atomic_load(&r->pauses);
	st->spill_cache = atomic_load(&r->spill_cache);
	return 0;
}

/* ---- connections to the memory nodes ------------------------------------------------------ */

/* Connect to memory node m and announce role; for SERVE, hand the connection to a worker
 * thread in forwarding mode. */
static int open_fwd_conn(struct router *r, uint32_t m, uint32_t role, struct dm_conn **out)
{
	struct cn *cn = r->cn;
	struct dm_wire_fwd_hello h = { .cn = r->self, .role = role };
	uint8_t body[sizeof(h)];
	struct dm_rpc_chan ch;
	struct dm_conn *c;
	int rc;

	rc = dm_xport_connect(cn->x, cn->cfg->mn[m].address, 2000, &c);
	if (rc)
		return rc;
	rc = dm_rpc_chan_init(&ch, c, cn->pool, 256, 2000);
	if (rc)
		goto err_close;
	dm_wire_fwd_hello_encode(body, &h);
	rc = dm_rpc_send(&ch, DM_OP_FWD_HELLO, 0, 0, body, sizeof(body));
	dm_rpc_chan_fini(&ch);
	if (rc)
		goto err_close;
	*out = c;
	return 0;
err_close:
	dm_conn_close(c);
	return rc;
}

static void ensure_conns(struct router *r)
{
	struct cn *cn = r->cn;

	for (uint32_t m = 0; m < cn->cfg->n_mn; m++) {
		/* Connecting can take seconds when a memory node is gone: stop promptly. */
		if (atomic_load(&r->stop) || atomic_load(&cn->stopping))
			return;
		if (!r->oc[m]) {
			if (open_fwd_conn(r, m, DM_FWD_ROLE_ORIGIN, &r->oc[m]) == 0 &&
			    dm_rpc_chan_init(&r->och[m], r->oc[m], cn->pool,
					     (uint32_t)(DM_WIRE_HDR_LEN + sizeof(struct dm_wire_fwd_state) +
							4 * DM_FWD_MAX_SAMPLE), 3000)) {
				dm_conn_close(r->oc[m]);
				r->oc[m] = NULL;
			}
		}
		if (r->ncn > 1 && !atomic_load(&r->serve_alive[m])) {
			struct cn_worker_arg *a = malloc(sizeof(*a));
			struct dm_conn *c;
			pthread_t t;

			if (!a)
				continue;
			if (open_fwd_conn(r, m, DM_FWD_ROLE_SERVE, &c)) {
				free(a);
				continue;
			}
			*a = (struct cn_worker_arg){ .cn = cn, .client = c, .serve = true,
						     .alive = &r->serve_alive[m] };
			atomic_store(&r->serve_alive[m], true);
			if (pthread_create(&t, NULL, cn_worker, a)) {
				atomic_store(&r->serve_alive[m], false);
				dm_conn_close(c);
				free(a);
				continue;
			}
			pthread_detach(t);
		}
	}
}

static void close_oc(struct router *r, uint32_t m)
{
	if (!r->oc[m])
		return;
	dm_rpc_chan_fini(&r->och[m]);
	dm_conn_close(r->oc[m]);
	r->oc[m] = NULL;
}

struct sample_ctx {
	uint32_t *ids;
	uint32_t n, cap;
	unsigned shift;     /* the 1/2^shift slice ([router] csp_slice) */
	uint64_t over;      /* ids of the slice left out: more than cap */
};

static void sample_id(void *arg, uint32_t id)
{
	struct sample_ctx *s = arg;

	if (!dm_csp_in_slice(id, s->shift))
		return;
	if (s->n < s->cap)
		s->ids[s->n++] = id;
	else
		s->over++;
}

/* Report our queue length, epochs (and, with_sample, our cache sample) to every memory node
 * and take in what they know of the other CNs, then take the next step of an epoch rollout.
 * Never waits for another CN: a memory node answers at once from its table. Returns
 * whether to report again soon (a rollout waits for the others). */
static bool exchange(struct router *r, bool with_sample)
{
	struct cn *cn = r->cn;
	struct dm_wire_fwd_state s = { .cn = r->self, .epoch = atomic_load(&r->epoch),
				       .entries = DM_FWD_NO_SAMPLE };
	uint32_t ids[DM_FWD_MAX_SAMPLE];
	uint8_t *msg = malloc(sizeof(s) + sizeof(ids));
	uint8_t resp[sizeof(struct dm_wire_fwd_table) + DM_MAX_NODES * sizeof(struct dm_wire_fwd_entry)];
	struct sample_ctx sc = { .ids = ids, .cap = DM_FWD_MAX_SAMPLE,
				 .shift = (unsigned)__builtin_ctz(r->p.csp_slice) };
	uint32_t best_age[DM_MAX_NODES];
	struct dm_rollout_cn rep[DM_MAX_NODES];
	bool csp_set = false;

	if (!msg)
		return false;
	memset(rep, 0, sizeof(rep));
	if (with_sample) {
		struct dm_cache_stats cs = { 0 };

		pthread_rwlock_rdlock(&cn->lock);
		if (cn->cache) {
			dm_cache_for_each(cn->cache, sample_id, &sc);
			dm_cache_stats(cn->cache, &cs);
		}
		pthread_rwlock_unlock(&cn->lock);
		s.entries = cs.entries;
		if (sc.over) {
			/* The estimate then misses duplicates among the ids left out: say so once */
			if (atomic_fetch_add(&r->csp_truncated, 1) == 0)
				dm_warn("cn%u: the CSP sample holds %llu ids of the 1/%u slice, over "
					"the %u a report carries: the estimate is low (a larger "
					"[router] csp_slice samples fewer)", r->self,
					(unsigned long long)(sc.n + sc.over), r->p.csp_slice,
					DM_FWD_MAX_SAMPLE);
		}
	}
	s.qlen = atomic_load(&cn->qlen);
	s.next = DM_MAX(s.epoch, atomic_load(&r->next_epoch));
	s.flags = (atomic_load(&r->ready) ? DM_FWD_S_READY : 0) |
		  (s.next > s.epoch && atomic_load(&r->rollout) == DM_FWD_ROLLOUT_PREPARED ?
			   DM_FWD_S_PREPARED : 0) |
		  (s.next > s.epoch && atomic_load(&r->reseed_epoch) == s.next ? DM_FWD_S_RESEED : 0);
	s.nsample = sc.n;
	s.seq = ++r->seq;
	dm_wire_fwd_state_encode(msg, &s);
	for (uint32_t i = 0; i < sc.n; i++)
		dm_put_le32(msg + sizeof(s) + 4 * (size_t)i, ids[i]);
	for (uint32_t c = 0; c < DM_MAX_NODES; c++)
		best_age[c] = UINT32_MAX;
	for (uint32_t m = 0; m < cn->cfg->n_mn; m++) {
		struct dm_wire_fwd_table t;
		uint32_t rlen = 0;
		int rc;

		if (!r->oc[m] || atomic_load(&r->stop))
			continue;
		rc = dm_rpc_call(&r->och[m], DM_OP_FWD_STATE, msg,
				 (uint32_t)(sizeof(s) + 4 * (size_t)sc.n), resp, sizeof(resp), &rlen);
		if (rc == 0)
			rc = dm_wire_fwd_table_decode(resp, rlen, &t);
		if (rc == 0 && rlen != sizeof(t) + sizeof(struct dm_wire_fwd_entry) * (size_t)t.n)
			rc = -EBADMSG;
		if (rc) {
			if (rc != -ETIMEDOUT)
				close_oc(r, m);
			continue;
		}
		if (t.epoch > atomic_load(&r->seen_epoch))
			atomic_store(&r->seen_epoch, t.epoch);
		pthread_mutex_lock(&r->mu);
		for (uint32_t i = 0; i < t.n; i++) {
			struct dm_wire_fwd_entry e;

			if (dm_wire_fwd_entry_decode(resp + sizeof(t) + sizeof(e) * (size_t)i,
						     sizeof(e), &e))
				continue;
			/* Several memory nodes: keep the freshest report of each CN. */
			if (e.cn < r->ncn && e.age_ms < best_age[e.cn]) {
				best_age[e.cn] = e.age_ms;
				rep[e.cn] = (struct dm_rollout_cn){
					.valid = true, .ready = e.flags & DM_FWD_S_READY,
					.prepared = e.flags & DM_FWD_S_PREPARED,
					.reseed = e.flags & DM_FWD_S_RESEED, .epoch = e.epoch,
					.next = e.next, .age_ms = e.age_ms };
				if (e.cn != r->self)
					r->qlen[e.cn] = e.qlen;
			}
		}
		pthread_mutex_unlock(&r->mu);
		if (with_sample && !csp_set && t.csp_ppm != DM_FWD_CSP_NONE &&
		    t.csp_cns >= DM_MIN(r->ncn, 2u)) {
			/* Every CN reports to every memory node: the first answer will do. */
			atomic_store(&r->csp_ppm, t.csp_ppm);
			atomic_store(&r->csp_cns, t.csp_cns);
			atomic_store(&r->csp_t_ns, dm_now_ns());
			csp_set = true;
		}
	}
	free(msg);
	/* Re-clustering: a CN that saw the CSP high for long enough asks for the next epoch;
	 * the others follow the highest epoch reported (router_rollout_step). */
	if (csp_set && r->p.recluster_secs && r->ncn > 1 &&
	    atomic_load(&r->strategy) != DM_ROUTE_NONE) {
		uint64_t now = dm_now_ns();

		if (atomic_load(&r->csp_ppm) > r->p.recluster_csp * 1e6) {
			if (!r->csp_high_since)
				r->csp_high_since = now;
			else if (now - r->csp_high_since >= r->p.recluster_secs * 1000000000ull &&
				 atomic_load(&r->want_epoch) <= atomic_load(&r->epoch)) {
				dm_info("cn%u: re-clustering: CSP above %.2f for %u s (epoch %u -> %u)",
					r->self, r->p.recluster_csp, r->p.recluster_secs,
					atomic_load(&r->epoch), atomic_load(&r->epoch) + 1);
				atomic_store(&r->reseed_epoch, atomic_load(&r->epoch) + 1);
				atomic_store(&r->want_epoch, atomic_load(&r->epoch) + 1);
			}
		} else {
			r->csp_high_since = 0;
		}
	}
	return router_rollout_step(r, rep);
}

#define MASS_CHUNK 256                 /* sample vectors per turn of the router loop */
#define MASS_PERIOD_NS 5000000000ull   /* a pass starts at most every 5 s */

/* One step of the mass-drift pass (router thread; issue 15's "mass imbalance" drift): count
 * up to MASS_CHUNK vectors of the current index's upper-level sample (the level the oracle
 * was fitted on, its stored vectors: no READ) by the partition the current oracle puts them
 * in. At the end of a pass: the ratio (dm_rollout_mass_ratio) as a metric; the epoch's
 * first pass is its base (what the fit left: a fit cannot always cut the sample evenly,
 * and fitting again on the same sample would not change that); a re-clustering (the next
 * epoch) when the ratio has stayed above base + recluster_mass for recluster_secs while
 * routing is on: inserts that went to a few partitions. Bounded work per turn: the chunk
 * holds the index's read locks for about a millisecond. */
static void mass_step(struct router *r)
{
	struct cn *cn = r->cn;
	uint32_t epoch = atomic_load(&r->epoch), lv = r->sample_level, k = r->ncn, id, done = 0;
	uint64_t now = dm_now_ns();

	if (r->p.recluster_mass <= 0 || !r->p.recluster_secs || k < 2 || !r->mass_count ||
	    !atomic_load(&r->ready) || !r->o || lv == 0)
		return;   /* a level-0 sample would have to be READ: no mass pass */
	/* Not while a rollout prepares the next epoch, nor in the first MASS_PERIOD_NS of a
	 * new one: the pass is background work on the router thread (a chunk is about a
	 * millisecond of CPU, and the loop turns every ROLLOUT_POLL_MS while a rollout
	 * waits), and a switch is when the queries can least afford it. */
	if (r->prep)
		return;
	if (epoch != r->mass_epoch) {   /* a new oracle: start over, a period after it */
		memset(r->mass_count, 0, k * sizeof(*r->mass_count));
		r->mass_next = 0;
		r->mass_epoch = epoch;
		r->mass_high_since = 0;
		r->mass_pass_ns = now;
		atomic_store(&r->mass_base_ppm, 0);
		return;
	}
	if (r->mass_next == 0 && r->mass_pass_ns && now - r->mass_pass_ns < MASS_PERIOD_NS)
		return;
	pthread_rwlock_rdlock(&cn->lock);
	const struct dindex *d = cn->views[0].cur;

	if (!d || d->p.dim != r->o->dim) {
		pthread_rwlock_unlock(&cn->lock);
		return;
	}
	if (d->meta_crc != r->mass_crc) {   /* another index: start over */
		memset(r->mass_count, 0, k * sizeof(*r->mass_count));
		r->mass_next = 0;
		r->mass_crc = d->meta_crc;
	}
	if (r->mass_dim != d->p.dim) {
		float *v = realloc(r->mass_v, d->p.dim * sizeof(float));

		if (!v) {
			pthread_rwlock_unlock(&cn->lock);
			return;
		}
		r->mass_v = v;
		r->mass_dim = d->p.dim;
	}
	pthread_rwlock_rdlock((pthread_rwlock_t *)&d->up_lock);   /* online upper levels */
	for (id = r->mass_next; id < d->cap && done < MASS_CHUNK; id++) {   /* online ids too */
		if (dindex_level(d, id) < lv || !d->uvec[id])
			continue;
		dindex_stored_vector(d, d->uvec[id], r->mass_v);
		done++;
		if (r->metric == DM_METRIC_COS && dm_normalize(r->mass_v, r->mass_dim))
			continue;
		uint32_t p = dm_oracle_best(r->o, r->mass_v);

		if (p < k)
			r->mass_count[p]++;
	}
	bool end = id >= d->cap;

	pthread_rwlock_unlock((pthread_rwlock_t *)&d->up_lock);
	pthread_rwlock_unlock(&cn->lock);
	r->mass_next = end ? 0 : id;
	if (!end)
		return;
	double ratio = dm_rollout_mass_ratio(r->mass_count, k);

	memset(r->mass_count, 0, k * sizeof(*r->mass_count));
	r->mass_pass_ns = now;
	atomic_store(&r->mass_ppm, (unsigned long)(ratio * 1e6));
	if (!atomic_load(&r->mass_base_ppm))
		atomic_store(&r->mass_base_ppm, (unsigned long)(ratio * 1e6));
	atomic_fetch_add(&r->mass_passes, 1);
	atomic_store(&r->mass_measured, epoch);
	double base = atomic_load(&r->mass_base_ppm) / 1e6;

	if (atomic_load(&r->strategy) == DM_ROUTE_NONE || ratio <= base + r->p.recluster_mass) {
		r->mass_high_since = 0;
		return;
	}
	if (!r->mass_high_since) {
		r->mass_high_since = now;
	} else if (now - r->mass_high_since >= r->p.recluster_secs * 1000000000ull &&
		   atomic_load(&r->want_epoch) <= epoch) {
		dm_info("cn%u: re-clustering: the largest partition holds %.3fx its share of the "
			"sample, %.3fx after the fit (drift above %.3f) for %u s (epoch %u -> %u)",
			r->self, ratio, base, r->p.recluster_mass, r->p.recluster_secs, epoch,
			epoch + 1);
		atomic_store(&r->want_epoch, epoch + 1);
		r->mass_high_since = 0;
	}
}

static void *router_thread(void *arg)
{
	struct router *r = arg;
	struct cn *cn = r->cn;
	uint32_t built_crc = 0;
	bool built = false;
	uint64_t last_csp = 0, last_look = 0;
	unsigned long seen_state = 0;
	bool asked = false, soon = false;

	while (!atomic_load(&r->stop) && !atomic_load(&cn->stopping)) {
		struct timespec ts;
		bool batch;
		uint32_t crc;

		ensure_conns(r);
		pthread_rwlock_rdlock(&cn->lock);
		crc = cn->views[0].cur ? cn->views[0].cur->meta_crc : 0;
		pthread_rwlock_unlock(&cn->lock);
		/* No index yet: look for one now and then (a `dmann load` after the start), so
		 * that the oracle exists before the first query. */
		if (!crc && dm_now_ns() - last_look >= 1000000000ull) {
			last_look = dm_now_ns();
			if (cn_refresh(cn, false) == 0) {
				pthread_rwlock_rdlock(&cn->lock);
				crc = cn->views[0].cur ? cn->views[0].cur->meta_crc : 0;
				pthread_rwlock_unlock(&cn->lock);
			}
		}
		/* The first oracle is of the epoch the others run: ask the memory nodes first. */
		if (crc && !built && !asked) {
			exchange(r, false);
			asked = true;
		}
		if (crc && (!built || crc != built_crc)) {
			uint32_t e = DM_MAX(atomic_load(&r->epoch), built ? 0 : r->cluster_epoch);

			built = router_build_oracle(r, e) == 0;
			built_crc = crc;
		}
		/* CNs the cluster state declares down or up again: new owners, new epoch (only
		 * when a new up-set arrived: cn_state_apply counts them). */
		unsigned long sc = atomic_load(&cn->state_changes);

		if (sc != seen_state) {
			pthread_mutex_lock(&r->mu);
			if (r->o)
				router_set_owners(r, false);
			pthread_mutex_unlock(&r->mu);
			seen_state = sc;
		}
		mass_step(r);
		if (dm_now_ns() - last_csp >= CSP_PERIOD_NS) {
			soon = exchange(r, true);
			last_csp = dm_now_ns();
		} else {
			soon = exchange(r, false);
		}
		/* Sleep until a batch ends or the exchange period passes (a short one while a
		 * rollout waits for the others: they switch within one of each other's). */
		uint32_t period = soon ? DM_MIN(ROLLOUT_POLL_MS, r->p.exchange_ms) : r->p.exchange_ms;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += (long)(period % 1000) * 1000000;
		ts.tv_sec += period / 1000 + ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		pthread_mutex_lock(&r->mu);
		if (!r->batch_done)
			pthread_cond_timedwait(&r->wake, &r->mu, &ts);
		batch = r->batch_done;
		r->batch_done = false;
		pthread_mutex_unlock(&r->mu);
		(void)batch;
	}
	router_prepare_drop(r);   /* waits for a fit in progress */
	for (uint32_t m = 0; m < cn->cfg->n_mn; m++)
		close_oc(r, m);
	return NULL;
}

struct router *router_start(struct cn *cn, const struct router_params *p)
{
	struct router *r = calloc(1, sizeof(*r));
	uint32_t k = cn->cfg->n_cn;

	if (!r)
		return NULL;
	r->cn = cn;
	r->p = *p;
	if (!r->p.csp_slice || r->p.csp_slice > 64 || (r->p.csp_slice & (r->p.csp_slice - 1)))
		r->p.csp_slice = 64;
	r->self = cn->node->id;
	r->ncn = k;
	atomic_store(&r->strategy, p->strategy);
	atomic_store(&r->spill_cache, p->spill_cache);
	atomic_store(&r->csp_ppm, DM_FWD_CSP_NONE);
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->wake, NULL);
	r->hist = calloc(k, sizeof(uint32_t));
	r->want = calloc(k, sizeof(uint32_t));
	r->demand = calloc(k, sizeof(double));
	r->limit = calloc(k, sizeof(uint32_t));
	r->qlen = calloc(k, sizeof(uint32_t));
	r->cns = calloc(k, sizeof(uint32_t));
	r->owner = calloc(k, sizeof(uint32_t));
	r->cand = calloc(k, sizeof(uint32_t));
	r->ring_seq = calloc(k, sizeof(uint32_t));
	r->mass_count = calloc(k, sizeof(uint64_t));
	if (!r->hist || !r->want || !r->demand || !r->limit || !r->qlen || !r->cns || !r->owner ||
	    !r->cand || !r->ring_seq || !r->mass_count)
		goto err_free;
	for (uint32_t p = 0; p < k; p++)
		r->owner[p] = p;
	router_reset_demand(r);
	router_set_limits(r);
	if (pthread_create(&r->thread, NULL, router_thread, r))
		goto err_free;
	return r;
err_free:
	free(r->hist);
	free(r->want);
	free(r->demand);
	free(r->limit);
	free(r->qlen);
	free(r->cns);
	free(r->owner);
	free(r->cand);
	free(r->ring_seq);
	free(r->mass_count);
	free(r);
	errno = ENOMEM;
	return NULL;
}

void router_stop(struct router *r)
{
	if (!r || r->joined)
		return;
	atomic_store(&r->stop, true);
	pthread_mutex_lock(&r->mu);
	pthread_cond_signal(&r->wake);
	pthread_mutex_unlock(&r->mu);
	pthread_join(r->thread, NULL);
	r->joined = true;
}

void router_free(struct router *r)
{
	if (!r)
		return;
	router_stop(r);
	/* SERVE workers leave on cn->stopping; the caller waited for every worker. */
#if DM_HAVE_ETCD
	router_etcd_close(r->etcd);   /* both threads were joined by router_stop */
	router_etcd_close(r->etcd_first);
#endif
	dm_oracle_free(r->o);
	free(r->spill);
	free(r->qv);
	free(r->owire);
	free(r->hist);
	free(r->want);
	free(r->demand);
	free(r->limit);
	free(r->qlen);
	free(r->cns);
	free(r->owner);
	free(r->cand);
	free(r->ring_seq);
	free(r->mass_count);
	free(r->mass_v);
	pthread_cond_destroy(&r->wake);
	pthread_mutex_destroy(&r->mu);
	free(r);
}
