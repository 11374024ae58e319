/* test_hnsw.c: the HNSW engine (common/hnsw): recall against brute force for l2, ip and cos,
 * determinism of single-threaded builds, a valid graph from parallel builds, the index image
 * (bit-exact round trip; corrupted, truncated and structurally invalid images refused), bad
 * parameters, and the dmann gen/build/search commands end to end. */
#include <criterion/criterion.h>

#include "distance.h"
#include "hnsw/hnsw.h"
#include "hnsw/hnsw_codes.h"
#include "topk.h"
#include "test_files.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- data ------------------------------------------------------------------------------- */

static uint64_t rs;

static uint64_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return rs;
}

static float gauss(void)
{
	double u = ((double)(rnd() >> 11) + 0.5) / 9007199254740992.0;
	double v = ((double)(rnd() >> 11) + 0.5) / 9007199254740992.0;
	return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Gaussian mixture: C clusters, each spread along r random directions, plus isotropic
 * noise; shift moves every vector (varied norms for the ip test). */
static float *mixture(uint32_t n, uint32_t dim, uint32_t C, uint32_t r, float noise, float shift,
		      uint64_t seed)
{
	rs = seed * 2654435761u + 1;
	float *cent = malloc((size_t)C * dim * sizeof(float));
	float *basis = malloc((size_t)C * r * dim * sizeof(float));
	float *x = malloc((size_t)n * dim * sizeof(float));
	cr_assert(cent && basis && x);
	for (size_t i = 0; i < (size_t)C * dim; i++)
		cent[i] = gauss() + shift;
	for (size_t i = 0; i < (size_t)C * r * dim; i++)
		basis[i] = gauss() / sqrtf((float)dim);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t c = (uint32_t)(rnd() % C);
		float *v = x + (size_t)i * dim;
		memcpy(v, cent + (size_t)c * dim, dim * sizeof(float));
		for (uint32_t k = 0; k < r; k++) {
			float z = gauss() * 1.5f;
			for (uint32_t j = 0; j < dim; j++)
				v[j] += z * basis[((size_t)c * r + k) * dim + j];
		}
		for (uint32_t j = 0; j < dim; j++)
			v[j] += noise * gauss();
	}
	free(cent);
	free(basis);
	return x;
}

/* Exact top-k ids by the metric's distance (dm_distance, independent of the graph code). */
static uint64_t *brute(enum dm_metric m, const float *base, uint32_t n, const float *q,
		       uint32_t nq, uint32_t dim, uint32_t k)
{
	uint64_t *ids = malloc((size_t)nq * k * sizeof(*ids));
	struct dm_topk *t = dm_topk_new(k);
	struct dm_hit *h = malloc(k * sizeof(*h));
	cr_assert(ids && t && h);
	for (uint32_t i = 0; i < nq; i++) {
		dm_topk_reset(t);
		for (uint32_t j = 0; j < n; j++)
			dm_topk_push(t, dm_distance(m, q + (size_t)i * dim, base + (size_t)j * dim, dim), j);
		size_t got = dm_topk_drain(t, h);
		cr_assert_eq(got, k);
		for (uint32_t j = 0; j < k; j++)
			ids[(size_t)i * k + j] = h[j].id;
	}
	dm_topk_free(t);
	free(h);
	return ids;
}

/* recall@k of the index over nq queries at ef; optionally checks the returned distances. */
static double recall_at(const struct hnsw_index *idx, const float *q, uint32_t nq,
			const uint64_t *gt, uint32_t k, uint32_t ef, const float *base)
{
	struct hnsw_src src;
	hnsw_src_local(idx, &src);
	struct hnsw_searcher *s = hnsw_searcher_new(idx->n, idx->p.dim);
	struct dm_hit *h = malloc(k * sizeof(*h));
	cr_assert(s && h);
	uint64_t found = 0;
	for (uint32_t i = 0; i < nq; i++) {
		const float *qv = q + (size_t)i * idx->p.dim;
		int n = hnsw_search(&src, s, qv, k, ef, h);
		cr_assert_eq(n, (int)k, "query %u: %d hits", i, n);
		for (int j = 0; j < n; j++) {
			if (j)
				cr_assert(h[j - 1].dist <= h[j].dist, "hits not ascending");
			if (base) {
				float d = dm_distance(idx->p.metric, qv, base + h[j].id * idx->p.dim,
						      idx->p.dim);
				cr_assert(fabsf(d - h[j].dist) <= 1e-3f * (1.0f + fabsf(d)),
					  "distance of hit %llu: %g, exact %g", (unsigned long long)h[j].id,
					  h[j].dist, d);
			}
			for (uint32_t t = 0; t < k; t++)
				if (gt[(size_t)i * k + t] == h[j].id) {
					found++;
					break;
				}
		}
	}
	hnsw_searcher_free(s);
	free(h);
	return (double)found / ((double)nq * k);
}

