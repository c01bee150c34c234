"""Traffic replay: re-drive a bundle's recorded request shapes against a live OpenAI-compatible seat.

A hang that the draft's gather sizes provoke depends on the traffic's *shape* (arrivals, concurrency,
prompt lengths, shared prefixes, max_tokens, sampling), not on its words. So requests are re-sent at
their recorded relative arrival times (scaled by ``speed``), with the raw prompt where the operator
opted into keeping it and otherwise a synthetic prompt of the same token length whose first
``shared_prefix_tokens`` words are common to its prefix group (so the radix cache sees the same sharing).
Synthetic prompts are built from words that are one token in common BPE vocabularies, so the word count
approximates the token count.

It is bounded in count and time, and looks for a bundle that the target seat's watchdog wrote after the
replay started: that is "the hang reproduced". Once one appears the replay stops sending: a hung seat answers
nothing more, so waiting out the time limit would only delay the answer (and keep requests open on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from sgl_seat.errors import UsageError
from sgl_seat.forensics.format.redact import RequestShape
from sgl_seat.forensics.format.store import bundles_in
from sgl_seat.forensics.recording.loadgen import ROUTES, request_body

__all__ = ["TrafficResult", "replay_traffic", "synth_prompt"]

#: Words that are a single token (with their leading space) in GPT-2/Llama/DeepSeek-style vocabularies.
_WORDS = ("the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "was", "with", "as", "at", "by", "be",
          "this", "are", "or", "from", "an", "but", "not", "all", "can", "one", "has", "more", "time", "will")
#: The recorded sampling fields a replayed request carries.
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "seed", "ignore_eos",
             "repetition_penalty")


def _words(seed: str, n: int) -> list[str]:
    rng = random.Random(seed)  # noqa: S311  # deterministic filler words, not a secret
    return [rng.choice(_WORDS) for _ in range(max(0, n))]


def synth_prompt(shape: RequestShape, index: int) -> str:
    """A prompt of ``prompt_tokens`` one-token words; the first ``shared_prefix_tokens`` come from its prefix group."""
    if shape.prompt is not None:
        return shape.prompt
    n = max(1, shape.prompt_tokens)
    shared = min(n, shape.shared_prefix_tokens)
    return " ".join(_words(f"group-{shape.prefix_group}", shared) + _words(f"req-{index}-{shape.prompt_hash}",
                                                                          n - shared))


@dataclass(slots=True)
class TrafficResult:
    """What the replay sent, what came back, and whether the target seat captured a new bundle."""

    target: str
    planned: int
    sent: int = 0
    ok: int = 0
    failed: int = 0
    timed_out: int = 0
    duration_s: float = 0.0
    stopped_early: str | None = None
    statuses: dict[str, int] = field(default_factory=dict)
    new_bundles: list[str] = field(default_factory=list)
    watched: str | None = None

    @property
    def reproduced(self) -> bool | None:
        """True: the target's watchdog captured a bundle during the replay; None: nowhere to look."""
        if self.watched is None:
            return None
        return bool(self.new_bundles)

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "planned": self.planned, "sent": self.sent, "ok": self.ok,
                "failed": self.failed, "timed_out": self.timed_out, "duration_s": round(self.duration_s, 3),
                "stopped_early": self.stopped_early, "statuses": dict(sorted(self.statuses.items())),
                "watched": self.watched, "new_bundles": self.new_bundles, "reproduced": self.reproduced}


