"""SGLang's own rule for the ``SGL_`` prefix, held to its source: this project's variables are not SGLang's (issue 49).

At import, ``sglang/srt/environ.py`` rewrites any ``SGL_*`` variable to ``SGLANG_*`` with a deprecation warning
(0.5.23: ``_handle_deprecated_envs``; 0.5.17, the H200 seat's version: ``_convert_SGL_to_SGLANG``), so this project's
variables were renamed ``SGLSEAT_*``. Here: the prefixes SGLang's rule tests are exactly the ones
``tests/unit/test_envcompat.py`` copies (both versions, read from their source), and SGLang 0.5.23 itself, imported
with the environment of a real seat's plan, warns about none of its variables (and does warn about an old name, so
the check can fail). It names the old prefix on purpose: /tmp/rename-env.sh leaves this file alone.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_seat.plan import build_plan
from sgl_seat.spec import load_spec
from tests.contract.conftest import CHILD_S, require
from tests.unit.test_envcompat import SGLANG_CLAIMS

pytestmark = [pytest.mark.contract]

OVERLAY_0517 = Path(os.environ.get("SGLSEAT_CACHE", Path.home() / ".cache" / "sgl-seat")) / "sglang-0.5.17-parser"


def _environ_py_0523() -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "srt" / "environ.py"
    return path if path.is_file() else None


def _rewrite_rule(source: str) -> tuple[set[str], set[tuple[str, str]]]:
    """The prefixes the loops over ``os.environ`` test with ``startswith`` and the ``replace`` calls they make."""
    tested: set[str] = set()
    replaced: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.For) and "os.environ" in ast.unparse(node.iter)):
            continue
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                args = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if call.func.attr == "startswith":
                    tested.update(args)
                elif call.func.attr == "replace" and len(args) == 2:
                    replaced.add((args[0], args[1]))
    return tested, replaced


@pytest.mark.parametrize("version", ["0.5.23", "0.5.17"])
def test_sglangs_rewrite_rule_is_the_one_the_unit_tests_copy(version: str) -> None:
    path = _environ_py_0523() if version == "0.5.23" else OVERLAY_0517 / "sglang" / "srt" / "environ.py"
    require(path is not None and path.is_file(), f"SGLang {version}'s environ.py is not installed")
    assert path is not None
    tested, replaced = _rewrite_rule(path.read_text(encoding="utf-8"))
    assert tested == {"SGL_"}, f"SGLang {version} now rewrites {tested}: update SGLANG_CLAIMS and check SGLSEAT_"
    assert replaced == {("SGL_", "SGLANG_")}
    assert all(SGLANG_CLAIMS.match(p + "X") for p in tested)
    assert not any("SGLSEAT_".startswith(p) for p in tested)


_CHILD = r"""
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import sglang.srt.environ  # noqa: F401  (its import applies the rule)
print(json.dumps([str(w.message) for w in caught]))
"""


def test_sglang_warns_about_no_variable_of_a_real_seats_plan() -> None:
    """GIVEN the environment the local-sglang plan gives its engines, and one old name as the control
    WHEN SGLang 0.5.23's environ.py is imported with it THEN it warns about the old name only."""
    require(_environ_py_0523() is not None, "SGLang 0.5.23 is not installed (scripts/install-sglang-parser.sh)")
    plan = build_plan(load_spec("local-sglang"))
    planned = {k: v for n in plan.nodes for k, v in n.env_dict().items()}
    ours = sorted(k for k in planned if k.startswith("SGLSEAT_"))
    assert ours, "the plan sets this project's variables"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SGL_", "SGLSEAT_"))}, **planned}
    env.pop("PYTHONPATH", None)  # ${watchdog_boot}: no probe in this child
    env["SGL_SEAT_CONTROL"] = "1"  # the control: an old-style name SGLang must warn about
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=CHILD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    messages: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    about_env = [m for m in messages if m.startswith("Environment variable")]
    assert [m for m in about_env if "SGL_SEAT_CONTROL" in m], messages  # the control: the check can fail
    assert [m for m in about_env if "SEAT" in m and "SGL_SEAT_CONTROL" not in m] == []
