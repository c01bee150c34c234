"""The HTML report: one self-contained page, plots drawn as inline SVG in Python.

The page is opened on laptops and attached to tickets, often offline, so it loads nothing: no CDN, no
external script or font, a Content-Security-Policy that allows only its own inline style and its one
hashed inline script. Every string from the bundle (frame names, titles, log lines) is untrusted and is
HTML-escaped. The script only marks the page as rendered (``data-replay-rendered="ok"``) once the three
plots exist, which lets a headless browser test prove the page ran without errors.

Plots: row-fetch latency against gather size (log-log, every bucket's p50/p99, the in-flight fetch in red),
each rank's timeline of stack states with the trigger, and throughput and running requests before the hang.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from sgl_seat import __version__
from sgl_seat.core.stats import gather_bucket_label
from sgl_seat.forensics.format.extras import words_of
from sgl_seat.forensics.replay.agree import age_words, cause_lines, progress_words, seconds, threshold_words
from sgl_seat.forensics.replay.analysis import rowfetch_scatter, throughput_series
from sgl_seat.forensics.replay.replayer import ReplayResult

__all__ = ["render_html"]

STATE_COLOR = {"rowfetch": "#d62728", "collective": "#e8a33d", "running": "#2ca02c", "idle": "#c7c7c7",
               "waiting": "#f3d9a4", "stopped": "#1f3b73", "exited": "#7f2a8a", "unread": "#ececec",
               "error": "#9467bd"}
#: What the legend says of a state where its name alone would mislead.
STATE_WORDS = {"unread": "stack not read (a failed sample)", "error": "no stack", "stopped": "stopped (SIGSTOP)",
               "waiting": "waiting for work"}
#: The latency plot's in-flight markers: red only for the verdict's own call; a call that waits on another cause
#: is drawn as waiting (the collectives' colour), never as the fault.
CAUSE_COLOR, WAITING_COLOR = "#d62728", "#e8a33d"

_SCRIPT = """(function () {
  var ids = ["plot-rowfetch", "plot-timeline", "plot-throughput"];
  var ok = ids.every(function (id) {
    var e = document.getElementById(id);
    return e && e.tagName.toLowerCase() === "svg";
  });
  document.documentElement.setAttribute("data-replay-rendered", ok ? "ok" : "missing-plots");
  var m = document.getElementById("render-status");
  if (m) { m.textContent = ok ? "rendered" : "plots missing"; }
})();"""

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, Segoe UI, sans-serif; margin: 24px; color: #222; max-width: 1180px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; } td, th { padding: 3px 10px; border-bottom: 1px solid #eee;
text-align: left; } th { background: #f6f6f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.hot td { background: #fde8e8; font-weight: 600; } .verdict { border: 2px solid #d62728; padding: 10px 14px;
border-radius: 6px; background: #fff7f7; } .kind { color: #d62728; font-weight: 700; font-size: 16px; }
.dim { color: #777; } pre { background: #f7f7f7; padding: 8px; overflow-x: auto; font-size: 12px; }
svg { background: #fff; border: 1px solid #e3e3e3; margin: 6px 0; } svg text { font: 11px sans-serif; fill: #333; }
.legend span { display: inline-block; margin-right: 14px; } .sw { display: inline-block; width: 11px; height: 11px;
margin-right: 4px; vertical-align: -1px; }
"""


def _e(x: Any) -> str:
    return escape("-" if x is None else str(x), quote=True)


def _num(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.3f}".rstrip("0").rstrip(".")
    return f"{x:,}" if isinstance(x, int) else _e(x)


