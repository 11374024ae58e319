#!/usr/bin/python3
"""test_client.py: the Python binding (module dmann over libdmann) on a local cluster
(2 MN + 2 CN, `dmann local up`): create an index, put 20,000 64-d vectors, delete some,
batch-query; the keys and distances equal a NumPy brute force and the C client's (libdmann
called directly through ctypes) within 1e-5; bad input raises ValueError / KeyError with
libdmann's messages; the same vectors bulk-loaded as an HNSW index and searched through
`search` (dmann_search, client-side routing): recall@10 >= 0.95 against the brute force, the
returned distances are the exact L2 ones, client-side and server routing give the same ids. Run by meson (suite cluster) with DMANN_BUILD_ROOT
set."""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.environ["DMANN_BUILD_ROOT"]
sys.path.insert(0, os.path.join(ROOT, "cn", "client", "python"))
import dmann  # noqa: E402

DMANN = os.path.join(ROOT, "cn", "dmann")
NV, DIM, NQ, K = 20000, 64, 200, 10


def c_batch_query(cfg, bucket, name, q, k):
    """The same queries through libdmann's C API (ctypes)."""
    lib = ctypes.CDLL(os.path.join(ROOT, "cn", "client", "libdmann.so.0"))
    lib.dmann_connect.restype = ctypes.c_void_p
    lib.dmann_errmsg.restype = ctypes.c_char_p
    d = ctypes.c_void_p(lib.dmann_connect(cfg.encode(), b"local"))
    assert d.value, lib.dmann_errmsg()
    nq = q.shape[0]
    keys = (ctypes.c_char_p * (nq * k))()
    dist = np.zeros((nq, k), dtype=np.float32)
    cnt = (ctypes.c_uint32 * nq)()
    qq = np.ascontiguousarray(q, dtype=np.float32)
    rc = lib.dmann_batch_query(d, bucket.encode(), name.encode(),
                               qq.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(nq),
                               ctypes.c_uint32(q.shape[1]), ctypes.c_uint32(k), keys,
                               dist.ctypes.data_as(ctypes.c_void_p), cnt)
    assert rc == 0, lib.dmann_errmsg()
    out = [[keys[i * k + j].decode() for j in range(cnt[i])] for i in range(nq)]
    lib.dmann_close(d)   # the key strings leak here: a test
    return out, dist