static struct hnsw_params params(uint32_t dim, enum dm_metric m, uint32_t M, uint32_t efc)
{
	struct hnsw_params p = { .dim = dim, .metric = m, .M = M, .ef_construction = efc,
				 .seed = 7, .block_shift = 10 };
	return p;
}

static struct hnsw_index *build(const struct hnsw_params *p, const float *x, uint32_t n,
				unsigned threads)
{
	char err[256] = "";
	struct hnsw_index *idx = hnsw_build(p, x, n, threads, NULL, NULL, err, sizeof(err));
	cr_assert(idx, "build failed: %s", err);
	cr_assert_eq(hnsw_validate(idx, err, sizeof(err)), 0, "invalid graph: %s", err);
	return idx;
}

/* ---- recall ----------------------------------------------------------------------------- */

Test(hnsw, recall_l2_20k_x_128, .timeout = 300)
{
	const uint32_t n = 20000, nq = 200, dim = 128, k = 10;
	float *x = mixture(n + nq, dim, 32, 24, 0.3f, 0.0f, 1);
	const float *q = x + (size_t)n * dim;
	uint64_t *gt = brute(DM_METRIC_L2, x, n, q, nq, dim, k);
	struct hnsw_params p = params(dim, DM_METRIC_L2, 16, 200);
	struct hnsw_index *idx = build(&p, x, n, 2);
	double r = recall_at(idx, q, nq, gt, k, 128, x);
	cr_log_info("l2 20k x 128: recall@10 at ef=128 = %.4f (ef=16: %.4f)", r,
		    recall_at(idx, q, nq, gt, k, 16, NULL));
	cr_assert(r >= 0.95, "recall@10 %.4f < 0.95", r);
	hnsw_free(idx);
	free(gt);
	free(x);
}

Test(hnsw, recall_cos)
{
	const uint32_t n = 5000, nq = 100, dim = 64, k = 10;
	float *x = mixture(n + nq, dim, 16, 16, 0.2f, 0.0f, 2);
	const float *q = x + (size_t)n * dim;
	uint64_t *gt = brute(DM_METRIC_COS, x, n, q, nq, dim, k);
	struct hnsw_params p = params(dim, DM_METRIC_COS, 16, 100);
	struct hnsw_index *idx = build(&p, x, n, 1);
	/* stored vectors are normalised */
	for (uint32_t i = 0; i < n; i += 97) {
		const float *v = hnsw_rec_vec(hnsw_rec(idx, i), idx->vec_off);
		cr_assert(fabsf(dm_norm(v, dim) - 1.0f) < 1e-4f, "record %u not normalised", i);
	}
	double r = recall_at(idx, q, nq, gt, k, 128, x);
	cr_log_info("cos: recall@10 at ef=128 = %.4f", r);
	cr_assert(r >= 0.95, "cos recall@10 %.4f < 0.95", r);
	hnsw_free(idx);
	free(gt);
	free(x);
}

Test(hnsw, recall_ip)
{
	const uint32_t n = 5000, nq = 100, dim = 64, k = 10;
	/* shifted data: norms differ, so ip ranks differently from cos and l2 */
	float *x = mixture(n + nq, dim, 16, 16, 0.2f, 0.5f, 3);
	const float *q = x + (size_t)n * dim;
	uint64_t *gt = brute(DM_METRIC_IP, x, n, q, nq, dim, k);
	uint64_t *gtl2 = brute(DM_METRIC_L2, x, n, q, nq, dim, k);
	size_t same = 0;
	for (size_t i = 0; i < (size_t)nq * k; i++)
		same += gt[i] == gtl2[i];
	cr_assert(same < (size_t)nq * k / 2, "ip and l2 ground truths should differ");
	struct hnsw_params p = params(dim, DM_METRIC_IP, 16, 100);
	struct hnsw_index *idx = build(&p, x, n, 1);
	double r = recall_at(idx, q, nq, gt, k, 128, x);
	cr_log_info("ip: recall@10 at ef=128 = %.4f", r);
	cr_assert(r >= 0.90, "ip recall@10 %.4f < 0.90", r);
	hnsw_free(idx);
	free(gt);
	free(gtl2);
	free(x);
}

