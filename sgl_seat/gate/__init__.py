"""``sgl-seat gate``: the A/B battery that decides whether the speculative draft ships, with a noise model.

The field report's decision (single-stream up, the shared seat's gates down, neither seat shipped) made by a
battery that has what its own limitations section lacked: repetitions interleaved ABBA, paired log-ratio
intervals, an A/A control arm as the noise floor, cold cells after a restart, counter deltas instead of
cumulative gauges, and the hybrid (``--speculative-adaptive``) arm measured like the others.

Module map:

- ``workloads`` (+ ``workloads.yaml``): the battery and the ship rule as data.
- ``design``: arms, ABBA schedule, a slot's cells.
- ``stats``: paired log-ratio intervals, PASS/FAIL/INCONCLUSIVE, crossover.
- ``client``: the asyncio streaming OpenAI client (tokens from ``usage``).
- ``scrape``: counters and ``/server_info`` from the engine.
- ``arms``: arms brought up and down through ``sgl_seat.launch``, or running seats by URL.
- ``runner``: slots and cells, each cell on disk as it completes, resume.
- ``verdict``: cells -> the versioned report; ``report`` (text) and ``html`` render it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sgl_seat.engines import backend_for
from sgl_seat.errors import ArmStartError, NoVerdictError, SeatError, UsageError
from sgl_seat.gate.arms import Arms, SeatArms, UrlArms
from sgl_seat.gate.design import ARM_NAMES, BASELINE, CANDIDATE, CONTROL, HYBRID
from sgl_seat.gate.runner import BatteryDir, Progress, run_battery, start_battery
from sgl_seat.gate.verdict import EXIT_CODES, build_report, exit_code
from sgl_seat.gate.workloads import load_battery
from sgl_seat.launch.seatrecord.home import seat_home
from sgl_seat.spec import SeatSpec

__all__ = ["EXIT_CODES", "GateOptions", "GateResult", "Progress", "error_document", "exit_code", "parse_arms",
           "parse_urls", "run_gate"]

#: The version of the document ``gate --json`` prints when the battery stops without a verdict.
ERROR_SCHEMA_VERSION = "1.0"


def parse_arms(text: str) -> list[str]:
    """The arms of ``--arms``: the baseline and at least one of candidate, hybrid, control, each once. The verdict
    is the candidate's; without one the hybrid's (``baseline,hybrid,control`` gates a seat's draft policy after
    ``sgl-seat tune draft``); with a control alone the A/A rehearsal's, which learns the noise floor."""
    arms = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARM_NAMES]
    if bad or BASELINE not in arms or not ({CANDIDATE, HYBRID, CONTROL} & set(arms)) or len(set(arms)) != len(arms):
        raise UsageError(f"--arms {text!r}: give baseline with candidate, hybrid or control (or several), each once"
                         + (f" ({', '.join(bad)} unknown)" if bad else ""),
                         fix="e.g. --arms baseline,candidate,hybrid,control; --arms baseline,hybrid,control gates a "
                             "tuned seat's policy; --arms baseline,control is an A/A rehearsal")
    return arms


def parse_urls(items: list[str]) -> dict[str, str]:
    """``--url ARM=URL`` values: arm -> endpoint of a running seat."""
    out: dict[str, str] = {}
    for it in items:
        arm, sep, url = it.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            raise UsageError(f"--url {it!r} is not ARM=URL", fix="e.g. --url baseline=http://10.0.0.1:30000")
        out[arm.strip()] = url.strip()
    return out


def error_document(exc: SeatError) -> dict[str, Any]:
    """What ``gate --json`` prints on stdout when the battery stops without a verdict (``verdict`` null, the exit
    status beside it): the error, its fix, and for an arm that did not start the arm, the node and the reason."""
    err: dict[str, Any] = {"kind": type(exc).__name__, "message": exc.message, "fix": exc.fix}
    if isinstance(exc, ArmStartError):
        err.update(arm=exc.arm, node=exc.node, reason=exc.reason)
    if isinstance(exc, NoVerdictError):
        err["directory"] = exc.directory
    return {"schema_version": ERROR_SCHEMA_VERSION, "verdict": None, "exit_code": exc.exit_code, "error": err}


