"""`watch` and `prometheus-config`: the watchdog seen live, here or from a monitoring host."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from sgl_seat.cli.common import err_console, print_json, styled


def watch(
    name: Annotated[str | None, typer.Argument(help="Seat name (default: the only recorded seat).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (one document per refresh).")] = False,
    once: Annotated[bool, typer.Option("--once", help="Print one view and exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")] = 1.0,
    timeout: Annotated[float, typer.Option("--timeout", min=0.5,
                                           help="Seconds to wait for the seat's Ray cluster.")] = 15.0,
) -> None:
    """Live view per rank: state, top frame, row-fetch p50/p99 and in-flight age, tokens/s, and the bundles
    captured so far. Ctrl-C ends it; the seat and its watchdog keep running."""
    from rich.live import Live

    from sgl_seat.cli.watchview import render
    from sgl_seat.launch import cluster
    from sgl_seat.launch.seatrecord.record import load_record, resolve_name
    from sgl_seat.launch.watchdoc import collect

    # The view's own console: no soft wrap, so tables are fitted to the terminal's width (one line per rank).
    view = Console(highlight=False, markup=False)
    seat = resolve_name(name)
    rec = load_record(seat)
    connected = False
    unreachable: str | None = None
    if rec.gcs_address and not rec.no_watchdog:
        try:
            cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=timeout)
            connected = True
        except Exception as exc:  # collect() reports the seat without sidecars
            unreachable = f"cannot reach the seat's Ray cluster: {exc}".splitlines()[0][:300]
            # stderr: under --json stdout carries the JSON documents and nothing else.
            err_console.print(styled("yellow", "cannot reach the seat's Ray cluster: ", str(exc)))

    def doc_now() -> dict[str, Any]:
        return collect(seat, connected=connected, unreachable=unreachable, timeout=timeout)

    try:
        if once:
            doc = doc_now()
            if json_out:
                print_json(doc)
            else:
                view.print(render(doc, width=view.width))
            return
        if json_out:
            while True:
                sys.stdout.write(json.dumps(doc_now()) + "\n")
                sys.stdout.flush()
                time.sleep(interval)
        with Live(render(doc_now(), width=view.width), console=view, refresh_per_second=4) as live:
            while True:
                time.sleep(interval)
                live.update(render(doc_now(), width=view.width))
    except KeyboardInterrupt:
        return
    finally:
        if connected:
            cluster.disconnect()


def prometheus_config(
    name: Annotated[str | None, typer.Argument(help="Seat name (default: the only recorded seat).")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the YAML here (default: stdout).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the config, targets and notes as JSON.")] = False,
) -> None:
    """Print a Prometheus config that scrapes every node's watchdog sidecar (and node 0's SGLang /metrics) of a
    seat that is up, with the shipped alert rules. A Prometheus on another host reaches the sidecars only when
    the seat's spec sets `watchdog.exporter_bind: cluster` (the default, loopback, serves each node only)."""
    from sgl_seat.launch.seatrecord.record import load_record, resolve_name
    from sgl_seat.launch.sidecars import prometheus_config_of

    cfg = prometheus_config_of(load_record(resolve_name(name)))
    if json_out:
        print_json(cfg.to_json())
        return
    text = cfg.render()
    if out is not None:
        out.write_text(text, encoding="utf-8")
        err_console.print(f"wrote {out} ({len(cfg.targets)} sidecar targets)")
    else:
        sys.stdout.write(text)
    for note in cfg.notes:
        err_console.print(f"note: {note}", markup=False)


COMMANDS: dict[str, Callable[..., Any]] = {"watch": watch, "prometheus-config": prometheus_config}
