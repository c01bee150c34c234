"""The seat spec: one YAML file that says what a seat is, validated before anything runs.

Loading is strict (unknown keys are errors) because a misspelt knob that is silently ignored is
how a seat boots with the wrong memory fraction. Every error names the file, the line, the field
and what to change, so :func:`load_spec` turns pydantic's errors into one :class:`SpecError`.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
import typing
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sgl_seat import envcompat
from sgl_seat.errors import SpecError

SCHEMA_VERSION = 1

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Strict(BaseModel):
    """Base for every spec section: unknown keys rejected, values frozen after load."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """What is served and, for planning, where its config.json lives."""

    path: str = Field(min_length=1, description="Model directory or hub id as the engine loads it.")
    served_name: str | None = Field(default=None, description="Name the API reports; default: last path part.")
    context_length: int = Field(gt=0, le=10_000_000, description="--context-length passed to the engine.")
    config: str | None = Field(
        default=None,
        description="Directory (or config.json path) used for capacity planning; relative to the spec file, or a "
        "built-in model's name (launch/models: e.g. deepseek-v4-flash), found wherever the spec file is.",
    )
    architecture: str | None = Field(
        default=None, pattern=r"^[A-Za-z][A-Za-z0-9_]{0,127}$",
        description="The model's architectures[0] (which functions the watchdog's probe wraps, "
        "watchdog/probe-targets.yaml); default: model.config's. A seat planned without a config sets it.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="--dtype: the weights' and activations' type (auto: the engine's choice from "
        "the config). float32 where answers are compared: in bf16 a small model's first tokens can tie.")
    kv_cache_dtype_bytes: int | None = Field(
        default=None, ge=1, le=4, description="Bytes per KV element; default from the model family."
    )
    weights_gb: float | None = Field(
        default=None, gt=0, le=100_000,
        description="Checkpoint weights in GiB, all ranks together (an input for planning; default: the "
        "safetensors index beside model.config).",
    )

    @property
    def name(self) -> str:
        return self.served_name or self.path.rstrip("/").split("/")[-1]


class HostSpec(_Strict):
    """One machine of the cluster and what is true of it alone (its NIC and HCA names, what preflight expects).

    Ray, not the spec, decides which host a placement bundle (a node rank) lands on, so settings that
    belong to a machine are keyed on the machine: ``up`` matches each node agent's address (or hostname)
    to a host here and gives that node the host's env. ``node_rank`` pins a rank to this host through
    ``ray_resource``, a custom resource only this host's raylet declares (``ray start --resources``).
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", description="Label used in plan and status.")
    address: str = Field(min_length=1, description="The host's node IP as Ray reports it, or its hostname.")
    env: dict[str, str] = Field(default_factory=dict, description="This host's env (NCCL/Gloo interface, HCA, GID).")
    interfaces: list[str] = Field(
        default_factory=list, description="Preflight expectation: interfaces that must exist on this host."
    )
    ray_resource: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$",
        description="Custom Ray resource only this host declares (`ray start --resources '{\"<name>\": 1}'`).",
    )
    node_rank: int | None = Field(
        default=None, ge=0, le=63, description="Pin this node rank to this host (needs ray_resource)."
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if envcompat.is_own(key):  # SGLSEAT_*, and the old names (issue 49)
                raise ValueError(f"{key!r}: {envcompat.NEW_PREFIX}* variables (and their old names, "
                                 f"{envcompat.OLD_PREFIX}*) are set by sgl-seat itself")
        return value

    @model_validator(mode="after")
    def _pin(self) -> HostSpec:
        if self.node_rank is not None and self.ray_resource is None:
            raise ValueError(f"host {self.name!r} pins node_rank {self.node_rank} but names no ray_resource;"
                             " Ray can only be told where a bundle goes through a resource this host alone has")
        return self


class ClusterSpec(_Strict):
    """Where the seat runs: a Ray address (or ``local`` / ``auto``) and the node shape."""

    address: str = Field(default="local", min_length=1, description="'local', 'auto' or a Ray address.")
    nodes: int = Field(ge=1, le=64)
    gpus_per_node: int = Field(ge=1, le=16)
    gpu_memory_gb: float = Field(gt=0, le=1024, description="Per-GPU memory in GiB, for planning.")
    cpus_per_node: int = Field(default=4, ge=1, le=1024, description="CPUs asked for in each Ray bundle.")
    token_env: str | None = Field(
        default=None, description="Name of the environment variable that holds the Ray auth token, if any."
    )
    hosts: list[HostSpec] = Field(
        default_factory=list,
        description="Per-host settings (replaces network.node_env); each node gets the env of the host Ray put it on.",
    )

    @model_validator(mode="after")
    def _hosts(self) -> ClusterSpec:
        for attr in ("name", "address"):
            seen = [getattr(h, attr) for h in self.hosts]
            dup = sorted({v for v in seen if seen.count(v) > 1})
            if dup:
                raise ValueError(f"cluster.hosts: {attr} {dup} given more than once")
        if self.hosts and len(self.hosts) < self.nodes:
            raise ValueError(f"cluster.hosts names {len(self.hosts)} hosts for {self.nodes} nodes; name every host"
                             " a node may land on")
        pins = [h.node_rank for h in self.hosts if h.node_rank is not None]
        if len(set(pins)) != len(pins):
            raise ValueError(f"cluster.hosts pins node ranks {pins}; a rank can be pinned to one host only")
        over = [p for p in pins if p >= self.nodes]
        if over:
            raise ValueError(f"cluster.hosts pins node rank {over[0]}, but the seat has {self.nodes} nodes")
        return self


class ParallelSpec(_Strict):
    """Parallel sizes as SGLang takes them."""

    tp: int = Field(ge=1, le=1024)
    ep: int = Field(default=1, ge=1, le=1024)
    dp: int = Field(default=1, ge=1, le=1024)


class DraftSpec(_Strict):
    """The speculative draft (MTP/EAGLE head) and the slot count it can afford."""

    enabled: bool = False
    algorithm: Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] = "EAGLE"
    steps: int = Field(default=3, ge=1, le=16)
    topk: int = Field(default=1, ge=1, le=16)
    draft_tokens: int = Field(default=4, ge=2, le=64)
    slots: int = Field(default=8, ge=1, le=4096, description="--max-running-requests with the draft on.")
    model_path: str | None = Field(default=None, description="Separate draft checkpoint (EAGLE3, STANDALONE).")
    config: str | None = Field(
        default=None, description="The draft checkpoint's config.json for planning (relative to this file): its "
        "layers join the KV cell and, with dummy weights, its parameters the weights. Default: model_path's.")
    extra_weights_gb: float = Field(
        default=2.0, ge=0, le=512, description="Draft weights per GPU in GiB, when config.json does not say."
    )
    adaptive: bool = Field(
        default=False, description="--speculative-adaptive: SGLang's draft-step tiers by batch size (0 steps at a "
        "batch of 64 with its defaults; KV allocated for the largest tier). EAGLE/EAGLE3 with topk 1 only.",
    )
    off_above: int | None = Field(
        default=None, ge=1, le=4096, description="The draft policy: draft at decode batches of up to this many "
        "running requests and not above (SGLang's --speculative-adaptive with a zero-step tier; "
        "sgl_seat.sizing.draft_tiers). Written by `sgl-seat tune draft` from a gate's crossover. The KV pool and slot "
        "cap stay those of the draft on. SGLang: EAGLE/EAGLE3 with topk 1 only; vLLM: NGRAM, as its own schedule "
        "(num_speculative_tokens_per_batch_size).",
    )

    @model_validator(mode="after")
    def _shape(self) -> DraftSpec:
        # NGRAM takes no steps or topk: its draft tokens are a BFS over a suffix index (default 12 there).
        if self.algorithm != "NGRAM" and self.topk == 1 and self.draft_tokens != self.steps + 1:
            raise ValueError(
                f"with topk 1 SGLang forces draft_tokens = steps + 1 = {self.steps + 1}, got {self.draft_tokens}"
            )
        # NGRAM with a policy is vLLM's schedule (num_speculative_tokens_per_batch_size); SGLang's backend refuses it.
        ngram_policy = self.algorithm == "NGRAM" and not self.adaptive
        if self.runs_adaptive and not ngram_policy and (self.algorithm not in ("EAGLE", "EAGLE3") or self.topk != 1):
            what = "off_above" if self.off_above is not None else "adaptive"
            raise ValueError(f"draft.{what} needs SGLang's --speculative-adaptive, which runs EAGLE/EAGLE3 with topk 1"
                             f" only (adaptive_unsupported_reason); this draft is {self.algorithm}, topk {self.topk}")
        return self

    @property
    def runs_adaptive(self) -> bool:
        """True when the draft runs SGLang's adaptive tiers: ``adaptive``, or a policy (``off_above``)."""
        return self.adaptive or self.off_above is not None


