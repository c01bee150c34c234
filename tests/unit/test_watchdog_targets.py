"""The shipped SGLang probe targets name functions and parameters that exist in the installed sglang 0.5.23.

Read from source with ``ast`` (importing sglang's Engram layer needs GPU-side packages); skipped when sglang
is not installed (the contract suite's environment has it).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from sgl_seat.watchdog import probe
from sgl_seat.watchdog.targets import family_targets


def _source_of(module: str) -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return path if path.is_file() else None


@pytest.mark.parametrize("target", family_targets("DeepseekV4ForCausalLM"))
def test_engram_target_exists_with_its_size_parameter(target: str) -> None:
    t = probe.parse_target(target)
    path = _source_of(t.module)
    if path is None:
        pytest.skip("sglang is not installed")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scope: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in t.qualname.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        assert node is not None, f"{t.qualname} not found in {path}"
        scope = node.body if isinstance(node, ast.ClassDef) else []
    assert isinstance(node, ast.FunctionDef)
    if isinstance(t.size_arg, str):
        params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
        assert t.size_arg in params, f"{t.qualname}({', '.join(params)}) has no {t.size_arg}"
