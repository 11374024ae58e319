#!/bin/bash
# bench/keyrange/run.sh: compute-node partitions as key ranges against k-means partitions
# (issue 15, point 2). For each data set (Fashion-MNIST, a generated SPACEV-shaped set) one
# HNSW image; for each partitioning a local cluster of 2 memory + 4 compute nodes (each node
# in its own network namespace behind tc-limited links, as bench/router/run.sh; NETNS=0 for
# loopback) started with `[router] partitions = kmeans` (balanced k-means, the default) or
# `keyrange` (contiguous runs of a VHash ring fitted on the same sample,
# oracle/oracle_keyrange.c); then for cache 5% and 10%, uniform and Zipf 1.0 streams, the
# routers bestfit and adaptive-ring (client-side: libdmann holds the oracle and sends each
# query to the compute node the router picks) and, once per cluster, `none` (independent
# caches, no partitions: the reference both are measured against). Every run warms up with
# the stream's first NQ positions and measures the next NQ (the warm-up queries are not the
# measured ones, except that a Zipf stream repeats popular queries: the `warmed` column).
# Reports QPS, hit rate and the online cache split penalty (CSP) side by side, and writes the
# table between the <!-- BEGIN keyrange --> markers of docs/benchmarks.md.
#
# Env: BUILD (build), NQ (2000), EF (64), NETNS (1; needs root), RATE (1gbit), DATASETS
# ("fmnist spacev"), RATIOS ("5% 10%"), DISTS ("uniform zipf"), STRATEGIES ("bestfit
# adaptive-ring"), SPACEV_N (100000), BATCH (100), REGIONS ([router] regions of the key-range
# clusters, 0: auto), PARTS ("kmeans keyrange"), CSP_SLICE (4: [router] csp_slice, the CSP
# estimate's hash slice; the default 1/64 holds ~50 ids per cache at 5% of Fashion-MNIST, and
# its CSP moved 0.5%-3.4% between two runs of one configuration), WORK (~/.cache/dmann-bench).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
NQ=${NQ:-2000}
EF=${EF:-64}
RATE=${RATE:-1gbit}
NETNS=${NETNS:-1}
DATASETS=${DATASETS:-"fmnist spacev"}
RATIOS=${RATIOS:-"5% 10%"}
DISTS=${DISTS:-"uniform zipf"}
STRATEGIES=${STRATEGIES:-"bestfit adaptive-ring"}
SPACEV_N=${SPACEV_N:-100000}
BATCH=${BATCH:-100}
REGIONS=${REGIONS:-0}
PARTS=${PARTS:-"kmeans keyrange"}
CSP_SLICE=${CSP_SLICE:-4}
TRUNC=0
DMANN=$ROOT/$BUILD/cn/dmann
WORK=${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/dmann-bench}
LC=$WORK/keyrange-cluster
OUT=$WORK/keyrange-results.jsonl

[ -x "$DMANN" ] || { echo "run.sh: build first: meson setup $BUILD && ninja -C $BUILD" >&2; exit 1; }
NSARGS=()
if [ "$NETNS" = 1 ]; then
	[ "$(id -u)" = 0 ] || { echo "run.sh: NETNS=1 needs root (or run with NETNS=0)" >&2; exit 1; }
	NSARGS=(--netns --rate "$RATE")
fi
mkdir -p "$WORK"
: >"$OUT"
START=$(date +%s)

. "$ROOT/bench/router/datasets.sh"   # prepare

# Wait until every compute node logged its oracle (the key-range one fits a VHash first).
wait_oracles() {   # partitions
	local want=$1 t=0
	while :; do
		local n
		n=$(grep -l "oracle epoch .*$want" "$LC"/cn*.log 2>/dev/null | wc -l || true)
		[ "$n" -ge 4 ] && return 0
		t=$((t + 1))
		[ $t -lt 300 ] || { echo "run.sh: the compute nodes built no '$want' oracle in 150 s" >&2; exit 1; }
		sleep 0.5
	done
}

trap '"$DMANN" local down --dir "$LC" >/dev/null 2>&1 || true' EXIT
for ds in $DATASETS; do
	prepare "$ds"
	for parts in $PARTS; do
		"$DMANN" local down --dir "$LC" >/dev/null 2>&1 || true
		rm -rf "$LC"
		"$DMANN" local up --mn 2 --cn 4 --dir "$LC" "${NSARGS[@]}" --region-mb "$REGION" \
			--router partitions=$parts --router regions=$REGIONS \
			--router csp_slice=$CSP_SLICE >/dev/null
		"$DMANN" load --config "$LC/cluster.ini" --index "$IDX" >/dev/null
		if [ $parts = kmeans ]; then wait_oracles "k-means partitions"; else wait_oracles "key ranges"; fi
		for ratio in $RATIOS; do
			for dist in $DISTS; do
				zipf=(); [ "$dist" = zipf ] && zipf=(--zipf 1.0)
				run() {   # variant, bench args...
					local variant=$1; shift
					echo "== $ds cache $ratio $dist $variant" >&2
					"$DMANN" bench --config "$LC/cluster.ini" --query "$DATA/query.fbin" \
						--gt "$DATA/gt.ibin" --k 10 --ef "$EF" --nq "$NQ" --warmup "$NQ" \
						--batch "$BATCH" "${zipf[@]}" --json "$@" |
						sed "s/^{/{\"dataset\": \"$ds\", \"dist\": \"$dist\", \"partitions\": \"$parts\", \"variant\": \"$variant\", \"load\": $(cut -d' ' -f1 /proc/loadavg), /" >>"$OUT" ||
						echo "run.sh: $ds $ratio $dist $parts $variant failed (not in the table)" >&2
				}
				[ $parts = kmeans ] && run none --routing none --cache-ratio "$ratio" \
					--spill-cache no --client-routing no
				for st in $STRATEGIES; do
					run "$st" --routing "$st" --cache-ratio "$ratio" --spill-cache no \
						--client-routing yes
				done
			done
		done
		# a cut sample misses duplicates: flag the table (the CN logs it once)
		grep -q 'the CSP sample holds' "$LC"/cn*.log 2>/dev/null && TRUNC=1
	done
