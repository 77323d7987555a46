#!/usr/bin/env bash
# Runs the built image here (buildah run --isolation chroot: podman run does not work on these
# machines) exactly as its configuration says: the image's ENTRYPOINT + CMD, user, environment
# and working directory. Then: wait for /readyz, POST a real frame and compare the labels with
# the in-process pipeline's, check the server process runs as the non-root user, send SIGTERM to
# the entrypoint's process (tini, which passes it on) and expect a clean exit (status 0) within
# the drain budget.
#   bash deploy/image/smoke.sh [IMAGE] [FRAME]
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${1:-localhost/lidarseg:cpu}
FRAME=${2:-../shared/data/real/semantickitti/seq00_000000.bin}
PY=${PYTHON:-.venv/bin/python}
B=(buildah --storage-driver vfs)
PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
LOG=$(mktemp)
ctr=$("${B[@]}" from --pull-never -q "$IMAGE")
cleanup() { "${B[@]}" rm "$ctr" >/dev/null 2>&1 || true; rm -f "$LOG"; }
trap cleanup EXIT
# the image's run configuration (Docker format: it keeps the HEALTHCHECK)
"${B[@]}" inspect --type image "$IMAGE" >"$LOG"
mapfile -t CMD < <("$PY" -c "import json, sys; c = json.load(open(sys.argv[1]))['Docker']['config']; [print(a) for a in c['Entrypoint'] + (c.get('Cmd') or [])]" "$LOG")
USER_ID=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['Docker']['config']['User'])" "$LOG")
echo "image $IMAGE: user $USER_ID, command ${CMD[*]}"
[ -n "$USER_ID" ] && [ "${USER_ID%%:*}" != 0 ] && [ "${USER_ID%%:*}" != root ] \
  || { echo "FAIL: the image runs as root" >&2; exit 1; }
# no build host's apt setting in the image (deploy/image/base.sh puts it in the base only)
if "${B[@]}" run --isolation chroot "$ctr" -- ls /etc/apt/apt.conf.d/ | grep -q lidarseg-build-host; then
  echo "FAIL: the image ships the build host's apt setting" >&2; exit 1
fi
"${B[@]}" config --env "LIDARSEG_PORT=$PORT" "$ctr"
start=$SECONDS
"${B[@]}" run --isolation chroot --user "$USER_ID" "$ctr" -- "${CMD[@]}" >"$LOG" 2>&1 &
runner=$!
ready=0
for _ in $(seq 600); do
  if curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then ready=1; break; fi
  kill -0 "$runner" 2>/dev/null || break
  sleep 1
done
if [ $ready != 1 ]; then echo "FAIL: not ready"; tail -40 "$LOG"; kill "$runner" 2>/dev/null; exit 1; fi
echo "ready after $((SECONDS - start)) s"
# the server: the process listening on the port, a descendant of `buildah run`
PID=$(ss -Hltnp "sport = :$PORT" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
uid=$(awk '/^Uid:/ {print $2}' "/proc/$PID/status")
echo "server pid $PID runs as uid $uid: $(tr '\0' ' ' <"/proc/$PID/cmdline")"
[ "$uid" != 0 ] || { echo "FAIL: the server runs as root" >&2; exit 1; }
status=0
"$PY" deploy/image/smoke_compare.py "http://127.0.0.1:$PORT" "$FRAME" || status=1
# SIGTERM to the entrypoint's process, as `docker stop` sends it: the server itself, or the init
# (tini) that runs it and must pass the signal on
STOP=$PID
case $(basename "${CMD[0]}") in python*) ;; *) STOP=$(ps -o ppid= -p "$PID" | tr -d ' ') ;; esac
stop_cmd=$(tr '\0' ' ' <"/proc/$STOP/cmdline")
if [ "${stop_cmd%% *}" != "${CMD[0]}" ]; then
  echo "FAIL: the server's parent is not the entrypoint ${CMD[0]}: $stop_cmd" >&2; exit 1
fi
t_term=$SECONDS
kill -TERM "$STOP"
rc=0
wait "$runner" || rc=$?
echo "SIGTERM to ${stop_cmd% } -> exit status $rc after $((SECONDS - t_term)) s"
tail -5 "$LOG"
if [ $rc != 0 ]; then echo "FAIL: unclean exit"; tail -40 "$LOG"; status=1; fi
[ $status = 0 ] && echo "smoke test passed" || echo "smoke test FAILED"
exit $status
