#!/usr/bin/env bash
# SGLang 0.5.17's own command-line parser, for the contract test of the H200 seat (tests/contract/
# test_plan_argv_sglang_0517.py): the GPU seat runs 0.5.17 (the newest release built for the H200 image's torch
# 2.11), the CPU engine and the rest of the contracts 0.5.23.
#
# What: the sglang==0.5.17 wheel and the two packages it needs at another version than the CPU engine's
# environment has (transformers 5.12.1: the engine environment's newer one refuses 0.5.17 at import, "'qwen3_asr' is
# already used"; tokenizers 0.22.2, which 5.12.1 asks for), unzipped side by side into one directory that goes first
# on PYTHONPATH in front of the CPU engine's interpreter (.venv-sglang), whose torch and other packages serve the
# import. Only its Python is used there (the wheel is built for Python 3.12; its compiled parts are never loaded).
# Registry wheels only, fetched without their dependencies.
#
# Where: ${SGLSEAT_CACHE:-~/.cache/sgl-seat}/sglang-0.5.17-parser, made once per machine (a stamp of this script);
# the test finds it there. Idempotent; says what it did.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/envcompat.sh  # old variable names, for one release (issue 49)
log() { echo "[sglang 0.5.17 parser] $*"; }
cache=${SGLSEAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sgl-seat}
dest=$cache/sglang-0.5.17-parser
want=$(sha256sum scripts/install-sglang-0517-parser.sh | cut -c1-16)
if [ -f "$dest/.stamp" ] && [ "$(cat "$dest/.stamp")" = "$want" ] && [ -f "$dest/sglang/srt/server_args.py" ]; then
  log "up to date in $dest"
  exit 0
fi
start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
log "fetching sglang==0.5.17 transformers==5.12.1 tokenizers==0.22.2 (wheels, no dependencies)"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp" sglang==0.5.17 transformers==5.12.1 tokenizers==0.22.2 2>&1 \
  | { grep -v "is ignored: it is neither" || true; }
rm -rf "$dest.new"
mkdir -p "$dest.new"
for w in "$tmp"/*.whl; do "$PY" -m zipfile -e "$w" "$dest.new"; done
echo "$want" > "$dest.new/.stamp"
rm -rf "$dest"
mv "$dest.new" "$dest"
log "ok: $dest ($(du -sh "$dest" | cut -f1)) in $(( $(date +%s) - start )) s"
