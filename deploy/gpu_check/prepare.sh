#!/usr/bin/env bash
# Runs HERE (a machine with network access to PyPI), not on the GPU machine.
#
# Downloads the CUDA 12.6 build of spconv and everything `import spconv.pytorch` needs that the
# H200 image (torch, numpy, pytest, hypothesis) lacks, for CPython 3.12 on x86_64 Linux, unpacks
# the wheels into one site folder and packs it with xz into .gpu_carry/ (gitignored):
#   .gpu_carry/site-py312.tar.xz    spconv-cu126, cumm-cu126, pccm, ccimport, pybind11, fire,
#                                   termcolor, lark, portalocker, ninja
#   .gpu_carry/frames-real.tar.xz   the real frames the tests and benchmarks read
#   .gpu_carry/MANIFEST.txt         wheel names, sizes, sha256
# torch is NOT carried: the GPU machine brings its own (torch 2.11 + CUDA 13).
#
# Everything that travels to the GPU machine (the files git tracks or would track, plus the
# carry folder) must stay under 60 MiB (the device tool refuses 64 MiB): the script measures
# both at the end and, above that, deletes the archives and exits 1.
#
# Usage (from anywhere):  bash deploy/gpu_check/prepare.sh [PIP]
#   PIP defaults to .venv/bin/pip (any pip >= 21 works; `pip download` with --python-version
#   does not need Python 3.12 here).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PIP="${1:-$ROOT/.venv/bin/pip}"
CARRY="$ROOT/.gpu_carry"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$CARRY" "$WORK/wheels" "$WORK/site"
T0=$(date +%s)
LIMIT=$((60 * 1024 * 1024))

PY=3.12
# spconv/cumm cu126 wheels are tagged manylinux 2014 (= 2_17) and/or 2_28 depending on release;
# pip accepts several --platform flags and takes whichever the index has.
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)
COMMON=(download --no-deps --disable-pip-version-check --python-version "$PY"
        --implementation cp --only-binary=:all: "${PLATFORMS[@]}" -d "$WORK/wheels")

fail=0
get() {  # get SPEC...: download wheels, report the exact error on failure
  if ! "$PIP" "${COMMON[@]}" "$@" >"$WORK/pip.log" 2>&1; then
    echo "ERROR: pip download $* failed:" >&2
    cat "$WORK/pip.log" >&2
    fail=1
  fi
}

# Pins: the versions this repo's CPU venv runs (requirements.txt: spconv 2.3.8, cumm 0.7.11).
get "spconv-cu126==2.3.8"
get "cumm-cu126==0.7.11"
# Runtime imports of `import spconv.pytorch` (checked with sys.modules on the CPU build):
# ccimport, cumm, lark, ninja, pccm, pybind11, spconv; plus fire/termcolor/portalocker declared
# in the metadata (Requires-Dist of spconv, cumm, pccm, ccimport, fire).
get "pccm>=0.4.16" "ccimport>=0.4.4" "pybind11>=2.6.0" fire termcolor "lark>=1.0.0" \
    "portalocker>=2.3.2" ninja
[ "$fail" = 0 ] || { echo "prepare.sh: some downloads failed, nothing packed" >&2; exit 1; }

{
  echo "# prepared $(date -u +%Y-%m-%dT%H:%M:%SZ) for CPython $PY x86_64"
  for w in "$WORK"/wheels/*.whl; do
    [ -e "$w" ] || continue
    printf '%s %s %s\n' "$(basename "$w")" "$(stat -c %s "$w")" "$(sha256sum "$w" | cut -d' ' -f1)"
  done
} >"$CARRY/MANIFEST.txt"

# A wheel is a zip of its site-packages tree: unzipping is installing (no scripts needed).
PYTHON="${PYTHON:-python3}"
unzip_to() { "$PYTHON" - "$@" <<'PYEOF'
import sys, zipfile
dest = sys.argv[1]
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(dest)
PYEOF
}
unzip_to "$WORK/site" "$WORK"/wheels/*.whl
# Byte code is rebuilt on first import.
find "$WORK/site" -name '__pycache__' -type d -prune -exec rm -rf {} +
# The H200 runs sm_90 code: blank the other GPUs' machine code in spconv's library (same size
# and layout, the zeros compress away; strip_fatbin.py says why that is safe). GPU_ARCH=0 keeps
# everything (then the carry is over the limit).
if [ "${GPU_ARCH:-90}" != 0 ]; then
  "$PYTHON" "$ROOT/deploy/gpu_check/strip_fatbin.py" --arch "${GPU_ARCH:-90}" \
      "$WORK"/site/spconv/core_cc*.so || { echo "prepare.sh: strip_fatbin failed" >&2; exit 1; }
fi

rm -f "$CARRY"/*.tar.xz
XZ_OPT=-9e tar -C "$WORK/site" -cJf "$CARRY/site-py312.tar.xz" .
# The real frames the tests, bench.layers and the tuner read (repo_root.parent/shared/data/real here; the GPU
# machine gets only the repo). They go into the gitignored carry folder, never into tracked
# files; run.sh unpacks them outside the repo. NO_FRAMES=1 skips this (then the GPU bench has no
# data and its step fails).
DATA="${DATA:-$ROOT/../shared/data/real}"
# The frames tests/conftest.py lists (the bench and tuner use a subset of them).
FRAMES=(semantickitti/seq00_000000.bin semantickitti/spvnas_000000.bin
        semantickitti/seq00_000000_subset50.bin
        "nuscenes/n015-2018-07-24-11-22-45+0800__LIDAR_TOP__1532402927647951.pcd.bin"
        ouster/os1-128_lb_n3_scan0_xyzr.bin)
if [ "${NO_FRAMES:-0}" != 1 ]; then
  if ! XZ_OPT=-9 tar -C "$DATA" -cJf "$CARRY/frames-real.tar.xz" "${FRAMES[@]}"; then
    echo "WARNING: could not pack the real frames from $DATA" >&2
    rm -f "$CARRY/frames-real.tar.xz"
  fi
fi
echo "== wheels"; cat "$CARRY/MANIFEST.txt"
echo "== unpacked site: $(du -sh "$WORK/site" | cut -f1)"
echo "== carry"; ls -l "$CARRY"
# What travels: tracked files and untracked ones git does not ignore, plus the carry folder.
repo=$(git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
       | (cd "$ROOT" && du -cb --files0-from=- 2>/dev/null) | tail -1 | cut -f1)
carry=$(du -cb "$CARRY"/* | tail -1 | cut -f1)
total=$((repo + carry))
echo "== travels: repo files $repo + carry $carry = $total bytes (limit $LIMIT = 60 MiB)"
echo "== prepare.sh took $(( $(date +%s) - T0 )) s"
if [ "$total" -gt "$LIMIT" ]; then
  echo "ERROR: $total bytes would travel, over 60 MiB: archives removed, nothing to carry" >&2
  rm -f "$CARRY"/*.tar.xz
  exit 1
fi
