"""The sidecar's stack samples, spooled to its keeper's directory, so the history survives the sidecar.

Why: the sidecar keeps its samples in memory, and it is a Ray actor, which dies with its raylet. The keeper
(:mod:`sgl_seat.watchdog.keeper`) takes its place then, and without a spool its history would begin at the takeover:
a bundle written soon after would have no stacks from before the raylet died, when the operator wants them most.
Each sample is one JSON line (:meth:`StackSample.to_json`, no pickle), appended as it is taken; two files at most,
the current one and the one before it, each rotated at ``max_bytes``, so the spool holds at least that much of the
newest samples and never more than twice it. A torn last line (the writer killed in the middle) is skipped.

The spool's version is in a header of its own, ``spool.json`` (``{"schema_version": SPOOL_SCHEMA_VERSION}``),
written on the first append, not in each line: a line stays one :class:`StackSample`, and rotation never loses the
version. :meth:`SampleSpool.read` refuses a spool of another version (:class:`~sgl_seat.errors.FormatVersionError`);
a spool without a header (written by the release before) is version 1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path

from sgl_seat.core.records import StackSample
from sgl_seat.errors import FormatVersionError

log = logging.getLogger(__name__)

CURRENT = "samples.jsonl"
PREVIOUS = "samples.1.jsonl"
HEADER = "spool.json"
#: The layout of a spool's lines (:meth:`StackSample.to_json`); only a change that older readers cannot read bumps it.
SPOOL_SCHEMA_VERSION = 1
#: Bytes per file before it is rotated: a sample of a scheduler is a few KB, so 4 MiB holds minutes of a node's
#: samples at the default 1 Hz (the default history is 120 s).
MAX_BYTES = 4 << 20


class SampleSpool:
    """Append samples to ``directory``; read them back (the keeper, after the sidecar is gone)."""

    def __init__(self, directory: Path, *, max_bytes: int = MAX_BYTES) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._failed = False
        self._headed = False

    def append(self, sample: StackSample) -> None:
        """One sample, one line. A spool that cannot be written (its directory gone, a full disk) is given up with
        one warning: the sampling it serves must go on."""
        if self._failed:
            return
        line = (json.dumps(sample.to_json(), separators=(",", ":")) + "\n").encode()
        path = self.directory / CURRENT
        with self._lock:
            try:
                if not self._headed:
                    tmp = self.directory / f".{HEADER}"
                    tmp.write_text(json.dumps({"schema_version": SPOOL_SCHEMA_VERSION}))
                    os.replace(tmp, self.directory / HEADER)  # whole or absent: never a torn header
                    self._headed = True
                with contextlib.suppress(FileNotFoundError):
                    if path.stat().st_size + len(line) > self.max_bytes:
                        os.replace(path, self.directory / PREVIOUS)
                with path.open("ab") as fh:
                    fh.write(line)
            except OSError as exc:
                self._failed = True
                log.warning("the sample spool in %s is given up: %s", self.directory, exc)

    def read(self, since: float | None = None) -> list[StackSample]:
        """Every sample spooled (taken at ``since`` or later), oldest first. Raises FormatVersionError for a spool
        of another version."""
        self._check_version()
        out: list[StackSample] = []
        for name in (PREVIOUS, CURRENT):
            try:
                data = (self.directory / name).read_bytes()
            except OSError:
                continue
            for raw in data.splitlines():
                try:
                    s = StackSample.from_json(json.loads(raw))
                except (ValueError, TypeError, KeyError):
                    continue  # a torn line: the writer died in the middle of it
                if since is None or s.t >= since:
                    out.append(s)
        return sorted(out, key=lambda s: s.t)

    def _check_version(self) -> None:
        path = self.directory / HEADER
        try:
            text = path.read_text()
        except OSError:
            return  # no header: a spool of the release before (version 1), or none at all
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        fix = ("the spool was written by another sgl-seat version than this one (sgl-seat changed under a running "
               "seat): bring the seat up again with one sgl-seat version on every node")
        if not isinstance(doc, dict):
            raise FormatVersionError(str(path), text[:80], SPOOL_SCHEMA_VERSION, fix=fix)
        FormatVersionError.check(path, doc, SPOOL_SCHEMA_VERSION, fix=fix)
