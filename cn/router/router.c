/* router.c: oracle construction, routing decisions, SERVE connections and the state exchange
 * of a compute node (see router.h). */
#include "router.h"
#include "util/dm_hash.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cn.h"
#include "oracle.h"
#include "rollout.h"
#include "route_limits.h"
#include "vhash.h"
#if DM_HAVE_ETCD
#include "router_etcd.h"
#endif

#define READ_CHUNK 128          /* records per READ batch while sampling */
#define CSP_PERIOD_NS 500000000ull

struct router {
	struct cn *cn;
	struct router_params p;
	uint32_t self, ncn;
	pthread_t thread;
	atomic_bool stop;
	bool joined;

	/* Routing state: everything below, under mu. */
	pthread_mutex_t mu;
	pthread_cond_t wake;         /* a batch ended: exchange now */
	bool batch_done;
	struct dm_oracle *o;
	uint32_t *spill;             /* ncn x (ncn-1): ring spill order of each partition */
	/* Partition p (the oracle's group p, CN p's own) is served by owner[p]: p while the
	 * cluster state has it up, else a ring neighbour (dm_oracle_owners). A query's
	 * candidates are the owners of its partitions in rank (or ring) order; limits,
	 * demand and the batch histogram count CNs, over the live ones. */
	uint32_t *owner;
	uint32_t *cand, *ring_seq;   /* scratch: candidate CNs, partitions in ring order */
	uint64_t hash;
	uint32_t crc;                /* the index the oracle was fitted on (meta_crc) */
	uint32_t sample_level;
	uint32_t *hist, *limit, total;
	uint32_t *want;              /* queries of this batch whose top-ranked CN is c */
	double *demand;              /* smoothed share of queries whose top-ranked CN is c */
	uint32_t *qlen;              /* last known queue length of each CN */
	uint32_t *cns;               /* scratch for ranks */
	float *qv;                   /* scratch for a normalised query */
	uint32_t metric;             /* the index's (cosine: queries ranked normalised) */
	uint8_t *owire;              /* the oracle's wire form (Q_ROUTER), owire_len bytes */
	size_t owire_len;
	atomic_uint strategy;
	atomic_bool ready;           /* an oracle exists */
	atomic_bool spill_cache;     /* spilled queries fill the cache */
	atomic_bool paused;          /* routing is paused now */
	atomic_ulong pauses;         /* times routing paused */

	/* Counters and the CSP estimate. */
	atomic_ulong cnt[RC_COUNT];
	atomic_uint csp_ppm, csp_cns, epoch, reclusters;
	atomic_uint repoch;          /* routing epoch (dm_oracle_route_epoch of epoch, owner) */
	atomic_uint moved;           /* partitions served by another CN than their own */
	atomic_ulong owner_changes;  /* times the owner table changed */
	atomic_ulong csp_t_ns;
	/* Oracle epochs: the highest one asked for here (dmann route refresh, re-clustering)
	 * and the highest one the memory nodes reported. */
	atomic_uint want_epoch, seen_epoch;
	/* The epoch the CSP re-clustering asked for here (0: none): fitted from a new seed,
	 * reported with DM_FWD_S_RESEED (a warm fit would give the same partitions back). */
	atomic_uint reseed_epoch;
	/* The two-phase rollout (oracle/rollout.h; router thread, except the atomics): the
	 * oracle of a later epoch being fitted by the prepare thread or fitted (prep_done),
	 * installed once every live CN has it. */
	struct oracle_build *prep;
	pthread_t prep_thread;
	bool prep_running;            /* prep_thread to join */
	atomic_bool prep_done;
	uint64_t prep_retry_ns;       /* a failed prepare: not again before */
	atomic_uint next_epoch;       /* the epoch rolled out (= epoch when none) */
	/* With [cluster] etcd, one CN fits a rollout's oracle and the others take it from
	 * etcd (router_etcd.h): the prepare thread's handle and the router thread's (a first
	 * oracle), each opened on first use (a handle is one thread's at a time). */
	struct router_etcd *etcd, *etcd_first;
	atomic_ulong fits_here;       /* rollout oracles fitted here */
	atomic_ulong fits_warm;       /* of those, started from the current epoch's centroids */
	atomic_ulong fits_taken;      /* rollout oracles taken from etcd */
	atomic_uint rollout;          /* DM_FWD_ROLLOUT_* */
	uint32_t cluster_epoch;       /* the epoch the others route with (the first oracle's) */
	/* The routing epoch before the current one: client-routed queries of it are admitted
	 * too (the clients that have not seen the switch yet). */
	atomic_uint prev_repoch;
	atomic_bool prev_ok;

