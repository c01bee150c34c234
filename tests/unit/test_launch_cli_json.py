"""`--json` on the commands that report something (up, down, bundle verify/pack/unpack; demo's is in
test_launch_demo): JSON alone on stdout, parseable, with the documented keys; progress on stderr. `up` and
`down` run with the library calls faked (no Ray): the CLI layer is what is under test here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.launch import stages, teardown
from sgl_seat.launch import up as up_mod
from sgl_seat.launch.seatrecord.home import HOME_ENV
from sgl_seat.launch.seatrecord.record import SeatRecord, save_record
from sgl_seat.launch.seatrecord.state import SeatState
from tests.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]
STALL = ROOT / "tests" / "fixtures" / "bundles" / "stall"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def _rec(name: str = "local-sim") -> SeatRecord:
    return SeatRecord(name=name, state=SeatState.READY, engine="sim", draft=True, cluster_address="local",
                      namespace="n", pg_name="p", endpoint="http://127.0.0.1:31000")


def _stages(reporter: stages.Reporter, *names: str, warn: str = "") -> stages.StageTimes:
    st = stages.Stages(reporter)
    for n in names:
        with st.stage(n, "doing it") as note:
            note["detail"] = f"{n} done"
            if n == warn:
                note["status"] = stages.WARN
    return st.times


def test_up_json_is_alone_on_stdout_with_endpoint_state_and_stages(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    def fake_up(spec: Any, opts: up_mod.UpOptions, reporter: stages.Reporter) -> tuple[SeatRecord, stages.StageTimes]:
        return _rec(), _stages(reporter, "cluster", "ready", "sidecars", warn="sidecars")

    monkeypatch.setattr(up_mod, "up", fake_up)
    assert run_cli(["up", "--json"], monkeypatch) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["endpoint"] == "http://127.0.0.1:31000" and doc["state"] == "READY" and doc["seat"] == "local-sim"
    assert [(s["name"], s["status"], s["detail"]) for s in doc["stages"]] == [
        ("cluster", "ok", "cluster done"), ("ready", "ok", "ready done"), ("sidecars", "warn", "sidecars done")]
    assert all(isinstance(s["seconds"], float) for s in doc["stages"]) and doc["total_s"] >= 0
    assert doc["warnings"] == ["sidecars: sidecars done"]
    assert "ok cluster" in err and "up: seat local-sim" in err  # progress went to stderr


def test_up_dry_run_json_is_the_plan(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["up", "--dry-run", "--json", "--draft", "on"], monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["seat"] == "local-sim" and doc["draft"] is True and len(doc["nodes"]) == 2


def test_down_json_has_stages_and_no_survivors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                               home: Path) -> None:
    save_record(_rec())
    monkeypatch.setattr(teardown, "down", lambda name, reporter: _stages(reporter, "connect", "engines", "cluster"))
    assert run_cli(["down", "--json"], monkeypatch) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["seat"] == "local-sim" and doc["state"] == "STOPPED" and doc["survivors"] == []
    assert [s["name"] for s in doc["stages"]] == ["connect", "engines", "cluster"]
    assert "down: seat local-sim" in err and "ok engines" in err


def test_down_json_that_leaves_survivors_names_them_and_fails(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    save_record(_rec())

    def fake_down(name: str, reporter: stages.Reporter) -> stages.StageTimes:
        raise teardown.NotDown(name, ["node 1: pid 4242 (sglang::scheduler_TP2_EP2)"], _stages(reporter, "engines"))

    monkeypatch.setattr(teardown, "down", fake_down)
    assert run_cli(["down", "--json"], monkeypatch) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["state"] == "FAILED" and doc["survivors"] == ["node 1: pid 4242 (sglang::scheduler_TP2_EP2)"]
    assert [s["name"] for s in doc["stages"]] == ["engines"]
    assert "error: seat 'local-sim' is not fully down" in err and "Traceback" not in err


def test_bundle_verify_pack_unpack_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                        home: Path, tmp_path: Path) -> None:
    shutil.copytree(STALL, home / "bundles" / "local-sim" / "stall")
    assert run_cli(["bundle", "verify", "stall", "--json"], monkeypatch) == 0
    v = json.loads(capsys.readouterr().out)
    files = [f for f in STALL.rglob("*") if f.is_file()]
    assert v["ok"] is True and v["bundle_id"] == "stall" and v["path"].endswith("local-sim/stall")
    assert v["files"] == len(files) and v["bytes"] == sum(f.stat().st_size for f in files if f.name != "manifest.json")

    arc = tmp_path / "s.tar.zst"
    assert run_cli(["bundle", "pack", "stall", "-o", str(arc), "--json"], monkeypatch) == 0
    p = json.loads(capsys.readouterr().out)
    assert p == {**p, "ok": True, "path": str(arc), "bytes": arc.stat().st_size}
    assert p["source_bytes"] == sum(f.stat().st_size for f in files)

    assert run_cli(["bundle", "verify", str(arc), "--json"], monkeypatch) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True

    assert run_cli(["bundle", "unpack", str(arc), "--into", str(tmp_path / "u"), "--json"], monkeypatch) == 0
    u = json.loads(capsys.readouterr().out)
    assert u == {**u, "ok": True, "path": str(tmp_path / "u" / "stall"), "archive": str(arc),
                 "archive_bytes": arc.stat().st_size, "files": len(files), "bytes": p["source_bytes"]}


def test_bundle_json_of_a_refused_bundle_says_not_ok(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str], home: Path,
                                                     tmp_path: Path) -> None:
    damaged = home / "bundles" / "local-sim" / "damaged"
    damaged.mkdir(parents=True)
    (damaged / "manifest.json").write_text("{")
    for argv in (["bundle", "verify", "damaged", "--json"], ["bundle", "pack", "damaged", "--json"]):
        assert run_cli(argv, monkeypatch) == 2
        out, err = capsys.readouterr()
        doc = json.loads(out)
        assert doc["ok"] is False and doc["path"] == "damaged" and "manifest.json" in doc["error"]
        assert "error:" in err and "Traceback" not in err
    junk = tmp_path / "junk.tar.zst"
    junk.write_bytes(b"not zstd")
    assert run_cli(["bundle", "unpack", str(junk), "--into", str(tmp_path / "u"), "--json"], monkeypatch) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["path"] == str(junk)
