#!/bin/bash
# bench/s3/scope.sh: scoped queries on TENANTS tenants (issue 15, point 4; docs/api.md "Scoped
# indexes", cn/s3/cn_s3_scope.c): a query whose filter pins the scope key reads only its
# scope's rows, and its answer is the exact filtered top-k. The rows of a SPACEV-shaped set
# (`dmann gen --kind spacev`, N x 100) are put through the HTTP gateway (s3_bench load, SigV4,
# PutVectors of 500 rows) into two indexes of one local cluster of 2 MN + 2 CN (R=1, tcp,
# loopback, no graph: [s3] graph_auto 0, so the exact path serves every query; no hedging:
# [s3] hedge_ms 20000, a hedged share would be scanned and counted twice), with the same rows
# and metadata {"tenant": "t<j>", "i": i}: tenant j of row i drawn by a hash of (SEED, i) from
# TENANTS tenants of skewed sizes (weights 25^(j/(TENANTS-1))). One index is declared with the
# tag dmann:scope = tenant, the other is not (the reference: the same filter applied to a full
# scan). Per index, WARM queries warm the fragment cache, then MEAS other queries (never the
# warm-up ones) are sent one at a time through cn0's gateway (s3_bench query), query j
# filtered to {"tenant": "t<j mod TENANTS>"} (every tenant queried alike); s3_bench computes
# the exact filtered top-10 itself (brute force over the tenant's rows of base.fbin) for the
# recall@10, and the compute nodes' counters give the rows read per query, the rows of other
# scopes read and the fragments kept and skipped. Writes the table between
# <!-- BEGIN scope --> markers of docs/benchmarks.md. Fails (exit 1, after writing the table)
# when the scoped index's recall@10 is not 1, a scoped query read rows of another scope or
# other rows than its tenant's, or a query was not planned as the index says.
#
# Env: N (rows, 200000), TENANTS (100), WARM (200), MEAS (1000), SEED (tenant assignment, 7),
# BUILD (build), WORK (/dev/shm/dmann-scope or ~/.cache/dmann-bench/scope).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
N=${N:-200000}
TENANTS=${TENANTS:-100}
WARM=${WARM:-200}
MEAS=${MEAS:-1000}
SEED=${SEED:-7}
K=10
. "$ROOT/bench/s3/lib.sh"
bench_init scope
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
S3B=$ROOT/$BUILD/bench/s3_bench
[ -x "$S3B" ] || { echo "scope.sh: build first: meson setup $BUILD && ninja -C $BUILD ($S3B)" >&2; exit 1; }
command -v curl >/dev/null || { echo "scope.sh: FAILED: curl is needed (the counters)" >&2; exit 1; }
OUT=$WORK/results.jsonl
: >"$OUT"

log "dmann gen --kind spacev --n $N"
"$DMANN" gen --kind spacev --n "$N" --nq $((WARM + MEAS)) --seed 5 --out "$WORK/d" >/dev/null
split_queries "$WARM"
"$DMANN" local down --dir "$CDIR" >/dev/null 2>&1 || true
rm -rf "$CDIR"
"$DMANN" local up --mn 2 --cn 2 --dir "$CDIR" --redundancy 1 --s3-set graph_auto=0 \
	--s3-set hedge_ms=20000 >/dev/null
INI=$CDIR/cluster.ini
bench_ports
[ "$(echo $ports | wc -w)" = 2 ] || { echo "scope.sh: FAILED: no metrics ports of 2 compute nodes in $INI" >&2; exit 1; }
EP=$(awk '/^\[cn.0\]/{c=1} c && /^http =/{print $3; exit}' "$INI")
[ -n "$EP" ] || { echo "scope.sh: FAILED: no http endpoint of cn0 in $INI" >&2; exit 1; }
AUTH=(--endpoint "$EP" --ak DMANNLOCALTEST --sk-file "$CDIR/s3.secret")
TARGS=(--tenants "$TENANTS" --seed "$SEED" --metric euclidean)
CTRS="dmann_cn_s3_scan_rows_total dmann_cn_s3_scope_queries_total dmann_cn_s3_scope_fragments_total dmann_cn_s3_scope_fragments_skipped_total dmann_cn_s3_scope_rows_total dmann_cn_s3_scope_other_rows_total dmann_cn_s3_hedges_total dmann_cn_s3_retries_total dmann_cn_s3_subrequests_total"
counters() {
	local c p m out=""
	for p in $ports; do
		m=$(curl -s "127.0.0.1:$p/metrics")
		for c in $CTRS; do
			grep -q "^$c[{ ]" <<<"$m" ||
				{ echo "scope.sh: FAILED: counter $c missing on the compute node of metrics port $p" >&2; exit 1; }
		done
	done
	for c in $CTRS; do out="$out $(msum "$c")"; done
	echo $out
}
counters >/dev/null

