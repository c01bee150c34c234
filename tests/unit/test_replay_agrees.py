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


# ---- issue 49: every line of the HTML agrees with the verdict ------------------------------------------------------
#
# Each rule runs over the HTML page of every committed bundle, and of each one again with thresholds learned from its
# own healthy calls written into its manifest (what a seat's bundle carries today: the committed ones predate it).

import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402

from sgl_seat.core.columns import ProbeColumns  # noqa: E402
from sgl_seat.core.detect import thresholds_from  # noqa: E402
from sgl_seat.core.learned import Learner  # noqa: E402
from sgl_seat.forensics.replay.replayer import ReplayResult  # noqa: E402
from sgl_seat.spec import WatchdogSpec  # noqa: E402

VARIANTS = [(n, False) for n in BUNDLES] + [(n, True) for n in BUNDLES]


def _learned_copy(name: str, dest: Path) -> Path:
    """The committed bundle with the thresholds its own completed calls teach (10 calls a shape) in its manifest."""
    from sgl_seat.forensics.format.bundle import read_bundle

    path = shutil.copytree(FIXTURES / name, dest / name)
    pt = read_bundle(path).probes
    lr = Learner(WatchdogSpec(learn_min_samples=10))
    lr.observe([pt.record(i) for i in range(len(pt)) if pt.record(i).end is not None])
    doc = json.loads((path / "manifest.json").read_text())
    doc["learned"] = lr.thresholds().to_json()
    (path / "manifest.json").write_text(json.dumps(doc))
    return path


def _replay(name: str, learned: bool, tmp_path: Path) -> tuple[ReplayResult, str]:
    res = replay_bundle(_learned_copy(name, tmp_path) if learned else FIXTURES / name)
    return res, render_html(res)


def _section(page: str, heading: str) -> str:
    """The HTML from ``<h2>heading`` to the next ``<h2>``."""
    start = page.index(f"<h2>{heading}")
    end = page.find("<h2>", start + 4)
    return page[start:end if end > 0 else len(page)]


