#!/bin/bash
# bench/epoch/run.sh: an oracle epoch refresh and compute nodes leaving and joining under a
# running query stream (issue 15, point 5). A local cluster of 2 memory + 3 compute nodes with
# `[router] partitions = keyrange` and adaptive routing; one libdmann client (`dmann bench`,
# client-side routing, --trace: each query's send time, latency, status, the routing epoch it
# was routed with and that of the node that ran it) runs one long stream:
#   - BEFORE seconds (60) of stream, then `dmann route refresh` (the two-phase rollout of the
#     next oracle epoch), then AFTER seconds (30);
#   - cn1 stopped (SIGTERM: it drains) and started again, then cn2 SIGKILLed and started
#     again, DRILL seconds (20) apart, the partition owners read from every compute node's
#     /metrics (dmann_cn_route_owner) before and after each.
# With REFRESHES > 1 the refresh is repeated, each after BEFORE seconds without one, and every
# switch is measured against its own minute before.
# Reports the failed queries; p50 / p99 of the minute before the refresh; the switch window
# (from the refresh request until every compute node runs the new epoch (their log lines)
# and the client routes with it (the first query routed with the new routing epoch)); the
# slowest query whose time in flight overlaps that window and its ratio to the minute
# before's p99 (issue 15: at most 2x); queries in the window not routed by the client or
# relayed by a compute node; the longest gap between two sends in the window against the
# minute before (a stall of the client would show there); and which partitions changed owner
# at each leave and join (issue 15: only the leaving node's, taken by a key-ring neighbour,
# and all back after the join). One JSON line on stdout; the table between the
# <!-- BEGIN epoch --> markers of docs/benchmarks.md.
#
# Env: BUILD (build), DATASET (spacev; or fmnist), SPACEV_N (100000), EF (64), CACHE (10%),
# BEFORE (60), AFTER (30), DRILL (20), NETNS (0; 1: each node in its own network namespace
# behind tc-limited links, needs root), RATE (1gbit), BATCH (100), CONNS (1) and DEPTH (2): the
# client's queries in flight, CONNS x DEPTH per compute node (dmann bench; 2 per node leaves
# a 2-core machine some idle time, so that a stall shows in the latencies; 2 x 8 saturates
# it, and queueing then sets the p99), FIT_DUTY (the cluster's default, 10: `[router] fit_duty`,
# the share of a CPU the one fitting compute node gives the fit), EF_UPPER (the cluster's
# default, 64: `[cn] ef_upper`, the level-1 search list of a query), REFRESHES (5: epoch refreshes,
# BEFORE seconds apart: the switches' slowest queries against the noise floor of windows of
# their length without one), WORK (~/.cache/dmann-bench).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
DATASET=${DATASET:-spacev}
SPACEV_N=${SPACEV_N:-100000}
EF=${EF:-64}
CACHE=${CACHE:-10%}
BEFORE=${BEFORE:-60}
AFTER=${AFTER:-30}
DRILL=${DRILL:-20}
NETNS=${NETNS:-0}
RATE=${RATE:-1gbit}
BATCH=${BATCH:-100}
CONNS=${CONNS:-1}
DEPTH=${DEPTH:-2}
FIT_DUTY=${FIT_DUTY:-}
EF_UPPER=${EF_UPPER:-}
REFRESHES=${REFRESHES:-5}
DMANN=$ROOT/$BUILD/cn/dmann
WORK=${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/dmann-bench}
LC=$WORK/epoch-cluster
RUN=$WORK/epoch-run
PY=/usr/bin/python3

[ -x "$DMANN" ] || { echo "run.sh: build first: meson setup $BUILD && ninja -C $BUILD" >&2; exit 1; }
[ "$BEFORE" -ge 60 ] || echo "run.sh: BEFORE=$BEFORE: the p99 is of less than the minute before" >&2
NSARGS=()
if [ "$NETNS" = 1 ]; then
	[ "$(id -u)" = 0 ] || { echo "run.sh: NETNS=1 needs root (or run with NETNS=0)" >&2; exit 1; }
	NSARGS=(--netns --rate "$RATE")
