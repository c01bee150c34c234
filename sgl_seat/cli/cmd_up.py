"""`up` and `down`: bring a seat up, take it down (logic in ``sgl_seat.launch.up`` and ``launch.teardown``)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from sgl_seat.cli.cmd_plan import DraftOpt, MemOpt, SlotsOpt, draft_flag
from sgl_seat.cli.common import (
    ConsoleReporter,
    JsonOpt,
    NameArg,
    PortBaseOpt,
    SeatOrDefault,
    console,
    err_console,
    print_json,
    stages_json,
    styled,
)

# The library (Ray, the plan) is imported inside the command: `sgl-seat --help` and `plan` do not pay for it.


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
    port_base: PortBaseOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and start nothing.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Bring a seat up across its nodes (Ray placement group), wait until READY, print the endpoint.

    Stages are shown with their elapsed time. The seat stays up after the command returns;
    Ctrl-C during `up` takes down everything it started. With --json: endpoint, state and stage
    timings as JSON on stdout (the plan's JSON with --dry-run). A second seat on this host: --port-base
    (a held port is refused before anything starts, naming the spec key that moves it).
    """
    from sgl_seat.launch import up as seat_up
    from sgl_seat.plan import render_text

    req = seat_up.prepare(seat, seat_up.UpOptions(
        draft=draft_flag(draft), slots=slots, mem_fraction=mem_fraction, timeout=timeout, faults=tuple(fault or ()),
        no_watchdog=no_watchdog, on_hang=on_hang, port_base=port_base))
    if req.note:
        err_console.print(req.note)
    if dry_run:
        p = seat_up.plan_of(req.spec, req.opts)
        if json_out:
            print_json(p.to_json())
        else:
            sys.stdout.write(render_text(p))
        return
    out = err_console if json_out else console
    spec = req.spec
    out.print(f"up: seat {spec.name} ({spec.engine}, {spec.cluster.nodes} nodes) from {spec.source}"
              + (f"; on hang: {req.policy.on_hang}" if req.policy.on_hang != "capture" else ""))
    rep = ConsoleReporter(out)
    try:
        rec, times = seat_up.up(spec, req.opts, rep)
    except KeyboardInterrupt:
        rep.close()
        err_console.print("interrupted: everything `up` started was taken down")
        raise
    finally:
        rep.close()
    if json_out:
        print_json({"seat": rec.name, "state": rec.state.value, "endpoint": rec.endpoint, "engine": rec.engine,
                    "draft": rec.draft, "on_hang": rec.on_hang, **stages_json(times),
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
    the record is kept, so `down` can be run again once the node is back, or `down --local` on that host. With no
    seat recorded (or none named NAME) there is nothing to take down: it says so and exits 0.

    With --json: the stage timings and the survivors (none when it is down) as JSON on stdout.
    """
    from sgl_seat.launch import teardown
    from sgl_seat.launch.seatrecord.record import resolve_name

    out = err_console if json_out else console
    if absent := teardown.nothing_to_take_down(name):  # idempotent: what is not up is down
        out.print(absent)
        if json_out:
            print_json({"seat": name, "recorded": False, "state": "STOPPED", "survivors": [], "total_s": 0,
                        "stages": []})
        return
    seat = resolve_name(name)
    if local:
        done = teardown.down_local(seat)
        if json_out:
            print_json(done.to_json())
        else:
            for n in done.nodes:
                pids = done.stopped.get(n) or []
                out.print(f"node {n}: " + (f"stopped pids {', '.join(map(str, pids))}" if pids else
                                           "no engine process was running"))
            if not done.saved:
                err_console.print(styled("bold yellow", "warning:", " the seat's record could not be saved"))
        done.refuse_survivors()
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
            print_json({"seat": seat, "state": "FAILED", "survivors": exc.survivors, **stages_json(exc.times)})
        raise
    finally:
        rep.close()
    if json_out:
        print_json({"seat": seat, "state": "STOPPED", "survivors": [], **stages_json(times)})
        return
    console.print(f"seat {seat} is down in {times.total():.1f} s; no engine process remains")