	/* Router thread's connections (ORIGIN role, state reports) and SERVE workers. */
	struct dm_conn *oc[DM_MAX_NODES];
	struct dm_rpc_chan och[DM_MAX_NODES];
	atomic_bool serve_alive[DM_MAX_NODES];
	uint64_t seq;
	uint64_t csp_high_since;
	/* Mass drift (router thread, mass_step; the atomics are read by router_mass): one pass
	 * over the upper-level sample in chunks, counting the vectors the current oracle puts
	 * in each partition. */
	uint64_t *mass_count;        /* per partition, in this pass */
	float *mass_v;               /* one decoded vector */
	uint32_t mass_dim;
	uint32_t mass_next;          /* node id the pass goes on from (0: none in progress) */
	uint32_t mass_epoch;         /* the oracle epoch the pass counts for ... */
	uint32_t mass_crc;           /* ... and the index (meta_crc) */
	uint64_t mass_pass_ns;       /* when the last pass ended */
	uint64_t mass_high_since;
	atomic_ulong mass_ppm, mass_base_ppm, mass_passes;   /* base: the epoch's first pass */
	atomic_ulong csp_truncated;   /* reports whose cache sample was cut at DM_FWD_MAX_SAMPLE */
	atomic_uint mass_measured;   /* the oracle epoch of the last pass */
};

/* ---- oracle ------------------------------------------------------------------------------ */

static uint64_t oracle_hash(const struct dm_oracle *o)
{
	uint64_t h = DM_FNV64_INIT;

	h = dm_fnv1a64(h, o->fine, (size_t)o->nfine * o->dim * sizeof(float));
	h = dm_fnv1a64(h, o->fine_group, o->nfine * sizeof(uint32_t));
	h = dm_fnv1a64(h, o->bias, o->nfine * sizeof(float));
	h = dm_fnv1a64(h, o->centroids, (size_t)o->k * o->dim * sizeof(float));
	return h;
}

static uint32_t node_level(const struct dindex *d, uint32_t id)
{
	return dindex_level(d, id);
}

/* READ the records of ids[0..n) from the memory nodes (over the router's connections) and
 * copy their vectors into out (n x dim). 0 or -errno. */
static int read_vectors(struct router *r, const struct dindex *d, const uint32_t *ids,
			uint32_t n, float *out)
{
	struct cn *cn = r->cn;
	size_t rs = d->rec_size;
	uint8_t *buf = aligned_alloc(64, DM_ALIGN_UP(READ_CHUNK * rs, 64));
	struct dm_mr *mr = NULL;
	int rc = -ENOMEM;

	if (!buf)
		return rc;
	rc = dm_xport_reg(cn->x, buf, READ_CHUNK * rs, 0, &mr);
	if (rc)
		goto out_free;
	for (uint32_t i = 0; i < n; i += READ_CHUNK) {
		uint32_t cnt = DM_MIN(READ_CHUNK, n - i);

		/* One READ batch per memory node, waited for before the next. */
		for (uint32_t m = 0; m < cn->cfg->n_mn; m++) {
			struct dm_rdma_wr wr[READ_CHUNK];
			int nw = 0;

			for (uint32_t j = 0; j < cnt; j++) {
				uint32_t mn, rkey;
				uint64_t addr;

				dindex_locate(d, cn->mns, ids[i + j], &mn, &addr, &rkey);
				if (mn != m)
					continue;
				wr[nw++] = (struct dm_rdma_wr){ .wr_id = j, .local = buf + j * rs,
					.mr = mr, .remote = addr, .rkey = rkey, .len = (uint32_t)rs };
			}
			if (!nw)
				continue;
			if (!r->oc[m]) {
				rc = -EHOSTDOWN;
				goto out_dereg;
			}
			wr[nw - 1].flags = DM_WR_SIGNALED;
			wr[nw - 1].wr_id |= 1ull << 40;
			rc = dm_conn_read_batch(r->oc[m], wr, nw);
			while (rc == 0) {
				struct dm_wc wc;
				int w = dm_conn_wait(r->oc[m], &wc, 1, 10000);

				if (w <= 0) {
					rc = w ? w : -ETIMEDOUT;
				} else if (wc.status) {
					rc = wc.status;
				} else if (wc.opcode == DM_WC_RECV) {
					dm_msgpool_repost(cn->pool, wc.wr_id);
				} else if (wc.opcode == DM_WC_READ && (wc.wr_id >> 40)) {
					break;
				}
			}
			if (rc)
				goto out_dereg;
		}
		for (uint32_t j = 0; j < cnt; j++) {
			const struct hnsw_rec_hdr *h = (const void *)(buf + j * rs);

			if (!dindex_rec_ok(d, h)) {
				rc = -EIO;
				goto out_dereg;
			}
			dindex_rec_vector(d, h, out + (size_t)(i + j) * d->p.dim);
		}
	}
	rc = 0;
out_dereg:
	dm_xport_dereg(cn->x, mr);
out_free:
	free(buf);
	return rc;
}

