#!/usr/bin/env bash
# Runs the built image's ENTRYPOINT + CMD as PID 1 of a new PID namespace, the way a container
# runtime starts it (buildah run --isolation chroot makes no PID namespace, so smoke.sh cannot
# show this), and stops it early, as `docker stop` or a kubelet does when a pod is deleted while
# it starts. The kernel drops every signal a namespace's PID 1 has no handler for, so a server
# that is PID 1 itself may ignore that SIGTERM, load its model and serve until the SIGKILL.
# Expected: the container ends within the wait and never answers /readyz.
#   bash deploy/image/pid1_check.sh [IMAGE] [DELAY_S]     # DELAY_S: SIGTERM after (0.5)
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${1:-localhost/lidarseg:cpu}
DELAY=${2:-0.5}
WAIT_S=60
PY=${PYTHON:-.venv/bin/python}
B=(buildah --storage-driver vfs)
if [ "$(id -u)" != 0 ]; then echo "pid1_check needs root (unshare, chroot)" >&2; exit 1; fi
PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
LOG=$(mktemp)
ctr=$("${B[@]}" from --pull-never -q "$IMAGE")
cleanup() {
  "${B[@]}" umount "$ctr" >/dev/null 2>&1 || true
  "${B[@]}" rm "$ctr" >/dev/null 2>&1 || true
  rm -f "$LOG"
}
trap cleanup EXIT
ROOT=$("${B[@]}" mount "$ctr")
"${B[@]}" inspect --type image "$IMAGE" >"$LOG"
config() {  # one field of the image's run configuration, a line per item
  "$PY" -c "import json, sys; c = json.load(open(sys.argv[1]))['Docker']['config']
v = c.get(sys.argv[2]) or []
print(*(v if isinstance(v, list) else [v]), sep='\n')" "$LOG" "$1"
}
mapfile -t CMD < <(config Entrypoint; config Cmd)
mapfile -t ENVS < <(config Env)
USER_ID=$(config User)
WORKDIR=$(config WorkingDir)
echo "image $IMAGE as PID 1: ${CMD[*]}"
# In a new mount namespace (gone with it): /proc of the new PID namespace, /dev and /sys; then
# the image's root, user, working directory and environment, and its command by exec, so the
# command is the namespace's PID 1.
unshare --fork --pid --mount --propagation private bash -c '
  root=$1 user=$2 dir=$3; shift 3
  mount -t proc proc "$root/proc" && mount --rbind /dev "$root/dev" \
    && mount --rbind /sys "$root/sys" || exit 125
  exec chroot --userspec="$user" "$root" /usr/bin/env -i -C "$dir" "$@"
' pid1 "$ROOT" "$USER_ID" "$WORKDIR" "${ENVS[@]}" "LIDARSEG_PORT=$PORT" "${CMD[@]}" \
  >"$LOG" 2>&1 &
runner=$!
sleep "$DELAY"
PID1=$(pgrep -P "$runner" | head -1)
[ -n "$PID1" ] || { echo "FAIL: no PID 1 found"; cat "$LOG"; exit 1; }
echo "SIGTERM to PID 1 ($(tr '\0' ' ' <"/proc/$PID1/cmdline")) after $DELAY s"
kill -TERM "$PID1"
t_term=$SECONDS
status=0
while kill -0 "$runner" 2>/dev/null; do
  if curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then
    echo "FAIL: ready $((SECONDS - t_term)) s after the SIGTERM: PID 1 dropped it"; status=1; break
  fi
  if [ $((SECONDS - t_term)) -ge $WAIT_S ]; then
    echo "FAIL: still running $WAIT_S s after the SIGTERM"; status=1; break
  fi
  sleep 0.2
done
if [ $status != 0 ]; then
  kill -KILL "$PID1" 2>/dev/null || true
  wait "$runner" 2>/dev/null || true
  tail -20 "$LOG"
  echo "pid1 check FAILED"; exit 1
fi
rc=0
wait "$runner" || rc=$?
echo "ended after $((SECONDS - t_term)) s with status $rc; its last lines:"
tail -3 "$LOG"
echo "pid1 check passed"
