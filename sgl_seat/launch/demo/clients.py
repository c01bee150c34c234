"""The demo's clients: one chat question, and the background traffic that the injected stall interrupts.

Every request goes straight to the seat's endpoint (``trust_env=False``: never through a proxy named by the
environment); any failure of a question is one :class:`~sgl_seat.errors.EngineError` naming the URL.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx

from sgl_seat.errors import EngineError


@dataclass(frozen=True, slots=True)
class Answer:
    prompt: str
    text: str
    completion_tokens: int | None


def ask(endpoint: str, model: str, prompt: str, *, max_tokens: int = 48, timeout: float = 60.0,
        client: httpx.Client | None = None) -> Answer:
    """One non-streaming chat completion against ``endpoint``; any failure is one EngineError."""
    url = f"{endpoint}/v1/chat/completions"
    fix = "see `sgl-seat logs --node 0` (the demo takes the seat down either way)"
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}
    try:
        # The seat's endpoint is reached directly, never through a proxy from the environment.
        r = (client.post(url, json=body, timeout=timeout) if client is not None
             else httpx.post(url, timeout=timeout, trust_env=False, json=body))
    except httpx.HTTPError as exc:
        raise EngineError(f"chat request to {url} failed: {type(exc).__name__}: {exc}", fix=fix) from None
    if r.status_code != 200:
        raise EngineError(f"chat request to {url} failed: HTTP {r.status_code} {r.text[:200]}", fix=fix)
    try:
        doc = r.json()
        usage = doc.get("usage") or {}
        text = doc["choices"][0]["message"]["content"]
        tokens = usage.get("completion_tokens")
    except (ValueError, LookupError, TypeError, AttributeError) as exc:
        raise EngineError(f"chat request to {url}: the answer is not an OpenAI chat completion "
                          f"({type(exc).__name__}: {exc}); it began: {r.text[:200]!r}", fix=fix) from None
    if not isinstance(text, str) or not (tokens is None or isinstance(tokens, int)):
        raise EngineError(f"chat request to {url}: the answer's content or usage has the wrong type; "
                          f"it began: {r.text[:200]!r}", fix=fix)
    return Answer(prompt, text, tokens)


class Load:
    """``concurrency`` threads sending chat completions back to back until :meth:`stop` (the traffic the
    stall interrupts). Requests caught by the stall stay in flight until it is released or the seat goes."""

    def __init__(self, endpoint: str, model: str, *, concurrency: int, max_tokens: int = 16) -> None:
        self.endpoint, self.model, self.max_tokens = endpoint, model, max_tokens
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), name=f"sgl-seat-demo-load-{i}", daemon=True)
                         for i in range(concurrency)]
        self.ok = 0
        self.answered = threading.Event()  # set at the first completed request
        self.failed = 0
        self.tokens = 0

    @property
    def started(self) -> bool:
        return any(t.ident is not None for t in self._threads)

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def _run(self, i: int) -> None:
        n = 0
        with httpx.Client(trust_env=False) as c:
            while not self._stop.is_set():
                n += 1
                try:
                    a = ask(self.endpoint, self.model, f"demo load {i}.{n}: say something", client=c,
                            max_tokens=self.max_tokens, timeout=120.0)
                except EngineError:
                    with self._lock:
                        self.failed += 1
                    self._stop.wait(0.5)
                    continue
                with self._lock:
                    self.ok += 1
                    self.tokens += a.completion_tokens or 0
                self.answered.set()

    def halt(self) -> None:
        """No new requests from now on (those in flight run on)."""
        self._stop.set()

    def stop(self, join_s: float) -> None:
        """Halt and wait up to ``join_s`` for the clients (daemon threads: one stuck in a stall cannot block exit)."""
        self._stop.set()
        deadline = time.monotonic() + join_s
        for t in self._threads:
            if t.ident is not None:  # started
                t.join(max(0.0, deadline - time.monotonic()))

    def to_json(self) -> dict[str, int]:
        with self._lock:
            return {"concurrency": len(self._threads), "requests_ok": self.ok, "requests_failed": self.failed,
                    "completion_tokens": self.tokens}
