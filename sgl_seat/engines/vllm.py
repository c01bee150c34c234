"""vLLM 0.32 on CPU (the registry package ``vllm-cpu``): the second real engine, and the one that speculates on a CPU.

Everything here was measured on this project's 2-core machine with the engine's own environment (``.venv-vllm``,
``scripts/install-vllm-engine.sh``) and the trained SmolLM2-135M-Instruct; ``docs/vllm-cpu.md`` has the figures and
the source lines in vLLM's wheel.

- One node: vLLM's CPU platform cannot place ranks through Ray (``ray_device_key`` is empty: "current platform cpu
  does not support ray"), and across hosts only with its own ``mp`` launcher; a ``local-vllm`` seat is one node whose
  ranks are processes of one host (``--tensor-parallel-size``). The plan refuses more than one node.
- The command line: ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` script fails: the distribution is
  named ``vllm-cpu``), ``--enforce-eager`` (the probe wraps Python methods: a compiled graph would trace them in).
- The draft: ``--speculative-config`` JSON, NGRAM (no weights) with ``num_speculative_tokens`` = ``draft.draft_tokens``,
  or EAGLE with a head at ``draft.model_path`` (``eaglehead.py`` trains one for the trained model; vLLM's CPU engine
  runs it, its KV beside the target's) and ``draft.steps`` tokens a step; from ``draft.off_above``, vLLM's own
  schedule ``num_speculative_tokens_per_batch_size`` (K up to N running requests, 0 above: the field report's
  untested next step, in vLLM's words).
- Capacity: ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB); the engine core logs ``CPU KV cache size: N tokens``.
- Processes: the API server (its command line), ``VLLM::EngineCore`` (the scheduler) and ``VLLM::Worker`` (the
  model's forward, also at one rank; ``..._TP<r>`` at more), spawned, so the probe's ``sitecustomize`` loads in each.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.engines.base import (
    ENGINE_VENV,
    EngineBackend,
    PlannedNode,
    PlannedSeat,
    missing_engine_python,
    probe_faults,
    rehearsal_env,
)
from sgl_seat.engines.preflight import Check, Failure
from sgl_seat.engines.registry import register
from sgl_seat.errors import PlanError
from sgl_seat.sizing import CapacityReport
from sgl_seat.spec import SeatSpec, spec_location
from sgl_seat.topology import Topology

#: Where vLLM's environment is on a host, when set (else ``.venv-vllm`` beside the running venv).
VLLM_VENV_ENV = "SGLSEAT_VLLM_VENV"

#: vLLM's names (0.32: ``utils/system_utils.set_process_title``, ``v1/metrics/loggers.py``, ``v1/spec_decode/
#: metrics.py``). The Worker runs the forward, so it is the rank's process; the engine core schedules.
WORDS = EngineWords(
    engine="vllm",
    title_prefix="VLLM::",
    rank_title="VLLM::Worker",
    helper_titles=(("VLLM::EngineCore", "engine-core"),),
    metric_prefix="vllm:",
    running="vllm:num_requests_running",
    queued="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    generated="vllm:generation_tokens_total",
    progress=("vllm:generation_tokens_total", "vllm:prompt_tokens_total",
              "vllm:spec_decode_num_draft_tokens_total"),
    prompt_tokens="vllm:prompt_tokens_total",
    cached_tokens="vllm:prompt_tokens_cached_total",
    # Each draft is verified in one step that yields its accepted tokens and one more: generated / drafts is the
    # accepted length per step, as SGLang's generated / verify calls is (when every step drafts).
    verify_steps="vllm:spec_decode_num_drafts_total",
    requests="vllm:request_success_total",
    pool_info=("vllm:cache_config_info", "kv_cache_size_tokens"),
)

# v1/core/kv_cache_utils.py (update_kv_cache_capacity): "CPU KV cache size: 23,296 tokens, Maximum concurrency ..."
_KV_LINE = re.compile(r"\b(?:CPU|GPU) KV cache size: ([\d,]+) tokens")


def vllm_venv() -> str:
    """vLLM's environment on this host: ``$SGLSEAT_VLLM_VENV``, else ``.venv-vllm`` beside the running venv."""
    return os.environ.get(VLLM_VENV_ENV) or str(Path(sys.prefix).parent / ".venv-vllm")


