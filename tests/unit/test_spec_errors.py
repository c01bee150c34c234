"""Bad seat specs: each gives ONE clear error with file and line, exit code 2, no traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sgl_seat.cli.main import main
from sgl_seat.spec import builtin_seats_dir

BASE = (builtin_seats_dir() / "large.yaml").read_text()


def _edit(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


# (case id, YAML text, expected substring in the error, expected line or None)
CASES: list[tuple[str, str, str, int | None]] = [
    ("unknown-top-key", BASE + "colour: blue\n", "colour: unknown key", BASE.count("\n") + 1),
    ("unknown-nested-key", _edit("  tp: 4\n", "  tp: 4\n  pp: 2\n"), "parallel.pp: unknown key", None),
    ("misspelt-knob", _edit("memory_fraction: 0.85", "mem_fraction: 0.85"), "mem_fraction: unknown key", None),
    ("wrong-type-int", _edit("  nodes: 2", "  nodes: two"), "cluster.nodes", None),
    ("wrong-type-bool", _edit("  enabled: false", "  enabled: maybe"), "draft.enabled", None),
    ("tp-not-divisible", _edit("  ep: 4", "  ep: 3"), "parallel.ep: ep = 3 does not divide tp = 4", None),
    ("tp-not-gpus", _edit("  tp: 4", "  tp: 8"), "parallel.tp: tp = 8", None),
    ("missing-model", BASE.split("model:\n")[0] + "cluster:" + BASE.split("cluster:", 1)[1], "model: Field required",
     None),
    ("missing-path", _edit("  path: /models/DeepSeek-V4.1-Flash\n", ""), "model.path", None),
    ("bad-port", _edit("http_port: 30000", "http_port: 80"), "network.http_port", None),
    ("port-too-big", _edit("dist_init_port: 5000", "dist_init_port: 70000"), "network.dist_init_port", None),
    ("same-ports", _edit("dist_init_port: 5000", "dist_init_port: 30000"), "both 30000", None),
    ("yaml-syntax", _edit("  nodes: 2", "  nodes: [2"), "YAML syntax error", None),
    ("not-a-mapping", "- just\n- a list\n", "must be a YAML mapping", 1),
    ("schema-version", _edit("schema_version: 1", "schema_version: 2"), "unknown schema_version 2", 3),
    ("bad-engine", _edit("engine: sglang", "engine: nosuch"), "unknown engine 'nosuch'", None),
    ("bad-engine-name", _edit("engine: sglang", "engine: SGLang!"), "engine", None),
    ("mem-fraction-range", _edit("memory_fraction: 0.85", "memory_fraction: 1.5"), "memory_fraction", None),
    ("node-env-count", _edit("    - NCCL_SOCKET_IFNAME: enp1s0f0np0\n      GLOO_SOCKET_IFNAME: enp1s0f0np0\n"
                             "      NCCL_IB_HCA: mlx5_1\n", ""), "node_env has 1 entries for 2 nodes", None),
    ("bad-env-name", _edit("NCCL_DEBUG: \"WARN\"", "NCCL-DEBUG: \"WARN\""), "not a valid environment variable",
     None),
    ("draft-tokens", _edit("  draft_tokens: 4", "  draft_tokens: 7"), "draft_tokens = steps + 1", None),
    ("bad-name", _edit("name: large", "name: Large Seat"), "name", None),
    ("missing-config", _edit("config: ../models/deepseek-v4-flash", "config: ../models/nope"), "config.json", None),
    ("nextn-on-v4", _edit("algorithm: EAGLE ", "algorithm: NEXTN ").replace("enabled: false", "enabled: true"),
     "NEXTN", None),
    ("empty-file", "", "must be a YAML mapping", 1),
    # watchdog.on_hang and its budget (issue 26)
    ("on-hang-unknown", _edit("  engine_timeout_s: 300", "  engine_timeout_s: 300\n  on_hang: reboot"),
     "watchdog.on_hang", None),
    ("on-hang-without-watchdog",
     _edit("  engine_timeout_s: 300", "  engine_timeout_s: 300\n  enabled: false\n  on_hang: restart"),
     "on_hang: restart acts on the watchdog's verdicts", None),
    ("remediation-max-zero",
     _edit("  engine_timeout_s: 300", "  engine_timeout_s: 300\n  remediation:\n    max: 0"),
     "watchdog.remediation.max", None),
    ("remediation-window-negative",
     _edit("  engine_timeout_s: 300", "  engine_timeout_s: 300\n  remediation:\n    window_s: -5"),
     "watchdog.remediation.window_s", None),
    ("remediation-cooldown-text",
     _edit("  engine_timeout_s: 300", "  engine_timeout_s: 300\n  remediation:\n    cooldown_s: soon"),
     "watchdog.remediation.cooldown_s", None),
    ("remediation-unknown-key",
     _edit("  engine_timeout_s: 300", "  engine_timeout_s: 300\n  remediation:\n    budget: 3"),
     "watchdog.remediation.budget: unknown key", None),
    ("remediation-gather-zero",
     _edit("  engine_timeout_s: 300", "  engine_timeout_s: 300\n  remediation:\n    draft_gather_max: 0"),
     "watchdog.remediation.draft_gather_max", None),
]


@pytest.mark.parametrize(("case", "text", "expect", "line"), CASES, ids=[c[0] for c in CASES])
def test_bad_spec_gives_one_clear_error(
    case: str, text: str, expect: str, line: int | None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The spec lives beside a models/ link so relative config paths resolve as in launch/seats.
    seats = tmp_path / "seats"
    seats.mkdir()
    (tmp_path / "models").symlink_to(builtin_seats_dir().parent / "models")
    path = seats / f"{case}.yaml"
    path.write_text(text)
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "plan", "--seat", str(path)])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    assert expect in err, err
    assert err.startswith(f"error: {path}:"), err
    assert sum(1 for ln in err.splitlines() if ln.startswith("error:")) == 1, err
    if line is not None:
        assert f"{path}:{line}:" in err, err
    else:  # every error names a line of the file
        assert err.split(str(path) + ":", 1)[1].split(":", 1)[0].isdigit(), err


def test_every_problem_is_listed_and_an_unknown_key_gets_the_nearest_known_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 49: two typo'd keys and a bad value: one error line (the first unknown key, with the key it was meant
    to be), then every other problem with its own line of the file, instead of "(and N more problem(s))"; the
    "missing" keys that the misspelt ones were meant to be are not listed again."""
    text = _edit("memory_fraction: 0.85", "mem_fraction: 0.85").replace("  nodes: 2", "  nodes: two", 1)
    text = text.replace("  tp: 4\n", "  tpp: 4\n", 1)
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    lines = text.splitlines()

    def line_of(s: str) -> int:
        return next(i for i, ln in enumerate(lines, 1) if ln.strip().startswith(s))

    monkeypatch.setattr(sys, "argv", ["sgl-seat", "plan", "--seat", str(path)])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "more problem" not in err, err
    assert sum(1 for ln in err.splitlines() if ln.startswith("error:")) == 1, err
    # unknown keys first (a misspelling explains a "missing" one), each kind in the file's order
    assert err.startswith(f"error: {path}:{line_of('tpp:')}: parallel.tpp: unknown key (did you mean tp?)"), err
    assert f"{path}:{line_of('mem_fraction:')}: mem_fraction: unknown key (did you mean memory_fraction?)" in err
    assert f"{path}:{line_of('nodes: two')}: cluster.nodes: " in err, err
    assert "Field required" not in err, err  # what the misspelt keys were meant to be: the same two problems
    assert "fix: rename tpp to tp" in err and "fix: give a whole number" in err, err
    assert len(err.splitlines()) == 4, err  # the head, the two others, the head's fix


