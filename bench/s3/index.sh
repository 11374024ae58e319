#!/bin/bash
# bench/s3/index.sh: the online indexing rate of the S3 path (issue 13, point 3) next to the
# local build rate of the same data. N + TAIL vectors of 128 dims (`dmann gen --kind sift`);
# an HNSW image of the first N (M=16, efConstruction=100) is bulk-imported with `dmann load
# --bucket --name` on a local cluster of 2 MN + 2 CN (R=2, tcp, loopback, every process on
# this machine), then the other TAIL rows are put through libdmann and the online indexers
# of both compute nodes move them into the graph; the script waits until the compute nodes
# report no row past the mark. Then MEAS queries through libdmann (graph path) give recall@10
# against the exact top-10 over all N + TAIL rows. The local build rates are `dmann build`
# of all N + TAIL rows with 1 and 2 threads on this machine. Writes the table between
# <!-- BEGIN index --> markers of docs/benchmarks.md.
#
# Env: N (50000), TAIL (50000), MEAS (1000), IXBATCH ([s3] index_batch, 2000), IXTHREADS
# ([s3] index_threads, 4), BUILD (build), WORK (/dev/shm/dmann-index or
# ~/.cache/dmann-bench/index).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
N=${N:-50000}
TAIL=${TAIL:-50000}
MEAS=${MEAS:-1000}
IXBATCH=${IXBATCH:-2000}
IXTHREADS=${IXTHREADS:-4}
SPARE=$((TAIL + TAIL / 5))
. "$ROOT/bench/s3/lib.sh"
bench_init index
secs() { echo "$(date +%s.%N) - $1" | bc; }

log "data: $((N + TAIL)) x 128, $MEAS queries"
"$DMANN" gen --kind sift --n $((N + TAIL)) --nq "$MEAS" --seed 5 --out "$WORK/d" >/dev/null
$PY - "$WORK" "$N" <<'EOF'
import struct, sys
w, n = sys.argv[1], int(sys.argv[2])
with open(w + "/d/base.fbin", "rb") as f:
    rows, dim = struct.unpack("<II", f.read(8))
    body = f.read(n * dim * 4)
with open(w + "/import.fbin", "wb") as f:
    f.write(struct.pack("<II", n, dim)); f.write(body)
EOF
log "local builds of all $((N + TAIL)) rows (1 and 2 threads)"
T0=$(date +%s.%N)
"$DMANN" build --base "$WORK/d/base.fbin" --metric l2 --M 16 --efc 100 --threads 1 \
	--out "$WORK/all1.hnsw" >/dev/null
B1_S=$(secs "$T0")
T0=$(date +%s.%N)
"$DMANN" build --base "$WORK/d/base.fbin" --metric l2 --M 16 --efc 100 --threads 2 \
	--out "$WORK/all2.hnsw" >/dev/null
B2_S=$(secs "$T0")
rm -f "$WORK/all1.hnsw" "$WORK/all2.hnsw"
log "offline build of the first $N rows (the image to import)"
"$DMANN" build --base "$WORK/import.fbin" --metric l2 --M 16 --efc 100 --threads 2 \
	--out "$WORK/idx.hnsw" >/dev/null
REC=$(( $(stat -c %s "$WORK/idx.hnsw") / 1048576 ))
REGION=$(( REC * 2 * (N + SPARE) / N + 512 ))
"$DMANN" local up --mn 2 --cn 2 --dir "$CDIR" --redundancy 2 --region-mb $REGION \
	--s3-set index_batch=$IXBATCH --s3-set index_threads=$IXTHREADS >/dev/null
INI=$CDIR/cluster.ini
"$DMANN" load --config "$INI" --index "$WORK/idx.hnsw" --bucket bench-bkt --name bench-idx \
	--vectors "$WORK/import.fbin" --spare $SPARE >"$WORK/load.txt"
rm -f "$WORK/import.fbin"
bench_ports
log "tail: $TAIL rows put through libdmann, indexed online by both compute nodes"
T0=$(date +%s.%N)
"$GB" put --config "$INI" --bucket bench-bkt --name bench-idx --base "$WORK/d/base.fbin" \
	--from "$N" --to $((N + TAIL)) >"$WORK/put.json"
while :; do
	rows=$(msum dmann_cn_s3_indexed_rows_total)
	lag=$(msum dmann_cn_s3_index_lag_rows)
	[ "$rows" -ge "$TAIL" ] && [ "$lag" -eq 0 ] && break
	if [ $(( $(date +%s) - START )) -gt 3600 ]; then
		echo "index.sh: indexing not done: $rows rows indexed, $lag past the mark" >&2
		exit 1
	fi
	sleep 0.5
