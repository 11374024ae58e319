#!/bin/bash
# bench/flat/run.sh: WAL writes/s of the flat store (flat_put, the memory node's PutVectors
# path, each write durable when it returns) with 1, 4, 16 and 64 concurrent writers, group
# commit off (one fdatasync per write: the behaviour before group commit) and on, in the
# same run and directory. The store lives under the build directory, i.e. on the disk the
# tree is on (not /tmp or /dev/shm: fdatasync on tmpfs measures nothing). Writes the table
# between <!-- BEGIN wal --> / <!-- END wal --> in docs/benchmarks.md.
# Usage: bench/flat/run.sh [build-dir] [seconds] [repeats]   (default: build, 3, 3)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-${DMANN_BUILD_ROOT:-$root/build}}
secs=${2:-3}
reps=${3:-3}
bench=$build/bench/wal_bench
[ -x "$bench" ] || { echo "flat/run.sh: $bench not built" >&2; exit 1; }
work=$(mktemp -d "$build/wal-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT
out=$work/table.md
fs=$(df --output=fstype "$work" | tail -1)
dev=$(df --output=source "$work" | tail -1)
{
	echo "### Flat store WAL: group commit (bench/flat/run.sh)"
	echo
	echo "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r), load average" \
	     "$(cut -d' ' -f1-3 /proc/loadavg) (shared machine: figures are noisy), store on" \
	     "$fs ($dev). Writers call flat_put on one index, each call 8 vectors of dimension 384" \
	     "with 200 B of metadata (~13 KB record), durable when it returns; $secs s per" \
	     "measurement, $reps repeats with off and on alternating which goes first; medians" \
	     "(the ratio is the median of the per-repeat ratios). fdatasyncs/write from the store's" \
	     "counters (flat_wal_stats)."
	echo
	"$bench" --dir "$work/store" --seconds "$secs" --repeat "$reps" --writers 1,4,16,64 |
		grep -v '^<!--'
} > "$out"
cat "$out"

doc=$root/docs/benchmarks.md
python3 "$root/bench/mdblock.py" "$doc" wal --heading '## Flat store WAL writes' < "$out"
echo "flat/run.sh: updated $doc" >&2
