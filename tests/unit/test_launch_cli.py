"""The seat commands' CLI layer: parsing, defaults, refusals that happen before any Ray call."""

from __future__ import annotations

from pathlib import Path

import pytest

from sgl_seat.launch.seatchoice import choose_seat
from sgl_seat.launch.seatrecord.home import HOME_ENV
from sgl_seat.launch.seatrecord.record import SeatRecord, save_record
from sgl_seat.launch.seatrecord.state import SeatState
from tests.cli_runner import run_cli


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def test_default_seat_is_local_sim_and_says_so(tmp_path: Path) -> None:
    seat, note = choose_seat(None)
    assert seat == "local-sim" and note is not None and "built-in local-sim" in note
    (tmp_path / "seat.yaml").write_text("x")
    assert choose_seat(None)[0] == "seat.yaml"
    assert choose_seat("large") == ("large", None)


def test_up_dry_run_prints_the_plan_and_starts_nothing(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    assert run_cli(["up", "--dry-run", "--draft", "on", "--slots", "4"], monkeypatch) == 0
    captured = capsys.readouterr()
    assert "seat local-sim  engine sim  draft on  slots 4" in captured.out
    assert "built-in local-sim" in captured.err
    assert not (home / "seats").exists()


def test_fault_on_a_real_sglang_seat_is_refused(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cli(["up", "--seat", "large", "--dry-run", "--fault", "crash:rank=1"], monkeypatch) == 2
    assert "not a rehearsal" in capsys.readouterr().err


def test_second_up_of_a_recorded_seat_is_refused_before_ray(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    save_record(SeatRecord(name="local-sim", state=SeatState.READY, engine="sim", draft=True,
                           cluster_address="local", namespace="n", pg_name="p", endpoint="http://127.0.0.1:1"))
    assert run_cli(["up", "--no-watchdog"], monkeypatch) == 1
    err = capsys.readouterr().err
    assert "already recorded as READY at http://127.0.0.1:1" in err and "sgl-seat down local-sim" in err
    assert not (home / "clusters").exists()  # refused from the record, before any cluster was started


def test_commands_without_a_recorded_seat_say_how_to_start_one(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for cmd in (["status"], ["down"], ["logs"]):
        assert run_cli(cmd, monkeypatch) == 2
        assert "sgl-seat up" in capsys.readouterr().err


def test_help_of_up_lists_its_options(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cli(["up", "--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    for opt in ("--seat", "--draft", "--slots", "--mem-fraction", "--timeout", "--fault", "--no-watchdog",
                "--dry-run"):
        assert opt in out, opt
