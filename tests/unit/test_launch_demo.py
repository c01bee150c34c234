"""`demo` at its seams, without Ray: `up`/`down` are faked and the "seat" is a tiny HTTP server on 127.0.0.1 in
this process, serving the chat route and the sim's fault route. Where the fault route arms the stall, the fake
copies the golden stall bundle into the bundles directory, as the seat's sidecars would write one; the rest
(traffic, the injection request, the wait, verification, replay, HTML, the JSON document) is the demo's code.

- a seat that answers badly: one EngineError naming the URL, never a traceback, and the seat still taken down;
- the whole run: the rank-3 stall posted to the node of rank 3, JSON alone on stdout, the stall released and
  the seat taken down once;
- no bundle, or Ctrl-C while waiting: the stall released, the seat taken down, the error (or 130) shown;
- a seat the demo cannot stall (not the sim, no rank 3) is refused before anything starts.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from sgl_seat.cli.main import main
from sgl_seat.engines.sim import NODE_PORT_ENV
from sgl_seat.errors import EngineError, UsageError
from sgl_seat.forensics.format.store import wait_for_bundle
from sgl_seat.launch.demo import clients as demo_traffic
from sgl_seat.launch.demo import run as demo
from sgl_seat.launch.seatrecord.home import HOME_ENV, host_id
from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.stages import WARN, Stage, StageTimes
from sgl_seat.netports import held
from sgl_seat.plan import build_plan
from sgl_seat.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
STALL_BUNDLE = ROOT / "tests" / "fixtures" / "bundles" / "stall"

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


class FakeSeat:
    """What the fake fault route saw, and where it "captures" (None: it arms the stall and nothing is captured)."""

    calls: ClassVar[list[tuple[str, Any]]] = []
    bundles: ClassVar[Path | None] = None


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/sim/faults":
            self._fault("POST", json.loads(body))
            return
        status, data, delay = ANSWERS[self.path.removesuffix("/v1/chat/completions")]
        time.sleep(delay)
        self._send(status, data)

    def do_DELETE(self) -> None:
        self._fault("DELETE", None)

    def _fault(self, method: str, body: Any) -> None:
        FakeSeat.calls.append((method, body))
        if method == "POST" and FakeSeat.bundles is not None:  # the sidecars write a bundle: dot-named, renamed
            tmp = FakeSeat.bundles / ".tmp-stall"
            shutil.copytree(STALL_BUNDLE, tmp)
            tmp.rename(FakeSeat.bundles / "stall")
        self._send(200, b'{"node_rank": 1}')

    def _send(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up (the demo's `down`)
            super().handle_error(request, client_address)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_good_answer(server: str) -> None:
    a = demo_traffic.ask(f"{server}/good", "m", "q")
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
        demo_traffic.ask(f"{server}{path}", "m", "q")
    assert needle in str(ei.value) and f"{server}{path}/v1/chat/completions" in str(ei.value)
    assert "sgl-seat logs" in str(ei.value)


def test_timeout_and_refused_connection_are_engine_errors(server: str) -> None:
    with pytest.raises(EngineError, match="ReadTimeout"):
        demo_traffic.ask(f"{server}/slow", "m", "q", timeout=0.3)
    # bound, never listening: connections to it are refused
    with held() as port, pytest.raises(EngineError, match="ConnectError"):
        demo_traffic.ask(f"http://127.0.0.1:{port}", "m", "q", timeout=5)


def _fake_seat(monkeypatch: pytest.MonkeyPatch, server: str, path: str, tmp_path: Path,
               up_stages: tuple[tuple[str, str], ...] = ()) -> list[str]:
    """`up` returns a READY local-sim record whose node 1 (ranks 2-3) has its fault route on ``server``."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setattr(demo, "QUICK_WARM_S", 0.3)
    FakeSeat.calls = []
    FakeSeat.bundles = None
    port = int(server.rsplit(":", 1)[1])
    spec = load_spec("local-sim")  # without its model config: the capacity model is not what is tested here
    plan = build_plan(spec.model_copy(update={"model": spec.model.model_copy(update={"config": None})}), draft=True)
    plan = replace(plan, nodes=tuple(
        replace(n, env=tuple(sorted({**n.env_dict(), NODE_PORT_ENV: str(port - 2)}.items()))) if n.node_rank == 1
        else n for n in plan.nodes))
    rec = SeatRecord(name="demo-seat", state=SeatState.READY, engine="sim", draft=True, cluster_address="local",
                     namespace="n", pg_name="p", endpoint=f"{server}{path}", plan=plan.to_json(),
                     bundles_dir=str(tmp_path / "bundles"),
                     nodes=[NodeRecord(node_rank=r, agent=f"a{r}", host_id=host_id()) for r in (0, 1)])
    downs: list[str] = []

    def fake_down(name: str, reporter: Any) -> StageTimes:
        downs.append(name)
        return demo_times()

    monkeypatch.setattr(demo, "up", lambda spec, opts, reporter: (rec, demo_times(up_stages)))
    monkeypatch.setattr(demo, "down", fake_down)
    return downs


