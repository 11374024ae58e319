#!/bin/bash
# bench/hnsw/run.sh: local HNSW recall/QPS benchmark of dmann (with RaBitQ neighbour codes and
# without) against hnswlib and faiss, all measured in one run on one machine. One data set
# (one table of docs/benchmarks.md) per invocation:
#
#   bench/hnsw/run.sh [DATASET [WORKDIR]]
#     DATASET  fmnist   Fashion-MNIST (Debian dataset-fashion-mnist), 60k x 784, l2 (default)
#              sift200k dmann gen --kind sift, 200k x 128, l2
#              cos384   dmann gen --kind cos384, 100k x 384, cosine
#     WORKDIR  default build-bench-hnsw in the source tree
#
# For each library: build with M=16, efConstruction=200 (THREADS_LIST, default "1 2" for
# fmnist and "2" for the generated sets; build time measured inside each program around the
# build call only; peak RSS from /usr/bin/time), then search the index built with the first
# thread count with one thread, one query at a time, over the SAME ef grid for every library
# (EFS: steps of 2 from 10 to 32, then 36..128), recall@10 against exact ground truth.
# Searches run ROUNDS (default 2; faiss FAISS_ROUNDS, default 1) rounds interleaved across
# libraries, one process each, and the best round counts (the machine may be shared). Both
# wall-clock QPS and CPU QPS (queries per second of the search thread's CPU time, robust to
# other load) are recorded; QPS at recall@10 = 0.95 is interpolated between grid points.
# Writes its table between <!-- BEGIN hnsw[-DATASET] --> markers in docs/benchmarks.md and
# the plot docs/hnsw-recall-qps[-DATASET].png (recall vs QPS, all four).
#
# EF_UPPER (default 1): dmann-codes' --ef-upper, the level-1 search list; 1 is the greedy
# upper-level descent of hnswlib and faiss, so that the comparison is of the level-0 search
# (dmann's default, 16, is measured against 1 by bench/hnsw/upper.sh).
#
# Compilers and flags (the fairness note of the table repeats them):
#   dmann    meson --buildtype=release (-O3; project flag -march=x86-64-v2), distance kernels
#            and the RaBitQ estimator chosen at run time (AVX-512, else AVX2, else portable)
#   hnswlib  g++ -O3 -march=native (its AVX / AVX-512 kernels are chosen at compile time)
#   faiss    Debian's prebuilt libfaiss (its own flags), driver g++ -O3 -march=native
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DATASET=${1:-fmnist}
WORK=${2:-$ROOT/build-bench-hnsw}
M=16
EFC=200
K=10
EFS=${EFS:-10,12,14,16,18,20,22,24,26,28,30,32,36,40,44,48,56,64,80,96,128}
ROUNDS=${ROUNDS:-2}
EF_UPPER=${EF_UPPER:-1}
export EF_UPPER
FAISS_ROUNDS=${FAISS_ROUNDS:-1}
CXXFLAGS="-O3 -march=native -std=c++17"
case $DATASET in
fmnist) METRIC=l2; THREADS_LIST=${THREADS_LIST:-1 2} ;;
sift200k) METRIC=l2; THREADS_LIST=${THREADS_LIST:-2} ;;
cos384) METRIC=cos; THREADS_LIST=${THREADS_LIST:-2} ;;
*) echo "run.sh: unknown data set '$DATASET' (fmnist, sift200k, cos384)" >&2; exit 2 ;;
esac
LIBS="dmann-codes dmann-nocodes hnswlib faiss"

mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
RES=$WORK/results-$DATASET
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

DATA=$WORK/$DATASET
if [ ! -s "$DATA/gt.ibin" ]; then
	log "preparing $DATASET + exact ground truth"
	case $DATASET in
	fmnist) DMANN_NO_PROGRESS=1 "$DMANN" fmnist --out "$DATA" >&2 ;;
	sift200k) DMANN_NO_PROGRESS=1 "$DMANN" gen --kind sift --n 200000 --nq 2000 --seed 1 --out "$DATA" >&2 ;;
	cos384) DMANN_NO_PROGRESS=1 "$DMANN" gen --kind cos384 --n 100000 --nq 2000 --seed 1 --out "$DATA" >&2 ;;
	esac
