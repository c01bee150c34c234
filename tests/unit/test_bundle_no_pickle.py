"""No code in sgl_seat/ may use pickle, marshal, dill, torch.load or allow_pickle=True (DESIGN section 6).

Loading any of those formats from an untrusted bundle runs code, which is how PyTorch's Flight Recorder
and SGLang's crash dumps fail (forensics anchors). The check reads Python *tokens*, so docstrings and
comments that state the rule ("no pickle") do not count; any name, attribute or keyword does.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BANNED_NAMES = {"pickle", "cPickle", "_pickle", "cloudpickle", "marshal", "dill", "allow_pickle"}


def _violations(path: Path, root: Path = ROOT) -> list[str]:
    out = []
    toks = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)]
    for i, t in enumerate(toks):
        if t.type == tokenize.NAME and t.string in BANNED_NAMES:
            out.append(f"{path.relative_to(root)}:{t.start[0]}: {t.string}")
        if (t.type == tokenize.NAME and t.string == "torch" and i + 2 < len(toks) and toks[i + 1].string == "."
                and toks[i + 2].string == "load"):
            out.append(f"{path.relative_to(root)}:{t.start[0]}: torch.load")
        if t.type == tokenize.STRING and any(b in t.string for b in ("import pickle", "import marshal", "import dill")):
            out.append(f"{path.relative_to(root)}:{t.start[0]}: pickle import in a string (exec?)")
    return out


def test_sgl_seat_has_no_pickle() -> None:
    files = sorted((ROOT / "sgl_seat").rglob("*.py"))
    assert len(files) > 10
    found = [v for f in files for v in _violations(f)]
    assert found == []


def test_the_checker_catches_what_it_must(tmp_path: Path) -> None:
    sample = tmp_path / "pkg" / "probe.py"
    sample.parent.mkdir()
    sample.write_text('"""no pickle here"""\nimport pickle  # bad\nx = torch . load(f)\n'
                      "np.load(f, allow_pickle=True)\nimport marshal, dill\n")
    v = _violations(sample, tmp_path)
    assert [s.split(": ")[1] for s in v] == ["pickle", "torch.load", "allow_pickle", "marshal", "dill"]
    assert all(s.startswith("pkg/probe.py:") for s in v)
