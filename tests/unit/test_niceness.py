"""sgl_seat.niceness on real processes: a child given a niceness back, and the refusal said with its fix."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from sgl_seat.niceness import RAY_WORKER_NICENESS_ENV, niceness_of, restore_raylet_niceness, set_niceness


@pytest.fixture
def child() -> psutil.Popen:
    proc = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.kill()
    proc.wait(10)


def test_a_child_raised_to_a_worker_niceness_is_given_its_parents_back(child: psutil.Popen) -> None:
    """GIVEN a process at its parent's niceness + 15 (as Ray starts a worker) WHEN set to the parent's THEN it has
    it (raising is always allowed; lowering needs CAP_SYS_NICE, so the lowering half runs only where we have it)."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert set_niceness(child.pid, min(19, base + 15)) is None
    assert niceness_of(child.pid) == min(19, base + 15)
    note = set_niceness(child.pid, base)
    if os.geteuid() == 0:
        assert note is None and niceness_of(child.pid) == base
    else:
        assert note is not None and RAY_WORKER_NICENESS_ENV in note


def test_already_there_and_gone_are_no_news(child: psutil.Popen) -> None:
    assert set_niceness(child.pid, niceness_of(child.pid) or 0) is None
    child.kill()
    child.wait(10)
    assert niceness_of(child.pid) is None and set_niceness(child.pid, 0) is None


def test_without_the_capability_the_process_keeps_its_niceness_and_the_note_says_how_to_fix_it() -> None:
    """GIVEN an unprivileged process at niceness 15 (as root, a child that drops to nobody once it has imported the
    module) WHEN it asks the raylet's niceness back for itself THEN it stays at 15 and the note names its niceness
    and RAY_worker_niceness=0."""
    code = textwrap.dedent("""
        import json, os
        from sgl_seat.niceness import restore_raylet_niceness
        if os.geteuid() == 0:
            os.setgroups([]); os.setgid(65534); os.setuid(65534)
        os.nice(15)
        print(json.dumps(restore_raylet_niceness(0)))
    """)
    parent = os.getpriority(os.PRIO_PROCESS, 0)
    if parent >= 19:
        pytest.skip("this test runs at niceness 19 already: its child cannot be niced above it, nothing to lower")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    nice, note = json.loads(out.stdout)
    assert nice == min(19, parent + 15)
    assert note is not None and f"niceness {nice}" in note and f"{RAY_WORKER_NICENESS_ENV}=0" in note, note


def test_restore_from_a_worker_gives_the_parents_niceness(child: psutil.Popen) -> None:
    """GIVEN this process as the "raylet" of a worker (its parent is us) THEN restore_raylet_niceness run inside a
    niced child gives that child our niceness back, where lowering is allowed."""
    if os.geteuid() != 0:
        pytest.skip("lowering a niceness needs CAP_SYS_NICE (CI runs as root)")
    code = "import json, os; from sgl_seat.niceness import restore_raylet_niceness as r; os.nice(15); " \
           "print(json.dumps(r(0)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    nice, note = json.loads(out.stdout)
    assert note is None and nice == os.getpriority(os.PRIO_PROCESS, 0)
    assert restore_raylet_niceness(child.pid)[1] is None
