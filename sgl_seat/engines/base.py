"""What differs between engine backends, behind one small interface.

Launch, health and teardown are the same for real SGLang and the sim: both are started from the
plan's argv, both serve ``/health_generate`` on rank 0, both run in one process group per node.
What differs lives here, so that neither the plan nor launch ever asks which engine it is: the module
to run, the engine's own environment and plan warnings, which functions the watchdog probes and whether
the engine loads the probe itself, which ``--fault`` values are accepted, which preflight checks apply
and where each listening port is bound, and how the actual KV pool is read from the startup log.

The plan and the node agent hand in the plan's nodes through the narrow :class:`PlannedSeat` and
:class:`PlannedNode` protocols (``sgl_seat.plan`` sits above this package and is never imported here).
"""

from __future__ import annotations

import os
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Protocol

from sgl_seat.engines import preflight, preflight_facts
from sgl_seat.engines.preflight import Check, Failure
from sgl_seat.spec import SeatSpec
from sgl_seat.topology import Topology

# SGLang 0.5.23 memory_pool.py: "KV Cache is allocated. dtype: ..., #tokens: N, ..."; the name may carry a
# label and "VA upper bound" may replace "is allocated" (contracts section 6).
#: The engine's own environment on a node (a directory), filled by the node's agent at apply time; a plan
#: writes it into the interpreter, library and model paths of engines that run from one (``sglang.py``).
ENGINE_VENV = "${engine_venv}"
#: Where the engine's environment is on a host, when set (else :func:`engine_venv`'s default).
ENGINE_VENV_ENV = "SGL_SEAT_ENGINE_VENV"


def engine_venv() -> str:
    """The engine's environment on this host: ``$SGL_SEAT_ENGINE_VENV``, else ``.venv-sglang`` beside the venv
    this interpreter runs in (the repository's ``.venv``, where setup puts both)."""
    return os.environ.get(ENGINE_VENV_ENV) or str(Path(sys.prefix).parent / ".venv-sglang")

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

    # -- the plan ----------------------------------------------------------------------------------

    @abstractmethod
    def validate_faults(self, faults: Sequence[str], *, rehearsal: bool = False) -> tuple[str, ...]:
        """Check ``--fault`` values; return them normalised or raise a UsageError.

        ``rehearsal`` is the spec's ``rehearsal`` mark: a real engine takes faults on a rehearsal seat only.
        """

    @abstractmethod
    def probe_targets(self, model_family: str | None) -> tuple[str, ...]:
        """The functions the watchdog's probe times on this engine (``module:function@arg``); () for none.

        ``model_family`` is the model's architecture (from its config.json) when capacity knows it.
        """

    def engine_flags(self, spec: SeatSpec) -> list[str]:
        """Flags of the engine's own that every node's command line gets after the plan's (none by default)."""
        return []

    def draft_problem(self, spec: SeatSpec) -> str | None:
        """Why this engine cannot run the speculative draft for ``spec`` (``None``: it can)."""
        return None

    def capacity_note(self, spec: SeatSpec) -> str | None:
        """Where capacity comes from when it is not sized from GPU memory (``None``: the sizing code decides)."""
        return None

    def node_env(self, spec: SeatSpec, *, kv_pool_tokens: int | None, faults: Sequence[str]) -> dict[str, str]:
        """Environment of the engine's own every node gets on top of the spec's (none for real SGLang).

        ``kv_pool_tokens`` is the predicted KV pool of the chosen draft state, when predicted; ``faults``
        the validated ``--fault`` values.
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
