/* router_oracle.c: an oracle of the compute node's router: its sample (the vectors of an
 * upper HNSW level, or level 0 READ from the memory nodes), its fit (balanced k-means or
 * the key ranges of a VHash, paced to [router] fit_duty), its installation, and the first
 * oracle of a CN (router_build_oracle). The rollout of later epochs is router_rollout.c. */
#include "router_int.h"
#include "util/dm_hash.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define READ_CHUNK 128          /* records per READ batch while sampling */

uint64_t router_oracle_hash(const struct dm_oracle *o)
{
	uint64_t h = DM_FNV64_INIT;

	h = dm_fnv1a64(h, o->fine, (size_t)o->nfine * o->dim * sizeof(float));
	h = dm_fnv1a64(h, o->fine_group, o->nfine * sizeof(uint32_t));
	h = dm_fnv1a64(h, o->bias, o->nfine * sizeof(float));
	h = dm_fnv1a64(h, o->centroids, (size_t)o->k * o->dim * sizeof(float));
	return h;
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

void router_build_free(struct oracle_build *b)
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
 * Once, by router_fit_oracle (which frees it), on the thread that fits, at its pace; a CN that
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
int router_gather_sample(struct router *r, uint32_t epoch, bool online,
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
		if (dindex_level(d, id) < (uint32_t)b->lv)
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
		router_build_free(b);
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
int router_build_spill(struct oracle_build *b)
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
uint32_t router_fit_regions(const struct oracle_build *b)
{
	uint32_t K = b->regions ? b->regions : DM_MIN(DM_VHASH_K_DEFAULT, b->n / 64);

	return DM_MIN(DM_MAX(K, b->ncn), DM_MIN(b->n, 256u * b->ncn));
}

int router_fit_oracle(struct oracle_build *b)
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

		b->o = dm_oracle_keyrange_fit(b->sample, b->n, b->dim, router_fit_regions(b), b->ncn,
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
	rc = router_build_spill(b);
	if (rc)
		goto out;
	b->owire_len = dm_oracle_wire_size(b->o);
	b->owire = malloc(b->owire_len);
	if (!b->owire || dm_oracle_encode(b->o, b->owire, b->owire_len) != (long)b->owire_len) {
		free(b->owire);   /* no client-side routing; the CNs still route */
		b->owire = NULL;
		b->owire_len = 0;
	}
	b->hash = router_oracle_hash(b->o);
out:
	free(b->sample);   /* not needed any more */
	b->sample = NULL;
	b->rc = rc ? (rc < 0 ? rc : -EINVAL) : 0;
	b->built_ns = dm_now_ns();
	return b->rc;
}

/* Route with b's oracle from now on (takes b's contents; b is freed). The routing epoch
 * it replaces stays admitted (router_admit) for the clients that still route with it. */
void router_install_oracle(struct router *r, struct oracle_build *b)
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
	router_reset_demand(r);   /* group g is another region of the data in the new epoch */
	router_set_limits(r);
	r->hash = b->hash;
	r->crc = b->crc;
	r->metric = b->metric;
	r->sample_level = (uint32_t)b->lv;
	atomic_store(&r->epoch, b->epoch);
	if (atomic_load(&r->next_epoch) < b->epoch)
		atomic_store(&r->next_epoch, b->epoch);
	router_set_owners(r, true);
	atomic_store(&r->ready, true);
	pthread_mutex_unlock(&r->mu);
	router_build_free(b);
}

void router_log_built(const struct router *r, const struct oracle_build *b, const char *how)
{
	dm_info("cn%u: oracle epoch %u: k=%u %s from %u nodes of level %d (dim %u): centroid "
		"hash %016llx (%s in %.2f s: sample %.2f s, %s %.2f s)", r->self, b->epoch, r->ncn,
		b->o->algo == DM_ORACLE_KEYRANGE ? "key ranges" : "k-means partitions", b->n, b->lv,
		b->dim, (unsigned long long)b->hash, how, (b->built_ns - b->t0_ns) / 1e9,
		(b->sampled_ns - b->t0_ns) / 1e9, b->taken ? "taken from etcd" :
		b->init ? "warm fit" : "fit",
		(b->built_ns - b->sampled_ns) / 1e9);
}

/* Build the oracle of the current index for epoch (same result on every CN) and route with
 * it at once: at start and after a new index (router thread). An epoch that a rollout
 * published in etcd (a CN that starts after it) is taken from there. */
int router_build_oracle(struct router *r, uint32_t epoch)
{
	struct oracle_build *b = NULL;
	int rc = router_gather_sample(r, epoch, false, &b);

	if (!rc && !router_first_from_etcd(r, b)) {
		b->duty = 100;   /* not routing yet: as fast as it can (fit_duty paces rollouts) */
		rc = router_fit_oracle(b);
	}
	if (rc) {
		router_build_free(b);
		dm_warn("cn%u: cannot build the oracle: %s", r->self, strerror(-rc));
		return rc;
	}
	router_log_built(r, b, "built");
	router_install_oracle(r, b);
	return 0;
}
