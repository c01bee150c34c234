#!/usr/bin/env bash
# Install just enough of SGLang 0.5.23 to run its OWN command-line parser
# (`ServerArgs.add_cli_args` + `ServerArgs.from_cli_args` from
# `sglang.srt.server_args`) and its OWN startup KV-pool sizing (ServerArgs
# resolution, ModelConfig, the pool configurators; sgl_seat/sizing/child.py)
# on a CPU-only machine, without a GPU and without sglang's ~80 GPU-centric
# runtime dependencies.
#
# Preconditions: the active interpreter (or $PYTHON) belongs to a venv that
# already has torch installed (CI: torch==2.13.0 CPU). torch is never touched:
# every pip call here runs with a constraint pinning the installed version.
#
# What gets installed:
#   * sglang==0.5.23 with --no-deps (its metadata asks for torch==2.14.1,
#     flashinfer, CUDA wheels, ...; none of that is needed to import the
#     parser, and pip prints a harmless "dependency conflicts" notice).
#   * the import-time dependencies of `sglang.srt.server_args`, pinned below,
#     installed only if their module is not importable already (so versions
#     the project venv already pins are left alone).
#   * the sizing path's import-time dependencies (SIZING_DEPS, pinned to what
#     sglang 0.5.23's metadata asks for where it pins: transformers 5.19.0,
#     tokenizers 0.23.2, apache-tvm-ffi 0.1.11, sentencepiece 0.2.1, openai
#     2.8.0), and three installed without their own dependencies
#     (NODEPS_DEPS: compressed-tensors 0.18.0 would pull a second torch).
#     torchvision has no CPU wheel for torch 2.13 on PyPI; the sizing child
#     stands in an import stub for it (SGLang imports it for image transforms).
#   * triton: `sglang/srt/utils/common.py` does a top-level `import triton`;
#     an empty stub breaks `torch._dynamo`, so the real wheel is required
#     (~190 MB wheel for 3.7.1, ~1 GB unpacked). 3.7.1 is the triton that the
#     Linux torch==2.13.0 wheel itself pins.
#
# Idempotent: if `import sglang.srt.server_args` already works with
# sglang==0.5.23 installed, it exits in ~2 s without calling pip.
#
# Env overrides:
#   PYTHON        interpreter to use (default: python3 from PATH, i.e. the active venv)
#   SGLANG_WHEEL  path to a local sglang-0.5.23 wheel to install instead of PyPI
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/envcompat.sh"  # old variable names, for one release (issue 49)

PY="${PYTHON:-python3}"
SGLANG_VERSION="0.5.23"

# module-to-import  pip-requirement
DEPS=(
  "numpy      numpy==2.4.6"
  "orjson     orjson==3.13.0"
  "psutil     psutil==7.2.2"
  "pybase64   pybase64==1.5.1"
  "requests   requests==2.34.2"
  "packaging  packaging==26.4"
  "PIL        pillow==13.0.0"
  "starlette  starlette==1.10.0"
  "msgspec    msgspec==0.23.0"
  "pydantic   pydantic==2.14.4"
  "zmq        pyzmq==27.3.0"
  "tqdm       tqdm==4.70.1"
  "IPython    ipython==9.18.1"
  "aiohttp    aiohttp==3.14.5"
  "triton     triton==3.7.1"
  "transformers transformers==5.19.0"
  "tokenizers tokenizers==0.23.2"
  "tvm_ffi    apache-tvm-ffi==0.1.11"
  "dill       dill==0.4.1"
  "sentencepiece sentencepiece==0.2.1"
  "loguru     loguru==0.7.3"
  "gguf       gguf==0.19.0"
  "openai     openai==2.8.0"
)
# Installed with --no-deps (module-to-import pip-requirement).
NODEPS_DEPS=(
  "compressed_tensors compressed-tensors==0.18.0"
  "partial_json_parser partial-json-parser==0.2.1.1.post7"
  "einops     einops==0.8.2"
)

log() { echo "[install-sglang-parser] $*" >&2; }

parser_ok() {
  "$PY" - "$SGLANG_VERSION" >/dev/null 2>&1 <<'PYEOF'
import sys
from importlib.metadata import version
assert version("sglang") == sys.argv[1], version("sglang")
import argparse
from sglang.srt.server_args import ServerArgs
ServerArgs.add_cli_args(argparse.ArgumentParser())
PYEOF
}

