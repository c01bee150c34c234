"""No import circle inside ``sgl_seat/watchdog/``: its modules import each other one way.

Why: ``peers`` imported ``sidecar`` (for a type) while ``sidecar`` imported ``peers``; a circle like that works
only as long as nobody moves an import out of ``TYPE_CHECKING`` or reorders a module, and it hides which module
is the lower one. ``peers`` now names the little it calls on a sidecar as a protocol (``SidecarCore``).

The graph is built with the import walker of ``test_layers.py`` (every import: module level, inside functions,
under ``TYPE_CHECKING``, relative ones, ``importlib`` of a literal name) over every module under the package,
subpackages included (``watchdog/boot/``, and any that grows). An edge goes to the module named by the import
(the longest dotted prefix that is a module of the package); importing ``a.b.c`` does not add an edge to the
package ``a.b`` it sits in (Python runs that ``__init__`` first, but that is how a package works, not a circle
that a module wrote). The checker is tested on synthetic packages below, so it is known to be able to fail.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from test_layers import PKG, ROOT, imports_of, module_name

#: (importing module, line) for each import edge (importer, imported) between modules of the package.
Edges = dict[tuple[str, str], int]


def import_graph(pkg_dir: Path, package: str) -> tuple[dict[str, Path], Edges]:
    """Every module of ``package`` (a dotted name under ``pkg_dir``, searched recursively) and the imports
    between them, each with the line of its first import statement."""
    files = {module_name(f, pkg_dir): f for f in sorted(pkg_dir.parent.joinpath(*package.split(".")).rglob("*.py"))}
    edges: Edges = {}
    for mod, f in files.items():
        for imp in imports_of(f.read_text(encoding="utf-8"), mod, is_package=f.name == "__init__.py",
                              pkg_dir=pkg_dir):
            parts = imp.target.split(".")
            target = next((t for t in (".".join(parts[:n]) for n in range(len(parts), 0, -1)) if t in files), None)
            if target is not None and target != mod:
                edges.setdefault((mod, target), imp.line)
    return files, edges


def find_cycle(modules: list[str], edges: Edges) -> list[str] | None:
    """One import circle (``[a, b, ..., a]``), or None; deterministic (modules and edges in sorted order)."""
    out: dict[str, list[str]] = {m: [] for m in modules}
    for a, b in sorted(edges):
        out[a].append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in out[m]:
            if state.get(n) == 1:
                return [*path[path.index(n):], n]
            if n not in state and (found := visit(n)) is not None:
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(modules):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def cycle_message(cycle: list[str], files: dict[str, Path], edges: Edges, root: Path) -> str:
    steps = [f"  {files[a].relative_to(root)}:{edges[(a, b)]}: {a} imports {b}" for a, b in itertools.pairwise(cycle)]
    return ("import circle inside the package: " + " -> ".join(cycle) + "\n" + "\n".join(steps)
            + "\ncut it: the lower module names what it needs as a typing.Protocol (see watchdog/peers.py)")


def check(pkg_dir: Path, package: str, root: Path) -> str | None:
    files, edges = import_graph(pkg_dir, package)
    cycle = find_cycle(list(files), edges)
    return None if cycle is None else cycle_message(cycle, files, edges, root)


def test_no_import_circle_inside_the_watchdog() -> None:
    files, edges = import_graph(PKG, "sgl_seat.watchdog")
    assert len(files) > 10 and len(edges) > 10, "the walk found too few modules or imports in sgl_seat/watchdog/"
    problem = check(PKG, "sgl_seat.watchdog", ROOT)
    assert problem is None, problem


# -- the checker itself can fail ------------------------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A synthetic ``sgl_seat/watchdog`` under ``tmp_path``: {relative path: source}; returns its sgl_seat/."""
    pkg = tmp_path / "sgl_seat"
    for rel, src in {"__init__.py": "", "watchdog/__init__.py": "", **files}.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src, encoding="utf-8")
    return pkg


@pytest.mark.parametrize(("files", "circle"), [
    ({"watchdog/a.py": "from sgl_seat.watchdog.b import B\n", "watchdog/b.py": "from sgl_seat.watchdog import a\n"},
     "sgl_seat.watchdog.a -> sgl_seat.watchdog.b -> sgl_seat.watchdog.a"),
    ({"watchdog/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
      "watchdog/b.py": "def f():\n    from . import c\n",
      "watchdog/c.py": "import importlib\nimportlib.import_module('sgl_seat.watchdog.a')\n"},
     "sgl_seat.watchdog.a -> sgl_seat.watchdog.b -> sgl_seat.watchdog.c -> sgl_seat.watchdog.a"),
    ({"watchdog/sub/__init__.py": "from .x import X\n",
      "watchdog/sub/x.py": "import sgl_seat.watchdog.y\n",
      "watchdog/y.py": "from sgl_seat.watchdog.sub import X\n"},
     "sgl_seat.watchdog.sub -> sgl_seat.watchdog.sub.x -> sgl_seat.watchdog.y -> sgl_seat.watchdog.sub"),
    ({"watchdog/sub/__init__.py": "", "watchdog/sub/deep/__init__.py": "",
      "watchdog/sub/deep/x.py": "from ...z import Z\n",
      "watchdog/z.py": "def f():\n    import sgl_seat.watchdog.sub.deep.x\n"},
     "sgl_seat.watchdog.sub.deep.x -> sgl_seat.watchdog.z -> sgl_seat.watchdog.sub.deep.x"),
])
def test_a_circle_is_named_with_its_path(tmp_path: Path, files: dict[str, str], circle: str) -> None:
    got = check(_package(tmp_path, files), "sgl_seat.watchdog", tmp_path)
    assert got is not None
    assert circle in got, got
    assert "sgl_seat/watchdog/" in got and ".py:" in got, got


@pytest.mark.parametrize("files", [
    {"watchdog/a.py": "from sgl_seat.watchdog.b import B\nfrom sgl_seat.core import records\n",
     "watchdog/b.py": "import json\nfrom sgl_seat.errors import SeatError\n"},
    # a package's __init__ re-exporting its modules, which import each other and their package's siblings
    {"watchdog/sub/__init__.py": "from .x import X\nfrom .y import Y\n",
     "watchdog/sub/x.py": "from sgl_seat.watchdog.sub.y import Y\nfrom sgl_seat.watchdog import a\nX = (Y, a)\n",
     "watchdog/sub/y.py": "Y = 1\n", "watchdog/a.py": "A = 1\n"},
])
def test_one_way_imports_pass(tmp_path: Path, files: dict[str, str]) -> None:
    assert check(_package(tmp_path, files), "sgl_seat.watchdog", tmp_path) is None
