#!/usr/bin/env bash
# Set up sgl-seat on a fresh machine: a venv in .venv with the CPU torch the sim needs, the
# package (editable) and, with --test, the test tools and SGLang 0.5.23's argument parser.
# --engine sglang also installs the real engine's own environment, .venv-sglang (SGLang 0.5.23 on its CPU
# engine, scripts/install-sglang-engine.sh); --test does too (the real-engine tests need it).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0 want_engine=0
while [ $# -gt 0 ]; do
  case "$1" in
    --test) want_test=1; want_engine=1 ;;
    --engine) shift; [ "${1:-}" = sglang ] || { echo "setup: --engine takes 'sglang'" >&2; exit 2; }; want_engine=1 ;;
    --engine=sglang) want_engine=1 ;;
    *) echo "setup: unknown option $1 (use --test, --engine sglang)" >&2; exit 2 ;;
  esac
  shift
done

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
# Debian packages for the tests (chromium for the HTML render tests, Prometheus) install in the background, beside the
# Python packages: apt is network and disk, pip/uv mostly CPU. Waited for before setup says ok.
deb_pid=""
if [ $want_test = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  debs=""
  command -v chromium >/dev/null 2>&1 || debs="$debs chromium"
  # Prometheus and promtool: the alert rules are checked and the hang alert is seen firing in a real one.
  command -v promtool >/dev/null 2>&1 || debs="$debs prometheus"
  if [ -n "$debs" ]; then
    echo "setup: installing Debian packages:$debs (in the background; log in .venv/apt.log)"
    ( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $debs) >.venv/apt.log 2>&1 \
      || echo "setup: Debian packages not installed ($debs): the tests that need them skip and say why" >&2 ) &
    deb_pid=$!
  fi
fi
pip_q() { pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored: it is neither" || true; }
# torch first and pinned, through pip (pip finds the CPU wheel on this machine's disk; an unpinned torch pulls
# a multi-GB CUDA build). --no-compile: byte-compiling torch's thousands of modules costs minutes on 2 cores;
# Python compiles the ones it imports on first use.
python -c "import torch" 2>/dev/null || { echo "setup: installing torch==2.13.0 (CPU)"; pip_q --no-compile torch==2.13.0; }
# Everything else through uv when it can be had: measured side by side on a loaded 2-core machine, uv installed
# sgl-seat[sim,test] in 36 s where pip took 400 s. pip stays the fallback. torch is installed by then, so
# no requirement below pulls another one.
[ -x .venv/bin/uv ] || pip_q --no-compile uv==0.13.9
export SGL_SEAT_UV=""
[ -x .venv/bin/uv ] && SGL_SEAT_UV="$PWD/.venv/bin/uv"
inst() {
  if [ -n "$SGL_SEAT_UV" ]; then "$SGL_SEAT_UV" pip install -q --python "$PWD/.venv/bin/python" "$@"; else pip_q "$@"; fi
}
# The engine's environment (its own venv, a per-user cache: scripts/install-sglang-engine.sh) is made or checked in
# the background beside the rest: the two share nothing but uv's cache, and its check alone (importing SGLang) is
# tens of seconds. Its output is printed when it ends, below.
eng_pid=""
if [ $want_engine = 1 ]; then
  bash scripts/install-sglang-engine.sh > .venv/engine-setup.log 2>&1 &
  eng_pid=$!
fi
extras="sim"
[ $want_test = 1 ] && extras="sim,test"
need=0
python -c "import sgl_seat, ray, uvicorn, setproctitle, numpy" 2>/dev/null || need=1
if [ $want_test = 1 ]; then python -c "import pytest, xdist, mypy, hypothesis, jsonschema" 2>/dev/null || need=1; fi
if [ $need = 1 ]; then
  echo "setup: installing sgl-seat[$extras]"
  inst -e ".[$extras]"
fi
python -c "import sgl_seat, ray, torch" || { echo "setup: install failed" >&2; exit 1; }
if [ $want_test = 1 ]; then
  bash scripts/install-sglang-parser.sh
  bash scripts/install-sglang-0517-parser.sh
fi
if [ -n "$eng_pid" ]; then
  eng_rc=0; wait "$eng_pid" || eng_rc=$?
  cat .venv/engine-setup.log
  [ "$eng_rc" = 0 ] || { echo "setup: the engine's environment failed (exit $eng_rc; log above)" >&2; exit 1; }
fi
if [ -n "$deb_pid" ]; then wait "$deb_pid" || true; fi
echo "setup: ok ($(python --version), torch $(python -c 'import torch; print(torch.__version__)'))"