fi
export BENCH_METRIC=$METRIC

# timed LIB PHASE CMD...: run CMD under /usr/bin/time, JSON stdout to RES/LIB.PHASE.json,
# peak RSS (KiB), wall, user and system seconds to RES/LIB.PHASE.time
timed() {
	local lib=$1 phase=$2
	shift 2
	/usr/bin/time -f '%M %e %U %S' -o "$RES/$lib.$phase.time" "$@" >"$RES/$lib.$phase.json"
}

# Builds, interleaved per thread count so that load from other users hits all alike.
for T in $THREADS_LIST; do
	for codes in rabitq none; do
		lib=dmann-codes
		[ $codes = none ] && lib=dmann-nocodes
		log "build, $T thread(s): $lib"
		timed $lib build$T env DMANN_NO_PROGRESS=1 "$DMANN" build --base "$DATA/base.fbin" \
			--metric $METRIC --M $M --efc $EFC --threads $T --codes $codes \
			--out "$WORK/$DATASET.$lib.$T.idx" --json
	done
	log "build, $T thread(s): hnswlib"
	timed hnswlib build$T "$WORK/hnswlib_driver" build "$DATA/base.fbin" $M $EFC $T \
		"$WORK/$DATASET.hnswlib.$T.idx"
	log "build, $T thread(s): faiss"
	timed faiss build$T env OMP_NUM_THREADS=$T "$WORK/faiss_driver" build "$DATA/base.fbin" $M $EFC $T \
		"$WORK/$DATASET.faiss.$T.idx"
done
ST=${THREADS_LIST%% *}

# Searches: every (round, ef) runs the libraries back to back, one process each; the best
# round counts. faiss is slow at high ef, so it gets fewer rounds.
for round in $(seq 1 $ROUNDS); do
	for ef in ${EFS//,/ }; do
		log "search round $round/$ROUNDS, ef=$ef"
		for lib in dmann-codes dmann-nocodes; do
			/usr/bin/time -f '%M %e %U %S' -o "$RES/$lib.search.$round.$ef.time" "$DMANN" search \
				--index "$WORK/$DATASET.$lib.$ST.idx" --query "$DATA/query.fbin" \
				--gt "$DATA/gt.ibin" --k $K --ef $ef --ef-upper "$EF_UPPER" --json \
				>>"$RES/$lib.search.json"
		done
		/usr/bin/time -f '%M %e %U %S' -o "$RES/hnswlib.search.$round.$ef.time" "$WORK/hnswlib_driver" \
			search "$WORK/$DATASET.hnswlib.$ST.idx" "$DATA/query.fbin" "$DATA/gt.ibin" $K $ef \
			>>"$RES/hnswlib.search.json"
		if [ "$round" -le "$FAISS_ROUNDS" ]; then
			/usr/bin/time -f '%M %e %U %S' -o "$RES/faiss.search.$round.$ef.time" env OMP_NUM_THREADS=1 \
				"$WORK/faiss_driver" search "$WORK/$DATASET.faiss.$ST.idx" "$DATA/query.fbin" \
				"$DATA/gt.ibin" $K $ef >>"$RES/faiss.search.json"
		fi
	done
done

for lib in $LIBS; do
	echo "$lib $(stat -c %s "$WORK/$DATASET.$lib.$ST.idx")"
done >"$RES/sizes.txt"
{
	echo "dataset: $DATASET ($(head -c 8 "$DATA/base.fbin" | od -An -tu4 | awk '{print $1 " x " $2}'), $METRIC)"
	echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
	echo "isa: $(grep -o -w -E 'avx512f|avx512bw|avx2|fma|sse4_2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
	echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
	echo "threads: $THREADS_LIST (searched: the $ST-thread builds)"
	echo "elapsed_s: $(( $(date +%s) - START ))"
} >"$RES/machine.txt"

log "writing docs/benchmarks.md and the plot"
/usr/bin/python3 "$ROOT/bench/hnsw/report.py" "$RES" "$ROOT/docs/benchmarks.md" "$DATASET"
log "done in $(( $(date +%s) - START )) s"
