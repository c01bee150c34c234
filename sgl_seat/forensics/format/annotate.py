"""What happened after a bundle was written, recorded in it: the one change a complete bundle may take.

A bundle is written once and then only read (:mod:`sgl_seat.forensics.format.bundle`); the seat's supervisor acts after
the bundle is complete, so what it did (``remediation``: the action, when it started, when the engines were
stopped, when the seat served again) can only be added afterwards. Only the manifest changes, and only by a key
this module names (:data:`KEYS`): the record files and their digests stay as captured. The bundle is verified
first, the new manifest is checked by the reader's own strict parser, and it replaces the old one by a rename
from a temporary file written beside the bundle (never inside it, where it would be an unlisted file), so a
reader sees the old manifest or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sgl_seat.errors import BundleError
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.bundle import verify_bundle
from sgl_seat.forensics.format.codec import dumps_line
from sgl_seat.forensics.format.manifest import Manifest

#: Manifest keys that may be added to a complete bundle, and what each holds.
KEYS = {"remediation": "what the seat's supervisor did about this hang (sgl_seat.core.remediation)"}


def annotate(path: str | Path, key: str, value: Mapping[str, Any]) -> Manifest:
    """Set manifest key ``key`` of the complete bundle at ``path`` to ``value``; returns the new manifest."""
    if key not in KEYS:
        raise BundleError(f"{key!r} is not a key a written bundle may gain", fix=f"one of {sorted(KEYS)}")
    root = Path(path)
    verify_bundle(root)  # complete and undamaged, or the BundleError that says why
    doc = json.loads((root / layout.MANIFEST).read_text(encoding="utf-8"))
    doc[key] = dict(value)
    manifest = Manifest.from_json(doc)
    data = (dumps_line(manifest.to_json()) + "\n").encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".annotate-{root.name}-", dir=root.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, root / layout.MANIFEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return manifest
