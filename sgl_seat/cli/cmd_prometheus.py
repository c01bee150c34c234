"""`prometheus-config`: the scrape config of a running seat, for a Prometheus on a monitoring host."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from sgl_seat.cli.common import err_console, print_json


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


COMMANDS: dict[str, Callable[..., Any]] = {"prometheus-config": prometheus_config}
