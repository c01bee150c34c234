"""Finding a node's engine processes: by command line and the engine's titles (their state: :mod:`sgl_seat.procstate`).

The main process is what an engine backend runs (``python -m sglang.launch_server``, the sim's
``sgl_seat.sim.launch_server``, ``sglang serve``: :func:`sgl_seat.engines.is_engine_main`); its descendants that carry
one of the engine's titles (:class:`~sgl_seat.core.vocabulary.EngineWords`: a rank's process, a helper) are found by
title. Nothing here runs py-spy (:mod:`sgl_seat.watchdog.pyspy`) or keeps history (:mod:`sgl_seat.watchdog.sampler`).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.engines import is_engine_main
from sgl_seat.engines.base import argv_value


@dataclass(frozen=True, slots=True)
class EngineProc:
    """A live engine process as discovery found it. ``kind`` is scheduler, detokenizer, main or other."""

    pid: int
    title: str
    rank: int | None
    kind: str
    create_time: float


def _title_of(proc: psutil.Process, words: EngineWords) -> str:
    try:
        argv = proc.cmdline()
    except (psutil.Error, OSError):
        return ""
    if argv and words.is_engine_title(argv[0]):
        return argv[0].strip()
    return " ".join(argv)[:300]


def find_engine_processes(words: EngineWords, *, node_rank: int | None = None, port: int | None = None,
                          root_pid: int | None = None) -> list[EngineProc]:
    """Engine processes of one node: main processes (filtered by ``--node-rank`` / ``--port`` when given,
    or the tree under ``root_pid``) and their descendants that carry one of the engine's titles (``words``)."""
    mains: list[psutil.Process] = []
    if root_pid is not None:
        try:
            root = psutil.Process(root_pid)
            for p in [root, *root.children(recursive=True)]:
                try:
                    if is_engine_main(p.cmdline()):
                        mains.append(p)
                except (psutil.Error, OSError):
                    continue
        except (psutil.Error, OSError):
            return []
    else:
        for p in psutil.process_iter(["cmdline"]):
            argv = p.info.get("cmdline") or []
            if not is_engine_main(argv):
                continue
            if node_rank is not None and int(argv_value(argv, "--node-rank") or 0) != node_rank:
                continue
            if port is not None and argv_value(argv, "--port") != str(port):
                continue
            mains.append(p)
    out: dict[int, EngineProc] = {}
    for m in mains:
        try:
            procs = [m, *m.children(recursive=True)]
        except (psutil.Error, OSError):
            continue
        for p in procs:
            try:
                title = _title_of(p, words)
                if p is not m and not words.is_engine_title(title):
                    continue
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                out[p.pid] = EngineProc(pid=p.pid, title=title, rank=words.rank_of_title(title),
                                        kind=words.kind_of_title(title), create_time=p.create_time())
            except (psutil.Error, OSError):
                continue
    return sorted(out.values(), key=lambda e: (e.kind != "main", e.rank if e.rank is not None else 1 << 20, e.pid))

