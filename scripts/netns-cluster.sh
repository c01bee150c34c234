#!/usr/bin/env bash
# A two-host Ray cluster on one machine: two network namespaces on a bridge, each a "host" with its
# own address and its own interface name, `ray start` head in one and worker in the other, token auth on.
# It is what issue 11's tests run multi-host seats on; people use it the same way:
#
#   sudo scripts/netns-cluster.sh up   [STATE_DIR]   # prints the env file it wrote (addresses, token path)
#   sudo ip netns exec <prefix>-a sgl-seat up --seat my-seat.yaml   # a driver runs inside host a
#   sudo scripts/netns-cluster.sh down [STATE_DIR]
#
# Addresses come from 198.18.0.0/15 only (set aside for test networks); the namespaces get no default
# route, so nothing they run can reach beyond the bridge. `down` ends processes by pid (every pid
# `ip netns pids` lists in the two namespaces: only what runs there, never `ray stop`), then removes the
# namespaces and links. Every wait is bounded. Needs root (CAP_NET_ADMIN) and iproute2.
#
# Knobs (environment): NETNS_PREFIX (default sgl11; names are <prefix>-a, <prefix>-b, bridge <prefix>br),
# NETNS_NET (default 198.18.0; host a is .1, host b .2, the bridge .254), NETNS_IF_A / NETNS_IF_B
# (default ethA0 / ensB1: different on purpose), NETNS_GCS_PORT (default 6390), NETNS_GPUS (simulated
# GPUs per host, default 2), NETNS_CPUS (default 4), RAY (default: `ray` on PATH).
set -euo pipefail

cmd=${1:-}
P=${NETNS_PREFIX:-sgl11}
STATE=${2:-/tmp/netns-cluster-$P}
NET=${NETNS_NET:-198.18.0}
IF_A=${NETNS_IF_A:-ethA0}
IF_B=${NETNS_IF_B:-ensB1}
PORT=${NETNS_GCS_PORT:-6390}
GPUS=${NETNS_GPUS:-2}
CPUS=${NETNS_CPUS:-4}
RAY=${RAY:-$(command -v ray || true)}
REPO=$(cd "$(dirname "$0")/.." && pwd)
BR="${P}br"
NS_A="$P-a"
NS_B="$P-b"

case "$NET" in 198.18.*|198.19.*) ;; *) echo "NETNS_NET=$NET is outside 198.18.0.0/15" >&2; exit 2 ;; esac

ns_pids() { ip netns pids "$1" 2>/dev/null || true; }
# Not `ip netns list | grep -q`: under pipefail grep's early exit can fail the pipe (SIGPIPE to ip).
ns_exists() { local all; all=$(ip netns list 2>/dev/null || true); grep -qw "$1" <<<"$all"; }

kill_all() {  # TERM every process in the namespaces named, wait up to 5 s, then KILL; bounded
    local pids i ns
    all_pids() { for ns in "$@"; do ns_pids "$ns"; done; }
    pids=$(all_pids "$@")
    [ -z "$pids" ] && return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for i in $(seq 1 10); do
        pids=$(all_pids "$@"); [ -z "$pids" ] && return 0; sleep 0.5
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    for i in $(seq 1 10); do
        pids=$(all_pids "$@"); [ -z "$pids" ] && return 0; sleep 0.5
    done
    echo "processes left in $*: $pids" >&2
    return 1
}

