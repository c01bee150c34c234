"""Ask the installed SGLang to size the KV pool, through a child process (:mod:`sgl_seat.sizing.child`).

The child imports SGLang once (seconds) and then answers any number of requests (milliseconds each), so one
worker is kept per planner process and reused: a whole grid of cases, or every plan a test session builds,
costs one import. Requests and answers are JSON lines over the child's stdin/stdout; every read has a
deadline, and a child that misses it is killed (its process group) and the caller gets :class:`SizingError`.
The worker ends at end of input or at interpreter exit; nothing is left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from sgl_seat.sizing import cache as sizing_cache

#: The SGLang release whose sizing code the child runs and the mirror follows.
SGLANG_VERSION = "0.5.23"
#: Seconds the child may take to import SGLang: ~15 s of CPU, but a 2-core machine loaded ten deep (the CI tier's
#: streams beside the contract tests) stretches that past 100 s; this bound only catches an import that hangs.
IMPORT_TIMEOUT_S = 240.0
#: Seconds one request of cases may take once SGLang is imported, plus :data:`PER_CASE_S` for each case: a case is
#: ~0.15 s of CPU, and a grid of 400 cases on a loaded 2-core machine took more than 120 s.
REQUEST_TIMEOUT_S = 120.0
PER_CASE_S = 1.0


class SizingError(RuntimeError):
    """SGLang's sizing could not be run (not installed, failed to import, timed out, or answered badly)."""


def installed_version() -> str | None:
    """The installed ``sglang`` distribution's version, without importing it (None if absent)."""
    if importlib.util.find_spec("sglang") is None:
        return None
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


@dataclass(frozen=True, slots=True)
class SizingCase:
    """One question for SGLang: node 0's flags (``--model-path`` already the planning config's directory) and
    the GPU memory its queries report, in bytes."""

    case_id: str
    argv: tuple[str, ...]
    gpu_memory_bytes: int
    pre_load_bytes: int
    free_after_load_bytes: int
    env: tuple[tuple[str, str], ...] = ()
    search_slots: bool = False
    slots_limit: int = 4096

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.case_id, "argv": list(self.argv), "gpu_memory_bytes": self.gpu_memory_bytes,
            "pre_load_bytes": self.pre_load_bytes, "free_after_load_bytes": self.free_after_load_bytes,
            "env": dict(self.env), "search_slots": self.search_slots, "slots_limit": self.slots_limit,
        }


