"""Two sidecars (in-process, no Ray) watching a two-rank fake engine on two "nodes": a row-fetch stall
gives exactly one bundle with the verdict, stacks and probe records; a crash gives a "process exited"
bundle with the log tail; an unwritable bundle directory is a logged error while the engine keeps going.

The fake engine is the sim's shape in 40 lines: each rank fetches rows through a probed function and then
waits in a fake ``all_reduce`` for its peer, so a stalled fetch on rank 1 leaves rank 0 in the collective.
The full sim + Ray path is ``test_watchdog_seat.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from sgl_seat.core.records import VerdictKind
from sgl_seat.forensics import read_bundle
from sgl_seat.forensics.replay.redetect import rerun_detectors
from sgl_seat.spec import WatchdogSpec
from sgl_seat.watchdog.config import SidecarConfig
from sgl_seat.watchdog.peers import local_peers
from sgl_seat.watchdog.procfind import EngineProc
from sgl_seat.watchdog.sampler import Sampler
from sgl_seat.watchdog.sidecar import Sidecar

pytestmark = pytest.mark.integration

METRICS_PORT = 26110
EXPORTER_PORT = 26111

ROWS = textwrap.dedent("""
    import glob, os, time
    def fetch_rows(table, ids, stall_file):
        while os.path.exists(stall_file):
            time.sleep(0.05)
        return len(ids)
    def all_reduce(ctl):
        while glob.glob(os.path.join(ctl, "stall*")):
            time.sleep(0.05)
        time.sleep(0.01)
""")

ENGINE = textwrap.dedent("""
    import os, sys, time
    rank, node, ctl, mport = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    import setproctitle
    setproctitle.setproctitle(f"sglang::scheduler_TP{rank}_EP{rank}")
    sys.path.insert(0, ctl)
    from sgl_seat import probe
    probe.install_from_env()
    import fakerows
    if mport:
        from prometheus_client import Counter, Gauge, start_http_server
        running = Gauge("sglang:num_running_reqs", "r")
        tokens = Counter("sglang:generation_tokens", "t")
        running.set(4)
        start_http_server(mport, addr="127.0.0.1")
    log = open(os.path.join(ctl, f"node{node}.log"), "a", buffering=1)
    log.write(f"[TP{rank}] engine up\\n")
    step = 0
    while True:
        fakerows.fetch_rows(None, list(range(8 * (1 + step % 4))), os.path.join(ctl, f"stall{rank}"))
        fakerows.all_reduce(ctl)
        step += 1
        if mport:
            tokens.inc(4)
        if step % 50 == 0:
            log.write(f"[TP{rank}] Decode batch, step {step}\\n")
        time.sleep(0.02)
