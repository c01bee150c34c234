"""What differs between engine backends, behind one small interface.

Launch, health and teardown are the same for real SGLang and the sim: both are started from the
plan's argv, both serve ``/health_generate`` on rank 0, both run in one process group per node.
What differs lives here, so that neither the plan nor launch ever asks which engine it is: the module
to run, the engine's own environment and plan warnings, which functions the watchdog probes and whether
the engine loads the probe itself, which ``--fault`` values are accepted, which preflight checks apply
and where each listening port is bound, and how the actual KV pool is read from the startup log.

The plan asks one question, :meth:`EngineBackend.describe`, and builds from the :class:`EngineFacts` it gets
back; the other methods are the hooks ``describe`` reads, or what launch asks a node at apply time.

The plan and the node agent hand in the plan's nodes through the narrow :class:`PlannedSeat` and
:class:`PlannedNode` protocols (``sgl_seat.plan`` sits above this package and is never imported here).
"""

from __future__ import annotations

import os
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Protocol

from sgl_seat.core.vocabulary import NO_WORDS, EngineWords
from sgl_seat.engines import preflight, preflight_facts
from sgl_seat.engines.family_targets import family_targets
from sgl_seat.engines.preflight import Check, Failure
from sgl_seat.errors import PlanError, UsageError
from sgl_seat.sizing import CapacityReport
from sgl_seat.sizing.draft_tiers import SEAT_FILES
from sgl_seat.spec import SeatSpec, spec_location
from sgl_seat.topology import Topology

# SGLang 0.5.23 memory_pool.py: "KV Cache is allocated. dtype: ..., #tokens: N, ..."; the name may carry a
# label and "VA upper bound" may replace "is allocated" (contracts section 6).
#: The engine's own environment on a node (a directory), filled by the node's agent at apply time; a plan
#: writes it into the interpreter, library and model paths of engines that run from one (``sglang.py``).
ENGINE_VENV = "${engine_venv}"
#: Where the engine's environment is on a host, when set (else :func:`engine_venv`'s default).
ENGINE_VENV_ENV = "SGLSEAT_ENGINE_VENV"


def engine_venv() -> str:
    """The engine's environment on this host: ``$SGLSEAT_ENGINE_VENV``, else ``.venv-sglang`` beside the venv
    this interpreter runs in (the repository's ``.venv``, where setup puts both)."""
    return os.environ.get(ENGINE_VENV_ENV) or str(Path(sys.prefix).parent / ".venv-sglang")

class Placeholder(str, Enum):
    """Late-bound values, written ``${name}`` in argv and env and filled at apply time (by the node agent, or by
    `up` for the node-0 address): what a backend's command line may hold besides literal values."""

    NODE0_ADDR = "${node0_addr}"
    AGENT_PYTHON = "${agent_python}"
    WATCHDOG_BOOT = "${watchdog_boot}"
    #: Node 0's directory for the engine's request log (SGLang's ``--log-requests-target``); the node agent fills it
    #: with ``$SGLSEAT_HOME/logs/<seat>/requests`` (mode 0700), the watchdog sidecar reads it.
    REQUEST_LOG_DIR = "${request_log_dir}"
    #: The engine's own environment on the node (engines that run from one: SGLang's CPU engine, .venv-sglang).
    ENGINE_VENV = ENGINE_VENV
    #: The node's directory of the plan's files (:attr:`LaunchPlan.files`); the node agent fills it with
    #: ``$SGLSEAT_HOME/logs/<seat>/files`` and writes the files there before the engine starts.
    SEAT_FILES = SEAT_FILES


_KV_LINE = re.compile(r"KV Cache (?:is allocated|VA upper bound)\b.*?#tokens:\s*([\d,]+)")


def parse_kv_tokens(text: str) -> int | None:
    """The first ``#tokens: N`` of a ``KV Cache is allocated`` line in ``text``, if any."""
    m = _KV_LINE.search(text)
    return int(m.group(1).replace(",", "")) if m else None


def argv_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in an engine's argv (``--flag value`` or ``--flag=value``; the first), if present.

    The one lookup of a flag in an engine command line: the plan's argv (bind hosts, the model path, rank 0's
    ``/metrics``) and a running engine's ``/proc`` command line (which node and port a process serves).
    """
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


#: The probe's rehearsal switches (``sgl_seat/probe/fault.py`` ENV_REHEARSAL / ENV_FAULTS; a unit test holds them
#: equal: importing the probe package here would load its writer into every plan).
ENV_PROBE_REHEARSAL = "SGLSEAT_PROBE_REHEARSAL"
ENV_PROBE_FAULTS = "SGLSEAT_PROBE_FAULTS"


def rehearsal_env(spec: SeatSpec, faults: Sequence[str]) -> dict[str, str]:
    """A rehearsal seat's processes carry the probe's fault gate (armed at start by ``faults``, at run time by
    ``sgl-seat fault``); any other seat's carry none, so production pays nothing for it."""
    if not spec.rehearsal:
        return {}
    env = {ENV_PROBE_REHEARSAL: "1"}
    if faults:
        env[ENV_PROBE_FAULTS] = ";".join(faults)
    return env


