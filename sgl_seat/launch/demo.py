"""The README's first command: bring a seat up with the draft on, ask it a few questions, take it down.

`down` runs in ``finally``: the demo never leaves a seat behind, even when a request fails or
the user presses Ctrl-C.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from sgl_seat.errors import EngineError
from sgl_seat.launch.stages import Reporter
from sgl_seat.launch.teardown import down
from sgl_seat.launch.up import UpOptions, up
from sgl_seat.spec import SeatSpec

PROMPTS = (
    "In one sentence, what is a KV cache?",
    "Why can speculative decoding lower throughput on a shared server?",
    "Name one reason a multi-node launch hangs at startup.",
)


@dataclass(frozen=True, slots=True)
class Answer:
    prompt: str
    text: str
    completion_tokens: int | None


def ask(endpoint: str, model: str, prompt: str, *, max_tokens: int = 48, timeout: float = 60.0) -> Answer:
    """One non-streaming chat completion against ``endpoint``; any failure is one EngineError."""
    url = f"{endpoint}/v1/chat/completions"
    fix = "see `sgl-seat logs --node 0` (the demo takes the seat down either way)"
    try:
        # The seat's endpoint is reached directly, never through a proxy from the environment.
        r = httpx.post(url, timeout=timeout, trust_env=False, json={
            "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0,
        })
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


@dataclass(frozen=True, slots=True)
class DemoResult:
    seat: str
    endpoint: str
    answers: list[Answer]

    def to_json(self) -> dict[str, Any]:
        return {"seat": self.seat, "endpoint": self.endpoint, "draft": True,
                "answers": [{"prompt": a.prompt, "text": a.text, "completion_tokens": a.completion_tokens}
                            for a in self.answers]}


def run_demo(spec: SeatSpec, *, reporter: Reporter | None, say: Callable[[str], None],
             prompts: Sequence[str] = PROMPTS, timeout: float = 600.0) -> DemoResult:
    """`up --draft on`, ask ``prompts``, print the answers through ``say``, and always `down`."""
    answers: list[Answer] = []
    rec, _ = up(spec, UpOptions(draft=True, timeout=timeout), reporter)
    endpoint = rec.endpoint or ""
    try:
        say(f"seat {rec.name} is READY at {endpoint} (draft on)")
        if spec.engine == "sim":
            say("(the sim engine answers with deterministic synthetic tokens, not a model: it exercises SGLang's"
                " wire contract, not language)")
        for p in prompts:
            a = ask(endpoint, spec.model.name, p)
            answers.append(a)
            say(f"\n> {a.prompt}\n{a.text}  [{a.completion_tokens} tokens]")
    finally:
        say("\ntaking the seat down")
        down(rec.name, reporter)
    return DemoResult(rec.name, endpoint, answers)
