"""Parallelism arithmetic: world size, ranks per node and SGLang's own rank -> node placement.

Kept apart from Ray and from the plan so it can be tested on its own: a seat whose TP/EP/DP do
not divide the cluster is refused here, before any command line is written.
"""

from __future__ import annotations

from dataclasses import dataclass

from sgl_seat.errors import TopologyError
from sgl_seat.spec import SeatSpec, spec_location


def rank_title(base: str, tp_rank: int, ep_rank: int, tp_size: int, ep_size: int) -> str:
    """The title of the process that runs a pure TP(+EP) rank (pp=1, dp=1): the engine's ``base`` (its
    :attr:`~sgl_seat.core.vocabulary.EngineWords.rank_title`), ``_TP{r}`` only when tp > 1, ``_EP{e}`` only when
    ep > 1.

    SGLang 0.5.23 builds it so (``setproctitle(f"sglang::scheduler{prefix.replace(' ', '_')}")`` in
    scheduler.py): a TP4/EP1 rank is ``..._TP2`` and a single-GPU seat's is ``base`` alone.
    """
    title = base
    if tp_size > 1:
        title += f"_TP{tp_rank}"
    if ep_size > 1:
        title += f"_EP{ep_rank}"
    return title


@dataclass(frozen=True, slots=True)
class RankInfo:
    """One scheduler rank: its TP rank, its EP rank, where it lives and its process title."""

    tp_rank: int
    ep_rank: int
    node_rank: int
    local_rank: int
    process_title: str


@dataclass(frozen=True, slots=True)
class Topology:
    """The seat's shape. ``world_size`` counts scheduler processes (one per GPU)."""

    nnodes: int
    gpus_per_node: int
    tp: int
    ep: int
    dp: int

    @property
    def world_size(self) -> int:
        return self.tp * self.dp

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes

    def ranks_on(self, node_rank: int, title: str) -> list[RankInfo]:
        """TP ranks of ``node_rank``: SGLang places ``[r*tp/nnodes, (r+1)*tp/nnodes)`` on node r (pp=1); ``title``
        is the engine's rank title (:func:`rank_title`'s ``base``)."""
        per = self.ranks_per_node
        out = []
        for local in range(per):
            tp_rank = node_rank * per + local
            # SGLang's moe_ep_rank = tp_rank // (tp // ep).
            ep_rank = tp_rank // (self.tp // self.ep)
            out.append(RankInfo(tp_rank=tp_rank, ep_rank=ep_rank, node_rank=node_rank, local_rank=local,
                                process_title=rank_title(title, tp_rank, ep_rank, self.tp, self.ep)))
        return out

    def node_of(self, tp_rank: int) -> int:
        if not 0 <= tp_rank < self.world_size:
            raise TopologyError(f"rank {tp_rank} is outside 0..{self.world_size - 1}")
        return tp_rank // self.ranks_per_node

    def all_ranks(self, title: str) -> list[RankInfo]:
        return [r for n in range(self.nnodes) for r in self.ranks_on(n, title)]


def topology_of(spec: SeatSpec) -> Topology:
    """Check TP/EP/DP against the cluster and return the shape."""
    nodes, gpn = spec.cluster.nodes, spec.cluster.gpus_per_node
    tp, ep, dp = spec.parallel.tp, spec.parallel.ep, spec.parallel.dp
    gpus = nodes * gpn
    where = f"(seat {spec.name}: {nodes} nodes x {gpn} GPUs = {gpus} GPUs)"
    if dp != 1:
        raise TopologyError(
            f"dp = {dp}: sgl-seat plans pure TP(+EP) seats only {where}",
            **spec_location(spec, "parallel.dp"),
            fix="set parallel.dp to 1 (DP attention is not planned yet)",
        )
    if tp != gpus:
        raise TopologyError(
            f"tp = {tp} but the seat has {gpus} GPUs {where}; a pure-TP seat needs tp = nodes x gpus_per_node",
            **spec_location(spec, "parallel.tp"),
            fix=f"set parallel.tp to {gpus}, or change cluster.nodes / cluster.gpus_per_node",
        )
    if tp % nodes:
        raise TopologyError(
            f"tp {tp} is not divisible by {nodes} nodes {where}",
            fix="make tp a multiple of nodes",
            **spec_location(spec, "parallel.tp"),
        )
    if ep > tp or tp % ep:
        raise TopologyError(
            f"ep = {ep} does not divide tp = {tp} {where}",
            **spec_location(spec, "parallel.ep"),
            fix=f"use an ep that divides {tp} (e.g. {tp} or 1)",
        )
    return Topology(nnodes=nodes, gpus_per_node=gpn, tp=tp, ep=ep, dp=dp)
