"""The gate when an arm cannot start (issue 49): an error with its own exit status (4: never a verdict's 0, 1 or 3,
nor the usage error's 2), naming the arm, the node, the reason and the fix, with an error document under --json;
and a start that fails once is really started again.

Why these seams: the held port runs the real gate from its CLI (`main()`, as a shell would) on local-sim moved to a
free block: the arms' ports are checked before the battery's local cluster starts, so nothing of Ray runs. The retry
replaces `up` (the arm's start) with one that fails once as `up` fails (its own teardown has removed the seat's
record) and then serves: it used to call `down` on that removed record and end the battery on "no seat named ...".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.errors import ArmStartError, EngineError
from sgl_seat.gate import arms as arms_mod
from sgl_seat.gate.arms import SeatArms
from sgl_seat.launch import up as seat_up
from sgl_seat.launch.seatrecord.record import SeatRecord
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.netports import free_block, held, port_range, random_starts
from sgl_seat.spec import load_spec
from tests.cli_runner import run_cli

LO, HI = port_range((30940, 30999))


@pytest.fixture(autouse=True)
def _home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")


def test_a_held_port_stops_the_gate_with_exit_4_naming_arm_node_port_and_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN the dist-init port of local-sim (moved to a free block with --port-base) held by another process WHEN
    `sgl-seat gate --quick --json` runs THEN exit 4 (it was 1, DO_NOT_SHIP's, after a retry that could not start),
    stdout is an error document (verdict null, the arm, node 0, the reason), stderr names the port, the spec key
    and the fix, and no retry is tried (a held port is not mended by starting again)."""
    base = free_block(random_starts(LO, HI - 16), (0, 2, 5, 10, 12, 15, 16))
    assert base is not None
    with held(base + 5, listen=True):
        code = run_cli(["gate", "--seat", "local-sim", "--quick", "--json", "--port-base", str(base),
                        "--out", str(tmp_path / "battery")], monkeypatch)
    out, err = capsys.readouterr()
    assert code == 4, err
    doc = json.loads(out)
    assert doc["verdict"] is None and doc["exit_code"] == 4
    e = doc["error"]
    assert e["kind"] == "ArmStartError" and e["arm"] == "baseline" and e["node"] == 0
    assert e["reason"].startswith("preflight failed on node 0") and e["directory"] == str(tmp_path / "battery")
    assert f"dist_init port {base + 5} is in use" in e["message"] and "network.dist_init_port" in e["message"]
    assert "--port-base" in e["fix"] and "--resume" in e["fix"]
    assert "error: arm baseline could not start (node 0, refused before it started)" in err
    assert "network.dist_init_port" in err and "starting it once more" not in err


def _rec(name: str, endpoint: str) -> SeatRecord:
    return SeatRecord(name=name, state=SeatState.READY, engine="sim", draft=False, cluster_address="127.0.0.1:1",
                      namespace="n", pg_name="p", endpoint=endpoint, bundles_dir=None)


def _arms(monkeypatch: pytest.MonkeyPatch, outcomes: list[Any]) -> tuple[SeatArms, list[str], list[str]]:
    """SeatArms on local-sim at a cluster address (no local cluster, no port check) whose `up` gives ``outcomes``
    in turn: an exception is raised as `up` raises it (its record already removed), a URL is a READY seat there."""
    spec = load_spec("local-sim")
    spec = spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"address": "127.0.0.1:1"})})
    calls: list[str] = []

    def fake_up(s: Any, opts: seat_up.UpOptions, reporter: Any = None) -> tuple[SeatRecord, Any]:
        calls.append(s.name)
        got = outcomes.pop(0)
        if isinstance(got, Exception):
            raise got
        return _rec(s.name, got), None

    monkeypatch.setattr(arms_mod.seat_up, "up", fake_up)
    said: list[str] = []
    return SeatArms(spec, watchdog=False, say=said.append), calls, said


def test_a_start_that_fails_once_is_started_again_and_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN an arm whose first `up` fails as the sim's gloo rendezvous did on a loaded machine (an EngineError on
    node 1; `up` took it down and removed its record) WHEN the gate starts the arm THEN it is brought up once more
    and the slot serves from the second start, recording that it took two and why the first failed."""
    arms, calls, said = _arms(monkeypatch, [
        EngineError("rendezvous failed at tcp://127.0.0.1:31005 (rank 2 of 4): Address already in use", node=1),
        "http://127.0.0.1:31000/"])
    s = arms.start("baseline")
    assert calls == ["local-sim-baseline", "local-sim-baseline"]
    assert s.endpoint == "http://127.0.0.1:31000" and s.starts == 2 and s.cold
    assert s.failed_start is not None and s.failed_start.startswith("rendezvous failed")
    assert said == ["arm baseline: the engine did not start (rendezvous failed at tcp://127.0.0.1:31005 (rank 2 of 4)"
                    ": Address already in use); starting it once more"]


def test_a_start_that_fails_twice_is_an_arm_start_error_with_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN an arm whose engine fails both starts WHEN the gate starts it THEN ArmStartError (exit 4), naming the
    arm, the node of the last failure and its reason, with the engine's fix."""
    arms, calls, _ = _arms(monkeypatch, [EngineError("node 0 engine died", node=0),
                                         EngineError("node 1 engine (pid 7) killed by SIGKILL", fix="read the logs",
                                                     node=1)])
    with pytest.raises(ArmStartError) as exc:
        arms.start("candidate")
    e = exc.value
    assert len(calls) == 2 and e.exit_code == 4 and e.arm == "candidate" and e.node == 1
    assert e.reason == "node 1 engine (pid 7) killed by SIGKILL" and e.fix == "read the logs"
    assert str(e).startswith("arm candidate could not start (node 1, 2 starts); the battery stopped without a verdict")
