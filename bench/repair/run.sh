#!/bin/bash
# bench/repair/run.sh: re-replication of a memory node lost for good (issue 14, point 2).
# N x 128 generated vectors (`dmann gen --kind sift`, default 700,000: an index image of
# about 1.1 GB with neighbour codes), HNSW M=16 efConstruction=100, loaded on a local cluster
# of 3 memory + 2 compute nodes (R=2, tcp, loopback, the cluster file's defaults:
# member_lease_s 5, replace_after_s 30). A query stream (`dmann bench`, every query of the
# stream a different one of the 1,000 queries in turn, cache off) runs while memory node 1 is
# SIGKILLed for good; the script notes when the up-set declares it down and when the
# placement that retires it is published (every block copied from its surviving replica to
# the next node, read back and compared). Afterwards memory node 2 is SIGKILLed too and
# 20,000 more queries run: they succeed only if every block has its copies again (each
# block was on 2 of the 3 nodes). The memory nodes also hold S3 data: BUCKETS buckets of
# S3_ROWS x 128 rows each (put through libdmann with `dmann put`; `[s3] graph_min_rows` above
# their size, so they stay on the exact path and the bench times the bucket copies alone).
# Buckets are whole on 2 of the 3 nodes: those on mn1 go to the next node once it is
# retired, marked stale and filled by the controller's catch-up; the script notes when no
# stale replica is left, and after mn2's kill reads back S3_CHECK rows of every bucket
# (vector equal to the one put) and queries them with their own vectors (found first).
# Writes the table between <!-- BEGIN repair --> markers of docs/benchmarks.md.
#
# Env: N (700000), STREAM (queries of the stream, 150000), KILL_AFTER (s, 20), BUCKETS (4),
# S3_ROWS (30000), S3_CHECK (500), BUILD (build), WORK (~/.cache/dmann-bench).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
N=${N:-700000}
STREAM=${STREAM:-150000}
KILL_AFTER=${KILL_AFTER:-20}
BUCKETS=${BUCKETS:-4}
S3_ROWS=${S3_ROWS:-30000}
S3_CHECK=${S3_CHECK:-500}
DMANN=$ROOT/$BUILD/cn/dmann
WORK=${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/dmann-bench}/repair
PY=/usr/bin/python3
export DMANN_NO_PROGRESS=1

[ -x "$DMANN" ] || { echo "run.sh: build first: meson setup $BUILD && ninja -C $BUILD" >&2; exit 1; }
$PY -c 'import json' || exit 1
mkdir -p "$WORK"
START=$(date +%s)
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
now() { date +%s.%N; }

if [ ! -s "$WORK/idx-$N.hnsw" ]; then
	log "data: $N x 128; build (2 threads)"
	"$DMANN" gen --kind sift --n "$N" --nq 1000 --seed 11 --out "$WORK/d" >/dev/null
	"$DMANN" build --base "$WORK/d/base.fbin" --metric l2 --M 16 --efc 100 --threads 2 \
		--out "$WORK/idx-$N.hnsw.tmp" >/dev/null
	mv "$WORK/idx-$N.hnsw.tmp" "$WORK/idx-$N.hnsw"
fi
for b in $(seq 0 $((BUCKETS - 1))); do
	[ -s "$WORK/s3-$S3_ROWS-$b/base.fbin" ] ||
		"$DMANN" gen --kind sift --n "$S3_ROWS" --nq 1 --seed $((100 + b)) --out "$WORK/s3-$S3_ROWS-$b" >/dev/null
done
IDX_BYTES=$(stat -c %s "$WORK/idx-$N.hnsw")
S3_BYTES=$(( BUCKETS * S3_ROWS * 128 * 4 ))
# Each memory node holds 2/3 of 2 copies, then half of them once one is retired.
REGION=$(( IDX_BYTES * 11 / 10 / 1048576 + 256 ))

log "cluster: 3 MN + 2 CN, R=2, regions of $REGION MiB; load"
rm -rf "$WORK/lc"
trap '"$DMANN" local down --dir "$WORK/lc" >/dev/null 2>&1 || true' EXIT
"$DMANN" local up --mn 3 --cn 2 --redundancy 2 --dir "$WORK/lc" --region-mb "$REGION" \
	--s3-set graph_min_rows=$((S3_ROWS * 10)) >/dev/null
CFG=$WORK/lc/cluster.ini
"$DMANN" load --config "$CFG" --index "$WORK/idx-$N.hnsw" >/dev/null
T_PUT=$(now)
for b in $(seq 0 $((BUCKETS - 1))); do
	"$DMANN" put --config "$CFG" --bucket "rb$b" --name idx --create euclidean \
		--vectors "$WORK/s3-$S3_ROWS-$b/base.fbin" >/dev/null
