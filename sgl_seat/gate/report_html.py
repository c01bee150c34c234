"""The gate report as one self-contained HTML page: verdict, gates with intervals, and the plots behind them.

Same rules as the replay page (:mod:`sgl_seat.forensics.replay.bundle_html`, whose SVG plot helpers this reuses):
nothing is loaded from anywhere (a Content-Security-Policy allows only the inline style and one hashed inline
script), every string is escaped, and the script only marks the page rendered (``data-gate-rendered="ok"``) once
every plot exists, so a headless browser test can prove it ran. A page of sim figures says SYNTHETIC at its top
and bottom.

Plots: output throughput against concurrency per arm (mean over repetitions with its 95 % interval), the
candidate/baseline ratio with its interval and the crossover, TTFT against concurrency, prefix hit rate (cold pass
and warm passes), and the KV pool with the running-request ceiling.
"""

from __future__ import annotations

import base64
import hashlib
import math
import statistics
from typing import Any

from sgl_seat import __version__
from sgl_seat.forensics.replay.bundle_html import _CSS, _e, _lin_ticks, _Plot, _table, _td
from sgl_seat.gate.intervals import t_quantile

__all__ = ["PLOT_IDS", "render_html"]

PLOT_IDS = ("plot-throughput", "plot-ratio", "plot-ttft", "plot-hitrate", "plot-kv")
ARM_COLOR = {"baseline": "#1f77b4", "candidate": "#d62728", "hybrid": "#2ca02c", "control": "#7f7f7f"}
_SCRIPT = """(function () {
  var ids = %s;
  var ok = ids.every(function (id) {
    var e = document.getElementById(id);
    return e && e.tagName.toLowerCase() === "svg";
  });
  document.documentElement.setAttribute("data-gate-rendered", ok ? "ok" : "missing-plots");
  var m = document.getElementById("render-status");
  if (m) { m.textContent = ok ? "rendered" : "plots missing"; }
})();""" % ("[" + ", ".join(f'"{p}"' for p in PLOT_IDS) + "]")
_EXTRA_CSS = """
.PASS { color: #1a7f37; font-weight: 700; } .FAIL { color: #d62728; font-weight: 700; }
.INCONCLUSIVE { color: #9a6700; font-weight: 700; } .synthetic { background: #fff3cd; border: 1px solid #e0c060;
padding: 8px 12px; font-weight: 600; } .big { font-size: 22px; }
"""


