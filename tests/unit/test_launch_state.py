"""Seat states: the documented transitions hold and nothing else is allowed."""

from __future__ import annotations

import pytest

from sgl_seat.errors import SeatStateError
from sgl_seat.launch.seatrecord.state import TRANSITIONS, SeatState, parse_state, transition


def test_every_state_has_a_transition_row() -> None:
    """GIVEN the enum WHEN the table is read THEN every state is covered (no silent dead ends)."""
    assert set(TRANSITIONS) == set(SeatState)


@pytest.mark.parametrize(("old", "new"), [
    (SeatState.PLACING, SeatState.STARTING),
    (SeatState.STARTING, SeatState.READY),
    (SeatState.READY, SeatState.DEGRADED),
    (SeatState.DEGRADED, SeatState.READY),
    (SeatState.READY, SeatState.HUNG),        # the watchdog latched a hang
    (SeatState.HUNG, SeatState.READY),        # ... and unlatched after progress
    (SeatState.HUNG, SeatState.FAILED),
    (SeatState.HUNG, SeatState.STOPPING),
    (SeatState.READY, SeatState.FAILED),
    (SeatState.FAILED, SeatState.STOPPING),
    (SeatState.STOPPING, SeatState.STOPPED),
    (SeatState.STOPPING, SeatState.FAILED),
    (SeatState.HUNG, SeatState.REMEDIATING),            # on_hang: restart / rollback-draft, after the bundle
    (SeatState.FAILED, SeatState.REMEDIATING),          # ... an engine that exited is restarted too
    (SeatState.REMEDIATING, SeatState.READY),           # serving again
    (SeatState.REMEDIATING, SeatState.FAILED),          # it could not be brought back
    (SeatState.REMEDIATING, SeatState.HUNG),            # hung again (the next decision refuses: cooldown)
    (SeatState.REMEDIATING, SeatState.STOPPING),        # `down` during a remediation
    (SeatState.HUNG, SeatState.REMEDIATION_EXHAUSTED),  # refused: budget or cooldown
    (SeatState.FAILED, SeatState.REMEDIATION_EXHAUSTED),
    (SeatState.REMEDIATION_EXHAUSTED, SeatState.STOPPING),
])
def test_documented_transitions_are_allowed(old: SeatState, new: SeatState) -> None:
    assert transition(old, new) is new


@pytest.mark.parametrize(("old", "new"), [
    (SeatState.FAILED, SeatState.READY),      # FAILED is sticky until down
    (SeatState.STOPPED, SeatState.PLACING),   # terminal
    (SeatState.PLACING, SeatState.READY),     # no skipping preflight
    (SeatState.READY, SeatState.STARTING),
    (SeatState.STARTING, SeatState.HUNG),     # not hung before it ever served
    (SeatState.REMEDIATION_EXHAUSTED, SeatState.READY),        # sticky until down: an operator's turn
    (SeatState.REMEDIATION_EXHAUSTED, SeatState.REMEDIATING),  # ... never remediated again by itself
    (SeatState.REMEDIATION_EXHAUSTED, SeatState.FAILED),
    (SeatState.READY, SeatState.REMEDIATING),                  # only a latched hang (or a failure) is remediated
    (SeatState.NODE_LOST, SeatState.REMEDIATING),              # a restart cannot reach a lost node's agent
])
def test_other_transitions_are_refused(old: SeatState, new: SeatState) -> None:
    with pytest.raises(SeatStateError, match=f"from {old.value} to {new.value}"):
        transition(old, new)


def test_only_stopped_is_terminal_and_up_means_serving() -> None:
    assert [s for s in SeatState if s.is_terminal()] == [SeatState.STOPPED]
    assert {s for s in SeatState if s.is_up()} == {SeatState.READY, SeatState.DEGRADED, SeatState.HUNG,
                                                   SeatState.NODE_LOST, SeatState.REMEDIATING}
    assert {s for s in SeatState if s.needs_operator()} == {SeatState.FAILED, SeatState.REMEDIATION_EXHAUSTED}


def test_the_new_states_values_are_what_records_carry() -> None:
    assert parse_state("REMEDIATION-EXHAUSTED") is SeatState.REMEDIATION_EXHAUSTED
    assert parse_state("REMEDIATING") is SeatState.REMEDIATING


def test_unknown_state_in_a_record_is_an_error_not_a_new_state() -> None:
    assert parse_state("READY") is SeatState.READY
    with pytest.raises(SeatStateError, match="unknown seat state"):
        parse_state("WARMING")
