"""Recording request shapes on the seat side, for ``requests.jsonl`` and traffic replay.

Two ways in:

- SGLang's own request log (``--log-requests --log-requests-format json``, what the plan turns on for node 0
  while the watchdog runs): the node-0 sidecar follows it (:mod:`sgl_seat.forensics.recording.requestlog`) and hands
  each event to :meth:`RequestRecorder.ingest`. At ``--log-requests-level 1`` (the default plan) the events
  carry sampling parameters, ``stream``, and on finishing the engine's ``prompt_tokens``,
  ``completion_tokens``, ``cached_tokens`` and ``e2e_latency``, but no text: shapes then have no hash, the
  token counts are the engine's, and the shared prefix is the engine's cache hit (``cached_tokens``); every
  request with a cache hit joins one prefix group, so a replay re-creates hits of the same sizes. A request
  still open when the capture runs has no token count yet: it gets the median of the others (marked
  estimated). At level 2-3 (``bundles.raw_prompts``) the text is there and is hashed for prefix groups;
  OpenAI routes log their raw payload first (``request.received.openai``), which is matched to the
  request that follows it. Health checks (``HEALTH_CHECK*`` rids) are skipped.
- A proxy or server in front of the engine calls :meth:`RequestRecorder.observe` with each request body as it
  arrives and :meth:`RequestRecorder.finish` when it completes.

The capture asks :meth:`RequestRecorder.encode` (or :meth:`snapshot`) for the last ``history_s`` seconds.
Requests are redacted on the way in (:class:`~sgl_seat.forensics.format.redact.Redactor`): the recorder never
keeps prompt text unless the seat spec sets ``bundles.raw_prompts``. Memory is bounded by ``capacity``.
Thread-safe: HTTP handlers run concurrently.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sgl_seat.forensics.format.codec import encode_records
from sgl_seat.forensics.format.redact import Redactor, RequestShape

__all__ = ["EVENT_FINISHED", "EVENT_RECEIVED", "EVENT_RECEIVED_OPENAI", "RequestRecorder", "prompt_of"]

#: Sampling parameters worth replaying (numbers, booleans, short strings); everything else is dropped.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                 "repetition_penalty", "seed", "ignore_eos", "n")
#: SGLang's sampling_params spell some keys their own way.
_SAMPLING_ALIASES = {"sampling_seed": "seed"}

# SGLang 0.5.23's request-log events (sglang/srt/utils/request_logger.py).
EVENT_RECEIVED = "request.received"
EVENT_RECEIVED_OPENAI = "request.received.openai"
EVENT_FINISHED = "request.finished"
#: SGLang's rid prefix of its own health-check generations (not traffic).
HEALTH_CHECK_PREFIX = "HEALTH_CHECK"
#: An OpenAI payload is matched to a request that arrives within this many seconds after it.
OPENAI_MATCH_S = 30.0


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


def _sampling(params: Mapping[str, Any]) -> dict[str, float | int | bool | str]:
    out: dict[str, float | int | bool | str] = {}
    for key, v in params.items():
        k = _SAMPLING_ALIASES.get(key, key)
        if k in SAMPLING_KEYS and (isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= 64)):
            out[k] = v
    return out


def event_time(doc: Mapping[str, Any], default: float) -> float:
    """An event's ``timestamp`` (SGLang: ``datetime.now().isoformat()``, the node's local time) as epoch s."""
    ts = doc.get("timestamp")
    if isinstance(ts, str) and len(ts) <= 64:
        try:
            return datetime.fromisoformat(ts).timestamp()
        except ValueError:
            pass
    return default


def _token_ids(v: Any) -> int | None:
    """len(input_ids) when the log holds the whole list (level 2 cuts long ones around "...")."""
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return len(v)
    return None


@dataclass(frozen=True, slots=True)
class _OpenAIPending:
    t: float
    shape: RequestShape
    max_tokens: int | None
    stream: bool


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
        self._by_rid: OrderedDict[str, int] = OrderedDict()
        self._openai: deque[_OpenAIPending] = deque(maxlen=1024)
        self._cache_group: int | None = None
        self.events = 0
        self.ignored = 0

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
            handle = self._add(shape)
        return handle

    def _add(self, shape: RequestShape, rid: str | None = None) -> int:
        handle = self._next
        self._next += 1
        self._shapes[handle] = shape
        if rid is not None:
            self._by_rid[rid] = handle
        while len(self._shapes) > self.capacity:
            self._shapes.popitem(last=False)
        while len(self._by_rid) > self.capacity:
            self._by_rid.popitem(last=False)
        return handle

    # ---- SGLang's request log ------------------------------------------------------------------

    def ingest(self, doc: Mapping[str, Any], *, now: float | None = None) -> bool:
        """One event of SGLang's JSON request log; False if it is not one the recorder uses."""
        event = doc.get("event")
        t = event_time(doc, time.time() if now is None else now)
        with self._lock:
            self.events += 1
            if event == EVENT_RECEIVED_OPENAI:
                ok = self._openai_payload(doc, t)
            elif event == EVENT_RECEIVED:
                ok = self._received(doc, t) is not None
            elif event == EVENT_FINISHED:
                ok = self._finished(doc, t)
            else:
                ok = False
            if not ok:
                self.ignored += 1
            return ok

    def _openai_payload(self, doc: Mapping[str, Any], t: float) -> bool:
        obj = doc.get("obj")
        if not isinstance(obj, dict):
            return False
        route = "/v1/chat/completions" if "messages" in obj else "/v1/completions"
        text = prompt_of(route, obj)
        mx = _int(obj.get("max_completion_tokens")) or _int(obj.get("max_tokens"))
        # Redacted at once: the text is hashed here and only kept raw when the operator opted in.
        shape = self.redactor.shape(t=t, route=route, prompt=text or None, prompt_tokens=None, max_tokens=mx,
                                    sampling=_sampling(obj), stream=bool(obj.get("stream")))
        self._openai.append(_OpenAIPending(t, shape, mx, bool(obj.get("stream"))))
        return True

    def _match_openai(self, t: float, max_tokens: int | None, stream: bool) -> RequestShape | None:
        while self._openai and self._openai[0].t < t - OPENAI_MATCH_S:
            self._openai.popleft()
        for i, p in enumerate(self._openai):
            if p.stream == stream and (p.max_tokens is None or p.max_tokens == max_tokens) and p.t <= t + 1.0:
                del self._openai[i]
                return p.shape
        return None

    def _received(self, doc: Mapping[str, Any], t: float) -> int | None:
        rid, obj = doc.get("rid"), doc.get("obj")
        if not isinstance(rid, str) or not isinstance(obj, dict) or rid.startswith(HEALTH_CHECK_PREFIX):
            return None
        if rid in self._by_rid:
            return self._by_rid[rid]
        sp = obj.get("sampling_params")
        params: dict[str, Any] = sp if isinstance(sp, dict) else {}
        max_tokens = _int(params.get("max_new_tokens"))
        stream = bool(obj.get("stream"))
        text = obj.get("text") if isinstance(obj.get("text"), str) else None
        ids = _token_ids(obj.get("input_ids"))
        pending = self._match_openai(t, max_tokens, stream) if obj.get("return_text_in_logprobs") is True else None
        if pending is not None:
            shape = replace(pending, t=t, max_tokens=max_tokens, sampling=_sampling(params), stream=stream,
                            prompt_tokens=ids if ids is not None else pending.prompt_tokens,
                            tokens_estimated=ids is None)
        else:
            # OpenAI adapters set return_text_in_logprobs; which of the two routes is not in the log.
            route = "/v1/completions" if obj.get("return_text_in_logprobs") is True else "/generate"
            shape = self.redactor.shape(t=t, route=route, prompt=text, prompt_tokens=ids, max_tokens=max_tokens,
                                        sampling=_sampling(params), stream=stream)
        return self._add(shape, rid)

    def _finished(self, doc: Mapping[str, Any], t: float) -> bool:
        rid, out = doc.get("rid"), doc.get("out")
        meta = out.get("meta_info") if isinstance(out, dict) else None
        if not isinstance(rid, str) or not isinstance(meta, dict) or rid.startswith(HEALTH_CHECK_PREFIX):
            return False
        handle = self._by_rid.get(rid)
        if handle is None or handle not in self._shapes:
            # It arrived before the recorder started reading: its arrival is the finish less its latency.
            e2e = meta.get("e2e_latency")
            arrived = t - float(e2e) if isinstance(e2e, (int, float)) and 0 <= e2e < 86_400 else t
            handle = self._received(doc, arrived)
            if handle is None:
                return False
        s = self._shapes[handle]
        pt, ct, cached = _int(meta.get("prompt_tokens")), _int(meta.get("completion_tokens")), _int(
            meta.get("cached_tokens"))
        group = s.prefix_group
        if cached and not s.prompt_hash:  # no text: the cache hit is the only sign of a shared prefix
            if self._cache_group is None:
                self._cache_group = self.redactor.prefixes.new_group()
            group = self._cache_group
        self._shapes[handle] = replace(
            s, finished=t, output_tokens=ct, prompt_tokens=pt if pt is not None else s.prompt_tokens,
            tokens_estimated=s.tokens_estimated and pt is None, prefix_tokens=cached, prefix_group=group)
        return True

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
            shapes = [s for s in self._shapes.values() if s.t >= cutoff]
        known = [s.prompt_tokens for s in shapes if not s.tokens_estimated]
        if known and any(s.tokens_estimated and not s.prompt_hash for s in shapes):
            med = max(1, round(statistics.median(known)))
            shapes = [replace(s, prompt_tokens=med) if s.tokens_estimated and not s.prompt_hash else s
                      for s in shapes]
        return shapes

    def encode(self, *, now: float | None = None) -> bytes:
        """``requests.jsonl`` for a bundle."""
        return encode_records(self.snapshot(now=now))

    @property
    def redaction(self) -> dict[str, Any]:
        """The manifest's ``redaction`` fields for bundles that carry this recorder's shapes."""
        return {"prompts": "raw" if self.redactor.raw_prompts else "redacted", "salt_id": self.redactor.salt_id}
