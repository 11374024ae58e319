#!/bin/sh
# bench/xport.sh: run the transport micro-benchmark (bench/xport_bench.c) and write its table
# between the <!-- BEGIN xport --> / <!-- END xport --> markers of docs/benchmarks.md.
# Usage: bench/xport.sh [build-dir] [seconds-per-measurement]   (default: build, 1.5)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${DMANN_BUILD_ROOT:-$root/build}}
secs=${2:-1.5}
bin=$build/bench/xport_bench
[ -x "$bin" ] || { echo "xport.sh: $bin not built (ninja -C $build bench/xport_bench)" >&2; exit 1; }

out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
	echo "### Transport (bench/xport.sh)"
	echo
	echo "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r), load average" \
	     "$(cut -d' ' -f1-3 /proc/loadavg) (shared machine: figures are noisy)," \
	     "host ${DMANN_TEST_HOST:-127.0.0.1}," \
	     "${secs} s per measurement. dmann READs: one batch of 4 KiB READs in flight" \
	     "(posted together, last one signaled); plain socket: the same requests written with" \
	     "one send() to a minimal server that answers them with one writev()." \
	     "SEND: 32-byte messages, at most 256 unacknowledged; plain socket: length-prefixed" \
	     "messages, one send() each, the server acknowledges a cumulative count per recv()." \
	     "Ratio = dmann / plain (throughput; above 1 is faster)."
	echo
	"$bin" --secs "$secs" ${DMANN_TEST_HOST:+--host "$DMANN_TEST_HOST"}
} > "$out"
cat "$out"

doc=$root/docs/benchmarks.md
python3 "$root/bench/mdblock.py" "$doc" xport < "$out"
echo "xport.sh: updated $doc" >&2
