"""py-spy calls: one dump of one process under a hard timeout, never leaving the target stopped.

Every call runs in its own session under a hard timeout and is SIGKILLed past it; afterwards the target is
checked in ``/proc`` and sent SIGCONT if py-spy left it stopped (only if it was not stopped before we touched
it). Periodic samples use ``--nonblocking``, which never stops the target; ``--native`` (capture time only)
has to pause it briefly, hence the check. py-spy missing or denied is a result, never an exception.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sgl_seat.core.records import Frame, ThreadStack
from sgl_seat.procstate import pid_state

log = logging.getLogger("sgl_seat.watchdog")

_DENIED = re.compile(r"permission denied|operation not permitted|os error 1\)|os error 13\)", re.I)
_GONE = re.compile(r"no such process|os error 3\)|process .* not found|failed to open process", re.I)
ENV_PYSPY = "SGLSEAT_PYSPY"


def find_pyspy() -> str | None:
    """``$SGLSEAT_PYSPY``, else the py-spy beside this interpreter (venv), else PATH."""
    env = os.environ.get(ENV_PYSPY)
    if env is not None:
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else None
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _thread_states(pid: int) -> list[str]:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out = []
    for tid in tids:
        st = pid_state(int(tid)) if tid.isdigit() else None
        if st:
            out.append(st)
    return out


def ensure_not_stopped(pid: int, *, was_stopped: bool, settle_s: float = 0.2) -> bool:
    """After a py-spy call: resume ``pid`` if it (or a thread) is left stopped and was not before.

    Returns True if a SIGCONT was sent. A tracer that died detaches at once; a leftover group stop
    (``T``) needs SIGCONT. We poll briefly because the kernel detaches asynchronously.
    """
    if was_stopped:
        return False
    deadline = time.monotonic() + settle_s
    while True:
        states = _thread_states(pid) or [s for s in [pid_state(pid)] if s]
        if not states:
            return False
        if "T" in states:
            try:
                os.kill(pid, signal.SIGCONT)
                log.warning("pid %d was left stopped after py-spy; sent SIGCONT", pid)
                return True
            except OSError:
                return False
        if "t" not in states or time.monotonic() >= deadline:
            if "t" in states:
                try:
                    os.kill(pid, signal.SIGCONT)
                    return True
                except OSError:
                    return False
            return False
        time.sleep(0.02)


@dataclass(frozen=True, slots=True)
class DumpResult:
    """One py-spy call: parsed threads (py-spy JSON, already typed), or the error."""

    threads: tuple[ThreadStack, ...]
    error: str | None
    duration_s: float
    native: bool
    denied: bool = False
    gone: bool = False
    timed_out: bool = False
    resumed: bool = False


def parse_pyspy_json(doc: Any) -> tuple[ThreadStack, ...]:
    """py-spy ``dump --json`` output -> ThreadStacks (frames innermost first, as py-spy gives them)."""
    if not isinstance(doc, list):
        raise ValueError("py-spy JSON is not a list of threads")
    threads = []
    for th in doc:
        if not isinstance(th, dict):
            continue
        frames = []
        for f in th.get("frames") or []:
            if not isinstance(f, dict):
                continue
            module = f.get("module")
            line = f.get("line")
            frames.append(Frame(
                name=str(f.get("name") or "?"),
                filename=str(f.get("filename") or f.get("short_filename") or "?"),
                line=int(line) if isinstance(line, int) and not isinstance(line, bool) and line > 0 else 0,
                module=str(module) if isinstance(module, str) else None,
                native=isinstance(module, str),
            ))
        tid = th.get("thread_id")
        name = th.get("thread_name")
        threads.append(ThreadStack(
            thread_id=int(tid) if isinstance(tid, int) else 0,
            name=str(name) if isinstance(name, str) else None,
            active=bool(th.get("active")),
            owns_gil=bool(th.get("owns_gil")),
            frames=tuple(frames),
        ))
    return tuple(threads)


def pyspy_dump(pid: int, *, exe: str, native: bool = False, timeout_s: float = 2.0) -> DumpResult:
    """One ``py-spy dump --json`` of ``pid`` under a hard timeout. Never raises for target trouble."""
    argv = [exe, "dump", "--json", "--pid", str(pid)]
    argv.append("--native" if native else "--nonblocking")
    was_stopped = pid_state(pid) in ("T", "t")
    t0 = time.monotonic()
    timed_out = False
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        return DumpResult((), f"cannot run py-spy: {exc}", 0.0, native, denied=isinstance(exc, PermissionError))
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: py-spy and anything it started
        proc.kill()
        try:
            out, err = proc.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
    dur = time.monotonic() - t0
    resumed = ensure_not_stopped(pid, was_stopped=was_stopped) if (native or timed_out) else False
    if timed_out:
        return DumpResult((), f"py-spy timed out after {timeout_s:g}s", dur, native, timed_out=True, resumed=resumed)
    text = err.decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        msg = text.splitlines()[-1] if text else f"py-spy exited with {proc.returncode}"
        gone = bool(_GONE.search(text)) or not psutil.pid_exists(pid)
        return DumpResult((), msg[:500], dur, native, denied=bool(_DENIED.search(text)) and not gone, gone=gone,
                          resumed=resumed)
    try:
        threads = parse_pyspy_json(json.loads(out.decode("utf-8", "replace")))
    except (ValueError, UnicodeDecodeError) as exc:
        return DumpResult((), f"unreadable py-spy output: {exc}", dur, native, resumed=resumed)
    return DumpResult(threads, None, dur, native, resumed=resumed)


def capture_stacks(pid: int, *, exe: str | None, timeout_s: float = 5.0) -> tuple[DumpResult, DumpResult | None]:
    """Both dumps of one process: Python-only (``--nonblocking``) first, then ``--native``.

    Both are kept: native stacks show where a thread sits in C (the driver, NCCL, a sleep), the
    Python one is the cheap, always-available view. A failed native dump leaves the Python one.
    (A capture does not call this: :func:`sgl_seat.watchdog.capture.node_part` takes every process's
    Python dump first and the native ones after, inside a budget.)
    """
    if exe is None:
        missing = DumpResult((), "py-spy not found", 0.0, False)
        return missing, None
    py = pyspy_dump(pid, exe=exe, native=False, timeout_s=timeout_s)
    if py.gone:
        return py, None
    nat = pyspy_dump(pid, exe=exe, native=True, timeout_s=timeout_s)
    return py, nat
