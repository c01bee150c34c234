#!/usr/bin/env bash
# Set up sgl-seat on a fresh machine: a venv in .venv with the CPU torch the sim needs, the
# package (editable) and, with --test, the test tools and SGLang 0.5.23's argument parser.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
pip_q() { pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored: it is neither" || true; }
# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
python -c "import torch" 2>/dev/null || { echo "setup: installing torch==2.13.0 (CPU)"; pip_q torch==2.13.0; }
extras="sim"
[ $want_test = 1 ] && extras="sim,test"
need=0
python -c "import sgl_seat, ray, uvicorn, setproctitle, numpy" 2>/dev/null || need=1
if [ $want_test = 1 ]; then python -c "import pytest, xdist, mypy, hypothesis, jsonschema" 2>/dev/null || need=1; fi
if [ $need = 1 ]; then
  echo "setup: installing sgl-seat[$extras]"
  pip_q -e ".[$extras]"
fi
python -c "import sgl_seat, ray, torch" || { echo "setup: install failed" >&2; exit 1; }
if [ $want_test = 1 ]; then
  bash scripts/install-sglang-parser.sh
  if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian chromium (headless render test of replay's HTML)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "setup: chromium not installed; the HTML render test will be skipped" >&2
  fi
fi
echo "setup: ok ($(python --version), torch $(python -c 'import torch; print(torch.__version__)'))"
