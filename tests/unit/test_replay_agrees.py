"""The replay report agrees with its verdict (sgl_seat.forensics.replay.agree), on the committed bundles.

Each rule on every fixture bundle (real SGLang: a probe stall, a SIGKILL, a SIGSTOP where committed; the sim: a
stall, a crash): a row-fetch stall names its own stalled call's bucket as the cause and nothing else is marked
STALLED; any other verdict names no bucket, marks none STALLED and calls no in-flight fetch "stalled"; a verdict
that names a stopped or exited rank makes it the lagging rank and no line says "a mismatched or lost collective";
the text, the HTML page and the JSON carry the same cause line.
"""

from __future__ import annotations

import html
import io
from pathlib import Path

import pytest
from rich.console import Console

from sgl_seat.core.stats import gather_bucket
from sgl_seat.forensics.replay.agree import WARMUP_CALLS, cause_lines
from sgl_seat.forensics.replay.bundle_html import render_html
from sgl_seat.forensics.replay.bundle_text import render_report
from sgl_seat.forensics.replay.replayer import replay_bundle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"
BUNDLES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def _text(res: object) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=200, color_system=None)
    for part in render_report(res):  # type: ignore[arg-type]
        con.print(part)
    return buf.getvalue()


@pytest.mark.parametrize("name", BUNDLES)
def test_the_report_never_points_past_its_verdict(name: str) -> None:
    res = replay_bundle(FIXTURES / name)
    doc = res.to_json()
    v, rf, div = doc["verdict"], doc["rowfetch"], doc["divergence"]
    assert v is not None
    text, page = _text(res), render_html(res)
    stalled_marks = [b for b in rf["buckets"] + rf.get("graph_buckets", []) if b["cause"]]
    if v["kind"] == "row-fetch stall":
        c = rf["cause_bucket"]
        assert c is not None and c["rank"] == v["rank"]
        call = max((f for f in rf["in_flight_fetches"] if f["rank"] == v["rank"] and f["stalled"]),
                   key=lambda f: f["age_ms"])
        assert (c["gather_size_min"], c["gather_size_max"]) == gather_bucket(call["gather_size"])
        assert len(stalled_marks) == 1 and stalled_marks[0]["gather_size_min"] == c["gather_size_min"]
        assert text.count(" STALLED") == 1
    else:
        assert rf["cause_bucket"] is None and stalled_marks == [] and " STALLED" not in text
        assert not any(f["cause"] for f in rf["in_flight_fetches"])
        assert "stalled:" not in page  # the scatter labels calls in flight, not stalled ones
    if v["kind"] in ("process stopped", "process exited"):
        assert v["rank"] in div["lagging"], div
        assert "mismatched or lost collective" not in div["summary"]
        assert "mismatched or lost collective" not in text and "mismatched or lost collective" not in page
    # one cause line, the same words in the text, the HTML and (through the same function) the JSON's fields
    for line in cause_lines(doc):
        assert " ".join(line.split()) in " ".join(text.split())
        assert html.escape(line) in page


def test_warmup_calls_are_a_processs_first_calls_and_never_the_cause() -> None:
    """GIVEN the committed sim stall bundle with each process's call numbers renumbered from 1 (as if the bundle held
    the process from its start; the committed bundles are trimmed to their last minutes) WHEN the warm-up calls are
    taken THEN they are the first WARMUP_CALLS calls per (process, target), with their latency; with the real
    numbering (the process's first call not in the bundle) there are none; the cause stays the stalled call's."""
    import numpy as np

    from sgl_seat.forensics.format.bundle import read_bundle
    from sgl_seat.forensics.replay.agree import _warmup

    bundle = read_bundle(FIXTURES / "stall")
    trig = bundle.manifest.trigger_t
    assert _warmup(bundle, trig)["calls"] == 0
    pt = bundle.probes
    pids = np.array([g.pid for g in pt.groups], np.int64)[pt.group]
    seq = pt.seq.copy()
    for p in np.unique(pids).tolist():
        seq[pids == p] -= seq[pids == p].min() - 1
    pt.seq = seq
    w = _warmup(bundle, trig)
    per = {(g.pid, g.target) for g in pt.groups}
    assert w["calls"] == WARMUP_CALLS * len(per) and w["per_target"] == WARMUP_CALLS
    firsts = {(d["pid"], d["target"], d["seq"]) for d in w["listed"]}
    for pid, target, s in firsts:
        rows = [int(seq[i]) for i in range(len(pt)) if pt.groups[int(pt.group[i])].pid == pid
                and pt.groups[int(pt.group[i])].target == target]
        assert s in sorted(rows)[:WARMUP_CALLS]
    assert w["max_ms"] == max(d["ms"] for d in w["listed"])
    assert replay_bundle(FIXTURES / "stall").to_json()["rowfetch"]["cause_bucket"]["rank"] == 3
