"""The CLI skeleton: every command of the loop exists in --help, and plan --json is clean JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cli_runner import run_cli


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cli(["--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    for cmd in ("plan", "schema", "up", "down", "status", "logs", "watch", "bundle", "replay", "demo"):
        assert cmd in out, cmd


def test_plan_json_is_parseable_and_alone_on_stdout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_cli(["plan", "--seat", "large", "--draft", "off", "--json"], monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["draft"] is False and doc["slots"] == 32
    assert doc["capacity"]["draft_on"]["max_running_requests"] == 8


def test_plan_overrides_reach_the_command_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_cli(["plan", "--seat", "large", "--draft", "on", "--slots", "4", "--mem-fraction", "0.88", "--json"],
                monkeypatch) == 0
    cmd = json.loads(capsys.readouterr().out)["nodes"][1]["command"]
    assert cmd[cmd.index("--max-running-requests") + 1] == "4"
    assert cmd[cmd.index("--mem-fraction-static") + 1] == "0.88"
    assert cmd[cmd.index("--node-rank") + 1] == "1"
    assert "--speculative-algorithm" in cmd


def test_bad_option_value_is_a_usage_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cli(["plan", "--draft", "maybe"], monkeypatch) == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["plan", "--mem-fraction", "-0.5"], ["up", "--dry-run", "--mem-fraction", "1.5"]])
def test_a_bad_flag_value_names_the_flag_not_the_spec(argv: list[str], capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_cli(argv, monkeypatch) == 2
    err = capsys.readouterr().err
    assert f"error: --mem-fraction {argv[-1]}: " in err and "<seat spec>" not in err, err


@pytest.mark.parametrize("cmd", [["demo"], ["up"], ["down"], ["plan"], ["bundle", "pack"]])
def test_help_paragraphs_are_not_wrapped_mid_sentence(cmd: list[str], capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The docstring's own line breaks are not kept: on a terminal wide enough, each paragraph is one line."""
    import inspect

    import typer

    from sgl_seat.cli.main import app

    command: Any = typer.main.get_command(app)
    for part in cmd:
        command = command.commands[part]
    paragraphs = [" ".join(p.split()) for p in inspect.cleandoc(command.help or "").split("\n\n")]
    monkeypatch.setenv("COLUMNS", "1000")
    assert run_cli([*cmd, "--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    for p in paragraphs:
        assert p in out, p
