#!/bin/bash
# bench/s3/run.sh: S3 Vectors QueryVectors latency on a local cluster (2 MN + 2 CN) for
# N x 384 cosine vectors (dmann gen --kind cos384) with W = 1 and W = 2 scan members per
# query, and in the same run the exact-scan rate of one core next to a STREAM-style read of
# one core. Writes the table between <!-- BEGIN s3 --> / <!-- END s3 --> in
# docs/benchmarks.md.
# Usage: bench/s3/run.sh [build-dir] [n] [queries]   (default: build, 50000, 1000)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-${DMANN_BUILD_ROOT:-$root/build}}
n=${2:-50000}
nq=${3:-1000}
dmann=$build/cn/dmann
bench=$build/bench/s3_bench
for b in "$dmann" "$bench" "$build/cn/dmann-cn" "$build/mn/dmann-mn"; do
	[ -x "$b" ] || { echo "s3/run.sh: $b not built" >&2; exit 1; }
done
# Memory nodes fdatasync every write: on a shared disk the load would measure the disk.
# The cluster lives in /dev/shm when there is one (the queries never touch the disk).
tmpdir=/tmp
[ -d /dev/shm ] && [ -w /dev/shm ] && tmpdir=/dev/shm
work=$(mktemp -d "$tmpdir/dmann-s3bench-XXXXXX")
cdir=$work/cluster
restarted=()
cleanup() {
	for p in "${restarted[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${restarted[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
	"$dmann" local down --dir "$cdir" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

echo "s3/run.sh: generating $n x 384 cosine vectors, $nq queries" >&2
"$dmann" gen --kind cos384 --n "$n" --nq "$nq" --seed 1 --out "$work/data" >/dev/null
base=$work/data/base.fbin
query=$work/data/query.fbin

# One core, same run: the members' scan loop vs a plain read of the same bytes.
scan=$("$bench" scan --base "$base" --query "$query" --nq 50)

# graph_auto=0: this bench measures the exact path (no graph for the API-created index)
DMANN_S3_WIDTH=1 DMANN_S3_GROUPS=2 "$dmann" local up --mn 2 --cn 2 --dir "$cdir" \
	--s3-set graph_auto=0 >/dev/null
ep=$(awk '/^\[cn.0\]/{c=1} c && /^http =/{print $3; exit}' "$cdir/cluster.ini")
auth=(--endpoint "$ep" --ak DMANNLOCALTEST --sk-file "$cdir/s3.secret")
t0=$(date +%s.%N)
"$bench" load "${auth[@]}" --base "$base"
load_s=$(echo "$(date +%s.%N) - $t0" | bc)
w1=$("$bench" query "${auth[@]}" --query "$query" --nq "$nq" --label "W=1")

# Same data (on the memory nodes), compute nodes restarted with the environment given.
# The compute nodes' current pids: those `dmann local up` started, then the restarted ones.
cnpid=("$(awk '$2 == "cn0" {print $1}' "$cdir/pids")" "$(awk '$2 == "cn1" {print $1}' "$cdir/pids")")
restart_cns() {
	for id in 0 1; do
		kill "${cnpid[$id]}"
		while kill -0 "${cnpid[$id]}" 2>/dev/null; do sleep 0.1; done
		env "$@" setsid "$build/cn/dmann-cn" --config "$cdir/cluster.ini" --id "$id" \
			>>"$cdir/cn$id.log" 2>&1 &
		cnpid[$id]=$!
		restarted[$id]=$!
	done
	port=${ep##*:}
	for i in $(seq 100); do
		(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
		sleep 0.1
	done
	sleep 0.5
}
# W = 2: sub-requests on kept-alive connections ([s3] member_conns, default 8), then the
# same with member_conns = 0 (a new connection per sub-request, as before 2026-12-04).
restart_cns DMANN_S3_WIDTH=2
w2=$("$bench" query "${auth[@]}" --query "$query" --nq "$nq" --label "W=2")
restart_cns DMANN_S3_WIDTH=2 DMANN_S3_MEMBER_CONNS=0
w2c=$("$bench" query "${auth[@]}" --query "$query" --nq "$nq" --label "W=2 (member_conns=0)")
isa=$(grep -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')

field() { echo "$1" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"; }
out=$work/table.md
{
	echo "### S3 Vectors QueryVectors (bench/s3/run.sh)"
	echo
	echo "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores (shared machine: figures are noisy)," \
	     "load average $(cut -d' ' -f1-3 /proc/loadavg). $n x 384 cosine vectors" \
	     "(\`dmann gen --kind cos384 --seed 1\`), 4096-row fragments, on a local cluster of" \
	     "2 memory + 2 compute nodes (tcp transport, loopback; data dirs in $tmpdir)," \
	     "loaded through PutVectors" \
	     "(500 per call) in ${load_s%.*} s. $nq queries, topK 10, one at a time over one" \
	     "keep-alive connection to cn0 (SigV4-signed), after 50 warm-up queries (the members'" \
	     "fragment caches are warm). W = scan members per query (\`DMANN_S3_WIDTH\`): W = 1" \
	     "scans on the ingress CN; W = 2 splits the fragments between both CNs (one" \
	     "sub-request over HTTP) and merges the partial top-k lists. For W = 1 the" \
	     "number of groups is pinned to 2 (\`DMANN_S3_GROUPS=2\`: every CN is a group and the" \
	     "ingress scans by itself); left to the rate rule a rarely queried index has one group." \
	     "W = 2 runs twice: with the sub-requests on kept-alive connections (\`[s3]" \
	     "member_conns\`, default 8) and with \`member_conns = 0\` (a new connection per" \
	     "sub-request, the member closing it). Machine: ${isa:-no AVX2}."
	echo
	echo "| W | p50 | p99 | QPS (1 client) |"
	echo "|---|---|---|---|"
	for r in "$w1" "$w2" "$w2c"; do
		echo "| $(field "$r" label | sed 's/W=//') | $(field "$r" p50_us) µs | $(field "$r" p99_us) µs | $(field "$r" qps) |"
	done
	echo
	echo "W = 2 QPS with kept-alive sub-request connections / with a new connection per" \
	     "sub-request: $(printf "%.2f" "$(echo "scale=4; $(field "$w2" qps) / $(field "$w2c" qps)" | bc)")x."
	echo
	echo "Scan rate of one core, measured in the same run on the same $n x 384 floats" \
	     "($(field "$scan" kernel) kernels): the members' exact cosine scan (dot product," \
	     "stored norms, top-10 heap) against a STREAM-style read of the same array" \
	     "at the same SIMD width (each 4096-float block dotted with itself: one read of" \
	     "every byte, best of 5). The scan is the whole per-query work of a member; the" \
	     "latencies above add the HTTP request, SigV4, JSON, the index-state RPC to the" \
	     "memory node and, for W = 2, the sub-request to the other CN; with 2 cores shared" \
	     "by 4 node processes (and whatever else runs), W = 2 cannot scan on two idle" \
	     "cores."
	echo
	echo "| exact scan, 1 core | STREAM-style read, 1 core | scan / read | per query (1 core) |"
	echo "|---|---|---|---|"
	s=$(field "$scan" scan_gbps_per_core)
	r=$(field "$scan" stream_read_gbps_per_core)
	echo "| $s GB/s | $r GB/s | $(printf "%.2f" "$(echo "scale=4; $s / $r" | bc)") | $(field "$scan" scan_ms_per_query) ms |"
} > "$out"
cat "$out"

doc=$root/docs/benchmarks.md
python3 "$root/bench/mdblock.py" "$doc" s3 < "$out"
echo "s3/run.sh: updated $doc" >&2