/* ---- neighbour codes (RaBitQ) ------------------------------------------------------------ */

/* recall@10 >= 0.95 at the stated ef with codes; hits carry exact distances (checked). */
static void recall_codes(enum dm_metric m, float shift, uint32_t ef, uint64_t seed)
{
	const uint32_t n = 5000, nq = 100, dim = 64, k = 10;
	float *x = mixture(n + nq, dim, 16, 16, 0.2f, shift, seed);
	const float *q = x + (size_t)n * dim;
	uint64_t *gt = brute(m, x, n, q, nq, dim, k);
	struct hnsw_params p = params(dim, m, 16, 100);
	p.codes = HNSW_CODES_RABITQ;
	struct hnsw_index *idx = build(&p, x, n, 2);
	cr_assert(idx->quant && idx->code_bytes > 0 && idx->vdim >= dim);
	double r = recall_at(idx, q, nq, gt, k, ef, x);
	cr_log_info("codes %s: recall@10 at ef=%u = %.4f", dm_metric_name(m), ef, r);
	cr_assert(r >= 0.95, "codes %s recall@10 at ef=%u: %.4f < 0.95", dm_metric_name(m), ef, r);
	hnsw_free(idx);
	free(gt);
	free(x);
}

Test(hnsw, recall_codes_l2, .timeout = 120) { recall_codes(DM_METRIC_L2, 0.0f, 64, 11); }
Test(hnsw, recall_codes_cos, .timeout = 120) { recall_codes(DM_METRIC_COS, 0.0f, 64, 12); }
Test(hnsw, recall_codes_ip, .timeout = 120) { recall_codes(DM_METRIC_IP, 0.5f, 128, 13); }

/* The estimates of a node's code list against exact distances: the error bound holds for
 * most neighbours, and the estimates rank neighbours much like the exact scores. */
Test(hnsw, codes_error_bound, .timeout = 120)
{
	const uint32_t n = 3000, nq = 20, dim = 96;
	float *x = mixture(n + nq, dim, 8, 16, 0.3f, 0.0f, 21);
	struct hnsw_params p = params(dim, DM_METRIC_L2, 16, 100);
	p.codes = HNSW_CODES_RABITQ;
	struct hnsw_index *idx = build(&p, x, n, 1);
	struct hnsw_qest *e = hnsw_qest_new(idx->quant, p.M);
	float *qr = malloc(idx->vdim * sizeof(float)), est[64], lb[64];
	cr_assert(e && qr);
	uint64_t total = 0, covered = 0;
	double err2 = 0, d2 = 0;
	for (uint32_t i = 0; i < nq; i++) {
		hnsw_quant_rotate(idx->quant, x + (size_t)(n + i) * dim, qr);
		hnsw_qest_query(e, qr);
		for (uint32_t u = i; u < n; u += 97) {
			const struct hnsw_rec_hdr *r = hnsw_rec(idx, u);
			const float *uv = hnsw_rec_vec(r, idx->vec_off);
			float du = dm_l2sq(qr, uv, idx->vdim);
			hnsw_qest_list(e, uv, du, hnsw_rec_codes(r, p.M), r->n0, est, lb);
			for (uint32_t j = 0; j < r->n0; j++) {
				uint32_t v = hnsw_rec_nbrs(r)[j];
				float d = dm_l2sq(x + (size_t)(n + i) * dim, x + (size_t)v * dim, dim);
				total++;
				covered += lb[j] <= d * (1 + 1e-4f) + 1e-4f;
				err2 += (double)(est[j] - d) * (est[j] - d);
				d2 += (double)d * d;
			}
		}
	}
	double cov = (double)covered / (double)total, rel = sqrt(err2 / d2);
	cr_log_info("codes: %llu estimates, lower bound holds for %.4f, relative rms error %.4f",
		    (unsigned long long)total, cov, rel);
	cr_assert(total > 1000);
	cr_assert(cov >= 0.95, "lower bound holds for only %.4f of the estimates", cov);
	cr_assert(rel < 0.25, "relative rms error %.4f", rel);
	free(qr);
	hnsw_qest_free(e);
	hnsw_free(idx);
	free(x);
}

