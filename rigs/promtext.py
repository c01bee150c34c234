"""An engine's counters from its Prometheus text (``GET /metrics``), summed over their label sets: what the benches
that load a real seat read acceptance and throughput from. Standard library only (it runs on the GPU host too)."""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence

__all__ = ["metric_sums"]


def metric_sums(url: str, names: Sequence[str], timeout: float = 30.0) -> dict[str, float]:
    """Each of ``names`` summed over its label sets at ``url`` (an engine's ``/metrics``); 0 for one not there."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out
