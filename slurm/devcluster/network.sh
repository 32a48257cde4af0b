#!/usr/bin/env bash
# The dev cluster's private network (common.sh): `network.sh up` makes a bridge holding the
# controller's address and, per node, a network namespace joined to the bridge by a veth pair
# (eth0 inside, $SUBNET.(10+k)/24), plus the /etc/hosts every node sees; `network.sh down` removes
# exactly what `up` made (listed in $NET_DIR/created). Both are idempotent.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_root
check_settings
mkdir -p "$NET_DIR"
CREATED="$NET_DIR/created"

made() { echo "$1 $2" >> "$CREATED"; }

up() {
    command -v ip >/dev/null || die "no 'ip' command: install iproute2"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        local other
        other="$(ip -o -4 addr show | awk -v p="$SUBNET." 'index($4, p) == 1 {print $2; exit}')"
        [ -z "$other" ] || die "$SUBNET.0/24 is already on $other: set DCP_SLURM_SUBNET to a free /24"
        ip link add "$BRIDGE" type bridge
        made link "$BRIDGE"
        ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
    fi
    ip link set "$BRIDGE" up
    local n ns veth
    for n in $(node_names); do
        ns="$(netns_of "$n")" veth="$(veth_of "$n")"
        if ! netns_exists "$ns"; then
            ip netns add "$ns"
            made netns "$ns"
        fi
        if ! ip link show "$veth" >/dev/null 2>&1; then
            ip link add "$veth" type veth peer name eth0 netns "$ns"
            made link "$veth"
            ip -n "$ns" addr add "$(node_addr "$n")/24" dev eth0
        fi
        ip link set "$veth" master "$BRIDGE"
        ip link set "$veth" up
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
    done
    # What every node resolves: the nodes by name to their own addresses (never to a loopback,
    # so torch.distributed on a node binds its bridge address), and the controller.
    {
        echo "$MARKER"
        echo "127.0.0.1 localhost"
        echo "$CTL_ADDR $CLUSTER_NAME-ctl"
        for n in $(node_names); do echo "$(node_addr "$n") $n"; done
    } > "$NET_DIR/hosts.new"
    mv "$NET_DIR/hosts.new" "$NET_DIR/hosts"
}

down() {
    [ -f "$CREATED" ] || return 0
    local entries entry kind name
    mapfile -t entries < <(tac "$CREATED")
    # The links first, newest first (deleting a veth end deletes its pair, the end in the node's
    # namespace too), then the namespaces. A link may vanish on its own meanwhile: what counts
    # is that it is gone after.
    for entry in "${entries[@]}"; do
        read -r kind name <<< "$entry"
        [ "$kind" = link ] || continue
        ip link del "$name" 2>/dev/null || true
        ! ip link show "$name" >/dev/null 2>&1 || die "could not remove the link $name"
    done
    for entry in "${entries[@]}"; do
        read -r kind name <<< "$entry"
        [ "$kind" = netns ] || continue
        ip netns del "$name" 2>/dev/null || true
        ! netns_exists "$name" || die "could not remove the network namespace $name"
    done
    rm -f "$CREATED" "$NET_DIR/hosts"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) die "usage: network.sh up|down" ;;
esac