start=$(date +%s)

# Every module of DEPS and NODEPS_DEPS findable (cheap: no imports).
deps_present() {
  local mods=()
  for entry in "${DEPS[@]}" "${NODEPS_DEPS[@]}"; do
    read -r mod _ <<<"$entry"
    mods+=("$mod")
  done
  "$PY" - "${mods[@]}" >/dev/null 2>&1 <<'PYEOF'
import importlib.util, sys
missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
sys.exit(1 if missing else 0)
PYEOF
}

# SGLang's sizing path imports (run once after installing; ~10 s).
sizing_ok() {
  "$PY" -c 'from sgl_seat.sizing.child import Sizer; Sizer()' >/dev/null 2>&1
}

if parser_ok && deps_present; then
  log "sglang==${SGLANG_VERSION} parser already importable with $("$PY" -c 'import sys; print(sys.executable)'); nothing to do."
  exit 0
fi

if ! torch_version=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
  log "ERROR: torch is not importable by $PY. Install torch first (CPU build, e.g."
  log "       pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu)."
  exit 1
fi
log "using $("$PY" -c 'import sys; print(sys.executable)') (torch ${torch_version})"

tmpdir=$(mktemp -d)
trap 'rm -rf "$tmpdir"' EXIT
echo "torch==${torch_version}" > "$tmpdir/constraints.txt"

# uv when setup.sh found one (SGLSEAT_UV): the triton and transformers wheels install in seconds instead of
# minutes; pip otherwise. Both take the same pins, the torch constraint and binary wheels only.
if [[ -n "${SGLSEAT_UV:-}" && -x "${SGLSEAT_UV}" ]]; then
  PIP=("$SGLSEAT_UV" pip install -q --python "$("$PY" -c 'import sys; print(sys.executable)')" --only-binary :all: -c "$tmpdir/constraints.txt")
else
  PIP=("$PY" -m pip install --disable-pip-version-check --no-input
       --only-binary=:all: -c "$tmpdir/constraints.txt")
fi

# Which pinned deps are missing? (one interpreter start, not one per module)
mods=()
for entry in "${DEPS[@]}"; do
  read -r mod _ <<<"$entry"
  mods+=("$mod")
done
missing_mods=$("$PY" - "${mods[@]}" <<'PYEOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
PYEOF
)

reqs=()
for entry in "${DEPS[@]}"; do
  read -r mod req <<<"$entry"
  for m in $missing_mods; do
    if [[ "$m" == "$mod" ]]; then reqs+=("$req"); fi
  done
done

if ((${#reqs[@]})); then
  log "installing: ${reqs[*]}"
  "${PIP[@]}" "${reqs[@]}"
else
  log "all import-time dependencies already present"
fi

nodeps=()
for entry in "${NODEPS_DEPS[@]}"; do
  read -r mod req <<<"$entry"
  if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)"; then
    nodeps+=("$req")
  fi
done
if ((${#nodeps[@]})); then
  log "installing without dependencies: ${nodeps[*]}"
  "${PIP[@]}" --no-deps "${nodeps[@]}"
fi

installed_sglang=$("$PY" -c 'from importlib.metadata import version; print(version("sglang"))' 2>/dev/null || true)
if [[ "$installed_sglang" != "$SGLANG_VERSION" ]]; then
  src="${SGLANG_WHEEL:-sglang==${SGLANG_VERSION}}"
  log "installing ${src} with --no-deps"
  # pip may print "sglang 0.5.23 requires ..., which is not installed" /
  # "requires torch==2.14.1": expected and harmless for parser-only use.
  "${PIP[@]}" --no-deps "$src"
fi

if ! parser_ok; then
  log "ERROR: sglang.srt.server_args still fails to import; traceback follows."
  "$PY" -c 'import sglang.srt.server_args' || true
  exit 1
fi
if ! sizing_ok; then
  log "ERROR: SGLang's sizing path fails to import; traceback follows."
  "$PY" -c 'from sgl_seat.sizing.child import Sizer; Sizer()' || true
  exit 1
fi
log "done in $(( $(date +%s) - start ))s"