def _mean_ci(vals: list[float]) -> tuple[float, float, float]:
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return m, m, m
    half = t_quantile(0.975, len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return m, m - half, m + half


def _series(rep: dict[str, Any], key: str) -> dict[str, list[tuple[int, list[float]]]]:
    """arm -> [(level, [value per repetition])] for a per-level figure."""
    out: dict[str, list[tuple[int, list[float]]]] = {}
    for arm, by_rep in rep["arms"].items():
        pts = []
        for c in rep["design"]["levels"]:
            vals = [v for f in by_rep.values() if (v := (f.get(key) or {}).get(str(c), (f.get(key) or {}).get(c)))
                    is not None]
            if vals:
                pts.append((c, vals))
        out[arm] = pts
    return out


def _legend(p: _Plot, arms: list[str]) -> None:
    x = p.ml + 8
    for arm in arms:
        p.parts.append(f'<rect x="{x}" y="{p.mt + 6}" width="10" height="10" fill="{ARM_COLOR.get(arm, "#333")}"/>'
                       f'<text x="{x + 14}" y="{p.mt + 15}">{_e(arm)}</text>')
        x += 24 + 7 * len(arm)


def _per_level_plot(rep: dict[str, Any], key: str, pid: str, title: str, ylabel: str, scale: float = 1.0) -> str:
    series = _series(rep, key)
    levels = rep["design"]["levels"]
    vals = [v * scale for pts in series.values() for _, vs in pts for v in vs]
    if not vals:
        return _Plot(pid, f"{title}: not measured", x=(1, 2), y=(0, 1), xlabel="", ylabel="", h=120).svg()
    ymax = max(vals) * 1.15 or 1.0
    p = _Plot(pid, title, xlog=True, x=(levels[0] / 1.3, levels[-1] * 1.3), y=(0, ymax),
              xlabel="concurrent clients (log)", ylabel=ylabel, h=320)
    p.ticks([(float(c), str(c)) for c in levels], [(v, f"{v:g}") for v in _lin_ticks(0, ymax, 5)])
    for arm, pts in series.items():
        color = ARM_COLOR.get(arm, "#333")
        line = []
        for c, vs in pts:
            m, lo, hi = _mean_ci([v * scale for v in vs])
            x = p.px(c)
            line.append(f"{x:.1f},{p.py(m):.1f}")
            p.parts.append(f'<line x1="{x:.1f}" y1="{p.py(lo):.1f}" x2="{x:.1f}" y2="{p.py(hi):.1f}" stroke="{color}" '
                           f'stroke-width="2"><title>{_e(arm)} c={c}: {m:.4g} [{lo:.4g}, {hi:.4g}] '
                           f"(n={len(vs)})</title></line>")
        p.parts.append(f'<polyline points="{" ".join(line)}" fill="none" stroke="{color}" stroke-width="2"/>')
    _legend(p, list(series))
    return p.svg()


def _ratio_plot(rep: dict[str, Any]) -> str:
    levels = rep["design"]["levels"]
    comps = {a: c for a, c in rep["comparisons"].items() if any(s.get("ratio") for s in c["sweep"])}
    his = [s["ci_high"] for c in comps.values() for s in c["sweep"] if s.get("ci_high")]
    rs = [s["ratio"] for c in comps.values() for s in c["sweep"] if s.get("ratio")]
    if not rs:
        return _Plot("plot-ratio", "throughput ratio vs baseline: not measured", x=(1, 2), y=(0, 1), xlabel="",
                     ylabel="", h=120).svg()
    ymax = min(max([*his, *rs, 1.2]) * 1.1, max(rs) * 3)
    p = _Plot("plot-ratio", "output throughput / baseline's, with 95 % interval (above 1: the draft pays)", xlog=True,
              x=(levels[0] / 1.3, levels[-1] * 1.3), y=(0, ymax), xlabel="concurrent clients (log)", ylabel="ratio",
              h=320)
    p.ticks([(float(c), str(c)) for c in levels], [(v, f"{v:g}") for v in _lin_ticks(0, ymax, 5)])
    y1 = p.py(1.0)
    p.parts.append(f'<line x1="{p.ml}" y1="{y1:.1f}" x2="{p.w - p.mr}" y2="{y1:.1f}" stroke="#333" '
                   'stroke-dasharray="5 3"/>')
    for arm, comp in comps.items():
        color = ARM_COLOR.get(arm, "#333")
        line = []
        for s in comp["sweep"]:
            if s.get("ratio") is None:
                continue
            x = p.px(s["concurrency"])
            line.append(f"{x:.1f},{p.py(s['ratio']):.1f}")
            hi = s["ci_high"] if s.get("ci_high") is not None else ymax
            lo = s["ci_low"] if s.get("ci_low") is not None else 0.0
            p.parts.append(f'<line x1="{x:.1f}" y1="{p.py(lo):.1f}" x2="{x:.1f}" y2="{p.py(hi):.1f}" '
                           f'stroke="{color}" stroke-width="3" stroke-opacity="0.5"><title>{_e(arm)} '
                           f"c={s['concurrency']}: {s['ratio']:.3f}</title></line>")
        p.parts.append(f'<polyline points="{" ".join(line)}" fill="none" stroke="{color}" stroke-width="2"/>')
    cx = rep.get("crossover") or {}
    if cx.get("estimate"):
        x = p.px(cx["estimate"])
        p.parts.append(f'<line x1="{x:.1f}" y1="{p.mt}" x2="{x:.1f}" y2="{p.h - p.mb}" stroke="#9467bd" '
                       f'stroke-width="2"/><text x="{x + 4:.1f}" y="{p.mt + 28}" fill="#9467bd">crossover '
                       f"{cx['estimate']:g}</text>")
    _legend(p, list(comps))
    return p.svg()


def _bars(pid: str, title: str, rows: list[tuple[str, list[tuple[str, float | None]]]], ylabel: str,
          fmt: str = "{:.3g}") -> str:
    vals = [v for _, items in rows for _, v in items if v is not None]
    if not vals:
        return _Plot(pid, f"{title}: not measured", x=(0, 1), y=(0, 1), xlabel="", ylabel="", h=120).svg()
    ymax = max(vals) * 1.2 or 1.0
    n = sum(len(items) for _, items in rows) + len(rows)
    p = _Plot(pid, title, x=(0, n), y=(0, ymax), xlabel="", ylabel=ylabel, h=280)
    p.ticks([], [(v, f"{v:g}") for v in _lin_ticks(0, ymax, 5)])
    i = 0.5
    for arm, items in rows:
        color = ARM_COLOR.get(arm, "#333")
        for label, v in items:
            x0, x1 = p.px(i), p.px(i + 0.8)
            if v is not None:
                p.parts.append(f'<rect x="{x0:.1f}" y="{p.py(v):.1f}" width="{x1 - x0:.1f}" '
                               f'height="{p.py(0) - p.py(v):.1f}" fill="{color}" fill-opacity="0.75">'
                               f"<title>{_e(arm)} {_e(label)}: {fmt.format(v)}</title></rect>"
                               f'<text x="{(x0 + x1) / 2:.1f}" y="{p.py(v) - 4:.1f}" text-anchor="middle">'
                               f"{_e(fmt.format(v))}</text>")
            p.parts.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{p.h - p.mb + 14}" text-anchor="middle">'
                           f"{_e(arm)} {_e(label)}</text>")
            i += 1
        i += 1
    return p.svg()


