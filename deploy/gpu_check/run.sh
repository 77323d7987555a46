#!/usr/bin/env bash
# The prepared GPU check. Runs ON THE GPU MACHINE (no network), from the repo root, with the
# carried .gpu_carry/ (made here by deploy/gpu_check/prepare.sh); deploy/gpu_check/README.md
# lists the steps and what comes back in $OUT. Budget BUDGET_S (420 s), every step under
# `timeout`; a failing step is logged and the script goes on. Exit code: 0 only if every step
# that ran passed.
#
# PACK=1: at the end, every file in $OUT but summary.txt goes into $OUT/gpu_check_logs.tar.gz
# (the device tool brings back at most 8 files; the check writes 10).
#
# DRY_RUN=1 (or --dry-run): on a machine without a GPU, run every step that needs none for real
# (unpacking, probe, builds with the sm_87/sm_90 compile check, the CUDA tests, which must skip
# cleanly, collection of the whole suite through skip_missing.py) and name the GPU steps it
# leaves out (rc=dry).
set -u
cd "$(dirname "$0")/../.."
ROOT="$PWD"
DRY_RUN="${DRY_RUN:-0}"
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
OUT="${OUT:-$ROOT/gpu_check_out}"
mkdir -p "$OUT"
BUDGET_S="${BUDGET_S:-420}"
PACK="${PACK:-0}"  # 1: pack every file but summary.txt into one archive (the device tool returns 8 files)
CAP_SCALE="${CAP_SCALE:-1}"  # multiplies every step's cap (a slow dry-run machine)
T0=$(date +%s)
SUMMARY="$OUT/summary.txt"
SETUP="$OUT/setup.log"
: >"$SUMMARY"; : >"$SETUP"
FAILED=0
LINKED=""

