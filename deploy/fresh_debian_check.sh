#!/usr/bin/env bash
# The README's two commands on a bare Debian bookworm: a debootstrap minbase root with python3
# and nothing else (no g++, no python3-venv, no libEGL, no git), a clone of this checkout in it
# and ../shared bind-mounted read-only beside it. Command 1 (set-up, then the service: ready, a
# frame through `python -m app client`, /v1/model's engine, SIGTERM) and command 2 (set-up
# again, then the whole test suite), each as the README gives it. Needs root (debootstrap,
# chroot, bind mounts) and 10-15 minutes; not part of CI (.ci/run's time budget).
#   sudo bash deploy/fresh_debian_check.sh [OUT]
# OUT (default /tmp/fresh_debian_check) receives debootstrap.log, command1.log, command2.log.
# pip inside the root uses this machine's PIP_CERT and PIP_FIND_LINKS where they are set (the
# bundle is copied to /etc/host-ca.crt there: apt's ca-certificates rewrites the system one).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/fresh_debian_check}
ROOT=$(mktemp -d /tmp/fresh-debian.XXXX)
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
MOUNTS=(proc sys dev work/shared)
mkdir -p "$OUT"
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
cleanup() {
  for m in "${MOUNTS[@]}" opt/wheels; do umount -R "$ROOT/$m" 2>/dev/null || true; done
  if mount | grep -q " $ROOT/"; then echo "mounts remain under $ROOT: left in place" >&2; return; fi
  rm -rf "$ROOT"
}
trap cleanup EXIT
echo "debootstrap into $ROOT"
debootstrap --variant=minbase --include=python3 bookworm "$ROOT" "$MIRROR" >"$OUT/debootstrap.log" 2>&1
cp /etc/resolv.conf "$ROOT/etc/"
mkdir -p "$ROOT/work/shared" "$ROOT/opt/wheels"
for m in proc sys dev; do mount --bind "/$m" "$ROOT/$m"; done
mount --bind ../shared "$ROOT/work/shared"
mount -o remount,bind,ro "$ROOT/work/shared"
ENV=(HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
if [ -n "${PIP_CERT:-}" ]; then
  cp "$PIP_CERT" "$ROOT/etc/host-ca.crt"
  ENV+=(PIP_CERT=/etc/host-ca.crt)
fi
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ]; then
  mount --bind "$PIP_FIND_LINKS" "$ROOT/opt/wheels"
  ENV+=(PIP_FIND_LINKS=/opt/wheels)
fi
git clone -q . "$ROOT/work/main"
in_root() { chroot "$ROOT" /usr/bin/env -i "${ENV[@]}" bash -c "cd /work/main && $1"; }
# shellcheck disable=SC2016  # expanded inside the root
command1='bash deploy/setup.sh && { .venv/bin/python -m app >/tmp/serve.log 2>&1 & pid=$!
  ready() { .venv/bin/python -c "import httpx, sys
sys.exit(httpx.get(\"http://127.0.0.1:8000/readyz\").status_code != 200)" 2>/dev/null; }
  for i in $(seq 300); do sleep 1; ready && break; done; echo "ready after $i s"
  .venv/bin/python -m app client ../shared/data/real/semantickitti/seq00_000000.bin \
    --url http://127.0.0.1:8000 | tail -3
  .venv/bin/python -c "import httpx
print(httpx.get(\"http://127.0.0.1:8000/v1/model\").json()[\"engine\"])"
  kill -TERM $pid; wait $pid; echo "server exit status $?"; }'
status=0
echo "command 1 (set-up, the service)"
in_root "$command1" >"$OUT/command1.log" 2>&1 || status=1
grep -E "ready after|timing_ms|voxelizer|exit status" "$OUT/command1.log" || true
echo "command 2 (set-up, the tests)"
in_root 'bash deploy/setup.sh && .venv/bin/python -m pytest -q -rs -p no:cacheprovider' \
  >"$OUT/command2.log" 2>&1 || status=1
tail -1 "$OUT/command2.log"
grep -q "'voxelizer': 'open3d'" "$OUT/command1.log" || { echo "FAIL: not voxelizing with Open3D"; status=1; }
[ $status = 0 ] && echo "fresh Debian check passed" || echo "fresh Debian check FAILED (logs: $OUT)"
exit $status
