"""What to do after a hang's bundle: the seat's ``watchdog.on_hang`` policy, decided as a pure function.

The supervisor (``sgl_seat.launch.actors.supervisor``) receives the sidecars' verdicts, waits until the bundle is
complete on disk and then asks :func:`decide`. Nothing here touches Ray, processes, files or the clock: the verdict, the
policy, the seat's remediation history and ``now`` are arguments, so every branch is a unit test and the operator
reads the same reason in ``status`` that the decision was made on.

The decision, in order (the first that applies):

1. ``on_hang: capture``: :attr:`Action.NONE`, the bundle only (today's behaviour, the default).
2. A whole node unreachable (``node-unreachable``): :attr:`Action.NONE`. A restart drives the node agents, and
   that node's agent does not answer; bringing a node back is an operator's work (``runbooks/node-unreachable.md``).
3. A remediation still in progress (its outcome ``pending``, begun less than :data:`PENDING_STALE_S` ago):
   :attr:`Action.NONE`; the verdict is the remediation's own business (stopping engines makes verdicts). One
   pending for longer was left so by a supervisor that died: it counts as begun and never served.
4. Refused before (any earlier refusal in the history): refused again. "Not again without an operator" holds
   until an operator acts, and the history is the seat record's: ``down`` then ``up`` starts a new one.
5. The budget: ``remediation.max`` remediations (restart or rollback-draft, begun) in the sliding window of
   ``remediation.window_s`` seconds up to ``now`` exhaust it: :attr:`Action.REFUSED_BUDGET`.
6. The cooldown: a hang (the verdict's ``t``) within ``remediation.cooldown_s`` of the last remediation (from
   when the seat served again; from when it began if it never did) was not healed by it:
   :attr:`Action.REFUSED_COOLDOWN`.
7. ``restart``: :attr:`Action.RESTART`. ``rollback-draft``: :attr:`Action.ROLLBACK_DRAFT` when the seat runs
   with the draft on and the verdict is one the draft makes likely (:func:`draft_likely`), else restart.

A refusal leaves the seat to an operator: the supervisor puts it in ``REMEDIATION-EXHAUSTED``
(:meth:`Decision.exhausted`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from sgl_seat.core.records import RecordError, Verdict, VerdictKind
from sgl_seat.errors import UsageError
from sgl_seat.spec import ON_HANG_POLICIES, SeatSpec, WatchdogSpec

__all__ = [
    "PENDING_STALE_S",
    "REMEDIATION_SCHEMA_VERSION",
    "Action",
    "Decision",
    "DraftShape",
    "Outcome",
    "Policy",
    "RemediationRecord",
    "budget_used",
    "decide",
    "draft_likely",
    "frame_in_verify",
    "parse_on_hang",
    "verdict_gather_size",
    "verdict_summary",
]

#: Version of :class:`RemediationRecord`'s JSON (seat records and ``status --json`` carry it). Readers refuse
#: another one. 1: first version.
REMEDIATION_SCHEMA_VERSION = 1
#: Seconds a remediation may stay pending before it is taken for abandoned (its supervisor died): twice `up`'s
#: default timeout, since a remediation stops the engines and brings them up again. ``status`` uses it too.
PENDING_STALE_S = 1200.0


class Action(str, Enum):
    """What a decision says to do; the values are what records, ``status --json`` and the exporter carry."""

    NONE = "none"
    RESTART = "restart"
    ROLLBACK_DRAFT = "rollback-draft"
    REFUSED_BUDGET = "refused-budget"
    REFUSED_COOLDOWN = "refused-cooldown"

    def remediates(self) -> bool:
        """Whether the seat's engines are stopped and brought back (what the budget counts)."""
        return self in (Action.RESTART, Action.ROLLBACK_DRAFT)

    def refused(self) -> bool:
        """A refusal: the policy wanted to act but may not; the seat waits for an operator."""
        return self in (Action.REFUSED_BUDGET, Action.REFUSED_COOLDOWN)


class Outcome(str, Enum):
    """How a remediation ended, as far as is known."""

    #: Begun, not serving again yet.
    PENDING = "pending"
    #: Serving again: rank 0's health route good and a request completed (``serving_again`` says when).
    SERVING = "serving"
    #: Ended without the seat serving (the record's ``error`` says why).
    FAILED = "failed"
    #: Nothing was done: a decision of none, or a refusal.
    NOT_ACTED = "not-acted"


