"""The seat commands' CLI layer: parsing, defaults, refusals that happen before any Ray call."""

from __future__ import annotations

import json
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
    for cmd in (["status"], ["logs"]):
        assert run_cli(cmd, monkeypatch) == 2
        assert "sgl-seat up" in capsys.readouterr().err


def test_down_with_nothing_up_is_done_with_or_without_a_name(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # `down` is idempotent (issue 49): nothing recorded is nothing to take down, exit 0, named or not, --local or not.
    for cmd in (["down"], ["down", "local-sglang"], ["down", "--local"], ["down", "--local", "local-sglang"]):
        assert run_cli(cmd, monkeypatch) == 0, cmd
        out, err = capsys.readouterr()
        assert "nothing to take down" in out and "error" not in err and "down: seat" not in out + err, (cmd, out, err)
    for cmd in (["down", "--json"], ["down", "--json", "local-sglang"]):
        assert run_cli(cmd, monkeypatch) == 0, cmd
        out, err = capsys.readouterr()
        doc = json.loads(out)
        assert doc["state"] == "STOPPED" and doc["recorded"] is False and doc["survivors"] == [], doc
        assert doc["seat"] == (cmd[2] if len(cmd) > 2 else None)


def test_down_of_an_unrecorded_name_names_the_recorded_seats(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    save_record(SeatRecord(name="local-sim", state=SeatState.READY, engine="sim", draft=True,
                           cluster_address="local", namespace="n", pg_name="p", endpoint="http://127.0.0.1:1"))
    assert run_cli(["down", "local-sin"], monkeypatch) == 0  # a typo: said, with what is recorded, and nothing done
    out = capsys.readouterr().out
    assert "no seat named 'local-sin' is recorded" in out and "nothing to take down" in out and "local-sim" in out
    save_record(SeatRecord(name="other", state=SeatState.READY, engine="sim", draft=True,
                           cluster_address="local", namespace="n", pg_name="p", endpoint="http://127.0.0.1:2"))
    assert run_cli(["down"], monkeypatch) == 2  # several up and none named: `down` does not guess
    assert "several seats are recorded" in capsys.readouterr().err


def test_help_of_up_lists_its_options(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cli(["up", "--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    for opt in ("--seat", "--draft", "--slots", "--mem-fraction", "--timeout", "--fault", "--no-watchdog",
                "--dry-run"):
        assert opt in out, opt


@pytest.mark.parametrize(("kv", "plan", "expect"), [
    ((1_040_128, 1_040_128), {}, "KV pool: predicted 1,040,128 tokens, actual 1,040,128 tokens (measured"),
    ((None, 4096), {"capacity_note": "KV pool set by --max-total-tokens 4,096 tokens (SGLang's CPU engine)"},
     "KV pool: no prediction (KV pool set by --max-total-tokens 4,096 tokens (SGLang's CPU engine)), "
     "actual 4,096 tokens (measured"),
    ((None, None), {}, "KV pool: no prediction (the plan sized none: model.config not set), actual not reported yet"),
], ids=["both", "cpu-engine", "neither"])
def test_status_says_what_it_knows_of_the_kv_pool(kv: tuple[int | None, int | None], plan: dict[str, str],
                                                  expect: str, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from sgl_seat.launch import status as seat_status
    from sgl_seat.launch.seatrecord.record import load_record

    save_record(SeatRecord(name="local-sglang", state=SeatState.READY, engine="sglang", draft=False,
                           cluster_address="local", namespace="n", pg_name="p", endpoint="http://127.0.0.1:1",
                           plan=plan, kv_predicted=kv[0], kv_actual=kv[1]))
    monkeypatch.setattr(seat_status, "status", lambda name, timeout: load_record(name))  # no Ray: the record as is
    assert run_cli(["status"], monkeypatch) == 0
    out = capsys.readouterr().out
    assert expect in out and "unknown" not in out, out
