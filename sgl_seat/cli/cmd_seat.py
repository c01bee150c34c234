"""`up`, `down`, `status`, `logs`, `demo`: the seat's life cycle (logic in ``sgl_seat.launch``)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import typer
from rich.console import Console
from rich.status import Status
from rich.text import Text

from sgl_seat.cli.cmd_plan import DraftOpt, MemOpt, SlotsOpt, draft_flag
from sgl_seat.cli.common import console, err_console, print_json, styled
from sgl_seat.launch.stages import FAILED, OK, WARN, StageTimes

if TYPE_CHECKING:
    from sgl_seat.launch.record import SeatRecord

# The library modules (Ray, the forensics, the plan) are imported inside each command: a command pays only
# for what it uses, so `sgl-seat --help` and `sgl-seat plan` do not import Ray and the watchdog.

DEFAULT_PROFILE = "local-sim"
LOCAL_SEAT_FILE = "seat.yaml"

SeatOrDefault = Annotated[
    str | None,
    typer.Option("--seat", "-s", help="Seat spec: a .yaml path or a built-in profile (default: ./seat.yaml, "
                                      "else the built-in local-sim)."),
]
NameArg = Annotated[str | None, typer.Argument(help="Seat name (default: the only recorded seat).")]


def choose_seat(seat: str | None) -> tuple[str, str | None]:
    """``--seat``, else ./seat.yaml, else the built-in local-sim (with a note saying so)."""
    if seat:
        return seat, None
    if Path(LOCAL_SEAT_FILE).is_file():
        return LOCAL_SEAT_FILE, f"no --seat: using ./{LOCAL_SEAT_FILE}"
    return DEFAULT_PROFILE, f"no --seat and no ./{LOCAL_SEAT_FILE}: using the built-in {DEFAULT_PROFILE} profile"


class ConsoleReporter:
    """Prints each stage with its elapsed time and outcome; a spinner shows the running stage on a terminal."""

    STYLES: ClassVar[dict[str, tuple[str, str]]] = {
        OK: ("green", "  ok"), WARN: ("bold yellow", "WARN"), FAILED: ("bold red", "FAIL"),
    }

    def __init__(self, out: Console = console) -> None:
        self._out = out
        self._status: Status | None = None

    def start(self, stage: str, detail: str) -> None:
        self.close()
        self._status = self._out.status(f"{stage}: {detail}")
        self._status.start()

    def finish(self, stage: str, seconds: float, detail: str, status: str = OK) -> None:
        self.close()
        style, word = self.STYLES.get(status, ("bold", status))
        self._out.print(styled(style, word, f" {stage:<13} {seconds:7.2f} s  {detail}"))

    def close(self) -> None:
        if self._status is not None:
            status, self._status = self._status, None
            # A Ctrl-C can land inside rich's own start of the spinner and leave its render hooks half set; the
            # spinner is cosmetic, so stopping it never hides the interrupt or the error being reported.
            with contextlib.suppress(IndexError):
                status.stop()


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (progress on stderr).")]


def _stages_json(times: StageTimes) -> dict[str, Any]:
    return {"total_s": round(times.total(), 3), "stages": [r.to_json() for r in times.records]}


def up(
    seat: SeatOrDefault = None,
    draft: DraftOpt = None,
    slots: SlotsOpt = None,
    mem_fraction: MemOpt = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds for the whole `up`.")] = 600.0,
    fault: Annotated[list[str] | None, typer.Option(
        "--fault", help="Inject KIND:key=value,... at start (repeatable): a sim seat's kinds, e.g. "
                  "crash:rank=2,after_s=30; on a real rehearsal seat (rehearsal: true) "
                  "probe-stall:rank=1,after_calls=200,for_s=30.",
    )] = None,
    no_watchdog: Annotated[bool, typer.Option("--no-watchdog", help="Do not start the watchdog sidecars.")] = False,
    on_hang: Annotated[str | None, typer.Option(
        "--on-hang", metavar="POLICY",
        help="After a hang's bundle: capture (the bundle only), restart (the same plan) or rollback-draft (the "
             "draft off when the verdict is one the draft makes likely, else restart), within the spec's "
             "watchdog.remediation budget (default: the spec's watchdog.on_hang).",
    )] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and start nothing.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Bring a seat up across its nodes (Ray placement group), wait until READY, print the endpoint.

    Stages are shown with their elapsed time. The seat stays up after the command returns;
    Ctrl-C during `up` takes down everything it started. With --json: endpoint, state and stage
    timings as JSON on stdout (the plan's JSON with --dry-run).
    """
    from sgl_seat.launch import up as seat_up
    from sgl_seat.plan import build_plan, render_text
    from sgl_seat.spec import load_spec

    path, note = choose_seat(seat)
    if note:
        err_console.print(note)
    spec = load_spec(path)
    faults = tuple(fault or ())
    opts = seat_up.UpOptions(draft=draft_flag(draft), slots=slots, mem_fraction=mem_fraction, timeout=timeout,
                             faults=faults, no_watchdog=no_watchdog, on_hang=on_hang)
    policy = seat_up.effective_policy(spec, opts)  # a bad --on-hang fails here, before anything starts
    if dry_run:
        p = build_plan(spec, draft=draft_flag(draft), slots=slots, mem_fraction=mem_fraction, faults=faults)
        if json_out:
            print_json(p.to_json())
        else:
            sys.stdout.write(render_text(p))
        return
    out = err_console if json_out else console
    out.print(f"up: seat {spec.name} ({spec.engine}, {spec.cluster.nodes} nodes) from {spec.source}"
              + (f"; on hang: {policy.on_hang}" if policy.on_hang != "capture" else ""))
    rep = ConsoleReporter(out)
    try:
        rec, times = seat_up.up(spec, opts, rep)
    except KeyboardInterrupt:
        rep.close()
        err_console.print("interrupted: everything `up` started was taken down")
        raise
    finally:
        rep.close()
    if json_out:
        print_json({"seat": rec.name, "state": rec.state.value, "endpoint": rec.endpoint, "engine": rec.engine,
                    "draft": rec.draft, "on_hang": rec.on_hang, **_stages_json(times),
                    "warnings": [f"{w.name}: {w.detail}" for w in times.warnings()]})
        return
    console.print(styled("bold green", "READY", f" seat {rec.name} in {times.total():.1f} s  endpoint: {rec.endpoint}"))
    for w in times.warnings():
        err_console.print(styled("bold yellow", "warning:", f" {w.name}: {w.detail}"))


