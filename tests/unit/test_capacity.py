"""Capacity planner: cell sizes checked against numbers computed by hand, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_seat.capacity import GIB, load_model_shape, predict
from sgl_seat.errors import CapacityError
from sgl_seat.plan import build_plan
from sgl_seat.spec import SeatSpec, load_spec

DSV3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "num_nextn_predict_layers": 1,
    "torch_dtype": "bfloat16",
}
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}


def _model_dir(tmp_path: Path, cfg: dict[str, object], total: int) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}}))
    return d


def _spec(model_dir: Path, *, tp: int = 8, nodes: int = 2, gpu_gb: float = 80) -> SeatSpec:
    return SeatSpec.model_validate(
        {
            "schema_version": 1,
            "name": "t",
            "engine": "sglang",
            "model": {"path": "/m", "context_length": 32768, "config": str(model_dir)},
            "cluster": {"nodes": nodes, "gpus_per_node": tp // nodes, "gpu_memory_gb": gpu_gb},
            "parallel": {"tp": tp, "ep": tp},
            "memory_fraction": 0.85,
            "slots": 64,
        }
    )


def test_mla_cell_is_latent_times_layers_times_dtype_not_sharded(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, DSV3, 680 * 10**9)
    shape = load_model_shape(d / "config.json")
    cap = predict(_spec(d), shape, draft=False, slots=64, mem_fraction=0.85)
    # (512 + 64) latent x 61 layers x 2 bytes (bf16), the same on every TP rank.
    assert cap.kv_bytes_per_token == (512 + 64) * 61 * 2 == 70_272
    cap_tp4 = predict(_spec(d, tp=4), shape, draft=False, slots=64, mem_fraction=0.85)
    assert cap_tp4.kv_bytes_per_token == cap.kv_bytes_per_token


def test_gqa_cell_is_sharded_by_tp(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, LLAMA, 140 * 10**9)
    shape = load_model_shape(d / "config.json")
    cap = predict(_spec(d, tp=8), shape, draft=False, slots=64, mem_fraction=0.85)
    # 2 (K,V) x 8 kv heads / 8 TP x head_dim 128 x 80 layers x 2 bytes.
    assert cap.kv_bytes_per_token == 2 * 1 * 128 * 80 * 2 == 40_960
    cap4 = predict(_spec(d, tp=4), shape, draft=False, slots=64, mem_fraction=0.85)
    assert cap4.kv_bytes_per_token == 2 * 2 * 128 * 80 * 2


def test_pool_follows_sglangs_formula(tmp_path: Path) -> None:
    """rest = pre*mf - weights - reserve; pool = rest // cell (page size 1 here)."""
    d = _model_dir(tmp_path, LLAMA, 140 * 10**9)
    shape = load_model_shape(d / "config.json")
    cap = predict(_spec(d, tp=8), shape, draft=False, slots=64, mem_fraction=0.85)
    pre = 80 * GIB - 1 * GIB
    rest = int(pre - 140 * 10**9 // 8 - 2 * GIB - pre * 0.15)
    assert cap.kv_pool_tokens == rest // 40_960
    assert cap.max_running_requests == 64


def test_sliding_window_layers_are_sized_per_request(tmp_path: Path) -> None:
    cfg = {**LLAMA, "sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention"] * 40}
    d = _model_dir(tmp_path, cfg, 140 * 10**9)
    shape = load_model_shape(d / "config.json")
    cap = predict(_spec(d), shape, draft=False, slots=64, mem_fraction=0.85)
    assert cap.kv_bytes_per_token == 2 * 1 * 128 * 40 * 2
    assert cap.per_request_bytes == 4096 * 2 * 1 * 128 * 40 * 2


def test_draft_on_never_has_more_tokens_than_draft_off(tmp_path: Path) -> None:
    for cfg in (DSV3, LLAMA):
        d = tmp_path / cfg["architectures"][0]  # type: ignore[index]
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 300 * 10**9}}))
        shape = load_model_shape(d / "config.json")
        for mf in (0.7, 0.8, 0.85, 0.9):
            for slots in (1, 8, 32, 64):
                off = predict(_spec(d), shape, draft=False, slots=slots, mem_fraction=mf)
                on = predict(_spec(d), shape, draft=True, slots=slots, mem_fraction=mf)
                assert on.kv_pool_tokens <= off.kv_pool_tokens
                assert on.kv_bytes_per_token > off.kv_bytes_per_token


def test_draft_on_with_too_many_slots_is_refused_with_the_numbers() -> None:
    with pytest.raises(CapacityError) as exc:
        build_plan(load_spec("large"), draft=True, slots=16)
    msg = str(exc.value)
    assert "16 slots" in msg and "GiB" in msg and "--slots 11" in msg


def test_too_low_memory_fraction_is_refused() -> None:
    with pytest.raises(CapacityError, match="raise it above"):
        build_plan(load_spec("large"), draft=False, mem_fraction=0.5)


def test_slot_ceiling_is_half_the_pool(tmp_path: Path) -> None:
    d = _model_dir(tmp_path, LLAMA, 140 * 10**9)
    shape = load_model_shape(d / "config.json")
    cap = predict(_spec(d, tp=8, gpu_gb=24), shape, draft=False, slots=4000, mem_fraction=0.9)
    assert cap.max_running_requests == min(4000, cap.kv_pool_tokens // 2)


def test_without_a_safetensors_index_the_plan_is_built_but_not_predicted(tmp_path: Path) -> None:
    """The index is optional (issue 2): no weights total means no prediction, never a refusal."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA))
    plan = build_plan(_spec(d), draft=True, slots=64)
    assert plan.capacity is not None
    for cap in (plan.capacity.draft_off, plan.capacity.draft_on):
        assert cap.predicted is False and cap.kv_pool_tokens == 0 and cap.max_slots_that_fit == 0
    assert any("not predicted" in w for w in plan.warnings)
    assert plan.slots == 64
