"""The gate's battery on the TRAINED model on a real GPU, replayed in CI from its cells.

What was recorded (tests/fixtures/gpu/sglang-0.5.17-h100-trained/README.md): ``sgl-seat gate --arms
baseline,candidate,hybrid,control`` on one H100, SGLang 0.5.17, SmolLM2-135M-Instruct (trained weights, bf16) with
the EAGLE-1 head eaglehead.py trained from the model's own answers; the hybrid is that draft under ``off_above: 4``
(SGLang's adaptive tiers). Every slot a cold ``up``. Held here: the report the gate's own code builds from those cells
is the report the GPU run wrote; the engine's counters in the cells show a trained draft accepted (the random heads
of the earlier fixtures stay at 1.0) and the hybrid drafting at and under its threshold only; ``tune draft`` refuses
a policy for a draft that lost already at one client.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import zstandard

from sgl_seat.errors import TuneRefused
from sgl_seat.gate.runner import BatteryDir
from sgl_seat.gate.tune import policy_from_report
from sgl_seat.gate.verdict import build_report

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "sglang-0.5.17-h100-trained" / "gate-battery.tar.zst"


@pytest.fixture(scope="module")
def battery(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trained-gate")
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(FIX.read_bytes())).read()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        tar.extractall(out, filter="data")
    return out / "battery"


def _cell(battery: Path, slot: str, cell: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((battery / "cells" / slot / f"{cell}.json").read_text())["data"]
    return data


def test_the_gates_code_rebuilds_the_gpu_runs_report_from_its_cells(battery: Path) -> None:
    recorded = json.loads((battery / "report.json").read_text())
    rebuilt = json.loads(json.dumps(build_report(BatteryDir(battery))))
    assert rebuilt == recorded
    assert rebuilt["complete"] and not rebuilt["synthetic"]
    assert rebuilt["design"]["arms"] == ["baseline", "candidate", "hybrid", "control"]
    assert rebuilt["noise_floor"]  # the control arm's A/A floor


def test_the_engine_served_the_trained_draft_and_the_hybrids_tiers(battery: Path) -> None:
    for slot, algo, adaptive in (("r00-baseline", None, False), ("r00-candidate", "EAGLE", False),
                                 ("r00-hybrid", "EAGLE", True), ("r00-control", None, False)):
        info = _cell(battery, slot, "engine")["info"]
        assert (info["version"], info["speculative_algorithm"], info["speculative_adaptive"]) == ("0.5.17", algo,
                                                                                                 adaptive), slot
        assert info["synthetic"] is False


@pytest.mark.parametrize("rep", ["r00", "r01"])
def test_the_trained_draft_is_accepted_and_the_hybrid_drafts_only_up_to_its_threshold(battery: Path, rep: str) -> None:
    """Accept length = the engine's generated tokens over its verify steps across each sweep cell. The static draft
    is accepted at every level (a random head: 1.008); the hybrid (off above 4 running requests) at 1 and 4 clients
    only: at 16 and 64 SGLang's zero-step tier verifies one token a step."""

    def accept(arm: str, c: int) -> float:
        k = _cell(battery, f"{rep}-{arm}", f"sweep_c{c}")["counters"]
        return float(k["generated"]) / float(k["verify_steps"])

    assert all(accept("candidate", c) > 1.15 for c in (1, 4, 16, 64))
    assert all(accept("hybrid", c) > 1.15 for c in (1, 4))
    assert all(accept("hybrid", c) < 1.02 for c in (16, 64))


def test_tune_refuses_a_policy_for_a_draft_that_lost_at_one_client(battery: Path) -> None:
    rep = json.loads((battery / "report.json").read_text())
    assert rep["crossover"]["below_sweep"]
    with pytest.raises(TuneRefused, match="lost already at the smallest concurrency measured"):
        policy_from_report(rep)
