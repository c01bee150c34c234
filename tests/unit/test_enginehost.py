"""The engine host (``sgl_seat/launch/host/enginehost.py``): an engine started through it outlives a caller that kills
its own children on exit (what a Ray worker does when its raylet dies), and its exit status still reaches the
node agent. Real processes, by pid; none left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from sgl_seat.launch.host import processgroups

# A caller like a Ray worker: it starts an engine through the host, says its pid, then kills every direct child
# of its own (Ray's kill_child_processes_on_worker_exit) and exits.
CALLER = textwrap.dedent("""
    import json, os, signal, sys
    from pathlib import Path
    import psutil
    from sgl_seat.launch.host import processgroups
    work = Path(sys.argv[1])
    env = {**os.environ, "SGL_SEAT_NAME": "hosted-test"}
    eng = processgroups.spawn_hosted(["sh", "-c", "sleep 300 & wait"], env, work / "node0.log", work / "host")
    print(json.dumps({"pid": eng.pid, "parent": eng.parent}), flush=True)
    for child in psutil.Process().children():
        child.send_signal(signal.SIGKILL)
    sys.exit(0)
""")


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = processgroups.find(pid)
        if p is None:
            return True
        time.sleep(0.02)
    return False


def test_an_engine_outlives_a_caller_that_kills_its_children_and_its_exit_is_still_read(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", CALLER, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    started = json.loads(res.stdout)
    pid, parent = int(started["pid"]), int(started["parent"])
    try:
        eng = psutil.Process(pid)
        assert processgroups.is_alive(eng)  # the caller and all its children are gone; the engine runs
        assert os.getpgid(pid) == pid  # its own process group, as every engine's
        assert eng.ppid() == parent  # its parent is the host, not the caller (which is gone)
        assert eng.environ().get("SGL_SEAT_NAME") == "hosted-test"
        assert "SGL_SEAT_NAME" not in psutil.Process(parent).environ()  # never taken for an engine process
        assert not (tmp_path / "host" / "spec.json").exists()  # the environment is not left on disk
        hosted = processgroups.HostedEngine(pid, parent, tmp_path / "host")
        assert hosted.poll() is None
        os.killpg(pid, signal.SIGKILL)
        assert hosted.wait(10.0) == -signal.SIGKILL
        assert processgroups.describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
        assert _gone(parent)  # the host exits after its engine
    finally:
        for p in (pid, parent):
            if processgroups.find(p) is not None:
                os.kill(p, signal.SIGKILL)


def test_an_engine_that_exits_gives_its_code(tmp_path: Path) -> None:
    eng = processgroups.spawn_hosted(["sh", "-c", "echo hello; exit 3"], dict(os.environ), tmp_path / "n.log",
                                     tmp_path / "h")
    assert eng.wait(10.0) == 3
    assert processgroups.describe_exit(3) == "exited with code 3"
    assert _gone(eng.parent)
    assert (tmp_path / "n.log").read_text() == "hello\n"  # its output goes to the node's log


def test_an_engine_that_cannot_start_is_an_error_that_names_it(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=r"could not start '/nonexistent/python'.*FileNotFoundError"):
        processgroups.spawn_hosted(["/nonexistent/python", "-m", "x"], dict(os.environ), tmp_path / "n.log",
                                   tmp_path / "h")


def test_an_engine_whose_host_was_killed_first_has_an_unknown_exit(tmp_path: Path) -> None:
    eng = processgroups.spawn_hosted(["sleep", "300"], dict(os.environ), tmp_path / "n.log", tmp_path / "h")
    try:
        os.kill(eng.parent, signal.SIGKILL)
        assert _gone(eng.parent)
        assert eng.poll() is None  # the engine itself still runs
        os.kill(eng.pid, signal.SIGKILL)
        assert eng.wait(10.0) == processgroups.EXIT_UNKNOWN
        assert "not known" in processgroups.describe_exit(processgroups.EXIT_UNKNOWN)
    finally:
        if processgroups.find(eng.pid) is not None:
            os.kill(eng.pid, signal.SIGKILL)
