"""The SGLang CPU engine variant (``device: cpu``, the ``local-sglang`` profile), as the plan sees it.

What these hold: the CPU engine's flags and environment come from the sglang backend (the plan never asks
which device a seat runs on); ``--draft on`` is refused before anything starts, with the reason; capacity is
what ``--max-total-tokens`` sets, never a GPU figure; colocated nodes get their own ``--port``; and the tiny
models the seat serves are made the same way for the same seed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sgl_seat.engines import tinymodel
from sgl_seat.engines.base import argv_value
from sgl_seat.engines.sglang import SGLangBackend
from sgl_seat.errors import PlanError
from sgl_seat.plan import LaunchPlan, Placeholder, build_plan, render_text
from sgl_seat.spec import load_spec, parse_spec


@pytest.fixture
def plan() -> LaunchPlan:
    return build_plan(load_spec("local-sglang"))


def test_every_node_gets_the_cpu_engines_flags_and_environment(plan: LaunchPlan) -> None:
    assert [n.node_rank for n in plan.nodes] == [0, 1]
    for node in plan.nodes:
        argv = node.command
        assert argv[0] == "${engine_venv}/bin/python" and argv[1:3] == ("-m", "sglang.launch_server")
        assert argv_value(argv, "--device") == "cpu"
        assert argv_value(argv, "--attention-backend") == "torch_native"
        # The trained model's own weights, in float32 (its greedy answers are the model's: bf16 ties its first tokens)
        assert argv_value(argv, "--load-format") == "auto" and argv_value(argv, "--dtype") == "float32"
        assert argv_value(argv, "--max-total-tokens") == "65536"
        assert "--sleep-on-idle" in argv and "--enable-metrics" in argv
        assert argv_value(argv, "--tp-size") == "2" and argv_value(argv, "--nnodes") == "2"
        env = node.env_dict()
        assert env["SGLANG_USE_CPU_ENGINE"] == "1"
        assert env["LD_LIBRARY_PATH"] == "${engine_venv}/lib/sgl-seat-stub"
        assert env["SGLANG_NCCL_SO_PATH"] == "/nonexistent/libnccl.so.2"
        assert env["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"  # the whole list on every node
    assert "${engine_venv}" in plan.placeholders()


def test_the_draft_is_refused_on_the_cpu_engine_with_the_reason() -> None:
    with pytest.raises(PlanError) as exc:
        build_plan(load_spec("local-sglang"), draft=True)
    assert "--draft on is refused" in str(exc.value)
    assert "speculative decoding" in str(exc.value) and "copy_all_layer_kv_cache_cpu" in str(exc.value)
    assert "--draft off" in exc.value.fix


def test_capacity_is_set_by_max_total_tokens_never_a_gpu_figure(plan: LaunchPlan) -> None:
    assert plan.capacity is None
    assert plan.capacity_note is not None and "--max-total-tokens 65,536" in plan.capacity_note
    text = render_text(plan)
    assert "capacity: KV pool set by --max-total-tokens 65,536 tokens" in text
    assert "GiB per GPU" not in text and "not predicted" not in text
    again = LaunchPlan.from_json(json.loads(plan.dumps()))  # what a node agent receives keeps it
    assert again.capacity_note == plan.capacity_note


def test_a_gpu_seat_gets_none_of_it() -> None:
    plan = build_plan(load_spec("large"))
    for node in plan.nodes:
        assert argv_value(node.command, "--device") is None and "--sleep-on-idle" not in node.command
        assert "SGLANG_USE_CPU_ENGINE" not in node.env_dict()
    assert plan.capacity_note is None and plan.capacity is not None


def test_a_colocated_node_moves_its_port_and_its_check_follows(plan: LaunchPlan) -> None:
    be = SGLangBackend()
    node1 = plan.nodes[1]
    moved = be.colocated_argv(plan, 1, node1.command)
    assert moved is not None and argv_value(moved, "--port") == str(plan.http_port + 10)
    assert be.colocated_env(plan, 1) == {}  # colocation is allowed (the own-host check passes)

    class Moved:
        node_rank = 1
        command = moved

        def env_dict(self) -> dict[str, str]:
            return node1.env_dict()

    assert be.listen_ports(plan, Moved())["http"] == plan.http_port + 10


def test_a_missing_engine_interpreter_fails_preflight_with_the_install_command(plan: LaunchPlan,
                                                                               tmp_path: Path) -> None:
    filled = plan.fill({Placeholder.ENGINE_VENV: str(tmp_path / "nowhere"), Placeholder.NODE0_ADDR: "127.0.0.1",
                        Placeholder.REQUEST_LOG_DIR: str(tmp_path)})
    (failure,) = SGLangBackend().local_checks(filled, filled.nodes[1], gpus=1, gpu_ids=["0"], env={})
    assert failure.check == "engine-python" and "nowhere/bin/python does not exist" in failure.problem
    assert "scripts/setup.sh --engine sglang" in failure.fix


def test_cpu_device_needs_an_engine_that_runs_there(tmp_path: Path) -> None:
    """The spec names the device; the engine's backend says where it runs (the sim does not run on `device: cpu`)."""
    text = Path(load_spec("local-sim").source or "").read_text() + "device: cpu\n"
    spec = parse_spec(text, path=str(tmp_path / "x.yaml"))
    with pytest.raises(PlanError, match="device: cpu is not one engine sim runs on"):
        build_plan(spec)


needs_tokenizers = pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None,
                                      reason="tokenizers is not installed (scripts/setup.sh --test installs it)")


@needs_tokenizers
@pytest.mark.parametrize("arch", tinymodel.ARCHS)
def test_tiny_models_are_the_same_for_the_same_seed(tmp_path: Path, arch: str) -> None:
    a = tinymodel.make(str(tmp_path / "a"), arch, seed=3)
    b = tinymodel.make(str(tmp_path / "b"), arch, seed=3)
    c = tinymodel.make(str(tmp_path / "c"), arch, seed=4)
    assert a == b
    assert a["tokenizer.json"] != c["tokenizer.json"]
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["architectures"] == [{"llama": "LlamaForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}[arch]]
    tok = json.loads((tmp_path / "a" / "tokenizer.json").read_text())
    assert max(tok["model"]["vocab"].values()) < cfg["vocab_size"]  # every id has an embedding row
    assert tok["added_tokens"][0]["content"] == tinymodel.EOS and tok["added_tokens"][0]["id"] == cfg["eos_token_id"]
    assert "chat_template" in json.loads((tmp_path / "a" / "tokenizer_config.json").read_text())
    assert tinymodel.is_tiny_model(str(tmp_path / "a"))
