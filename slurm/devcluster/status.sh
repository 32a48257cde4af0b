#!/usr/bin/env bash
# Print which dev-cluster daemons run, whether the nodes' namespaces exist, and each node's state.
# Exit 0 when all are up and every node is idle or running jobs, 1 otherwise.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rc=0
for d in $(daemon_names); do
    if pid="$(live_pid "$d")"; then
        printf '%-14s running (pid %s)\n' "$d" "$pid"
    elif [ "$d" = munged ] && munge_works; then
        printf '%-14s running (not started by start.sh: left alone)\n' "$d"
    else
        printf '%-14s stopped\n' "$d"; rc=1
    fi
done
if net_up; then
    printf '%-14s up (bridge %s, controller %s, %s)\n' network "$BRIDGE" "$CTL_ADDR" \
        "$(for n in $(node_names); do printf '%s %s ' "$n" "$(node_addr "$n")"; done)"
else
    printf '%-14s missing\n' network; rc=1
fi
if [ "$rc" = 0 ]; then
    states="$(sinfo -h -N -o '%N %t')" || rc=1
    while read -r n st; do printf '%-14s %s\n' "$n" "$st"; done <<< "$states"
    [ "$(grep -Ec ' (idle|mix|alloc)$' <<< "$states")" = "$NODES" ] || rc=1
    if [ "$ACCOUNTING" = 1 ]; then sacct -n -X -S now-1hour -o JobID >/dev/null && echo "sacct: ok" || rc=1; fi
fi
exit "$rc"
