"""Prometheus exposition with SGLang's metric names and labels (``/metrics``, only with --enable-metrics).

Why one registry in the main process: SGLang aggregates its processes with prometheus' multiprocess mode;
the sim does not need that. Rank 0 pushes its scheduler figures (running, queued, throughput, cache hit
rate, usage, acceptance) to the main process, which owns the tokenizer-side counters and histograms itself.
Scheduler gauges carry SGLang's scheduler labels for TP0 (the only rank that emits them in a pure-TP seat);
tokenizer metrics carry the tokenizer labels. One extra gauge, ``sgl_seat_sim_synthetic``, says that every
figure on the page is synthetic.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sgl_seat.sim import contract

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 120.0, 160.0)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
               0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
               400.0, 800.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST

_STAT_KEYS = {
    "sglang:num_running_reqs": "num_running_reqs",
    "sglang:num_queue_reqs": "num_queue_reqs",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:cache_hit_rate": "cache_hit_rate",
    "sglang:token_usage": "token_usage",
    "sglang:num_used_tokens": "num_used_tokens",
    "sglang:decode_sum_seq_lens": "decode_sum_seq_lens",
    "sglang:spec_accept_length": "spec_accept_length",
    "sglang:spec_accept_rate": "spec_accept_rate",
}


def _doc(name: str) -> str:
    return f"{name.split(':', 1)[1].replace('_', ' ')} (sgl-seat sim: synthetic)"


class SimMetrics:
    def __init__(self, *, model_name: str, spec_on: bool) -> None:
        self.registry = CollectorRegistry()
        self.spec_on = spec_on
        self.sched_labels = {
            "model_name": model_name, "engine_type": contract.ENGINE_TYPE, "tp_rank": "0", "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        self.tok_labels = {"model_name": model_name, "engine_type": contract.ENGINE_TYPE}
        assert tuple(self.sched_labels) == contract.SCHEDULER_LABELS
        assert tuple(self.tok_labels) == contract.TOKENIZER_LABELS
        r = self.registry
        self.gauges = {
            name: Gauge(name, _doc(name), labelnames=[*contract.SCHEDULER_LABELS, *extra], registry=r)
            for name, extra in contract.SCHEDULER_GAUGES.items()
        }
        self.counters = {
            name: Counter(name, _doc(name), labelnames=[*contract.TOKENIZER_LABELS, *extra], registry=r)
            for name, extra in contract.TOKENIZER_COUNTERS.items()
        }
        self.sched_counters = {
            name: Counter(name, _doc(name), labelnames=[*contract.SCHEDULER_LABELS, *extra], registry=r)
            for name, extra in contract.SCHEDULER_COUNTERS.items()
        }
        self._forward_ct = 0
        buckets = {
            "sglang:time_to_first_token_seconds": TTFT_BUCKETS,
            "sglang:inter_token_latency_seconds": ITL_BUCKETS,
            "sglang:e2e_request_latency_seconds": E2E_BUCKETS,
        }
        self.hists = {
            name: Histogram(name, _doc(name), labelnames=[*contract.TOKENIZER_LABELS, *extra], buckets=buckets[name],
                            registry=r)
            for name, extra in contract.TOKENIZER_HISTOGRAMS.items()
        }
        synthetic = Gauge(contract.SIM_ONLY_METRICS[0], "1: every figure here comes from sgl-seat's sim engine",
                          labelnames=["engine"], registry=r)
        synthetic.labels(engine="sgl-seat-sim").set(1)

    def set_constants(self, *, max_total_num_tokens: int, context_len: int) -> None:
        self.gauges["sglang:max_total_num_tokens"].labels(**self.sched_labels).set(max_total_num_tokens)
        self.gauges["sglang:context_len"].labels(**self.sched_labels).set(context_len)
        # Present from the start, the speculative gauges too: SGLang 0.5.23 exports sglang:spec_accept_length and
        # sglang:spec_accept_rate at 0.0 with no speculative algorithm (seen on its CPU engine, draft off).
        for name in _STAT_KEYS:
            self.gauges[name].labels(**self.sched_labels).set(0.0)

    def set_stats(self, stats: dict[str, Any]) -> None:
        for name, key in _STAT_KEYS.items():
            if key in stats:
                self.gauges[name].labels(**self.sched_labels).set(float(stats[key]))
        ct = int(stats.get("forward_ct", self._forward_ct))
        if ct > self._forward_ct:  # SGLang counts every forward pass; the sim's rank 0 reports its count
            self.sched_counters["sglang:cuda_graph_passes_total"].labels(
                **self.sched_labels, mode=contract.CUDA_GRAPH_MODE_NONE).inc(ct - self._forward_ct)
            self._forward_ct = ct

    def first_token(self, seconds: float, streaming: bool) -> None:
        self.hists["sglang:time_to_first_token_seconds"].labels(
            **self.tok_labels, is_streaming=str(streaming).lower()).observe(seconds)

    def inter_token(self, seconds: float) -> None:
        self.hists["sglang:inter_token_latency_seconds"].labels(**self.tok_labels).observe(seconds)

    def finished(self, *, prompt: int, generated: int, cached: int, e2e_s: float, streaming: bool,
                 spec_verify: int = 0) -> None:
        s = str(streaming).lower()
        self.counters["sglang:prompt_tokens_total"].labels(**self.tok_labels, is_streaming=s).inc(prompt)
        self.counters["sglang:generation_tokens_total"].labels(**self.tok_labels, is_streaming=s).inc(generated)
        self.counters["sglang:num_requests_total"].labels(**self.tok_labels, is_streaming=s).inc()
        self.counters["sglang:cached_tokens_total"].labels(
            **self.tok_labels, cache_source=contract.CACHE_SOURCE_DEVICE).inc(cached)
        if spec_verify:  # as SGLang: only requests that were verified count
            self.counters["sglang:spec_verify_calls_total"].labels(**self.tok_labels).inc(spec_verify)
        self.hists["sglang:e2e_request_latency_seconds"].labels(**self.tok_labels, is_streaming=s).observe(e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def render_empty(node_rank: int) -> bytes:
    """Node >= 1's ``/metrics``: a pure-TP seat's other nodes export no scheduler gauges (only TP0 does)."""
    reg = CollectorRegistry()
    g = Gauge(contract.SIM_ONLY_METRICS[0], "1: every figure here comes from sgl-seat's sim engine",
              labelnames=["engine"], registry=reg)
    g.labels(engine="sgl-seat-sim").set(1)
    return f"# sgl-seat sim node_rank {node_rank}: no scheduler gauges on this node (TP0 emits them)\n".encode() + \
        generate_latest(reg)
