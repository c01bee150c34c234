"""Real SGLang 0.5.23: every preflight check applies, the probe loads through ``sitecustomize`` and its targets
depend on the model's architecture, and faults are injected only into a rehearsal seat, through the probe.

Faults on a real engine: a seat the spec marks ``rehearsal: true`` takes ``probe-stall:...`` faults
(``up --fault``, and at run time ``sgl-seat fault``): the probe's rehearsal gate
(``sgl_seat/probe/fault.py``) stalls a probed call inside the scheduler, so real SGLang code blocks in
its forward where the field report's hang did and its peers wait in the real all-reduce. Every other seat
refuses them before anything starts; production processes carry no gate at all.

The CPU variant (``device: cpu``, SGLang's CPU engine) lives here too, so that neither the plan nor launch
ever asks which device a seat runs on. Everything it needs was measured on a 2-core CPU machine and is written
down in ``../shared/reference/sglang-cpu.md``:

- flags: ``--device cpu --attention-backend torch_native`` (the x86 default is ``intel_amx``),
  ``--max-total-tokens`` (otherwise the pool is sized from the host's available memory: gigabytes),
  ``--sleep-on-idle`` (an idle scheduler spins at ~100 % of a core without it) and ``--load-format``;
- environment: ``SGLANG_USE_CPU_ENGINE=1`` (without it SGLang never takes the CPU path), the project's stub
  ``libcuda.so.1`` on ``LD_LIBRARY_PATH`` (the kernel wheel links it), a missing ``libnccl.so.2`` (TP > 1 would
  build a pynccl communicator and die on the CPU) and ``SGLANG_CPU_OMP_THREADS_BIND`` with one entry per rank
  (every node gets the whole list; SGLang picks its entry by global rank);
- no speculative decoding: the CPU engine cannot run it with registry packages, so ``--draft on`` is refused
  before anything starts;
- capacity is what ``--max-total-tokens`` sets; no GPU figure is computed for a CPU seat.

The engine runs in its own environment (``.venv-sglang``, ``scripts/install-sglang-engine.sh``), written
``${engine_venv}`` in the plan and filled on each node by its agent (:func:`engine_venv`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.engines import preflight_facts
from sgl_seat.engines.base import (
    ENGINE_VENV,
    ENGINE_VENV_ENV,
    EngineBackend,
    Placeholder,
    PlannedNode,
    PlannedSeat,
    argv_value,
    missing_engine_python,
    probe_faults,
    rehearsal_env,
)
from sgl_seat.engines.preflight import Check, Failure
from sgl_seat.engines.registry import register
from sgl_seat.errors import PlanError
from sgl_seat.sizing import CapacityReport, speculative_flags
from sgl_seat.sizing.draft_tiers import ADAPTIVE_CONFIG_NAME, SEAT_FILES, tiers_for
from sgl_seat.spec import SeatSpec, spec_location
from sgl_seat.topology import Topology

#: The stub ``libcuda.so.1``'s directory inside the engine's environment (scripts/install-sglang-engine.sh).
STUB_LIB_DIR = "lib/sgl-seat-stub"
#: A path with no library: SGLang then disables pynccl (``pynccl.py:73-79``) instead of dying on the CPU.
NO_NCCL = "/nonexistent/libnccl.so.2"
#: Checks that need a GPU host; a CPU seat skips them.
_GPU_CHECKS = frozenset({Check.GPUS, Check.IB_HCA, Check.ENGRAM_HOST})
#: How far apart the HTTP ports of SGLang nodes sharing one host are (rank >= 1 binds ``--port`` for its
#: dummy health server, so two nodes on one host cannot share it).
COLOCATED_PORT_STEP = 10


CPU_DRAFT_REFUSED = (
    "SGLang's CPU engine cannot run speculative decoding with the registry packages: NGRAM needs"
    " sgl_kernel's copy_all_layer_kv_cache_cpu (a CPU build of the kernel package that no registry has), the"
    " torch_native backend cannot verify and EAGLE refuses it"
)

#: SGLang's names (0.5.23 and 0.5.17; ``tests/contract`` holds them to each version's source): the scheduler's title
#: (``setproctitle`` in scheduler.py), the detokenizer's, and the ``/metrics`` names the watchdog and the gate read.
WORDS = EngineWords(
    engine="sglang",
    title_prefix="sglang::",
    rank_title="sglang::scheduler",
    helper_titles=(("sglang::detokenizer", "detokenizer"),),
    metric_prefix="sglang:",
    running="sglang:num_running_reqs",
    queued="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    generated="sglang:generation_tokens_total",
    gen_throughput="sglang:gen_throughput",
    accept_length="sglang:spec_accept_length",
    # SGLang bumps ``generation_tokens_total`` when a request finishes, so with few long requests it can stay flat
    # while decode runs; ``num_used_tokens`` (KV in use) moves every decode step the scheduler reports.
    progress=("sglang:generation_tokens_total", "sglang:num_used_tokens", "sglang:decode_sum_seq_lens",
              "sglang:forward_execution_seconds_total", "sglang:cuda_graph_passes_total"),
    prompt_tokens="sglang:prompt_tokens_total",
    cached_tokens="sglang:cached_tokens_total",
    verify_steps="sglang:spec_verify_calls_total",
    requests="sglang:num_requests_total",
    hang_log_line="Scheduler watchdog timeout",
)


def _fmt_float(x: float) -> str:
    return format(x, "g")


def sglang_argv(spec: SeatSpec, topo: Topology, *, node_rank: int, draft: bool, slots: int, mem_fraction: float,
                flags: Sequence[str]) -> list[str]:
    """The flags after ``-m <module>``; only flags that exist in SGLang 0.5.23 (tests parse them); ``flags``: the
    backend's :meth:`~sgl_seat.engines.base.EngineBackend.engine_flags`. The sim takes the same line (its double)."""
    argv = [
        "--model-path", spec.model.path,
        "--served-model-name", spec.model.name,
        "--tp-size", str(topo.tp),
        "--ep-size", str(topo.ep),
        "--nnodes", str(topo.nnodes),
        "--node-rank", str(node_rank),
        "--dist-init-addr", f"{Placeholder.NODE0_ADDR.value}:{spec.network.dist_init_port}",
        "--mem-fraction-static", _fmt_float(mem_fraction),
        "--max-running-requests", str(slots),
        "--context-length", str(spec.model.context_length),
        "--watchdog-timeout", _fmt_float(spec.watchdog.engine_timeout_s),
        "--enable-metrics",
        "--host", spec.network.host,
        "--port", str(spec.network.http_port),
    ]
    if spec.model.dtype != "auto":
        argv += ["--dtype", spec.model.dtype]
    if draft:
        argv += speculative_flags(spec)
    return argv + list(flags) + request_log_argv(spec, node_rank)