def missing_engine_python(node: PlannedNode, *, what: str, install: str) -> list[Failure]:
    """The preflight failure of a node whose engine interpreter (a path) is not there; none when it is."""
    python = node.command[0] if node.command else ""
    if os.sep in python and not os.access(python, os.X_OK):
        return [Failure(node.node_rank, "engine-python", f"{what} {python} does not exist on this node", install)]
    return []


def probe_faults(faults: Sequence[str], *, rehearsal: bool, engine: str, example_seat: str) -> tuple[str, ...]:
    """A real engine's ``--fault`` values: probe stalls only (the probe's own rehearsal gate stalls a probed call
    inside the engine), and only on a seat its spec marks ``rehearsal: true``; normalised, or a UsageError."""
    if not faults:
        return ()
    if not rehearsal:
        raise UsageError(f"this seat is not a rehearsal: a real {engine} seat takes injected faults only when its "
                         "spec says `rehearsal: true` (never on a production seat)",
                         fix=f"drop --fault, or rehearse on a seat marked rehearsal: true (e.g. {example_seat})")
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


class PlannedNode(Protocol):
    """One node of a plan (:class:`sgl_seat.plan.NodePlan`): its rank, argv and environment."""

    @property
    def node_rank(self) -> int: ...

    @property
    def command(self) -> tuple[str, ...]: ...

    def env_dict(self) -> dict[str, str]: ...


class PlannedSeat(Protocol):
    """The seat-wide ports of a plan (:class:`sgl_seat.plan.LaunchPlan`) and its nodes."""

    @property
    def http_port(self) -> int: ...

    @property
    def dist_init_port(self) -> int: ...

    @property
    def nodes(self) -> Sequence[PlannedNode]: ...


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """Everything engine-specific about one seat that its plan needs (:meth:`EngineBackend.describe`).

    Two inputs are known only once capacity is sized, and sizing needs :attr:`flags` first: the model's family
    (from its config.json) and the predicted KV pool. For those this value carries a table
    (:attr:`probe_family`, :attr:`kv_pool_env`) that :meth:`probe_targets` and :meth:`node_env` read, so the plan
    never goes back to the backend.
    """

    #: ``python -m <module>`` starts one node of the engine.
    module: str
    #: The engine's own flags, after the plan's on every node's command line, with the draft on or off.
    flags: tuple[str, ...]
    #: The engine's own environment on every node, on top of the spec's (sorted pairs).
    env: tuple[tuple[str, str], ...]
    #: The variable that carries the plan's predicted KV pool to every node (``None``: the engine sizes its own).
    kv_pool_env: str | None
    #: Things in the spec the operator should know about for this engine.
    warnings: tuple[str, ...]
    #: Where capacity comes from when it is not sized from GPU memory (``None``: the sizing code decides).
    capacity_note: str | None
    #: The ``--fault`` values, validated and normalised.
    faults: tuple[str, ...]
    #: True when injected faults run inside the watchdog's probe (faults on a seat with no probe are refused).
    faults_need_probe: bool
    #: The family whose functions the probe times whatever the model is (``None``: the model's own family).
    probe_family: str | None
    #: Put before the model's family to name this engine's targets of it (``vllm/``; SGLang's have none).
    probe_family_prefix: str
    #: True when the engine installs the probe itself (no ``sitecustomize`` loader on its ``PYTHONPATH``).
    loads_probe_itself: bool
    #: True when the engine's answers and figures are synthetic (a stand-in, not a model).
    synthetic: bool
    #: True when SGLang's own sizing code computes this engine's pool (real SGLang: not its double, nor another engine).
    sized_by_sglang: bool
    #: The title of a rank's process before its ``_TP``/``_EP`` suffix (:func:`sgl_seat.topology.rank_title`).
    rank_title: str
    #: The draft policy's description and the files that carry it, with the draft on (:meth:`EngineBackend.draft_policy`
    #: bound to the seat: ``draft_policy(cap, slots, warnings)``).
    draft_policy: Any = field(compare=False, repr=False, default=None)
    #: Node ``node_rank``'s engine flags (after ``-m <module>``) for a draft state, slot cap and memory fraction:
    #: :meth:`EngineBackend.argv` bound to the seat (``argv(node_rank=, draft=, slots=, mem_fraction=)``).
    argv: Any = field(compare=False, repr=False, default=None)

    def probe_targets(self, model_family: str | None) -> tuple[str, ...]:
        """The functions the watchdog's probe times (``module:function@arg``) for a model of ``model_family``;
        () for none."""
        family = self.probe_family or (self.probe_family_prefix + model_family if model_family else None)
        return family_targets(family) if family else ()

    def node_env(self, kv_pool_tokens: int | None) -> dict[str, str]:
        """:attr:`env`, with the predicted KV pool of the chosen draft state where the engine takes it."""
        env = dict(self.env)
        if self.kv_pool_env is not None and kv_pool_tokens is not None:
            env[self.kv_pool_env] = str(kv_pool_tokens)
        return env


