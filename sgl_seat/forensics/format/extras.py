"""What a bundle's manifest extras say that more than one reader needs: the engine's words, the learned thresholds and
the missing nodes.

Why here, in the format: merging the nodes' parts at capture (:mod:`.merge`) and replay both read them; with them in
replay, the format folder imported replay while replay imports the format (a folder loop, ``tests/unit/test_layers``).
"""

from __future__ import annotations

from sgl_seat.core.learned import LearnedThresholds
from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.engines import engine_names, words_for
from sgl_seat.errors import UsageError
from sgl_seat.forensics.format.bundle import Bundle

__all__ = ["ENGINE_BEFORE_IT_WAS_RECORDED", "engine_of", "learned_of", "why_missing", "words_of"]

#: Bundles written before the manifest named the engine are SGLang's or the sim's, which share SGLang's names.
ENGINE_BEFORE_IT_WAS_RECORDED = "sglang"


def engine_of(bundle: Bundle) -> str:
    """The engine whose records the bundle holds (the manifest's optional ``engine``)."""
    name = bundle.manifest.extra.get("engine")
    return name if isinstance(name, str) and name else ENGINE_BEFORE_IT_WAS_RECORDED


def words_of(bundle: Bundle) -> EngineWords:
    """The names the bundle's records carry: its engine's (:func:`engine_of`)."""
    try:
        return words_for(engine_of(bundle))
    except UsageError:
        raise UsageError(f"bundle {bundle.manifest.bundle_id}: engine {engine_of(bundle)!r} is not one this "
                         f"sgl-seat knows", fix=f"replay it with the sgl-seat that wrote it (this one knows "
                                                f"{engine_names()})") from None


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
