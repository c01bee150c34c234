"""Fault specs: the parser `up --fault` calls, and when each fault fires on its rank."""

from __future__ import annotations

import pytest

from sgl_seat.errors import UsageError
from sgl_seat.sim.faults import CRASH, SLOW, STALL, Fault, FaultState, parse_fault, parse_faults


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("rowfetch-stall:rank=3,after_steps=200", Fault(STALL, 3, after_steps=200)),
        ("crash:rank=2,after_s=30", Fault(CRASH, 2, after_s=30.0)),
        ("slow:rank=1,ms=50", Fault(SLOW, 1, ms=50.0)),
        ("rowfetch-stall:rank=0,gather_ge=64,for_s=2.5", Fault(STALL, 0, gather_ge=64, for_s=2.5)),
        (" crash : rank = 1 ", Fault(CRASH, 1)),
    ],
)
def test_parse_valid(text: str, want: Fault) -> None:
    got = parse_fault(text)
    assert got == want
    assert parse_fault(got.spec()) == got  # canonical text round-trips


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "is empty"),
        ("explode:rank=1", "unknown kind 'explode'"),
        ("crash", "rank is required"),
        ("crash:", "rank is required"),
        ("crash:after_s=3", "rank is required"),
        ("crash:rank=x", "rank='x' is not a whole number"),
        ("crash:rank=1.5", "not a whole number"),
        ("crash:rank=-1", "negative"),
        ("crash:rank=1,ms=5", "crash takes no key 'ms'"),
        ("crash:rank=1,rank=2", "given twice"),
        ("crash:rank", "'rank' is not key=value"),
        ("slow:rank=1", "slow needs ms"),
        ("slow:rank=1,ms=0", "ms must be above 0"),
        ("rowfetch-stall:rank=1,after_s=nan", "not finite"),
    ],
)
def test_parse_errors_say_what_and_how(text: str, needle: str) -> None:
    with pytest.raises(UsageError) as ei:
        parse_fault(text)
    msg = str(ei.value)
    assert needle in msg
    assert "fix:" in msg  # every error says what to write instead
    assert ei.value.exit_code == 2


def test_parse_faults_splits_on_semicolons() -> None:
    got = parse_faults("rowfetch-stall:rank=3,after_steps=200;crash:rank=2,after_s=30; ;slow:rank=1,ms=50")
    assert [f.kind for f in got] == [STALL, CRASH, SLOW]
    assert parse_faults("") == ()


def test_fault_state_only_arms_its_rank() -> None:
    st = FaultState(rank=1)
    assert not st.arm(parse_fault("crash:rank=2"), now=0.0)
    assert st.arm(parse_fault("crash:rank=1"), now=0.0)
    assert st.on_step(step=0, gather=1, now=0.0).crash is not None


def test_stall_triggers_after_steps_once() -> None:
    st = FaultState(rank=3)
    st.arm(parse_fault("rowfetch-stall:rank=3,after_steps=5"), now=0.0)
    assert st.on_step(step=4, gather=8, now=1.0).stall is None
    fx = st.on_step(step=5, gather=8, now=1.0)
    assert fx.stall is not None and fx.stall_s is None  # until the process dies
    assert st.on_step(step=6, gather=8, now=1.0).stall is None  # fires once


def test_triggers_combine_time_and_gather_size() -> None:
    st = FaultState(rank=0)
    st.arm(parse_fault("rowfetch-stall:rank=0,after_s=10,gather_ge=32,for_s=3"), now=100.0)
    assert st.on_step(step=0, gather=64, now=105.0).stall is None  # too early
    assert st.on_step(step=0, gather=16, now=111.0).stall is None  # gather too small
    fx = st.on_step(step=0, gather=32, now=112.0)
    assert fx.stall is not None and fx.stall_s == 3.0


def test_slow_adds_latency_for_its_window() -> None:
    st = FaultState(rank=1)
    st.arm(parse_fault("slow:rank=1,ms=50,for_s=2"), now=0.0)
    st.arm(parse_fault("slow:rank=1,ms=5"), now=0.0)
    assert st.on_step(step=0, gather=1, now=0.0).extra_ms == 55.0
    assert st.on_step(step=1, gather=1, now=1.9).extra_ms == 55.0
    assert st.on_step(step=2, gather=1, now=2.5).extra_ms == 5.0
    st.clear()
    assert st.on_step(step=3, gather=1, now=3.0).extra_ms == 0.0


def test_error_fault_fires_once_as_an_error_not_a_crash() -> None:
    from sgl_seat.sim.faults import FaultState, parse_fault

    f = parse_fault("error:rank=2,after_steps=3")
    assert (f.kind, f.rank, f.after_steps) == ("error", 2, 3) and parse_fault(f.spec()) == f
    st = FaultState(rank=2)
    assert st.arm(f, now=0.0)
    assert st.on_step(step=1, gather=8, now=1.0).error is None
    fired = st.on_step(step=3, gather=8, now=2.0)
    assert fired.error == f and fired.crash is None
    assert st.on_step(step=4, gather=8, now=3.0).error is None  # once