#: ``--log-requests-level`` for the watchdog's request log: 1 keeps metadata, sampling parameters and token
#: counts but no text; 3 (only with ``bundles.raw_prompts``) also the full prompts and outputs.
REQUEST_LOG_LEVEL = 1
REQUEST_LOG_LEVEL_RAW = 3


def request_log_argv(spec: SeatSpec, node_rank: int) -> list[str]:
    """SGLang's own request log on node 0 (its TokenizerManager) while the watchdog is on, as JSON lines in
    ``${request_log_dir}``: the sidecar turns them into the bundle's request shapes (``requests.jsonl``)."""
    if node_rank != 0 or not spec.watchdog.enabled:
        return []
    level = REQUEST_LOG_LEVEL_RAW if spec.bundles.raw_prompts else REQUEST_LOG_LEVEL
    return ["--log-requests", "--log-requests-level", str(level), "--log-requests-format", "json",
            "--log-requests-target", Placeholder.REQUEST_LOG_DIR.value]  # last: the flag takes 1+ values


def sglang_draft_rules(spec: SeatSpec) -> None:
    """SGLang's policy (``draft.off_above``) runs its adaptive tiers, which take EAGLE/EAGLE3 with topk 1 only (the
    spec lets NGRAM through for engines with their own schedule: vLLM's)."""
    d = spec.draft
    if d.off_above is not None and d.algorithm == "NGRAM":
        raise PlanError("draft.off_above needs SGLang's --speculative-adaptive, which runs EAGLE/EAGLE3 with topk 1 "
                        "only (adaptive_unsupported_reason); this draft is NGRAM",
                        fix="drop draft.off_above, or use an EAGLE draft", **spec_location(spec, "draft.off_above"))


