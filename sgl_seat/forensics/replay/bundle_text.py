"""The terminal report of a replayed bundle (rich renderables; the CLI prints them).

Ordered like an operator reads a hang: the verdict, then who lags and where, how long threads were
stuck, the row-fetch latency by gather size with the stalled fetch marked, what the seat was doing,
exited processes and their log tail, then each rank's timeline as a strip of states.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sgl_seat.core.stats import gather_bucket_label
from sgl_seat.forensics.replay.agree import age_words, cause_lines, progress_words, threshold_words
from sgl_seat.forensics.replay.replayer import ReplayResult

__all__ = ["STATE_GLYPH", "print_report", "render_report", "timeline_strip"]

#: One character per sample in the timeline strip.
STATE_GLYPH = {"rowfetch": "R", "collective": "C", "running": ".", "idle": "_", "stopped": "S", "unread": "?",
               "error": "x", "exited": "X", "waiting": "w"}
#: What each glyph means, for the strip's title.
_GLYPH_WORDS = {"rowfetch": "row fetch", "unread": "stack not read (a failed sample)", "error": "no stack"}
_STATE_STYLE = {"rowfetch": "bold red", "collective": "yellow", "running": "green", "idle": "dim", "error": "magenta",
                "stopped": "bold blue", "unread": "dim", "exited": "bold magenta"}
#: The widest a piped report is printed (a terminal's own width holds otherwise).
PIPED_MAX_WIDTH = 400


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") + unit
    return f"{v}{unit}"


def timeline_strip(segments: list[dict[str, Any]], width: int = 60) -> Text:
    """A rank's last ``width`` samples as glyphs (R row fetch, C collective, . running, _ idle, x error)."""
    glyphs: list[tuple[str, str]] = []
    for seg in segments:
        glyphs.extend([(STATE_GLYPH.get(seg["state"], "?"), seg["state"])] * int(seg["samples"]))
    text = Text()
    for g, st in glyphs[-width:]:
        text.append(g, style=_STATE_STYLE.get(st, ""))
    return text


def _verdict(doc: dict[str, Any]) -> RenderableType:
    v = doc["verdict"]
    if v is None:
        return Panel("no verdict recorded (a manual capture?) and none re-derived", title="verdict")
    lines = Text()
    lines.append(f"{v['kind']}", style="bold red")
    lines.append(f"  rank {_fmt(v['rank'])}  node {_fmt(v['node'])}  frame {_fmt(v['frame'])}\n")
    for e in v["evidence"]:
        lines.append(f"  - {e}\n")
    if v["waiting_ranks"]:
        lines.append(f"  waiting ranks: {', '.join(map(str, v['waiting_ranks']))}\n")
    if v.get("node_ranks"):
        lines.append(f"  ranks on the unreachable node: {', '.join(map(str, v['node_ranks']))}\n")
    style = {True: "green", False: "bold yellow"}.get(doc["live_verdict_matches"],
                                                       "bold yellow" if doc["verdict_matches"] is False else "dim")
    lines.append(doc["comparison"], style=style)
    return Panel(lines, title="verdict", border_style="red")


def _divergence(doc: dict[str, Any]) -> RenderableType:
    d = doc["divergence"]
    t = Table(title="ranks at the trigger", title_justify="left", show_edge=False)
    for c in ("rank", "node", "state", "frame", "from"):
        t.add_column(c)
    lag = set(d["lagging"])
    for r in d["ranks"]:
        style = "bold red" if r["rank"] in lag else ""
        t.add_row(str(r["rank"]), str(r["node"]), r["state"], _fmt(r["frame"]), r["source"], style=style)
    return Group(t, Text(d["summary"], style="bold" if lag else ""))


def _stuck(doc: dict[str, Any]) -> RenderableType:
    t = Table(title="threads stuck on one stack (longest first)", title_justify="left", show_edge=False)
    for c in ("rank", "node", "pid", "thread", "state", "frame", "for", "samples"):
        t.add_column(c)
    for s in doc["stuck"]:
        t.add_row(_fmt(s["rank"]), str(s["node"]), str(s["pid"]), _fmt(s["thread"]), s["state"], _fmt(s["frame"]),
                  _fmt(s["duration_s"], " s"), str(s["samples"]))
    return t if doc["stuck"] else Text("no thread kept one stack for 3 samples or more", style="dim")