done
ELAPSED=$(( $(date +%s) - START ))

/usr/bin/python3 - "$OUT" "$ROOT/docs/benchmarks.md" "$NQ" "$EF" "$NETNS" "$RATE" "$SPACEV_N" "$BATCH" "$ELAPSED" "$CSP_SLICE" "$TRUNC" <<'PY'
import datetime, json, os, re, subprocess, sys
out, doc, nq, ef, netns, rate, spacev_n, batch, elapsed, slice_, trunc = sys.argv[1:12]
rows = [json.loads(l) for l in open(out) if l.strip()]
cpu = open("/proc/cpuinfo").read()
isa = " ".join(f for f in ("avx512f", "avx2") if re.search(r"\b%s\b" % f, cpu)) or "scalar"
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip() or "unknown"
net = (f"each node in its own network namespace, links rate-limited to {rate} (tc tbf)"
       if netns == "1" else "loopback")
loads = [r["load"] for r in rows if "load" in r]
load_s = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "not recorded"
names = {"fmnist": "Fashion-MNIST", "spacev": f"SPACEV-shaped {spacev_n}"}
lines = [
    f"Generated by `bench/keyrange/run.sh` ({datetime.date.today().isoformat()}, commit {commit}, "
    f"ISA {isa}, 2 cores, load average {load_s}, {elapsed} s). 2 memory + 4 compute nodes, {net}, "
    f"tcp; HNSW M=16, k=10, ef={ef}; routing batch {batch}; client-side routing (libdmann ranks the "
    f"compute nodes with the oracle the cluster built). Each data set and partitioning has its own "
    f"cluster; `none` (independent caches, no partitions) ran on the k-means one. {nq} stream "
    f"positions measured after a warm-up with the {nq} before them (uniform: no measured query was "
    f"in the warm-up; Zipf: `warmed` is the share of measured positions whose query the warm-up "
    f"sent). CSP: the online estimate after the measured pass, from the cached ids in a fixed "
    f"1/{slice_} hash slice of every cache (`[router] csp_slice = {slice_}`; "
    + ("no compute node's sample was cut at the 3072 ids a report carries" if trunc == "0" else
       "**a compute node's sample was cut at the 3072 ids a report carries: those CSPs are low**")
    + "). QPS is noisy on this shared machine; hit rate and CSP much less so.",
    "",
    "| data set | cache | queries | routing | CSP k-means | CSP key ranges | hit rate k-means | hit rate key ranges | QPS k-means | QPS key ranges | recall@10 k-means / key ranges | warmed |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
]
def pick(ds, ratio, dist, parts, variant):
    m = [r for r in rows if r["dataset"] == ds and round(r["cache_ratio"], 4) == ratio
         and r["dist"] == dist and r["partitions"] == parts and r["variant"] == variant]
    return m[0] if m else None
def pct(v):
    return "n/a" if v is None else f"{v*100:.1f}%"
verdict = []
keys = []
for r in rows:
    k = (r["dataset"], round(r["cache_ratio"], 4), r["dist"], r["variant"])
    if k not in keys:
        keys.append(k)
for ds, ratio, dist, variant in keys:
    a = pick(ds, ratio, dist, "kmeans", variant)
    b = pick(ds, ratio, dist, "keyrange", variant)
    if variant == "none":
        if a:
            lines.append(f"| {names.get(ds, ds)} | {ratio*100:.0f}% | {dist} | none (no partitions) | "
                         f"{pct(a['csp'])} | | {a['hit_rate']:.3f} | | {a['qps']:.0f} | | "
                         f"{a['recall']:.4f} | {a.get('warmed_queries', 0)/max(a['queries'], 1):.2f} |")
        continue
    if not a or not b:
        continue
    lines.append(f"| {names.get(ds, ds)} | {ratio*100:.0f}% | {dist} | {variant} | {pct(a['csp'])} | "
                 f"{pct(b['csp'])} | {a['hit_rate']:.3f} | {b['hit_rate']:.3f} | {a['qps']:.0f} | "
                 f"{b['qps']:.0f} | {a['recall']:.4f} / {b['recall']:.4f} | "
                 f"{b.get('warmed_queries', 0)/max(b['queries'], 1):.2f} |")
    if a["csp"] is not None and b["csp"] is not None:
        verdict.append(b["csp"] <= a["csp"])
lines += ["", f"CSP with key ranges at most that of k-means in {sum(verdict)} of {len(verdict)} rows."]
block = "\n".join(lines)
sys.path.insert(0, os.path.join(os.path.dirname(doc), "..", "bench"))
from mdblock import put_block
put_block(doc, "keyrange", block,
          heading="## Partitions as key ranges vs k-means partitions (issue 15, point 2)")
print(block)
PY
