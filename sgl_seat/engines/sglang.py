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

import os
from collections.abc import Mapping, Sequence
from typing import ClassVar

from sgl_seat.engines import preflight_facts
from sgl_seat.engines.base import ENGINE_VENV, ENGINE_VENV_ENV, EngineBackend, PlannedNode, PlannedSeat, argv_value
from sgl_seat.engines.preflight import Check, Failure
from sgl_seat.errors import UsageError
from sgl_seat.spec import SeatSpec
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

#: The probe's rehearsal switches (``sgl_seat/probe/fault.py`` ENV_REHEARSAL / ENV_FAULTS; a unit test
#: holds them equal: the engines layer does not import the watchdog's).
ENV_PROBE_REHEARSAL = "SGLSEAT_PROBE_REHEARSAL"
ENV_PROBE_FAULTS = "SGLSEAT_PROBE_FAULTS"

CPU_DRAFT_REFUSED = (
    "SGLang's CPU engine cannot run speculative decoding with the registry packages: NGRAM needs"
    " sgl_kernel's copy_all_layer_kv_cache_cpu (a CPU build of the kernel package that no registry has), the"
    " torch_native backend cannot verify and EAGLE refuses it"
)


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


class SGLangBackend(EngineBackend):
    """``python -m sglang.launch_server`` on real GPUs, or on SGLang's CPU engine (``device: cpu``)."""

    name: ClassVar[str] = "sglang"
    module: ClassVar[str] = "sglang.launch_server"
    checks: ClassVar[frozenset[Check]] = frozenset(Check)
    #: SGLang's nodes of rank >= 1 wait for node 0's dist-init store themselves (torch's TCPStore client
    #: retries until --dist-timeout); measured on the CPU engine: a seat whose nodes start at once serves.
    start_nodes_together: ClassVar[bool] = True

    faults_need_probe: ClassVar[bool] = True

    def validate_faults(self, faults: Sequence[str], *, rehearsal: bool = False) -> tuple[str, ...]:
        if not faults:
            return ()
        if not rehearsal:
            raise UsageError("this seat is not a rehearsal: a real SGLang seat takes injected faults only when its "
                             "spec says `rehearsal: true` (never on a production seat)",
                             fix="drop --fault, or rehearse on a seat marked rehearsal: true (e.g. local-sglang)")
        # The gate's own parser (standard library only): what the plan accepts is what the engine will run.
        from sgl_seat.probe.fault import parse_probe_fault

        out = []
        for f in faults:
            try:
                out.append(parse_probe_fault(f).spec())
            except ValueError as exc:
                raise UsageError(f"--fault {f!r}: {exc}", fix="a real engine takes probe-stall faults only, e.g. "
                                 "probe-stall:rank=1,after_calls=20,for_s=30") from None
        return tuple(out)

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
        env = self._rehearsal_env(spec, faults)
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

    @staticmethod
    def _rehearsal_env(spec: SeatSpec, faults: Sequence[str]) -> dict[str, str]:
        """A rehearsal seat's processes carry the probe's fault gate (armed at start by ``faults``, at run time by
        ``sgl-seat fault``); any other seat's carry none, so production pays nothing for it."""
        if not spec.rehearsal:
            return {}
        env = {ENV_PROBE_REHEARSAL: "1"}
        if faults:
            env[ENV_PROBE_FAULTS] = ";".join(faults)
        return env

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
        python = node.command[0] if node.command else ""
        if os.sep in python and not os.access(python, os.X_OK):
            return [Failure(node.node_rank, "engine-python",
                            f"the engine's interpreter {python} does not exist on this node",
                            "install the engine's environment: bash scripts/setup.sh --engine sglang"
                            f" (or point {ENGINE_VENV_ENV} at it)")]
        if not _is_cpu(node.command):
            return super().local_checks(plan, node, gpus=gpus, gpu_ids=gpu_ids, env=env)
        return self._run_checks(self.checks - _GPU_CHECKS, plan, node, gpus=gpus, gpu_ids=gpu_ids, env=env)
