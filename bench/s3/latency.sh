#!/bin/bash
# bench/s3/latency.sh: the latency of one QueryVectors at a time on an idle cluster, graph
# path against exact path on the same index of one cluster in one run. N vectors of 128
# dims (`dmann gen --kind sift`); an HNSW image of them (M=16, efConstruction=100) is
# bulk-imported with `dmann load --bucket --name` on a local cluster of 2 MN + 2 CN (R=2,
# tcp, loopback, every process on this machine). Queries through libdmann's dmann_query
# (graph_bench lat): WARM queries to warm up, then MEAS other queries measured one at a time
# (one in flight: p50, p99 and queries/s), then the same MEAS queries from CONC threads (a
# handle each, one query in flight per thread). Then the compute nodes are restarted with
# [s3] graph_min_rows past the index (DMANN_S3_GRAPH_MIN_ROWS), so the planner takes the
# exact path (the distributed scan), warmed and measured on the same queries. The graph
# counters of the CNs are read around each run. Before the queries, the CPU time the idle
# nodes use over IDLE seconds (utime + stime of each process). Prints a markdown table
# (nothing written).
#
# Env: N (30000), WARM (200), MEAS (500), CONC (8), IDLE (10), EF (graph_ef, default of
# the cluster file), BUILD (build), COMMIT (the commit BUILD was built from, if not this tree's HEAD:
# e.g. an older build's binaries copied aside), WORK (/dev/shm/dmann-latency or
# ~/.cache/dmann-bench/latency).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
N=${N:-30000}
WARM=${WARM:-200}
MEAS=${MEAS:-500}
CONC=${CONC:-8}
IDLE=${IDLE:-10}
EF=${EF:-}
. "$ROOT/bench/s3/lib.sh"
bench_init latency

log "data: $N x 128, $((WARM + MEAS)) queries"
"$DMANN" gen --kind sift --n "$N" --nq $((WARM + MEAS)) --seed 7 --out "$WORK/d" >/dev/null
$PY - "$WORK" "$WARM" <<'EOF'
import struct, sys
w, warm = sys.argv[1], int(sys.argv[2])
def cut(src, dst, lo, hi, esize=4):
    with open(src, "rb") as f:
        rows, dim = struct.unpack("<II", f.read(8))
        f.seek(8 + lo * dim * esize)
        body = f.read((hi - lo) * dim * esize)
    with open(dst, "wb") as f:
        f.write(struct.pack("<II", hi - lo, dim)); f.write(body)
    return rows
q = cut(w + "/d/query.fbin", w + "/warm.fbin", 0, warm)
cut(w + "/d/query.fbin", w + "/meas.fbin", warm, q)
cut(w + "/d/gt.ibin", w + "/meas_gt.ibin", warm, q)
EOF
log "offline build of $N rows (2 threads)"
"$DMANN" build --base "$WORK/d/base.fbin" --metric l2 --M 16 --efc 100 --threads 2 \
	--out "$WORK/idx.hnsw" >/dev/null
REC=$(( $(stat -c %s "$WORK/idx.hnsw") / 1048576 ))
REGION=$(( REC * 2 + 512 ))
SET=()
[ -n "$EF" ] && SET=(--s3-set graph_ef=$EF)
"$DMANN" local up --mn 2 --cn 2 --dir "$CDIR" --redundancy 2 --region-mb $REGION \
	"${SET[@]}" >/dev/null
INI=$CDIR/cluster.ini
log "bulk import into bench-bkt/bench-idx"
"$DMANN" load --config "$INI" --index "$WORK/idx.hnsw" --bucket bench-bkt --name bench-idx \
	>"$WORK/load.txt"
bench_ports
sleep 2
log "idle: CPU time of every node over $IDLE s"
cpu_ticks() {   # utime + stime of every node process of the cluster, "name ticks" lines
	local pid name rest
	while read -r pid name rest; do
		[ -r "/proc/$pid/stat" ] && [ "$name" != "${name#[mc]n}" ] &&
			echo "$name $(awk '{print $14 + $15}' "/proc/$pid/stat")"
	done <"$CDIR/pids"
}
cpu_ticks >"$WORK/idle0"
sleep "$IDLE"
cpu_ticks >"$WORK/idle1"