def adaptive_policy(spec: SeatSpec, cap: CapacityReport | None, slots: int,
                    warnings: list[str]) -> tuple[dict[str, Any] | None, tuple[tuple[str, str], ...]]:
    """The draft policy's tiers and the file that carries them (sgl_seat.sizing.draft_tiers), with what the hybrid
    keeps and cannot give back, in the engine's own figures where capacity was sized."""
    d = spec.draft
    if not d.runs_adaptive:
        return None, ()
    keeps: dict[str, Any] = {"note": "SGLang sizes the pool and the slot cap for the draft at start: they stay as "
                                     "with the draft on; at zero steps it still runs a verify-shaped forward and "
                                     "a draft extend per decode step"}
    if cap is not None:
        keeps.update(kv_pool_tokens=cap.draft_on.kv_pool_tokens, max_running_requests=cap.draft_on.max_running_requests,
                     draft_off_kv_pool_tokens=cap.draft_off.kv_pool_tokens,
                     draft_off_max_running_requests=cap.draft_off.max_running_requests)
    if d.off_above is None:
        return {"kind": "adaptive", "tiers": "SGLang's defaults (version-dependent; 0 steps from a batch of 64)",
                "keeps": keeps}, ()
    tiers = tiers_for(d.off_above, d.steps)
    if tiers.speculates_up_to >= slots:
        warnings.append(f"draft.off_above {d.off_above} is at or above the draft's slot cap {slots}: the policy never "
                        "turns speculation off (a decode batch cannot exceed the cap)")
    return ({"kind": "off_above", **tiers.to_json(), "flag_file": f"{SEAT_FILES}/{ADAPTIVE_CONFIG_NAME}",
             "keeps": keeps}, ((ADAPTIVE_CONFIG_NAME, tiers.config_text()),))


def gpu_flags(spec: SeatSpec) -> list[str]:
    """The ``gpu:`` block's flags, each one SGLang 0.5.17 and 0.5.23 both take (``tests/contract`` parses the
    plan's lines with each version's own parser)."""
    g = spec.gpu
    out: list[str] = []
    if g.attention_backend:
        out += ["--attention-backend", g.attention_backend]
    if g.sampling_backend:
        out += ["--sampling-backend", g.sampling_backend]
    if g.load_format != "auto":
        out += ["--load-format", g.load_format]
    if g.cuda_graph_max_bs is not None:
        out += ["--cuda-graph-max-bs-decode", str(g.cuda_graph_max_bs)]
    if g.disable_prefill_cuda_graph:
        out.append("--disable-prefill-cuda-graph")
    return out


def _is_cpu(argv: Sequence[str]) -> bool:
    return argv_value(argv, "--device") == "cpu"


