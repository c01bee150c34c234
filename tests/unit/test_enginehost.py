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

from sgl_seat.errors import FormatVersionError
from sgl_seat.launch.host import enginehost, processgroups

# A caller like a Ray worker: it starts an engine through the host, says its pid, then kills every direct child
# of its own (Ray's kill_child_processes_on_worker_exit) and exits.
CALLER = textwrap.dedent("""
    import json, os, signal, sys
    from pathlib import Path
    import psutil
    from sgl_seat.launch.host import processgroups
    work = Path(sys.argv[1])
    env = {**os.environ, "SGLSEAT_NAME": "hosted-test"}
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
        assert eng.environ().get("SGLSEAT_NAME") == "hosted-test"
        assert "SGLSEAT_NAME" not in psutil.Process(parent).environ()  # never taken for an engine process
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


# -- the files' version (schema_version, HOST_SCHEMA_VERSION) ---------------------------------------------------------

def _host(directory: Path, spec: dict[str, object]) -> dict[str, object]:
    """Run the real engine host on ``spec`` (as an older or newer node agent would have written it); its
    started.json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / enginehost.SPEC).write_text(json.dumps(spec))
    res = subprocess.run([sys.executable, "-I", enginehost.__file__, str(directory)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert not (directory / enginehost.SPEC).exists()  # read and removed, refused or not
    doc: dict[str, object] = json.loads((directory / enginehost.STARTED).read_text())
    return doc


def test_the_host_writes_its_version_and_reads_a_spec_without_one(tmp_path: Path) -> None:
    """A spec of the release before (no schema_version) is version 1: its engine starts; started.json and exit.json
    carry the host's version."""
    assert enginehost.HOST_SCHEMA_VERSION == 1
    started = _host(tmp_path, {"argv": ["sh", "-c", "exit 3"], "env": {}})
    assert started["schema_version"] == enginehost.HOST_SCHEMA_VERSION and "pid" in started, started
    deadline = time.monotonic() + 10
    while not (tmp_path / enginehost.EXIT).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert json.loads((tmp_path / enginehost.EXIT).read_text()) == {"schema_version": 1, "returncode": 3}
    assert _gone(int(str(started["parent"])))


@pytest.mark.parametrize("version", [2, "1", True])
def test_the_host_refuses_a_spec_of_another_version_and_starts_nothing(tmp_path: Path, version: object) -> None:
    started = _host(tmp_path / "h", {"schema_version": version, "argv": ["touch", str(tmp_path / "ran")], "env": {}})
    assert set(started) == {"schema_version", "error"}, started
    assert f"{tmp_path / 'h' / enginehost.SPEC}: schema_version {version!r} is not one this sgl-seat reads (it " \
           "reads 1;" in str(started["error"])
    assert "fix: " in str(started["error"])
    time.sleep(0.2)
    assert not (tmp_path / "ran").exists()


#: A stand-in engine host: it keeps the spec it was given (spec.seen) and answers with the started.json in $STARTED.
STAND_IN = textwrap.dedent("""
    import os, shutil, sys
    d = sys.argv[1]
    shutil.copy(os.path.join(d, "spec.json"), os.path.join(d, "spec.seen"))
    with open(os.path.join(d, "started.json"), "w") as fh:
        fh.write(os.environ["STARTED"])
""")


def _stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: dict[str, object]) -> None:
    (tmp_path / "standin.py").write_text(STAND_IN)
    monkeypatch.setattr(enginehost, "__file__", str(tmp_path / "standin.py"))
    monkeypatch.setenv("STARTED", json.dumps(started))


def test_the_agent_writes_the_specs_version_and_reads_a_started_of_the_release_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(tmp_path, monkeypatch, {"pid": 123456789, "parent": 123456788})  # no schema_version: version 1
    eng = processgroups.spawn_hosted(["sleep", "1"], {"A": "b"}, tmp_path / "n.log", tmp_path / "h")
    assert (eng.pid, eng.parent) == (123456789, 123456788)
    seen = json.loads((tmp_path / "h" / "spec.seen").read_text())
    assert seen == {"schema_version": enginehost.HOST_SCHEMA_VERSION, "argv": ["sleep", "1"], "env": {"A": "b"}}


def test_the_agent_refuses_a_started_of_another_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(tmp_path, monkeypatch, {"schema_version": 2, "pid": 123456789, "parent": 123456788})
    with pytest.raises(FormatVersionError) as err:
        processgroups.spawn_hosted(["sleep", "1"], {}, tmp_path / "n.log", tmp_path / "h")
    text = str(err.value)
    assert f"{tmp_path / 'h' / enginehost.STARTED}: schema_version 2 is not one this sgl-seat reads (it reads 1;" \
        in text
    assert "fix: " in text and "one sgl-seat version" in text


@pytest.mark.parametrize(("doc", "rc"), [({"returncode": 3}, 3), ({"schema_version": 1, "returncode": -9}, -9)])
def test_an_exit_status_of_this_version_or_of_the_release_before_is_read(tmp_path: Path, doc: dict[str, object],
                                                                         rc: int) -> None:
    (tmp_path / enginehost.EXIT).write_text(json.dumps(doc))
    assert processgroups.HostedEngine(123456789, 123456788, tmp_path).poll() == rc


def test_an_exit_status_of_another_version_is_refused(tmp_path: Path) -> None:
    (tmp_path / enginehost.EXIT).write_text(json.dumps({"schema_version": 2, "returncode": 0}))
    with pytest.raises(FormatVersionError, match=r"exit\.json: schema_version 2 is not one this sgl-seat reads \(it "
                                                 r"reads 1; a file without schema_version is 1\)\n  fix: "):
        processgroups.HostedEngine(123456789, 123456788, tmp_path).poll()
