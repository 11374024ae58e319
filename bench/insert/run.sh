#!/bin/bash
# bench/insert/run.sh: online indexing rate (issue 13, point 3). Generated 128-d vectors
# (`dmann gen --kind sift`), HNSW M=16 efConstruction=100. An index built offline on the
# first N0 rows is loaded on a local cluster (2 memory + 2 compute nodes, R=2, tcp,
# loopback) with room for the other N1 rows, which `dmann insert` writes online through both
# compute nodes (CONNS connections each) while nothing else runs; then recall@10 of the
# queries against brute force over all N0 + N1 rows (inserted rows mapped to their ids),
# self-find of the inserted rows (recall@1 against their own ids), and for reference the
# local build (`dmann build`, the same parameters) of the same N0 + N1 rows with 1 and 2
# threads, in the same run. Writes the table between <!-- BEGIN insert --> markers of
# docs/benchmarks.md.
#
# Env: N0 (50000), N1 (20000), CONNS (2), BUILD (build), WORK (~/.cache/dmann-bench).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
N0=${N0:-50000}
N1=${N1:-20000}
CONNS=${CONNS:-2}
DMANN=$ROOT/$BUILD/cn/dmann
WORK=${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/dmann-bench}/insert
PY=/usr/bin/python3
export DMANN_NO_PROGRESS=1

[ -x "$DMANN" ] || { echo "run.sh: build first: meson setup $BUILD && ninja -C $BUILD" >&2; exit 1; }
$PY -c 'import numpy' 2>/dev/null || { echo "run.sh: needs NumPy for $PY (python3-numpy)" >&2; exit 1; }
rm -rf "$WORK"
mkdir -p "$WORK"
START=$(date +%s)
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

log "data: $((N0 + N1)) x 128"
"$DMANN" gen --kind sift --n $((N0 + N1)) --nq 1000 --seed 7 --out "$WORK/d" >/dev/null
$PY - "$WORK" "$N0" <<'EOF'
import sys, numpy as np
w, n0 = sys.argv[1], int(sys.argv[2])
h = np.fromfile(w + "/d/base.fbin", dtype=np.uint32, count=2)
x = np.fromfile(w + "/d/base.fbin", dtype=np.float32, offset=8).reshape(int(h[0]), int(h[1]))
for name, m in (("a", x[:n0]), ("b", x[n0:])):
    with open("%s/%s.fbin" % (w, name), "wb") as f:
        np.array(m.shape, dtype=np.uint32).tofile(f)
        m.tofile(f)
EOF
log "offline build of the first $N0 rows, and local builds of all rows (1 and 2 threads)"
"$DMANN" build --base "$WORK/a.fbin" --metric l2 --M 16 --efc 100 --threads 2 --out "$WORK/a.hnsw" >/dev/null
"$DMANN" build --base "$WORK/d/base.fbin" --metric l2 --M 16 --efc 100 --threads 1 --json \
	--out "$WORK/all1.hnsw" >"$WORK/build1.json"
"$DMANN" build --base "$WORK/d/base.fbin" --metric l2 --M 16 --efc 100 --threads 2 --json \
	--out "$WORK/all2.hnsw" >"$WORK/build2.json"
"$DMANN" search --index "$WORK/all2.hnsw" --query "$WORK/d/query.fbin" --gt "$WORK/d/gt.ibin" \
	--k 10 --ef 64 --json >"$WORK/local-search.json"
# the same self-find over the offline build of all rows (row n0 + i is b's row i there)
$PY -c "
import numpy as np, sys
with open(sys.argv[1], 'wb') as f:
    np.array([$N1, 1], dtype=np.uint32).tofile(f); np.arange($N0, $N0 + $N1, dtype=np.int32).tofile(f)
" "$WORK/selfgt.ibin"
"$DMANN" search --index "$WORK/all2.hnsw" --query "$WORK/b.fbin" --gt "$WORK/selfgt.ibin" \
	--k 1 --ef 64 --json >"$WORK/local-self.json"

log "cluster: 2 MN + 2 CN, R=2; load with room for $N1; insert online"
trap '"$DMANN" local down --dir "$WORK/lc" >/dev/null 2>&1 || true' EXIT
"$DMANN" local up --mn 2 --cn 2 --redundancy 2 --dir "$WORK/lc" \
	--region-mb $(( (N0 + N1) * 1536 * 2 / 1048576 + 64 )) >/dev/null
