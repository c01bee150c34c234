"""Replaying the golden bundles gives the committed verdict and report.

The golden bundles (tests/fixtures/bundles/) were captured from the local two-node sim seat by
``tests/fixtures/make_bundles.py --from-sim``: a row-fetch stall on rank 3 armed to fire at a gather of 128
rows or more (ranks 0-2 left in the gloo all_reduce), and a crash of rank 2; each trimmed to its last 20 s.
The replayed verdict must equal the live (recorded) one on kind, rank, node and frame, and the whole report
must equal the committed JSON. The detectors' evidence wording belongs to the watchdog and may be
reworded there, so it is compared only between replayed and recorded verdicts, not against the golden file.
To refresh after an intended change: ``python tests/fixtures/make_bundles.py --reports`` (new bundles:
``--from-sim``) and review the diff.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sgl_seat.forensics import read_bundle
from sgl_seat.forensics.replay.replayer import replay_bundle
from tests.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "bundles"
CASES = ("stall", "crash")


def _make_bundles() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_bundles", ROOT / "tests" / "fixtures" / "make_bundles.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    assert result.verdict_matches is True, "replayed detectors must reproduce the capture's verdict"
    # The golden bundles predate the live verdict field: the report must not claim a live comparison.
    assert result.live is None and result.live_matches is None
    assert "consistency check" in result.comparison
    assert result.replayed is not None and result.recorded is not None
    assert result.replayed.evidence[0] == result.recorded.evidence[0]


def test_stall_names_rank_3_the_fetch_and_the_exploding_bucket() -> None:
    doc = replay_bundle(GOLDEN / "stall").to_json()
    v = doc["verdict"]
    assert (v["kind"], v["rank"], v["node"]) == ("row-fetch stall", 3, 1)
    assert v["frame"].startswith("fetch_rows (rowfetch.py:") and v["waiting_ranks"] == [0, 1, 2]
    assert doc["divergence"]["waiting"] == [0, 1, 2] and doc["divergence"]["lagging"] == [3]
    buckets = doc["rowfetch"]["buckets"]
    for b in buckets:
        assert set(b) >= {"gather_size_min", "gather_size_max", "count", "p50_ms", "p99_ms", "max_ms"}
        assert b["gather_size_max"] + 1 == 2 * b["gather_size_min"]  # power-of-two buckets
    (fetch,) = doc["rowfetch"]["in_flight_fetches"]
    assert fetch["rank"] == 3 and fetch["gather_size"] >= 128 and fetch["stalled"]  # armed with gather_ge=128
    (stalled,) = [b for b in buckets if b["stalled"]]
    assert stalled["gather_size_min"] <= fetch["gather_size"] <= stalled["gather_size_max"]
    # latency explodes in that bucket alone: its p99 and max are the stall, every other bucket stays sub-10 ms
    assert stalled["max_ms"] == stalled["p99_ms"] >= 3000.0
    assert all(b["max_ms"] < 10.0 for b in buckets if b is not stalled)
    assert doc["rowfetch"]["worst_bucket"]["gather_size_min"] == stalled["gather_size_min"]
    stuck = {s["rank"]: s for s in doc["stuck"]}
    assert stuck[3]["state"] == "rowfetch" and stuck[3]["duration_s"] >= 3.0
    act = doc["activity"]
    assert act["running_reqs_last"] > 0 and act["spec_accept_length_mean"] > 1.0  # draft on
    assert act["last_token_progress_s"] < 0 and act["throughput_tok_s_last"] == 0.0
    assert act["requests"]["recorded"] > 100 and act["requests"]["redacted"] is True
    assert act["requests"]["open_at_trigger"] > 0


def test_crash_names_rank_2_and_keeps_the_log_tail() -> None:
    doc = replay_bundle(GOLDEN / "crash").to_json()
    assert (doc["verdict"]["kind"], doc["verdict"]["rank"], doc["verdict"]["node"]) == ("process exited", 2, 1)
    r2 = [e for e in doc["exited"] if e["rank"] == 2]
    assert len(r2) == 1 and r2[0]["node"] == 1 and r2[0]["title"] == "sglang::scheduler_TP2_EP2"
    assert any("sim fault: crashing rank 2" in line for line in doc["log_tail"]["1"])
    rank2 = next(r for r in doc["divergence"]["ranks"] if r["rank"] == 2)
    assert rank2["state"] == "exited"
    assert doc["rowfetch"]["in_flight"] == 0 and not any(b["stalled"] for b in doc["rowfetch"]["buckets"])


@pytest.mark.parametrize("name", CASES)
def test_golden_bundles_are_small_live_captures_with_requests(name: str) -> None:
    size = sum(f.stat().st_size for f in (GOLDEN / name).rglob("*") if f.is_file())
    assert size < 1_000_000, size
    b = read_bundle(GOLDEN / name)
    m = b.manifest
    assert m.extra["fixture"]["kept_s"] == 20.0 and "synthetic" not in m.extra
    assert m.redaction["prompts"] == "redacted" and m.redaction["requests"] == len(b.requests) > 100
    assert all(r.prompt is None and r.prompt_hash == "" for r in b.requests)
    assert any(r.prefix_tokens for r in b.requests), "the traffic shares a system prompt: cache hits recorded"
    assert {r.route for r in b.requests} == {"/v1/completions"}
    assert all(r.sampling.get("temperature") == 0.7 for r in b.requests)
    trig = m.verdict.t if m.verdict else m.trigger_t
    assert min(s.t for s in b.stacks) >= trig - 20.0 - 1e-6
    assert {s.rank for s in b.native_stacks if s.rank is not None} <= {0, 1, 2, 3}


@pytest.mark.parametrize("name", CASES)
def test_trimming_is_stable(name: str, tmp_path: Path) -> None:
    """make_bundles.py's trim, rewritten through the forensics writer, is a fixed point on the golden bundles:
    trimming one again to the same window gives byte-identical files (checksums consistent by construction)."""
    mod = _make_bundles()
    mod.trim_bundle(GOLDEN / name, tmp_path, name)
    for f in (GOLDEN / name).rglob("*"):
        if f.is_file():
            assert (tmp_path / name / f.relative_to(GOLDEN / name)).read_bytes() == f.read_bytes(), f
    read_bundle(tmp_path / name)  # verifies sizes and sha256 against the rewritten manifest


def test_cli_replay_terminal_and_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "140")
    assert run_cli(["replay", str(GOLDEN / "stall")], monkeypatch) == 0
    out = capsys.readouterr().out
    for s in ("row-fetch stall", "rank 3", "fetch_rows", "STALLED", "128-255", "consistency"):
        assert s in out, s
    assert run_cli(["replay", str(GOLDEN / "crash"), "--json"], monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"]["kind"] == "process exited"


def test_cli_replay_usage_errors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["replay", str(GOLDEN / "stall"), "--traffic"], monkeypatch) == 2
    assert "--target" in capsys.readouterr().err
    assert run_cli(["replay", "/nonexistent/bundle"], monkeypatch) == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(("live_rank", "agrees"), [(3, True), (2, False)])
def test_replay_compares_with_the_triggering_sidecars_live_verdict(tmp_path: Path, live_rank: int,
                                                                    agrees: bool) -> None:
    """GIVEN a bundle whose manifest carries the triggering sidecar's live verdict WHEN replayed THEN the report
    compares the replayed verdict with it (kind, rank, node) and says so; a different rank is reported."""
    import shutil

    shutil.copytree(GOLDEN / "stall", tmp_path / "stall")
    man = tmp_path / "stall" / "manifest.json"
    doc = json.loads(man.read_text())
    doc["live_verdict"] = {**doc["verdict"], "rank": live_rank, "evidence": ["seen live on node 1"]}
    man.write_text(json.dumps(doc))
    result = replay_bundle(tmp_path / "stall")
    assert result.live is not None and result.live.rank == live_rank
    assert result.live_matches is agrees
    out = result.to_json()
    assert out["live_verdict"]["rank"] == live_rank and out["live_verdict_matches"] is agrees
    want = "agrees with the verdict the triggering sidecar reached live" if agrees else "DIFFERS from the triggering"
    assert out["comparison"].startswith(want), out["comparison"]


def test_a_draft_off_seats_zero_accept_length_is_no_figure() -> None:
    """GIVEN the stall bundle's metrics with sglang:spec_accept_length at 0.0 (SGLang 0.5.23 exports the gauge at 0
    with no draft; seen on its CPU engine) WHEN its activity is analysed THEN no accept length is reported."""
    from dataclasses import replace

    from sgl_seat.core.records import MetricsPoint
    from sgl_seat.forensics.replay.analysis import activity

    b = read_bundle(GOLDEN / "stall")
    trig = b.manifest.trigger_t
    off = replace(b, metrics=[MetricsPoint(p.t, p.node, {**p.values, "sglang:spec_accept_length": 0.0})
                              for p in b.metrics])
    act = activity(off, trig)
    assert act["spec_accept_length_mean"] is None and act["spec_accept_length_last"] is None
    assert activity(b, trig)["spec_accept_length_mean"] > 1.0  # draft on: the figure stays
