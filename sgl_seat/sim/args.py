"""The sim's command line (the subset of SGLang 0.5.23's flags sgl-seat generates) and its environment.

Why argparse with SGLang's spellings: the plan builder swaps only the module (``sglang.launch_server`` ->
``sgl_seat.sim.launch_server``), so the same argv must mean the same thing here, and an unknown flag must
be refused the same way (argparse: usage, ``error: unrecognized arguments``, exit 2). The environment
carries what SGLang would derive from the GPU and the model (KV pool size, acceptance, step floor) and the
faults to inject; the planner writes it through the sim backend (``sgl_seat.engines.sim``), which
takes these names from here.

Everything resolves into one :class:`SimConfig`, a plain JSON-able record that is also what the child
processes receive.

Environment (the first four are written by the planner, through ``sgl_seat.engines.sim``):

- ``SGLSEAT_SIM_KV_TOKENS``: KV pool in tokens (``max_total_num_tokens``); default 890,368 draft off,
  260,352 draft on (the paper's large seat).
- ``SGLSEAT_SIM_ACCEPT_RATE``: accepted / proposed draft tokens, default 0.81.
- ``SGLSEAT_SIM_STEP_FLOOR_MS``: the per-step floor of the cost model, default 30.
- ``SGLSEAT_SIM_PREFILL_TOKEN_MS``: the cost model's prefill milliseconds per uncached prompt token (default
  0.02; 0.08 makes a 400k-token prompt one forward of about 32 s, the long prefill a watchdog must not call a
  hang). Synthetic, as every sim figure.
- ``SGLSEAT_SIM_FAULTS``: ``;``-separated fault specs (see :mod:`sgl_seat.sim.faults`).
- ``SGLSEAT_SIM_NODE_PORT``: the port this node listens on instead of ``--port`` (and its admin port is
  this + 2), so several simulated nodes can share one host; SGLang itself uses ``--port`` on every node.
- ``SGLSEAT_SIM_TABLE_ROWS``: rows of each rank's host embedding table (default 4096 x 7168 bf16).
- ``SGLSEAT_SIM_FLIP_NEAR_TIES``: ``1`` makes greedy near-ties depend on batch composition.
- ``SGLSEAT_SIM_WATCHDOG_GRACE_S``: the pause between the watchdog line and SIGQUIT (SGLang: 5 s).
- ``SGLSEAT_PROBE``: when set, each scheduler installs ``sgl_seat.probe`` at start.
- ``SGLSEAT_SIM_DEVICE``: ``cpu`` (default), ``cuda`` or ``auto`` (cuda where torch sees a GPU) when
  ``--device`` is not given.
- ``SGLSEAT_SIM_DRAFT_COST``: sim-only (no SGLang flag or variable does this): a multiplier in [0, 1] on
  the draft's own costs (its forwards, its extra prefill, its per-request KV look-ahead); default 1, and 0
  is a free draft, the "what if the draft cost nothing" case of ``sgl-seat gate``'s acceptance bench.
- ``SGLANG_LOG_REQUEST_EXCEEDED_MS``: as SGLang's, with ``--log-requests`` (:mod:`sgl_seat.sim.front.reqlog`).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sgl_seat.errors import UsageError
from sgl_seat.sim.faults import GPU_STALL, parse_faults
from sgl_seat.sim.front import ports
from sgl_seat.sim.front.ports import ENV_NODE_PORT
from sgl_seat.sim.step.costmodel import DEFAULT_ACCEPT_RATE, DEFAULT_FLOOR_MS, CostModel

PROG = "python -m sgl_seat.sim.launch_server"

# Environment the planner writes (sgl_seat.engines.sim imports these names).
ENV_KV_TOKENS = "SGLSEAT_SIM_KV_TOKENS"
ENV_ACCEPT_RATE = "SGLSEAT_SIM_ACCEPT_RATE"
ENV_STEP_FLOOR_MS = "SGLSEAT_SIM_STEP_FLOOR_MS"
ENV_FAULTS = "SGLSEAT_SIM_FAULTS"
# The sim's own knobs (not written by the planner today).
ENV_TABLE_ROWS = "SGLSEAT_SIM_TABLE_ROWS"
ENV_FLIP_NEAR_TIES = "SGLSEAT_SIM_FLIP_NEAR_TIES"
ENV_WATCHDOG_GRACE_S = "SGLSEAT_SIM_WATCHDOG_GRACE_S"  # SGLang sleeps 5 s before SIGQUIT
ENV_PROBE = "SGLSEAT_PROBE"
ENV_DEVICE = "SGLSEAT_SIM_DEVICE"  # cpu | cuda | auto, when --device is not given
ENV_DRAFT_COST = "SGLSEAT_SIM_DRAFT_COST"  # sim-only: 0 makes the draft free (no SGLang equivalent)
ENV_PREFILL_MS = "SGLSEAT_SIM_PREFILL_TOKEN_MS"
ENV_CUDA_GRAPHS = "SGLSEAT_SIM_CUDA_GRAPHS"  # 1: decode steps replay CUDA graphs (--device cuda only; default 0)

DEFAULT_KV_TOKENS_OFF = 890_368  # the paper's large seat, draft off
DEFAULT_KV_TOKENS_ON = 260_352  # ... draft on
DEFAULT_CONTEXT_LEN = 163_840
DEFAULT_CHUNKED_PREFILL = 8192
DEFAULT_TABLE_ROWS = 4096  # host table rows per rank: 4096 x 7168 x bf16 = 56 MiB, eight ranks fit a small box
SPEC_DEFAULT_MAX_RUNNING = 48  # SGLang resets an unset cap to 48 with speculation
DEFAULT_MAX_RUNNING = 256
TORCH_DEFAULT_TIMEOUT_S = 1800  # torch's default process-group timeout when --dist-timeout is unset


def build_parser() -> argparse.ArgumentParser:
    """SGLang's flag names; argparse refuses anything else with usage + message and exit 2, as SGLang does."""
    p = argparse.ArgumentParser(
        prog=PROG, description="sgl-seat's sim engine: SGLang 0.5.23's contract, synthetic figures."
    )
    a = p.add_argument
    a("--model-path", "--model", dest="model_path", required=True, help="Reported as the model; never loaded.")
    a("--served-model-name", default=None)
    a("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    a("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int, default=1)
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    a("--dist-timeout", type=int, default=None, help="Seconds for the rendezvous and collectives.")
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--context-length", type=int, default=None)
    a("--chunked-prefill-size", type=int, default=None)
    a("--watchdog-timeout", type=float, default=300.0)
    a("--enable-metrics", action="store_true")
    a("--enable-cache-report", action="store_true")
    a("--disable-radix-cache", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    a("--log-level", default="info")
    a("--log-requests", action="store_true", help="Log requests (see sgl_seat.sim.front.reqlog).")
    a("--log-requests-level", type=int, default=2, choices=[0, 1, 2, 3])
    a("--log-requests-format", default="text", choices=["text", "json"])
    a("--log-requests-target", nargs="+", default=None, help="stdout and/or directories.")
    a("--device", default=None, choices=["cpu", "cuda"],
      help="cpu: gloo and host work; cuda: NCCL, one GPU per rank, pinned-table copies and a matmul per step "
           f"(see sgl_seat.sim.step.device). Unset: ${ENV_DEVICE} (cpu, cuda or auto: cuda where torch sees a GPU), "
           "else cpu.")
    a("--sim-cuda-graphs", action="store_true", default=None,
      help="--device cuda only: decode steps are captured per batch-size bucket as CUDA graphs and replayed, the "
           "host-table read a kernel inside the graph, as SGLang decodes (see sgl_seat.sim.graphs). Unset: "
           f"${ENV_CUDA_GRAPHS} (default 0: every step eager).")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--speculative-algorithm", default=None)
    a("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path",
      default=None)
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    a("--speculative-adaptive", action="store_true",
      help="Draft steps per batch-size tier (SGLang's defaults or --speculative-adaptive-config); see "
           "sgl_seat.sim.step.adaptive.")
    a("--speculative-adaptive-config", default=None, help="SGLang's adaptive tier JSON.")
    return p


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Resolved flags + environment. JSON-able (``to_json``/``from_json``) for the child processes."""

    model_path: str
    served_model_name: str
    tp_size: int
    ep_size: int
    nnodes: int
    node_rank: int
    dist_init_addr: str | None
    dist_timeout: int | None
    mem_fraction_static: float
    max_running_requests: int
    requested_max_running_requests: int | None
    context_length: int
    chunked_prefill_size: int
    watchdog_timeout: float
    enable_metrics: bool
    enable_cache_report: bool
    disable_radix_cache: bool
    decode_log_interval: int
    log_level: str
    host: str
    port: int
    node_port: int
    speculative_algorithm: str | None
    speculative_draft_model_path: str | None
    speculative_num_steps: int | None
    speculative_eagle_topk: int | None
    speculative_num_draft_tokens: int | None
    kv_tokens: int
    accept_rate: float
    floor_ms: float
    faults: tuple[str, ...]
    table_rows: int
    flip_near_ties: bool
    watchdog_grace_s: float
    launch_command: str
    log_requests: bool = False
    log_requests_level: int = 2
    log_requests_format: str = "text"
    log_requests_target: tuple[str, ...] | None = None
    device: str = "cpu"
    prefill_token_ms: float = CostModel().prefill_token_ms
    speculative_adaptive: bool = False
    speculative_adaptive_config: str | None = None
    draft_cost: float = 1.0
    cuda_graphs: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ranks_per_node(self) -> int:
        return self.tp_size // self.nnodes

    def local_tp_ranks(self) -> list[int]:
        per = self.ranks_per_node
        return list(range(self.node_rank * per, (self.node_rank + 1) * per))

    def ep_rank_of(self, tp_rank: int) -> int:
        """SGLang's ``moe_ep_rank = tp_rank // (tp_size // ep_size)``."""
        return tp_rank // (self.tp_size // self.ep_size)

    def node_of(self, tp_rank: int) -> int:
        return tp_rank // self.ranks_per_node

    @property
    def admin_port(self) -> int:
        return ports.admin_port(self.node_port)

    @property
    def spec_on(self) -> bool:
        return self.speculative_algorithm is not None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["faults"] = list(self.faults)
        d["log_requests_target"] = None if self.log_requests_target is None else list(self.log_requests_target)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SimConfig:
        target = d.get("log_requests_target")
        return cls(**{**d, "faults": tuple(d["faults"]), "log_requests_target": None if target is None
                      else tuple(target)})

    def server_args(self) -> dict[str, Any]:
        """The ServerArgs fields the sim reports in /server_info (names checked by the contract test)."""
        from sgl_seat.sim.contract import SERVER_ARGS_FIELDS

        return {name: getattr(self, name) for name in SERVER_ARGS_FIELDS}


def _env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        val = int(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a whole number", fix=f"set {name} to e.g. {default}") from None
    if val < minimum:
        raise UsageError(f"{name}={val} is below {minimum}", fix=f"set {name} to {minimum} or more")
    return val


def _env_float(env: Mapping[str, str], name: str, default: float, *, lo: float, hi: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        val = float(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number", fix=f"set {name} to e.g. {default:g}") from None
    if not (math.isfinite(val) and lo <= val <= hi):
        raise UsageError(f"{name}={raw} is outside [{lo:g}, {hi:g}]", fix=f"set {name} to e.g. {default:g}")
    return val


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


def _device(flag: str | None, env: Mapping[str, str]) -> str:
    """``--device`` if given, else ``SGLSEAT_SIM_DEVICE`` (``auto``: cuda where torch sees a GPU), else cpu."""
    if flag is not None:
        return flag
    raw = (env.get(ENV_DEVICE) or "cpu").strip().lower()
    _check(raw in ("cpu", "cuda", "auto"), f"{ENV_DEVICE}={raw!r} is not cpu, cuda or auto")
    if raw != "auto":
        return raw
    import torch  # only here: planning imports this module and must not pay for torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve(ns: argparse.Namespace, env: Mapping[str, str], argv: Sequence[str]) -> SimConfig:
    """Semantic checks and defaults (SGLang's resolution, reduced to what the sim needs)."""
    _check(ns.nnodes >= 1, f"--nnodes {ns.nnodes} must be at least 1")
    _check(0 <= ns.node_rank < ns.nnodes, f"--node-rank {ns.node_rank} is outside 0..{ns.nnodes - 1}")
    _check(ns.tp_size >= 1 and ns.tp_size % ns.nnodes == 0,
           f"--tp-size {ns.tp_size} must be a positive multiple of --nnodes {ns.nnodes}")
    _check(ns.ep_size >= 1 and ns.tp_size % ns.ep_size == 0,
           f"--ep-size {ns.ep_size} must divide --tp-size {ns.tp_size}")
    _check(1 <= ns.port <= 65535, f"--port {ns.port} is not a TCP port")
    _check(ns.watchdog_timeout > 0, f"--watchdog-timeout {ns.watchdog_timeout} must be above 0")
    _check(ns.decode_log_interval >= 1, f"--decode-log-interval {ns.decode_log_interval} must be at least 1")
    if ns.dist_timeout is not None:
        _check(ns.dist_timeout >= 1, f"--dist-timeout {ns.dist_timeout} must be at least 1 (seconds)")
    if ns.mem_fraction_static is not None:
        _check(0 < ns.mem_fraction_static < 1, f"--mem-fraction-static {ns.mem_fraction_static} is outside (0, 1)")
    if ns.max_running_requests is not None:
        _check(ns.max_running_requests >= 1, f"--max-running-requests {ns.max_running_requests} must be >= 1")
    if ns.context_length is not None:
        _check(ns.context_length >= 2, f"--context-length {ns.context_length} must be at least 2")
    for t in ns.log_requests_target or ():
        _check("${" not in t, f"--log-requests-target {t!r} still holds a plan placeholder (fill the plan first)")
    if ns.nnodes > 1:
        _check(ns.dist_init_addr is not None, "--dist-init-addr is required with --nnodes > 1 (host:port of node 0)")
    if ns.dist_init_addr is not None:
        host, sep, port = str(ns.dist_init_addr).rpartition(":")
        _check(bool(sep and host and port.isdigit() and 1 <= int(port) <= 65535),
               f"--dist-init-addr {ns.dist_init_addr!r} is not host:port")

    algo = ns.speculative_algorithm.upper() if ns.speculative_algorithm else None
    steps, topk, draft = ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens
    if algo is not None:
        if algo == "NEXTN":
            algo = "EAGLE"
        if steps is None:
            _check(topk is None and draft is None,
                   "--speculative-eagle-topk/--speculative-num-draft-tokens need --speculative-num-steps too")
            steps, topk, draft = 3, 1, 4
        topk = 1 if topk is None else topk
        if topk == 1:
            draft = steps + 1
        draft = steps + 1 if draft is None else draft
        _check(steps >= 1 and topk >= 1 and draft >= 2,
               "--speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens must be positive")
    else:
        _check(steps is None and topk is None and draft is None,
               "--speculative-* shape flags need --speculative-algorithm")
    adaptive, adaptive_off = bool(ns.speculative_adaptive), None
    if adaptive:  # SGLang warns and falls back to static params (speculative_hook.py), it does not refuse
        if algo not in ("EAGLE", "EAGLE3"):
            adaptive_off = f"speculative_algorithm={algo} (only EAGLE/EAGLE3 are supported)"
        elif topk != 1:
            adaptive_off = f"speculative_eagle_topk={topk} (only topk=1 is supported)"
        adaptive = adaptive_off is None

    kv_default = DEFAULT_KV_TOKENS_ON if algo else DEFAULT_KV_TOKENS_OFF
    kv_tokens = _env_int(env, ENV_KV_TOKENS, kv_default, minimum=2)
    accept = _env_float(env, ENV_ACCEPT_RATE, DEFAULT_ACCEPT_RATE, lo=0.0, hi=1.0)
    floor = _env_float(env, ENV_STEP_FLOOR_MS, DEFAULT_FLOOR_MS, lo=0.0, hi=60_000.0)
    prefill_ms = _env_float(env, ENV_PREFILL_MS, CostModel().prefill_token_ms, lo=0.0, hi=1_000.0)
    rows = _env_int(env, ENV_TABLE_ROWS, DEFAULT_TABLE_ROWS, minimum=1)
    grace = _env_float(env, ENV_WATCHDOG_GRACE_S, 5.0, lo=0.0, hi=600.0)
    node_port = _env_int(env, ENV_NODE_PORT, ns.port, minimum=1)
    _check(node_port <= 65535, f"{ENV_NODE_PORT}={node_port} is not a TCP port")
    device = _device(ns.device, env)
    draft_cost = _env_float(env, ENV_DRAFT_COST, 1.0, lo=0.0, hi=1.0)
    graphs = bool(ns.sim_cuda_graphs) or env.get(ENV_CUDA_GRAPHS, "").strip().lower() in ("1", "true", "yes", "on")
    _check(not graphs or device == "cuda",
           f"--sim-cuda-graphs / {ENV_CUDA_GRAPHS}=1 replays CUDA graphs, but the sim runs with --device {device}")
    faults = parse_faults(env.get(ENV_FAULTS, ""))
    for f in faults:
        _check(f.rank < ns.tp_size,
               f"{ENV_FAULTS}: fault {f.spec()!r} names rank {f.rank}, but the seat has ranks 0..{ns.tp_size - 1}")
        _check(f.kind != GPU_STALL or device == "cuda",
               f"{ENV_FAULTS}: fault {f.spec()!r} stalls a GPU stream, but the sim runs with --device {device}")

    requested = ns.max_running_requests
    cap = requested if requested is not None else (SPEC_DEFAULT_MAX_RUNNING if algo else DEFAULT_MAX_RUNNING)
    cap = max(1, min(cap, kv_tokens // 2))  # SGLang's per-DP cap: min(requested, token_capacity // 2)
    served = ns.served_model_name or ns.model_path.rstrip("/").split("/")[-1]
    return SimConfig(
        model_path=ns.model_path,
        served_model_name=served,
        tp_size=ns.tp_size,
        ep_size=ns.ep_size,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        dist_timeout=ns.dist_timeout,
        mem_fraction_static=ns.mem_fraction_static if ns.mem_fraction_static is not None else 0.85,
        max_running_requests=cap,
        requested_max_running_requests=requested,
        context_length=ns.context_length or DEFAULT_CONTEXT_LEN,
        chunked_prefill_size=ns.chunked_prefill_size or DEFAULT_CHUNKED_PREFILL,
        watchdog_timeout=float(ns.watchdog_timeout),
        enable_metrics=bool(ns.enable_metrics),
        enable_cache_report=bool(ns.enable_cache_report),
        disable_radix_cache=bool(ns.disable_radix_cache),
        decode_log_interval=ns.decode_log_interval,
        log_level=ns.log_level,
        host=ns.host,
        port=ns.port,
        node_port=node_port,
        speculative_algorithm=algo,
        speculative_draft_model_path=ns.speculative_draft_model_path,
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=draft,
        kv_tokens=kv_tokens,
        accept_rate=accept,
        floor_ms=floor,
        faults=tuple(f.spec() for f in faults),
        table_rows=rows,
        flip_near_ties=env.get(ENV_FLIP_NEAR_TIES, "") not in ("", "0", "false", "False"),
        watchdog_grace_s=grace,
        launch_command=shlex.join([sys.executable, "-m", "sgl_seat.sim.launch_server", *argv]),
        log_requests=bool(ns.log_requests),
        log_requests_level=ns.log_requests_level,
        log_requests_format=ns.log_requests_format,
        log_requests_target=None if ns.log_requests_target is None else tuple(ns.log_requests_target),
        device=device,
        speculative_adaptive=adaptive,
        speculative_adaptive_config=ns.speculative_adaptive_config,
        draft_cost=draft_cost,
        cuda_graphs=graphs,
        extra={} if adaptive_off is None else {"adaptive_disabled": adaptive_off},
        prefill_token_ms=prefill_ms,
    )


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SimConfig:
    """argv -> SimConfig. Syntax errors exit 2 (argparse); semantic ones raise :class:`UsageError`."""
    parser = build_parser()
    ns = parser.parse_args(list(argv))
    return resolve(ns, os.environ if env is None else env, argv)
