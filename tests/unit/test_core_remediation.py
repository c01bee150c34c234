"""The on_hang policy's decision (sgl_seat/core/remediation.py): every verdict kind, the budget at its edges, the
sliding window, the cooldown, the sticky refusal, the draft's gathers, and the record's JSON.

GIVEN/WHEN/THEN: a verdict as the detectors produce it, a policy, a history and a time; the decision's action is
checked, and its reason where an operator reads a number in it."""

from __future__ import annotations

import json

import pytest

from sgl_seat.core import detect as d
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import ProbeRecord, RecordError, Verdict, VerdictKind
from sgl_seat.core.remediation import (
    PENDING_STALE_S,
    REMEDIATION_SCHEMA_VERSION,
    Action,
    Decision,
    DraftShape,
    Outcome,
    Policy,
    RemediationRecord,
    budget_used,
    decide,
    draft_likely,
    frame_in_verify,
    parse_on_hang,
    verdict_gather_size,
    verdict_summary,
)
from sgl_seat.engines import words_for
from sgl_seat.errors import UsageError
from sgl_seat.spec import WatchdogSpec, load_spec

T0 = 1_000_000.0
#: local-sim's draft: 8 slots x 4 draft tokens = 32 positions per verify step.
DRAFT_ON = DraftShape(enabled=True, slots=8, draft_tokens=4)
DRAFT_OFF = DraftShape(enabled=False, slots=8, draft_tokens=4)
ROLLBACK = Policy(on_hang="rollback-draft", max=3, window_s=3600, cooldown_s=300)
RESTART = Policy(on_hang="restart", max=3, window_s=3600, cooldown_s=300)
TARGET = "sgl_seat.sim.rowfetch:fetch_rows"

WORDS = words_for("sglang")


def rowfetch_verdict(size: int, *, t: float = T0 + 5.0) -> Verdict:
    """A row-fetch stall as detect() makes it at ``t``: rank 3's fetch of ``size`` rows in flight for 5 s, its
    peers' fetches done (the real detector, so the gather size is read from the evidence line it writes)."""
    t0 = t - 5.0
    probes = [ProbeRecord(node=r // 2, rank=r, pid=100 + r, thread=1, seq=s, target=TARGET, start=t0 - 1 + s * 0.03,
                          end=t0 - 1 + s * 0.03 + 0.002, gather_size=size) for r in range(4) for s in range(20)]
    probes.append(ProbeRecord(node=1, rank=3, pid=103, thread=1, seq=999, target=TARGET, start=t0, end=None,
                              gather_size=size))
    v = d.detect(Observation.of(words=WORDS, probes=probes, rank_nodes={0: 0, 1: 0, 2: 1, 3: 1}), WatchdogSpec(), t)
    assert v is not None and v.kind is VerdictKind.ROWFETCH_STALL and v.rank == 3
    return v


def verdict(kind: VerdictKind, frame: str | None = "Scheduler.step (scheduler.py:210)", *, t: float = T0 + 5.0,
            node: int | None = 1) -> Verdict:
    return Verdict(kind=kind, rank=3, node=node, frame=frame, t=t, evidence=("synthetic",))


def done(started: float, *, served_after: float | None = 20.0, action: Action = Action.RESTART) -> RemediationRecord:
    """A remediation begun at ``started`` that served again ``served_after`` s later (None: it never did)."""
    r = RemediationRecord(action=action, reason="test", verdict="row-fetch stall rank 3", bundle_id="b",
                          started=started, outcome=Outcome.PENDING)
    return r.failed("did not come back") if served_after is None else r.stopped(started + 2).served(
        started + served_after)


# -- policy and verdict reading -----------------------------------------------------------------------------


def test_the_default_policy_is_capture_and_matches_the_spec_defaults() -> None:
    """GIVEN no policy in the spec THEN capture, 3 per hour, 300 s cooldown; Policy() says the same."""
    assert Policy.of(WatchdogSpec()) == Policy() == Policy(on_hang="capture", max=3, window_s=3600, cooldown_s=300)


def test_up_on_hang_overrides_the_spec_and_is_checked() -> None:
    assert Policy.of(WatchdogSpec(), "rollback-draft").on_hang == "rollback-draft"
    assert Policy.of(WatchdogSpec.model_validate({"on_hang": "restart"}), None).on_hang == "restart"
    with pytest.raises(UsageError, match="--on-hang 'reboot'"):
        parse_on_hang("reboot")


