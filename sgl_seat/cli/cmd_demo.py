"""`demo` (the README's first command) and `fault` (a fault into a rehearsal seat), over ``sgl_seat.launch``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sgl_seat.cli.common import (
    ConsoleReporter,
    JsonOpt,
    PortBaseOpt,
    SeatOrDefault,
    console,
    err_console,
    print_json,
)
from sgl_seat.launch.seatchoice import DEFAULT_PROFILE


def demo(
    seat: SeatOrDefault = None,
    quick: Annotated[bool, typer.Option("--quick", help="One question and 5 s of traffic before the stall "
                                                        "(instead of three and a minute).")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write the HTML report here (default: "
                                                             "$SGLSEAT_HOME/reports/<seat>/<bundle id>.html).")]
    = None,
    port_base: PortBaseOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The main job on the local-sim seat: up (draft on), traffic, a row-fetch stall injected on rank 3, the
    watchdog's bundle, its replay verdict and HTML report, and the seat down (also on error or Ctrl-C).

    `--seat local-sglang` runs it on real SGLang (CPU engine): the draft off (that engine cannot run it) and
    the stall a SIGSTOP of rank 1's scheduler (the SIGSTOP any real seat can take), released before down.

    The sim's answers and figures are synthetic. With --json: stages with seconds, the bundle, the verdict and
    the HTML path as one JSON document on stdout (progress on stderr).
    """
    from sgl_seat.launch.demo.run import DemoOptions, run_demo
    from sgl_seat.spec import load_spec

    spec = load_spec(seat or DEFAULT_PROFILE).with_port_base(port_base)
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
             "sigcont:rank=R, sigkill:rank=R, sigstop:H / sigcont:H for the engine's helper process H (SGLang's "
             "detokenizer, vLLM's engine-core); on a sim seat also the "
             "sim's own kinds (rowfetch-stall:rank=3, crash:rank=2, ...).")],
    name: Annotated[str | None, typer.Option("--name", "-n", help="Seat name (default: the only recorded seat).")]
    = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print what was done as JSON.")] = False,
) -> None:
    """Inject a fault into a running REHEARSAL seat (spec `rehearsal: true`, or a sim seat), to see what the
    watchdog makes of it; any other seat refuses. The watchdog's bundle follows in `sgl-seat watch` and
    `sgl-seat bundle ls`; a stopped process stays stopped until `sigcont`, a probe stall until its for_s or
    `clear`."""
    from sgl_seat.launch.rehearse import inject
    from sgl_seat.launch.seatrecord.record import resolve_name

    res = inject(resolve_name(name), action)
    if json_out:
        print_json(res.to_json())
        return
    where = f"{res.title} (pid {res.pid}) on node {res.nodes[0]}" if res.pid else \
        "node" + ("s " if len(res.nodes) > 1 else " ") + ", ".join(map(str, res.nodes))
    console.print(f"{res.action}: applied to {where}" + (f" (fault id {res.fault_id})" if res.fault_id else ""))
