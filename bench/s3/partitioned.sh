#!/bin/bash
# bench/s3/partitioned.sh: the partitioned mode of the exact scan (issue 15, point 3;
# cn/s3/cn_s3_part.c) against the exact scan of every row, on the same index of one cluster
# in one run. Per data set (Fashion-MNIST from the Debian package, a generated SPACEV-shaped
# set): the rows are put through libdmann into an index of a local cluster of 2 MN + 2 CN
# (R=1, tcp, loopback, no graph: [s3] graph_auto 0, so the exact path serves every query),
# then for each budget B (0 = every row, then BUDGETS) the compute nodes are restarted with
# [s3] scan_budget B (DMANN_S3_SCAN_BUDGET), WARM queries warm the fragment cache and let the
# compute nodes fit their models (repeated until every warm-up query is partitioned), and
# MEAS other queries (never the warm-up ones) are measured through libdmann's
# dmann_batch_query (graph_bench query: up to 16 in flight per compute node): queries per
# second, recall@10 against the exact top-10 of `dmann gen` / `dmann fmnist`, the mean count
# of regions chosen and the share of rows compared (the compute nodes' counters). Writes the
# table between <!-- BEGIN partitioned --> markers of docs/benchmarks.md.
#
# Env: DATASETS ("fmnist spacev"), N (SPACEV rows, 200000), REGIONS ([s3] scan_regions, 64),
# BUDGETS ("2 4 8 16"), WARM (200), MEAS (1000), FMNIST_SRC (/usr/share/datasets/
# fashion-mnist: the Debian package dataset-fashion-mnist; missing = the run fails), BUILD
# (build), WORK (/dev/shm/dmann-partitioned or ~/.cache/dmann-bench/partitioned).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
DATASETS=${DATASETS:-"fmnist spacev"}
N=${N:-200000}
REGIONS=${REGIONS:-64}
BUDGETS=${BUDGETS:-"2 4 8 16"}
WARM=${WARM:-200}
MEAS=${MEAS:-1000}
FMNIST_SRC=${FMNIST_SRC:-/usr/share/datasets/fashion-mnist}
. "$ROOT/bench/s3/lib.sh"
bench_init partitioned
OUT=$WORK/results.jsonl
: >"$OUT"

