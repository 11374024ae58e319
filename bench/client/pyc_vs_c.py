#!/usr/bin/python3
"""pyc_vs_c.py: batch-query throughput of the Python binding vs libdmann's C API (called
directly through ctypes, so both run the same C code; the difference is what the binding
adds: NumPy conversion, the key lists) on the same cluster and queries.

usage: PYTHONPATH=build/cn/client/python bench/client/pyc_vs_c.py BUILD_DIR CLUSTER_INI
       [--n 20000] [--dim 64] [--nq 2000] [--k 10] [--reps 3]
Creates bucket "benchc"/index "bench" (dropped at the end), prints queries/s of each and
the ratio Python / C."""
import argparse
import ctypes
import os
import time

import numpy as np

import dmann


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("config")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--nq", type=int, default=2000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    v = rng.standard_normal((a.n, a.dim), dtype=np.float32)
    q = rng.standard_normal((a.nq, a.dim), dtype=np.float32)
    c = dmann.connect(config=a.config, client="local")
    try:
        c.drop_index("benchc", "bench")
    except KeyError:
        pass
    c.create_index("benchc", "bench", a.dim)
    c.put("benchc", "bench", ["b%d" % i for i in range(a.n)], v)
    lib = ctypes.CDLL(os.path.join(a.build, "cn", "client", "libdmann.so.0"))
    lib.dmann_connect.restype = ctypes.c_void_p
    d = ctypes.c_void_p(lib.dmann_connect(a.config.encode(), b"local"))
    keys = (ctypes.c_char_p * (a.nq * a.k))()
    dist = np.zeros((a.nq, a.k), dtype=np.float32)
    cnt = (ctypes.c_uint32 * a.nq)()
    best_py = best_c = 0.0
    for _ in range(a.reps):
        t = time.perf_counter()
        lib.dmann_batch_query(d, b"benchc", b"bench", q.ctypes.data_as(ctypes.c_void_p),
                              ctypes.c_size_t(a.nq), ctypes.c_uint32(a.dim),
                              ctypes.c_uint32(a.k), keys,
                              dist.ctypes.data_as(ctypes.c_void_p), cnt)
        best_c = max(best_c, a.nq / (time.perf_counter() - t))
        lib.dmann_free_keys(keys, ctypes.c_size_t(a.nq * a.k))
        t = time.perf_counter()
        c.batch_query("benchc", "bench", q, a.k)
        best_py = max(best_py, a.nq / (time.perf_counter() - t))
    print("C  batch query: %.0f queries/s" % best_c)
    print("Py batch query: %.0f queries/s" % best_py)
    print("ratio Python / C: %.3f" % (best_py / best_c))
    lib.dmann_close(d)
    c.drop_index("benchc", "bench")


if __name__ == "__main__":
    main()
