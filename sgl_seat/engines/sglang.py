"""Real SGLang 0.5.23: every preflight check applies, fault injection is refused, the probe loads through
``sitecustomize`` and its targets depend on the model's architecture."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sgl_seat.engines import probes
from sgl_seat.engines.base import EngineBackend
from sgl_seat.engines.preflight import Check
from sgl_seat.engines.targets import family_targets
from sgl_seat.errors import UsageError
from sgl_seat.spec import SeatSpec
from sgl_seat.topology import Topology


class SGLangBackend(EngineBackend):
    """``python -m sglang.launch_server`` on real GPUs."""

    name: ClassVar[str] = "sglang"
    module: ClassVar[str] = "sglang.launch_server"
    checks: ClassVar[frozenset[Check]] = frozenset(Check)

    def validate_faults(self, faults: Sequence[str]) -> tuple[str, ...]:
        if faults:
            raise UsageError("--fault is only for sim seats; a real SGLang seat refuses fault injection",
                             fix="drop --fault, or use a seat with engine: sim")
        return ()

    def probe_targets(self, model_family: str | None) -> tuple[str, ...]:
        return family_targets(model_family) if model_family else ()

    def plan_warnings(self, spec: SeatSpec, topo: Topology) -> list[str]:
        if topo.nnodes > 1 and not spec.network.node_env and not spec.cluster.hosts:
            return ["network.node_env is empty: NCCL/Gloo pick interfaces on their own on every node"]
        return []

    def visible_gpus(self) -> list[str] | None:
        return probes.nvidia_gpus() or []
