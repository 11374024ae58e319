#!/bin/sh
# run.sh: meson test wrapper for the AWS SDK test (suite 'cluster'). Exits 77 (skip) with
# the reason when node or the npm modules are missing; install them with
#   ninja -C <builddir> s3sdk-deps      (npm ci into <builddir>/s3sdk-cache)
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${DMANN_BUILD_ROOT:?DMANN_BUILD_ROOT not set}
mods="$build/s3sdk-cache/node_modules"
bin="$build/cn/s3/dmann-s3"

if ! command -v node >/dev/null 2>&1; then
	echo "SKIP: node is not installed (Debian: apt-get install nodejs npm)"
	exit 77
fi
if [ ! -d "$mods/@aws-sdk/client-s3vectors" ]; then
	echo "SKIP: @aws-sdk/client-s3vectors is not installed in $mods;"
	echo "      run: ninja -C $build s3sdk-deps"
	exit 77
fi
if [ ! -x "$bin" ]; then
	echo "FAIL: $bin not built"
	exit 1
fi
DMANN_S3_BIN="$bin" S3SDK_NODE_MODULES="$mods" exec node --no-warnings --test \
	--test-reporter=spec "$here/s3sdk.test.js"
