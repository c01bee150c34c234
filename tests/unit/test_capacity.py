"""Capacity through the mirror (no SGLang here): cells and pools checked against arithmetic done by hand from
SGLang 0.5.23's code, the DeepSeek-V4 pool on the published geometry, V4.1's request-cap SWA pool and its
refusal of EAGLE, the weights input, and the refusals with their numbers.

The mirror is held to SGLang's own code by tests/contract/test_sizing_mirror.py; these tests pin the
arithmetic so a change to it is seen without SGLang installed.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from sgl_seat.errors import CapacityError
from sgl_seat.sizing import SOURCE_MIRROR, plan_capacity, refuse_if_unbootable
from sgl_seat.sizing.capacity import GIB
from sgl_seat.spec import SeatSpec

MODELS = Path(__file__).resolve().parents[2] / "launch" / "models"
DSV3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512,
    "qk_rope_head_dim": 64, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16",
}
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192, "torch_dtype": "bfloat16",
}


@pytest.fixture(autouse=True)
def _mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")


def _model_dir(tmp_path: Path, cfg: dict[str, object], total: int | None) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    if total is not None:
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}}))
    return d


def _spec(model_dir: Path, *, tp: int = 8, nodes: int = 2, gpu_gb: float = 80, context: int = 32768,
          **extra: object) -> SeatSpec:
    doc: dict[str, object] = {
        "schema_version": 1, "name": "t", "engine": "sglang",
        "model": {"path": "/m", "context_length": context, "config": str(model_dir)},
        "cluster": {"nodes": nodes, "gpus_per_node": tp // nodes, "gpu_memory_gb": gpu_gb},
        "parallel": {"tp": tp, "ep": tp}, "memory_fraction": 0.85, "slots": 64,
    }
    doc.update(extra)
    return SeatSpec.model_validate(doc)


def _rest(gpu_gb: float, weights_per_gpu: int, mf: float, draft_bytes: int = 0) -> int:
    """SGLang's _profile_available_bytes on the budget capacity.py feeds it (1 GiB context, 2 GiB reserve)."""
    pre = gpu_gb * GIB - GIB
    after = pre - weights_per_gpu - draft_bytes - 2 * GIB
    return int((after / GIB - pre / GIB * (1 - mf)) * GIB)


def test_mla_cell_is_latent_times_layers_times_dtype_not_sharded(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, DSV3, 250 * 10**9)
    cap = plan_capacity(_spec(d), slots_off=64, slots_on=8, mem_fraction=0.85)
    assert cap is not None and cap.source == SOURCE_MIRROR
    # (512 + 64) latent x 61 layers x 2 bytes (bf16), the same on every TP rank.
    assert cap.draft_off.kv_bytes_per_token == (512 + 64) * 61 * 2 == 70_272
    # EAGLE/MTP: one draft layer folded into the cell, int(cell * 1 / 61).
    assert cap.draft_on.kv_bytes_per_token == 70_272 + 70_272 // 61
    cap4 = plan_capacity(_spec(d, tp=4), slots_off=64, slots_on=8, mem_fraction=0.85)
    assert cap4 is not None and cap4.draft_off.kv_bytes_per_token == 70_272


