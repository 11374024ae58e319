#!/bin/bash
# bench/cluster/run.sh: compute-node cache benchmark on Fashion-MNIST (issue: memory node /
# compute node). A local cluster of 2 memory nodes + 2 compute nodes, each node in its own
# network namespace joined by veth links rate-limited with tc (default 1gbit), so that the
# network, not the 2-core CPU, is the bottleneck as on a real cluster. For cache ratios
# 0 (the no-cache baseline), 2, 5 and 10 % it runs a warm-up pass and then a measured pass
# of the same query stream, and writes throughput, hit rate and per-query READs, bytes and
# round trips (with the ratio to the no-cache baseline measured in the same run) between
# the <!-- BEGIN cluster --> markers of docs/benchmarks.md.
#
# Needs root (namespaces, tc), the packages of deploy/install-deps.sh, and a build
# (meson setup build && ninja -C build). Env: RATE (1gbit), NQ (2000), EF (64), BUILD (build).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
RATE=${RATE:-1gbit}
NQ=${NQ:-2000}
EF=${EF:-64}
DMANN=$ROOT/$BUILD/cn/dmann
WORK=${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/dmann-bench}
DATA=$WORK/fmnist
IDX=$WORK/fmnist.v2.hnsw
LC=$WORK/cluster-netns
OUT=$WORK/cluster-results.jsonl

[ "$(id -u)" = 0 ] || { echo "run.sh: needs root for network namespaces and tc" >&2; exit 1; }
[ -x "$DMANN" ] || { echo "run.sh: build first: meson setup $BUILD && ninja -C $BUILD" >&2; exit 1; }
mkdir -p "$WORK"
[ -f "$DATA/gt.ibin" ] || "$DMANN" fmnist --out "$DATA"
[ -f "$IDX" ] || "$DMANN" build --base "$DATA/base.fbin" --metric l2 --M 16 --efc 200 --out "$IDX"

"$DMANN" local down --dir "$LC" >/dev/null 2>&1 || true
rm -rf "$LC"
trap '"$DMANN" local down --dir "$LC" >/dev/null 2>&1 || true' EXIT
"$DMANN" local up --mn 2 --cn 2 --dir "$LC" --netns --rate "$RATE" --region-mb 320
"$DMANN" load --config "$LC/cluster.ini" --index "$IDX"

: >"$OUT"
for ratio in 0 2% 5% 10%; do
	echo "== cache $ratio"
	"$DMANN" bench --config "$LC/cluster.ini" --query "$DATA/query.fbin" --gt "$DATA/gt.ibin" \
		--k 10 --ef "$EF" --cache-ratio "$ratio" --nq "$NQ" --warmup "$NQ" --json | tee -a "$OUT"
done

python3 - "$OUT" "$ROOT/docs/benchmarks.md" "$RATE" "$NQ" "$EF" <<'PY'
import json, os, sys, datetime
out, doc, rate, nq, ef = sys.argv[1:6]
rows = [json.loads(l) for l in open(out) if l.strip()]
base = rows[0]
lines = [
    f"Fashion-MNIST (60000 x 784, L2), HNSW M=16 efConstruction=200, k=10, ef={ef}; 2 memory "
    f"nodes + 2 compute nodes, each in its own network namespace, every link rate-limited to "
    f"{rate} with tc tbf; tcp transport; {nq} queries after a warm-up pass of the same stream, "
    f"2 connections x 8 queries in flight per compute node, routing none. Ratios are against "
    f"the no-cache run of the same invocation of `bench/cluster/run.sh` "
    f"({datetime.date.today().isoformat()}).",
    "",
    "| cache ratio | recall@10 | QPS | QPS vs no cache | hit rate | READs/query | KiB/query | bytes vs no cache | round trips/query | hops/query | p50 ms | p99 ms |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
]
for r in rows:
    lines.append(
        f"| {r['cache_ratio']*100:.0f}% | {r['recall']:.4f} | {r['qps']:.0f} | "
        f"{r['qps']/base['qps']:.2f}x | {r['hit_rate']:.3f} | {r['reads_per_query']:.0f} | "
        f"{r['bytes_per_query']/1024:.0f} | {r['bytes_per_query']/base['bytes_per_query']:.2f}x | "
        f"{r['round_trips_per_query']:.1f} | {r['hops_per_query']:.1f} | "
        f"{r['p50_us']/1000:.1f} | {r['p99_us']/1000:.1f} |")
block = "\n".join(lines)
sys.path.insert(0, os.path.join(os.path.dirname(doc), "..", "bench"))
from mdblock import put_block
put_block(doc, "cluster", block, heading="## Compute-node cache on rate-limited links")
print(block)
PY
