"""`logs` as a library call: each node's engine log through its agent, or from disk on this host.

The last lines of every node's log (or one node's), then, with ``follow``, new whole lines as they come
(the agent never cuts a line in two). A node whose agent is gone is read from disk when its log is on
this host; otherwise the error says where the log is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from sgl_seat.errors import ClusterError, SeatStateError
from sgl_seat.launch import cluster
from sgl_seat.launch.actors.agent import tail_lines
from sgl_seat.launch.agentclient import CALL_TIMEOUT, AgentClient, get_agent
from sgl_seat.launch.seatrecord.record import load_record
from sgl_seat.launch.teardown import same_host

log = logging.getLogger(__name__)

def logs(name: str, *, node: int | None, follow: bool, lines: int, write: Callable[[str], None],
         poll: float = 0.5, stop: Callable[[], bool] = lambda: False) -> None:
    """Write the last ``lines`` of each node's log (or node ``node``), then follow new output if asked."""
    rec = load_record(name)
    nodes = [n for n in rec.nodes if node is None or n.node_rank == node]
    if not nodes:
        raise SeatStateError(f"seat {name!r} has no node {node}", fix=f"nodes are 0..{len(rec.nodes) - 1}")
    prefix = len(nodes) > 1
    connected = False
    if rec.gcs_address:
        try:
            cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=20.0)
            connected = True
        except ClusterError as exc:
            log.warning("%s", exc)
    try:
        offsets: dict[int, int] = {}
        partial: dict[int, str] = {}
        clients: dict[int, AgentClient] = {}
        for n in nodes:
            c = get_agent(name, n.node_rank) if connected else None
            if c is None:
                if n.log_path and same_host(n):
                    for ln in tail_lines(Path(n.log_path), lines):
                        write(_prefixed(n.node_rank, ln, prefix))
                    continue
                raise ClusterError(f"node {n.node_rank}'s agent cannot be reached and its log is on {n.ip}",
                                   fix="run `sgl-seat logs` on that node, or check `sgl-seat status`")
            res = c.call("log_tail", lines, timeout=CALL_TIMEOUT)
            for ln in res["lines"]:
                write(_prefixed(n.node_rank, ln, prefix))
            offsets[n.node_rank] = int(res["size"])
            clients[n.node_rank] = c
        while follow and clients and not stop():
            for r, c in list(clients.items()):
                try:
                    res = c.call("read_log", offsets[r], timeout=CALL_TIMEOUT)
                except ClusterError as exc:
                    write(f"[node {r}] -- {exc.message}")
                    del clients[r]
                    continue
                offsets[r] = int(res["offset"])
                *complete, partial[r] = (partial.get(r, "") + res["data"]).split("\n")
                for ln in complete:
                    write(_prefixed(r, ln, prefix))
            until = time.monotonic() + poll
            while not stop() and time.monotonic() < until:
                time.sleep(min(0.05, poll))
    finally:
        if connected:
            cluster.disconnect()


def _prefixed(node_rank: int, line: str, prefix: bool) -> str:
    return f"[node {node_rank}] {line}" if prefix else line