def test_mha_cell_is_sharded_by_tp_and_the_pool_follows_sglangs_formula(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, LLAMA, 140 * 10**9)
    cap = plan_capacity(_spec(d, tp=8), slots_off=64, slots_on=8, mem_fraction=0.85)
    assert cap is not None
    # 8 kv heads / 8 TP x (128 K + 128 V) x 80 layers x 2 bytes.
    assert cap.draft_off.kv_bytes_per_token == 1 * 256 * 80 * 2 == 40_960
    assert cap.draft_off.kv_pool_tokens == _rest(80, 140 * 10**9 // 8, 0.85) // 40_960
    assert cap.draft_off.max_running_requests == 64
    cap4 = plan_capacity(_spec(d, tp=4), slots_off=64, slots_on=8, mem_fraction=0.85)
    assert cap4 is not None and cap4.draft_off.kv_bytes_per_token == 2 * 256 * 80 * 2


def _v4_bytes_per_full_token(*, spec_decode: bool, swa_ratio: float | None) -> float:
    """DSV4PoolConfigurator on the published geometry, by hand: 43 layers, ratios 4 on 21, 128 on 20."""
    page = 256
    paged = math.ceil(page * 584 / 576) * 576 / page  # V4 layout row 584 B, page stride padded to 576 B
    paged128 = math.ceil(2 * 584 / 576) * 576 / 2
    ring4 = 16 if spec_decode else 8
    swa_token = paged * 43 + ring4 / page * (2 * 2 * 512 * 4 + 2 * 2 * 128 * 4) * 21
    compressed = 21 * (paged / 4 + (128 + 4) / 4) + 20 * paged128 / 128
    full = (swa_ratio or 0) * swa_token + compressed
    return full * (44 / 43 if spec_decode else 1)


def _v4_spec(tmp_path: Path, model: str, weights_gb: float, **extra: object) -> SeatSpec:
    d = tmp_path / model
    shutil.copytree(MODELS / model, d)
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": int(weights_gb * GIB)}}))
    return _spec(d, tp=4, nodes=2, gpu_gb=96, context=409_600, **extra)


def test_published_v4_flash_pool_is_the_dsv4_configurator_by_hand(tmp_path: Path) -> None:
    spec = _v4_spec(tmp_path, "deepseek-v4-flash", 286.0)
    cap = plan_capacity(spec, slots_off=32, slots_on=8, mem_fraction=0.85)
    assert cap is not None and cap.model_type == "deepseek_v4"
    off, on = cap.draft_off, cap.draft_on
    bpt = _v4_bytes_per_full_token(spec_decode=False, swa_ratio=0.1)
    assert off.kv_bytes_per_token == round(bpt) == 7087
    assert on.kv_bytes_per_token == round(_v4_bytes_per_full_token(spec_decode=True, swa_ratio=0.1))
    weights = int(286 * GIB) // 4
    # Fixed bytes: the c128 compress-state rows, (33 slots x 128 ring + 129) padded to 128, x 2 x 512 x fp32 x 20.
    c128 = math.ceil((33 * 128 + 129) / 128) * 128 * 2 * 512 * 4 * 20
    tokens = int((_rest(96, weights, 0.85) - c128) / bpt) // 256 * 256
    assert off.kv_pool_tokens == tokens
    assert off.swa_pool_tokens == int(tokens * 0.1) // 256 * 256
    assert off.configurator == "DSV4PoolConfigurator"
    assert on.kv_pool_tokens < off.kv_pool_tokens and on.fits and off.fits


def test_v41_sizes_the_swa_pool_by_request_cap_and_refuses_eagle(tmp_path: Path) -> None:
    spec = _v4_spec(tmp_path, "deepseek-v4.1-flash-engram", 286.0)
    cap = plan_capacity(spec, slots_off=32, slots_on=8, mem_fraction=0.85)
    assert cap is not None and cap.model_type == "deepseek_v41"
    # compute_swa_request_cap: (128 window + 128 eviction + 256 page + 256 decode) x 32 + 2 x 8192 chunk + 256,
    # plus 4 x 32 prefix tails x (128 + 256), aligned to the page.
    cap_tokens = math.ceil(((128 + 128 + 256 + 256) * 32 + 2 * 8192 + 256 + 128 * 384) / 256) * 256
    assert cap.draft_off.swa_pool_tokens == cap_tokens == 90_368
    assert cap.draft_off.kv_bytes_per_token == round(_v4_bytes_per_full_token(spec_decode=False, swa_ratio=None))
    assert not cap.draft_on.fits and cap.draft_on.kv_pool_tokens == 0
    assert "DeepSeek-V4.1 does not support speculative decoding other than DSpark" in (cap.draft_on.problem or "")
    with pytest.raises(CapacityError, match="DSpark"):
        refuse_if_unbootable(spec, cap.draft_on)


def test_draft_on_never_has_more_tokens_than_draft_off(tmp_path: Path) -> None:
    for name, cfg in (("dsv3", DSV3), ("llama", LLAMA)):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 300 * 10**9}}))
        for mf in (0.7, 0.85, 0.9):
            cap = plan_capacity(_spec(d), slots_off=8, slots_on=8, mem_fraction=mf)
            assert cap is not None
            assert cap.draft_on.kv_pool_tokens < cap.draft_off.kv_pool_tokens
            assert cap.draft_on.kv_bytes_per_token > cap.draft_off.kv_bytes_per_token