static void reset_demand(struct router *r);
static void set_limits(struct router *r);
static void set_owners(struct router *r, bool force);
static bool cn_ok(const struct router *r, uint32_t c);

/* One oracle being built: the sample (read by the router thread), then the fit (on the
 * router thread, or on the prepare thread of a rollout), then installed. */
struct oracle_build {
	uint32_t epoch, crc, ncn, regions, dim, metric, n;
	uint32_t duty;               /* percent of a CPU the fit may take (fit_pace) */
	uint64_t cpu_mark_ns;        /* the fitting thread's CPU time at its last pause */
	int lv;
	bool keyrange;
	float *sample;               /* n x dim, normalised for cosine (sample_finish) */
	float *raw;                  /* until sample_finish: n x vdim stored vectors */
	uint32_t vdim;               /* their width */
	struct hnsw_quant *quant;    /* NULL, or a copy of the index's quantizer: raw is rotated */
	float *init;                 /* NULL, or the current epoch's centroids to start from */
	uint32_t *prev_cn;           /* key ranges, with init: each region's current CN */
	/* the fit */
	int rc;
	struct dm_oracle *o;
	uint32_t *spill;             /* ncn x (ncn-1) */
	uint8_t *owire;              /* NULL: no client-side routing with it */
	size_t owire_len;
	float *qv;                   /* the router's scratch for a normalised query */
	uint64_t hash;
	uint64_t t0_ns, sampled_ns, built_ns;   /* sampling started, sample read, fit done */
	bool taken;                  /* taken from etcd (fitted by cn `fitter`), not fitted */
	uint32_t fitter;
};

static void build_free(struct oracle_build *b)
{
	if (!b)
		return;
	free(b->sample);
	free(b->raw);
	hnsw_quant_free(b->quant);
	free(b->init);
	free(b->prev_cn);
	dm_oracle_free(b->o);
	free(b->spill);
	free(b->owire);
	free(b->qv);
	free(b);
}

#define SAMPLE_PACE_CHUNK 256u   /* sample vectors between two calls of the fit's pace */

/* b's stored vectors (raw) into the index's space (sample); raw and the quantizer copy are
 * freed. pace (NULL: none) is called every SAMPLE_PACE_CHUNK vectors. */
static void sample_unrotate(struct oracle_build *b, void (*pace)(void *), void *arg)
{
	if (!b->raw)
		return;
	for (uint32_t i = 0; i < b->n; i++) {
		const float *v = b->raw + (size_t)i * b->vdim;

		if (b->quant) {
			hnsw_quant_unrotate(b->quant, v, b->raw + (size_t)i * b->vdim);
			v = b->raw + (size_t)i * b->vdim;   /* unrotated in place: vdim >= dim */
		}
		memcpy(b->sample + (size_t)i * b->dim, v, b->dim * sizeof(float));
		if (pace && i % SAMPLE_PACE_CHUNK == SAMPLE_PACE_CHUNK - 1)
			pace(arg);
	}
	free(b->raw);
	b->raw = NULL;
	hnsw_quant_free(b->quant);
	b->quant = NULL;
}

/* The sample as the fit takes it: in the index's space, normalised for a cosine index.
 * Once, by fit_oracle (which frees it), on the thread that fits, at its pace; a CN that
 * takes the oracle from etcd never does it. */
static void sample_finish(struct oracle_build *b, void (*pace)(void *), void *arg)
{
	sample_unrotate(b, pace, arg);
	if (b->metric == DM_METRIC_COS)
		for (uint32_t i = 0; i < b->n; i++)
			dm_normalize(b->sample + (size_t)i * b->dim, b->dim);
}

