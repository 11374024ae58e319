#!/bin/bash
# demo.sh: build dmann and run `dmann demo`: a local cluster of 2 memory nodes and 2 compute
# nodes, an HNSW index of Fashion-MNIST placed on the memory nodes, queries through the
# compute nodes with and without a cache, a summary; every process is stopped at the end.
# Needs the packages of deploy/install-deps.sh. Arguments are passed to `dmann demo`.
set -eu
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
	meson setup build --buildtype=release >/dev/null
fi
ninja -C build >/dev/null
exec build/cn/dmann demo "$@"