#: vLLM's CPU block size (``platforms/cpu.py``: 128 unless the user sets one).
CPU_BLOCK = 128
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def cpu_kv_tokens(config: Mapping[str, Any], *, gib: int, dtype: str, max_model_len: int, tp: int = 1) -> int | None:
    """The KV pool vLLM 0.32's CPU engine reports for a Llama-shaped ``config`` (its config.json): the budget
    (``VLLM_CPU_KVCACHE_SPACE`` GiB) over the bytes of a block of every layer (``get_kv_cache_config_from_groups``),
    then ``get_kv_cache_capacity``'s tokens = blocks / blocks-per-request x ``max_model_len`` (not blocks x 128 unless
    ``max_model_len`` is a multiple of 128). None where the config lacks a figure. ``tests/contract/test_vllm_args.py``
    holds it to vLLM's own functions."""
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = max(1, int(config.get("num_key_value_heads") or heads) // tp)
        head = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError):
        return None
    name = dtype if dtype != "auto" else str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    size = _DTYPE_BYTES.get(name)
    if size is None:
        return None
    per_block = layers * CPU_BLOCK * 2 * kv_heads * head * size
    blocks = gib * (1 << 30) // per_block
    per_request = -(-max_model_len // CPU_BLOCK)
    return int(blocks / per_request * max_model_len)


def _config_of(path: str) -> dict[str, Any] | None:
    """The config.json of a model directory named in a spec (``${engine_venv}`` is vLLM's environment here)."""
    try:
        doc = json.loads((Path(path.replace(ENGINE_VENV, vllm_venv())) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def draft_layers(spec: SeatSpec) -> int | None:
    """The layers an EAGLE draft adds to every KV block (its head's config.json); 0 for NGRAM; None where the head's
    config cannot be read. vLLM's CPU engine keeps the drafter's KV beside the target's ("EAGLE drafter KV cache
    initialized"): with the one-layer head of ``eaglehead.py`` the pool of 1 GiB was 22,528 tokens, not 23,296."""
    d = spec.draft
    if d.algorithm != "EAGLE":
        return 0
    cfg = _config_of(d.model_path) if d.model_path else None
    try:
        return None if cfg is None else int(cfg["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        return None


def predicted_pool(spec: SeatSpec, *, draft: bool = False, config: Mapping[str, Any] | None = None) -> int | None:
    """:func:`cpu_kv_tokens` for ``spec`` with the draft off, or on (an EAGLE head's layers join every block), from
    the config.json files as this host has them (the model's as ``config`` when the caller has read it); None where
    one cannot be read."""
    config = config if config is not None else _config_of(spec.model.path)
    extra = draft_layers(spec) if draft else 0
    if config is None or extra is None or spec.cpu.kv_cache_gb is None:
        return None
    if extra:
        config = {**config, "num_hidden_layers": int(config.get("num_hidden_layers", 0)) + extra}
    return cpu_kv_tokens(config, gib=spec.cpu.kv_cache_gb, dtype=spec.model.dtype,
                         max_model_len=spec.model.context_length, tp=spec.parallel.tp)


def proposed_tokens(spec: SeatSpec) -> int:
    """How many tokens the draft proposes a step (vLLM's ``num_speculative_tokens``): NGRAM's ``draft_tokens``; an
    EAGLE chain's ``steps`` (the spec's ``draft_tokens`` is SGLang's count, the verified token included)."""
    d = spec.draft
    return d.steps if d.algorithm == "EAGLE" else d.draft_tokens


def speculative_config(spec: SeatSpec) -> dict[str, Any]:
    """``--speculative-config``: NGRAM with the spec's draft tokens, or EAGLE with the head at ``draft.model_path``
    and ``draft.steps`` tokens a step; with ``draft.off_above`` N, vLLM's schedule ``[[1, N, K], [N + 1, slots, 0]]``
    (inclusive batch-size ranges; K = 0 turns the draft off above N)."""
    d = spec.draft
    k = proposed_tokens(spec)
    doc: dict[str, Any]
    if d.algorithm == "EAGLE":
        doc = {"method": "eagle", "model": d.model_path, "num_speculative_tokens": k}
    else:
        doc = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": k, "prompt_lookup_min": 1}
    if d.off_above is not None:
        sched = [[1, d.off_above, k]]
        if d.off_above < d.slots:
            sched.append([d.off_above + 1, d.slots, 0])
        doc["num_speculative_tokens_per_batch_size"] = sched
    return doc


@register
class VLLMBackend(EngineBackend):
    """``python -m vllm.entrypoints.openai.api_server`` on vLLM's CPU engine (``device: cpu``), one node."""

    name: ClassVar[str] = "vllm"
    module: ClassVar[str] = "vllm.entrypoints.openai.api_server"
    checks: ClassVar[frozenset[Check]] = frozenset({Check.MODEL_PATH, Check.PORTS})
    health_path: ClassVar[str] = "/health"
    kv_actual_source: ClassVar[str] = "measured: the engine core's own 'CPU KV cache size' log line"
    faults_need_probe: ClassVar[bool] = True
    words: ClassVar[EngineWords] = WORDS
    devices: ClassVar[frozenset[str]] = frozenset({"cpu"})
    #: The probe's targets for a model family on this engine: ``probe-targets.yaml``'s ``vllm/<family>``.
    probe_family_prefix: ClassVar[str] = "vllm/"
    policy_is_schedule: ClassVar[bool] = True

    def engine_venv(self) -> str:
        return vllm_venv()

    def argv(self, spec: SeatSpec, topo: Topology, *, node_rank: int, draft: bool, slots: int,
             mem_fraction: float) -> list[str]:
        argv = [
            "--model", spec.model.path,
            "--served-model-name", spec.model.name,
            "--tensor-parallel-size", str(topo.tp),
            "--max-model-len", str(spec.model.context_length),
            "--max-num-seqs", str(slots),
            "--enforce-eager",
            "--host", spec.network.host,
            "--port", str(spec.network.http_port),
        ]
        if spec.model.dtype != "auto":
            argv += ["--dtype", spec.model.dtype]
        if draft:
            argv += ["--speculative-config", json.dumps(speculative_config(spec), separators=(",", ":"))]
        return argv + self.engine_flags(spec)

    def draft_policy(self, spec: SeatSpec, cap: CapacityReport | None, slots: int,
                     warnings: list[str]) -> tuple[dict[str, Any] | None, tuple[tuple[str, str], ...]]:
        """``draft.off_above`` as vLLM's own schedule inside ``--speculative-config`` (no file)."""
        d = spec.draft
        if d.off_above is None:
            return None, ()
        if d.off_above >= slots:
            warnings.append(f"draft.off_above {d.off_above} is at or above the slot cap {slots}: the schedule never "
                            "turns speculation off")
        return ({"kind": "off_above", "schedule": speculative_config(spec)["num_speculative_tokens_per_batch_size"],
                 "flag": "--speculative-config num_speculative_tokens_per_batch_size",
                 "keeps": {"note": "the KV pool and the slot cap are the draft-on seat's (NGRAM has no pool of its "
                                   "own; an EAGLE head's layers join every block); above N running requests no draft"
                                   " tokens are proposed"}}, ())

    def validate_faults(self, faults: Sequence[str], *, rehearsal: bool = False) -> tuple[str, ...]:
        return probe_faults(faults, rehearsal=rehearsal, engine="vLLM", example_seat="local-vllm")

    def draft_problem(self, spec: SeatSpec) -> str | None:
        d = spec.draft
        if d.algorithm == "EAGLE":
            if not d.model_path:
                return ("draft.algorithm EAGLE needs draft.model_path: the head's directory (an EAGLE-1 head for "
                        "this model, e.g. one made by sgl_seat/engines/eaglehead.py)")
            if d.topk != 1:
                return f"draft.topk {d.topk}: vLLM's EAGLE proposes a chain (topk 1)"
            return None
        if d.algorithm != "NGRAM":
            return f"draft.algorithm {d.algorithm}: a vLLM seat here drafts with NGRAM or an EAGLE head"
        return None

    def capacity_note(self, spec: SeatSpec) -> str | None:
        config = _config_of(spec.model.path)  # read once for both figures
        tokens = predicted_pool(spec, config=config)
        pred = (f"{tokens:,} tokens by vLLM's own arithmetic over the model's config.json" if tokens is not None
                else "not predicted: the model's config.json is not readable here")
        if spec.draft.algorithm == "EAGLE":
            on = predicted_pool(spec, draft=True, config=config)
            pred += (f"; {on:,} with the EAGLE head on (its layers join every block)" if on is not None else
                     "; with the EAGLE head on: not predicted (the head's config.json is not readable here)")
        return (f"KV pool set by VLLM_CPU_KVCACHE_SPACE={spec.cpu.kv_cache_gb} GiB: {pred} (vLLM's CPU engine: no "
                "GPU memory to size from; the engine core's own 'CPU KV cache size' line is the actual)")

    def node_env(self, spec: SeatSpec, *, faults: Sequence[str]) -> dict[str, str]:
        env = {
            "VLLM_CPU_KVCACHE_SPACE": str(spec.cpu.kv_cache_gb),
            # Nothing is fetched from a hub, and nothing reported: the model is converted on the node by setup.
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        if spec.cpu.threads_bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu.threads_bind
        return env | rehearsal_env(spec, faults)

    def plan_warnings(self, spec: SeatSpec, topo: Topology) -> list[str]:
        return [f"vLLM's CPU engine: a rehearsal seat ({spec.model.name}'s own weights); its timings are not a GPU "
                "seat's"]

    def sampled_draft_problem(self, spec: SeatSpec) -> str | None:
        """Measured here on 2026-12-06 (docs/vllm-cpu.md): with ``temperature`` 0.7 and the draft off, the trained
        model answers "The capital of France is Paris."; with NGRAM or an EAGLE head the same requests come back as
        strings of unrelated tokens, almost no draft token accepted. Greedy requests are the target's with every
        draft. The CPU engine runs its rejection sampler's C++ fallbacks (no Triton on this CPU)."""
        return ("vLLM 0.32's CPU engine returns corrupted text for sampled requests (temperature above 0) while it "
                "speculates, with NGRAM and with an EAGLE head alike (docs/vllm-cpu.md)")

    def check_spec(self, spec: SeatSpec, topo: Topology) -> None:
        if topo.nnodes != 1:
            raise PlanError(f"{topo.nnodes} nodes: vLLM's CPU engine cannot place ranks through Ray (its CPU platform "
                            "has no Ray device: 'current platform cpu does not support ray'); a vLLM seat here is "
                            "one node", fix="set cluster.nodes: 1 (ranks are processes of one host: parallel.tp)",
                            **spec_location(spec, "cluster.nodes"))
        if spec.cpu.kv_cache_gb is None:
            raise PlanError("cpu.kv_cache_gb is not set: vLLM's CPU engine takes its KV cache in whole GiB "
                            "(VLLM_CPU_KVCACHE_SPACE)", fix="set cpu.kv_cache_gb, e.g. 1",
                            **spec_location(spec, "cpu"))

    def visible_gpus(self) -> list[str] | None:
        return None

    def parse_kv_tokens(self, log_text: str) -> int | None:
        m = _KV_LINE.search(log_text)
        return int(m.group(1).replace(",", "")) if m else None

    def startup_port(self, plan: PlannedSeat) -> int:
        """The API server's port: it listens once the engine core and its workers are up (one node: no store)."""
        return plan.http_port

    def listen_ports(self, plan: PlannedSeat, node: PlannedNode) -> dict[str, int]:
        """The API server's port (no dist-init store: one node)."""
        return {"http": plan.http_port}

    def local_checks(self, plan: PlannedSeat, node: PlannedNode, *, gpus: int, gpu_ids: Sequence[str],
                     env: Mapping[str, str]) -> list[Failure]:
        return missing_engine_python(node, what="vLLM's interpreter", install="install vLLM's environment: bash "
                                     f"scripts/setup.sh --engine vllm (or point {VLLM_VENV_ENV} at it)") or \
            super().local_checks(plan, node, gpus=gpus, gpu_ids=gpu_ids, env=env)


__all__ = ["WORDS", "VLLMBackend", "cpu_kv_tokens", "draft_layers", "predicted_pool", "proposed_tokens",
           "speculative_config", "vllm_venv"]