def _rowfetch(doc: dict[str, Any]) -> RenderableType:
    rf = doc["rowfetch"]
    if not rf["records"]:
        return Text("no row-fetch probe records", style="dim")
    warm = bool(rf.get("warmup_apart"))
    t = Table(title=f"row-fetch latency by gather size ({rf['records']:,} fetches, {rf['in_flight']} in flight"
                    + (f"; {rf['warmup_apart']} warm-up calls kept apart" if warm else "") + ")",
              title_justify="left", show_edge=False)
    for c in ("gather size", "count", "p50 ms", "p99 ms", "max ms", "in flight", *(["warm-up"] if warm else [])):
        t.add_column(c, justify="right")
    for b in rf["buckets"]:
        t.add_row(gather_bucket_label(b["gather_size_min"]), f"{b['count']:,}", _fmt(b["p50_ms"]),
                  _fmt(b["p99_ms"]), _fmt(b["max_ms"]), str(b["in_flight"]) + _mark(b),
                  *([str(b.get("warmup", 0))] if warm else []),
                  style="bold red" if b.get("cause", b["stalled"]) else "")
    parts: list[RenderableType] = [t]
    if rf.get("graph_buckets"):
        g = Table(title=f"CUDA graph replays by token count ({rf['graph_replays']:,} replays, "
                        f"{rf['graph_in_flight']} in flight; GPU time from each replay's CUDA events)",
                  title_justify="left", show_edge=False)
        for c in ("tokens", "shape keys", "count", "p50 ms", "p99 ms", "max ms", "in flight"):
            g.add_column(c, justify="right")
        for b in rf["graph_buckets"]:
            g.add_row(gather_bucket_label(b["gather_size_min"]), _keys(b["shape_keys"]), f"{b['count']:,}",
                      _fmt(b["p50_ms"]), _fmt(b["p99_ms"]), _fmt(b["max_ms"]),
                      str(b["in_flight"]) + _mark(b), style="bold red" if b.get("cause", b["stalled"]) else "")
        parts.append(g)
    for f in rf["in_flight_fetches"][:5]:
        what = f"graph replay of {f['gather_size']} tokens, shape key {f['graph_key']}" \
            + (" (on the GPU)" if f.get("on_gpu") else "") if "graph_key" in f else f"gather {f['gather_size']}"
        parts.append(Text(f"in flight: rank {f['rank']} (node {f['node']}) seq {f['seq']} {what}, "
                          f"{age_words(f)}, {threshold_words(f)} ({f['target']})",
                          style="bold red" if f.get("cause", f["stalled"]) else ""))
    parts += [Text(line, style="bold red" if rf.get("cause_bucket") else "dim") for line in cause_lines(doc)]
    return Group(*parts)


def _mark(b: dict[str, Any]) -> str:
    if not b["stalled"]:
        return ""
    return " STALLED" if b.get("cause", True) else " past the threshold (not the verdict's cause)"


def _keys(keys: list[int]) -> str:
    """Shape keys of a bucket, shortened past four."""
    return ", ".join(map(str, keys[:4])) + (f" (+{len(keys) - 4})" if len(keys) > 4 else "")


