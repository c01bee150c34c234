"""Predict a seat's KV pool and concurrency ceiling before any weights load, draft on and off.

This mirrors SGLang 0.5.23's sizing (``sglang/srt/mem_cache/kv_cache_configurator.py``
``_profile_available_bytes`` / ``resolve_max_num_reqs`` and
``sglang/srt/model_executor/pool_configurator.py`` ``DefaultPoolConfigurator``):

    rest      = free_after_load - pre_load * (1 - mem_fraction_static)
    pool      = (rest - per_request_pools) // cell_bytes, rounded down to the page size
    max_reqs  = min(requested_slots, pool // 2)

Where it is approximated (each marked ``APPROX`` below): the memory profiled at run time is
replaced by GPU memory minus a fixed CUDA-context and runtime reserve; weights per GPU are the
safetensors total divided by TP (experts split by EP=TP, attention by TP; replicated tensors are
not added back); the DeepSeek-V4 draft's sliding-window ring is taken from
``deepseek_v4_memory_pool.get_draft_swa_ring_size`` with a full-head K/V cell. Read the engine's
``KV Cache is allocated ... #tokens: N`` line to compare (``sgl-seat status`` does).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sgl_seat.errors import CapacityError, SpecError
from sgl_seat.spec import SeatSpec, spec_location

GIB = 1 << 30
# APPROX: what the CUDA context and torch take before SGLang profiles ``pre_model_load_memory``.
CUDA_CONTEXT_BYTES = 1 * GIB
# APPROX: memory resident after load that is neither weights nor KV (NCCL buffers, graphs' pools).
RUNTIME_RESERVE_BYTES = 2 * GIB

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "fp8": 1}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the planner needs from config.json and the safetensors index."""

    architecture: str
    num_layers: int
    mla: bool
    kv_lora_rank: int
    qk_rope_head_dim: int
    num_kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    sliding_window: int | None
    swa_layers: int
    draft_layers: int
    weights_total_bytes: int | None
    page_size: int

    @property
    def is_deepseek_v4(self) -> bool:
        return self.architecture.startswith("DeepseekV4")


