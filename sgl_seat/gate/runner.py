"""Running the battery: slots in ABBA order, each cell written to disk as it completes, ``--resume`` by cell.

Why per-cell files: a real battery runs for hours (every slot restarts a multi-node seat). A battery directory
holds ``battery.json`` (the workloads, arms and schedule it was started with; a resume reads them from here, so
a resumed battery is the same battery) and ``cells/<slot>/<cell>.json``, each written atomically (temp file and
rename) when its cell ends. Resuming skips every cell whose file exists; a slot with cells missing is brought up
again and only its missing cells run (cold cells first, as the restart makes them meaningful again).

Progress goes to a callback per slot and cell with an estimate of the time left (mean slot time so far times
the slots left).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sgl_seat.errors import UsageError
from sgl_seat.forensics.format.store import bundles_in
from sgl_seat.gate import engine_counters
from sgl_seat.gate.arms import Arms, ArmSession
from sgl_seat.gate.client import Sampling, closed_loop
from sgl_seat.gate.design import COLD_CELLS, Slot, cell_names, schedule
from sgl_seat.gate.workloads import Battery, prompt_words, sweep_prompt

__all__ = ["BatteryDir", "Progress", "run_battery"]

SCHEMA_VERSION = 2  # 2: cell counters keyed by meaning (engine_counters.COUNTERS), not by SGLang metric name


@dataclass(frozen=True, slots=True)
class Progress:
    done_slots: int
    total_slots: int
    slot: str
    cell: str
    eta_s: float | None
    note: str = ""


class BatteryDir:
    """The on-disk battery: its plan and its finished cells."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def plan_path(self) -> Path:
        return self.root / "battery.json"

    def cell_path(self, slot: Slot, cell: str) -> Path:
        return self.root / "cells" / slot.key / f"{cell}.json"

    def write_json(self, path: Path, doc: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def read_plan(self) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads(self.plan_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"{self.plan_path}: not a battery directory ({exc})",
                             fix="pass a directory an earlier `sgl-seat gate` wrote (it holds battery.json)") from None
        major = int(str(doc.get("schema_version", "0")).split(".")[0])
        if major != SCHEMA_VERSION:
            raise UsageError(f"{self.plan_path}: battery schema_version {doc.get('schema_version')}; this sgl-seat "
                             f"reads {SCHEMA_VERSION}", fix="resume it with the sgl-seat version that started it")
        return doc

    def cell(self, slot: Slot, cell: str) -> dict[str, Any] | None:
        path = self.cell_path(slot, cell)
        if not path.is_file():
            return None
        doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return doc

    def cells(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every finished cell: (slot key, cell name) -> its document."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        base = self.root / "cells"
        if base.is_dir():
            for f in sorted(base.glob("*/*.json")):
                out[(f.parent.name, f.stem)] = json.loads(f.read_text(encoding="utf-8"))
        return out


def _bundle_ids(d: Path | None) -> list[str] | None:
    if d is None:
        return None
    return sorted(b.bundle_id for b in bundles_in(d))


def _counter_delta(endpoint: str, fn: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], dict[str, float]]:
    before = engine_counters.counters(endpoint)
    data = fn()
    return data, engine_counters.counters(endpoint).delta(before)


class _SlotRun:
    """The cells of one slot on one live arm."""

    def __init__(self, b: Battery, slot: Slot, s: ArmSession, timeout: float) -> None:
        self.b, self.slot, self.s, self.timeout = b, slot, s, timeout
        # Sweep and prefix prompts differ per repetition and arm (same lengths): on a seat that is not restarted
        # between slots, one arm's requests must not warm the cache for the next. Greedy and cold prompts are the
        # same everywhere (identity is compared across arms; cold cells run right after a restart).
        self.tag = f"r{slot.rep}-{slot.arm}"

    def engine(self) -> dict[str, Any]:
        info = engine_counters.engine_info(self.s.endpoint)
        return {"info": info.to_json(), "up_s": self.s.up_s, "cold": self.s.cold, "starts": self.s.starts,
                "failed_start": self.s.failed_start,
                "bundles_before": _bundle_ids(self.s.bundles_dir)}

    def cold_ttft(self) -> dict[str, Any]:
        c = self.b.cold_ttft
        prompt = prompt_words(self.b.seed, c.prompt_tokens, tag="cold")
        run = closed_loop(self.s.endpoint, self.s.model, [prompt], concurrency=1, max_tokens=c.max_tokens,
                          timeout=self.timeout)
        r = run.results[0]
        return {"ok": r.ok, "error": r.error, "ttft_s": r.ttft_s, "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens}

    def greedy(self) -> dict[str, Any]:
        g = self.b.greedy
        prompts = [prompt_words(self.b.seed, g.prompt_tokens, tag=f"greedy{i}") for i in range(g.prompts)]
        run = closed_loop(self.s.endpoint, self.s.model, prompts, concurrency=1, max_tokens=g.max_tokens,
                          timeout=self.timeout)
        return {**run.summary(), "after_restart": self.s.cold,
                "texts": [r.text if r.ok else None for r in run.results]}

    def sweep(self, c: int) -> dict[str, Any]:
        w = self.b.sweep
        prompts = [sweep_prompt(w.style, self.b.seed, w.prompt_tokens, tag=f"{self.tag}-sweep{c}-{i}")
                   for i in range(c * w.requests_per_client)]
        data, delta = _counter_delta(self.s.endpoint, lambda: closed_loop(
            self.s.endpoint, self.s.model, prompts, concurrency=c, max_tokens=w.max_tokens,
            timeout=self.timeout, sampling=Sampling(w.temperature, w.ignore_eos)).summary())
        return {**data, "counters": delta}

    def prefix(self) -> dict[str, Any]:
        p = self.b.prefix
        prompts = []
        for g in range(p.groups):
            system = prompt_words(self.b.seed, p.system_tokens, tag=f"{self.tag}-sys{g}")
            for j in range(p.prompts_per_group):
                prompts.append(system + " " + prompt_words(self.b.seed, p.question_tokens, tag=f"{self.tag}-q{g}-{j}"))
        passes = []
        for _ in range(p.passes):
            data, delta = _counter_delta(self.s.endpoint, lambda: closed_loop(
                self.s.endpoint, self.s.model, prompts, concurrency=p.concurrency, max_tokens=p.max_tokens,
                timeout=self.timeout).summary())
            prompt_t, cached = delta["prompt_tokens"], delta["cached_tokens"]
            passes.append({"failed": data["failed"], "prompt_tokens": prompt_t, "cached_tokens": cached,
                           "hit_rate": cached / prompt_t if prompt_t else None})

        def rate(ps: list[dict[str, Any]]) -> float | None:
            pt = sum(x["prompt_tokens"] for x in ps)
            return sum(x["cached_tokens"] for x in ps) / pt if pt else None

        return {"passes": passes, "hit_rate_cold": rate(passes[:1]), "hit_rate_warm": rate(passes[1:]),
                "hit_rate_all": rate(passes)}

    def hangs(self, before: list[str] | None) -> dict[str, Any]:
        after = _bundle_ids(self.s.bundles_dir)
        if after is None or before is None:
            return {"measured": False, "reason": "no watchdog bundles directory for this arm"}
        new = sorted(set(after) - set(before))
        return {"measured": True, "count": len(new), "bundles": new}

    def run(self, cell: str, engine_doc: dict[str, Any] | None) -> dict[str, Any]:
        if cell in COLD_CELLS and not self.s.cold:
            return {"measured": False, "reason": "a running seat was given: no restart, so no cold measurement"}
        if cell == "engine":
            return self.engine()
        if cell == "cold_ttft":
            return self.cold_ttft()
        if cell == "greedy":
            return self.greedy()
        if cell.startswith("sweep_c"):
            return self.sweep(int(cell.removeprefix("sweep_c")))
        if cell == "prefix":
            return self.prefix()
        if cell == "hangs":
            return self.hangs(None if engine_doc is None else engine_doc["data"].get("bundles_before"))
        raise ValueError(f"unknown cell {cell}")


def start_battery(root: Path, battery: Battery, arms: list[str], describe: dict[str, Any],
                  note: str | None = None) -> BatteryDir:
    """Create a new battery directory (refused if one is already there: resume it instead)."""
    bd = BatteryDir(root)
    if bd.plan_path.exists():
        raise UsageError(f"{root} already holds a battery",
                         fix=f"resume it with --resume {root}, or pick another --out")
    bd.write_json(bd.plan_path, {
        "schema_version": f"{SCHEMA_VERSION}.0", "created": time.time(), "arms": arms,
        "battery": battery.model_dump(mode="json"),
        "slots": [s.key for s in schedule(arms, battery.runs)], "arms_from": describe, "note": note,
    })
    return bd


def run_battery(bd: BatteryDir, arms_impl: Arms, *, progress: Callable[[Progress], None] = lambda _p: None,
                request_timeout: float = 300.0) -> None:
    """Run every slot's missing cells in schedule order; each cell is on disk when it returns."""
    plan = bd.read_plan()
    battery = Battery.model_validate(plan["battery"])
    slots = schedule(plan["arms"], battery.runs)
    names = cell_names(battery.levels())
    todo = [s for s in slots if any(bd.cell(s, c) is None for c in names)]
    done0 = len(slots) - len(todo)
    spent: list[float] = []
    try:
        for i, slot in enumerate(todo):
            t0 = time.monotonic()
            eta = (sum(spent) / len(spent)) * (len(todo) - i) if spent else None
            progress(Progress(done0 + i, len(slots), slot.key, "up", eta))
            session = arms_impl.start(slot.arm)
            try:
                runner = _SlotRun(battery, slot, session, request_timeout)
                engine_doc = bd.cell(slot, "engine")
                if engine_doc is not None and session.cold:  # a restarted slot: a fresh bundle baseline
                    engine_doc = None
                for cell in names:
                    if cell != "engine" and bd.cell(slot, cell) is not None:
                        continue
                    progress(Progress(done0 + i, len(slots), slot.key, cell, eta))
                    t1 = time.monotonic()
                    data = runner.run(cell, engine_doc)
                    doc = {"schema_version": f"{SCHEMA_VERSION}.0", "slot": slot.key, "arm": slot.arm,
                           "rep": slot.rep, "position": slot.position, "cell": cell, "data": data,
                           "seconds": round(time.monotonic() - t1, 3), "finished": time.time()}
                    if cell == "engine":
                        engine_doc = doc
                    bd.write_json(bd.cell_path(slot, cell), doc)
            finally:
                arms_impl.stop(session)
            spent.append(time.monotonic() - t0)
        progress(Progress(len(slots), len(slots), "", "done", 0.0))
    finally:
        arms_impl.close()