note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
# step NAME CAP_S LOG CMD...: runs CMD under timeout min(CAP_S, time left - 10), appends its
# output to LOG, logs the exit code. Skips (rc=skip) when the budget cut the cap below 20 s.
step() {
  local name="$1" cap=$(( $2 * CAP_SCALE )) log="$3"; shift 3
  local budget; budget=$(( $(left) - 10 ))
  local want="$cap"
  [ "$budget" -lt "$cap" ] && cap="$budget"
  if [ "$cap" -lt "$want" ] && [ "$cap" -lt 20 ]; then
    note "$(printf '%-14s rc=skip (only %ss of the budget left)' "$name" "$(left)")"
    return 0
  fi
  local s; s=$(date +%s)
  echo "===== $name: $* (timeout ${cap}s)" >>"$log"
  timeout --kill-after=10 "$cap" "$@" >>"$log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - s ))
  local msg=""
  { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && msg=" (timed out after ${cap}s)"
  note "$(printf '%-14s rc=%s %ss%s  -> %s' "$name" "$rc" "$dt" "$msg" "$(basename "$log")")"
  [ "$rc" = 0 ] || FAILED=1
  return "$rc"
}
# gpu_step NAME CAP LOG CMD...: a step that needs the GPU; a dry run only names it.
gpu_step() {
  if [ "$DRY_RUN" = 1 ]; then
    note "$(printf '%-14s rc=dry (needs a GPU): %s' "$1" "${*:4}")"
    return 0
  fi
  step "$@"
}

note "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) repo=$ROOT budget=${BUDGET_S}s dry_run=$DRY_RUN"
git -C "$ROOT" log -1 --format='commit %H %s' 2>/dev/null | tee -a "$SUMMARY" >/dev/null
git -C "$ROOT" status --short 2>/dev/null | head -20 | sed 's/^/  dirty: /' >>"$SUMMARY"

gpu_step nvidia-smi 15 "$OUT/nvidia-smi.txt" nvidia-smi

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
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
note "python: $(command -v "$PY") $PYVER"

# ---- the carried spconv-cu126 site and real frames, unpacked outside the repo
CARRY="${CARRY:-$ROOT/.gpu_carry}"
SITE="$(mktemp -d /tmp/gpu_check_site.XXXX)"
DATA="$(mktemp -d /tmp/gpu_check_data.XXXX)"
if [ -f "$CARRY/site-py312.tar.xz" ]; then
  step unpack-site 60 "$SETUP" tar -C "$SITE" -xJf "$CARRY/site-py312.tar.xz"
else
  note "unpack-site    rc=missing: $CARRY/site-py312.tar.xz not carried; spconv checks skip"
  [ "$DRY_RUN" = 1 ] || FAILED=1
fi
# The site is built for CPython 3.12 (the H200 image); on another Python it would shadow a
# working spconv, so it goes on the path only there.
SITE_PATH=""
[ "$PYVER" = 3.12 ] && SITE_PATH=":$SITE"
export PYTHONPATH="$ROOT$SITE_PATH${PYTHONPATH:+:$PYTHONPATH}"
if [ -f "$CARRY/frames-real.tar.xz" ]; then
  step unpack-frames 30 "$SETUP" tar -C "$DATA" -xJf "$CARRY/frames-real.tar.xz"
  # tests/conftest.py reads repo_root.parent/shared/data/real (skips when missing): point it there
  REAL="$ROOT/../shared/data/real"
  if [ ! -e "$REAL" ] && mkdir -p "$(dirname "$REAL")" 2>/dev/null && ln -s "$DATA" "$REAL"; then
    note "frames: linked $REAL -> $DATA for the tests"
    LINKED="$REAL"
  fi
else
  note "unpack-frames  rc=missing: $CARRY/frames-real.tar.xz not carried; frame tests skip"
  [ "$DRY_RUN" = 1 ] || FAILED=1
fi
export LIDARSEG_BUILD_DIR="${LIDARSEG_BUILD_DIR:-/tmp/lidarseg_build}"

# ---- environment probe (a tiny spconv CUDA conv proves the carried wheel loads and runs)
step probe 60 "$SETUP" "$PY" - <<'EOF'
import shutil, sys, torch
print("python", sys.version)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
from kernels import toolchain
print("nvcc", toolchain.nvcc_path(), "compute-sanitizer", shutil.which("compute-sanitizer"))
try:
    import spconv, spconv.pytorch as sp
    print("spconv", spconv.__version__, spconv.__file__)
except ImportError as e:
    print("spconv missing:", e)
    sp = None
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability(),
          "free/total MiB", [v >> 20 for v in torch.cuda.mem_get_info()])
    if sp is not None:
        idx = torch.tensor([[0, 1, 1, 1], [0, 1, 2, 1], [0, 2, 2, 2]], dtype=torch.int32,
                           device="cuda")
        x = sp.SparseConvTensor(torch.ones(3, 4, device="cuda"), idx, [8, 8, 8], 1)
        y = sp.SubMConv3d(4, 4, 3, bias=False).cuda()(x)
        torch.cuda.synchronize()
        print("spconv cuda SubMConv3d ok", tuple(y.features.shape))
if sp is not None:  # the CPU references name the Native algorithm (models/spconv_compat.py)
    idx = torch.tensor([[0, 1, 1, 1], [0, 1, 2, 1], [0, 2, 2, 2]], dtype=torch.int32)
    x = sp.SparseConvTensor(torch.ones(3, 4), idx, [8, 8, 8], 1)
    y = sp.SubMConv3d(4, 4, 3, bias=False, algo=sp.ConvAlgo.Native)(x)
    print("spconv cpu SubMConv3d (Native) ok", tuple(y.features.shape))
EOF

# ---- kernels: the CPU library, and the CUDA one for this GPU (a dry run compile-checks 87, 90)
step build 150 "$SETUP" "$PY" -m kernels.build
if [ "$DRY_RUN" = 1 ]; then
  step build-cuda 150 "$SETUP" "$PY" -m kernels.build --cuda-only --cuda-arch 87 90
fi