def test_policy_round_trips_and_a_bad_one_is_a_record_error() -> None:
    p = Policy(on_hang="restart", max=2, window_s=60.0, cooldown_s=0.0, draft_gather_max=96)
    assert Policy.from_json(json.loads(json.dumps(p.to_json()))) == p
    with pytest.raises(RecordError, match="remediation policy"):
        Policy.from_json({**p.to_json(), "max": 0})


def test_the_gather_size_is_read_from_the_detectors_own_evidence() -> None:
    """GIVEN the real row-fetch detector's verdict THEN its gather size is read back; other kinds carry none."""
    assert verdict_gather_size(rowfetch_verdict(24)) == 24
    assert verdict_gather_size(rowfetch_verdict(400)) == 400
    assert verdict_gather_size(rowfetch_verdict(-1)) is None  # a target without a measured argument
    assert verdict_gather_size(verdict(VerdictKind.STACK_UNCHANGED)) is None


@pytest.mark.parametrize(("frame", "verify"), [
    ("EAGLEWorkerV2.verify (eagle_worker_v2.py:1979)", True),
    ("run_eagle_verify (eagle_worker_common.py:547)", True),
    ("EAGLEWorkerV2._build_trivial_verify_input (eagle_worker_v2.py:1678)", True),
    ("Scheduler.step (scheduler.py:210)", False),
    ("verifyish (x.py:1)", False),
    ("EagleVerifyInput.prepare (eagle_info.py:10)", False),  # the class is no step of verify's: its method is named
    (None, False),
])
def test_frame_in_verify(frame: str | None, verify: bool) -> None:
    assert frame_in_verify(frame) is verify


def test_verdict_summary_is_one_line() -> None:
    assert verdict_summary(rowfetch_verdict(24)).startswith("row-fetch stall rank 3 node 1 fetch_rows")
    assert verdict_summary(Verdict(kind=VerdictKind.NO_PROGRESS, rank=None, node=None, frame=None, t=0.0)) \
        == "no progress"


# -- every verdict kind under each policy ------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(VerdictKind))
def test_capture_never_acts(kind: VerdictKind) -> None:
    dec = decide(verdict(kind), Policy(), [], T0 + 6, draft=DRAFT_ON)
    assert dec.action is Action.NONE and "capture" in dec.reason and not dec.exhausted


LOST_NODE = (VerdictKind.NODE_UNREACHABLE, VerdictKind.NODE_ISOLATED)


@pytest.mark.parametrize("kind", [k for k in VerdictKind if k not in LOST_NODE])
def test_restart_restarts_on_every_kind_but_an_unreachable_node(kind: VerdictKind) -> None:
    dec = decide(verdict(kind), RESTART, [], T0 + 6, draft=DRAFT_ON)
    assert dec.action is Action.RESTART and "remediation 1 of 3" in dec.reason


@pytest.mark.parametrize("kind", LOST_NODE)
@pytest.mark.parametrize("policy", [RESTART, ROLLBACK])
def test_an_unreachable_node_is_left_to_an_operator_without_spending_budget(policy: Policy, kind: VerdictKind
                                                                            ) -> None:
    """A restart drives the node agents; the unreachable (or isolated) node's does not answer."""
    dec = decide(verdict(kind), policy, [], T0 + 6, draft=DRAFT_ON)
    assert dec.action is Action.NONE and "node-unreachable.md" in dec.reason and not dec.exhausted


@pytest.mark.parametrize(("kind", "frame", "action"), [
    # the draft's cases: a stall in verify, whatever detector saw it
    (VerdictKind.STACK_UNCHANGED, "EAGLEWorkerV2.verify (eagle_worker_v2.py:1979)", Action.ROLLBACK_DRAFT),
    (VerdictKind.NO_PROGRESS, "run_eagle_verify (eagle_worker_common.py:547)", Action.ROLLBACK_DRAFT),
    (VerdictKind.ENGINE_WATCHDOG, "EAGLEWorkerV2.verify (eagle_worker_v2.py:1979)", Action.ROLLBACK_DRAFT),
    # stalls elsewhere, and kinds that are no stall of the draft's even with a verify frame
    (VerdictKind.STACK_UNCHANGED, "Scheduler.step (scheduler.py:210)", Action.RESTART),
    (VerdictKind.NO_PROGRESS, None, Action.RESTART),
    (VerdictKind.ENGINE_WATCHDOG, None, Action.RESTART),
    (VerdictKind.PROCESS_EXITED, "EAGLEWorkerV2.verify (eagle_worker_v2.py:1979)", Action.RESTART),
    (VerdictKind.PROCESS_STOPPED, "EAGLEWorkerV2.verify (eagle_worker_v2.py:1979)", Action.RESTART),
])
def test_rollback_draft_by_kind_and_frame(kind: VerdictKind, frame: str | None, action: Action) -> None:
    dec = decide(verdict(kind, frame), ROLLBACK, [], T0 + 6, draft=DRAFT_ON)
    assert dec.action is action, dec.reason
    assert dec.draft_likely is (action is Action.ROLLBACK_DRAFT)
    if action is Action.RESTART:
        assert "falls back to restart" in dec.reason