/* A single-threaded build with codes has exactly the graph of the one without (the graph is
 * built over the original vectors, the rotation comes after). */
Test(hnsw, codes_same_graph, .timeout = 60)
{
	const uint32_t n = 2000, dim = 50;
	float *x = mixture(n, dim, 8, 8, 0.2f, 0.0f, 9);
	struct hnsw_params p = params(dim, DM_METRIC_L2, 8, 60);
	struct hnsw_index *a = build(&p, x, n, 1);
	p.codes = HNSW_CODES_RABITQ;
	struct hnsw_index *b = build(&p, x, n, 1);
	cr_assert_eq(a->entry, b->entry);
	cr_assert_eq(a->max_level, b->max_level);
	for (uint32_t i = 0; i < n; i++) {
		const struct hnsw_rec_hdr *ra = hnsw_rec(a, i), *rb = hnsw_rec(b, i);
		cr_assert_eq(ra->n0, rb->n0, "node %u", i);
		cr_assert(!memcmp(hnsw_rec_nbrs(ra), hnsw_rec_nbrs(rb), ra->n0 * 4), "node %u", i);
		for (uint32_t l = 1; l <= ra->level; l++)
			cr_assert(!memcmp(hnsw_up_list(a, i, l), hnsw_up_list(b, i, l),
					  (1 + p.M) * 4), "node %u level %u", i, l);
	}
	hnsw_free(a);
	hnsw_free(b);
	free(x);
}

/* Stored vectors are rotated (and normalised for cos); unrotating gives the originals, and
 * every record has seq 0 and a matching CRC32C. */
Test(hnsw, codes_records)
{
	const uint32_t n = 500, dim = 40;
	float *x = mixture(n, dim, 4, 8, 0.2f, 0.0f, 5);
	struct hnsw_params p = params(dim, DM_METRIC_COS, 8, 50);
	p.codes = HNSW_CODES_RABITQ;
	struct hnsw_index *idx = build(&p, x, n, 2);
	float *o = malloc(idx->vdim * sizeof(float)), v[64];
	for (uint32_t i = 0; i < n; i++) {
		const struct hnsw_rec_hdr *r = hnsw_rec(idx, i);
		cr_assert_eq(r->seq, 0);
		cr_assert(hnsw_rec_stable(r, idx->rec_size), "record %u: CRC", i);
		if (i % 50)
			continue;
		hnsw_quant_unrotate(idx->quant, hnsw_rec_vec(r, idx->vec_off), o);
		memcpy(v, x + (size_t)i * dim, dim * sizeof(float));
		dm_normalize(v, dim);
		for (uint32_t j = 0; j < dim; j++)
			cr_assert(fabsf(o[j] - v[j]) < 1e-4f, "record %u dim %u: %g vs %g", i, j, o[j], v[j]);
	}
	/* a flipped bit anywhere in the body fails the reader's check */
	struct hnsw_rec_hdr *r = hnsw_rec(idx, 7);
	((uint8_t *)r)[idx->rec_size - 70] ^= 1;
	cr_assert(!hnsw_rec_stable(r, idx->rec_size));
	((uint8_t *)r)[idx->rec_size - 70] ^= 1;
	r->seq = 1;
	cr_assert(!hnsw_rec_stable(r, idx->rec_size), "odd seq: a writer holds it");
	r->seq = 0;
	free(o);
	hnsw_free(idx);
	free(x);
}

Test(hnsw, search_edges)
{
	const uint32_t n = 300, dim = 8;
	float *x = mixture(n, dim, 4, 4, 0.1f, 0.0f, 4);
	struct hnsw_params p = params(dim, DM_METRIC_L2, 4, 20);
	struct hnsw_index *idx = build(&p, x, n, 1);
	struct hnsw_src src;
	hnsw_src_local(idx, &src);
	struct hnsw_searcher *s = hnsw_searcher_new(n, dim);
	struct dm_hit h[400];
	/* k larger than the index: every node, once */
	int got = hnsw_search(&src, s, x, 400, 10, h);
	cr_assert_eq(got, (int)n);
	bool *seen = calloc(n, 1);
	for (int i = 0; i < got; i++) {
		cr_assert(h[i].id < n && !seen[h[i].id]);
		seen[h[i].id] = true;
	}
	free(seen);
	/* a base vector finds itself first at distance 0 */
	got = hnsw_search(&src, s, x + 17 * dim, 1, 1, h);
	cr_assert_eq(got, 1);
	cr_assert_eq(h[0].dist, 0.0f);
	cr_assert_eq(hnsw_search(&src, s, x, 0, 10, h), 0);
	/* a searcher of the wrong dimension is refused */
	struct hnsw_searcher *s2 = hnsw_searcher_new(n, dim + 1);
	cr_assert_eq(hnsw_search(&src, s2, x, 1, 10, h), -EINVAL);
	hnsw_searcher_free(s2);
	hnsw_searcher_free(s);
	hnsw_free(idx);
	free(x);
}

