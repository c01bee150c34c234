"""The mirror (sgl_seat.sizing.mirror) against SGLang 0.5.23's own sizing code, side by side over a grid.

Grid: the shipped DeepSeek-V4 configs (``deepseek_v4`` and ``deepseek_v41``), draft off and EAGLE on with
1-5 steps (topk 1), ``--speculative-adaptive``, memory fraction 0.70-0.92, 1-64 slots, two context lengths
and two weight figures; plus the default configurator's MLA (DeepSeek-V3 with its MTP draft) and MHA cells.
Every case is run by SGLang's code (one child process for the whole grid) and by the mirror; pool tokens must
agree within 1 %, max running requests exactly, and a refusal on one side must be a refusal on the other.
Under CI=true a missing SGLang fails these tests (conftest.py).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.sizing import SizingCase, SizingError, mirror, size_with_sglang
from tests.contract.conftest import require

pytestmark = pytest.mark.contract

MODELS = Path(__file__).resolve().parents[2] / "launch" / "models"
GIB = 1 << 30
EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1"]
DSV3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "hidden_size": 7168, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16", "vocab_size": 129280, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "max_position_embeddings": 163840, "rope_theta": 10000, "rms_norm_eps": 1e-6,
    "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "norm_topk_prob": True,
}
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192, "intermediate_size": 28672,
    "torch_dtype": "bfloat16", "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
}


def _memory(gpu_gib: float, weights_gib: float, draft_gib: float) -> dict[str, int]:
    gpu = int(gpu_gib * GIB)
    pre = gpu - GIB
    return {"gpu_memory_bytes": gpu, "pre_load_bytes": pre,
            "free_after_load_bytes": pre - int(weights_gib * GIB) - int(draft_gib * GIB) - 2 * GIB}


def _grid(tmp: Path) -> list[tuple[SizingCase, dict[str, Any]]]:
    cases: list[tuple[SizingCase, dict[str, Any]]] = []
    for name in ("deepseek-v4-flash", "deepseek-v4.1-flash-engram"):
        cfg = json.loads((MODELS / name / "config.json").read_text())
        steps = [[*EAGLE, "--speculative-num-steps", str(s), "--speculative-num-draft-tokens", str(s + 1)]
                 for s in (1, 3, 5)]
        drafts: list[list[str]] = [[], *steps]
        drafts.append([*EAGLE, "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4",
                       "--speculative-adaptive"])
        for draft, mf, slots, ctx, weights in itertools.product(
            drafts, (0.70, 0.85, 0.92), (1, 8, 32, 64), (65_536, 409_600), (60.0, 71.6)
        ):
            if draft and ctx == 65_536 and weights == 60.0:
                continue  # keep the grid's size in check: draft cases at the other three corners
            argv = ["--model-path", str(MODELS / name), "--tp-size", "4", "--ep-size", "4",
                    "--mem-fraction-static", str(mf), "--max-running-requests", str(slots),
                    "--context-length", str(ctx), *draft]
            mem = _memory(96, weights, 2.0 if draft else 0.0)
            cid = f"{name} draft={' '.join(draft[4:]) or 'off'} mf={mf} slots={slots} ctx={ctx} w={weights}"
            cases.append((SizingCase(cid, tuple(argv), search_slots=(slots == 8 and mf == 0.85), **mem), cfg))
    for name, cfg, tp in (("dsv3", DSV3, 8), ("llama", LLAMA, 8)):
        d = tmp / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        draft_options: list[list[str]] = [[]]
        if name == "dsv3":
            draft_options.append([*EAGLE, "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"])
        for draft, mf, slots in itertools.product(draft_options, (0.7, 0.85, 0.92), (1, 64)):
            argv = ["--model-path", str(d), "--tp-size", str(tp), "--ep-size", str(tp),
                    "--mem-fraction-static", str(mf), "--max-running-requests", str(slots),
                    "--context-length", "32768", *draft]
            mem = _memory(80, 31.0, 1.0 if draft else 0.0)
            cases.append((SizingCase(f"{name} draft={bool(draft)} mf={mf} slots={slots}", tuple(argv), **mem), cfg))
    return cases


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    grid = _grid(tmp_path_factory.mktemp("models"))
    try:
        answers = size_with_sglang([c for c, _ in grid])
    except SizingError as exc:
        require(False, f"SGLang's sizing cannot run: {exc}")
        raise
    out = []
    for (case, cfg), got in zip(grid, answers.results, strict=True):
        kw = {"gpu_memory_bytes": case.gpu_memory_bytes, "pre_load_bytes": case.pre_load_bytes,
              "free_after_load_bytes": case.free_after_load_bytes}
        mine: dict[str, Any]
        try:
            res = mirror.size_case(cfg, case.argv, **kw)
            mine = {"ok": True, "tokens": res.max_total_num_tokens, "reqs": res.max_running_requests,
                    "swa": res.swa_max_total_num_tokens}
        except mirror.SglangWouldRefuse as exc:
            mine = {"ok": False, "error": str(exc)}
        if case.search_slots:
            mine["max_slots"] = mirror.max_slots_that_fit(cfg, case.argv, **kw)
        out.append((case.case_id, got, mine))
    return out


def test_the_grid_is_large_and_both_model_types_and_draft_states_are_in_it(
    side_by_side: list[tuple[str, dict[str, Any], dict[str, Any]]],
) -> None:
    ids = [cid for cid, _, _ in side_by_side]
    assert len(ids) >= 300
    assert any("deepseek-v4.1" in i and "draft=off" in i for i in ids)
    assert any("deepseek-v4-flash" in i and "adaptive" in i for i in ids)
    sglang_ok = [got for _, got, _ in side_by_side if got["ok"]]
    assert len(sglang_ok) >= 200, "most grid cases must be sized by SGLang, not refused"
    assert {got["configurator"] for got in sglang_ok} == {"DSV4PoolConfigurator", "DefaultPoolConfigurator"}


def test_mirror_within_one_percent_of_sglang_on_every_case(
    side_by_side: list[tuple[str, dict[str, Any], dict[str, Any]]],
) -> None:
    bad = []
    for cid, got, mine in side_by_side:
        if got["ok"] != mine["ok"]:
            bad.append(f"{cid}: SGLang {'sized' if got['ok'] else 'refused: ' + str(got['error'])}, "
                       f"mirror {'sized' if mine['ok'] else 'refused: ' + mine['error']}")
            continue
        if not got["ok"]:
            continue
        tokens = got["max_total_num_tokens"]
        if abs(mine["tokens"] - tokens) > 0.01 * tokens or mine["reqs"] != got["max_running_requests"]:
            bad.append(f"{cid}: SGLang {tokens} tokens / {got['max_running_requests']} reqs, "
                       f"mirror {mine['tokens']} / {mine['reqs']}")
        if got.get("swa_max_total_num_tokens") is not None and mine["swa"] != got["swa_max_total_num_tokens"]:
            swa = got["swa_max_total_num_tokens"]
            if abs(mine["swa"] - swa) > 0.01 * swa:
                bad.append(f"{cid}: SWA pool SGLang {swa}, mirror {mine['swa']}")
        if "max_slots_that_fit" in got and mine.get("max_slots") != got["max_slots_that_fit"]:
            bad.append(f"{cid}: most slots SGLang {got['max_slots_that_fit']}, mirror {mine.get('max_slots')}")
    assert not bad, f"{len(bad)} case(s) differ:\n" + "\n".join(bad[:20])


def test_refusals_agree_on_the_reason(side_by_side: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> None:
    refused = [(cid, got, mine) for cid, got, mine in side_by_side if not got["ok"]]
    assert any("deepseek-v4.1" in cid and "DSpark" in got["error"] for cid, got, _ in refused), (
        "V4.1 with EAGLE must be refused by SGLang"
    )
    for cid, got, mine in refused:
        words = "DSpark" if "DSpark" in got["error"] else got["error"].split(":", 1)[-1].strip()[:30]
        assert words in mine["error"], f"{cid}: SGLang said {got['error']!r}, mirror {mine['error']!r}"
