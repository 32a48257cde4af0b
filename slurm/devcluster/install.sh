#!/usr/bin/env bash
# Install the Debian packages of the dev cluster (idempotent: installs only what is missing).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_root

packages=(slurmctld slurmd slurm-client munge iproute2)
[ "$ACCOUNTING" = 1 ] && packages+=(slurmdbd mariadb-server)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" = 0 ]; then
    log "packages present: ${packages[*]}"
    exit 0
fi

# Package postinst scripts try to start services; keep them from doing so while we install.
made_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
fi
trap '[ "$made_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT

log "installing: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
log "installed: ${missing[*]}"
