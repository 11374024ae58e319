/* cli_index.c: local HNSW index commands of the dmann CLI.
 *   dmann build   build an HNSW index image from a vector file (multi-threaded)
 *   dmann search  search an index image locally (one thread, one query at a time) and
 *                 report recall@k against ground truth, QPS and latency percentiles */
#include "cli.h"
#include "dm.h"
#include "hnsw/hnsw.h"
#include "vecfile.h"
#include "vhash_order.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- build ----------------------------------------------------------------------------- */

static void build_usage(FILE *f)
{
	fprintf(f, "usage: dmann build --base F --metric l2|ip|cos --M 16 --efc 200 --threads T --out INDEX\n"
		   "                   [--codes rabitq|none] [--seed S] [--block-shift B]\n"
		   "                   [--order insertion|vhash] [--vhash-k K] [--json]\n\n"
		   "Build an HNSW index (Malkov & Yashunin) over the vectors of F (fbin, fvecs, bvecs,\n"
		   "u8bin, i8bin) and write its image to INDEX.\n\n"
		   "  --base F         vector file\n"
		   "  --metric M       l2 (default), ip (inner product) or cos (vectors normalised)\n"
		   "  --M M            links per node, 2M on level 0 (2..%u, default %u)\n"
		   "  --efc E          efConstruction (1..100000, default %u)\n"
		   "  --threads T      build threads (1..1024, default: online CPUs); 1 = deterministic\n"
		   "  --out INDEX      index image to write\n"
		   "  --codes C        neighbour codes in every record: rabitq (default; RaBitQ 1-bit\n"
		   "                   codes, a search reads only the nodes it expands) or none\n"
		   "  --seed S         seed of the level draws and the quantizer (default 42)\n"
		   "  --block-shift B  2^B records per block (6..20, default %u)\n"
		   "  --order O        numbering of the graph's nodes: insertion (default; node i is\n"
		   "                   row i of F) or vhash: in the key order of a VHash (Semord's\n"
		   "                   learned semantic key, oracle/vhash.h) fitted on an even sample\n"
		   "                   of 100 K rows, so that a block of consecutive nodes is a\n"
		   "                   semantic region. Answers still name rows of F (the image\n"
		   "                   holds the node -> row map; format 3) and the VHash is saved\n"
		   "                   as INDEX.vhash. Same graph as insertion order up to the\n"
		   "                   renumbering (levels drawn and nodes inserted by row)\n"
		   "  --vhash-k K      VHash regions with --order vhash (1..65536, default %u)\n"
		   "  --json           print the summary as one JSON object\n",
		HNSW_MAX_M, HNSW_DEFAULT_M, HNSW_DEFAULT_EFC, HNSW_DEFAULT_BLOCK_SHIFT,
		DM_VHASH_K_DEFAULT);
}

/* --order vhash: fit the VHash on v, save it as <out>.vhash, and return the key order of
 * v's rows (malloc'd labels, node id -> row), or NULL after printing why. */
static uint32_t *key_order(const struct dm_vecs *v, enum dm_metric metric, uint32_t k,
			   uint64_t seed, unsigned threads, const char *out, double *secs)
{
	uint64_t t0 = dm_now_ns();
	bool norm = metric == DM_METRIC_COS;
	struct dm_vhash *vh;
	uint32_t *labels = NULL;
	char path[4096];
	void *buf = NULL;
	size_t len;
	FILE *f = NULL;
	int rc;

	if ((uint64_t)k * DM_VHASH_ORDER_SAMPLE_PER_REGION > v->n && k > v->n) {
		fprintf(stderr, "dmann build: --vhash-k %u: more regions than the %llu vectors\n",
			k, (unsigned long long)v->n);
		return NULL;
	}
	vh = dm_vhash_fit_rows(v->data, v->n, v->dim, k, 0, norm, seed);
	if (!vh) {
		fprintf(stderr, "dmann build: fitting the VHash (K = %u): %s\n", k,
			errno == EINVAL ? "bad data (a non-finite or huge value?)" : strerror(errno));
		return NULL;
	}
	labels = malloc(v->n * sizeof(*labels));
	if (!labels) {
		fprintf(stderr, "dmann build: out of memory for the label map\n");
		goto out_vh;
	}
	rc = dm_vhash_order(vh, v->data, v->n, v->dim, norm, threads, labels, NULL);
	if (rc) {
		fprintf(stderr, "dmann build: keying the vectors: %s\n", strerror(-rc));
		goto out_labels;
	}
	len = dm_vhash_save_size(vh);
	buf = malloc(len);
	if (snprintf(path, sizeof(path), "%s.vhash", out) >= (int)sizeof(path) || !buf ||
	    dm_vhash_save(vh, buf, len) || !(f = fopen(path, "wb")) ||
	    fwrite(buf, 1, len, f) != len || fclose(f)) {
		fprintf(stderr, "dmann build: writing the VHash to %s.vhash: %s\n", out,
			strerror(errno ? errno : EIO));
		f = NULL;
		goto out_labels;
	}
	free(buf);
	dm_vhash_free(vh);
	*secs = (double)(dm_now_ns() - t0) / 1e9;
	return labels;

out_labels:
	free(buf);
	free(labels);
	labels = NULL;
out_vh:
	dm_vhash_free(vh);
	return NULL;
}

