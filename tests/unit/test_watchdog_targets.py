"""The shipped SGLang probe targets name functions and parameters that exist in the installed sglang (0.5.23).

Read from source with ``ast`` (importing sglang's Engram layer needs GPU-side packages); skipped when sglang
is not installed (the contract suite's environment has it).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from sgl_seat import probe
from sgl_seat.engines.family_targets import family_targets


def _source_of(module: str) -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return path if path.is_file() else None


def _find(path: Path, qualname: str) -> ast.AST | None:
    """The def of ``qualname`` in ``path``; a module-level name bound by ``from X import name`` is followed to X
    (the probe wraps the binding the module's own code calls)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    scope: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None and i == 0:
            for imp in (n for n in scope if isinstance(n, ast.ImportFrom) and n.module):
                if any((a.asname or a.name) == part for a in imp.names):
                    src = _source_of(str(imp.module))
                    return _find(src, ".".join(parts)) if src else None
        if node is None:
            return None
        scope = node.body if isinstance(node, ast.ClassDef) else []
    return node


#: The SGLang families of ``watchdog/probe-targets.yaml`` (every one but the sim's), each target checked once.
SGLANG_TARGETS = sorted({t for fam in ("DeepseekV4ForCausalLM", "LlamaForCausalLM", "Qwen3MoeForCausalLM")
                         for t in family_targets(fam)})


def test_every_sglang_family_has_targets() -> None:
    """An empty family (a renamed key) would leave the check below with nothing to check."""
    for fam in ("DeepseekV4ForCausalLM", "LlamaForCausalLM", "Qwen3MoeForCausalLM"):
        assert family_targets(fam), fam
    assert any(probe.parse_target(t).runner_link for t in SGLANG_TARGETS)


@pytest.mark.parametrize("target", SGLANG_TARGETS)
def test_sglang_target_exists_with_its_size_parameter(target: str) -> None:
    """Its function exists and so does the parameter it names (the gather, a graph's shape key, a link's runner)."""
    t = probe.parse_target(target)
    path = _source_of(t.module)
    if path is None:
        pytest.skip("sglang is not installed")
    node = _find(path, t.qualname)
    assert isinstance(node, ast.FunctionDef), f"{t.qualname} not found in {path} (or where it imports it from)"
    if isinstance(t.size_arg, str):
        params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
        assert t.size_arg in params, f"{t.qualname}({', '.join(params)}) has no {t.size_arg}"
