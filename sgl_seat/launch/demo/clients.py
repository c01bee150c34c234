"""The demo's clients: one chat question, and the background traffic that the injected stall interrupts.

Every request goes straight to the seat's endpoint (``trust_env=False``: never through a proxy named by the
environment); any failure of a question is one :class:`~sgl_seat.errors.EngineError` naming the URL. The
background traffic is the library's load generator (:mod:`sgl_seat.forensics.recording.loadgen`) asking these
questions.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from sgl_seat.errors import EngineError
from sgl_seat.forensics.recording import loadgen


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
    body = loadgen.request_body("/v1/chat/completions", prompt, model=model, max_tokens=max_tokens,
                                sampling={"temperature": 0})
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


class Load(loadgen.Load):
    """``concurrency`` threads sending chat completions back to back until :meth:`stop` (the traffic the
    stall interrupts). Requests caught by the stall stay in flight until it is released or the seat goes."""

    def __init__(self, endpoint: str, model: str, *, concurrency: int, max_tokens: int = 16) -> None:
        self.endpoint, self.model, self.max_tokens = endpoint, model, max_tokens
        super().__init__(self._ask, concurrency=concurrency, failures=(EngineError,), pause_s=0.5, timeout=120.0,
                         name="sgl-seat-demo-load")

    def _ask(self, c: httpx.Client, i: int, n: int) -> int:
        a = ask(self.endpoint, self.model, f"demo load {i}.{n}: say something", client=c, max_tokens=self.max_tokens,
                timeout=120.0)
        return a.completion_tokens or 0