/* ---- build ------------------------------------------------------------------------------ */

static void spit(const char *path, const void *b, size_t len)
{
	FILE *f = fopen(path, "wb");
	cr_assert(f && fwrite(b, 1, len, f) == len);
	cr_assert_eq(fclose(f), 0);
}

static void save(const struct hnsw_index *idx, const char *path)
{
	char err[256] = "";
	cr_assert_eq(hnsw_save(idx, path, err, sizeof(err)), 0, "save: %s", err);
}

Test(hnsw, deterministic_single_thread)
{
	const uint32_t n = 3000, dim = 32;
	float *x = mixture(n, dim, 8, 8, 0.2f, 0.0f, 5);
	struct hnsw_params p = params(dim, DM_METRIC_L2, 8, 64);
	struct hnsw_index *a = build(&p, x, n, 1), *b = build(&p, x, n, 1);
	char *d = tmpdir_new("test_hnsw"), pa[256], pb[256], pc[256];
	snprintf(pa, sizeof(pa), "%s/a.idx", d);
	snprintf(pb, sizeof(pb), "%s/b.idx", d);
	snprintf(pc, sizeof(pc), "%s/c.idx", d);
	save(a, pa);
	save(b, pb);
	cr_assert(same_file(pa, pb), "two 1-thread builds with the same seed differ");
	p.seed = 8;
	struct hnsw_index *c = build(&p, x, n, 1);
	save(c, pc);
	cr_assert(!same_file(pa, pc), "another seed gave the same graph");
	hnsw_free(a);
	hnsw_free(b);
	hnsw_free(c);
	rmtree(d);
	free(d);
	free(x);
}

Test(hnsw, parallel_build_valid)
{
	const uint32_t n = 4000, nq = 100, dim = 32, k = 10;
	float *x = mixture(n + nq, dim, 8, 8, 0.2f, 0.0f, 6);
	const float *q = x + (size_t)n * dim;
	uint64_t *gt = brute(DM_METRIC_L2, x, n, q, nq, dim, k);
	struct hnsw_params p = params(dim, DM_METRIC_L2, 12, 100);
	struct hnsw_index *idx = build(&p, x, n, 4);
	/* every node is reachable on level 0 from the entry point */
	bool *seen = calloc(n, 1);
	uint32_t *stack = malloc(n * sizeof(*stack)), top = 0, cnt = 1;
	stack[top++] = idx->entry;
	seen[idx->entry] = true;
	while (top) {
		const struct hnsw_rec_hdr *r = hnsw_rec(idx, stack[--top]);
		for (uint32_t j = 0; j < r->n0; j++) {
			uint32_t v = hnsw_rec_nbrs(r)[j];
			if (!seen[v]) {
				seen[v] = true;
				stack[top++] = v;
				cnt++;
			}
		}
	}
	/* heuristic pruning can orphan a few nodes (as in hnswlib); a race used to strand dozens */
	cr_assert(cnt >= n - n / 400, "only %u of %u nodes reachable", cnt, n);
	double r = recall_at(idx, q, nq, gt, k, 128, x);
	cr_assert(r >= 0.95, "4-thread build recall %.4f", r);
	free(seen);
	free(stack);
	free(gt);
	hnsw_free(idx);
	free(x);
}

