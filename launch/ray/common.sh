# Shared by head.sh and worker.sh (sourced, not run): the node's RoCE / socket environment and token auth.
# Everything a raylet has in its environment, the seat's node agents and engines inherit, so the fabric
# variables are exported here, before `ray start`. Per-host values belong in this host's copy of the env file
# (and in the seat spec's cluster.hosts[] entry for this host, which sgl-seat checks in preflight).

die() { echo "$(basename "$0"): $*" >&2; exit 2; }

# The env file: NODE_IP (this host's address on the cluster network), and optionally NCCL_SOCKET_IFNAME,
# GLOO_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_IB_GID_INDEX, NUM_GPUS, NUM_CPUS, HOST_RESOURCE, GCS_PORT, TOKEN_FILE.
ENV_FILE=${1:-${SGLSEAT_RAY_ENV:-/etc/sgl-seat/ray.env}}
[ -r "$ENV_FILE" ] || die "no env file $ENV_FILE (copy launch/ray/ray.env.example and fill it in)"
# shellcheck disable=SC1090
. "$ENV_FILE"
[ -n "${NODE_IP:-}" ] || die "NODE_IP is not set in $ENV_FILE (this host's address on the cluster network)"
# Read the addresses first: `ip ... | grep -q` under pipefail fails when grep's early exit kills ip (SIGPIPE).
_addrs=$(ip -o addr show 2>/dev/null || true)
grep -qw "inet ${NODE_IP}" <<<"$_addrs" || die "NODE_IP=$NODE_IP is not an address of this host"
GCS_PORT=${GCS_PORT:-6379}
for var in NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME NCCL_IB_HCA NCCL_IB_GID_INDEX; do
    if [ -n "${!var:-}" ]; then export "${var?}"; fi
done
if [ -n "${GLOO_SOCKET_IFNAME:-}" ] && [ ! -e "/sys/class/net/$GLOO_SOCKET_IFNAME" ]; then
    die "GLOO_SOCKET_IFNAME=$GLOO_SOCKET_IFNAME is not an interface of this host"
fi

# Token auth (Ray >= 2.52; the default for multi-node clusters from 2.61): every raylet, driver and client
# must present the same token. sgl-seat reads it from the variable cluster.token_env names.
TOKEN_FILE=${TOKEN_FILE:-/etc/sgl-seat/ray.token}
[ -r "$TOKEN_FILE" ] || die "no token file $TOKEN_FILE (create it once: python3 -c 'import secrets;" \
    "print(secrets.token_hex(32))' > $TOKEN_FILE; chmod 600 $TOKEN_FILE; copy it to every host)"
[ "$(stat -c %a "$TOKEN_FILE")" = 600 ] || die "$TOKEN_FILE must be mode 600"
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(cat "$TOKEN_FILE")
export RAY_AUTH_TOKEN
export RAY_USAGE_STATS_ENABLED=0

if [ -z "${NUM_GPUS:-}" ]; then
    NUM_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
RAY_ARGS=(--node-ip-address "$NODE_IP" --num-gpus "$NUM_GPUS" --disable-usage-stats)
if [ -n "${NUM_CPUS:-}" ]; then RAY_ARGS+=(--num-cpus "$NUM_CPUS"); fi
# A resource only this host declares lets a seat pin a node rank here (cluster.hosts[].ray_resource).
if [ -n "${HOST_RESOURCE:-}" ]; then RAY_ARGS+=(--resources "{\"$HOST_RESOURCE\": 1}"); fi
# Under systemd (or a test harness that ends it by pid): keep `ray start` in the foreground.
if [ "${BLOCK:-0}" = 1 ]; then RAY_ARGS+=(--block); fi
# Anything else for `ray start` (e.g. --temp-dir DIR --object-store-memory BYTES), split on spaces.
if [ -n "${RAY_EXTRA_ARGS:-}" ]; then read -r -a _extra <<<"$RAY_EXTRA_ARGS"; RAY_ARGS+=("${_extra[@]}"); fi