class NetworkSpec(_Strict):
    """Ports and the per-node NCCL/Gloo environment (never copied from node 0 to the others)."""

    host: str = Field(
        default="127.0.0.1", description="--host of the engine HTTP server on node 0 (loopback unless set)."
    )
    http_port: int = Field(default=30000, ge=1024, le=65535)
    dist_init_port: int = Field(default=5000, ge=1024, le=65535)
    env: dict[str, str] = Field(default_factory=dict, description="Environment common to every node.")
    node_env: list[dict[str, str]] = Field(
        default_factory=list, description="One mapping per node rank, in order; each node's own interfaces."
    )

    @field_validator("env", "node_env")
    @classmethod
    def _names(cls, value: Any) -> Any:
        maps = value if isinstance(value, list) else [value]
        for mapping in maps:
            for key in mapping:
                if not _ENV_NAME.match(key):
                    raise ValueError(f"{key!r} is not a valid environment variable name")
        return value

    @model_validator(mode="after")
    def _ports(self) -> NetworkSpec:
        if self.http_port == self.dist_init_port:
            raise ValueError(f"http_port and dist_init_port are both {self.http_port}; use two ports")
        return self


#: What the seat does after the watchdog's bundle of a hang (``watchdog.on_hang``; ``sgl-seat up --on-hang``).
ON_HANG_POLICIES: tuple[str, ...] = ("capture", "restart", "rollback-draft")
OnHang = Literal["capture", "restart", "rollback-draft"]