@pytest.mark.parametrize(("size", "action"), [
    (1, Action.ROLLBACK_DRAFT),
    (24, Action.ROLLBACK_DRAFT),
    (32, Action.ROLLBACK_DRAFT),   # 8 slots x 4 draft tokens: the largest verify gather
    (33, Action.RESTART),          # only a prefill gathers more
    (400, Action.RESTART),         # the runbook's rehearsal: a long prompt's prefill
    (-1, Action.RESTART),          # size unknown: no telling verify from prefill
])
def test_a_row_fetch_stall_is_the_drafts_within_a_verify_steps_gather(size: int, action: Action) -> None:
    dec = decide(rowfetch_verdict(size), ROLLBACK, [], T0 + 6, draft=DRAFT_ON)
    assert dec.action is action, dec.reason
    if size == 33:
        assert "a prefill, which the draft does not change" in dec.reason
    if size == -1:
        assert "gather size is unknown" in dec.reason


def test_the_policy_can_set_the_verify_gather_bound() -> None:
    """A model whose probed gather counts several ids per position (Engram's n_hash_cols) sets the bound."""
    wide = Policy(on_hang="rollback-draft", draft_gather_max=32 * 8)
    assert decide(rowfetch_verdict(200), wide, [], T0 + 6, draft=DRAFT_ON).action is Action.ROLLBACK_DRAFT
    assert decide(rowfetch_verdict(257), wide, [], T0 + 6, draft=DRAFT_ON).action is Action.RESTART


def test_the_bound_follows_the_seats_draft_block() -> None:
    shape = DraftShape.of(load_spec("local-sim"), enabled=True)
    assert (shape.slots, shape.draft_tokens, shape.verify_gather_max(Policy())) == (8, 4, 32)


def test_rollback_on_a_seat_whose_draft_is_off_restarts() -> None:
    dec = decide(rowfetch_verdict(24), ROLLBACK, [], T0 + 6, draft=DRAFT_OFF)
    assert dec.action is Action.RESTART and dec.draft_likely and "draft off already" in dec.reason


def test_draft_likely_says_why_for_every_kind() -> None:
    for kind in VerdictKind:
        likely, why = draft_likely(verdict(kind, None), DRAFT_ON, ROLLBACK)
        assert not likely and why


# -- budget, window, cooldown --------------------------------------------------------------------------------


def test_the_budget_counts_remediations_not_refusals_or_nones() -> None:
    hist = [done(T0 - 3000), done(T0 - 2000),
            RemediationRecord(action=Action.NONE, reason="x", verdict="v", bundle_id=None, started=T0 - 1000,
                              outcome=Outcome.NOT_ACTED)]
    assert budget_used(RESTART, hist, T0) == 2
    assert decide(verdict(VerdictKind.STACK_UNCHANGED), RESTART, hist, T0 + 6, draft=DRAFT_ON).action \
        is Action.RESTART


def test_the_budget_is_exhausted_at_max_and_not_before() -> None:
    """GIVEN 2 remediations in the hour THEN the 3rd goes ahead; GIVEN 3 THEN the 4th is refused, saying when the
    oldest frees."""
    now = T0 + 6
    two = [done(T0 - 3000), done(T0 - 2000)]
    dec = decide(verdict(VerdictKind.STACK_UNCHANGED), RESTART, two, now, draft=DRAFT_ON)
    assert dec.action is Action.RESTART and "remediation 3 of 3" in dec.reason
    three = [*two, done(T0 - 1000)]
    dec = decide(verdict(VerdictKind.STACK_UNCHANGED), RESTART, three, now, draft=DRAFT_ON)
    assert dec.action is Action.REFUSED_BUDGET and dec.exhausted
    assert "3 remediations in the last 3600 s (max 3)" in dec.reason and "frees in 594 s" in dec.reason


