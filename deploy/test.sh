#!/bin/bash
# test.sh: build dmann and run its whole test suite, as CI does:
#   1. a -Werror build and the fast, graph (the SDK on the graph path at 50,000 rows), chaos
#      (issue 14's chaos test, 2 minutes of kills), demo and rxe (soft-RoCE VM) suites;
#   2. an ASan + UBSan build and its fast, cluster and chaos (40 s of kills) suites (the
#      cluster suite runs once, under the sanitizers, to keep CI within its hour; the plain
#      build's cluster programs still run in the soft-RoCE VM and in the demo);
#   3. the libFuzzer targets (clang), each for its time budget.
# Ends with one line "N passed, N failed[, N skipped]" summed from meson's counts, and exits
# non-zero when anything failed. Needs the packages of deploy/install-deps.sh.
# Env: DMANN_TEST_SKIP="asan fuzz rxe" skips steps (for quick local runs; CI skips nothing;
# a skipped step is counted as skipped in the closing line). A suite that cannot run (npm
# modules missing, no rxe suite, no qemu) is a failure with its reason, never a skip; meson
# tests that report SKIP are counted in the closing line.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
SKIP=" ${DMANN_TEST_SKIP:-} "
PASS=0 FAIL=0 SKIPPED=0 STEP_FAIL=0
T0=$SECONDS

step() { echo; echo "=== [$((SECONDS - T0))s] $*"; }

# Add one meson test run's counts (read from its printed summary) to the totals.
count() {
	local log=$1 ok xf fail to up sk
	ok=$(awk '/^Ok:/{print $2}' "$log"); xf=$(awk '/^Expected Fail:/{print $3}' "$log")
	fail=$(awk '/^Fail:/{print $2}' "$log"); to=$(awk '/^Timeout:/{print $2}' "$log")
	up=$(awk '/^Unexpected Pass:/{print $3}' "$log"); sk=$(awk '/^Skipped:/{print $2}' "$log")
	if [ -z "$ok" ]; then
		echo "test.sh: no meson summary in $log: counting the run as one failure"
		FAIL=$((FAIL + 1)); return
	fi
	PASS=$((PASS + ok + ${xf:-0})); FAIL=$((FAIL + ${fail:-0} + ${to:-0} + ${up:-0}))
	SKIPPED=$((SKIPPED + ${sk:-0}))
}

# setup DIR [meson options...]: configure (fresh) and build; a failed build counts as a failure.
setup() {
	local dir=$1; shift
	rm -rf "$dir"
	if ! meson setup "$dir" --werror "$@" >"$dir.setup.log" 2>&1; then
		cat "$dir.setup.log"; echo "test.sh: meson setup $dir failed"; FAIL=$((FAIL + 1)); return 1
	fi
	if ! ninja -C "$dir" >"$dir.build.log" 2>&1; then
		tail -50 "$dir.build.log"; echo "test.sh: build in $dir failed"; FAIL=$((FAIL + 1)); return 1
	fi
}

# run DIR [meson test options...]; then the run's slowest tests (where CI's hour goes).
run() {
	local dir=$1; shift
	local log="$dir.test.log"
	meson test -C "$dir" --print-errorlogs "$@" 2>&1 | tee "$log"
	count "$log"
	/usr/bin/python3 - "$dir/meson-logs/testlog.json" <<'EOF' || true
import json, sys
try:
    runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    sys.exit(0)
runs.sort(key=lambda r: -r.get("duration", 0))
print("slowest: " + ", ".join("%s %.0f s" % (r["name"], r["duration"]) for r in runs[:8]))
EOF
}

step "build (-Werror) and run suites fast, graph and chaos"
if setup build-test; then
	# The AWS SDK tests need the npm modules pinned in tests/s3sdk/package-lock.json
	# (suite graph here, the SDK suites of the ASan build below). A failed npm ci is a
	# failure (the SDK suites then fail too, each with the reason).
	ninja -C build-test s3sdk-deps >build-test.npm.log 2>&1 ||
		{ tail -20 build-test.npm.log; echo "test.sh: FAIL: npm ci of the AWS SDK modules failed"; FAIL=$((FAIL + 1)); }
	run build-test --suite fast --suite graph --suite chaos
	step "the README's main command: dmann demo"
	run build-test --suite demo
	if [[ $SKIP == *" rxe "* ]]; then echo "test.sh: step rxe skipped (DMANN_TEST_SKIP)"; SKIPPED=$((SKIPPED + 1)); fi
	if [[ $SKIP != *" rxe "* ]]; then
		step "soft-RoCE VM suite (verbs backend under rdma_rxe in QEMU)"
		if meson test -C build-test --list 2>/dev/null | grep -q '^dmann:rxe'; then
			run build-test --suite rxe --suite rxe-cluster
			# What ran inside the VM: kernel, rxe0, every Criterion summary.
			echo "--- inside the soft-RoCE VM (from build-test/meson-logs/testlog.txt):"
			grep -a -E "=== VM kernel|hca_id|transport:|fw_ver|state:|active_mtu|link_layer|=== RUN|Synthesis|^ok [0-9]|^not ok|RXE-TEST-RESULT|\[FAIL\]|Assertion|\[----\] [^ ]*\.c:[0-9]+|\[----\]   " \
				build-test/meson-logs/testlog.txt | sed 's/^/    /'

		else
			echo "test.sh: FAIL: no rxe suite in this build (verbs backend not built: libibverbs-dev/librdmacm-dev?)"
			FAIL=$((FAIL + 1))
		fi
	fi
fi

skip_step() { echo "test.sh: step $1 skipped (DMANN_TEST_SKIP)"; SKIPPED=$((SKIPPED + 1)); }

if [[ $SKIP == *" asan "* ]]; then skip_step asan; fi
if [[ $SKIP != *" asan "* ]]; then
	step "ASan + UBSan build, suites fast, cluster and chaos"
	if setup build-asan -Dsanitizers=true; then
		# The AWS SDK tests need the npm modules pinned in tests/s3sdk/package-lock.json.
		# A failed npm ci is a failure (the SDK suites then fail too, each with the reason).
		ninja -C build-asan s3sdk-deps >build-asan.npm.log 2>&1 ||
			{ tail -20 build-asan.npm.log; echo "test.sh: FAIL: npm ci of the AWS SDK modules failed"; FAIL=$((FAIL + 1)); }
		ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 run build-asan --suite fast --suite cluster --suite chaos
	fi
fi

if [[ $SKIP == *" fuzz "* ]]; then skip_step fuzz; fi
if [[ $SKIP != *" fuzz "* ]]; then
	step "libFuzzer targets (clang)"
	if CC=clang setup build-fuzz -Dfuzz=true -Dtests=disabled; then
		run build-fuzz --suite fuzz
	fi
fi

step "done in $((SECONDS - T0))s"
if [ "$SKIPPED" -gt 0 ] && [ -z "${DMANN_TEST_SKIP:-}" ]; then
	echo "test.sh: FAIL: $SKIPPED test(s) skipped in a full run (see SKIP lines above)"
fi
echo "$PASS passed, $FAIL failed, $SKIPPED skipped"
[ "$FAIL" -eq 0 ] && { [ "$SKIPPED" -eq 0 ] || [ -n "${DMANN_TEST_SKIP:-}" ]; }
