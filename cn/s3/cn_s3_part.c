/* cn_s3_part.c: the partitioned mode of the exact scan (issue 15, Semord's bounded-fanout
 * frontier; docs/api.md "Partitioned exact scans"). With [s3] scan_budget B > 0, an
 * unfiltered query of an index of at least scan_min_rows rows that the exact path serves
 * whole scans only the rows of B of the index's scan_regions VHash regions: the frontier
 * of oracle/vhash_frontier.c (the query's own region, its key-ring neighbours, the nearest
 * region hints; widened for ambiguous queries with scan_widen) over a layout of one
 * logical fragment per region, in key order.
 *
 * The model of an index, its VHash, is fitted by every compute node alike: on the first
 * S3_PART_SAMPLE_ROWS rows (dead or alive: rows never change once written; the first
 * fragments, sealed once the index holds scan_min_rows >= 16,384 rows) of the memory node
 * whose state the query read, with one seed, in a thread of its own (queries meanwhile scan
 * every row), so that the ingress choosing the regions and
 * the members scanning them hold the same model without exchanging it; the sub-request
 * names it by a hash of its bytes, and a member whose model differs (or is still being
 * fitted) scans its whole share. The rows of a cached fragment are labelled with their
 * region (the ring position of their nearest centroid) the first time a partitioned scan
 * reads them; the labels live with the fragment in the fragment cache.
 *
 * Not built: per-index settings (the mode and B are [s3] settings of the cluster), tail
 * fragments in key order (the scan still reads every fragment it is given; it skips rows),
 * the graph path's tail scan and filtered queries (always whole), a model refit when the
 * index drifts from its first rows.
 */
#include "cn_s3_int.h"

#include <stdlib.h>
#include <string.h>

#include "distance.h"
#include "util/dm_hash.h"
#include "vhash.h"
#include "vhash_frontier.h"

#define PART_MAX         64u           /* indexes with a model on one compute node */
#define PART_SEED        0x5ca77e5ull
#define PART_RETRY_NS    (30ull * 1000000000ull)   /* a failed fit is tried again after */

struct s3_part {
	/* key and version: the index as one memory node holds it */
	uint32_t mn;
	uint64_t epoch;
	int64_t created;
	char b[S3_FC_NAME_MAX], x[S3_FC_NAME_MAX];
	int state;                       /* 1 ready, 0 being fitted, -errno failed */
	uint64_t failed_at;
	struct dm_vhash *vh;
	uint64_t id;                     /* FNV-1a of the saved model */
	uint64_t *flo, *fhi;             /* layout: ring position p = region vh->ring[p] */
	bool cos;                        /* labels and queries normalised */
	int refs;                        /* under the table's mutex */
	bool detached;                   /* replaced: freed at the last put */
	uint64_t used_ns;
};

struct s3_parts {
	pthread_mutex_t mu;
	pthread_cond_t cv;               /* a fit ended */
	uint32_t fitting;                /* fit threads running */
	struct s3_part *e[PART_MAX];
};

/* A fit in the background: the model p of the index state st (scalars only). */
struct fitjob {
	struct cn_s3 *s;
	struct s3_part *p;
	struct ixstate st;
};

struct s3_parts *parts_new(void)
{
	struct s3_parts *t = calloc(1, sizeof(*t));

	if (!t) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	return t;
}

static void part_free(struct s3_part *p)
{
	dm_vhash_free(p->vh);
	free(p->flo);
	free(p->fhi);
	free(p);
}

void parts_drain(struct s3_parts *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&t->mu);
	while (t->fitting)
		pthread_cond_wait(&t->cv, &t->mu);
	pthread_mutex_unlock(&t->mu);
}

void parts_free(struct s3_parts *t)
{
	if (!t)
		return;
	parts_drain(t);
	for (uint32_t i = 0; i < PART_MAX; i++)
		if (t->e[i])
			part_free(t->e[i]);
	pthread_mutex_destroy(&t->mu);
	pthread_cond_destroy(&t->cv);
	free(t);
}

/* x (dim floats) into out, scaled to unit length for a cosine index (a zero vector stays
 * zero). */