class EngineBackend(ABC):
    """One engine family. Instances are stateless; get one with :func:`sgl_seat.engines.backend_for`."""

    name: ClassVar[str]
    #: ``python -m <module>`` starts one node of the engine.
    module: ClassVar[str]
    checks: ClassVar[frozenset[Check]]
    health_path: ClassVar[str] = "/health_generate"
    #: True when the engine installs the watchdog probe itself; otherwise the plan puts the probe's
    #: ``sitecustomize`` loader (``${watchdog_boot}``) first on the engine's ``PYTHONPATH``.
    loads_probe_itself: ClassVar[bool] = False
    #: Where ``status``'s "actual" KV pool comes from, said wherever that figure is shown.
    kv_actual_source: ClassVar[str] = "measured: the engine's own 'KV Cache is allocated' log line"
    #: True when the engine's answers and figures are synthetic (a stand-in, not a model).
    synthetic: ClassVar[bool] = False
    #: True when nodes 1.. may start while node 0 is still starting (they wait for its dist-init port on their
    #: own, as SGLang's nodes do): their start-up (imports, tens of seconds) then overlaps node 0's. False: `up`
    #: starts them once node 0 listens and they can reach it.
    start_nodes_together: ClassVar[bool] = False
    #: True when injected faults run inside the watchdog's probe (a plan with faults and no probe targets is
    #: refused); the sim fires its own.
    faults_need_probe: ClassVar[bool] = False
    #: The family (``watchdog/probe-targets.yaml``) whose functions the probe times whatever the model is;
    #: ``None``: the model's own architecture, when known.
    probe_family: ClassVar[str | None] = None
    #: Put before the model's family in ``watchdog/probe-targets.yaml`` for this engine's targets (``vllm/``).
    probe_family_prefix: ClassVar[str] = ""
    #: The environment variable through which every node gets the plan's predicted KV pool (``None``: the
    #: engine sizes its own pool).
    kv_pool_env: ClassVar[str | None] = None
    #: The spec's ``device`` values this engine runs on.
    devices: ClassVar[frozenset[str]] = frozenset({"cuda"})
    #: True when the engine reads the spec's ``sim`` block (the stand-in's knobs).
    reads_sim_block: ClassVar[bool] = False
    #: True when SGLang's own sizing code computes this engine's pool (:func:`sgl_seat.sizing.plan_capacity`).
    sized_by_sglang: ClassVar[bool] = False
    #: True when the engine's draft policy is ``draft.off_above`` alone, run as its own schedule (vLLM's
    #: ``num_speculative_tokens_per_batch_size``): the gate's hybrid arm is then the seat's draft with its policy.
    #: False: the hybrid runs the engine's adaptive tiers (SGLang's ``--speculative-adaptive``, the seat's policy
    #: tiers or SGLang's defaults).
    policy_is_schedule: ClassVar[bool] = False
    #: The engine's names for its processes and metrics (:mod:`sgl_seat.core.vocabulary`): what the watchdog,
    #: replay and the gate read by.
    words: ClassVar[EngineWords] = NO_WORDS

    def is_main_cmdline(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` is the command line of one of this engine's node main processes (``python -m module``)."""
        return any(a == "-m" and i + 1 < len(argv) and argv[i + 1] == self.module for i, a in enumerate(argv))

    # -- the plan ----------------------------------------------------------------------------------

    def describe(self, spec: SeatSpec, topo: Topology, *, draft: bool, faults: Sequence[str]) -> EngineFacts:
        """Everything engine-specific about ``spec``'s seat, in one answer; raises what this engine refuses.

        ``faults`` are the ``--fault`` values as given (a UsageError when this engine does not take them);
        ``draft`` the chosen draft state (a PlanError when this engine cannot run the draft for ``spec``).
        """
        if spec.device not in self.devices:
            raise PlanError(f"device: {spec.device} is not one engine {self.name} runs on ({sorted(self.devices)})",
                            fix="change device, or the engine", **spec_location(spec, "device"))
        if spec.sim is not None and not self.reads_sim_block:
            raise PlanError(f"a 'sim' block is only valid for the sim engine, not engine: {self.name}",
                            fix="remove the sim block", **spec_location(spec, "sim"))
        self.check_spec(spec, topo)
        valid = self.validate_faults(faults, rehearsal=spec.rehearsal)
        cannot_draft = self.draft_problem(spec)
        if draft and cannot_draft:
            raise PlanError(f"--draft on is refused for seat {spec.name!r}: {cannot_draft}",
                            fix="bring it up with the draft off (--draft off); the sim seat (local-sim) rehearses"
                                " the draft-on path", **spec_location(spec, "draft.enabled"))
        return EngineFacts(
            module=self.module,
            flags=tuple(self.engine_flags(spec)),
            env=tuple(sorted(self.node_env(spec, faults=valid).items())),
            kv_pool_env=self.kv_pool_env,
            warnings=tuple(self.plan_warnings(spec, topo)) + self._sampled_draft_warning(spec, draft),
            capacity_note=self.capacity_note(spec),
            faults=valid,
            faults_need_probe=self.faults_need_probe,
            probe_family=self.probe_family,
            probe_family_prefix=self.probe_family_prefix,
            loads_probe_itself=self.loads_probe_itself,
            synthetic=self.synthetic,
            rank_title=self.words.rank_title,
            sized_by_sglang=self.sized_by_sglang,
            argv=partial(self.argv, spec, topo),
            draft_policy=partial(self.draft_policy, spec),
        )

    @abstractmethod
    def argv(self, spec: SeatSpec, topo: Topology, *, node_rank: int, draft: bool, slots: int,
             mem_fraction: float) -> list[str]:
        """The engine's whole command line after ``python -m <module>`` for node ``node_rank``: its base flags, the
        draft's (when ``draft``), :meth:`engine_flags` and whatever the watchdog needs of the engine."""

    @abstractmethod
    def validate_faults(self, faults: Sequence[str], *, rehearsal: bool = False) -> tuple[str, ...]:
        """Check ``--fault`` values; return them normalised or raise a UsageError.

        ``rehearsal`` is the spec's ``rehearsal`` mark: a real engine takes faults on a rehearsal seat only.
        """

    def draft_policy(self, spec: SeatSpec, cap: CapacityReport | None, slots: int,
                     warnings: list[str]) -> tuple[dict[str, Any] | None, tuple[tuple[str, str], ...]]:
        """With the draft on: the draft policy (``draft.off_above``) as the engine runs it, for the plan's
        ``draft_policy``, and the files (name, text) it needs on every node (``${seat_files}``); ``warnings`` gets
        what the operator should know. None and () by default."""
        return None, ()

    def check_spec(self, spec: SeatSpec, topo: Topology) -> None:
        """Raise a :class:`PlanError` (at the spec's line) for a seat this engine cannot run; nothing by default."""
        return

    def _sampled_draft_warning(self, spec: SeatSpec, draft: bool) -> tuple[str, ...]:
        why = self.sampled_draft_problem(spec) if draft else None
        return (f"with the draft on: {why}; greedy requests are the target's own",) if why else ()

    def sampled_draft_problem(self, spec: SeatSpec) -> str | None:
        """Why this engine's answers cannot be trusted when it drafts and samples (temperature above 0), as measured
        on it; None (the default) where nothing is known against it. The gate refuses a sampled sweep with a draft
        arm on such a seat, and the plan warns."""
        return None

    def engine_venv(self) -> str:
        """The engine's own environment on this host (what ``${engine_venv}`` is filled with)."""
        return engine_venv()

    def engine_flags(self, spec: SeatSpec) -> list[str]:
        """Flags of the engine's own that every node's command line gets after the plan's (none by default)."""
        return []

    def draft_problem(self, spec: SeatSpec) -> str | None:
        """Why this engine cannot run the speculative draft for ``spec`` (``None``: it can)."""
        return None

    def capacity_note(self, spec: SeatSpec) -> str | None:
        """Where capacity comes from when it is not sized from GPU memory (``None``: the sizing code decides)."""
        return None

    def node_env(self, spec: SeatSpec, *, faults: Sequence[str]) -> dict[str, str]:
        """Environment of the engine's own every node gets on top of the spec's (none for real SGLang).

        ``faults`` are the validated ``--fault`` values; the predicted KV pool is added by the plan under
        :attr:`kv_pool_env`.
        """
        return {}

    def plan_warnings(self, spec: SeatSpec, topo: Topology) -> list[str]:
        """Things in the spec the operator should know about for this engine (the plan prints them)."""
        return []

    # -- a node ------------------------------------------------------------------------------------

    @abstractmethod
    def visible_gpus(self) -> list[str] | None:
        """The node's own GPU listing for the GPU check, or ``None`` when only Ray's ids count."""

    def parse_kv_tokens(self, log_text: str) -> int | None:
        return parse_kv_tokens(log_text)

    def listen_ports(self, plan: PlannedSeat, node: PlannedNode) -> dict[str, int]:
        """Ports this node's engine binds, by name, for the ports-free check.

        SGLang binds ``--port`` on every node (rank >= 1 runs its dummy health server there) and
        node 0's scheduler listens on the dist-init port.
        """
        ports = {"http": plan.http_port}
        if node.node_rank == 0:
            ports["dist_init"] = plan.dist_init_port
        return ports

    def startup_port(self, plan: PlannedSeat) -> int:
        """The port node 0 listens on once its engine has started (`up` waits for it before the other nodes): SGLang's
        dist-init store."""
        return plan.dist_init_port

    def bind_host(self, argv: Sequence[str], port_name: str) -> str:
        """The address the engine binds the port named ``port_name`` (:meth:`listen_ports`' names) on.

        The dist-init port on the ``--dist-init-addr`` host, the HTTP port on ``--host`` (SGLang's default
        is 127.0.0.1).
        """
        if port_name == "dist_init":
            addr = argv_value(argv, "--dist-init-addr")
            if addr:
                return addr.rpartition(":")[0].strip("[]")
        return argv_value(argv, "--host") or "127.0.0.1"

    def fault_url(self, plan: PlannedSeat, node: PlannedNode) -> str | None:
        """The URL that arms a fault on ``node`` at run time (POST ``{"fault": SPEC}``, DELETE clears), or None
        when the engine has no such route (real SGLang: its faults go through the probe, `sgl-seat fault`)."""
        return None

    def colocated_env(self, plan: PlannedSeat, node_rank: int) -> dict[str, str] | None:
        """Environment for node ``node_rank`` when it shares a host with a lower node of the seat.

        That happens only with simulated nodes (a local cluster on one machine). ``None`` means the
        engine cannot run two nodes on one host (their ports would collide).
        """
        return None

    def colocated_argv(self, plan: PlannedSeat, node_rank: int, argv: Sequence[str]) -> tuple[str, ...] | None:
        """Node ``node_rank``'s command line when it shares a host with a lower node (``None``: unchanged)."""
        return None

    def local_checks(self, plan: PlannedSeat, node: PlannedNode, *, gpus: int, gpu_ids: Sequence[str],
                     env: Mapping[str, str]) -> list[Failure]:
        """Every check in :attr:`checks` that runs on the node itself, over facts read from this host.

        ``gpus`` is what the node's bundle asks for, ``gpu_ids`` what Ray assigned, ``env`` the engine's
        environment as it will start (the node's, then the plan's).
        """
        return self._run_checks(self.checks, plan, node, gpus=gpus, gpu_ids=gpu_ids, env=env)

    def _run_checks(self, checks: frozenset[Check], plan: PlannedSeat, node: PlannedNode, *, gpus: int,
                    gpu_ids: Sequence[str], env: Mapping[str, str]) -> list[Failure]:
        """The checks of ``checks`` that run on the node itself (:meth:`local_checks`)."""
        r = node.node_rank
        out: list[Failure] = []
        if Check.GPUS in checks:
            out += preflight.check_gpus(r, gpus, gpu_ids, self.visible_gpus())
        if Check.SOCKET_IFNAME in checks:
            out += preflight.check_socket_ifnames(r, env, preflight_facts.interfaces())
        if Check.IB_HCA in checks:
            out += preflight.check_ib_hca(r, env.get("NCCL_IB_HCA"), preflight_facts.ib_devices())
        if Check.MODEL_PATH in checks:
            model = argv_value(node.command, "--model-path")
            if model is not None:
                out += preflight.check_model_path(r, model, preflight_facts.path_exists(model))
        if Check.ENGRAM_HOST in checks:
            out += preflight.check_engram_host_table(r, env)
        if Check.PORTS in checks:
            ports = self.listen_ports(plan, node)
            holders = {p: preflight_facts.port_holder(p, self.bind_host(node.command, what))
                       for what, p in ports.items()}
            out += preflight.check_ports_free(r, ports, holders)
        return out