Test(hnsw, bad_input_refused)
{
	char err[256];
	float x[64];
	for (int i = 0; i < 64; i++)
		x[i] = (float)i;
	struct hnsw_params p = params(8, DM_METRIC_L2, 1, 10);
	cr_assert_null(hnsw_build(&p, x, 8, 1, NULL, NULL, err, sizeof(err)));
	cr_assert(strstr(err, "M=1"), "message: %s", err);
	p = params(0, DM_METRIC_L2, 8, 10);
	cr_assert_null(hnsw_build(&p, x, 8, 1, NULL, NULL, err, sizeof(err)));
	p = params(8, DM_METRIC_L2, 8, 10);
	cr_assert_null(hnsw_build(&p, x, 0, 1, NULL, NULL, err, sizeof(err)));
	x[13] = NAN;
	cr_assert_null(hnsw_build(&p, x, 8, 1, NULL, NULL, err, sizeof(err)));
	cr_assert(strstr(err, "non-finite"), "message: %s", err);
	x[13] = 0;
	memset(x + 16, 0, 8 * sizeof(float));
	p.metric = DM_METRIC_COS;
	cr_assert_null(hnsw_build(&p, x, 8, 1, NULL, NULL, err, sizeof(err)));
	cr_assert(strstr(err, "zero norm"), "message: %s", err);
}

/* ---- image ------------------------------------------------------------------------------ */

struct img_fixture {
	char *dir;
	char path[256];
	float *x;
	struct hnsw_index *idx;
};

static void img_setup(struct img_fixture *f)
{
	const uint32_t n = 2500, dim = 24;
	f->x = mixture(n, dim, 8, 6, 0.2f, 0.0f, 9);
	struct hnsw_params p = params(dim, DM_METRIC_L2, 8, 40);
	p.block_shift = 8;   /* several blocks, the last one partial */
	f->idx = build(&p, f->x, n, 2);
	f->dir = tmpdir_new("test_hnsw");
	snprintf(f->path, sizeof(f->path), "%s/a.idx", f->dir);
	save(f->idx, f->path);
}

static void img_teardown(struct img_fixture *f)
{
	hnsw_free(f->idx);
	rmtree(f->dir);
	free(f->dir);
	free(f->x);
}

Test(hnsw, image_round_trip_bit_exact)
{
	struct img_fixture f;
	img_setup(&f);
	char err[256] = "", p2[300];
	struct hnsw_index *b = hnsw_load(f.path, err, sizeof(err));
	cr_assert(b, "load: %s", err);
	const struct hnsw_index *a = f.idx;
	cr_assert_eq(a->n, b->n);
	cr_assert_eq(a->entry, b->entry);
	cr_assert_eq(a->max_level, b->max_level);
	cr_assert(a->p.dim == b->p.dim && a->p.metric == b->p.metric && a->p.M == b->p.M &&
		  a->p.ef_construction == b->p.ef_construction && a->p.seed == b->p.seed &&
		  a->p.block_shift == b->p.block_shift);
	cr_assert_eq(a->nblocks, b->nblocks);
	for (uint32_t i = 0; i < a->n; i++) {
		cr_assert(!memcmp(hnsw_rec(a, i), hnsw_rec(b, i), a->rec_size), "record %u differs", i);
		uint32_t lv = hnsw_rec(a, i)->level;
		if (lv)
			cr_assert(!memcmp(a->upl[i], b->upl[i], lv * hnsw_up_list_words(a->p.M) * 4),
				  "upper lists of %u differ", i);
	}
	snprintf(p2, sizeof(p2), "%s/b.idx", f.dir);
	save(b, p2);
	cr_assert(same_file(f.path, p2), "save(load(image)) is not the same file");
	/* and the loaded index answers exactly like the original */
	struct hnsw_src sa, sb;
	hnsw_src_local(a, &sa);
	hnsw_src_local(b, &sb);
	struct hnsw_searcher *s = hnsw_searcher_new(a->n, a->p.dim);
	struct dm_hit ha[10], hb[10];
	for (uint32_t i = 0; i < 50; i++) {
		const float *q = f.x + (size_t)i * 7 * a->p.dim;
		int na = hnsw_search(&sa, s, q, 10, 32, ha), nb = hnsw_search(&sb, s, q, 10, 32, hb);
		cr_assert_eq(na, nb);
		cr_assert(!memcmp(ha, hb, (size_t)na * sizeof(*ha)));
	}
	hnsw_searcher_free(s);
	hnsw_free(b);
	img_teardown(&f);
}