@dataclass(kw_only=True, slots=True)
class GateOptions:
    spec: SeatSpec | None = None  # arms brought up from this seat spec
    urls: Mapping[str, str] = field(default_factory=dict)  # or: arm -> endpoint of a running seat
    arms: list[str] = field(default_factory=lambda: [BASELINE, CANDIDATE])
    runs: int | None = None
    quick: bool = False
    seed: int | None = None
    out: Path | None = None
    resume: Path | None = None
    watchdog: bool = True
    workloads: Path | None = None
    request_timeout: float = 300.0
    note: str | None = None  # the operator's words about what is measured, carried into the report


@dataclass(frozen=True, slots=True)
class GateResult:
    directory: Path
    report: dict[str, Any]


def _arms_impl(opts: GateOptions, say: Callable[[str], None]) -> Arms:
    if opts.urls:
        return UrlArms(opts.urls)
    if opts.spec is None:
        raise UsageError("gate needs a seat spec or the URLs of running seats", fix="pass --seat or --url ARM=URL")
    return SeatArms(opts.spec, watchdog=opts.watchdog, say=say)


def _refuse_a_sampled_sweep_the_engine_corrupts(opts: GateOptions, temperature: float) -> None:
    """A sampled sweep with a draft arm on a seat whose engine is known to corrupt sampled answers while it drafts
    (its backend says so): the verdict would be on broken text, so none is given."""
    drafted = [a for a in opts.arms if a in (CANDIDATE, HYBRID)]
    if opts.spec is None or temperature <= 0 or not drafted:
        return
    why = backend_for(opts.spec.engine).sampled_draft_problem(opts.spec)
    if why:
        raise UsageError(f"the sweep samples (temperature {temperature:g}) and arm {drafted[0]} drafts on seat "
                         f"{opts.spec.name!r}: {why}; a verdict on that text would not be the draft's",
                         fix="gate this engine on a greedy sweep (temperature 0, the default), or gate "
                             "baseline,control alone")


def run_gate(opts: GateOptions, *, progress: Callable[[Progress], None] = lambda _p: None,
             say: Callable[[str], None] = lambda _s: None) -> GateResult:
    """Run (or resume) a battery, then build its report (also written as ``report.json`` in the directory)."""
    if opts.resume is not None:
        bd = BatteryDir(opts.resume)
        plan = bd.read_plan()
        opts.arms = list(plan["arms"])
        say(f"resuming the battery in {bd.root}")
    else:
        battery = load_battery(quick=opts.quick, path=opts.workloads).with_runs(opts.runs, opts.seed)
        _refuse_a_sampled_sweep_the_engine_corrupts(opts, battery.sweep.temperature)
        name = opts.spec.name if opts.spec is not None else "urls"
        root = opts.out or seat_home() / "gate" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        arms_from: dict[str, Any] = ({"kind": "urls", "urls": dict(opts.urls)} if opts.urls else
                                     {"kind": "seat", "seat": name, "source": opts.spec.source if opts.spec else None})
        bd = start_battery(root, battery, opts.arms, arms_from, note=opts.note)
        say(f"battery directory: {bd.root}")
    try:
        run_battery(bd, _arms_impl(opts, say), progress=progress, request_timeout=opts.request_timeout)
    except SeatError as exc:
        # A failure's own exit status may be a verdict's (an EngineError's is DO_NOT_SHIP's 1): a battery that
        # stopped is NoVerdictError's 4, whatever stopped it; a usage error keeps its 2.
        if not isinstance(exc, NoVerdictError) and exc.exit_code not in EXIT_CODES.values():
            raise
        err = exc if isinstance(exc, NoVerdictError) else NoVerdictError(
            f"the battery stopped without a verdict: {exc.message}", fix=exc.fix)
        err.directory = str(bd.root)
        err.fix = (f"{err.fix}; then " if err.fix else "") + f"`sgl-seat gate --resume {bd.root}` runs what is missing"
        if err is exc:
            raise
        raise err from exc
    report = build_report(bd)
    bd.write_json(bd.root / "report.json", report)
    return GateResult(bd.root, report)
