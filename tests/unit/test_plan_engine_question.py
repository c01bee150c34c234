"""The plan asks the engine's backend one question per plan: ``describe``, looked up once.

Everything engine-specific about a seat (flags, environment, warnings, capacity note, probe targets, the module,
refusals) comes back as one :class:`~sgl_seat.engines.EngineFacts`, so a reader follows the walk from `up` to the
argv down to the backend and back once. A recording wrapper stands in the registry's place in ``sgl_seat.plan``
and notes every name the plan reads from the backend, methods and class attributes alike.
"""

from __future__ import annotations

from typing import Any

import pytest

from sgl_seat import plan as plan_module
from sgl_seat.engines import EngineBackend, backend_for
from sgl_seat.errors import PlanError
from sgl_seat.plan import build_plan
from sgl_seat.spec import load_spec


class Recording:
    """A real backend behind a wrapper that records each attribute read on it (calls inside the backend are its
    own business and not recorded)."""

    def __init__(self, inner: EngineBackend) -> None:
        self.inner = inner
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.asked.append(name)
        return getattr(self.inner, name)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Recording]]:
    """Each lookup the plan makes: the engine's name and the recording backend it got."""
    lookups: list[tuple[str, Recording]] = []

    def lookup(engine: str) -> Recording:
        rec = Recording(backend_for(engine))
        lookups.append((engine, rec))
        return rec

    monkeypatch.setattr(plan_module, "backend_for", lookup)
    return lookups


@pytest.mark.parametrize(("seat", "draft", "faults"), [
    ("local-sim", False, ()),
    ("local-sim", True, ()),
    ("local-sim", True, ("crash:rank=1,after_s=30",)),
    ("large", False, ()),
    ("large", True, ()),
    ("local-sglang", False, ()),
    ("local-sglang", False, ("probe-stall:rank=1,after_calls=20,for_s=30",)),
])
def test_build_plan_asks_the_backend_once(recorded: list[tuple[str, Recording]], seat: str, draft: bool,
                                          faults: tuple[str, ...]) -> None:
    spec = load_spec(seat)
    plan = build_plan(spec, draft=draft, faults=faults)
    assert [(engine, rec.asked) for engine, rec in recorded] == [(spec.engine, ["describe"])]
    assert plan.nodes and all(n.command[2] == recorded[0][1].inner.module for n in plan.nodes)


def test_a_refusal_is_the_same_one_question(recorded: list[tuple[str, Recording]]) -> None:
    """The CPU engine refuses the draft inside ``describe``; the plan asks nothing more before or after."""
    with pytest.raises(PlanError, match="--draft on is refused"):
        build_plan(load_spec("local-sglang"), draft=True)
    assert [(engine, rec.asked) for engine, rec in recorded] == [("sglang", ["describe"])]


@pytest.mark.parametrize("seat", ["local-sim", "large", "local-sglang"])
def test_recording_changes_nothing_in_the_plan(seat: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec(seat)
    plain = build_plan(spec)
    monkeypatch.setattr(plan_module, "backend_for", lambda engine: Recording(backend_for(engine)))
    assert build_plan(spec) == plain
