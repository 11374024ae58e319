#!/bin/bash
# bench/keyorder/run.sh: key-order placement vs insertion order (issue 15, point 1).
# N x 100 generated SPACEV-shaped vectors (`dmann gen --kind spacev`, default 1,000,000),
# HNSW M=16 efConstruction=100 with neighbour codes, built twice from the same file with 2
# threads: in insertion order (node i = row i) and in VHash key order (`dmann build --order
# vhash`, K = 256 regions: a block of 4096 consecutive nodes is a semantic region; the graph
# is the same up to the renumbering, built in the same row order). Each image is loaded as
# graph 0 on a local cluster of 3 memory + 2 compute nodes (R=2, tcp, loopback); the key-order
# image twice: blocks placed one by one (the default) and in runs of RUN consecutive blocks
# (`dmann load --place-run`). Each is queried with a beam of 4 candidates per round trip at
# cache 5% and 10% (`dmann bench --beam 4 --cache-ratio`): a warm-up on the first WARM queries
# of the stream, then NQ other queries measured (the query file holds WARM + NQ). Reported per
# configuration: recall@10, QPS, distinct memory nodes per round trip and per query, distinct
# blocks per query (of the queries' remote READs: the compute nodes' locality counters,
# Q_STATS loc_*), round trips (read batches) per query, READs per query and the cache hit
# rate, plus the block bytes each memory node holds (as `dmann load` reports them from the
# placement function); and the key/insertion ratios. The table goes
# between the <!-- BEGIN keyorder --> markers of docs/benchmarks.md.
#
# Env: N (1000000), NQ (2000), WARM (2000), EF (64), RUN (8), BUILD (build),
# WORK (~/.cache/dmann-bench/keyorder).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
N=${N:-1000000}
NQ=${NQ:-2000}
WARM=${WARM:-2000}
EF=${EF:-64}
RUN=${RUN:-8}
DMANN=$ROOT/$BUILD/cn/dmann
WORK=${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/dmann-bench}/keyorder
PY=/usr/bin/python3
export DMANN_NO_PROGRESS=1

[ -x "$DMANN" ] || { echo "run.sh: build first: meson setup $BUILD && ninja -C $BUILD" >&2; exit 1; }
mkdir -p "$WORK"
START=$(date +%s)
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

D=$WORK/d-$N
if [ ! -s "$D/gt.ibin" ]; then
	log "data: $N x 100 (spacev), $((WARM + NQ)) queries"
	"$DMANN" gen --kind spacev --n "$N" --nq $((WARM + NQ)) --seed 15 --out "$D" >/dev/null
fi
declare -A BUILD_S
for order in insertion vhash; do
	IDX=$WORK/idx-$N-$order.hnsw
	if [ ! -s "$IDX" ]; then
		log "build: $order order (2 threads)"
		"$DMANN" build --base "$D/base.fbin" --metric l2 --M 16 --efc 100 --threads 2 \
			--order "$order" --json --out "$IDX.tmp" >"$WORK/build-$order.json"
		[ ! -f "$IDX.tmp.vhash" ] || mv "$IDX.tmp.vhash" "$IDX.vhash"
		mv "$IDX.tmp" "$IDX"
	fi
	BUILD_S[$order]=$($PY -c "import json; print(json.load(open('$WORK/build-$order.json'))['build_s'])" 2>/dev/null || echo "?")
done
IDX_BYTES=$(stat -c %s "$WORK/idx-$N-insertion.hnsw")
# Each memory node holds 2/3 of 2 copies; during a load the next generation too.
REGION=$(( IDX_BYTES * 3 / 1048576 + 256 ))

