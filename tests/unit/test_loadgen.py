"""The one load generator: the bodies it builds per route, what it counts, how failures pause it, how it stops."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest

from sgl_seat.forensics.recording.loadgen import Load, answer_tokens, posting, request_body


class _Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        _Handler.seen.append((self.path, body))
        if self.path.startswith("/fail"):
            self._send(500, b"no")
        elif self.path == "/generate" and body.get("stream"):
            events = [{"text": "a", "meta_info": {"completion_tokens": 1}},
                      {"text": "a b", "meta_info": {"completion_tokens": 2}}]
            data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
            self._send(200, data, "text/event-stream")
        elif self.path == "/generate":
            self._send(200, json.dumps({"text": "a b c", "meta_info": {"completion_tokens": 3}}).encode())
        else:
            self._send(200, json.dumps({"choices": [{"text": "x"}], "usage": {"completion_tokens": 4}}).encode())

    def _send(self, status: int, data: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with ThreadingHTTPServer(("127.0.0.1", 0), _Handler) as srv:  # its handler threads are daemons
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{srv.server_address[1]}"
        srv.shutdown()


def test_the_body_of_each_route() -> None:
    assert request_body("/generate", "hi", max_tokens=8, sampling={"ignore_eos": True}) == {
        "text": "hi", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
    assert request_body("/generate", "hi", max_tokens=8, stream=True) == {
        "text": "hi", "sampling_params": {"max_new_tokens": 8}, "stream": True}
    assert request_body("/v1/completions", "hi", max_tokens=8, model="m", stream=False,
                        sampling={"temperature": 0}) == {
        "model": "m", "prompt": "hi", "max_tokens": 8, "stream": False, "temperature": 0}
    assert request_body("/v1/chat/completions", "hi", max_tokens=8, model="m") == {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_answer_tokens_read_a_plain_and_a_streamed_answer(server: str) -> None:
    with httpx.Client(trust_env=False, timeout=10) as c:
        assert answer_tokens(c, server, "/generate", request_body("/generate", "q", max_tokens=3)) == 3
        assert answer_tokens(c, server, "/generate", request_body("/generate", "q", max_tokens=3, stream=True)) == 2
        assert answer_tokens(c, server, "/v1/completions", request_body("/v1/completions", "q", max_tokens=4)) == 4
        with pytest.raises(httpx.HTTPStatusError):
            answer_tokens(c, server, "/fail", {"prompt": "q"})


def test_a_load_counts_answers_and_tokens_and_stops(server: str) -> None:
    _Handler.seen.clear()
    load = Load(posting(server, "/generate", lambda i, n: request_body("/generate", f"w{i}.{n}", max_tokens=3),
                        tokens=True), concurrency=3, name="t-load")
    with load:
        assert load.answered.wait(10) and load.wait_ok(6, 10)
        # Every worker has sent its first request (under load one thread can start after the others' six answers).
        deadline = time.monotonic() + 10
        while not {"w0.1", "w1.1", "w2.1"} <= {b["text"] for _, b in list(_Handler.seen)} \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(t.name for t in threading.enumerate() if t.name.startswith("t-load-")) == [
            "t-load-0", "t-load-1", "t-load-2"]
    assert not [t for t in threading.enumerate() if t.name.startswith("t-load-")]
    assert load.failed == 0 and load.ok >= 6 and load.tokens == 3 * load.ok == sum(k for _, k in load.events)
    assert load.tokens_between(0.0, time.time() + 1) == load.tokens
    assert load.to_json() == {"concurrency": 3, "requests_ok": load.ok, "requests_failed": 0,
                              "completion_tokens": load.tokens}
    prompts = {b["text"] for _, b in _Handler.seen}
    assert {"w0.1", "w1.1", "w2.1", "w0.2"} <= prompts  # worker i's n-th request, n from 1


def test_a_failed_request_is_counted_and_pauses_its_worker(server: str) -> None:
    load = Load(posting(server, "/fail", lambda i, n: {"n": n}), concurrency=1, pause_s=0.3).start()
    time.sleep(1.0)
    load.stop(5)
    assert load.ok == 0 and 2 <= load.failed <= 5, load.failed  # one try per pause, not a tight loop
    unchecked = Load(posting(server, "/fail", lambda i, n: {"n": n}, check=False), concurrency=1).start()
    assert unchecked.wait_ok(2, 10)  # an answer of any status is taken where the caller does not check it
    unchecked.stop(5)
    assert unchecked.failed == 0


def test_halt_stops_new_requests_and_an_unstarted_load_stops_at_once() -> None:
    calls: list[int] = []

    def send(c: httpx.Client, i: int, n: int) -> int:
        calls.append(n)
        time.sleep(0.05)
        return 1

    load = Load(send, concurrency=1).start()
    assert load.wait_ok(2, 10)
    load.halt()
    time.sleep(0.2)
    n = len(calls)
    time.sleep(0.2)
    assert len(calls) == n and load.started
    idle = Load(send, concurrency=2)
    t0 = time.monotonic()
    idle.stop(10)
    assert not idle.started and time.monotonic() - t0 < 1.0
