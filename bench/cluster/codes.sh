#!/bin/bash
# bench/cluster/codes.sh: remote search with and without RaBitQ neighbour codes (issue 12) on
# Fashion-MNIST. The SAME graph (both indexes built with one thread: a build with codes has
# exactly the graph of the one without) is served by a local cluster of 2 memory nodes + 2
# compute nodes, each node in its own network namespace joined by veth links rate-limited
# with tc (default 1gbit), tcp transport. For each layout and cache setting (0%, 10% of that
# layout's index, and 10% of the no-codes index in bytes for both: equal bytes) it runs a
# warm-up pass of NQ queries and a measured pass of the NQ after them (no query measured was
# warmed with) with `dmann bench --json` (and
# at 10% once more with admission probability 1.0 instead of the default 0.1), and for codes
# also beams b = 1, 2, 4 (candidates expanded per round trip) at cache 0% and 10%, loaded
# (16 queries in flight per compute node) and idle (one in flight: latency without queueing). Writes
# the tables between <!-- BEGIN cluster-codes --> markers of docs/benchmarks.md, with every
# ratio taken between runs of the same invocation.
#
# ef is chosen per layout so that recall with codes is at least that without (equal recall
# >= 0.95, the codes side never favoured): EF_NONE (16) and EF_CODES (18).
#
# Needs root (namespaces, tc) and a build (meson setup build && ninja -C build).
# Env: RATE (1gbit), NQ (1000), EF_NONE (16), EF_CODES (18), BUILD (build), WORK
# (~/.cache/dmann-bench).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
RATE=${RATE:-1gbit}
NQ=${NQ:-1000}
EF_NONE=${EF_NONE:-16}
EF_CODES=${EF_CODES:-18}
DMANN=$ROOT/$BUILD/cn/dmann
WORK=${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/dmann-bench}
DATA=$WORK/fmnist
LC=$WORK/cluster-codes
OUT=$WORK/cluster-codes.jsonl
export DMANN_NO_PROGRESS=1

[ "$(id -u)" = 0 ] || { echo "codes.sh: needs root for network namespaces and tc" >&2; exit 1; }
[ -x "$DMANN" ] || { echo "codes.sh: build first: meson setup $BUILD && ninja -C $BUILD" >&2; exit 1; }
mkdir -p "$WORK"
START=$(date +%s)
[ -f "$DATA/gt.ibin" ] || "$DMANN" fmnist --out "$DATA"
for c in rabitq none; do
	# rebuilt when dmann is newer than the image (a cached image would measure old code)
	[ "$WORK/fmnist.$c.v2.hnsw" -nt "$DMANN" ] || "$DMANN" build --base "$DATA/base.fbin" --metric l2 --M 16 \
		--efc 200 --threads 1 --codes $c --out "$WORK/fmnist.$c.v2.hnsw"
done

"$DMANN" local down --dir "$LC" >/dev/null 2>&1 || true
rm -rf "$LC"
trap '"$DMANN" local down --dir "$LC" >/dev/null 2>&1 || true' EXIT
"$DMANN" local up --mn 2 --cn 2 --dir "$LC" --netns --rate "$RATE" --region-mb 640

: >"$OUT"
run() {   # LAYOUT LABEL ARGS...
	local layout=$1 label=$2 ef=$EF_NONE
	shift 2
	[ "$layout" = rabitq ] && ef=$EF_CODES
	echo "== $layout $label" >&2
	"$DMANN" bench --config "$LC/cluster.ini" --query "$DATA/query.fbin" --gt "$DATA/gt.ibin" \
		--k 10 --ef "$ef" --nq "$NQ" --warmup "$NQ" --json "$@" |
		sed "s/^{/{\"layout\": \"$layout\", \"label\": \"$label\", /" | tee -a "$OUT"
}
NONE_BYTES=$(stat -c %s "$WORK/fmnist.none.v2.hnsw")
EQ_MIB=$(python3 -c "print($NONE_BYTES * 0.10 / 1048576)")
for c in none rabitq; do
	"$DMANN" load --config "$LC/cluster.ini" --index "$WORK/fmnist.$c.v2.hnsw" >&2
	run $c "cache 0%" --cache-ratio 0
	run $c "cache 10%" --cache-ratio 10%
	run $c "equal bytes" --cache-mib "$EQ_MIB"
	run $c "cache 10% admit 1.0" --cache-ratio 10% --admit 1.0
	if [ $c = rabitq ]; then
		run $c "b=2 cache 0%" --cache-ratio 0 --beam 2
		run $c "b=4 cache 0%" --cache-ratio 0 --beam 4
		run $c "b=2 cache 10%" --cache-ratio 10% --beam 2
		run $c "b=4 cache 10%" --cache-ratio 10% --beam 4
		# latency without queueing: one query in flight per compute node
		for b in 1 2 4; do
			run $c "b=$b idle" --cache-ratio 0 --beam $b --conns 1 --depth 1 --nq 300
		done
	fi
done
ELAPSED=$(( $(date +%s) - START ))

python3 - "$OUT" "$ROOT/docs/benchmarks.md" "$RATE" "$NQ" "$EF_NONE/$EF_CODES" "$ELAPSED" \
	"$(grep -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')" \
	"$(git -C "$ROOT" rev-parse --short HEAD)" <<'PY'