def demo_times(stages: tuple[tuple[str, str], ...] = ()) -> StageTimes:
    """`up`'s or `down`'s stage times: one ok stage, then ``(name, detail)`` stages that warned."""
    return StageTimes([Stage("fake", 0.01), *(Stage(n, 0.01, d, WARN) for n, d in stages)])


def test_demo_takes_the_seat_down_when_the_seat_answers_garbage(server: str, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    downs = _fake_seat(monkeypatch, server, "/garbage", tmp_path)
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "demo", "--quick"])
    with pytest.raises(SystemExit) as ei:
        main()
    err = capsys.readouterr().err
    assert ei.value.code == 1 and "error: chat request to" in err and "Traceback" not in err
    assert downs == ["demo-seat"]
    assert FakeSeat.calls == []  # it failed before the injection: nothing to release


def test_demo_json_injects_on_rank3s_node_and_prints_one_document(server: str, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    downs = _fake_seat(monkeypatch, server, "/good", tmp_path)
    bundles = tmp_path / "bundles"  # where `up` recorded that the seat's sidecars write
    bundles.mkdir(parents=True)
    FakeSeat.bundles = bundles
    html = tmp_path / "report.html"
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "demo", "--quick", "--json", "--html", str(html)])
    with pytest.raises(SystemExit) as ei:
        main()
    out, err = capsys.readouterr()
    assert ei.value.code == 0, err
    doc = json.loads(out)  # stdout holds the document and nothing else
    assert "[3/6] inject" in err and "HTML report:" in err  # progress on stderr
    assert FakeSeat.calls[0] == ("POST", {"fault": "rowfetch-stall:rank=3"})
    assert FakeSeat.calls[-1] == ("DELETE", None) and len(FakeSeat.calls) == 2  # released before `down`
    assert downs == ["demo-seat"]
    assert [s["name"] for s in doc["stages"]] == ["up", "traffic", "inject", "bundle", "replay", "down"]
    assert doc["injection"]["node"] == 1 and doc["injection"]["admin_url"] == f"{server}/sim/faults"
    assert [a["prompt"] for a in doc["answers"]] == list(demo.PROMPTS[:1])
    assert doc["traffic"]["requests_ok"] > 0 and doc["synthetic"] is True
    assert doc["bundle"]["id"] == "stall" and doc["bundle"]["verified"] is True
    assert doc["bundle"]["path"] == str(bundles / "stall") and 0 <= doc["bundle"]["seen_after_s"] < 5
    v = doc["verdict"]
    assert (v["kind"], v["rank"], v["node"]) == ("row-fetch stall", 3, 1) and v["frame"].startswith("fetch_rows")
    assert doc["exploding_bucket"]["max_ms"] > doc["other_buckets_max_ms"]
    assert doc["html"] == str(html) and "rank 3" in html.read_text(encoding="utf-8")


