"""A seat's KV pool and concurrency ceiling before any weights load, draft on and off: SGLang's own arithmetic.

When SGLang 0.5.23 is installed (the operator's head node usually has it; the test setup installs it), the
figures come from SGLang's startup sizing code run on CPU in a child process (:mod:`sgl_seat.sizing.ask_sglang`):
``ServerArgs`` resolution, ``ModelConfig``, the pool configurator SGLang picks, ``_profile_available_bytes``,
``calculate_pool_sizes``, ``resolve_max_num_reqs``. Elsewhere the mirror (:mod:`sgl_seat.sizing.mirror`), held to
SGLang's code within 1 % by a contract test, computes them. Every report says which source it is.

The inputs are the only thing sgl-seat supplies, and each is an input, never a fitted number:

* node 0's command line and the planning config (``model.config``), the file SGLang reads;
* the weights: ``model.weights_gb`` when the spec gives it, else the safetensors index's ``total_size``; per GPU
  it is the total over TP (APPROX: experts split by EP = TP, attention by TP, replicated tensors not added back),
  less the Engram tables when the spec moves them to host memory;
* GPU memory as SGLang's queries would report it: total = ``cluster.gpu_memory_gb``; free before load = total
  minus a CUDA context (APPROX, 1 GiB); free after load = that minus weights, draft weights and a runtime
  reserve (APPROX, 2 GiB: NCCL buffers and the like resident before the KV pool is profiled).

Read the engine's ``KV Cache is allocated ... #tokens: N`` line to compare (``sgl-seat status`` does).
About 400 lines: the inputs, the choice of source and the report are one decision and stay together.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from sgl_seat.errors import CapacityError, SpecError
from sgl_seat.sizing import mirror
from sgl_seat.sizing.ask_sglang import SGLANG_VERSION, SizingCase, SizingError, installed_version, size_with_sglang
from sgl_seat.sizing.cache import CACHE_ENV
from sgl_seat.sizing.draft_tiers import ADAPTIVE_CONFIG_NAME, SEAT_FILES
from sgl_seat.sizing.engram import EngramTables, engram_tables
from sgl_seat.sizing.reconcile import has_report_shape, report_notes
from sgl_seat.spec import SeatSpec, builtin_models, spec_location

GIB = 1 << 30
# APPROX: what the CUDA context and torch take before SGLang measures ``pre_model_load_memory``.
CUDA_CONTEXT_BYTES = 1 * GIB
# APPROX: memory resident after load that is neither weights nor KV (NCCL buffers, runtime pools).
RUNTIME_RESERVE_BYTES = 2 * GIB
#: ``SGLSEAT_SIZING``: ``auto`` (SGLang when installed, for SGLang seats), ``sglang`` (required) or ``mirror``.
SIZING_ENV = "SGLSEAT_SIZING"
SOURCE_MIRROR = "mirror"
SOURCE_SGLANG = f"sglang-{SGLANG_VERSION}"
#: Flags of node 0's command line that only route logs; left out of the sizing run (their values are
#: apply-time placeholders, and the request log would be a directory SGLang might create).
_NOT_SIZING_FLAGS = {"--log-requests-target": -1, "--log-requests-format": 1, "--log-requests-level": 1,
                     "--log-requests": 0}


@dataclass(frozen=True, slots=True)
class Capacity:
    """One draft state. Bytes are per GPU; tokens are the pool SGLang allocates on every rank."""

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
    swa_pool_tokens: int | None = None
    configurator: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CapacityReport:
    """Both draft states side by side, as ``plan`` prints them, and where the figures come from."""

    model: str
    gpu_memory_bytes: int
    mem_fraction: float
    draft_off: Capacity
    draft_on: Capacity
    source: str = SOURCE_MIRROR
    sglang_version: str | None = None
    model_type: str | None = None
    engram_host_bytes_per_node: int | None = None
    engram_pinned_bytes_per_process: int | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def source_label(self) -> str:
        """Words for the text output: who computed the figures."""
        if self.source == SOURCE_MIRROR:
            return f"mirror of SGLang {SGLANG_VERSION}'s sizing"
        return f"SGLang {self.sglang_version}'s own sizing code"

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "model_type": self.model_type,
            "source": self.source,
            "sglang_version": self.sglang_version,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "mem_fraction": self.mem_fraction,
            "engram_host_bytes_per_node": self.engram_host_bytes_per_node,
            "engram_pinned_bytes_per_process": self.engram_pinned_bytes_per_process,
            "draft_off": self.draft_off.to_json(),
            "draft_on": self.draft_on.to_json(),
            "notes": list(self.notes),
        }


def read_planning_config(config_path: Path) -> dict[str, Any]:
    """config.json as SGLang would read it (errors name the file)."""
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
    return cfg


def weights_total_bytes(spec: SeatSpec, config_path: Path) -> int | None:
    """The checkpoint's weights: ``model.weights_gb`` (GiB), else what is on disk beside config.json (its
    safetensors index, or one model.safetensors), else, for random weights a GPU engine makes, the config's
    parameters."""
    if spec.model.weights_gb is not None:
        return int(spec.model.weights_gb * GIB)
    dummy = spec.gpu.load_format == "dummy" and spec.device == "cuda"
    if not dummy or (config_path.parent / "model.safetensors.index.json").is_file():
        return checkpoint_bytes(config_path)
    try:  # random weights made by the engine: exactly the parameters the config describes
        return mirror.dense_param_bytes(read_planning_config(config_path))
    except mirror.MirrorUnsupported:
        return None


def checkpoint_bytes(config_path: Path) -> int | None:
    """The weights beside a config.json on disk: its safetensors index's total, else one model.safetensors file's
    tensors; None when neither is there."""
    index = config_path.parent / "model.safetensors.index.json"
    if index.is_file():
        try:
            return int(json.loads(index.read_text(encoding="utf-8"))["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SpecError(f"safetensors index unreadable: {exc}", path=str(index)) from None
    single = config_path.parent / "model.safetensors"
    return safetensors_data_bytes(single) if single.is_file() else None


def safetensors_data_bytes(path: Path) -> int:
    """The tensors' bytes of one safetensors file (a checkpoint saved without an index): the file less its header
    (an 8-byte little-endian length, then that much JSON)."""
    try:
        with path.open("rb") as f:
            header = int.from_bytes(f.read(8), "little")
        return path.stat().st_size - 8 - header
    except OSError as exc:
        raise SpecError(f"safetensors file unreadable: {exc}", path=str(path)) from None


@dataclass(frozen=True, slots=True)
class EngramPlacement:
    """The spec's Engram choice resolved against the config: host table or HBM, and what it moves."""

    tables: EngramTables | None
    host_table: bool
    layout: Literal["shared", "per_rank"]
    staging: bool

    def gpu_bytes_moved_per_rank(self, tp: int) -> int:
        return self.tables.gpu_bytes_per_rank(tp) if (self.tables and self.host_table) else 0


