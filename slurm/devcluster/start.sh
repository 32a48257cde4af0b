#!/usr/bin/env bash
# Start the dev cluster (installing packages if missing): the controller here, each node a slurmd
# in namespaces of its own (common.sh); wait until a probe job has run on every node.
# Idempotent: a second start while up is a no-op; a changed configuration restarts the cluster.
# Environment: DCP_SLURM_NODES (nodes, default 2), DCP_SLURM_CPUS (CPUs each node advertises,
# default 4), DCP_SLURM_ACCOUNTING (1 = slurmdbd + MariaDB, the default; 0 = no sacct),
# DCP_SLURM_STATE (state dir), and to run a second cluster beside this one: DCP_SLURM_CONF_DIR,
# DCP_SLURM_PORT, DCP_SLURM_DB_PORT, DCP_SLURM_SUBNET, DCP_SLURM_CLUSTER (README).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_root
check_settings
START_TIMEOUT_S="${DCP_SLURM_START_TIMEOUT_S:-90}"

"$DEVCLUSTER_DIR/install.sh"
mkdir -p "$STATE_DIR"/{state,spool,pids,log,conf}

real_memory_mb() {  # 90 % of this machine's memory, shared by the nodes
    local kb; kb="$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
    echo $(( kb / 1024 * 9 / 10 / NODES ))
}

node_lines() {
    local n
    for n in $(node_names); do echo "NodeName=$n NodeHostname=$n NodeAddr=$(node_addr "$n")"; done
}

render() {  # render template $1 into file $2
    local storage=accounting_storage/none
    [ "$ACCOUNTING" = 1 ] && storage=accounting_storage/slurmdbd
    sed -e "s|@CLUSTER_NAME@|$CLUSTER_NAME|g" -e "s|@STATE_DIR@|$STATE_DIR|g" \
        -e "s|@CPUS@|$SLURM_CPUS|g" -e "s|@REAL_MEMORY@|$(real_memory_mb)|g" \
        -e "s|@ACCOUNTING_STORAGE@|$storage|g" -e "s|@DB_PORT@|$DB_PORT|g" \
        -e "s|@CTL_ADDR@|$CTL_ADDR|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
        -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" -e "s|@DBD_PORT@|$DBD_PORT|g" \
        -e "s|@NODE_LIST@|$(node_names | paste -sd, -)|g" "$1" \
        | awk -v lines="$(node_lines)" '$0 == "@NODE_LINES@" {print lines; next} {print}' > "$2"
}

render "$DEVCLUSTER_DIR/slurm.conf.in" "$STATE_DIR/conf/slurm.conf"
render "$DEVCLUSTER_DIR/slurmdbd.conf.in" "$STATE_DIR/conf/slurmdbd.conf"
want_hash="$(cat "$STATE_DIR/conf/slurm.conf" "$STATE_DIR/conf/slurmdbd.conf" \
    "$DEVCLUSTER_DIR/start.sh" "$DEVCLUSTER_DIR/network.sh" | sha256sum | cut -d' ' -f1)"
[ "$ACCOUNTING" = 1 ] || want_hash="$want_hash-noacct"
have_hash="$(cat "$STATE_DIR/conf/running.hash" 2>/dev/null || true)"

all_up=1; any_up=0
for d in $(daemon_names); do
    if live_pid "$d" >/dev/null; then any_up=1
    elif [ "$d" != munged ] || ! munge_works; then all_up=0; fi  # a munged not ours is used
done

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit="$1" what="$2"; shift 2
    local deadline=$(( SECONDS + limit ))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${limit}s waiting for $what (logs: $LOG_DIR)"
        sleep 0.2
    done
}

# Every node idle (or running jobs), none missing.
nodes_idle() {
    local states; states="$(sinfo -h -N -o '%N %t' 2>/dev/null)" || return 1
    [ "$(grep -Ec ' (idle|mix|alloc)$' <<< "$states")" = "$NODES" ]
}

if [ "$all_up" = 1 ] && [ "$want_hash" = "$have_hash" ] && net_up && nodes_idle; then
    log "already up (state: $STATE_DIR)"
    exit 0
fi
if [ "$any_up" = 1 ] || [ -f "$NET_DIR/created" ]; then
    log "restarting (configuration changed or a daemon is missing)"
    "$DEVCLUSTER_DIR/stop.sh"
fi
"$DEVCLUSTER_DIR/network.sh" up

install_conf() {  # install $STATE_DIR/conf/$1 as /etc/slurm/$1, keeping a foreign file as .orig
    local dst="$CONF_DIR/$1"
    mkdir -p "$CONF_DIR"
    if [ -f "$dst" ] && ! grep -qF "$MARKER" "$dst" && [ ! -e "$dst.orig" ]; then
        log "keeping the existing $dst as $dst.orig"
        cp -p "$dst" "$dst.orig"
    fi
    install -m "$2" "$STATE_DIR/conf/$1" "$dst"
}
install_conf slurm.conf 644
if [ "$ACCOUNTING" = 1 ]; then install_conf slurmdbd.conf 600; fi

