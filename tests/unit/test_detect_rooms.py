"""The detector registry (``sgl_seat.core.detect.DETECTORS``) is what the rest of the house knows of its detectors.

Why: a detector's kind is also spelled in ``VerdictKind``, the bundle schema's enum and the runbook's verdict table, and
the thresholds it reads are the seat's ``watchdog:`` keys (``watchdog/thresholds.yaml``, pinned to ``WatchdogSpec`` by
``test_watchdog_config.py``). Before the registry nothing tied them together, so a new detector could ship a verdict
that every bundle reader refused or that no operator was told what to do with. Each check here says what is missing
and where it goes; the tests at the bottom show each can fail.

GIVEN the registry, WHEN it is compared with the kinds, the schema, the runbook and what each detector reads and
writes on the committed bundles, THEN they agree.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from sgl_seat.core import detect as d
from sgl_seat.core.detect import Detector
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import LogLine, VerdictKind
from sgl_seat.engines import words_for
from sgl_seat.forensics.format.bundle import read_bundle
from sgl_seat.forensics.replay.redetect import observation_of, thresholds_of
from sgl_seat.spec import WatchdogSpec

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "forensics" / "bundle.schema.json"
RUNBOOK = ROOT / "runbooks" / "watchdog-fired.md"
VERDICT_TABLE = "## 5. Decide by verdict"
FIXTURES = ROOT / "tests" / "fixtures" / "bundles"
THRESHOLDS = ROOT / "watchdog" / "thresholds.yaml"

WORDS = words_for("sglang")


def schema_kinds() -> list[str]:
    return list(json.loads(SCHEMA.read_text())["$defs"]["verdict"]["properties"]["kind"]["enum"])


def watchdog_fields() -> set[str]:
    """The ``watchdog:`` keys both the code and the shipped defaults file know."""
    return set(yaml.safe_load(THRESHOLDS.read_text())["watchdog"]) & set(WatchdogSpec.model_fields)


def runbook_kinds(text: str) -> list[str]:
    """The kinds the runbook's verdict table names: every backticked word in its rows' first cells."""
    section = text.split(VERDICT_TABLE, 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    return [k for ln in rows for k in re.findall(r"`([^`]+)`", ln.split("|")[1])]


def registry_gaps(detectors: Sequence[Detector], node_kinds: Iterable[VerdictKind], *, kinds: Iterable[VerdictKind],
                  schema: Iterable[str], runbook: Iterable[str], fields: Iterable[str]) -> list[str]:
    """What does not agree with the registry, one line each naming the file to change; empty when all agree."""
    out: list[str] = []
    made = [x.kind for x in detectors] + list(node_kinds)
    dup = sorted({k.value for k in made if made.count(k) > 1})
    if dup:
        out.append(f"kinds made twice (one detector per kind): {dup}")
    prios = [x.priority for x in detectors]
    if len(set(prios)) != len(prios) or prios != sorted(prios):
        out.append(f"priorities must be distinct and DETECTORS in their order: {prios}")
    for k in sorted(set(kinds) - set(made), key=lambda k: k.value):
        out.append(f"VerdictKind {k.value!r} has no registered detector (core/detect/__init__.py: DETECTORS) "
                   "and is not a node kind (NODE_KINDS)")
    values = {k.value for k in made}
    schema, runbook = set(schema), set(runbook)
    for v in sorted(values - schema):
        out.append(f"{v!r} is missing from forensics/bundle.schema.json's verdict kind enum (bump its minor version)")
    for v in sorted(schema - values):
        out.append(f"the bundle schema's verdict enum has {v!r}, which nothing registered makes")
    for v in sorted(values - runbook):
        out.append(f"{v!r} has no row in runbooks/watchdog-fired.md's table '{VERDICT_TABLE[3:]}'")
    for v in sorted(runbook - values):
        out.append(f"runbooks/watchdog-fired.md's verdict table names {v!r}, which nothing registered makes")
    known = set(fields)
    for x in detectors:
        for t in sorted(set(x.thresholds) - known):
            out.append(f"{x.kind.value}: threshold {t!r} is not a watchdog field (spec.py WatchdogSpec, "
                       "watchdog/thresholds.yaml)")
    return out


def test_every_detector_module_is_registered() -> None:
    """A module of the package that defines a ``DETECTOR`` and is left out of the tuple would never run."""
    registered = {id(x) for x in d.DETECTORS}
    rooms = [m.name for m in pkgutil.iter_modules(d.__path__)]
    defined = {name: getattr(importlib.import_module(f"{d.__name__}.{name}"), "DETECTOR", None) for name in rooms}
    unregistered = [n for n, x in defined.items() if x is not None and id(x) not in registered]
    assert unregistered == [], f"add their DETECTOR to DETECTORS in core/detect/__init__.py: {unregistered}"
    assert len([x for x in defined.values() if x is not None]) == len(d.DETECTORS) == 6


def test_kinds_schema_runbook_and_thresholds_agree_with_the_registry() -> None:
    gaps = registry_gaps(d.DETECTORS, d.NODE_KINDS, kinds=VerdictKind, schema=schema_kinds(),
                         runbook=runbook_kinds(RUNBOOK.read_text()), fields=watchdog_fields())
    assert gaps == []


def test_the_registry_keeps_todays_order() -> None:
    """The order is behaviour: the first detector to fire is the verdict (every committed bundle replays to it)."""
    assert [x.kind.value for x in d.DETECTORS] == ["process exited", "process stopped", "row-fetch stall",
                                                   "stack unchanged", "engine watchdog", "no progress"]


# -- what each detector reads and writes, on the committed bundles ------------------------------------------------


class _Reads:
    """The thresholds, recording which fields a detector reads (directly or through its helpers)."""

    def __init__(self, th: WatchdogSpec) -> None:
        self._th = th
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._th, name)


def _cases() -> list[tuple[str, Observation, WatchdogSpec, float]]:
    """(name, observation, thresholds, now): each committed bundle at its verdict and at earlier sample times, and a
    line of SGLang's own watchdog (no committed bundle has one)."""
    out = []
    for root in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        b = read_bundle(root)
        obs, th = observation_of(b), thresholds_of(b)
        assert b.manifest.verdict is not None
        end = b.manifest.verdict.t
        ts = sorted({s.t for s in b.stacks if s.t <= end})
        # Later too, and with tighter thresholds: so that every detector fires on some case, not only the verdict's.
        tight = th.model_copy(update={"no_progress_s": 1.0, "stack_unchanged_samples": 3})
        for now in [*ts[-40::4], end, end + 1.0, end + 10.0]:
            out += [(root.name, obs, th, now), (f"{root.name} (tighter)", obs, tight, now)]
    line = LogLine(t=1.0, node=1, text="[2026-11-29 10:00:00 TP2 EP2] Scheduler watchdog timeout (300 s)")
    out.append(("engine watchdog line", Observation.of(words=WORDS, logs=[line]), WatchdogSpec(), 2.0))
    return out