def engram_placement(spec: SeatSpec, cfg: Mapping[str, Any]) -> EngramPlacement:
    """The spec's ``engram`` block (default: tables in HBM) checked against the config's tables."""
    tables = engram_tables(cfg)
    eng = spec.engram
    if eng.host_table and tables is None:
        raise SpecError(
            "engram.host_table is on but the planning config declares no Engram tables (engram_layer_ids)",
            fix="turn engram.host_table off, or point model.config at a DeepSeek-V4.1 config with Engram keys",
            **spec_location(spec, "engram.host_table"),
        )
    return EngramPlacement(tables=tables, host_table=eng.host_table, layout=eng.layout, staging=eng.host_staging)


def sizing_argv(spec: SeatSpec, *, draft: bool, slots: int, mem_fraction: float) -> list[str]:
    """The sizing-relevant flags of node 0's command line, for callers that have no plan (tests, benches).

    ``plan`` passes the real node-0 argv instead; both carry the same values for these flags.
    """
    argv = [
        "--model-path", spec.model.path, "--tp-size", str(spec.parallel.tp), "--ep-size", str(spec.parallel.ep),
        "--nnodes", str(spec.cluster.nodes), "--node-rank", "0",
        "--mem-fraction-static", format(mem_fraction, "g"), "--max-running-requests", str(slots),
        "--context-length", str(spec.model.context_length),
    ]
    return argv + (speculative_flags(spec) if draft else [])


