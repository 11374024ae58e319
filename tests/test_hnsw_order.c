/* test_hnsw_order.c: HNSW graphs whose nodes are numbered in another order than the rows
 * they were built from (hnsw_build_ordered, what `dmann build --order vhash` uses): with one
 * thread the same graph as hnsw_build renamed, the same answers once labels are applied, the
 * label map saved in the image (format 3; format 2 without one) and loaded back, and a
 * damaged or non-permutation map refused. */
#include <criterion/criterion.h>

#include "hnsw/hnsw.h"
#include "test_files.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

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

/* n points around C random centres (unit Gaussians, spread 0.3). */
static float *mixture(uint32_t n, uint32_t dim, uint32_t C, uint64_t seed)
{
	float *cent = malloc((size_t)C * dim * sizeof(float));
	float *x = malloc((size_t)n * dim * sizeof(float));

	cr_assert(cent && x);
	rs = seed * 2654435761u + 1;
	for (size_t i = 0; i < (size_t)C * dim; i++)
		cent[i] = gauss();
	for (uint32_t i = 0; i < n; i++) {
		uint32_t c = (uint32_t)(rnd() % C);

		for (uint32_t j = 0; j < dim; j++)
			x[(size_t)i * dim + j] = cent[(size_t)c * dim + j] + 0.3f * gauss();
	}
	free(cent);
	return x;
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
	return idx;
}

static void save(const struct hnsw_index *idx, const char *path)
{
	char err[256] = "";

	cr_assert_eq(hnsw_save(idx, path, err, sizeof(err)), 0, "save: %s", err);
}

/* Load must fail and say why (the message must contain want). */
static void refused(const char *path, const char *want)
{
	char err[512] = "";
	struct hnsw_index *idx = hnsw_load(path, err, sizeof(err));

	cr_assert_null(idx, "a damaged image (%s) was accepted", want);
	cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
}

/* A reversed-and-shuffled numbering: node i = row labels[i]. */
static uint32_t *shuffled_labels(uint32_t n, uint64_t seed)
{
	uint32_t *l = malloc(n * sizeof(*l));

	cr_assert(l);
	rs = seed;
	for (uint32_t i = 0; i < n; i++)
		l[i] = i;
	for (uint32_t i = n - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(rnd() % (i + 1)), t = l[i];

		l[i] = l[j];
		l[j] = t;
	}
	return l;
}

/* With one thread, hnsw_build_ordered is hnsw_build with the node ids renamed: node i of the
 * ordered index is node labels[i] of the plain one (level, neighbours, vector, entry). */
Test(hnsw_order, build_is_renamed_graph, .timeout = 120)
{
	const uint32_t n = 3000, dim = 32;
	float *x = mixture(n, dim, 8, 5);
	struct hnsw_params p = params(dim, DM_METRIC_L2, 8, 64);
	uint32_t *labels = shuffled_labels(n, 99);
	char err[256] = "";
	struct hnsw_index *a, *b;

	for (int codes = 0; codes < 2; codes++) {
		p.codes = codes ? HNSW_CODES_RABITQ : HNSW_CODES_NONE;
		a = build(&p, x, n, 1);
		b = hnsw_build_ordered(&p, x, n, labels, 1, NULL, NULL, err, sizeof(err));
		cr_assert(b, "%s", err);
		cr_assert(b->labels && !memcmp(b->labels, labels, n * sizeof(*labels)));
		cr_assert_eq(labels[b->entry], a->entry);
		cr_assert_eq(a->max_level, b->max_level);
		for (uint32_t i = 0; i < n; i++) {
			const struct hnsw_rec_hdr *rb = hnsw_rec(b, i), *ra = hnsw_rec(a, labels[i]);
			const uint32_t *nb = hnsw_rec_nbrs(rb), *na = hnsw_rec_nbrs(ra);

			cr_assert_eq(rb->level, ra->level, "node %u", i);
			cr_assert_eq(rb->n0, ra->n0, "node %u", i);
			for (uint32_t j = 0; j < rb->n0; j++)
				cr_assert_eq(labels[nb[j]], na[j], "node %u neighbour %u", i, j);
			cr_assert(!memcmp(hnsw_rec_vec(rb, b->vec_off), hnsw_rec_vec(ra, a->vec_off),
					  b->vdim * sizeof(float)), "node %u's vector", i);
		}
		/* the local search finds the same rows */
		struct hnsw_src sa, sb;
		struct hnsw_searcher *s = hnsw_searcher_new(n, dim);
		struct dm_hit ha[10], hb[10];

		hnsw_src_local(a, &sa);
		hnsw_src_local(b, &sb);
		for (uint32_t q = 0; q < 40; q++) {
			const float *v = x + (size_t)q * 31 * dim;
			int ka = hnsw_search_b(&sa, s, v, 10, 32, 2, ha);
			int kb = hnsw_search_b(&sb, s, v, 10, 32, 2, hb);

			cr_assert_eq(ka, kb);
			for (int j = 0; j < ka; j++)
				cr_assert_eq(hnsw_label(b->labels, b->n, hb[j].id), ha[j].id);
		}
		hnsw_searcher_free(s);
		hnsw_free(a);
		hnsw_free(b);
	}
	/* not a permutation: refused */
	labels[7] = labels[8];
	p.codes = HNSW_CODES_NONE;
	b = hnsw_build_ordered(&p, x, n, labels, 1, NULL, NULL, err, sizeof(err));
	cr_assert_null(b);
	cr_assert(strstr(err, "repeated"), "%s", err);
	labels[7] = n;
	b = hnsw_build_ordered(&p, x, n, labels, 1, NULL, NULL, err, sizeof(err));
	cr_assert_null(b);
	cr_assert(strstr(err, "out of range"), "%s", err);
	free(labels);
	free(x);
}