class RemediationSpec(_Strict):
    """The budget of ``watchdog.on_hang``'s remediations, and the guard that stops a restart loop.

    Why a budget and a cooldown both: a restart brings back a seat whose cause is still there (the draft, a bad
    host), so it can hang again at once and be restarted again, for ever, hiding the incident behind serving
    gaps. The budget bounds how often a seat is healed without a person in a sliding window; the cooldown says
    that a seat hung again soon after a remediation was not healed by it, and hands it to an operator at once.
    """

    max: int = Field(default=3, ge=1, le=100, description="Remediations allowed within window_s; past it the "
                     "seat stays down as REMEDIATION-EXHAUSTED until an operator brings it back.")
    window_s: float = Field(default=3600, gt=0, le=7 * 86_400,
                            description="The sliding window (seconds) that `max` counts remediations in.")
    cooldown_s: float = Field(default=300, ge=0, le=86_400,
                              description="A seat that hangs again within this many seconds of a remediation "
                              "(from when it served again, else from when the remediation began) is not "
                              "remediated again without an operator (0: no such guard).")
    draft_gather_max: int | None = Field(
        default=None, ge=1, le=1 << 40,
        description="rollback-draft: the largest gather a draft-on decode/verify step makes (default: "
        "draft.slots x draft.draft_tokens, one id per token position: the sim, and the embedding lookup the "
        "tiny models' probe times). A stalled gather larger than this is a prefill, which the draft does not "
        "change. A model whose probed gather counts several ids per position (DeepSeek-V4.1 Engram: "
        "n_hash_cols) sets it.",
    )


