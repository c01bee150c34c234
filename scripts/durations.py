"""The test command's durations table: its phases and the slowest tests, in seconds (scripts/test.sh).

Reads the folder that scripts/test.sh fills while it runs:
  * ``phases.tsv``: one line per phase, ``name<TAB>start<TAB>end`` (epoch seconds; setup, lint, type check, each
    stream), so phases that ran side by side show as such;
  * ``<part>.xml``: pytest's JUnit XML of each pytest run (the unit and contract tests, each integration stream),
    whose ``time`` of a test is its setup, call and teardown together (a module fixture's start-up lands on the
    module's first test).

Prints one table and writes the same text to ``--out``. The last line is the run's wall time against the CI tier's
budget: a line a person reads, never an assertion (a slow run still passes or fails on its tests alone).
Standard library only: it runs before and without the project's environment.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

#: The CI tier's budget, in seconds, for a fresh-clone run on 2 cores (README, "The tests").
CI_BUDGET_S = 20 * 60
SLOWEST = 15


@dataclass(frozen=True)
class Phase:
    name: str
    start: float
    end: float

    @property
    def took(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Case:
    part: str
    module: str
    name: str
    seconds: float
    outcome: str


def read_phases(path: Path) -> list[Phase]:
    phases = []
    if path.is_file():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                try:
                    phases.append(Phase(parts[0], float(parts[1]), float(parts[2])))
                except ValueError:
                    continue
    return phases


def read_cases(folder: Path) -> list[Case]:
    cases = []
    for xml in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(xml).getroot()  # noqa: S314 (pytest's own output, written by this run)
        except ET.ParseError:
            continue  # a stream killed mid-write: its phase line still says how long it ran
        for tc in root.iter("testcase"):
            classname = tc.get("classname", "")
            # "tests.integration.test_x" or "tests.integration.test_x.TestClass": the module is the test_ part
            module = next((p for p in classname.split(".") if p.startswith("test_")), classname)
            outcome = "passed"
            for child in tc:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                elif child.tag == "skipped" and outcome == "passed":
                    outcome = "skipped"
            cases.append(Case(xml.stem, module, tc.get("name", "?"), float(tc.get("time", 0.0) or 0.0), outcome))
    return cases


def _minsec(s: float) -> str:
    return f"{int(s // 60)}:{int(s % 60):02d}"


def render(phases: list[Phase], cases: list[Case], *, budget_s: float, tier: str) -> str:
    lines = [f"== durations ({tier} tier), seconds"]
    if phases:
        t0 = min(p.start for p in phases)
        lines.append(f"{'phase':<34} {'from':>6} {'to':>6} {'took':>7}")
        for p in phases:
            lines.append(f"{p.name:<34} {p.start - t0:>6.0f} {p.end - t0:>6.0f} {p.took:>7.1f}")
    by_part: dict[str, list[Case]] = {}
    for c in cases:
        by_part.setdefault(c.part, []).append(c)
    if by_part:
        lines.append("")
        lines.append(f"{'tests by part':<34} {'passed':>6} {'failed':>6} {'skipped':>7} {'sum of tests':>13}")
        for part, cs in by_part.items():
            n = {k: sum(1 for c in cs if c.outcome == k) for k in ("passed", "failed", "skipped")}
            lines.append(f"{part:<34} {n['passed']:>6} {n['failed']:>6} {n['skipped']:>7} "
                         f"{sum(c.seconds for c in cs):>13.1f}")
    if cases:
        lines.append("")
        lines.append(f"the {min(SLOWEST, len(cases))} slowest tests (setup, call and teardown together)")
        for c in sorted(cases, key=lambda c: -c.seconds)[:SLOWEST]:
            flag = "" if c.outcome == "passed" else f"  [{c.outcome}]"
            lines.append(f"{c.seconds:>7.1f}  {c.part:<8} {c.module}::{c.name}{flag}")
    if phases:
        total = max(p.end for p in phases) - min(p.start for p in phases)
        lines.append("")
        verdict = "inside" if total <= budget_s else "OVER"
        lines.append(f"total {total:.0f} s ({_minsec(total)}) of the {tier} tier's budget {budget_s:.0f} s "
                     f"({_minsec(budget_s)}): {verdict}")
    if cases:
        # The plain closing line a CI reader counts, over every part of the run.
        n = {k: sum(1 for c in cases if c.outcome == k) for k in ("passed", "failed", "skipped")}
        lines.append(f"tests: {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="the run's folder (phases.tsv and the JUnit XML files)")
    ap.add_argument("--out", type=Path, help="also write the table here")
    ap.add_argument("--tier", default="CI", help="the tier's name, for the closing line")
    ap.add_argument("--budget-s", type=float, default=CI_BUDGET_S, help="the tier's budget (default: 20 min)")
    args = ap.parse_args(argv)
    text = render(read_phases(args.folder / "phases.tsv"), read_cases(args.folder),
                  budget_s=args.budget_s, tier=args.tier)
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
