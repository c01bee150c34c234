"""SGLang's sizing answers kept on disk, keyed by everything they depend on.

Why: the answer is SGLang's own arithmetic, but reaching it costs an import of SGLang (torch, transformers,
its kernels' Python side: ~8 s of CPU on an idle machine) for milliseconds of arithmetic. ``plan`` and ``up``
of the same seat ask the same questions again and again, so an answer computed once is kept and read back
while nothing it depends on has changed. The key covers all of it:

- the installed SGLang distribution (its version and its RECORD, which lists every installed file's hash:
  a reinstall or a patched file is a new key), and this package's sizing driver (the child's source);
- the case itself: node 0's flags (``--model-path`` replaced by a hash of the small files in that
  directory, config.json above all; weights files are not read by sizing), the GPU memory figures, the
  per-case environment and the slot search;
- the ``SGLANG_*`` / ``SGL_*`` variables of this process, which the child inherits and SGLang reads.

Nothing is fitted or guessed: a miss runs SGLang's code and stores its answer; a hit returns that answer and
``plan`` says it was read from the cache. ``SGLSEAT_SIZING_CACHE=off`` (or ``0``) recomputes every time.
Entries are JSON (never pickle), one file per key, written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

CACHE_ENV = "SGLSEAT_SIZING_CACHE"
#: Bumped when the key or the entry layout changes (old entries are then simply never hit).
FORMAT = 1
#: Files in the model directory larger than this are weights or tokenizers, which sizing does not read.
_SMALL_FILE = 4 * 1024 * 1024
_CHILD_SOURCE = Path(__file__).with_name("child.py")


def cache_dir() -> Path | None:
    """``$SGLSEAT_HOME/cache/sizing`` (default home ``~/.sgl-seat``), or None when the cache is off."""
    if os.environ.get(CACHE_ENV, "on").strip().lower() in {"0", "off", "no", "false"}:
        return None
    home = os.environ.get("SGLSEAT_HOME")
    root = Path(home).expanduser() if home else Path.home() / ".sgl-seat"
    return root / "cache" / "sizing"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sglang_fingerprint() -> str:
    """The installed SGLang as sizing sees it: version, RECORD (every file's hash) and our driver's source."""
    try:
        dist = distribution("sglang")
    except PackageNotFoundError:
        return "absent"
    record = dist.read_text("RECORD") or ""
    child = _CHILD_SOURCE.read_bytes() if _CHILD_SOURCE.is_file() else b""
    return _sha(f"{dist.version}\n{_sha(record.encode())}\n{_sha(child)}".encode())


def model_dir_digest(model_dir: Path) -> str:
    """Hash of the small files of a model directory (name and bytes): what SGLang's config loading reads."""
    h = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        size = path.stat().st_size
        if size > _SMALL_FILE:
            h.update(f"{path.name}:{size}\n".encode())
            continue
        h.update(f"{path.name}:{_sha(path.read_bytes())}\n".encode())
    return h.hexdigest()


def case_key(case: Mapping[str, Any], *, fingerprint: str) -> str:
    """The key of one sizing case (its JSON form, as the child receives it)."""
    argv = [str(a) for a in case.get("argv", ())]
    if "--model-path" in argv:
        i = argv.index("--model-path")
        if i + 1 < len(argv) and Path(argv[i + 1]).is_dir():
            argv[i + 1] = "model-dir:" + model_dir_digest(Path(argv[i + 1]))
    env = {k: v for k, v in os.environ.items() if k.startswith(("SGLANG_", "SGL_")) and k != CACHE_ENV}
    doc = {"format": FORMAT, "sglang": fingerprint, "case": {**case, "id": None, "argv": argv}, "env": env}
    return _sha(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def load(key: str) -> dict[str, Any] | None:
    """The stored answer for ``key``, or None (no cache, no entry, or an unreadable one)."""
    root = cache_dir()
    if root is None:
        return None
    try:
        doc = json.loads((root / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("result"), dict):
        return None
    return doc


def store(key: str, result: Mapping[str, Any], *, sglang_version: str, stubs: list[str]) -> None:
    """Keep one answer (best effort: a cache that cannot be written only costs the next plan time)."""
    root = cache_dir()
    if root is None:
        return
    doc = {"format": FORMAT, "sglang_version": sglang_version, "stubs": stubs, "result": dict(result)}
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", dir=root)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, root / f"{key}.json")
    except OSError:
        return
