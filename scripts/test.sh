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
echo "== pytest: integration tests (two streams: 'ray' and 'other', printed when both end)"
logs=$(mktemp -d)
trap 'kill $pid_ray $pid_other 2>/dev/null || true' INT TERM
pid_ray="" pid_other=""
for stream in ray other; do
  SGL_SEAT_STREAM=$stream python -m pytest -q -p no:cacheprovider -m "not slow" --durations=10 tests/integration \
    > "$logs/$stream.log" 2>&1 &
  eval "pid_$stream=$!"
done
for stream in ray other; do
  eval "pid=\$pid_$stream"
  src=0; wait "$pid" || src=$?
  echo "== integration stream '$stream' (exit $src)"; cat "$logs/$stream.log"
  [ "$src" -gt "$rc" ] && rc=$src
done
rm -rf "$logs"
exit $rc