class _Plot:
    """A minimal SVG plot area: linear or log axes, ticks, and primitives in data coordinates."""

    def __init__(self, pid: str, title: str, *, w: int = 1100, h: int = 300, xlog: bool = False,
                 ylog: bool = False, x: tuple[float, float], y: tuple[float, float], xlabel: str, ylabel: str) -> None:
        self.pid, self.title, self.w, self.h = pid, title, w, h
        self.xlog, self.ylog = xlog, ylog
        self.ml, self.mr, self.mt, self.mb = 70, 70, 28, 42
        self.x0, self.x1 = self._t(x[0], xlog), self._t(x[1], xlog)
        self.y0, self.y1 = self._t(y[0], ylog), self._t(y[1], ylog)
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        if self.y1 <= self.y0:
            self.y1 = self.y0 + 1
        self.xlabel, self.ylabel = xlabel, ylabel
        self.parts: list[str] = []

    @staticmethod
    def _t(v: float, log: bool) -> float:
        return math.log10(max(v, 1e-9)) if log else v

    def px(self, x: float) -> float:
        return self.ml + (self._t(x, self.xlog) - self.x0) / (self.x1 - self.x0) * (self.w - self.ml - self.mr)

    def py(self, y: float) -> float:
        t = (self._t(y, self.ylog) - self.y0) / (self.y1 - self.y0)
        return self.h - self.mb - max(0.0, min(1.0, t)) * (self.h - self.mt - self.mb)

    def ticks(self, xt: Sequence[tuple[float, str]], yt: Sequence[tuple[float, str]]) -> None:
        for v, lab in xt:
            x = self.px(v)
            self.parts.append(f'<line x1="{x:.1f}" y1="{self.mt}" x2="{x:.1f}" y2="{self.h - self.mb}" '
                              f'stroke="#eee"/><text x="{x:.1f}" y="{self.h - self.mb + 14}" '
                              f'text-anchor="middle">{_e(lab)}</text>')
        for v, lab in yt:
            y = self.py(v)
            self.parts.append(f'<line x1="{self.ml}" y1="{y:.1f}" x2="{self.w - self.mr}" y2="{y:.1f}" '
                              f'stroke="#eee"/><text x="{self.ml - 6}" y="{y + 4:.1f}" '
                              f'text-anchor="end">{_e(lab)}</text>')

    def svg(self) -> str:
        w, h = self.w, self.h
        frame = (f'<rect x="{self.ml}" y="{self.mt}" width="{w - self.ml - self.mr}" height="{h - self.mt - self.mb}" '
                 f'fill="none" stroke="#999"/>')
        labels = (f'<text x="{w / 2:.0f}" y="16" text-anchor="middle" font-weight="bold">{_e(self.title)}</text>'
                  f'<text x="{w / 2:.0f}" y="{h - 6}" text-anchor="middle">{_e(self.xlabel)}</text>'
                  f'<text transform="translate(14,{h / 2:.0f}) rotate(-90)" text-anchor="middle">'
                  f"{_e(self.ylabel)}</text>")
        return (f'<svg id="{self.pid}" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
                f'viewBox="0 0 {w} {h}" role="img" aria-label="{_e(self.title)}">{frame}{"".join(self.parts)}'
                f"{labels}</svg>")


def _log_ticks(lo: float, hi: float, fmt: Callable[[float], str]) -> list[tuple[float, str]]:
    out = []
    e = math.floor(math.log10(max(lo, 1e-9)))
    while 10.0**e <= hi * 1.0001:
        if 10.0**e >= lo * 0.9999:
            out.append((10.0**e, fmt(10.0**e)))
        e += 1
    return out


def _lin_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    v = math.ceil(lo / step) * step
    out = []
    while v <= hi + 1e-9:
        out.append(round(v, 10))
        v += step
    return out


def _ms(v: float) -> str:
    return f"{v:g} ms" if v >= 1 else f"{v * 1000:g} µs"


