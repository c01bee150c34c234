"""Finding a node's engine processes: by command line and ``sglang::`` title (their state: :mod:`sgl_seat.procstate`).

The main process is ``python -m sglang.launch_server`` (or the sim's ``sgl_seat.sim.launch_server``, or
``sglang serve``); its ``sglang::scheduler_TP<r>...`` and ``sglang::detokenizer`` descendants are found by
title. Nothing here runs py-spy (:mod:`sgl_seat.watchdog.pyspy`) or keeps history (:mod:`sgl_seat.watchdog.sampler`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psutil

from sgl_seat.engines import ENGINE_MODULES
from sgl_seat.engines.base import argv_value

#: What an engine node's main process runs (``python -m <module>``), from the engine backends.
MAIN_MODULES = tuple(sorted(ENGINE_MODULES.values()))
TITLE_PREFIX = "sglang::"
SCHEDULER_PREFIX = "sglang::scheduler"
_TITLE_RANK = re.compile(r"_TP(\d+)(?:_|$)")


@dataclass(frozen=True, slots=True)
class EngineProc:
    """A live engine process as discovery found it. ``kind`` is scheduler, detokenizer, main or other."""

    pid: int
    title: str
    rank: int | None
    kind: str
    create_time: float


def rank_of_title(title: str) -> int | None:
    """``sglang::scheduler_TP3_EP3`` -> 3; a scheduler without TP in its title (tp=1) is rank 0."""
    m = _TITLE_RANK.search(title)
    if m:
        return int(m.group(1))
    if title.startswith(SCHEDULER_PREFIX):
        return 0
    return None


def is_main_cmdline(argv: list[str]) -> bool:
    """``python -m sglang.launch_server ...`` / ``-m sgl_seat.sim.launch_server`` / ``sglang serve``."""
    for i, a in enumerate(argv):
        if a == "-m" and i + 1 < len(argv) and argv[i + 1] in MAIN_MODULES:
            return True
        if a.endswith("/sglang") and i + 1 < len(argv) and argv[i + 1] == "serve":
            return True
    return False


def _title_of(proc: psutil.Process) -> str:
    try:
        argv = proc.cmdline()
    except (psutil.Error, OSError):
        return ""
    if argv and argv[0].startswith(TITLE_PREFIX):
        return argv[0].strip()
    return " ".join(argv)[:300]


def _kind(title: str) -> str:
    if title.startswith(SCHEDULER_PREFIX):
        return "scheduler"
    if title.startswith("sglang::detokenizer"):
        return "detokenizer"
    if title.startswith(TITLE_PREFIX):
        return "other"
    return "main"


def find_engine_processes(*, node_rank: int | None = None, port: int | None = None,
                          root_pid: int | None = None) -> list[EngineProc]:
    """Engine processes of one node: main processes (filtered by ``--node-rank`` / ``--port`` when given,
    or the tree under ``root_pid``) and their ``sglang::*`` descendants."""
    mains: list[psutil.Process] = []
    if root_pid is not None:
        try:
            root = psutil.Process(root_pid)
            for p in [root, *root.children(recursive=True)]:
                try:
                    if is_main_cmdline(p.cmdline()):
                        mains.append(p)
                except (psutil.Error, OSError):
                    continue
        except (psutil.Error, OSError):
            return []
    else:
        for p in psutil.process_iter(["cmdline"]):
            argv = p.info.get("cmdline") or []
            if not is_main_cmdline(argv):
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
                title = _title_of(p)
                if p is not m and not title.startswith(TITLE_PREFIX):
                    continue
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                out[p.pid] = EngineProc(pid=p.pid, title=title, rank=rank_of_title(title), kind=_kind(title),
                                        create_time=p.create_time())
            except (psutil.Error, OSError):
                continue
    return sorted(out.values(), key=lambda e: (e.kind != "main", e.rank if e.rank is not None else 1 << 20, e.pid))