""")


@dataclass
class Rig:
    ctl: Path
    procs: dict[int, subprocess.Popen[bytes]]
    sidecars: dict[int, Sidecar]

    def stall(self, rank: int) -> float:
        (self.ctl / f"stall{rank}").write_text("")
        return time.time()

    def unstall(self, rank: int) -> None:
        (self.ctl / f"stall{rank}").unlink()

    def bundles(self, root: Path) -> list[Path]:
        return sorted(p for p in root.glob("*") if p.is_dir() and not p.name.startswith("."))


def _start_rig(tmp_path: Path, bundle_dir: Path, *, recover_s: float = 2.0, pyspy: str | bool = True) -> Rig:
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "fakerows.py").write_text(ROWS)
    (ctl / "engine.py").write_text(ENGINE)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for rank in (0, 1):
        env = {**os.environ, "SGLSEAT_PROBE": "fakerows:fetch_rows@ids",
               "SGLSEAT_PROBE_DIR": str(tmp_path / "rings" / f"node{rank}")}
        mport = str(METRICS_PORT if rank == 0 else 0)
        procs[rank] = subprocess.Popen([sys.executable, str(ctl / "engine.py"), str(rank), str(rank), str(ctl), mport],
                                       env=env, stdin=subprocess.DEVNULL)
    th = WatchdogSpec().model_dump()
    sidecars: dict[int, Sidecar] = {}
    for node in (0, 1):
        p = procs[node]

        def discover(p: subprocess.Popen[bytes] = p) -> list[EngineProc]:
            try:
                ps = psutil.Process(p.pid)
                title = ps.cmdline()[0]
                if not title.startswith("sglang::"):
                    return []
                return [EngineProc(pid=p.pid, title=title, rank=int(title.split("_TP")[1].split("_")[0]),
                                   kind="scheduler", create_time=ps.create_time())]
            except (psutil.Error, IndexError):
                return []

        cfg = SidecarConfig(
            seat="fake", node=node, nnodes=2, thresholds=th, bundle_dir=str(bundle_dir), quota_mb=64,
            probe_dir=str(tmp_path / "rings" / f"node{node}"), log_path=str(ctl / f"node{node}.log"),
            metrics_url=f"http://127.0.0.1:{METRICS_PORT}/metrics",
            metrics_port=EXPORTER_PORT if node == 0 else None, rank_nodes={0: 0, 1: 1}, gpu=False,
            recover_s=recover_s)
        sampler = Sampler(node=node, sample_hz=1.0, history_s=120, discover=discover, pyspy=pyspy)
        sidecars[node] = Sidecar(cfg, sampler=sampler)
    for n, peer in local_peers(sidecars).items():
        sidecars[n].peers = peer
    rig = Rig(ctl=ctl, procs=procs, sidecars=sidecars)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # both ranks titled and probed
        if all(s.sampler._discover() for s in sidecars.values()) and all(
                (tmp_path / "rings" / f"node{n}").is_dir() and any((tmp_path / "rings" / f"node{n}").iterdir())
                for n in (0, 1)):
            break
        time.sleep(0.1)
    for s in sidecars.values():
        s.start()
    return rig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = _start_rig(tmp_path, tmp_path / "bundles")
    yield r
    _stop(r)


def _stop(r: Rig) -> None:
    for s in r.sidecars.values():
        s.stop()
    for f in r.ctl.glob("stall*"):
        f.unlink()
    for p in r.procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(10)
    me = psutil.Process()
    left = [c for c in me.children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"left behind: {[c.cmdline() for c in left]}"


def _wait(cond, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_rowfetch_stall_gives_one_bundle_then_rearms(rig: Rig, tmp_path: Path) -> None:
    root = tmp_path / "bundles"
    time.sleep(4)  # healthy traffic: stack history, fetches, tokens
    assert rig.bundles(root) == []
    assert all(s.verdict is None for s in rig.sidecars.values())
    t_stall = rig.stall(1)
    assert _wait(lambda: rig.bundles(root), 10), "no bundle within 10 s of the stall"
    t_bundle = time.time()
    (path,) = rig.bundles(root)
    b = read_bundle(path)
    v = b.manifest.verdict
    assert v is not None and v.kind is VerdictKind.ROWFETCH_STALL
    assert (v.rank, v.node) == (1, 1)
    assert v.frame is not None and v.frame.startswith("fetch_rows (fakerows.py:")
    assert v.waiting_ranks == (0,)
    assert t_bundle - t_stall < 10
    # every rank: a capture-time stack (native or its Python-only fallback) and a stack history
    assert {s.rank for s in b.native_stacks} == {0, 1}
    assert {s.rank for s in b.stacks} == {0, 1}
    assert min(s.t for s in b.stacks) <= t_stall - 3
    inflight = [p for p in b.probes if p.end is None]
    assert [p.rank for p in inflight] == [1] and inflight[0].start >= t_stall - 0.5
    assert any(p.rank == 0 and p.end is not None for p in b.probes)
    assert b.metrics and b.log_text.get(0) is not None
    assert b.manifest.thresholds["rowfetch_inflight_s"] == 3.0
    replayed, why = rerun_detectors(b)  # what `sgl-seat replay` does: the same verdict from the same records
    assert replayed == v, why
    # the exporter on 127.0.0.1 counts samples, captures and fetch latencies by gather size
    text = httpx.get(f"http://127.0.0.1:{EXPORTER_PORT}/metrics", timeout=5).text
    assert 'sgl_seat_watchdog_captures_total{node="0",result="ok"} 1.0' in text
    # the gathers are 8, 16, 24 and 32 rows: power-of-two buckets as in the replay report
    assert 'sgl_seat_watchdog_rowfetch_seconds_count{gather="8-15",node="0"}' in text
    # one hang, one bundle: the stall goes on, detectors keep firing, nothing new is written
    time.sleep(5)
    assert len(rig.bundles(root)) == 1
    assert rig.sidecars[1].verdict is not None and rig.sidecars[1].latched_at is not None
    # recovery re-arms (recover_s=2 here) ...
    rig.unstall(1)
    assert _wait(lambda: all(s.latched_at is None for s in rig.sidecars.values()), 20)
    # ... so a crash afterwards is a second, separate bundle with the log tail
    rig.procs[1].send_signal(signal.SIGKILL)
    assert _wait(lambda: len(rig.bundles(root)) == 2, 10)
    crash = read_bundle(rig.bundles(root)[-1])
    cv = crash.manifest.verdict
    assert cv is not None and cv.kind is VerdictKind.PROCESS_EXITED and (cv.rank, cv.node) == (1, 1)
    assert "engine up" in crash.log_text[1]
    assert any(not p.alive and p.rank == 1 for p in crash.processes)


def test_unwritable_bundle_dir_is_an_error_not_a_crash(tmp_path: Path) -> None:
    blocker = tmp_path / "full"
    blocker.write_text("a file where the bundle directory should be")
    r = _start_rig(tmp_path, blocker / "bundles")
    try:
        time.sleep(2)
        r.stall(1)
        assert _wait(lambda: r.sidecars[0].capture_errors, 15)
        assert "could not write bundle" in r.sidecars[0].capture_errors[0]
        ticks = r.sidecars[0].ticks
        assert _wait(lambda: r.sidecars[0].ticks > ticks + 4, 5)  # still watching
        r.unstall(1)
        assert all(p.poll() is None for p in r.procs.values())  # the engine keeps serving
        tokens = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).text
        assert "sglang:generation_tokens_total" in tokens
        assert not list(tmp_path.glob("**/.tmp-*"))
    finally:
        _stop(r)


def test_snapshot_is_plain_json(rig: Rig) -> None:
    time.sleep(2.5)
    snap = rig.sidecars[0].snapshot()
    json.dumps(snap)
    (r0,) = [v for v in snap["ranks"] if v["rank"] == 0]
    assert r0["state"] in ("running", "collective") and r0["fetches"] > 0
    assert snap["tokens_per_s"] is not None and snap["tokens_per_s"] > 0


def test_without_pyspy_the_probe_alone_catches_the_stall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """py-spy missing: one warning, no stacks, and still a bundle naming rank 1 from the probe records."""
    monkeypatch.setenv("SGLSEAT_PYSPY", "/nonexistent/py-spy")
    r = _start_rig(tmp_path, tmp_path / "bundles")
    try:
        assert all(s.sampler.state == "py-spy not found" for s in r.sidecars.values())
        time.sleep(2)
        r.stall(1)
        assert _wait(lambda: r.bundles(tmp_path / "bundles"), 10)
        b = read_bundle(r.bundles(tmp_path / "bundles")[0])
        v = b.manifest.verdict
        assert v is not None and v.kind is VerdictKind.ROWFETCH_STALL and (v.rank, v.node) == (1, 1)
        assert v.frame == "fetch_rows (fakerows:fetch_rows)"  # no stack: the frame comes from the probe target
        assert b.stacks == [] or all(s.error for s in b.stacks)
        assert any(c["status"] != "ok" and "py-spy" in c["step"] for c in b.manifest.capture)
    finally:
        _stop(r)
