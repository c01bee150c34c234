"""``sgl_seat.sizing``'s public names: each is its submodule's own object, the lists that name them agree, and
importing the package loads none of its submodules (the sizing child imports it before SGLang)."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import sgl_seat.sizing as sizing

INIT = Path(sizing.__file__)


def _type_checking_imports() -> dict[str, str]:
    """Name -> submodule, from the ``if TYPE_CHECKING:`` block that mypy reads."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(INIT.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sgl_seat.sizing."):
            found.update({a.name: (node.module or "").rsplit(".", 1)[1] for a in node.names})
    return found


def test_every_public_name_is_its_submodules_object() -> None:
    homes = sizing._HOME
    assert sorted(sizing.__all__) == sorted(homes) and len(set(sizing.__all__)) == len(sizing.__all__)
    assert _type_checking_imports() == homes
    for name, home in homes.items():
        assert getattr(sizing, name) is getattr(importlib.import_module(f"sgl_seat.sizing.{home}"), name), name


def test_importing_the_package_loads_no_submodule() -> None:
    probe = "import json, sys, sgl_seat.sizing; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    mods = set(json.loads(out.stdout))
    assert sorted(m for m in mods if m.startswith("sgl_seat.sizing.") or m in ("sgl_seat.spec", "pydantic")) == []
