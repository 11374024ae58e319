#!/bin/bash
# bench/hnsw/run.sh: HNSW recall/QPS benchmark of dmann against hnswlib and faiss on
# Fashion-MNIST (60k x 784, 10k queries, l2), all measured in one run on one machine.
#
#   bench/hnsw/run.sh [WORKDIR]        (default WORKDIR: build-bench-hnsw in the source tree)
#
# For each library: build with M=16, efConstruction=200 using 1 and 2 threads (build time
# measured inside each program around the build call only; peak RSS of the process from
# /usr/bin/time), then search the 1-thread index with one thread, one query at a time,
# ef in {10,16,32,64,128,256,512}, recall@10 against exact ground truth. Searches run
# ROUNDS (default 2; faiss FAISS_ROUNDS, default 1) rounds interleaved across libraries, and
# the best round counts (the machine may be shared). Both wall-clock QPS and CPU QPS (queries
# per second of the search thread's CPU time, robust to other load) are recorded.
# Writes the table between <!-- BEGIN hnsw --> and <!-- END hnsw --> in docs/benchmarks.md
# and the plot docs/hnsw-recall-qps.png.
#
# Compilers and flags (the fairness note of the table repeats them):
#   dmann    meson --buildtype=release (-O3; project flag -march=x86-64-v2), distance kernels
#            chosen at run time (AVX-512, else AVX+FMA, else portable)
#   hnswlib  g++ -O3 -march=native (its AVX / AVX-512 kernels are chosen at compile time)
#   faiss    Debian's prebuilt libfaiss (its own flags), driver g++ -O3 -march=native
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${1:-$ROOT/build-bench-hnsw}
M=16
EFC=200
K=10
EFS=10,16,32,64,128,256,512
ROUNDS=${ROUNDS:-2}
FAISS_ROUNDS=${FAISS_ROUNDS:-1}
CXXFLAGS="-O3 -march=native -std=c++17"

mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
RES=$WORK/results
rm -rf "$RES"
mkdir -p "$RES"
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
START=$(date +%s)

log "building dmann (release) in $WORK/build"
if [ ! -f "$WORK/build/build.ninja" ]; then
	meson setup "$WORK/build" "$ROOT" --buildtype=release >"$WORK/meson-setup.log"
fi
ninja -C "$WORK/build" cn/dmann >"$WORK/ninja.log"
DMANN=$WORK/build/cn/dmann

log "compiling the hnswlib and faiss drivers ($CXXFLAGS)"
g++ $CXXFLAGS -I"$ROOT/bench/hnsw" "$ROOT/bench/hnsw/hnswlib_driver.cpp" -o "$WORK/hnswlib_driver" -pthread
g++ $CXXFLAGS -fopenmp -I"$ROOT/bench/hnsw" "$ROOT/bench/hnsw/faiss_driver.cpp" -o "$WORK/faiss_driver" \
	-lfaiss -lopenblas -llapack

DATA=$WORK/fmnist
if [ ! -s "$DATA/gt.ibin" ]; then
	log "converting Fashion-MNIST + exact ground truth"
	DMANN_NO_PROGRESS=1 "$DMANN" fmnist --out "$DATA" >&2
fi

# timed LIB PHASE CMD...: run CMD under /usr/bin/time, JSON stdout to RES/LIB.PHASE.json,
# peak RSS (KiB), wall, user and system seconds to RES/LIB.PHASE.time
timed() {
	local lib=$1 phase=$2
	shift 2
	/usr/bin/time -f '%M %e %U %S' -o "$RES/$lib.$phase.time" "$@" >"$RES/$lib.$phase.json"
}

for T in 1 2; do
	log "build, $T thread(s): dmann"
	timed dmann build$T env DMANN_NO_PROGRESS=1 "$DMANN" build --base "$DATA/base.fbin" --metric l2 \
		--M $M --efc $EFC --threads $T --out "$WORK/dmann.$T.idx" --json
	log "build, $T thread(s): hnswlib"
	timed hnswlib build$T "$WORK/hnswlib_driver" build "$DATA/base.fbin" $M $EFC $T "$WORK/hnswlib.$T.idx"
	log "build, $T thread(s): faiss"
	timed faiss build$T env OMP_NUM_THREADS=$T "$WORK/faiss_driver" build "$DATA/base.fbin" $M $EFC $T \
		"$WORK/faiss.$T.idx"
done

# Searches: every (round, ef) runs the three libraries back to back, one process each, so that
# load from other users of the machine hits them alike; the best round counts. faiss is
# slow at high ef, so it gets fewer rounds.
for round in $(seq 1 $ROUNDS); do
	for ef in ${EFS//,/ }; do
		log "search round $round/$ROUNDS, ef=$ef"
		/usr/bin/time -f '%M %e %U %S' -o "$RES/dmann.search.$round.$ef.time" "$DMANN" search \
			--index "$WORK/dmann.1.idx" --query "$DATA/query.fbin" --gt "$DATA/gt.ibin" --k $K \
			--ef $ef --json >>"$RES/dmann.search.json"
		/usr/bin/time -f '%M %e %U %S' -o "$RES/hnswlib.search.$round.$ef.time" "$WORK/hnswlib_driver" \
			search "$WORK/hnswlib.1.idx" "$DATA/query.fbin" "$DATA/gt.ibin" $K $ef \
			>>"$RES/hnswlib.search.json"
		if [ "$round" -le "$FAISS_ROUNDS" ]; then
			/usr/bin/time -f '%M %e %U %S' -o "$RES/faiss.search.$round.$ef.time" env OMP_NUM_THREADS=1 \
				"$WORK/faiss_driver" search "$WORK/faiss.1.idx" "$DATA/query.fbin" "$DATA/gt.ibin" \
				$K $ef >>"$RES/faiss.search.json"
		fi
	done
done

ls -l "$WORK"/dmann.1.idx "$WORK"/hnswlib.1.idx "$WORK"/faiss.1.idx | awk '{print $9, $5}' >"$RES/sizes.txt"
{
	echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
	echo "kernel isa: $(grep -o -w -E 'avx512f|avx2|fma|avx' /proc/cpuinfo | sort -u | tr '\n' ' ')"
	echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
	echo "elapsed_s: $(( $(date +%s) - START ))"
} >"$RES/machine.txt"

log "writing docs/benchmarks.md and docs/hnsw-recall-qps.png"
/usr/bin/python3 "$ROOT/bench/hnsw/report.py" "$RES" "$ROOT/docs/benchmarks.md" "$ROOT/docs/hnsw-recall-qps.png"
log "done in $(( $(date +%s) - START )) s"
