"""Following SGLang's request log (``--log-requests-format json --log-requests-target DIR``) into a recorder.

SGLang's TokenizerManager (node 0) writes ``DIR/<hostname>_<rank>.log`` through an hourly
``TimedRotatingFileHandler``; each line is ``[YYYY-mm-dd HH:MM:SS] {"timestamp": ..., "event": ...}``.
:class:`RequestLogFollower` reads whole new lines of every ``*.log`` in the directory (from where each file
ended when it started, so a restarted seat's old lines are not taken for new traffic; files that appear
later from their start), survives rotation (the renamed file is read to its end before the new one is
opened) and truncation, never follows links, and feeds each event to a
:class:`~sgl_seat.forensics.recording.recorder.RequestRecorder`, which redacts on the way in. Nothing it reads is
executed; a line that is not a request event is counted and skipped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sgl_seat.forensics.recording.recorder import RequestRecorder

__all__ = ["RequestLogFollower", "parse_line"]

log = logging.getLogger(__name__)

#: A longer line (a level-3 log of a huge prompt) is skipped rather than buffered without bound.
MAX_LINE_BYTES = 16 << 20
#: Bytes read from one file per poll (the rest waits for the next poll).
READ_BUDGET = 8 << 20


def parse_line(line: bytes | str) -> dict[str, Any] | None:
    """One log line -> the event's JSON object, or None if it is not a request event."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    text = text.strip()
    if text.startswith("["):  # the logging formatter's "[date time] " prefix
        end = text.find("] ")
        if end < 0:
            return None
        text = text[end + 2:].lstrip()
    if not text.startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("event"), str) or not doc["event"].startswith("request."):
        return None
    return doc


@dataclass(slots=True)
class _Open:
    fh: IO[bytes]
    ino: int
    partial: bytes = b""
    skipping: bool = False  # inside an over-long line: drop bytes until its newline


class RequestLogFollower:
    """Follows every ``*.log`` of one directory and hands the events to ``recorder`` (see the module doc)."""

    def __init__(self, directory: str | Path, recorder: RequestRecorder, *, from_end: bool = True) -> None:
        self.directory = Path(directory)
        self.recorder = recorder
        self._open: dict[str, _Open] = {}
        self.errors = 0
        self.skipped_lines = 0
        self.last_error: str | None = None
        if from_end:
            for name in self._names():
                st = self._attach(name)
                if st is not None:
                    st.fh.seek(0, os.SEEK_END)

    def _names(self) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self.directory)
                          if e.name.endswith(".log") and e.is_file(follow_symlinks=False))
        except OSError:
            return []

    def _attach(self, name: str) -> _Open | None:
        try:
            flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
            fd = os.open(self.directory / name, flags)
        except OSError as exc:
            self._error(f"{name}: {exc.strerror or exc}")
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        o = _Open(os.fdopen(fd, "rb"), st.st_ino)
        self._open[name] = o
        return o

    def _error(self, msg: str) -> None:
        self.errors += 1
        self.last_error = msg[:300]
        log.debug("request log: %s", msg)

    def poll(self, now: float | None = None) -> int:
        """Read what was appended since the last poll; returns the number of events the recorder took."""
        taken = 0
        for name in self._names():
            o = self._open.get(name) or self._attach(name)
            if o is None:
                continue
            taken += self._drain(o, now)
            try:
                st = os.stat(self.directory / name, follow_symlinks=False)
            except OSError:
                continue
            if st.st_ino != o.ino:  # rotated: the old file was read to its end above; start the new one
                taken += self._drain(o, now)
                o.fh.close()
                del self._open[name]
                o2 = self._attach(name)
                if o2 is not None:
                    taken += self._drain(o2, now)
            elif st.st_size < o.fh.tell():  # truncated in place
                o.fh.seek(0)
                o.partial = b""
        for name in [n for n in self._open if not (self.directory / n).exists()]:
            with contextlib.suppress(OSError):
                self._open[name].fh.close()
            del self._open[name]
        return taken

    def _drain(self, o: _Open, now: float | None) -> int:
        try:
            data = o.fh.read(READ_BUDGET)
        except OSError as exc:
            self._error(str(exc))
            return 0
        if not data:
            return 0
        chunks = data.split(b"\n")
        tail = chunks.pop()
        taken = 0
        for i, chunk in enumerate(chunks):
            if o.skipping:
                o.skipping = False
                continue
            line = o.partial + chunk if i == 0 else chunk
            if i == 0:
                o.partial = b""
            taken += self._line(line, now)
        if o.skipping:
            return taken
        if chunks:
            o.partial = tail
        else:
            o.partial += tail
        if len(o.partial) > MAX_LINE_BYTES:
            o.partial = b""
            o.skipping = True
            self.skipped_lines += 1
        return taken

    def _line(self, line: bytes, now: float | None) -> int:
        if not line.strip():
            return 0
        doc = parse_line(line)
        if doc is None:
            self.skipped_lines += 1
            return 0
        return 1 if self.recorder.ingest(doc, now=now) else 0

    def close(self) -> None:
        for o in self._open.values():
            with contextlib.suppress(OSError):
                o.fh.close()
        self._open.clear()

    def stats(self) -> Mapping[str, Any]:
        return {"files": sorted(self._open), "events": self.recorder.events, "ignored": self.recorder.ignored,
                "skipped_lines": self.skipped_lines, "errors": self.errors, "last_error": self.last_error}
