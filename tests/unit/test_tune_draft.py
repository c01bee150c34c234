"""`sgl-seat tune draft`: the policy from a report's crossover, the refusals, and the seat file edited in place.

The reports here are the report format's crossover and sweep fields written by hand (the narrow seam: what
``policy_from_report`` reads); the flow from a real battery runs in tests/integration/test_gate.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sgl_seat.cli.main import app
from sgl_seat.errors import TuneRefused, UsageError
from sgl_seat.gate.tune import policy_from_report, set_off_above, tune_draft
from sgl_seat.plan import build_plan
from sgl_seat.spec import builtin_seats_dir, load_spec
from tests.cli_runner import run_cli


def _report(cross: dict[str, Any], sweep: list[tuple[int, float, float, float]], synthetic: bool = True) -> dict:
    return {"kind": "sgl-seat gate report", "schema_version": "1.1", "synthetic": synthetic,
            "crossover": cross,
            "comparisons": {"candidate": {"sweep": [{"concurrency": c, "ratio": r, "ci_low": lo, "ci_high": hi}
                                                    for c, r, lo, hi in sweep]}}}


SWEEP = [(1, 1.6, 1.4, 1.8), (8, 1.2, 1.05, 1.3), (64, 0.7, 0.6, 0.8)]
CROSS = {"estimate": 20.4, "ci_low": 13.7, "ci_high": 29.0, "below_sweep": False, "beyond_sweep": False}


def test_policy_is_the_lower_bound_rounded_down() -> None:
    n, why = policy_from_report(_report(CROSS, SWEEP))
    assert n == 13 and "13.7" in why and "20.4" in why


@pytest.mark.parametrize(("cross", "sweep", "says"), [
    ({**CROSS, "estimate": None, "ci_low": None, "below_sweep": True}, [(1, 0.5, 0.4, 0.6)], "lost already"),
    ({**CROSS, "estimate": None, "ci_low": None, "ci_high": None, "beyond_sweep": True},
     [(1, 1.5, 1.3, 1.7), (64, 1.2, 1.1, 1.3)], "surely paid up to the end"),
    ({**CROSS, "ci_low": None}, [(1, 1.3, 0.9, 1.7), (64, 0.7, 0.6, 0.8)], "did not surely pay"),
    ({**CROSS, "ci_low": 0.6}, SWEEP, "below one running request"),
    (None, [], "no crossover"),
])
def test_refusals_say_which_case(cross: dict | None, sweep: list, says: str) -> None:
    with pytest.raises(TuneRefused, match=says) as err:
        policy_from_report(_report(cross or {}, sweep))
    assert err.value.exit_code == 3 and err.value.fix


DRAFT_YAML = """schema_version: 1
name: x
# a comment that stays
draft:
  enabled: false   # the draft's own comment
  algorithm: EAGLE
  steps: 3
  # a comment inside the block
  slots: 8
network:
  http_port: 30000
"""


def test_set_off_above_adds_then_replaces_and_keeps_comments() -> None:
    once = set_off_above(DRAFT_YAML, 12, "first")
    assert "  off_above: 12  # first\n" in once and "# a comment that stays" in once
    assert once.count("off_above") == 1 and once.index("off_above") > once.index("draft:")
    assert once.index("off_above") < once.index("network:")
    twice = set_off_above(once, 9, "second")
    assert "  off_above: 9  # second\n" in twice and "off_above: 12" not in twice
    assert twice.replace("  off_above: 9  # second\n", "") == DRAFT_YAML
    with pytest.raises(UsageError, match="inline"):
        set_off_above("name: x\ndraft: {enabled: true}\n", 3, "c")
    assert set_off_above("name: x\n", 4, "c").endswith("draft:\n  off_above: 4  # c\n")


def _seat_copy(tmp_path: Path) -> Path:
    """local-sim beside its planning config (its relative paths stay valid)."""
    d = tmp_path / "seats"
    shutil.copytree(builtin_seats_dir(), d)
    shutil.copytree(builtin_seats_dir().parent / "models", tmp_path / "models")
    return d / "local-sim.yaml"


def test_tune_writes_the_seat_and_plan_runs_the_tiers(tmp_path: Path) -> None:
    seat = _seat_copy(tmp_path)
    report = tmp_path / "report.json"
    report.write_text(json.dumps(_report(CROSS, SWEEP)))
    before = seat.read_text()
    dry = tune_draft(report, str(seat), dry_run=True)
    assert dry.off_above == 13 and not dry.written and seat.read_text() == before
    res = CliRunner().invoke(app, ["tune", "draft", str(report), "--seat", str(seat), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["written"] and doc["off_above"] == 13 and doc["synthetic"] and doc["warnings"] == []
    spec = load_spec(str(seat))
    assert spec.draft.off_above == 13
    plan = build_plan(spec, draft=True)
    cmd = list(plan.nodes[0].command)
    i = cmd.index("--speculative-adaptive-config")
    assert cmd[i - 1] == "--speculative-adaptive" and cmd[i + 1] == "${seat_files}/adaptive-config.json"
    assert json.loads(dict(plan.files)["adaptive-config.json"]) == {"1": {"candidate_steps": [3]},
                                                                    "14": {"candidate_steps": [0]}}
    pol = plan.to_json()["draft_policy"]
    assert pol["speculates_up_to"] == 13 and pol["keeps"]["max_running_requests"] == plan.slots
    # The policy's pool is the static draft's: SGLang sizes it at start and gives nothing back.
    static = build_plan(spec.model_copy(update={"draft": spec.draft.model_copy(update={"off_above": None})}),
                        draft=True)
    assert plan.capacity and static.capacity
    assert plan.capacity.draft_on.kv_pool_tokens == static.capacity.draft_on.kv_pool_tokens
    # Draft off: no policy, no file, no adaptive flag.
    off = build_plan(spec, draft=False)
    assert not off.files and off.draft_policy is None and "--speculative-adaptive" not in off.nodes[0].command


def test_refusal_exits_3_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    seat = _seat_copy(tmp_path)
    report = tmp_path / "report.json"
    report.write_text(json.dumps(_report({**CROSS, "estimate": None, "ci_low": None, "below_sweep": True},
                                         [(1, 0.5, 0.4, 0.6)])))
    before = seat.read_text()
    assert run_cli(["tune", "draft", str(report), "--seat", str(seat)], monkeypatch) == 3
    assert seat.read_text() == before
    assert "lost already" in capsys.readouterr().err


def test_a_builtin_profile_and_a_non_report_are_refused(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_text(json.dumps(_report(CROSS, SWEEP)))
    with pytest.raises(UsageError, match="built-in profile"):
        tune_draft(report, "local-sim")
    (tmp_path / "other.json").write_text('{"kind": "something else"}')
    with pytest.raises(UsageError, match="not a gate report"):
        tune_draft(tmp_path / "other.json", str(_seat_copy(tmp_path)))


def test_a_report_of_another_seat_is_said(tmp_path: Path) -> None:
    seat = _seat_copy(tmp_path)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({**_report(CROSS, SWEEP), "design": {"arms_from": {"kind": "seat", "seat": "other"}}}))
    res = tune_draft(report, str(seat), dry_run=True)
    assert res.warnings and "'other'" in res.warnings[0] and "'local-sim'" in res.warnings[0]
