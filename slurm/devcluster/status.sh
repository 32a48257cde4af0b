#!/usr/bin/env bash
# Print which dev-cluster daemons run and the node state. Exit 0 when all are up, 1 otherwise.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rc=0
for d in $(daemon_names); do
    if pid="$(live_pid "$d")"; then
        printf '%-10s running (pid %s)\n' "$d" "$pid"
    else
        printf '%-10s stopped\n' "$d"; rc=1
    fi
done
if [ "$rc" = 0 ]; then
    sinfo -h -o 'partition %P: %D node(s) %t (%N)' || rc=1
    if [ "$ACCOUNTING" = 1 ]; then sacct -n -X -S now-1hour -o JobID >/dev/null && echo "sacct: ok" || rc=1; fi
fi
exit "$rc"
