#!/usr/bin/env bash
# Start this host as the Ray head of an sgl-seat cluster: token auth on, the RoCE env exported, the dashboard
# bound to the cluster address only. Usage: head.sh [ENV_FILE]   (default /etc/sgl-seat/ray.env)
# Ray's GCS listens on every interface whatever --node-ip-address says (Ray 2.60, measured in a network
# namespace: *:<port>); the token is what guards it. Restrict it to the cluster subnet with the host firewall
# too (launch/ray/README.md shows the nft rule).
set -euo pipefail
. "$(dirname "$0")/common.sh"
exec ray start --head --port "$GCS_PORT" "${RAY_ARGS[@]}" \
    --dashboard-host "$NODE_IP" --dashboard-port "${DASHBOARD_PORT:-8265}"
