"""Load on a live seat: client threads that send requests back to back until stopped, counting what came back.

One generator for everything that keeps a seat busy: the demo's chat traffic, the rigs' and tests' ``/generate`` and
completion clients, the benches' background load. What differs between them is a parameter, not another loop:

- the request: ``send(client, i, n)`` sends worker ``i``'s ``n``-th request (from 1) on the worker's own
  ``httpx.Client`` and returns the answer's completion tokens (0 where the caller does not count them);
  :func:`posting` builds one from a route and a body, :func:`request_body` builds the body of each route;
- how many workers (``concurrency``), their client timeout;
- what counts as a failed request (``failures``: the exceptions ``send`` raises for one) and how long a worker pauses
  after one (``pause_s``: a seat that refuses everything is not hammered);
- how it stops: :meth:`Load.halt` (no new requests, those in flight run on) or :meth:`Load.stop` (halt and wait a
  bounded time for the workers; they are daemon threads, so one stuck in a stalled seat cannot block exit).

Every request goes straight to the seat (``trust_env=False``): never through a proxy named by the environment.
The recorded-shape replay (:mod:`sgl_seat.forensics.recording.traffic`) builds its bodies here too.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import httpx

__all__ = ["ROUTES", "Load", "Send", "answer_tokens", "completion_tokens", "posting", "request_body"]

ROUTES: Final = ("/v1/completions", "/v1/chat/completions", "/generate")
GENERATE: Final = "/generate"
CHAT: Final = "/v1/chat/completions"

#: ``send(client, i, n)``: worker ``i``'s ``n``-th request; the answer's completion tokens; raises for a failure.
Send = Callable[[httpx.Client, int, int], int]
_L = TypeVar("_L", bound="Load")


def request_body(route: str, prompt: str, *, max_tokens: int, model: str = "default", stream: bool | None = None,
                 sampling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of one request to ``route``: SGLang's ``/generate`` (``sampling`` inside ``sampling_params``,
    no model) or an OpenAI route (``sampling`` as top-level fields). ``stream`` None: the field is left out."""
    extra = dict(sampling or {})
    streaming = {} if stream is None else {"stream": stream}
    if route == GENERATE:
        return {"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, **extra}, **streaming}
    if route == CHAT:
        return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                **streaming, **extra}
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, **streaming, **extra}


def completion_tokens(route: str, answer: Mapping[str, Any]) -> int:
    """The completion tokens an answer of ``route`` reports (``meta_info`` on ``/generate``, ``usage`` elsewhere);
    KeyError or TypeError where it reports none."""
    return int(answer["meta_info"]["completion_tokens"] if route == GENERATE else answer["usage"]["completion_tokens"])


def answer_tokens(client: httpx.Client, url: str, route: str, body: Mapping[str, Any]) -> int:
    """POST ``body`` to ``url + route`` (streamed where the body asks for it); a non-2xx answer raises
    ``httpx.HTTPStatusError``; the completion tokens of the answer, or of a stream's last event."""
    if not body.get("stream"):
        r = client.post(f"{url}{route}", json=body)
        r.raise_for_status()
        return completion_tokens(route, r.json())
    last: dict[str, Any] = {}
    with client.stream("POST", f"{url}{route}", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[6:])
    return completion_tokens(route, last)


def posting(url: str, route: str, body: Callable[[int, int], Mapping[str, Any]], *, check: bool = True,
            tokens: bool = False) -> Send:
    """A ``send`` that POSTs ``body(i, n)`` to ``url + route``. ``check``: a non-2xx answer is a failure
    (``httpx.HTTPStatusError``); ``tokens``: read the answer's completion tokens (:func:`answer_tokens`), else 0."""

    def send(c: httpx.Client, i: int, n: int) -> int:
        b = body(i, n)
        if tokens:
            return answer_tokens(c, url, route, b)
        r = c.post(f"{url}{route}", json=b)
        if check:
            r.raise_for_status()
        return 0

    return send


class Load:
    """``concurrency`` worker threads, each sending ``send``'s requests back to back until halted.

    ``ok``, ``failed`` and ``tokens`` count the answered and the failed requests and the answered ones' completion
    tokens; ``events`` is (finish time, tokens) per answered request; ``answered`` is set at the first one.
    """

    def __init__(self, send: Send, *, concurrency: int,
                 failures: tuple[type[BaseException], ...] = (httpx.HTTPError,), pause_s: float = 0.5,
                 timeout: float = 120.0, name: str = "load") -> None:
        self._send = send
        self._failures = failures
        self.pause_s = pause_s
        self.timeout = timeout
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), name=f"{name}-{i}", daemon=True)
                         for i in range(concurrency)]
        self.ok = 0
        self.failed = 0
        self.tokens = 0
        self.events: list[tuple[float, int]] = []
        self.answered = threading.Event()

    @property
    def concurrency(self) -> int:
        return len(self._threads)

    @property
    def started(self) -> bool:
        return any(t.ident is not None for t in self._threads)

    def start(self: _L) -> _L:
        for t in self._threads:
            t.start()
        return self

    def _run(self, i: int) -> None:
        n = 0
        with httpx.Client(timeout=self.timeout, trust_env=False) as c:
            while not self._stop.is_set():
                n += 1
                try:
                    toks = self._send(c, i, n)
                except self._failures:
                    with self._lock:
                        self.failed += 1
                    self._stop.wait(self.pause_s)
                    continue
                with self._lock:
                    self.ok += 1
                    self.tokens += toks
                    self.events.append((time.time(), toks))
                self.answered.set()

    def halt(self) -> None:
        """No new requests from now on (those in flight run on)."""
        self._stop.set()

    def stop(self, join_s: float = 30.0) -> None:
        """Halt and wait up to ``join_s`` in all for the workers."""
        self._stop.set()
        deadline = time.monotonic() + join_s
        for t in self._threads:
            if t.ident is not None:  # started
                t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self: _L) -> _L:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(self.timeout + 10.0)  # a request in flight ends by its client timeout

    def wait_ok(self, n: int, timeout: float) -> bool:
        """Wait up to ``timeout`` for ``n`` more answered requests than there are now."""
        with self._lock:
            want = self.ok + n
        deadline = time.monotonic() + timeout
        while self.ok < want:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
        return True

    def tokens_between(self, t0: float, t1: float) -> int:
        """Completion tokens of the requests answered between wall times ``t0`` and ``t1``."""
        with self._lock:
            return sum(k for t, k in self.events if t0 <= t < t1)

    def to_json(self) -> dict[str, int]:
        with self._lock:
            return {"concurrency": len(self._threads), "requests_ok": self.ok, "requests_failed": self.failed,
                    "completion_tokens": self.tokens}