fi
mkdir -p "$WORK"
rm -rf "$RUN"
mkdir -p "$RUN"
START=$(date +%s)
LOAD0=$(cut -d' ' -f1 /proc/loadavg)

. "$ROOT/bench/router/datasets.sh"   # prepare
prepare "$DATASET"

mono() { $PY -c 'import time; print(time.monotonic_ns())'; }
metric() {   # cn name
	local url
	url=$(awk -v s="[cn.$1]" '$0 == s { f = 1; next } /^\[/ { f = 0 } f && $1 == "metrics" { print $3 }' "$LC/cluster.ini")
	curl -s --max-time 2 "http://$url/metrics" 2>/dev/null | awk -v m="$2" '$1 ~ "^"m"\\{" { print $2; exit }'
}
# Owners and moved partitions of compute node $1 from one scrape (the router snapshots
# both together; two scrapes could pair owners from before a change with the count from
# after it): "o0 o1 o2|moved", or "|" when it does not answer.
owners_moved() {
	local url
	url=$(awk -v s="[cn.$1]" '$0 == s { f = 1; next } /^\[/ { f = 0 } f && $1 == "metrics" { print $3 }' "$LC/cluster.ini")
	curl -s --max-time 2 "http://$url/metrics" 2>/dev/null |
		awk '/^dmann_cn_route_owner\{/ { match($0, /partition="[0-9]+"/); p = substr($0, RSTART + 11, RLENGTH - 12); o[p] = $2; n++ }
		     /^dmann_cn_route_partitions_moved\{/ { m = $2 }
		     END { for (i = 0; i < n; i++) printf "%s%s", i ? " " : "", o[i]; printf "|%s\n", m }'
}
# Wait (at most 60 s) until the compute nodes in "$1" report the same owners, with $2 of
# them served by a neighbour; echo those owners.
wait_owners() {
	local nodes=$1 moved=$2 t=0
	while :; do
		local first="" same=1
		for c in $nodes; do
			local om o m
			om=$(owners_moved "$c"); o=${om%|*}; m=${om#*|}
			if [ -z "$o" ] || [ "$m" != "$moved" ]; then same=0; break; fi
			if [ -z "$first" ]; then first=$o; elif [ "$o" != "$first" ]; then same=0; break; fi
		done
		if [ $same = 1 ] && [ -n "$first" ]; then echo "$first"; return 0; fi
		t=$((t + 1))
		[ $t -lt 600 ] || { echo "run.sh: compute nodes $nodes did not agree on owners with $moved moved" >&2; return 1; }
		sleep 0.1
	done
}
EVENTS=$RUN/events.jsonl
: >"$EVENTS"
event() { echo "{\"event\": \"$1\", \"t_ns\": $(mono)${2:+, $2}}" >>"$EVENTS"; }

trap '"$DMANN" local down --dir "$LC" >/dev/null 2>&1 || true' EXIT
"$DMANN" local down --dir "$LC" >/dev/null 2>&1 || true
rm -rf "$LC"
"$DMANN" local up --mn 2 --cn 3 --dir "$LC" "${NSARGS[@]}" --region-mb "$REGION" \
	--router partitions=keyrange --router strategy=adaptive --router batch=$BATCH \
	${FIT_DUTY:+--router fit_duty=$FIT_DUTY} ${EF_UPPER:+--cn-set ef_upper=$EF_UPPER} >/dev/null
"$DMANN" load --config "$LC/cluster.ini" --index "$IDX" >/dev/null
t=0
until [ "$(grep -l "oracle epoch 0: .*key ranges" "$LC"/cn*.log 2>/dev/null | wc -l)" -ge 3 ]; do
	t=$((t + 1)); [ $t -lt 600 ] || { echo "run.sh: no key-range oracle on every compute node in 300 s" >&2; exit 1; }
	sleep 0.5
done

# Calibration (and cache warm-up): the rate that sizes the stream.
CAL=$("$DMANN" bench --config "$LC/cluster.ini" --query "$DATA/query.fbin" --gt "$DATA/gt.ibin" \
	--k 10 --ef "$EF" --nq 5000 --cache-ratio "$CACHE" --routing adaptive --client-routing yes --conns "$CONNS" \
	--depth "$DEPTH" --json)
QPS=$(echo "$CAL" | $PY -c 'import json, sys; print(int(json.load(sys.stdin)["qps"]))')
# The stream must outlast the timeline (before, refresh, after, two drills of two phases,
# the nodes' starts): 1.5x its length at the calibrated rate (a warm cache runs faster).
TOTAL_S=$((BEFORE * REFRESHES + AFTER + 4 * DRILL + 60))
NQ=$((QPS * TOTAL_S * 3 / 2))
echo "== calibration: $QPS queries/s; stream of $NQ queries (~$TOTAL_S s)" >&2

TRACE=$RUN/trace.txt
"$DMANN" bench --config "$LC/cluster.ini" --query "$DATA/query.fbin" --gt "$DATA/gt.ibin" \
	--k 10 --ef "$EF" --nq "$NQ" --cache-ratio keep --routing adaptive --client-routing yes --conns "$CONNS" --depth "$DEPTH" \
	--trace "$TRACE" --json >"$RUN/bench.json" 2>"$RUN/bench.err" &
BENCH=$!
# The stream has started once the compute nodes answer its queries (the trace is written
# after each call of 65,536 queries).
qsum() { local n=0 c v; for c in 0 1 2; do v=$(metric $c dmann_cn_queries_total); n=$((n + ${v:-0})); done; echo $n; }
Q0=$(qsum)
t=0
until [ "$(qsum)" -gt $((Q0 + 100)) ]; do
	t=$((t + 1)); [ $t -lt 1200 ] || { echo "run.sh: the stream did not start" >&2; exit 1; }
	kill -0 $BENCH 2>/dev/null || { cat "$RUN/bench.err" >&2; exit 1; }
	sleep 0.05
done
event stream_seen
for i in $(seq 1 "$REFRESHES"); do
	sleep "$BEFORE"
	echo "== refresh $i" >&2
	"$DMANN" route refresh --config "$LC/cluster.ini" --wait 120 --json >"$RUN/refresh-$i.json"
	cat "$RUN/refresh-$i.json" >&2
done
sleep "$AFTER"

drill() {   # action node live-nodes-after moved-after
	local o0 o1
	o0=$(wait_owners "0 1 2" 0)
	event "before_$1_$2" "\"owners\": \"$o0\""
	echo "== $1 $2" >&2
	"$DMANN" local "$1" --dir "$LC" "$2" >/dev/null
	o1=$(wait_owners "$3" "$4")
	event "after_$1_$2" "\"owners\": \"$o1\", \"epoch\": \"$(metric "${3%% *}" dmann_cn_route_epoch)\""
	sleep "$DRILL"
}
drill stop cn1 "0 2" 1
"$DMANN" local start --dir "$LC" cn1 >/dev/null
o=$(wait_owners "0 1 2" 0)
event after_start_cn1 "\"owners\": \"$o\", \"oracle_epochs\": \"$(for c in 0 1 2; do metric $c dmann_cn_oracle_epoch; done | tr '\n' ' ')\""
sleep "$DRILL"
drill kill cn2 "0 1" 1
"$DMANN" local start --dir "$LC" cn2 >/dev/null
o=$(wait_owners "0 1 2" 0)
event after_start_cn2 "\"owners\": \"$o\", \"oracle_epochs\": \"$(for c in 0 1 2; do metric $c dmann_cn_oracle_epoch; done | tr '\n' ' ')\""
event drills_done "\"stream_running\": $(kill -0 $BENCH 2>/dev/null && echo true || echo false)"
echo "== waiting for the stream to end" >&2
BST=0
wait $BENCH || BST=$?
event stream_end
grep -h "oracle epoch .* active\|preparing oracle epoch\|oracle epoch .* prepared in" "$LC"/cn*.log >"$RUN/rollout.log" || true
for c in 0 1 2; do grep -h "cn$c: oracle epoch .* active" "$LC/cn$c.log" | sed "s/^/cn$c /"; done >"$RUN/active.txt" || true
ELAPSED=$(( $(date +%s) - START ))
LOAD1=$(cut -d' ' -f1 /proc/loadavg)

$PY - "$RUN" "$ROOT/docs/benchmarks.md" "$DATASET" "$SPACEV_N" "$EF" "$CACHE" "$NETNS" "$RATE" \
	"$BATCH" "$ELAPSED" "$LOAD0" "$LOAD1" "$BST" "$QPS" "$CONNS" "$DEPTH" "${FIT_DUTY:-25}" "$REFRESHES" \
	"$DATA/query.fbin" "${EF_UPPER:-64}" <<'PY'
import datetime, json, os, re, subprocess, sys
run, doc, dataset, spacev_n, ef, cache, netns, rate, batch, elapsed, load0, load1, bst, qps_cal, conns, depth, fit_duty, nref, qfile, ef_upper = sys.argv[1:21]
rows = []
for l in open(f"{run}/trace.txt"):
    if l.startswith("#"):
        continue
    p = l.split()
    rows.append((int(p[1]), float(p[2]), int(p[3]), int(p[4]), int(p[5]), int(p[6], 16),
                 int(p[7], 16), int(p[8]), int(p[0])))
rows.sort()
# The stream replays the query file (nq_file queries) over and over: each query's median
# latency over the whole stream tells a query that is slow wherever it runs (its search
# expands several times the usual nodes) from one that a switch slowed.
import statistics
with open(qfile, "rb") as f:
    nq_file = int.from_bytes(f.read(4), "little")
by_q = {}
for r in rows:
    if r[2] == 0:
        by_q.setdefault(r[8] % nq_file, []).append(r[1])
q_median = {q: statistics.median(v) for q, v in by_q.items()}
ev = [json.loads(l) for l in open(f"{run}/events.jsonl")]
evd = {e["event"]: e for e in ev}
refs = [json.load(open(f"{run}/refresh-{i}.json")) for i in range(1, int(nref) + 1)
        if os.path.exists(f"{run}/refresh-{i}.json")]
active_by_epoch = {}   # epoch -> {cn: monotonic ns}
for l in open(f"{run}/active.txt"):
    m = re.search(r"^cn(\d+) .*oracle epoch (\d+) active .* at ([0-9.]+) s monotonic", l)
    if m:
        active_by_epoch.setdefault(int(m.group(2)), {})[int(m.group(1))] = int(float(m.group(3)) * 1e9)

def pct(v, q):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]
def gap(ts):
    ts = sorted(ts)
    return max((b - a for a, b in zip(ts, ts[1:])), default=0) / 1e6

first_routed = next((r[0] for r in rows if r[5]), None)

def switch(ref):
    """One refresh: its minute before, its window, its slowest query and the noise floor."""
    t_req, new = ref["requested_ns"], ref["to"]
    active = active_by_epoch.get(new, {})
    # The client is on the new epoch from its first query routed with it (the routing
    # epoch's top byte is the oracle epoch's low byte).
    t_client = next((r[0] for r in rows if r[0] >= t_req and r[5] and (r[5] >> 24) == (new & 0xff)), None)
    before = [r for r in rows if t_req - 60e9 <= r[0] < t_req and r[2] == 0]
    lat_b = [r[1] for r in before]
    p99_b = pct(lat_b, 0.99)
    sw = {"from": ref["from"], "to": new, "cli_seconds": ref["seconds"],
          "cn_active_s": {f"cn{c}": round((t - t_req) / 1e9, 3) for c, t in sorted(active.items())},
          "client_on_new_s": round((t_client - t_req) / 1e9, 3) if t_client else None,
          "before": {"queries": len(before), "failed": sum(1 for r in rows if t_req - 60e9 <= r[0] < t_req and r[2]),
                     "seconds": round((before[-1][0] - before[0][0]) / 1e9, 1) if before else 0,
                     "p50_us": pct(lat_b, 0.50), "p99_us": p99_b, "max_us": max(lat_b) if lat_b else None,
                     "longest_send_gap_ms": round(gap([r[0] for r in before]), 2)},
          "complete": False}
    if len(active) < 3 or not t_client or not p99_b:
        return sw
    t_end = max(list(active.values()) + [t_client])
    win = [r for r in rows if r[0] <= t_end and r[0] + r[1] * 1e3 >= t_req]
    ok = [r for r in win if r[2] == 0]
    slow = max(r[1] for r in ok) if ok else None
    slow_r = max(ok, key=lambda r: r[1]) if ok else None
    sent_in = [r for r in rows if t_req <= r[0] <= t_end]
    sw.update({
        "complete": True, "t_end": t_end,
        "seconds": round((t_end - t_req) / 1e9, 3), "queries": len(win),
        "failed": sum(1 for r in win if r[2] != 0), "slowest_us": slow,
        "ratio_to_p99_before": round(slow / p99_b, 3) if slow else None,
        "p99_us": pct([r[1] for r in ok], 0.99),
        "not_client_routed": sum(1 for r in sent_in if r[5] == 0 and first_routed and r[0] > first_routed),
        "relayed": sum(1 for r in win if r[7] & 4), "spilled": sum(1 for r in win if r[7] & 2),
        "retried": sum(1 for r in win if r[7] & 8),
        "slowest_query": slow_r[8] % nq_file if slow_r else None,
        "slowest_query_median_us": round(q_median[slow_r[8] % nq_file], 1) if slow_r else None,
        "slowest_query_runs": len(by_q[slow_r[8] % nq_file]) if slow_r else None,
        "routed_with_old_epoch_ran_on_new": sum(1 for r in win if r[5] and r[6] and (r[5] >> 24) != (r[6] >> 24)),
        "longest_send_gap_ms": round(gap([r[0] for r in sent_in]), 2)})
    # The reference: windows of the switch's length in the minute before, no switch in
    # them; how slow their slowest query is against the same p99 (the noise floor of the
    # 2x bound at this load on this machine), and where the switch ranks among them.
    # The same for each query against its own median (what a switch adds, whatever the
    # query's own cost): the largest such slowdown in the window and in each reference.
    def own(rs):
        return max((r[1] / q_median[r[8] % nq_file] for r in rs), default=0)
    wl = t_end - t_req
    refw, refo = [], []
    t0 = t_req - 60e9
    while wl > 0 and t0 + wl <= t_req:
        wr = [r for r in before if t0 <= r[0] < t0 + wl]
        if wr:
            refw.append(max(r[1] for r in wr) / p99_b)
            refo.append(own(wr))
        t0 += wl
    refw.sort()
    refo.sort()
    so = own(ok)
    sw["own_median"] = {
        "switch_max_ratio": round(so, 3),
        "windows_before_median": round(pct(refo, 0.5), 3) if refo else None,
        "windows_before_worst": round(refo[-1], 3) if refo else None,
        "share_at_least_the_switch": round(sum(1 for x in refo if x >= so) / len(refo), 3) if refo else None}
    ratio = slow / p99_b if slow else 0
    sw["windows_before"] = {
        "count": len(refw), "median_ratio": round(pct(refw, 0.5), 3) if refw else None,
        "worst_ratio": round(refw[-1], 3) if refw else None,
        "share_over_2x": round(sum(1 for x in refw if x > 2.0) / len(refw), 3) if refw else None,
        "share_at_least_the_switch": round(sum(1 for x in refw if x >= ratio) / len(refw), 3) if refw else None}
    after = [r for r in rows if t_end < r[0] <= t_end + 30e9 and r[2] == 0]
    sw["after"] = {"queries": len(after), "p50_us": pct([r[1] for r in after], 0.5),
                   "p99_us": pct([r[1] for r in after], 0.99)}
    return sw

sws = [switch(r) for r in refs]
failed = sum(1 for r in rows if r[2] != 0)
res = {"dataset": dataset, "queries": len(rows), "failed": failed, "bench_exit": int(bst),
       "qps_calibration": int(qps_cal), "refreshes": len(refs), "switches": sws}
# Leaves and joins: which partitions changed owner.
def own(e):
    return [int(x) for x in evd[e]["owners"].split()] if e in evd else None
drills = []
for act, node, back in (("stop", "cn1", "after_start_cn1"), ("kill", "cn2", "after_start_cn2")):
    b, a, j = own(f"before_{act}_{node}"), own(f"after_{act}_{node}"), own(back)
    if not b or not a or not j:
        drills.append({"drill": f"{act} {node}", "complete": False})
        continue
    leaving = int(node[2:])
    moved = [p for p in range(len(b)) if a[p] != b[p]]
    neighbour = all(p == leaving and abs(a[p] - p) == 1 for p in moved)
    t0, t1 = evd[f"before_{act}_{node}"]["t_ns"], evd[back]["t_ns"]
    inwin = [r for r in rows if t0 <= r[0] <= t1]
    drills.append({"drill": f"{act} {node}", "owners_before": b, "owners_after_leave": a,
                   "moved": moved, "only_its_range_to_a_key_neighbour": bool(moved == [leaving] and neighbour),
                   "owners_after_join": j, "all_back": j == b,
                   "oracle_epochs_after_join": evd[back].get("oracle_epochs", "").split(),
                   "queries": len(inwin), "failed": sum(1 for r in inwin if r[2] != 0),
                   "retried": sum(1 for r in inwin if r[7] & 8),
                   "relayed": sum(1 for r in inwin if r[7] & 4),
                   "p99_us": pct([r[1] for r in inwin if r[2] == 0], 0.99),
                   "max_us": max((r[1] for r in inwin if r[2] == 0), default=None)})
res["drills"] = drills
# Every event happened under the stream only if it was still running after the last one.
res["stream_outlasted_the_drills"] = bool(evd.get("drills_done", {}).get("stream_running"))
last = rows[-1][0] if rows else 0
res["stream_after_first_refresh_s"] = round((last - refs[0]["requested_ns"]) / 1e9, 1) if rows and refs else None
done = [s for s in sws if s["complete"]]
res["verdict"] = {
    "zero_failed": failed == 0 and int(bst) == 0 and res["stream_outlasted_the_drills"],
    "slowest_at_most_2x_p99": bool(refs) and len(done) == len(refs) and
                              all(s["ratio_to_p99_before"] <= 2.0 for s in done),
    "switches_at_most_2x": sum(1 for s in done if s["ratio_to_p99_before"] <= 2.0),
    "switches": len(refs),
    "leaves_move_only_neighbouring_ranges": all(d.get("only_its_range_to_a_key_neighbour") and d.get("all_back") for d in drills)}
cpu = open("/proc/cpuinfo").read()
isa = " ".join(f for f in ("avx512f", "avx2") if re.search(r"\b%s\b" % f, cpu)) or "scalar"
ncpu = len(re.findall(r"^processor\s", cpu, re.M))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
res.update({"isa": isa, "cores": ncpu, "load_start": float(load0), "load_end": float(load1),
            "commit": commit, "elapsed_s": int(elapsed), "fit_duty": int(fit_duty), "ef_upper": int(ef_upper)})
print(json.dumps(res))

net = (f"each node in its own network namespace, links rate-limited to {rate} (tc tbf)" if netns == "1" else "loopback")
names = {"fmnist": "Fashion-MNIST", "spacev": f"SPACEV-shaped {spacev_n}"}
def us(v):
    return "n/a" if v is None else f"{v/1000:.2f} ms"
lines = [
    f"Generated by `bench/epoch/run.sh` ({datetime.date.today().isoformat()}, commit {commit}, ISA {isa}, "
    f"{ncpu} cores, load average {load0} at the start and {load1} at the end, {elapsed} s). "
    f"{names.get(dataset, dataset)}, 2 memory + 3 compute nodes, {net}, tcp; `[router] partitions = keyrange`, "
    f"`fit_duty = {fit_duty}` (one compute node fits each epoch, through etcd), "
    f"adaptive routing (batch {batch}), client-side routing through libdmann (`dmann bench --trace`), "
    f"cache {cache}, k=10, ef={ef}, `[cn] ef_upper = {ef_upper}`; one closed-loop stream of {len(rows)} queries, {int(conns) * int(depth)} in flight per compute node "
    f"(calibrated at {qps_cal} queries/s), {len(refs)} epoch refreshes (`dmann route refresh`) a minute or more apart, "
    f"then the drills. "
    f"A switch window runs from the `dmann route refresh` request until every compute node runs the new "
    f"epoch (their log lines) and the client routes with it (its first query routed with the new routing "
    f"epoch); its slowest query is the slowest whose time in flight overlaps the window, against the p99 of "
    f"the minute before that request. The noise floor: the minute before cut into windows of the switch's "
    f"length (no switch in them), each window's slowest query against the same p99.",
    "",
    "| switch | window | queries | failed | p99 of the minute before | p99 in the window | slowest in the window | windows of that length in the minute before: median, worst, share over 2x | share of those at least as slow as the switch |",
    "|---|---|---|---|---|---|---|---|---|",
]
for i, s in enumerate(sws, 1):
    if not s["complete"]:
        lines.append(f"| {i}: epoch {s['from']} -> {s['to']} | the window could not be determined (a compute node's log line or the client's switch missing) | | | | | | | |")
        continue
    wb = s["windows_before"]
    lines.append(f"| {i}: epoch {s['from']} -> {s['to']} | {s['seconds']} s | {s['queries']} | {s['failed']} | "
                 f"{us(s['before']['p99_us'])} | {us(s['p99_us'])} | {us(s['slowest_us'])} (**{s['ratio_to_p99_before']}x**) | "
                 + (f"{wb['median_ratio']}x, {wb['worst_ratio']}x, {wb['share_over_2x'] * 100:.0f}% | "
                    f"{wb['share_at_least_the_switch'] * 100:.0f}% |" if wb["count"] else "n/a | n/a |"))
lines += ["", "| | queries | failed | p50 | p99 | slowest | longest gap between sends |", "|---|---|---|---|---|---|---|"]
if sws:
    b0 = sws[0]["before"]
    lines.append(f"| minute before the first refresh | {b0['queries']} | {b0['failed']} | {us(b0['p50_us'])} | "
                 f"{us(b0['p99_us'])} | {us(b0['max_us'])} | {b0['longest_send_gap_ms']} ms |")
if done and "after" in done[-1]:
    a = done[-1]["after"]
    lines.append(f"| 30 s after the last switch | {a['queries']} | 0 | {us(a['p50_us'])} | {us(a['p99_us'])} | | |")
for d in drills:
    if not d.get("owners_before"):
        lines.append(f"| {d['drill']} | incomplete | | | | | |")
        continue
    lines.append(f"| {d['drill']} and start again | {d['queries']} | {d['failed']} | | {us(d['p99_us'])} | "
                 f"{us(d['max_us'])} | |")
lines += [""]
for i, s in enumerate(done, 1):
    lines.append(f"Switch {s['from']} -> {s['to']}: compute nodes active {s['cn_active_s']} s after the request, the "
                 f"client on the new epoch after {s['client_on_new_s']} s; {s['not_client_routed']} queries "
                 f"not routed by the client, {s['relayed']} relayed by a compute node, {s['retried']} sent again, "
                 f"{s['routed_with_old_epoch_ran_on_new']} routed with the old epoch and run by a node on the new one; "
                 f"longest gap between sends {s['longest_send_gap_ms']} ms (the minute before: "
                 f"{s['before']['longest_send_gap_ms']} ms); its slowest query, query "
                 f"{s['slowest_query']} of the file, ran {s['slowest_query_runs']} times in the stream "
                 f"with a median of {us(s['slowest_query_median_us'])} "
                 f"({s['slowest_query_median_us'] / s['before']['p99_us']:.2f}x the p99; "
                 f"{s['slowest_us'] / s['slowest_query_median_us']:.2f}x its own median here). "
                 f"The largest slowdown of a query of the window against its own median: "
                 f"{s['own_median']['switch_max_ratio']}x; in windows of that length in the minute before: "
                 f"median {s['own_median']['windows_before_median']}x, worst "
                 f"{s['own_median']['windows_before_worst']}x, "
                 + (f"{s['own_median']['share_at_least_the_switch'] * 100:.0f}% at least as large."
                    if s['own_median']['share_at_least_the_switch'] is not None else "n/a."))
for d in drills:
    if d.get("owners_before"):
        lines.append(f"{d['drill']}: owners {d['owners_before']} -> {d['owners_after_leave']} (partitions moved: "
                     f"{d['moved']}; only its own range, to a key-ring neighbour: {'yes' if d['only_its_range_to_a_key_neighbour'] else 'NO'}) "
                     f"-> {d['owners_after_join']} after it started again ({'all back' if d['all_back'] else 'NOT all back'}; "
                     f"oracle epochs {' '.join(d['oracle_epochs_after_join'])}); {d['failed']} failed, {d['retried']} sent again, "
                     f"{d['relayed']} relayed.")
v = res["verdict"]
if not res["stream_outlasted_the_drills"]:
    lines.append("The stream ended before the last drill: the run does not show the drills under a stream.")
lines += ["", f"Issue 15 point 5: zero failed queries: {'yes' if v['zero_failed'] else 'NO'}; slowest query during the "
              f"switch at most 2x the p99 of the minute before: {'yes' if v['slowest_at_most_2x_p99'] else 'NO'} "
              f"({v['switches_at_most_2x']} of {v['switches']} switches); a "
              f"compute node leaving and joining moves only neighbouring ranges: "
              f"{'yes' if v['leaves_move_only_neighbouring_ranges'] else 'NO'}."]
over = [s for s in done if s["ratio_to_p99_before"] > 2.0]
if over:
    hard = [s for s in over if s["slowest_query_median_us"] > 2.0 * s["before"]["p99_us"]]
    lines[-1] += (f" Of the {len(over)} over 2x, {len(hard)} had as slowest query one whose median "
                  f"over the whole stream is itself over 2x that p99 (slow wherever it runs).")
nf = [s["windows_before"] for s in done if s["windows_before"]["count"]]
if nf:
    exp = sum(w["share_over_2x"] for w in nf)
    lines[-1] += (f" Without a switch, windows of the same lengths held a query over 2x their p99 in "
                  f"{min(w['share_over_2x'] for w in nf) * 100:.0f}-{max(w['share_over_2x'] for w in nf) * 100:.0f}% "
                  f"of the cases: at that rate {exp:.1f} of the {len(nf)} switches would exceed 2x with no stall "
                  f"of their own; {sum(1 for s in done if s['ratio_to_p99_before'] > 2.0)} did.")
block = "\n".join(lines)
sys.path.insert(0, os.path.join(os.path.dirname(doc), "..", "bench"))
from mdblock import put_block
put_block(doc, "epoch", block,
          heading="## Oracle epoch refresh and compute nodes leaving and joining under a query stream (issue 15, point 5)")
print(block, file=sys.stderr)
PY
