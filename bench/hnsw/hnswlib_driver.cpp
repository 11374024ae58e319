// hnswlib_driver.cpp: reference HNSW for bench/hnsw/run.sh (Debian libhnswlib-dev, header-only).
//   hnswlib_driver build  BASE M EFC THREADS OUT     -> {"lib":"hnswlib","build_s":...}
//   hnswlib_driver search OUT QUERY GT K EF[,EF...]  -> one JSON line per ef
// Parallel build: THREADS std::threads pull ids from an atomic counter and call addPoint,
// the way hnswlib's own examples (ParallelFor) build. L2 metric, or with BENCH_METRIC=cos
// inner product over normalised vectors.
#include "bench_io.h"
#include <atomic>
#include <hnswlib/hnswlib.h>
#include <thread>

int main(int argc, char **argv)
{
	try {
		if (argc == 7 && std::string(argv[1]) == "build") {
			Mat b = read_bin(argv[2], false);
			size_t M = std::stoul(argv[3]), efc = std::stoul(argv[4]), T = std::stoul(argv[5]);
			if (bench_cos())
				normalise_rows(b);
			hnswlib::L2Space l2(b.d);
			hnswlib::InnerProductSpace ipsp(b.d);
			hnswlib::SpaceInterface<float> &space = bench_cos() ? (hnswlib::SpaceInterface<float> &)ipsp : l2;
			hnswlib::HierarchicalNSW<float> idx(&space, b.n, M, efc, 100);
			double t0 = now_s();
			std::atomic<size_t> next(0);
			auto work = [&]() {
				for (size_t i; (i = next++) < b.n;)
					idx.addPoint(b.f.data() + i * b.d, i);
			};
			std::vector<std::thread> th;
			for (size_t t = 1; t < T; t++)
				th.emplace_back(work);
			work();
			for (auto &t : th)
				t.join();
			double secs = now_s() - t0;
			idx.saveIndex(argv[6]);
			printf("{\"lib\":\"hnswlib\",\"n\":%u,\"threads\":%zu,\"build_s\":%.3f}\n", b.n, T, secs);
			return 0;
		}
		if (argc == 7 && std::string(argv[1]) == "search") {
			Mat q = read_bin(argv[3], false), gt = read_bin(argv[4], true);
			size_t k = std::stoul(argv[5]);
			if (bench_cos())
				normalise_rows(q);
			hnswlib::L2Space l2(q.d);
			hnswlib::InnerProductSpace ipsp(q.d);
			hnswlib::SpaceInterface<float> &space = bench_cos() ? (hnswlib::SpaceInterface<float> &)ipsp : l2;
			hnswlib::HierarchicalNSW<float> idx(&space, argv[2]);
			sweep("hnswlib", q, gt, k, parse_efs(argv[6]), [&](size_t ef) { idx.setEf(ef); },
			      [&](const float *v, size_t kk, int64_t *out) {
				      auto r = idx.searchKnn(v, kk);
				      size_t n = r.size();
				      for (size_t j = n; j-- > 0; r.pop())
					      out[j] = (int64_t)r.top().second;
				      return n;
			      });
			return 0;
		}
		fprintf(stderr, "usage: hnswlib_driver build BASE M EFC THREADS OUT | search INDEX QUERY GT K EFS\n");
		return 2;
	} catch (const std::exception &e) {
		fprintf(stderr, "hnswlib_driver: %s\n", e.what());
		return 1;
	}
}
