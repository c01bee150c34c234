"""Traffic replay against a stand-in OpenAI-compatible server on 127.0.0.1 (a thread; no engine).

GIVEN the stall bundle's recorded request shapes WHEN re-driven THEN each request keeps its token
length, prefix sharing, max_tokens and sampling; the run is bounded in count and time; and a bundle that
the target's watchdog writes during the run is reported as "reproduced".
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.cli.main import main
from sgl_seat.errors import UsageError
from sgl_seat.forensics import read_bundle
from sgl_seat.forensics.recording.traffic import replay_traffic, synth_prompt

ROOT = Path(__file__).resolve().parents[2]
STALL = ROOT / "tests" / "fixtures" / "bundles" / "stall"


class Seat:
    """Records request bodies; optionally 'captures a bundle' when the Nth request arrives."""

    def __init__(self, bundle_after: int | None = None, bundles_dir: Path | None = None, delay: float = 0.0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        self.bundle_after = bundle_after
        self.bundles_dir = bundles_dir
        self.delay = delay
        self.released = threading.Event()  # set at the test's end: a delayed answer stops waiting


def _handler(seat: Seat) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send(200, {"data": [{"id": "sim-model"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with seat.lock:
                seat.bodies.append(body)
                seat.paths.append(self.path)
                n = len(seat.bodies)
            if seat.bundle_after is not None and n == seat.bundle_after and seat.bundles_dir is not None:
                import shutil

                shutil.copytree(STALL, seat.bundles_dir / "captured-during-replay")
                man = seat.bundles_dir / "captured-during-replay" / "manifest.json"
                doc = json.loads(man.read_text())
                doc["created"] = 4e9  # a capture "now" (after the replay started)
                man.write_text(json.dumps(doc))
            if seat.delay:
                seat.released.wait(seat.delay)
            self._send(200, {"choices": [{"text": "ok"}], "usage": {"completion_tokens": 1}})

    return H


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # the default backlog of 5 drops connections when the replay opens many at once
    # server_close() joins the handler threads: none outlives its test (a late one's traceback landed in the
    # captured stderr of the next test on the same xdist worker)
    daemon_threads = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # the replay stopped and closed its connections: what it is meant to do
        super().handle_error(request, client_address)


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []
    seats: list[Seat] = []

    def start(seat: Seat) -> str:
        srv = _Server(("127.0.0.1", 0), _handler(seat))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        seats.append(seat)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for seat in seats:
        seat.released.set()
    for s in servers:
        s.shutdown()
        s.server_close()


def test_replay_keeps_request_shapes_and_sees_the_new_bundle(serve: Any, tmp_path: Path) -> None:
    reqs = read_bundle(STALL).requests
    watch = tmp_path / "bundles" / "local-sim"
    watch.mkdir(parents=True)
    seat = Seat(bundle_after=25, bundles_dir=watch)  # the last request: every shape is sent before the stop
    res = replay_traffic(reqs, serve(seat), speed=200.0, max_requests=25, max_seconds=20, watch_dir=watch,
                         watch_grace_s=2.0)
    assert res.planned == 25 and res.sent == 25 and res.ok == 25 and res.failed == 0, res.statuses
    assert res.reproduced is True and res.new_bundles == [str(watch / "captured-during-replay")]
    shapes = sorted(reqs, key=lambda r: r.t)[:25]
    by_prompt = {b["prompt"]: b for b in seat.bodies}
    assert len(by_prompt) == 25
    for i, s in enumerate(shapes):
        body = by_prompt[synth_prompt(s, i)]
        assert len(body["prompt"].split()) == s.prompt_tokens  # one-token words: word count = token count
        assert body["max_tokens"] == s.max_tokens and body["temperature"] == s.sampling["temperature"]
        assert body["model"] == "sim-model" and body["stream"] == s.stream
    # Prompts of one prefix group share exactly their recorded shared prefix.
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(shapes):
        groups.setdefault(s.prefix_group, []).append(i)
    shared = [(a, b) for g in groups.values() for a, b in itertools.pairwise(g)]
    assert shared, "the fixture has shared-prefix families"
    for a, b in shared:
        pa, pb = synth_prompt(shapes[a], a).split(), synth_prompt(shapes[b], b).split()
        k = min(shapes[a].shared_prefix_tokens, shapes[b].shared_prefix_tokens)
        assert pa[:k] == pb[:k]


def test_replay_is_bounded_in_time_and_reports_no_reproduction(serve: Any, tmp_path: Path) -> None:
    reqs = read_bundle(STALL).requests
    watch = tmp_path / "bundles" / "local-sim"
    res = replay_traffic(reqs, serve(Seat(delay=0.3)), speed=1.0, max_requests=500, max_seconds=2.0,
                         watch_dir=watch, watch_grace_s=0.0)
    assert res.stopped_early and res.duration_s < 6.0 and res.sent < res.planned
    assert res.reproduced is False and res.new_bundles == []


def test_replay_stops_sending_once_the_target_captured_a_bundle(serve: Any, tmp_path: Path) -> None:
    """A seat that hangs (each answer takes 20 s) and captures a bundle at the 3rd request: the replay stops
    sending and returns within seconds, not at its 30 s limit, and says why it stopped."""
    reqs = read_bundle(STALL).requests
    watch = tmp_path / "bundles" / "local-sim"
    watch.mkdir(parents=True)
    res = replay_traffic(reqs, serve(Seat(bundle_after=3, bundles_dir=watch, delay=20.0)), speed=2.0,
                         max_requests=500, max_seconds=30.0, watch_dir=watch, watch_grace_s=0.0)
    assert res.reproduced is True and res.new_bundles == [str(watch / "captured-during-replay")]
    assert res.stopped_early is not None and "reproduced" in res.stopped_early, res.stopped_early
    assert res.duration_s < 10.0 and 3 <= res.sent < res.planned, (res.duration_s, res.sent, res.planned)


def test_replay_refuses_bad_targets_and_empty_traffic() -> None:
    reqs = read_bundle(STALL).requests
    with pytest.raises(UsageError):
        replay_traffic(reqs, "file:///etc/passwd")
    with pytest.raises(UsageError):
        replay_traffic(reqs, "http://127.0.0.1:1", speed=0)
    with pytest.raises(UsageError):
        replay_traffic([], "http://127.0.0.1:1")


def test_unreachable_target_counts_failures(tmp_path: Path) -> None:
    reqs = read_bundle(STALL).requests
    res = replay_traffic(reqs, "http://127.0.0.1:9", speed=500.0, max_requests=3, max_seconds=10)
    assert res.sent == 3 and res.ok == 0 and res.failed + res.timed_out == 3 and res.reproduced is None


def test_cli_traffic(serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path / "home"))
    url = serve(Seat())
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "replay", str(STALL), "--traffic", "--target", url, "--speed",
                                      "500", "--max-requests", "5", "--max-seconds", "10", "--watch-grace", "0",
                                      "--json"])
    with pytest.raises(SystemExit) as ex:
        main()
    assert ex.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert doc["traffic"]["sent"] == 5 and doc["traffic"]["ok"] == 5 and doc["traffic"]["reproduced"] is False
    assert doc["traffic"]["watched"].endswith(f"bundles/{read_bundle(STALL).manifest.seat}")


def _seat_with_bundles_dir(tmp_path: Path, name: str) -> Path:
    """Record seat ``name`` (READY) whose spec sets ``bundles.dir``; return that directory."""
    import yaml

    from sgl_seat.launch.seatrecord.record import SeatRecord, save_record
    from sgl_seat.launch.seatrecord.state import SeatState
    from sgl_seat.spec import load_spec

    src = Path(load_spec("local-sim").source or "")
    doc = yaml.safe_load(src.read_text(encoding="utf-8"))
    doc["name"] = name
    doc["model"]["config"] = str((src.parent / doc["model"]["config"]).resolve())
    bdir = tmp_path / "elsewhere" / "my-bundles"
    bdir.mkdir(parents=True)
    doc["bundles"] = {"dir": str(bdir)}
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(doc), encoding="utf-8")
    save_record(SeatRecord(name=name, state=SeatState.READY, engine="sim", draft=True, cluster_address="local",
                           namespace="n", pg_name="p", spec_source=str(spec)))
    return bdir


def test_cli_traffic_watches_the_seats_own_bundles_dir(serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN a recorded seat whose spec sets ``bundles.dir`` WHEN its watchdog captures a bundle there during
    `replay --traffic --target-seat` THEN the replay reports it reproduced (it watched the default
    ``$SGLSEAT_HOME/bundles/<seat>`` instead and said "not reproduced")."""
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path / "home"))
    bdir = _seat_with_bundles_dir(tmp_path, "s9")
    url = serve(Seat(bundle_after=3, bundles_dir=bdir))
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "replay", str(STALL), "--traffic", "--target", url, "--target-seat",
                                      "s9", "--speed", "500", "--max-requests", "5", "--max-seconds", "10",
                                      "--watch-grace", "2", "--json"])
    with pytest.raises(SystemExit) as ex:
        main()
    assert ex.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert doc["traffic"]["watched"] == str(bdir)
    assert doc["traffic"]["reproduced"] is True
    assert doc["traffic"]["new_bundles"] == [str(bdir / "captured-during-replay")]


def test_a_bundle_id_in_a_seats_own_bundles_dir_resolves_and_is_listed(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN a bundle in a recorded seat's ``bundles.dir`` WHEN `replay` and `bundle show` get its bare id and
    `bundle ls` lists THEN they find it there (they looked only under ``$SGLSEAT_HOME/bundles``)."""
    import shutil

    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path / "home"))
    bdir = _seat_with_bundles_dir(tmp_path, "s9")
    bid = "20260101-000000.000-rowfetch-stall-r3"
    shutil.copytree(STALL, bdir / bid)
    docs = []
    for argv in (["replay", bid, "--json"], ["bundle", "show", bid, "--json"], ["bundle", "ls", "--json"]):
        monkeypatch.setattr(sys, "argv", ["sgl-seat", *argv])
        with pytest.raises(SystemExit) as ex:
            main()
        out, err = capsys.readouterr()
        assert ex.value.code in (0, None), (argv, err)
        docs.append(json.loads(out))
    replayed, shown, listed = docs
    assert replayed["bundle"]["id"] == shown["bundle_id"] == read_bundle(STALL).manifest.bundle_id
    assert [b["path"] for b in listed] == [str(bdir / bid)]
