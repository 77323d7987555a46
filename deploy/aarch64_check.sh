#!/usr/bin/env bash
# The Orin image's CPU half, proven on this x86-64 machine (README "Deploy", issue 12):
#  1. the C++ kernel library cross-compiles for armv8.2-a (Debian's g++-aarch64-linux-gnu) with
#     warnings as errors;
#  2. in a Debian bookworm arm64 root (debootstrap; cached as a tarball under /var/cache) run by
#     qemu-user-static, deploy/aarch64/harness.py (numpy + ctypes: the aarch64 torch wheel crashes
#     under qemu-user here) voxelizes a real frame, builds its kernel maps three ways and runs the
#     fused convolution, and compares everything with the x86-64 library's results: maps equal,
#     features within float tolerance.
# Needs root (debootstrap, chroot, binfmt_misc). The frame is read from ../shared and copied only
# into a temporary root that is deleted at exit.
#   bash deploy/aarch64_check.sh [FRAME.bin]
set -euo pipefail
cd "$(dirname "$0")/.."
FRAME=${1:-../shared/data/real/semantickitti/seq00_000000.bin}
PY=${PYTHON:-.venv/bin/python}
CACHE=${LIDARSEG_IMAGE_CACHE:-/var/cache/lidarseg-image}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
need=()
for tool in aarch64-linux-gnu-g++:g++-aarch64-linux-gnu qemu-aarch64-static:qemu-user-static \
            update-binfmts:binfmt-support debootstrap:debootstrap; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  update-binfmts --enable qemu-aarch64
fi
WORK=$(mktemp -d /var/tmp/lidarseg-aarch64.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
t0=$SECONDS

# 1. libraries: aarch64 (cross, -Werror) and the x86-64 reference (-Werror too)
ARM_LIB=$(CXX=aarch64-linux-gnu-g++ LIDARSEG_CXXFLAGS=-Werror LIDARSEG_BUILD_DIR="$WORK/lib" \
          "$PY" kernels/build.py --isa armv8.2-a)
X86_LIB=$(LIDARSEG_CXXFLAGS=-Werror LIDARSEG_BUILD_DIR="$WORK/lib" "$PY" kernels/build.py --isa x86-64-v3)
file -b "$ARM_LIB" | grep -q "ARM aarch64" || { echo "not an aarch64 library: $ARM_LIB" >&2; exit 1; }
echo "cross-compiled for armv8.2-a with -Werror: $(basename "$ARM_LIB") ($((SECONDS - t0)) s)"

# 2. the arm64 root (python3 + numpy + libgomp1), bootstrapped once per machine
ROOTFS="bookworm arm64 minbase python3,python3-numpy,libgomp1"  # what the cached root holds
KEY=$(echo "$ROOTFS" | sha256sum | cut -c1-12)
TARBALL=$CACHE/bookworm-arm64-numpy-$KEY.tar
if [ ! -f "$TARBALL" ]; then
  mkdir -p "$CACHE"
  t1=$SECONDS
  debootstrap --arch=arm64 --variant=minbase --include=python3,python3-numpy,libgomp1 \
    bookworm "$WORK/boot" "$MIRROR" >"$CACHE/debootstrap-arm64.log" 2>&1 \
    || { tail -30 "$CACHE/debootstrap-arm64.log" >&2; exit 1; }
  rm -rf "$WORK"/boot/var/cache/apt/archives/*.deb "$WORK"/boot/var/lib/apt/lists/*
  tar -C "$WORK/boot" --numeric-owner -cf "$TARBALL.partial" . && mv "$TARBALL.partial" "$TARBALL"
  rm -rf "$WORK/boot"
  echo "debootstrap arm64: $((SECONDS - t1)) s (cached in $TARBALL)"
fi
mkdir -p "$WORK/root" && tar -C "$WORK/root" -xf "$TARBALL"
mkdir -p "$WORK/root/check"
cp deploy/aarch64/harness.py "$ARM_LIB" "$WORK/root/check/"
cp "$FRAME" "$WORK/root/check/frame.bin"

# 3. x86-64 reference, then the same on aarch64 under qemu, compared
"$PY" deploy/aarch64/harness.py "$X86_LIB" "$FRAME" reference "$WORK/root/check/ref.npz"
t2=$SECONDS
chroot "$WORK/root" /usr/bin/python3 -c "import platform; print('chroot machine:', platform.machine())"
chroot "$WORK/root" /usr/bin/python3 /check/harness.py "/check/$(basename "$ARM_LIB")" \
  /check/frame.bin compare /check/ref.npz
echo "aarch64 run under qemu: $((SECONDS - t2)) s; whole check: $((SECONDS - t0)) s"