def _rowfetch_plot(result: ReplayResult) -> str:
    rf = result.analysis.rowfetch
    pts = rowfetch_scatter(result.bundle, result.analysis.trigger_t)
    if not pts:
        p = _Plot("plot-rowfetch", "row-fetch latency vs gather size: no probe records", x=(1, 2), y=(0.01, 1),
                  xlabel="gather size (rows)", ylabel="latency", h=120)
        return p.svg()
    gmax = max(max(q[0] for q in pts), 2)
    lmin = max(min(max(q[1], 1e-3) for q in pts), 1e-3)
    lmax = max(q[1] for q in pts)
    p = _Plot("plot-rowfetch", "row-fetch latency vs gather size (every fetch; the legend is below)",
              xlog=True, ylog=True, x=(0.8, gmax * 1.25), y=(lmin / 1.5, lmax * 2), xlabel="gather size (rows, log)",
              ylabel="latency (log)", h=360)
    xt = [(float(1 << k), str(1 << k)) for k in range(0, gmax.bit_length() + 1)]
    p.ticks(xt, _log_ticks(lmin / 1.5, lmax * 2, _ms))
    dots, hot = [], []
    causes = {(f["pid"], f["seq"]) for f in rf["in_flight_fetches"] if f.get("cause")}
    v0 = result.verdict
    why = "" if v0 is None else f" (not the cause: the verdict is {v0.kind.value}" + (
        f" on rank {v0.rank})" if v0.rank is not None else ")")
    labelled = False
    # One label, on the verdict's own call (or the oldest call in flight, where none is the cause): inside the plot
    # area, on the side of the point with room, so it never runs into the axes or another label.
    pts.sort(key=lambda q: (not q[2] or (q[4], q[5]) not in causes, -q[1]))
    for g, v, fl, warm, pid, seq in pts:
        x, y = p.px(max(g, 0.8)), p.py(max(v, lmin / 1.5))
        if fl:
            cause = (pid, seq) in causes
            color = CAUSE_COLOR if cause else WAITING_COLOR
            word = "stalled, the verdict's cause" if cause else "in flight" + why
            mark = (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{color}" stroke="#600" stroke-width="1.5">'
                    f"<title>{_e(word)}: gather {g}, {v / 1000:.2f} s at the trigger</title></circle>")
            if not labelled:
                labelled = True
                words = f"{'stalled' if cause else 'in flight'}: {seconds(v / 1000)} at the trigger (gather {g})"
                ty = min(max(y + 4, p.mt + 12), p.h - p.mb - 4)
                mark += ((f'<text x="{x - 9:.1f}" y="{ty:.1f}" text-anchor="end" ' if x > p.w * 0.6
                          else f'<text x="{x + 9:.1f}" y="{ty:.1f}" ') + f'fill="{color}" font-weight="bold">'
                         f"{_e(words)}</text>")
            hot.append(mark)
        elif warm:
            dots.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="none" stroke="#555">'
                        f"<title>warm-up call: gather {g}, {v:,.1f} ms (not in the bucket statistics)</title></circle>")
        else:
            dots.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="1.6" fill="#1f77b4" fill-opacity="0.35"/>')
    p.parts.extend(dots)
    for key, color in (("p50_ms", "#2ca02c"), ("p99_ms", "#ff7f0e")):
        line = []
        for b in rf["buckets"]:
            if not b["count"]:
                continue
            c = math.sqrt(max(b["gather_size_min"], 0.8) * max(b["gather_size_max"], 0.8))
            line.append(f"{p.px(c):.1f},{p.py(max(b[key], lmin / 1.5)):.1f}")
        if line:
            p.parts.append(f'<polyline points="{" ".join(line)}" fill="none" stroke="{color}" stroke-width="2">'
                           f"<title>{key.replace('_ms', '')} by bucket</title></polyline>")
    p.parts.extend(hot)
    return p.svg()


#: Rectangles per rank in the timeline plot: more than the plot has pixels only bloats the page.
TIMELINE_MAX_RECTS = 1000


def _fit_segments(segs: list[dict[str, Any]], p: _Plot, *, max_rects: int) -> list[dict[str, Any]]:
    """Segments narrower than a pixel column merged into that column's dominant state (long histories)."""
    if len(segs) <= max_rects:
        return segs
    lo, hi = segs[0]["start_s"], segs[-1]["end_s"]
    width = (hi - lo) / max_rects or 1.0
    cols: dict[int, dict[str, float]] = {}
    frames: dict[tuple[int, str], str | None] = {}
    for s in segs:
        c = min(max_rects - 1, int((s["start_s"] - lo) / width))
        cols.setdefault(c, {})
        cols[c][s["state"]] = cols[c].get(s["state"], 0.0) + (s["end_s"] - s["start_s"])
        frames.setdefault((c, s["state"]), s["frame"])
    out = []
    for c in sorted(cols):
        state = max(cols[c].items(), key=lambda kv: kv[1])[0]
        out.append({"start_s": round(lo + c * width, 3), "end_s": round(lo + (c + 1) * width, 3), "state": state,
                    "frame": frames[(c, state)], "samples": len(cols[c])})
    return out


