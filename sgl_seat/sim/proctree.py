"""Process-tree plumbing, as SGLang does it: children die with their parent, teardown kills the tree.

Children are started with :mod:`subprocess` (``python -m sgl_seat.sim.worker ROLE CONFIG_JSON``), each
given one end of a socketpair per channel through ``pass_fds``: nothing is pickled on the way. A child's
first act is ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (SGLang's ``kill_itself_when_parent_died``), then its
title, so the process is recognisable and cannot outlive the node's main process.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psutil

PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies; exit now if it already has."""
    if sys.platform == "linux":
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


@dataclass
class Child:
    """A started child: its name (title), process and the parent's ends of its channels."""

    name: str
    proc: subprocess.Popen[bytes]
    socks: dict[str, socket.socket]

    @property
    def pid(self) -> int:
        return self.proc.pid


def spawn(
    role: str, name: str, config: Mapping[str, Any], channels: list[str],
    direct: Mapping[str, socket.socket] | None = None, env: Mapping[str, str] | None = None,
) -> Child:
    """Start ``python -m sgl_seat.sim.worker role``: one socketpair to the parent per name in ``channels``,
    plus ``direct`` sockets handed over as they are (e.g. rank 0's end of its pipe to the detokenizer).
    The parent closes its copies of every child end once the child has started. ``env`` is added to
    the parent's environment for this child."""
    parent_ends: dict[str, socket.socket] = {}
    child_ends: dict[str, socket.socket] = dict(direct or {})
    for ch in channels:
        a, b = socket.socketpair()
        parent_ends[ch], child_ends[ch] = a, b
    fds = {ch: s.fileno() for ch, s in child_ends.items()}
    payload = json.dumps({"config": dict(config), "fds": fds, "parent": os.getpid(), "name": name})
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sgl_seat.sim.worker", role, payload],
            pass_fds=tuple(fds.values()),
            stdin=subprocess.DEVNULL,
            close_fds=True,
            env={**os.environ, **env} if env else None,
        )
    finally:
        for s in child_ends.values():
            s.close()
    return Child(name=name, proc=proc, socks=parent_ends)


def kill_process_tree(pid: int, *, include_parent: bool = True, wait_s: float = 10.0) -> None:
    """SIGKILL every descendant of ``pid``, reap them, then (optionally) the process itself."""
    try:
        me = psutil.Process(pid)
        children = me.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for c in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            c.kill()
    psutil.wait_procs(children, timeout=wait_s)
    if include_parent:
        if pid == os.getpid():
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(pid, signal.SIGKILL)
        else:
            with contextlib.suppress(psutil.NoSuchProcess):
                me.kill()