def speculative_flags(spec: SeatSpec) -> list[str]:
    """The draft's SGLang flags, as node 0's command line and the sizing run both carry them (one source)."""
    d = spec.draft
    argv = ["--speculative-algorithm", d.algorithm]
    if d.algorithm == "NGRAM":  # no draft model, no steps or topk: draft tokens from its suffix index
        return [*argv, "--speculative-num-draft-tokens", str(d.draft_tokens)]
    if d.model_path:
        argv += ["--speculative-draft-model-path", d.model_path]
    argv += ["--speculative-num-steps", str(d.steps), "--speculative-eagle-topk", str(d.topk),
             "--speculative-num-draft-tokens", str(d.draft_tokens)]
    if d.off_above is not None:  # the policy's tiers (sgl_seat.sizing.draft_tiers), a file the plan carries
        return [*argv, "--speculative-adaptive", "--speculative-adaptive-config",
                f"{SEAT_FILES}/{ADAPTIVE_CONFIG_NAME}"]
    return [*argv, "--speculative-adaptive"] if d.adaptive else argv


def for_sizing(argv: Sequence[str], model_dir: Path, draft_dir: Path | None = None) -> list[str]:
    """Node 0's flags as the sizing run takes them: ``--model-path`` is the planning config's directory (and
    ``--speculative-draft-model-path`` the draft's, where there is one), and the request-log flags (placeholders,
    no bearing on sizing) are left out."""
    out: list[str] = []
    items = [str(a) for a in argv]
    i = 0
    while i < len(items):
        flag = items[i]
        if flag in _NOT_SIZING_FLAGS:
            n = _NOT_SIZING_FLAGS[flag]
            i += 1
            if n < 0:  # takes one or more values: up to the next flag
                while i < len(items) and not items[i].startswith("--"):
                    i += 1
            else:
                i += n
            continue
        if flag == "--speculative-adaptive-config" and i + 1 < len(items):
            # The policy's tiers are {1: [steps], N+1: [0]}: their largest step is the static draft's, so SGLang
            # sizes them as the static flags (max_speculative_num_draft_tokens = steps + 1); the file is the
            # node's, written at apply time, so the sizing run takes the static flags.
            i += 2
            continue
        if flag == "--speculative-adaptive" and "--speculative-adaptive-config" in items:
            i += 1
            continue
        if flag == "--model-path" and i + 1 < len(items):
            out += [flag, str(model_dir)]
            i += 2
            continue
        if flag == "--speculative-draft-model-path" and draft_dir is not None and i + 1 < len(items):
            out += [flag, str(draft_dir)]
            i += 2
            continue
        out.append(flag)
        i += 1
    if "--model-path" not in out:
        out = ["--model-path", str(model_dir), *out]
    return out


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """What SGLang's GPU memory queries report on one GPU, in bytes."""

    gpu_memory_bytes: int
    pre_load_bytes: int
    free_after_load_bytes: int
    weights_bytes: int
    draft_weights_bytes: int


