"""A node's capture: Python stacks first, native ones by priority inside a budget, and the bundle says what missed it.

Why: the soak measured 4-14 s from a stall passing its threshold to the bundle on disk (target 3 s), most of it
native py-spy dumps (CPU-bound, 0.3-2 s each for a scheduler with torch loaded on 2 cores) that the capture waited
for one process after another. py-spy is replaced here by a fake with set costs (no subprocess, no timing of a real
tool): what is checked is the order, the budget and what the steps say.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from sgl_seat.core.records import Frame, ThreadStack
from sgl_seat.watchdog import capture as cap
from sgl_seat.watchdog.procfind import EngineProc
from sgl_seat.watchdog.pyspy import DumpResult

PROCS = [EngineProc(10, "python -m sglang.launch_server", None, "main", 0.0),
         EngineProc(11, "sglang::scheduler_TP0_EP0", 0, "scheduler", 0.0),
         EngineProc(12, "sglang::scheduler_TP1_EP1", 1, "scheduler", 0.0),
         EngineProc(13, "sglang::detokenizer", None, "detokenizer", 0.0)]
THREADS = (ThreadStack(1, "MainThread", True, False, (Frame("step", "/x.py", 1),)),)


class FakePySpy:
    """pyspy_dump's stand-in: a Python dump costs ``py_s``; a native one costs ``native_s[pid]`` (past its timeout:
    a timeout, as the real one reports it). Records the order native dumps began in."""

    def __init__(self, native_s: dict[int, float], py_s: float = 0.01) -> None:
        self.native_s, self.py_s = native_s, py_s
        self.began: list[int] = []
        self.py_done_at: float | None = None
        self.first_native_at: float | None = None
        self._lock = threading.Lock()

    def __call__(self, pid: int, *, exe: str, native: bool = False, timeout_s: float = 2.0) -> DumpResult:
        if not native:
            time.sleep(self.py_s)
            with self._lock:
                self.py_done_at = max(self.py_done_at or 0.0, time.monotonic())
            return DumpResult(THREADS, None, self.py_s, False)
        with self._lock:
            self.began.append(pid)
            self.first_native_at = self.first_native_at or time.monotonic()
        cost = self.native_s[pid]
        time.sleep(min(cost, timeout_s))
        if cost > timeout_s:
            return DumpResult((), f"py-spy timed out after {timeout_s:g}s", timeout_s, True, timed_out=True)
        return DumpResult(THREADS, None, cost, True)


def _part(fake: FakePySpy, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> dict[str, Any]:
    monkeypatch.setattr(cap, "pyspy_dump", fake)
    monkeypatch.setattr(cap, "native_workers", lambda: 2)
    return cap.node_part(node=0, procs=PROCS, pyspy="/fake/py-spy", samples=[], probes=[], metrics=[], logs=[],
                         processes=[], log_text="", env={}, gpu=False, **kw)


def _native(part: dict[str, Any]) -> list[dict[str, Any]]:
    """The part's capture-time stacks as they reach the coordinator over Ray (its wire form, decoded)."""
    return [s.to_json() for s in cap.decode_parts([cap.wire(part)]).native]


def _steps(part: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["step"]: s for s in part["capture"]}


def test_python_stacks_first_then_natives_by_priority_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN rank 1 named by the node's verdict, natives of 0.1 s for the schedulers and 30 s (a stuck unwind) for
    the launcher and detokenizer, a 0.6 s budget WHEN the part is taken THEN every Python dump is in before any
    native begins, rank 1's native begins first and lands, rank 0's too, the others time out inside the budget,
    and every process still has a capture-time stack."""
    fake = FakePySpy({10: 30.0, 11: 0.1, 12: 0.1, 13: 30.0})
    t0 = time.monotonic()
    part = _part(fake, monkeypatch, native_budget_s=0.6, focus_ranks=[1])
    took = time.monotonic() - t0
    assert fake.py_done_at is not None and fake.first_native_at is not None
    assert fake.py_done_at <= fake.first_native_at
    assert set(fake.began[:2]) == {11, 12}, fake.began  # the schedulers (rank 1 named) begin first
    steps = _steps(part)
    assert steps["py-spy --native 12"]["status"] == "ok" and steps["py-spy --native 11"]["status"] == "ok"
    for pid in (10, 13):
        st = steps[f"py-spy --native {pid}"]
        assert st["status"] in ("timeout", "skipped"), st
        assert "native budget" in st["detail"] and "Python-only stack kept" in st["detail"], st
    natives = {s["pid"]: s["native"] for s in _native(part)}
    assert natives == {10: False, 11: True, 12: True, 13: False}  # a capture-time stack for each, said which
    assert took < 0.6 + 2.0, took  # the 30 s unwinds did not hold the part (2 s of slack for a loaded box)


def test_a_dump_not_begun_in_time_is_skipped_and_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN two workers busy with 0.5 s natives and a 0.3 s budget THEN the next two never begin: skipped."""
    fake = FakePySpy({10: 0.5, 11: 0.5, 12: 0.5, 13: 0.5})
    part = _part(fake, monkeypatch, native_budget_s=0.3)
    steps = _steps(part)
    assert sorted(fake.began) == [11, 12]  # schedulers first by rank, then the rest: these two never began
    assert [steps[f"py-spy --native {p}"]["status"] for p in (10, 13)] == ["skipped", "skipped"]
    assert "not begun within the capture's native budget (0.30s)" in steps["py-spy --native 13"]["detail"]


def test_native_dumps_stop_at_the_deadline_after_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a deadline (detection + NATIVE_BY_S) already past when the Python dumps are in (the host was busy)
    THEN no native dump begins: the time lost comes out of the native budget, not on top of it; and a deadline
    0.3 s ahead cuts a 5 s budget to 0.3 s."""
    fake = FakePySpy({10: 0.1, 11: 0.1, 12: 0.1, 13: 0.1})
    part = _part(fake, monkeypatch, native_budget_s=5.0, native_deadline=time.time() - 1.0)
    assert fake.began == [] and all(not s["native"] for s in _native(part)) and len(_native(part)) == 4
    assert {st["status"] for st in part["capture"] if st["step"].startswith("py-spy --native")} == {"skipped"}
    slow = FakePySpy({10: 30.0, 11: 30.0, 12: 30.0, 13: 30.0})
    t0 = time.monotonic()
    _part(slow, monkeypatch, native_budget_s=5.0, native_deadline=time.time() + 0.3)
    assert time.monotonic() - t0 < 0.3 + 2.0  # not 5 s (2 s of slack for a loaded box)


def test_native_order() -> None:
    order = [ep.pid for ep in cap.native_order(PROCS, focus_ranks=[1])]
    assert order == [12, 11, 10, 13]
    assert [ep.pid for ep in cap.native_order(PROCS)] == [11, 12, 10, 13]