def down(name: NameArg = None, json_out: JsonOpt = False,
         local: Annotated[bool, typer.Option(
             "--local", help="Without Ray: stop the engines of this seat's nodes that run on this host, from the "
             "pids and process groups in its record (for a node whose raylet, agent or link is gone). Then run "
             "`down` from the driver to remove the rest.")] = False) -> None:
    """Take a seat down on every node, then check that no engine process remains (non-zero if one does).

    A node whose agent does not answer within a few seconds is left out and named, with the pids it left running;
    the record is kept, so `down` can be run again once the node is back, or `down --local` on that host.

    With --json: the stage timings and the survivors (none when it is down) as JSON on stdout.
    """
    from sgl_seat.launch import teardown
    from sgl_seat.launch.record import resolve_name

    seat = resolve_name(name)
    out = err_console if json_out else console
    if local:
        done = teardown.down_local(seat)
        if json_out:
            print_json({"seat": seat, "local": True, "nodes": list(done.nodes),
                        "stopped": {str(k): v for k, v in done.stopped.items()}, "survivors": done.survivors,
                        "keepers_stopped": list(done.keepers), "record_saved": done.saved})
        else:
            for n in done.nodes:
                pids = done.stopped.get(n) or []
                out.print(f"node {n}: " + (f"stopped pids {', '.join(map(str, pids))}" if pids else
                                           "no engine process was running"))
            if not done.saved:
                err_console.print(styled("bold yellow", "warning:", " the seat's record could not be saved"))
        if done.survivors:
            from sgl_seat.errors import EngineError

            raise EngineError("still alive after `down --local`:\n  " + "\n  ".join(done.survivors),
                              fix="kill those pids by hand (they are the seat's own), then run `sgl-seat down "
                                  "--local` again")
        if not json_out:
            console.print(f"seat {seat}: nothing of node(s) {', '.join(map(str, done.nodes))} is left on this host;"
                          f" run `sgl-seat down {seat}` from the driver to remove the rest")
        return
    out.print(f"down: seat {seat}")
    rep = ConsoleReporter(out)
    try:
        times = teardown.down(seat, rep)
    except teardown.NotDown as exc:
        if json_out:
            print_json({"seat": seat, "state": "FAILED", "survivors": exc.survivors, **_stages_json(exc.times)})
        raise
    finally:
        rep.close()
    if json_out:
        print_json({"seat": seat, "state": "STOPPED", "survivors": [], **_stages_json(times)})
        return
    console.print(f"seat {seat} is down in {times.total():.1f} s; no engine process remains")