@pytest.fixture(scope="module")
def cases() -> list[tuple[str, Observation, WatchdogSpec, float]]:
    return _cases()


def reads_of(det: Detector, cases: Sequence[tuple[str, Observation, WatchdogSpec, float]]) -> set[str]:
    seen: set[str] = set()
    for _, obs, th, now in cases:
        rec = _Reads(th)
        det.run(obs, cast(WatchdogSpec, rec), now)
        seen |= rec.read
    return seen


def evidence_misfits(det: Detector, cases: Sequence[tuple[str, Observation, WatchdogSpec, float]]) -> list[str]:
    """First evidence lines of ``det``'s verdicts that its declared shape does not match; raises if it never fired."""
    fired, bad = 0, []
    for name, obs, th, now in cases:
        v = det.run(obs, th, now)
        if v is None:
            continue
        fired += 1
        assert v.kind is det.kind, (name, v.kind, det.kind)
        if not v.evidence or re.match(det.evidence, v.evidence[0]) is None:
            bad.append(f"{name} at {now}: {v.evidence[:1]}")
    assert fired, f"{det.kind.value} fired on no case: give it one here (a committed bundle or a line above)"
    return bad


@pytest.mark.parametrize("det", d.DETECTORS, ids=lambda x: x.kind.value)
def test_a_detector_reads_the_thresholds_it_declares(det: Detector,
                                                      cases: list[tuple[str, Observation, WatchdogSpec, float]],
                                                      ) -> None:
    """Only those (some it reads only on a path these cases do not take: ``engine_timeout_s`` once a long forward is
    seen), so the thresholds a bundle records and replay reuses are the ones its verdict depended on."""
    assert reads_of(det, cases) <= set(det.thresholds)