log "cluster: 3 MN + 2 CN, R=2, regions of $REGION MiB"
rm -rf "$WORK/lc"
trap '"$DMANN" local down --dir "$WORK/lc" >/dev/null 2>&1 || true' EXIT
"$DMANN" local up --mn 3 --cn 2 --redundancy 2 --dir "$WORK/lc" --region-mb "$REGION" >/dev/null
CFG=$WORK/lc/cluster.ini
OUT=$WORK/results.jsonl
: >"$OUT"
for conf in insertion:1 vhash:1 vhash:$RUN; do
	order=${conf%:*}
	run=${conf#*:}
	log "load: $order order, placement runs of $run block(s)"
	used=$("$DMANN" load --config "$CFG" --index "$WORK/idx-$N-$order.hnsw" --place-run "$run" |
		sed -n 's/^dmann load: block bytes per memory node: //p' | tr ' ' ',')
	sleep 2   # the compute nodes pick the generation up within refresh_ms
	for ratio in 5% 10%; do
		log "bench: $order, run $run, cache $ratio"
		"$DMANN" bench --config "$CFG" --query "$D/query.fbin" --gt "$D/gt.ibin" --k 10 \
			--ef "$EF" --beam 4 --cache-ratio "$ratio" --warmup "$WARM" --nq "$NQ" --json |
			$PY -c "import json,sys; r=json.loads(sys.stdin.read()); r.update(order='$order', run=$run, mn_used='$used'); print(json.dumps(r))" >>"$OUT"
	done
done
ELAPSED=$(( $(date +%s) - START ))

$PY - "$OUT" "$ROOT/docs/benchmarks.md" "$N" "$NQ" "$WARM" "$EF" "$ELAPSED" \
	"$(grep -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')" \
	"$(git -C "$ROOT" rev-parse --short HEAD)" "${BUILD_S[insertion]}" "${BUILD_S[vhash]}" \
	"$(nproc)" <<'PY'
import json, os, sys, datetime
out, doc, n, nq, warm, ef, elapsed, isa, commit, bs_ins, bs_key, ncpu = sys.argv[1:13]
rows = [json.loads(l) for l in open(out) if l.strip()]
by = {(r["order"], r["run"], round(r["cache_ratio"], 2)): r for r in rows}
warmed = max(r.get("warmed_queries", 0) for r in rows)
name = {"insertion": "insertion order", "vhash": "VHash key order"}
L = [
    f"{int(n):,} x 100 generated SPACEV-shaped vectors (`dmann gen --kind spacev`, a mixture of "
    f"64 components, l2), HNSW M=16 efConstruction=100 with RaBitQ neighbour codes, built with "
    f"2 threads in insertion order ({bs_ins} s) and in VHash key order (K = 256, {bs_key} s; "
    f"the same rows inserted in the same order, nodes numbered by key); blocks of 4096 records. "
    f"3 memory + 2 compute nodes on one {ncpu}-core VM (tcp, loopback, R=2), each image loaded as "
    f"graph 0; k=10, ef={ef}, beam b=4 candidates expanded per round trip, {nq} queries measured "
    f"after a warm-up on {warm} other queries (measured queries also in the warm-up: {warmed}), "
    f"2 connections x 8 queries in flight per compute node, routing none. MNs and blocks count "
    f"the remote READs of a query (cache hits touch none); a round trip is one batch of READs "
    f"issued together. Produced by `bench/keyorder/run.sh` in {elapsed} s "
    f"({datetime.date.today().isoformat()}, commit {commit}, ISA: {isa.strip()}). QPS on this "
    f"shared 2-core VM is indicative only (5 node processes and the client share 2 cores).",
    "",
    "| numbering | placement | cache | recall@10 | QPS | hit rate | MNs/round trip | MNs/query | blocks/query | round trips/query | READs/query | block MiB per memory node (mn0/mn1/mn2) |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
]
for r in rows:
    used = "/".join(f"{int(u)/1048576:.0f}" for u in r["mn_used"].split(",") if u)
    L.append(
        f"| {name[r['order']]} | {'block by block' if r['run'] == 1 else 'runs of %d blocks' % r['run']} | "
        f"{r['cache_ratio']*100:.0f}% | {r['recall']:.4f} | {r['qps']:.0f} | {r['hit_rate']:.3f} | "
        f"{r['mns_per_round_trip']:.2f} | {r['mns_per_query']:.2f} | {r['blocks_per_query']:.1f} | "
        f"{r['round_trips_per_query']:.1f} | {r['reads_per_query']:.1f} | {used} |")
L += ["", "Key order against insertion order (ratio key / insertion, same cache):", "",
      "| placement of the key order | cache | recall | QPS | hit rate | MNs/round trip | MNs/query | blocks/query | round trips/query |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
for r in rows:
    if r["order"] != "vhash":
        continue
    b = by.get(("insertion", 1, round(r["cache_ratio"], 2)))
    if not b:
        continue
    q = lambda k: f"{r[k] / b[k]:.2f}" if b[k] else "-"
    L.append(f"| {'block by block' if r['run'] == 1 else 'runs of %d blocks' % r['run']} | "
             f"{r['cache_ratio']*100:.0f}% | {q('recall')} | {q('qps')} | {q('hit_rate')} | "
             f"{q('mns_per_round_trip')} | {q('mns_per_query')} | {q('blocks_per_query')} | "
             f"{q('round_trips_per_query')} |")
block = "\n".join(L)
sys.path.insert(0, os.path.join(os.path.dirname(doc), "..", "bench"))
from mdblock import put_block
# this section's heading is inside its markers
put_block(doc, "keyorder", "## Key-order placement against insertion order (issue 15)\n\n" + block)
print(block)
PY
