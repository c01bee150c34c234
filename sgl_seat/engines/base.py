"""What differs between engine backends, behind one small interface.

Launch, health and teardown are the same for real SGLang and the sim: both are started from the
plan's argv, both serve ``/health_generate`` on rank 0, both run in one process group per node.
What differs is small and lives here: which preflight checks apply, how the node lists its GPUs,
whether ``--fault`` is accepted, and how the actual KV pool is read from the startup log.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from sgl_seat.launch.preflight import Check
from sgl_seat.plan import LaunchPlan, NodePlan

# SGLang 0.5.23 memory_pool.py: "KV Cache is allocated. dtype: ..., #tokens: N, ..."; the name may carry a
# label and "VA upper bound" may replace "is allocated" (contracts section 6).
_KV_LINE = re.compile(r"KV Cache (?:is allocated|VA upper bound)\b.*?#tokens:\s*([\d,]+)")


def parse_kv_tokens(text: str) -> int | None:
    """The first ``#tokens: N`` of a ``KV Cache is allocated`` line in ``text``, if any."""
    m = _KV_LINE.search(text)
    return int(m.group(1).replace(",", "")) if m else None


class EngineBackend(ABC):
    """One engine family. Instances are stateless; get one with :func:`sgl_seat.engines.backend_for`."""

    name: ClassVar[str]
    checks: ClassVar[frozenset[Check]]
    health_path: ClassVar[str] = "/health_generate"

    @abstractmethod
    def validate_faults(self, faults: Sequence[str]) -> tuple[str, ...]:
        """Check ``--fault`` values; return them normalised or raise a UsageError."""

    @abstractmethod
    def visible_gpus(self) -> list[str] | None:
        """The node's own GPU listing for the GPU check, or ``None`` when only Ray's ids count."""

    def parse_kv_tokens(self, log_text: str) -> int | None:
        return parse_kv_tokens(log_text)

    def listen_ports(self, plan: LaunchPlan, node: NodePlan) -> dict[str, int]:
        """Ports this node's engine binds, by name, for the ports-free check.

        SGLang binds ``--port`` on every node (rank >= 1 runs its dummy health server there) and
        node 0's scheduler listens on the dist-init port.
        """
        ports = {"http": plan.http_port}
        if node.node_rank == 0:
            ports["dist_init"] = plan.dist_init_port
        return ports

    def colocated_env(self, plan: LaunchPlan, node_rank: int) -> dict[str, str] | None:
        """Environment for node ``node_rank`` when it shares a host with a lower node of the seat.

        That happens only with simulated nodes (a local cluster on one machine). ``None`` means the
        engine cannot run two nodes on one host (their ports would collide).
        """
        return None