for idx in plain scoped; do
	flag=()
	[ $idx = scoped ] && flag=(--scoped)
	log "$idx: $N rows of $TENANTS tenants put through the gateway"
	T0=$(date +%s.%N)
	"$S3B" load "${AUTH[@]}" "${TARGS[@]}" "${flag[@]}" --bucket sbkt --index "$idx" \
		--base "$WORK/d/base.fbin"
	PUT_S=$(echo "$(date +%s.%N) - $T0" | bc)
	log "$idx: $WARM warm-up queries"
	"$S3B" query "${AUTH[@]}" "${TARGS[@]}" --bucket sbkt --index "$idx" --base "$WORK/d/base.fbin" \
		--query "$WORK/warm.fbin" --nq "$WARM" --warmup 0 --k $K --label warm >/dev/null
	c0=$(counters)
	log "$idx: $MEAS measured queries"
	"$S3B" query "${AUTH[@]}" "${TARGS[@]}" --bucket sbkt --index "$idx" --base "$WORK/d/base.fbin" \
		--query "$WORK/meas.fbin" --nq "$MEAS" --warmup 0 --k $K --label "$idx" >"$WORK/q.json"
	c1=$(counters)
	$PY - "$idx" "$PUT_S" "$c0" "$c1" "$WORK/q.json" >>"$OUT" <<'EOF'
import json, sys
idx, put_s, c0, c1 = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
q = json.loads(open(sys.argv[5]).readline())
d = [int(y) - int(x) for x, y in zip(c0.split(), c1.split())]
q.update({"index": idx, "put_s": put_s, "scan_rows": d[0], "scope_queries": d[1],
          "scope_frags": d[2], "scope_frags_skipped": d[3], "scope_rows": d[4],
          "scope_other_rows": d[5], "hedges": d[6], "retries": d[7], "subrequests": d[8]})
print(json.dumps(q))
EOF
	tail -1 "$OUT" >&2
done
ELAPSED=$(( $(date +%s) - START ))
LOAD1=$(cut -d' ' -f1 /proc/loadavg)

