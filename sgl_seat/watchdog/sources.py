"""What a sidecar reads besides stacks: the probe rings, rank 0's ``/metrics`` and the engine log.

Each source keeps a bounded, time-pruned history of typed records (``records.py``) and never raises
for trouble on the other side (an engine that is gone, a port that refuses, a log being rotated):
it records an error count and carries on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sgl_seat import probe
from sgl_seat.core.records import LogLine, MetricsPoint, ProbeRecord

log = logging.getLogger("sgl_seat.watchdog")


class ProbeReader:
    """Reads the node's probe rings and keeps their records for ``history_s`` (in-flight ones always)."""

    def __init__(self, directory: str, *, node: int, history_s: float = 120.0) -> None:
        self.directory = directory
        self.node = node
        self.history_s = history_s
        self._lock = threading.Lock()
        #: One reader at a time: the sidecar's 20 Hz loop and a capture's part both read the rings.
        self._read_lock = threading.Lock()
        self._records: dict[tuple[int, int], ProbeRecord] = {}
        self._inflight: dict[tuple[int, int], ProbeRecord] = {}
        self._last_prune = float("-inf")
        self._readers: dict[int, probe.RingReader] = {}
        self.errors = 0
        self.on_complete: Callable[[ProbeRecord], None] | None = None

    def read(self, pid_ranks: Mapping[int, int | None], now: float) -> list[ProbeRecord]:
        """Read the rings of ``pid_ranks`` (pid -> rank); returns records that completed since last read."""
        with self._read_lock:
            return self._read(pid_ranks, now)

    def _read(self, pid_ranks: Mapping[int, int | None], now: float) -> list[ProbeRecord]:
        rings = probe.list_rings(self.directory)
        fresh_done: list[ProbeRecord] = []
        for pid, rank in pid_ranks.items():
            path = rings.get(pid)
            if path is None:
                continue
            reader = self._readers.get(pid)
            if reader is None or reader.path != path:
                reader = self._readers[pid] = probe.RingReader(path, record=ProbeRecord)
            try:
                recs = reader.read(node=self.node, rank=rank if rank is not None else None)
            except (FileNotFoundError, probe.RingNotReady):
                continue  # the process is creating its ring, or exited and removed it: nothing to read, no error
            except (OSError, ValueError) as exc:
                self.errors += 1
                log.debug("probe ring %s unreadable: %s", path, exc)
                continue
            with self._lock:
                for r in recs:
                    key = (r.pid, r.seq)
                    old = self._records.get(key)
                    if r.rank < 0 and rank is not None:
                        r = dataclasses.replace(r, rank=rank)
                    if old is None or (old.end is None and r.end is not None) or _gpu_moved(old, r):
                        self._records[key] = r
                        if r.end is not None and (old is None or old.end is None):
                            fresh_done.append(r)
                        if r.end is not None and not _gpu_open(r):
                            self._inflight.pop(key, None)
                        else:
                            self._inflight[key] = r
        self._prune(now)
        cb = self.on_complete
        if cb is not None:
            for r in fresh_done:
                with contextlib.suppress(Exception):  # metrics export must not stop reading
                    cb(r)
        return fresh_done

    def _prune(self, now: float) -> None:
        if now - self._last_prune < 5.0:
            return
        self._last_prune = now
        cutoff = now - self.history_s
        with self._lock:
            for key in [k for k, r in self._records.items()
                        if r.end is not None and r.end < cutoff and not _gpu_open(r)]:
                del self._records[key]

    def records(self, since: float | None = None) -> list[ProbeRecord]:
        """Records in flight, and completed ones (ending at or after ``since``, all if None); unsorted."""
        with self._lock:
            if since is None:
                return list(self._records.values())
            return [r for r in self._records.values() if r.end is None or r.end >= since or _gpu_open(r)]

    def in_flight(self) -> list[ProbeRecord]:
        with self._lock:
            return list(self._inflight.values())

    def remove_all(self) -> None:
        """Delete every ring of this node and the directory (at `down`: an engine keeps its mapping, the
        file only served the reader)."""
        for path in probe.list_rings(self.directory).values():
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.directory.rstrip("/")))  # the seat's directory, once empty

    def cleanup(self, keep_pids: set[int]) -> list[str]:
        """Delete ring files of processes that no longer exist (and are not in ``keep_pids``)."""
        removed = []
        for pid, path in probe.list_rings(self.directory).items():
            if pid in keep_pids or _pid_alive(pid):
                continue
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                continue
        return removed


