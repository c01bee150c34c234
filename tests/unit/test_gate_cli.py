"""`sgl-seat gate` as a pipeline sees it: `--arms baseline,control` is accepted, and the exit status follows the
verdict (SHIP 0, DO_NOT_SHIP 1, INCONCLUSIVE 3, a usage error 2).

Why the seam is ``sgl_seat.gate.run_battery``: everything above it runs for real (typer's parsing, the arms and URLs,
the battery directory, the report built from the cells on disk, its rendering, the exit status); only the slots are
not run against an engine. The fake writes the cells a battery would (the engine's KV pool, the hangs count) with
values whose verdict is known: a one-gate workloads file (kv_pool) decides it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import sgl_seat.gate as gate_pkg
from sgl_seat.cli.main import app
from sgl_seat.errors import SeatError
from sgl_seat.gate import EXIT_CODES, exit_code
from sgl_seat.gate.design import schedule
from sgl_seat.gate.runner import BatteryDir
from sgl_seat.gate.workloads import Battery
from tests.cli_runner import run_cli

WORKLOADS = """schema_version: 1
full:
  runs: 2
  greedy: {prompts: 1, max_tokens: 2}
  sweep: {levels: [1], requests_per_client: 1, prompt_tokens: 4, max_tokens: 2}
  cold_ttft: {prompt_tokens: 4, max_tokens: 2}
  prefix: {groups: 1, prompts_per_group: 1, system_tokens: 4, question_tokens: 2, max_tokens: 2, passes: 2,
           concurrency: 1}
  gates:
    - {name: kv_pool, metric: kv_pool_tokens, threshold: 0.95, higher_is_better: true}
"""
BASE_KV = 1_040_128


def _fake_battery(kv_by_arm: dict[str, int | None], seen: list[Any]) -> Any:
    """A stand-in for run_battery: the engine and hangs cells of every slot, KV pool as given (None: not reported)."""

    def run_battery(bd: BatteryDir, arms_impl: Any, **_kw: Any) -> None:
        seen.append(arms_impl)
        plan = bd.read_plan()
        for slot in schedule(plan["arms"], Battery.model_validate(plan["battery"]).runs):
            kv = kv_by_arm[slot.arm]
            cells = {"engine": {"info": {} if kv is None else {"kv_pool_tokens": kv}, "up_s": 1.0, "cold": False,
                                "bundles_before": []},
                     "hangs": {"measured": True, "count": 0, "bundles": []}}
            for name, data in cells.items():
                bd.write_json(bd.cell_path(slot, name), {
                    "schema_version": "1.0", "slot": slot.key, "arm": slot.arm, "rep": slot.rep,
                    "position": slot.position, "cell": name, "data": data, "seconds": 1.0, "finished": time.time()})

    return run_battery


def _invoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arms: str, kv: dict[str, int | None],
            *extra: str) -> tuple[int, str, list[Any]]:
    seen: list[Any] = []
    monkeypatch.setattr(gate_pkg, "run_battery", _fake_battery(kv, seen))
    tmp_path.mkdir(parents=True, exist_ok=True)
    wl = tmp_path / "w.yaml"
    wl.write_text(WORKLOADS)
    res = CliRunner().invoke(app, ["gate", "--url", "baseline=http://127.0.0.1:9", "--url",
                                   "candidate=http://127.0.0.1:8", "--arms", arms, "--workloads", str(wl), "--out",
                                   str(tmp_path / "b"), *extra],
                             env={"SGLSEAT_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "COLUMNS": "200"})
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.stdout, seen


def test_cli_accepts_baseline_control_as_an_aa_rehearsal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN `--arms baseline,control` and only the baseline's URL WHEN the gate runs THEN the CLI accepts it (it used
    to refuse "give baseline,candidate"), the control runs at the baseline's URL, every gate compares control against
    baseline, the verdict is the control's, and identical arms give SHIP: exit 0."""
    seen: list[Any] = []
    monkeypatch.setattr(gate_pkg, "run_battery", _fake_battery({"baseline": BASE_KV, "control": BASE_KV}, seen))
    wl = tmp_path / "w.yaml"
    wl.write_text(WORKLOADS)
    res = CliRunner().invoke(app, ["gate", "--url", "baseline=http://127.0.0.1:9/", "--arms", "baseline,control",
                                   "--workloads", str(wl), "--out", str(tmp_path / "b"), "--json"],
                             env={"SGLSEAT_HOME": str(tmp_path / "home")})
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["design"]["arms"] == ["baseline", "control"] and rep["verdict_of"] == "control"
    assert rep["verdict"] == "SHIP" and list(rep["comparisons"]) == ["control"]
    assert [g["outcome"] for g in rep["gates"]] == ["PASS"] and rep["noise_floor"] is not None
    assert seen[0].urls == {"baseline": "http://127.0.0.1:9", "control": "http://127.0.0.1:9"}
    assert json.loads((tmp_path / "b" / "battery.json").read_text())["arms"] == ["baseline", "control"]
    code, out, _ = _invoke(tmp_path / "text", monkeypatch, "baseline,control",
                           {"baseline": BASE_KV, "control": BASE_KV})
    assert code == 0 and "VERDICT (control vs baseline, A/A rehearsal: identical arms): SHIP" in out


