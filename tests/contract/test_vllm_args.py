"""vLLM 0.32's own argument parser and config take the argv a ``vllm`` backend will emit (issue 48's groundwork).

In the vLLM environment (``.venv-vllm``, made by ``scripts/setup.sh --engine vllm``; ``$SGLSEAT_VLLM_VENV`` when
set), one child process runs, for each command line below, what ``python -m vllm.entrypoints.openai.api_server``
runs before it serves: ``make_arg_parser(FlexibleArgumentParser())`` and ``validate_parsed_serve_args`` (the API
server's parse), ``AsyncEngineArgs.from_cli_args(...).create_engine_config()`` (the engine's config; it reads the
trained model's config.json, nothing else), then ``build_dynamic_sd_schedule_lookup`` with the values the engine
core's scheduler passes it (``vllm/v1/core/sched/scheduler.py``): that is where vLLM checks the speculation schedule
``num_speculative_tokens_per_batch_size`` (``vllm/v1/spec_decode/dynamic/utils.py``). The parser and the config take
a schedule whose ranges overlap or do not start at 1; only the scheduler refuses it, at the engine's start, after the
weights are loaded. So a backend must check the schedule before launching; the child names the stage that refused.

The plan's own command lines for the ``local-vllm`` seat are among them (draft off, NGRAM, and ``draft.off_above``
as vLLM's schedule). Skips, saying why, where the vLLM environment is absent. One child for the
module: importing vLLM costs 20-35 s of CPU on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.contract.conftest import CHILD_S

pytestmark = [pytest.mark.contract]

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SGLSEAT_VLLM_VENV") or REPO / ".venv-vllm")
MODEL = VENV / "models" / "smollm2-135m-instruct"
VERSION = "0.32.0"
MAX_NUM_SEQS = 8
NUM_SPEC = 4

# The command line of the hand-served seat (docs/vllm-cpu.md), less the interpreter and module.
BASE = ["--model", str(MODEL), "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048",
        "--max-num-seqs", str(MAX_NUM_SEQS), "--host", "127.0.0.1", "--port", "31250"]


def ngram(schedule: Any = None) -> list[str]:
    spec: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": NUM_SPEC, "prompt_lookup_max": 4}
    if schedule is not None:
        spec["num_speculative_tokens_per_batch_size"] = schedule
    return [*BASE, "--speculative-config", json.dumps(spec)]


CASES: dict[str, list[str]] = {
    "plain": BASE,
    "ngram": ngram(),
    # Speculation with K=2 at batch 1 and off (K=0) from 2 to max-num-seqs: the draft's "off above N" with N=1.
    "off_above_1": ngram([[1, 1, 2], [2, MAX_NUM_SEQS, 0]]),
    "k_above_num_spec": ngram([[1, MAX_NUM_SEQS, 9]]),
    "gap": ngram([[1, 2, 3], [5, MAX_NUM_SEQS, 0]]),
    "not_from_1": ngram([[2, MAX_NUM_SEQS, 0]]),
    "overlap": ngram([[1, 4, 2], [3, MAX_NUM_SEQS, 0]]),
    "negative_k": ngram([[1, MAX_NUM_SEQS, -1]]),
    "start_after_end": ngram([[1, 1, 2], [8, 2, 0]]),
    "two_items": ngram([[1, 2]]),
    "bad_int": [*BASE, "--max-num-seqs", "eight"],
}


def _plan_argv(draft: bool, off_above: int | None = None, eagle: Path | None = None) -> list[str]:
    """What `sgl-seat plan --seat local-vllm` writes after ``-m <module>``, ``${engine_venv}`` filled with VENV;
    with ``eagle``, the EAGLE head there as its draft."""
    from sgl_seat.plan import build_plan
    from sgl_seat.spec import load_spec

    spec = load_spec("local-vllm")
    if off_above is not None:
        spec = spec.model_copy(update={"draft": spec.draft.model_copy(update={"off_above": off_above})})
    if eagle is not None:
        spec = spec.model_copy(update={"draft": spec.draft.model_copy(update={
            "algorithm": "EAGLE", "steps": 3, "draft_tokens": 4, "model_path": str(eagle)})})
    cmd = build_plan(spec, draft=draft).nodes[0].command
    return [a.replace("${engine_venv}", str(VENV)) for a in cmd[3:]]


#: The plan's own lines (the local-vllm seat: draft off, NGRAM, and the policy that `tune draft` writes as N = 2).
PLAN_CASES: dict[str, list[str]] = {"plan_off": _plan_argv(False), "plan_ngram": _plan_argv(True),
                                    "plan_off_above_2": _plan_argv(True, 2)}
CASES.update(PLAN_CASES)

_CHILD = r"""
import contextlib, io, json, sys
import vllm
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