def memory_budget(spec: SeatSpec, *, weights_total: int, engram: EngramPlacement, draft: bool,
                  draft_cfg: Mapping[str, Any] | None = None, draft_weights_total: int | None = None,
                  ) -> MemoryBudget:
    """``gpu.cuda_context_gb`` / ``gpu.runtime_reserve_gb`` where the spec gives them (measured on the node),
    else the approximations above; the draft's weights are its config's parameters with dummy weights, else
    ``draft.extra_weights_gb``."""
    tp = spec.parallel.tp
    gpu = int(spec.cluster.gpu_memory_gb * GIB)
    ctx = CUDA_CONTEXT_BYTES if spec.gpu.cuda_context_gb is None else int(spec.gpu.cuda_context_gb * GIB)
    reserve = RUNTIME_RESERVE_BYTES if spec.gpu.runtime_reserve_gb is None else int(spec.gpu.runtime_reserve_gb * GIB)
    pre = gpu - ctx
    weights = max(weights_total // tp - engram.gpu_bytes_moved_per_rank(tp), 0)
    draft_weights = 0
    if draft and spec.draft.algorithm != "NGRAM":
        if draft_cfg is not None and spec.gpu.load_format == "dummy":
            draft_weights = mirror.dense_param_bytes(draft_cfg) // tp
        elif draft_weights_total is not None:  # the draft's own checkpoint on disk
            draft_weights = draft_weights_total // tp
        else:
            draft_weights = int(spec.draft.extra_weights_gb * GIB)
    return MemoryBudget(gpu_memory_bytes=gpu, pre_load_bytes=pre,
                        free_after_load_bytes=pre - weights - draft_weights - reserve,
                        weights_bytes=weights, draft_weights_bytes=draft_weights)


def sizing_source(real_sglang: bool) -> str:
    """Which source to use: ``SGLSEAT_SIZING`` (auto/sglang/mirror); auto picks SGLang for a seat of real SGLang
    (``real_sglang``: its backend says so) when the installed SGLang is the release followed, the mirror otherwise
    (the sim's figures are synthetic anyway)."""
    want = os.environ.get(SIZING_ENV, "auto").strip().lower() or "auto"
    if want not in ("auto", "sglang", "mirror"):
        raise SpecError(f"{SIZING_ENV}={want!r}", fix="use auto, sglang or mirror")
    if want == "auto":
        return "sglang" if real_sglang and installed_version() == SGLANG_VERSION else "mirror"
    return want


def _model_dir(cfg_path: Path, stack: list[Path]) -> Path:
    """A directory whose config.json is the planning config (SGLang reads ``<model-path>/config.json``)."""
    if cfg_path.name == "config.json":
        return cfg_path.parent.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="sgl-seat-config-"))
    stack.append(tmp)
    shutil.copyfile(cfg_path, tmp / "config.json")
    return tmp


def _capacity(draft: bool, slots: int, budget: MemoryBudget, got: Mapping[str, Any]) -> Capacity:
    """One state from a result (the SGLang child's answer or the mirror's, same keys)."""
    if got.get("unsupported"):
        return replace(_unpredicted(draft, slots), problem=str(got["unsupported"]))
    error = got.get("error")
    tokens = int(got.get("max_total_num_tokens") or 0)
    max_reqs = int(got.get("max_running_requests") or 0)
    per_token = float(got.get("bytes_per_token") or 0.0)
    problem = None
    if error:
        problem = f"SGLang {SGLANG_VERSION} refuses to size it: {error}"
    elif max_reqs < slots:
        problem = (
            f"{slots} slots: SGLang would reduce --max-running-requests to {max_reqs} "
            f"(KV pool {tokens:,} tokens)"
        )
    return Capacity(
        draft=draft, fits=problem is None, problem=problem, predicted=True,
        weights_bytes_per_gpu=budget.weights_bytes, draft_weights_bytes_per_gpu=budget.draft_weights_bytes,
        kv_bytes_per_token=round(per_token), per_request_bytes=0, requested_slots=slots,
        kv_pool_bytes=int(got.get("available_bytes") or 0), kv_pool_tokens=tokens, max_running_requests=max_reqs,
        max_slots_that_fit=int(got.get("max_slots_that_fit") or 0),
        swa_pool_tokens=got.get("swa_max_total_num_tokens"), configurator=got.get("configurator"),
    )