"$DMANN" load --config "$WORK/lc/cluster.ini" --index "$WORK/a.hnsw" --spare "$N1" >/dev/null
"$DMANN" insert --config "$WORK/lc/cluster.ini" --vectors "$WORK/b.fbin" --ef 100 \
	--conns "$CONNS" --out "$WORK/ids.ibin" --json >"$WORK/insert.json"
"$DMANN" bench --config "$WORK/lc/cluster.ini" --query "$WORK/d/query.fbin" --gt "$WORK/d/gt.ibin" \
	--k 10 --ef 64 --cache-ratio keep --out "$WORK/res.ibin" --json >"$WORK/query.json"
"$DMANN" bench --config "$WORK/lc/cluster.ini" --query "$WORK/b.fbin" --gt "$WORK/ids.ibin" \
	--k 1 --ef 64 --cache-ratio keep --json >"$WORK/self.json"
ELAPSED=$(( $(date +%s) - START ))

$PY - "$WORK" "$N0" "$N1" "$CONNS" "$ROOT/docs/benchmarks.md" "$ELAPSED" <<'EOF'
import json, os, re, subprocess, sys, numpy as np
w, n0, n1, conns, md, elapsed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
def rd(p, dt):
    h = np.fromfile(p, dtype=np.uint32, count=2)
    return np.fromfile(p, dtype=dt, offset=8).reshape(int(h[0]), int(h[1]))
gt = rd(w + "/d/gt.ibin", np.int32)[:, :10]
res = rd(w + "/res.ibin", np.int32)
ids = rd(w + "/ids.ibin", np.int32)[:, 0]
m = np.where(gt >= n0, ids[np.clip(gt - n0, 0, n1 - 1)], gt)
recall = float(np.mean([len(set(m[i]) & set(res[i])) / 10.0 for i in range(len(res))]))
ins = json.load(open(w + "/insert.json"))
b1 = json.load(open(w + "/build1.json")); b2 = json.load(open(w + "/build2.json"))
ls = json.loads(open(w + "/local-search.json").read().splitlines()[0])
self_find = json.load(open(w + "/self.json"))["recall"]
local_self = json.loads(open(w + "/local-self.json").read().splitlines()[0])["recall"]
isa = open("/proc/cpuinfo").read()
isa = " ".join(f for f in ("avx512f", "avx2") if re.search(r"\b%s\b" % f, isa))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
n = n0 + n1
rows = [
    ("online inserts, 2 CNs x %s connections (%d rows into an index of %d)" % (conns, n1, n0),
     "%.0f" % ins["rate"], "%.1f" % ins["seconds"]),
    ("local build of all %d rows, 1 thread" % n, "%.0f" % (n / b1["build_s"]), "%.1f" % b1["build_s"]),
    ("local build of all %d rows, 2 threads" % n, "%.0f" % (n / b2["build_s"]), "%.1f" % b2["build_s"]),
]
out = ["## Online inserts (issue 13)", "",
       "Generated by `bench/insert/run.sh` (do not edit by hand): %d x 128 generated vectors "
       "(`dmann gen --kind sift`), HNSW M=16 efConstruction=100; the first %d built offline and "
       "bulk-imported (`dmann load --spare %d`) on a local cluster of 2 memory + 2 compute nodes "
       "(R=2, tcp, loopback, one 2-core machine for every process), the other %d inserted online "
       "by `dmann insert` (no queries meanwhile). Machine: %s; commit %s; %s s." %
       (n, n0, n1, n1, isa, commit, elapsed), "",
       "| what | rows/s | seconds |", "|---|---:|---:|"]
out += ["| %s | %s | %s |" % r for r in rows]
out += ["",
        "After the inserts: recall@10 of 1,000 queries at ef=64 against brute force over all %d "
        "rows **%.4f** (the local search of the 2-thread offline build of all rows: %.4f); every "
        "inserted row queried with its own vector finds itself first: %.4f (the same rows in the "
        "local search of the offline build of all rows, ef=64: %.4f); back-links made %d, "
        "dropped %d, lock retries %d, records read %d (%d again after a torn read)." %
        (n, recall, ls["recall"], self_find, local_self, ins["links"], ins["links_dropped"],
         ins["lock_retries"], ins["reads"], ins["rereads"]),
        "", "Online rate / 2-thread local build rate: %.3f (target of issue 13: >= 300 rows/s online)." %
        (ins["rate"] / (n / b2["build_s"]))]
block = "\n".join(out)
sys.path.insert(0, os.path.join(os.path.dirname(md), "..", "bench"))
from mdblock import put_block
put_block(md, "insert", block)
print(block)
EOF
