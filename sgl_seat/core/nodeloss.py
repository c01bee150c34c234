"""Node loss as a verdict: a node whose sidecar did not answer the capture is named, with its ranks.

A capture that reaches only some nodes holds only their ranks. Over those, every rank may well wait in a
collective (the peers they wait for are on the node that is gone), and the detectors would call that a
mismatched collective; the real finding is that a node is unreachable. So when nodes are missing, this
verdict comes first, and what the detectors saw over the reachable ranks is kept as evidence, marked partial.
Pure: the live coordinator (``watchdog.capture``) and ``replay`` both use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sgl_seat.core.records import Verdict, VerdictKind


def missing_nodes(rank_nodes: Mapping[int, int], present: Iterable[int]) -> list[int]:
    """The seat's nodes (from its rank -> node map) that contributed nothing."""
    return sorted(set(rank_nodes.values()) - set(present))


def ranks_of(rank_nodes: Mapping[int, int], node: int) -> list[int]:
    return sorted(r for r, n in rank_nodes.items() if n == node)


def names(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def node_unreachable(missing: Sequence[int], rank_nodes: Mapping[int, int], t: float, *,
                     why: Mapping[int, str] | None = None, last_seen: Mapping[int, str] | None = None,
                     partial: Verdict | None = None) -> Verdict:
    """The verdict for the lowest missing node; every missing node, why and when last seen, in the evidence.

    ``why``: per node, what the coordinator got instead of its part (a timeout, a dead actor); ``last_seen``:
    per node, what was last seen from it (last sample time, last probe record, Ray's view); ``partial``: the
    detectors' verdict over the ranks that did answer (kept as evidence only: it saw part of the seat).
    """
    if not missing:
        raise ValueError("node_unreachable needs at least one missing node")
    first = missing[0]
    ranks = ranks_of(rank_nodes, first)
    ev = []
    for n in missing:
        line = f"node {n} ({names(ranks_of(rank_nodes, n))}) did not answer the capture"
        if why and why.get(n):
            line += f": {why[n]}"
        ev.append(line)
        if last_seen and last_seen.get(n):
            ev.append(f"node {n} last seen: {last_seen[n]}")
    seen = sorted(r for r, n in rank_nodes.items() if n not in set(missing))
    if partial is not None:
        who = "".join(f", {k} {v}" for k, v in (("rank", partial.rank), ("node", partial.node)) if v is not None)
        ev.append(f"over the {len(seen)} ranks that answered ({names(seen)}) only: {partial.kind.value}{who}"
                  " (partial: not a seat-wide finding)")
    return Verdict(kind=VerdictKind.NODE_UNREACHABLE, rank=None, node=first, frame=None, t=t, evidence=tuple(ev),
                   node_ranks=tuple(ranks))
