/* frontier_bench.c: offline measurement of the bounded-fanout frontier (oracle/vhash_frontier.h)
 * over key-ordered fragments (issue 15, point 3; bench/frontier/run.sh drives it). Not the
 * product's query path: no partitioned query mode exists yet; this program builds the layout
 * in memory and scans it exactly.
 *
 *   1. fit a VHash on an even sample of the base rows (dm_vhash_fit_rows: K regions, sample
 *      rows, seed) and key every row (dm_vhash_order: rows sorted by key);
 *   2. for each F: cut the key order into F fragments of about n / F rows: fragment f starts
 *      at the key of the row of rank floor(f n / F) (kept strictly increasing, so rows with
 *      equal keys stay in one fragment), and is the key range up to the next start;
 *   3. for each query: the exact squared L2 distance (distance.h's dm_l2sq) to every row,
 *      the exact top-k of the whole set (the truth: dm_topk over all rows), and the exact
 *      top-k of each fragment; the top-k over a set of fragments is then the merge of their
 *      lists (dm_topk_merge), exactly what scanning those fragments returns;
 *   4. for each budget B: recall@k of (a) the frontier without widening, (b) with widening,
 *      (c) B' random distinct fragments, B' = the count (a) chose for that query (per-query
 *      seeded draw), (d) all F fragments (recall 1 by construction: a check of the layout);
 *      mean fragments scanned of each.
 * The truth is also compared with the ground-truth file (--gt), when given (gt_agree: mean
 * share of the file's top-k the brute force finds; < 1 only through distance ties/rounding).
 *
 * Output: JSON lines on stdout, one "meta" line per data set, one "row" line per (F, B).
 * usage: frontier_bench --base F --query F [--gt F] [--nq N] [--k K] [--frags "32 64"]
 *        [--budgets "1 2 4 6 8 12 16"] [--vhash-k K] [--sample S] [--seed S] [--ring R]
 *        [--hints H] [--gap G] [--wide-extra E] [--threads T] [--label L]
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dm.h"
#include "distance.h"
#include "topk.h"
#include "vecfile.h"
#include "vhash.h"
#include "vhash_frontier.h"
#include "vhash_order.h"

#define MAX_F  16
#define MAX_B  32
#define MAX_K  100
#define QBLOCK 8     /* queries sharing one pass over the base rows */

struct cfg {
	const char *base, *query, *gt, *label;
	uint64_t nq, seed;
	uint32_t k, vk, threads, nf, nb;
	size_t sample;
	uint32_t frags[MAX_F], budgets[MAX_B];
	struct dm_frontier_opts plain, wide;
};

struct layout {
	uint32_t F;
	uint64_t *lo, *hi;
	size_t *pos;         /* F + 1: fragment f is key-order ranks [pos[f], pos[f + 1]) */
};

/* Sums over queries of one thread: [F][B]. */
struct acc {
	double rec_plain[MAX_F][MAX_B], rec_wide[MAX_F][MAX_B], rec_rand[MAX_F][MAX_B];
	double n_plain[MAX_F][MAX_B], n_wide[MAX_F][MAX_B], n_rand[MAX_F][MAX_B];
	double rec_full[MAX_F], gt_agree;
	uint64_t widened, queries, errors;
};

struct shared {
	const struct cfg *c;
	const struct dm_vhash *vh;
	const float *base, *q;
	const int32_t *gt;
	uint32_t gtk;
	size_t n, dim;
	const uint32_t *labels;   /* rank -> row */
	const struct layout *lay;
	double *gaps;             /* nq relative gaps */
	atomic_uint_fast64_t next;
};

struct worker {
	struct shared *s;
	struct acc a;
	pthread_t th;
};

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static double recall(const struct dm_hit *got, size_t ng, const struct dm_hit *truth,
		     size_t nt)
{
	size_t hit = 0;

	for (size_t i = 0; i < nt; i++)
		for (size_t j = 0; j < ng; j++)
			if (got[j].id == truth[i].id) {
				hit++;
				break;
			}
	return nt ? (double)hit / (double)nt : 1.0;
}

