"""The vLLM backend's plan (engines/vllm.py), without vLLM: its argv and environment, the draft's schedule from
``draft.off_above``, what it refuses and why, and its words. vLLM's own parser takes these lines in
``tests/contract/test_vllm_args.py``; the seat serves in ``tests/integration/test_real_vllm_seat.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sgl_seat.engines import backend_for, words_for
from sgl_seat.errors import PlanError, UsageError
from sgl_seat.gate.verdict import REPORT_SCHEMA_VERSION
from sgl_seat.gate.workloads import load_battery
from sgl_seat.plan import LaunchPlan, build_plan, render_text
from sgl_seat.spec import SeatSpec, builtin_seats_dir, load_spec


def _with(spec: SeatSpec, **draft: object) -> SeatSpec:
    return spec.model_copy(update={"draft": spec.draft.model_copy(update=draft)})


def _arg(cmd: tuple[str, ...], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_the_plan_runs_vllms_api_server_with_the_seats_flags() -> None:
    plan = build_plan(load_spec("local-vllm"))
    (node,) = plan.nodes
    cmd = node.command
    assert cmd[:3] == ("${engine_venv}/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    assert _arg(cmd, "--max-num-seqs") == "8" and _arg(cmd, "--max-model-len") == "2048"
    assert _arg(cmd, "--dtype") == "float32" and "--enforce-eager" in cmd and "--speculative-config" not in cmd
    env = node.env_dict()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env["SGLSEAT_PROBE"].startswith("vllm.model_executor.layers.vocab_parallel_embedding:")
    assert [r.process_title for r in node.ranks] == ["VLLM::Worker"]
    assert "node 0 (HTTP): Worker" in render_text(plan)
    assert LaunchPlan.from_json(json.loads(plan.dumps())).nodes[0].ranks == node.ranks


def test_the_draft_is_ngram_and_off_above_is_vllms_own_schedule() -> None:
    spec = load_spec("local-vllm")
    on = json.loads(_arg(build_plan(spec, draft=True).nodes[0].command, "--speculative-config"))
    assert on == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    tuned = build_plan(_with(spec, off_above=2), draft=True)
    cfg = json.loads(_arg(tuned.nodes[0].command, "--speculative-config"))
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 8, 0]]
    assert tuned.draft_policy is not None and tuned.draft_policy["schedule"] == [[1, 2, 4], [3, 8, 0]]
    assert not tuned.files  # no adaptive-tier file: the schedule is in the flag
    assert ("draft policy: --speculative-config num_speculative_tokens_per_batch_size: [[1, 2, 4], [3, 8, 0]]"
            in render_text(tuned))
    at_cap = build_plan(_with(spec, off_above=8), draft=True)
    assert json.loads(_arg(at_cap.nodes[0].command, "--speculative-config"))[
        "num_speculative_tokens_per_batch_size"] == [[1, 8, 4]]
    assert any("never turns speculation off" in w for w in at_cap.warnings)


def test_what_vllm_refuses_here_is_refused_at_plan_time_with_the_reason() -> None:
    spec = load_spec("local-vllm")
    with pytest.raises(PlanError, match="drafts with NGRAM or an EAGLE head"):
        build_plan(_with(spec, algorithm="STANDALONE", steps=3, draft_tokens=4, model_path="/m"), draft=True)
    with pytest.raises(PlanError, match=r"EAGLE needs draft\.model_path"):
        build_plan(_with(spec, algorithm="EAGLE", steps=3, draft_tokens=4), draft=True)
    with pytest.raises(PlanError, match="a chain"):
        build_plan(_with(spec, algorithm="EAGLE", steps=3, topk=2, draft_tokens=6, model_path="/m"), draft=True)
    two = spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"nodes": 2}),
                                  "parallel": spec.parallel.model_copy(update={"tp": 2})})
    with pytest.raises(PlanError, match="does not support ray"):
        build_plan(two)
    no_kv = spec.model_copy(update={"cpu": spec.cpu.model_copy(update={"kv_cache_gb": None})})
    with pytest.raises(PlanError, match=r"cpu\.kv_cache_gb is not set"):
        build_plan(no_kv)


def test_sglang_refuses_an_ngram_policy_that_only_vllm_runs() -> None:
    spec = _with(load_spec("local-sim"), algorithm="NGRAM", off_above=4)
    with pytest.raises(PlanError, match="EAGLE/EAGLE3 with topk 1"):
        build_plan(spec, draft=True)


def test_the_engine_cores_kv_line_is_the_actual_pool() -> None:
    line = ("(EngineCore pid=9370) INFO 12-06 10:41:12 [kv_cache_utils.py:2327] CPU KV cache size: 23,296 tokens, "
            "Maximum concurrency for 2,048 tokens per request: 11.38x")
    be = backend_for("vllm")
    assert be.parse_kv_tokens("noise\n" + line) == 23_296 and be.parse_kv_tokens("no such line") is None


def test_vllms_words_name_its_processes_and_metrics() -> None:
    w = words_for("vllm")
    assert w.rank_of_title("VLLM::Worker") == 0 and w.rank_of_title("VLLM::Worker_TP2") == 2
    assert w.kind_of_title("VLLM::EngineCore") == "engine-core" and w.rank_of_title("VLLM::EngineCore") is None
    assert w.kind_of_title("/x/.venv-vllm/bin/python -m vllm.entrypoints.openai.api_server") == "main"
    assert backend_for("vllm").is_main_cmdline(["/x/python", "-m", "vllm.entrypoints.openai.api_server"])
    assert w.running == "vllm:num_requests_running" and w.verify_steps == "vllm:spec_decode_num_drafts_total"


def test_tune_writes_a_vllm_seats_policy_as_its_schedule(tmp_path: Path) -> None:
    """`tune draft` on a vLLM seat: draft.off_above written from a report's crossover, and the policy it says is
    vLLM's schedule (the plan's argv then carries it: test_the_draft_is_ngram_and_off_above_is_vllms_own_schedule)."""
    from sgl_seat.gate.tune import tune_draft

    seat = tmp_path / "seats" / "v.yaml"
    seat.parent.mkdir()
    (tmp_path / "models").symlink_to(builtin_seats_dir().parent / "models")
    seat.write_text((builtin_seats_dir() / "local-vllm.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    report = tmp_path / "report.json"
    report.write_text(json.dumps({
        "schema_version": REPORT_SCHEMA_VERSION, "kind": "sgl-seat gate report", "synthetic": False,
        "crossover": {"estimate": 4.5, "ci_low": 3.2, "ci_high": 6.0, "below_sweep": False, "beyond_sweep": False},
        "comparisons": {"candidate": {"sweep": [{"concurrency": c, "ratio": r, "ci_low": r - 0.2, "ci_high": r + 0.2}
                                               for c, r in ((1, 2.0), (4, 1.1), (16, 0.6))]}}}))
    res = tune_draft(report, str(seat))
    assert res.off_above == 3 and load_spec(str(seat)).draft.off_above == 3
    assert res.policy["schedule"] == [[1, 3, 4], [4, 8, 0]] and "num_speculative_tokens_per_batch_size" in res.how()


def test_the_cpu_pool_is_vllms_arithmetic_over_the_config() -> None:
    """SmolLM2-135M's shape (30 layers, 3 KV heads of 64): vLLM's engine core logged 23,296 tokens for 1 GiB of
    float32 at 2,048 tokens of context, 46,592 for 2 GiB, and 22,750 at a context of 2,000 (its capacity counts whole
    requests of blocks, not blocks x 128); tests/contract/test_vllm_args.py holds the function to vLLM's own code."""
    from sgl_seat.engines.vllm import cpu_kv_tokens

    cfg = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576,
           "head_dim": 64, "torch_dtype": "bfloat16"}
    assert cpu_kv_tokens(cfg, gib=1, dtype="float32", max_model_len=2048) == 23_296
    assert cpu_kv_tokens(cfg, gib=2, dtype="float32", max_model_len=2048) == 46_592
    assert cpu_kv_tokens(cfg, gib=1, dtype="float32", max_model_len=2000) == 22_750
    assert cpu_kv_tokens(cfg, gib=1, dtype="auto", max_model_len=2048) == 46_592  # the config's bf16: half the bytes
    assert cpu_kv_tokens({"num_hidden_layers": 30}, gib=1, dtype="float32", max_model_len=2048) is None


SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "hidden_size": 576, "head_dim": 64, "torch_dtype": "bfloat16"}


def test_an_eagle_head_is_vllms_eagle_method_and_its_layer_joins_the_pool(tmp_path: Path) -> None:
    """An EAGLE head (eaglehead.py's, one layer): vLLM's ``eagle`` method with the head's directory and ``steps``
    tokens a step (the spec's draft_tokens counts the verified token too, SGLang's way); the head's layer joins
    every KV block: vLLM 0.32's engine core logged 22,528 tokens for 1 GiB with it, 23,296 without (this host,
    2026-12-06, the trained model in float32)."""
    target, head = tmp_path / "target", tmp_path / "head"
    target.mkdir()
    head.mkdir()
    (target / "config.json").write_text(json.dumps(SMOLLM2))
    (head / "config.json").write_text(json.dumps({**SMOLLM2, "num_hidden_layers": 1}))
    spec = load_spec("local-vllm")
    spec = _with(spec.model_copy(update={"model": spec.model.model_copy(update={"path": str(target)})}),
                 algorithm="EAGLE", steps=3, draft_tokens=4, model_path=str(head))
    plan = build_plan(spec, draft=True)
    cfg = json.loads(_arg(plan.nodes[0].command, "--speculative-config"))
    assert cfg == {"method": "eagle", "model": str(head), "num_speculative_tokens": 3}
    assert plan.capacity_note is not None
    assert "23,296 tokens by vLLM's own arithmetic" in plan.capacity_note
    assert "22,528 with the EAGLE head on" in plan.capacity_note
    tuned = json.loads(_arg(build_plan(_with(spec, off_above=2), draft=True).nodes[0].command, "--speculative-config"))
    assert tuned["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 8, 0]]
    (head / "config.json").unlink()
    assert "with the EAGLE head on: not predicted" in (build_plan(spec).capacity_note or "")


def test_a_vllm_eagle_seats_hybrid_is_its_schedule_not_sglangs_tiers(tmp_path: Path) -> None:
    """The gate's hybrid arm of a vLLM seat drafting with an EAGLE head is the seat's draft with its off_above, run as
    vLLM's schedule: SGLang's adaptive tiers (which the spec would allow for EAGLE with topk 1) are not vLLM's."""
    from sgl_seat.gate.arms import arm_spec

    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({**SMOLLM2, "num_hidden_layers": 1}))
    spec = _with(load_spec("local-vllm"), algorithm="EAGLE", steps=3, draft_tokens=4, model_path=str(head))
    with pytest.raises(UsageError, match=r"has no policy: its EAGLE draft runs one only with draft\.off_above"):
        arm_spec(spec, "hybrid")
    hyb = arm_spec(_with(spec, off_above=2), "hybrid")
    assert not hyb.draft.adaptive and hyb.draft.off_above == 2
    cfg = json.loads(_arg(build_plan(hyb, draft=True).nodes[0].command, "--speculative-config"))
    assert cfg["method"] == "eagle" and cfg["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 8, 0]]


def test_the_gate_refuses_a_sampled_sweep_with_a_draft_on_vllm(tmp_path: Path) -> None:
    """vLLM 0.32's CPU engine returns corrupted text for sampled requests while it drafts (docs/vllm-cpu.md): the plan
    warns with the draft on, and the gate refuses a sampled sweep with a drafting arm before anything starts; greedy
    sweeps and an A/A battery are not refused, and SGLang's seats are not."""
    from sgl_seat.gate import GateOptions, run_gate

    spec = load_spec("local-vllm")
    assert any("corrupted text for sampled requests" in w for w in build_plan(spec, draft=True).warnings)
    assert not any("corrupted" in w for w in build_plan(spec).warnings)
    sampled = tmp_path / "sampled.yaml"
    battery = yaml.safe_load(load_battery(quick=False).model_dump_json())  # the shipped battery, its sweep sampled
    battery["sweep"].update(temperature=0.7, ignore_eos=False)
    sampled.write_text(yaml.safe_dump({"schema_version": 1, "full": battery, "quick": {}}))
    opts = GateOptions(spec=spec, workloads=sampled, arms=["baseline", "candidate"], out=tmp_path / "battery")
    with pytest.raises(UsageError, match=r"the sweep samples \(temperature 0.7\) and arm candidate drafts") as exc:
        run_gate(opts)
    assert "greedy sweep" in (exc.value.fix or "")
    assert not (tmp_path / "battery").exists()  # refused before the battery directory was made
    from sgl_seat.gate import _refuse_a_sampled_sweep_the_engine_corrupts as refuse

    refuse(GateOptions(spec=spec, arms=["baseline", "candidate"]), 0.0)  # greedy: no refusal
    refuse(GateOptions(spec=spec, arms=["baseline", "control"]), 0.7)  # no arm drafts
    refuse(GateOptions(spec=load_spec("local-sglang"), arms=["baseline", "candidate"]), 0.7)

