"""What the battery reads from the engine itself: counters (for deltas) and ``/server_info`` (pool and ceiling).

Why counter deltas: SGLang's ``cache_hit_rate`` gauge and ``avg_spec_accept_length`` are cumulative since boot or
``mostrecent`` across processes (bench-anchors sections 1 and 3.6), so warm-up, health checks and earlier cells
pollute them. The battery reads ``sglang:cached_tokens_total``, ``sglang:prompt_tokens_total``,
``sglang:generation_tokens_total`` and ``sglang:spec_verify_calls_total`` before and after a cell and divides the
deltas. On a shared seat other tenants' traffic lands in the same counters: run the battery on an idle seat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Counters", "EngineInfo", "counters", "engine_info"]

COUNTERS = ("sglang:cached_tokens_total", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
            "sglang:spec_verify_calls_total", "sglang:num_requests_total")
SYNTHETIC_METRIC = "sgl_seat_sim_synthetic"


@dataclass(frozen=True, slots=True)
class Counters:
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
    vals = dict.fromkeys(COUNTERS, 0.0)
    synthetic = False
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in vals:
                vals[s.name] += float(s.value)
            elif s.name == SYNTHETIC_METRIC and s.value:
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
    """KV pool (``max_total_num_tokens``) and the running-request ceiling as the engine reports them."""
    doc = _get(endpoint, "/server_info", timeout).json()
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
