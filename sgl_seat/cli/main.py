"""The `sgl-seat` entry point: registers the commands and prints every SeatError the same way."""

from __future__ import annotations

import sys

import typer

from sgl_seat import __version__
from sgl_seat.cli import (
    cmd_bundle,
    cmd_demo,
    cmd_engine,
    cmd_gate,
    cmd_model,
    cmd_plan,
    cmd_replay,
    cmd_status,
    cmd_up,
    cmd_watch,
)
from sgl_seat.cli.common import err_console, styled, unwrap_help
from sgl_seat.errors import SeatError

app = typer.Typer(
    name="sgl-seat",
    help=(
        "Plan, bring up, watch, capture and replay one multi-node SGLang MoE seat.\n\n"
        "The loop: `plan` (dry run) -> `up` -> `status`/`logs`/`watch` -> bundles on a hang -> `replay` -> `down`."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

app.command("plan")(cmd_plan.plan)
app.command("schema")(cmd_plan.schema)
app.command("up")(cmd_up.up)
app.command("down")(cmd_up.down)
app.command("status")(cmd_status.status)
app.command("logs")(cmd_status.logs)
app.command("demo")(cmd_demo.demo)
app.command("fault")(cmd_demo.fault)
for _name, _fn in cmd_watch.COMMANDS.items():
    app.command(_name)(_fn)
app.command("replay")(cmd_replay.replay)
app.command("gate")(cmd_gate.gate)
app.add_typer(cmd_bundle.app, name="bundle")
app.add_typer(cmd_model.app, name="model")
app.add_typer(cmd_engine.app, name="engine")
app.add_typer(cmd_gate.tune_app, name="tune")
unwrap_help(app)


@app.callback(invoke_without_command=True)
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    if version:
        sys.stdout.write(f"sgl-seat {__version__}\n")
        raise typer.Exit(0)


def main() -> None:
    """Run the CLI; a SeatError becomes its message on stderr and its exit code, never a traceback."""
    try:
        app()
    except SeatError as exc:
        err_console.print(styled("bold red", "error:", f" {exc}"))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
