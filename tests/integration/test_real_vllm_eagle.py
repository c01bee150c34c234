"""Real vLLM 0.32 on its CPU engine drafting with an EAGLE head made by ``sgl_seat/engines/eaglehead.py``, brought
up and down by `sgl-seat` (full tier: training even a small head and a second real engine start take minutes on 2
cores; the CI tier's vLLM seat drafts with NGRAM, ``test_real_vllm_seat.py``).

The head here is a SMALL one, trained in seconds from 12 of the model's own answers: these tests are of the
mechanics (the plan's EAGLE line is served, the head's layer is in the pool as the plan predicts, the draft drafts,
greedy answers stay the target's), not of its acceptance; ``bench/vllm/eagle_acceptance.py`` measures a full head's.

Ports 24770-24779. Processes checked by pid, process group and the seat's name (``realseat.brought_up``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from launchutil import REPO
from realseat import RealSeat, brought_up
from test_real_vllm_seat import LOCAL_VLLM, MODEL, _chat, _metrics, require_vllm

from sgl_seat.engines.vllm import predicted_pool, vllm_venv
from sgl_seat.spec import load_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HTTP_PORT = 24770
NAME = "rv-eagle"


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealSeat]:
    require_vllm()
    base = tmp_path_factory.mktemp("real-vllm-eagle")
    venv = Path(vllm_venv())
    made = subprocess.run([str(venv / "bin" / "python"), str(REPO / "sgl_seat" / "engines" / "eaglehead.py"), "train",
                           "--model", str(venv / "models" / MODEL), "--out", str(base / "head"), "--engine", "vllm",
                           "--texts", "12", "--max-new-tokens", "32", "--epochs", "1"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert made.returncode == 0, made.stderr[-3000:]
    doc: dict[str, Any] = yaml.safe_load(LOCAL_VLLM.read_text())
    doc["name"] = NAME
    doc["network"]["http_port"], doc["network"]["dist_init_port"] = HTTP_PORT, HTTP_PORT + 5
    doc["draft"].update(algorithm="EAGLE", steps=3, topk=1, draft_tokens=4, model_path=str(base / "head" / "vllm"))
    spec = base / f"{NAME}.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    rs = RealSeat(base / "home", spec, NAME, HTTP_PORT)
    with brought_up(rs, "--draft", "on"):
        yield rs


def test_the_eagle_seat_is_ready_with_the_pool_the_plan_predicts(seat: RealSeat) -> None:
    """GIVEN an EAGLE head WHEN `up --draft on` THEN READY with the draft, and the engine core's KV line is the plan's
    draft-on prediction: the head's layer joins every block (22,528 tokens for 1 GiB, not the draft-off 23,296)."""
    st = seat.remember()
    assert st["state"] == "READY" and st["engine"] == "vllm" and st["draft"] is True, st
    spec = load_spec(str(seat.spec))
    assert st["kv_pool"]["actual"] == predicted_pool(spec, draft=True) == 22_528, st["kv_pool"]
    assert predicted_pool(spec) == 23_296


def test_the_head_drafts_every_step_and_greedy_answers_stay_the_targets(seat: RealSeat) -> None:
    """GIVEN the seat WHEN greedy chats THEN the answer names Paris (verification keeps the target's tokens), and
    vLLM's own counters show a draft at every decode step (EAGLE proposes whenever it decodes)."""
    before = _metrics(seat)
    assert "Paris" in _chat(seat, "What is the capital of France?", max_tokens=32)
    after = _metrics(seat)
    drafts = after["vllm:spec_decode_num_drafts_total"] - before.get("vllm:spec_decode_num_drafts_total", 0.0)
    proposed = (after["vllm:spec_decode_num_draft_tokens_total"]
                - before.get("vllm:spec_decode_num_draft_tokens_total", 0.0))
    accepted = (after["vllm:spec_decode_num_accepted_tokens_total"]
                - before.get("vllm:spec_decode_num_accepted_tokens_total", 0.0))
    print(f"EAGLE (small head): {drafts:.0f} drafts, {proposed:.0f} tokens proposed, {accepted:.0f} accepted")
    assert drafts > 0 and proposed == 3 * drafts
    r = httpx.get(f"{seat.endpoint}/v1/models", timeout=30.0, trust_env=False)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL
