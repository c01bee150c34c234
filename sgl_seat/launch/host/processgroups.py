"""Engine process groups: start one, list what belongs to it, take it down and prove it is gone.

SGLang's schedulers are known to outlive their launcher (``deploy-anchors.md`` section 5: orphaned
``sglang::scheduler`` processes reparented to PID 1). So every engine starts in its own session
(``start_new_session=True``: pgid = engine pid) and teardown works on the whole group: SIGTERM to
the group, a grace period, SIGKILL to the group and to any known pid that left it, then a check
that nothing remains. Processes are identified by (pid, create_time) so a recycled pid is never
signalled. Zombies count as gone: they hold no memory, port or GPU and only wait to be reaped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import psutil

from sgl_seat.engines import is_engine_title
from sgl_seat.errors import FormatVersionError


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """A process as seen once: enough to report it and to find it again safely."""

    pid: int
    ppid: int
    pgid: int | None
    title: str
    create_time: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def title_of(p: psutil.Process) -> str:
    """An engine's title (``cmdline()[0]`` after setproctitle: any engine's :class:`EngineWords` title), else the
    command line, else the name."""
    try:
        cmd = p.cmdline()
    except (psutil.Error, OSError):
        cmd = []
    if cmd and is_engine_title(cmd[0]):
        return cmd[0]
    text = " ".join(c for c in cmd if c)
    if text:
        return text[:300]
    try:
        return p.name()
    except (psutil.Error, OSError):
        return "?"


def is_alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def info(p: psutil.Process) -> ProcInfo | None:
    try:
        with p.oneshot():
            return ProcInfo(pid=p.pid, ppid=p.ppid(), pgid=pgid_of(p.pid), title=title_of(p),
                            create_time=p.create_time())
    except (psutil.Error, OSError):
        return None


def find(pid: int, create_time: float | None = None) -> psutil.Process | None:
    """The live process ``pid`` if it is the one created at ``create_time`` (when given)."""
    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 0.05:
            return None
    except (psutil.Error, OSError):
        return None
    return p if is_alive(p) else None


def members(pgid: int | None, roots: Iterable[int] = (),
            known: Iterable[tuple[int, float]] = ()) -> list[psutil.Process]:
    """Live processes of group ``pgid``, live descendants of ``roots``, and live ``known`` (pid, ctime)."""
    found: dict[int, psutil.Process] = {}
    if pgid is not None:
        for p in psutil.process_iter():
            if pgid_of(p.pid) == pgid and is_alive(p):
                found[p.pid] = p
    for root in roots:
        rp = find(root)
        if rp is None:
            continue
        found.setdefault(rp.pid, rp)
        with contextlib.suppress(psutil.Error, OSError):
            for c in rp.children(recursive=True):
                if is_alive(c):
                    found.setdefault(c.pid, c)
    for pid, ctime in known:
        kp = find(pid, ctime)
        if kp is not None:
            found.setdefault(kp.pid, kp)
    return sorted(found.values(), key=lambda p: p.pid)


def _signal_all(pgid: int | None, procs: Sequence[psutil.Process], sig: signal.Signals) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for p in procs:
        with contextlib.suppress(psutil.Error, OSError):
            p.send_signal(sig)


def _wait_gone(procs: Sequence[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    left = [p for p in procs if is_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if is_alive(p)]
    return left


def kill_group(pgid: int | None, roots: Iterable[int] = (), known: Iterable[tuple[int, float]] = (),
               *, timeout: float = 10.0, reap: subprocess.Popen[bytes] | None = None) -> list[ProcInfo]:
    """SIGTERM the group, wait ``timeout``, SIGKILL what is left, verify; return the survivors.

    ``reap`` is the engine's Popen when the caller is its parent, so the main process does not
    linger as a zombie of the caller.
    """
    roots = list(roots)
    known = list(known)
    procs = members(pgid, roots, known)
    if procs or pgid is not None:
        _signal_all(pgid, procs, signal.SIGTERM)
    left = _wait_gone(procs, timeout)
    # Anything that joined the group or was forked while we waited is included in the SIGKILL.
    left = members(pgid, roots, known) + [p for p in left if is_alive(p)]
    if left:
        _signal_all(pgid, left, signal.SIGKILL)
        left = _wait_gone(left, 5.0)
    if reap is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            reap.wait(timeout=2.0)
    survivors = [i for i in (info(p) for p in members(pgid, roots, known)) if i is not None]
    return survivors


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (its own process group) with stdout+stderr to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log: IO[bytes]
    with log_path.open("wb") as log:
        return subprocess.Popen(
            list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )


#: The exit status of an engine whose parent (its :mod:`~sgl_seat.launch.host.enginehost`) was gone before it could
#: write one: the engine is gone, how it ended is not known.
EXIT_UNKNOWN = 1 << 16
#: What to do about an engine host's status file of another version: its host came from another install than the
#: reader's (the two run the same install's code unless sgl-seat changed on disk under a running node agent).
_HOST_VERSION_FIX = ("the engine host that wrote it runs another sgl-seat version than this node agent (sgl-seat "
                     "changed under a running seat): take the seat down and bring it up again with one sgl-seat "
                     "version on every node")


def _host_status(path: Path) -> Any:
    """An engine host's status file (:data:`~sgl_seat.launch.host.enginehost.STARTED` or ``EXIT``) as JSON, refused
    (FormatVersionError) unless of its ``HOST_SCHEMA_VERSION`` (none: version 1, an older release's host)."""
    from sgl_seat.launch.host.enginehost import HOST_SCHEMA_VERSION

    doc = json.loads(path.read_text())
    if isinstance(doc, dict):
        FormatVersionError.check(path, doc, HOST_SCHEMA_VERSION, fix=_HOST_VERSION_FIX)
    return doc


class HostedEngine:
    """An engine started through :mod:`sgl_seat.launch.host.enginehost`: its pid, and its exit status as the engine's
    own parent wrote it. The part of ``subprocess.Popen`` that the node agent uses (``pid``, ``poll``, ``wait``,
    ``returncode``), for a process that is not the caller's child."""

    def __init__(self, pid: int, parent: int, directory: Path) -> None:
        self.pid = pid
        self.parent = parent
        self.directory = directory
        self.returncode: int | None = None
        self._proc = find(pid, None)
        self._parent = find(parent, None)

    def poll(self) -> int | None:
        """The exit status once the engine has exited and its parent has said how (None while it runs)."""
        if self.returncode is not None:
            return self.returncode
        from sgl_seat.launch.host.enginehost import EXIT

        try:
            self.returncode = int(_host_status(self.directory / EXIT)["returncode"])
            return self.returncode
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            return None  # being written: the next poll
        if self._proc is not None and is_alive(self._proc):
            return None
        if self._parent is not None and is_alive(self._parent):
            return None  # reaped, the status not written yet
        if (self.directory / EXIT).exists():
            return self.poll()
        self.returncode = EXIT_UNKNOWN
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """:meth:`poll` until it answers or ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        while (rc := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return rc


def spawn_hosted(argv: Sequence[str], env: Mapping[str, str], log_path: Path, directory: Path,
                 *, timeout: float = 30.0) -> HostedEngine:
    """Start ``argv`` as :func:`spawn` does (its own session, stdout+stderr to ``log_path``), but as the child of
    an :mod:`~sgl_seat.launch.host.enginehost`, not of the caller: a Ray worker that exits kills its own children, and
    the engine must outlive its node agent's worker (a raylet killed, a GCS gone). Raises OSError when the engine
    could not be started (the host's words), FormatVersionError when the host's answer is of another version."""
    from sgl_seat.launch.host import enginehost

    log_path.parent.mkdir(parents=True, exist_ok=True)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in (enginehost.SPEC, enginehost.STARTED, enginehost.EXIT):
        (directory / name).unlink(missing_ok=True)
    spec = directory / enginehost.SPEC
    fd = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"schema_version": enginehost.HOST_SCHEMA_VERSION, "argv": list(argv), "env": dict(env)}, fh)
    log: IO[bytes]
    with log_path.open("wb") as log:
        first = subprocess.Popen(
            [sys.executable, "-I", enginehost.__file__, str(directory)], stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
        )
    try:
        first.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        first.kill()
        first.wait()
    try:
        started = _host_status(directory / enginehost.STARTED)
    except (OSError, ValueError) as exc:
        raise OSError(f"the engine's host did not start it within {timeout:.0f} s ({exc})") from None
    if "error" in started:
        raise OSError(f"could not start {argv[0]!r}: {started['error']}")
    return HostedEngine(int(started["pid"]), int(started["parent"]), directory)


def describe_exit(returncode: int) -> str:
    """``exited with code 3`` / ``killed by SIGKILL``, as an operator reads it."""
    if returncode == EXIT_UNKNOWN:
        return "exited (how is not known: its parent, which reaps it, was gone first)"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"