/* Load must fail and say why (the message must contain want). */
static void refused(const char *path, const char *want)
{
	char err[512] = "";
	struct hnsw_index *idx = hnsw_load(path, err, sizeof(err));
	cr_assert_null(idx, "a damaged image (%s) was accepted", want);
	cr_assert(strstr(err, path), "message does not name the file: %s", err);
	cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
}

Test(hnsw, image_corruption_refused)
{
	struct img_fixture f;
	img_setup(&f);
	size_t len;
	unsigned char *img = slurp(f.path, &len);
	char p[300];
	snprintf(p, sizeof(p), "%s/bad.idx", f.dir);
	/* header fields (magic, dim, n...), block table, upper area, first and last block */
	uint64_t data_off;
	memcpy(&data_off, img + 88, sizeof(data_off));   /* struct img_hdr.data_off */
	cr_assert(data_off % 4096 == 0 && data_off < len);
	struct { size_t off; const char *want; } flips[] = {
		{ 0, "magic" }, { 16, "header checksum" }, { 44, "header checksum" },
		{ 162, "block table checksum" }, { 160 + 16 * 10 + 8, "upper area checksum" },
		{ data_off - 1, "padding" }, { data_off + 3, "block 0 checksum" },
		{ len - 5, "block 9 checksum" },
	};
	for (size_t i = 0; i < DM_ARRAY_SIZE(flips); i++) {
		cr_assert(flips[i].off < len);
		img[flips[i].off] ^= 0x20;
		spit(p, img, len);
		refused(p, flips[i].want);
		img[flips[i].off] ^= 0x20;
	}
	/* truncated anywhere, and trailing bytes */
	size_t cuts[] = { 0, 10, 127, 128, 200, len / 2, len - 1 };
	for (size_t i = 0; i < DM_ARRAY_SIZE(cuts); i++) {
		spit(p, img, cuts[i]);
		refused(p, cuts[i] < 128 ? "truncated" : "truncated");
	}
	/* an image of the old record layout (format 1) names the rebuild command */
	uint32_t fmt = 1, keepfmt;
	memcpy(&keepfmt, img + 8, 4);
	memcpy(img + 8, &fmt, 4);
	spit(p, img, len);
	refused(p, "dmann build");
	memcpy(img + 8, &keepfmt, 4);
	unsigned char *longer = malloc(len + 3);
	memcpy(longer, img, len);
	memset(longer + len, 0, 3);
	spit(p, longer, len + 3);
	refused(p, "trailing");
	free(longer);
	spit(p, img, len);
	char err[256];
	struct hnsw_index *ok = hnsw_load(p, err, sizeof(err));
	cr_assert(ok, "the undamaged copy must load: %s", err);
	hnsw_free(ok);
	refused("/nonexistent/x.idx", "cannot open");
	free(img);
	img_teardown(&f);
}

Test(hnsw, image_invalid_graph_refused)
{
	/* checksums are right (save computes them) but the graph is not: a neighbour id out
	 * of range, then an upper-level link to a node without that level */
	struct img_fixture f;
	img_setup(&f);
	char p[300];
	snprintf(p, sizeof(p), "%s/bad.idx", f.dir);
	struct hnsw_rec_hdr *r = hnsw_rec(f.idx, 5);
	cr_assert(r->n0 > 0);
	uint32_t *nb = (uint32_t *)hnsw_rec_nbrs(r), keep = nb[0];
	nb[0] = f.idx->n + 3;
	save(f.idx, p);
	refused(p, "out of range");
	nb[0] = keep;
	uint32_t up = UINT32_MAX, low = UINT32_MAX;
	for (uint32_t i = 0; i < f.idx->n && (up == UINT32_MAX || low == UINT32_MAX); i++) {
		uint32_t lv = hnsw_rec(f.idx, i)->level;
		if (lv && hnsw_up_list(f.idx, i, 1)[0] > 0 && up == UINT32_MAX)
			up = i;
		if (!lv && low == UINT32_MAX)
			low = i;
	}
	cr_assert(up != UINT32_MAX && low != UINT32_MAX);
	uint32_t *w = hnsw_up_list(f.idx, up, 1);
	keep = w[1];
	w[1] = low;
	save(f.idx, p);
	refused(p, "invalid");
	w[1] = keep;
	r->n0 = 2 * f.idx->p.M + 1;
	save(f.idx, p);
	refused(p, "bad header");
	img_teardown(&f);
}

/* ---- CLI -------------------------------------------------------------------------------- */

