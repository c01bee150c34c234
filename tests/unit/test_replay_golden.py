"""Replaying the golden bundles gives the committed verdict and report.

The golden bundles (tests/fixtures/bundles/, made by tests/fixtures/make_bundles.py) are shaped like
the sim seat's: a row-fetch stall on rank 3 with ranks 0-2 in a gloo all_reduce, and a crash of rank 2.
The replayed verdict must equal the live (recorded) one on kind, rank, node and frame, and the whole
report must equal the committed JSON. The detectors' evidence wording belongs to the watchdog and may be
reworded there, so it is compared only between replayed and recorded verdicts, not against the golden file.
To refresh after an intended change: ``python tests/fixtures/make_bundles.py --reports`` and review the diff.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.cli.main import main
from sgl_seat.forensics.replay import replay_bundle

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "bundles"
CASES = ("stall", "crash")


def _without_evidence(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    for key in ("verdict", "recorded_verdict"):
        if doc.get(key):
            doc[key].pop("evidence", None)
    return doc


@pytest.mark.parametrize("name", CASES)
def test_replay_matches_golden_report(name: str) -> None:
    result = replay_bundle(GOLDEN / name)
    got = json.loads(json.dumps(result.to_json(), sort_keys=True))
    want = json.loads((GOLDEN / f"{name}.report.json").read_text())
    assert _without_evidence(got) == _without_evidence(want)
    assert result.verdict_matches is True, "replayed detectors must reproduce the live verdict"
    assert result.replayed is not None and result.recorded is not None
    assert result.replayed.evidence[0] == result.recorded.evidence[0]


def test_stall_names_rank_3_the_fetch_and_the_exploding_bucket() -> None:
    doc = replay_bundle(GOLDEN / "stall").to_json()
    v = doc["verdict"]
    assert (v["kind"], v["rank"], v["node"]) == ("row-fetch stall", 3, 1)
    assert v["frame"].startswith("fetch_rows") and v["waiting_ranks"] == [0, 1, 2]
    assert doc["divergence"]["waiting"] == [0, 1, 2] and doc["divergence"]["lagging"] == [3]
    buckets = doc["rowfetch"]["buckets"]
    for b in buckets:
        assert set(b) >= {"gather_size_min", "gather_size_max", "count", "p50_ms", "p99_ms", "max_ms"}
        assert b["gather_size_max"] + 1 == 2 * b["gather_size_min"]  # power-of-two buckets
    stalled = [b for b in buckets if b["stalled"]]
    assert len(stalled) == 1 and stalled[0]["gather_size_min"] <= 224 <= stalled[0]["gather_size_max"]
    assert doc["rowfetch"]["worst_bucket"]["gather_size_min"] == 128
    assert doc["rowfetch"]["in_flight_fetches"][0]["rank"] == 3
    stuck = {s["rank"]: s for s in doc["stuck"]}
    assert stuck[3]["state"] == "rowfetch" and stuck[3]["duration_s"] >= 3.0
    assert doc["activity"]["running_reqs_last"] > 0 and doc["activity"]["spec_accept_length_mean"] > 1.0
    assert doc["activity"]["last_token_progress_s"] < 0


def test_crash_names_rank_2_and_keeps_the_log_tail() -> None:
    doc = replay_bundle(GOLDEN / "crash").to_json()
    assert (doc["verdict"]["kind"], doc["verdict"]["rank"], doc["verdict"]["node"]) == ("process exited", 2, 1)
    assert doc["exited"] == [{"rank": 2, "node": 1, "pid": 42001, "title": "sglang::scheduler_TP2_EP2",
                              "exit_code": 1}]
    assert any("RuntimeError" in line for line in doc["log_tail"]["1"])
    r2 = next(r for r in doc["divergence"]["ranks"] if r["rank"] == 2)
    assert r2["state"] == "exited"


def test_golden_bundles_are_reproducible(tmp_path: Path) -> None:
    """make_bundles.py is deterministic: regenerating gives byte-identical bundles."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_bundles", ROOT / "tests" / "fixtures" / "make_bundles.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in CASES:
        getattr(mod, f"make_{name}")(tmp_path)
        for f in (GOLDEN / name).rglob("*"):
            if f.is_file():
                assert (tmp_path / name / f.relative_to(GOLDEN / name)).read_bytes() == f.read_bytes(), f


def _cli(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sys, "argv", ["sgl-seat", *argv])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_cli_replay_terminal_and_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "140")
    assert _cli(["replay", str(GOLDEN / "stall")], monkeypatch) == 0
    out = capsys.readouterr().out
    for s in ("row-fetch stall", "rank 3", "fetch_rows", "STALLED", "128-255", "reproduce the live verdict"):
        assert s in out, s
    assert _cli(["replay", str(GOLDEN / "crash"), "--json"], monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"]["kind"] == "process exited"


def test_cli_replay_usage_errors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["replay", str(GOLDEN / "stall"), "--traffic"], monkeypatch) == 2
    assert "--target" in capsys.readouterr().err
    assert _cli(["replay", "/nonexistent/bundle"], monkeypatch) == 2
    assert "Traceback" not in capsys.readouterr().err