def test_the_window_slides() -> None:
    """A remediation exactly window_s old has left the window; one a second younger has not."""
    hist = [done(T0 - 3600), done(T0 - 2000), done(T0 - 1000)]
    assert budget_used(RESTART, hist, T0) == 2
    assert decide(verdict(VerdictKind.STACK_UNCHANGED, t=T0), RESTART, hist, T0, draft=DRAFT_ON).action \
        is Action.RESTART
    hist[0] = done(T0 - 3599)
    assert budget_used(RESTART, hist, T0) == 3
    assert decide(verdict(VerdictKind.STACK_UNCHANGED, t=T0), RESTART, hist, T0, draft=DRAFT_ON).action \
        is Action.REFUSED_BUDGET


def test_a_budget_of_one() -> None:
    one = Policy(on_hang="restart", max=1, window_s=600, cooldown_s=0)
    assert decide(verdict(VerdictKind.STACK_UNCHANGED), one, [], T0 + 6, draft=DRAFT_ON).action is Action.RESTART
    assert decide(verdict(VerdictKind.STACK_UNCHANGED), one, [done(T0 - 593)], T0 + 6, draft=DRAFT_ON).action \
        is Action.REFUSED_BUDGET
    assert decide(verdict(VerdictKind.STACK_UNCHANGED), one, [done(T0 - 594)], T0 + 6, draft=DRAFT_ON).action \
        is Action.RESTART


def test_four_stalls_in_a_row_exhaust_a_budget_of_three() -> None:
    """The issue's acceptance case, decided: stalls 1-3 (each after the cooldown) are rolled back or restarted,
    the 4th is refused; from then on every verdict is refused until an operator acts."""
    hist: list[RemediationRecord] = []
    actions = []
    for i in range(5):
        t = T0 + i * 400.0
        v = rowfetch_verdict(24, t=t)
        dec = decide(v, ROLLBACK, hist, t + 2, draft=DRAFT_ON if i == 0 else DRAFT_OFF)
        actions.append(dec.action)
        rec = RemediationRecord.begin(dec, v, f"bundle-{i}", t + 2, draft_before=i == 0)
        hist.append(rec.stopped(t + 4).served(t + 20) if dec.action.remediates() else rec)
    assert actions == [Action.ROLLBACK_DRAFT, Action.RESTART, Action.RESTART, Action.REFUSED_BUDGET,
                       Action.REFUSED_BUDGET]
    assert hist[0].draft_after is False and hist[1].draft_before is False


def test_hung_again_within_the_cooldown_is_refused() -> None:
    """GIVEN a restart that served again at T0 WHEN the seat hangs 299 s later THEN refused (it did not heal);
    300 s later THEN restarted."""
    hist = [done(T0 - 20, served_after=20)]
    dec = decide(verdict(VerdictKind.STACK_UNCHANGED, t=T0 + 299), RESTART, hist, T0 + 301, draft=DRAFT_ON)
    assert dec.action is Action.REFUSED_COOLDOWN and dec.exhausted
    assert "hung again 299 s after the last restart served again (cooldown 300 s)" in dec.reason
    dec = decide(verdict(VerdictKind.STACK_UNCHANGED, t=T0 + 300), RESTART, hist, T0 + 302, draft=DRAFT_ON)
    assert dec.action is Action.RESTART


def test_the_cooldown_counts_from_the_start_of_a_remediation_that_never_served() -> None:
    hist = [done(T0, served_after=None)]
    dec = decide(verdict(VerdictKind.PROCESS_EXITED, t=T0 + 100), RESTART, hist, T0 + 101, draft=DRAFT_ON)
    assert dec.action is Action.REFUSED_COOLDOWN and "restart began" in dec.reason


def test_a_cooldown_of_zero_is_no_guard() -> None:
    p = Policy(on_hang="restart", cooldown_s=0)
    hist = [done(T0 - 20, served_after=20)]
    assert decide(verdict(VerdictKind.STACK_UNCHANGED, t=T0 + 1), p, hist, T0 + 2, draft=DRAFT_ON).action \
        is Action.RESTART


def test_budget_and_cooldown_together_name_both() -> None:
    hist = [done(T0 - 2000), done(T0 - 1000), done(T0 - 30, served_after=20)]
    dec = decide(verdict(VerdictKind.STACK_UNCHANGED, t=T0), RESTART, hist, T0 + 1, draft=DRAFT_ON)
    assert dec.action is Action.REFUSED_BUDGET and "hung again 10 s after the last one" in dec.reason


