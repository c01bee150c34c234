"""Only the engine backends (``sgl_seat/engines/``) and the sim's own package spell an engine's words.

The house rule (ARCHITECTURE.md): a new engine is one module in ``engines/``. So no module elsewhere may hold an
engine's process title or metric name in a string, or compare a seat's ``engine`` with a name: it asks the engine's
backend (:class:`~sgl_seat.core.vocabulary.EngineWords`, :func:`sgl_seat.engines.backend_for`). Docstrings may name
them as examples; code may not. The checker is tested on synthetic sources below, so it is known to be able to fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.engines import backend_for, engine_names

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "sgl_seat"
#: Where an engine's words belong: its backend, and the stand-in engine's own package (it speaks SGLang's names).
ALLOWED = ("engines/", "sim/")


def engine_words() -> list[str]:
    """Every title, metric prefix and watchdog log line of every known engine: a string holding one spells its word."""
    out: set[str] = set()
    for name in engine_names():
        w = backend_for(name).words
        out |= {x for x in (w.title_prefix, w.rank_title, w.metric_prefix, w.synthetic_marker, w.hang_log_line,
                            *(t for t, _ in w.helper_titles)) if x}
    return sorted(out)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _is_engine(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "engine") or (
        isinstance(node, ast.Name) and node.id == "engine")


def _is_name_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_is_name_literal(e) for e in node.elts)


def violations(source: str, words: list[str]) -> list[str]:
    """``line: why`` for each string spelling an engine word, and each ``engine ==/!=/in`` a literal name."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            hit = next((w for w in words if w in node.value), None)
            if hit is not None:
                out.append(f"{node.lineno}: the string {node.value[:60]!r} spells the engine word {hit!r}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            ops_ok = any(isinstance(o, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for o in node.ops)
            if ops_ok and any(_is_engine(s) for s in sides) and any(_is_name_literal(s) for s in sides):
                out.append(f"{node.lineno}: compares `engine` with an engine's name")
    return out


def test_no_module_outside_the_backends_spells_an_engine_word() -> None:
    words = engine_words()
    assert "sglang::" in words and "sglang:" in words, words  # the list itself is the backends'
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith(ALLOWED):
            continue
        found += [f"sgl_seat/{rel}:{v}" for v in violations(path.read_text(encoding="utf-8"), words)]
    assert not found, "engine words outside engines/ (ask the backend's EngineWords):\n" + "\n".join(found)


@pytest.mark.parametrize(("source", "n"), [
    ('X = "sglang:num_running_reqs"\n', 1),
    ('def f(t):\n    return t.startswith("sglang::scheduler")\n', 1),
    ('def f(spec):\n    return spec.engine == "sglang"\n', 1),
    ('def f(engine):\n    return engine in ("sim", "sglang")\n', 1),
    ('"""Docs may say sglang::scheduler_TP1."""\n', 0),
    ('def f(spec, w):\n    return spec.engine == w.engine\n', 0),
    ('X = "sglang.srt.models.llama"  # a module path, not a word\n', 0),
])
def test_the_checker_can_fail(source: str, n: int) -> None:
    assert len(violations(source, ["sglang::", "sglang:"])) == n


def test_every_backend_words_name_its_engine() -> None:
    for name in engine_names():
        w = backend_for(name).words
        assert isinstance(w, EngineWords) and w.engine == name