def _timeline_plot(result: ReplayResult) -> str:
    tl = result.analysis.timeline
    if not tl:
        return _Plot("plot-timeline", "timeline: no stack samples", x=(0, 1), y=(0, 1), xlabel="s", ylabel="",
                     h=120).svg()
    lo = min(s["start_s"] for r in tl for s in r["segments"])
    hi = max(0.0, max(s["end_s"] for r in tl for s in r["segments"]))
    row_h = 26
    h = 28 + 42 + row_h * len(tl) + 10
    p = _Plot("plot-timeline", "per-rank main-thread state (from the stack history; the trigger at 0 s)",
              x=(lo, hi + max(1.0, (hi - lo) * 0.02)), y=(0, len(tl)), xlabel="seconds relative to the trigger",
              ylabel="", h=h)
    p.ml = 130
    p.ticks([(v, f"{v:g}") for v in _lin_ticks(lo, hi)], [])
    top = p.mt + 6
    for i, r in enumerate(tl):
        y = top + i * row_h
        p.parts.append(f'<text x="{p.ml - 8}" y="{y + row_h / 2 + 2:.1f}" text-anchor="end">rank {r["rank"]} '
                       f'(node {r["node"]})</text>')
        for s in _fit_segments(r["segments"], p, max_rects=TIMELINE_MAX_RECTS):
            x0, x1 = p.px(s["start_s"]), p.px(s["end_s"])
            color = STATE_COLOR.get(s["state"], "#888")
            p.parts.append(f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(1.0, x1 - x0):.1f}" height="{row_h - 6}" '
                           f'fill="{color}" stroke="#bbb" stroke-width="0.5"><title>rank {r["rank"]}: '
                           f'{_e(s["state"])} {_e(s["frame"])} ({s["start_s"]:g} s to {s["end_s"]:g} s, '
                           f'{s["samples"]} samples)</title></rect>')
    x = p.px(0.0)
    p.parts.append(f'<line x1="{x:.1f}" y1="{p.mt}" x2="{x:.1f}" y2="{p.h - p.mb}" stroke="#000" stroke-width="2" '
                   f'stroke-dasharray="4 3"/><text x="{x - 4:.1f}" y="{p.mt - 4}" text-anchor="end">trigger</text>')
    return p.svg()