# ---- 1. the CUDA tests (in a dry run they must all skip cleanly)
step pytest-cuda 120 "$OUT/pytest_cuda.log" "$PY" -m pytest -q -rs tests/kernels tests/models \
  -k "cuda or CUDA"

# ---- 2. compute-sanitizer memcheck on the small CUDA tests, instrumenting our kernels only
#      (they live in namespace lidarseg; torch's kernels run uninstrumented, and the CUDA API
#      errors torch provokes on purpose while probing the device are not reported)
MEMCHECK_TESTS=(tests/kernels/test_kmap.py tests/kernels/test_engine.py
                tests/kernels/test_bindings.py tests/kernels/test_chunking.py)
MEMCHECK_K="cuda and not oracle and not gradcheck"
SANITIZER="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
if [ -z "$SANITIZER" ] && [ "$DRY_RUN" != 1 ]; then
  note "memcheck       rc=missing: compute-sanitizer not found (PATH, /usr/local/cuda/bin)"
  FAILED=1
else
  # No caching allocator, so an access past a tensor's end is outside any allocation.
  gpu_step memcheck 90 "$OUT/memcheck.log" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    "${SANITIZER:-compute-sanitizer}" --tool memcheck \
    --target-processes all --kernel-name kns=lidarseg --report-api-errors no \
    --error-exitcode 3 --print-limit 20 \
    "$PY" -m pytest -q -x "${MEMCHECK_TESTS[@]}" -k "$MEMCHECK_K"
fi

# ---- 3. benchmarks: layers fp32 and fp16 ours vs spconv-cu126, then the whole network
if [ "$DRY_RUN" = 1 ]; then
  step bench-import 30 "$OUT/bench_cuda.txt" "$PY" -m bench.layers --help
fi
gpu_step bench 90 "$OUT/bench_cuda.txt" "$PY" -m bench.layers --device cuda --data "$DATA" \
  --json "$OUT/bench_cuda.json"
gpu_step bench-minkunet 60 "$OUT/bench_cuda.txt" "$PY" -m bench.minkunet --device cuda \
  --frames kitti00 --runs 3

# ---- 3b. where a CUDA forward's time goes (torch.profiler over the pipeline on kitti00)
PROFILE=(env "PYTHONPATH=$ROOT:${PYTHONPATH:-}" "$PY" deploy/gpu_check/cuda_profile.py)
if [ "$DRY_RUN" = 1 ]; then
  step profile-import 30 "$OUT/profile.txt" "${PROFILE[@]}" --help
fi
gpu_step profile 60 "$OUT/profile.txt" "${PROFILE[@]}" \
  --frame "$DATA/semantickitti/seq00_000000.bin" --runs 3

# ---- 4. the whole suite, leaving out (and naming) test files whose packages the image lacks
ALL=(env "PYTHONPATH=$ROOT/deploy/gpu_check:$PYTHONPATH" "$PY" -m pytest -q -rs tests
     -p skip_missing --continue-on-collection-errors --durations=10)
[ "$DRY_RUN" = 1 ] && ALL+=(--collect-only)
step pytest-all 240 "$OUT/pytest_all.log" "${ALL[@]}"

# ---- 5. CUDA grouping tuning, merged into a copy of kernels/tuned/grouping.json (if time)
cp "$ROOT/kernels/tuned/grouping.json" "$OUT/grouping.json" 2>/dev/null || true
gpu_step tuner-cuda 90 "$OUT/bench_cuda.txt" "$PY" -m bench.tuner --device cuda --data "$DATA" \
  --runs 3 --out "$OUT/grouping.json"

note "total $(( $(date +%s) - T0 ))s; failed=$FAILED"
if [ "$PACK" = 1 ]; then
  (cd "$OUT" && find . -maxdepth 1 -type f ! -name summary.txt ! -name gpu_check_logs.tar.gz \
     -printf '%f\n' | tar -czf gpu_check_logs.tar.gz --remove-files -T -)
fi
[ -n "${LINKED:-}" ] && rm -f "$LINKED"
rm -rf "$SITE" "$DATA"
exit "$FAILED"
