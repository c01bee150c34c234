"""`status` and `up` for healing by policy (issue 26), without Ray: the history in `status` and `status --json`,
a remediation in progress left to the supervisor, REMEDIATION-EXHAUSTED kept like FAILED, and `up --on-hang`
reaching the library's options and the record.

The agents are fakes at the `get_agent` seam (as in test_launch_node_lost); `up` is faked at the library call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.core.records import Verdict, VerdictKind
from sgl_seat.core.remediation import Action, Decision, Outcome, Policy, RemediationRecord
from sgl_seat.launch import stages, status
from sgl_seat.launch import up as up_mod
from sgl_seat.launch.seatrecord.home import HOME_ENV
from sgl_seat.launch.seatrecord.record import NodeRecord, RankRecord, SeatRecord, load_record, save_record
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.spec import load_spec
from tests.cli_runner import run_cli

T0 = 1_700_000_000.0
V = Verdict(kind=VerdictKind.ROWFETCH_STALL, rank=3, node=1, frame="fetch_rows (rowfetch.py:88)", t=T0)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def _rec(state: SeatState = SeatState.READY) -> SeatRecord:
    nodes = [NodeRecord(node_rank=n, agent=f"a{n}", ip="127.0.0.1",
                        ranks=[RankRecord(tp_rank=r, ep_rank=r, title=f"sglang::scheduler_TP{r}")
                               for r in (2 * n, 2 * n + 1)]) for n in range(2)]
    rec = SeatRecord(name="local-sim", state=state, engine="sim", draft=False, cluster_address="local",
                     namespace="n", pg_name="p", endpoint="http://127.0.0.1:1", nodes=nodes, no_watchdog=True,
                     gcs_address="127.0.0.1:6379", on_hang="rollback-draft",
                     remediation_policy=Policy(on_hang="rollback-draft").to_json())
    rollback = RemediationRecord.begin(Decision(action=Action.ROLLBACK_DRAFT, reason="row-fetch stall at gather "
                                                "size 24, within what a draft-on step gathers"),
                                       V, "20261130-rb", T0 + 2, draft_before=True)
    rec.add_remediation(rollback.stopped(T0 + 4.5).served(T0 + 21.25))
    return rec


def _alive(node: int) -> dict[str, Any]:
    ranks = [{"tp_rank": 2 * node + i, "ep_rank": 2 * node + i, "title": f"sglang::scheduler_TP{2 * node + i}",
              "pid": 100 + i, "alive": True} for i in range(2)]
    return {"node_rank": node, "started": True, "alive": True, "pid": 99, "pgid": 99, "ranks": ranks,
            "processes": [], "reason": None}


class _Agent:
    def __init__(self, node_rank: int, answer: dict[str, Any]) -> None:
        self.node_rank = node_rank
        self.answer = answer

    def submit(self, method: str, *args: Any) -> str:
        return method

    def wait(self, ref: Any, timeout: float, what: str) -> Any:
        return self.answer


def _reconcile(rec: SeatRecord, monkeypatch: pytest.MonkeyPatch, answers: dict[int, dict[str, Any]]) -> None:
    monkeypatch.setattr(status, "get_agent", lambda seat, r: _Agent(r, answers[r]))
    monkeypatch.setattr(status.health, "probe", lambda url, timeout: (200, None))
    status._reconcile(rec, timeout=1.0)


# -- status ------------------------------------------------------------------------------------------------


def test_status_json_carries_the_policy_the_budget_and_the_history_with_timings() -> None:
    doc = json.loads(json.dumps(status.status_json(_rec(), now=T0 + 60)))
    assert doc["on_hang"] == "rollback-draft"
    rem = doc["remediation"]
    assert rem["policy"] == {"on_hang": "rollback-draft", "max": 3, "window_s": 3600.0, "cooldown_s": 300.0,
                             "draft_gather_max": None}
    assert (rem["used"], rem["left"], rem["exhausted"]) == (1, 2, False)
    (h,) = rem["history"]
    assert (h["action"], h["outcome"], h["bundle_id"]) == ("rollback-draft", "serving", "20261130-rb")
    assert (h["engines_stopped_s"], h["serving_again_s"]) == (2.5, 19.25)
    assert (h["draft_before"], h["draft_after"], h["schema_version"]) == (True, False, 1)
    # an hour and more later the budget is free again; the history stays
    later = status.status_json(_rec(), now=T0 + 2 + 3600)["remediation"]
    assert (later["used"], later["left"], len(later["history"])) == (0, 3, 1)


def test_status_json_of_a_seat_without_a_policy_says_capture_and_empty() -> None:
    rec = SeatRecord(name="s", state=SeatState.READY, engine="sim", draft=False, cluster_address="local",
                     namespace="n", pg_name="p")
    doc = status.status_json(rec, now=T0)
    assert doc["on_hang"] == "capture" and doc["remediation"]["history"] == []
    assert doc["remediation"]["policy"]["on_hang"] == "capture" and doc["remediation"]["left"] == 3
    assert status.remediation_lines(rec, T0) == []


def test_status_lines_show_each_remediation_with_its_timings() -> None:
    rec = _rec()
    refused = RemediationRecord.begin(Decision(action=Action.REFUSED_COOLDOWN, reason="hung again 12 s after the "
                                               "last rollback-draft served again"), V, "20261130-x", T0 + 40)
    rec.add_remediation(refused)
    lines = status.remediation_lines(rec, T0 + 60)
    assert lines[0] == "on hang: rollback-draft (1 of 3 remediations used in the last 3600 s; cooldown 300 s)"
    assert "rollback-draft  serving; engines stopped +2.5 s; serving again +19.2 s; draft on -> off  bundle " \
           "20261130-rb" in lines[1]
    assert lines[2].strip().startswith("row-fetch stall rank 3 node 1 fetch_rows (rowfetch.py:88): row-fetch stall")
    assert "refused-cooldown  not-acted  bundle 20261130-x" in lines[3]


def test_status_prints_the_history(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN a recorded seat with a remediation WHEN `sgl-seat status` THEN its lines are printed; --json has it."""
    rec = _rec()
    save_record(rec)
    monkeypatch.setattr(status, "status", lambda name, timeout: load_record(name))
    assert run_cli(["status"], monkeypatch) == 0
    out = capsys.readouterr().out
    assert "on hang: rollback-draft" in out and "serving again +19.2 s" in out
    assert run_cli(["status", "--json"], monkeypatch) == 0
    assert json.loads(capsys.readouterr().out)["remediation"]["history"][0]["action"] == "rollback-draft"