class _Worker:
    """One child process and its pipes; one request at a time (a lock serialises callers)."""

    def __init__(self, python: str) -> None:
        env = dict(os.environ)
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [python, "-m", "sgl_seat.sizing.child"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, start_new_session=True, text=True, bufsize=1,
        )
        self.stderr_tail: list[str] = []
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        self.lock = threading.Lock()
        self.hello = self._read_line(IMPORT_TIMEOUT_S, "importing SGLang")
        if not self.hello.get("ready"):
            self.close()
            raise SizingError(f"SGLang's sizing code did not import: {self.hello.get('error')}")

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail = [*self.stderr_tail[-40:], line.rstrip()]

    def _read_line(self, timeout_s: float, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if not sel.select(timeout_s):
                self.close()
                raise SizingError(f"SGLang's sizing child gave no answer within {timeout_s:.0f} s ({what})")
            line = self.proc.stdout.readline()
        finally:
            sel.close()
        if not line:
            self.close()
            tail = "; ".join(self.stderr_tail[-3:])
            raise SizingError(f"SGLang's sizing child exited ({what}): {tail}")
        try:
            doc = json.loads(line)
        except ValueError as exc:
            self.close()
            raise SizingError(f"SGLang's sizing child answered non-JSON: {line[:200]!r}") from exc
        if not isinstance(doc, dict):
            raise SizingError(f"SGLang's sizing child answered {type(doc).__name__}, not an object")
        return doc

    def ask(self, cases: Sequence[SizingCase], timeout_s: float) -> list[dict[str, Any]]:
        with self.lock:
            if self.proc.poll() is not None or self.proc.stdin is None:
                raise SizingError("SGLang's sizing child is not running")
            try:
                self.proc.stdin.write(json.dumps({"cases": [c.to_json() for c in cases]}) + "\n")
                self.proc.stdin.flush()
            except OSError as exc:
                self.close()
                raise SizingError(f"SGLang's sizing child is gone: {exc}") from exc
            answer = self._read_line(timeout_s, f"{len(cases)} case(s)")
        results = answer.get("results")
        if not isinstance(results, list) or len(results) != len(cases):
            raise SizingError("SGLang's sizing child answered the wrong number of results")
        return results

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


_WORKER: _Worker | None = None
_WORKER_LOCK = threading.Lock()
#: Open :func:`sizing_session` blocks. Outside any, each call starts its own child and stops it before it
#: returns: a library call must not leave a process behind in its caller (tests check that by pid).
_SESSIONS = 0


@contextlib.contextmanager
def sizing_session() -> Iterator[None]:
    """Keep one child for every sizing call inside the block (a grid, a test module): SGLang's imports cost
    seconds of CPU, so a run of many plans pays them once. The child is stopped when the last block ends."""
    global _SESSIONS
    with _WORKER_LOCK:
        _SESSIONS += 1
    try:
        yield
    finally:
        with _WORKER_LOCK:
            _SESSIONS -= 1
            last = _SESSIONS == 0
        if last:
            shutdown()


def _worker(python: str | None = None) -> _Worker:
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None or not _WORKER.alive():
            _WORKER = _Worker(python or sys.executable)
        return _WORKER


@atexit.register
def shutdown() -> None:
    """Stop the worker (also registered at exit): end of input, then a kill after 5 s."""
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is not None:
            _WORKER.close()
            _WORKER = None


@dataclass(frozen=True, slots=True)
class SglangAnswers:
    """The child's answers, in the order asked, with what it reported about itself."""

    results: tuple[dict[str, Any], ...]
    sglang_version: str
    stubs: tuple[str, ...]
    elapsed_s: float
    #: How many of the answers were read from the sizing cache (computed earlier by the same SGLang code for
    #: the same inputs) instead of being computed now.
    cached: int = 0


def size_with_sglang(cases: Sequence[SizingCase], *, timeout_s: float | None = None) -> SglangAnswers:
    """Run SGLang's sizing for every case in one request (``timeout_s``: default :data:`REQUEST_TIMEOUT_S` and
    :data:`PER_CASE_S` a case). Raises :class:`SizingError` when it cannot run."""
    have = installed_version()
    if have is None:
        raise SizingError("sglang is not installed (scripts/install-sglang-parser.sh installs it)")
    if have != SGLANG_VERSION:
        raise SizingError(f"sglang {have} is installed; sgl-seat follows {SGLANG_VERSION}'s sizing")
    t0 = time.perf_counter()
    fingerprint = sizing_cache.sglang_fingerprint() if sizing_cache.cache_dir() is not None else None
    keys = [sizing_cache.case_key(c.to_json(), fingerprint=fingerprint) if fingerprint else None for c in cases]
    hits = [sizing_cache.load(k) if k else None for k in keys]
    missing = [i for i, hit in enumerate(hits) if hit is None]
    results: list[dict[str, Any]] = [{**hit["result"], "id": c.case_id} if hit else {} for c, hit in zip(
        cases, hits, strict=True)]
    version_now, stubs = "", list(next((h["stubs"] for h in hits if h), []))
    if missing:
        worker = _worker()
        try:
            bound = timeout_s if timeout_s is not None else REQUEST_TIMEOUT_S + PER_CASE_S * len(missing)
            asked = worker.ask([cases[i] for i in missing], bound)
        finally:
            if _SESSIONS == 0:
                shutdown()
        version_now, stubs = str(worker.hello.get("sglang_version")), list(worker.hello.get("stubs") or ())
        for i, answer in zip(missing, asked, strict=True):
            results[i] = answer
            key = keys[i]
            if key is not None:
                sizing_cache.store(key, answer, sglang_version=version_now, stubs=stubs)
    version_seen = version_now or str(next(h["sglang_version"] for h in hits if h))
    return SglangAnswers(
        results=tuple(results), sglang_version=version_seen, stubs=tuple(stubs),
        elapsed_s=time.perf_counter() - t0, cached=len(cases) - len(missing),
    )