for ds in $DATASETS; do
	rm -rf "$WORK/d"
	case $ds in
	fmnist)
		if [ ! -f "$FMNIST_SRC/train-images-idx3-ubyte.gz" ]; then
			echo "partitioned.sh: FAILED: Fashion-MNIST not found in $FMNIST_SRC (apt-get install dataset-fashion-mnist)" >&2
			exit 1
		fi
		log "$ds: dmann fmnist"
		"$DMANN" fmnist --out "$WORK/d" --data "$FMNIST_SRC" >/dev/null ;;
	spacev)
		log "$ds: dmann gen --kind spacev --n $N"
		"$DMANN" gen --kind spacev --n "$N" --nq $((WARM + MEAS)) --seed 5 --out "$WORK/d" >/dev/null ;;
	*) echo "partitioned.sh: unknown data set $ds" >&2; exit 2 ;;
	esac
	split_queries "$WARM"
	"$DMANN" local down --dir "$CDIR" >/dev/null 2>&1 || true
	rm -rf "$CDIR"
	"$DMANN" local up --mn 2 --cn 2 --dir "$CDIR" --redundancy 1 --s3-set graph_auto=0 \
		--s3-set scan_regions="$REGIONS" --s3-set scan_min_rows=20000 >/dev/null
	INI=$CDIR/cluster.ini
	bench_ports
	log "$ds: rows put through libdmann"
	T0=$(date +%s.%N)
	"$DMANN" put --config "$INI" --bucket pbkt --name pidx --vectors "$WORK/d/base.fbin" \
		--key-prefix "" --create euclidean >/dev/null
	PUT_S=$(echo "$(date +%s.%N) - $T0" | bc)
	for B in 0 $BUDGETS; do
		for cn in cn0 cn1; do
			"$DMANN" local stop --dir "$CDIR" $cn >/dev/null
			DMANN_S3_SCAN_BUDGET=$B "$DMANN" local start --dir "$CDIR" $cn >/dev/null
		done
		sleep 2
		bench_ports
		log "$ds: scan_budget $B: warm-up"
		for try in $(seq 1 30); do
			p0=$(msum dmann_cn_s3_partitioned_queries_total)
			"$GB" query --config "$INI" --bucket pbkt --name pidx --query "$WORK/warm.fbin" \
				--gt "$WORK/d/gt.ibin" --label warm >/dev/null
			p1=$(msum dmann_cn_s3_partitioned_queries_total)
			{ [ "$B" = 0 ] || [ $((p1 - p0)) -ge "$WARM" ]; } && break
			[ "$try" = 30 ] && { echo "partitioned.sh: models not ready after 30 warm-up rounds" >&2; exit 1; }
			sleep 1
		done
		c0="$(msum dmann_cn_s3_partitioned_queries_total) $(msum dmann_cn_s3_partition_regions_total) $(msum dmann_cn_s3_scan_rows_total) $(msum dmann_cn_s3_scan_rows_skipped_total) $(msum dmann_cn_s3_partition_mismatches_total) $(msum dmann_cn_s3_subrequests_total)"
		log "$ds: scan_budget $B: $MEAS measured queries"
		"$GB" query --config "$INI" --bucket pbkt --name pidx --query "$WORK/meas.fbin" \
			--gt "$WORK/meas_gt.ibin" --nq "$MEAS" --label "$ds-$B" >"$WORK/q.json"
		c1="$(msum dmann_cn_s3_partitioned_queries_total) $(msum dmann_cn_s3_partition_regions_total) $(msum dmann_cn_s3_scan_rows_total) $(msum dmann_cn_s3_scan_rows_skipped_total) $(msum dmann_cn_s3_partition_mismatches_total) $(msum dmann_cn_s3_subrequests_total)"
		$PY - "$ds" "$B" "$REGIONS" "$PUT_S" "$c0" "$c1" "$WORK/q.json" >>"$OUT" <<'EOF'
import json, sys
ds, b, k, put_s, c0, c1 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
q = json.loads(open(sys.argv[7]).readline())
d = [int(y) - int(x) for x, y in zip(c0.split(), c1.split())]
print(json.dumps({"ds": ds, "budget": b, "regions": k, "put_s": put_s, "queries": q["queries"],
                  "qps": q["qps"], "recall": q["recall"], "partitioned": d[0],
                  "regions_chosen": d[1], "rows": d[2], "skipped": d[3], "mismatches": d[4],
                  "subrequests": d[5]}))
EOF
		tail -1 "$OUT" >&2
	done
	DIMS=$(od -An -tu4 -j4 -N4 "$WORK/d/base.fbin" | tr -d ' ')
	ROWS=$(od -An -tu4 -N4 "$WORK/d/base.fbin" | tr -d ' ')
	echo "{\"ds\": \"$ds\", \"meta\": true, \"rows\": $ROWS, \"dim\": $DIMS}" >>"$OUT"
done
ELAPSED=$(( $(date +%s) - START ))

