"""Rehearsal faults through the probe (``probe-stall``): the grammar, each trigger, the stall's bounds, the control
file (clear, re-arm, malformed), the stalled call in flight in the ring, and no gate at all in production."""

from __future__ import annotations

import itertools
import json
import os
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sgl_seat import probe
from sgl_seat.core.records import ProbeRecord
from sgl_seat.probe import fault, guard
from tests.unit.conftest import probe_writer

FAST_S = 0.15  # a call that did not stall returns well within this
STALL_S = 0.3


@pytest.fixture(params=["native", "python"])
def rehearsal(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A rehearsal process (rank 3, node 1) with a private probe directory, once with each ring writer."""
    d = tmp_path / "rings"
    d.mkdir(mode=0o700)
    monkeypatch.setenv(probe.ENV_DIR, str(d))
    monkeypatch.setenv(probe.ENV_SLOTS, "64")
    monkeypatch.setenv(probe.ENV_RANK, "3")
    monkeypatch.setenv(probe.ENV_NODE, "1")
    monkeypatch.setenv(probe.ENV_GPU, "0")
    monkeypatch.setenv(fault.ENV_REHEARSAL, "1")
    monkeypatch.delenv(fault.ENV_FAULTS, raising=False)
    monkeypatch.setattr(guard, "_WARNED", set())
    probe_writer(request.param, monkeypatch)
    # The ring's target table is process-wide and holds MAX_TARGETS names; each test's module has a new name.
    monkeypatch.setattr(probe.writer, "_TARGET_NAMES", [])
    monkeypatch.setattr(fault, "CHECK_EVERY_S", 0.05)  # quicker tests; test_the_control_file_is_looked_at_rarely
    fault.reset()
    yield d
    fault.reset()
    probe.reset()


_SEQ = iter(range(10**6))


def _module(src: str) -> types.ModuleType:
    """A fresh module (a new name per test: install is idempotent per target) holding ``src``."""
    name = f"probe_fault_t{next(_SEQ)}"
    mod = types.ModuleType(name)
    exec(compile(textwrap.dedent(src), f"<{name}>", "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


ROWS = """
    def fetch_rows(table, ids):
        return len(ids)
    def other_rows(table, ids):
        return -len(ids)
"""


def _install(mod: types.ModuleType, *names: str) -> None:
    targets = [f"{mod.__name__}:{n}@ids" for n in names or ("fetch_rows",)]
    state = probe.install(targets)
    assert all(state[t] == "installed" for t in targets), state


def _timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    t0 = time.monotonic()
    fn(*args, **kwargs)
    return time.monotonic() - t0


def _after_a_check() -> None:
    """Let the gate's next call look at the control file (it does at most every CHECK_EVERY_S)."""
    time.sleep(fault.CHECK_EVERY_S + 0.05)


# --- the grammar ---------------------------------------------------------------------------------------------


def test_grammar_round_trip_and_canonical_text() -> None:
    cases = {
        "probe-stall": fault.ProbeFault(),
        "probe-stall:": fault.ProbeFault(),
        "probe-stall:rank=1,after_calls=20,for_s=30": fault.ProbeFault(rank=1, after_calls=20, for_s=30.0),
        " probe-stall : for_s = 0.25 , target = Vocab , rank = 0 ":
            fault.ProbeFault(rank=0, for_s=0.25, target="Vocab"),
        "probe-stall:target=sglang.srt.layers.vocab_parallel_embedding:VocabParallelEmbedding.forward,gather_ge=0,"
        "node=2": fault.ProbeFault(node=2, gather_ge=0,
                                   target="sglang.srt.layers.vocab_parallel_embedding:VocabParallelEmbedding.forward"),
    }
    for text, want in cases.items():
        got = fault.parse_probe_fault(text)
        assert got == want, text
        assert fault.parse_probe_fault(got.spec()) == got
    assert fault.ProbeFault().spec() == "probe-stall"
    assert fault.parse_probe_fault("probe-stall:for_s=30,after_calls=20,rank=1").spec() == fault.EXAMPLE
    assert fault.ProbeFault(for_s=0.3, gather_ge=4096).spec() == "probe-stall:gather_ge=4096,for_s=0.3"
    assert fault.KIND == "probe-stall"
    assert fault.KEYS == ("rank", "node", "after_calls", "gather_ge", "for_s", "target")
    with pytest.raises(AttributeError):
        fault.ProbeFault().rank = 1  # type: ignore[misc]  # frozen
    for bad in ({"rank": -1}, {"after_calls": 1.5}, {"for_s": 0.0}, {"for_s": float("nan")}, {"target": "a,b"},
                {"target": ""}, {"target": " a"}, {"gather_ge": True}):
        with pytest.raises(ValueError):
            fault.ProbeFault(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "why"), [
    ("probe-hang:rank=1", "kind 'probe-hang'"),
    ("", "kind ''"),
    ("probe-stall:ranks=1", "unknown key 'ranks'"),
    ("probe-stall:rank=one", "rank='one' is not a whole number"),
    ("probe-stall:rank=-1", "rank='-1' is not a whole number"),
    ("probe-stall:after_calls=1.5", "after_calls='1.5'"),
    ("probe-stall:gather_ge=", "'gather_ge' has no value"),
    ("probe-stall:rank", "'rank' has no value"),
    ("probe-stall:for_s=0", "for_s='0' must be a finite number > 0"),
    ("probe-stall:for_s=-2", "must be a finite number > 0"),
    ("probe-stall:for_s=nan", "must be a finite number > 0"),
    ("probe-stall:for_s=inf", "must be a finite number > 0"),
    ("probe-stall:for_s=soon", "not a number of seconds"),
    ("probe-stall:rank=1,rank=2", "'rank' given twice"),
    ("probe-stall:rank=1,", "empty item"),
    ("probe-stall:target=a;b", "may not hold ';'"),
])
def test_grammar_errors_say_what_is_wrong_and_show_an_example(text: str, why: str) -> None:
    with pytest.raises(ValueError) as err:
        fault.parse_probe_fault(text)
    assert why in str(err.value)
    assert fault.EXAMPLE in str(err.value)