down() {
    local rc=0
    local present=()
    for ns in "$NS_A" "$NS_B"; do
        if ns_exists "$ns"; then present+=("$ns"); fi
    done
    if [ ${#present[@]} -gt 0 ]; then kill_all "${present[@]}" || rc=1; fi
    for ns in "$NS_A" "$NS_B"; do
        if ns_exists "$ns"; then ip netns del "$ns" || rc=1; fi
        rm -rf "/etc/netns/$ns"
    done
    rmdir /etc/netns 2>/dev/null || true  # only when empty: nothing of anyone else's goes
    for link in "$BR" "${P}va" "${P}vb"; do
        # A veth goes with its namespace, asynchronously: gone by the time of `del` is fine.
        if ip link show "$link" >/dev/null 2>&1; then
            ip link del "$link" 2>/dev/null || ! ip link show "$link" >/dev/null 2>&1 || rc=1
        fi
    done
    rm -rf "$STATE"
    return $rc
}

wait_port() {  # wait_port NS ADDR PORT SECONDS: TCP connect from inside NS, bounded
    local ns=$1 addr=$2 port=$3 secs=$4 i
    for i in $(seq 1 $((secs * 2))); do
        if ip netns exec "$ns" timeout 2 bash -c "exec 3<>/dev/tcp/$addr/$port" 2>/dev/null; then return 0; fi
        sleep 0.5
    done
    echo "nothing listens on $addr:$port in $ns after $secs s" >&2
    return 1
}

start_ray() {  # start_ray NS LOG SCRIPT ENV_FILE: launch/ray/<script> in NS, detached, pid in $STATE/<ns>.pid
    local ns=$1 log=$2 script=$3 envf=$4
    ip netns exec "$ns" env -u RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER PATH="$(dirname "$RAY"):$PATH" \
        setsid bash "$REPO/launch/ray/$script" "$envf" >"$log" 2>&1 </dev/null &
    echo $! >"$STATE/$ns.pid"
}

host_env() {  # host_env FILE ADDR IFNAME RESOURCE EXTRA: the env file launch/ray/{head,worker}.sh read
    cat >"$1" <<ENVEOF
NODE_IP=$2
HEAD_IP=$NET.1
GCS_PORT=$PORT
GLOO_SOCKET_IFNAME=$3
NCCL_SOCKET_IFNAME=$3
HOST_RESOURCE=$4
TOKEN_FILE=$STATE/token
NUM_GPUS=$GPUS
NUM_CPUS=$CPUS
BLOCK=1
RAY_EXTRA_ARGS="--object-store-memory 100000000 $5"
ENVEOF
}

wait_started() {  # wait_started NS LOG SECONDS: `ray start --block` reached its blocking loop, bounded
    local ns=$1 log=$2 secs=$3 i pid
    pid=$(cat "$STATE/$ns.pid")
    for i in $(seq 1 $((secs * 2))); do
        if grep -q "block forever" "$log" 2>/dev/null; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then echo "ray start in $ns exited:" >&2; tail -n 20 "$log" >&2; return 1; fi
        sleep 0.5
    done
    echo "ray start in $ns not up after $secs s" >&2
    return 1
}

up() {
    [ -n "$RAY" ] || { echo "no ray on PATH (activate the venv or set RAY)" >&2; exit 2; }
    if ns_exists "$NS_A"; then echo "$NS_A exists: run '$0 down' first" >&2; exit 1; fi
    mkdir -p "$STATE"; chmod 700 "$STATE"
    trap 'tail -n 20 "$STATE"/ray-*.log >&2 2>/dev/null; down; exit 1' ERR INT TERM
    python3 -c 'import secrets; print(secrets.token_hex(32))' >"$STATE/token"; chmod 600 "$STATE/token"
    ip link add "$BR" type bridge
    ip addr add "$NET.254/24" dev "$BR"
    ip link set "$BR" up
    local ns ifn addr v
    for spec in "a:$NS_A:$IF_A:$NET.1" "b:$NS_B:$IF_B:$NET.2"; do
        IFS=: read -r v ns ifn addr <<<"$spec"
        ip netns add "$ns"
        # Name resolution inside the host without a network beyond the bridge: its own name maps to its
        # address and no DNS server is tried (Ray resolves the hostname while it starts).
        mkdir -p "/etc/netns/$ns"
        printf '127.0.0.1 localhost\n%s %s\n' "$addr" "$(hostname)" >"/etc/netns/$ns/hosts"
        : >"/etc/netns/$ns/resolv.conf"
        ip link add "${P}v$v" type veth peer name "$ifn" netns "$ns"
        ip link set "${P}v$v" master "$BR" up
        ip -n "$ns" addr add "$addr/24" dev "$ifn"
        ip -n "$ns" link set "$ifn" up
        ip -n "$ns" link set lo up
    done
    # The hosts start the way an operator's do: launch/ray/head.sh and worker.sh with a per-host env file.
    host_env "$STATE/a.env" "$NET.1" "$IF_A" sgl-host-a "--temp-dir $STATE/ray-a --include-dashboard false"
    host_env "$STATE/b.env" "$NET.2" "$IF_B" sgl-host-b "--temp-dir $STATE/ray-b"
    start_ray "$NS_A" "$STATE/ray-a.log" head.sh "$STATE/a.env"
    wait_port "$NS_A" "$NET.1" "$PORT" 60
    wait_started "$NS_A" "$STATE/ray-a.log" 60
    start_ray "$NS_B" "$STATE/ray-b.log" worker.sh "$STATE/b.env"
    wait_started "$NS_B" "$STATE/ray-b.log" 60
    cat >"$STATE/env" <<EOF
NETNS_A=$NS_A
NETNS_B=$NS_B
ADDR_A=$NET.1
ADDR_B=$NET.2
IF_A=$IF_A
IF_B=$IF_B
GCS=$NET.1:$PORT
TOKEN_FILE=$STATE/token
EOF
    trap - ERR INT TERM
    echo "$STATE/env"
}

case "$cmd" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down [STATE_DIR]" >&2; exit 2 ;;
esac