class WatchdogSpec(_Strict):
    """Thresholds of the sidecar watchdog; SGLang's own watchdog timeout is passed through.

    ``on_hang`` and ``remediation`` say what happens after a hang's bundle, not how a hang is detected: they are
    left out of :meth:`model_dump` (``exclude``), so the ``thresholds`` a bundle records (scalars, read back by
    replay's :func:`~sgl_seat.core.detect.thresholds_from`) stay the detector thresholds they always were.
    """

    engine_timeout_s: float = Field(default=300, gt=0, description="SGLang --watchdog-timeout.")
    enabled: bool = True
    sample_hz: float = Field(default=1.0, gt=0, le=50)
    history_s: float = Field(default=120, gt=0, le=86_400)
    no_progress_s: float = Field(default=5.0, gt=0)
    stack_unchanged_samples: int = Field(default=5, ge=2)
    rowfetch_inflight_s: float = Field(
        default=3.0, gt=0, description="The fixed row-fetch threshold: for warm-up calls and for shapes with fewer "
        "than learn_min_samples healthy calls (every call when learn_enabled is off).")
    stopped_s: float = Field(
        default=0.25, gt=0, description="An engine process stopped (/proc state T, read 20 times a second) this long "
        "without a break. A healthy engine process is never in state T (py-spy's native dumps leave it in 't'), "
        "so there is nothing to learn: this floor is the threshold.")
    learn_enabled: bool = Field(
        default=True, description="Judge a probed call by the threshold learned from its shape's healthy calls "
        "(core/learned.py); off: rowfetch_inflight_s for every call.")
    learn_floor_s: float = Field(default=0.3, gt=0, le=3600,
                                 description="A learned row-fetch threshold is never below this.")
    learn_k: float = Field(default=8.0, ge=1, le=1000,
                           description="A learned threshold is learn_k x the shape's learn_quantile.")
    learn_quantile: float = Field(default=99.0, gt=0, le=100,
                                  description="The percentile of the shape's healthy durations (nearest rank).")
    learn_min_samples: int = Field(default=200, ge=10, le=4096,
                                   description="Healthy calls of a shape before its learned threshold replaces "
                                   "rowfetch_inflight_s.")
    learn_warmup_calls: int = Field(default=2, ge=0, le=1000,
                                    description="A process's first calls of each shape are warm-up: they teach "
                                    "nothing and are judged by rowfetch_inflight_s.")
    learn_idle_gap_s: float = Field(default=5.0, gt=0, le=86_400,
                                    description="A process's first call after this long without a probed call is "
                                    "warm-up too (after start-up, idle or --sleep-on-idle).")
    exporter_bind: str = Field(
        default="loopback",
        description="Where each node's sidecar serves its Prometheus metrics (port http_port + 15 + node rank): "
        "'loopback' (127.0.0.1, the default: only a Prometheus or agent on that node can scrape it), 'cluster' "
        "(the node's address as Ray reports it, so a Prometheus on a monitoring host can scrape every node; "
        "`sgl-seat prometheus-config` writes its scrape config), or an IP address every node has, such as "
        "0.0.0.0. The metrics carry no prompts, but anyone who can reach the port can read them.",
    )

    on_hang: OnHang = Field(
        default="capture", exclude=True,
        description="After a hang's bundle is complete: 'capture' (only the bundle; the seat stays as it is), "
        "'restart' (the seat's engines restarted with the same plan), 'rollback-draft' (re-planned with the draft "
        "off when the verdict is one the draft makes likely, else restart). Within watchdog.remediation's budget. "
        "`sgl-seat up --on-hang` overrides it for one seat.",
    )
    remediation: RemediationSpec = Field(default_factory=RemediationSpec, exclude=True)

    @field_validator("exporter_bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        if value in ("loopback", "cluster"):
            return value
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not 'loopback', 'cluster' or an IP address") from None
        return value


class BundleSpec(_Strict):
    """Where forensic bundles go and how much disk they may take."""

    dir: str | None = Field(default=None, description="Default: $SGLSEAT_HOME/bundles/<seat>.")
    quota_mb: int = Field(default=2048, ge=1)
    raw_prompts: bool = Field(default=False, description="Keep raw prompt/output text (off: redacted).")


class SimSpec(_Strict):
    """Knobs of the sim engine (ignored by real SGLang); every figure it makes is synthetic."""

    accept_rate: float = Field(default=0.81, ge=0, le=1)
    step_floor_ms: float = Field(default=30.0, ge=0)
    faults: list[str] = Field(default_factory=list, description="KIND:key=value,... as `up --fault` takes.")


class EngramSpec(_Strict):
    """DeepSeek-V4.1's Engram tables: in HBM (default, TP-sharded) or in pinned host memory on every node."""

    host_table: bool = Field(default=False, description="SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1 on every node.")
    layout: Literal["shared", "per_rank"] = Field(
        default="shared", description="SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT (shared needs one PID namespace)."
    )
    host_staging: bool = Field(default=False, description="SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING=1.")


class CpuEngineSpec(_Strict):
    """SGLang's CPU engine (``device: cpu``): for rehearsing a seat where there is no GPU.

    On a CPU the KV pool is not sized from a GPU's memory: SGLang takes the host's available memory, which
    would reserve gigabytes, so ``--max-total-tokens`` bounds it (``sglang-cpu.md``, "Run").
    """

    max_total_tokens: int = Field(default=65536, ge=256, le=10_000_000,
                                  description="--max-total-tokens: the KV pool in tokens (what capacity is on a CPU).")
    load_format: Literal["dummy", "auto", "safetensors"] = Field(
        default="dummy", description="--load-format: dummy fills random weights (a tiny model has none on disk).")
    threads_bind: str | None = Field(
        default=None, pattern=r"^[0-9,|-]+$",
        description="SGLANG_CPU_OMP_THREADS_BIND, one entry per rank separated by '|' (default: core i for rank i).",
    )
    kv_cache_gb: int | None = Field(
        default=None, ge=1, le=1024, description="vLLM's CPU engine: VLLM_CPU_KVCACHE_SPACE, its KV cache in whole "
        "GiB (what capacity is on a vLLM CPU seat; SGLang's reads max_total_tokens).")
    sleep_on_idle: bool = Field(
        default=True, description="--sleep-on-idle: an idle scheduler sleeps (~1.5 % of a core) instead of spinning "
        "at ~100 % in its poll loop (off: the spin, which the watchdog must not take for a hang).")


class GpuEngineSpec(_Strict):
    """Flags a GPU seat's engine needs on its image (``device: cuda``), and the two memory facts its plan uses.

    On the H200 image with SGLang 0.5.17 (``../shared/reference/sglang-gpu.md``): ``attention_backend: triton``
    (Hopper's default, fa3, loads a 1 GB kernel the lean engine package leaves out) and ``sampling_backend:
    pytorch`` (flashinfer's JIT headers are left out too). ``cuda_context_gb`` / ``runtime_reserve_gb`` replace the
    plan's approximations where they were measured on the node (``bench/gpu/draft_seat.py`` measures them with the
    engine's own torch: total memory, and what a fresh CUDA process holds).
    """

    attention_backend: Literal["triton", "fa3", "flashinfer"] | None = Field(
        default=None, description="--attention-backend (default: SGLang's choice for the GPU).")
    sampling_backend: Literal["pytorch", "flashinfer"] | None = Field(
        default=None, description="--sampling-backend (default: SGLang's choice).")
    load_format: Literal["auto", "dummy", "safetensors"] = Field(
        default="auto", description="--load-format: dummy fills random weights (a model made from a config); "
        "the plan then counts the config's parameters as the weights.")
    cuda_graph_max_bs: int | None = Field(
        default=None, ge=1, le=4096, description="--cuda-graph-max-bs-decode: the largest decode batch captured.")
    disable_prefill_cuda_graph: bool = Field(
        default=False, description="--disable-prefill-cuda-graph: no prefill graphs captured at start (they took "
        "74 s of an 8B-shaped model's start on the H200).")
    cuda_context_gb: float | None = Field(
        default=None, ge=0, le=64, description="GPU memory a process holds before the weights load, measured on the "
        "node (a fresh CUDA process's total minus free memory); default: the plan's approximation, 1 GiB.")
    runtime_reserve_gb: float | None = Field(
        default=None, ge=0, le=64, description="GPU memory resident after load that is neither weights nor KV; "
        "default: the plan's approximation, 2 GiB (NCCL buffers of a multi-GPU seat).")


class SeatSpec(_Strict):
    """A whole seat. ``source`` is where it was loaded from (not part of the YAML)."""

    schema_version: Literal[1]
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    engine: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$", description="The engine backend (sgl_seat.engines: "
                        "sglang, sim, or one registered); `plan` refuses one it does not know.")
    python: str = Field(default="python3", min_length=1, description="Interpreter on the nodes.")
    device: Literal["cuda", "cpu"] = Field(
        default="cuda", description="cuda: GPU nodes; cpu: CPU nodes (rehearsals; the engines that run there).")
    cpu: CpuEngineSpec = Field(default_factory=CpuEngineSpec)
    gpu: GpuEngineSpec = Field(default_factory=GpuEngineSpec)
    model: ModelSpec
    cluster: ClusterSpec
    parallel: ParallelSpec
    memory_fraction: float = Field(gt=0.05, lt=1.0, description="--mem-fraction-static.")
    slots: int = Field(ge=1, le=4096, description="--max-running-requests with the draft off.")
    draft: DraftSpec = Field(default_factory=DraftSpec)
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    watchdog: WatchdogSpec = Field(default_factory=WatchdogSpec)
    bundles: BundleSpec = Field(default_factory=BundleSpec)
    sim: SimSpec | None = None
    rehearsal: bool = Field(
        default=False, description="A rehearsal seat (tests, benches, drills; never production): faults may be "
        "injected into its real engine (`up --fault probe-stall:...`, `sgl-seat fault`). A production plan "
        "refuses them.")
    engram: EngramSpec = Field(default_factory=EngramSpec)
    source: str | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _cross(self) -> SeatSpec:
        if self.network.node_env and len(self.network.node_env) != self.cluster.nodes:
            raise ValueError(
                f"network.node_env has {len(self.network.node_env)} entries for {self.cluster.nodes} nodes;"
                " give one mapping per node rank"
            )
        if self.network.node_env and self.cluster.hosts:
            raise ValueError("network.node_env (per node rank) and cluster.hosts (per host) both set; Ray picks"
                             " which host holds which rank, so give the per-machine env in cluster.hosts only")
        if self.watchdog.on_hang != "capture" and not self.watchdog.enabled:
            raise ValueError(f"watchdog.on_hang: {self.watchdog.on_hang} acts on the watchdog's verdicts, but "
                             "watchdog.enabled is false; enable the watchdog or set on_hang: capture")
        return self

    def to_json(self) -> dict[str, Any]:
        """The validated spec as JSON data, what the seat record keeps of it (:meth:`from_json` rebuilds it): every
        field, ``watchdog.on_hang`` and ``watchdog.remediation`` included (they are left out of :meth:`model_dump`),
        ``source`` left out (the record keeps it apart, for display and for paths relative to the file)."""
        doc = self.model_dump(mode="json")
        doc["watchdog"] |= {"on_hang": self.watchdog.on_hang,
                            "remediation": self.watchdog.remediation.model_dump(mode="json")}
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, source: str | None = None) -> SeatSpec:
        """The spec :meth:`to_json` wrote, validated again as a file is (a damaged one is a :class:`SpecError`);
        ``source``: the file it was first loaded from (model.config and draft.config are found beside it)."""
        if "source" in doc:
            raise SpecError("'source' is not a spec key", path=source, field="source", fix="remove the key")
        try:
            return cls.model_validate({**doc, "source": source})
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "<spec>"
            raise SpecError(f"a recorded spec does not validate ({exc.error_count()} errors): {err['msg']}",
                            path=source, field=field, fix="take the seat down and bring it up again") from None

    def model_config_path(self) -> Path | None:
        """The planning config.json: relative to the spec file, else a built-in model by name
        (:func:`planning_config_path`)."""
        if self.model.config is None:
            return None
        return planning_config_path(self.model.config, self.source)

    def draft_config_path(self) -> Path | None:
        """The draft checkpoint's planning config.json: ``draft.config``, else ``draft.model_path``'s where that is
        a path on this machine (not a placeholder filled on the node); None for a draft without a checkpoint."""
        given = self.draft.config or self.draft.model_path
        if given is None or "${" in given:
            return None
        return planning_config_path(given, self.source)

    def with_port_base(self, base: int | None) -> SeatSpec:
        """This seat with its ports moved so that ``network.http_port`` is ``base`` (``--port-base``); every other
        port keeps its distance from it (dist-init, the simulated nodes' and admin ports, the exporters), so a
        second seat on one host needs one number, not an edited copy. ``None``: unchanged."""
        if base is None or base == self.network.http_port:
            return self
        dist = base + self.network.dist_init_port - self.network.http_port
        if not 1024 <= base <= 65535 - 20 or not 1024 <= dist <= 65535:
            raise SpecError(f"--port-base {base} puts network.http_port at {base} and network.dist_init_port at "
                            f"{dist}: outside 1024-65515", path=self.source, field="network",
                            fix="pick a base between 1024 and 65515 (the dist-init port moves with it, "
                                f"{self.network.dist_init_port - self.network.http_port:+d})")
        net = self.network.model_copy(update={"http_port": base, "dist_init_port": dist})
        return self.model_copy(update={"network": net})


