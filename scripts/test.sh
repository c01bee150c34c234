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
# Integration tests one at a time: on two workers, runs in a fresh clone failed where modules ran side by side
# (seats' `up` timing out, a raylet-kill capture, a sidecar snapshot), different ones each run.
echo "== pytest: integration tests"
python -m pytest -q -p no:cacheprovider -m "not slow" --durations=15 tests/integration || rc=$?
exit $rc
