"""StackSample.state (the /proc state at dump time): its JSON, the bundle's stack table both ways, the schema,
and the sampler that reads it (a stopped detokenizer is sampled every round, not every ``others_every_s``)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from sgl_seat.core.records import Frame, RecordError, StackSample, ThreadStack
from sgl_seat.forensics.format.codec import decode_stack_samples, encode_stack_samples
from sgl_seat.watchdog import sampler as sampler_mod
from sgl_seat.watchdog.procfind import EngineProc
from sgl_seat.watchdog.pyspy import DumpResult

ROOT = Path(__file__).resolve().parents[2]
TH = ThreadStack(1, "MainThread", True, False, (Frame("Scheduler._poll_timeout_aborts", "/x/scheduler.py", 3605),))


def _s(t: float, state: str | None, *, pid: int = 7, error: str | None = None) -> StackSample:
    return StackSample(t=t, node=0, pid=pid, title="sglang::scheduler_TP0", rank=0, native=False,
                       threads=() if error else (TH,), error=error, state=state)


def test_state_is_written_only_when_set() -> None:
    assert "state" not in _s(1.0, None).to_json()
    assert _s(1.0, "T").to_json()["state"] == "T"
    assert StackSample.from_json(_s(1.0, "T").to_json()) == _s(1.0, "T")
    assert StackSample.from_json(_s(1.0, None).to_json()).state is None


@pytest.mark.parametrize("bad", ["TT", "", "1", 3, "é"])
def test_a_malformed_state_is_refused(bad: object) -> None:
    doc = {**_s(1.0, None).to_json(), "state": bad}
    with pytest.raises(RecordError):
        StackSample.from_json(doc)


def test_the_stack_table_round_trips_state_on_its_fast_and_general_paths() -> None:
    """Same head fields, different states (and none): each sample comes back with its own state, also when a
    line's text after ``t`` repeats an earlier one (the decoder's fastest path)."""
    samples = [_s(1.0, "S"), _s(2.0, "T"), _s(3.0, "T"), _s(4.0, None), _s(5.0, "T", error="py-spy failed"),
               _s(6.0, "R", pid=8), _s(7.0, "S")]
    raw = encode_stack_samples(samples)
    assert raw.count(b'"state":"T"') == 3
    assert decode_stack_samples(io.BytesIO(raw), "stacks.jsonl") == samples
    # A plain to_json() line (the general path) carries it too.
    plain = (json.dumps(_s(9.0, "T").to_json()) + "\n").encode()
    assert decode_stack_samples(io.BytesIO(plain), "stacks.jsonl")[0].state == "T"


def test_schema_and_readme_name_the_new_kind_and_field() -> None:
    schema = json.loads((ROOT / "forensics" / "bundle.schema.json").read_text())
    assert "process stopped" in schema["$defs"]["verdict"]["properties"]["kind"]["enum"]
    readme = (ROOT / "forensics" / "README.md").read_text()
    assert "state" in readme and "| 1.2 |" in readme
    fmt = re.search(r"format (\d+)\.(\d+)", schema["title"])
    assert fmt is not None and (int(fmt[1]), int(fmt[2])) >= (1, 2), schema["title"]  # 1.2 brought the field


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_sampler_records_state_and_samples_a_stopped_detokenizer_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    procs = [EngineProc(10, "sglang::scheduler_TP0", 0, "scheduler", 1.0),
             EngineProc(11, "sglang::detokenizer", None, "detokenizer", 1.0),
             EngineProc(12, "python -m sglang.launch_server", None, "main", 1.0)]
    states = {10: "R", 11: "S", 12: "S"}
    dumped: list[int] = []

    def dump(pid: int, **_kw: object) -> DumpResult:
        dumped.append(pid)
        return DumpResult((TH,), None, 0.01, False)

    monkeypatch.setattr(sampler_mod, "pid_state", lambda pid: states.get(pid))
    monkeypatch.setattr(sampler_mod, "pyspy_dump", dump)
    monkeypatch.setattr(sampler_mod.Sampler, "refresh", lambda self, force=False: None)
    clock = _Clock()
    s = sampler_mod.Sampler(node=0, discover=lambda: procs, pyspy="/bin/py-spy", clock=clock, others_every_s=5.0)
    s._known = {e.pid: e for e in procs}
    first = s.sample_once()
    assert {x.pid: x.state for x in first} == {10: "R", 11: "S", 12: "S"}
    clock.t += 1.0
    assert [x.pid for x in s.sample_once()] == [10]  # others wait for others_every_s
    states[11] = "T"
    for _ in range(3):
        clock.t += 1.0
        got = {x.pid: x.state for x in s.sample_once()}
        assert got == {10: "R", 11: "T"}, got  # the stopped detokenizer every round; main still every 5 s
    states[11] = "S"
    clock.t += 1.0
    got = {x.pid: x.state for x in s.sample_once()}
    assert got == {10: "R", 12: "S"}, got  # running again: back to every others_every_s (main's turn, 5 s on)
