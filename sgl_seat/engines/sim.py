"""The sim engine: Ray's fake GPU ids stand for GPUs, no RDMA or model files, faults allowed.

This is the one module above ``sgl_seat.sim`` that imports it: the sim's own knobs (its environment
names, its port arithmetic in :mod:`sgl_seat.sim.front.ports`, its fault parser) are read from the sim, so the
launcher spells and computes them as the sim does. ``--fault`` values are checked with the sim's parser before
anything is placed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.engines import sglang
from sgl_seat.engines.base import EngineBackend, PlannedNode, PlannedSeat
from sgl_seat.engines.family_targets import SIM_FAMILY
from sgl_seat.engines.preflight import Check
from sgl_seat.engines.registry import register
from sgl_seat.sim import contract
from sgl_seat.sim.args import ENV_ACCEPT_RATE, ENV_FAULTS, ENV_KV_TOKENS, ENV_STEP_FLOOR_MS
from sgl_seat.sim.faults import parse_fault
from sgl_seat.sim.front import ports
from sgl_seat.sim.front.ports import ENV_NODE_PORT as NODE_PORT_ENV
from sgl_seat.sizing import CapacityReport
from sgl_seat.spec import SeatSpec
from sgl_seat.topology import Topology

__all__ = ["NODE_PORT_ENV", "SimBackend"]


@register
class SimBackend(EngineBackend):
    """``python -m sgl_seat.sim.launch_server``: SGLang's contract without a GPU."""

    name: ClassVar[str] = "sim"
    module: ClassVar[str] = "sgl_seat.sim.launch_server"
    checks: ClassVar[frozenset[Check]] = frozenset(
        {Check.GPUS, Check.SOCKET_IFNAME, Check.PORTS, Check.DIST_INIT_REACHABLE}
    )
    #: Each sim scheduler installs the probe at start when ``SGLSEAT_PROBE`` is set.
    loads_probe_itself: ClassVar[bool] = True
    kv_actual_source: ClassVar[str] = "synthetic: the sim echoes the plan's prediction, nothing is measured"
    synthetic: ClassVar[bool] = True
    #: The sim's own row fetch, whatever model the spec names (it runs none).
    probe_family: ClassVar[str | None] = SIM_FAMILY
    #: The sim serves the pool the plan predicts (SGLang would size it from the GPU and the model).
    kv_pool_env: ClassVar[str | None] = ENV_KV_TOKENS
    reads_sim_block: ClassVar[bool] = True
    #: SGLang's words (the sim is its double, held to them by ``tests/contract/test_sim_contract.py``), and the
    #: sim's own marker that its figures are synthetic.
    words: ClassVar[EngineWords] = dataclasses.replace(sglang.WORDS, engine="sim",
                                                       synthetic_marker=contract.SIM_ONLY_METRICS[0])

    def argv(self, spec: SeatSpec, topo: Topology, *, node_rank: int, draft: bool, slots: int,
             mem_fraction: float) -> list[str]:
        """SGLang's line (the sim parses SGLang's flags: ``sgl_seat/sim/args.py``)."""
        return sglang.sglang_argv(spec, topo, node_rank=node_rank, draft=draft, slots=slots,
                                  mem_fraction=mem_fraction, flags=self.engine_flags(spec))

    def draft_policy(self, spec: SeatSpec, cap: CapacityReport | None, slots: int,
                     warnings: list[str]) -> tuple[dict[str, Any] | None, tuple[tuple[str, str], ...]]:
        """SGLang's adaptive tiers, as the plan of a real SGLang seat of the same spec has them."""
        return sglang.adaptive_policy(spec, cap, slots, warnings)

    def check_spec(self, spec: SeatSpec, topo: Topology) -> None:
        sglang.sglang_draft_rules(spec)

    def validate_faults(self, faults: Sequence[str], *, rehearsal: bool = False) -> tuple[str, ...]:
        # The sim is a stand-in engine: every sim seat is a rehearsal, marked or not.
        for f in faults:
            parse_fault(f)  # a UsageError naming what is wrong and how to write it
        return tuple(faults)

    def node_env(self, spec: SeatSpec, *, faults: Sequence[str]) -> dict[str, str]:
        """What SGLang would derive from the model (acceptance, step floor) and the faults; the KV pool it would
        derive from the GPU is the plan's prediction, under :attr:`kv_pool_env`."""
        env: dict[str, str] = {}
        sim = spec.sim
        if sim is not None:
            env[ENV_ACCEPT_RATE] = format(sim.accept_rate, "g")
            env[ENV_STEP_FLOOR_MS] = format(sim.step_floor_ms, "g")
        all_faults = [*(sim.faults if sim else []), *faults]
        if all_faults:
            env[ENV_FAULTS] = ";".join(all_faults)
        return env

    def visible_gpus(self) -> list[str] | None:
        return None

    def listen_ports(self, plan: PlannedSeat, node: PlannedNode) -> dict[str, int]:
        port = int(node.env_dict().get(NODE_PORT_ENV, plan.http_port))
        out = {"http": port, "sim admin": ports.admin_port(port)}
        if node.node_rank == 0:
            out["dist_init"] = plan.dist_init_port
        return out

    def bind_host(self, argv: Sequence[str], port_name: str) -> str:
        """The sim's admin (fault) routes listen on loopback only; the rest as SGLang binds them."""
        return ports.ADMIN_HOST if port_name == "sim admin" else super().bind_host(argv, port_name)

    def fault_url(self, plan: PlannedSeat, node: PlannedNode) -> str | None:
        """The sim's loopback admin route (``sgl_seat.sim.front.admin``: POST arms, DELETE clears)."""
        port = self.listen_ports(plan, node)["sim admin"]
        return f"http://{self.bind_host(node.command, 'sim admin')}:{port}/sim/faults"

    def colocated_env(self, plan: PlannedSeat, node_rank: int) -> dict[str, str] | None:
        """Simulated nodes on one host: each listens on its own port (:func:`sgl_seat.sim.front.ports.node_port`)."""
        return {NODE_PORT_ENV: str(ports.node_port(plan.http_port, node_rank))}
