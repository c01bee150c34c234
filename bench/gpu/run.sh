#!/usr/bin/env bash
# On the GPU machine (its image has torch, httpx, psutil, pyyaml, typer, rich, prometheus-client): install the
# carried wheels (.whl/: pydantic & co, uvicorn, starlette, setproctitle, py-spy, zstandard; see
# docs/gpu-validation.md for the list) into /tmp/site, then run a bench script of this folder:
#   bench/gpu/run.sh [gpu_watchdog.py|decode_loop.py|event_cost.py|probe_ab.py|record_after_copy.py|
#                     capture_check.py|runahead_check.py|up_seat.py] [its arguments]   (default: gpu_watchdog.py)
# Only up_seat.py needs Ray: its wheel (79 MB) travels in two parts, joined and installed into /tmp/site first
# (docs/gpu-validation.md, session 4). NVLink multicast stays off (the lending host's rule).
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
script=gpu_watchdog.py
if [[ "${1:-}" == *.py ]]; then script=$1; shift; fi
python3 "bench/gpu/$script" "$@"
