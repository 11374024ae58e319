/* oracle_eval.c: measures the two balanced k-means variants (docs/oracle.md): balance of the
 * groups under the predictor's assignment and mean squared distance to the nearest fine
 * centroid, on a generated Gaussian mixture with unequal blob sizes and on Fashion-MNIST
 * (a 1/16 sample: what the first HNSW layer with M=16 would hold).
 *
 * usage: oracle-eval [train-images-idx3-ubyte.gz [t10k-images-idx3-ubyte.gz]]
 * Held-out balance: the predictor's assignment of points not in the sample (the next 8000
 * mixture points; Fashion-MNIST's 10000 test images), i.e. the load routing would see.
 */
#include "oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static uint64_t rs = 12345;
static double urand(void)
{
	rs = rs * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(rs >> 11) * 0x1.0p-53;
}
static double gauss(void)
{
	double u = urand(), v = urand();
	return sqrt(-2.0 * log(u + 1e-300)) * cos(2 * M_PI * v);
}

/* n points, dim, nblob blobs with sizes ~ 1/(b+1) (skewed). */
static float *gen_mixture(size_t n, size_t dim, size_t nblob)
{
	float *x = malloc(n * dim * sizeof(float)), *c = malloc(nblob * dim * sizeof(float));
	double *w = malloc(nblob * sizeof(double)), tw = 0;
	for (size_t b = 0; b < nblob; b++) {
		w[b] = 1.0 / (double)(b + 1);
		tw += w[b];
		for (size_t d = 0; d < dim; d++)
			c[b * dim + d] = (float)(urand() * 10.0);
	}
	for (size_t i = 0; i < n; i++) {
		double r = urand() * tw, acc = 0;
		size_t b = 0;
		for (; b + 1 < nblob; b++) {
			acc += w[b];
			if (acc > r)
				break;
		}
		for (size_t d = 0; d < dim; d++)
			x[i * dim + d] = c[b * dim + d] + (float)gauss();
	}
	free(c);
	free(w);
	return x;
}

/* Every stride-th image of an IDX3 gz file, pixels as floats 0..255. */
static float *load_fmnist(const char *path, size_t stride, size_t *n_out, size_t *dim_out)
{
	gzFile f = gzopen(path, "rb");
	unsigned char hdr[16];
	if (!f || gzread(f, hdr, 16) != 16)
		return NULL;
	uint32_t magic = (uint32_t)hdr[0] << 24 | hdr[1] << 16 | hdr[2] << 8 | hdr[3];
	uint32_t cnt = (uint32_t)hdr[4] << 24 | hdr[5] << 16 | hdr[6] << 8 | hdr[7];
	uint32_t rows = (uint32_t)hdr[8] << 24 | hdr[9] << 16 | hdr[10] << 8 | hdr[11];
	uint32_t cols = (uint32_t)hdr[12] << 24 | hdr[13] << 16 | hdr[14] << 8 | hdr[15];
	if (magic != 0x803 || rows * cols == 0 || rows * cols > 4096) {
		gzclose(f);
		return NULL;
	}
	size_t dim = (size_t)rows * cols, n = (cnt + stride - 1) / stride;
	float *x = malloc(n * dim * sizeof(float));
	unsigned char *img = malloc(dim);
	size_t m = 0;
	for (uint32_t i = 0; i < cnt; i++) {
		if (gzread(f, img, (unsigned)dim) != (int)dim)
			break;
		if (i % stride)
			continue;
		for (size_t d = 0; d < dim; d++)
			x[m * dim + d] = img[d];
		m++;
	}
	free(img);
	gzclose(f);
	*n_out = m;
	*dim_out = dim;
	return x;
}

/* Build both variants on x (n points); report in-sample balance, within-group mean squared
 * distance to the group mean, and the balance of the predictor on held-out points h (nh). */
static void run(const char *name, const float *x, size_t n, const float *h, size_t nh,
		size_t dim, uint32_t k)
{
	static const char *an[] = { "constrained", "doubling" };
	for (int a = 0; a < 2; a++) {
		struct dm_oracle_params p;
		dm_oracle_params_default(&p, k);
		p.algo = (enum dm_oracle_algo)a;
		uint64_t t0 = dm_now_ns();
		struct dm_oracle *o = dm_oracle_build(x, n, dim, &p);
		double ms = (double)(dm_now_ns() - t0) / 1e6;
		if (!o) {
			printf("%s k=%u %s: failed (%d)\n", name, k, an[a], errno);
			continue;
		}
		uint64_t mx = 0, mn = UINT64_MAX;
		for (uint32_t g = 0; g < k; g++) {
			mx = DM_MAX(mx, o->sizes[g]);
			mn = DM_MIN(mn, o->sizes[g]);
		}
		double ideal = (double)n / k;
		uint64_t hs[64] = { 0 }, hmx = 0, hmn = UINT64_MAX;
		double hsse = 0;
		for (size_t i = 0; i < nh; i++) {
			uint32_t g = dm_oracle_best(o, h + i * dim);
			hs[g]++;
			hsse += dm_oracle_l2_exact(h + i * dim, o->centroids + (size_t)g * dim, dim);
		}
		for (uint32_t g = 0; g < k; g++) {
			hmx = DM_MAX(hmx, hs[g]);
			hmn = DM_MIN(hmn, hs[g]);
		}
		double hideal = (double)nh / k;
		printf("| %s | %zu | %u | %s | %u | %.3f / %.3f | %.4g | %.3f / %.3f | %.4g | %.0f | %u |\n",
		       name, n, k, an[a], o->nfine, (double)mx / ideal, (double)mn / ideal,
		       o->sse / (double)n, (double)hmx / hideal, (double)hmn / hideal,
		       hsse / (double)nh, ms, o->exact_rechecks);
		if (getenv("ORACLE_EVAL_ITERS"))
			fprintf(stderr, "iterations %u\n", o->iterations);
		dm_oracle_free(o);
	}
}

int main(int argc, char **argv)
{
	if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		printf("usage: oracle-eval [TRAIN_IDX_GZ [TEST_IDX_GZ]]\n\n"
		       "Measure the balanced k-means variants (balance, within-group distance, build\n"
		       "time) on a generated mixture and on Fashion-MNIST (default: Debian's\n"
		       "dataset-fashion-mnist files); prints a markdown table (docs/oracle.md).\n");
		return 0;
	}
	printf("| data | n | k | algorithm | fine centroids | sample max/min vs n/k | "
	       "sample mean sq. dist to group mean | held-out max/min vs n/k | held-out mean sq. "
	       "dist | build ms | BLAS near-ties rechecked |\n"
	       "|---|---|---|---|---|---|---|---|---|---|---|\n");
	/* mixture: first 8000 points are the sample, the next 8000 the held-out queries */
	float *g = gen_mixture(16000, 32, 24);
	for (uint32_t k = 4; k <= 16; k *= 2)
		run("mixture-24-skewed", g, 8000, g + 8000 * 32, 8000, 32, k);
	free(g);
	const char *fm = argc > 1 ? argv[1] :
		"/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
	const char *ft = argc > 2 ? argv[2] :
		"/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";
	size_t n, dim, nh, hdim;
	float *x = load_fmnist(fm, 16, &n, &dim);
	float *h = load_fmnist(ft, 1, &nh, &hdim);
	if (!x || !h || hdim != dim) {
		fprintf(stderr, "cannot read %s / %s\n", fm, ft);
		return 1;
	}
	for (uint32_t k = 4; k <= 16; k *= 2)
		run("fashion-mnist train/16, held-out t10k", x, n, h, nh, dim, k);
	free(x);
	free(h);
	return 0;
}
