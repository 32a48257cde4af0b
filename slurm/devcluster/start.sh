#!/usr/bin/env bash
# Start the single-node dev cluster (installing packages if missing) and wait until it runs jobs.
# Idempotent: a second start while up is a no-op; a changed configuration restarts the cluster.
# Environment: DCP_SLURM_STATE (state dir), DCP_SLURM_CPUS (CPUs advertised, default 4),
# DCP_SLURM_ACCOUNTING (1 = slurmdbd + MariaDB, the default; 0 = no sacct).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_root
START_TIMEOUT_S="${DCP_SLURM_START_TIMEOUT_S:-90}"

"$DEVCLUSTER_DIR/install.sh"
mkdir -p "$STATE_DIR"/{state,spool,pids,log,conf}

real_memory_mb() {
    local kb; kb="$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
    echo $(( kb / 1024 * 9 / 10 ))
}

render() {  # render template $1 into file $2
    local storage=accounting_storage/none
    [ "$ACCOUNTING" = 1 ] && storage=accounting_storage/slurmdbd
    sed -e "s|@CLUSTER_NAME@|$CLUSTER_NAME|g" -e "s|@STATE_DIR@|$STATE_DIR|g" \
        -e "s|@CPUS@|$SLURM_CPUS|g" -e "s|@REAL_MEMORY@|$(real_memory_mb)|g" \
        -e "s|@ACCOUNTING_STORAGE@|$storage|g" -e "s|@DB_PORT@|$DB_PORT|g" "$1" > "$2"
}

render "$DEVCLUSTER_DIR/slurm.conf.in" "$STATE_DIR/conf/slurm.conf"
render "$DEVCLUSTER_DIR/slurmdbd.conf.in" "$STATE_DIR/conf/slurmdbd.conf"
want_hash="$(cat "$STATE_DIR/conf/slurm.conf" "$STATE_DIR/conf/slurmdbd.conf" | sha256sum | cut -d' ' -f1)"
[ "$ACCOUNTING" = 1 ] || want_hash="$want_hash-noacct"
have_hash="$(cat "$STATE_DIR/conf/running.hash" 2>/dev/null || true)"

all_up=1; any_up=0
for d in $(daemon_names); do
    if live_pid "$d" >/dev/null; then any_up=1; else all_up=0; fi
done

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit="$1" what="$2"; shift 2
    local deadline=$(( SECONDS + limit ))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${limit}s waiting for $what (logs: $LOG_DIR)"
        sleep 0.2
    done
}

node_idle() { sinfo -h -n localhost -o %t 2>/dev/null | grep -Eq '^(idle|mix|alloc)'; }

if [ "$all_up" = 1 ] && [ "$want_hash" = "$have_hash" ] && node_idle; then
    log "already up (state: $STATE_DIR)"
    exit 0
fi
if [ "$any_up" = 1 ]; then
    log "restarting (configuration changed or a daemon is missing)"
    "$DEVCLUSTER_DIR/stop.sh"
fi

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
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
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

# --- slurmctld + slurmd -----------------------------------------------------------------------
live_pid slurmctld >/dev/null || /usr/sbin/slurmctld
wait_for 30 slurmctld scontrol ping
live_pid slurmd >/dev/null || /usr/sbin/slurmd -N localhost
wait_for "$START_TIMEOUT_S" "node localhost to come up" bash -c \
    "sinfo -h -n localhost -o %t | grep -Eq '^(idle|mix|alloc|down|drain)'"
if sinfo -h -n localhost -o %t | grep -Eq '^(down|drain)'; then
    scontrol update nodename=localhost state=resume || true
fi
wait_for "$START_TIMEOUT_S" "node localhost to be idle" node_idle

# The scheduler's first pass comes a few seconds after slurmctld starts: a probe job hides that.
probe_log="$LOG_DIR/probe.out"
timeout "$START_TIMEOUT_S" sbatch --wait --quiet --job-name=devcluster-probe --time=1 \
    --output="$probe_log" --wrap 'echo probe ok' >/dev/null \
    || die "the probe job did not run (see $LOG_DIR/slurmctld.log)"
echo "$want_hash" > "$STATE_DIR/conf/running.hash"
log "up: $(sinfo -h -o '%P %a %D %t %N' | head -1) (cpus=$SLURM_CPUS accounting=$ACCOUNTING state=$STATE_DIR)"