def _mirror_answer(cfg: Mapping[str, Any], case: SizingCase,
                   draft_cfg: Mapping[str, Any] | None = None) -> dict[str, Any]:
    kw: dict[str, Any] = {"gpu_memory_bytes": case.gpu_memory_bytes, "pre_load_bytes": case.pre_load_bytes,
                          "free_after_load_bytes": case.free_after_load_bytes, "draft_cfg": draft_cfg}
    out: dict[str, Any]
    try:
        res = mirror.size_case(cfg, case.argv, **kw)
        out = {"ok": True, "error": None, **asdict(res)}
    except mirror.SglangWouldRefuse as exc:
        out = {"ok": False, "error": str(exc)}
    except mirror.MirrorUnsupported as exc:
        return {"ok": False, "unsupported": f"SGLang is not installed and the mirror does not cover this: {exc}"}
    if case.search_slots:
        out["max_slots_that_fit"] = mirror.max_slots_that_fit(cfg, case.argv, limit=case.slots_limit, **kw)
    return out


def _unpredicted(draft: bool, slots: int) -> Capacity:
    return Capacity(draft=draft, fits=False,
                    problem="not predicted: no model.weights_gb and no model.safetensors.index.json beside "
                            "config.json, so weights per GPU are unknown",
                    predicted=False, weights_bytes_per_gpu=0, draft_weights_bytes_per_gpu=0, kv_bytes_per_token=0,
                    per_request_bytes=0, requested_slots=slots, kv_pool_bytes=0, kv_pool_tokens=0,
                    max_running_requests=slots, max_slots_that_fit=0)


