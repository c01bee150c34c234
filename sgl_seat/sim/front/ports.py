"""Where a simulated node listens: the sim's port arithmetic, in one place.

A node serves HTTP on ``--port``, or on ``$SGLSEAT_SIM_NODE_PORT`` where several simulated nodes share one
host (a local cluster); node r > 0 sharing node 0's host gets ``--port + NODE_PORT_STEP * r``
(:func:`node_port`). Every node's admin (fault) routes listen on loopback only, at its listen port +
``ADMIN_PORT_OFFSET`` (:func:`admin_port`). The sim binds these; its backend (``sgl_seat.engines.sim``: the
co-located nodes' environment, preflight's ports) and the test rigs compute them here. SGLang itself uses
``--port`` on every node and has no admin routes.
"""

from __future__ import annotations

from typing import Final

#: This node's listen port instead of ``--port`` (several simulated nodes on one host).
ENV_NODE_PORT: Final = "SGLSEAT_SIM_NODE_PORT"
#: The admin routes' host: loopback only.
ADMIN_HOST: Final = "127.0.0.1"
ADMIN_PORT_OFFSET: Final = 2
NODE_PORT_STEP: Final = 10


def node_port(http_port: int, node_rank: int) -> int:
    """The listen port of simulated node ``node_rank`` when the seat's nodes share one host."""
    return http_port + NODE_PORT_STEP * node_rank


def admin_port(listen_port: int) -> int:
    """The loopback admin port of the node that listens on ``listen_port``."""
    return listen_port + ADMIN_PORT_OFFSET
