/* cli_data.c: dataset commands of the dmann CLI.
 *   dmann gen    Gaussian-mixture sets shaped like SIFT / DEEP / SPACEV / 384-d cosine
 *                embeddings, optional Zipf-skewed query stream, exact ground truth
 *   dmann fmnist Fashion-MNIST from Debian's dataset-fashion-mnist
 * Both write DIR/base.fbin, DIR/query.fbin and DIR/gt.ibin (exact top-100 ids per query,
 * computed with OpenBLAS batched distances). */
#include "cli.h"
#include "distance.h"
#include "dm.h"
#include "topk.h"
#include "util/dm_hash.h"
#include "vecfile.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define GT_K 100u

/* ---- ground truth -------------------------------------------------------------------- */

/* Exact top-k ids of every query (ties by id) through dm_distance_batch in tiles. */
static int ground_truth(enum dm_metric m, const float *base, uint64_t nb, const float *q,
			uint64_t nq, uint32_t dim, uint32_t k, int32_t *out)
{
	const size_t QT = 256, BT = 8192;
	int rc = -ENOMEM;
	float *bn2 = malloc(nb * sizeof(*bn2));
	float *d = malloc(QT * BT * sizeof(*d));
	struct dm_topk **t = calloc(QT, sizeof(*t));
	struct dm_hit *hits = malloc(k * sizeof(*hits));
	if (!bn2 || !d || !t || !hits)
		goto out_free;
	for (size_t i = 0; i < QT; i++)
		if (!(t[i] = dm_topk_new(k)))
			goto out_free;
	for (uint64_t j = 0; j < nb; j++)
		bn2[j] = dm_dot(base + j * dim, base + j * dim, dim);
	struct dm_progress *pg = dm_progress_start("groundtruth", nq);
	for (uint64_t q0 = 0; q0 < nq; q0 += QT) {
		size_t qn = (size_t)DM_MIN((uint64_t)QT, nq - q0);
		for (size_t i = 0; i < qn; i++)
			dm_topk_reset(t[i]);
		for (uint64_t b0 = 0; b0 < nb; b0 += BT) {
			size_t bnum = (size_t)DM_MIN((uint64_t)BT, nb - b0);
			dm_distance_batch(m, q + q0 * dim, qn, base + b0 * dim, bnum, dim, bn2 + b0, d);
			for (size_t i = 0; i < qn; i++) {
				const float *row = d + i * bnum;
				float bound = dm_topk_bound(t[i]);
				for (size_t j = 0; j < bnum; j++) {
					if (row[j] <= bound) {
						dm_topk_push(t[i], row[j], b0 + j);
						bound = dm_topk_bound(t[i]);
					}
				}
			}
		}
		for (size_t i = 0; i < qn; i++) {
			size_t n = dm_topk_drain(t[i], hits);
			for (size_t j = 0; j < k; j++)
				out[(q0 + i) * k + j] = j < n ? (int32_t)hits[j].id : -1;
		}
		dm_progress_update(pg, q0 + qn);
	}
	dm_progress_end(pg);
	rc = 0;
out_free:
	if (t)
		for (size_t i = 0; i < QT; i++)
			dm_topk_free(t[i]);
	free(t);
	free(hits);
	free(d);
	free(bn2);
	return rc;
}