def test_unknown_profile_lists_builtins(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "plan", "--seat", "no-such-seat"])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "local-sim" in err and "large" in err


def test_schema_command_prints_json_schema(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setattr(sys, "argv", ["sgl-seat", "schema"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["additionalProperties"] is False
    assert {"schema_version", "name", "engine", "model", "cluster", "parallel"} <= set(schema["required"])


def test_a_good_policy_loads_and_stays_out_of_the_bundle_thresholds(tmp_path: Path) -> None:
    """GIVEN on_hang: rollback-draft with a budget WHEN loaded THEN every value is read; the detector thresholds a
    bundle records (``model_dump``) leave the policy out, so bundles keep scalar thresholds only."""
    from sgl_seat.spec import parse_spec

    text = _edit("  engine_timeout_s: 300", "  engine_timeout_s: 300\n  on_hang: rollback-draft\n  remediation:\n"
                 "    max: 2\n    window_s: 600\n    cooldown_s: 60\n    draft_gather_max: 96")
    (tmp_path / "models").symlink_to(builtin_seats_dir().parent / "models")
    (tmp_path / "seats").mkdir()
    wd = parse_spec(text, path=str(tmp_path / "seats" / "x.yaml")).watchdog
    assert wd.on_hang == "rollback-draft"
    assert (wd.remediation.max, wd.remediation.window_s, wd.remediation.cooldown_s,
            wd.remediation.draft_gather_max) == (2, 600, 60, 96)
    dumped = wd.model_dump()
    assert "on_hang" not in dumped and "remediation" not in dumped
    assert all(isinstance(v, (int, float, str, bool)) for v in dumped.values())