$PY - "$OUT" "$ROOT/docs/benchmarks.md" "$ELAPSED" "$WARM" "$MEAS" "$SEED" "$LOAD0" "$LOAD1" <<'EOF'
import json, os, re, subprocess, sys
out, md, elapsed, warm, meas, seed, load0, load1 = sys.argv[1:9]
r = {x["index"]: x for x in (json.loads(l) for l in open(out) if l.strip())}
p, s = r["plain"], r["scoped"]
cpu = open("/proc/cpuinfo").read()
isa = " ".join(f for f in ("avx512f", "avx2") if re.search(r"\b%s\b" % f, cpu)) or "scalar"
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip() or "unknown"
n, t = s["rows"], s["tenants"]
lines = ["## Scoped queries on %d tenants (issue 15, point 4)" % t, "",
         "Generated by `bench/s3/scope.sh` (do not edit by hand): a SPACEV-shaped set (`dmann gen "
         "--kind spacev`, %d x 100, euclidean) put through the HTTP gateway (SigV4, PutVectors of "
         "500 rows) into two indexes of one local cluster of 2 memory + 2 compute nodes (R=1, tcp, "
         "loopback, one 2-core machine for every process; `[s3] graph_auto = 0`: the exact path "
         "serves every query; `hedge_ms = 20000`: no hedged share scanned twice) with the same rows "
         "and metadata `{\"tenant\": \"t<j>\", \"i\": <row>}`, tenant j of each row drawn by a hash of (seed %s, "
         "row) from %d tenants of skewed sizes (%d to %d rows, mean %.0f); **scoped**: created with "
         "the tag `dmann:scope = tenant`, **unscoped**: without (the same filter applied to a scan "
         "of every row). Per index %s warm-up queries, then %s other queries sent one at a time "
         "through cn0's gateway, query j filtered to `{\"tenant\": \"t<j mod %d>\"}` (%d tenants "
         "queried, each alike); recall@10 against the exact filtered top-10 that the driver "
         "computes over the tenant's rows (`bench/s3/s3_bench.c query --tenants`); rows read: "
         "the compute nodes' `scan_rows_total` over the queries; fragments: `scope_fragments"
         "_total` / `scope_fragments_skipped_total` over the queries. Queries/s and latencies "
         "depend on what else runs on the machine (the load averages); recall and the counters "
         "do not. Machine: %s, %d cores, load average %s at the start and %s at the end; commit "
         "%s; %s s." % (n, seed, t, s["tenant_rows_min"], s["tenant_rows_max"], n / t, warm,
                        meas, t, s["tenants_queried"], isa, os.cpu_count(), load0, load1, commit,
                        elapsed), "",
         "| index | put (rows/s) | recall@10 | rows read / query | rows of other scopes | "
         "fragments read / skipped per query | queried tenant's share of the rows (mean) | "
         "queries/s | p50 | p99 | / unscoped |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for x in (p, s):
    qn = max(x["queries"], 1)
    sc = x["index"] == "scoped"
    frag = "%.1f / %.1f" % (x["scope_frags"] / qn, x["scope_frags_skipped"] / qn) if sc else \
        "all (%d of %d planned scoped)" % (x["scope_queries"], x["queries"])
    other = "%d (%d rows checked)" % (x["scope_other_rows"], x["scope_rows"]) if sc else "n/a"
    lines.append("| %s | %.0f | %.4f | %.0f (%.2f%%) | %s | %s | %.2f%% | %.1f | %.2f ms | "
                 "%.2f ms | %s |" % (
                     "scoped" if sc else "unscoped", n / x["put_s"], x["recall"],
                     x["scan_rows"] / qn, 100 * x["scan_rows"] / qn / n, other, frag,
                     100 * x["tenant_rows_mean"] / n, x["qps"], x["p50_us"] / 1e3,
                     x["p99_us"] / 1e3, "%.2fx" % (x["qps"] / p["qps"])))
bad = []
if s["recall"] < 1.0:
    bad.append("scoped recall@10 %.4f < 1 (worst %.2f, tenant %s)" % (
        s["recall"], s["worst_recall"], s["worst_tenant"]))
if s["scope_other_rows"]:
    bad.append("scoped queries read %d rows of other scopes" % s["scope_other_rows"])
if s["scope_queries"] != s["queries"]:
    bad.append("%d of %d scoped queries planned scoped" % (s["scope_queries"], s["queries"]))
if s["scan_rows"] != s["tenant_rows_sum"] or s["scope_rows"] != s["tenant_rows_sum"]:
    bad.append("scoped queries read %d rows (%d checked), their tenants hold %d" % (
        s["scan_rows"], s["scope_rows"], s["tenant_rows_sum"]))
if p["scope_queries"]:
    bad.append("%d queries of the unscoped index planned scoped" % p["scope_queries"])
if s["hedges"] or p["hedges"] or s["retries"] or p["retries"]:
    bad.append("hedges/retries during the measured queries (%d/%d, %d/%d): rows counted twice" % (
        p["hedges"], s["hedges"], p["retries"], s["retries"]))
lines += ["", "Scoped: every measured query read exactly its tenant's rows (%d rows over %d "
          "queries, the sum of the queried tenants' sizes), 0 rows of another tenant; %.1fx fewer "
          "rows read than the unscoped index's full scan, %.2fx its queries/s." % (
              s["tenant_rows_sum"], s["queries"], p["scan_rows"] / max(s["scan_rows"], 1),
              s["qps"] / p["qps"]) if not bad else
          "**Not as expected:** " + "; ".join(bad) + "."]
block = "\n".join(lines)
sys.path.insert(0, os.path.join(os.path.dirname(md), "..", "bench"))
from mdblock import put_block
put_block(md, "scope", block)
print(block)
if bad:
    print("scope.sh: FAILED: " + "; ".join(bad), file=sys.stderr)
    sys.exit(1)
EOF
