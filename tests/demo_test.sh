#!/bin/bash
# demo_test.sh: the README's main command does what it says: `dmann demo` starts a local
# cluster, builds and loads the index, answers queries with high recall, and leaves no
# process behind. Usage: demo_test.sh BUILD_ROOT
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
echo "PASS: demo ran, recall >= 0.95 twice, no process left"
