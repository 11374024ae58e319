# bench/router/datasets.sh: the data sets of the routing benchmarks (bench/router/run.sh,
# bench/keyrange/run.sh), sourced. prepare NAME sets DATA (base, queries, ground truth), IDX
# (an HNSW image, built once and kept in WORK) and REGION (memory-node region MiB).
# Needs DMANN, WORK and SPACEV_N.
prepare() {   # dataset -> DATA, IDX, REGION
	case $1 in
	fmnist)
		DATA=$WORK/fmnist; IDX=$WORK/fmnist.v2.hnsw
		[ -f "$DATA/gt.ibin" ] || "$DMANN" fmnist --out "$DATA"
		[ -f "$IDX" ] || "$DMANN" build --base "$DATA/base.fbin" --metric l2 --M 16 --efc 200 --out "$IDX"
		REGION=320 ;;
	spacev)
		DATA=$WORK/spacev-$SPACEV_N; IDX=$WORK/spacev-$SPACEV_N.v2.hnsw
		[ -f "$DATA/gt.ibin" ] || "$DMANN" gen --kind spacev --n "$SPACEV_N" --nq 10000 --seed 7 --out "$DATA"
		[ -f "$IDX" ] || "$DMANN" build --base "$DATA/base.fbin" --metric l2 --M 16 --efc 100 --out "$IDX"
		REGION=$(( SPACEV_N * 1500 / 1048576 + 32 )) ;;
	*) echo "$0: unknown data set $1" >&2; exit 2 ;;
	esac
}