/* The label map through the image: format 3 with it, format 2 without (unchanged), round
 * trip, and a damaged or non-permutation map refused. */
Test(hnsw_order, image_label_map)
{
	const uint32_t n = 1500, dim = 16;
	float *x = mixture(n, dim, 4, 9);
	struct hnsw_params p = params(dim, DM_METRIC_L2, 8, 40);
	uint32_t *labels = shuffled_labels(n, 5), fmt, loff;
	char *d = tmpdir_new("test_hnsw_order"), pa[256], pb[256], pc[256], err[512] = "";
	struct hnsw_index *a, *b, *c;
	unsigned char *img;
	size_t len;
	FILE *f;

	p.codes = HNSW_CODES_NONE;
	snprintf(pa, sizeof(pa), "%s/a.idx", d);
	snprintf(pb, sizeof(pb), "%s/b.idx", d);
	snprintf(pc, sizeof(pc), "%s/c.idx", d);
	a = hnsw_build_ordered(&p, x, n, labels, 1, NULL, NULL, err, sizeof(err));
	cr_assert(a, "%s", err);
	save(a, pa);
	b = hnsw_load(pa, err, sizeof(err));
	cr_assert(b, "%s", err);
	cr_assert(b->labels && !memcmp(b->labels, labels, n * sizeof(*labels)));
	save(b, pb);
	cr_assert(same_file(pa, pb), "save(load(image with labels)) differs");
	img = slurp(pa, &len);
	memcpy(&fmt, img + 8, 4);
	cr_assert_eq(fmt, 3u, "an image with a label map is format 3");
	/* without labels: format 2 */
	free(b->labels);
	b->labels = NULL;
	save(b, pb);
	free(img);
	img = slurp(pb, &len);
	memcpy(&fmt, img + 8, 4);
	cr_assert_eq(fmt, 2u, "an image without a label map stays format 2");
	c = hnsw_load(pb, err, sizeof(err));
	cr_assert(c && !c->labels, "%s", err);
	hnsw_free(c);
	free(img);
	/* damage: a flipped bit in the map (CRC) and a repeated label (CRC recomputed) */
	img = slurp(pa, &len);
	{
		uint64_t q_off, q_len;

		memcpy(&q_off, img + 128, 8);   /* struct img_hdr.q_off */
		memcpy(&q_len, img + 136, 8);
		loff = (uint32_t)(q_off + q_len);
	}
	img[loff + 5] ^= 1;
	f = fopen(pc, "wb");
	cr_assert(f && fwrite(img, 1, len, f) == len && !fclose(f));
	refused(pc, "label map checksum");
	img[loff + 5] ^= 1;
	memcpy(img + loff, img + loff + 4, 4);
	{
		uint32_t crc = (uint32_t)crc32(0, img + loff, n * 4), hc;

		memcpy(img + 152, &crc, 4);      /* struct img_hdr.lab_crc */
		hc = (uint32_t)crc32(0, img, 156);
		memcpy(img + 156, &hc, 4);
	}
	f = fopen(pc, "wb");
	cr_assert(f && fwrite(img, 1, len, f) == len && !fclose(f));
	refused(pc, "repeated");
	free(img);
	hnsw_free(a);
	hnsw_free(b);
	free(labels);
	rmtree(d);
	free(d);
	free(x);
}
