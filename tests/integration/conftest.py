"""Integration modules run in two streams at once (scripts/test.sh), each stream one module after another.

Why two streams: the integration tests wait far more than they compute (Ray and engines starting, detections,
timeouts); one at a time they no longer fit CI's 20 minutes on 2 cores. Why these two: every module that starts
a Ray cluster on 127.0.0.1 runs in stream ``ray``, never beside another such module (two local clusters on one
host share Ray's fixed default ports and its /tmp/ray session files; beside each other, seats' `up` timed out in
earlier CI runs); stream ``other`` holds the modules without a local Ray cluster, and the two-host cluster,
whose Ray lives in network namespaces of its own. The two streams' port ranges do not overlap: launch
23000-23999, runbooks 30500-30599, the watchdog seat 26600-26716 and the remediation seat 27200-27240 in
``ray``; sim 32000-32767, gate 30740-30799, soak 30800-30899, Prometheus 30900-30930, raw prompts 26750-26766, the
sidecar 26110-26111 and the namespaces' own addresses in ``other``. All are below Linux's ephemeral range
(32768-60999): a fixed port in it can be taken at any moment as the local port of another process's outgoing
connection (a fresh-clone CI run failed on "address already in use" for 36752), and above Ray's worker ports
(10002-19999).

``SGL_SEAT_STREAM=ray|sglang|other`` selects a stream's modules (unset: every module, in file order). Stream
``sglang`` holds the real-engine modules that bring SGLang up through a local Ray cluster (ports 24100-24199 and,
for the watchdog on real schedulers, 24200-24299;
test_sim_vs_real starts real SGLang without Ray and stays in ``other``, ports 24500-24599);
scripts/test.sh runs it before stream ``ray`` in the same slot (beside the unit tests, which it overlaps well: it
mostly waits on the engine), since two local clusters must not run at once.
"""

from __future__ import annotations

import os

import pytest

#: The modules that start a local Ray cluster on 127.0.0.1 (one at a time, in this order: the longest first).
RAY_LOCAL = ("test_runbooks", "test_watchdog_seat", "test_remediation", "test_launch_shared", "test_launch_lifecycle",
             "test_demo")
#: Real SGLang seats through a local Ray cluster: stream ``sglang``, run before stream ``ray`` (never beside
#: another local cluster), beside the unit tests.
REAL_ENGINE = ("test_real_sglang_seat", "test_real_sglang_watchdog")
STREAMS = ("ray", "sglang", "other")
STREAM_ENV = "SGL_SEAT_STREAM"


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
    items[:] = keep
    config.hook.pytest_deselected(items=drop)


def _stream_of(item: pytest.Item) -> str:
    stem = item.path.stem if item.path.parent.name == "integration" else ""
    if stem in RAY_LOCAL:
        return "ray"
    return "sglang" if stem in REAL_ENGINE else "other"