def _activity(doc: dict[str, Any]) -> RenderableType:
    a = doc["activity"]
    rq = a["requests"]
    t = Table(title=f"before the trigger (last {a['window_s']:.0f} s)", title_justify="left", show_edge=False,
              show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    rows = [
        ("running requests (last / max)", f"{_fmt(a['running_reqs_last'])} / {_fmt(a['running_reqs_max'])}"),
        ("queued requests (last)", _fmt(a["queue_reqs_last"])),
        ("throughput tok/s (mean / last)", f"{_fmt(a['throughput_tok_s_mean'])} / {_fmt(a['throughput_tok_s_last'])}"),
        ("last token progress", progress_words(a["last_token_progress_s"])),
        ("spec accept length (mean / last)",
         f"{_fmt(a['spec_accept_length_mean'])} / {_fmt(a['spec_accept_length_last'])}"),
        ("KV token usage (last)", _fmt(a["token_usage_last"])),
        ("requests recorded / open at trigger", f"{rq['recorded']} / {rq['open_at_trigger']}"),
        ("prompt tokens p50 / max", f"{_fmt(rq['prompt_tokens_p50'])} / {_fmt(rq['prompt_tokens_max'])}"),
        ("shared-prefix groups", str(rq["prefix_groups"])),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _exited(doc: dict[str, Any]) -> Iterator[RenderableType]:
    for p in doc["exited"]:
        title = p["title"] if len(p["title"]) <= 80 else p["title"][:77] + "..."
        code = "unknown" if p["exit_code"] is None else p["exit_code"]
        yield Text(f"exited: {title} (rank {_fmt(p['rank'])}, node {p['node']}, pid {p['pid']}) exit code {code}",
                   style="bold red")
    for node, lines in doc["log_tail"].items():
        if doc["exited"] or (doc["verdict"] and doc["verdict"]["kind"] in ("process exited", "process stopped",
                                                                         "engine watchdog")):
            body = Text("\n".join(lines[-12:]))
            yield Panel(body, title=f"log tail, node {node}", border_style="dim")


def _timeline(doc: dict[str, Any]) -> RenderableType:
    drawn = {s["state"] for r in doc["timeline"] for s in r["segments"]}
    glyphs = ", ".join(f"{g} {_GLYPH_WORDS.get(st, st)}" for st, g in STATE_GLYPH.items()
                       if st in drawn or st not in ("error", "waiting"))
    t = Table(title=f"timeline per rank (one glyph per sample, newest right: {glyphs})", title_justify="left",
              show_edge=False, show_header=False)
    t.add_column("rank")
    t.add_column("strip")
    t.add_column("now")
    for r in doc["timeline"]:
        last = r["segments"][-1] if r["segments"] else None
        now = f"{last['state']} {_fmt(last['frame'])} for {last['end_s'] - last['start_s']:.0f} s" if last else "-"
        t.add_row(f"rank {r['rank']} (node {r['node']})", timeline_strip(r["segments"]), now)
    return t


def render_report(result: ReplayResult) -> list[RenderableType]:
    """The terminal report, as renderables in reading order."""
    doc = result.to_json()
    b = doc["bundle"]
    head = Text()
    head.append(f"bundle {b['id']}", style="bold")
    head.append(f"  seat {b['seat']}  nodes {len(b['nodes'])}  ranks {len(b['ranks'])}  files {b['files']}  "
                f"{b['size_bytes'] / 1e6:.1f} MB  history {b['time_range_s'][0]:.0f} s to trigger\n")
    head.append(f"source: {result.source}", style="dim")
    out: list[RenderableType] = [head, _verdict(doc)]
    if doc.get("prehang_warning"):
        w = doc["prehang_warning"]
        out.append(Text(f"pre-hang warning {-w['t_s']:.1f} s before the trigger: {w['summary']}", style="bold yellow"))
    out += [_divergence(doc), _stuck(doc), _rowfetch(doc), _activity(doc)]
    out.extend(_exited(doc))
    out.append(_timeline(doc))
    for n in doc["notes"]:
        out.append(Text(f"note: {n}", style="yellow"))
    return out


def print_report(result: ReplayResult, console: Console) -> None:
    """Print the report: on a terminal at its width; piped or redirected (no terminal), each part as wide as its
    widest line (up to :data:`PIPED_MAX_WIDTH`), so no evidence, frame or title is cut at 80 columns."""
    parts = render_report(result)
    if console.is_terminal:
        for part in parts:
            console.print(part)
        return
    width = console.width  # rich prints no wider than the console: widened for each part, then given back
    try:
        for part in parts:
            need = console.measure(part, options=console.options.update_width(PIPED_MAX_WIDTH)).maximum
            console.width = max(width, min(need, PIPED_MAX_WIDTH))
            console.print(part)
    finally:
        console.width = width
