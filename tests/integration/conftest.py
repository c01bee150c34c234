"""Integration modules run in three streams (scripts/test.sh), each stream one module after another.

Why streams: the integration tests wait far more than they compute (Ray and engines starting, detections,
timeouts); one at a time they would not fit the CI tier's 20 minutes on 2 cores. The streams:

* ``sglang``: the real-engine modules that bring SGLang up through `sgl-seat up` (a local Ray cluster of each seat's
  own; ports 24100-24199 and, for the watchdog on real schedulers, 24200-24299), and the real vLLM seat (24700-24719);
* ``ray``: the modules whose sim seats run on a local Ray cluster on 127.0.0.1 (runbooks 30500-30599, the watchdog
  seat 26600-26716, the remediation seat 27200-27240, the recorded-settings seat 27500-27516, lifecycle and two
  seats 23000-23999), one module at a time, in :data:`RAY_LOCAL`'s order (test_two_seats runs its two seats'
  clusters side by side: the point of it);
* ``other``: the other modules (sim 32000-32767, soak 30800-30899, Prometheus 30900-30930, raw prompts 26750-26766,
  the sidecar 26110-26111, test_sim_vs_real's real seat started without Ray 24500-24599, the gate 30740-30799, the
  two-namespace cluster, whose Ray lives in network namespaces of its own), and two that start a local Ray cluster
  of their own: the demo (30600-30699) and test_launch_shared (23000-23999). Those two run beside stream ``ray``'s
  cluster: two local clusters share nothing (each head takes a free GCS port, Ray picks its other ports free, and
  each session has its own directory under /tmp/ray; bench/ray_side_by_side.py holds that to 20 `up`/`down` pairs
  side by side), and they take about a minute off the slot that runs ``sglang`` then ``ray``, the longer one.

Stream ``sglang`` runs first, then ``ray``, in one slot; beside them the unit tests at niceness 10, then ``other``
with ruff and mypy at niceness 10 (scripts/test.sh says why: on a saturated 2-core box the streams' deadlines need
the CPU). The port ranges of all
three streams are disjoint, below Linux's ephemeral range (32768-60999: a fixed port in it can be taken at any moment
as the local port of another process's outgoing connection) and above Ray's worker ports (10002-19999).

Tiers: a test or module marked ``slow`` runs in the full tier only (`bash scripts/test.sh --full`); the README's
"The tests" lists each with the reason, and tests/tiers.py gives the few windows that are longer in the full tier.

``SGLSEAT_STREAM=ray|sglang|other`` selects a stream's modules (unset: every module, in file order).
"""

from __future__ import annotations

import os

import pytest

#: Stream ``ray``: modules starting a local Ray cluster on 127.0.0.1 (one at a time, in this order: the longest first).
RAY_LOCAL = ("test_runbooks", "test_watchdog_seat", "test_remediation", "test_recorded_settings",
             "test_launch_lifecycle", "test_two_seats")
#: Stream ``other``'s modules that run last, after its others (file order otherwise): the gate's timed sim arms,
#: whose shape the CPU decides, when the other slot (stream ``ray``) has most likely ended: at the start of ``other``,
#: beside stream ``ray``, the battery lost its shape once (the CI run of 2026-12-06 19:02), not at its end.
OTHER_LAST = ("test_gate",)
#: Real SGLang and vLLM seats through a local Ray cluster: stream ``sglang``, before stream ``ray``.
REAL_ENGINE = ("test_real_sglang_seat", "test_real_sglang_watchdog", "test_real_sglang_healing", "test_netns_sglang",
               "test_real_vllm_seat", "test_real_vllm_eagle")
STREAMS = ("ray", "sglang", "other")
STREAM_ENV = "SGLSEAT_STREAM"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stream = os.environ.get(STREAM_ENV, "").strip()
    if stream not in ("", *STREAMS):
        raise pytest.UsageError(f"{STREAM_ENV}={stream!r}: expected one of {', '.join(STREAMS)}")
    if not stream:
        return
    keep, drop = [], []
    for item in items:
        (keep if _stream_of(item) == stream else drop).append(item)
    if stream == "ray":
        keep.sort(key=lambda it: RAY_LOCAL.index(it.path.stem))  # stable: a module's own order is kept
    elif stream == "other":
        keep.sort(key=lambda it: it.path.stem in OTHER_LAST)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)


def _stream_of(item: pytest.Item) -> str:
    stem = item.path.stem if item.path.parent.name == "integration" else ""
    if stem in RAY_LOCAL:
        return "ray"
    return "sglang" if stem in REAL_ENGINE else "other"