def test_too_many_slots_is_refused_with_the_largest_that_fits(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, LLAMA, 148 * GIB)  # 18.5 GiB per GPU leaves ~0.2 GiB of KV on 24 GiB at 0.9
    spec = _spec(d, tp=8, gpu_gb=24)
    cap = plan_capacity(spec, slots_off=4000, slots_on=8, mem_fraction=0.9)
    assert cap is not None
    off = cap.draft_off
    assert off.max_running_requests == off.kv_pool_tokens // 2 < 4000 and not off.fits
    assert off.max_slots_that_fit == off.kv_pool_tokens // 2
    with pytest.raises(CapacityError, match=f"--slots {off.max_slots_that_fit} or fewer"):
        refuse_if_unbootable(spec, off)


def test_too_low_memory_fraction_is_refused_with_sglangs_words(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, LLAMA, 500 * 10**9)
    spec = _spec(d, tp=8)
    cap = plan_capacity(spec, slots_off=8, slots_on=8, mem_fraction=0.5)
    assert cap is not None and not cap.draft_off.fits
    assert "Raise --mem-fraction-static above" in (cap.draft_off.problem or "")
    with pytest.raises(CapacityError):
        refuse_if_unbootable(spec, cap.draft_off)


def test_without_weights_the_plan_is_not_predicted(tmp_path: Path) -> None:
    """No safetensors index and no model.weights_gb: no prediction, never a refusal."""
    d = _model_dir(tmp_path, LLAMA, None)
    cap = plan_capacity(_spec(d), slots_off=64, slots_on=8, mem_fraction=0.85)
    assert cap is not None
    for state in (cap.draft_off, cap.draft_on):
        assert state.predicted is False and state.kv_pool_tokens == 0 and state.max_slots_that_fit == 0
    refuse_if_unbootable(_spec(d), cap.draft_on)  # does not raise


def test_a_model_the_mirror_does_not_cover_is_not_predicted_rather_than_guessed(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, {**LLAMA, "sliding_window": 4096, "layer_types": ["sliding_attention"] * 80},
                   140 * 10**9)
    cap = plan_capacity(_spec(d), slots_off=8, slots_on=8, mem_fraction=0.85)
    assert cap is not None and not cap.draft_off.predicted
    assert "mirror does not cover" in (cap.draft_off.problem or "")


def test_a_single_safetensors_file_without_an_index_gives_its_tensors_bytes(tmp_path: Path) -> None:
    """A checkpoint saved as one model.safetensors (no index, as the trained model is): the weights are the file
    less its header, and the plan is predicted from them."""
    from sgl_seat.sizing.capacity import safetensors_data_bytes, weights_total_bytes

    d = _model_dir(tmp_path, LLAMA, None)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 16]}}).encode()
    path = d / "model.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    assert safetensors_data_bytes(path) == 16
    assert weights_total_bytes(_spec(d), d / "config.json") == 16
    cap = plan_capacity(_spec(d), slots_off=64, slots_on=8, mem_fraction=0.85)
    assert cap is not None and cap.draft_off.predicted is True and cap.draft_off.kv_pool_tokens > 0


def test_a_draft_checkpoint_on_disk_gives_the_draft_its_own_weights(tmp_path: Path) -> None:
    """A STANDALONE draft whose directory holds its weights (one model.safetensors): the plan takes them, not
    draft.extra_weights_gb's 2 GiB default (the H100 run of 2026-12-06: the plan 2.5 % under the engine's pool)."""
    from sgl_seat.sizing.capacity import EngramPlacement, checkpoint_bytes, memory_budget

    d = _model_dir(tmp_path, LLAMA, 10 * GIB)
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({**LLAMA, "num_hidden_layers": 2}))
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    (draft / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    assert checkpoint_bytes(draft / "config.json") == 8
    spec = _spec(d, tp=8, draft={"enabled": True, "algorithm": "STANDALONE", "model_path": str(draft),
                                  "config": str(draft)})
    none = EngramPlacement(tables=None, host_table=False, layout="shared", staging=False)
    on = memory_budget(spec, weights_total=10 * GIB, engram=none, draft=True, draft_weights_total=8 * 8)
    guess = memory_budget(spec, weights_total=10 * GIB, engram=none, draft=True)
    assert on.draft_weights_bytes == 8 and guess.draft_weights_bytes == 2 * GIB
    cap = plan_capacity(spec, slots_off=64, slots_on=8, mem_fraction=0.85)
    assert cap is not None and cap.draft_on.draft_weights_bytes_per_gpu == 1  # 8 bytes over TP8
