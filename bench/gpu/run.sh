#!/usr/bin/env bash
# On the GPU machine (its image has torch, httpx, psutil, pyyaml, typer, rich, prometheus-client): install the
# carried wheels (.whl/: pydantic & co, uvicorn, starlette, setproctitle, py-spy, zstandard; see
# docs/gpu-validation.md for the list) into /tmp/site, then run a bench script of this folder:
#   bench/gpu/run.sh [gpu_watchdog.py|decode_loop.py|event_cost.py|probe_ab.py|record_after_copy.py|
#                     capture_check.py|runahead_check.py|up_seat.py|graph_cost.py] [its arguments]
#                                                                                   (default: gpu_watchdog.py)
#   bench/gpu/run.sh graphs [OUT]   issue 25 on 1 GPU: the probe's cost per CUDA graph replay (graph_cost.py ->
#                                   OUT/graph_cost.json), then a stall inside a replayed graph of the sim's graph
#                                   mode, named from the graph record (gpu_watchdog.py --graphs, 1 node x 1 GPU,
#                                   draft on -> OUT/graphs/result.json); OUT defaults to $OUT, else /tmp/gpu-out.
# Only up_seat.py needs Ray: its wheel (79 MB) travels in two parts, joined and installed into /tmp/site first
# (docs/gpu-validation.md, session 4). NVLink multicast stays off (the lending host's rule).
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
script=gpu_watchdog.py
if [[ "${1:-}" == graphs ]]; then
  out=${2:-${OUT:-/tmp/gpu-out}}
  mkdir -p "$out/graphs"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/graphs/gpus.txt" || true
  rc=0
  python3 bench/gpu/graph_cost.py --out "$out" 2>&1 | tee "$out/graph_cost.log" || rc=1
  python3 bench/gpu/gpu_watchdog.py --graphs --nodes 1 --gpus-per-node 1 --draft on --skip-probe-cost \
    --scenarios gpu-stall:0,gpu-stall:0,crash:0 --out "$out/graphs" 2>&1 | tee "$out/graphs/run.log" || rc=1
  exit $rc
fi
if [[ "${1:-}" == *.py ]]; then script=$1; shift; fi
python3 "bench/gpu/$script" "$@"