done
PUT_S=$($PY -c "print('%.1f' % ($(now) - $T_PUT))")
log "$BUCKETS buckets of $S3_ROWS rows put in $PUT_S s"
sleep 3   # the compute nodes pick the index up within refresh_ms

log "stream of $STREAM queries; mn1 SIGKILLed after $KILL_AFTER s"
"$DMANN" bench --config "$CFG" --query "$WORK/d/query.fbin" --gt "$WORK/d/gt.ibin" --k 10 \
	--ef 64 --cache-ratio 0 --nq "$STREAM" --json >"$WORK/stream.json" 2>"$WORK/stream.err" &
BENCH=$!
sleep "$KILL_AFTER"
T_KILL=$(now)
"$DMANN" local kill --dir "$WORK/lc" mn1 >/dev/null
T_DOWN=""
T_REPAIRED=""
while [ -z "$T_REPAIRED" ]; do
	st=$("$DMANN" status --config "$CFG" --json 2>/dev/null || true)
	if [ -z "$T_DOWN" ] && printf '%s' "$st" | $PY -c '
import json, sys; d = json.load(sys.stdin)["etcd"]; sys.exit(0 if "mn1" in d["upset"]["down"] else 1)' 2>/dev/null; then
		T_DOWN=$(now)
		log "mn1 declared down"
	fi
	if printf '%s' "$st" | $PY -c '
import json, sys; d = json.load(sys.stdin)["etcd"]; sys.exit(0 if "mn1" in d.get("placement", {}).get("retired", []) else 1)' 2>/dev/null; then
		T_REPAIRED=$(now)
		log "placement retiring mn1 published"
	fi
	if [ $(( $(date +%s) - ${T_KILL%.*} )) -gt 300 ]; then
		echo "run.sh: mn1 not retired 300 s after the kill" >&2
		exit 1
	fi
	sleep 0.2
