"""Recording request shapes on the seat side, for ``requests.jsonl`` and traffic replay.

Whatever serves the seat's HTTP API (the sim engine's server, or a proxy in front of SGLang) calls
:meth:`RequestRecorder.observe` with each request body as it arrives and :meth:`RequestRecorder.finish`
when it completes; the capture asks :meth:`RequestRecorder.encode` for the last ``history_s`` seconds.
Bodies are redacted on the way in (:class:`~sgl_seat.forensics.redact.Redactor`): the recorder never
holds prompt text unless the seat spec sets ``bundles.raw_prompts``. Memory is bounded by ``capacity``.
Thread-safe: HTTP handlers run concurrently.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sgl_seat.forensics.codec import encode_records
from sgl_seat.forensics.redact import Redactor, RequestShape

__all__ = ["RequestRecorder", "prompt_of"]

#: Sampling parameters worth replaying (numbers, booleans, short strings); everything else is dropped.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                 "repetition_penalty", "seed", "ignore_eos", "n")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def prompt_of(route: str, body: Mapping[str, Any]) -> str:
    """The prompt text of an OpenAI completions/chat or SGLang /generate body ("" if it has none)."""
    if "messages" in body and isinstance(body["messages"], list):
        return "\n".join(f"{m.get('role', '')}: {_text(m.get('content'))}" for m in body["messages"]
                         if isinstance(m, dict))
    for key in ("prompt", "text"):
        v = body.get(key)
        if isinstance(v, str):
            return v
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            return "\n".join(v)
    return ""


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


class RequestRecorder:
    """A bounded, redacting ring of recent request shapes."""

    def __init__(self, *, raw_prompts: bool = False, salt: bytes | None = None, capacity: int = 20_000,
                 history_s: float = 300.0) -> None:
        self.redactor = Redactor(raw_prompts=raw_prompts, salt=salt)
        self.capacity = capacity
        self.history_s = history_s
        self._lock = threading.Lock()
        self._shapes: OrderedDict[int, RequestShape] = OrderedDict()
        self._next = 0

    def observe(self, route: str, body: Mapping[str, Any], *, t: float | None = None,
                prompt_tokens: int | None = None) -> int:
        """Record one arriving request; returns a handle for :meth:`finish`."""
        sp = body.get("sampling_params")
        params: dict[str, Any] = dict(sp) if isinstance(sp, dict) else {}
        merged = {**params, **body}
        max_tokens = _int(merged.get("max_tokens")) or _int(merged.get("max_completion_tokens")) or _int(
            merged.get("max_new_tokens"))
        sampling = {k: merged[k] for k in SAMPLING_KEYS
                    if isinstance(merged.get(k), (int, float, bool)) or (isinstance(merged.get(k), str)
                                                                          and len(merged[k]) <= 64)}
        with self._lock:
            shape = self.redactor.shape(t=time.time() if t is None else t, route=route,
                                        prompt=prompt_of(route, body), prompt_tokens=prompt_tokens,
                                        max_tokens=max_tokens, sampling=sampling, stream=bool(body.get("stream")))
            handle = self._next
            self._next += 1
            self._shapes[handle] = shape
            while len(self._shapes) > self.capacity:
                self._shapes.popitem(last=False)
        return handle

    def finish(self, handle: int, *, output_tokens: int | None = None, prompt_tokens: int | None = None,
               t: float | None = None) -> None:
        """Mark a request done, with the engine's token counts where it reported them."""
        with self._lock:
            s = self._shapes.get(handle)
            if s is None:
                return
            self._shapes[handle] = replace(
                s, finished=time.time() if t is None else t, output_tokens=output_tokens,
                prompt_tokens=prompt_tokens if prompt_tokens is not None else s.prompt_tokens,
                tokens_estimated=s.tokens_estimated and prompt_tokens is None)

    def snapshot(self, *, now: float | None = None) -> list[RequestShape]:
        """The shapes that arrived in the last ``history_s`` seconds, oldest first."""
        cutoff = (time.time() if now is None else now) - self.history_s
        with self._lock:
            return [s for s in self._shapes.values() if s.t >= cutoff]

    def encode(self, *, now: float | None = None) -> bytes:
        """``requests.jsonl`` for a bundle."""
        return encode_records(self.snapshot(now=now))

    @property
    def redaction(self) -> dict[str, Any]:
        """The manifest's ``redaction`` fields for bundles that carry this recorder's shapes."""
        return {"prompts": "raw" if self.redactor.raw_prompts else "redacted", "salt_id": self.redactor.salt_id}