def spec_location(spec: SeatSpec, field: str) -> dict[str, Any]:
    """``path``/``line``/``field`` keywords for an error about ``field`` (dotted) of a loaded spec.

    Checks that need more than one section (topology, capacity) run after validation; this
    finds the line again so their errors point at the file like validation errors do.
    """
    line = None
    if spec.source:
        try:
            node = yaml.compose(Path(spec.source).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
            line = _line_of(node, tuple(field.split(".")))
        except (OSError, yaml.YAMLError):
            line = None
    return {"path": spec.source or f"<seat {spec.name}>", "line": line, "field": field}


def builtin_seats_dir() -> Path:
    """The shipped profiles: ``launch/seats`` in a checkout, ``sgl_seat/_assets/seats`` in a wheel."""
    checkout = Path(__file__).resolve().parent.parent / "launch" / "seats"
    if checkout.is_dir():
        return checkout
    return Path(str(resources.files("sgl_seat") / "_assets" / "seats"))


def builtin_models_dir() -> Path:
    """The shipped planning configs: ``launch/models`` in a checkout, ``sgl_seat/_assets/models`` in a wheel."""
    checkout = Path(__file__).resolve().parent.parent / "launch" / "models"
    if checkout.is_dir():
        return checkout
    return Path(str(resources.files("sgl_seat") / "_assets" / "models"))


def builtin_models() -> list[str]:
    return sorted(p.name for p in builtin_models_dir().iterdir() if (p / "config.json").is_file())


def planning_config_path(given: str, source: str | None) -> Path:
    """A planning config.json named by a spec (``model.config``, ``draft.config``): a path (absolute, or relative
    to the spec file) where one is there; else a built-in model found by its name (``deepseek-v4-flash``, or the
    shipped profiles' ``../models/deepseek-v4-flash``), so a profile copied anywhere still plans. Only a bare name
    or a ``../models/NAME`` path falls back to a built-in: any other path that is not there stays what it says
    (the plan then names it as missing)."""
    raw = Path(given).expanduser()
    if not raw.is_absolute() and source:
        raw = Path(source).parent / raw
    if not raw.exists():
        rel = Path(given)
        if len(rel.parts) == 1 or rel.parent == Path("../models"):
            builtin = builtin_models_dir() / rel.name
            if (builtin / "config.json").is_file():
                raw = builtin
    return raw / "config.json" if raw.is_dir() or raw.suffix != ".json" else raw


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in builtin_seats_dir().glob("*.yaml"))


