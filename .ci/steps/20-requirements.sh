#!/usr/bin/env bash
# ci-lane: background
# The requirement sets resolve where the images run: Python 3.10 (JetPack 6), 3.11, 3.12 on
# x86-64 (glibc 2.36, Debian bookworm) and aarch64 (glibc 2.35, JetPack 6 / Ubuntu 22.04): pip's
# resolver against the package indexes, wheels only, nothing installed.
#
# pip evaluates environment markers for the running interpreter, not for --python-version and
# --platform, so the files are first flattened here with the target's marker values.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
flatten() {  # flatten FILE PYVER MACHINE > requirement lines for that target
  "$PY" - "$@" <<'PYEOF'
import sys
from pathlib import Path
from packaging.requirements import Requirement

path, pyver, machine = sys.argv[1:]
env = {"python_version": pyver, "python_full_version": pyver + ".0",
       "platform_machine": machine, "sys_platform": "linux", "platform_system": "Linux",
       "os_name": "posix", "implementation_name": "cpython"}

def lines(p: Path):
    for raw in p.read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r "):
            yield from lines(p.parent / line[3:].strip())
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            req.marker = None
            yield str(req)

print("\n".join(lines(Path(path))))
PYEOF
}
check() {  # check PYVER MACHINE GLIBC_MINOR FILE
  local reqs="$TMP/req-$1-$2-${4//\//_}"
  flatten "$4" "$1" "$2" >"$reqs.all"
  local plats=(--platform "manylinux2014_$2") glibc
  for glibc in $(seq 17 "$3"); do plats+=(--platform "manylinux_2_${glibc}_$2"); done
  # This machine's pip configuration (local wheel folders, caps) is left out: the public index
  # is what an image build elsewhere sees.
  local pip=(env PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS="" "$PY" -m pip)
  local target=(--only-binary=:all: --python-version "$1" "${plats[@]}")
  # torch: only that the pinned release has a wheel for the target (pip index, no download).
  # Resolving its dependencies would fetch gigabytes of CUDA wheels, and nothing else here
  # depends on torch; images bring their own or install the CPU wheel.
  local torch
  torch=$(grep -E '^torch==' "$reqs.all" | cut -d= -f3 || true)
  grep -vE '^torch==' "$reqs.all" >"$reqs"
  local versions
  versions=$("${pip[@]}" index versions torch "${target[@]}" 2>/dev/null || true)
  if [ -n "$torch" ] && ! grep -q "Available versions:.*\b${torch//./\\.}\b" <<<"$versions"; then
    echo "FAIL: $4 on Python $1 $2: no torch $torch wheel"; return 1
  fi
  if ! out=$("${pip[@]}" install --dry-run --quiet --ignore-installed --disable-pip-version-check \
      --target "$reqs.target" "${target[@]}" -r "$reqs" 2>&1); then
    echo "FAIL: $4 on Python $1 $2:"
    echo "$out" | grep -v "is ignored: it is neither\|Ignored the following versions" | tail -15
    return 1
  fi
  echo "ok: $4 on Python $1 $2${torch:+ (torch $torch: wheel found)}"
}
# The checks run in parallel (each is mostly waiting on the index); results in order.
run() { check "$@" >"$TMP/out-$1-$2-${4//\//_}" 2>&1 || echo 1 >"$TMP/failed-$1-$2-${4//\//_}"; }
for py in 3.10 3.11 3.12; do
  run "$py" x86_64 36 requirements.txt &
  run "$py" aarch64 35 requirements.txt &
done
# The Orin image: torch comes from the JetPack wheel index, the rest from here.
run 3.10 aarch64 35 requirements/jetson.txt &
wait
cat "$TMP"/out-*
if ls "$TMP"/failed-* >/dev/null 2>&1; then exit 1; fi