def _median(by_rep: dict[str, Any], key: str) -> float | None:
    vals = [f[key] for f in by_rep.values() if f.get(key) is not None]
    return statistics.median(vals) if vals else None


def render_html(rep: dict[str, Any]) -> str:
    """The whole page as one string."""
    script_hash = base64.b64encode(hashlib.sha256(_SCRIPT.encode("utf-8")).digest()).decode("ascii")
    csp = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{script_hash}'; img-src data:"
    d = rep["design"]
    syn = (f'<p class="synthetic">{_e(rep["synthetic_note"])}</p>' if rep.get("synthetic") else "")
    syn += f'<p class="synthetic">{_e(rep["note"])}</p>' if rep.get("note") else ""
    out = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        f"<title>sgl-seat gate: {_e(rep['verdict'])}</title><style>{_CSS}{_EXTRA_CSS}</style></head><body>", syn,
        f'<h1>Draft gate: <span class="big {_e(rep["verdict"])}">{_e(rep["verdict"])}</span></h1>',
        f'<p class="dim">arms {_e(", ".join(d["arms"]))}; {d["runs"]} run(s) per arm in ABBA order; sweep '
        f'{_e(d["levels"])}; sgl-seat {_e(__version__)}; <span id="render-status">static</span></p>',
        f"<h2>Gates ({_e(rep.get('verdict_of', 'candidate'))} / baseline, 95 % interval; A/A noise floor beside;"
        " hangs: per serving hour)</h2>",
    ]
    rows = []
    for g in rep["gates"]:
        nf = g.get("noise_floor") or {}
        limit = g["bound"] if g.get("bound") is not None else g["threshold"]  # hangs: 1 + threshold since 1.1
        thr = ("&ge; " if g["higher_is_better"] else "&le; ") + _e(f"{limit:g}")
        ci = "-" if g.get("ci_low") is None and g.get("ci_high") is None else (
            f"[{_e(g.get('ci_low'))}, {_e(g.get('ci_high') if g.get('ci_high') is not None else 'inf')}]")
        ratio = _td("inf") if g.get("ratio_infinite") else _td(g.get("ratio"), True)
        rows.append([_td(g["name"]), ratio, f"<td>{ci}</td>", f"<td>{thr}</td>",
                     _td(None if nf.get("half_width") is None else f"+/-{nf['half_width'] * 100:.1f}%"),
                     f'<td class="{_e(g["outcome"])}">{_e(g["outcome"])}</td>', _td(g.get("note", ""))])
    out.append(_table(["gate", "ratio", "95 % interval", "threshold", "A/A floor", "outcome", "note"], rows,
                      [g["outcome"] == "FAIL" for g in rep["gates"]]))
    ss = rep.get("single_stream") or {}
    out.append("<p>Single-stream output (reported, never gated): " + "; ".join(
        f"{_e(a)}/baseline {_e(v.get('ratio'))} [{_e(v.get('ci_low'))}, {_e(v.get('ci_high'))}]"
        for a, v in ss.items()) + "</p>")
    for arm, comp in rep["comparisons"].items():
        if arm != rep.get("verdict_of", "candidate"):
            out.append(f"<p>{_e(arm)} arm: verdict <b class=\"{_e(comp['verdict'])}\">{_e(comp['verdict'])}</b> ("
                       + ", ".join(f"{_e(g['name'])} {_e(g['outcome'])}" for g in comp["gates"]) + ")</p>")
    out.append("<h2>Throughput against concurrency</h2>")
    out.append(_per_level_plot(rep, "sweep_output_tok_s", "plot-throughput",
                               "output tokens/s per arm (mean over runs, 95 % interval)", "tokens/s"))
    out.append(_ratio_plot(rep))
    cx, rec = rep.get("crossover"), rep.get("recommendation")
    if cx:
        out.append(f"<p>Crossover concurrency: <b>{_e(cx.get('estimate'))}</b> (interval {_e(cx.get('ci_low'))} to "
                   f"{_e(cx.get('ci_high'))}; below sweep: {_e(cx.get('below_sweep'))}, beyond sweep: "
                   f"{_e(cx.get('beyond_sweep'))})</p>")
    if rec:
        out.append(f"<p><b>Recommendation</b>: {_e(rec['text'])}. {_e(rec['action'])}.</p>")
    out.append("<h2>Latency</h2>")
    out.append(_per_level_plot(rep, "sweep_ttft_s", "plot-ttft", "median TTFT per arm (ms)", "ms", scale=1000.0))
    arms = list(rep["arms"])
    out.append(_table(["arm", "cold TTFT s (median over runs)", "single-stream tok/s", "accept length"],
                      [[_td(a), _td(_median(rep["arms"][a], "cold_ttft_s"), True),
                        _td(_median(rep["arms"][a], "single_stream_tok_s"), True),
                        _td(_median(rep["arms"][a], "accept_length"), True)] for a in arms]))
    out.append("<h2>Prefix cache and KV pool</h2>")
    out.append(_bars("plot-hitrate", "prefix hit rate from counter deltas (cold pass apart)",
                     [(a, [("cold", _median(rep["arms"][a], "prefix_hit_rate_cold")),
                           ("warm", _median(rep["arms"][a], "prefix_hit_rate_warm"))]) for a in arms], "hit rate"))
    out.append(_bars("plot-kv", "KV pool (tokens, thousands) and running-request ceiling, as the engine reports",
                     [(a, [("KV k", None if (v := _median(rep["arms"][a], "kv_pool_tokens")) is None else v / 1000),
                           ("slots", _median(rep["arms"][a], "max_running_requests"))]) for a in arms], "",
                     fmt="{:,.0f}"))
    gi = rep.get("greedy_identity") or {}
    out.append(f"<h2>Evidence</h2><p>Greedy identity (A/A: {_e(gi.get('aa_source'))}): {_e(gi)}</p>")
    out.append(f"<p>Client overhead: {_e(rep.get('client_overhead'))}</p>")
    if not rep.get("complete", True):
        out.append(f"<p><b>Incomplete</b>: {len(rep['missing_cells'])} cells missing.</p>")
    out.append(syn)
    out.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(out) + "\n"