def parse_on_hang(value: str) -> str:
    """``--on-hang``'s value, checked: one of :data:`~sgl_seat.spec.ON_HANG_POLICIES`."""
    if value not in ON_HANG_POLICIES:
        raise UsageError(f"--on-hang {value!r} is not a policy", fix=f"use one of {', '.join(ON_HANG_POLICIES)}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """The effective policy of one seat: ``watchdog.on_hang`` (or ``up --on-hang``) and its budget.

    ``up`` writes it into the seat record (:meth:`to_json`), so the supervisor acts on what the seat was brought
    up with even if the spec file changes afterwards.
    """

    on_hang: str = "capture"
    max: int = 3
    window_s: float = 3600.0
    cooldown_s: float = 300.0
    #: The largest gather a draft-on decode/verify step makes; None: :meth:`DraftShape.verify_gather_max`.
    draft_gather_max: int | None = None

    @classmethod
    def of(cls, wd: WatchdogSpec, on_hang: str | None = None) -> Policy:
        """The spec's policy, with ``on_hang`` (``up --on-hang``) in place of the spec's when given."""
        r = wd.remediation
        return cls(on_hang=parse_on_hang(on_hang) if on_hang is not None else wd.on_hang, max=r.max,
                   window_s=float(r.window_s), cooldown_s=float(r.cooldown_s), draft_gather_max=r.draft_gather_max)

    def to_json(self) -> dict[str, Any]:
        return {"on_hang": self.on_hang, "max": self.max, "window_s": self.window_s, "cooldown_s": self.cooldown_s,
                "draft_gather_max": self.draft_gather_max}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Policy:
        """Back from :meth:`to_json`, checked as the spec checks it (a hand-edited record gets a clear error)."""
        try:
            wd = WatchdogSpec.model_validate({
                "on_hang": d.get("on_hang", "capture"),
                "remediation": {k: d[k] for k in ("max", "window_s", "cooldown_s", "draft_gather_max") if k in d},
            })
        except ValueError as exc:
            raise RecordError(f"remediation policy: {exc}") from None
        return cls.of(wd)


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftShape:
    """The draft as the seat runs it now: on or off, and the shape that bounds a verify step's gather."""

    enabled: bool
    slots: int
    draft_tokens: int

    @classmethod
    def of(cls, spec: SeatSpec, *, enabled: bool) -> DraftShape:
        """From the spec's ``draft`` block; ``enabled`` is the seat's (the record's ``draft``: `up --draft`)."""
        return cls(enabled=enabled, slots=spec.draft.slots, draft_tokens=spec.draft.draft_tokens)

    def verify_gather_max(self, policy: Policy) -> int:
        """The largest gather a draft-on decode/verify step makes: the policy's ``draft_gather_max``, else
        ``slots x draft_tokens`` (every running request verifies ``draft_tokens`` positions per step, one id each)."""
        if policy.draft_gather_max is not None:
            return policy.draft_gather_max
        return self.slots * self.draft_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What :func:`decide` concluded, with the sentence an operator reads in ``status``."""

    action: Action
    reason: str
    #: Whether the verdict is one the draft makes likely (:func:`draft_likely`); False where not asked.
    draft_likely: bool = False

    @property
    def exhausted(self) -> bool:
        """The seat is left to an operator (``REMEDIATION-EXHAUSTED``)."""
        return self.action.refused()


@dataclass(frozen=True, slots=True, kw_only=True)
class RemediationRecord:
    """One decision acted on (or refused), as the seat record and ``status --json`` keep it.

    Times are epoch seconds. ``engines_stopped`` and ``serving_again`` stay None until they happen; the supervisor
    replaces the record as it goes (:meth:`stopped`, :meth:`served`, :meth:`failed`).
    """

    action: Action
    reason: str
    #: One line: the verdict's kind, rank, node and frame (:func:`verdict_summary`).
    verdict: str
    bundle_id: str | None
    started: float
    outcome: Outcome
    engines_stopped: float | None = None
    serving_again: float | None = None
    #: Why the remediation failed (outcome ``failed``), else None.
    error: str | None = None
    #: The draft before and after: a rollback turns it off.
    draft_before: bool | None = None
    draft_after: bool | None = None
    schema_version: int = REMEDIATION_SCHEMA_VERSION

    @classmethod
    def begin(cls, decision: Decision, verdict: Verdict, bundle_id: str | None, started: float, *,
              draft_before: bool | None = None) -> RemediationRecord:
        """The record of ``decision`` as it starts: pending if it acts, not-acted if it does not."""
        acts = decision.action.remediates()
        after = (False if decision.action is Action.ROLLBACK_DRAFT else draft_before) if acts else draft_before
        return cls(action=decision.action, reason=decision.reason, verdict=verdict_summary(verdict),
                   bundle_id=bundle_id, started=started, outcome=Outcome.PENDING if acts else Outcome.NOT_ACTED,
                   draft_before=draft_before, draft_after=after)

    def stopped(self, t: float) -> RemediationRecord:
        return replace(self, engines_stopped=t)

    def served(self, t: float) -> RemediationRecord:
        return replace(self, serving_again=t, outcome=Outcome.SERVING, error=None)

    def failed(self, error: str) -> RemediationRecord:
        return replace(self, outcome=Outcome.FAILED, error=error)

    def hang_to_serving_s(self) -> float | None:
        """Seconds from the start of the remediation to serving again (None until it serves)."""
        return None if self.serving_again is None else self.serving_again - self.started

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "action": self.action.value, "reason": self.reason,
                "verdict": self.verdict, "bundle_id": self.bundle_id, "started": self.started,
                "engines_stopped": self.engines_stopped, "serving_again": self.serving_again,
                "outcome": self.outcome.value, "error": self.error, "draft_before": self.draft_before,
                "draft_after": self.draft_after}

    def bundle_json(self) -> dict[str, Any]:
        """The bundle's ``remediation`` entry (issue 26: ``{action, started, serving_again}``)."""
        return {"action": self.action.value, "started": self.started, "serving_again": self.serving_again}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RemediationRecord:
        """Strict: a record of another schema version, or of the wrong shape, is a :class:`RecordError`."""
        if not isinstance(d, Mapping):
            raise RecordError(f"a remediation must be an object, got {type(d).__name__}")
        version = d.get("schema_version")
        if version != REMEDIATION_SCHEMA_VERSION:
            raise RecordError(f"remediation schema_version {version!r} is not {REMEDIATION_SCHEMA_VERSION}")
        try:
            action, outcome = Action(d["action"]), Outcome(d["outcome"])
        except (KeyError, ValueError, TypeError) as exc:
            raise RecordError(f"remediation: bad action or outcome ({exc})") from None
        return cls(action=action, outcome=outcome, reason=_str(d, "reason"), verdict=_str(d, "verdict"),
                   bundle_id=_opt(d, "bundle_id", str), started=_num(d, "started"),
                   engines_stopped=_opt_num(d, "engines_stopped"), serving_again=_opt_num(d, "serving_again"),
                   error=_opt(d, "error", str), draft_before=_opt(d, "draft_before", bool),
                   draft_after=_opt(d, "draft_after", bool))


def _str(d: Mapping[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str):
        raise RecordError(f"remediation field {key!r}: expected a string, got {type(v).__name__}")
    return v


def _num(d: Mapping[str, Any], key: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RecordError(f"remediation field {key!r}: expected a number, got {type(v).__name__}")
    return float(v)


def _opt_num(d: Mapping[str, Any], key: str) -> float | None:
    return None if d.get(key) is None else _num(d, key)


def _opt(d: Mapping[str, Any], key: str, typ: type) -> Any:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, typ) or (typ is not bool and isinstance(v, bool)):
        raise RecordError(f"remediation field {key!r}: expected {typ.__name__}, got {type(v).__name__}")
    return v


def verdict_summary(v: Verdict) -> str:
    """One line for a record: ``row-fetch stall rank 3 node 1 fetch_rows (rowfetch.py:40)``."""
    parts = [v.kind.value]
    if v.rank is not None:
        parts.append(f"rank {v.rank}")
    if v.node is not None:
        parts.append(f"node {v.node}")
    if v.frame:
        parts.append(v.frame)
    return " ".join(parts)


#: How :func:`sgl_seat.core.detect.detect_rowfetch_stall` writes the stalled call's size in its first evidence line
#: ("... (pid P, thread T, gather size G); threshold ..."); a unit test holds the two together.
_GATHER = re.compile(r"\bgather size (-?\d+)\)")


def verdict_gather_size(v: Verdict) -> int | None:
    """The stalled call's gather size that a row-fetch stall verdict carries, or None (another kind, or unknown:
    the probe records -1 for a target without a measured argument)."""
    if v.kind is not VerdictKind.ROWFETCH_STALL or not v.evidence:
        return None
    m = _GATHER.search(v.evidence[0])
    if m is None:
        return None
    size = int(m.group(1))
    return size if size >= 0 else None


#: A function name that is a verify step: the token ``verify`` in it (SGLang 0.5.23's ``EAGLEWorkerV2.verify``,
#: ``run_eagle_verify`` in ``speculative/eagle_worker_common.py``, ``_build_trivial_verify_input``).
_VERIFY = re.compile(r"(?:^|_)verify(?:_|$)", re.IGNORECASE)


def frame_in_verify(frame: str | None) -> bool:
    """Whether a verdict's frame (``Frame.label``: ``Class.func (file.py:line)``) is in a verify function."""
    if not frame:
        return False
    func = frame.split(" (", 1)[0].rsplit(".", 1)[-1]
    return bool(_VERIFY.search(func))


#: Kinds whose frame is where the seat stalls (a verify frame there is a stall in verify). A process that exited
#: or was stopped, or a node that does not answer, did not stall in its frame.
_STALL_KINDS = frozenset({VerdictKind.ROWFETCH_STALL, VerdictKind.STACK_UNCHANGED, VerdictKind.ENGINE_WATCHDOG,
                          VerdictKind.NO_PROGRESS})


def draft_likely(v: Verdict, draft: DraftShape, policy: Policy) -> tuple[bool, str]:
    """Whether the verdict is one the draft makes likely, and why, from what the verdict carries.

    Why these two cases: the field report's draft-on hangs were host-side row-fetch stalls that "the draft's
    variable gather sizes provoke", and the draft runs its target in verify forwards. A verdict carries its kind,
    its rank and node, one frame and evidence lines, and no forward mode. So:

    - **A row-fetch stall at the draft's gathers**: the stalled call's gather size is in the verdict's first
      evidence line (:func:`verdict_gather_size`). With the draft on, every decode step is a verify of
      ``draft_tokens`` positions per running request, so a gather up to :meth:`DraftShape.verify_gather_max` is one
      the draft shapes (the larger, the more the draft multiplied it), while a larger one can only be a prefill,
      which the draft does not change (``runbooks/watchdog-fired.md``, step 6). A stall whose size is unknown
      cannot be told apart and is not rolled back on.
    - **A stall in verify**: a stalling verdict whose frame is a verify function (:func:`frame_in_verify`). The
      frame is the probed call's or the innermost engine frame, so a stall deep inside a kernel that verify
      launched is named by that kernel's frame, not verify's: it is not seen as one here and falls back to
      restart. Decode and verify that replay CUDA graphs run no Python per step, so the probe does not see their
      gathers at all (``watchdog/probe-targets.yaml``).

    A process that exited or was stopped, or a node that does not answer, is not the draft's doing by anything the
    verdict says.
    """
    if v.kind not in _STALL_KINDS:
        return False, f"a {v.kind.value} verdict is not one the draft makes likely"
    if v.kind is VerdictKind.ROWFETCH_STALL:
        size = verdict_gather_size(v)
        bound = draft.verify_gather_max(policy)
        if size is not None and size <= bound:
            return True, (f"row-fetch stall at gather size {size}, within what a draft-on decode/verify step "
                          f"gathers (<= {bound})")
        if frame_in_verify(v.frame):
            return True, f"row-fetch stall in verify ({v.frame})"
        if size is None:
            return False, ("the row-fetch stall's gather size is unknown: a verify's gather cannot be told from a "
                           "prefill's")
        return False, (f"row-fetch stall at gather size {size}, larger than any draft-on decode/verify step "
                       f"gathers ({bound}): a prefill, which the draft does not change")
    if frame_in_verify(v.frame):
        return True, f"{v.kind.value} in verify ({v.frame})"
    return False, f"{v.kind.value} at {v.frame or 'an unknown frame'}, not in verify"


def budget_used(policy: Policy, history: Sequence[RemediationRecord], now: float) -> int:
    """Remediations (restart or rollback-draft, begun) in the window ``(now - window_s, now]``."""
    return sum(1 for r in history if r.action.remediates() and now - policy.window_s < r.started <= now)


def _fmt_s(x: float) -> str:
    return f"{x:.0f} s" if abs(x) >= 10 else f"{x:.1f} s"


def decide(verdict: Verdict, policy: Policy, history: Sequence[RemediationRecord], now: float, *,
           draft: DraftShape) -> Decision:
    """What to do about ``verdict`` under ``policy``, given the seat's ``history`` (oldest first) and ``now``.

    Call it once the verdict's bundle is complete on disk. See the module's docstring for the order of the rules.
    """
    if policy.on_hang == "capture":
        return Decision(action=Action.NONE, reason="on_hang: capture (the bundle only; the seat is left as it is)")
    if verdict.kind is VerdictKind.NODE_ISOLATED:
        return Decision(action=Action.NONE, reason=f"node {verdict.node} is cut off by its own link or route: a "
                        "restart cannot reach it; restore its link first (runbooks/node-unreachable.md)")
    if verdict.kind is VerdictKind.NODE_UNREACHABLE:
        return Decision(action=Action.NONE, reason=f"node {verdict.node} does not answer: a restart cannot reach "
                        "its agent; bring the node back first (runbooks/node-unreachable.md)")
    acted = sorted((r for r in history if r.action.remediates()), key=lambda r: r.started)
    last = acted[-1] if acted else None
    if last is not None and last.outcome is Outcome.PENDING and now - last.started < PENDING_STALE_S:
        return Decision(action=Action.NONE, reason=f"a {last.action.value} begun {_fmt_s(now - last.started)} ago "
                        "is still in progress; this verdict is left to it")
    refusals = [r for r in history if r.action.refused()]
    if refusals:
        first = refusals[0]
        return Decision(action=first.action, reason=f"refused already {_fmt_s(now - first.started)} ago "
                        f"({first.reason}); not remediated again without an operator")
    used = budget_used(policy, history, now)
    since = None if last is None else (last.serving_again if last.serving_again is not None else last.started)
    if since is not None and last is not None and verdict.t < since:
        return Decision(action=Action.NONE, reason=f"the verdict (at {verdict.t:.1f}) predates the end of the last "
                        f"{last.action.value} (at {since:.1f}): a hang it already answered")
    cooled = since is None or policy.cooldown_s <= 0 or verdict.t - since >= policy.cooldown_s
    if used >= policy.max:
        oldest = min(r.started for r in acted if now - policy.window_s < r.started <= now)
        reason = (f"budget exhausted: {used} remediations in the last {_fmt_s(policy.window_s)} (max {policy.max}); "
                  f"the oldest of them frees in {_fmt_s(oldest + policy.window_s - now)}")
        if not cooled and since is not None:
            reason += f"; hung again {_fmt_s(verdict.t - since)} after the last one"
        return Decision(action=Action.REFUSED_BUDGET, reason=reason + "; the seat waits for an operator")
    if not cooled and since is not None and last is not None:
        what = "served again" if last.serving_again is not None else "began"
        return Decision(action=Action.REFUSED_COOLDOWN, reason=(
            f"hung again {_fmt_s(verdict.t - since)} after the last {last.action.value} {what} (cooldown "
            f"{_fmt_s(policy.cooldown_s)}): it did not heal the seat; the seat waits for an operator"))
    count = f"remediation {used + 1} of {policy.max} in {_fmt_s(policy.window_s)}"
    if policy.on_hang == "restart":
        return Decision(action=Action.RESTART, reason=f"on_hang: restart after a {verdict.kind.value} ({count})")
    likely, why = draft_likely(verdict, draft, policy)
    if likely and draft.enabled:
        return Decision(action=Action.ROLLBACK_DRAFT, draft_likely=True,
                        reason=f"on_hang: rollback-draft: {why}: the seat comes back with the draft off ({count})")
    fallback = "the seat runs with the draft off already" if likely else why
    return Decision(action=Action.RESTART, draft_likely=likely,
                    reason=f"on_hang: rollback-draft falls back to restart: {fallback} ({count})")