def _check_target(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--target {url!r} is not an http(s) URL", fix="e.g. --target http://127.0.0.1:30000")
    return url.rstrip("/")


async def _model_name(client: httpx.AsyncClient) -> str:
    try:
        r = await client.get("/v1/models", timeout=5.0)
        data = r.json().get("data") if r.status_code == 200 else None
        if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
            return str(data[0]["id"])
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return "default"


def _fresh_bundles(watch_dir: Path, before: set[str], started: float) -> list[str]:
    """Bundles in ``watch_dir`` written since the replay started (not among ``before``)."""
    return sorted(str(s.path) for s in bundles_in(watch_dir)
                  if str(s.path) not in before and (s.created or 0.0) >= started - 1.0)


async def _drive(shapes: list[RequestShape], res: TrafficResult, *, base: str, speed: float, max_seconds: float,
                 concurrency: int, request_timeout_s: float, transport: httpx.AsyncBaseTransport | None,
                 reproduced: Callable[[], bool] | None = None) -> None:
    t_start = time.monotonic()
    deadline = t_start + max_seconds
    done = asyncio.Event()
    sem = asyncio.Semaphore(concurrency)
    first = shapes[0].t if shapes else 0.0
    async with httpx.AsyncClient(base_url=base, transport=transport, timeout=request_timeout_s) as client:
        model = await _model_name(client)

        async def one(i: int, s: RequestShape) -> None:
            route = s.route if s.route in ROUTES else "/v1/completions"
            async with sem:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                res.sent += 1
                try:
                    body = request_body(route, synth_prompt(s, i), max_tokens=s.max_tokens or 128, model=model,
                                        stream=s.stream, sampling={k: v for k, v in s.sampling.items()
                                                                   if k in _SAMPLING})
                    timeout = httpx.Timeout(min(request_timeout_s, left))
                    async with client.stream("POST", route, json=body, timeout=timeout) as r:
                        async for _ in r.aiter_bytes():
                            if time.monotonic() > deadline:
                                raise httpx.ReadTimeout("replay time limit reached")
                        key = str(r.status_code)
                        res.statuses[key] = res.statuses.get(key, 0) + 1
                        if r.status_code < 400:
                            res.ok += 1
                        else:
                            res.failed += 1
                except httpx.TimeoutException:
                    res.timed_out += 1
                    res.statuses["timeout"] = res.statuses.get("timeout", 0) + 1
                except httpx.HTTPError as exc:
                    res.failed += 1
                    k = type(exc).__name__
                    res.statuses[k] = res.statuses.get(k, 0) + 1

        async def watch() -> None:
            # Polled off the event loop (a directory listing): the bundle means the hang is back, stop sending.
            while reproduced is not None and not done.is_set():
                if await asyncio.to_thread(reproduced):
                    res.stopped_early = "the target's watchdog wrote a bundle: reproduced, stopped sending"
                    done.set()
                    return
                await asyncio.sleep(0.5)

        watcher = asyncio.create_task(watch())
        tasks: list[asyncio.Task[None]] = []
        for i, s in enumerate(shapes):
            due = t_start + (s.t - first) / speed
            delay = due - time.monotonic()
            if due > deadline:
                res.stopped_early = res.stopped_early or \
                    f"time limit {max_seconds:g} s reached before every request was sent"
                break
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), delay)
            if done.is_set():
                break
            tasks.append(asyncio.create_task(one(i, s)))
        if tasks:
            # Every request answered, the time limit, or the hang reproduced: whichever comes first.
            finished = asyncio.create_task(asyncio.wait(tasks))
            stop = asyncio.create_task(done.wait())
            await asyncio.wait([finished, stop], timeout=max(0.0, deadline - time.monotonic()) + 1.0,
                               return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            stop.cancel()
        for t in tasks:
            if not t.done():
                t.cancel()
                res.stopped_early = res.stopped_early or f"time limit {max_seconds:g} s reached with requests open"
        done.set()
        watcher.cancel()
        await asyncio.gather(*tasks, watcher, return_exceptions=True)
    res.duration_s = time.monotonic() - t_start


def replay_traffic(requests: Sequence[RequestShape], target: str, *, speed: float = 1.0, max_requests: int = 500,
                   max_seconds: float = 300.0, concurrency: int = 256, request_timeout_s: float = 120.0,
                   watch_dir: Path | None = None, watch_grace_s: float = 10.0,
                   transport: httpx.AsyncBaseTransport | None = None) -> TrafficResult:
    """Send up to ``max_requests`` recorded shapes to ``target`` within ``max_seconds``; then check ``watch_dir``."""
    base = _check_target(target)
    if speed <= 0:
        raise UsageError("--speed must be positive", fix="e.g. --speed 1 (recorded pace) or --speed 2 (twice as fast)")
    if not requests:
        raise UsageError("the bundle recorded no requests (requests.jsonl is empty or missing)",
                         fix="traffic replay needs a bundle captured with request recording on")
    shapes = sorted(requests, key=lambda r: r.t)[:max_requests]
    res = TrafficResult(target=base, planned=len(shapes))
    started = time.time()
    before = {str(s.path) for s in bundles_in(watch_dir)} if watch_dir else set()
    wd = watch_dir
    seen = (lambda: bool(_fresh_bundles(wd, before, started))) if wd is not None else None
    asyncio.run(_drive(shapes, res, base=base, speed=speed, max_seconds=max_seconds, concurrency=concurrency,
                       request_timeout_s=request_timeout_s, transport=transport, reproduced=seen))
    if wd is not None:
        res.watched = str(wd)
        end = time.monotonic() + watch_grace_s
        while True:
            fresh = _fresh_bundles(wd, before, started)
            if fresh or time.monotonic() >= end:
                res.new_bundles = fresh
                break
            time.sleep(0.5)
    return res