# --- munge -----------------------------------------------------------------------------------
if ! live_pid munged >/dev/null; then
    if munge_works; then
        log "munged already running (not started by us; left alone)"
    else
        [ -f /etc/munge/munge.key ] || mungekey --create
        mkdir -p /run/munge /var/log/munge /var/lib/munge
        chown munge:munge /run/munge /var/log/munge /var/lib/munge
        runuser -u munge -- /usr/sbin/munged
        cp /run/munge/munged.pid "$PID_DIR/munged.pid"
        wait_for 10 munged bash -c 'munge -n | unmunge'
    fi
fi

# --- accounting: private MariaDB + slurmdbd ---------------------------------------------------
if [ "$ACCOUNTING" = 1 ]; then
    DB="$STATE_DIR/mysql"
    if ! live_pid mariadbd >/dev/null; then
        mkdir -p "$DB"
        chown mysql:mysql "$DB" "$LOG_DIR"
        if [ ! -d "$DB/data/mysql" ]; then
            mariadb-install-db --no-defaults --user=mysql --datadir="$DB/data" \
                --auth-root-authentication-method=socket --skip-test-db >"$LOG_DIR/mariadb-install.log" 2>&1
        fi
        install -o mysql -m 600 "$DEVCLUSTER_DIR/mariadb-init.sql" "$DB/init.sql"
        rm -f "$DB/mysqld.pid"
        setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB/data" \
            --socket="$DB/mysqld.sock" --pid-file="$DB/mysqld.pid" --bind-address=127.0.0.1 \
            --port="$DB_PORT" --skip-name-resolve --init-file="$DB/init.sql" \
            --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 \
            --log-error="$LOG_DIR/mariadb.err" </dev/null >/dev/null 2>&1 &
        wait_for 30 "MariaDB pid file" test -s "$DB/mysqld.pid"
        cp "$DB/mysqld.pid" "$PID_DIR/mariadbd.pid"
        wait_for 30 "MariaDB on port $DB_PORT" bash -c "exec 3<>/dev/tcp/127.0.0.1/$DB_PORT"
    fi
    if ! live_pid slurmdbd >/dev/null; then
        /usr/sbin/slurmdbd
        wait_for 30 slurmdbd sacctmgr -n list cluster
    fi
    sacctmgr -n list cluster format=cluster | grep -qw "$CLUSTER_NAME" \
        || sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
fi

# --- slurmctld + one slurmd per node ------------------------------------------------------------
live_pid slurmctld >/dev/null || /usr/sbin/slurmctld
wait_for 30 slurmctld scontrol ping
for n in $(node_names); do
    live_pid "slurmd-$n" >/dev/null && continue
    mkdir -p "$STATE_DIR/spool/$n"
    # In the node's network namespace, with a UTS namespace (its hostname) and a mount namespace
    # (its /etc/hosts) of its own; slurmd daemonizes and its jobs inherit all three. (Not `ip
    # netns exec`: it mounts a fresh /sys, without the cgroup filesystem slurmd needs.)
    nsenter --net="/run/netns/$(netns_of "$n")" unshare --uts --mount --propagation private \
        /bin/sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && exec /usr/sbin/slurmd -N "$2"' \
        slurmd "$NET_DIR/hosts" "$n"
done
all_registered() { [ "$(sinfo -h -N -o %t | grep -Ec '^(idle|mix|alloc|down|drain)')" = "$NODES" ]; }
wait_for "$START_TIMEOUT_S" "$NODES node(s) to register" all_registered
for n in $(sinfo -h -N -o '%N %t' | awk '$2 ~ /^(down|drain)/ {print $1}'); do
    scontrol update nodename="$n" state=resume || true
done
wait_for "$START_TIMEOUT_S" "every node to be idle" nodes_idle

# The scheduler's first pass comes a few seconds after slurmctld starts: a probe job hides that.
# It runs one task on every node, each printing its hostname: every node must be its own host.
probe_log="$LOG_DIR/probe.out"
timeout "$START_TIMEOUT_S" sbatch --wait --quiet --job-name=devcluster-probe --time=1 \
    --nodes="$NODES" --ntasks-per-node=1 --output="$probe_log" \
    --wrap 'srun --kill-on-bad-exit=1 bash -c "echo \$SLURMD_NODENAME \$(hostname)"' >/dev/null \
    || die "the probe job did not run (see $probe_log and $LOG_DIR/slurmctld.log)"
want_probe="$(node_names | awk '{print $1, $1}')"
[ "$(sort "$probe_log")" = "$want_probe" ] \
    || die "the probe job's tasks did not run one per node, each on its own host: got $(tr '\n' ';' < "$probe_log") (want node name = hostname on every node)"
echo "$want_hash" > "$STATE_DIR/conf/running.hash"
log "up: $(sinfo -h -o '%P %a %D %t %N' | head -1) (cpus=$SLURM_CPUS per node, accounting=$ACCOUNTING, state=$STATE_DIR)"
