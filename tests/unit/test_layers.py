"""Imports run one way: a package imports only from its own layer or a lower one, and nothing imports tests.

The layers, low to high (ARCHITECTURE.md describes them):

    L0  errors, deadline, niceness, netports, procstate, envcompat (and the package root, which runs envcompat);
        probe (the in-engine probe: it imports nothing of sgl-seat, only its own modules)
    L1  core (records, observation, frames, detectors), spec, topology
    L2  sizing (the KV pool and slot ceiling), engines (the engine backends: everything engine-specific)
    L3  plan
    L4  forensics (may import core, never watchdog)
    L5  watchdog
    L6  launch
    L7  gate (the A/B battery: brings arms up and down through launch)
    L8  cli

``sgl_seat.sim`` is the stand-in engine process, apart from the stack: it imports only ``errors``,
``topology``, ``netports`` and its own modules, and only ``sgl_seat.engines.sim`` (the sim's backend) imports it.

Every import is checked: module level, inside functions, under ``TYPE_CHECKING``, relative ones, and
``importlib.import_module`` / ``__import__`` of a literal name. A violation names the file, the line and
the rule it breaks. And no import circle anywhere under ``sgl_seat/``: an edge goes to the module named by the
import (the longest dotted prefix that is a module); importing ``a.b.c`` does not add an edge to the package ``a.b``
it sits in (Python runs that ``__init__`` first, but that is how a package works, not a circle a module wrote).
Both checkers are tested on synthetic modules below, so they are known to be able to fail.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "sgl_seat"

#: Layer of each top-level name under ``sgl_seat`` (a module or a package). ``""`` is the package root.
LAYERS: dict[str, int] = {
    "": 0, "errors": 0, "deadline": 0, "niceness": 0, "netports": 0, "procstate": 0, "envcompat": 0, "probe": 0,
    "core": 1, "spec": 1, "topology": 1,
    "sizing": 2, "engines": 2,
    "plan": 3,
    "forensics": 4,
    "watchdog": 5,
    "launch": 6,
    "gate": 7,
    "cli": 8,
}
LAYER_NAMES = {0: "errors", 1: "core/spec/topology", 2: "sizing/engines", 3: "plan", 4: "forensics",
               5: "watchdog", 6: "launch", 7: "gate", 8: "cli"}
DIRECTION = " < ".join(f"L{n} {name}" for n, name in sorted(LAYER_NAMES.items()))

SIM = "sim"
#: What the sim may import besides its own modules. ``netports`` (standard library only): the sim picks its
#: rendezvous port as the tests, the benches and the local cluster pick theirs, from the one helper.
SIM_MAY_IMPORT = {"", "errors", "topology", "netports", "probe"}
#: The in-engine probe loads by path into engine interpreters that may lack sgl-seat: it imports nothing of it.
PROBE = "probe"
#: The only module outside the sim that may import it.
SIM_BACKEND = "sgl_seat.engines.sim"

#: Imports against the rules that are deliberate, each with its reason (module, imported module).
EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True, slots=True)
class Import:
    line: int
    target: str  # the dotted module imported (``sgl_seat.x.y`` or anything else)


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_submodule(pkg_dir: Path, dotted: str) -> bool:
    """Does ``dotted`` (``sgl_seat.a.b``) name a module or package on disk under ``pkg_dir``'s parent?"""
    p = pkg_dir.parent.joinpath(*dotted.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports_of(source: str, module: str, *, is_package: bool, pkg_dir: Path = PKG) -> Iterator[Import]:
    """Every module ``source`` imports, wherever the statement is (functions, TYPE_CHECKING, try)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                # ``from sgl_seat import forensics`` imports the package sgl_seat.forensics.
                yield Import(node.lineno, sub if _is_submodule(pkg_dir, sub) else target)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in ("import_module", "__import__"):
                yield Import(node.lineno, node.args[0].value)


def top(dotted: str) -> str | None:
    """The top-level name under sgl_seat (``""`` for the root), or None outside sgl_seat."""
    parts = dotted.split(".")
    if parts[0] != "sgl_seat":
        return None
    return parts[1] if len(parts) > 1 else ""


def layer_of(name: str) -> int | None:
    return LAYERS.get(name)


def violations(label: str, module: str, source: str, *, is_package: bool = False,
               pkg_dir: Path = PKG) -> list[str]:
    """What in ``source`` (module ``module``, shown as ``label``) runs against the layers."""
    out: list[str] = []
    mine = top(module)
    assert mine is not None, module
    for imp in imports_of(source, module, is_package=is_package, pkg_dir=pkg_dir):
        where = f"{label}:{imp.line}: {module} imports {imp.target}"
        if imp.target == "tests" or imp.target.startswith("tests."):
            out.append(f"{where}: nothing under sgl_seat/ may import from tests/ (test code stays out of the wheel)")
            continue
        theirs = top(imp.target)
        if theirs is None or (module, imp.target) in EXCEPTIONS:
            continue
        if mine == PROBE:
            if theirs != PROBE:
                out.append(f"{where}: the probe (loaded by path into engines without sgl-seat) imports nothing of "
                           "sgl-seat but its own modules")
            continue
        if mine == SIM:
            if theirs != SIM and theirs not in SIM_MAY_IMPORT:
                out.append(f"{where}: the sim (the stand-in engine process) imports only sgl_seat.errors, "
                           "sgl_seat.topology, sgl_seat.netports and its own modules")
            continue
        if theirs == SIM:
            if module != SIM_BACKEND:
                out.append(f"{where}: only {SIM_BACKEND} (the sim's backend) may import the sim; go through "
                           "the engine backend (sgl_seat.engines.backend_for)")
            continue
        lo, hi = layer_of(theirs), layer_of(mine)
        if lo is None or hi is None:
            unknown = theirs if lo is None else mine
            out.append(f"{where}: sgl_seat.{unknown} has no layer; add it to LAYERS in tests/unit/test_layers.py "
                       "(and to ARCHITECTURE.md)")
        elif lo > hi:
            out.append(f"{where}: L{hi} {LAYER_NAMES[hi]} may not import L{lo} {LAYER_NAMES[lo]} "
                       f"(a package imports only from its own layer or lower: {DIRECTION})")
    return out


def _sources() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_no_import_runs_against_the_layers() -> None:
    files = _sources()
    assert len(files) > 60, "the walk found too few modules to be looking at sgl_seat/"
    found = [v for f in files
             for v in violations(str(f.relative_to(ROOT)), module_name(f, PKG), f.read_text(encoding="utf-8"),
                                 is_package=f.name == "__init__.py")]
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_every_top_level_module_has_a_layer() -> None:
    names = {p.stem if p.is_file() else p.name for p in PKG.iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert names, "no modules found"
    assert sorted(n for n in names if n != SIM and layer_of(n) is None) == []


def test_the_documented_exceptions_are_still_needed() -> None:
    """An exception whose import is gone must go too (it would otherwise hide a future import)."""
    for (module, target), why in EXCEPTIONS.items():
        assert why
        path = PKG.parent.joinpath(*module.split(".")).with_suffix(".py")
        assert any(i.target == target for i in imports_of(path.read_text(encoding="utf-8"), module,
                                                          is_package=False)), (module, target)


# -- the checker itself can fail ------------------------------------------------------------------


@pytest.mark.parametrize(("module", "source", "line", "rule"), [
    ("sgl_seat.plan", "from sgl_seat.watchdog.targets import family_targets\n", 1, "L3 plan may not import L5"),
    ("sgl_seat.plan", "def f():\n    from sgl_seat.launch import cluster\n", 2, "L3 plan may not import L6"),
    ("sgl_seat.forensics.replay.analysis",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sgl_seat.watchdog.sidecar import Sidecar\n", 3,
     "L4 forensics may not import L5"),
    ("sgl_seat.forensics.replay.analysis", "from ...watchdog import sampler\n", 1, "L4 forensics may not import L5"),
    ("sgl_seat.core.detect", "from sgl_seat import launch\n", 1, "L1 core/spec/topology may not import L6"),
    ("sgl_seat.engines.base", "import sgl_seat.launch.probes\n", 1, "L2 sizing/engines may not import L6"),
    ("sgl_seat.watchdog.sidecar", "from sgl_seat.launch.cluster import bounded\n", 1,
     "L5 watchdog may not import L6"),
    ("sgl_seat.launch.sidecars", "import importlib\nimportlib.import_module('sgl_seat.cli.main')\n", 2,
     "L6 launch may not import L8"),
    ("sgl_seat.launch.actors.agent", "from sgl_seat.sim.contract import ADMIN_HOST\n", 1, "only sgl_seat.engines.sim"),
    ("sgl_seat.sim.scheduler", "from sgl_seat.plan import build_plan\n", 1, "the sim (the stand-in engine process)"),
    ("sgl_seat.sim.node", "x = __import__('sgl_seat.launch.host.processgroups')\n", 1,
     "the sim (the stand-in engine process)"),
    ("sgl_seat.watchdog.actors", "from tests.simrig import SimSeat\n", 1, "may import from tests/"),
    ("sgl_seat.newthing", "import sgl_seat.errors\n", 1, "sgl_seat.newthing has no layer"),
    ("sgl_seat.sizing_extra", "import sgl_seat.errors\n", 1, "sgl_seat.sizing_extra has no layer"),
    ("sgl_seat.probe.ring", "from sgl_seat.core.records import ProbeRecord\n", 1, "the probe (loaded by path"),
    ("sgl_seat.probe.writer", "from sgl_seat.errors import SeatError\n", 1, "imports nothing of sgl-seat"),
])
def test_a_bad_import_is_named_with_file_line_and_rule(module: str, source: str, line: int, rule: str) -> None:
    got = violations("x.py", module, source)
    assert len(got) == 1, got
    assert got[0].startswith(f"x.py:{line}: {module} imports "), got
    assert rule in got[0], got


@pytest.mark.parametrize(("module", "source"), [
    ("sgl_seat.cli.cmd_up", "from sgl_seat.launch import up\nfrom sgl_seat.plan import build_plan\n"),
    ("sgl_seat.watchdog.capture", "from sgl_seat.forensics import write_bundle\nfrom sgl_seat.core import detect\n"),
    ("sgl_seat.engines.sim", "from sgl_seat.sim.args import ENV_FAULTS\n"),
    ("sgl_seat.sim.contract", "from sgl_seat.topology import scheduler_title\nfrom . import logs\n"),
    ("sgl_seat.forensics.format.bundle", "from sgl_seat import __version__\nimport json\n"),
    ("sgl_seat.sizing.capacity", "from sgl_seat.spec import SeatSpec\nfrom sgl_seat.sizing import mirror\n"),
])
def test_imports_along_the_direction_pass(module: str, source: str) -> None:
    assert violations("x.py", module, source) == []


# -- import circles ----------------------------------------------------------------------------------


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
    return ("import circle: " + " -> ".join(cycle) + "\n" + "\n".join(steps)
            + "\ncut it: the lower module names what it needs as a typing.Protocol (see watchdog/peers.py)")


def check(pkg_dir: Path, package: str, root: Path) -> str | None:
    files, edges = import_graph(pkg_dir, package)
    cycle = find_cycle(list(files), edges)
    return None if cycle is None else cycle_message(cycle, files, edges, root)


def test_no_import_circle_anywhere() -> None:
    """Why: a circle works only as long as nobody moves an import out of ``TYPE_CHECKING`` or reorders a module,
    and it hides which module is the lower one (the supervisor restarts engines with ``launch/bringup``, which
    sits below both it and ``launch/up``, so neither imports the other)."""
    files, edges = import_graph(PKG, "sgl_seat")
    assert len(files) > 100 and len(edges) > 300, "the walk found too few modules or imports in sgl_seat/"
    problem = check(PKG, "sgl_seat", ROOT)
    assert problem is None, problem


# -- the circle checker itself can fail -----------------------------------------------------------


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


# -- folder-level loops ---------------------------------------------------------------------------------------


def folder_of(module: str, files: dict[str, Path]) -> str:
    """The folder a module lives in: its package (``sgl_seat.forensics.format.merge`` -> ``sgl_seat.forensics.format``;
    a package's ``__init__`` is its own folder); a module at the top of ``sgl_seat`` is a room of its own
    (``sgl_seat.plan``), since every folder imports the root's small modules and the root's modules import folders."""
    f = files[module]
    if f.name == "__init__.py":
        return module
    parent = module.rsplit(".", 1)[0]
    return module if parent == "sgl_seat" else parent


def _nested(a: str, b: str) -> bool:
    """One folder holds the other (``sgl_seat.sim`` and ``sgl_seat.sim.front``)."""
    return a.startswith(b + ".") or b.startswith(a + ".")


def folder_graph(pkg_dir: Path, package: str) -> tuple[dict[str, Path], Edges, dict[tuple[str, str], tuple[str, str]]]:
    """The folders of ``package`` and the imports between them: for each folder edge, the first module edge
    (importer, imported) that makes it. Imports between a folder and one inside it are not edges: a subfolder is a
    part of its folder (``launch/actors`` runs ``launch``'s bring-up, and ``launch/up`` starts the actors), as a
    module is of its package; a loop counts between folders side by side or across the house."""
    files, edges = import_graph(pkg_dir, package)
    folders = {folder_of(m, files) for m in files}
    fedges: Edges = {}
    why: dict[tuple[str, str], tuple[str, str]] = {}
    for (a, b), line in sorted(edges.items()):
        fa, fb = folder_of(a, files), folder_of(b, files)
        if fa != fb and not _nested(fa, fb) and (fa, fb) not in fedges:
            fedges[(fa, fb)] = line
            why[(fa, fb)] = (a, b)
    return {f: files.get(f, pkg_dir) for f in folders}, fedges, why


def check_folders(pkg_dir: Path, package: str, root: Path) -> str | None:
    files, fedges, why = folder_graph(pkg_dir, package)
    cycle = find_cycle(list(files), fedges)
    if cycle is None:
        return None
    mods, _ = import_graph(pkg_dir, package)
    steps = []
    for a, b in itertools.pairwise(cycle):
        ma, mb = why[(a, b)]
        steps.append(f"  {mods[ma].relative_to(root)}:{fedges[(a, b)]}: {ma} imports {mb}")
    return ("folder loop: " + " -> ".join(cycle) + "\n" + "\n".join(steps)
            + "\ncut it: move what both need to the lower folder, or name it there as a typing.Protocol")


def test_no_loop_between_folders() -> None:
    """Why (the house issue): no module-level circle remained while whole folders still leaned on each other
    (``engines`` and ``watchdog``: the watchdog's config imported engines while the SGLang backend reached into the
    probe under watchdog/; ``forensics/format`` and ``forensics/replay``). A loop of folders has no lower one, so
    neither can be read, tested or replaced alone."""
    files, fedges, _ = folder_graph(PKG, "sgl_seat")
    assert len(files) > 20 and len(fedges) > 40, "the walk found too few folders or imports in sgl_seat/"
    problem = check_folders(PKG, "sgl_seat", ROOT)
    assert problem is None, problem


@pytest.mark.parametrize(("files", "loop"), [
    # two folders, no module circle: a -> sub2.y, sub2.z -> sub1.x where sub1 holds a
    ({"watchdog/sub1/__init__.py": "", "watchdog/sub1/a.py": "from sgl_seat.watchdog.sub2 import y\n",
      "watchdog/sub1/x.py": "X = 1\n", "watchdog/sub2/__init__.py": "", "watchdog/sub2/y.py": "Y = 1\n",
      "watchdog/sub2/z.py": "from sgl_seat.watchdog.sub1.x import X\n"},
     "sgl_seat.watchdog.sub1 -> sgl_seat.watchdog.sub2 -> sgl_seat.watchdog.sub1"),
    # cousins: a/x -> b/c/y, b/c/z -> a/w
    ({"watchdog/a/__init__.py": "", "watchdog/a/x.py": "from sgl_seat.watchdog.b.c.y import Y\n",
      "watchdog/a/w.py": "W = 1\n", "watchdog/b/__init__.py": "", "watchdog/b/c/__init__.py": "",
      "watchdog/b/c/y.py": "Y = 1\n", "watchdog/b/c/z.py": "from sgl_seat.watchdog.a import w\n"},
     "sgl_seat.watchdog.a -> sgl_seat.watchdog.b.c -> sgl_seat.watchdog.a"),
])
def test_a_folder_loop_is_named_with_the_imports_that_make_it(tmp_path: Path, files: dict[str, str],
                                                               loop: str) -> None:
    pkg = _package(tmp_path, files)
    assert check(pkg, "sgl_seat.watchdog", tmp_path) is None  # no module circle: only the folders loop
    got = check_folders(pkg, "sgl_seat.watchdog", tmp_path)
    assert got is not None and loop in got, got
    assert "sgl_seat/watchdog/" in got and ".py:" in got, got


@pytest.mark.parametrize("files", [
    {"watchdog/sub1/__init__.py": "", "watchdog/sub1/a.py": "from ..sub2 import y\n",
     "watchdog/sub2/__init__.py": "", "watchdog/sub2/y.py": "from sgl_seat.watchdog import b\n",
     "watchdog/b.py": "B = 1\n"},
    # a folder and one inside it, both ways: part and whole, not a loop
    {"watchdog/top.py": "from sgl_seat.watchdog.sub.x import X\n", "watchdog/other.py": "O = 1\n",
     "watchdog/sub/__init__.py": "", "watchdog/sub/x.py": "from sgl_seat.watchdog.other import O\nX = O\n"},
])
def test_folders_imported_one_way_pass(tmp_path: Path, files: dict[str, str]) -> None:
    assert check_folders(_package(tmp_path, files), "sgl_seat.watchdog", tmp_path) is None