/* Top-k of the fragments in sel[0..m): the merge of their exact lists. */
static size_t scan(struct dm_hit *const *fh, const size_t *fn, const uint32_t *sel, uint32_t m,
		   size_t k, struct dm_hit *out)
{
	const struct dm_hit *lists[4096];
	size_t lens[4096];

	for (uint32_t i = 0; i < m; i++) {
		lists[i] = fh[sel[i]];
		lens[i] = fn[sel[i]];
	}
	return dm_topk_merge(lists, lens, m, k, out);
}

static void eval_query(struct worker *w, uint64_t qi, const float *dist, struct dm_topk *tk,
		       struct dm_hit **fh, size_t *fn, uint32_t *sel, uint32_t *perm)
{
	struct shared *s = w->s;
	const struct cfg *c = s->c;
	const float *q = s->q + qi * s->dim;
	struct dm_hit truth[MAX_K], got[MAX_K];
	size_t nt;

	/* the truth: all rows */
	for (size_t r = 0; r < s->n; r++)
		dm_topk_push(tk, dist[r], r);
	nt = dm_topk_drain(tk, truth);
	if (s->gt) {
		const int32_t *g = s->gt + qi * s->gtk;
		size_t hit = 0;
		for (uint32_t i = 0; i < c->k; i++)
			for (size_t j = 0; j < nt; j++)
				if ((uint64_t)(uint32_t)g[i] == truth[j].id) {
					hit++;
					break;
				}
		w->a.gt_agree += (double)hit / c->k;
	}
	w->a.queries++;

	for (uint32_t fi = 0; fi < c->nf; fi++) {
		const struct layout *L = &s->lay[fi];
		struct dm_frontier_info info;

		/* exact per-fragment lists, rows in key order */
		for (uint32_t f = 0; f < L->F; f++) {
			for (size_t i = L->pos[f]; i < L->pos[f + 1]; i++)
				dm_topk_push(tk, dist[s->labels[i]], s->labels[i]);
			fn[f] = dm_topk_drain(tk, fh[f]);
		}
		/* (d) the full scan */
		for (uint32_t f = 0; f < L->F; f++)
			sel[f] = f;
		w->a.rec_full[fi] += recall(got, scan(fh, fn, sel, L->F, c->k, got), truth, nt);

		for (uint32_t bi = 0; bi < c->nb; bi++) {
			uint32_t B = c->budgets[bi];
			/* (a) plain frontier */
			int m = dm_vhash_frontier(s->vh, L->lo, L->hi, L->F, q, B, &c->plain, sel,
						  L->F, &info);
			if (m < 1) {
				w->a.errors++;
				continue;
			}
			w->a.rec_plain[fi][bi] += recall(got, scan(fh, fn, sel, (uint32_t)m, c->k, got),
							 truth, nt);
			w->a.n_plain[fi][bi] += m;
			if (fi == 0 && bi == 0)
				s->gaps[qi] = info.gap_rel;
			/* (c) random: m distinct fragments, a partial Fisher-Yates per query */
			uint64_t st = mix64(c->seed ^ mix64(qi * 1000003u + fi * 131u + bi));
			for (uint32_t f = 0; f < L->F; f++)
				perm[f] = f;
			for (uint32_t j = 0; j < (uint32_t)m; j++) {
				st = mix64(st + j);
				uint32_t r = j + (uint32_t)(st % (L->F - j));
				uint32_t t = perm[j];
				perm[j] = perm[r];
				perm[r] = t;
			}
			w->a.rec_rand[fi][bi] += recall(got, scan(fh, fn, perm, (uint32_t)m, c->k, got),
							truth, nt);
			w->a.n_rand[fi][bi] += m;
			/* (b) widened frontier */
			m = dm_vhash_frontier(s->vh, L->lo, L->hi, L->F, q, B, &c->wide, sel, L->F,
					      &info);
			if (m < 1) {
				w->a.errors++;
				continue;
			}
			w->a.rec_wide[fi][bi] += recall(got, scan(fh, fn, sel, (uint32_t)m, c->k, got),
							truth, nt);
			w->a.n_wide[fi][bi] += m;
			if (fi == 0 && bi == 0)
				w->a.widened += info.widened;
		}
	}
}

