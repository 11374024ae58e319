#!/bin/bash
# extract-vmlinux.sh: extract the uncompressed ELF vmlinux from an xz-compressed bzImage
# (Debian kernels use KERNEL_XZ). The ELF has the PVH entry note (CONFIG_PVH=y), so QEMU boots
# it directly with -kernel and skips the slow in-guest xz decompression under TCG.
set -euo pipefail
IN=${1:?vmlinuz}; OUT=${2:?vmlinux}
off=$(LC_ALL=C grep -abo $'\xfd7zXZ\x00' "$IN" | head -1 | cut -d: -f1)
[ -n "$off" ] || { echo "extract-vmlinux: no xz stream in $IN" >&2; exit 1; }
tail -c +$((off + 1)) "$IN" | xz -dc --single-stream > "$OUT" 2>/dev/null || true
[ "$(head -c 4 "$OUT" | tail -c 3)" = ELF ] || { echo "extract-vmlinux: extraction failed" >&2; exit 1; }
ls -la "$OUT"