done
INDEX_S=$(secs "$T0")
{
	echo "rows $(mget dmann_cn_s3_indexed_rows_total)"
	echo "ins_ms $(mget dmann_cn_s3_index_insert_milliseconds_total)"
	echo "snaps $(mget dmann_cn_s3_index_snapshots_total)"
	echo "snap_s $(mget dmann_cn_s3_index_snapshot_seconds_total)"
	echo "batches $(mget dmann_cn_s3_index_batches_total)"
	echo "inserts $(mget dmann_cn_inserts_total)"
	echo "rounds $(mget dmann_cn_insert_round_trips_total)"
	echo "links $(mget dmann_cn_insert_links_total)"
	echo "kept $(mget dmann_cn_insert_links_kept_total)"
	echo "retries $(mget dmann_cn_insert_lock_retries_total)"
} >"$WORK/index.txt"
log "recall: $MEAS queries on the graph path"
q0=$(msum dmann_cn_s3_graph_queries_total)
"$GB" query --config "$INI" --bucket bench-bkt --name bench-idx --query "$WORK/d/query.fbin" \
	--gt "$WORK/d/gt.ibin" --label graph >"$WORK/graph.json"
q1=$(msum dmann_cn_s3_graph_queries_total)
tr=$(msum dmann_cn_s3_graph_tail_rows_total)
ELAPSED=$(( $(date +%s) - START ))

$PY - "$WORK" "$ROOT/docs/benchmarks.md" "$N" "$TAIL" "$MEAS" "$B1_S" "$B2_S" "$INDEX_S" \
	"$IXBATCH" "$IXTHREADS" "$((q1 - q0))" "$ELAPSED" <<'EOF'
import json, os, re, subprocess, sys
w, md = sys.argv[1], sys.argv[2]
n, tail, meas = map(int, sys.argv[3:6])
b1, b2, index_s = map(float, sys.argv[6:9])
ixbatch, ixthreads, gq, elapsed = map(int, sys.argv[9:13])
c = {}
for line in open(w + "/index.txt"):
    k, *v = line.split()
    c[k] = [float(x) for x in v]
put = json.load(open(w + "/put.json"))
g = json.load(open(w + "/graph.json"))
isa = open("/proc/cpuinfo").read()
isa = " ".join(f for f in ("avx512f", "avx2") if re.search(r"\b%s\b" % f, isa))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
tot = n + tail
rows = sum(c["rows"])
online = tail / index_s
out = ["## Online indexing of an S3 index at 128 dims (issue 13)", "",
       "Generated by `bench/s3/index.sh` (do not edit by hand): %d x 128 generated vectors "
       "(`dmann gen --kind sift`, l2), HNSW M=16, efConstruction=100. An image of the first "
       "%d bulk-imported with `dmann load --bucket --name` on a local cluster of 2 memory + 2 "
       "compute nodes (R=2, tcp, loopback, one 2-core machine for every process); the other "
       "%d put through libdmann in %.0f s while the online indexers of both compute nodes "
       "(`[s3] index_threads = %d`, `index_ef = 100`, `index_batch = %d`) moved them into the "
       "graph. Machine: %s; commit %s; %d s." %
       (tot, n, tail, put["s"], ixthreads, ixbatch, isa, commit, elapsed), "",
       "| what | rows | seconds | rows/s |", "|---|---:|---:|---:|",
       "| online indexing, 2 CNs, from the first put until no row is past the mark | %d | %.1f | **%.0f** |" %
       (tail, index_s, online)]
for i, r in enumerate(c["rows"]):
    ins = c["ins_ms"][i] / 1e3
    out.append("| of which cn%d's indexer: graph inserts (counter; %d batches, %d snapshots "
               "took %.0f s more) | %d | %.1f | %.0f |" %
               (i, c["batches"][i], c["snaps"][i], c["snap_s"][i], r, ins, r / max(ins, 1e-9)))
out += ["| local build of all %d rows (`dmann build`), 1 thread | %d | %.1f | %.0f |" %
        (tot, tot, b1, tot / b1),
        "| local build of all %d rows, 2 threads | %d | %.1f | %.0f |" % (tot, tot, b2, tot / b2),
        "",
        "After indexing: recall@10 of %d QueryVectors through libdmann against the exact top-10 "
        "over all %d rows **%.4f** (%d of them served by the graph path; %.1f queries/s)." %
        (meas, tot, g["recall"], gq, g["qps"]), "",
        "Per insert (both indexers' counters): %.1f round trips to the memory nodes, %.1f "
        "back-links, %.2f pushed-out neighbours linked from the new node, %.2f lock retries." %
        tuple(sum(c[k]) / max(sum(c["inserts"]), 1) for k in ("rounds", "links", "kept", "retries")),
        "",
        "Online rate / 2-thread local build rate: %.3f (target of issue 13: >= 300 rows/s "
        "online with 2 CNs)." % (online / (tot / b2))]
block = "\n".join(out)
sys.path.insert(0, os.path.join(os.path.dirname(md), "..", "bench"))
from mdblock import put_block
put_block(md, "index", block)
print(block)
EOF
