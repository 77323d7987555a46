#!/usr/bin/env bash
# The prepared GPU check. Runs ON THE GPU MACHINE (no network), from the repo root, with the
# carried .gpu_carry/ (made here by deploy/gpu_check/prepare.sh). Everything goes to $OUT
# (at most 8 files come back from the device tool, so the logs are grouped):
#   summary.txt      one line per step: name, exit code (124 = hit its timeout), seconds; notes
#   nvidia-smi.txt   nvidia-smi
#   setup.log        unpacking, Python/torch/CUDA/nvcc/spconv probe, kernel build (python -m
#                    kernels.build and build_cuda() explicitly)
#   pytest_cuda.log  python -m pytest -q tests -k "cuda or CUDA"
#   bench_cuda.txt   python -m bench.layers --device cuda (then the CUDA tuner's output)
#   bench_cuda.json  its figures
#   pytest_all.log   the whole suite (only if time is left)
#   grouping.json    kernels/tuned/grouping.json with cuda entries from bench.tuner (if time)
# Total budget: 8 minutes (BUDGET_S), every step under `timeout`; a failing step is logged and
# the script goes on. Exit code: 0 only if every step that ran passed.
set -u
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/gpu_check_out}"
mkdir -p "$OUT"
BUDGET_S="${BUDGET_S:-480}"
T0=$(date +%s)
SUMMARY="$OUT/summary.txt"
SETUP="$OUT/setup.log"
: >"$SUMMARY"; : >"$SETUP"
FAILED=0
LINKED=""

note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
# step NAME CAP_S LOG CMD...: runs CMD under timeout min(CAP_S, time left - 10), appends its
# output to LOG, logs the exit code. Skips (rc=skip) when under 30 s would be left.
step() {
  local name="$1" cap="$2" log="$3"; shift 3
  local budget; budget=$(( $(left) - 10 ))
  [ "$budget" -lt "$cap" ] && cap="$budget"
  if [ "$cap" -lt 30 ]; then
    note "$(printf '%-14s rc=skip (only %ss of the budget left)' "$name" "$(left)")"
    return 0
  fi
  local s; s=$(date +%s)
  echo "===== $name: $* (timeout ${cap}s)" >>"$log"
  timeout --kill-after=10 "$cap" "$@" >>"$log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - s ))
  local msg=""
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && msg=" (timed out after ${cap}s)"
  note "$(printf '%-14s rc=%s %ss%s  -> %s' "$name" "$rc" "$dt" "$msg" "$(basename "$log")")"
  [ "$rc" = 0 ] || FAILED=1
  return "$rc"
}

note "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) repo=$ROOT budget=${BUDGET_S}s"
git -C "$ROOT" log -1 --format='commit %H %s' 2>/dev/null | tee -a "$SUMMARY" >/dev/null
git -C "$ROOT" status --short 2>/dev/null | head -20 | sed 's/^/  dirty: /' >>"$SUMMARY"

# ---- nvidia-smi
step nvidia-smi 30 "$OUT/nvidia-smi.txt" nvidia-smi

# ---- Python with torch
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3 python python3.12; do
    if command -v "$cand" >/dev/null && "$cand" -c "import torch" >/dev/null 2>&1; then
      PY="$cand"; break
    fi
  done
fi
if [ -z "$PY" ]; then
  note "FATAL: no python with torch found (tried python3, python, python3.12; set PYTHON=)"
  exit 1
fi
note "python: $(command -v "$PY") $("$PY" -c 'import sys; print(sys.version.split()[0])')"

# ---- unpack the carried site packages (spconv-cu126 ...) outside the repo
CARRY="$ROOT/.gpu_carry"
SITE="$(mktemp -d /tmp/gpu_check_site.XXXX)"
DATA="$(mktemp -d /tmp/gpu_check_data.XXXX)"
if [ -f "$CARRY/site-py312.tar.xz" ]; then
  step unpack-site 120 "$SETUP" tar -C "$SITE" -xJf "$CARRY/site-py312.tar.xz"
else
  note "unpack-site    rc=missing: $CARRY/site-py312.tar.xz not carried (carry [\".gpu_carry\"]);" \
       "spconv comparisons will be skipped"
  FAILED=1
