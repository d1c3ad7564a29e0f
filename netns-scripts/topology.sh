#!/usr/bin/env bash
# Bring the kubeport test topology of network namespaces up and down.
# Layout and address plan: netns-scripts/README.md.
#
#   topology.sh up     [--prefix P] [--pods-per-node N]
#   topology.sh down   [--prefix P]
#   topology.sh status [--prefix P]
#
# Every name the script creates lives inside namespaces called "<P>-*"; nothing
# is added to the root namespace, so runs with different prefixes never collide.
set -euo pipefail

PREFIX=kp
PODS_PER_NODE=2
NODES=(a b)

die() { echo "topology.sh: error: $*" >&2; exit 1; }
say() { echo "topology.sh: $*" >&2; }

usage() {
    cat >&2 <<'EOF'
usage: topology.sh up     [--prefix P] [--pods-per-node N]
       topology.sh down   [--prefix P]
       topology.sh status [--prefix P]
P: letters, digits and '-', at most 24 characters (default kp); N: 1..99 (default 2).
EOF
}

parse_args() {
    while (($#)); do
        case "$1" in
            --prefix) (($# >= 2)) || die "--prefix needs a value"; PREFIX=$2; shift 2 ;;
            --prefix=*) PREFIX=${1#--prefix=}; shift ;;
            --pods-per-node) (($# >= 2)) || die "--pods-per-node needs a value"; PODS_PER_NODE=$2; shift 2 ;;
            --pods-per-node=*) PODS_PER_NODE=${1#--pods-per-node=}; shift ;;
            -h|--help) usage; exit 0 ;;
            *) usage; die "unknown argument: $1" ;;
        esac
    done
    # The prefix goes into a regular expression and into namespace names: keep it plain.
    [[ $PREFIX =~ ^[A-Za-z0-9]([A-Za-z0-9-]{0,22}[A-Za-z0-9])?$ ]] \
        || die "invalid --prefix '$PREFIX' (letters, digits, inner '-', at most 24 characters)"
    [[ $PODS_PER_NODE =~ ^[1-9][0-9]?$ ]] \
        || die "invalid --pods-per-node '$PODS_PER_NODE' (1..99)"
}

# Namespaces that belong to PREFIX, including leftovers of a crashed or half-built run.
prefix_namespaces() {
    ip netns list | awk '{print $1}' \
        | grep -E "^${PREFIX}-(lan|client|ext|node-[ab]|[ab][0-9]+)\$" | sort || true
}

namespace_pids() {
    local ns
    for ns in "$@"; do
        ip netns pids "$ns" 2>/dev/null || true
    done
}

do_down() {
    local names attempt pids left
    mapfile -t names < <(prefix_namespaces)
    ((${#names[@]})) || return 0
    # Kill until nothing is left: a process may fork while we look.
    for attempt in $(seq 1 100); do
        pids=$(namespace_pids "${names[@]}")
        [[ -z $pids ]] && break
        # shellcheck disable=SC2086  # word splitting of the pid list is wanted
        kill -KILL $pids 2>/dev/null || true
        sleep 0.02
    done
    [[ -z $(namespace_pids "${names[@]}") ]] || die "processes in ${PREFIX}-* survived SIGKILL"
    printf 'netns del %s\n' "${names[@]}" | ip -force -batch - >/dev/null 2>&1 || true
    left=$(prefix_namespaces)
    [[ -z $left ]] || die "could not delete namespaces: $(echo "$left" | tr '\n' ' ')"
    say "down: removed ${#names[@]} namespaces of prefix '$PREFIX'"
}

all_namespaces() {
    local n i
    echo "$PREFIX-lan" "$PREFIX-client" "$PREFIX-ext" "$PREFIX-node-a" "$PREFIX-node-b"
    for n in "${NODES[@]}"; do
        for ((i = 1; i <= PODS_PER_NODE; i++)); do echo "$PREFIX-$n$i"; done
    done
}

# Node index: a -> 1, b -> 2 (the third octet of its pod subnet, last octet of its LAN address - 10).
node_index() { [[ $1 == a ]] && echo 1 || echo 2; }
other_node() { [[ $1 == a ]] && echo b || echo a; }

# Root-namespace batch: every veth pair is created directly inside its two namespaces.
veth_batch() {
    local end n i
    for end in node-a node-b client ext; do
        echo "link add eth0 netns $PREFIX-$end type veth peer name $end netns $PREFIX-lan"
    done
    for n in "${NODES[@]}"; do
        for ((i = 1; i <= PODS_PER_NODE; i++)); do
            echo "link add eth0 netns $PREFIX-$n$i type veth peer name veth-$n$i netns $PREFIX-node-$n"
        done
    done
}

lan_batch() {
    local end
    echo "link set lo up"
    echo "link add lan0 type bridge mcast_snooping 0"
    echo "link set lan0 up"
    for end in node-a node-b client ext; do echo "link set $end master lan0 up"; done
}

# A host on the LAN: eth0 with its LAN addresses, lo up.
lan_host_batch() {
    local octet=$1
    echo "link set lo up"
    echo "link set eth0 up"
    echo "addr add 192.168.50.$octet/24 dev eth0"
    echo "addr add fd00:50::$octet/64 dev eth0 nodad"
}

node_batch() {
    local n=$1 idx other oidx i
    idx=$(node_index "$n"); other=$(other_node "$n"); oidx=$(node_index "$other")
    lan_host_batch $((10 + idx))
    echo "link add br0 type bridge mcast_snooping 0"
    echo "link set br0 up"
    echo "addr add 10.244.$idx.1/24 dev br0"
    echo "addr add fd00:10:244:$idx::1/64 dev br0 nodad"
    for ((i = 1; i <= PODS_PER_NODE; i++)); do echo "link set veth-$n$i master br0 up"; done
    echo "route add 10.244.$oidx.0/24 via 192.168.50.$((10 + oidx))"
    echo "route add fd00:10:244:$oidx::/64 via fd00:50::$((10 + oidx))"
}

pod_batch() {
    local n=$1 i=$2 idx
    idx=$(node_index "$n")
    echo "link set lo up"
    echo "link set eth0 up"
    echo "addr add 10.244.$idx.$((10 + i))/24 dev eth0"
    echo "addr add fd00:10:244:$idx::$((10 + i))/64 dev eth0 nodad"
    echo "route add 0.0.0.0/0 via 10.244.$idx.1"
    echo "route add ::/0 via fd00:10:244:$idx::1"
}

client_batch() {
    lan_host_batch 100
    # externalIPs and LoadBalancer ingress IPs are served by node-a.
    echo "route add 192.168.60.0/24 via 192.168.50.11"
    echo "route add 192.168.70.0/24 via 192.168.50.11"
    echo "route add fd00:60::/64 via fd00:50::11"
    echo "route add fd00:70::/64 via fd00:50::11"
}

ns_batch() {
    local ns=$1
    shift
    "$@" | ip -n "$ns" -batch - || die "configuring namespace $ns failed (see the ip error above)"
}

# Before any link exists, so that "default" applies to all of them. DAD must be off on every
# interface ("all" and the interface): a tentative link-local address delays the first IPv6
# connection through a node by seconds, and new addresses must be usable at once.
ns_sysctls() {
    local ns=$1
    local settings=(net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0)
    if [[ $ns == "$PREFIX"-node-? ]]; then
        # Nodes route between pods, the LAN and the service VIPs.
        settings+=(net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
                   net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0)
    fi
    ip netns exec "$ns" sysctl -q -w "${settings[@]}" >/dev/null || die "setting sysctls in $ns failed"
}

do_up() {
    local ns n i
    do_down
    # A failed `up` leaves nothing behind (a killed one is what `down` is for).
    trap 'say "up failed, removing the partial topology"; do_down >/dev/null 2>&1 || true' EXIT
    # shellcheck disable=SC2046  # one namespace name per word
    printf 'netns add %s\n' $(all_namespaces) | ip -batch - || die "creating namespaces for prefix '$PREFIX' failed"
    for ns in $(all_namespaces); do ns_sysctls "$ns"; done
    veth_batch | ip -batch - || die "creating veth pairs for prefix '$PREFIX' failed"
    ns_batch "$PREFIX-lan" lan_batch
    for n in "${NODES[@]}"; do
        ns_batch "$PREFIX-node-$n" node_batch "$n"
        for ((i = 1; i <= PODS_PER_NODE; i++)); do ns_batch "$PREFIX-$n$i" pod_batch "$n" "$i"; done
    done
    ns_batch "$PREFIX-client" client_batch
    ns_batch "$PREFIX-ext" lan_host_batch 200
    trap - EXIT
    say "up: prefix '$PREFIX', $PODS_PER_NODE pods per node"
}

do_status() {
    local names ns
    mapfile -t names < <(prefix_namespaces)
    if ((${#names[@]} == 0)); then
        echo "prefix '$PREFIX': down"
        return 1
    fi
    echo "prefix '$PREFIX': ${#names[@]} namespaces"
    for ns in "${names[@]}"; do
        echo "$ns:"
        ip -n "$ns" -brief addr show 2>/dev/null | sed 's/^/    /' || echo "    (unreadable)"
    done
}

main() {
    (($#)) || { usage; exit 2; }
    local cmd=$1
    shift
    parse_args "$@"
    [[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces)"
    case "$cmd" in
        up) do_up ;;
        down) do_down ;;
        status) do_status ;;
        -h|--help|help) usage ;;
        *) usage; die "unknown command: $cmd" ;;
    esac
}

main "$@"