/* The sample of the current index for an oracle of epoch: the vectors of the first HNSW
 * level from the top holding at least sample_min_nodes nodes (level 0: READ from the memory
 * nodes over the router's connections); online: with the nodes inserted online (a
 * rollout's fit through etcd, see below). Router thread only. 0 or -errno (-ENOENT: no
 * index). */
static int gather_sample(struct router *r, uint32_t epoch, bool online,
			 struct oracle_build **out)
{
	struct cn *cn = r->cn;
	struct oracle_build *b = calloc(1, sizeof(*b));
	uint64_t counts[HNSW_MAX_LEVEL + 1] = { 0 };
	uint32_t *ids = NULL;
	int rc = 0;   /* a level >= 1 sample without the check sets it nowhere */

	if (!b)
		return -ENOMEM;
	b->t0_ns = dm_now_ns();
	b->epoch = epoch;
	b->ncn = r->ncn;
	b->keyrange = r->p.keyrange;
	b->regions = r->p.regions;
	b->duty = r->p.fit_duty;
	pthread_rwlock_rdlock(&cn->lock);
	const struct dindex *d = cn->views[0].cur;

	if (!d || d->n < r->ncn) {
		rc = -ENOENT;
		goto out_unlock;
	}
	b->crc = d->meta_crc;
	b->dim = d->p.dim;
	b->metric = d->p.metric;
	counts[0] = d->n;
	pthread_rwlock_rdlock((pthread_rwlock_t *)&d->up_lock);   /* online upper levels */
	for (int l = 1; l <= d->max_level; l++)
		counts[l] = d->at_level[l];
	pthread_rwlock_unlock((pthread_rwlock_t *)&d->up_lock);
	b->lv = dm_oracle_pick_level(counts, (uint32_t)d->max_level + 1, r->p.sample_min_nodes);
	ids = malloc(counts[b->lv] * sizeof(*ids));
	b->sample = malloc(counts[b->lv] * d->p.dim * sizeof(float));
	if (!ids || !b->sample) {
		rc = -ENOMEM;
		goto out_unlock;
	}
	/* A level >= 1 sample is in this CN's own upper levels (their stored vectors, as the
	 * records hold them): no READ. Reading thousands of records from the memory nodes
	 * queued the queries' READs behind them (a rollout's prepare phase slowed the
	 * queries of each CN in turn by up to 250 ms). Level 0: READ from the memory nodes.
	 * The stored vectors are copied as they are (rotated, for an index with codes) and
	 * turned back into the index's space by sample_finish, on the thread that fits and
	 * without the locks: unrotating 6161 x 100 here held cn->lock, which prefers writers,
	 * for 10-20 ms on the router thread, at normal priority, as every rollout began. */
	if (b->lv >= 1) {
		b->vdim = d->quant ? hnsw_quant_vdim(d->quant) : d->p.dim;
		b->raw = malloc(counts[b->lv] * b->vdim * sizeof(float));
		if (d->quant)
			b->quant = hnsw_quant_dup(d->quant);
		if (!b->raw || (d->quant && !b->quant)) {
			rc = -ENOMEM;
			goto out_unlock;
		}
	}
	/* online (a rollout's fit): ids up to cap, the nodes inserted online (n .. cap-1) too,
	 * which the replay added to the upper levels (cn_upper.h) and to at_level; one CN fits
	 * and the others take its model (etcd), so their copies of the upper levels, which
	 * may differ by the replay's progress, need not agree. Otherwise (the first oracle,
	 * which every CN builds itself) and at level 0: the loaded rows, alike everywhere. */
	uint32_t lim = online && b->lv >= 1 ? d->cap : d->n;