fi
EXTRA=""
if ! "$PY" -c "import numpy" >/dev/null 2>&1 && [ -f "$CARRY/numpy-py312.tar.xz" ]; then
  mkdir -p "$SITE/_numpy"
  step unpack-numpy 60 "$SETUP" tar -C "$SITE/_numpy" -xJf "$CARRY/numpy-py312.tar.xz"
  EXTRA="$EXTRA:$SITE/_numpy"
fi
if ! "$PY" -c "import pytest, hypothesis" >/dev/null 2>&1 && [ -f "$CARRY/testdeps-py3.tar.xz" ]; then
  mkdir -p "$SITE/_testdeps"
  step unpack-tests 60 "$SETUP" tar -C "$SITE/_testdeps" -xJf "$CARRY/testdeps-py3.tar.xz"
  EXTRA="$EXTRA:$SITE/_testdeps"
fi
export PYTHONPATH="$ROOT:$SITE$EXTRA${PYTHONPATH:+:$PYTHONPATH}"
if [ -f "$CARRY/frames-real.tar.xz" ]; then
  step unpack-frames 60 "$SETUP" tar -C "$DATA" -xJf "$CARRY/frames-real.tar.xz"
  # tests/conftest.py reads repo_root.parent/shared/data/real (skips when missing): point it there
  REAL="$ROOT/../shared/data/real"
  if [ ! -e "$REAL" ] && mkdir -p "$(dirname "$REAL")" 2>/dev/null && ln -s "$DATA" "$REAL"; then
    note "frames: linked $REAL -> $DATA for the tests"
    LINKED="$REAL"
  fi
else
  note "unpack-frames  rc=missing: $CARRY/frames-real.tar.xz not carried; bench will fail"
  FAILED=1
fi
export LIDARSEG_BUILD_DIR="${LIDARSEG_BUILD_DIR:-/tmp/lidarseg_build}"

# ---- environment probe (a tiny spconv CUDA conv proves the carried wheel loads and runs)
step probe 90 "$SETUP" "$PY" - <<'EOF'
import shutil, sys, torch
print("python", sys.version)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
from kernels import build
print("nvcc", build.nvcc_path())
import spconv, spconv.pytorch as sp
from spconv.cppconstants import CPU_ONLY_BUILD
print("spconv", spconv.__version__, spconv.__file__, "cpu_only_build", CPU_ONLY_BUILD)
idx = torch.tensor([[0, 1, 1, 1], [0, 1, 2, 1], [0, 2, 2, 2]], dtype=torch.int32, device="cuda")
x = sp.SparseConvTensor(torch.ones(3, 4, device="cuda"), idx, [8, 8, 8], 1)
y = sp.SubMConv3d(4, 4, 3, bias=False).cuda()(x)
torch.cuda.synchronize()
print("spconv cuda SubMConv3d ok", tuple(y.features.shape))
EOF

# ---- build the CUDA kernels (nvcc, this GPU's arch)
step build 240 "$SETUP" "$PY" -m kernels.build
step build-cuda 240 "$SETUP" "$PY" -c "from kernels import build; print(build.build_cuda())"

# ---- CUDA tests, bench, whole suite, CUDA tuning
step pytest-cuda 150 "$OUT/pytest_cuda.log" "$PY" -m pytest -q -rs tests -k "cuda or CUDA"
step bench 200 "$OUT/bench_cuda.txt" "$PY" -m bench.layers --device cuda --data "$DATA" \
  --json "$OUT/bench_cuda.json"
step bench-minkunet 120 "$OUT/bench_cuda.txt" "$PY" -m bench.minkunet --device cuda \
  --frames kitti00 --runs 3
step pytest-all 240 "$OUT/pytest_all.log" "$PY" -m pytest -q -rs tests \
  --durations=10
cp "$ROOT/kernels/tuned/grouping.json" "$OUT/grouping.json" 2>/dev/null || true
step tuner-cuda 120 "$OUT/bench_cuda.txt" "$PY" -m bench.tuner --device cuda --data "$DATA" \
  --runs 5 --out "$OUT/grouping.json"

note "total $(( $(date +%s) - T0 ))s; failed=$FAILED"
[ -n "${LINKED:-}" ] && rm -f "$LINKED"
rm -rf "$SITE" "$DATA"
exit "$FAILED"
