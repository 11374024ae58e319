// faiss_driver.cpp: reference HNSW for bench/hnsw/run.sh (Debian libfaiss-dev, IndexHNSWFlat).
//   faiss_driver build  BASE M EFC THREADS OUT     -> {"lib":"faiss","build_s":...}
//   faiss_driver search OUT QUERY GT K EF[,EF...]  -> one JSON line per ef
// Build threads through OpenMP (faiss' own parallel add); search with one OpenMP thread,
// one query per call. L2 metric, or with BENCH_METRIC=cos inner product over normalised
// vectors.
#include "bench_io.h"
#include <faiss/IndexHNSW.h>
#include <faiss/index_io.h>
#include <memory>
#include <omp.h>

int main(int argc, char **argv)
{
	try {
		if (argc == 7 && std::string(argv[1]) == "build") {
			Mat b = read_bin(argv[2], false);
			int M = std::stoi(argv[3]), efc = std::stoi(argv[4]), T = std::stoi(argv[5]);
			omp_set_num_threads(T);
			if (bench_cos())
				normalise_rows(b);
			faiss::IndexHNSWFlat idx(b.d, M, bench_cos() ? faiss::METRIC_INNER_PRODUCT : faiss::METRIC_L2);
			idx.hnsw.efConstruction = efc;
			double t0 = now_s();
			idx.add(b.n, b.f.data());
			double secs = now_s() - t0;
			faiss::write_index(&idx, argv[6]);
			printf("{\"lib\":\"faiss\",\"n\":%u,\"threads\":%d,\"build_s\":%.3f}\n", b.n, T, secs);
			return 0;
		}
		if (argc == 7 && std::string(argv[1]) == "search") {
			omp_set_num_threads(1);
			Mat q = read_bin(argv[3], false), gt = read_bin(argv[4], true);
			size_t k = std::stoul(argv[5]);
			if (bench_cos())
				normalise_rows(q);
			std::unique_ptr<faiss::Index> base(faiss::read_index(argv[2]));
			auto *idx = dynamic_cast<faiss::IndexHNSWFlat *>(base.get());
			if (!idx)
				throw std::runtime_error("not an IndexHNSWFlat");
			std::vector<float> dist(k);
			std::vector<faiss::Index::idx_t> lab(k);
			sweep("faiss", q, gt, k, parse_efs(argv[6]), [&](size_t ef) { idx->hnsw.efSearch = (int)ef; },
			      [&](const float *v, size_t kk, int64_t *out) {
				      idx->search(1, v, (faiss::Index::idx_t)kk, dist.data(), lab.data());
				      size_t n = 0;
				      for (size_t j = 0; j < kk; j++)
					      if (lab[j] >= 0)
						      out[n++] = lab[j];
				      return n;
			      });
			return 0;
		}
		fprintf(stderr, "usage: faiss_driver build BASE M EFC THREADS OUT | search INDEX QUERY GT K EFS\n");
		return 2;
	} catch (const std::exception &e) {
		fprintf(stderr, "faiss_driver: %s\n", e.what());
		return 1;
	}
}
