"""A new engine is one module (ARCHITECTURE.md, "Where things go"): a backend registered from outside ``engines/``
(``tests/unit/fakeengine``) plans a seat that names it, its words name its rank processes, the watchdog finds and
the detectors read by them, and nothing else in sgl-seat had to learn its name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sgl_seat.core import detect as d
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import MetricsPoint
from sgl_seat.engines import backend_for, engine_names, is_engine_main, is_engine_title, words_for, words_of_metrics
from sgl_seat.errors import PlanError
from sgl_seat.plan import LaunchPlan, build_plan, render_text
from sgl_seat.spec import WatchdogSpec, load_spec, parse_spec
from tests.unit import fakeengine


def _fake_seat(tmp_path: Path) -> Path:
    text = Path(load_spec("local-sim").source or "").read_text(encoding="utf-8")
    text = text.replace("engine: sim", "engine: fakeeng").split("\nsim:")[0] + "\n"
    path = tmp_path / "fake.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_registered_backend_plans_a_seat_that_names_it(tmp_path: Path) -> None:
    assert "fakeeng" in engine_names() and backend_for("fakeeng").words is fakeengine.WORDS
    spec = parse_spec(_fake_seat(tmp_path).read_text(encoding="utf-8"), path=str(tmp_path / "fake.yaml"))
    plan = build_plan(spec)
    assert plan.engine == "fakeeng"
    node = plan.nodes[1]
    assert node.command[1:3] == ("-m", "fakeengine.serve") and node.command[-2:] == ("--fake-pool", "1024")
    assert [r.process_title for r in node.ranks] == ["FAKE::Runner_TP2_EP2", "FAKE::Runner_TP3_EP3"]
    text = render_text(plan)
    assert "node 1: Runner_TP2_EP2, Runner_TP3_EP3" in text and "KV pool set by --fake-pool 1,024 tokens" in text
    back = LaunchPlan.from_json(plan.to_json())  # what a node agent gets: the titles travel as data
    assert [r.process_title for r in back.nodes[1].ranks] == ["FAKE::Runner_TP2_EP2", "FAKE::Runner_TP3_EP3"]


def test_an_unknown_engine_is_refused_at_its_line(tmp_path: Path) -> None:
    text = _fake_seat(tmp_path).read_text(encoding="utf-8").replace("engine: fakeeng", "engine: nosuch")
    spec = parse_spec(text, path=str(tmp_path / "x.yaml"))
    with pytest.raises(PlanError, match="unknown engine 'nosuch'") as exc:
        build_plan(spec)
    assert exc.value.fix is not None and "fakeeng" in exc.value.fix


def test_the_watchdog_reads_the_new_engine_by_its_words() -> None:
    w = words_for("fakeeng")
    assert is_engine_main(["python3", "-m", "fakeengine.serve", "--port", "1"])
    assert is_engine_title("FAKE::Runner_TP1") and w.rank_of_title("FAKE::Runner_TP1") == 1
    assert w.kind_of_title("FAKE::Front") == "front" and w.rank_of_title("FAKE::Runner") == 0
    assert words_of_metrics(["fake:running", "fake:out_tokens_total"]) is w
    # No progress for a while with requests running: the no-progress detector fires on the fake engine's metrics,
    # and stays quiet when the same figures come under another engine's names.
    th = WatchdogSpec()
    pts = [MetricsPoint(t=float(t), node=0, values={"fake:running": 3.0, "fake:out_tokens_total": 100.0,
                                                    "fake:steps_total": 7.0}) for t in range(0, 80, 5)]
    v = d.detect(Observation.of(metrics=pts, words=w), th, 75.0)
    assert v is not None and v.kind is d.VerdictKind.NO_PROGRESS and "3 requests run" in v.evidence[0]
    other = dataclasses.replace(w, running="else:running", progress=("else:out",))
    assert d.detect(Observation.of(metrics=pts, words=other), th, 75.0) is None
