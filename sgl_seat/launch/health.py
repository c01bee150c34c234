"""Rank 0's health, the only HTTP answer a seat's state trusts.

SGLang's rank >= 1 nodes run a dummy health server that answers 200 for ``/health`` and
``/health_generate`` without looking at their schedulers (``deploy-anchors.md`` section 5, PR
#12297), so the seat's health is rank 0's ``/health_generate`` (which runs a real generation
through every rank) plus the liveness of every engine process, checked by the node agents.
"""

from __future__ import annotations

import httpx


def probe(url: str, timeout: float = 5.0) -> tuple[int | None, str | None]:
    """GET ``url`` once: (status code, None) or (None, error text)."""
    try:
        r = httpx.get(url, timeout=timeout, trust_env=False)  # the seat is reached directly, never via a proxy
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return r.status_code, None if r.status_code == 200 else f"HTTP {r.status_code}"
