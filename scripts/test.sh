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
# Unit and contract tests are CPU-bound and share nothing: two pytest-xdist workers (a contract module stays on
# one worker, tests/contract/conftest.py). Tests marked slow (the watchdog soak's CI size) are left to
# `bash scripts/test.sh -m slow`.
rc=0
echo "== pytest: unit and contract tests (2 workers)"
python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup tests/unit tests/contract || rc=$?
# Integration tests in two streams at once, each one module at a time (tests/integration/conftest.py says why
# these two): the modules with a local Ray cluster on 127.0.0.1, and the rest. Each stream's output goes to its
# own log, printed when both have ended.
# Stream 'sglang' (real SGLang seats through a local Ray cluster) runs after 'ray' in the same slot: two local
# Ray clusters must never run at once. Its exit code is kept apart from 'ray''s.
echo "== pytest: integration tests (streams 'ray' then 'sglang', beside 'other'; printed when all end)"
logs=$(mktemp -d)
trap 'kill $pid_ray $pid_other 2>/dev/null || true' INT TERM
pid_ray="" pid_other=""
run_stream() {
  local s0; s0=$(date +%s)
  local src=0
  SGL_SEAT_STREAM=$1 python -m pytest -q -p no:cacheprovider -m "not slow" --durations=10 tests/integration \
    > "$logs/$1.log" 2>&1 || src=$?
  echo "(stream $1 took $(( $(date +%s) - s0 )) s)" >> "$logs/$1.log"
  echo "$src" > "$logs/$1.rc"
}
( run_stream ray; run_stream sglang ) &
pid_ray=$!
run_stream other &
pid_other=$!
wait "$pid_ray" || true
wait "$pid_other" || true
for stream in ray sglang other; do
  src=$(cat "$logs/$stream.rc" 2>/dev/null || echo 1)
  # pytest's 5 is "no tests collected": a stream with no module selected is not a failure.
  [ "$src" = 5 ] && src=0
  echo "== integration stream '$stream' (exit $src)"; cat "$logs/$stream.log"
  [ "$src" -gt "$rc" ] && rc=$src
done
rm -rf "$logs"
exit $rc
