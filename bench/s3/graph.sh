#!/bin/bash
# bench/s3/graph.sh: QueryVectors on the graph path against the exact path, on the same index
# of one cluster in one run (issue 13, point 2, as far as it is built). N + TAIL vectors of
# 96 dims (`dmann gen --kind deep`); an HNSW image of the first N (M=16, efConstruction=100)
# is bulk-imported with `dmann load --bucket --name` on a local cluster of 2 MN + 2 CN (R=2,
# tcp, loopback, every process on this machine), then the other TAIL rows are put through
# libdmann and the online indexer moves them into the graph (the script waits until the
# compute nodes report no row past the mark, and reports the indexing rate next to the
# offline build rate of the same data). Queries through libdmann's dmann_batch_query (up to 32 requests in
# flight per compute node, the same for both paths): WARM queries to warm up, then MEAS
# other queries measured (never the warm-up ones), recall@10 against the exact top-10 over
# all N + TAIL rows. Then the compute nodes are restarted with [s3] graph_min_rows past the
# index (DMANN_S3_GRAPH_MIN_ROWS), so the planner takes the exact path (the distributed
# scan over W members, fragments cached on the CNs), warmed and measured on the same
# queries. The graph counters of the CNs are read around each run. Writes the table between
# <!-- BEGIN graph --> markers of docs/benchmarks.md.
#
# Env: N (1000000), TAIL (50000), WARM (500), MEAS (2000), EF (graph_ef, 64), CACHE ([cn]
# cache, 10%), IXBATCH ([s3] index_batch, 8192), IXTHREADS ([s3] index_threads, 4), BUILD
# (build), WORK (/dev/shm/dmann-graph or ~/.cache/dmann-bench/graph).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
N=${N:-1000000}
TAIL=${TAIL:-50000}
WARM=${WARM:-500}
MEAS=${MEAS:-2000}
EF=${EF:-64}
CACHE=${CACHE:-10%}
IXBATCH=${IXBATCH:-8192}
IXTHREADS=${IXTHREADS:-4}
SPARE=$((TAIL + TAIL / 5))
. "$ROOT/bench/s3/lib.sh"
bench_init graph

log "data: $((N + TAIL)) x 96, $((WARM + MEAS)) queries"
"$DMANN" gen --kind deep --n $((N + TAIL)) --nq $((WARM + MEAS)) --seed 3 --out "$WORK/d" >/dev/null
# Slices without NumPy: the first N rows (fbin), the warm-up and measured queries and the
# measured queries' ground truth.
split_queries "$WARM" "$N"
log "offline build of the first $N rows (2 threads)"
T0=$(date +%s.%N)
"$DMANN" build --base "$WORK/import.fbin" --metric l2 --M 16 --efc 100 --threads 2 \
	--out "$WORK/idx.hnsw" >/dev/null
BUILD_S=$(echo "$(date +%s.%N) - $T0" | bc)
# Region: the graph's records (both replicas on each of the 2 memory nodes) with room.
REC=$(( $(stat -c %s "$WORK/idx.hnsw") / 1048576 ))
REGION=$(( REC * 2 * (N + SPARE) / N + 512 ))
"$DMANN" local up --mn 2 --cn 2 --dir "$CDIR" --redundancy 2 --region-mb $REGION \
	--s3-set graph_ef=$EF --s3-set index_batch=$IXBATCH --s3-set index_threads=$IXTHREADS --cn-set cache=$CACHE >/dev/null
INI=$CDIR/cluster.ini
log "bulk import into bkt/idx (region ${REGION} MiB per memory node)"
T0=$(date +%s.%N)
"$DMANN" load --config "$INI" --index "$WORK/idx.hnsw" --bucket bench-bkt --name bench-idx \
	--vectors "$WORK/import.fbin" --spare $SPARE >"$WORK/load.txt"
rm -f "$WORK/import.fbin"
IMPORT_S=$(echo "$(date +%s.%N) - $T0" | bc)
bench_ports
log "tail: $TAIL rows put through libdmann, indexed online"
T0=$(date +%s.%N)
"$GB" put --config "$INI" --bucket bench-bkt --name bench-idx --base "$WORK/d/base.fbin" \
	--from "$N" --to $((N + TAIL)) >"$WORK/put.json"
while :; do
	rows=$(msum dmann_cn_s3_indexed_rows_total)
	lag=$(msum dmann_cn_s3_index_lag_rows)
	[ "$rows" -ge "$TAIL" ] && [ "$lag" -eq 0 ] && break
	if [ $(( $(date +%s) - START )) -gt 7200 ]; then
		echo "graph.sh: indexing not done: $rows rows indexed, $lag past the mark" >&2
		exit 1
	fi
	sleep 1
done
INDEX_S=$(echo "$(date +%s.%N) - $T0" | bc)
echo "$(msum dmann_cn_s3_indexed_rows_total) $(msum dmann_cn_s3_index_insert_milliseconds_total)" \
	"$(msum dmann_cn_s3_index_snapshots_total) $(msum dmann_cn_s3_index_snapshot_seconds_total)" \
	>"$WORK/index.txt"
sleep 2

