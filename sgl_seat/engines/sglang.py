"""Real SGLang 0.5.23: every preflight check applies and fault injection is refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sgl_seat.engines.base import EngineBackend
from sgl_seat.errors import UsageError
from sgl_seat.launch import probes
from sgl_seat.launch.preflight import Check


class SGLangBackend(EngineBackend):
    """``python -m sglang.launch_server`` on real GPUs."""

    name: ClassVar[str] = "sglang"
    checks: ClassVar[frozenset[Check]] = frozenset(Check)

    def validate_faults(self, faults: Sequence[str]) -> tuple[str, ...]:
        if faults:
            raise UsageError("--fault is only for sim seats; a real SGLang seat refuses fault injection",
                             fix="drop --fault, or use a seat with engine: sim")
        return ()

    def visible_gpus(self) -> list[str] | None:
        return probes.nvidia_gpus() or []