doc = json.load(sys.stdin)
out = {"version": vllm.__version__, "cases": {}, "kv": []}
for name, argv in doc["cases"].items():
    case = out["cases"][name] = {"stage": "parse"}
    try:
        parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = parser.parse_args(argv)
        except SystemExit as e:
            raise ValueError(f"exit {e.code}: {err.getvalue().strip().splitlines()[-1]}") from None
        validate_parsed_serve_args(args)
        case["stage"] = "config"
        cfg = AsyncEngineArgs.from_cli_args(args).create_engine_config()
        spec = cfg.speculative_config
        case["max_num_seqs"] = cfg.scheduler_config.max_num_seqs
        case["speculative"] = None if spec is None else {
            "method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
            "prompt_lookup_max": spec.prompt_lookup_max, "prompt_lookup_min": spec.prompt_lookup_min,
            "schedule": spec.num_speculative_tokens_per_batch_size,
            "draft_architectures": list(spec.draft_model_config.hf_config.architectures or ())
            if spec.method == "eagle" else None}
        case["stage"] = "scheduler"
        if spec is not None and spec.num_speculative_tokens_per_batch_size:
            # As the engine core's Scheduler calls it; index 0 is unused (the lookup is by batch size).
            case["k_by_batch"] = build_dynamic_sd_schedule_lookup(
                spec.num_speculative_tokens_per_batch_size, vllm_max_batch_size=cfg.scheduler_config.max_num_seqs,
                vllm_num_speculative_tokens=spec.num_speculative_tokens)[1:]
        case["stage"] = "ok"
    except Exception as e:
        case["error"] = {"type": type(e).__name__, "message": str(e)[:800]}
# The KV pool as the CPU engine core computes it (v1/engine/core.py), fed the budget VLLM_CPU_KVCACHE_SPACE gives
# (platforms/cpu.py) and the worker's per-layer specs, without a server.
import os
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.core.kv_cache_utils import get_kv_cache_configs, generate_scheduler_kv_cache_config, get_kv_cache_capacity
for gib, mml, dtype in doc["kv"]:
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(gib)
    cfg = EngineArgs(model=doc["model"], dtype=dtype, enforce_eager=True, max_model_len=mml,
                     max_num_seqs=8).create_engine_config()
    mc = cfg.model_config
    spec = FullAttentionSpec(block_size=cfg.cache_config.block_size, num_kv_heads=mc.get_num_kv_heads(
        cfg.parallel_config), head_size=mc.get_head_size(), dtype=mc.dtype)
    specs = {f"model.layers.{i}.self_attn.attn": spec for i in range(mc.get_num_layers(cfg.parallel_config))}
    cfg.cache_config.kv_cache_layout = "LBHNC"  # what the CPU engine core resolves ("Using LBHNC KV cache layout")
    budget = cfg.cache_config.kv_cache_memory_bytes
    sched = generate_scheduler_kv_cache_config(get_kv_cache_configs(cfg, [specs], [budget]))
    tokens, _ = get_kv_cache_capacity(cfg, sched)
    out["kv"].append([gib, mml, dtype, int(tokens)])
