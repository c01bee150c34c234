"""Lay out an offline engine package on its GPU host and check it, with the standard library only.

    python3 hostlayout.py PACKAGE_DIR DEST [--python PYTHON] [--no-check] [--json]

``PACKAGE_DIR`` holds what `sgl-seat engine pack` wrote (``engine-package.json``, the archive or its parts, this
file). Every part's and the archive's sha256 are checked before anything is unpacked; the archive is unpacked under
``DEST/site`` with tarfile's ``data`` filter (no links out, no devices, no absolute paths); every file's sha256 and
size are checked against the manifest; ``DEST/env.sh`` says what to export and ``DEST/bin/python`` runs the image's
Python with it (so ``DEST`` serves as a seat's engine environment); then the target's check runs under
``PYTHON`` (the image's) with the package first on its path, before anything starts: it must see CUDA and import
SGLang. Exit 0 when all of that held, else 1 with the reason on stderr. It imports nothing of sgl-seat: the host
has only the package and its own Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

MANIFEST = "engine-package.json"
MANIFEST_SCHEMA_VERSION = 1


class LayoutError(Exception):
    pass


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(package: str) -> dict[str, object]:
    with open(os.path.join(package, MANIFEST)) as fh:
        doc = json.load(fh)
    version = doc.get("schema_version")
    if version != MANIFEST_SCHEMA_VERSION:
        raise LayoutError(f"{MANIFEST}: schema_version {version!r}; this hostlayout.py reads "
                          f"{MANIFEST_SCHEMA_VERSION} (use the hostlayout.py packed beside it)")
    if doc.get("kind") != "sgl-seat-engine-package":
        raise LayoutError(f"{MANIFEST} is not an sgl-seat engine package manifest")
    return dict(doc)


def assemble(package: str, doc: dict[str, object], dest: str) -> str:
    """The archive, checked: its parts joined (each checked first) into ``dest``, or the archive itself."""
    archive = dict(doc["archive"])  # type: ignore[call-overload]
    parts = list(doc.get("parts") or [])  # type: ignore[call-overload]
    if not parts:
        path = os.path.join(package, str(archive["name"]))
    else:
        path = os.path.join(dest, str(archive["name"]))
        with open(path, "wb") as out:
            for part in parts:
                p = os.path.join(package, part["name"])
                if not os.path.isfile(p):
                    raise LayoutError(f"part {part['name']} is missing from {package}")
                if sha256_of(p) != part["sha256"]:
                    raise LayoutError(f"part {part['name']}: sha256 differs from the manifest (damaged in transit)")
                with open(p, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
    if os.path.getsize(path) != archive["size"] or sha256_of(path) != archive["sha256"]:
        raise LayoutError(f"{archive['name']}: size or sha256 differs from the manifest")
    return path


def unpack(archive: str, dest: str, files: dict[str, dict[str, object]]) -> int:
    """Unpack under ``dest/site`` and check every file against the manifest; returns the bytes laid out."""
    site = os.path.join(dest, "site")
    if os.path.exists(site):
        shutil.rmtree(site)
    with tarfile.open(archive, "r:xz") as tar:
        members = tar.getmembers()
        bad = [m.name for m in members if not (m.name == "site" or m.name.startswith("site/"))]
        if bad:
            raise LayoutError(f"the archive holds paths outside site/: {bad[:3]}")
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - Python before 3.12 without the backported filter
            tar.extractall(dest, members=members)  # noqa: S202  (names checked above)
    total = 0
    for rel, ent in files.items():
        p = os.path.join(site, rel)
        if not os.path.isfile(p) or os.path.getsize(p) != ent["size"] or sha256_of(p) != ent["sha256"]:
            raise LayoutError(f"site/{rel}: missing or not the file the manifest names")
        total += int(str(ent["size"]))
    return total


def environment(doc: dict[str, object], dest: str) -> dict[str, str]:
    site = os.path.abspath(os.path.join(dest, "site"))
    out = {}
    for k, v in dict(doc.get("env") or {}).items():  # type: ignore[call-overload]
        out[k] = os.path.normpath(v.replace("{site}", site)) if "$" not in v else v.replace("{site}", site)
    return out


def write_env(env: dict[str, str], dest: str) -> str:
    path = os.path.join(dest, "env.sh")
    with open(path, "w") as fh:
        fh.write("# source this file: the engine package first on the paths\n")
        for k, v in env.items():
            fh.write(f'export {k}="{v}"\n')
    return path


def write_python(env: dict[str, str], dest: str, python: str) -> str:
    """``DEST/bin/python``: the image's interpreter with the package on its paths, so that ``DEST`` stands where a seat
    expects an engine environment (``${engine_venv}/bin/python``, ``SGLSEAT_ENGINE_VENV=DEST``). What the caller
    already has on ``PYTHONPATH`` stays first (the seat's probe boot directory must precede every other
    ``sitecustomize``); the package still precedes the image's own site-packages, which is what shadowing needs."""
    os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
    path = os.path.join(dest, "bin", "python")
    lines = ["#!/bin/sh", "# the image's Python with the engine package on its paths (written by hostlayout.py)"]
    for k, v in env.items():
        if k == "PYTHONPATH":
            lines.append(f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{v}"')
        else:
            lines.append(f'export {k}="{v}"')
    lines.append(f'exec "{python}" "$@"')
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    os.chmod(path, 0o755)  # noqa: S103 (an interpreter wrapper: every user of the host runs it)
    return path


def run_check(doc: dict[str, object], env: dict[str, str], python: str, timeout: float = 600.0) -> dict[str, object]:
    full = dict(os.environ)
    for k, v in env.items():
        full[k] = os.path.expandvars(v.replace("$PATH", full.get("PATH", "")))
    for k in env:
        if k.endswith("_DIR"):
            os.makedirs(full[k], exist_ok=True)
    proc = subprocess.run([python, "-c", str(doc.get("check") or "print('{}')")], env=full, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise LayoutError(f"the target's check failed under {python} ({proc.returncode}):\n{proc.stderr[-3000:]}")
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    return dict(json.loads(last))


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    python = sys.executable
    if "--python" in argv:
        python = argv[argv.index("--python") + 1]
        args.remove(python)
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    package, dest = args
    report: dict[str, object] = {"package": package, "dest": dest}
    try:
        t0 = time.monotonic()
        doc = read_manifest(package)
        os.makedirs(dest, exist_ok=True)
        archive = assemble(package, doc, dest)
        report["target"], report["archive_bytes"] = doc["target"], os.path.getsize(archive)
        report["unpacked_bytes"] = unpack(archive, dest, dict(doc["files"]))  # type: ignore[call-overload]
        if archive.startswith(os.path.abspath(dest)) or os.path.dirname(archive) == dest:
            os.unlink(archive)  # the joined copy; the parts stay where they came
        env = environment(doc, dest)
        report["env_file"] = write_env(env, dest)
        report["python"] = write_python(env, dest, python)
        report["layout_s"] = round(time.monotonic() - t0, 1)
        if "--no-check" not in argv:
            t0 = time.monotonic()
            report["check"] = run_check(doc, env, python)
            report["check_s"] = round(time.monotonic() - t0, 1)
    except (LayoutError, OSError, KeyError, ValueError, tarfile.TarError, subprocess.TimeoutExpired) as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(report) if "--json" in argv else f"hostlayout: {report['error']}",
              file=sys.stdout if "--json" in argv else sys.stderr)
        return 1
    print(json.dumps(report, indent=None if "--json" in argv else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
