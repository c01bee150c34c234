"""What keeps the probe from hurting the process it lives in: it warns once on stderr instead of raising, and
it trusts no directory that someone else could write into.

Why a module of its own: every part of the probe (the ring writer, the C writer's loader, the GPU timer, the
installer) needs both, and none of them may raise into the engine over a ring or a build that fails.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys

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
