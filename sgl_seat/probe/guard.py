"""What keeps the probe from hurting the process it lives in: it warns once on stderr instead of raising, and
it trusts no directory that someone else could write into.

Why a module of its own: every part of the probe (the ring writer, the C writer's loader, the GPU timer, the
installer) needs both, and none of them may raise into the engine over a ring or a build that fails. The GPU
readers also need :func:`reader_thread`, so that none of them takes the engine down at its exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import stat
import sys
import threading
from collections.abc import Callable

_WARNED: set[str] = set()


def warn_once(key: str, msg: str) -> None:
    """Write ``msg`` on stderr the first time ``key`` is warned about in this process; never raises."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    with contextlib.suppress(Exception):  # stderr may be closed; the engine must not notice
        sys.stderr.write(f"sgl-seat probe (pid {os.getpid()}): {msg}\n")


def check_private_dir(directory: str) -> None:
    """Refuse a ring directory that is a link, or that someone else owns or may write into."""
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{directory} is not a directory")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(f"{directory} is not private to uid {os.getuid()} (owner {st.st_uid}, mode {st.st_mode:o})")


def reader_thread(target: Callable[[], None], name: str, stop: threading.Event) -> threading.Thread:
    """Start a daemon reader thread that is stopped and joined at the interpreter's exit.

    A daemon thread still running at exit is frozen when it next wants the GIL, and on Python 3.12 that unwinds its
    stack: a reader inside a CUDA query made through torch (a C++ frame) then ends the process with "terminate
    called without an active exception" (SIGABRT, exit 134). Seen on an H200 with the Python graph timer as well as
    the C one (docs/gpu-validation.md, issue 25). Stopped and joined from ``atexit`` (before finalization), it
    leaves cleanly; a join that times out leaves it as before.
    """
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()

    def at_exit() -> None:
        stop.set()
        if thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    atexit.register(at_exit)
    return thread
