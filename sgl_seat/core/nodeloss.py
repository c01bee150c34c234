"""Node loss as a verdict: a node whose sidecar did not answer the capture is named, with its ranks.

A capture that reaches only some nodes holds only their ranks. Over those, every rank may well wait in a
collective (the peers they wait for are on the node that is gone), and the detectors would call that a
mismatched collective; the real finding is that a node is unreachable. So when nodes are missing, this
verdict comes first, and what the detectors saw over the reachable ranks is kept as evidence, marked partial.
A node whose own check (:mod:`sgl_seat.core.isolation`) found its own link or route gone is named ``node-isolated``
instead, from its own evidence: it is the node that was cut off, whoever it lost. :func:`loss_verdict` is the one
rule, used by the live coordinator (``watchdog.capture``), ``replay`` (``forensics.redetect``) and ``bundle merge``.
Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sgl_seat.core.isolation import SelfCheck, isolated_nodes, own_side_gone
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


def _partial_line(partial: Verdict, seen: Sequence[int]) -> str:
    who = "".join(f", {k} {v}" for k, v in (("rank", partial.rank), ("node", partial.node)) if v is not None)
    return (f"over the {len(seen)} ranks seen ({names(seen)}) only: {partial.kind.value}{who}"
            " (partial: not a seat-wide finding)")


def node_isolated(node: int, check: SelfCheck, rank_nodes: Mapping[int, int], t: float, *,
                  partial: Verdict | None = None) -> Verdict:
    """The verdict for a node cut off by its own side: itself named, its own evidence first, then what it lost."""
    ranks = ranks_of(rank_nodes, node)
    gone = own_side_gone(check)
    ev = [f"node {node} ({names(ranks)}) is isolated: its own side is gone ({'; '.join(gone)})"]
    ev += [f"node {node} self-check: {line}" for line in check.evidence()]
    for n, last in sorted(check.silent.items()):
        ev.append(f"node {node} lost node {n} (from node {node}'s side; not node {n}'s fault): {last}")
    if partial is not None:
        ev.append(_partial_line(partial, ranks))
    return Verdict(kind=VerdictKind.NODE_ISOLATED, rank=None, node=node, frame=None, t=t, evidence=tuple(ev),
                   node_ranks=tuple(ranks))


def loss_verdict(rank_nodes: Mapping[int, int], present: Sequence[int], t: float, *,
                 checks: Mapping[int, SelfCheck] | None = None, why: Mapping[int, str] | None = None,
                 last_seen: Mapping[int, str] | None = None, partial: Verdict | None = None) -> Verdict | None:
    """The seat-wide verdict when nodes are lost or one isolated itself; None when neither (the detectors' own).

    A present node whose self-check found its own side gone comes first (``node-isolated``, that node): its evidence
    outranks a peer's silence. Else a missing node is ``node-unreachable``, with the present nodes' own checks
    (healthy: their links up) as evidence that the fault is not on their side.
    """
    checks = checks or {}
    isolated = isolated_nodes(checks, present)
    if isolated:
        return node_isolated(isolated[0], checks[isolated[0]], rank_nodes, t, partial=partial)
    lost = missing_nodes(rank_nodes, present)
    if not lost:
        return None
    v = node_unreachable(lost, rank_nodes, t, why=why, last_seen=last_seen, partial=partial)
    own = [f"node {n}'s own side (healthy): {'; '.join(checks[n].evidence())}" for n in sorted(checks)
           if n in set(present)]
    return Verdict(kind=v.kind, rank=v.rank, node=v.node, frame=v.frame, t=v.t, evidence=v.evidence + tuple(own),
                   node_ranks=v.node_ranks) if own else v