static void part_vec(const struct s3_part *p, const float *x, uint32_t dim, float *out)
{
	memcpy(out, x, dim * sizeof(float));
	if (p->cos)
		(void)dm_normalize(out, dim);
}

/* Fit p's model from the first rows of the index state st (the fitting thread, outside
 * the table's mutex): 0 or -errno. */
static int part_fit(struct cn_s3 *s, struct s3_part *p, const struct ixstate *st)
{
	uint64_t t0 = dm_now_ns();
	uint32_t dim = st->dim, n = 0, k = s->scan_regions;
	/* The sample: the first fragments, whole (sealed: every one but the last is full), as
	 * they are on every replica alike whatever share of them a sub-request names. */
	uint32_t nf = (S3_PART_SAMPLE_ROWS + st->frag_rows - 1) / st->frag_rows;
	struct ixstate fs = *st;
	float *sample = malloc((size_t)S3_PART_SAMPLE_ROWS * dim * sizeof(float));
	uint8_t *buf = NULL;
	size_t len;
	int rc = 0;

	fs.nfrag = nf;
	fs.fr = calloc(nf, sizeof(*fs.fr));
	if (!sample || !fs.fr) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t f = 0; f < nf; f++)
		fs.fr[f].rows = st->frag_rows;
	for (uint32_t f = 0; f < nf && n < S3_PART_SAMPLE_ROWS && !rc; f++) {
		struct s3_frag *fr;

		rc = frag_get(s, &fs, p->b, p->x, f, &fr);
		if (rc)
			break;
		pthread_rwlock_rdlock(&fr->rw);
		for (uint32_t r = 0; r < DM_MIN(fr->rows, st->frag_rows) && n < S3_PART_SAMPLE_ROWS;
		     r++, n++)
			part_vec(p, fr->vec + (size_t)r * dim, dim, sample + (size_t)n * dim);
		pthread_rwlock_unlock(&fr->rw);
		s3_fcache_put(s->cache, fr);
	}
	if (rc)
		goto out;
	if (n < S3_PART_SAMPLE_ROWS || n < 4u * k) {
		rc = -ENODATA;
		goto out;
	}
	p->vh = dm_vhash_fit(sample, n, dim, k, PART_SEED, NULL);
	if (!p->vh) {
		rc = -errno;
		goto out;
	}
	p->flo = calloc(k, sizeof(*p->flo));
	p->fhi = calloc(k, sizeof(*p->fhi));
	len = dm_vhash_save_size(p->vh);
	buf = malloc(len);
	if (!p->flo || !p->fhi || !buf || dm_vhash_save(p->vh, buf, len) < 0) {
		rc = -ENOMEM;
		goto out;
	}
	p->id = dm_fnv1a64(DM_FNV64_INIT, buf, len);
	for (uint32_t pos = 0; pos < k; pos++) {
		p->flo[pos] = p->vh->lo[p->vh->ring[pos]];
		p->fhi[pos] = p->vh->hi[p->vh->ring[pos]];
	}
	rc = dm_frontier_layout_check(p->flo, p->fhi, k);
	if (!rc) {
		__atomic_add_fetch(&s->part_fits, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&s->part_fit_ns, dm_now_ns() - t0, __ATOMIC_RELAXED);
		dm_info("cn%u: s3: partitioned scans of %s/%s: %u regions fitted on %u rows of mn%u "
			"in %.2f s (model %016llx)", s->node->id, p->b, p->x, k, n, p->mn,
			(double)(dm_now_ns() - t0) / 1e9, (unsigned long long)p->id);
	}
out:
	if (rc) {
		dm_vhash_free(p->vh);
		p->vh = NULL;
		dm_warn("cn%u: s3: partitioned scans of %s/%s: no model (%s): its queries scan "
			"every row", s->node->id, p->b, p->x, rc == -ENODATA ? "too few rows" :
			strerror(-rc));
	}
	free(buf);
	free(sample);
	free(fs.fr);
	return rc;
}

