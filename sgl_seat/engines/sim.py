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

log = logging.getLogger(__name__)


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