def main():
    tmp = tempfile.mkdtemp(prefix="dmann-pyclient-")
    lc = os.path.join(tmp, "lc")
    # exact answers are asserted: no graph for the API-created index ([s3] graph_auto)
    subprocess.run([DMANN, "local", "up", "--mn", "2", "--cn", "2", "--dir", lc,
                    "--region-mb", "32", "--s3-set", "graph_auto=0"], check=True)
    try:
        cfg = os.path.join(lc, "cluster.ini")
        c = dmann.connect(config=cfg, client="local")
        rng = np.random.default_rng(7)
        v = rng.standard_normal((NV, DIM), dtype=np.float32)
        q = rng.standard_normal((NQ, DIM), dtype=np.float32)
        keys = ["p%05d" % i for i in range(NV)]
        c.create_index("pybucket", "pyidx", DIM, "euclidean")
        assert c.describe_index("pybucket", "pyidx") == {"dimension": DIM,
                                                         "metric": "euclidean"}
        c.put("pybucket", "pyidx", keys, v,
              metadata=[{"i": i} if i < 10 else None for i in range(NV)])
        c.delete("pybucket", "pyidx", keys[:500])
        got_keys, got_d = c.batch_query("pybucket", "pyidx", q, K)
        assert got_d.dtype == np.float32 and got_d.shape == (NQ, K)
        # NumPy brute force over the vectors left.
        rest = v[500:].astype(np.float64)
        d2 = ((q.astype(np.float64)[:, None, :] - rest[None, :, :]) ** 2).sum(-1)
        order = np.argsort(d2, axis=1, kind="stable")[:, :K]
        want_d = np.sqrt(np.take_along_axis(d2, order, 1))
        for i in range(NQ):
            want = [keys[500 + j] for j in order[i]]
            assert got_keys[i] == want, (i, got_keys[i], want)
        assert np.all(np.abs(got_d - want_d) <= 1e-5 * np.maximum(1, want_d)), \
            np.abs(got_d - want_d).max()
        # The C client returns the same keys and distances.
        ck, cd = c_batch_query(cfg, "pybucket", "pyidx", q, K)
        assert ck == got_keys
        assert np.abs(cd - got_d).max() <= 1e-5
        # query / get
        k1, d1 = c.query("pybucket", "pyidx", q[0], K)
        assert k1 == got_keys[0] and np.allclose(d1, got_d[0], atol=1e-5)
        back, found = c.get("pybucket", "pyidx", [keys[1], keys[600]])
        assert list(found) == [False, True]
        assert np.array_equal(back[1], v[600]), "float32 must round-trip exactly"
        # Bad input: the C library's messages.
        bad = q[0].copy()
        bad[3] = np.nan
        for call, exc, text in [
                (lambda: c.query("pybucket", "pyidx", bad, K), ValueError, "NaN or Inf"),
                (lambda: c.query("pybucket", "pyidx", q[0][:10], K), ValueError,
                 "wrong dimension"),
                (lambda: c.query("pybucket", "nosuch", q[0], K), KeyError, "nosuch"),
                (lambda: c.query("pybucket", "pyidx", q[0], 0), ValueError, "k = 0"),
                (lambda: c.put("pybucket", "pyidx", [""], q[:1]), ValueError, "key 0"),
                (lambda: c.put("pybucket", "pyidx", ["a", "b"], q[:1]), ValueError, "2 keys"),
                (lambda: c.create_index("pybucket", "pyidx", DIM), dmann.Error, "Conflict"),
        ]:
            try:
                call()
            except exc as e:
                assert text in str(e), (text, str(e))
            else:
                raise AssertionError("no %s for %s" % (exc.__name__, text))
        # The HNSW index: a clustered set (uniform Gaussian 64-d is a needle-in-a-haystack
        # case for any graph) bulk-loaded, searched natively.
        centres = rng.standard_normal((200, DIM), dtype=np.float32)
        v = (centres[rng.integers(0, 200, NV)] +
             0.3 * rng.standard_normal((NV, DIM), dtype=np.float32)).astype(np.float32)
        q = (centres[rng.integers(0, 200, NQ)] +
             0.3 * rng.standard_normal((NQ, DIM), dtype=np.float32)).astype(np.float32)
        base = os.path.join(tmp, "base.fbin")
        with open(base, "wb") as f:
            np.array([NV, DIM], dtype=np.int32).tofile(f)
            v.tofile(f)
        subprocess.run([DMANN, "build", "--base", base, "--metric", "l2", "--M", "16",
                        "--efc", "100", "--out", os.path.join(tmp, "idx.hnsw")], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([DMANN, "load", "--config", cfg, "--index",
                        os.path.join(tmp, "idx.hnsw")], check=True, stdout=subprocess.DEVNULL)
        # The compute nodes pick up a first index within their refresh period.
        for attempt in range(100):
            try:
                ids, hd = c.search(q, K, ef=128)
                break
            except KeyError:
                if attempt == 99:
                    raise
                time.sleep(0.2)
        assert ids.dtype == np.uint64 and ids.shape == (NQ, K) and hd.dtype == np.float32
        vall = v.astype(np.float64)
        d2a = ((q.astype(np.float64)[:, None, :] - vall[None, :, :]) ** 2).sum(-1)
        truth = np.argsort(d2a, axis=1, kind="stable")[:, :K]
        recall = np.mean([len(set(ids[i].tolist()) & set(truth[i].tolist())) / K
                          for i in range(NQ)])
        assert recall >= 0.95, recall
        exact = np.sqrt(np.take_along_axis(d2a, ids.astype(np.int64), 1))
        assert np.all(np.abs(hd - exact) <= 1e-4 * np.maximum(1, exact)), \
            np.abs(hd - exact).max()
        ids_s, hd_s = c.search(q, K, ef=128, routing="server")
        assert np.array_equal(ids_s, ids), "client-side and server routing differ"
        for call, exc, text in [
                (lambda: c.search(bad[None, :], K), ValueError, "not finite"),
                (lambda: c.search(q, 0), ValueError, "k = 0"),
                (lambda: c.search(q, K, routing="x"), ValueError, "routing"),
                (lambda: c.search(q[:, :10], K), ValueError, "wrong dimension"),
        ]:
            try:
                call()
            except exc as e:
                assert text in str(e), (text, str(e))
            else:
                raise AssertionError("no %s for %s" % (exc.__name__, text))
        print("python client: HNSW search recall@%d %.4f" % (K, recall))
        c.drop_index("pybucket", "pyidx")
        try:
            c.describe_index("pybucket", "pyidx")
            raise AssertionError("index still there")
        except KeyError:
            pass
        c.close()
        print("python client: ok (%d vectors, %d queries, keys and distances as NumPy and C)"
              % (NV, NQ))
    finally:
        subprocess.run([DMANN, "local", "down", "--dir", lc])
        if not os.environ.get("DMANN_KEEP_TEST_DIR"):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
