#!/bin/bash
# demo_test.sh: the README's main command does what it says: `dmann demo` starts a local
# cluster, builds the index and bulk-imports it into an S3 Vectors index, answers native
# queries with high recall, writes, queries and deletes through the S3 calls (the written
# rows indexed online and found through the graph, QueryVectors served by the graph path),
# and leaves no process behind. Usage: demo_test.sh BUILD_ROOT
set -u
BUILD=${1:?build root}
DIR=$(mktemp -d /tmp/dmann-demo-test.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
"$BUILD/cn/dmann" demo --dir "$DIR" >"$DIR/out.txt" 2>&1
rc=$?
cat "$DIR/out.txt"
[ $rc = 0 ] || { echo "FAIL: dmann demo exited $rc"; exit 1; }
left=$(pgrep -f -- "--config $DIR/" || true)
[ -z "$left" ] || { echo "FAIL: processes left behind: $left"; ps -fp $left; exit 1; }
# Two bench lines, each with a recall of at least 0.95.
n=0
while read -r r; do
	awk -v r="$r" 'BEGIN { exit !(r >= 0.95) }' || { echo "FAIL: recall $r < 0.95"; exit 1; }
	n=$((n + 1))
done < <(sed -n 's/^recall@10 \([0-9.]*\).*/\1/p' "$DIR/out.txt")
[ $n = 2 ] || { echo "FAIL: expected 2 bench results, found $n"; exit 1; }
grep -q "errors" "$DIR/out.txt" && ! grep -q "queries failed" "$DIR/out.txt" ||
	{ echo "FAIL: queries failed"; exit 1; }
# The S3 part: new vectors find themselves, QueryVectors' recall, served by the graph path.
grep -q "each new vector queried with itself: 200 of 200 found first" "$DIR/out.txt" ||
	{ echo "FAIL: new vectors did not all find themselves"; exit 1; }
grep -q "the online indexer moved them into the graph within .*: 200 of 200 found first, 200 of 200 queries on the graph path" "$DIR/out.txt" ||
	{ echo "FAIL: the online indexer did not move the new vectors into the graph, or they were not found through it"; exit 1; }
r=$(sed -n 's/^QueryVectors: .* recall@10 \([0-9.]*\).*/\1/p' "$DIR/out.txt")
awk -v r="${r:-0}" 'BEGIN { exit !(r >= 0.95) }' || { echo "FAIL: QueryVectors recall ${r:-none} < 0.95"; exit 1; }
g=$(sed -n 's/^served by the graph path: \([0-9]*\) of \([0-9]*\).*/\1 \2/p' "$DIR/out.txt")
set -- $g
[ -n "${1:-}" ] && [ "$1" = "$2" ] || { echo "FAIL: the graph path served ${1:-?} of ${2:-?} queries"; exit 1; }
l=$(sed -n 's/^QueryVectors on demo\/live: \([0-9]*\) of \([0-9]*\) later rows found first; .* recall@10 \([0-9.]*\) .*graph path: \([0-9]*\) of \([0-9]*\)$/\1 \2 \3 \4 \5/p' "$DIR/out.txt")
set -- $l
[ -n "${1:-}" ] && [ "$1" = "$2" ] && [ "$4" = "$5" ] &&
	awk -v r="$3" 'BEGIN { exit !(r >= 0.95) }' ||
	{ echo "FAIL: live index: ${l:-no result line} (found first, recall >= 0.95, every query on the graph path expected)"; exit 1; }
echo "PASS: demo ran, recall >= 0.95 twice, the S3 calls on the graph path, new rows indexed online, the live index served by the graph it got, no process left"