def test_a_refusal_sticks_until_an_operator_acts() -> None:
    """GIVEN a cooldown refusal an hour ago WHEN the seat hangs again, budget and cooldown long clear THEN it is
    refused again: only an operator clears it (a new record: down, then up)."""
    v = verdict(VerdictKind.STACK_UNCHANGED, t=T0)
    refused = RemediationRecord.begin(Decision(action=Action.REFUSED_COOLDOWN, reason="hung again 5 s after"), v,
                                      "b1", T0)
    assert refused.outcome is Outcome.NOT_ACTED
    dec = decide(verdict(VerdictKind.STACK_UNCHANGED, t=T0 + 7200), RESTART, [done(T0 - 30), refused], T0 + 7201,
                 draft=DRAFT_ON)
    assert dec.action is Action.REFUSED_COOLDOWN and "without an operator" in dec.reason


def test_a_verdict_during_a_remediation_is_left_to_it() -> None:
    pending = RemediationRecord(action=Action.RESTART, reason="r", verdict="v", bundle_id="b", started=T0,
                                outcome=Outcome.PENDING)
    dec = decide(verdict(VerdictKind.PROCESS_EXITED, t=T0 + 3), RESTART, [pending], T0 + 4, draft=DRAFT_ON)
    assert dec.action is Action.NONE and "still in progress" in dec.reason


def test_a_remediation_pending_for_too_long_is_taken_for_abandoned() -> None:
    """GIVEN a restart still pending PENDING_STALE_S after it began (its supervisor died) WHEN the seat hangs
    THEN it is no longer left to it: it counts as begun and never served (here: past the cooldown, restart)."""
    pending = RemediationRecord(action=Action.RESTART, reason="r", verdict="v", bundle_id="b", started=T0,
                                outcome=Outcome.PENDING)
    now = T0 + PENDING_STALE_S
    dec = decide(verdict(VerdictKind.STACK_UNCHANGED, t=now - 1), RESTART, [pending], now, draft=DRAFT_ON)
    assert dec.action is Action.RESTART and "remediation 2 of 3" in dec.reason


def test_a_verdict_older_than_the_last_remediation_is_not_acted_on() -> None:
    hist = [done(T0, served_after=20)]
    dec = decide(verdict(VerdictKind.STACK_UNCHANGED, t=T0 + 10), RESTART, hist, T0 + 30, draft=DRAFT_ON)
    assert dec.action is Action.NONE and "predates" in dec.reason


# -- the record --------------------------------------------------------------------------------------------


def test_the_record_round_trips_through_json_and_times_its_stages() -> None:
    v = rowfetch_verdict(24)
    dec = decide(v, ROLLBACK, [], T0 + 6, draft=DRAFT_ON)
    rec = RemediationRecord.begin(dec, v, "20261130-x", T0 + 6, draft_before=True)
    assert (rec.outcome, rec.draft_before, rec.draft_after, rec.hang_to_serving_s()) == \
        (Outcome.PENDING, True, False, None)
    rec = rec.stopped(T0 + 8).served(T0 + 26)
    doc = json.loads(json.dumps(rec.to_json()))
    assert doc["schema_version"] == REMEDIATION_SCHEMA_VERSION and doc["action"] == "rollback-draft"
    assert doc["outcome"] == "serving" and doc["verdict"].startswith("row-fetch stall rank 3")
    back = RemediationRecord.from_json(doc)
    assert back == rec and back.hang_to_serving_s() == 20.0
    assert rec.bundle_json() == {"action": "rollback-draft", "started": T0 + 6, "serving_again": T0 + 26}
    assert rec.failed("x").outcome is Outcome.FAILED


@pytest.mark.parametrize(("edit", "match"), [
    ({"schema_version": 2}, "schema_version 2"),
    ({"action": "reboot"}, "bad action"),
    ({"outcome": None}, "bad action or outcome"),
    ({"started": "yesterday"}, "'started'"),
    ({"started": True}, "'started'"),
    ({"reason": 5}, "'reason'"),
    ({"draft_before": 1}, "'draft_before'"),
])
def test_a_damaged_record_is_a_record_error(edit: dict[str, object], match: str) -> None:
    doc = done(T0).to_json()
    with pytest.raises(RecordError, match=match):
        RemediationRecord.from_json({**doc, **edit})
