"""The sim engine: Ray's fake GPU ids stand for GPUs, no RDMA or model files, faults allowed.

``--fault`` values are checked with the sim's own parser (``sgl_seat.sim.faults.parse_fault``) so a
typo fails before anything is placed; if that module is not importable the sim checks them itself
when it starts.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from typing import ClassVar

from sgl_seat.engines.base import EngineBackend
from sgl_seat.errors import UsageError
from sgl_seat.launch.preflight import Check
from sgl_seat.plan import LaunchPlan, NodePlan

log = logging.getLogger(__name__)

# The sim's own knobs (sgl_seat.sim.args.ENV_NODE_PORT, sgl_seat.sim.contract.ADMIN_PORT_OFFSET; a unit
# test pins them): a node's listen port instead of --port, and its loopback admin port's offset.
NODE_PORT_ENV = "SGL_SEAT_SIM_NODE_PORT"
ADMIN_PORT_OFFSET = 2
# Simulated node r > 0 that shares node 0's host listens on --port + 10 * r (admin on that + 2).
COLOCATED_PORT_STEP = 10


class SimBackend(EngineBackend):
    """``python -m sgl_seat.sim.launch_server``: SGLang's contract without a GPU."""

    name: ClassVar[str] = "sim"
    checks: ClassVar[frozenset[Check]] = frozenset(
        {Check.GPUS, Check.SOCKET_IFNAME, Check.PORTS, Check.DIST_INIT_REACHABLE}
    )

    def validate_faults(self, faults: Sequence[str]) -> tuple[str, ...]:
        if not faults:
            return ()
        try:
            mod = importlib.import_module("sgl_seat.sim.faults")
            parse = mod.parse_fault
        except (ImportError, AttributeError) as exc:
            log.debug("sgl_seat.sim.faults.parse_fault is not available (%s); the sim checks --fault itself", exc)
            return tuple(faults)
        for f in faults:
            try:
                parse(f)
            except (ValueError, TypeError, KeyError) as exc:
                raise UsageError(f"--fault {f!r}: {exc}",
                                 fix="use KIND:key=value,... e.g. --fault crash:rank=2,after_s=30") from None
        return tuple(faults)

    def visible_gpus(self) -> list[str] | None:
        return None

    def listen_ports(self, plan: LaunchPlan, node: NodePlan) -> dict[str, int]:
        port = int(node.env_dict().get(NODE_PORT_ENV, plan.http_port))
        ports = {"http": port, "sim admin": port + ADMIN_PORT_OFFSET}
        if node.node_rank == 0:
            ports["dist_init"] = plan.dist_init_port
        return ports

    def colocated_env(self, plan: LaunchPlan, node_rank: int) -> dict[str, str] | None:
        return {NODE_PORT_ENV: str(plan.http_port + COLOCATED_PORT_STEP * node_rank)}