def test_a_remediation_in_progress_is_left_to_the_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN REMEDIATING with a pending remediation WHEN `status` runs THEN it returns the record untouched, without
    Ray; once the remediation is older than REMEDIATION_STALE_S it is reconciled as any other seat."""
    rec = _rec(SeatState.HUNG)
    rec.set_state(SeatState.REMEDIATING, "restart")
    pending = RemediationRecord.begin(Decision(action=Action.RESTART, reason="r"), V, "b2", T0 + 100)
    rec.add_remediation(pending)
    save_record(rec)

    def no_ray(*a: Any, **k: Any) -> None:
        raise AssertionError("status went to Ray during a remediation")

    monkeypatch.setattr(status.cluster, "connect", no_ray)
    monkeypatch.setattr(status.time, "time", lambda: T0 + 160)
    assert status.status("local-sim").state is SeatState.REMEDIATING
    assert status.remediation_in_progress(rec, T0 + 100 + status.REMEDIATION_STALE_S - 1)
    assert not status.remediation_in_progress(rec, T0 + 100 + status.REMEDIATION_STALE_S)
    _reconcile(rec, monkeypatch, {0: _alive(0), 1: _alive(1)})  # stale: the seat serves, so READY
    assert rec.state is SeatState.READY


def test_exhausted_is_kept_like_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN REMEDIATION-EXHAUSTED WHEN status finds engines alive and health good, or an engine dead THEN the state
    and its reason stay: an operator's turn."""
    rec = _rec(SeatState.HUNG)
    rec.set_state(SeatState.REMEDIATION_EXHAUSTED, "budget exhausted: 3 remediations in the last 3600 s")
    _reconcile(rec, monkeypatch, {0: _alive(0), 1: _alive(1)})
    assert rec.state is SeatState.REMEDIATION_EXHAUSTED and rec.reason.startswith("budget exhausted")
    dead = {**_alive(1), "alive": False, "returncode": -9, "reason": "node 1 engine (pid 99) was killed"}
    _reconcile(rec, monkeypatch, {0: _alive(0), 1: dead})
    assert rec.state is SeatState.REMEDIATION_EXHAUSTED and rec.reason.startswith("budget exhausted")
    assert status.status_json(rec, now=T0)["remediation"]["exhausted"] is True


