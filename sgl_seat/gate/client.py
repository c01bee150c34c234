"""The battery's load client: asyncio streaming against the OpenAI ``/v1/completions`` route.

Why these choices (bench-anchors sections 1 and 2.5):

- Tokens come from the server's ``usage`` (``stream_options.include_usage``), never from counting chunks: a draft
  streams several tokens per chunk, so chunk counts undercount its output by about the acceptance length.
- Per request: TTFT (first non-empty text chunk), end-to-end latency and TPOT = (latency - TTFT) / (tokens - 1);
  no per-chunk inter-token gaps. A cell's throughput is its output tokens over its wall time, as
  ``sglang.bench_serving`` computes ``output_throughput``.
- Every request sends ``temperature: 0`` explicitly (an omitted one takes the checkpoint's default) and
  ``ignore_eos`` so each one runs to ``max_tokens`` on every arm; a sweep may sample as users are served instead
  (:class:`Sampling`): greedy decoding with ``ignore_eos`` falls into repetition, which an n-gram draft feeds on.
- Closed loop: ``concurrency`` workers, each sends its next request when its last one ended; the clock for a
  request starts just before its POST (client queueing excluded, as bench_serving does).
- The client's own cost is measured in every cell: its CPU seconds per request and the event loop's lag (how late
  a 10 ms ticker wakes), so a saturated client is visible instead of being booked as a slow seat.

The endpoint is reached directly (``trust_env=False``), never through a proxy from the environment.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["CellRun", "RequestResult", "closed_loop", "one_request"]

TICK_S = 0.01


@dataclass(slots=True)
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    text: str = ""
    error: str | None = None
    start: float = 0.0

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.completion_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.completion_tokens - 1)


@dataclass(slots=True)
class CellRun:
    """One closed-loop run: its requests, wall time and the client's own overhead."""

    concurrency: int
    results: list[RequestResult]
    duration_s: float
    client_cpu_s: float
    loop_lag_ms_p50: float
    loop_lag_ms_max: float

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def output_tok_s(self) -> float:
        return sum(r.completion_tokens for r in self.ok) / self.duration_s if self.duration_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        ok = self.ok
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        tpots = [t for t in (r.tpot_s for r in ok) if t is not None]
        return {
            "concurrency": self.concurrency,
            "requests": len(self.results),
            "failed": len(self.results) - len(ok),
            "errors": sorted({r.error for r in self.results if r.error})[:5],
            "duration_s": round(self.duration_s, 4),
            "output_tokens": sum(r.completion_tokens for r in ok),
            "prompt_tokens": sum(r.prompt_tokens for r in ok),
            "output_tok_s": round(self.output_tok_s, 3),
            "ttft_s_median": round(statistics.median(ttfts), 5) if ttfts else None,
            "ttft_s_max": round(max(ttfts), 5) if ttfts else None,
            "tpot_s_median": round(statistics.median(tpots), 6) if tpots else None,
            "latency_s_median": round(statistics.median(r.latency_s for r in ok), 5) if ok else None,
            "client": {"cpu_s_per_request": round(self.client_cpu_s / max(len(self.results), 1), 6),
                       "loop_lag_ms_p50": round(self.loop_lag_ms_p50, 3),
                       "loop_lag_ms_max": round(self.loop_lag_ms_max, 3)},
        }


@dataclass(frozen=True, slots=True)
class Sampling:
    """How a cell's requests sample: greedy with ``ignore_eos`` by default (every arm runs each request to
    ``max_tokens``), or as users are served (a temperature, the end of sequence honoured: a sweep's ``temperature``
    and ``ignore_eos`` in the workloads file)."""

    temperature: float = 0.0
    ignore_eos: bool = True


GREEDY = Sampling()


def _body(model: str, prompt: str, max_tokens: int, sampling: Sampling = GREEDY) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": sampling.temperature,
            "ignore_eos": sampling.ignore_eos, "stream": True, "stream_options": {"include_usage": True}}


async def one_request(client: httpx.AsyncClient, endpoint: str, model: str, prompt: str, max_tokens: int,
                      *, timeout: float, sampling: Sampling = GREEDY) -> RequestResult:
    """One streamed completion; never raises for a failed request (``ok`` False with the error)."""
    res = RequestResult(ok=False)
    pieces: list[str] = []
    res.start = t0 = time.perf_counter()
    try:
        async with client.stream("POST", f"{endpoint}/v1/completions", json=_body(model, prompt, max_tokens, sampling),
                                 timeout=timeout) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:160]!r}"
                return res
            usage: dict[str, Any] | None = None
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                doc = json.loads(data)
                if doc.get("error"):
                    res.error = str(doc["error"])[:160]
                    return res
                for ch in doc.get("choices") or ():
                    text = ch.get("text") or ""
                    if text:
                        if res.ttft_s is None:
                            res.ttft_s = time.perf_counter() - t0
                        pieces.append(text)
                if doc.get("usage"):
                    usage = doc["usage"]
    except (httpx.HTTPError, ValueError, OSError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:160]
        return res
    res.latency_s = time.perf_counter() - t0
    if usage is None:
        res.error = "no usage in the stream (the server ignored stream_options.include_usage)"
        return res
    res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    res.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    res.cached_tokens = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    res.text = "".join(pieces)
    res.ok = True
    return res


async def _ticker(stop: asyncio.Event, lags: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(TICK_S)
        lags.append(max(0.0, time.perf_counter() - t - TICK_S) * 1000.0)


async def _closed_loop(endpoint: str, model: str, prompts: Sequence[str], concurrency: int, max_tokens: int,
                       timeout: float, sampling: Sampling) -> CellRun:
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for i, p in enumerate(prompts):
        queue.put_nowait((i, p))
    results: list[RequestResult | None] = [None] * len(prompts)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    lags: list[float] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(trust_env=False, limits=limits, timeout=timeout) as client:

        async def worker() -> None:
            while True:
                try:
                    i, p = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                results[i] = await one_request(client, endpoint, model, p, max_tokens, timeout=timeout,
                                               sampling=sampling)

        tick = asyncio.create_task(_ticker(stop, lags))
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
        duration, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        stop.set()
        await tick
    done = [r if r is not None else RequestResult(ok=False, error="not sent") for r in results]
    return CellRun(concurrency, done, duration, cpu, statistics.median(lags) if lags else 0.0,
                   max(lags) if lags else 0.0)


def closed_loop(endpoint: str, model: str, prompts: Sequence[str], *, concurrency: int, max_tokens: int,
                timeout: float = 600.0, sampling: Sampling = GREEDY) -> CellRun:
    """Send ``prompts`` with ``concurrency`` closed-loop workers; return the cell's requests and timings."""
    if concurrency < 1 or not prompts:
        raise ValueError("closed_loop needs concurrency >= 1 and at least one prompt")
    return asyncio.run(_closed_loop(endpoint, model, prompts, concurrency, max_tokens, timeout, sampling))