$PY - "$OUT" "$ROOT/docs/benchmarks.md" "$ELAPSED" "$WARM" "$MEAS" <<'EOF'
import json, os, re, subprocess, sys
out, md, elapsed, warm, meas = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
recs = [json.loads(l) for l in open(out) if l.strip()]
meta = {r["ds"]: r for r in recs if r.get("meta")}
rows = [r for r in recs if not r.get("meta")]
cpu = open("/proc/cpuinfo").read()
isa = " ".join(f for f in ("avx512f", "avx2") if re.search(r"\b%s\b" % f, cpu)) or "scalar"
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip() or "unknown"
names = {"fmnist": "Fashion-MNIST", "spacev": "SPACEV-shaped"}
out = ["## Partitioned exact scans (issue 15, point 3)", "",
       "Generated by `bench/s3/partitioned.sh` (do not edit by hand): per data set, its rows put "
       "through libdmann into one index of a local cluster of 2 memory + 2 compute nodes (R=1, tcp, "
       "loopback, one 2-core machine for every process; no graph: `[s3] graph_auto = 0`, so the "
       "exact path serves every query); for each budget B the compute nodes restarted with `[s3] "
       "scan_budget` B (0: every row, the reference), %s warm-up queries (repeated until the "
       "compute nodes' models are fitted and every one is partitioned), then %s other queries "
       "measured through libdmann's `dmann_batch_query`; recall@10 against the exact top-10; "
       "sub-requests / query: scan shares the ingress sent to the other compute node (the "
       "planner's W and R groups; 0: each ingress scanned alone). "
       "Partitioned: each query scans the rows of the regions the bounded-fanout frontier "
       "chooses (oracle/vhash_frontier.c: its own region, one key-ring neighbour each side, the "
       "nearest regions' hints, one more when ambiguous; `scan_widen = 1`) of the index's VHash "
       "of `scan_regions` regions fitted on its first 16,384 rows by every compute node alike. "
       "Regions are the logical fragments: the rows stay in their arrival-order fragments on the "
       "memory nodes, each compute node labels the rows of the fragments it caches. Machine: %s; "
       "commit %s; %s s." % (warm, meas, isa, commit, elapsed), ""]
for ds in meta:
    m = meta[ds]
    rs = [r for r in rows if r["ds"] == ds]
    ref = next((r for r in rs if r["budget"] == 0), None)
    out += ["**%s** (%d x %d, %d regions; put in %.0f s):" % (names.get(ds, ds), m["rows"], m["dim"],
            rs[0]["regions"], rs[0]["put_s"]), "",
            "| scan_budget B | regions scanned (mean, share) | rows compared | sub-requests / query | recall@10 | queries/s | / exact |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        tot = r["rows"] + r["skipped"]
        share = r["rows"] / tot if tot else 0
        if r["budget"] == 0:
            reg = "all %d (100%%)" % r["regions"]
        else:
            mean = r["regions_chosen"] / r["partitioned"] if r["partitioned"] else 0
            reg = "%.2f (%.1f%%)" % (mean, 100 * mean / r["regions"])
        note = "" if r["budget"] == 0 or r["partitioned"] == r["queries"] else \
            " (%d of %d partitioned)" % (r["partitioned"], r["queries"])
        note += "" if not r["mismatches"] else " (%d shares whole: model mismatch)" % r["mismatches"]
        out.append("| %s | %s | %.1f%% | %.2f | %.4f | %.1f | %s |" % (
            "0 (exact)" if r["budget"] == 0 else r["budget"], reg + note, 100 * share,
            r.get("subrequests", 0) / max(r["queries"], 1),
            r["recall"], r["qps"], "%.2fx" % (r["qps"] / ref["qps"]) if ref else "n/a"))
    ok = [r for r in rs if r["budget"] and r["recall"] >= 0.95]
    if ok:
        best = min(ok, key=lambda r: r["regions_chosen"] / max(r["partitioned"], 1))
        mean = best["regions_chosen"] / max(best["partitioned"], 1)
        out += ["", "Smallest measured budget with recall@10 >= 0.95: B = %d, %.1f%% of the "
                "regions (issue 15 point 3: <= 40%%), %.2fx the exact scan's queries/s." % (
                    best["budget"], 100 * mean / best["regions"],
                    best["qps"] / ref["qps"] if ref else 0)]
    else:
        out += ["", "No measured budget reached recall@10 >= 0.95."]
    out.append("")
block = "\n".join(out).rstrip("\n")
sys.path.insert(0, os.path.join(os.path.dirname(md), "..", "bench"))
from mdblock import put_block
put_block(md, "partitioned", block)
print(block)
EOF