@pytest.mark.parametrize(("arms", "kv", "verdict", "code"), [
    ("baseline,candidate", {"baseline": BASE_KV, "candidate": BASE_KV}, "SHIP", 0),
    ("baseline,candidate", {"baseline": BASE_KV, "candidate": BASE_KV // 2}, "DO_NOT_SHIP", 1),
    ("baseline,candidate", {"baseline": BASE_KV, "candidate": None}, "INCONCLUSIVE", 3),
    ("baseline,control", {"baseline": BASE_KV, "control": BASE_KV // 2}, "DO_NOT_SHIP", 1),
])
@pytest.mark.parametrize("json_out", [True, False])
def test_exit_code_follows_the_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arms: str,
                                       kv: dict[str, int | None], verdict: str, code: int, json_out: bool) -> None:
    """GIVEN cells whose verdict is known (the KV pool equal, halved, or not reported) WHEN the gate runs, with --json
    or text THEN the report says that verdict and the exit status is its code."""
    got, out, _ = _invoke(tmp_path, monkeypatch, arms, kv, *(["--json"] if json_out else []))
    rep = json.loads((tmp_path / "b" / "report.json").read_text())
    assert rep["verdict"] == verdict and got == code, out
    assert (json.loads(out)["verdict"] == verdict) if json_out else (f"): {verdict}" in out)


def test_usage_errors_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN arms without a baseline, or without a candidate or control, or an option click refuses WHEN the gate is
    called as a shell would THEN exit 2 (the usage error's status, apart from every verdict's) and no battery ran."""
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path / "home"))
    ran: list[Any] = []
    monkeypatch.setattr(gate_pkg, "run_battery", _fake_battery({}, ran))
    for arms in ("candidate,control", "baseline", "baseline,control,control", "baseline,turbo"):
        assert run_cli(["gate", "--url", "baseline=http://127.0.0.1:9", "--arms", arms], monkeypatch) == 2, arms
        assert "give baseline with candidate, hybrid or control" in capsys.readouterr().err
    assert run_cli(["gate", "--runs", "0"], monkeypatch) == 2
    assert ran == []
    assert 2 not in EXIT_CODES.values() and exit_code("SOMETHING_NEW") == 3


def test_help_documents_the_exit_codes_and_the_aa_rehearsal() -> None:
    res = CliRunner().invoke(app, ["gate", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    text = " ".join(res.stdout.split())
    assert res.exit_code == 0
    assert "0 SHIP, 1 DO_NOT_SHIP, 3 INCONCLUSIVE, 2 a usage error" in text and "baseline,control" in text


def test_a_hybrid_arm_without_a_candidate_is_its_own_subject() -> None:
    """GIVEN --arms baseline,hybrid,control (gating a tuned seat's policy) THEN it is accepted and the report's verdict
    is the hybrid's, never the A/A control's (a pipeline must not ship a failed hybrid on a clean A/A)."""
    from sgl_seat.gate import parse_arms

    assert parse_arms("baseline,hybrid,control") == ["baseline", "hybrid", "control"]
    assert parse_arms("baseline,candidate,hybrid,control") == ["baseline", "candidate", "hybrid", "control"]


def test_the_operators_note_reaches_the_battery_with_arms_from_a_seat(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN `gate --seat SEAT --note WORDS` WHEN the gate starts THEN the battery gets the operator's words (the seat
    chooser's own note once replaced them, so the trained model's battery on the GPU came back unnamed)."""
    got: list[Any] = []

    def run_gate(opts: Any, **_kw: Any) -> Any:
        got.append(opts)
        raise SeatError("stop here", fix="-")

    monkeypatch.setattr(gate_pkg, "run_gate", run_gate)
    res = CliRunner().invoke(app, ["gate", "--seat", "h200-1", "--note", "TRAINED: the model, the draft, the GPU",
                                   "--out", str(tmp_path / "b")], env={"SGLSEAT_HOME": str(tmp_path / "home")})
    assert isinstance(res.exception, SeatError) and got, res.output
    assert got[0].note == "TRAINED: the model, the draft, the GPU" and got[0].spec is not None