static void build_progress(void *arg, uint64_t done)
{
	dm_progress_update(arg, done);
}

int dm_cmd_build(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "base", required_argument, 0, 'b' },   { "metric", required_argument, 0, 'm' },
		{ "M", required_argument, 0, 'M' },      { "efc", required_argument, 0, 'e' },
		{ "threads", required_argument, 0, 't' }, { "out", required_argument, 0, 'o' },
		{ "seed", required_argument, 0, 's' },   { "block-shift", required_argument, 0, 'B' },
		{ "json", no_argument, 0, 'j' },         { "help", no_argument, 0, 'h' },
		{ "codes", required_argument, 0, 'c' },
		{ "order", required_argument, 0, 'O' },  { "vhash-k", required_argument, 0, 'K' },
		{ 0, 0, 0, 0 },
	};
	const char *base = NULL, *out = NULL;
	bool vorder = false, k_set = false;
	unsigned long long vk = DM_VHASH_K_DEFAULT;
	uint32_t *labels = NULL;
	double order_s = 0;
	enum hnsw_codes codes = HNSW_CODES_RABITQ;
	unsigned long long M = HNSW_DEFAULT_M, efc = HNSW_DEFAULT_EFC, seed = 42,
			   bshift = HNSW_DEFAULT_BLOCK_SHIFT;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned long long threads = ncpu > 0 ? (unsigned long long)ncpu : 1;
	enum dm_metric metric = DM_METRIC_L2;
	bool json = false, ok;
	int c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'b':
			base = optarg;
			break;
		case 'm':
			metric = dm_metric_from_name(optarg, &ok);
			if (!ok) {
				fprintf(stderr, "dmann build: --metric '%s': expected l2, ip or cos\n", optarg);
				return 2;
			}
			break;
		case 'M':
			if (dm_cli_parse_u64("build", "--M", optarg, 2, HNSW_MAX_M, &M) < 0)
				return 2;
			break;
		case 'e':
			if (dm_cli_parse_u64("build", "--efc", optarg, 1, 100000, &efc) < 0)
				return 2;
			break;
		case 't':
			if (dm_cli_parse_u64("build", "--threads", optarg, 1, 1024, &threads) < 0)
				return 2;
			break;
		case 'o':
			out = optarg;
			break;
		case 's':
			if (dm_cli_parse_u64("build", "--seed", optarg, 0, UINT64_MAX, &seed) < 0)
				return 2;
			break;
		case 'B':
			if (dm_cli_parse_u64("build", "--block-shift", optarg, 6, 20, &bshift) < 0)
				return 2;
			break;
		case 'c':
			if (!strcmp(optarg, "rabitq")) {
				codes = HNSW_CODES_RABITQ;
			} else if (!strcmp(optarg, "none")) {
				codes = HNSW_CODES_NONE;
			} else {
				fprintf(stderr, "dmann build: --codes '%s': expected rabitq or none\n", optarg);
				return 2;
			}
			break;
		case 'O':
			if (!strcmp(optarg, "vhash")) {
				vorder = true;
			} else if (!strcmp(optarg, "insertion")) {
				vorder = false;
			} else {
				fprintf(stderr, "dmann build: --order '%s': expected insertion or vhash\n",
					optarg);
				return 2;
			}
			break;
		case 'K':
			if (dm_cli_parse_u64("build", "--vhash-k", optarg, 1, DM_VHASH_K_MAX, &vk) < 0)
				return 2;
			k_set = true;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			build_usage(stdout);
			return 0;
		default:
			dm_cli_bad_option("build", c, argv, optind);
			build_usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "dmann build: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!base || !out) {
		fprintf(stderr, "dmann build: --base and --out are required\n");
		build_usage(stderr);
		return 2;
	}
	if (k_set && !vorder) {
		fprintf(stderr, "dmann build: --vhash-k goes with --order vhash\n");
		return 2;
	}

	char err[512];
	struct dm_vecs v;
	int rc = dm_vecs_read(base, DM_VF_AUTO, &v, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "dmann build: %s\n", err);
		return 1;
	}
	if (v.type != DM_VT_F32) {
		fprintf(stderr, "dmann build: %s holds ids, not vectors\n", base);
		dm_vecs_free(&v);
		return 1;
	}
	if (v.n >= UINT32_MAX) {
		fprintf(stderr, "dmann build: %s: %llu vectors, more than one index holds (2^32 - 1)\n",
			base, (unsigned long long)v.n);
		dm_vecs_free(&v);
		return 1;
	}
	struct hnsw_params p = { .dim = v.dim, .metric = metric, .M = (uint32_t)M,
				 .ef_construction = (uint32_t)efc, .seed = seed,
				 .block_shift = (uint32_t)bshift, .codes = codes };
	if (vorder) {
		labels = key_order(&v, metric, (uint32_t)vk, seed, (unsigned)threads, out, &order_s);
		if (!labels) {
			dm_vecs_free(&v);
			return 1;
		}
	}
	struct dm_progress *pg = dm_progress_start("build", v.n);
	uint64_t t0 = dm_now_ns();
	struct hnsw_index *idx = hnsw_build_ordered(&p, v.data, (uint32_t)v.n, labels,
						    (unsigned)threads, build_progress, pg, err,
						    sizeof(err));
	free(labels);
	uint64_t t1 = dm_now_ns();
	dm_progress_end(pg);
	dm_vecs_free(&v);
	if (!idx) {
		fprintf(stderr, "dmann build: %s: %s\n", base, err);
		return 1;
	}
	rc = hnsw_save(idx, out, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "dmann build: %s\n", err);
		hnsw_free(idx);
		return 1;
	}
	struct stat st;
	long long size = stat(out, &st) == 0 ? (long long)st.st_size : -1;
	double secs = (double)(t1 - t0) / 1e9;
	if (json)
		printf("{\"index\":\"%s\",\"n\":%u,\"dim\":%u,\"metric\":\"%s\",\"M\":%u,\"efc\":%u,"
		       "\"threads\":%llu,\"build_s\":%.3f,\"max_level\":%d,\"bytes\":%lld,"
		       "\"codes\":\"%s\",\"rec_size\":%u,\"order\":\"%s\",\"vhash_k\":%llu,"
		       "\"order_s\":%.3f}\n",
		       out, idx->n, p.dim, dm_metric_name(metric), p.M, p.ef_construction, threads,
		       secs, idx->max_level, size, codes ? "rabitq" : "none", idx->rec_size,
		       vorder ? "vhash" : "insertion", vorder ? vk : 0ull, order_s);
	else
		printf("built %s: %u x %u %s, M=%u efc=%u, codes %s, %u-byte records, %llu threads, "
		       "%.3f s, %d levels, %lld bytes%s%s%s\n",
		       out, idx->n, p.dim, dm_metric_name(metric), p.M, p.ef_construction,
		       codes ? "rabitq" : "none", idx->rec_size, threads, secs, idx->max_level + 1, size,
		       vorder ? ", nodes in VHash key order (the VHash in " : "", vorder ? out : "", vorder ? ".vhash)" : "");
	hnsw_free(idx);
	return 0;
}