# -- up --on-hang ------------------------------------------------------------------------------------------


def _fake_up(seen: list[up_mod.UpOptions]) -> Any:
    def fake(spec: Any, opts: up_mod.UpOptions, reporter: stages.Reporter) -> tuple[SeatRecord, stages.StageTimes]:
        seen.append(opts)
        policy = up_mod.effective_policy(spec, opts)
        rec = _rec()
        rec.on_hang, rec.remediation_policy = policy.on_hang, policy.to_json()
        return rec, stages.Stages(reporter).times
    return fake


def test_up_on_hang_reaches_the_library_and_the_json(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[up_mod.UpOptions] = []
    monkeypatch.setattr(up_mod, "up", _fake_up(seen))
    assert run_cli(["up", "--on-hang", "restart", "--json"], monkeypatch) == 0
    out, err = capsys.readouterr()
    assert seen[-1].on_hang == "restart" and json.loads(out)["on_hang"] == "restart"
    assert "on hang: restart" in err
    assert run_cli(["up", "--json"], monkeypatch) == 0
    assert seen[-1].on_hang is None and json.loads(capsys.readouterr().out)["on_hang"] == "capture"


@pytest.mark.parametrize(("argv", "message"), [
    (["up", "--on-hang", "reboot"], "--on-hang 'reboot' is not a policy"),
    (["up", "--on-hang", "reboot", "--dry-run"], "--on-hang 'reboot' is not a policy"),
    (["up", "--on-hang", "restart", "--no-watchdog"], "starts no watchdog"),
])
def test_a_bad_on_hang_is_refused_before_anything_starts(argv: list[str], message: str, home: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    def never(*a: Any, **k: Any) -> None:
        raise AssertionError("up started")

    monkeypatch.setattr(up_mod, "up", never)
    assert run_cli(argv, monkeypatch) == 2
    assert message in capsys.readouterr().err
    assert not (home / "seats").exists()


def test_the_effective_policy_is_the_specs_with_on_hang_replaced() -> None:
    spec = load_spec("local-sim")
    assert up_mod.effective_policy(spec, up_mod.UpOptions()) == Policy()
    p = up_mod.effective_policy(spec, up_mod.UpOptions(on_hang="rollback-draft"))
    assert p == Policy(on_hang="rollback-draft")
    # the spec's own policy with --no-watchdog is recorded as it is (the seat is just not watched)
    assert up_mod.effective_policy(spec, up_mod.UpOptions(no_watchdog=True)).on_hang == "capture"


def test_help_of_up_lists_on_hang(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["up", "--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    assert "--on-hang" in out and "rollback-draft" in out


def test_outcome_values_are_stable() -> None:
    """status --json and the exporter's labels carry these words (docs/status-json.md lists them)."""
    assert [a.value for a in Action] == ["none", "restart", "rollback-draft", "refused-budget", "refused-cooldown"]
    assert [o.value for o in Outcome] == ["pending", "serving", "failed", "not-acted"]
