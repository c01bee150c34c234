"""Fault specs for the sim engine: ``KIND:key=value,...`` text, parsed once and fired by a pure state machine.

The same text arrives from three places: ``sgl-seat up --fault`` (the CLI calls :func:`parse_fault` to refuse
a bad spec before anything starts), the seat spec's ``sim.faults`` and ``SGLSEAT_SIM_FAULTS`` (``;``-joined,
parsed at launch), and the loopback admin route at run time. Kinds:

- ``rowfetch-stall``: the rank's host row fetch stops returning (it waits inside ``rowfetch.fetch_rows``)
  for ``for_s`` seconds, or until the process dies.
- ``gpu-stall`` (``--device cuda`` only): the rank's row fetch stalls *on its GPU stream* (a spin kernel
  inside ``rowfetch.fetch_rows`` stands in for a UVA read of the host table that does not return) for
  ``for_s`` seconds, or about an hour; its CPU thread runs on into the collective like its peers'.
- ``crash``: the rank dies abruptly (SIGKILL to itself, as a segfault or an NCCL abort would look).
- ``error``: the rank raises inside its forward, as a CUDA error or a failed assertion would: the scheduler
  logs SGLang's "Scheduler hit an exception: ..." and SIGQUITs its node (the peers then fail their collective
  with "Connection closed by peer", the path a real in-rank error takes).
- ``slow``: the rank adds ``ms`` milliseconds to every step, or stretches every step ``factor`` times (a rank
  5x slower but alive: ``factor=5``), for ``for_s`` seconds or for good.
- ``slow-stall``: the rank's host row fetches each take ``ms`` milliseconds longer for ``slow_s`` seconds
  (a fetch tail growing before the hang, as the field report saw), then its row fetch stalls as
  ``rowfetch-stall`` does (for ``for_s`` seconds, or until the process dies).

Triggers (all optional; every one given must hold): ``after_steps`` (the rank's forward count),
``after_s`` (seconds since the fault was armed: engine start for launch faults, injection for admin ones),
``gather_ge`` (the step's row-gather size is at least N). With none, the fault fires on the next step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sgl_seat.errors import UsageError

STALL = "rowfetch-stall"
GPU_STALL = "gpu-stall"
CRASH = "crash"
SLOW = "slow"
ERROR = "error"
SLOW_STALL = "slow-stall"
KINDS: tuple[str, ...] = (STALL, GPU_STALL, CRASH, ERROR, SLOW, SLOW_STALL)

_TRIGGERS = ("after_steps", "after_s", "gather_ge")
_KEYS: dict[str, tuple[str, ...]] = {
    STALL: ("rank", *_TRIGGERS, "for_s"),
    GPU_STALL: ("rank", *_TRIGGERS, "for_s"),
    CRASH: ("rank", *_TRIGGERS),
    ERROR: ("rank", *_TRIGGERS),
    SLOW: ("rank", "ms", "factor", *_TRIGGERS, "for_s"),
    SLOW_STALL: ("rank", "ms", "slow_s", *_TRIGGERS, "for_s"),
}
_INT_KEYS = frozenset({"rank", "after_steps", "gather_ge"})
_EXAMPLE = "rowfetch-stall:rank=3,after_steps=200"


@dataclass(frozen=True, slots=True)
class Fault:
    """One parsed fault. ``spec()`` gives back canonical text that parses to an equal value."""

    kind: str
    rank: int
    after_steps: int | None = None
    after_s: float | None = None
    gather_ge: int | None = None
    for_s: float | None = None
    ms: float | None = None
    factor: float | None = None
    slow_s: float | None = None

    def spec(self) -> str:
        parts = [f"rank={self.rank}"]
        for key in ("ms", "factor", "slow_s", *_TRIGGERS, "for_s"):
            val = getattr(self, key)
            if val is not None:
                parts.append(f"{key}={format(val, 'g') if isinstance(val, float) else val}")
        return f"{self.kind}:{','.join(parts)}"

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "rank": self.rank, "spec": self.spec()}


def _bad(text: str, why: str, fix: str) -> UsageError:
    return UsageError(f"fault {text!r}: {why}", fix=fix)


def parse_fault(text: str) -> Fault:
    """Parse ``KIND:key=value,...``; raise :class:`UsageError` naming what is wrong and how to write it."""
    raw = text.strip()
    if not raw:
        raise _bad(text, "is empty", f"write KIND:key=value,... e.g. {_EXAMPLE}")
    kind, sep, rest = raw.partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise _bad(text, f"unknown kind {kind!r}", f"use one of {', '.join(KINDS)} (e.g. {_EXAMPLE})")
    if not sep or not rest.strip():
        raise _bad(text, "has no key=value settings (rank is required)", f"e.g. {kind}:rank=0")
    allowed = _KEYS[kind]
    values: dict[str, int | float] = {}
    for item in rest.split(","):
        key, eq, val = (s.strip() for s in item.partition("="))
        if not eq or not key or not val:
            raise _bad(text, f"{item.strip()!r} is not key=value", f"e.g. {kind}:rank=0")
        if key not in allowed:
            raise _bad(text, f"{kind} takes no key {key!r}", f"use only {', '.join(allowed)}")
        if key in values:
            raise _bad(text, f"key {key!r} is given twice", "give each key once")
        values[key] = _number(text, key, val)
    if "rank" not in values:
        raise _bad(text, "rank is required", f"add rank=N, e.g. {kind}:rank=0")
    if kind == SLOW and "ms" not in values and "factor" not in values:
        raise _bad(text, "slow needs ms (milliseconds added to each step) or factor (steps stretched that many "
                   "times)", "e.g. slow:rank=1,ms=50 or slow:rank=1,factor=5")
    if kind == SLOW_STALL and ("ms" not in values or "slow_s" not in values):
        raise _bad(text, "slow-stall needs ms (added to each row fetch) and slow_s (seconds before the stall)",
                   "e.g. slow-stall:rank=1,ms=200,slow_s=5")
    if kind in (SLOW, SLOW_STALL) and "ms" in values and values["ms"] <= 0:
        raise _bad(text, "ms must be above 0", f"e.g. {kind}:rank=1,ms=50")
    if "factor" in values and values["factor"] < 1:
        raise _bad(text, "factor must be at least 1 (a step cannot run faster than the cost model)",
                   "e.g. slow:rank=1,factor=5")
    return Fault(
        kind=kind,
        rank=int(values["rank"]),
        after_steps=_opt_int(values.get("after_steps")),
        after_s=_opt_float(values.get("after_s")),
        gather_ge=_opt_int(values.get("gather_ge")),
        for_s=_opt_float(values.get("for_s")),
        ms=_opt_float(values.get("ms")),
        factor=_opt_float(values.get("factor")),
        slow_s=_opt_float(values.get("slow_s")),
    )


def parse_faults(text: str) -> tuple[Fault, ...]:
    """``;``-separated specs (the form ``SGLSEAT_SIM_FAULTS`` carries); blanks are ignored."""
    return tuple(parse_fault(part) for part in text.split(";") if part.strip())


def _number(text: str, key: str, val: str) -> int | float:
    try:
        num: int | float = int(val) if key in _INT_KEYS else float(val)
    except ValueError:
        want = "a whole number" if key in _INT_KEYS else "a number"
        raise _bad(text, f"{key}={val!r} is not {want}", f"e.g. {key}=3") from None
    if isinstance(num, float) and not math.isfinite(num):
        raise _bad(text, f"{key}={val!r} is not finite", f"e.g. {key}=3")
    if num < 0:
        raise _bad(text, f"{key}={val} is negative", f"use {key}=0 or more")
    return num


def _opt_int(v: int | float | None) -> int | None:
    return None if v is None else int(v)


def _opt_float(v: int | float | None) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True, slots=True)
class StepFaults:
    """What one rank must do this step."""

    crash: Fault | None = None
    stall: Fault | None = None
    stall_s: float | None = None  # None with ``stall`` set: until the process dies
    extra_ms: float = 0.0
    error: Fault | None = None
    gpu_stall: Fault | None = None
    gpu_stall_s: float | None = None  # None with ``gpu_stall`` set: about an hour (until the process dies)
    slow_factor: float = 1.0  # the step's modelled time is stretched this many times
    fetch_delay_ms: float = 0.0  # added inside the row fetch (``slow-stall`` before it stalls)


@dataclass(slots=True)
class _Armed:
    fault: Fault
    armed_at: float
    fired_at: float | None = None
    stalled_at: float | None = None  # slow-stall: when its slow phase ended in the stall


@dataclass(slots=True)
class FaultState:
    """The faults aimed at one rank and when each fires. Pure: the caller passes the clock."""

    rank: int
    _armed: list[_Armed] = field(default_factory=list)

    def arm(self, fault: Fault, now: float) -> bool:
        """Arm ``fault`` if it is aimed at this rank; return whether it was."""
        if fault.rank != self.rank:
            return False
        self._armed.append(_Armed(fault, now))
        return True

    def clear(self) -> None:
        self._armed.clear()

    def armed(self) -> list[Fault]:
        return [a.fault for a in self._armed]

    def on_step(self, *, step: int, gather: int, now: float) -> StepFaults:
        """Evaluate every armed fault for the step about to run."""
        crash: Fault | None = None
        error: Fault | None = None
        stall: Fault | None = None
        stall_s: float | None = None
        gpu_stall: Fault | None = None
        gpu_stall_s: float | None = None
        extra = 0.0
        factor = 1.0
        fetch_delay = 0.0
        for a in self._armed:
            f = a.fault
            if f.kind == SLOW_STALL and a.fired_at is not None and a.stalled_at is None:
                if now - a.fired_at < (f.slow_s or 0.0):
                    fetch_delay += f.ms or 0.0
                else:
                    a.stalled_at = now
                    stall, stall_s = f, f.for_s
                continue
            if a.fired_at is None:
                if not _due(f, a.armed_at, step=step, gather=gather, now=now):
                    continue
                a.fired_at = now
                if f.kind == CRASH:
                    crash = f
                elif f.kind == ERROR:
                    error = f
                elif f.kind == STALL:
                    stall, stall_s = f, f.for_s
                    continue
                elif f.kind == GPU_STALL:
                    gpu_stall, gpu_stall_s = f, f.for_s
                    continue
                elif f.kind == SLOW_STALL:
                    fetch_delay += f.ms or 0.0
                    continue
            if f.kind == SLOW and (f.for_s is None or now - a.fired_at < f.for_s):
                extra += f.ms or 0.0
                factor *= f.factor or 1.0
        return StepFaults(crash=crash, stall=stall, stall_s=stall_s, extra_ms=extra, error=error,
                          gpu_stall=gpu_stall, gpu_stall_s=gpu_stall_s, slow_factor=factor,
                          fetch_delay_ms=fetch_delay)


def _due(f: Fault, armed_at: float, *, step: int, gather: int, now: float) -> bool:
    if f.after_steps is not None and step < f.after_steps:
        return False
    if f.after_s is not None and now - armed_at < f.after_s:
        return False
    return not (f.gather_ge is not None and gather < f.gather_ge)