@register
class SGLangBackend(EngineBackend):
    """``python -m sglang.launch_server`` on real GPUs, or on SGLang's CPU engine (``device: cpu``)."""

    name: ClassVar[str] = "sglang"
    module: ClassVar[str] = "sglang.launch_server"
    checks: ClassVar[frozenset[Check]] = frozenset(Check)
    #: SGLang's nodes of rank >= 1 wait for node 0's dist-init store themselves (torch's TCPStore client
    #: retries until --dist-timeout); measured on the CPU engine: a seat whose nodes start at once serves.
    start_nodes_together: ClassVar[bool] = True

    faults_need_probe: ClassVar[bool] = True
    words: ClassVar[EngineWords] = WORDS
    sized_by_sglang: ClassVar[bool] = True
    #: GPUs, and SGLang's CPU engine (the module doc says what it needs).
    devices: ClassVar[frozenset[str]] = frozenset({"cuda", "cpu"})

    def is_main_cmdline(self, argv: Sequence[str]) -> bool:
        """``python -m sglang.launch_server ...``, or ``sglang serve ...``."""
        return super().is_main_cmdline(argv) or any(
            a.endswith("/sglang") and i + 1 < len(argv) and argv[i + 1] == "serve" for i, a in enumerate(argv))

    def argv(self, spec: SeatSpec, topo: Topology, *, node_rank: int, draft: bool, slots: int,
             mem_fraction: float) -> list[str]:
        return sglang_argv(spec, topo, node_rank=node_rank, draft=draft, slots=slots, mem_fraction=mem_fraction,
                           flags=self.engine_flags(spec))

    def draft_policy(self, spec: SeatSpec, cap: CapacityReport | None, slots: int,
                     warnings: list[str]) -> tuple[dict[str, Any] | None, tuple[tuple[str, str], ...]]:
        return adaptive_policy(spec, cap, slots, warnings)

    def check_spec(self, spec: SeatSpec, topo: Topology) -> None:
        sglang_draft_rules(spec)

    def validate_faults(self, faults: Sequence[str], *, rehearsal: bool = False) -> tuple[str, ...]:
        return probe_faults(faults, rehearsal=rehearsal, engine="SGLang", example_seat="local-sglang")

    def engine_flags(self, spec: SeatSpec) -> list[str]:
        if spec.device != "cpu":
            return gpu_flags(spec)
        return ["--device", "cpu", "--attention-backend", "torch_native", "--load-format", spec.cpu.load_format,
                "--max-total-tokens", str(spec.cpu.max_total_tokens),
                *(["--sleep-on-idle"] if spec.cpu.sleep_on_idle else [])]

    def draft_problem(self, spec: SeatSpec) -> str | None:
        return CPU_DRAFT_REFUSED if spec.device == "cpu" else None

    def capacity_note(self, spec: SeatSpec) -> str | None:
        if spec.device != "cpu":
            return None
        return (f"KV pool set by --max-total-tokens {spec.cpu.max_total_tokens:,} tokens (SGLang's CPU engine:"
                " no GPU memory to size from; the engine's own 'KV Cache is allocated' line is the actual)")

    def node_env(self, spec: SeatSpec, *, faults: Sequence[str]) -> dict[str, str]:
        env = rehearsal_env(spec, faults)
        if spec.device != "cpu":
            return env
        world = spec.parallel.tp * spec.parallel.dp
        return env | {
            "SGLANG_USE_CPU_ENGINE": "1",
            "LD_LIBRARY_PATH": f"{ENGINE_VENV}/{STUB_LIB_DIR}",
            "SGLANG_NCCL_SO_PATH": NO_NCCL,
            "SGLANG_CPU_OMP_THREADS_BIND": spec.cpu.threads_bind or "|".join(str(i) for i in range(world)),
            # Nothing is fetched from a model hub: the models are made or converted on the node by setup.
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }

    def plan_warnings(self, spec: SeatSpec, topo: Topology) -> list[str]:
        if spec.device == "cpu":
            weights = ("random weights: its answers are noise" if spec.cpu.load_format == "dummy"
                       else f"{spec.model.name}'s own weights")
            return [f"SGLang's CPU engine: a rehearsal seat ({weights}); its timings are not a GPU seat's"]
        if topo.nnodes > 1 and not spec.network.node_env and not spec.cluster.hosts:
            return ["network.node_env is empty: NCCL/Gloo pick interfaces on their own on every node"]
        return []

    def visible_gpus(self) -> list[str] | None:
        return preflight_facts.nvidia_gpus() or []

    def listen_ports(self, plan: PlannedSeat, node: PlannedNode) -> dict[str, int]:
        """As the base, with the node's own ``--port`` (a colocated node listens on another one)."""
        ports = super().listen_ports(plan, node)
        own = argv_value(node.command, "--port")
        if own is not None:
            ports["http"] = int(own)
        return ports

    def colocated_argv(self, plan: PlannedSeat, node_rank: int, argv: Sequence[str]) -> tuple[str, ...] | None:
        """Nodes on one host (a CPU rehearsal, :meth:`colocated_env`): node ``r`` moves its ``--port`` up by ``r``
        steps."""
        out = list(argv)
        for i, a in enumerate(out[:-1]):
            if a == "--port":
                out[i + 1] = str(plan.http_port + COLOCATED_PORT_STEP * node_rank)
        return tuple(out)

    def colocated_env(self, plan: PlannedSeat, node_rank: int) -> dict[str, str] | None:
        """A CPU seat's nodes may share a host (a local rehearsal); a GPU seat's may not (their GPUs would)."""
        node = next((n for n in plan.nodes if n.node_rank == node_rank), None)
        return {} if node is not None and _is_cpu(node.command) else None

    def local_checks(self, plan: PlannedSeat, node: PlannedNode, *, gpus: int, gpu_ids: Sequence[str],
                     env: Mapping[str, str]) -> list[Failure]:
        """Every check, less the GPU host's on a CPU seat, and first of all: is the engine's interpreter there?"""
        missing = missing_engine_python(node, what="the engine's interpreter", install="install the engine's "
                                        f"environment: bash scripts/setup.sh --engine sglang (or point "
                                        f"{ENGINE_VENV_ENV} at it)")
        if missing:
            return missing
        if not _is_cpu(node.command):
            return super().local_checks(plan, node, gpus=gpus, gpu_ids=gpu_ids, env=env)
        return self._run_checks(self.checks - _GPU_CHECKS, plan, node, gpus=gpus, gpu_ids=gpu_ids, env=env)
