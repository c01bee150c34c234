"""`watch`'s rendering of a watch document (no Ray: the document is what sidecars return)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from sgl_seat.cli.watchview import render
from sgl_seat.launch.seatrecord.home import HOME_ENV
from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord, save_record
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.netports import any_free_port
from tests.cli_runner import run_cli

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


def test_each_rank_stays_on_one_line_at_80_columns() -> None:
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(render(DOC, width=80))
    lines = buf.getvalue().splitlines()
    assert all(len(ln) <= 80 for ln in lines), [len(ln) for ln in lines]
    rank_rows = [ln for ln in lines if ln.lstrip().startswith(("0 ", "3 ", "- "))]
    assert len(rank_rows) == 3, lines  # rank 0, rank 3, node 2's missing sidecar: one line each
    assert all("n/30s" in ln for ln in lines if ln.startswith("rank")), "the last column was dropped"
    assert any("fetch_rows (rowfetch.py:" in ln and ln.rstrip().endswith("850") for ln in lines), lines


def test_watch_json_keeps_stdout_for_json_and_warns_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A seat whose Ray cluster is gone: `watch --once --json` prints one JSON document on stdout and the
    warning, as plain styled text (no literal rich markup), on stderr."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    port = any_free_port()  # a loopback port nobody listens on once closed
    save_record(SeatRecord(name="w", state=SeatState.READY, engine="sim", draft=True, cluster_address="local",
                           namespace="sgl-seat-w", pg_name="sgl-seat-w-pg", gcs_address=f"127.0.0.1:{port}",
                           nodes=[NodeRecord(node_rank=0, agent="a0", ranks=[])]))
    assert run_cli(["watch", "w", "--once", "--json", "--timeout", "1"], monkeypatch) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["seat"] == "w" and "cannot reach the seat's Ray cluster" in doc["error"]
    assert "cannot reach the seat's Ray cluster" in err and "[yellow]" not in err + out


def test_render_shows_the_remediations_as_the_supervisor_records_them() -> None:
    rem = {"policy": {"on_hang": "rollback-draft", "max": 3}, "used": 2, "left": 1, "exhausted": False,
           "history": [
               {"action": "rollback-draft", "outcome": "serving", "engines_stopped_s": 1.5, "serving_again_s": 12.25,
                "verdict": "row-fetch stall, rank 3, node 1"},
               {"action": "restart", "outcome": "pending", "engines_stopped_s": None, "serving_again_s": None,
                "verdict": "row-fetch stall, rank 3, node 1"}]}
    out = _text({**DOC, "remediation": rem})
    assert "on hang: rollback-draft (2 of 3 remediations used)" in out and "EXHAUSTED" not in out
    assert "rollback-draft serving engines_stopped 1.5 s, serving_again 12.2 s" in out
    assert "restart pending: row-fetch stall, rank 3, node 1" in out
    out = _text({**DOC, "remediation": {**rem, "exhausted": True, "used": 3}})
    assert "EXHAUSTED: the seat waits for an operator" in out
    assert "on hang" not in _text(DOC)


def test_render_names_a_peer_left_unwatched_and_a_restarted_sidecar() -> None:
    doc = json.loads(json.dumps(DOC))
    doc["nodes"][0]["watch_gaps"] = {"1": "its watchdog sidecar has not answered for 3.4 s; its node agent answers"}
    doc["nodes"][1]["restarted"] = True
    out = _text(doc)
    assert "node 0: node 1 unwatched: its watchdog sidecar has not answered for 3.4 s" in out
    assert "sidecar restarted by Ray" in out
