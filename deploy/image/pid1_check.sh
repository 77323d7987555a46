#!/usr/bin/env bash
# Runs the built image's ENTRYPOINT + CMD as PID 1 of a new PID namespace, the way a container
# runtime starts it (buildah run --isolation chroot makes no PID namespace, so smoke.sh cannot
# show this), and stops it early, as `docker stop` or a kubelet does when a pod is deleted while
# it starts. The kernel drops every signal a namespace's PID 1 has no handler for, so a server
# that is PID 1 itself may ignore a SIGTERM (python's first milliseconds, before
# app/stop_signals.py holds it; any subcommand but serve) and serve on until the SIGKILL.
# Expected: PID 1 is an init (tini) that has started the server as its child; a SIGTERM to PID 1
# DELAY_S after that ends the container without it ever answering /readyz, with status 0 (the
# server held the signal and exited) or 143 (it had no handler yet; tini passes that on).
#   bash deploy/image/pid1_check.sh [IMAGE] [DELAY_S]     # DELAY_S: SIGTERM after (0.5)
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${1:-localhost/lidarseg:cpu}
DELAY=${2:-0.5}
WAIT_S=300  # as the pods' startup probe: a loaded machine imports torch slowly
PY=${PYTHON:-.venv/bin/python}
B=(buildah --storage-driver vfs)
if [ "$(id -u)" != 0 ]; then echo "pid1_check needs root (unshare, chroot)" >&2; exit 1; fi
PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
LOG=$(mktemp)
runner=""
ctr=$("${B[@]}" from --pull-never -q "$IMAGE")
child_of() { pgrep -P "$1" 2>/dev/null | head -1 || true; }
args_of() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true; }
cleanup() {
  # the namespace's PID 1 first: every process in the namespace dies with it (unshare's
  # --kill-child alone does not reach it once chroot --userspec has changed its user)
  if [ -n "$runner" ]; then
    ns_init=$(child_of "$runner")
    if [ -n "$ns_init" ]; then kill -KILL "$ns_init" 2>/dev/null || true; fi
    kill -KILL "$runner" 2>/dev/null || true
    wait "$runner" 2>/dev/null || true
  fi
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
unshare --fork --kill-child --pid --mount --propagation private bash -c '
  root=$1 user=$2 dir=$3; shift 3
  mount -t proc proc "$root/proc" && mount --rbind /dev "$root/dev" \
    && mount --rbind /sys "$root/sys" || exit 125
  exec chroot --userspec="$user" "$root" /usr/bin/env -i -C "${dir:-/}" "$@"
' pid1 "$ROOT" "${USER_ID:-0}" "$WORKDIR" "${ENVS[@]}" "LIDARSEG_PORT=$PORT" "${CMD[@]}" \
  >"$LOG" 2>&1 &
runner=$!
# PID 1 runs bash, chroot and env before the image's command: wait until it is that command, and
# until that command has a child (an init blocks the signals it passes on before it starts one,
# at once: 5 s is plenty)
PID1="" child="" t_start=$SECONDS t_cmd=""
while [ $((SECONDS - t_start)) -lt $WAIT_S ] && kill -0 "$runner" 2>/dev/null; do
  PID1=$(child_of "$runner")
  if [ -n "$PID1" ] && [ "$(args_of "$PID1")" = "${CMD[*]} " ]; then
    t_cmd=${t_cmd:-$SECONDS}
    child=$(child_of "$PID1")
    if [ -n "$child" ] || [ $((SECONDS - t_cmd)) -ge 5 ]; then break; fi
  fi
  sleep 0.05
done
if [ -z "$child" ]; then
  if [ -n "$PID1" ] && [ "$(args_of "$PID1")" = "${CMD[*]} " ]; then
    echo "FAIL: PID 1 ($(args_of "$PID1")) is the server itself, not an init that runs it as"
    echo "  its child: a signal it has no handler for yet is dropped"
  else
    echo "FAIL: the image's command never became PID 1"; tail -20 "$LOG"
  fi
  exit 1
fi
sleep "$DELAY"
echo "PID 1: $(args_of "$PID1")- its child: $(args_of "$child")"
echo "SIGTERM to PID 1 after $DELAY s"
kill -TERM "$PID1"
t_term=$SECONDS
while kill -0 "$runner" 2>/dev/null; do
  if curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then
    echo "FAIL: ready $((SECONDS - t_term)) s after the SIGTERM: it was dropped"
    tail -20 "$LOG"; exit 1
  fi
  if [ $((SECONDS - t_term)) -ge $WAIT_S ]; then
    echo "FAIL: still running $WAIT_S s after the SIGTERM"; tail -20 "$LOG"; exit 1
  fi
  sleep 0.2
done
rc=0
wait "$runner" || rc=$?
runner=""
echo "ended after $((SECONDS - t_term)) s with status $rc; its last lines:"
tail -3 "$LOG"
case $rc in
  0 | 143) echo "pid1 check passed" ;;
  *) echo "FAIL: status $rc (0: the server held the SIGTERM, 143: tini passed it on)"
     tail -20 "$LOG"; exit 1 ;;
esac