static void *work(void *arg)
{
	struct worker *w = arg;
	struct shared *s = w->s;
	const struct cfg *c = s->c;
	uint32_t maxF = 0;
	for (uint32_t i = 0; i < c->nf; i++)
		maxF = DM_MAX(maxF, c->frags[i]);
	float *dist = malloc(QBLOCK * s->n * sizeof(*dist));
	struct dm_topk *tk = dm_topk_new(c->k);
	struct dm_hit **fh = calloc(maxF, sizeof(*fh));
	struct dm_hit *fhbuf = malloc((size_t)maxF * c->k * sizeof(*fhbuf));
	size_t *fn = calloc(maxF, sizeof(*fn));
	uint32_t *sel = malloc(maxF * sizeof(*sel)), *perm = malloc(maxF * sizeof(*perm));

	if (!dist || !tk || !fh || !fhbuf || !fn || !sel || !perm) {
		w->a.errors++;
		goto out;
	}
	for (uint32_t f = 0; f < maxF; f++)
		fh[f] = fhbuf + (size_t)f * c->k;
	for (;;) {
		uint64_t q0 = atomic_fetch_add(&s->next, QBLOCK);
		if (q0 >= c->nq)
			break;
		uint32_t nb = (uint32_t)DM_MIN((uint64_t)QBLOCK, c->nq - q0);
		/* one pass over the rows for the block: each row read once, nb distances */
		for (size_t r = 0; r < s->n; r++) {
			const float *x = s->base + r * s->dim;
			for (uint32_t j = 0; j < nb; j++)
				dist[j * s->n + r] = dm_l2sq(s->q + (q0 + j) * s->dim, x, s->dim);
		}
		for (uint32_t j = 0; j < nb; j++)
			eval_query(w, q0 + j, dist + j * s->n, tk, fh, fn, sel, perm);
	}
out:
	free(dist);
	dm_topk_free(tk);
	free(fh);
	free(fhbuf);
	free(fn);
	free(sel);
	free(perm);
	return NULL;
}

/* Fragments of about n / F rows in key order, cut at keys (see the top). */
static int make_layout(struct layout *L, uint32_t F, const uint64_t *keys, size_t n)
{
	L->F = F;
	L->lo = malloc(F * sizeof(*L->lo));
	L->hi = malloc(F * sizeof(*L->hi));
	L->pos = malloc((F + 1) * sizeof(*L->pos));
	if (!L->lo || !L->hi || !L->pos)
		return -ENOMEM;
	L->lo[0] = 0;
	for (uint32_t f = 1; f < F; f++) {
		uint64_t k = keys[(size_t)((unsigned __int128)f * n / F)];
		if (L->lo[f - 1] == UINT64_MAX)
			return -ERANGE;
		L->lo[f] = DM_MAX(k, L->lo[f - 1] + 1);
	}
	for (uint32_t f = 0; f + 1 < F; f++)
		L->hi[f] = L->lo[f + 1] - 1;
	L->hi[F - 1] = UINT64_MAX;
	if (dm_frontier_layout_check(L->lo, L->hi, F))
		return -EINVAL;
	/* pos[f]: the first rank whose key is >= lo[f] (keys ascend) */
	size_t i = 0;
	for (uint32_t f = 0; f < F; f++) {
		while (i < n && keys[i] < L->lo[f])
			i++;
		L->pos[f] = i;
	}
	L->pos[F] = n;
	return 0;
}

static int parse_list(const char *s, uint32_t *out, uint32_t max, uint32_t *n)
{
	char *end;

	*n = 0;
	while (*s) {
		while (*s == ' ' || *s == ',')
			s++;
		if (!*s)
			break;
		errno = 0;
		unsigned long v = strtoul(s, &end, 10);
		if (end == s || errno || v == 0 || v > 4096 || *n >= max)
			return -EINVAL;
		out[(*n)++] = (uint32_t)v;
		s = end;
	}
	return *n ? 0 : -EINVAL;
}

