"""Names that tie a seat's Ray objects together, so any process can find them again.

``up``, ``down``, ``status``, ``logs`` and (later) the watchdog sidecars run in different processes;
they find the seat's placement group and node agents by these names in the seat's namespace,
never through handles kept in memory.
"""

from __future__ import annotations


def namespace_of(seat: str) -> str:
    """Ray namespace of everything a seat creates (named actors, the placement group)."""
    return f"sgl-seat-{seat}"


def pg_name(seat: str) -> str:
    return f"sgl-seat-{seat}-pg"


def agent_name(seat: str, node_rank: int) -> str:
    """Name of the node agent on bundle ``node_rank``; sidecars use it to land on the same bundle."""
    return f"sgl-seat-{seat}-node{node_rank}"