import json, os, sys, datetime
out, doc, rate, nq, ef, elapsed, isa, commit = sys.argv[1:9]
rows = [json.loads(l) for l in open(out) if l.strip()]
by = {(r["layout"], r["label"]): r for r in rows}
warmed = max(r.get("warmed_queries", 0) for r in rows)   # measured queries also warmed with
L = [
    f"Fashion-MNIST (60000 x 784, L2), HNSW M=16 efConstruction=200 built with one thread (the "
    f"same graph with and without codes), k=10, ef={ef} (without/with codes: recall with codes at "
    f"least that without); 2 memory nodes + 2 compute nodes, each "
    f"in its own network namespace, every link rate-limited to {rate} with tc tbf; tcp "
    f"transport; {nq} queries after a warm-up pass of {nq} other queries "
    f"(the stream positions before them; measured queries also in the warm-up: {warmed}), "
    f"2 connections x 8 "
    f"queries in flight per compute node, routing none. Compute nodes hold the upper-level "
    f"lists and the upper-level nodes' vectors (both layouts), so READs are level-0 records: "
    f"hops/query counts the upper-level greedy steps (no READ) and the level-0 expansions; "
    f"with codes at cache 0% READs/query equals the level-0 expansions. "
    f"Produced by `bench/cluster/codes.sh` in {elapsed} s ({datetime.date.today().isoformat()}, "
    f"commit {commit}, ISA: {isa.strip()}); ratios are between runs of that one invocation.",
    "",
    "| layout | cache | cache MiB | recall@10 | QPS | hit rate | READs/query | hops/query | READs/hop | KiB/query | round trips/query | p50 ms | p99 ms |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]
for r in rows:
    if r["label"].startswith("b="):
        continue
    L.append(f"| {'codes' if r['layout'] == 'rabitq' else 'no codes'} (ef {r['ef']}) | {r['label']} | {r['cache_mib']:.1f} | "
             f"{r['recall']:.4f} | {r['qps']:.0f} | {r['hit_rate']:.3f} | {r['reads_per_query']:.1f} | "
             f"{r['hops_per_query']:.1f} | {r['reads_per_query']/max(r['hops_per_query'],1e-9):.2f} | "
             f"{r['bytes_per_query']/1024:.0f} | {r['round_trips_per_query']:.1f} | "
             f"{r['p50_us']/1000:.2f} | {r['p99_us']/1000:.2f} |")
L += ["", "Codes vs no codes (same cache setting, same run):", "",
      "| cache | READs/query ratio | READs per hop (codes; target <= 1.5) | bytes/query ratio (target <= 0.4) | throughput ratio (target >= 2.5) |",
      "|---|---:|---:|---:|---:|"]
for lab in ["cache 0%", "cache 10%", "equal bytes"]:
    c, n = by.get(("rabitq", lab)), by.get(("none", lab))
    if not c or not n:
        continue
    rh = c["reads_per_query"] / max(c["hops_per_query"], 1e-9)
    br = c["bytes_per_query"] / n["bytes_per_query"] if n["bytes_per_query"] else float("nan")
    qr = c["qps"] / n["qps"]
    L.append(f"| {lab} | {c['reads_per_query']/max(n['reads_per_query'],1e-9):.3f} | {rh:.2f} ({'met' if rh <= 1.5 else 'not met'}) | "
             f"{br:.3f} ({'met' if br <= 0.4 else 'not met'}) | {qr:.2f}x ({'met' if qr >= 2.5 else 'not met'}) |")
L += ["", "Beam b (codes: best b candidates expanded per round trip, one doorbell):", "",
      "| cache | b | recall@10 | QPS | READs/query | round trips/query | hops/query | p50 ms | p99 ms |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
for cache in ["cache 0%", "cache 10%"]:
    for b in (1, 2, 4):
        r = by.get(("rabitq", cache if b == 1 else f"b={b} {cache}"))
        if r:
            cache_l = cache + " (16 in flight per CN)"
            L.append(f"| {cache_l} | {b} | {r['recall']:.4f} | {r['qps']:.0f} | {r['reads_per_query']:.1f} | "
                     f"{r['round_trips_per_query']:.1f} | {r['hops_per_query']:.1f} | "
                     f"{r['p50_us']/1000:.2f} | {r['p99_us']/1000:.2f} |")
for b in (1, 2, 4):
    r = by.get(("rabitq", f"b={b} idle"))
    if r:
        L.append(f"| cache 0% (1 in flight per CN) | {b} | {r['recall']:.4f} | {r['qps']:.0f} | {r['reads_per_query']:.1f} | "
                 f"{r['round_trips_per_query']:.1f} | {r['hops_per_query']:.1f} | "
                 f"{r['p50_us']/1000:.2f} | {r['p99_us']/1000:.2f} |")
block = "\n".join(L)
sys.path.insert(0, os.path.join(os.path.dirname(doc), "..", "bench"))
from mdblock import put_block
put_block(doc, "cluster-codes", block,
          heading="## Remote search with neighbour codes (issue 12)")
print(block)
PY