def plan_capacity(
    spec: SeatSpec, *, slots_off: int, slots_on: int, mem_fraction: float,
    argv_off: Sequence[str] | None = None, argv_on: Sequence[str] | None = None, real_sglang: bool = False,
) -> CapacityReport | None:
    """Both draft states for a spec, or None when the spec names no config.json to plan from.

    ``real_sglang``: the seat runs real SGLang (its backend's
    :attr:`~sgl_seat.engines.EngineFacts.sized_by_sglang`), so SGLang's own sizing code may answer and the field
    report's figures are set beside the plan's.

    ``argv_off`` / ``argv_on`` are node 0's flags for each state (``plan`` passes them); without them the
    sizing-relevant flags are built from the spec (:func:`sizing_argv`).
    """
    cfg_path = spec.model_config_path()
    if cfg_path is None:
        return None
    if not cfg_path.is_file():
        raise SpecError(
            f"no config.json at {cfg_path}",
            fix="point model.config at the model directory (relative to the spec file), or name a built-in "
                f"model: {', '.join(builtin_models())}",
            **spec_location(spec, "model.config"),
        )
    cfg = read_planning_config(cfg_path)
    arch = str((cfg.get("architectures") or ["unknown"])[0])
    engram = engram_placement(spec, cfg)
    total = weights_total_bytes(spec, cfg_path)
    gpu = int(spec.cluster.gpu_memory_gb * GIB)
    host_bytes = pinned = None
    if engram.tables is not None and engram.host_table:
        ranks = spec.parallel.tp // spec.cluster.nodes
        host_bytes = engram.tables.host_bytes_per_node(engram.layout, tp=spec.parallel.tp, ranks_per_node=ranks)
        pinned = engram.tables.pinned_bytes_per_process(engram.layout, tp=spec.parallel.tp)
    model_type = str(cfg["model_type"]) if cfg.get("model_type") else None

    def report(off: Capacity, on: Capacity, **more: Any) -> CapacityReport:
        return CapacityReport(model=arch, gpu_memory_bytes=gpu, mem_fraction=mem_fraction, draft_off=off,
                              draft_on=on, model_type=model_type, engram_host_bytes_per_node=host_bytes,
                              engram_pinned_bytes_per_process=pinned, **more)

    if total is None:
        return report(_unpredicted(False, slots_off), _unpredicted(True, slots_on))
    cleanup: list[Path] = []
    try:
        model_dir = _model_dir(cfg_path, cleanup)
        draft_path = spec.draft_config_path()
        draft_cfg = read_planning_config(draft_path) if draft_path is not None else None
        draft_dir = _model_dir(draft_path, cleanup) if draft_path is not None else None
        draft_total = checkpoint_bytes(draft_path) if draft_path is not None else None
        states = [(False, slots_off, argv_off), (True, slots_on, argv_on)]
        budgets, cases = [], []
        for draft, slots, argv in states:
            budget = memory_budget(spec, weights_total=total, engram=engram, draft=draft, draft_cfg=draft_cfg,
                                   draft_weights_total=draft_total)
            flags = argv if argv is not None else sizing_argv(spec, draft=draft, slots=slots, mem_fraction=mem_fraction)
            budgets.append(budget)
            cases.append(SizingCase(
                case_id=f"draft-{'on' if draft else 'off'}", argv=tuple(for_sizing(flags, model_dir, draft_dir)),
                gpu_memory_bytes=budget.gpu_memory_bytes, pre_load_bytes=budget.pre_load_bytes,
                free_after_load_bytes=budget.free_after_load_bytes, search_slots=True,
            ))
        source, version, notes = SOURCE_MIRROR, None, []
        answers: list[dict[str, Any]]
        want = sizing_source(real_sglang)
        if want == "sglang":
            try:
                got = size_with_sglang(cases)
                answers, source, version = list(got.results), SOURCE_SGLANG, got.sglang_version
                if got.cached:
                    notes.append(f"SGLang {version}'s answers for these exact inputs were read from the sizing cache "
                                 f"({got.cached} of {len(cases)}; computed earlier by the same installed SGLang; "
                                 f"{CACHE_ENV}=off recomputes)")
            except SizingError as exc:
                if os.environ.get(SIZING_ENV, "auto").strip().lower() == "sglang":
                    raise CapacityError(f"SGLang's sizing could not run: {exc}",
                                        fix=f"install SGLang {SGLANG_VERSION} (scripts/install-sglang-parser.sh) "
                                            f"or set {SIZING_ENV}=mirror") from None
                notes.append(f"SGLang's sizing could not run ({exc}); figures from the mirror")
                answers = [_mirror_answer(cfg, c, draft_cfg) for c in cases]
        else:
            answers = [_mirror_answer(cfg, c, draft_cfg) for c in cases]
    finally:
        for path in cleanup:
            shutil.rmtree(path, ignore_errors=True)
    off, on = (_capacity(d, s, b, a) for (d, s, _), b, a in zip(states, budgets, answers, strict=True))
    label = f"SGLang {version}'s sizing" if source == SOURCE_SGLANG else f"the mirror of SGLang {SGLANG_VERSION}"
    if real_sglang and has_report_shape(spec, arch):
        notes += report_notes(source_label=label, off_tokens=off.kv_pool_tokens or None,
                              on_tokens=on.kv_pool_tokens or None, on_problem=on.problem,
                              mem_fraction=mem_fraction, model_type=model_type)
    return report(off, on, source=source, sglang_version=version, notes=tuple(notes))


def refuse_if_unbootable(spec: SeatSpec, cap: Capacity) -> None:
    """Raise :class:`CapacityError` with the numbers when the selected state does not run what was asked."""
    if cap.fits or not cap.predicted:
        return
    state = "on" if cap.draft else "off"
    field_name = "draft.slots" if cap.draft else "slots"
    if cap.max_slots_that_fit > 0:
        fix = f"use --slots {cap.max_slots_that_fit} or fewer, or raise --mem-fraction"
    else:
        fix = "raise --mem-fraction, lower the weights per GPU, or use more GPUs"
        if cap.problem and "speculative" in cap.problem:
            fix = "turn the draft off, or use a draft algorithm SGLang accepts for this model"
            field_name = "draft.algorithm"
        elif cap.problem and "mem-fraction" in cap.problem:
            field_name = "memory_fraction"
    raise CapacityError(f"draft {state}: cannot boot: {cap.problem}", fix=fix, **spec_location(spec, field_name))
