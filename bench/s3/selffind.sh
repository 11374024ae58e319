#!/bin/bash
# bench/s3/selffind.sh: how many rows of an S3 index grown online find themselves first
# (issue 13, point 1 at 200k: "each finds itself first"), and the shape of the grown graph.
# N0 + NT vectors of 128 dims (`dmann gen --kind sift`); an HNSW image of the first N0 (M=16,
# efConstruction=100) is bulk-imported with `dmann load --bucket --name` on a local cluster
# of 2 MN + 2 CN (R=2, tcp, loopback), the other NT rows are put through libdmann and the
# online indexers of both compute nodes move them into the graph; then S rows sampled evenly
# over all N0 + NT are queried with their own vector (k=1, the graph path) through libdmann,
# and `dmann graph check` reads every record: unreachable nodes and the count of nodes with
# 0-3 level-0 in-links. Prints one JSON line; writes nothing into the docs (an exploration
# tool: run it before and after a change to the insert path).
#
# Env: N0 (20000), NT (200000), S (20000), SET (more [s3] settings, "k=v[,k=v...]"), BUILD
# (build), WORK (/dev/shm/dmann-selffind or ~/.cache/dmann-bench/selffind).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
N0=${N0:-20000}
NT=${NT:-200000}
S=${S:-20000}
SET=${SET:-}
SPARE=$((NT + NT / 5))
. "$ROOT/bench/s3/lib.sh"
bench_init selffind

log "data: $((N0 + NT)) x 128"
"$DMANN" gen --kind sift --n $((N0 + NT)) --nq 10 --seed 7 --out "$WORK/d" >/dev/null
$PY - "$WORK" "$N0" "$S" <<'EOF'
import struct, sys
w, n0, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(w + "/d/base.fbin", "rb") as f:
    rows, dim = struct.unpack("<II", f.read(8))
    body = f.read()
with open(w + "/import.fbin", "wb") as f:
    f.write(struct.pack("<II", n0, dim)); f.write(body[:n0 * dim * 4])
s = min(s, rows)
pick = [i * rows // s for i in range(s)]
with open(w + "/self.fbin", "wb") as f:
    f.write(struct.pack("<II", s, dim))
    for i in pick:
        f.write(body[i * dim * 4:(i + 1) * dim * 4])
with open(w + "/self_gt.ibin", "wb") as f:
    f.write(struct.pack("<II", s, 1))
    for i in pick:
        f.write(struct.pack("<i", i))
EOF
"$DMANN" build --base "$WORK/import.fbin" --metric l2 --M 16 --efc 100 --threads 2 \
	--out "$WORK/idx.hnsw" >/dev/null
REC=$(( $(stat -c %s "$WORK/idx.hnsw") / 1048576 ))
REGION=$(( REC * 2 * (N0 + SPARE) / N0 + 512 ))
sets=()
IFS=',' read -ra kv <<<"$SET"
for s in "${kv[@]}"; do sets+=(--s3-set "$s"); done
"$DMANN" local up --mn 2 --cn 2 --dir "$CDIR" --redundancy 2 --region-mb $REGION \
	"${sets[@]}" >/dev/null
INI=$CDIR/cluster.ini
"$DMANN" load --config "$INI" --index "$WORK/idx.hnsw" --bucket self-bkt --name self-idx \
	--vectors "$WORK/import.fbin" --spare $SPARE >/dev/null
bench_ports
log "$NT rows put, indexed online by both compute nodes"
T0=$(date +%s)
"$GB" put --config "$INI" --bucket self-bkt --name self-idx --base "$WORK/d/base.fbin" --from "$N0" \
	--to $((N0 + NT)) >/dev/null
while :; do
	rows=$(msum dmann_cn_s3_indexed_rows_total)
	lag=$(msum dmann_cn_s3_index_lag_rows)
	[ "$rows" -ge "$NT" ] && [ "$lag" -eq 0 ] && break
	sleep 1
done
IX_S=$(( $(date +%s) - T0 ))
log "self-find of $S rows (k=1)"
"$GB" query --config "$INI" --bucket self-bkt --name self-idx --query "$WORK/self.fbin" \
	--gt "$WORK/self_gt.ibin" --k 1 --label self >"$WORK/self.json"
"$DMANN" graph check --config "$INI" --json --list 0 >"$WORK/check.json"
$PY - "$WORK" "$N0" "$NT" "$S" "$IX_S" "$SET" <<'EOF'
import json, sys
w, n0, nt, s, ix, st = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
q = json.load(open(w + "/self.json"))
c = json.load(open(w + "/check.json"))
print(json.dumps({"imported": n0, "online": nt, "set": st, "index_s": ix, "sampled": s,
                  "self_first": round(q["recall"] * s), "missed": s - round(q["recall"] * s),
                  "unreachable": c["unreachable"], "level0_inlinks_0_1_2_3": c["level0_inlinks"],
                  "edges": c["edges"], "ids": c["ids"]}))
EOF
