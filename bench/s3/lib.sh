# bench/s3/lib.sh: what the bench/s3 cluster scripts share (sourced after ROOT and BUILD are
# set): bench_init NAME sets DMANN, GB (graph_bench), PY, WORK (/dev/shm/dmann-NAME or
# ~/.cache/dmann-bench/NAME unless set), CDIR (the local cluster's directory) and START,
# checks the binaries and takes the cluster down and WORK away on exit; log prints a
# timestamped line to stderr; after the cluster is up, bench_ports reads the compute nodes'
# metrics ports, mget NAME prints a metric of every compute node (space-separated) and msum
# NAME their sum (integer part).
bench_init() {
	DMANN=$ROOT/$BUILD/cn/dmann
	GB=$ROOT/$BUILD/bench/graph_bench
	PY=/usr/bin/python3
	export DMANN_NO_PROGRESS=1
	if [ -z "${WORK:-}" ]; then
		WORK=${XDG_CACHE_HOME:-$HOME/.cache}/dmann-bench/$1
		[ -d /dev/shm ] && [ -w /dev/shm ] && WORK=/dev/shm/dmann-$1
	fi
	local b
	for b in "$DMANN" "$GB" "$ROOT/$BUILD/cn/dmann-cn" "$ROOT/$BUILD/mn/dmann-mn"; do
		[ -x "$b" ] || { echo "$1.sh: build first: meson setup $BUILD && ninja -C $BUILD ($b)" >&2; exit 1; }
	done
	CDIR=$WORK/cluster
	trap bench_cleanup EXIT
	rm -rf "$WORK"
	mkdir -p "$WORK"
	START=$(date +%s)
}
bench_cleanup() { "$DMANN" local down --dir "$CDIR" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
bench_ports() {
	ports=$(awk '/^\[cn\./{c=1} /^\[mn\./{c=0} c && /^metrics =/{split($3,a,":"); print a[2]}' \
		"$CDIR/cluster.ini")
}
mget() {
	local v p out=""
	for p in $ports; do
		v=$(curl -s "127.0.0.1:$p/metrics" | awk -v n="$1" '$1 == n || $1 ~ "^"n"[{]" {print $2}')
		out="$out ${v:-0}"
	done
	echo $out
}
msum() { local t=0 v; for v in $(mget "$1"); do t=$((t + ${v%.*})); done; echo $t; }
# split_queries WARM [N]: $WORK/d's queries cut into $WORK/warm.fbin (the first WARM) and
# $WORK/meas.fbin + $WORK/meas_gt.ibin (the rest, with their ground truth); with N, also the
# first N base rows into $WORK/import.fbin.
split_queries() {
	$PY - "$WORK" "$1" "${2:-0}" <<'EOF'
import struct, sys
w, warm, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
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
if n:
    cut(w + "/d/base.fbin", w + "/import.fbin", 0, n)
EOF
}
