"""The sampler against real processes: py-spy on a tiny Python program, a target that exits mid-sample,
py-spy missing, denied or hung, a target left stopped, and the probe loaded through sitecustomize."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sgl_seat import probe
from sgl_seat.procstate import pid_state
from sgl_seat.watchdog import boot_dir
from sgl_seat.watchdog.procfind import EngineProc
from sgl_seat.watchdog.pyspy import capture_stacks, ensure_not_stopped, find_pyspy, pyspy_dump
from sgl_seat.watchdog.sampler import Sampler

pytestmark = pytest.mark.integration

PROG = textwrap.dedent("""
    import sys, threading, time
    def fetch_rows(ids):
        time.sleep(float(sys.argv[1]))
    def worker():
        while True:
            time.sleep(0.5)
    threading.Thread(target=worker, name="w1", daemon=True).start()
    print("ready", flush=True)
    fetch_rows([1, 2, 3])
""")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[bytes]] = []
    script = tmp_path / "prog.py"
    script.write_text(PROG)

    def _spawn(seconds: float = 60.0) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, str(script), str(seconds)], stdout=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        procs.append(p)
        return p

    yield _spawn
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def _fake_pyspy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def _one(p: subprocess.Popen[bytes]) -> list[EngineProc]:
    return [EngineProc(pid=p.pid, title="sglang::scheduler_TP3_EP3", rank=3, kind="scheduler",
                       create_time=psutil.Process(p.pid).create_time())] if p.poll() is None else []


def test_samples_a_real_program(spawn) -> None:  # type: ignore[no-untyped-def]
    p = spawn()
    exe = find_pyspy()
    assert exe, "py-spy is a dependency of sgl-seat"
    res = pyspy_dump(p.pid, exe=exe, timeout_s=10)
    assert res.error is None, res.error
    main = next(t for t in res.threads if t.name == "MainThread")
    assert main.frames[0].name == "fetch_rows" and main.frames[0].filename.endswith("prog.py")
    assert {t.name for t in res.threads} == {"MainThread", "w1"}
    sampler = Sampler(node=1, sample_hz=5, history_s=60, discover=lambda: _one(p))
    for _ in range(3):
        out = sampler.sample_once()
        assert len(out) == 1 and out[0].rank == 3 and out[0].node == 1 and out[0].error is None
    assert sampler.samples_taken == 3 and len(sampler.samples()) == 3
    assert pid_state(p.pid) in ("S", "R")


def test_native_capture_leaves_the_target_running(spawn) -> None:  # type: ignore[no-untyped-def]
    p = spawn()
    py, nat = capture_stacks(p.pid, exe=find_pyspy(), timeout_s=10)
    assert py.error is None
    assert nat is not None
    if nat.error is None:  # native unwinding is best effort; when it works it has native frames
        assert any(f.native for t in nat.threads for f in t.frames)
    time.sleep(0.1)
    assert pid_state(p.pid) in ("S", "R")


def test_target_exits_mid_sampling(spawn) -> None:  # type: ignore[no-untyped-def]
    p = spawn(seconds=0.6)
    ctime = psutil.Process(p.pid).create_time()
    ep = EngineProc(pid=p.pid, title="sglang::scheduler_TP0_EP0", rank=0, kind="scheduler", create_time=ctime)
    sampler = Sampler(node=0, sample_hz=20, history_s=60, discover=lambda: [ep] if p.poll() is None else [])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(not e.alive for e in sampler.processes()):
        sampler.sample_once()
        time.sleep(0.02)
    p.wait(5)
    sampler.sample_once()
    gone = [e for e in sampler.processes() if not e.alive]
    assert [e.pid for e in gone] == [p.pid]
    assert sampler.sample_once() == []


def test_pyspy_missing_warns_once_and_samples_nothing(spawn, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                                      caplog: pytest.LogCaptureFixture) -> None:
    p = spawn()
    monkeypatch.setenv("SGLSEAT_PYSPY", "/nonexistent/py-spy")
    sampler = Sampler(node=0, discover=lambda: _one(p))
    assert sampler.pyspy is None and sampler.state == "py-spy not found"
    assert sampler.sample_once() == [] and sampler.sample_once() == []
    assert len([r for r in caplog.records if "py-spy was not found" in r.getMessage()]) == 1
    assert [e.pid for e in sampler.processes()] == [p.pid]  # liveness still works without py-spy


def test_pyspy_denied_turns_sampling_off_with_one_warning(spawn, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          caplog: pytest.LogCaptureFixture) -> None:
    p = spawn()
    fake = _fake_pyspy(tmp_path, 'echo "Error: Permission Denied (os error 13)" >&2; exit 1')
    sampler = Sampler(node=0, discover=lambda: _one(p), pyspy=fake)
    for _ in range(5):
        sampler.sample_once()
    assert sampler.state == "py-spy denied"
    assert len([r for r in caplog.records if "may not attach" in r.getMessage()]) == 1
    n = sampler.samples_taken
    sampler.sample_once()
    assert sampler.samples_taken == n  # backed off: no more calls for a while


def test_hung_pyspy_is_killed_and_a_stopped_target_resumed(spawn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A py-spy that stops its target and then hangs: the timeout kills it, the target runs again."""
    p = spawn()
    fake = _fake_pyspy(tmp_path, 'for a in "$@"; do last=$a; done\n'
                                 'pid=$(echo "$@" | sed "s/.*--pid \\([0-9]*\\).*/\\1/")\n'
                                 'kill -STOP "$pid"\nsleep 30')
    t0 = time.monotonic()
    res = pyspy_dump(p.pid, exe=fake, native=True, timeout_s=1.0)
    assert res.timed_out and time.monotonic() - t0 < 6
    assert res.resumed
    time.sleep(0.1)
    assert pid_state(p.pid) in ("S", "R")
    # and nothing of the fake py-spy is left behind (its `sleep` child included: the whole session is killed)
    time.sleep(0.2)
    left = [q for q in psutil.process_iter(["cmdline"]) if (q.info["cmdline"] or [])[:2] == ["sleep", "30"]
            and q.status() != psutil.STATUS_ZOMBIE]
    assert not left