done
# The buckets that had a replica on mn1 are marked stale before the placement's publication
# and filled by the catch-up (the gateways' dmann_cn_s3_catchups_total counts them): their
# copies are whole again when no stale replica is left.
STALE_MAX=0
T_BUCKETS=""
while [ -z "$T_BUCKETS" ]; do
	st=$("$DMANN" status --config "$CFG" --json 2>/dev/null || true)
	ns=$(printf '%s' "$st" | $PY -c '
import json, sys; print(len(json.load(sys.stdin)["etcd"]["stale_replicas"]))' 2>/dev/null || echo 99)
	[ "$ns" != 99 ] && [ "$ns" -gt "$STALE_MAX" ] && STALE_MAX=$ns
	if [ "$ns" = 0 ]; then T_BUCKETS=$(now); log "no stale bucket replica left"; fi
	if [ $(( $(date +%s) - ${T_KILL%.*} )) -gt 400 ]; then
		echo "run.sh: bucket replicas still stale 400 s after the kill" >&2
		exit 1
	fi
	sleep 0.2
done
kill -0 $BENCH 2>/dev/null && STILL=yes || STILL=no
wait $BENCH || { echo "run.sh: the stream failed: $(cat "$WORK/stream.err")" >&2; exit 1; }
T_END=$(now)
curl -s "http://$(awk '/^\[cn.0\]/{c=1} c&&/^metrics/{print $3; exit}' "$CFG")/metrics" >"$WORK/cn0.prom"
curl -s "http://$(awk '/^\[cn.1\]/{c=1} c&&/^metrics/{print $3; exit}' "$CFG")/metrics" >"$WORK/cn1.prom"

log "mn2 SIGKILLed too; 20,000 queries"
"$DMANN" local kill --dir "$WORK/lc" mn2 >/dev/null
"$DMANN" bench --config "$CFG" --query "$WORK/d/query.fbin" --gt "$WORK/d/gt.ibin" --k 10 \
	--ef 64 --cache-ratio 0 --nq 20000 --json >"$WORK/after.json"
# Every bucket now has one copy left: read back S3_CHECK rows of each and query them with
# their own vectors.
S3_GOT=0 S3_FOUND=0 S3_ASKED=0
for b in $(seq 0 $((BUCKETS - 1))); do
	$PY "$ROOT/bench/repair/sample.py" pick "$WORK/s3-$S3_ROWS-$b/base.fbin" "$S3_CHECK" \
		"$WORK/check.fbin" "$WORK/check.keys"
	"$DMANN" get --config "$CFG" --bucket "rb$b" --name idx --json \
		--keys "$(paste -sd, "$WORK/check.keys")" >"$WORK/check.get"
	"$DMANN" query --config "$CFG" --bucket "rb$b" --name idx --k 1 --json \
		--vectors "$WORK/check.fbin" >"$WORK/check.query"
	read -r got found asked < <($PY "$ROOT/bench/repair/sample.py" check "$WORK/check.fbin" \
		"$WORK/check.keys" "$WORK/check.get" "$WORK/check.query")
	S3_GOT=$((S3_GOT + got)); S3_FOUND=$((S3_FOUND + found)); S3_ASKED=$((S3_ASKED + asked))
done
log "S3 rows after mn2's kill: $S3_GOT of $S3_ASKED read back exactly, $S3_FOUND found first"
ELAPSED=$(( $(date +%s) - START ))

$PY - "$WORK" "$ROOT/docs/benchmarks.md" "$ELAPSED" "$N" "$STREAM" "$IDX_BYTES" "$T_KILL" \
	"$T_DOWN" "$T_REPAIRED" "$T_END" "$STILL" "$T_BUCKETS" "$BUCKETS" "$S3_ROWS" "$S3_BYTES" \
	"$STALE_MAX" "$S3_GOT" "$S3_FOUND" "$S3_ASKED" "$PUT_S" <<'EOF'
import json, os, re, subprocess, sys
w, md, elapsed, n, stream, idx_bytes = sys.argv[1:7]
t_kill, t_down, t_rep, t_end = (float(x) for x in sys.argv[7:11])
still = sys.argv[11]
t_buckets = float(sys.argv[12])
buckets, s3_rows, s3_bytes, stale_max, s3_got, s3_found, s3_asked = (int(x) for x in sys.argv[13:20])
put_s = float(sys.argv[20])
s = json.loads(open(w + "/stream.json").read().splitlines()[-1])
a = json.loads(open(w + "/after.json").read().splitlines()[-1])
def prom(name):
    v = 0
    for f in ("cn0", "cn1"):
        for line in open("%s/%s.prom" % (w, f)):
            if line.startswith(name + "{"):
                v += float(line.split()[-1])
    return v
copies, cbytes = prom("dmann_cn_repair_copies_total"), prom("dmann_cn_repair_bytes_total")
s3_catchups, s3_cbytes = prom("dmann_cn_s3_catchups_total"), prom("dmann_cn_s3_catchup_bytes_total")
isa = open("/proc/cpuinfo").read()
isa = " ".join(f for f in ("avx512f", "avx2") if re.search(r"\b%s\b" % f, isa))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
copy_s = t_rep - t_down - 30   # replace_after_s after the up-set declared it down
out = ["## Re-replication of a lost memory node (issue 14)", "",
       "Generated by `bench/repair/run.sh` (do not edit by hand): %s x 128 generated vectors, "
       "HNSW M=16 efConstruction=100 with neighbour codes, index image %.2f GB, on a local "
       "cluster of 3 memory + 2 compute nodes (R=2, tcp, loopback, one 2-core machine for every "
       "process; member_lease_s 5, replace_after_s 30, the defaults), next to %d S3 buckets of "
       "%d x 128 rows each (%.2f GB of vectors, put with `dmann put` in %.0f s, exact path), each "
       "whole on 2 of the 3 memory nodes. Memory node 1 SIGKILLed "
       "for good during a stream of %s queries (cache off, ef=64). Machine: %s; commit %s; %s s." %
       (n, int(idx_bytes) / 1e9, buckets, s3_rows, s3_bytes / 1e9, put_s, stream, isa, commit,
        elapsed), "",
       "| what | value |", "|---|---:|",
       "| kill -> declared down in the up-set | %.1f s |" % (t_down - t_kill),
       "| kill -> every block back to 2 copies (placement published) | **%.1f s** (target: 120 s) |" % (t_rep - t_kill),
       "| of which copying (after replace_after_s) | %.1f s |" % copy_s,
       "| blocks copied, bytes | %d, %.2f GB (%.2f GB/s read + write + read back) |" %
       (copies, cbytes / 1e9, cbytes / 1e9 / max(copy_s, 0.1)),
       "| stream: queries, failed, recall@10, QPS | %d, %d, %.4f, %.0f |" %
       (s["queries"], s["errors"], s["recall"], s["qps"]),
       "| stream still running when the placement was published | %s |" % still,
       "| buckets copied to a new replica (catch-ups, bytes; most stale replicas seen at once) | %d of %d, %.3f GB; %d |" %
       (s3_catchups, buckets, s3_cbytes / 1e9, stale_max),
       "| kill -> every bucket back to 2 caught-up copies (no stale replica left) | **%.1f s** |" %
       (t_buckets - t_kill),
       "| then mn2 SIGKILLed too: queries, failed, recall@10 | %d, %d, %.4f |" %
       (a["queries"], a["errors"], a["recall"]),
       "| then: S3 rows read back exactly, found first by their own vector | %d and %d of %d |" %
       (s3_got, s3_found, s3_asked), ""]
block = "\n".join(out)
sys.path.insert(0, os.path.join(os.path.dirname(md), "..", "bench"))
from mdblock import put_block
put_block(md, "repair", block)
print(block)
EOF
