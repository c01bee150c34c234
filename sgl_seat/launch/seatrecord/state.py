"""The seat's life cycle as one enum with its allowed transitions.

::

    (none) -> PLACING -> STARTING -> READY <-> DEGRADED      (READY / DEGRADED / HUNG <-> NODE-LOST)
                 |          |          |  ^      |  ^
                 |          |          v  |      v  |
                 |          |          HUNG <-----+-+   (any of READY / DEGRADED / HUNG to any other)
                 +----------+----------+---------+--> FAILED
                 +----------+----------+---------+--> STOPPING -> STOPPED
                                               FAILED --> STOPPING
                                             STOPPING --> FAILED (a process survived `down`)
       HUNG / FAILED --> REMEDIATING --> READY / DEGRADED / HUNG / NODE-LOST / FAILED / STOPPING  (watchdog.on_hang)
       HUNG / FAILED --> REMEDIATION-EXHAUSTED --> STOPPING  (the policy refused: budget spent, or hung again soon)

- PLACING: the placement group is requested and node agents are being created.
- STARTING: preflight passed on every node and engines are starting.
- READY: every engine process on every node is alive and rank 0's ``/health_generate`` answers 200.
  A rank >= 1 HTTP answer is never trusted (SGLang's dummy health server answers 200 regardless).
- DEGRADED: every engine process is alive but rank 0's ``/health_generate`` does not answer 200
  (for example a hung scheduler); it can go back to READY.
- HUNG: every engine process is alive but the watchdog has latched a hang: it captured a bundle (the
  record names it) and has not seen the seat progress since. Health alone cannot tell: rank 0's
  ``/health_generate`` may still answer while a rank is stalled. It goes back to READY when the
  watchdog unlatches (its detectors quiet and progress seen).
- NODE-LOST: a whole node does not answer (its agent's call timed out, or Ray reports its node dead) while
  the engines that can be reached are alive: a link down or a dead host, not a hang and not an engine
  crash. The reason names the node, its address and host, and its ranks. It goes back to READY when the
  node answers again; an engine found dead makes it FAILED.
- FAILED: an engine process or node agent is gone, or the cluster cannot be reached; sticky until
  ``down`` (or until the supervisor remediates it under ``watchdog.on_hang``). The record keeps the reason and
  the log tail.
- REMEDIATING: the seat's supervisor acts on a hang under ``watchdog.on_hang`` (restart, or rollback-draft),
  after the hang's bundle is complete; the latest entry of the record's ``remediations`` says what and since
  when. From HUNG, or from FAILED (an engine that exited is restarted too). It ends READY when the seat serves
  again, FAILED when it cannot be brought back, or in any state the next reconcile finds. ``status`` leaves a
  remediation in progress to the supervisor, which writes the record itself.
- REMEDIATION-EXHAUSTED: a hang the policy would have acted on was refused: the budget
  (``watchdog.remediation.max`` in ``window_s``) is spent, or the seat hung again within ``cooldown_s`` of a
  remediation. Its supervisor stops the engines once the bundle is on disk (no client waits on a hung scheduler) and
  the seat stays down for an operator; like FAILED it is sticky until ``down``.
- STOPPING / STOPPED: ``down`` is tearing down / has verified nothing remains (terminal).

The local record of a seat is a cache of this state; ``status`` reconciles it with Ray.
"""

from __future__ import annotations

from enum import Enum

from sgl_seat.errors import SeatStateError


class SeatState(str, Enum):
    """One seat's state; values are what records and ``status --json`` carry."""

    PLACING = "PLACING"
    STARTING = "STARTING"
    READY = "READY"
    DEGRADED = "DEGRADED"
    HUNG = "HUNG"
    NODE_LOST = "NODE-LOST"
    FAILED = "FAILED"
    REMEDIATING = "REMEDIATING"
    REMEDIATION_EXHAUSTED = "REMEDIATION-EXHAUSTED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"

    def is_terminal(self) -> bool:
        return self is SeatState.STOPPED

    def is_up(self) -> bool:
        """Serving or able to serve (a remediation brings it back by itself): what `up` refuses to start over."""
        return self in (SeatState.READY, SeatState.DEGRADED, SeatState.HUNG, SeatState.NODE_LOST,
                        SeatState.REMEDIATING)

    def needs_operator(self) -> bool:
        """Sticky until `down`: nothing the tool does by itself changes it (``status`` keeps the first reason)."""
        return self in (SeatState.FAILED, SeatState.REMEDIATION_EXHAUSTED)

    def can_become(self, new: SeatState) -> bool:
        return new is self or new in TRANSITIONS[self]


TRANSITIONS: dict[SeatState, frozenset[SeatState]] = {
    SeatState.PLACING: frozenset({SeatState.STARTING, SeatState.FAILED, SeatState.STOPPING}),
    SeatState.STARTING: frozenset({SeatState.READY, SeatState.FAILED, SeatState.STOPPING}),
    SeatState.READY: frozenset({SeatState.DEGRADED, SeatState.HUNG, SeatState.NODE_LOST, SeatState.FAILED,
                                SeatState.STOPPING}),
    SeatState.DEGRADED: frozenset({SeatState.READY, SeatState.HUNG, SeatState.NODE_LOST, SeatState.FAILED,
                                   SeatState.STOPPING}),
    SeatState.HUNG: frozenset({SeatState.READY, SeatState.DEGRADED, SeatState.NODE_LOST, SeatState.FAILED,
                               SeatState.STOPPING, SeatState.REMEDIATING, SeatState.REMEDIATION_EXHAUSTED}),
    SeatState.NODE_LOST: frozenset({SeatState.READY, SeatState.DEGRADED, SeatState.HUNG, SeatState.FAILED,
                                    SeatState.STOPPING}),
    SeatState.FAILED: frozenset({SeatState.STOPPING, SeatState.REMEDIATING, SeatState.REMEDIATION_EXHAUSTED}),
    SeatState.REMEDIATING: frozenset({SeatState.READY, SeatState.DEGRADED, SeatState.HUNG, SeatState.NODE_LOST,
                                      SeatState.FAILED, SeatState.STOPPING}),
    SeatState.REMEDIATION_EXHAUSTED: frozenset({SeatState.STOPPING}),
    SeatState.STOPPING: frozenset({SeatState.STOPPED, SeatState.FAILED}),
    SeatState.STOPPED: frozenset(),
}


def transition(old: SeatState, new: SeatState) -> SeatState:
    """Return ``new`` if ``old -> new`` is allowed, else raise :class:`SeatStateError`."""
    if not old.can_become(new):
        raise SeatStateError(
            f"a seat cannot go from {old.value} to {new.value}",
            fix="run `sgl-seat status` to refresh the record, or `sgl-seat down` to start over",
        )
    return new


def parse_state(raw: str) -> SeatState:
    """A state read from a record; an unknown value is a damaged record, not a new state."""
    try:
        return SeatState(raw)
    except ValueError:
        raise SeatStateError(
            f"unknown seat state {raw!r} in a seat record",
            fix="the record was written by another sgl-seat version; run `sgl-seat down` with that version",
        ) from None
