"""How `sgl-seat watch` draws the watch document (``sgl_seat.launch.watchdoc``) as one rich table."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from sgl_seat.core.records import RecordError
from sgl_seat.core.warning import PREHANG_KIND, PreHangWarning


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x:.2f}"


def _state_style(state: str) -> str:
    return {"running": "green", "collective": "yellow", "fetching": "red", "gpu fetch": "red",
            "exited": "bold red"}.get(state, "dim")


def _warning_line(doc: Any) -> str:
    """The pre-hang warning of a snapshot, as one line (a sidecar of another version may send another shape)."""
    try:
        return PreHangWarning.from_json(doc).summary()
    except RecordError:
        return PREHANG_KIND


#: What the fixed columns of the rank table take (widths plus two-space gaps); the top frame gets the rest.
_RANK_FIXED = 4 + 4 + 10 + 6 + 6 + 5 + 5 + 7 * 2
_BUNDLE_ID = 40


def render(doc: dict[str, Any], width: int = 80) -> RenderableType:
    """The live view: a header, one row per rank, then the bundles captured so far.

    ``width`` is the terminal's: each rank stays on one line (rich shrinks only wrapping columns, so the one
    long cell, the top frame, is given the width left over and ends in an ellipsis).
    """
    parts: list[RenderableType] = []
    nodes = doc.get("nodes") or []
    tps = next((n.get("tokens_per_s") for n in nodes if n.get("tokens_per_s") is not None), None)
    head = Text(f"seat {doc['seat']}  {doc.get('state', '?')}  {doc.get('endpoint') or ''}  "
                f"tokens/s {'-' if tps is None else f'{tps:.1f}'}")
    parts.append(head)
    if doc.get("error"):
        parts.append(Text(f"watchdog: {doc['error']}", style="yellow"))
    # One line per rank on an 80-column terminal: short headers, numbers never wrap, and the top frame (the
    # only long cell) takes what is left and ends in an ellipsis instead of wrapping into a second line.
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for c, cw in (("rank", 4), ("node", 4), ("state", 10)):
        t.add_column(c, justify="left" if c == "state" else "right", no_wrap=True, min_width=cw)
    t.add_column("top frame", no_wrap=True, overflow="ellipsis", max_width=max(12, width - _RANK_FIXED - 1))
    for c in ("p50 ms", "p99 ms", "age s", "n/30s"):
        t.add_column(c, justify="right", no_wrap=True, min_width=len(c))
    for n in nodes:
        if n.get("error"):
            t.add_row("-", str(n.get("node")), Text("no sidecar", style="dim"), str(n["error"]), "", "", "", "")
            continue
        for r in n.get("ranks") or []:
            age = r.get("inflight_age_s")
            t.add_row(str(r["rank"]), str(r.get("node")), Text(r["state"], style=_state_style(r["state"])),
                      r.get("frame") or "-", _ms(r.get("rowfetch_p50_ms")), _ms(r.get("rowfetch_p99_ms")),
                      "-" if age is None else f"{age:.1f}", str(r.get("fetches", 0)))
    parts.append(t)
    for n in nodes:
        bits = []
        if n.get("sampler") and n["sampler"] != "ok":
            bits.append(f"sampler: {n['sampler']}")
        v = n.get("verdict")
        if v:
            bits.append(f"detector: {v['kind']} rank {v.get('rank')} node {v.get('node')} {v.get('frame') or ''}")
        if n.get("warning"):
            bits.append(f"warning: {_warning_line(n['warning'])}")
        if n.get("latched"):
            bits.append("latched (captured; waiting for recovery)")
        if n.get("capture_errors"):
            bits.append(f"capture error: {n['capture_errors'][-1]}")
        if n.get("restarted"):
            bits.append("sidecar restarted by Ray (its history begins at the restart)")
        for peer, why in sorted((n.get("watch_gaps") or {}).items()):
            bits.append(f"node {peer} unwatched: {why}")
        if bits:
            parts.append(Text(f"node {n.get('node')}: " + "; ".join(bits), style="yellow"))
    rem = doc.get("remediation")
    if rem:
        pol = rem.get("policy") or {}
        parts.append(Text(f"on hang: {pol.get('on_hang')} ({rem.get('used')} of {pol.get('max')} remediations used)"
                          + ("; EXHAUSTED: the seat waits for an operator" if rem.get("exhausted") else ""),
                          style="red" if rem.get("exhausted") else ""))
        for r in (rem.get("history") or [])[-3:]:
            stages = [f"{k} {r[k + '_s']:.1f} s" for k in ("engines_stopped", "serving_again")
                      if r.get(k + "_s") is not None]
            parts.append(Text(f"  {r['action']} {r['outcome']}{' ' + ', '.join(stages) if stages else ''}: "
                              f"{r['verdict']}",
                              style="yellow" if r["outcome"] == "pending" else ""))
    bundles = doc.get("bundles") or []
    if bundles:
        bt = Table(title=f"bundles ({len(bundles)})", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                   collapse_padding=True, title_justify="left")
        bt.add_column("id", no_wrap=True, overflow="ellipsis", max_width=_BUNDLE_ID)
        bt.add_column("verdict", no_wrap=True, overflow="ellipsis", max_width=max(12, width - _BUNDLE_ID - 8 - 5))
        bt.add_column("size", justify="right", no_wrap=True, min_width=8)
        for b in bundles[:10]:
            v = b.get("verdict") or {}
            vt = f"{v.get('kind')} rank {v.get('rank')} node {v.get('node')} {v.get('frame') or ''}" if v else "-"
            bt.add_row(b.get("id", "?"), b.get("error") or vt, f"{(b.get('size_bytes') or 0) / 1e6:.1f} MB")
        parts.append(bt)
    else:
        parts.append(Text("no bundles", style="dim"))
    return Group(*parts)
