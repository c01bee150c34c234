"""From a gate report's crossover to the seat's draft policy: ``sgl-seat tune draft REPORT --seat SEAT``.

The report's crossover is where the candidate/baseline throughput ratio falls through 1, with the concurrencies
where its interval's edges do (:class:`sgl_seat.gate.intervals.Crossover`). The policy takes the lower bound, the
earliest concurrency at which the draft may stop paying, rounded down: ``draft.off_above: N`` drafts up to N
running requests and not above (the plan turns it into SGLang's adaptive tiers, :mod:`sgl_seat.sizing.draft_tiers`).
Rounding down and the lower bound both err towards the baseline: above the crossover the draft costs every
request, below it a request loses only the gain.

Nothing is written where the report cannot support a policy, and the refusal says which case it is: no
candidate arm or no sweep; a draft that lost already at the smallest concurrency measured (keep it off); a draft
that surely paid nowhere (every interval reaches under 1: more runs); a draft whose interval never falls back
through 1 (no crossover inside the sweep: extend the sweep). The seat file is edited in place as text, so its
comments stay: one ``off_above:`` line inside ``draft:``, checked by loading the result before it replaces the file.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sgl_seat.engines import backend_for
from sgl_seat.errors import SpecError, TuneRefused, UsageError
from sgl_seat.gate.verdict import REPORT_SCHEMA_VERSION
from sgl_seat.spec import SeatSpec, builtin_seats_dir, parse_spec, resolve_seat_path

__all__ = ["DraftTune", "load_report", "policy_from_report", "set_off_above", "tune_draft"]

_DRAFT = re.compile(r"^draft:\s*(#.*)?$")
_KEY = re.compile(r"^(\s+)([A-Za-z_][A-Za-z0-9_]*):")


@dataclass(frozen=True, slots=True)
class DraftTune:
    seat: str
    path: Path
    report: Path
    off_above: int
    previous: int | None
    why: str
    synthetic: bool
    #: The policy as the seat's engine runs it (its backend's draft policy: SGLang's adaptive tiers, vLLM's schedule).
    policy: dict[str, Any]
    written: bool
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"seat": self.seat, "path": str(self.path), "report": str(self.report), "off_above": self.off_above,
                "previous": self.previous, "why": self.why, "synthetic": self.synthetic,
                "policy": self.policy, "written": self.written, "warnings": list(self.warnings)}

    def how(self) -> str:
        """The policy in one line, as the engine runs it."""
        p = self.policy
        if "schedule" in p:
            return f"{p.get('flag')}: {p['schedule']} ([first, last running requests, draft tokens])"
        if "how" in p:
            return f"--speculative-adaptive, {p['how']}"
        return json.dumps(p)


def load_report(path: Path) -> tuple[Path, dict[str, Any]]:
    """A gate report: ``report.json`` or the battery directory that holds it."""
    p = path / "report.json" if path.is_dir() else path
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{p}: not a gate report ({exc})",
                         fix="pass the report.json `sgl-seat gate` wrote, or its battery directory") from None
    if not isinstance(doc, dict) or doc.get("kind") != "sgl-seat gate report":
        raise UsageError(f"{p}: not a gate report (no kind 'sgl-seat gate report')",
                         fix="pass the report.json `sgl-seat gate` wrote, or its battery directory")
    major = str(doc.get("schema_version", "")).split(".")[0]
    if major != REPORT_SCHEMA_VERSION.split(".")[0]:
        raise UsageError(f"{p}: report schema_version {doc.get('schema_version')!r}; this sgl-seat reads "
                         f"{REPORT_SCHEMA_VERSION.split('.')[0]}.x", fix="tune with the sgl-seat that ran the gate")
    return p, doc


def _level_text(sweep: list[dict[str, Any]], i: int) -> str:
    s = sweep[i]
    return f"c={s['concurrency']}: ratio {s.get('ratio')} [{s.get('ci_low')}, {s.get('ci_high')}]"


def policy_from_report(doc: dict[str, Any]) -> tuple[int, str]:
    """``off_above`` from the report's crossover lower bound, and why; :class:`TuneRefused` where none follows."""
    cross = doc.get("crossover")
    sweep = (doc.get("comparisons") or {}).get("candidate", {}).get("sweep") or []
    if not cross or not sweep:
        raise TuneRefused("the report has no crossover: it needs a candidate arm (draft on) and a concurrency sweep "
                          "on both arms", fix="run `sgl-seat gate --arms baseline,candidate,control`")
    if cross.get("below_sweep"):
        raise TuneRefused(f"the draft lost already at the smallest concurrency measured ({_level_text(sweep, 0)}): "
                          "no load at which it pays, so no policy is written",
                          fix="keep the draft off (draft.enabled: false), or gate a better-accepted draft")
    low = cross.get("ci_low")
    if low is None and not any((s.get("ci_low") or 0) >= 1.0 for s in sweep):
        raise TuneRefused(f"the draft did not surely pay at any concurrency measured (the interval reaches under 1 "
                          f"at every level, from {_level_text(sweep, 0)}): no load to keep it for",
                          fix="run more repetitions (--runs) to narrow the intervals, or keep the draft off")
    if low is None:
        raise TuneRefused(f"the draft surely paid up to the end of the sweep ({_level_text(sweep, -1)}): the "
                          "crossover's lower bound is beyond it, so there is nothing to turn off yet",
                          fix="add larger levels to the workloads' sweep (or leave the draft static)")
    n = math.floor(float(low))
    if n < 1:
        raise TuneRefused(f"the crossover's lower bound {low} is below one running request: no load at which the "
                          "draft surely pays", fix="keep the draft off (draft.enabled: false)")
    est = cross.get("estimate")
    why = (f"crossover {est} (95 % bracket {low} to {cross.get('ci_high')}); off_above takes the lower bound, "
           f"rounded down")
    return n, why


