"""`watch` (the watchdog issue; `replay` lives in cmd_replay.py)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from sgl_seat.cli.common import console, print_json


def watch(
    name: Annotated[str | None, typer.Argument(help="Seat name (default: the only recorded seat).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (one document per refresh).")] = False,
    once: Annotated[bool, typer.Option("--once", help="Print one view and exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")] = 1.0,
) -> None:
    """Live view per rank: state, top frame, row-fetch p50/p99 and in-flight age, tokens/s, and the bundles
    captured so far. Ctrl-C ends it; the seat and its watchdog keep running."""
    from rich.live import Live

    from sgl_seat.cli.watchview import collect, render
    from sgl_seat.launch import cluster
    from sgl_seat.launch.record import load_record, resolve_name

    seat = resolve_name(name)
    rec = load_record(seat)
    connected = False
    if rec.gcs_address and not rec.no_watchdog:
        try:
            cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=15.0)
            connected = True
        except Exception as exc:  # collect() reports the seat without sidecars
            console.print(f"[yellow]cannot reach the seat's Ray cluster: {exc}[/]")
    try:
        if once:
            doc = collect(seat, connected=connected)
            if json_out:
                print_json(doc)
            else:
                console.print(render(doc))
            return
        if json_out:
            while True:
                sys.stdout.write(json.dumps(collect(seat, connected=connected)) + "\n")
                sys.stdout.flush()
                time.sleep(interval)
        with Live(render(collect(seat, connected=connected)), console=console, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(render(collect(seat, connected=connected)))
    except KeyboardInterrupt:
        return
    finally:
        if connected:
            cluster.disconnect()


COMMANDS: dict[str, Callable[..., Any]] = {"watch": watch}
