"""`watch`'s rendering of a watch document (no Ray: the document is what sidecars return)."""

from __future__ import annotations

import io

from rich.console import Console

from sgl_seat.cli.watchview import render
from sgl_seat.watchdog.exporter import gather_bucket

DOC = {
    "schema_version": 1, "seat": "local-sim", "t": 0.0, "state": "READY", "endpoint": "http://127.0.0.1:31000",
    "error": None,
    "nodes": [
        {"node": 0, "sampler": "ok", "tokens_per_s": 812.5, "verdict": None, "latched": False, "capture_errors": [],
         "ranks": [{"rank": 0, "node": 0, "pid": 10, "state": "collective", "frame": "all_reduce (c10d.py:1)",
                    "rowfetch_p50_ms": 1.25, "rowfetch_p99_ms": 4.5, "inflight_age_s": None, "fetches": 900}]},
        {"node": 1, "sampler": "py-spy denied", "tokens_per_s": None, "latched": True, "capture_errors": ["disk full"],
         "verdict": {"kind": "row-fetch stall", "rank": 3, "node": 1, "frame": "fetch_rows (rowfetch.py:88)"},
         "ranks": [{"rank": 3, "node": 1, "pid": 13, "state": "fetching", "frame": "fetch_rows (rowfetch.py:88)",
                    "rowfetch_p50_ms": 1.0, "rowfetch_p99_ms": 2.0, "inflight_age_s": 4.2, "fetches": 850}]},
        {"node": 2, "error": "no watchdog sidecar"},
    ],
    "bundles": [{"id": "20261129-120000.000-row-fetch-stall-r3", "size_bytes": 2_500_000,
                 "verdict": {"kind": "row-fetch stall", "rank": 3, "node": 1, "frame": "fetch_rows (rowfetch.py:88)"}}],
}


def _text(doc: dict) -> str:  # type: ignore[type-arg]
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(render(doc))
    return buf.getvalue()


def test_render_shows_ranks_detector_and_bundles() -> None:
    out = _text(DOC)
    assert "tokens/s 812.5" in out
    assert "all_reduce (c10d.py:1)" in out and "1.25" in out and "4.50" in out
    assert "fetching" in out and "4.2" in out
    assert "sampler: py-spy denied" in out and "row-fetch stall rank 3 node 1" in out
    assert "capture error: disk full" in out and "no watchdog sidecar" in out
    assert "bundles (1)" in out and "20261129-120000.000-row-fetch-stall-r3" in out and "2.5 MB" in out


def test_render_without_sidecars_or_bundles() -> None:
    out = _text({"seat": "s", "state": "READY", "nodes": [], "bundles": [], "error": "started with --no-watchdog"})
    assert "watchdog: started with --no-watchdog" in out and "no bundles" in out


def test_gather_buckets() -> None:
    assert [gather_bucket(n) for n in (-1, 1, 64, 65, 16384, 16385)] == [
        "unknown", "<=64", "<=64", "<=256", "<=16384", ">16384"]