def resolve_seat_path(seat: str) -> Path:
    """``--seat`` takes a path or a built-in profile name."""
    path = Path(seat).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise SpecError("no such seat file", path=str(path), fix=f"built-in profiles: {builtin_profiles()}")
        return path
    builtin = builtin_seats_dir() / f"{seat}.yaml"
    if builtin.is_file():
        return builtin
    raise SpecError(
        f"{seat!r} is neither a seat file nor a built-in profile",
        fix=f"pass a path to a .yaml file or one of {builtin_profiles()}",
    )


def _line_of(node: yaml.Node | None, loc: tuple[str | int, ...]) -> int | None:
    """Walk the composed YAML tree along a pydantic error location; return the deepest line found."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    nxt = value
                    line = key.start_mark.line + 1
                    break
            if nxt is None:
                return line
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


_FIXES: Mapping[str, str] = {
    "extra_forbidden": "remove the key, or check its spelling against `sgl-seat schema`",
    "missing": "add the field (see `sgl-seat schema`)",
    "literal_error": "use one of the allowed values",
    "int_parsing": "give a whole number",
    "int_type": "give a whole number",
    "float_parsing": "give a number",
    "bool_parsing": "give true or false",
    "string_type": "give a string",
    "dict_type": "give a mapping (key: value lines)",
    "model_type": "give a mapping (key: value lines)",
    "list_type": "give a list",
    "greater_than": "raise the value",
    "greater_than_equal": "raise the value",
    "less_than": "lower the value",
    "less_than_equal": "lower the value",
    "string_pattern_mismatch": "use lower-case letters, digits and '-' (at most 63)",
}


def _problem(err: Any) -> tuple[bool, str | None, str, str, str]:
    """One pydantic error as (an unknown key?, the field it was likely meant to be, field, message, fix): an unknown
    key gets the nearest known key of its section (difflib), where one is close enough to be a misspelling."""
    loc = tuple(err["loc"])
    field = ".".join(str(p) for p in loc) or "<spec>"
    if err["type"] != "extra_forbidden":
        return False, None, field, err["msg"].removeprefix("Value error, "), _FIXES.get(
            err["type"], "change the value as the message says")
    near = difflib.get_close_matches(str(loc[-1]), _known_keys(loc[:-1]), n=1, cutoff=0.75)
    if not near:
        return True, None, field, "unknown key", _FIXES["extra_forbidden"]
    return (True, ".".join([*map(str, loc[:-1]), near[0]]), field, f"unknown key (did you mean {near[0]}?)",
            f"rename {loc[-1]} to {near[0]}")


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys of the spec section at ``loc`` (list indices and mapping keys pass through to their items' model);
    none where no model is found."""
    model: type[BaseModel] | None = SeatSpec
    for part in loc:
        if model is None:
            return []
        info = model.model_fields.get(str(part)) if not isinstance(part, int) else None
        if info is None:
            continue  # a list index or a mapping's key: the items' model was found already
        model = _model_in(info.annotation)
    return [k for k in model.model_fields if k != "source"] if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The spec model inside an annotation (itself, or in an Optional, a list or a mapping of it)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def parse_spec(text: str, *, path: str | None = None) -> SeatSpec:
    """Parse and validate seat YAML text; raise :class:`SpecError` naming file, line and field."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(
            f"YAML syntax error: {problem}",
            path=path,
            line=mark.line + 1 if mark is not None else None,
            fix="fix the indentation or quoting at that line",
        ) from None
    if not isinstance(data, dict):
        raise SpecError("the seat spec must be a YAML mapping", path=path, line=1, fix="start with 'schema_version: 1'")
    version = data.get("schema_version")
    if isinstance(version, int) and version != SCHEMA_VERSION:
        raise SpecError(
            f"unknown schema_version {version}; this sgl-seat reads version {SCHEMA_VERSION}",
            path=path,
            line=_line_of(node, ("schema_version",)),
            field="schema_version",
            fix="upgrade sgl-seat or rewrite the spec for schema_version 1",
        )
    if "source" in data:
        raise SpecError(
            "'source' is not a spec key", path=path, line=_line_of(node, ("source",)), field="source",
            fix="remove the key",
        )
    try:
        return SeatSpec.model_validate({**data, "source": path})
    except ValidationError as exc:
        # Every problem, each with its line: unknown keys first (a misspelling usually explains a "missing" one),
        # each kind in the file's order. The first is the error's head and its fix; the others follow it.
        # A "missing" key that a misspelt one was meant to be is that same problem: not listed again.
        found = [(*_problem(err), _line_of(node, tuple(err["loc"]))) for err in exc.errors()]
        meant = {near for _, near, _, _, _, _ in found if near}
        found = sorted((f for f in found if not (f[4] == _FIXES["missing"] and f[2] in meant)),
                       key=lambda f: (not f[0], f[5] or 0))
        _, _, field, msg, fix, line = found[0]
        also = "".join(f"\n  also {path or '<seat spec>'}" + (f":{ln}" if ln is not None else "") + f": {f}: {m}"
                       + ("" if near else f"; fix: {fx}") for _, near, f, m, fx, ln in found[1:])
        raise SpecError(msg + also, path=path, line=line, field=field, fix=fix) from None


def load_spec(seat: str) -> SeatSpec:
    """Load ``--seat`` (a path or a built-in profile name)."""
    path = resolve_seat_path(seat)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read: {exc}", path=str(path)) from None
    return parse_spec(text, path=str(path))


def spec_json_schema() -> str:
    """The JSON Schema of the seat spec (``sgl-seat schema``)."""
    schema = SeatSpec.model_json_schema(mode="validation")
    schema["properties"].pop("source", None)
    schema["title"] = "sgl-seat seat spec (schema_version 1)"
    return json.dumps(schema, indent=2, sort_keys=True)
