"""The test command's durations table (scripts/durations.py): phases, the slowest tests, the budget line."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "durations.py"


def _durations() -> Any:
    """The script's names, as a namespace (it is a script, not a module of a package)."""
    return SimpleNamespace(**runpy.run_path(str(SCRIPT), run_name="durations_script"))


def _junit(path: Path, cases: list[tuple[str, str, float, str]]) -> None:
    body = []
    for classname, name, secs, outcome in cases:
        inner = {"passed": "", "failed": "<failure message='x'/>", "skipped": "<skipped message='y'/>"}[outcome]
        body.append(f'<testcase classname="{classname}" name="{name}" time="{secs}">{inner}</testcase>')
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{"".join(body)}</testsuite>'
                    "</testsuites>")


def test_the_table_has_each_phase_the_slowest_tests_and_the_total_against_the_budget(tmp_path: Path) -> None:
    d = _durations()
    (tmp_path / "phases.tsv").write_text("setup\t1000\t1090\nunit and contract tests\t1100\t1400\n"
                                         "integration stream 'ray'\t1100\t2350\n")
    _junit(tmp_path / "ray.xml", [("tests.integration.test_runbooks", "test_a", 240.5, "passed"),
                                  ("tests.integration.test_demo", "test_b", 36.0, "failed")])
    _junit(tmp_path / "units.xml", [("tests.unit.test_x.TestK", "test_c", 0.2, "passed"),
                                    ("tests.unit.test_x", "test_d", 0.0, "skipped")])
    out = tmp_path / "durations.txt"
    assert d.main([str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    lines = text.splitlines()
    assert any(line.startswith("setup") and line.split()[-1] == "90.0" for line in lines), text
    assert any(line.startswith("integration stream 'ray'") and line.split()[-1] == "1250.0" for line in lines), text
    slow = lines.index(next(line for line in lines if line.startswith("the 4 slowest")))
    assert "test_runbooks::test_a" in lines[slow + 1] and "240.5" in lines[slow + 1]
    assert "test_demo::test_b" in lines[slow + 2] and "[failed]" in lines[slow + 2]
    assert "test_x::test_c" in lines[slow + 3]  # the module, not the class, names a test
    # 1000 -> 2350: 1350 s, over the CI tier's 1200 s: said, not raised
    assert "total 1350 s (22:30) of the CI tier's budget 1200 s (20:00): OVER" in text
    assert lines[-1] == "tests: 2 passed, 1 failed, 1 skipped"


def test_a_run_inside_its_budget_says_so_and_a_stream_killed_mid_write_is_left_out(tmp_path: Path) -> None:
    d = _durations()
    (tmp_path / "phases.tsv").write_text("setup\t0\t60\nintegration stream 'other'\t60\t900\nnot\ta line\n")
    (tmp_path / "other.xml").write_text("<testsuites><testsuite")  # cut off: the phase line still counts
    text = d.render(d.read_phases(tmp_path / "phases.tsv"), d.read_cases(tmp_path), budget_s=5400, tier="full")
    assert "total 900 s (15:00) of the full tier's budget 5400 s (90:00): inside" in text
    assert "slowest" not in text and "tests:" not in text
