"""What the battery reads from the engine itself: counters (for deltas) and ``/server_info`` (pool and ceiling).

Why counter deltas: SGLang's ``cache_hit_rate`` gauge and ``avg_spec_accept_length`` are cumulative since boot or
``mostrecent`` across processes (bench-anchors sections 1 and 3.6), so warm-up, health checks and earlier cells
pollute them. The battery reads the engine's counters of prompt tokens, cached prompt tokens, generated tokens, verify
steps and finished requests before and after a cell and divides the deltas. Each is read by what it means
(:data:`COUNTERS`, the :class:`~sgl_seat.core.vocabulary.EngineWords` fields) under the engine's own name, found from
the page itself, so a server someone else runs is read too. On a shared seat other tenants' traffic lands in the same
counters: run the battery on an idle seat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.engines import synthetic_markers, words_of_metrics

__all__ = ["COUNTERS", "Counters", "EngineInfo", "counters", "engine_info"]

#: The counters a cell records, by meaning (the :class:`EngineWords` field that names each).
COUNTERS = ("cached_tokens", "prompt_tokens", "generated", "verify_steps", "requests")


@dataclass(frozen=True, slots=True)
class Counters:
    #: By meaning (:data:`COUNTERS`); 0.0 where the engine has no such counter.
    values: dict[str, float]
    synthetic: bool

    def delta(self, before: Counters) -> dict[str, float]:
        return {k: self.values.get(k, 0.0) - before.values.get(k, 0.0) for k in COUNTERS}


def _get(endpoint: str, path: str, timeout: float) -> httpx.Response:
    r = httpx.get(f"{endpoint}{path}", timeout=timeout, trust_env=False)
    r.raise_for_status()
    return r


def counters(endpoint: str, *, timeout: float = 10.0) -> Counters:
    """Sum each counter over its label sets (every rank, every ``is_streaming`` value)."""
    text = _get(endpoint, "/metrics", timeout).text
    samples = [(s.name, float(s.value)) for fam in text_string_to_metric_families(text) for s in fam.samples]
    words = words_of_metrics(n for n, _ in samples) or EngineWords()
    by_name = {getattr(words, k): k for k in COUNTERS if getattr(words, k)}
    vals = dict.fromkeys(COUNTERS, 0.0)
    markers = set(synthetic_markers())
    synthetic = False
    for name, value in samples:
        if name in by_name:
            vals[by_name[name]] += value
        elif name in markers and value:
            synthetic = True
    return Counters(vals, synthetic)


@dataclass(frozen=True, slots=True)
class EngineInfo:
    kv_pool_tokens: int | None
    max_running_requests: int | None
    speculative_algorithm: str | None
    speculative_adaptive: bool
    synthetic: bool
    version: str | None

    def to_json(self) -> dict[str, Any]:
        return {"kv_pool_tokens": self.kv_pool_tokens, "max_running_requests": self.max_running_requests,
                "speculative_algorithm": self.speculative_algorithm,
                "speculative_adaptive": self.speculative_adaptive, "synthetic": self.synthetic,
                "version": self.version}


def engine_info(endpoint: str, *, timeout: float = 10.0) -> EngineInfo:
    """KV pool (``max_total_num_tokens``) and the running-request ceiling as the engine reports them (SGLang's
    ``/server_info``); an engine without that route (vLLM: 404) is read from ``/metrics`` by its words."""
    try:
        doc = _get(endpoint, "/server_info", timeout).json()
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 404:
            raise
        return _engine_info_from_metrics(endpoint, timeout)
    state = (doc.get("internal_states") or [{}])[0]
    if "decode" in doc and not state:  # PD deployments nest it
        state = (doc["decode"][0].get("internal_states") or [{}])[0]
    pool = doc.get("max_total_num_tokens") or (state.get("memory_usage") or {}).get("token_capacity")
    ceiling = state.get("effective_max_running_requests_per_dp") or doc.get("max_running_requests")
    return EngineInfo(
        kv_pool_tokens=int(pool) if pool else None,
        max_running_requests=int(ceiling) if ceiling else None,
        speculative_algorithm=doc.get("speculative_algorithm"),
        speculative_adaptive=bool(doc.get("speculative_adaptive")),
        synthetic=any(k.startswith("sgl_seat") for k in doc),
        version=doc.get("version"),
    )


def _engine_info_from_metrics(endpoint: str, timeout: float) -> EngineInfo:
    """The pool from the engine's info gauge (:attr:`EngineWords.pool_info`); whether it drafts from its draft
    counter being on the page. The slot cap is not on vLLM's page (None: the report says not measured)."""
    text = _get(endpoint, "/metrics", timeout).text
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    words = words_of_metrics(s.name for s in samples) or EngineWords()
    metric, label = words.pool_info
    pool = next((s.labels.get(label) for s in samples if metric and s.name == metric and s.labels.get(label)), None)
    drafts = bool(words.verify_steps) and any(s.name == words.verify_steps for s in samples)
    return EngineInfo(
        kv_pool_tokens=int(pool) if pool and pool.isdigit() else None, max_running_requests=None,
        speculative_algorithm=f"{words.engine} draft" if drafts else None, speculative_adaptive=False,
        synthetic=False, version=None)