static int dbl_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: frontier_bench --base F --query F [--gt F] [--nq N] [--k K]\n"
		   "       [--frags \"32 64\"] [--budgets \"1 2 4 6 8 12 16\"] [--vhash-k K]\n"
		   "       [--sample S] [--seed S] [--ring R] [--hints H] [--gap G]\n"
		   "       [--wide-extra E] [--threads T] [--label L]\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "base", required_argument, 0, 'b' },    { "query", required_argument, 0, 'q' },
		{ "gt", required_argument, 0, 'g' },      { "nq", required_argument, 0, 'n' },
		{ "k", required_argument, 0, 'k' },       { "frags", required_argument, 0, 'F' },
		{ "budgets", required_argument, 0, 'B' }, { "vhash-k", required_argument, 0, 'K' },
		{ "sample", required_argument, 0, 'S' },  { "seed", required_argument, 0, 's' },
		{ "ring", required_argument, 0, 'r' },    { "hints", required_argument, 0, 'H' },
		{ "gap", required_argument, 0, 'G' },     { "wide-extra", required_argument, 0, 'E' },
		{ "threads", required_argument, 0, 't' }, { "label", required_argument, 0, 'l' },
		{ "help", no_argument, 0, 'h' },          { 0, 0, 0, 0 },
	};
	struct cfg c = { .nq = 1000, .k = 10, .vk = DM_VHASH_K_DEFAULT, .seed = 5, .threads = 2,
			 .label = "data" };
	struct dm_vecs base = { 0 }, qv = { 0 }, gt = { 0 };
	char err[512];
	int ch, rc = 1;

	dm_frontier_opts_default(&c.plain);
	parse_list("32 64", c.frags, MAX_F, &c.nf);
	parse_list("1 2 4 6 8 12 16", c.budgets, MAX_B, &c.nb);
	while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (ch) {
		case 'b': c.base = optarg; break;
		case 'q': c.query = optarg; break;
		case 'g': c.gt = optarg; break;
		case 'n': c.nq = strtoull(optarg, NULL, 10); break;
		case 'k': c.k = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'F':
			if (parse_list(optarg, c.frags, MAX_F, &c.nf)) {
				fprintf(stderr, "frontier_bench: bad --frags '%s'\n", optarg);
				return 2;
			}
			break;
		case 'B':
			if (parse_list(optarg, c.budgets, MAX_B, &c.nb)) {
				fprintf(stderr, "frontier_bench: bad --budgets '%s'\n", optarg);
				return 2;
			}
			break;
		case 'K': c.vk = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'S': c.sample = strtoull(optarg, NULL, 10); break;
		case 's': c.seed = strtoull(optarg, NULL, 10); break;
		case 'r': c.plain.ring = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'H': c.plain.hints = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'G': c.plain.gap_rel = strtod(optarg, NULL); break;
		case 'E': c.plain.wide_extra = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 't': c.threads = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'l': c.label = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!c.base || !c.query || optind < argc || c.k < 1 || c.k > MAX_K || c.threads < 1 ||
	    c.threads > 64 || c.nq < 1 || c.vk < 1) {
		usage(stderr);
		return 2;
	}
	c.wide = c.plain;
	c.wide.widen = true;

	if (dm_vecs_read(c.base, DM_VF_AUTO, &base, err, sizeof(err)) ||
	    dm_vecs_read(c.query, DM_VF_AUTO, &qv, err, sizeof(err)) ||
	    (c.gt && dm_vecs_read(c.gt, DM_VF_AUTO, &gt, err, sizeof(err)))) {
		fprintf(stderr, "frontier_bench: %s\n", err);
		goto out;
	}
	if (base.type != DM_VT_F32 || qv.type != DM_VT_F32 || qv.dim != base.dim ||
	    (c.gt && (gt.type != DM_VT_I32 || gt.dim < c.k || gt.n < DM_MIN(c.nq, qv.n)))) {
		fprintf(stderr, "frontier_bench: base, queries and ground truth do not match\n");
		goto out;
	}
	if (base.n >= UINT32_MAX) {
		fprintf(stderr, "frontier_bench: at most 2^32 - 1 rows\n");
		goto out;
	}
	c.nq = DM_MIN(c.nq, qv.n);
	size_t n = base.n, dim = base.dim;
	for (uint32_t i = 0; i < c.nf; i++)
		if (c.frags[i] > n) {
			fprintf(stderr, "frontier_bench: %u fragments of %zu rows\n", c.frags[i], n);
			goto out;
		}

	/* 1. VHash and key order */
	double t0 = now_s();
	struct dm_vhash *vh = dm_vhash_fit_rows(base.data, n, dim, c.vk, c.sample, false, c.seed);
	if (!vh) {
		fprintf(stderr, "frontier_bench: fitting the VHash (K = %u): %s\n", c.vk,
			strerror(errno));
		goto out;
	}
	double t_fit = now_s() - t0;
	uint32_t *labels = malloc(n * sizeof(*labels));
	uint64_t *keys = malloc(n * sizeof(*keys));
	struct layout lay[MAX_F] = { 0 };
	double *gaps = calloc(c.nq, sizeof(*gaps));
	struct worker *ws = calloc(c.threads, sizeof(*ws));
	if (!labels || !keys || !gaps || !ws) {
		fprintf(stderr, "frontier_bench: out of memory\n");
		goto out_vh;
	}
	t0 = now_s();
	int e = dm_vhash_order(vh, base.data, n, dim, false, c.threads, labels, keys);
	if (e) {
		fprintf(stderr, "frontier_bench: keying the rows: %s\n", strerror(-e));
		goto out_vh;
	}
	double t_order = now_s() - t0;
	/* 2. layouts */
	for (uint32_t i = 0; i < c.nf; i++) {
		e = make_layout(&lay[i], c.frags[i], keys, n);
		if (e) {
			fprintf(stderr, "frontier_bench: layout of %u fragments: %s\n", c.frags[i],
				strerror(-e));
			goto out_vh;
		}
	}
	/* 3-4. queries */
	struct shared sh = { .c = &c, .vh = vh, .base = base.data, .q = qv.data,
			     .gt = c.gt ? gt.data : NULL, .gtk = gt.dim, .n = n, .dim = dim,
			     .labels = labels, .lay = lay, .gaps = gaps };
	atomic_init(&sh.next, 0);
	t0 = now_s();
	for (uint32_t i = 0; i < c.threads; i++) {
		ws[i].s = &sh;
		if (pthread_create(&ws[i].th, NULL, work, &ws[i])) {
			fprintf(stderr, "frontier_bench: pthread_create failed\n");
			for (uint32_t j = 0; j < i; j++)
				pthread_join(ws[j].th, NULL);
			goto out_vh;
		}
	}
	for (uint32_t i = 0; i < c.threads; i++)
		pthread_join(ws[i].th, NULL);
	double t_scan = now_s() - t0;
	struct acc a = { 0 };
	for (uint32_t i = 0; i < c.threads; i++) {
		const struct acc *x = &ws[i].a;
		for (uint32_t fi = 0; fi < c.nf; fi++) {
			a.rec_full[fi] += x->rec_full[fi];
			for (uint32_t bi = 0; bi < c.nb; bi++) {
				a.rec_plain[fi][bi] += x->rec_plain[fi][bi];
				a.rec_wide[fi][bi] += x->rec_wide[fi][bi];
				a.rec_rand[fi][bi] += x->rec_rand[fi][bi];
				a.n_plain[fi][bi] += x->n_plain[fi][bi];
				a.n_wide[fi][bi] += x->n_wide[fi][bi];
				a.n_rand[fi][bi] += x->n_rand[fi][bi];
			}
		}
		a.gt_agree += x->gt_agree;
		a.widened += x->widened;
		a.queries += x->queries;
		a.errors += x->errors;
	}
	if (a.errors || a.queries != c.nq) {
		fprintf(stderr, "frontier_bench: %llu errors, %llu of %llu queries\n",
			(unsigned long long)a.errors, (unsigned long long)a.queries,
			(unsigned long long)c.nq);
		goto out_vh;
	}
	double nq = (double)c.nq;
	qsort(gaps, c.nq, sizeof(*gaps), dbl_cmp);
	/* rows per fragment: the spread the key cut leaves (ties keep rows together) */
	printf("{\"type\": \"meta\", \"label\": \"%s\", \"n\": %zu, \"dim\": %zu, \"nq\": %llu, "
	       "\"k\": %u, \"vhash_k\": %u, \"sample\": %zu, \"seed\": %llu, \"ring\": %u, "
	       "\"hints\": %u, \"gap\": %g, \"wide_extra\": %u, \"fit_s\": %.2f, "
	       "\"order_s\": %.2f, \"scan_s\": %.2f, \"threads\": %u, \"widened_share\": %.4f, "
	       "\"gap_p10\": %.4f, \"gap_p25\": %.4f, \"gap_p50\": %.4f, \"gap_p75\": %.4f, "
	       "\"gt_agree\": %s",
	       c.label, n, dim, (unsigned long long)c.nq, c.k, vh->k,
	       c.sample ? DM_MIN(c.sample, n) : DM_MIN((size_t)c.vk * DM_VHASH_ORDER_SAMPLE_PER_REGION, n),
	       (unsigned long long)c.seed, c.plain.ring, c.plain.hints, c.plain.gap_rel,
	       c.plain.wide_extra, t_fit, t_order, t_scan, c.threads, (double)a.widened / nq,
	       gaps[(size_t)(0.10 * (c.nq - 1))], gaps[(size_t)(0.25 * (c.nq - 1))],
	       gaps[(size_t)(0.50 * (c.nq - 1))], gaps[(size_t)(0.75 * (c.nq - 1))],
	       c.gt ? "" : "null");
	if (c.gt)
		printf("%.4f", a.gt_agree / nq);
	printf(", \"frag_rows\": {");
	for (uint32_t fi = 0; fi < c.nf; fi++) {
		size_t mn = SIZE_MAX, mx = 0;
		for (uint32_t f = 0; f < lay[fi].F; f++) {
			size_t r = lay[fi].pos[f + 1] - lay[fi].pos[f];
			mn = DM_MIN(mn, r);
			mx = DM_MAX(mx, r);
		}
		printf("%s\"%u\": [%zu, %zu]", fi ? ", " : "", lay[fi].F, mn, mx);
	}
	printf("}}\n");
	for (uint32_t fi = 0; fi < c.nf; fi++)
		for (uint32_t bi = 0; bi < c.nb; bi++)
			printf("{\"type\": \"row\", \"label\": \"%s\", \"F\": %u, \"B\": %u, "
			       "\"recall_frontier\": %.4f, \"frags_frontier\": %.3f, "
			       "\"recall_wide\": %.4f, \"frags_wide\": %.3f, "
			       "\"recall_random\": %.4f, \"frags_random\": %.3f, "
			       "\"recall_full\": %.4f}\n",
			       c.label, c.frags[fi], c.budgets[bi], a.rec_plain[fi][bi] / nq,
			       a.n_plain[fi][bi] / nq, a.rec_wide[fi][bi] / nq, a.n_wide[fi][bi] / nq,
			       a.rec_rand[fi][bi] / nq, a.n_rand[fi][bi] / nq, a.rec_full[fi] / nq);
	rc = 0;
out_vh:
	for (uint32_t i = 0; i < MAX_F; i++) {
		free(lay[i].lo);
		free(lay[i].hi);
		free(lay[i].pos);
	}
	free(ws);
	free(gaps);
	free(keys);
	free(labels);
	dm_vhash_free(vh);
out:
	dm_vecs_free(&base);
	dm_vecs_free(&qv);
	dm_vecs_free(&gt);
	return rc;
}
