"""`sgl-seat engine pack`: an engine environment for a GPU host that has no package registry, as files to carry.

Plan first, then apply: the wheels the target pins are fetched from the registry this machine uses (``pip download``
for the target's Python and platforms, no dependency resolution: the pins are the whole set), laid out with
``pip install --target --no-deps``, trimmed by the target's rules, their debug sections stripped where named, then
one ``.tar.xz`` with a manifest (schema_version 1: every file's sha256 and size, the versions, what was left out and
why, the archive's and each part's digest), optionally split into parts of a given size. Beside it goes
``hostlayout.py`` (standard library only), which lays the package out on the host and runs the target's check.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sgl_seat.engines.offline import hostlayout
from sgl_seat.engines.offline.packtargets import PackTarget, TrimRule
from sgl_seat.errors import UsageError

MANIFEST_SCHEMA_VERSION = hostlayout.MANIFEST_SCHEMA_VERSION
MANIFEST = hostlayout.MANIFEST


@dataclass(frozen=True, slots=True)
class LeftOut:
    pattern: str
    reason: str
    files: int
    bytes: int


@dataclass(slots=True)
class PackResult:
    target: str
    directory: Path
    archive: str
    archive_bytes: int
    unpacked_bytes: int
    files: int
    parts: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["directory"] = str(self.directory)
        return doc


def matches(site: Path, rule: TrimRule) -> list[Path]:
    """Every file under ``site`` the rule takes out (a matched directory takes its whole tree)."""
    out: list[Path] = []
    for p in sorted(site.glob(rule.pattern)):
        out += sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p] if p.is_file() else []
    return out


def trim(site: Path, rules: Iterable[TrimRule]) -> list[LeftOut]:
    """Remove what each rule matches; a rule that matches nothing is an error (the wheel it was written for moved
    a file, or the pins changed): the rules say exactly what the package leaves out."""
    out = []
    for rule in rules:
        found = matches(site, rule)
        if not found:
            raise UsageError(f"trim rule {rule.pattern!r} matches nothing under {site}",
                             fix="the pinned wheels changed: update the target's trim rules in "
                                 "engines/offline/packtargets.py")
        out.append(LeftOut(rule.pattern, rule.reason, len(found), sum(f.stat().st_size for f in found)))
        for f in found:
            f.unlink()
        for d in sorted((p for p in site.glob(rule.pattern) if p.is_dir()), reverse=True):
            shutil.rmtree(d)  # the directories a rule named, emptied above
    return out


def file_table(site: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {sha256, size}} of every file under ``site`` (links are refused: a package carries files)."""
    table: dict[str, dict[str, Any]] = {}
    for f in sorted(site.rglob("*")):
        if f.is_symlink():
            raise UsageError(f"{f} is a symbolic link: the package carries plain files only")
        if f.is_file():
            table[f.relative_to(site).as_posix()] = {"sha256": hostlayout.sha256_of(str(f)), "size": f.stat().st_size}
    return table


def write_archive(site: Path, archive: Path, *, preset: int = 9) -> None:
    """``site`` as ``archive`` (.tar.xz), deterministic: sorted names, no owners, one mtime. The ``xz`` binary with
    threads when there is one (it is the slow part), else Python's lzma."""
    tmp_tar = archive.with_suffix("")  # .tar
    with tarfile.open(tmp_tar, "w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(site.rglob("*")):
            info = tar.gettarinfo(str(f), arcname=f"site/{f.relative_to(site).as_posix()}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if f.is_file():
                with f.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    xz = shutil.which("xz")
    if xz:
        subprocess.run([xz, f"-{preset}", "-T0", "-f", str(tmp_tar)], check=True)
        os.replace(str(tmp_tar) + ".xz", archive)
    else:  # pragma: no cover - every supported machine has xz
        with tmp_tar.open("rb") as src, lzma.open(archive, "wb", preset=preset) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        tmp_tar.unlink()


def split(archive: Path, part_bytes: int) -> list[dict[str, Any]]:
    """Cut ``archive`` into ``<name>.partNN`` files of at most ``part_bytes`` (the archive is then removed)."""
    parts = []
    with archive.open("rb") as src:
        for n in range(1000):
            chunk = src.read(part_bytes)
            if not chunk:
                break
            p = archive.with_name(f"{archive.name}.part{n:02d}")
            p.write_bytes(chunk)
            parts.append({"name": p.name, "sha256": hashlib.sha256(chunk).hexdigest(), "size": len(chunk)})
    archive.unlink()
    return parts


def pip_fetch(t: PackTarget, wheels: Path, say: Callable[[str], None]) -> None:
    """The target's pinned wheels into ``wheels`` (already there: kept)."""
    plat = [a for p in t.platforms for a in ("--platform", p)]
    wheels.mkdir(parents=True, exist_ok=True)
    reqs = wheels / "pins.txt"
    reqs.write_text("\n".join(t.pins) + "\n")
    say(f"fetching {len(t.pins)} pinned wheels for Python {t.python} into {wheels}")
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *plat,
          "--python-version", t.python, "--implementation", "cp", "-d", str(wheels), "-r", str(reqs)])


