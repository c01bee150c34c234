"""The one /proc state reader: a process's and a thread's letter, a stopped one, a zombie, a gone one, the names."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from sgl_seat.procstate import STATE_NAMES, pid_state, state_name


def _until(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_stopped_child_then_a_zombie_then_gone() -> None:
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert pid_state(p.pid) in ("S", "R") and state_name(p.pid) in ("sleeping", "running")
        os.kill(p.pid, signal.SIGSTOP)
        assert _until(lambda: pid_state(p.pid) == "T"), pid_state(p.pid)
        assert state_name(p.pid) == "stopped"
        os.kill(p.pid, signal.SIGKILL)
        assert _until(lambda: pid_state(p.pid) == "Z"), pid_state(p.pid)  # dead, not reaped yet
        assert state_name(p.pid) == "zombie"
    finally:
        p.kill()
        p.wait()
    assert pid_state(p.pid) is None and state_name(p.pid) is None


def test_a_thread_whose_name_holds_a_parenthesis_is_read_by_its_id() -> None:
    """The letter follows the last ``)``: a name such as ``x) Z (y`` must not be read as a zombie."""
    go, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def worker() -> None:
        tid.append(threading.get_native_id())
        go.set()
        stop.wait(30)

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    try:
        assert go.wait(10)
        with open(f"/proc/self/task/{tid[0]}/comm", "w", encoding="ascii") as fh:
            fh.write("x) Z (y")
        assert _until(lambda: pid_state(tid[0]) == "S"), pid_state(tid[0])
    finally:
        stop.set()
        t.join(10)


def test_the_names_are_psutils() -> None:
    import psutil

    assert pid_state(os.getpid()) == "R" and state_name(os.getpid()) == psutil.STATUS_RUNNING
    assert {STATE_NAMES[k] for k in ("T", "t", "Z", "D", "S")} == {
        psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE, psutil.STATUS_DISK_SLEEP,
        psutil.STATUS_SLEEPING}
