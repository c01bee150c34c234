"""The local seat record: round trip, the claim that refuses a second `up`, and NAME resolution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_seat.core.records import Verdict, VerdictKind
from sgl_seat.core.remediation import Action, Decision, Outcome, Policy, RemediationRecord
from sgl_seat.errors import SeatStateError, UsageError
from sgl_seat.launch.seatrecord.home import HOME_ENV, seat_home
from sgl_seat.launch.seatrecord.record import (
    RECORD_SCHEMA_VERSION,
    NodeRecord,
    RankRecord,
    SeatRecord,
    claim_record,
    list_names,
    load_record,
    record_path,
    remove_record,
    resolve_name,
    save_record,
)
from sgl_seat.launch.seatrecord.state import SeatState


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    return tmp_path / "home"


def _rec(name: str = "s1") -> SeatRecord:
    return SeatRecord(
        name=name, state=SeatState.PLACING, engine="sim", draft=True, cluster_address="local",
        namespace=f"sgl-seat-{name}", pg_name=f"sgl-seat-{name}-pg",
        nodes=[NodeRecord(node_rank=0, agent="a0", ranks=[RankRecord(tp_rank=0, ep_rank=0, title="sglang::x",
                                                                     pid=12, alive=True)])],
    )


def test_home_follows_the_environment(home: Path) -> None:
    assert seat_home() == home


def test_record_round_trips_through_json(home: Path) -> None:
    """GIVEN a record with nested nodes and ranks WHEN saved and loaded THEN it is equal, as plain JSON."""
    rec = _rec()
    save_record(rec)
    doc = json.loads(record_path("s1").read_text())
    assert doc["state"] == "PLACING" and doc["schema_version"] == RECORD_SCHEMA_VERSION == 3
    back = load_record("s1")
    assert back.to_dict() == rec.to_dict()
    assert back.nodes[0].ranks[0].pid == 12


def test_second_claim_is_refused_naming_the_state() -> None:
    """A second `up` of a recorded seat is refused before anything is started."""
    claim_record(_rec())
    with pytest.raises(SeatStateError, match="already recorded as PLACING"):
        claim_record(_rec())


def test_unknown_record_version_is_refused(home: Path) -> None:
    save_record(_rec())
    path = record_path("s1")
    doc = json.loads(path.read_text())
    doc["schema_version"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(SeatStateError, match="schema_version 99"):
        load_record("s1")


def test_set_state_follows_transitions() -> None:
    rec = _rec()
    rec.set_state(SeatState.FAILED, "node 1 engine killed by SIGKILL")
    assert rec.reason == "node 1 engine killed by SIGKILL"
    with pytest.raises(SeatStateError):
        rec.set_state(SeatState.READY)


def test_name_defaults_to_the_only_seat_else_lists_them() -> None:
    with pytest.raises(UsageError, match="no seat is recorded"):
        resolve_name(None)
    save_record(_rec("a"))
    assert resolve_name(None) == "a"
    save_record(_rec("b"))
    with pytest.raises(UsageError, match="a, b"):
        resolve_name(None)
    assert resolve_name("b") == "b"
    remove_record("a")
    assert list_names() == ["b"]


def test_missing_record_names_what_is_recorded() -> None:
    save_record(_rec("a"))
    with pytest.raises(SeatStateError, match=r"recorded seats: \['a'\]"):
        load_record("zzz")


def test_a_schema_1_record_still_loads_with_no_policy_and_no_history(home: Path) -> None:
    """GIVEN a record as schema 1 wrote it (no on_hang, no remediations) WHEN loaded THEN on_hang capture, the
    default budget, an empty history; saved back it is schema 3."""
    save_record(_rec())
    path = record_path("s1")
    doc = json.loads(path.read_text())
    for key in ("on_hang", "remediation_policy", "remediations"):
        del doc[key]
    doc["schema_version"] = 1
    path.write_text(json.dumps(doc))
    rec = load_record("s1")
    assert (rec.on_hang, rec.remediations, rec.policy()) == ("capture", [], Policy())
    save_record(rec)
    assert json.loads(path.read_text())["schema_version"] == 3


def test_policy_and_history_round_trip(home: Path) -> None:
    """GIVEN a seat brought up with on_hang rollback-draft WHEN the supervisor adds and updates a remediation THEN
    both survive a save and load, typed."""
    rec = _rec()
    rec.on_hang = "rollback-draft"
    rec.remediation_policy = Policy(on_hang="rollback-draft", max=2, window_s=600, cooldown_s=60).to_json()
    v = Verdict(kind=VerdictKind.ROWFETCH_STALL, rank=3, node=1, frame="fetch_rows (rowfetch.py:88)", t=100.0)
    r = RemediationRecord.begin(Decision(action=Action.ROLLBACK_DRAFT, reason="why"), v, "b-1", 101.0,
                                draft_before=True)
    rec.add_remediation(r)
    rec.update_remediation(r.stopped(103.0).served(120.0))
    save_record(rec)
    back = load_record("s1")
    assert back.policy() == Policy(on_hang="rollback-draft", max=2, window_s=600, cooldown_s=60)
    (h,) = back.remediation_history()
    assert (h.action, h.outcome, h.serving_again, h.draft_after) == (Action.ROLLBACK_DRAFT, Outcome.SERVING, 120.0,
                                                                     False)


def test_updating_a_remediation_that_was_never_added_is_an_error() -> None:
    with pytest.raises(SeatStateError, match="no remediation to update"):
        _rec().update_remediation(RemediationRecord(action=Action.RESTART, reason="r", verdict="v", bundle_id=None,
                                                    started=1.0, outcome=Outcome.PENDING))


@pytest.mark.parametrize(("key", "value"), [
    ("remediations", [{"schema_version": 1, "action": "reboot"}]),
    ("remediation_policy", {"max": 0}),
    ("on_hang", "reboot"),
])
def test_a_damaged_policy_or_history_is_found_on_load(home: Path, key: str, value: object) -> None:
    save_record(_rec())
    path = record_path("s1")
    doc = json.loads(path.read_text())
    doc[key] = value
    if key == "on_hang":
        doc["remediation_policy"] = Policy().to_json()
    path.write_text(json.dumps(doc))
    with pytest.raises(SeatStateError, match="damaged seat record"):
        load_record("s1")