static int run(const char *args, char *out, size_t outlen)
{
	const char *root = getenv("DMANN_BUILD_ROOT");
	cr_assert(root, "DMANN_BUILD_ROOT not set (run through meson test)");
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "'%s/cn/dmann' %s 2>&1", root, args);
	FILE *f = popen(cmd, "r");
	cr_assert(f);
	size_t n = fread(out, 1, outlen - 1, f);
	out[n] = 0;
	int st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(hnsw, cli_gen_build_search, .timeout = 120)
{
	char *d = tmpdir_new("test_hnsw"), a[1024], out[8192];
	snprintf(a, sizeof(a), "gen --kind deep --n 3000 --nq 50 --seed 3 --out %s/g", d);
	cr_assert_eq(run(a, out, sizeof(out)), 0, "%s", out);
	snprintf(a, sizeof(a), "build --base %s/g/base.fbin --metric l2 --M 12 --efc 100 --threads 2 --out %s/i",
		 d, d);
	cr_assert_eq(run(a, out, sizeof(out)), 0, "%s", out);
	snprintf(a, sizeof(a), "search --index %s/i --query %s/g/query.fbin --gt %s/g/gt.ibin --k 10 --ef 10,128 --json",
		 d, d, d);
	cr_assert_eq(run(a, out, sizeof(out)), 0, "%s", out);
	char *l2 = strchr(out, '\n');
	cr_assert(l2 && strstr(out, "\"ef\":10,") && strstr(l2, "\"ef\":128,"), "%s", out);
	double rec = atof(strstr(l2, "\"recall\":") + 9);
	cr_assert(rec >= 0.95, "recall at ef=128 %.4f: %s", rec, out);
	cr_assert(strstr(out, "\"qps\":") && strstr(out, "\"p50_us\":") && strstr(out, "\"p99_us\":"));
	/* same seed, same files */
	snprintf(a, sizeof(a), "gen --kind deep --n 3000 --nq 50 --seed 3 --out %s/h", d);
	cr_assert_eq(run(a, out, sizeof(out)), 0, "%s", out);
	char x1[300], x2[300];
	snprintf(x1, sizeof(x1), "%s/g/base.fbin", d);
	snprintf(x2, sizeof(x2), "%s/h/base.fbin", d);
	cr_assert(same_file(x1, x2));
	rmtree(d);
	free(d);
}

Test(hnsw, cli_bad_arguments)
{
	char out[4096];
	struct { const char *args; const char *want; } bad[] = {
		{ "gen --kind foo --n 10 --nq 1 --seed 1 --out /tmp/x", "--kind 'foo'" },
		{ "gen --kind sift --n 0 --nq 1 --seed 1 --out /tmp/x", "--n: '0'" },
		{ "gen --kind sift --n 10 --nq 1 --out /tmp/x", "required" },
		{ "gen --kind sift --n 10 --nq 1 --seed 1 --out /tmp/x --zipf -1", "--zipf" },
		{ "build --base x.fbin --M abc --out y", "--M: 'abc'" },
		{ "build --base x.fbin --metric hamming --out y", "--metric 'hamming'" },
		{ "build --base x.fbin --threads 0 --out y", "--threads: '0'" },
		{ "build --base /nonexistent.fbin --out /tmp/y", "nonexistent" },
		{ "build --bogus", "unknown option '--bogus'" },
		{ "build --base", "needs a value" },
		{ "search --index /nonexistent.idx --query q.fbin", "cannot open" },
		{ "search --index i --query q --ef 10,x", "--ef: 'x'" },
		{ "search --index i --query q --k 0", "--k: '0'" },
		{ "fmnist", "--out DIR is required" },
	};
	for (size_t i = 0; i < DM_ARRAY_SIZE(bad); i++) {
		int st = run(bad[i].args, out, sizeof(out));
		cr_assert(st == 1 || st == 2, "'%s' exited %d", bad[i].args, st);
		cr_assert(strstr(out, bad[i].want), "'%s': message '%s' lacks '%s'", bad[i].args, out,
			  bad[i].want);
	}
	const char *helps[] = { "gen --help", "fmnist --help", "build --help", "search --help" };
	for (size_t i = 0; i < DM_ARRAY_SIZE(helps); i++) {
		cr_assert_eq(run(helps[i], out, sizeof(out)), 0);
		cr_assert(strstr(out, "usage: dmann"), "%s", out);
	}
}
