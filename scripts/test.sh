#!/usr/bin/env bash
# The test command (README's second command; .ci/run calls exactly this): set up, then lint,
# type-check and run every test. Integration tests start local Ray clusters and sim engines on
# 127.0.0.1 only and leave nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
. .venv/bin/activate
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
# Tests talk to 127.0.0.1 only: never through a proxy the environment may name.
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"
echo "== ruff"; ruff check .
echo "== mypy --strict"; mypy sgl_seat
if [ $# -gt 0 ]; then
  echo "== pytest $*"; exec python -m pytest -q -p no:cacheprovider "$@"
fi
rc=0
# Four parts in two slots at once, each part's output in its own log, printed when all have ended:
# - slot A: stream 'sglang' (real SGLang seats through a local Ray cluster: mostly waiting on the engine, so it
#   overlaps the CPU-bound unit tests well), then stream 'ray' (the modules with a local Ray cluster): one after the
#   other, since two local Ray clusters must never run at once (tests/integration/conftest.py);
# - slot B: the unit and contract tests (two pytest-xdist workers; a contract module stays on one worker,
#   tests/contract/conftest.py), then stream 'other' (the integration modules without a local Ray cluster).
# Each stream runs one module at a time. Tests marked slow (the watchdog soak's CI size) are left to
# `bash scripts/test.sh -m slow`.
echo "== pytest: stream 'sglang' then 'ray', beside the unit and contract tests then stream 'other' (printed when all end)"
logs=$(mktemp -d)
trap 'kill $pid_a $pid_b 2>/dev/null || true' INT TERM
pid_a="" pid_b=""
run_stream() {
  local s0; s0=$(date +%s)
  local src=0
  SGL_SEAT_STREAM=$1 python -m pytest -q -p no:cacheprovider -m "not slow" --durations=10 tests/integration \
    > "$logs/$1.log" 2>&1 || src=$?
  echo "(stream $1 took $(( $(date +%s) - s0 )) s)" >> "$logs/$1.log"
  echo "$src" > "$logs/$1.rc"
}
run_units() {
  local s0; s0=$(date +%s)
  local src=0
  python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup tests/unit tests/contract > "$logs/units.log" 2>&1 \
    || src=$?
  echo "(unit and contract tests took $(( $(date +%s) - s0 )) s)" >> "$logs/units.log"
  echo "$src" > "$logs/units.rc"
}
( run_stream sglang; run_stream ray ) &
pid_a=$!
( run_units; run_stream other ) &
pid_b=$!
wait "$pid_a" || true
wait "$pid_b" || true
for stream in units sglang ray other; do
  src=$(cat "$logs/$stream.rc" 2>/dev/null || echo 1)
  # pytest's 5 is "no tests collected": a stream with no module selected is not a failure.
  [ "$src" = 5 ] && src=0
  echo "== $([ "$stream" = units ] && echo "unit and contract tests" || echo "integration stream '$stream'") (exit $src)"
  cat "$logs/$stream.log"
  [ "$src" -gt "$rc" ] && rc=$src
done
rm -rf "$logs"
exit $rc
