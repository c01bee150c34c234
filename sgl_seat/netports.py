"""Loopback ports for what a test, a bench, a local cluster or the sim starts: one place that knows how to find them.

Two ways to pick a port, and each caller says which it needs:

- :func:`any_free_port`: the kernel's choice (bind to port 0, read it back, release it). For a single port that
  nothing else needs to predict (a rendezvous address, a GCS port).
- :func:`free_block`: the first start ``p`` among the caller's candidates whose ports ``p + offset`` can all be bound
  now. For a seat's block of ports (HTTP, admin, dist-init, ... at fixed offsets) inside a fixed range: a test or a
  bench keeps to its own range so that parallel runs on one host do not take each other's ports.

Everything binds ``127.0.0.1`` unless told otherwise, never every interface. Standard library only: the sim may
import it too (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
from collections.abc import Container, Iterable, Iterator
from typing import Final

__all__ = ["HOST", "PORTS_ENV", "any_free_port", "free_block", "held", "is_free", "port_range", "random_starts"]

HOST: Final = "127.0.0.1"
#: ``LO-HI``: the range a test's ports come from instead of its default (an engineer testing beside others picks one).
PORTS_ENV: Final = "SGLSEAT_TEST_PORTS"


def any_free_port(host: str = HOST) -> int:
    """A port the kernel hands out as free on ``host`` right now (it is released again before this returns)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def is_free(port: int, host: str = HOST, *, reuse: bool = True) -> bool:
    """Can ``port`` be bound on ``host`` now? With ``reuse`` the check binds with SO_REUSEADDR, as the sim's servers
    do, so a port in TIME_WAIT after a recent run counts as free; without it only a port nobody holds in any way."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_block(starts: Iterable[int], offsets: Iterable[int] = (0,), *, avoid: Container[int] = (),
               host: str = HOST, reuse: bool = True) -> int | None:
    """The first ``p`` of ``starts`` whose ports ``p + offset`` are none of them in ``avoid`` and all free now
    (:func:`is_free`); None when no start qualifies. Nothing is held: the caller binds them, or marks them taken."""
    offs = tuple(offsets)
    for p in starts:
        block = [p + o for o in offs]
        if not any(q in avoid for q in block) and all(is_free(q, host, reuse=reuse) for q in block):
            return p
    return None


def random_starts(lo: int, hi: int, tries: int = 500) -> Iterator[int]:
    """``tries`` starts drawn from ``lo``..``hi`` (both included): runs that share a range rarely try the same one."""
    for _ in range(tries):
        yield random.randint(lo, hi)  # noqa: S311  # a port to try, not a secret


def port_range(default: tuple[int, int]) -> tuple[int, int]:
    """``$SGLSEAT_TEST_PORTS`` (``LO-HI``) if set, else ``default``."""
    raw = os.environ.get(PORTS_ENV)
    if not raw:
        return default
    lo, _, hi = raw.partition("-")
    return int(lo), int(hi)


@contextlib.contextmanager
def held(port: int = 0, host: str = HOST, *, listen: bool = False) -> Iterator[int]:
    """Hold ``port`` (0: one the kernel picks) on ``host`` for the ``with`` block, bound and, with ``listen``,
    accepting connections (none are ever accepted: a client's connect succeeds or waits). Bound and not listening,
    a connection to it is refused. Yields the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, port))
        if listen:
            s.listen(1)
        yield int(s.getsockname()[1])