/* ---- search ---------------------------------------------------------------------------- */

static void search_usage(FILE *f)
{
	fprintf(f, "usage: dmann search --index INDEX --query F [--gt F] [--k 10] [--ef 64[,128...]]\n"
		   "                    [--nq N] [--beam B] [--ef-upper E] [--json]\n\n"
		   "Search a local index image with one thread, one query at a time; print recall@k\n"
		   "(with --gt), QPS and latency percentiles, one line per ef.\n\n"
		   "  --index INDEX  image written by dmann build\n"
		   "  --query F      query vectors (same dimension as the index)\n"
		   "  --gt F         ground-truth ids (ibin/ivecs), at least k per query\n"
		   "  --k K          neighbours per query (1..1000, default 10)\n"
		   "  --ef E[,E...]  search breadth(s) (1..100000, default 64); ef < k is raised to k\n"
		   "  --nq N         use only the first N queries\n"
		   "  --beam B       with codes: candidates expanded per step (1..64, default 1)\n"
		   "  --ef-upper E   with codes: search list size on level 1 (1..256, default 64,\n"
		   "                 as [cn] ef_upper; 1: the greedy descent of hnswlib); its best\n"
		   "                 ceil(E/4) nodes are level 0's entry points\n"
		   "  --json         one JSON object per result line\n");
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Parse "64" or "10,16,32" into efs; returns the count or -1. */
static int parse_ef_list(const char *s, unsigned long long *efs, int max)
{
	char buf[512];
	if (strlen(s) >= sizeof(buf)) {
		fprintf(stderr, "dmann search: --ef list too long\n");
		return -1;
	}
	strcpy(buf, s);
	int n = 0;
	char *save = NULL;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == max) {
			fprintf(stderr, "dmann search: at most %d ef values\n", max);
			return -1;
		}
		if (dm_cli_parse_u64("search", "--ef", t, 1, 100000, &efs[n]) < 0)
			return -1;
		n++;
	}
	if (n == 0)
		fprintf(stderr, "dmann search: --ef '%s' holds no value\n", s);
	return n ? n : -1;
}

