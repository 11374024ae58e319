#!/bin/sh
# run.sh: meson test wrapper for the AWS SDK tests (suite 'cluster'). Fails (exit 1) with
# the reason when node or the npm modules are missing: a suite that cannot run is a failure,
# never a skip. Install the modules with
#   ninja -C <builddir> s3sdk-deps      (npm ci into <builddir>/s3sdk-cache)
# Usage: run.sh [single|cluster|graph] [https]  (single: dmann-s3; cluster: dmann local up
# --mn 2 --cn 2; graph: graph.test.js, the graph path of a bulk-imported index on a local
# cluster; https: every SDK client over HTTPS, trusting the gateway's self-signed certificate)
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${DMANN_BUILD_ROOT:?DMANN_BUILD_ROOT not set}
mods="$build/s3sdk-cache/node_modules"
target=${1:-single}
tls=0
[ "${2:-}" = https ] && tls=1
if [ "$tls" = 1 ] && ! command -v openssl >/dev/null 2>&1; then
	echo "FAIL: the openssl CLI is not installed (Debian: apt-get install openssl)"
	exit 1
fi

if ! command -v node >/dev/null 2>&1; then
	echo "FAIL: node is not installed (Debian: apt-get install nodejs npm; deploy/install-deps.sh does)"
	exit 1
fi
if [ ! -d "$mods/@aws-sdk/client-s3vectors" ]; then
	echo "FAIL: @aws-sdk/client-s3vectors is not installed in $mods;"
	echo "      run: ninja -C $build s3sdk-deps (npm ci of tests/s3sdk/package-lock.json)"
	exit 1
fi
case "$target" in
single)
	bin="$build/cn/s3/dmann-s3"
	for b in "$bin"; do
		[ -x "$b" ] || { echo "FAIL: $b not built"; exit 1; }
	done
	;;
cluster|graph)
	for b in "$build/cn/dmann" "$build/cn/dmann-cn" "$build/mn/dmann-mn"; do
		[ -x "$b" ] || { echo "FAIL: $b not built"; exit 1; }
	done
	# dmann local up looks for dmann-mn / dmann-cn beside dmann or on PATH.
	PATH="$build/cn:$build/mn:$PATH"
	export PATH
	bin=""
	;;
*)
	echo "usage: run.sh [single|cluster|graph] [https]"
	exit 2
	;;
esac
suite="$here/s3sdk.test.js"
[ "$target" = graph ] && suite="$here/graph.test.js"
S3SDK_HTTPS="$tls" S3SDK_TARGET="$target" DMANN_S3_BIN="$bin" DMANN_BIN_DIR="$build/cn" \
	DMANN_MN_BIN="$build/mn/dmann-mn" \
	S3SDK_NODE_MODULES="$mods" exec node --no-warnings --test \
	--test-reporter=spec "$suite"