# --- production: no gate -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "0", "yes", ""])
def test_production_adds_no_gate(value: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without SGLSEAT_PROBE_REHEARSAL=1 the probe wrapper wraps the function itself (every kind of target), the
    gate is never built, and a launch-time fault (with a control file too) does nothing."""
    monkeypatch.setenv(probe.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(probe.ENV_GPU, "0")
    if value is None:
        monkeypatch.delenv(fault.ENV_REHEARSAL, raising=False)
    else:
        monkeypatch.setenv(fault.ENV_REHEARSAL, value)
    monkeypatch.setenv(fault.ENV_FAULTS, "probe-stall:for_s=5")
    fault.write_control(tmp_path, "probe-stall:for_s=5", fault_id="x")
    probe_writer("python", monkeypatch)
    monkeypatch.setattr(probe.writer, "_TARGET_NAMES", [])
    fault.reset()

    def no_gate(*_: Any) -> None:
        raise AssertionError("the gate was built in production")

    monkeypatch.setattr(fault, "gate", no_gate)
    mod = _module("""
        def fetch_rows(table, ids):
            return len(ids)
        class T:
            def m(self, ids):
                return 1
            @staticmethod
            def s(ids):
                return 2
            @classmethod
            def c(cls, ids):
                return 3
    """)
    plain, m, s, c = mod.fetch_rows, mod.T.__dict__["m"], mod.T.__dict__["s"].__func__, mod.T.__dict__["c"].__func__
    n = mod.__name__
    state = probe.install([f"{n}:fetch_rows@ids", f"{n}:T.m@ids", f"{n}:T.s@ids", f"{n}:T.c@ids"])
    assert set(state.values()) == {"installed"}, state
    assert mod.fetch_rows.__wrapped__ is plain
    assert mod.T.__dict__["m"].__wrapped__ is m
    assert mod.T.__dict__["s"].__func__.__wrapped__ is s
    assert mod.T.__dict__["c"].__func__.__wrapped__ is c
    assert _timed(mod.fetch_rows, None, [1]) < FAST_S
    assert fault.state()["armed"] == [] and fault.state()["calls"] == 0
    probe.reset()


def test_faults_without_the_rehearsal_switch_are_warned_about_not_armed(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(probe.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(probe.ENV_GPU, "0")
    monkeypatch.delenv(fault.ENV_REHEARSAL, raising=False)
    monkeypatch.setenv(fault.ENV_FAULTS, "probe-stall:for_s=5")
    monkeypatch.setattr(guard, "_WARNED", set())
    probe_writer("python", monkeypatch)
    monkeypatch.setattr(probe.writer, "_TARGET_NAMES", [])
    fault.reset()
    mod = _module(ROWS)
    plain = mod.fetch_rows
    monkeypatch.setenv(probe.ENV_TARGETS, f"{mod.__name__}:fetch_rows@ids")
    assert set(probe.install_from_env().values()) == {"installed"}
    assert mod.fetch_rows.__wrapped__ is plain
    assert _timed(mod.fetch_rows, None, [1]) < FAST_S
    assert f"{fault.ENV_FAULTS} is set but {fault.ENV_REHEARSAL} is not 1: no fault armed" in capsys.readouterr().err
    probe.reset()


def test_rehearsal_puts_the_gate_inside_the_probe_wrapper_idempotently(rehearsal: Path) -> None:
    mod = _module("""
        def fetch_rows(table, ids):
            return len(ids)
        class T:
            @staticmethod
            def s(ids):
                return 2
            @classmethod
            def c(cls, ids):
                return cls
    """)
    plain = mod.fetch_rows
    n = mod.__name__
    targets = [f"{n}:fetch_rows@ids", f"{n}:T.s@ids", f"{n}:T.c@ids"]
    probe.install(targets)
    outer = mod.fetch_rows
    assert outer.__sgl_seat_probe__ == f"{n}:fetch_rows"
    assert outer.__wrapped__.__code__.co_name == "rehearsal_gate" and outer.__wrapped__.__wrapped__ is plain
    assert not hasattr(outer.__wrapped__, "__sgl_seat_probe__")
    assert mod.T.__dict__["s"].__func__.__wrapped__.__code__.co_name == "rehearsal_gate"
    assert mod.T.__dict__["c"].__func__.__wrapped__.__code__.co_name == "rehearsal_gate"
    assert mod.fetch_rows(None, [1, 2]) == 2 and mod.T.s([1]) == 2 and mod.T.c([1]) is mod.T
    monkey = probe.installer._INSTALLED
    monkey.clear()  # forget the install state: idempotence then rests on the marker of the outer wrapper
    probe.install(targets)
    assert mod.fetch_rows is outer
    assert mod.T.__dict__["s"].__func__.__wrapped__.__wrapped__.__name__ == "s"
    assert fault.state()["calls"] == 3


# --- triggers ------------------------------------------------------------------------------------------------


def test_after_calls_fires_once_on_the_call_after_n(rehearsal: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(fault.ENV_FAULTS, f"probe-stall:after_calls=3,for_s={STALL_S}")
    mod = _module(ROWS)
    _install(mod, "fetch_rows", "other_rows")
    assert [a["fault"] for a in fault.state()["armed"]] == [f"probe-stall:after_calls=3,for_s={STALL_S}"]
    times = [_timed(mod.fetch_rows, None, [1]), _timed(mod.other_rows, None, [1]), _timed(mod.fetch_rows, None, [1]),
             _timed(mod.fetch_rows, None, [1, 2]), _timed(mod.fetch_rows, None, [1]), _timed(mod.fetch_rows, None, [1])]
    assert all(t < FAST_S for t in times[:3] + times[4:]), times  # calls of every probed target count
    assert STALL_S - 0.01 <= times[3] < STALL_S + 1.0, times
    st = fault.state()
    assert st["fired"] == ["env:0"] and st["armed"] == [] and st["calls"] == 6
    assert st["history"][0]["call"] == 4 and st["history"][0]["gather"] == 2
    err = capsys.readouterr().err
    assert err.count("sgl-seat rehearsal:") == 1
    assert (f"sgl-seat rehearsal: probe-stall on rank 3 (node 1) in {mod.__name__}:fetch_rows, gather 2, "
            f"for {STALL_S} s\n") in err


def test_after_calls_counts_from_arming(rehearsal: Path) -> None:
    mod = _module(ROWS)
    _install(mod)
    for _ in range(5):
        mod.fetch_rows(None, [1])
    fault.write_control(rehearsal, f"probe-stall:after_calls=2,for_s={STALL_S}", fault_id="a")
    _after_a_check()
    times = [_timed(mod.fetch_rows, None, [1]) for _ in range(4)]  # the first of them arms it: the first counted
    assert times[0] < FAST_S and times[1] < FAST_S and times[3] < FAST_S, times
    assert times[2] >= STALL_S - 0.01, times
    fault.write_control(rehearsal, f"probe-stall:after_calls=0,for_s={STALL_S}", fault_id="b")
    _after_a_check()
    assert _timed(mod.fetch_rows, None, [1]) >= STALL_S - 0.01  # the call that sees the file is the next call


def test_gather_ge_is_sized_like_the_probe(rehearsal: Path) -> None:
    mod = _module("""
        class Tensor:
            def __init__(self, n):
                self.n = n
            def numel(self):
                return self.n
        class Embedding:
            def forward(self, input_):
                return input_.n
    """)
    probe.install([f"{mod.__name__}:Embedding.forward@input_:numel"])
    fault.write_control(rehearsal, f"probe-stall:gather_ge=100,for_s={STALL_S}", fault_id="g")
    emb = mod.Embedding()
    times = [_timed(emb.forward, mod.Tensor(n)) for n in (10, 99)]
    times.append(_timed(emb.forward, mod.Tensor(100)))
    times.append(_timed(emb.forward, mod.Tensor(5000)))  # fired once already
    assert times[0] < FAST_S and times[1] < FAST_S and times[3] < FAST_S, times
    assert times[2] >= STALL_S - 0.01, times
    assert fault.state()["history"][0]["gather"] == 100
    assert fault.state()["history"][0]["target"] == f"{mod.__name__}:Embedding.forward"


def test_both_gates_keep_the_call_and_size_it(rehearsal: Path) -> None:
    """The generated gate (the target's own parameters: defaults, keyword-only ones) and the generic one (``*ids``)
    pass every argument through unchanged and size the call as the probe does."""
    import inspect

    mod = _module("""
        def gather(weight, ids=(), block=8, *, idx=(), sort=False):
            return (weight, list(ids), block, list(idx), sort)
        def varargs(*ids):
            return len(ids)
    """)
    sig = inspect.signature(mod.gather)
    n = mod.__name__
    probe.install([f"{n}:gather@idx", f"{n}:varargs@0:none"])
    assert inspect.signature(mod.gather) == sig
    exact, generic = mod.gather.__wrapped__, mod.varargs.__wrapped__
    assert exact.__code__.co_name == generic.__code__.co_name == "rehearsal_gate"
    assert exact.__code__.co_filename.startswith("<sgl-seat rehearsal gate")
    assert not generic.__code__.co_filename.startswith("<sgl-seat rehearsal gate")
    assert mod.gather("w") == ("w", [], 8, [], False)
    assert mod.gather("w", [1], 4, idx=[2, 3], sort=True) == ("w", [1], 4, [2, 3], True)
    assert mod.varargs(1, 2, 3) == 3
    with pytest.raises(TypeError):
        mod.gather()  # a missing argument fails as the target itself would
    fault.write_control(rehearsal, f"probe-stall:gather_ge=3,for_s={STALL_S}", fault_id="kw")
    _after_a_check()
    assert _timed(mod.gather, "w", range(9)) < FAST_S  # ids is not the sized argument
    assert _timed(mod.gather, "w", idx=range(3)) >= STALL_S - 0.01
    fault.write_control(rehearsal, f"probe-stall:target=varargs,for_s={STALL_S}", fault_id="va")
    _after_a_check()
    assert _timed(mod.varargs, 1) >= STALL_S - 0.01
    assert [(h["id"], h["gather"]) for h in fault.state()["history"]] == [("kw", 3), ("va", -1)]


def test_rank_and_node_select_the_process(rehearsal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _module(ROWS)
    _install(mod)
    monkeypatch.setenv(probe.ENV_RANK, "0")
    fault.write_control(rehearsal, f"probe-stall:rank=1,for_s={STALL_S}", fault_id="r1")
    assert all(_timed(mod.fetch_rows, None, [1]) < FAST_S for _ in range(3))
    (armed,) = fault.state()["armed"]
    assert armed["id"] == "r1" and armed["live"] is False  # armed, but for another rank
    fault.write_control(rehearsal, f"probe-stall:rank=0,node=2,for_s={STALL_S}", fault_id="n2")
    _after_a_check()
    assert all(_timed(mod.fetch_rows, None, [1]) < FAST_S for _ in range(3))  # node 1 here
    fault.write_control(rehearsal, f"probe-stall:rank=0,node=1,for_s={STALL_S}", fault_id="r0")
    _after_a_check()
    assert _timed(mod.fetch_rows, None, [1]) >= STALL_S - 0.01
    assert fault.state()["fired"] == ["r0"]
    assert fault.state()["history"][0]["rank"] == 0


def test_rank_is_read_again_when_the_process_learns_it(rehearsal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine's title (hence its rank) may be set after the probe is installed."""
    monkeypatch.setenv(probe.ENV_RANK, "0")
    monkeypatch.setenv(fault.ENV_FAULTS, f"probe-stall:rank=2,for_s={STALL_S}")
    mod = _module(ROWS)
    _install(mod)
    assert _timed(mod.fetch_rows, None, [1]) < FAST_S
    monkeypatch.setenv(probe.ENV_RANK, "2")
    _after_a_check()
    assert _timed(mod.fetch_rows, None, [1]) >= STALL_S - 0.01


def test_target_substring_selects_the_target(rehearsal: Path) -> None:
    mod = _module(ROWS)
    _install(mod, "fetch_rows", "other_rows")
    fault.write_control(rehearsal, f"probe-stall:target=other_,for_s={STALL_S}", fault_id="t")
    assert all(_timed(mod.fetch_rows, None, [1]) < FAST_S for _ in range(3))
    assert _timed(mod.other_rows, None, [1]) >= STALL_S - 0.01
    assert fault.state()["history"][0]["target"] == f"{mod.__name__}:other_rows"


def test_for_s_bounds_the_stall_and_the_call_then_runs(rehearsal: Path) -> None:
    mod = _module("""
        calls = []
        def fetch_rows(table, ids):
            calls.append(list(ids))
            return len(ids)
    """)
    _install(mod)
    fault.write_control(rehearsal, f"probe-stall:for_s={STALL_S}", fault_id="f")
    t0 = time.monotonic()
    assert mod.fetch_rows(None, [7, 8]) == 2
    took = time.monotonic() - t0
    assert STALL_S - 0.01 <= took < STALL_S + 0.2, took
    assert mod.calls == [[7, 8]]


# --- the control file ----------------------------------------------------------------------------------------


def _stall_in_thread(fn: Callable[..., Any], *args: Any) -> tuple[threading.Thread, dict[str, float]]:
    out: dict[str, float] = {}

    def run() -> None:
        t0 = time.monotonic()
        fn(*args)
        out["took"] = time.monotonic() - t0

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, out


def _wait_stalling(fault_id: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while fault_id not in fault.state()["stalling"]:
        assert time.monotonic() < deadline, fault.state()
        time.sleep(0.01)


def test_removing_the_control_file_ends_its_stall(rehearsal: Path) -> None:
    mod = _module(ROWS)
    _install(mod)
    path = fault.write_control(rehearsal, "probe-stall:for_s=20", fault_id="c")
    assert path == rehearsal / fault.CONTROL_FILE and path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text()) == {"schema_version": 1, "id": "c", "fault": "probe-stall:for_s=20"}
    th, out = _stall_in_thread(mod.fetch_rows, None, [1])
    _wait_stalling("c")
    time.sleep(0.1)
    t_clear = time.monotonic()
    assert fault.write_control(rehearsal, None, fault_id="c") is None
    th.join(5)
    assert not th.is_alive()
    assert time.monotonic() - t_clear < 1.0  # seen within a check (0.2 s) or two, not after for_s
    assert 0.1 <= out["took"] < 2.0, out
    assert fault.state()["stalling"] == [] and fault.state()["control"]["id"] is None


def test_an_until_cleared_stall_ends_when_another_id_is_written(rehearsal: Path) -> None:
    mod = _module(ROWS)
    _install(mod)
    fault.write_control(rehearsal, "probe-stall", fault_id="u1")
    th, out = _stall_in_thread(mod.fetch_rows, None, [1])
    _wait_stalling("u1")
    fault.write_control(rehearsal, f"probe-stall:for_s={STALL_S}", fault_id="u2")
    th.join(5)
    assert not th.is_alive() and out["took"] < 2.0
    assert [a["id"] for a in fault.state()["armed"]] == ["u2"]  # the new id is armed, for the next call
    assert _timed(mod.fetch_rows, None, [1]) >= STALL_S - 0.01
    assert fault.state()["fired"] == ["u1", "u2"]


def test_a_launch_time_stall_is_not_cleared_by_the_file(rehearsal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fault.ENV_FAULTS, "probe-stall:for_s=0.6")
    mod = _module(ROWS)
    _install(mod)
    th, out = _stall_in_thread(mod.fetch_rows, None, [1])
    _wait_stalling("env:0")
    fault.write_control(rehearsal, "probe-stall:rank=9", fault_id="other")
    time.sleep(0.1)
    fault.write_control(rehearsal, None, fault_id="other")
    th.join(5)
    assert out["took"] >= 0.59, out


def test_a_new_id_re_arms_and_the_same_id_does_not(rehearsal: Path) -> None:
    mod = _module(ROWS)
    _install(mod)
    spec = f"probe-stall:for_s={STALL_S}"
    fault.write_control(rehearsal, spec, fault_id="a")
    assert _timed(mod.fetch_rows, None, [1]) >= STALL_S - 0.01
    assert _timed(mod.fetch_rows, None, [1]) < FAST_S  # fired: once per id
    fault.write_control(rehearsal, spec, fault_id="a")  # rewritten (a new file), same id
    _after_a_check()
    assert _timed(mod.fetch_rows, None, [1]) < FAST_S
    fault.write_control(rehearsal, None, fault_id="a")
    _after_a_check()
    mod.fetch_rows(None, [1])
    fault.write_control(rehearsal, spec, fault_id="a")  # removed and written again: still the same id
    _after_a_check()
    assert _timed(mod.fetch_rows, None, [1]) < FAST_S
    fault.write_control(rehearsal, spec, fault_id="b")
    _after_a_check()
    assert _timed(mod.fetch_rows, None, [1]) >= STALL_S - 0.01
    assert fault.state()["fired"] == ["a", "b"]


def test_a_removed_file_disarms_a_fault_not_fired_yet(rehearsal: Path) -> None:
    mod = _module(ROWS)
    _install(mod)
    fault.write_control(rehearsal, f"probe-stall:after_calls=1000,for_s={STALL_S}", fault_id="d")
    mod.fetch_rows(None, [1])
    assert [a["id"] for a in fault.state()["armed"]] == ["d"]
    fault.write_control(rehearsal, None, fault_id="d")
    _after_a_check()
    mod.fetch_rows(None, [1])
    assert fault.state()["armed"] == []


@pytest.mark.parametrize("body", [
    "{not json",
    json.dumps({"schema_version": 2, "id": "m", "fault": "probe-stall"}),
    json.dumps({"schema_version": 1, "fault": "probe-stall"}),
    json.dumps({"schema_version": 1, "id": "m", "fault": "probe-stall:ranks=1"}),
    json.dumps({"schema_version": 1, "id": "m", "fault": 7}),
    json.dumps(["probe-stall"]),
    "\xff\xfe",
])
def test_a_malformed_control_file_is_warned_about_once_and_ignored(rehearsal: Path, body: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    mod = _module(ROWS)
    _install(mod)
    path = rehearsal / fault.CONTROL_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(body.encode("latin-1"))
    for _ in range(4):
        assert _timed(mod.fetch_rows, None, [1]) < FAST_S
        _after_a_check()
    err = capsys.readouterr().err
    assert err.count("rehearsal control file") == 1 and "ignored" in err, err
    assert fault.state()["armed"] == [] and fault.state()["fired"] == []
    fault.write_control(rehearsal, f"probe-stall:for_s={STALL_S}", fault_id="ok")  # a good file is then read
    _after_a_check()
    assert _timed(mod.fetch_rows, None, [1]) >= STALL_S - 0.01


def test_a_control_file_others_may_write_is_ignored(rehearsal: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mod = _module(ROWS)
    _install(mod)
    path = fault.write_control(rehearsal, f"probe-stall:for_s={STALL_S}", fault_id="w")
    assert path is not None
    path.chmod(0o666)
    assert _timed(mod.fetch_rows, None, [1]) < FAST_S
    assert "not a regular file private" in capsys.readouterr().err


def test_the_control_file_is_looked_at_rarely(rehearsal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing armed, a call looks at the clock only: the file is looked at once per CHECK_EVERY_S (0.2 s)."""
    monkeypatch.setattr(fault, "CHECK_EVERY_S", 0.2)
    ticks: list[float] = []
    tick = fault._tick

    def counted(now: float, call: int | None = None) -> None:
        ticks.append(now)
        tick(now, call)

    monkeypatch.setattr(fault, "_tick", counted)
    mod = _module(ROWS)
    _install(mod)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:
        for _ in range(100):
            mod.fetch_rows(None, [1])
    assert fault.state()["calls"] > 1000
    assert 2 <= len(ticks) <= 4, ticks
    assert all(b - a >= 0.2 for a, b in itertools.pairwise(ticks)), ticks


def test_write_control_validates_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown key"):
        fault.write_control(tmp_path, "probe-stall:bogus=1", fault_id="x")
    with pytest.raises(ValueError, match="fault id"):
        fault.write_control(tmp_path, "probe-stall", fault_id="")
    assert list(tmp_path.iterdir()) == []
    path = fault.write_control(tmp_path, "probe-stall: for_s=30,rank=1 ,after_calls=20", fault_id="x")
    assert path is not None
    assert json.loads(path.read_text())["fault"] == fault.EXAMPLE  # canonical text
    assert [p.name for p in tmp_path.iterdir()] == [fault.CONTROL_FILE]  # no temporary file left
    assert fault.write_control(tmp_path, None, fault_id="x") is None and not path.exists()
    assert fault.write_control(tmp_path, None, fault_id="x") is None  # absent already: fine
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(OSError, match="not private"):
        fault.write_control(shared, "probe-stall", fault_id="x")


def test_a_malformed_launch_time_fault_is_warned_and_the_others_armed(rehearsal: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(fault.ENV_FAULTS, f"probe-stall:rank=x ; probe-stall:after_calls=1,for_s={STALL_S};")
    mod = _module(ROWS)
    _install(mod)
    assert "rehearsal fault not armed" in capsys.readouterr().err
    assert [a["id"] for a in fault.state()["armed"]] == ["env:1"]
    assert _timed(mod.fetch_rows, None, [1]) < FAST_S
    assert _timed(mod.fetch_rows, None, [1]) >= STALL_S - 0.01


def test_the_gate_never_raises_into_the_engine(rehearsal: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    mod = _module(ROWS)
    _install(mod)

    def broken(*_: Any) -> None:
        raise RuntimeError("gate bug")

    monkeypatch.setattr(fault, "_consider", broken)
    assert mod.fetch_rows(None, [1, 2, 3]) == 3
    assert mod.fetch_rows(None, [1]) == 1
    err = capsys.readouterr().err
    assert err.count("rehearsal gate failed (gate bug); call proceeds") == 1


# --- the ring ------------------------------------------------------------------------------------------------


def test_the_stalled_call_is_in_flight_in_the_ring(rehearsal: Path) -> None:
    mod = _module(ROWS)
    _install(mod)
    mod.fetch_rows(None, [1])  # the ring exists
    fault.write_control(rehearsal, "probe-stall:gather_ge=50,for_s=1", fault_id="ring")
    _after_a_check()
    target = f"{mod.__name__}:fetch_rows"
    th, out = _stall_in_thread(mod.fetch_rows, None, list(range(64)))
    _wait_stalling("ring")
    time.sleep(0.3)
    path = probe.ring_file()
    assert path is not None and Path(path).parent == rehearsal
    infl = [r for r in probe.read_ring(path, record=ProbeRecord) if r.target == target and r.end is None]
    assert len(infl) == 1 and infl[0].gather_size == 64 and infl[0].thread == th.ident
    assert infl[0].rank == 3 and infl[0].node == 1
    assert infl[0].duration(time.time()) >= 0.3
    th.join(5)
    done = [r for r in probe.read_ring(path, record=ProbeRecord) if r.target == target]
    assert [r.gather_size for r in done] == [1, 64] and all(r.end is not None for r in done)
    assert done[1].duration(time.time()) >= 0.99 and out["took"] >= 0.99


# --- graph replays ---------------------------------------------------------------------------------------------

GRAPH = """
    class ShapeKey:
        def __init__(self, size):
            self.size = size

    class Runner:
        captured_req_width = 4   # a verify graph: 4 draft tokens per request
        ragged_verify_mode = False

    class FullCudaGraphBackend:  # SGLang 0.5.17's: __init__ does not keep its runner
        def __init__(self, cuda_graph_runner, *, enable_memory_saver=False):
            self.replays = 0

        def replay(self, shape_key, static_forward_batch, **kwargs):
            self.replays += 1
            return "out"
"""


def _graph_module() -> types.ModuleType:
    mod = _module(GRAPH)
    targets = [f"{mod.__name__}:FullCudaGraphBackend.__init__@cuda_graph_runner:link",
               f"{mod.__name__}:FullCudaGraphBackend.replay@shape_key:graph"]
    state = probe.install(targets)
    assert all(state[t] == "installed" for t in targets), state
    return mod


def test_a_graph_replay_stalls_in_flight_and_a_link_is_not_gated(rehearsal: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN rank 0 replaying a verify graph (link + graph targets) WHEN the control file arms
    ``probe-stall:rank=0,target=FullCudaGraphBackend.replay,after_calls=2,for_s=...`` THEN the third replay after
    arming stalls before the graph is launched, and while it stalls the ring holds that replay in flight: a graph
    replay of 3 requests x 4 tokens on the stalled thread. Backends made meanwhile (their constructor is a link:
    never gated) neither count nor stall."""
    monkeypatch.setenv(probe.ENV_RANK, "0")
    mod = _graph_module()
    init = mod.FullCudaGraphBackend.__dict__["__init__"]
    assert init.__wrapped__.__code__.co_name == "__init__", "a link has no gate inside"
    b = mod.FullCudaGraphBackend(mod.Runner())
    b.replay(mod.ShapeKey(1), None)  # the ring exists
    fault.write_control(rehearsal, "probe-stall:rank=0,target=FullCudaGraphBackend.replay,after_calls=2,for_s=0.8",
                        fault_id="graph")
    _after_a_check()
    assert _timed(b.replay, mod.ShapeKey(3), None) < FAST_S  # arms the fault: call 1 of 2
    mod.FullCudaGraphBackend(mod.Runner())
    assert _timed(b.replay, mod.ShapeKey(3), None) < FAST_S  # call 2 of 2
    assert b.replays == 3
    th, out = _stall_in_thread(b.replay, mod.ShapeKey(3), None)
    _wait_stalling("graph")
    time.sleep(0.2)
    assert b.replays == 3, "the stall comes before the graph is launched"
    path = probe.ring_file()
    assert path is not None
    target = f"{mod.__name__}:FullCudaGraphBackend.replay"
    infl = [r for r in probe.read_ring(path, record=ProbeRecord) if r.end is None]
    assert len(infl) == 1 and infl[0].target == target and infl[0].thread == th.ident, infl
    assert infl[0].graph_replay and infl[0].graph_key == 3 and infl[0].gather_size == 12
    assert infl[0].rank == 0 and infl[0].duration(time.time()) >= 0.2
    th.join(5)
    assert b.replays == 4 and out["took"] >= 0.79
    recs = [r for r in probe.read_ring(path, record=ProbeRecord) if r.target == target]
    assert [r.gather_size for r in recs] == [4, 12, 12, 12] and all(r.end is not None for r in recs)
    assert [(h["id"], h["call"], h["gather"]) for h in fault.state()["history"]] == [("graph", 4, 12)]


def test_gather_ge_on_a_graph_replay_reads_its_token_count(rehearsal: Path) -> None:
    """A graph target's gather is the replay's token count, as the ring records it: 3 requests x 4 draft tokens
    reach gather_ge=12 where 2 requests (8 tokens) do not, though the shape key itself is never 12."""
    mod = _graph_module()
    b = mod.FullCudaGraphBackend(cuda_graph_runner=mod.Runner())
    fault.write_control(rehearsal, f"probe-stall:target=FullCudaGraphBackend.replay,gather_ge=12,for_s={STALL_S}",
                        fault_id="ge")
    _after_a_check()
    times = [_timed(b.replay, mod.ShapeKey(n), None) for n in (2, 2, 3, 3)]
    assert times[0] < FAST_S and times[1] < FAST_S and times[3] < FAST_S, times
    assert times[2] >= STALL_S - 0.01, times
    assert [(h["id"], h["gather"]) for h in fault.state()["history"]] == [("ge", 12)]
