"""What a bundle's manifest extras say that more than one reader needs: the learned thresholds and the missing nodes.

Why here, in the format: merging the nodes' parts at capture (:mod:`.merge`) and replay both read them; with them in
replay, the format folder imported replay while replay imports the format (a folder loop, ``tests/unit/test_layers``).
"""

from __future__ import annotations

from sgl_seat.core.learned import LearnedThresholds
from sgl_seat.forensics.format.bundle import Bundle

__all__ = ["learned_of", "why_missing"]


def learned_of(bundle: Bundle) -> LearnedThresholds | None:
    """The bundle's learned thresholds (None: none recorded, or unreadable)."""
    doc = bundle.manifest.extra.get("learned")
    if doc is None:
        return None
    try:
        return LearnedThresholds.from_json(doc)
    except ValueError:
        return None


def why_missing(bundle: Bundle) -> dict[int, str]:
    """Per missing node, what the capture got instead of its part (the manifest's optional ``missing_nodes``)."""
    out: dict[int, str] = {}
    raw = bundle.manifest.extra.get("missing_nodes")
    for d in raw if isinstance(raw, list) else []:
        if isinstance(d, dict) and type(d.get("node")) is int and isinstance(d.get("detail"), str):
            out[d["node"]] = d["detail"][:300]
    return out