def _print_status(rec: SeatRecord) -> None:
    from sgl_seat.engines import backend_for
    from sgl_seat.launch.state import SeatState
    from sgl_seat.launch.status import capture_failure_line, remediation_lines

    color = {SeatState.READY: "green", SeatState.DEGRADED: "yellow", SeatState.HUNG: "red",
             SeatState.NODE_LOST: "red", SeatState.FAILED: "red", SeatState.REMEDIATING: "yellow",
             SeatState.REMEDIATION_EXHAUSTED: "red"}.get(rec.state, "cyan")
    console.print(Text.assemble(
        f"seat {rec.name}  ", (rec.state.value, f"bold {color}"),
        f"  endpoint {rec.endpoint or '-'}  ({rec.engine}, draft {'on' if rec.draft else 'off'})",
    ))
    if rec.reason:
        console.print(f"reason: {rec.reason}")

    def tok(n: int | None) -> str:
        return f"{n:,}" if n is not None else "unknown"

    if rec.state is SeatState.HUNG and rec.hang_bundle:
        console.print(f"bundle: {rec.hang_bundle}  (`sgl-seat replay {rec.hang_bundle}` explains it)")
    for f in rec.capture_failures:
        console.print(styled("bold red", "watchdog:", f" {capture_failure_line(f)}"), markup=False)
    for ln in remediation_lines(rec, time.time()):
        console.print(ln, markup=False)
    source = backend_for(rec.engine).kv_actual_source
    console.print(f"KV pool: predicted {tok(rec.kv_predicted)} tokens, actual {tok(rec.kv_actual)} tokens ({source})")
    for n in rec.nodes:
        alive = {True: "alive", False: "DEAD", None: "-"}[n.alive]
        console.print(f"node {n.node_rank}  {n.ip or '?'}  agent pid {n.agent_pid or '-'}  engine pid "
                      f"{n.engine_pid or '-'} ({alive})  GPUs {','.join(n.gpu_ids) or '-'}  log {n.log_path or '-'}")
        for r in n.ranks:
            state = f" ({r.state})" if r.alive and r.state else ""
            console.print(f"    {r.title:<28} pid {r.pid or '-':<8} {'alive' if r.alive else 'not running'}{state}")
    for ln in rec.log_tail:
        console.print(f"  | {ln}", markup=False)


def status(
    name: NameArg = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1,
                                           help="Seconds a node's agent has to answer (silent: NODE-LOST).")] = 20.0,
) -> None:
    """Show a seat's state (reconciled with Ray now), nodes, ranks with pids, endpoint, KV pool."""
    from sgl_seat.launch import status as seat_status
    from sgl_seat.launch.record import resolve_name

    rec = seat_status.status(resolve_name(name), timeout=timeout)
    if json_out:
        print_json(seat_status.status_json(rec))
    else:
        _print_status(rec)