def _gpu_open(r: ProbeRecord) -> bool:
    """CUDA events were recorded for the call and its GPU work has not been seen to finish."""
    return r.gpu and r.gpu_end is None


def _gpu_moved(old: ProbeRecord, new: ProbeRecord) -> bool:
    """The engine's event reader resolved more of the call's GPU timing since the last read."""
    return (new.gpu_start, new.gpu_end) != (old.gpu_start, old.gpu_end)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parse_metrics_text(text: str, prefix: str) -> dict[str, float]:
    """Prometheus text -> {sample name: value summed over labels}, the names that start with ``prefix`` (the
    engine's :attr:`~sgl_seat.core.vocabulary.EngineWords.metric_prefix`) only, without buckets.

    A sample that is not a finite number (``NaN``, ``+Inf``) carries no value and is left out: real SGLang
    exports such gauges (seen on its CPU seat), and a bundle's JSON cannot hold them, so one NaN made every
    capture of that seat fail ("Out of range float values are not JSON compliant").
    """
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            value = float(s.value)
            if not name.startswith(prefix) or name.endswith(("_bucket", "_created")) or not math.isfinite(value):
                continue
            out[name] = out.get(name, 0.0) + value
    return out


class MetricsPoller:
    """Scrapes one ``/metrics`` URL into a history of :class:`MetricsPoint`."""

    def __init__(self, url: str, *, node: int, prefix: str, history_s: float = 120.0, timeout_s: float = 1.0) -> None:
        self.url = url
        #: The engine's metric prefix: what is kept of each scrape.
        self.prefix = prefix
        self.node = node
        self.history_s = history_s
        self.timeout_s = timeout_s
        self._points: deque[MetricsPoint] = deque()
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=timeout_s, trust_env=False)
        self.errors = 0
        self.last_error: str | None = None
        self._busy = threading.Lock()

    def poll_in_background(self, now: float) -> bool:
        """Start one :meth:`poll` on a thread of its own and return at once; False while the last one still runs.

        Why: the sidecar's tick is its detector. A scrape of an address that went away (node 0's link down) waits out
        its timeout, and in the tick that second delayed every check behind it, the loss of a node included."""
        if not self._busy.acquire(blocking=False):
            return False

        def run() -> None:
            try:
                self.poll(now)
            finally:
                self._busy.release()

        threading.Thread(target=run, name="sgl-seat-metrics", daemon=True).start()
        return True

    def poll(self, now: float) -> MetricsPoint | None:
        try:
            resp = self._client.get(self.url)
            resp.raise_for_status()
            values = parse_metrics_text(resp.text, self.prefix)
        except Exception as exc:
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            return None
        point = MetricsPoint(t=now, node=self.node, values=values)
        with self._lock:
            self._points.append(point)
            while self._points and self._points[0].t < now - self.history_s:
                self._points.popleft()
        return point

    def points(self) -> list[MetricsPoint]:
        with self._lock:
            return list(self._points)

    def close(self) -> None:
        self._client.close()


class LogTailer:
    """Follows the node's engine log from where it was when the sidecar started (rotation-safe)."""

    def __init__(self, path: str | None, *, node: int, max_lines: int = 2000, from_start: bool = False) -> None:
        self.path = path
        self.node = node
        self._lines: deque[LogLine] = deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._ino: int | None = None
        self._pos = 0
        self._partial = b""
        if path and not from_start:
            try:
                st = os.stat(path)
                self._ino, self._pos = st.st_ino, st.st_size
            except OSError:
                pass

    def poll(self, now: float) -> list[LogLine]:
        if not self.path:
            return []
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        if self._ino != st.st_ino or st.st_size < self._pos:
            self._ino, self._pos, self._partial = st.st_ino, 0, b""
        if st.st_size == self._pos:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._pos)
                data = fh.read(min(st.st_size - self._pos, 4 << 20))
        except OSError:
            return []
        self._pos += len(data)
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        new = [LogLine(t=now, node=self.node, text=c.decode("utf-8", "replace").rstrip("\r")) for c in chunks]
        with self._lock:
            self._lines.extend(new)
        return new

    def lines(self) -> list[LogLine]:
        with self._lock:
            return list(self._lines)

    def tail_text(self, max_bytes: int = 256 * 1024) -> str:
        """The raw last ``max_bytes`` of the log file (also what was written before the sidecar started)."""
        if not self.path:
            return ""
        try:
            p = Path(self.path)
            size = p.stat().st_size
            with p.open("rb") as fh:
                fh.seek(max(0, size - max_bytes))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
