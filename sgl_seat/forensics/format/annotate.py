"""What happened after a bundle was written, recorded in it: the two changes a complete bundle may take.

A bundle is written once and then only read (:mod:`sgl_seat.forensics.format.bundle`); the seat's supervisor acts after
the bundle is complete, so what it did (``remediation``: the action, when it started, when the engines were
stopped, when the seat served again) can only be added afterwards. Only the manifest changes, and only by a key
this module names (:data:`KEYS`): the record files and their digests stay as captured. The bundle is verified
first, the new manifest is checked by the reader's own strict parser, and it replaces the old one by a rename
from a temporary file written beside the bundle (never inside it, where it would be an unlisted file), so a
reader sees the old manifest or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sgl_seat.errors import BundleError
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.bundle import amending_marker, verify_bundle
from sgl_seat.forensics.format.codec import dumps_line
from sgl_seat.forensics.format.manifest import Manifest


def _write_beside(root: Path, data: bytes) -> str:
    fd, tmp = tempfile.mkstemp(prefix=f".annotate-{root.name}-", dir=root.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def add_late_files(path: str | Path, files: Mapping[str, bytes], steps: list[dict[str, Any]],
                   late: Mapping[str, Any]) -> Manifest:
    """Replace or add the late ``files`` of the complete bundle at ``path`` (only the names ``_LATE`` allows),
    append ``steps`` to its capture steps and set its manifest key ``late``; returns the new manifest."""
    root = Path(path)
    for name in files:
        if not _LATE.match(name):
            raise BundleError(f"{name!r} is not a file a written bundle may gain", fix="native_stacks.jsonl or gpu/")
    verify_bundle(root)
    doc = json.loads((root / layout.MANIFEST).read_text(encoding="utf-8"))
    doc["files"] = {**doc["files"], **{n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                                       for n, d in files.items()}}
    doc["capture"] = [*(doc.get("capture") or []), *steps]
    doc["late"] = dict(late)
    manifest = Manifest.from_json(doc)
    data = (dumps_line(manifest.to_json()) + "\n").encode("utf-8")
    tmps: dict[str, str] = {}
    marker = amending_marker(root)
    try:
        for name, body in files.items():
            tmps[name] = _write_beside(root, body)
        tmp_manifest = _write_beside(root, data)
        tmps[layout.MANIFEST] = tmp_manifest
        marker.write_bytes(b"")  # a reader that meets a file and a manifest that do not match reads again
        for name, tmp in tmps.items():
            if name != layout.MANIFEST:
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, root / name)
        os.replace(tmp_manifest, root / layout.MANIFEST)
    finally:
        marker.unlink(missing_ok=True)
        for tmp in tmps.values():
            Path(tmp).unlink(missing_ok=True)
    return manifest

#: Manifest keys that may be added to a complete bundle, and what each holds.
KEYS = {"remediation": "what the seat's supervisor did about this hang (sgl_seat.core.remediation)",
        "late": "what the capture added after the bundle was on disk (native stacks, nvidia-smi), and when"}
#: Files a complete bundle's late part may write: the capture-time stacks, and each node's nvidia-smi text.
_LATE = re.compile(r"^(native_stacks\.jsonl|gpu/node\d{1,6}\.txt)$")


def annotate(path: str | Path, key: str, value: Mapping[str, Any]) -> Manifest:
    """Set manifest key ``key`` of the complete bundle at ``path`` to ``value``; returns the new manifest."""
    if key not in KEYS:
        raise BundleError(f"{key!r} is not a key a written bundle may gain", fix=f"one of {sorted(KEYS)}")
    root = Path(path)
    verify_bundle(root)  # complete and undamaged, or the BundleError that says why
    doc = json.loads((root / layout.MANIFEST).read_text(encoding="utf-8"))
    doc[key] = dict(value)
    manifest = Manifest.from_json(doc)
    tmp = _write_beside(root, (dumps_line(manifest.to_json()) + "\n").encode("utf-8"))
    try:
        os.replace(tmp, root / layout.MANIFEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return manifest
