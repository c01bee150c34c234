"""`sgl-seat gate`: the A/B battery that decides whether the draft ships; `sgl-seat tune draft`: its crossover written
into the seat as the draft policy (logic in ``sgl_seat.gate`` and ``sgl_seat.gate.tune``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sgl_seat.cli.common import PortBaseOpt, SeatOrDefault, console, err_console, print_json
from sgl_seat.errors import SeatError, UsageError

if TYPE_CHECKING:
    from sgl_seat.gate import Progress

# The gate (and through it Ray and the launch code) is imported inside the command: other commands and
# `--help` do not pay for it.


def _progress(p: Progress) -> None:
    eta = "" if p.eta_s is None else f", about {p.eta_s / 60:.1f} min left"
    if p.cell == "done":
        err_console.print(f"gate: all {p.total_slots} slots done")
    else:
        err_console.print(f"gate: slot {p.done_slots + 1}/{p.total_slots} {p.slot}: {p.cell}{eta}")


def gate(
    seat: SeatOrDefault = None,
    arms: Annotated[str, typer.Option("--arms", help="baseline,candidate[,hybrid][,control] (control: baseline "
                                                     "again, the A/A noise floor); baseline,control alone is an A/A "
                                                     "rehearsal.")] = "baseline,candidate",
    runs: Annotated[int | None, typer.Option("--runs", min=1, help="Repetitions per arm (default 3; --quick 2).")]
    = None,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer runs, a shorter sweep and smaller workloads.")]
    = False,
    json_out: Annotated[bool, typer.Option("--json", help="The report as JSON on stdout (progress on stderr).")]
    = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write the HTML report here.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Battery directory (default: "
                                                           "$SGLSEAT_HOME/gate/<seat>-<time>).")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue the battery in this directory "
                                                                 "(finished cells are not repeated).")] = None,
    url: Annotated[list[str] | None, typer.Option("--url", help="ARM=URL of a running seat instead of bringing "
                                                               "arms up (repeatable; cold gates not measured).")]
    = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Prompt seed (default: the workloads file's).")] = None,
    no_watchdog: Annotated[bool, typer.Option("--no-watchdog", help="Arms without watchdog sidecars (the hangs "
                                                                    "gate is then not measured).")] = False,
    workloads: Annotated[Path | None, typer.Option("--workloads", help="A workloads YAML instead of the shipped "
                                                                       "one.")] = None,
    note: Annotated[str | None, typer.Option("--note", help="Words about what is measured, shown atop the report "
                                                            "(e.g. that the model has random weights).")] = None,
    port_base: PortBaseOpt = None,
) -> None:
    """Run the A/B battery: arms interleaved ABBA, paired 95 % intervals, an A/A noise floor, a verdict.

    Prints the verdict (SHIP / DO_NOT_SHIP / INCONCLUSIVE), each gate's ratio, interval and outcome, the
    crossover concurrency and a recommendation per concurrency band. Each arm is brought up and down by the
    gate (a fresh engine per slot), or taken from --url. Results are written per cell; --resume DIR continues.
    The hangs gate is a rate ratio (hang bundles per serving hour, with its exact 95 % interval).

    --arms baseline,control (an A/A rehearsal, to learn the noise floor before a real battery): every gate
    compares the control against the baseline and the verdict is the control's. SHIP: identical arms
    resolve every gate here; DO_NOT_SHIP: a gate FAILed on identical arms, so this machine or this number
    of runs cannot decide; INCONCLUSIVE: more runs are needed.

    Exit status (for pipelines): 0 SHIP, 1 DO_NOT_SHIP, 3 INCONCLUSIVE, 2 a usage error (a bad option, spec
    or workloads file), 4 no verdict: the battery could not run (an arm that did not start, naming the node,
    the reason and the fix; the cluster failed); the message is on stderr and, with --json, an error document
    ("verdict": null, "error": {...}) on stdout. An arm whose engine fails to start is started once more;
    one that fails preflight (a port held: see --port-base) is not. Ctrl-C exits 130.
    """
    from sgl_seat.gate import GateOptions, error_document, exit_code, parse_arms, parse_urls, run_gate
    from sgl_seat.gate.report_html import render_html
    from sgl_seat.gate.report_text import render_text
    from sgl_seat.launch.seatchoice import choose_seat
    from sgl_seat.spec import load_spec

    urls = parse_urls(url or [])
    spec = None
    if not urls:  # arms brought up from a spec (a resumed battery too)
        path, seat_note = choose_seat(seat)  # its own name: --note is the operator's words for the report
        if seat_note:
            err_console.print(seat_note)
        spec = load_spec(path).with_port_base(port_base)
    arm_list = parse_arms(arms)
    if urls:
        urls.setdefault("control", urls.get("baseline", ""))
        missing = [a for a in arm_list if not urls.get(a)]
        if missing:
            raise UsageError(f"no --url for arm(s) {', '.join(missing)}", fix="pass --url ARM=URL for each arm")
    try:
        result = run_gate(GateOptions(spec=spec, urls=urls, arms=arm_list, runs=runs, quick=quick, seed=seed,
                                      out=out, resume=resume, watchdog=not no_watchdog, workloads=workloads,
                                      note=note), progress=_progress, say=lambda s: err_console.print(s))
    except SeatError as exc:  # no verdict: with --json a document says so on stdout, then the error on stderr
        if json_out:
            print_json(error_document(exc))
        raise
    if html is not None:
        html.write_text(render_html(result.report), encoding="utf-8")
        err_console.print(f"HTML report: {html}")
    if json_out:
        print_json(result.report)
    else:
        sys.stdout.write(render_text(result.report))
        console.print(f"battery directory: {result.directory} (report.json)")
    raise typer.Exit(exit_code(result.report["verdict"]))  # the verdict is the exit status: pipelines act on it


tune_app = typer.Typer(help="Seat settings from measurements: `draft` writes draft.off_above from a gate report.",
                  no_args_is_help=True)


@tune_app.command("draft")
def draft(
    report: Annotated[Path, typer.Argument(help="The gate's report.json, or its battery directory.")],
    seat: Annotated[str, typer.Option("--seat", help="The seat file to write (a path; a built-in profile is "
                                                     "refused: copy it first).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be written; write nothing.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="The result as JSON.")] = False,
) -> None:
    """Write the seat's draft policy, draft.off_above: N, from the gate report's crossover.

    N is the crossover's lower bound (the earliest concurrency at which the draft may stop paying), rounded
    down. `sgl-seat plan --draft on` then shows it as the engine's own policy (SGLang's --speculative-adaptive
    tiers: a zero-step tier from N + 1 running requests; vLLM's num_speculative_tokens_per_batch_size: no draft
    tokens above N) and what the hybrid cannot give back (the draft's KV pool and slot cap stay);
    `sgl-seat gate --arms baseline,hybrid,control` gates it.

    Exit status: 0 written (or --dry-run), 3 the report supports no policy (the reason is printed: the draft
    lost everywhere, paid everywhere, or the interval is too wide), 2 a bad report or seat file.
    """
    from sgl_seat.gate.tune import tune_draft

    res = tune_draft(report, seat, dry_run=dry_run)
    if json_out:
        print_json(res.to_json())
        return
    prev = "" if res.previous is None else f" (was {res.previous})"
    console.print(f"{'would write' if dry_run else 'wrote'} draft.off_above: {res.off_above}{prev} to {res.path}")
    console.print(f"  from {res.report}: {res.why}")
    console.print(f"  the engine runs it as {res.how()}")
    for w in [*res.warnings, *(["the report is SYNTHETIC (the sim engine): this policy rehearses the flow only"]
                               if res.synthetic else [])]:
        err_console.print(f"  warning: {w}")
