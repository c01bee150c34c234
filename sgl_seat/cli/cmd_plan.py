"""`sgl-seat plan` and `sgl-seat schema`."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated

import typer

from sgl_seat.cli.common import PortBaseOpt, print_json


class DraftState(str, Enum):
    on = "on"
    off = "off"


SeatOpt = Annotated[
    str, typer.Option("--seat", "-s", help="Seat spec: a path to a .yaml file or a built-in profile name.")
]
DraftOpt = Annotated[
    DraftState | None, typer.Option("--draft", help="Speculative draft on or off (default: the spec's draft.enabled).")
]
SlotsOpt = Annotated[
    int | None, typer.Option("--slots", min=1, help="--max-running-requests for the chosen draft state.")
]
MemOpt = Annotated[
    float | None, typer.Option("--mem-fraction", help="--mem-fraction-static (default: the spec's memory_fraction).")
]


def draft_flag(d: DraftState | None) -> bool | None:
    return None if d is None else d is DraftState.on


def plan(
    seat: SeatOpt = "local-sim",
    draft: DraftOpt = None,
    slots: SlotsOpt = None,
    mem_fraction: MemOpt = None,
    port_base: PortBaseOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Show what a seat will run on each node, how Ray places it, and its KV pool draft off and on.

    Nothing is started: this is the dry run of `up`. A configuration that cannot boot (for example
    too many slots with the draft on) is refused with the numbers that do not fit (exit 2).
    """
    from sgl_seat.plan import build_plan, render_text  # imported here: other commands do not pay for it
    from sgl_seat.spec import load_spec

    spec = load_spec(seat).with_port_base(port_base)
    p = build_plan(spec, draft=draft_flag(draft), slots=slots, mem_fraction=mem_fraction)
    if json_out:
        print_json(p.to_json())
    else:
        sys.stdout.write(render_text(p))


def schema() -> None:
    """Print the JSON Schema of the seat spec (schema_version 1)."""
    from sgl_seat.spec import spec_json_schema

    sys.stdout.write(spec_json_schema() + "\n")