/* Create DIR (one level) if missing. */
static int make_dir(const char *cmd, const char *dir)
{
	struct stat st;
	if (stat(dir, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return 0;
		fprintf(stderr, "dmann %s: --out %s exists and is not a directory\n", cmd, dir);
		return -ENOTDIR;
	}
	if (mkdir(dir, 0755) < 0) {
		fprintf(stderr, "dmann %s: cannot create %s: %s\n", cmd, dir, strerror(errno));
		return -errno;
	}
	return 0;
}

/* Write base, queries and their exact ground truth into dir. */
static int write_set(const char *cmd, const char *dir, enum dm_metric m, const float *base,
		     uint64_t nb, const float *q, uint64_t nq, uint32_t dim)
{
	uint32_t k = (uint32_t)DM_MIN((uint64_t)GT_K, nb);
	char path[4096];
	int rc;
	int32_t *gt = malloc(nq * k * sizeof(*gt));
	if (!gt) {
		fprintf(stderr, "dmann %s: out of memory for ground truth\n", cmd);
		return -ENOMEM;
	}
	if ((rc = ground_truth(m, base, nb, q, nq, dim, k, gt)) < 0) {
		fprintf(stderr, "dmann %s: ground truth: %s\n", cmd, strerror(-rc));
		goto out_free;
	}
	const struct { const char *name; const void *data; enum dm_vec_type t; uint64_t n; uint32_t d; } f[] = {
		{ "base.fbin", base, DM_VT_F32, nb, dim },
		{ "query.fbin", q, DM_VT_F32, nq, dim },
		{ "gt.ibin", gt, DM_VT_I32, nq, k },
	};
	for (size_t i = 0; i < DM_ARRAY_SIZE(f); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, f[i].name);
		rc = dm_vecs_write(path, DM_VF_AUTO, f[i].data, f[i].t, f[i].n, f[i].d);
		if (rc < 0) {
			fprintf(stderr, "dmann %s: write %s: %s\n", cmd, path, strerror(-rc));
			goto out_free;
		}
	}
	printf("wrote %s/{base.fbin,query.fbin,gt.ibin}: %llu x %u base, %llu queries, top-%u %s ground truth\n",
	       dir, (unsigned long long)nb, dim, (unsigned long long)nq, k, dm_metric_name(m));
out_free:
	free(gt);
	return rc;
}

/* ---- gen ------------------------------------------------------------------------------- */