print("SGLSEAT_RESULT " + json.dumps(out, default=list))
"""

#: (GiB, max_model_len, dtype): the seat's, twice the budget, a length that is not a multiple of the block, bf16.
KV_CASES = [[1, 2048, "float32"], [2, 2048, "float32"], [1, 2000, "float32"], [1, 2048, "bfloat16"]]


@pytest.fixture(scope="module")
def vllm_says(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = VENV / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"the vLLM environment ({VENV}) is not set up: bash scripts/setup.sh --engine vllm")
    if not (MODEL / "config.json").is_file():
        pytest.skip(f"the trained model is not in the vLLM environment ({MODEL}): bash scripts/setup.sh --engine vllm")
    # An EAGLE head's directory as engines/eaglehead.py writes it for vLLM (the config is all the parse reads: the
    # target's, one layer, architecture LlamaForCausalLM, which vLLM's EAGLEConfig names EagleLlamaForCausalLM).
    head = tmp_path_factory.mktemp("eagle-head")
    (head / "config.json").write_text(json.dumps({**json.loads((MODEL / "config.json").read_text()),
                                                  "num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"]}))
    cases = {**CASES, "plan_eagle": _plan_argv(True, eagle=head), "plan_eagle_off_above_2": _plan_argv(True, 2, head)}
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_CONFIGURE_LOGGING": "0"}
    res = subprocess.run([str(python), "-c", _CHILD], input=json.dumps({"cases": cases, "kv": KV_CASES,
                                                                          "model": str(MODEL)}),
                         env=env, capture_output=True,
                         text=True, timeout=CHILD_S, check=False)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("SGLSEAT_RESULT ")]
    assert res.returncode == 0 and lines, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    doc: dict[str, Any] = json.loads(lines[-1].removeprefix("SGLSEAT_RESULT "))
    assert doc["version"] == VERSION, doc["version"]
    return doc


def _case(doc: dict[str, Any], name: str) -> dict[str, Any]:
    case: dict[str, Any] = doc["cases"][name]
    return case


def test_the_seats_argv_parses_without_speculation(vllm_says: dict[str, Any]) -> None:
    case = _case(vllm_says, "plain")
    assert case["stage"] == "ok", case.get("error")
    assert case["speculative"] is None
    assert case["max_num_seqs"] == MAX_NUM_SEQS


def test_ngram_speculation_parses_with_its_defaults(vllm_says: dict[str, Any]) -> None:
    case = _case(vllm_says, "ngram")
    assert case["stage"] == "ok", case.get("error")
    # prompt_lookup_min defaults to prompt_lookup_max; no schedule means K=4 at every batch size.
    assert case["speculative"] == {"method": "ngram", "num_speculative_tokens": NUM_SPEC, "prompt_lookup_max": 4,
                                   "prompt_lookup_min": 4, "schedule": None,
                                   "draft_architectures": None}
    assert "k_by_batch" not in case


def test_off_above_n_schedule_parses_and_the_scheduler_reads_it(vllm_says: dict[str, Any]) -> None:
    case = _case(vllm_says, "off_above_1")
    assert case["stage"] == "ok", case.get("error")
    assert case["speculative"]["schedule"] == [[1, 1, 2], [2, MAX_NUM_SEQS, 0]]
    # K by running batch size 1..max-num-seqs: 2 drafts at one request, none from two on.
    assert case["k_by_batch"] == [2] + [0] * (MAX_NUM_SEQS - 1)


def test_the_scheduler_caps_k_and_carries_it_through_gaps(vllm_says: dict[str, Any]) -> None:
    # K above num_speculative_tokens is no error: the scheduler caps it.
    assert _case(vllm_says, "k_above_num_spec")["k_by_batch"] == [NUM_SPEC] * MAX_NUM_SEQS
    # A gap (3-4 here) keeps the K of the range before it.
    assert _case(vllm_says, "gap")["k_by_batch"] == [3, 3, 3, 3, 0, 0, 0, 0]


@pytest.mark.parametrize(("name", "stage", "error", "words"), [
    ("not_from_1", "scheduler", "ValueError", "The first batch-size range must start at 1"),
    ("overlap", "scheduler", "ValueError", "Batch-size ranges must be non-overlapping and sorted"),
    ("negative_k", "scheduler", "ValueError", "num_speculative_tokens_per_batch_size values must be >= 0"),
    ("start_after_end", "scheduler", "ValueError", "Batch-size range start must be <= end"),
    ("two_items", "config", "ValidationError", "num_speculative_tokens_per_batch_size"),
    ("bad_int", "parse", "ValueError", "argument --max-num-seqs: invalid int value: 'eight'"),
])
def test_an_invalid_schedule_is_refused_with_vllms_own_error(vllm_says: dict[str, Any], name: str, stage: str,
                                                            error: str, words: str) -> None:
    case = _case(vllm_says, name)
    assert "error" in case, f"vLLM accepted {name}: {case}"
    assert (case["stage"], case["error"]["type"]) == (stage, error), case["error"]
    assert words in case["error"]["message"], case["error"]["message"]


def test_the_plans_own_lines_parse_and_its_policy_is_vllms_schedule(vllm_says: dict[str, Any]) -> None:
    """`plan --seat local-vllm`'s argv, as the backend writes it, goes through vLLM's parser, its config and its
    scheduler; draft.off_above 2 is K = 4 up to two running requests and none above."""
    off, on, pol = (_case(vllm_says, n) for n in ("plan_off", "plan_ngram", "plan_off_above_2"))
    for case in (off, on, pol):
        assert case["stage"] == "ok", case.get("error")
    assert off["speculative"] is None and off["max_num_seqs"] == MAX_NUM_SEQS
    assert on["speculative"]["method"] == "ngram" and on["speculative"]["num_speculative_tokens"] == NUM_SPEC
    assert pol["speculative"]["schedule"] == [[1, 2, NUM_SPEC], [3, MAX_NUM_SEQS, 0]]
    assert pol["k_by_batch"] == [NUM_SPEC, NUM_SPEC] + [0] * (MAX_NUM_SEQS - 2)


def test_the_plans_kv_pool_is_vllms_own_arithmetic(vllm_says: dict[str, Any]) -> None:
    """The backend's prediction (engines/vllm.cpu_kv_tokens, over the model's config.json) equals what vLLM's own
    functions compute for the CPU engine core, for every budget, length and dtype here; the seat's 1 GiB is the
    engine's logged 23,296 tokens (tests/integration/test_real_vllm_seat.py reads that line)."""
    from sgl_seat.engines.vllm import cpu_kv_tokens

    config = json.loads((MODEL / "config.json").read_text())
    got = {(g, m, d): t for g, m, d, t in vllm_says["kv"]}
    assert len(got) == len(KV_CASES)
    for (gib, mml, dtype), tokens in got.items():
        assert cpu_kv_tokens(config, gib=gib, dtype=dtype, max_model_len=mml) == tokens, (gib, mml, dtype, tokens)
    assert got[(1, 2048, "float32")] == 23_296 and got[(1, 2000, "float32")] != 23_296


def test_the_plans_eagle_line_is_vllms_eagle_over_the_heads_directory(vllm_says: dict[str, Any]) -> None:
    """An EAGLE seat's line (the head of engines/eaglehead.py, 3 steps): vLLM's config reads the head's directory as
    its EAGLE Llama and proposes 3 tokens a step; draft.off_above 2 is that K up to two running requests."""
    on, pol = _case(vllm_says, "plan_eagle"), _case(vllm_says, "plan_eagle_off_above_2")
    for case in (on, pol):
        assert case["stage"] == "ok", case.get("error")
    assert on["speculative"]["method"] == "eagle" and on["speculative"]["num_speculative_tokens"] == 3
    assert on["speculative"]["draft_architectures"] == ["EagleLlamaForCausalLM"]
    assert pol["k_by_batch"] == [3, 3] + [0] * (MAX_NUM_SEQS - 2)