int dm_cmd_search(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "index", required_argument, 0, 'i' }, { "query", required_argument, 0, 'q' },
		{ "gt", required_argument, 0, 'g' },    { "k", required_argument, 0, 'k' },
		{ "ef", required_argument, 0, 'e' },    { "nq", required_argument, 0, 'n' },
		{ "json", no_argument, 0, 'j' },        { "help", no_argument, 0, 'h' },
		{ "beam", required_argument, 0, 'b' },  { "ef-upper", required_argument, 0, 'u' },
		{ 0, 0, 0, 0 },
	};
	const char *ipath = NULL, *qpath = NULL, *gpath = NULL;
	unsigned long long k = 10, efs[64] = { 64 }, nqmax = 0, beam = 1,
			   ef_upper = HNSW_EF_UPPER_DEFAULT;
	int nef = 1;
	bool json = false;
	int c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'i':
			ipath = optarg;
			break;
		case 'q':
			qpath = optarg;
			break;
		case 'g':
			gpath = optarg;
			break;
		case 'k':
			if (dm_cli_parse_u64("search", "--k", optarg, 1, 1000, &k) < 0)
				return 2;
			break;
		case 'e':
			nef = parse_ef_list(optarg, efs, (int)DM_ARRAY_SIZE(efs));
			if (nef < 0)
				return 2;
			break;
		case 'n':
			if (dm_cli_parse_u64("search", "--nq", optarg, 1, UINT32_MAX, &nqmax) < 0)
				return 2;
			break;
		case 'b':
			if (dm_cli_parse_u64("search", "--beam", optarg, 1, 64, &beam) < 0)
				return 2;
			break;
		case 'u':
			if (dm_cli_parse_u64("search", "--ef-upper", optarg, 1, HNSW_EF_UPPER_MAX,
					     &ef_upper) < 0)
				return 2;
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			search_usage(stdout);
			return 0;
		default:
			dm_cli_bad_option("search", c, argv, optind);
			search_usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "dmann search: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!ipath || !qpath) {
		fprintf(stderr, "dmann search: --index and --query are required\n");
		search_usage(stderr);
		return 2;
	}

	char err[512];
	int rc = 1;
	struct dm_vecs q = { 0 }, gt = { 0 };
	struct hnsw_index *idx = hnsw_load(ipath, err, sizeof(err));
	if (!idx) {
		fprintf(stderr, "dmann search: %s\n", err);
		return 1;
	}
	if (dm_vecs_read(qpath, DM_VF_AUTO, &q, err, sizeof(err)) < 0) {
		fprintf(stderr, "dmann search: %s\n", err);
		goto out_free_idx;
	}
	if (q.type != DM_VT_F32 || q.dim != idx->p.dim) {
		fprintf(stderr, "dmann search: %s: %u-d %s, the index is %u-d vectors\n", qpath, q.dim,
			q.type == DM_VT_F32 ? "vectors" : "ids", idx->p.dim);
		goto out_free_q;
	}
	uint64_t nq = q.n;
	if (nqmax && nqmax < nq)
		nq = nqmax;
	if (gpath) {
		if (dm_vecs_read(gpath, DM_VF_AUTO, &gt, err, sizeof(err)) < 0) {
			fprintf(stderr, "dmann search: %s\n", err);
			goto out_free_q;
		}
		if (gt.type != DM_VT_I32 || gt.n != q.n || gt.dim < k) {
			fprintf(stderr, "dmann search: %s: %llu rows of %u %s; need %llu rows of >= %llu ids\n",
				gpath, (unsigned long long)gt.n, gt.dim,
				gt.type == DM_VT_I32 ? "ids" : "floats", (unsigned long long)q.n, k);
			goto out_free_gt;
		}
	}

	struct hnsw_searcher *s = hnsw_searcher_new(idx->n, idx->p.dim);
	struct dm_hit *hits = malloc(k * sizeof(*hits));
	uint64_t *lat = malloc(nq * sizeof(*lat));
	uint64_t *qd = malloc(nq * sizeof(*qd));    /* exact distances (level-0 expansions) */
	if (!s || !hits || !lat || !qd) {
		fprintf(stderr, "dmann search: out of memory\n");
		goto out_free_s;
	}
	struct hnsw_src src;
	hnsw_src_local(idx, &src);
	src.ef_upper = (uint32_t)ef_upper;
	for (int e = 0; e < nef; e++) {
		uint64_t found = 0, lost = 0;   /* lost: queries that found none of their k */
		src.hops = src.dist_evals = src.est_evals = 0;
		struct timespec c0, c1;
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
		uint64_t t0 = dm_now_ns();
		for (uint64_t i = 0; i < nq; i++) {
			uint64_t a = dm_now_ns(), d0 = src.dist_evals;
			int n = hnsw_search_b(&src, s, (const float *)q.data + i * q.dim, k, efs[e],
					      (uint32_t)beam, hits);
			lat[i] = dm_now_ns() - a;
			qd[i] = src.dist_evals - d0;
			if (n < 0) {
				fprintf(stderr, "dmann search: query %llu: %s\n", (unsigned long long)i,
					strerror(-n));
				goto out_free_s;
			}
			/* answers name rows of the vector file (a key-ordered image's label map) */
			for (int j = 0; j < n; j++)
				hits[j].id = hnsw_label(idx->labels, idx->n, hits[j].id);
			if (gpath) {
				const int32_t *g = (const int32_t *)gt.data + i * gt.dim;
				uint64_t f0 = found;

				for (int j = 0; j < n; j++)
					for (unsigned long long t = 0; t < k; t++)
						if ((int64_t)hits[j].id == g[t]) {
							found++;
							break;
						}
				lost += found == f0;
			}
		}
		double secs = (double)(dm_now_ns() - t0) / 1e9;
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
		/* CPU time of this thread: the rate the search would reach on an idle core */
		double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9;
		double cpu_qps = cpu > 0 ? (double)nq / cpu : 0;
		qsort(lat, nq, sizeof(*lat), cmp_u64);
		double p50 = (double)lat[nq / 2] / 1e3, p99 = (double)lat[DM_MIN(nq - 1, nq * 99 / 100)] / 1e3;
		double qps = (double)nq / secs, recall = (double)found / (double)(nq * k);
		double hops = (double)src.hops / (double)nq, evals = (double)src.dist_evals / (double)nq;
		double ests = (double)src.est_evals / (double)nq;
		qsort(qd, nq, sizeof(*qd), cmp_u64);
		unsigned long long d99 = qd[DM_MIN(nq - 1, nq * 99 / 100)], dmax = qd[nq - 1];
		if (json) {
			printf("{\"ef\":%llu,\"k\":%llu,\"nq\":%llu,", efs[e], k, (unsigned long long)nq);
			if (gpath)
				printf("\"recall\":%.5f,\"lost\":%llu,", recall, (unsigned long long)lost);
			printf("\"qps\":%.1f,\"cpu_qps\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
			       "\"hops_per_query\":%.1f,\"dist_per_query\":%.1f,\"est_per_query\":%.1f,"
			       "\"dist_p99\":%llu,\"dist_max\":%llu,\"beam\":%llu,\"ef_upper\":%llu,"
			       "\"codes\":\"%s\"}\n", qps, cpu_qps, p50, p99, hops, evals, ests, d99,
			       dmax, beam, ef_upper, idx->quant ? "rabitq" : "none");
		} else {
			printf("ef=%-5llu k=%llu", efs[e], k);
			if (gpath)
				printf(" recall@%llu=%.4f (none found: %llu)", k, recall,
				       (unsigned long long)lost);
			printf(" qps=%.0f cpu_qps=%.0f p50_us=%.1f p99_us=%.1f hops/q=%.1f dists/q=%.1f"
			       " (p99 %llu, max %llu) ests/q=%.1f\n", qps, cpu_qps, p50, p99, hops, evals,
			       d99, dmax, ests);
		}
		fflush(stdout);
	}
	rc = 0;
out_free_s:
	free(lat);
	free(qd);
	free(hits);
	hnsw_searcher_free(s);
out_free_gt:
	dm_vecs_free(&gt);
out_free_q:
	dm_vecs_free(&q);
out_free_idx:
	hnsw_free(idx);
	return rc;
}
