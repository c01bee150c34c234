"""`plan` through SGLang's own sizing leaves no sizing child behind in the calling process (outside a session)."""

from __future__ import annotations

import psutil
import pytest

from sgl_seat.plan import build_plan
from sgl_seat.sizing import CACHE_ENV, installed_version, sizing_session
from sgl_seat.spec import load_spec

# Full tier only (README, "The tests"): three plans through SGLang's own sizing child for a process-lifecycle check;
# the contract tests run SGLang's sizing in the CI tier.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _sizing_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if any("sgl_seat.sizing.child" in a for a in p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_plan_stops_its_sizing_child_unless_a_session_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    if installed_version() is None:
        pytest.skip("SGLang 0.5.23 is not installed (scripts/install-sglang-parser.sh)")
    monkeypatch.setenv(CACHE_ENV, "off")  # every plan below must ask the child (a cache hit would start none)
    plan = build_plan(load_spec("large"), draft=True)
    assert plan.capacity is not None and plan.capacity.source.startswith("sglang"), plan.capacity
    assert _sizing_children() == [], "a plain build_plan left SGLang's sizing child running"
    with sizing_session():
        build_plan(load_spec("large"), draft=False)
        kept = _sizing_children()
        assert len(kept) == 1, kept  # one child serves every call inside the session
        build_plan(load_spec("large"), draft=True)
        assert _sizing_children() == kept
    psutil.wait_procs(kept, timeout=10)
    assert _sizing_children() == []
