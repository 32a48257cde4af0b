#!/usr/bin/env bash
# Stop the daemons start.sh started (by saved PID, checking /proc/PID/comm first), newest first,
# then remove the namespaces and links it made (network.sh down). Running jobs are cancelled first
# so no slurmstepd is left behind. Idempotent.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_root

if live_pid slurmctld >/dev/null && command -v scancel >/dev/null; then
    scancel --full --quiet --user=root 2>/dev/null || true
    # Give steps their KillWait to end before the daemons go.
    for _ in $(seq 1 40); do
        [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.25
    done
fi

names=($(daemon_names))
[ "$ACCOUNTING" = 1 ] || names+=(slurmdbd mariadbd)  # stop leftovers of an earlier accounting run
for f in "$PID_DIR"/slurmd*.pid; do  # and the nodes of an earlier start (more nodes, or one)
    [ -e "$f" ] || continue
    d="$(basename "$f" .pid)"
    [[ " ${names[*]} " == *" $d "* ]] || names+=("$d")
done
for (( i=${#names[@]}-1; i>=0; i-- )); do
    d="${names[$i]}"
    pid="$(live_pid "$d" || true)"
    if [ -z "$pid" ]; then
        rm -f "$PID_DIR/$d.pid"
        continue
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        live_pid "$d" >/dev/null || break
        sleep 0.1
    done
    if live_pid "$d" >/dev/null; then
        log "$d (pid $pid) ignored SIGTERM for 10 s: sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PID_DIR/$d.pid"
    log "stopped $d (pid $pid)"
done
"$DEVCLUSTER_DIR/network.sh" down
rm -f "$STATE_DIR/conf/running.hash"
