"""CPU niceness of the processes a seat starts: an engine or sidecar must not run at Ray's worker niceness.

Ray starts every worker process at the raylet's niceness plus its ``worker_niceness`` (15 by default, the
``RAY_worker_niceness`` setting the raylet reads at start), so that tasks yield to the system. A node agent and a
watchdog sidecar are Ray actors, so they are such workers, and without this module every SGLang engine an agent
spawns (its launcher, schedulers, detokenizer: children inherit niceness) ran at niceness 15 as well: measured on
this project's CI, ``ps -o ni`` showed 15 on every rehearsal engine, and a real seat's `up` took 250-300 s beside
the unit tests against ~115 s alone. On a GPU node the schedulers' host loop (batching, kernel launches, the
embedding row fetch) would lose the CPU to anything else on the host, and the sidecar that must notice a hang
would be the first process starved.

So the agent gives each engine, and each sidecar itself, the raylet's niceness back. Lowering a niceness needs
``CAP_SYS_NICE`` (root has it) or an ``RLIMIT_NICE`` that allows it; where neither does, the process keeps Ray's
niceness and the caller reports why, with the fix: start Ray with ``RAY_worker_niceness=0``.
"""

from __future__ import annotations

import os

#: Ray's own setting for its workers' added niceness (ray._private.ray_constants.RAY_WORKER_NICENESS).
RAY_WORKER_NICENESS_ENV = "RAY_worker_niceness"


def niceness_of(pid: int) -> int | None:
    """``pid``'s niceness, or None when it is gone."""
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except (ProcessLookupError, PermissionError):
        return None


def set_niceness(pid: int, target: int) -> str | None:
    """Give ``pid`` (0: this process) niceness ``target``; None when it has it now, else why not, for the operator.

    Only that process changes: its children started before keep theirs. An engine's launcher starts its schedulers
    seconds after it begins (imports first), so setting it right after the spawn reaches them all.
    """
    current = niceness_of(pid or os.getpid())
    if current is None or current == target:
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, pid, target)
    except ProcessLookupError:
        return None
    except PermissionError:
        return (f"pid {pid or os.getpid()} runs at niceness {current} (Ray's worker niceness) and may not lower it "
                f"to {target} without CAP_SYS_NICE: start Ray with {RAY_WORKER_NICENESS_ENV}=0")
    return None


def restore_raylet_niceness(pid: int) -> tuple[int | None, str | None]:
    """From inside a Ray worker (whose parent is the raylet): give ``pid`` the raylet's niceness.

    Returns ``pid``'s niceness afterwards and the reason it could not be lowered, if it could not.
    """
    target = niceness_of(os.getppid())
    note = set_niceness(pid, target) if target is not None else None
    return niceness_of(pid or os.getpid()), note
