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
# Two pytest-xdist workers for each stage. Unit and contract tests are CPU-bound and share nothing (a contract
# module stays on one worker, tests/contract/conftest.py). Integration tests mostly wait on Ray, engines and
# detections; a module is never split, and modules that share a port range run one after the other
# (tests/integration/conftest.py); the modules marked serial there run alone afterwards. Tests marked slow (the watchdog soak's CI size) are left to
# `bash scripts/test.sh -m slow`.
rc=0
echo "== pytest: unit and contract tests (2 workers)"
python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup tests/unit tests/contract || rc=$?
echo "== pytest: integration tests (2 workers)"
python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup -m "not slow and not serial" --durations=15 \
  tests/integration || rc=$?
echo "== pytest: integration tests that run alone"
python -m pytest -q -p no:cacheprovider -m "serial and not slow" --durations=10 tests/integration || rc=$?
exit $rc
