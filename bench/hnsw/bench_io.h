// bench_io.h: shared by the reference drivers of bench/hnsw: fbin/ibin readers, timing, and
// the JSON result lines (same fields as `dmann search --json`), so the three libraries are
// measured the same way: one thread, one query at a time, recall@k against the same gt.
#pragma once
#include <cmath>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

struct Mat {
	uint32_t n = 0, d = 0;
	std::vector<float> f;
	std::vector<int32_t> i;
};

// big-ann-benchmarks fbin/ibin: u32 n, u32 d, then n*d values.
static Mat read_bin(const std::string &path, bool ints)
{
	FILE *fp = fopen(path.c_str(), "rb");
	if (!fp)
		throw std::runtime_error("cannot open " + path);
	Mat m;
	uint32_t h[2];
	if (fread(h, 4, 2, fp) != 2)
		throw std::runtime_error(path + ": truncated header");
	m.n = h[0];
	m.d = h[1];
	size_t cnt = (size_t)m.n * m.d;
	size_t got;
	if (ints) {
		m.i.resize(cnt);
		got = fread(m.i.data(), 4, cnt, fp);
	} else {
		m.f.resize(cnt);
		got = fread(m.f.data(), 4, cnt, fp);
	}
	fclose(fp);
	if (got != cnt)
		throw std::runtime_error(path + ": truncated data");
	return m;
}

// CPU time of the calling thread: the rate a search would reach on an idle core.
static double cpu_s()
{
	timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now_s()
{
	return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sweep: search(q, k, ids_out) for every query; prints one JSON line per ef.
static void sweep(const char *lib, const Mat &q, const Mat &gt, size_t k, const std::vector<size_t> &efs,
		  const std::function<void(size_t)> &set_ef,
		  const std::function<size_t(const float *, size_t, int64_t *)> &search)
{
	std::vector<double> lat(q.n);
	std::vector<int64_t> ids(k);
	for (size_t ef : efs) {
		set_ef(ef);
		size_t found = 0;
		double c0 = cpu_s(), t0 = now_s();
		for (uint32_t i = 0; i < q.n; i++) {
			double a = now_s();
			size_t n = search(q.f.data() + (size_t)i * q.d, k, ids.data());
			lat[i] = now_s() - a;
			const int32_t *g = gt.i.data() + (size_t)i * gt.d;
			for (size_t j = 0; j < n; j++)
				for (size_t t = 0; t < k; t++)
					if (ids[j] == g[t]) {
						found++;
						break;
					}
		}
		double secs = now_s() - t0, cpu = cpu_s() - c0;
		std::sort(lat.begin(), lat.end());
		printf("{\"lib\":\"%s\",\"ef\":%zu,\"k\":%zu,\"nq\":%u,\"recall\":%.5f,\"qps\":%.1f,"
		       "\"cpu_qps\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f}\n",
		       lib, ef, k, q.n, (double)found / ((double)q.n * k), q.n / secs, q.n / cpu, lat[q.n / 2] * 1e6,
		       lat[std::min<size_t>(q.n - 1, (size_t)q.n * 99 / 100)] * 1e6);
		fflush(stdout);
	}
}

static std::vector<size_t> parse_efs(const char *s)
{
	std::vector<size_t> v;
	std::string str(s);
	size_t p = 0;
	while (p <= str.size()) {
		size_t c = str.find(',', p);
		if (c == std::string::npos)
			c = str.size();
		v.push_back(std::stoul(str.substr(p, c - p)));
		p = c + 1;
	}
	return v;
}

/* BENCH_METRIC=cos: the cosine metric as hnswlib/faiss serve it, inner product over
 * normalised vectors (base and queries normalised here, as dmann does internally). */
static inline bool bench_cos()
{
	const char *m = getenv("BENCH_METRIC");
	return m && std::string(m) == "cos";
}

static inline void normalise_rows(Mat &m)
{
	for (uint32_t r = 0; r < m.n; r++) {
		float *v = m.f.data() + (size_t)r * m.d;
		double s = 0;
		for (uint32_t j = 0; j < m.d; j++)
			s += (double)v[j] * v[j];
		float inv = s > 0 ? (float)(1.0 / sqrt(s)) : 0.0f;
		for (uint32_t j = 0; j < m.d; j++)
			v[j] *= inv;
	}
}