def _throughput_plot(result: ReplayResult) -> str:
    trig = result.analysis.trigger_t
    w = words_of(result.bundle)
    series = [(t - trig, v) for t, v in throughput_series(result.bundle.metrics, w) if t <= trig + 5]
    running = [(p.t - trig, p.values[w.running]) for p in sorted(result.bundle.metrics, key=lambda p: p.t)
               if w.running in p.values and p.t <= trig + 5]
    if not series and not running:
        return _Plot("plot-throughput", "throughput before the trigger: no metrics", x=(0, 1), y=(0, 1), xlabel="s",
                     ylabel="", h=120).svg()
    xs = [t for t, _ in series + running]
    lo, hi = min(xs), max(max(xs), 0.0)
    ymax = max([v for _, v in series] + [1.0]) * 1.1
    rmax = max([v for _, v in running] + [1.0]) * 1.1
    p = _Plot("plot-throughput", "throughput (tokens/s, blue) and running requests (grey, right axis) before the "
              "trigger", x=(lo, hi + 1), y=(0, ymax), xlabel="seconds relative to the trigger", ylabel="tokens/s")
    p.ticks([(v, f"{v:g}") for v in _lin_ticks(lo, hi)], [(v, f"{v:g}") for v in _lin_ticks(0, ymax, 5)])
    if running:
        pts = " ".join(f"{p.px(t):.1f},{p.h - p.mb - v / rmax * (p.h - p.mt - p.mb):.1f}" for t, v in running)
        p.parts.append(f'<polyline points="{pts}" fill="none" stroke="#999" stroke-width="1.5" '
                       f'stroke-dasharray="3 2"><title>running requests</title></polyline>')
        for v in _lin_ticks(0, rmax, 4):
            y = p.h - p.mb - v / rmax * (p.h - p.mt - p.mb)
            p.parts.append(f'<text x="{p.w - p.mr + 6}" y="{y + 4:.1f}" fill="#777">{v:g}</text>')
    if series:
        pts = " ".join(f"{p.px(t):.1f},{p.py(v):.1f}" for t, v in series)
        p.parts.append(f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2">'
                       f"<title>tokens/s</title></polyline>")
    x = p.px(0.0)
    p.parts.append(f'<line x1="{x:.1f}" y1="{p.mt}" x2="{x:.1f}" y2="{p.h - p.mb}" stroke="#d62728" '
                   f'stroke-width="2" stroke-dasharray="4 3"/><text x="{x - 4:.1f}" y="{p.mt + 12}" '
                   f'text-anchor="end" fill="#d62728">trigger</text>')
    return p.svg()


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], hot: Sequence[bool] = ()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, r in enumerate(rows):
        cls = ' class="hot"' if i < len(hot) and hot[i] else ""
        body.append(f"<tr{cls}>" + "".join(r) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _td(x: Any, num: bool = False) -> str:
    return f'<td class="num">{_num(x)}</td>' if num else f"<td>{_e(x)}</td>"


def _threshold_heading(rf: dict[str, Any]) -> str:
    """The thresholds the calls were judged by, each labelled: the fixed one, and the learned ones where the bundle
    carries them (the detectors' own, ``redetect.thresholds_of`` and the manifest's ``learned``)."""
    th = rf.get("thresholds") or {"fixed_s": rf["stall_threshold_ms"] / 1000.0, "learned_shapes": 0}
    out = f"fixed stall threshold {th['fixed_s']:g} s"
    if th.get("learned_shapes"):
        lo, hi = seconds(th["learned_min_s"]), seconds(th["learned_max_s"])
        out = (f"thresholds learned from healthy calls for {th['learned_shapes']} call shapes "
               f"({lo if lo == hi else f'{lo} to {hi}'}); {out} for warm-up calls and shapes not learned")
    return out


def render_html(result: ReplayResult) -> str:
    """The whole page as one string."""
    doc = result.to_json()
    b, v, d, rf, a = doc["bundle"], doc["verdict"], doc["divergence"], doc["rowfetch"], doc["activity"]
    script_hash = base64.b64encode(hashlib.sha256(_SCRIPT.encode("utf-8")).digest()).decode("ascii")
    csp = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{script_hash}'; img-src data:"
    out: list[str] = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>sgl-seat replay: {_e(b['id'])} ({_e(b['seat'])})</title><style>{_CSS}</style></head><body>",
        f"<h1>Hang bundle {_e(b['id'])} <span class=\"dim\">seat {_e(b['seat'])}</span></h1>",
        f'<p class="dim">{len(b["nodes"])} nodes, {len(b["ranks"])} ranks, {b["files"]} files, '
        f'{b["size_bytes"] / 1e6:.1f} MB; history from {b["time_range_s"][0]:g} s to the trigger; '
        f'sgl-seat {_e(__version__)}; <span id="render-status">static</span></p>',
    ]
    if v:
        ev = "".join(f"<li>{_e(x)}</li>" for x in v["evidence"])
        out.append(f'<div class="verdict"><div class="kind">{_e(v["kind"])}</div>'
                   f"<div>rank <b>{_e(v['rank'])}</b>, node <b>{_e(v['node'])}</b>, frame <b>{_e(v['frame'])}</b>"
                   f"; waiting ranks: {_e(', '.join(map(str, v['waiting_ranks'])) or 'none')}</div><ul>{ev}</ul>"
                   f'<div class="dim">{_e(doc["comparison"])}</div></div>')
    else:
        out.append('<div class="verdict">no verdict recorded and none re-derived</div>')
    out.append("<h2>Ranks at the trigger</h2>")
    out.append(_table(["rank", "node", "state", "frame", "from"],
                      [[_td(r["rank"]), _td(r["node"]), _td(r["state"]), _td(r["frame"]), _td(r["source"])]
                       for r in d["ranks"]], [r["rank"] in d["lagging"] for r in d["ranks"]]))
    out.append(f"<p>{_e(d['summary'])}</p>")
    drawn = {s["state"] for r in doc["timeline"] for s in r["segments"]}
    out.append("<h2>Timeline</h2>" + _timeline_plot(result) + '<div class="legend">' + "".join(
        f'<span data-state="{_e(s)}"><i class="sw" style="background:{c}"></i>{_e(STATE_WORDS.get(s, s))}</span>'
        for s, c in STATE_COLOR.items() if s in drawn or s not in ("error", "waiting")) + "</div>")
    out.append("<h2>Threads stuck on one stack</h2>")
    out.append(_table(["rank", "node", "pid", "thread", "state", "frame", "for (s)", "samples"],
                      [[_td(s["rank"]), _td(s["node"]), _td(s["pid"]), _td(s["thread"]), _td(s["state"]),
                        _td(s["frame"]), _td(s["duration_s"], True), _td(s["samples"], True)] for s in doc["stuck"]])
               if doc["stuck"] else '<p class="dim">none</p>')
    out.append(f"<h2>Row-fetch latency by gather size</h2><p>{rf['records']:,} fetches, {rf['in_flight']} in flight "
               f"at the trigger; {_e(_threshold_heading(rf))}</p>")
    out.append(_rowfetch_plot(result))
    out.append('<div class="legend">' + "".join(
        f'<span><i class="sw" style="background:{c}"></i>{_e(w)}</span>' for c, w in (
            (CAUSE_COLOR, "in flight: the verdict's own call"), (WAITING_COLOR, "in flight, not the cause"),
            ("#1f77b4", "completed"), ("#fff; border: 1px solid #555", "warm-up call (not in the statistics)"),
            ("#2ca02c", "p50 by power-of-two bucket"), ("#ff7f0e", "p99 by bucket"))) + "</div>")
    warm = bool(rf.get("warmup_apart"))
    out.append(_table(["gather size", "count", "p50 ms", "p99 ms", "max ms", "in flight"]
                      + (["warm-up calls (apart)"] if warm else []),
                      [[_td(gather_bucket_label(x["gather_size_min"])), _td(x["count"], True),
                        _td(x["p50_ms"], True), _td(x["p99_ms"], True), _td(x["max_ms"], True),
                        _td(x["in_flight"], True)] + ([_td(x.get("warmup", 0), True)] if warm else [])
                       for x in rf["buckets"]],
                      [x.get("cause", x["stalled"]) for x in rf["buckets"]]))
    if rf.get("graph_buckets"):
        out.append(f"<h3>CUDA graph replays by token count</h3><p>{rf['graph_replays']:,} replays, "
                   f"{rf['graph_in_flight']} in flight at the trigger (GPU time from each "
                   "replay's CUDA events)</p>")
        out.append(_table(["tokens", "shape keys", "count", "p50 ms", "p99 ms", "max ms", "in flight"]
                          + (["warm-up calls (apart)"] if warm else []),
                          [[_td(gather_bucket_label(x["gather_size_min"])), _td(", ".join(map(str, x["shape_keys"]))),
                            _td(x["count"], True), _td(x["p50_ms"], True), _td(x["p99_ms"], True),
                            _td(x["max_ms"], True), _td(x["in_flight"], True)]
                           + ([_td(x.get("warmup", 0), True)] if warm else []) for x in rf["graph_buckets"]],
                          [x.get("cause", x["stalled"]) for x in rf["graph_buckets"]]))
    for f in rf["in_flight_fetches"][:10]:
        what = (f"graph replay of {_e(f['gather_size'])} tokens, shape key {_e(f['graph_key'])}"
                + (" (on the GPU)" if f.get("on_gpu") else "")) if "graph_key" in f \
            else f"gather {_e(f['gather_size'])}"
        out.append(f"<p><b>in flight</b>: rank {_e(f['rank'])} (node {_e(f['node'])}), seq {_e(f['seq'])}, {what}, "
                   f"{_e(age_words(f))}, {_e(threshold_words(f))}, {_e(f['target'])}</p>")
    out += [f"<p><b>{_e(line)}</b></p>" for line in cause_lines(doc)]
    out.append("<h2>Before the trigger</h2>" + _throughput_plot(result))
    rq = a["requests"]
    out.append(_table(["what", "value"], [[_td(k), _td(x, True)] for k, x in (
        ("running requests (last)", a["running_reqs_last"]), ("running requests (max)", a["running_reqs_max"]),
        ("queued requests (last)", a["queue_reqs_last"]), ("throughput tok/s (mean)", a["throughput_tok_s_mean"]),
        ("last token progress", progress_words(a["last_token_progress_s"])),
        ("spec accept length (mean)", a["spec_accept_length_mean"]), ("KV token usage (last)", a["token_usage_last"]),
        ("requests recorded", rq["recorded"]), ("requests open at the trigger", rq["open_at_trigger"]),
        ("prompt tokens p50", rq["prompt_tokens_p50"]), ("shared-prefix groups", rq["prefix_groups"]))]))
    if doc["exited"]:
        out.append("<h2>Exited processes</h2>")
        out.append(_table(["rank", "node", "pid", "title", "exit code"],
                          [[_td(p["rank"]), _td(p["node"]), _td(p["pid"]), _td(p["title"]), _td(p["exit_code"])]
                           for p in doc["exited"]]))
    if doc["log_tail"]:
        out.append("<h2>Log tail</h2>")
        for node, lines in doc["log_tail"].items():
            out.append(f"<h3>node {_e(node)}</h3><pre>{_e(chr(10).join(lines))}</pre>")
    for n in doc["notes"]:
        out.append(f'<p class="dim">note: {_e(n)}</p>')
    out.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(out) + "\n"