def set_off_above(text: str, n: int, comment: str) -> str:
    """The seat YAML ``text`` with ``draft.off_above: n`` (replaced, or added as the block's first key)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if _DRAFT.match(ln.rstrip("\n"))), None)
    entry = f"off_above: {n}  # {comment}\n"
    if start is None:
        if any(ln.startswith("draft:") for ln in lines):
            raise UsageError("the seat's draft: block is written inline ({...}); tune edits a block mapping",
                             fix="write draft: as one key per line, then tune again")
        sep = "" if not lines or lines[-1].endswith("\n") else "\n"
        return text + sep + "draft:\n  " + entry
    end, indent = start + 1, None
    while end < len(lines):
        ln = lines[end]
        if ln.strip() and not ln.startswith((" ", "\t")) and not ln.lstrip().startswith("#"):
            break
        m = _KEY.match(ln)
        if m and indent is None:
            indent = m.group(1)
        if m and m.group(1) == indent and m.group(2) == "off_above":
            lines[end] = indent + entry
            return "".join(lines)
        end += 1
    lines.insert(start + 1, (indent or "  ") + entry)
    return "".join(lines)


def tune_draft(report: Path, seat: str, *, dry_run: bool = False) -> DraftTune:
    """Write ``draft.off_above`` into the seat file ``seat`` from the gate report ``report`` (unless ``dry_run``)."""
    rpath, doc = load_report(report)
    path = resolve_seat_path(seat)
    if path.parent.resolve() == builtin_seats_dir().resolve() and not Path(seat).expanduser().exists():
        raise UsageError(f"{seat!r} is a built-in profile: tune writes the seat file it is given",
                         fix=f"copy {path} beside it under a name of yours (its relative paths stay valid) and "
                             "pass that file")
    n, why = policy_from_report(doc)
    text = path.read_text(encoding="utf-8")
    old_spec = parse_spec(text, path=str(path))
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    synthetic = bool(doc.get("synthetic"))
    note = (f"sgl-seat tune draft, {stamp}: crossover lower bound {doc['crossover']['ci_low']} "
            f"({'SYNTHETIC: sim' if synthetic else 'measured'}; {rpath.parent.name})")
    new_text = set_off_above(text, n, note)
    try:
        new_spec: SeatSpec = parse_spec(new_text, path=str(path))
    except SpecError as exc:
        raise SpecError(f"with draft.off_above {n} the seat no longer validates: {exc.message}", path=str(path),
                        fix=exc.fix or "off_above needs draft.algorithm EAGLE or EAGLE3 with topk 1") from None
    if new_spec.draft.off_above != n:  # set_off_above's contract, checked before the write
        raise SpecError(f"the edited seat reads draft.off_above {new_spec.draft.off_above}, not {n}", path=str(path),
                        fix="write off_above under draft: by hand")
    warnings: list[str] = []
    # What the plan says of the policy (a cap it never reaches, ...) it says there; here only how the engine runs it.
    policy, _files = backend_for(new_spec.engine).draft_policy(new_spec, None, new_spec.draft.slots, [])
    src = (doc.get("design") or {}).get("arms_from") or {}
    if src.get("kind") == "seat" and src.get("seat") not in (None, new_spec.name):
        warnings.append(f"the report's battery ran seat {src['seat']!r}, not {new_spec.name!r}: its crossover is that "
                        "seat's")
    if not dry_run:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(new_text, encoding="utf-8")
        os.replace(tmp, path)
    return DraftTune(seat=new_spec.name, path=path, report=rpath, off_above=n, previous=old_spec.draft.off_above,
                     why=why, synthetic=synthetic, policy=policy or {}, written=not dry_run,
                     warnings=tuple(warnings))
