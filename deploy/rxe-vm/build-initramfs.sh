#!/bin/bash
# build-initramfs.sh: build the self-contained initramfs of the dmann soft-RoCE test VM:
# busybox, kmod, iproute2 (ip, rdma), rdma-core userland with the rxe verbs provider, the
# kernel modules soft-RoCE needs (with their dependency closure) and the test binaries with
# their shared-library closure.
#
# usage: build-initramfs.sh KVER MODROOT OUT.cpio.gz RUNNER [SRC:DST ...]
#   KVER     kernel version (lib/modules/KVER under MODROOT must have modules.dep)
#   MODROOT  root of the unpacked kernel package
#   RUNNER   script installed as /tests.sh (run by /init)
#   SRC:DST  host file copied to DST in the guest, with its ldd closure
set -euo pipefail
KVER=${1:?kernel version}
MODROOT=${2:?module root}
OUT=${3:?output}
RUNNER=${4:?runner script}
shift 4
HERE=$(cd "$(dirname "$0")" && pwd)
ST=$(mktemp -d "${TMPDIR:-/tmp}/dmann-initramfs.XXXXXX")
trap 'rm -rf "$ST"' EXIT

# merged-/usr layout like the host, so host library paths work unchanged
mkdir -p "$ST"/usr/{bin,sbin,lib,lib64} "$ST"/{proc,sys,dev,tmp,run,etc,root,mnt,var/tmp}
ln -s usr/bin "$ST/bin"; ln -s usr/sbin "$ST/sbin"; ln -s usr/lib "$ST/lib"; ln -s usr/lib64 "$ST/lib64"

# busybox and its applet links
cp /bin/busybox "$ST/usr/bin/busybox"
/bin/busybox --list | (cd "$ST/usr/bin" && xargs -r -n 200 /bin/busybox sh -c \
	'for a; do [ -e "$a" ] || ln -s busybox "$a"; done' sh)

# host files copied with their shared-library closure. libgcc_s is dlopened by glibc for
# pthread_cancel/exit (ldd does not list it); the rxe provider is dlopened by libibverbs.
FILES=(/usr/bin/kmod /usr/bin/ip /usr/bin/rdma /usr/lib/x86_64-linux-gnu/libgcc_s.so.1)
for b in ibv_devices ibv_devinfo etcd; do   # etcd: the cluster state of local clusters
	p=$(command -v "$b" || true)
	[ -n "$p" ] && FILES+=("$p")
done
shopt -s nullglob
PROV=(/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so)
shopt -u nullglob
if [ ${#PROV[@]} = 0 ] || [ ! -f /etc/libibverbs.d/rxe.driver ]; then
	echo "build-initramfs: the rxe verbs provider is missing (install ibverbs-providers)" >&2
	exit 1
fi
FILES+=("${PROV[@]}")
# libcurl is dlopened by the etcd client (common/etcd/etcd_curl.c): ldd of dmann does not list it
CURL=/usr/lib/x86_64-linux-gnu/libcurl.so.4
if [ ! -e "$CURL" ]; then
	echo "build-initramfs: $CURL is missing (install libcurl4-openssl-dev)" >&2
	exit 1
fi
FILES+=("$CURL")
mkdir -p "$ST/etc/libibverbs.d"
cp /etc/libibverbs.d/rxe.driver "$ST/etc/libibverbs.d/"
for e in "$@"; do FILES+=("${e%%:*}"); done
rm -f "$ST/usr/bin/ip" "$ST/usr/bin/rdma"      # iproute2's tools replace the applets
LIBS=$(ldd "${FILES[@]}" 2>/dev/null | awk '/=> \//{print $3} /^\t\/[^ ]+ \(/{print $1}' | sort -u)
# shellcheck disable=SC2086
cp --parents -L "${FILES[@]}" $LIBS "$ST/"
for e in "$@"; do
	mkdir -p "$ST$(dirname "${e#*:}")"
	cp "${e%%:*}" "$ST${e#*:}"
done
for a in modprobe insmod rmmod lsmod depmod modinfo; do
	rm -f "$ST/usr/bin/$a" "$ST/usr/sbin/$a"
	ln -s ../bin/kmod "$ST/usr/sbin/$a"
done

# kernel modules: the dependency closure of what init loads
MODS="rdma_rxe rdma_ucm ib_uverbs rdma_cm ib_cm iw_cm configfs virtio_pci virtio_net
      crc32_generic"
KOS=$(for m in $MODS; do modprobe -d "$MODROOT" -S "$KVER" --show-depends "$m"; done |
	awk '$1=="insmod"{print $2}' | sort -u)
MR=$(realpath "$MODROOT")
# shellcheck disable=SC2086
(cd "$MR" && cp --parents ${KOS//"$MR/"/} "$ST/usr/")
cp "$MR/lib/modules/$KVER"/modules.{order,builtin,builtin.modinfo} "$ST/usr/lib/modules/$KVER/"
depmod -b "$ST" "$KVER"

cp -a /etc/ld.so.conf /etc/ld.so.conf.d "$ST/etc/"
ldconfig -r "$ST"

install -m 0755 "$HERE/init" "$ST/init"
install -m 0755 "$RUNNER" "$ST/tests.sh"
(cd "$ST" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$OUT"