	pthread_rwlock_rdlock((pthread_rwlock_t *)&d->up_lock);
	for (uint32_t id = 0; id < lim && b->n < counts[b->lv]; id++) {
		if (node_level(d, id) < (uint32_t)b->lv)
			continue;
		if (b->lv >= 1) {
			if (!d->uvec[id])
				continue;
			memcpy(b->raw + (size_t)b->n * b->vdim, d->uvec[id],
			       b->vdim * sizeof(float));
		}
		ids[b->n++] = id;
	}
	pthread_rwlock_unlock((pthread_rwlock_t *)&d->up_lock);
	if (b->lv == 0 || getenv("DMANN_ROUTER_SAMPLE_CHECK")) {
		float *chk = b->lv ? malloc((size_t)b->n * b->dim * sizeof(float)) : b->sample;

		rc = chk ? read_vectors(r, d, ids, b->n, chk) : -ENOMEM;
		if (!rc && chk != b->sample) {
			sample_unrotate(b, NULL, NULL);   /* debug check: here, as it is */
			dm_info("cn%u: sample check: %u vectors, upper levels %s the records", r->self,
				b->n, memcmp(chk, b->sample, (size_t)b->n * b->dim * sizeof(float)) ?
				"DIFFER FROM" : "equal to");
			free(chk);
		}
		if (rc)
			goto out_unlock;
	}
	b->sampled_ns = dm_now_ns();
out_unlock:
	pthread_rwlock_unlock(&cn->lock);
	free(ids);
	if (rc) {
		build_free(b);
		return rc;
	}
	*out = b;
	return 0;
}

/* The calling thread's CPU time. */
static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define FIT_PACE_RUN_NS 2000000ull   /* CPU time a fit runs between two pauses */

/* The fit's pace (dm_oracle_params.pace): after each FIT_PACE_RUN_NS of CPU time, sleep so
 * that it takes at most b->duty percent of a CPU. Nice and SCHED_IDLE order threads within
 * one process only: with every node in its own session (autogroup) on a shared machine,
 * three compute nodes fitting at once took both cores of a 2-core machine for 0.4 s and
 * every query in flight waited that long (bench/epoch/run.sh, 2 queries in flight per
 * CN); sleeping bounds the fit's share wherever it runs. */
static void fit_pace(void *arg)
{
	struct oracle_build *b = arg;
	uint64_t now = thread_cpu_ns(), ran = now - b->cpu_mark_ns;

	if (now < b->cpu_mark_ns || ran < FIT_PACE_RUN_NS)
		return;
	uint64_t ns = ran * (100 - b->duty) / b->duty;
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull),
			       .tv_nsec = (long)(ns % 1000000000ull) };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
	b->cpu_mark_ns = thread_cpu_ns();
}

/* Fit the oracle of b's epoch on its sample (the same result on every CN): balanced
 * k-means of ncn groups, or the key ranges of a VHash. Touches nothing but b. 0 or -errno
 * (also in b->rc). */
/* What routing with b's oracle needs beside it: every CN's spill order and the scratch
 * vector. 0 or -ENOMEM. */
static int build_spill(struct oracle_build *b)
{
	b->spill = calloc((size_t)b->ncn * (b->ncn ? b->ncn - 1 : 0) + 1, sizeof(*b->spill));
	b->qv = malloc(b->dim * sizeof(float));
	if (!b->spill || !b->qv)
		return -ENOMEM;
	for (uint32_t c = 0; c < b->ncn; c++)
		dm_oracle_spill_order(b->o, c, b->spill + (size_t)c * (b->ncn - 1));
	return 0;
}

/* The VHash regions of a key-range oracle fitted on b's sample. */
static uint32_t fit_regions(const struct oracle_build *b)
{
	uint32_t K = b->regions ? b->regions : DM_MIN(DM_VHASH_K_DEFAULT, b->n / 64);

	return DM_MIN(DM_MAX(K, b->ncn), DM_MIN(b->n, 256u * b->ncn));
}

