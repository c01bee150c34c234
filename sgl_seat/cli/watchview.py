"""What `sgl-seat watch` shows: every sidecar's snapshot and the seat's bundles, as one plain document.

:func:`collect` reads the seat record, connects to the seat's Ray cluster and asks each sidecar (named
actors, with timeouts); :func:`render` turns the document into a rich table. Both are library functions;
the CLI (``cmd_watch``) only loops and prints. It sits beside the CLI because it reads from every layer
below: the seat's record (``launch``), the sidecars (``watchdog``) and the bundles (``forensics``).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

WATCH_SCHEMA_VERSION = 1


def collect(name: str, *, timeout: float = 10.0, connected: bool = False) -> dict[str, Any]:
    """One watch document for seat ``name`` (connects to Ray unless ``connected``)."""
    from sgl_seat.forensics.store import bundles_in
    from sgl_seat.launch import cluster
    from sgl_seat.launch.record import bundles_dir_of, load_record
    from sgl_seat.watchdog.actors import snapshots

    rec = load_record(name)
    doc: dict[str, Any] = {"schema_version": WATCH_SCHEMA_VERSION, "seat": rec.name, "t": time.time(),
                           "state": rec.state.value, "endpoint": rec.endpoint, "nodes": [], "error": None}
    if rec.no_watchdog:
        doc["error"] = "the seat was started with --no-watchdog: no sidecars"
    elif not rec.gcs_address:
        doc["error"] = "the seat has no Ray cluster address (not up?)"
    else:
        try:
            if not connected:
                cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=timeout)
            doc["nodes"] = snapshots(rec.name, rec.namespace, len(rec.nodes), timeout=timeout)
        except Exception as exc:
            doc["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    doc["bundles"] = [b.to_json() for b in bundles_in(bundles_dir_of(rec))]
    return doc


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x:.2f}"


def _state_style(state: str) -> str:
    return {"running": "green", "collective": "yellow", "fetching": "red", "exited": "bold red"}.get(state, "dim")


def render(doc: dict[str, Any]) -> RenderableType:
    """The live view: a header, one row per rank, then the bundles captured so far."""
    parts: list[RenderableType] = []
    nodes = doc.get("nodes") or []
    tps = next((n.get("tokens_per_s") for n in nodes if n.get("tokens_per_s") is not None), None)
    head = Text(f"seat {doc['seat']}  {doc.get('state', '?')}  {doc.get('endpoint') or ''}  "
                f"tokens/s {'-' if tps is None else f'{tps:.1f}'}")
    parts.append(head)
    if doc.get("error"):
        parts.append(Text(f"watchdog: {doc['error']}", style="yellow"))
    t = Table(show_edge=False, pad_edge=False)
    for c in ("rank", "node", "state", "top frame", "fetch p50 ms", "p99 ms", "in flight s", "fetches/30s"):
        t.add_column(c, justify="right" if c not in ("state", "top frame") else "left")
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
        if n.get("latched"):
            bits.append("latched (captured; waiting for recovery)")
        if n.get("capture_errors"):
            bits.append(f"capture error: {n['capture_errors'][-1]}")
        if bits:
            parts.append(Text(f"node {n.get('node')}: " + "; ".join(bits), style="yellow"))
    bundles = doc.get("bundles") or []
    if bundles:
        bt = Table(title=f"bundles ({len(bundles)})", show_edge=False, pad_edge=False, title_justify="left")
        for c in ("id", "verdict", "size"):
            bt.add_column(c)
        for b in bundles[:10]:
            v = b.get("verdict") or {}
            vt = f"{v.get('kind')} rank {v.get('rank')} node {v.get('node')} {v.get('frame') or ''}" if v else "-"
            bt.add_row(b.get("id", "?"), b.get("error") or vt, f"{(b.get('size_bytes') or 0) / 1e6:.1f} MB")
        parts.append(bt)
    else:
        parts.append(Text("no bundles", style="dim"))
    return Group(*parts)
