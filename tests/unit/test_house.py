"""The house a newcomer walks into: rooms of a readable size, one name per file, thin commands, tests and benches apart.

Why: a package of 25 modules flat, two files called ``html.py``, a 360-line command module and a test that loads
a bench script each cost a reader time before they cost anything else. The rules, checked on the tree:

- no package under ``sgl_seat/`` holds more than 15 modules at one level (its ``__init__`` counted);
- no two modules under ``sgl_seat/`` share a file name (``__init__.py`` aside);
- no module under ``sgl_seat/cli/`` is over 150 lines: a command parses, calls one library function and prints;
- no module under ``bench/`` imports from ``tests/``, and no test imports or loads a file under ``bench/``: what
  both need lives in the library or in ``rigs/``, which imports neither.

Each rule is a function of a tree, and each is run on a synthetic tree below too, so it is known to be able to fail.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULES = 15
MAX_CLI_LINES = 150


def crowded_packages(pkg: Path) -> list[str]:
    """Packages with more than MAX_MODULES modules at one level."""
    out = []
    for d in sorted([pkg, *(p.parent for p in pkg.rglob("__init__.py"))]):
        n = len(list(d.glob("*.py")))
        if n > MAX_MODULES:
            out.append(f"{d.relative_to(pkg.parent)}: {n} modules (at most {MAX_MODULES}): group them by job")
    return sorted(set(out))


def shared_names(pkg: Path) -> list[str]:
    """File names that two or more modules share."""
    names = Counter(p.name for p in pkg.rglob("*.py") if p.name != "__init__.py")
    return sorted(f"{name}: " + ", ".join(str(p.relative_to(pkg.parent)) for p in sorted(pkg.rglob(name)))
                  for name, n in names.items() if n > 1)


def fat_commands(cli: Path) -> list[str]:
    out = []
    for p in sorted(cli.glob("*.py")):
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_CLI_LINES:
            out.append(f"{p.name}: {n} lines (at most {MAX_CLI_LINES}): move the work into the library")
    return out


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every import, wherever it stands."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
    return out


def crossings(root: Path) -> list[str]:
    """Bench modules that import tests, and tests that import or load a bench file (an import of ``bench``, or a
    string that names a ``.py`` file under ``bench/``, or ``"bench"`` joined to a path)."""
    out = []
    for p in sorted((root / "bench").rglob("*.py")):
        for line, name in _imports(ast.parse(p.read_text(encoding="utf-8"))):
            if name == "tests" or name.startswith("tests."):
                out.append(f"{p.relative_to(root)}:{line}: a bench imports {name} (move what both need to rigs/)")
    for p in sorted((root / "tests").rglob("*.py")):
        if p.name == Path(__file__).name:  # this checker's own synthetic trees name bench files on purpose
            continue
        tree = ast.parse(p.read_text(encoding="utf-8"))
        for line, name in _imports(tree):
            if name == "bench" or name.startswith("bench."):
                out.append(f"{p.relative_to(root)}:{line}: a test imports {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) \
                    and isinstance(node.right, ast.Constant) and node.right.value == "bench":
                out.append(f"{p.relative_to(root)}:{node.lineno}: a test opens a path under bench/")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith("bench/") and node.value.endswith(".py") and " " not in node.value:
                out.append(f"{p.relative_to(root)}:{node.lineno}: a test names the bench file {node.value}")
    return out


def test_no_package_is_crowded() -> None:
    assert crowded_packages(ROOT / "sgl_seat") == []


def test_no_two_modules_share_a_file_name() -> None:
    assert shared_names(ROOT / "sgl_seat") == []


def test_commands_are_thin() -> None:
    assert len(list((ROOT / "sgl_seat" / "cli").glob("cmd_*.py"))) >= 5, "the walk found too few command modules"
    assert fat_commands(ROOT / "sgl_seat" / "cli") == []


def test_tests_and_benches_stand_apart() -> None:
    assert len(list((ROOT / "bench").rglob("*.py"))) > 10 and len(list((ROOT / "tests").rglob("*.py"))) > 50
    assert crossings(ROOT) == []


def test_the_rigs_import_neither_tests_nor_benches() -> None:
    rigs = sorted((ROOT / "rigs").glob("*.py"))
    assert len(rigs) >= 3
    bad = [f"{p.name}:{line}: {name}" for p in rigs for line, name in _imports(ast.parse(p.read_text()))
           if name.split(".")[0] in ("tests", "bench")]
    assert bad == []


# -- the rules can fail ---------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return tmp_path


def test_a_crowded_package_and_a_shared_name_are_named(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": "", **{f"pkg/flat/m{i}.py": "" for i in range(MAX_MODULES)},
             "pkg/flat/__init__.py": "", "pkg/a/__init__.py": "", "pkg/a/html.py": "", "pkg/b/__init__.py": "",
             "pkg/b/html.py": ""}
    root = _tree(tmp_path, files)
    assert crowded_packages(root / "pkg") == [f"pkg/flat: {MAX_MODULES + 1} modules (at most 15): group them by job"]
    assert shared_names(root / "pkg") == ["html.py: pkg/a/html.py, pkg/b/html.py"]


def test_a_fat_command_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"cli/cmd_a.py": "x = 1\n" * MAX_CLI_LINES, "cli/cmd_b.py": "x = 1\n" * (MAX_CLI_LINES + 1)})
    assert fat_commands(root / "cli") == [f"cmd_b.py: {MAX_CLI_LINES + 1} lines (at most 150): move the work into "
                                          "the library"]


@pytest.mark.parametrize(("files", "expect"), [
    ({"bench/b.py": "from tests.simrig import SimSeat\n"}, "bench/b.py:1: a bench imports tests.simrig"),
    ({"bench/b.py": "def f():\n    import tests.integration.util\n"}, "bench/b.py:2: a bench imports tests"),
    ({"tests/t.py": "import bench.soak\n"}, "tests/t.py:1: a test imports bench.soak"),
    ({"tests/t.py": "from pathlib import Path\nB = Path(__file__).parents[1] / 'bench' / 'soak.py'\n"},
     "tests/t.py:2: a test opens a path under bench/"),
    ({"tests/t.py": "import runpy\nrunpy.run_path('bench/soak.py')\n"}, "tests/t.py:2: a test names the bench file"),
])
def test_a_crossing_is_named(tmp_path: Path, files: dict[str, str], expect: str) -> None:
    got = crossings(_tree(tmp_path, {"bench/x.py": "", "tests/y.py": "", **files}))
    assert len(got) == 1 and got[0].startswith(expect), got


def test_a_comment_naming_a_bench_is_not_a_crossing(tmp_path: Path) -> None:
    files = {"tests/t.py": '"""Its long form is bench/watchdog_soak.py."""\n# see bench/soak.py\nX = 1\n',
             "bench/b.py": "import rigs.simrig\n"}
    assert crossings(_tree(tmp_path, files)) == []