@pytest.mark.parametrize("det", d.DETECTORS, ids=lambda x: x.kind.value)
def test_a_detector_writes_the_evidence_it_declares(det: Detector,
                                                     cases: list[tuple[str, Observation, WatchdogSpec, float]],
                                                     ) -> None:
    assert evidence_misfits(det, cases) == []


# -- each check can fail ---------------------------------------------------------------------------------------------


def _gaps_without(drop: VerdictKind) -> list[str]:
    kept = tuple(x for x in d.DETECTORS if x.kind is not drop)
    return registry_gaps(kept, d.NODE_KINDS, kinds=VerdictKind, schema=schema_kinds(),
                         runbook=runbook_kinds(RUNBOOK.read_text()), fields=watchdog_fields())


def test_a_kind_without_its_detector_is_named() -> None:
    gaps = _gaps_without(VerdictKind.ENGINE_WATCHDOG)
    assert "VerdictKind 'engine watchdog' has no registered detector (core/detect/__init__.py: DETECTORS) and is not " \
           "a node kind (NODE_KINDS)" in gaps
    assert "the bundle schema's verdict enum has 'engine watchdog', which nothing registered makes" in gaps


def test_a_detector_missing_from_the_schema_and_the_runbook_is_named() -> None:
    gaps = registry_gaps(d.DETECTORS, d.NODE_KINDS, kinds=VerdictKind,
                         schema=[k for k in schema_kinds() if k != "process stopped"],
                         runbook=[k for k in runbook_kinds(RUNBOOK.read_text()) if k != "process stopped"],
                         fields=watchdog_fields())
    assert gaps == [
        "'process stopped' is missing from forensics/bundle.schema.json's verdict kind enum (bump its minor version)",
        "'process stopped' has no row in runbooks/watchdog-fired.md's table '5. Decide by verdict'",
    ]


def test_disorder_a_double_kind_and_an_unknown_threshold_are_named() -> None:
    stopped = d.DETECTORS[1]
    twin = dataclasses.replace(stopped, priority=0, thresholds=("stopped_for_s",))
    gaps = registry_gaps((*d.DETECTORS, twin), d.NODE_KINDS, kinds=VerdictKind, schema=schema_kinds(),
                         runbook=runbook_kinds(RUNBOOK.read_text()), fields=watchdog_fields())
    assert gaps == ["kinds made twice (one detector per kind): ['process stopped']",
                    "priorities must be distinct and DETECTORS in their order: [1, 2, 3, 4, 5, 6, 0]",
                    "process stopped: threshold 'stopped_for_s' is not a watchdog field (spec.py WatchdogSpec, "
                    "watchdog/thresholds.yaml)"]


def test_an_undeclared_read_and_a_wrong_evidence_shape_are_seen(
        cases: list[tuple[str, Observation, WatchdogSpec, float]]) -> None:
    stopped = next(x for x in d.DETECTORS if x.kind is VerdictKind.PROCESS_STOPPED)
    assert reads_of(dataclasses.replace(stopped, thresholds=()), cases) == {"sample_hz", "stopped_s"}
    assert evidence_misfits(dataclasses.replace(stopped, evidence=r"pid \d+ stopped"), cases)


def test_the_runbook_table_is_read_as_an_operator_reads_it() -> None:
    text = (f"{VERDICT_TABLE}\n\n| Verdict | Go to |\n|---|---|\n| `a`, `b` | step `6` |\n| `c` | x |\n\n"
            "## 6. Next\n| `d` |")
    assert runbook_kinds(text) == ["a", "b", "c"]