def test_a_target_stopped_before_us_stays_stopped(spawn) -> None:  # type: ignore[no-untyped-def]
    p = spawn()
    os.kill(p.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 3
        while pid_state(p.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ensure_not_stopped(p.pid, was_stopped=True) is False
        assert pid_state(p.pid) == "T"
    finally:
        os.kill(p.pid, signal.SIGCONT)


def test_sitecustomize_loads_the_probe_into_a_foreign_engine(tmp_path: Path) -> None:
    """What a real SGLang node gets: PYTHONPATH=<boot dir> + SGLSEAT_PROBE; the target module is imported
    later by the engine; an existing sitecustomize keeps running."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "engram_like.py").write_text("def engram_gather(w, s, ids, out):\n    return len(ids)\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n")
    rings = tmp_path / "rings"
    env = {**os.environ, "PYTHONPATH": f"{boot_dir()}:{other}:{tmp_path / 'pkg'}",
           probe.ENV_TARGETS: "engram_like:engram_gather@ids", probe.ENV_DIR: str(rings)}
    code = ("import os, sys, engram_like\n"
            "engram_like.engram_gather(0, 0, [1, 2, 3, 4], None)\n"
            "print(os.environ.get('OTHER_SITECUSTOMIZE'), engram_like.engram_gather.__sgl_seat_probe__, flush=True)\n"
            "if sys.argv[1] == 'kill':\n    os._exit(0)  # like a killed engine: no atexit, the ring stays\n")
    out = subprocess.run([sys.executable, "-c", code, "kill"], env=env, capture_output=True, timeout=60, check=True)
    assert out.stdout.decode().split() == ["ran", "engram_like:engram_gather"], out.stderr.decode()
    (ring,) = probe.list_rings(str(rings)).values()
    recs = probe.read_ring(ring, node=0)
    assert [(r.target, r.gather_size) for r in recs] == [("engram_like:engram_gather", 4)]
    os.unlink(ring)
    # a normal exit removes the ring (nothing left in /dev/shm by engines that stop cleanly)
    subprocess.run([sys.executable, "-c", code, "exit"], env=env, capture_output=True, timeout=60, check=True)
    assert probe.list_rings(str(rings)) == {}
    # without SGLSEAT_PROBE the loader does nothing
    env.pop(probe.ENV_TARGETS)
    res = subprocess.run([sys.executable, "-c", "import sys; print('sgl_seat.probe' in sys.modules)"],
                         env=env, capture_output=True, timeout=60, check=True)
    assert res.stdout.decode().strip() == "False"


def test_sampled_json_is_what_records_hold(spawn) -> None:  # type: ignore[no-untyped-def]
    p = spawn()
    sampler = Sampler(node=0, discover=lambda: _one(p))
    (s,) = sampler.sample_once()
    from sgl_seat.core.records import StackSample

    assert StackSample.from_json(json.loads(json.dumps(s.to_json()))) == s