static int fit_oracle(struct oracle_build *b)
{
	struct dm_oracle_params op;
	int rc = 0;

	dm_oracle_params_default(&op, b->ncn);
	op.seed += b->epoch;
	if (b->duty && b->duty < 100) {
		b->cpu_mark_ns = thread_cpu_ns();
		op.pace = fit_pace;
		op.pace_arg = b;
	}
	sample_finish(b, op.pace, op.pace_arg);
	if (b->keyrange) {
		/* Key ranges: a VHash of the same sample, its ring cut into ncn runs */
		bool warm = false;

		b->o = dm_oracle_keyrange_fit(b->sample, b->n, b->dim, fit_regions(b), b->ncn,
					      op.balance_eps, op.seed, b->init, b->prev_cn, op.pace,
					      op.pace_arg, &warm);
		if (b->o && b->init && !warm) {
			dm_info("oracle epoch %u: the warm fit found no balanced cut (the sample "
				"moved): fitted from a new seed", b->epoch);
			free(b->init);
			b->init = NULL;
		}
		if (!b->o)
			rc = -errno;
	} else {
		op.init = b->init;
		b->o = dm_oracle_build(b->sample, b->n, b->dim, &op);
		if (!b->o)
			rc = -errno;
	}
	if (rc)
		goto out;
	rc = build_spill(b);
	if (rc)
		goto out;
	b->owire_len = dm_oracle_wire_size(b->o);
	b->owire = malloc(b->owire_len);
	if (!b->owire || dm_oracle_encode(b->o, b->owire, b->owire_len) != (long)b->owire_len) {
		free(b->owire);   /* no client-side routing; the CNs still route */
		b->owire = NULL;
		b->owire_len = 0;
	}
	b->hash = oracle_hash(b->o);
out:
	free(b->sample);   /* not needed any more */
	b->sample = NULL;
	b->rc = rc ? (rc < 0 ? rc : -EINVAL) : 0;
	b->built_ns = dm_now_ns();
	return b->rc;
}

/* Route with b's oracle from now on (takes b's contents; b is freed). The routing epoch
 * it replaces stays admitted (router_admit) for the clients that still route with it. */
static void install_oracle(struct router *r, struct oracle_build *b)
{
	pthread_mutex_lock(&r->mu);
	if (atomic_load(&r->ready)) {
		atomic_store(&r->prev_repoch, atomic_load(&r->repoch));
		atomic_store(&r->prev_ok, true);
	}
	dm_oracle_free(r->o);
	free(r->spill);
	free(r->qv);
	free(r->owire);
	r->o = b->o;
	r->spill = b->spill;
	r->qv = b->qv;
	r->owire = b->owire;
	r->owire_len = b->owire_len;
	b->o = NULL;
	b->spill = NULL;
	b->qv = NULL;
	b->owire = NULL;
	reset_demand(r);   /* group g is another region of the data in the new epoch */
	set_limits(r);
	r->hash = b->hash;
	r->crc = b->crc;
	r->metric = b->metric;
	r->sample_level = (uint32_t)b->lv;
	atomic_store(&r->epoch, b->epoch);
	if (atomic_load(&r->next_epoch) < b->epoch)
		atomic_store(&r->next_epoch, b->epoch);
	set_owners(r, true);
	atomic_store(&r->ready, true);
	pthread_mutex_unlock(&r->mu);
	build_free(b);
}

static void log_built(const struct router *r, const struct oracle_build *b, const char *how)
{
	dm_info("cn%u: oracle epoch %u: k=%u %s from %u nodes of level %d (dim %u): centroid "
		"hash %016llx (%s in %.2f s: sample %.2f s, %s %.2f s)", r->self, b->epoch, r->ncn,
		b->o->algo == DM_ORACLE_KEYRANGE ? "key ranges" : "k-means partitions", b->n, b->lv,
		b->dim, (unsigned long long)b->hash, how, (b->built_ns - b->t0_ns) / 1e9,
		(b->sampled_ns - b->t0_ns) / 1e9, b->taken ? "taken from etcd" :
		b->init ? "warm fit" : "fit",
		(b->built_ns - b->sampled_ns) / 1e9);
}

static bool first_from_etcd(struct router *r, struct oracle_build *b);

/* Build the oracle of the current index for epoch (same result on every CN) and route with
 * it at once: at start and after a new index (router thread). An epoch that a rollout
 * published in etcd (a CN that starts after it) is taken from there. */
static int build_oracle(struct router *r, uint32_t epoch)
{
	struct oracle_build *b = NULL;
	int rc = gather_sample(r, epoch, false, &b);

	if (!rc && !first_from_etcd(r, b)) {
		b->duty = 100;   /* not routing yet: as fast as it can (fit_duty paces rollouts) */
		rc = fit_oracle(b);
	}
	if (rc) {
		build_free(b);
		dm_warn("cn%u: cannot build the oracle: %s", r->self, strerror(-rc));
		return rc;
	}
	log_built(r, b, "built");
	install_oracle(r, b);
	return 0;
}

/* ---- the two-phase rollout of a new oracle epoch (oracle/rollout.h) ---------------------- */