def _paragraphs(part: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", p)) for p in re.findall(r"<p>(.*?)</p>", part, re.S)]


_IN_FLIGHT = re.compile(r"in flight for ([\d.]+)s on rank (\d+)\b[^;]*; threshold ([\d.]+)s(?: \((\w+))?")


@pytest.mark.parametrize(("name", "learned"), VARIANTS)
def test_the_threshold_and_the_age_of_each_call_are_the_verdicts(name: str, learned: bool, tmp_path: Path) -> None:
    """One threshold source, one age (both named): the row-fetch heading states the fixed threshold the detectors
    use (labelled so, and the learned ones where the bundle has them), and every call the verdict times ("in flight
    for Xs on rank R ... threshold Ys") is shown with that age at the verdict and that threshold."""
    res, page = _replay(name, learned, tmp_path)
    part = _section(page, "Row-fetch latency")
    paras = _paragraphs(part)
    fixed = thresholds_from(res.bundle.manifest.thresholds).rowfetch_inflight_s
    assert f"fixed stall threshold {fixed:g} s" in paras[0]
    assert ("learned" in paras[0]) is bool(learned and res.bundle.manifest.extra.get("learned", {}).get("shapes"))
    assert re.search(r"threshold [\d.]+ s\)", paras[0]) is None  # no unlabelled figure
    v = res.verdict
    assert v is not None
    timed = [m for e in v.evidence for m in [_IN_FLIGHT.search(e)] if m]
    for m in timed:
        age, rank, th, how = m.groups()
        lines = [p for p in paras if p.startswith("in flight") and f"rank {rank} " in p]
        assert any(f"{age} s at the verdict" in p and f"threshold {th} s" in p for p in lines), (m.group(0), lines)
        if how == "learned":
            assert any(f"threshold {th} s (learned" in p for p in lines)
    for p in paras:  # every age is named: at the trigger or at the verdict
        for m in re.finditer(r"([\d.]+) s (at|when)", p):
            assert p[m.end():].startswith((" the trigger", " the verdict")), p


def _rects(page: str) -> dict[int, list[tuple[str, float, float]]]:
    """Per rank, the timeline's rectangles: (state, start s, end s), from their titles."""
    svg = page[page.index('<svg id="plot-timeline"'):]
    svg = svg[:svg.index("</svg>")]
    out: dict[int, list[tuple[str, float, float]]] = {}
    for rank, state, a, b in re.findall(r"<title>rank (\d+): (\S+) .*?\(([-\d.e]+) s to ([-\d.e]+) s", svg):
        out.setdefault(int(rank), []).append((state, float(a), float(b)))
    return out


@pytest.mark.parametrize("name", BUNDLES)
def test_stopped_and_exited_ranks_are_drawn_so_and_the_legend_names_every_state(name: str) -> None:
    res = replay_bundle(FIXTURES / name)
    page = render_html(res)
    rects = _rects(page)
    legend = page[page.index('<div class="legend">', page.index('id="plot-timeline"')):]
    legend = legend[:legend.index("</div>")]
    for state in {s for rs in rects.values() for s, _, _ in rs}:
        assert f"data-state=\"{state}\"" in legend, state
    v = res.verdict
    assert v is not None
    named = {"process stopped": "stopped", "process exited": "exited"}.get(v.kind.value)
    if named is not None and v.rank in rects:
        at_trigger = [s for s, a, b in rects[v.rank] if a <= 0.0 < b] or [rects[v.rank][-1][0]]
        assert at_trigger == [named], rects[v.rank]
        assert max(b for _, _, b in rects[v.rank]) >= 0.0  # drawn up to the trigger
    for r, rs in rects.items():  # a failed stack sample is no fault: "error" is never drawn
        assert all(s != "error" for s, _, _ in rs), (r, rs)


@pytest.mark.parametrize("name", BUNDLES)
def test_only_the_verdicts_own_call_is_drawn_red(name: str) -> None:
    res = replay_bundle(FIXTURES / name)
    page = render_html(res)
    svg = page[page.index('<svg id="plot-rowfetch"'):]
    svg = svg[:svg.index("</svg>")]
    red = len(re.findall(r'<circle [^>]*fill="#d62728"', svg))
    causes = sum(1 for f in res.to_json()["rowfetch"]["in_flight_fetches"] if f["cause"])
    assert red == causes


def _latency_ms(pt: ProbeColumns, i: int, now: float) -> float:
    r = pt.record(i)
    return max(0.0, ((now if r.end is None else r.end) - r.start) * 1000.0)


@pytest.mark.parametrize("name", BUNDLES)
def test_warm_up_calls_are_kept_out_of_the_bucket_statistics(name: str, tmp_path: Path) -> None:
    """Each bucket's count and max are those of its calls less the completed warm-up calls (listed apart), and the
    HTML table says how many it set apart. Checked from the records (eager calls; the committed bundles hold no
    graph replays)."""
    from sgl_seat.forensics.replay.analysis import warmup_rows

    res = replay_bundle(FIXTURES / name)
    doc, page = res.to_json(), render_html(res)
    pt, now = res.bundle.probes, res.analysis.trigger_t
    warm = warmup_rows(pt)
    rf = doc["rowfetch"]
    assert sum(b["count"] for b in rf["buckets"]) + sum(b["warmup"] for b in rf["buckets"]) == len(pt)
    for b in rf["buckets"]:
        rows = [i for i in range(len(pt)) if b["gather_size_min"] <= int(pt.gather_size[i]) <= b["gather_size_max"]]
        kept = [i for i in rows if not (warm[i] and pt.record(i).end is not None)]
        assert b["count"] == len(kept) and b["warmup"] == len(rows) - len(kept)
        assert b["max_ms"] == pytest.approx(max(_latency_ms(pt, i, now) for i in kept), abs=1e-3)
    if any(b["warmup"] for b in rf["buckets"]):
        assert "<th>warm-up calls (apart)</th>" in _section(page, "Row-fetch latency")


@pytest.mark.parametrize("name", BUNDLES)
def test_no_idle_thread_is_listed_as_stuck(name: str) -> None:
    """A thread that is no scheduler rank's and that py-spy saw idle in every one of its unchanged samples (a
    launcher waiting on its children, an event loop) waits for work: it is not "stuck"."""
    res = replay_bundle(FIXTURES / name)
    page = render_html(res)
    for s in res.to_json()["stuck"]:
        if s["rank"] is None:
            active = [th.active for x in res.bundle.stacks if x.pid == s["pid"] and x.node == s["node"]
                      for th in x.threads if th.thread_id == s["thread_id"]]
            assert any(active[-s["samples"]:]), s
    assert "stuck" in page


@pytest.mark.parametrize("name", BUNDLES)
def test_every_figure_before_the_trigger_says_what_it_is(name: str) -> None:
    res = replay_bundle(FIXTURES / name)
    page, text = render_html(res), _text(res)
    last = res.to_json()["activity"]["last_token_progress_s"]
    assert "last token progress (s)" not in page
    if last is not None:
        for out in (html.unescape(page), " ".join(text.split())):
            assert f"tokens last grew {abs(last):g} s {'before' if last <= 0 else 'after'} the trigger" in out


def _boxes(svg: str) -> list[tuple[float, float, float, float, str]]:
    """Each plain text element's box (11 px font, 6.2 px a character), from its x, y and anchor."""
    out = []
    for attrs, body in re.findall(r"<text ([^>]*)>(.*?)</text>", svg):
        if "transform" in attrs:
            continue
        x, y = float(re.search(r'\bx="([-\d.]+)"', attrs)[1]), float(re.search(r'\by="([-\d.]+)"', attrs)[1])  # type: ignore[index]
        w = 6.2 * len(html.unescape(re.sub(r"<[^>]+>", "", body)))
        x0 = x - w if 'text-anchor="end"' in attrs else x - w / 2 if 'text-anchor="middle"' in attrs else x
        out.append((x0, y - 10, x0 + w, y + 2, body))
    return out


@pytest.mark.parametrize("name", BUNDLES)
def test_no_label_of_the_latency_plot_overlaps_another(name: str) -> None:
    page = render_html(replay_bundle(FIXTURES / name))
    svg = page[page.index('<svg id="plot-rowfetch"'):]
    boxes = _boxes(svg[:svg.index("</svg>")])
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a[4], b[4])


@pytest.mark.parametrize("name", BUNDLES)
def test_the_text_report_piped_cuts_no_line(name: str) -> None:
    """Piped (not a terminal), the report is printed as wide as its lines: no evidence or frame is cut at 80."""
    from sgl_seat.forensics.replay.bundle_text import print_report

    res = replay_bundle(FIXTURES / name)
    buf = io.StringIO()
    print_report(res, Console(file=buf, width=80, color_system=None))
    out = buf.getvalue()
    assert "…" not in out
    assert res.verdict is not None
    for e in res.verdict.evidence:
        assert e in out, e


def test_the_demo_summary_names_the_fault_it_sent_and_the_waiting_ranks_in_words() -> None:
    from sgl_seat.launch.demo.run import fault_words, waiting_words

    assert fault_words({"fault": "SIGSTOP", "rank": 1}) == "the SIGSTOP of rank 1's scheduler"
    assert fault_words({"fault": "rowfetch-stall:rank=3", "rank": 3}) == "the stall on rank 3"
    assert waiting_words([0]) == "rank 0 waits in a collective"
    assert waiting_words([0, 1, 2]) == "ranks 0, 1, 2 wait in a collective"
    assert waiting_words([]) == "no rank waits in a collective"