def test_no_bundle_releases_the_stall_and_takes_the_seat_down(server: str, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    downs = _fake_seat(monkeypatch, server, "/good", tmp_path)
    monkeypatch.setattr(demo, "BUNDLE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "demo", "--quick"])
    with pytest.raises(SystemExit) as ei:
        main()
    err = capsys.readouterr().err
    assert ei.value.code == 1 and "no bundle under" in err and "within 0.5 s of the injected stall" in err
    assert [c[0] for c in FakeSeat.calls] == ["POST", "DELETE"] and downs == ["demo-seat"]


def test_ctrl_c_while_waiting_releases_the_stall_and_takes_the_seat_down(
        server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    downs = _fake_seat(monkeypatch, server, "/good", tmp_path)

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "wait_for_bundle", interrupted)
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "demo", "--quick"])
    with pytest.raises(SystemExit) as ei:
        main()
    out, err = capsys.readouterr()
    assert ei.value.code == 130 and "interrupted: the demo took its seat down" in err
    assert "FAIL bundle" in out and "KeyboardInterrupt" not in out  # the stage says "interrupted"
    assert [c[0] for c in FakeSeat.calls] == ["POST", "DELETE"] and downs == ["demo-seat"]


def test_ctrl_c_after_the_traffic_started_stops_its_clients(server: str, monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    downs = _fake_seat(monkeypatch, server, "/good", tmp_path)
    loads: list[demo_traffic.Load] = []

    class Recorded(demo_traffic.Load):
        def start(self) -> demo_traffic.Load:
            loads.append(self)
            return super().start()

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "Load", Recorded)
    monkeypatch.setattr(demo, "_inject", interrupted)
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "demo", "--quick"])
    with pytest.raises(SystemExit) as ei:
        main()
    assert ei.value.code == 130 and downs == ["demo-seat"]
    (load,) = loads
    assert load.ok > 0 and load.started
    assert not [t for t in threading.enumerate() if t.name.startswith("sgl-seat-demo-load-")], "clients left running"


def test_a_seat_up_without_sidecars_stops_the_demo_before_the_stall(
        server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    downs = _fake_seat(monkeypatch, server, "/good", tmp_path, up_stages=(("sidecars", "not started: boom"),))
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "demo", "--quick"])
    with pytest.raises(SystemExit) as ei:
        main()
    err = capsys.readouterr().err
    assert ei.value.code == 1 and "without its watchdog sidecars" in err and "sidecars: not started: boom" in err
    assert FakeSeat.calls == [] and downs == ["demo-seat"]


def test_wait_for_bundle_sees_only_new_complete_bundles(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_text("{}")
    (tmp_path / ".tmp-new").mkdir()  # being written
    (tmp_path / "half").mkdir()  # no manifest yet
    assert wait_for_bundle(tmp_path, {old}, 0.3) is None
    (tmp_path / "half" / "manifest.json").write_text("{}")
    found = wait_for_bundle(tmp_path, {old}, 0.3)
    assert found is not None and found[0] == tmp_path / "half"


def test_seats_the_demo_cannot_stall_are_refused_before_up(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(demo, "up", lambda *a: pytest.fail("`up` ran"))
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "demo", "--seat", "large"])
    with pytest.raises(SystemExit) as ei:
        main()
    assert ei.value.code == 2 and "whose nodes all run on this host" in capsys.readouterr().err
    spec = load_spec("local-sim")
    small = spec.model_copy(update={"parallel": spec.parallel.model_copy(update={"tp": 2, "ep": 2})})
    with pytest.raises(UsageError, match="no rank 3"):
        demo.check_spec(small)


def test_on_a_real_local_seat_the_demo_stops_the_last_rank_with_the_draft_off() -> None:
    """local-sglang (real SGLang, CPU engine): accepted; the draft off (the engine refuses it); rank 1 stalled."""
    spec = load_spec("local-sglang")
    demo.check_spec(spec)
    assert demo.stall_rank(spec) == 1
    assert demo.demo_draft(spec) is False
    assert demo.demo_draft(load_spec("local-sim")) is True and demo.stall_rank(load_spec("local-sim")) == 3
