#!/bin/sh
# install-deps.sh: install exactly what building, testing and benchmarking dmann need on a
# fresh Debian 12 (bookworm). Idempotent: packages already present are left alone.
# Run as root, or as a user who may sudo.
set -eu

PKGS="
  build-essential meson ninja-build pkg-config clang libclang-rt-14-dev
  libibverbs-dev librdmacm-dev rdma-core ibverbs-providers ibverbs-utils rdmacm-utils
  libnuma-dev libhugetlbfs-dev libopenblas-dev libssl-dev libinih-dev zlib1g-dev
  libcriterion-dev libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev etcd-server
  libhnswlib-dev libfaiss-dev python3 python3-matplotlib python3-numpy python3-dev
  dataset-fashion-mnist
  qemu-system-x86 busybox-static kmod iproute2 cpio bc
  ca-certificates procps openssl
"
# node + npm run the AWS SDK tests; a machine that already has node (any source) keeps it.
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs"
command -v npm >/dev/null 2>&1 || PKGS="$PKGS npm"

missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
if [ -z "$missing" ]; then
	echo "install-deps: all packages present"
	exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
	if ! command -v sudo >/dev/null 2>&1; then
		echo "install-deps: missing:$missing; run this script as root" >&2
		exit 1
	fi
	SUDO="sudo"
fi
echo "install-deps: installing$missing"
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
# shellcheck disable=SC2086
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
