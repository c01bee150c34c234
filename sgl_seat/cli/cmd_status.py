"""`status` and `logs`: what a seat is doing now (logic in ``sgl_seat.launch.status`` and ``launch.seatlogs``)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from sgl_seat.cli.common import NameArg, console, print_json, styled

if TYPE_CHECKING:
    from sgl_seat.launch.seatrecord.record import SeatRecord


def _print_status(rec: SeatRecord) -> None:
    from sgl_seat.launch.seatrecord.state import SeatState
    from sgl_seat.launch.status import capture_failure_line, kv_line, node_processes, remediation_lines

    color = {SeatState.READY: "green", SeatState.DEGRADED: "yellow", SeatState.HUNG: "red",
             SeatState.NODE_LOST: "red", SeatState.FAILED: "red", SeatState.REMEDIATING: "yellow",
             SeatState.REMEDIATION_EXHAUSTED: "red"}.get(rec.state, "cyan")
    console.print(Text.assemble(
        f"seat {rec.name}  ", (rec.state.value, f"bold {color}"),
        f"  endpoint {rec.endpoint or '-'}  ({rec.engine}, draft {'on' if rec.draft else 'off'})",
    ))
    if rec.reason:
        console.print(f"reason: {rec.reason}")

    if rec.state is SeatState.HUNG and rec.hang_bundle:
        console.print(f"bundle: {rec.hang_bundle}  (`sgl-seat replay {rec.hang_bundle}` explains it)")
    for f in rec.capture_failures:
        console.print(styled("bold red", "watchdog:", f" {capture_failure_line(f)}"), markup=False)
    for ln in remediation_lines(rec, time.time()):
        console.print(ln, markup=False)
    console.print(kv_line(rec))
    for n in rec.nodes:
        alive = {True: "alive", False: "DEAD", None: "-"}[n.alive]
        console.print(f"node {n.node_rank}  {n.ip or '?'}  agent pid {n.agent_pid or '-'}  engine pid "
                      f"{n.engine_pid or '-'} ({alive})  GPUs {','.join(n.gpu_ids) or '-'}  log {n.log_path or '-'}")
        for r in n.ranks:
            state = f" ({r.state})" if r.alive and r.state else ""
            console.print(f"    {r.title:<28} pid {r.pid or '-':<8} {'alive' if r.alive else 'not running'}{state}")
        procs = [p for p in node_processes(rec, n) if p["kind"] != "scheduler"]
        if procs:
            console.print("    also: " + ", ".join(f"{p['kind']} pid {p['pid']}" + (
                f" ({p['title'][:40]})" if p["kind"] in ("other",) else "") for p in procs), markup=False)
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
    from sgl_seat.launch.seatrecord.record import resolve_name

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
    from sgl_seat.launch import seatlogs as seat_logs
    from sgl_seat.launch.seatrecord.record import resolve_name

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