static void *fit_main(void *arg)
{
	struct fitjob *j = arg;
	struct s3_parts *t = j->s->parts;
	int rc = part_fit(j->s, j->p, &j->st);

	pthread_mutex_lock(&t->mu);
	j->p->state = rc ? rc : 1;
	j->p->failed_at = rc ? dm_now_ns() : 0;
	j->p->used_ns = dm_now_ns();
	pthread_mutex_unlock(&t->mu);
	part_put(j->s, j->p);                 /* the job's reference */
	pthread_mutex_lock(&t->mu);
	t->fitting--;
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
	free(j);
	return NULL;
}

/* Start the fit of p (mu held; p->state 0 and one reference for the job, which it drops):
 * 0 or -errno (then p is marked failed). */
static int fit_start(struct cn_s3 *s, struct s3_part *p, const struct ixstate *st)
{
	struct fitjob *j = calloc(1, sizeof(*j));
	pthread_attr_t a;
	pthread_t th;
	int rc;

	if (!j)
		return -ENOMEM;
	*j = (struct fitjob){ .s = s, .p = p, .st = *st };
	j->st.fr = NULL;
	j->st.conf = NULL;
	j->st.scope = NULL;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	rc = -pthread_create(&th, &a, fit_main, j);
	pthread_attr_destroy(&a);
	if (rc) {
		free(j);
		return rc;
	}
	s->parts->fitting++;
	return 0;
}

static bool part_is(const struct s3_part *p, const struct ixstate *st, const char *b,
		    const char *x)
{
	return p->mn == st->mn && !strcmp(p->b, b) && !strcmp(p->x, x);
}

int part_get(struct cn_s3 *s, const struct ixstate *st, const char *b, const char *x,
	     struct s3_part **out)
{
	struct s3_parts *t = s->parts;
	struct s3_part *p = NULL;
	uint32_t slot = PART_MAX, victim = PART_MAX;
	int rc;

	*out = NULL;
	if (!t || strlen(b) >= S3_FC_NAME_MAX || strlen(x) >= S3_FC_NAME_MAX)
		return -EINVAL;
	pthread_mutex_lock(&t->mu);
	for (uint32_t i = 0; i < PART_MAX; i++) {
		struct s3_part *e = t->e[i];

		if (!e) {
			slot = slot == PART_MAX ? i : slot;
			continue;
		}
		if (part_is(e, st, b, x)) {
			if (e->epoch == st->epoch && e->created == st->created) {
				p = e;
				break;
			}
			/* another version of the index (MN restarted, index re-created) */
			t->e[i] = NULL;
			if (e->refs)
				e->detached = true;
			else
				part_free(e);
			slot = i;
			continue;
		}
		if (!e->refs && e->state != 0 &&
		    (victim == PART_MAX || e->used_ns < t->e[victim]->used_ns))
			victim = i;
	}
	if (p) {
		if (p->state == 1) {
			p->refs++;
			p->used_ns = dm_now_ns();
			*out = p;
			rc = 0;
		} else if (p->state == 0 || dm_now_ns() - p->failed_at < PART_RETRY_NS) {
			rc = p->state == 0 ? -EAGAIN : p->state;
		} else {
			p->state = 0;             /* try again */
			p->refs++;
			rc = fit_start(s, p, st);
			if (rc) {
				p->refs--;
				p->state = rc;
				p->failed_at = dm_now_ns();
			}
			rc = rc ? rc : -EAGAIN;
		}
		pthread_mutex_unlock(&t->mu);
		return rc;
	}
	if (slot == PART_MAX && victim != PART_MAX) {
		part_free(t->e[victim]);
		t->e[victim] = NULL;
		slot = victim;
	}
	if (slot == PART_MAX) {
		pthread_mutex_unlock(&t->mu);
		return -EBUSY;                    /* every model in use */
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		pthread_mutex_unlock(&t->mu);
		return -ENOMEM;
	}
	*p = (struct s3_part){ .mn = st->mn, .epoch = st->epoch, .created = st->created,
			       .cos = st->metric == DM_METRIC_COS, .refs = 1 };
	snprintf(p->b, sizeof(p->b), "%s", b);
	snprintf(p->x, sizeof(p->x), "%s", x);
	t->e[slot] = p;
	rc = fit_start(s, p, st);                  /* the job holds the reference */
	if (rc) {
		p->refs--;
		p->state = rc;
		p->failed_at = dm_now_ns();
	}
	pthread_mutex_unlock(&t->mu);
	return rc ? rc : -EAGAIN;
}