run() {   # label: warm-up, one at a time, then CONC at a time; graph counters around both
	local c0 c1
	"$GB" lat --config "$INI" --bucket bench-bkt --name bench-idx --query "$WORK/warm.fbin" \
		--gt "$WORK/d/gt.ibin" --label warm >/dev/null
	c0=$(msum dmann_cn_s3_graph_queries_total)
	"$GB" lat --config "$INI" --bucket bench-bkt --name bench-idx --query "$WORK/meas.fbin" \
		--gt "$WORK/meas_gt.ibin" --label "$1" >"$WORK/$1-1.json"
	"$GB" lat --config "$INI" --bucket bench-bkt --name bench-idx --query "$WORK/meas.fbin" \
		--gt "$WORK/meas_gt.ibin" --label "$1" --conc "$CONC" >"$WORK/$1-c.json"
	c1=$(msum dmann_cn_s3_graph_queries_total)
	echo $((c1 - c0)) >"$WORK/$1.ctr"
}
log "graph path: $WARM warm-up + $MEAS measured queries, 1 then $CONC in flight"
run graph
log "exact path: compute nodes restarted with graph_min_rows past the index"
for cn in cn0 cn1; do
	"$DMANN" local stop --dir "$CDIR" $cn >/dev/null
	DMANN_S3_GRAPH_MIN_ROWS=1099511627776 "$DMANN" local start --dir "$CDIR" $cn >/dev/null
done
sleep 3
run exact
ELAPSED=$(( $(date +%s) - START ))

COMMIT=${COMMIT:-} $PY - "$WORK" "$N" "$WARM" "$MEAS" "$CONC" "$ELAPSED" "$IDLE" \
	"$(getconf CLK_TCK)" <<'EOF'
import json, os, re, subprocess, sys
w = sys.argv[1]
n, warm, meas, conc, elapsed, idle, hz = map(int, sys.argv[2:9])
isa = open("/proc/cpuinfo").read()
isa = " ".join(f for f in ("avx512f", "avx2") if re.search(r"\b%s\b" % f, isa))
commit = os.environ.get("COMMIT") or subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = not os.environ.get("COMMIT") and subprocess.run(
    ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
    text=True).stdout.strip()
out = ["## QueryVectors latency, one query at a time, on an idle cluster", "",
       "Generated by `bench/s3/latency.sh`: %d x 128 generated vectors (`dmann gen --kind "
       "sift`, l2), an HNSW image of them (M=16, efConstruction=100) bulk-imported with "
       "`dmann load --bucket --name` on a local cluster of 2 memory + 2 compute nodes (R=2, "
       "tcp, loopback, one 2-core machine for every process). Queries through libdmann's "
       "`dmann_query`, %d warm-up queries, then %d other queries measured: one in flight, "
       "then %d threads with a handle each and one query in flight per thread. The exact "
       "path is the same index after a restart of the compute nodes with `[s3] "
       "graph_min_rows` past it. Machine: %s, %d CPUs; commit %s%s; %d s." %
       (n, warm, meas, conc, isa, len(re.findall(r"^processor", open("/proc/cpuinfo").read(), re.M)),
        commit, " (with local changes)" if dirty else "", elapsed), "",
       "| path | in flight | p50 ms | p99 ms | mean ms | queries/s | recall@10 | served by the graph (counter) |",
       "|---|---:|---:|---:|---:|---:|---:|---:|"]
for p in ("graph", "exact"):
    ctr = int(open(w + "/" + p + ".ctr").read())
    for s in ("1", "c"):
        r = json.load(open(w + "/%s-%s.json" % (p, s)))
        out.append("| %s | %d | %.2f | %.2f | %.2f | %.1f | %.4f | %s |" %
                   (p, r["conc"], r["p50_ms"], r["p99_ms"], r["mean_ms"], r["qps"], r["recall"],
                    "%d of %d" % (ctr, 2 * meas) if s == "1" else "(both rows)"))
t0 = dict(l.split() for l in open(w + "/idle0"))
t1 = dict(l.split() for l in open(w + "/idle1"))
use = {k: (int(t1[k]) - int(t0[k])) / hz / idle * 100 for k in sorted(t0) if k in t1}
out += ["", "Idle cluster before the queries, CPU of each node over %d s: %s (%% of one core)." %
        (idle, ", ".join("%s %.1f%%" % (k, v) for k, v in use.items()))]
print("\n".join(out))
EOF
