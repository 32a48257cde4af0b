#!/usr/bin/env bash
# Start the two-node dev cluster (installing Slurm's Debian packages if needed) and run the
# slurm-marked tests against it. A cluster this script started is stopped again at the end; one
# that was already up is left running. Needs root (apt-get, slurmctld/slurmd as root).
# Uses the active Python (the venv .ci/run made), or $PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

if [ "$(id -u)" != 0 ]; then
    echo "error: .ci/slurm.sh needs root (it installs and starts a two-node Slurm)" >&2
    exit 2
fi

started=0
if ! slurm/devcluster/status.sh >/dev/null 2>&1; then
    started=1
fi
stop_cluster() {
    if [ "$started" = 1 ] && [ "${DCP_SLURM_KEEP:-0}" != 1 ]; then
        slurm/devcluster/stop.sh || true
    fi
}
trap stop_cluster EXIT

slurm/devcluster/start.sh
slurm/devcluster/status.sh
"$PYTHON" -m pytest -m slurm tests -q -p no:cacheprovider "$@"