static double rng_unif(struct dm_rng *r)   /* (0, 1) */
{
	return ((double)(dm_rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static float rng_gauss(struct dm_rng *r)
{
	return (float)(sqrt(-2.0 * log(rng_unif(r))) * cos(6.283185307179586 * rng_unif(r)));
}

/* Pick an index from a cumulative distribution. */
static uint32_t pick(const double *cdf, uint32_t n, double u)
{
	uint32_t lo = 0, hi = n - 1;
	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;
		if (cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

enum gen_shape { SHAPE_SIFT, SHAPE_DEEP, SHAPE_SPACEV, SHAPE_COS };

static const struct gen_kind {
	const char *name;
	uint32_t dim;
	enum dm_metric metric;
	enum gen_shape shape;
	const char *what;
} gen_kinds[] = {
	{ "sift", 128, DM_METRIC_L2, SHAPE_SIFT, "128-d non-negative integer-valued (like SIFT), l2" },
	{ "deep", 96, DM_METRIC_L2, SHAPE_DEEP, "96-d unit-norm (like DEEP1B), l2" },
	{ "spacev", 100, DM_METRIC_L2, SHAPE_SPACEV, "100-d int8-valued (like SPACEV), l2" },
	{ "cos384", 384, DM_METRIC_COS, SHAPE_COS, "384-d embeddings, cosine" },
};

/* The mixture: per cluster a centroid and a low-rank spread (intrinsic dimension r), so that
 * the sets have the low intrinsic dimensionality of real embeddings. */
struct mixture {
	uint32_t dim, C, r;
	float *cent;      /* C x dim */
	float *basis;     /* C x r x dim */
	float *scale;     /* C */
	float noise;
};

/* Draw one point of cluster c into out, then shape it like the target kind. */
static void draw_point(const struct mixture *mx, struct dm_rng *g, uint32_t c, enum gen_shape sh,
		       float *out)
{
	uint32_t dim = mx->dim;
	memcpy(out, mx->cent + (size_t)c * dim, dim * sizeof(*out));
	for (uint32_t k = 0; k < mx->r; k++) {
		float z = rng_gauss(g) * mx->scale[c];
		const float *b = mx->basis + ((size_t)c * mx->r + k) * dim;
		for (uint32_t j = 0; j < dim; j++)
			out[j] += z * b[j];
	}
	for (uint32_t j = 0; j < dim; j++)
		out[j] += mx->noise * rng_gauss(g);
	switch (sh) {
	case SHAPE_SIFT:
		for (uint32_t j = 0; j < dim; j++)
			out[j] = fminf(255.0f, fmaxf(0.0f, roundf(24.0f + 20.0f * out[j])));
		break;
	case SHAPE_DEEP:
		if (dm_normalize(out, dim) < 0)
			out[0] = 1.0f;
		break;
	case SHAPE_SPACEV:
		for (uint32_t j = 0; j < dim; j++)
			out[j] = fminf(127.0f, fmaxf(-127.0f, roundf(20.0f * out[j])));
		break;
	case SHAPE_COS:
		break;
	}
	if (sh != SHAPE_DEEP) {
		/* an all-zero row would be undefined under cosine: never emit one */
		bool zero = true;
		for (uint32_t j = 0; j < dim && zero; j++)
			zero = out[j] == 0.0f;
		if (zero)
			out[0] = 1.0f;
	}
}

static void gen_usage(FILE *f)
{
	fprintf(f, "usage: dmann gen --kind sift|deep|spacev|cos384 --n N --nq Q --seed S --out DIR\n"
		   "                 [--zipf S] [--clusters C] [--idim R]\n\n"
		   "Generate a Gaussian-mixture data set and its exact top-100 ground truth:\n"
		   "DIR/base.fbin (N vectors), DIR/query.fbin (Q queries), DIR/gt.ibin.\n\n"
		   "  --kind K       sift (128-d), deep (96-d), spacev (100-d): l2; cos384: cosine\n"
		   "  --n N          base vectors (1..100000000)\n"
		   "  --nq Q         queries (1..10000000)\n"
		   "  --seed S       random seed (same seed, same files)\n"
		   "  --out DIR      output directory (created if missing)\n"
		   "  --zipf S       skewed query stream: clusters drawn with Zipf exponent S (0 < S <= 5)\n"
		   "                 instead of the base distribution\n"
		   "  --clusters C   mixture components (default 64)\n"
		   "  --idim R       intrinsic dimension of each component (default 16)\n");
	for (size_t i = 0; i < DM_ARRAY_SIZE(gen_kinds); i++)
		fprintf(f, "  kind %-8s %s\n", gen_kinds[i].name, gen_kinds[i].what);
}

int dm_cmd_gen(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "kind", required_argument, 0, 'k' }, { "n", required_argument, 0, 'n' },
		{ "nq", required_argument, 0, 'q' },   { "seed", required_argument, 0, 's' },
		{ "out", required_argument, 0, 'o' },  { "zipf", required_argument, 0, 'z' },
		{ "clusters", required_argument, 0, 'c' }, { "idim", required_argument, 0, 'r' },
		{ "help", no_argument, 0, 'h' },       { 0, 0, 0, 0 },
	};
	const struct gen_kind *kind = NULL;
	unsigned long long n = 0, nq = 0, seed = 0, C = 64, r = 16;
	double zipf = 0;
	const char *out = NULL;
	bool have_seed = false;
	int c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'k':
			for (size_t i = 0; i < DM_ARRAY_SIZE(gen_kinds); i++)
				if (!strcmp(optarg, gen_kinds[i].name))
					kind = &gen_kinds[i];
			if (!kind) {
				fprintf(stderr, "dmann gen: --kind '%s': expected sift, deep, spacev or cos384\n", optarg);
				return 2;
			}
			break;
		case 'n':
			if (dm_cli_parse_u64("gen", "--n", optarg, 1, 100000000, &n) < 0)
				return 2;
			break;
		case 'q':
			if (dm_cli_parse_u64("gen", "--nq", optarg, 1, 10000000, &nq) < 0)
				return 2;
			break;
		case 's':
			if (dm_cli_parse_u64("gen", "--seed", optarg, 0, UINT64_MAX, &seed) < 0)
				return 2;
			have_seed = true;
			break;
		case 'o':
			out = optarg;
			break;
		case 'z':
			if (dm_cli_parse_double("gen", "--zipf", optarg, 1e-9, 5.0, &zipf) < 0)
				return 2;
			break;
		case 'c':
			if (dm_cli_parse_u64("gen", "--clusters", optarg, 1, 100000, &C) < 0)
				return 2;
			break;
		case 'r':
			if (dm_cli_parse_u64("gen", "--idim", optarg, 1, 4096, &r) < 0)
				return 2;
			break;
		case 'h':
			gen_usage(stdout);
			return 0;
		default:
			dm_cli_bad_option("gen", c, argv, optind);
			gen_usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "dmann gen: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!kind || !n || !nq || !have_seed || !out) {
		fprintf(stderr, "dmann gen: --kind, --n, --nq, --seed and --out are required\n");
		gen_usage(stderr);
		return 2;
	}
	uint32_t dim = kind->dim;
	if (make_dir("gen", out) < 0)
		return 1;

	struct mixture mx = { .dim = dim, .C = (uint32_t)C, .r = (uint32_t)DM_MIN(r, (uint64_t)dim),
			      .noise = 0.05f };
	mx.cent = malloc(C * dim * sizeof(float));
	mx.basis = malloc(C * mx.r * dim * sizeof(float));
	mx.scale = malloc(C * sizeof(float));
	double *wcdf = malloc(C * sizeof(double)), *qcdf = malloc(C * sizeof(double));
	float *base = malloc(n * dim * sizeof(float)), *q = malloc(nq * dim * sizeof(float));
	int rc = 1;
	if (!mx.cent || !mx.basis || !mx.scale || !wcdf || !qcdf || !base || !q) {
		fprintf(stderr, "dmann gen: out of memory for %llu x %u vectors\n",
			(unsigned long long)n, dim);
		goto out_free;
	}
	struct dm_rng g;
	dm_rng_seed(&g, seed);
	/* Mixture: centroids ~ N(0, 1); each component spreads along r random directions with
	 * per-direction scale 1/sqrt(r) * s_c, s_c in [0.5, 1]; base weights in [0.5, 1.5]. */
	for (size_t i = 0; i < C * dim; i++)
		mx.cent[i] = rng_gauss(&g);
	for (size_t i = 0; i < C * mx.r * dim; i++)
		mx.basis[i] = rng_gauss(&g) / sqrtf((float)dim);
	double acc = 0;
	for (uint32_t i = 0; i < C; i++) {
		mx.scale[i] = (float)(0.5 + 0.5 * rng_unif(&g)) * 2.0f;
		acc += 0.5 + rng_unif(&g);
		wcdf[i] = acc;
	}
	for (uint32_t i = 0; i < C; i++)
		wcdf[i] /= acc;
	if (zipf > 0) {
		/* Zipf over a random permutation of the clusters: query skew is not tied to id order */
		uint32_t *perm = malloc(C * sizeof(*perm));
		double *w = calloc(C, sizeof(*w));
		if (!perm || !w) {
			free(perm);
			free(w);
			fprintf(stderr, "dmann gen: out of memory\n");
			goto out_free;
		}
		for (uint32_t i = 0; i < C; i++)
			perm[i] = i;
		for (uint32_t i = (uint32_t)C - 1; i > 0; i--) {
			uint32_t j = (uint32_t)(dm_rng_next(&g) % (i + 1)), t = perm[i];
			perm[i] = perm[j];
			perm[j] = t;
		}
		for (uint32_t rank = 0; rank < C; rank++)
			w[perm[rank]] = 1.0 / pow(rank + 1.0, zipf);
		acc = 0;
		for (uint32_t i = 0; i < C; i++)
			qcdf[i] = (acc += w[i]);
		for (uint32_t i = 0; i < C; i++)
			qcdf[i] /= acc;
		free(perm);
		free(w);
	} else {
		memcpy(qcdf, wcdf, C * sizeof(double));
	}
	struct dm_progress *pg = dm_progress_start("generate", n + nq);
	for (uint64_t i = 0; i < n; i++) {
		draw_point(&mx, &g, pick(wcdf, (uint32_t)C, rng_unif(&g)), kind->shape, base + i * dim);
		if ((i & 4095) == 0)
			dm_progress_update(pg, i);
	}
	/* queries: a separate stream so that --nq does not change the base */
	struct dm_rng gq;
	dm_rng_seed(&gq, seed ^ 0x5175657279ull);
	for (uint64_t i = 0; i < nq; i++)
		draw_point(&mx, &gq, pick(qcdf, (uint32_t)C, rng_unif(&gq)), kind->shape, q + i * dim);
	dm_progress_end(pg);
	rc = write_set("gen", out, kind->metric, base, n, q, nq, dim) < 0 ? 1 : 0;
out_free:
	free(mx.cent);
	free(mx.basis);
	free(mx.scale);
	free(wcdf);
	free(qcdf);
	free(base);
	free(q);
	return rc;
}

/* ---- fmnist ---------------------------------------------------------------------------- */

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Read a gzipped IDX3 image file (big-endian header: magic 0x803, n, rows, cols; then
 * n*rows*cols bytes) into float32 rows. */
static float *read_idx3(const char *path, uint32_t *n, uint32_t *dim)
{
	gzFile f = gzopen(path, "rb");
	if (!f) {
		fprintf(stderr, "dmann fmnist: cannot open %s: %s (is dataset-fashion-mnist installed?)\n",
			path, strerror(errno ? errno : ENOENT));
		return NULL;
	}
	unsigned char h[16];
	float *out = NULL;
	unsigned char *buf = NULL;
	if (gzread(f, h, sizeof(h)) != (int)sizeof(h)) {
		fprintf(stderr, "dmann fmnist: %s: truncated IDX header\n", path);
		goto out_close;
	}
	uint32_t v[4];
	for (int i = 0; i < 4; i++)
		v[i] = (uint32_t)h[4 * i] << 24 | (uint32_t)h[4 * i + 1] << 16 |
		       (uint32_t)h[4 * i + 2] << 8 | h[4 * i + 3];
	if (v[0] != 0x803 || v[1] == 0 || v[1] > 10000000 || v[2] == 0 || v[3] == 0 ||
	    (uint64_t)v[2] * v[3] > 65536) {
		fprintf(stderr, "dmann fmnist: %s: not an IDX3 image file (magic 0x%x, %u x %u x %u)\n",
			path, v[0], v[1], v[2], v[3]);
		goto out_close;
	}
	size_t total = (size_t)v[1] * v[2] * v[3];
	buf = malloc(total);
	out = malloc(total * sizeof(*out));
	if (!buf || !out) {
		fprintf(stderr, "dmann fmnist: out of memory\n");
		goto out_fail;
	}
	size_t got = 0;
	while (got < total) {
		unsigned chunk = (unsigned)DM_MIN(total - got, (size_t)1 << 30);
		int r = gzread(f, buf + got, chunk);
		if (r <= 0) {
			fprintf(stderr, "dmann fmnist: %s: truncated (%zu of %zu pixel bytes)\n", path, got, total);
			goto out_fail;
		}
		got += (size_t)r;
	}
	for (size_t i = 0; i < total; i++)
		out[i] = (float)buf[i];
	*n = v[1];
	*dim = v[2] * v[3];
	free(buf);
	gzclose(f);
	return out;
out_fail:
	free(out);
	out = NULL;
	free(buf);
out_close:
	gzclose(f);
	return NULL;
}

static void fmnist_usage(FILE *f)
{
	fprintf(f, "usage: dmann fmnist --out DIR [--data DIR]\n\n"
		   "Convert Fashion-MNIST (Debian package dataset-fashion-mnist) into DIR/base.fbin\n"
		   "(60000 x 784 training images), DIR/query.fbin (10000 test images) and DIR/gt.ibin\n"
		   "(exact l2 top-100), pixel values as float32.\n\n"
		   "  --out DIR    output directory (created if missing)\n"
		   "  --data DIR   where the .gz files are (default " FMNIST_DIR ")\n");
}

int dm_cmd_fmnist(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "out", required_argument, 0, 'o' }, { "data", required_argument, 0, 'd' },
		{ "help", no_argument, 0, 'h' },      { 0, 0, 0, 0 },
	};
	const char *out = NULL, *data = FMNIST_DIR;
	int c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'o':
			out = optarg;
			break;
		case 'd':
			data = optarg;
			break;
		case 'h':
			fmnist_usage(stdout);
			return 0;
		default:
			dm_cli_bad_option("fmnist", c, argv, optind);
			fmnist_usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "dmann fmnist: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!out) {
		fprintf(stderr, "dmann fmnist: --out DIR is required\n");
		fmnist_usage(stderr);
		return 2;
	}
	char p1[4096], p2[4096];
	snprintf(p1, sizeof(p1), "%s/train-images-idx3-ubyte.gz", data);
	snprintf(p2, sizeof(p2), "%s/t10k-images-idx3-ubyte.gz", data);
	uint32_t nb, db, nq, dq;
	float *base = read_idx3(p1, &nb, &db);
	if (!base)
		return 1;
	float *q = read_idx3(p2, &nq, &dq);
	if (!q) {
		free(base);
		return 1;
	}
	int rc = 1;
	if (db != dq) {
		fprintf(stderr, "dmann fmnist: train images are %u pixels, test images %u\n", db, dq);
		goto out_free;
	}
	if (make_dir("fmnist", out) < 0)
		goto out_free;
	rc = write_set("fmnist", out, DM_METRIC_L2, base, nb, q, nq, db) < 0 ? 1 : 0;
out_free:
	free(base);
	free(q);
	return rc;
}