def checkout_wheel(wheels: Path, say: Callable[[str], None]) -> Path:
    """sgl-seat itself as a wheel, built from the checkout this code runs from (``pip wheel --no-deps``)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file():
        raise UsageError("this target carries sgl-seat itself, built from a checkout, and this sgl-seat is installed "
                         "from a wheel", fix="run `sgl-seat engine pack` from a checkout of sgl-seat")
    for old in wheels.glob("sgl_seat-*.whl"):
        old.unlink()
    say(f"building sgl-seat's own wheel from {root}")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels),
          str(root)])
    (built,) = wheels.glob("sgl_seat-*.whl")
    return built


def pip_layout(t: PackTarget, wheels: Path, site: Path) -> None:
    plat = [a for p in t.platforms for a in ("--platform", p)]
    wanted = {p.split("==")[0].lower().replace("-", "_") for p in t.pins} | ({"sgl_seat"} if t.from_checkout else set())
    files = sorted(w for w in wheels.glob("*.whl") if w.name.split("-")[0].lower() in wanted)
    if len(files) != len(wanted):
        raise UsageError(f"{len(files)} wheels found in {wheels} for {len(t.pins)} pins",
                         fix="remove the wheel cache directory and pack again")
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--only-binary=:all:", *plat,
          "--python-version", t.python, "--implementation", "cp", "--target", str(site), *map(str, files)])


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise UsageError(f"{' '.join(argv[:5])} ... failed ({proc.returncode}):\n{proc.stderr.strip()[-2000:]}",
                         fix="check the registry this machine uses (pip config list) and the target's pins")


def strip_debug(site: Path, patterns: Iterable[str]) -> list[str]:
    strip = shutil.which("strip")
    done = []
    for pat in patterns:
        for f in sorted(site.glob(pat)):
            if strip:
                subprocess.run([strip, "--strip-debug", str(f)], check=True)
                done.append(f.relative_to(site).as_posix())
    return done


def pack(t: PackTarget, out: Path, *, cache: Path, part_bytes: int | None = None,
         say: Callable[[str], None] = lambda s: None) -> PackResult:
    """Build the target's package under ``out`` (made empty first) and return what it holds."""
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise UsageError(f"{out} is not empty and holds no engine package: pack will not empty it",
                         fix="name a new directory with --out, or an earlier package's to replace it")
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    wheels = cache / t.name
    pip_fetch(t, wheels, say)
    if t.from_checkout:
        checkout_wheel(wheels, say)
    seconds["fetch"] = time.monotonic() - t0
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    work = out / ".site"
    t0 = time.monotonic()
    say(f"laying out {len(t.pins)} wheels (pip install --target --no-deps)")
    pip_layout(t, wheels, work)
    seconds["layout"] = time.monotonic() - t0
    t0 = time.monotonic()
    left = trim(work, t.trim)
    stripped = strip_debug(work, t.strip_debug)
    table = file_table(work)
    seconds["trim"] = time.monotonic() - t0
    say(f"left out {sum(x.bytes for x in left) / 2**20:,.1f} MiB by {len(left)} rules; "
        f"{sum(e['size'] for e in table.values()) / 2**20:,.1f} MiB in {len(table)} files to carry")
    archive = out / f"{t.name}.tar.xz"
    t0 = time.monotonic()
    say(f"compressing to {archive.name} (xz -9: the slow step)")
    write_archive(work, archive)
    seconds["compress"] = time.monotonic() - t0
    shutil.rmtree(work)
    size, digest = archive.stat().st_size, hostlayout.sha256_of(str(archive))
    parts = split(archive, part_bytes) if part_bytes else []
    manifest = {
        "schema_version": MANIFEST_SCHEMA_VERSION, "kind": "sgl-seat-engine-package", "target": t.name,
        "description": t.description, "python": t.python, "platforms": list(t.platforms),
        "pins": list(t.pins), "versions": versions_of_table(table),
        "archive": {"name": archive.name, "sha256": digest, "size": size}, "parts": parts,
        "unpacked_bytes": sum(e["size"] for e in table.values()),
        "left_out": [asdict(x) for x in left], "stripped_debug": stripped,
        "env": t.env, "check": t.check, "notes": list(t.notes), "files": table,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    shutil.copyfile(hostlayout.__file__, out / "hostlayout.py")
    return PackResult(target=t.name, directory=out, archive=archive.name, archive_bytes=size,
                      unpacked_bytes=manifest["unpacked_bytes"], files=len(table), parts=parts, left_out=left,
                      seconds={k: round(v, 1) for k, v in seconds.items()})


def versions_of_table(table: dict[str, dict[str, Any]]) -> dict[str, str]:
    """{distribution: version} from the ``*.dist-info/METADATA`` entries of a file table."""
    out = {}
    for rel in table:
        top = rel.split("/", 1)[0]
        if top.endswith(".dist-info") and rel.endswith("/METADATA"):
            name, _, version = top.removesuffix(".dist-info").rpartition("-")
            out[name.lower().replace("_", "-")] = version
    return dict(sorted(out.items()))