@dataclass(frozen=True, slots=True)
class Capacity:
    """Per-GPU prediction for one draft state. Bytes are per GPU; tokens are the seat's pool."""

    draft: bool
    fits: bool
    problem: str | None
    predicted: bool
    weights_bytes_per_gpu: int
    draft_weights_bytes_per_gpu: int
    kv_bytes_per_token: int
    per_request_bytes: int
    requested_slots: int
    kv_pool_bytes: int
    kv_pool_tokens: int
    max_running_requests: int
    max_slots_that_fit: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def load_model_shape(config_path: Path, *, kv_dtype_bytes: int | None = None) -> ModelShape:
    """Read config.json (and model.safetensors.index.json beside it, for the weight total)."""
    try:
        cfg = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(
            "model.config: no config.json here", path=str(config_path), fix="point model.config at the model directory"
        ) from None
    except (OSError, ValueError) as exc:
        raise SpecError(f"model config.json is unreadable: {exc}", path=str(config_path)) from None
    if not isinstance(cfg, dict):
        raise SpecError("config.json is not a JSON object", path=str(config_path))
    arch = (cfg.get("architectures") or ["unknown"])[0]
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg.get("num_attention_heads", 1))
        head_dim = int(cfg.get("head_dim") or cfg.get("hidden_size", 0) // max(heads, 1))
        kv_heads = int(cfg.get("num_key_value_heads", heads))
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"config.json lacks a usable {exc}", path=str(config_path)) from None
    mla = "kv_lora_rank" in cfg and cfg.get("kv_lora_rank") is not None
    is_v4 = arch.startswith("DeepseekV4")
    if kv_dtype_bytes is None:
        # DeepSeek-V4 presets KV fp8_e4m3 (contracts section 2); others keep the weights' dtype.
        kv_dtype_bytes = 1 if is_v4 else _DTYPE_BYTES.get(str(cfg.get("torch_dtype", "bfloat16")), 2)
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    swa_layers = 0
    if isinstance(layer_types, list) and window:
        swa_layers = sum(1 for t in layer_types if t == "sliding_attention")
    index = config_path.parent / "model.safetensors.index.json"
    total: int | None = None
    if index.is_file():
        try:
            total = int(json.loads(index.read_text(encoding="utf-8"))["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SpecError(f"safetensors index unreadable: {exc}", path=str(index)) from None
    return ModelShape(
        architecture=arch,
        num_layers=layers,
        mla=mla,
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        kv_dtype_bytes=kv_dtype_bytes,
        sliding_window=int(window) if window else None,
        swa_layers=swa_layers,
        draft_layers=int(cfg.get("num_nextn_predict_layers") or 1),
        weights_total_bytes=total,
        page_size=256 if is_v4 else 1,  # DSV4 presets page_size=256 (contracts section 2).
    )


def full_attention_cell(shape: ModelShape, tp: int, layers: int) -> int:
    """Per-token KV bytes of ``layers`` full-attention layers on one GPU.

    MLA: (kv_lora_rank + qk_rope_head_dim) x layers x dtype, the latent is not sharded by TP.
    GQA/MHA: 2 (K and V) x max(1, kv_heads // tp) x head_dim x layers x dtype.
    """
    if shape.mla:
        return (shape.kv_lora_rank + shape.qk_rope_head_dim) * layers * shape.kv_dtype_bytes
    return 2 * max(1, shape.num_kv_heads // tp) * shape.head_dim * layers * shape.kv_dtype_bytes


def predict(spec: SeatSpec, shape: ModelShape, *, draft: bool, slots: int, mem_fraction: float) -> Capacity:
    """Predict one draft state. Never raises for a misfit: ``fits``/``problem`` say why."""
    tp = spec.parallel.tp
    gpu = int(spec.cluster.gpu_memory_gb * GIB)
    pre_load = gpu - CUDA_CONTEXT_BYTES
    weights = (shape.weights_total_bytes or 0) // tp
    draft_weights = int(spec.draft.extra_weights_gb * GIB) if draft else 0
    free_after_load = pre_load - weights - draft_weights - RUNTIME_RESERVE_BYTES
    rest = int(free_after_load - pre_load * (1 - mem_fraction))

    full_layers = shape.num_layers - shape.swa_layers
    cell = full_attention_cell(shape, tp, full_layers)
    # Sliding-window target layers hold window tokens per running request, not per pool token.
    per_request = 0
    if shape.swa_layers and shape.sliding_window:
        per_request += shape.sliding_window * full_attention_cell(
            ModelShape(**{**asdict(shape), "mla": False}), tp, shape.swa_layers
        )
    if draft:
        # EAGLE/NEXTN: the draft's KV is folded into the target's cell (pool_configurator.py).
        cell += int(cell * shape.draft_layers / shape.num_layers)
        if shape.is_deepseek_v4 and shape.sliding_window:
            # APPROX: DSV4's draft keeps a sliding-window ring per request
            # (get_draft_swa_ring_size), K and V with full heads in bf16.
            ring = math.ceil((shape.sliding_window + spec.draft.draft_tokens) / shape.page_size) * shape.page_size
            per_request += ring * 2 * max(1, shape.num_kv_heads // tp) * shape.head_dim * 2 * shape.draft_layers

    pool_bytes = rest - per_request * slots
    tokens = max(pool_bytes, 0) // cell if cell else 0
    tokens = tokens // shape.page_size * shape.page_size
    problem = None
    predicted = weights > 0
    if not predicted:
        # The index is optional: without it the pool cannot be predicted, but nothing is refused.
        problem = "not predicted: no model.safetensors.index.json beside config.json, so weights per GPU are unknown"
        tokens = 0
    elif rest <= 0:
        need = 1 - (pre_load - weights - draft_weights - RUNTIME_RESERVE_BYTES) / pre_load
        problem = (
            f"weights ({_gib(weights + draft_weights)} per GPU) leave no KV budget under memory fraction "
            f"{mem_fraction}: raise it above {need:.3f}"
        )
    elif tokens < 2 * slots or tokens < shape.page_size:
        problem = (
            f"{slots} slots x {_gib(per_request)} of per-request pool = {_gib(per_request * slots)} per GPU, "
            f"but only {_gib(rest)} is left after weights{' and draft' if draft else ''}: "
            f"the KV pool would hold {tokens} tokens"
        )
    max_fit = slots
    if per_request:
        max_fit = max(0, (rest - cell * shape.page_size) // (per_request + 2 * cell)) if rest > 0 else 0
    else:
        max_fit = max(0, tokens // 2)
    if not predicted:
        max_fit = 0
    return Capacity(
        draft=draft,
        fits=problem is None,
        problem=problem,
        predicted=predicted,
        weights_bytes_per_gpu=weights,
        draft_weights_bytes_per_gpu=draft_weights,
        kv_bytes_per_token=cell,
        per_request_bytes=per_request,
        requested_slots=slots,
        kv_pool_bytes=max(pool_bytes, 0),
        kv_pool_tokens=tokens,
        max_running_requests=min(slots, tokens // 2) if problem is None else (slots if not predicted else 0),
        max_slots_that_fit=int(max_fit),
    )


def _gib(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True, slots=True)
class CapacityReport:
    """Both draft states side by side, as ``plan`` prints them."""

    model: str
    gpu_memory_bytes: int
    mem_fraction: float
    draft_off: Capacity
    draft_on: Capacity

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "mem_fraction": self.mem_fraction,
            "draft_off": self.draft_off.to_json(),
            "draft_on": self.draft_on.to_json(),
        }


def plan_capacity(
    spec: SeatSpec, *, slots_off: int, slots_on: int, mem_fraction: float
) -> CapacityReport | None:
    """Both states for a spec, or None when the spec names no config.json to plan from."""
    cfg = spec.model_config_path()
    if cfg is None:
        return None
    if not cfg.is_file():
        raise SpecError(
            f"no config.json at {cfg}", fix="point model.config at the model directory (relative to the spec file)",
            **spec_location(spec, "model.config"),
        )
    shape = load_model_shape(cfg, kv_dtype_bytes=spec.model.kv_cache_dtype_bytes)
    return CapacityReport(
        model=shape.architecture,
        gpu_memory_bytes=int(spec.cluster.gpu_memory_gb * GIB),
        mem_fraction=mem_fraction,
        draft_off=predict(spec, shape, draft=False, slots=slots_off, mem_fraction=mem_fraction),
        draft_on=predict(spec, shape, draft=True, slots=slots_on, mem_fraction=mem_fraction),
    )


def refuse_if_unbootable(spec: SeatSpec, cap: Capacity) -> None:
    """Raise :class:`CapacityError` with the numbers when the selected state cannot boot."""
    if cap.fits or not cap.predicted:
        return
    state = "on" if cap.draft else "off"
    fix = "lower --slots"
    if cap.max_slots_that_fit > 0:
        fix = f"use --slots {cap.max_slots_that_fit} or fewer, or raise --mem-fraction"
    elif cap.problem and "memory fraction" in cap.problem:
        fix = "raise --mem-fraction, or use more GPUs"
    field = "draft.slots" if cap.draft else "slots"
    if cap.problem and "memory fraction" in cap.problem:
        field = "memory_fraction"
    raise CapacityError(f"draft {state}: cannot boot: {cap.problem}", fix=fix, **spec_location(spec, field))
