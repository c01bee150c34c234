#!/usr/bin/env bash
# Join this host to the sgl-seat Ray cluster at HEAD_IP (set in the env file): same token, this host's own
# RoCE env. Usage: worker.sh [ENV_FILE]   (default /etc/sgl-seat/ray.env)
set -euo pipefail
. "$(dirname "$0")/common.sh"
[ -n "${HEAD_IP:-}" ] || die "HEAD_IP is not set in $ENV_FILE (the head's address on the cluster network)"
exec ray start --address "$HEAD_IP:$GCS_PORT" "${RAY_ARGS[@]}"
