"""`demo` against a seat that answers badly: one EngineError naming the URL, never a traceback, and the seat
is still taken down. The "seat" is a tiny HTTP server on 127.0.0.1 in this process (up/down are faked)."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.cli.main import main
from sgl_seat.errors import EngineError
from sgl_seat.launch import demo
from sgl_seat.launch.home import HOME_ENV
from sgl_seat.launch.record import SeatRecord
from sgl_seat.launch.state import SeatState

GOOD = b'{"choices": [{"message": {"role": "assistant", "content": "a cache"}}], "usage": {"completion_tokens": 2}}'

# path -> (status, body, delay before answering)
ANSWERS: dict[str, tuple[int, bytes, float]] = {
    "/good": (200, GOOD, 0.0),
    "/garbage": (200, b"<html>\x00not json", 0.0),
    "/wrong-shape": (200, b'{"choices": []}', 0.0),
    "/list": (200, b"[1, 2]", 0.0),
    "/null-content": (200, b'{"choices": [{"message": {"content": null}}]}', 0.0),
    "/error": (500, b"internal error", 0.0),
    "/slow": (200, GOOD, 2.0),
}


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        status, body, delay = ANSWERS[self.path.removesuffix("/v1/chat/completions")]
        time.sleep(delay)
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_good_answer(server: str) -> None:
    a = demo.ask(f"{server}/good", "m", "q")
    assert (a.text, a.completion_tokens) == ("a cache", 2)


@pytest.mark.parametrize(("path", "needle"), [
    ("/garbage", "is not an OpenAI chat completion"),
    ("/wrong-shape", "is not an OpenAI chat completion"),
    ("/list", "is not an OpenAI chat completion"),
    ("/null-content", "wrong type"),
    ("/error", "HTTP 500 internal error"),
])
def test_bad_answers_are_one_engine_error(server: str, path: str, needle: str) -> None:
    with pytest.raises(EngineError) as ei:
        demo.ask(f"{server}{path}", "m", "q")
    assert needle in str(ei.value) and f"{server}{path}/v1/chat/completions" in str(ei.value)
    assert "sgl-seat logs" in str(ei.value)


def test_timeout_and_refused_connection_are_engine_errors(server: str) -> None:
    with pytest.raises(EngineError, match="ReadTimeout"):
        demo.ask(f"{server}/slow", "m", "q", timeout=0.3)
    with socket.socket() as held:  # bound, never listening: connections to it are refused
        held.bind(("127.0.0.1", 0))
        with pytest.raises(EngineError, match="ConnectError"):
            demo.ask(f"http://127.0.0.1:{held.getsockname()[1]}", "m", "q", timeout=5)


def _fake_seat(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> list[str]:
    downs: list[str] = []
    rec = SeatRecord(name="demo-seat", state=SeatState.READY, engine="sim", draft=True, cluster_address="local",
                     namespace="n", pg_name="p", endpoint=endpoint)
    monkeypatch.setattr(demo, "up", lambda spec, opts, reporter: (rec, None))
    monkeypatch.setattr(demo, "down", lambda name, reporter: downs.append(name))
    return downs


def test_demo_takes_the_seat_down_when_the_seat_answers_garbage(server: str, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    downs = _fake_seat(monkeypatch, f"{server}/garbage")
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "demo"])
    with pytest.raises(SystemExit) as ei:
        main()
    err = capsys.readouterr().err
    assert ei.value.code == 1 and "error: chat request to" in err and "Traceback" not in err
    assert downs == ["demo-seat"]


def test_demo_json_prints_the_answers_alone_on_stdout(server: str, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    downs = _fake_seat(monkeypatch, f"{server}/good")
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "demo", "--json"])
    with pytest.raises(SystemExit) as ei:
        main()
    assert ei.value.code == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["seat"] == "demo-seat" and doc["endpoint"] == f"{server}/good" and doc["draft"] is True
    assert [a["prompt"] for a in doc["answers"]] == list(demo.PROMPTS)
    assert all(a["text"] == "a cache" and a["completion_tokens"] == 2 for a in doc["answers"])
    assert "is READY at" in err and "taking the seat down" in err  # progress on stderr
    assert downs == ["demo-seat"]
