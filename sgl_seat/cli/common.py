"""Helpers shared by the CLI commands: the one error printer, JSON output, shared options, the stage reporter."""

from __future__ import annotations

import contextlib
import datetime as _dt
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, ClassVar

import typer
from rich.console import Console
from rich.status import Status
from rich.text import Text

from sgl_seat.errors import SeatError
from sgl_seat.launch.stages import FAILED, OK, WARN, StageTimes

# markup=False: paths, log lines and error texts may contain "[...]"; styled output is built with
# rich Text (see ``styled``), never by formatting untrusted text into markup.
console = Console(highlight=False, soft_wrap=True, markup=False)
err_console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def styled(style: str, head: str, rest: str = "") -> Text:
    """``head`` in ``style`` followed by plain ``rest``: safe for any text."""
    return Text.assemble((head, style), rest)


def print_json(doc: Any) -> None:
    """JSON on stdout, nothing else (so ``--json`` output pipes into jq)."""
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    # Out at once: a Ray driver whose cluster is dying can be ended by Ray's own core worker without Python's exit,
    # and a buffered document would then never reach a piped stdout (`down --json` with a node's raylet killed).
    sys.stdout.flush()



def unwrap_help(app: typer.Typer) -> None:
    """Join the line breaks inside each paragraph of every command's docstring: typer's rich help keeps them after
    the first paragraph and then wraps again, which breaks lines mid-sentence. A paragraph that starts with ``\\b``
    keeps its lines; anything after ``\\f`` is left as it is."""
    for info in app.registered_commands:
        doc = info.help if info.help is not None else inspect.getdoc(info.callback)
        if doc:
            text, cut, rest = inspect.cleandoc(doc).partition("\f")
            info.help = "\n\n".join(p if p.startswith("\b") else " ".join(p.split())
                                     for p in text.split("\n\n")) + cut + rest
    for group in app.registered_groups:
        if group.typer_instance is not None:
            unwrap_help(group.typer_instance)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (progress on stderr).")]
SeatOrDefault = Annotated[
    str | None,
    typer.Option("--seat", "-s", help="Seat spec: a .yaml path or a built-in profile (default: ./seat.yaml, "
                                      "else the built-in local-sim)."),
]
PortBaseOpt = Annotated[int | None, typer.Option(
    "--port-base", min=1024, max=65515, metavar="PORT",
    help="Move every port of the seat so that its HTTP port is PORT (dist-init, the simulated nodes' and the "
         "exporters' ports keep their distance from it): a second seat on this host without editing a copy.")]
NameArg = Annotated[str | None, typer.Argument(help="Seat name (default: the only recorded seat).")]


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


def stages_json(times: StageTimes) -> dict[str, Any]:
    return {"total_s": round(times.total(), 3), "stages": [r.to_json() for r in times.records]}


# -- the `bundle` commands' options and helpers --

BundleArg = Annotated[str, typer.Argument(help="A bundle directory, a .tar.zst, or a bundle id under $SGLSEAT_HOME.")]
PlainJsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
# None: the library's default (sgl_seat.forensics.format.archive.DEFAULT_MAX_UNPACKED_BYTES), not imported here
# for speed.
MaxUnpackedOpt = Annotated[int | None, typer.Option(
    "--max-unpacked-bytes", min=1, metavar="BYTES",
    help="Refuse a .tar.zst that would unpack to more than this, whatever its manifest claims, before writing "
         "anything (default 2 GiB: 2147483648).")]


def when(t: float | None) -> str:
    if t is None:
        return "-"
    return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def verdict_text(v: dict[str, Any] | None) -> str:
    if not v:
        return "-"
    return f"{v['kind']} rank {v.get('rank')} node {v.get('node')}" + (f" {v['frame']}" if v.get("frame") else "")


@contextlib.contextmanager
def json_refusal(json_out: bool, path: object) -> Iterator[None]:
    """With --json a refused bundle still gets its JSON answer (``"ok": false``), then the error on stderr."""
    try:
        yield
    except SeatError as exc:
        if json_out:
            print_json({"path": str(path), "ok": False, "error": exc.message})
        raise


def dir_sizes(root: Path) -> dict[str, int]:
    files = [f for f in root.rglob("*") if f.is_file()]
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}