void part_put(struct cn_s3 *s, struct s3_part *p)
{
	bool gone;

	if (!p)
		return;
	pthread_mutex_lock(&s->parts->mu);
	gone = --p->refs == 0 && p->detached;
	pthread_mutex_unlock(&s->parts->mu);
	if (gone)
		part_free(p);
}

uint64_t part_id(const struct s3_part *p)
{
	return p->id;
}

uint32_t part_regions(const struct s3_part *p)
{
	return p->vh->k;
}

int part_select(struct cn_s3 *s, const struct s3_part *p, const float *q, uint32_t *pos,
		uint32_t room, bool *widened)
{
	struct dm_frontier_opts o;
	struct dm_frontier_info info;
	uint32_t dim = p->vh->dim;
	float *qv = malloc(dim * sizeof(float));
	int n;

	if (!qv)
		return -ENOMEM;
	part_vec(p, q, dim, qv);
	dm_frontier_opts_default(&o);
	o.widen = s->scan_widen != 0;
	o.hints = DM_MIN(o.hints, p->vh->k);
	n = dm_vhash_frontier(p->vh, p->flo, p->fhi, p->vh->k, qv,
			      DM_MIN(s->scan_budget, p->vh->k), &o, pos, room, &info);
	free(qv);
	if (n > 0 && widened)
		*widened = info.widened;
	return n;
}

/* f's labelled rows grouped by label (s3_frag.porder, pstart): a counting sort over k
 * labels. 0 or -ENOMEM (the labels then stand, without an order: part_id reset so that
 * the next scan labels again). */
static int part_order(struct s3_frag *f, uint32_t k)
{
	uint32_t *po = realloc(f->porder, (size_t)(f->part_rows ? f->part_rows : 1) * sizeof(*po));
	uint32_t *ps;

	if (!po)
		goto nomem;
	f->porder = po;
	ps = realloc(f->pstart, ((size_t)k + 1) * sizeof(*ps));
	if (!ps)
		goto nomem;
	f->pstart = ps;
	f->pk = k;
	memset(ps, 0, ((size_t)k + 1) * sizeof(*ps));
	for (uint32_t r = 0; r < f->part_rows; r++)
		ps[f->part[r] + 1]++;
	for (uint32_t g = 0; g < k; g++)
		ps[g + 1] += ps[g];
	for (uint32_t r = 0; r < f->part_rows; r++)
		po[ps[f->part[r]]++] = r;
	for (uint32_t g = k; g > 0; g--)   /* ps[g] held the end of g: shift back to starts */
		ps[g] = ps[g - 1];
	ps[0] = 0;
	return 0;
nomem:
	f->part_id = 0;
	f->part_rows = 0;
	return -ENOMEM;
}

int part_label(const struct s3_part *p, struct s3_frag *f, uint32_t upto)
{
	uint32_t dim = p->vh->dim, from = f->part_id == p->id ? f->part_rows : 0;
	float *v;

	if (upto > f->rows)
		upto = f->rows;
	if (from >= upto)
		return 0;
	if (f->part_cap < upto) {
		uint16_t *np = realloc(f->part, (size_t)f->cap * sizeof(*np));

		if (!np)
			return -ENOMEM;
		f->part = np;
		f->part_cap = f->cap;
	}
	v = malloc(dim * sizeof(float));
	if (!v)
		return -ENOMEM;
	for (uint32_t r = from; r < upto; r++) {
		part_vec(p, f->vec + (size_t)r * dim, dim, v);
		f->part[r] = (uint16_t)p->vh->ring_pos[dm_vhash_nearest(p->vh, v, NULL)];
	}
	free(v);
	f->part_id = p->id;
	f->part_rows = upto;
	return part_order(f, p->vh->k);
}