def logs(
    name: NameArg = None,
    node: Annotated[int | None, typer.Option("--node", "-n", min=0, help="Only this node rank.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C stops).")] = False,
    lines: Annotated[int, typer.Option("--lines", min=0, help="Lines of history to show first.")] = 100,
) -> None:
    """Show (or follow) the engine log of every node, or of one node, streamed by its node agent."""
    from sgl_seat.launch import logs as seat_logs
    from sgl_seat.launch.record import resolve_name

    def write(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    # Following, the first Ctrl-C ends the loop between two reads (a KeyboardInterrupt raised inside a Ray call
    # can leave the driver's shutdown hanging); a second one interrupts at once.
    stopping = threading.Event()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if stopping.is_set():
            raise KeyboardInterrupt
        stopping.set()

    previous = signal.signal(signal.SIGINT, on_sigint) if follow else None
    try:
        seat_logs.logs(resolve_name(name), node=node, follow=follow, lines=lines, write=write, stop=stopping.is_set)
    except KeyboardInterrupt:
        return
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def demo(
    seat: SeatOrDefault = None,
    quick: Annotated[bool, typer.Option("--quick", help="One question and 5 s of traffic before the stall "
                                                        "(instead of three and a minute).")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write the HTML report here (default: "
                                                             "$SGL_SEAT_HOME/reports/<seat>/<bundle id>.html).")]
    = None,
    json_out: JsonOpt = False,
) -> None:
    """The main job on the local-sim seat: up (draft on), traffic, a row-fetch stall injected on rank 3, the
    watchdog's bundle, its replay verdict and HTML report, and the seat down (also on error or Ctrl-C).

    `--seat local-sglang` runs it on real SGLang (CPU engine): the draft off (that engine cannot run it) and
    the stall a SIGSTOP of rank 1's scheduler (the SIGSTOP any real seat can take), released before down.

    The sim's answers and figures are synthetic. With --json: stages with seconds, the bundle, the verdict and
    the HTML path as one JSON document on stdout (progress on stderr).
    """
    from sgl_seat.launch.demo import DemoOptions, run_demo
    from sgl_seat.spec import load_spec

    spec = load_spec(seat or DEFAULT_PROFILE)
    out = err_console if json_out else console
    rep = ConsoleReporter(out)
    try:
        result = run_demo(spec, DemoOptions(quick=quick, html=html), reporter=rep,
                          say=lambda s: out.print(s, markup=False))
    except KeyboardInterrupt:
        rep.close()
        err_console.print("interrupted: the demo took its seat down")
        raise
    finally:
        rep.close()
    if json_out:
        print_json(result.to_json())


def fault(
    action: Annotated[str, typer.Argument(
        help="What to do: probe-stall:rank=R[,after_calls=N][,gather_ge=K][,for_s=S][,target=T] (the probe stalls "
             "rank R's next matching probed call inside the engine), clear (ends it), sigstop:rank=R, "
             "sigcont:rank=R, sigkill:rank=R, sigstop:detokenizer / sigcont:detokenizer; on a sim seat also the "
             "sim's own kinds (rowfetch-stall:rank=3, crash:rank=2, ...).")],
    name: Annotated[str | None, typer.Option("--name", "-n", help="Seat name (default: the only recorded seat).")]
    = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print what was done as JSON.")] = False,
) -> None:
    """Inject a fault into a running REHEARSAL seat (spec `rehearsal: true`, or a sim seat), to see what the
    watchdog makes of it; any other seat refuses. The watchdog's bundle follows in `sgl-seat watch` and
    `sgl-seat bundle ls`; a stopped process stays stopped until `sigcont`, a probe stall until its for_s or
    `clear`."""
    from sgl_seat.launch.record import resolve_name
    from sgl_seat.launch.rehearse import inject

    res = inject(resolve_name(name), action)
    if json_out:
        print_json(res.to_json())
        return
    where = f"{res.title} (pid {res.pid}) on node {res.nodes[0]}" if res.pid else \
        "node" + ("s " if len(res.nodes) > 1 else " ") + ", ".join(map(str, res.nodes))
    console.print(f"{res.action}: applied to {where}" + (f" (fault id {res.fault_id})" if res.fault_id else ""))


COMMANDS: dict[str, Callable[..., Any]] = {"up": up, "down": down, "status": status, "logs": logs, "demo": demo,
                                           "fault": fault}