counters() {
	local q=0 f=0 v
	for p in $ports; do
		v=$(curl -s "127.0.0.1:$p/metrics" | awk '/^dmann_cn_s3_graph_queries_total/{print $2}')
		q=$((q + ${v:-0}))
		v=$(curl -s "127.0.0.1:$p/metrics" | awk '/^dmann_cn_s3_graph_fallbacks_total/{print $2}')
		f=$((f + ${v:-0}))
	done
	echo "$q $f"
}
run() {   # label: warm-up, then the measured run, with the graph counters around it
	"$GB" query --config "$INI" --bucket bench-bkt --name bench-idx --query "$WORK/warm.fbin" \
		--gt "$WORK/d/gt.ibin" --label warm >/dev/null
	local c0 c1
	c0=$(counters)
	"$GB" query --config "$INI" --bucket bench-bkt --name bench-idx --query "$WORK/meas.fbin" \
		--gt "$WORK/meas_gt.ibin" --label "$1" >"$WORK/$1.json"
	c1=$(counters)
	echo "$c0 $c1" >"$WORK/$1.ctr"
}
log "graph path: $WARM warm-up + $MEAS measured queries"
run graph
log "exact path: compute nodes restarted with graph_min_rows past the index"
for cn in cn0 cn1; do
	"$DMANN" local stop --dir "$CDIR" $cn >/dev/null
	DMANN_S3_GRAPH_MIN_ROWS=1099511627776 "$DMANN" local start --dir "$CDIR" $cn >/dev/null
done
sleep 3
run exact
ELAPSED=$(( $(date +%s) - START ))

$PY - "$WORK" "$ROOT/docs/benchmarks.md" "$N" "$TAIL" "$WARM" "$MEAS" "$EF" "$BUILD_S" \
	"$IMPORT_S" "$ELAPSED" "$CACHE" "$INDEX_S" "$IXBATCH" "$IXTHREADS" <<'EOF'
import json, os, re, subprocess, sys
w, md = sys.argv[1], sys.argv[2]
n, tail, warm, meas, ef = map(int, sys.argv[3:8])
build_s, import_s, elapsed = float(sys.argv[8]), float(sys.argv[9]), sys.argv[10]
cache = sys.argv[11]
index_s, ixbatch, ixthreads = float(sys.argv[12]), int(sys.argv[13]), int(sys.argv[14])
irows, ins_ms, snaps, snap_s = map(int, open(w + "/index.txt").read().split())
g = json.load(open(w + "/graph.json")); x = json.load(open(w + "/exact.json"))
put = json.load(open(w + "/put.json"))
gc = list(map(int, open(w + "/graph.ctr").read().split()))
xc = list(map(int, open(w + "/exact.ctr").read().split()))
isa = open("/proc/cpuinfo").read()
isa = " ".join(f for f in ("avx512f", "avx2") if re.search(r"\b%s\b" % f, isa))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
out = ["## The graph path against the exact path (issue 13)", "",
       "Generated by `bench/s3/graph.sh` (do not edit by hand): %d x 96 generated vectors "
       "(`dmann gen --kind deep`, l2); an HNSW image of the first %d (M=16, efConstruction=100, "
       "RaBitQ codes; built in %.0f s with 2 threads) bulk-imported with `dmann load --bucket "
       "--name` in %.0f s on a local cluster of 2 memory + 2 compute nodes (R=2, tcp, loopback, "
       "one 2-core machine for every process), then %d more rows put through libdmann in %.0f s "
       "and moved into the graph by the online indexers (both compute nodes, each its share of "
       "the keys, `[s3] index_threads = %d`, `index_ef = 100`, `index_batch = %d`); queries start once no row is past the "
       "graph mark. Queries through libdmann's `dmann_batch_query` (up to 32 requests in "
       "flight per compute node for both paths), %d warm-up queries, then %d other queries "
       "measured; recall@10 against the exact top-10 over all %d rows. The exact path is the "
       "same index after a restart of the compute nodes with `[s3] graph_min_rows` past it (the "
       "planner's distributed scan, fragments cached on the CNs, warmed with the same warm-up "
       "queries). graph_ef = %d, graph_beam = 4, `[cn] cache = %s`, `[cn] call_threads = 8`. "
       "Machine: %s; commit %s; %s s." %
       (n + tail, n, build_s, import_s, tail, put["s"], ixthreads, ixbatch, warm, meas, n + tail, ef,
        cache, isa, commit, elapsed), "",
       "| indexing | rows | seconds | rows/s |", "|---|---:|---:|---:|",
       "| offline build (`dmann build`, 2 threads, one machine) | %d | %.0f | %.0f |" %
       (n, build_s, n / build_s),
       "| online indexer, from the first put until no row is past the mark | %d | %.0f | %.0f |" %
       (tail, index_s, tail / index_s),
       "| of which graph inserts (counter: the insert time of both indexers added up; %d graph "
       "snapshots took %d s more) | %d | %.0f | %.0f |" %
       (snaps, snap_s, irows, ins_ms / 1e3, irows / max(ins_ms / 1e3, 1e-9)), "",
       "| path | queries/s | recall@10 | served by the graph (counter) |", "|---|---:|---:|---:|",
       "| graph (HNSW candidates, the tail indexed) | %.1f | %.4f | %d of %d (%d sent on to the exact path) |" %
       (g["qps"], g["recall"], gc[2] - gc[0], meas, gc[3] - gc[1]),
       "| exact (distributed scan) | %.1f | %.4f | %d of %d |" %
       (x["qps"], x["recall"], xc[2] - xc[0], meas), "",
       "Graph path / exact path: **%.2fx** queries per second (target of issue 13: >= 5x at "
       "recall@10 >= 0.95, with the tail indexed online)." % (g["qps"] / x["qps"])]
block = "\n".join(out)
sys.path.insert(0, os.path.join(os.path.dirname(md), "..", "bench"))
from mdblock import put_block
put_block(md, "graph", block)
print(block)
EOF
