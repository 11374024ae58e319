#!/bin/bash
# bench/s3/selffind.sh: how many rows of an S3 index grown online find themselves first
# (issue 13, point 1 at 200k: "each finds itself first"), and the shape of the grown graph.
# N0 + NT vectors of 128 dims (`dmann gen --kind sift`); an HNSW image of the first N0 (M,
# efConstruction EFC) is bulk-imported with `dmann load --bucket --name` on a local cluster
# of 2 MN + 2 CN (R=2, tcp, loopback), the other NT rows are put through libdmann and the
# online indexers of both compute nodes move them into the graph; then S rows sampled evenly
# over all N0 + NT are queried with their own vector (k=1, the graph path) through libdmann,
# and `dmann graph check --anchors` reads every record: unreachable nodes, the count of nodes
# with 0-3 level-0 in-links, and of nodes whose nearest in-link is over 1.5x / 2x / 4x as far
# as their nearest out-link (reached only from afar). The reference, in the same run: an offline build of all N0 + NT rows
# with the same M and efConstruction (`dmann build`, 2 threads), whose self-find of the
# same sample is run locally with `dmann search` (k=1, ef 128 and 256, the graph path's
# default and twice it). Prints one JSON line and, with TABLE=1, writes the row of this run
# into the table between <!-- BEGIN selffind --> markers of docs/benchmarks.md (one row per
# configuration: M, efConstruction, SET; the rows of runs of other sizes are dropped).
#
# Env: N0 (20000), NT (200000), S (20000), M (16: the image's M), EFC (100: its
# efConstruction), SET (more [s3] settings, "k=v[,k=v...]"), BUILD
# (build), WORK (/dev/shm/dmann-selffind or ~/.cache/dmann-bench/selffind).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${BUILD:-build}
N0=${N0:-20000}
NT=${NT:-200000}
S=${S:-20000}
M=${M:-16}
EFC=${EFC:-100}
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
"$DMANN" build --base "$WORK/import.fbin" --metric l2 --M "$M" --efc "$EFC" --threads 2 \
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
"$DMANN" graph check --config "$INI" --json --list 0 --anchors >"$WORK/check.json"
"$DMANN" local down --dir "$CDIR" >/dev/null
log "reference: offline build of all $((N0 + NT)) rows, local self-find"
"$DMANN" build --base "$WORK/d/base.fbin" --metric l2 --M "$M" --efc "$EFC" --threads 2 \
	--out "$WORK/all.hnsw" >/dev/null
"$DMANN" search --index "$WORK/all.hnsw" --query "$WORK/self.fbin" --gt "$WORK/self_gt.ibin" \
	--k 1 --ef 128,256 --beam 4 --json >"$WORK/ref.json"
$PY - "$WORK" "$N0" "$NT" "$S" "$IX_S" "$SET" "$M" "$EFC" "${TABLE:-0}" "$ROOT/docs/benchmarks.md" \
	"$(( $(date +%s) - START ))" <<'EOF'
import json, os, re, subprocess, sys
w, n0, nt, s, ix, st = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
m, efc, table, md, elapsed = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9] == "1", sys.argv[10], int(sys.argv[11])
q = json.load(open(w + "/self.json"))
c = json.load(open(w + "/check.json"))
ref = {}
for line in open(w + "/ref.json"):
    r = json.loads(line)
    ref[r["ef"]] = r["recall"]
first = round(q["recall"] * s)
res = {"imported": n0, "online": nt, "M": m, "efc": efc, "set": st, "index_s": ix,
       "sampled": s, "self_first": first, "missed": s - first, "unreachable": c["unreachable"],
       "level0_inlinks_0_1_2_3": c["level0_inlinks"], "edges": c["edges"], "ids": c["ids"],
       "far_in_links_1_5x_2x_4x": c["far_in_links"],
       "offline_missed_ef128": s - round(ref[128] * s), "offline_missed_ef256": s - round(ref[256] * s)}
print(json.dumps(res))
if table:
    isa = open("/proc/cpuinfo").read()
    isa = " ".join(f for f in ("avx512f", "avx2") if re.search(r"\b%s\b" % f, isa))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    row = ("| %d | %d | %s | %d of %d (%d missed) | %d / %d | %d / %d / %d | %d / %d / %d | %d | %d s | %s, %s |" %
           (m, efc, st or "defaults", first, s, s - first, res["offline_missed_ef128"],
            res["offline_missed_ef256"], *c["level0_inlinks"][1:4], *c["far_in_links"],
            c["unreachable"], ix, commit, isa))
    b, e = "<!-- BEGIN selffind -->", "<!-- END selffind -->"
    head = ("Generated by `bench/s3/selffind.sh` with TABLE=1 (one row per configuration, the "
            "latest run of each): %d x 128 generated vectors (`dmann gen --kind sift`, seed 7, "
            "l2); an image of the first %d bulk-imported, the other %d put through libdmann and "
            "indexed online by both compute nodes (2 MN + 2 CN, R=2, tcp, loopback); %d rows "
            "sampled evenly over all queried with their own vector (k=1, the graph path, "
            "`graph_ef` 128). Reference in the same run: an offline build of all rows with the "
            "same M and efConstruction, the same sample searched locally (`dmann search`, k=1, "
            "beam 4) at ef 128 / 256." % (n0 + nt, n0, nt, s))
    hdr = ["| M | efConstruction | [s3] settings | online graph: found first | offline build: missed at ef 128 / 256 | nodes with 1 / 2 / 3 level-0 in-links | nodes whose nearest in-link is over 1.5x / 2x / 4x as far as their nearest out-link | unreachable | indexing | commit, ISA |",
           "|---:|---:|---|---|---|---|---|---:|---:|---|"]
    text = open(md).read()
    rows = []
    if b in text:
        old = text[text.index(b):text.index(e)]
        # rows of a run of other sizes (another head) are dropped, not mixed in
        if head in old:
            rows = [l for l in old.splitlines() if l.startswith("| ") and not l.startswith("| M |")]
    key = row.split("|")[1:4]
    rows = [r for r in rows if r.split("|")[1:4] != key] + [row]
    block = "\n".join([head, ""] + hdr + rows)
    sys.path.insert(0, os.path.join(os.path.dirname(md), "..", "bench"))
    from mdblock import put_block
    put_block(md, "selffind", block)
    print(block)
EOF