#define ROLLOUT_FRESH_MS 2000u          /* reports older than this: a silent CN, not waited for */
#define ROLLOUT_WAIT_NS (30ull * 1000000000ull) /* prepared: switch anyway after this long */
#define ROLLOUT_RETRY_NS 1000000000ull  /* a failed prepare is tried again after this */
#define ROLLOUT_POLL_MS 20u             /* report period while prepared and waiting */
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

/* Install the oracle another CN fitted (wire, len bytes; taken) into b as fit_oracle would
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
	    (b->o->algo == DM_ORACLE_KEYRANGE) != b->keyrange || oracle_hash(b->o) != m->hash)
		goto out;
	rc = build_spill(b);
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
	fit_oracle(b);
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

/* The first oracle of a CN (build_oracle), of an epoch > 0: taken from etcd when a
 * rollout published it for this index (one read, on the router thread, bounded by the
 * handle's 2 s). Returns whether b is done; otherwise (not published, any error) b is
 * fitted here as before. */
static bool first_from_etcd(struct router *r, struct oracle_build *b)
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
	fit_oracle(b);
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
static void prepare_drop(struct router *r)
{
	if (!r->prep)
		return;
	if (r->prep_running) {
		pthread_join(r->prep_thread, NULL);
		r->prep_running = false;
	}
	build_free(r->prep);
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
	uint32_t want = b->keyrange ? fit_regions(b) : b->ncn;

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
	int rc = gather_sample(r, target, etcd, &r->prep);

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
static bool rollout_step(struct router *r, const struct dm_rollout_cn *rep)
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
			prepare_drop(r);
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
		prepare_drop(r);
		atomic_store(&r->rollout, DM_FWD_ROLLOUT_PREPARING);
		return false;
	}
	if (atomic_load(&r->rollout) != DM_FWD_ROLLOUT_PREPARED) {
		atomic_store(&r->rollout, DM_FWD_ROLLOUT_PREPARED);
		log_built(r, b, "prepared");
		return true;    /* report it before looking at the others */
	}
	/* Phase 2: switch once every live CN has it (or after ROLLOUT_WAIT_NS anyway). */
	for (uint32_t c = 0; c < r->ncn; c++)
		up[c] = cn_ok(r, c);
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
	install_oracle(r, b);
	atomic_fetch_add(&r->reclusters, 1);
	atomic_store(&r->rollout, DM_FWD_ROLLOUT_IDLE);
	r->csp_high_since = 0;
	return false;
}

/* ---- routing decisions ------------------------------------------------------------------- */

/* Forget the learned demand: equal shares (caller holds mu). */
static void reset_demand(struct router *r)
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
static void set_limits(struct router *r)
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
static bool cn_ok(const struct router *r, uint32_t c)
{
	if (c == r->self)
		return !atomic_load_explicit(&r->cn->state_self_down, memory_order_relaxed);
	return !atomic_load_explicit(&r->cn->state_cn_down[c], memory_order_relaxed);
}

/* Re-partition after a CN joined or left (caller holds mu, an oracle exists): the owners
 * of the live set the cluster state gives, a new routing epoch when they changed (or with
 * force, after a new oracle). The batch starts afresh: a partition's queue is its new
 * owner's. */
static void set_owners(struct router *r, bool force)
{
	bool up[DM_MAX_NODES];
	uint32_t own[DM_MAX_NODES];
	int moved;

	for (uint32_t c = 0; c < r->ncn; c++)
		up[c] = cn_ok(r, c);
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
	set_limits(r);
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
			if (cn_ok(r, r->cand[i])) {
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

		if (r->hist[c] < r->limit[c] && cn_ok(r, c)) {
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
		set_limits(r);
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
		if (cn_ok(r, c)) {
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

			if (c != r->self && r->qlen[c] <= band && cn_ok(r, c)) {
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
		reset_demand(r);
		set_limits(r);
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
	 * the others follow the highest epoch reported (rollout_step). */
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
	return rollout_step(r, rep);
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
		if (node_level(d, id) < lv || !d->uvec[id])
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

			built = build_oracle(r, e) == 0;
			built_crc = crc;
		}
		/* CNs the cluster state declares down or up again: new owners, new epoch (only
		 * when a new up-set arrived: cn_state_apply counts them). */
		unsigned long sc = atomic_load(&cn->state_changes);

		if (sc != seen_state) {
			pthread_mutex_lock(&r->mu);
			if (r->o)
				set_owners(r, false);
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
	prepare_drop(r);   /* waits for a fit in progress */
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
	reset_demand(r);
	set_limits(r);
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
