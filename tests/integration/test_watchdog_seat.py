"""Acceptance of the watchdog on a real seat: `sgl-seat up --draft on` of a two-node sim seat on a local Ray
cluster (sidecars started by `up`), steady traffic, then:

- no stall for 30 s: no bundle, a quiet watch view (the soak is the false-positive evidence);
- a row-fetch stall injected on rank 3: one bundle within 10 s of the stall, holding Python stacks of all 4
  ranks from both nodes and a capture-time stack of each (native where it landed inside the native budget),
  the stack history of the preceding 60 s, the probe records with the stalled fetch in flight, and a verdict
  naming rank 3, its node and the row-fetch frame, ranks 0-2 waiting in the collective (SGLang's own watchdog
  would fire at --watchdog-timeout);
  the bundle also records the requests before the hang (from SGLang's request log on node 0, redacted);
- `sgl-seat replay` of that live bundle names rank 3, its node and the row-fetch frame, shows the gather-size
  bucket where latency explodes, and writes HTML that headless Chromium renders without errors;
- `replay --traffic` of that bundle against a fresh sim seat armed with the same stall (rank 3's row fetch,
  fired by a gather size this traffic reaches and light traffic does not) makes the fresh seat's watchdog
  capture a row-fetch stall: reproduced;
- node 1's sidecar actor SIGKILLed: Ray restarts it, no bundle (its agent answering, node 1 is not lost), READY;
- node 1's agent SIGKILLed: its engines go on serving, no bundle, `status` FAILED naming the agent and the engines;
- a crashed rank: a bundle of kind "process exited" with the log tail;
- `down` stops the sidecars and leaves no process behind.

One seat serves the module (an `up` costs ~20-40 s on a small box); tests run in file order. Ports 26600-26620
for the seat, 26700-26712 for the replay target (ours: 26000-26999, below Linux's ephemeral range, see
tests/integration/conftest.py). Processes are checked by pid and process group, never by name.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psutil
import pytest
from launchutil import (
    REPO,
    alive,
    descendants,
    engine_pgids,
    in_groups,
    local_sim_spec,
    run_cli,
    seat_processes,
    status_json,
    wait_until,
)

from rigs.simrig import SimSeat, Traffic, sim_spec
from sgl_seat.core.records import VerdictKind
from sgl_seat.forensics import read_bundle
from sgl_seat.forensics.replay.redetect import rerun_detectors
from sgl_seat.sim.front import ports as sim_ports
from sgl_seat.spec import WatchdogSpec

pytestmark = pytest.mark.integration

SEAT = "wd-seat"
HTTP = 26600  # +2 admin node 0, +5 dist-init, +10/+12 node 1 and its admin, +15/+16 the sidecar exporters
TARGET = "wd-replay-target"
TARGET_HTTP = 26700  # the fresh seat that replayed traffic is sent to: +2, +5, +10, +12
LEARN_MIN_SAMPLES = 30


@dataclass
class Seat:
    home: Path
    url: str
    traffic: Traffic
    sidecars_up_at: float
    traffic_from: float  # when the traffic began (after `up` and the status read: later under load)
    stall_bundle: Path | None = None

    def bundles(self) -> list[Path]:
        d = self.home / "bundles" / SEAT
        return sorted(p for p in d.glob("*") if p.is_dir() and not p.name.startswith(".")) if d.is_dir() else []

    def admin(self, node: int) -> str:
        return f"http://127.0.0.1:{sim_ports.admin_port(sim_ports.node_port(HTTP, node))}/sim/faults"

    def watch(self) -> dict[str, Any]:
        res = run_cli(["watch", SEAT, "--once", "--json"], self.home, timeout=90)
        assert res.returncode == 0, res.stdout + res.stderr
        doc: dict[str, Any] = json.loads(res.stdout)
        return doc


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seat]:
    tmp = tmp_path_factory.mktemp("wdseat")
    home = tmp / "home"
    # A shape's threshold is learned after LEARN_MIN_SAMPLES healthy calls (200 by default), and the stall fires on
    # rank 3's next fetch, whatever its gather. A minute of this traffic gives a prefill shape of several prompts
    # (gather 128-255) 126 calls on an idle 2-core machine, fewer on a loaded one, and no larger shape: the landing
    # CI's stall hit gather 160 and the fixed 3 s judged it (2026-12-06). The test is of the learned path, not of
    # the default count.
    spec = local_sim_spec(tmp, SEAT, HTTP, draft=True, sections={"watchdog": {"learn_min_samples": LEARN_MIN_SAMPLES}})
    up = run_cli(["up", "--seat", str(spec), "--draft", "on", "--timeout", "300"], home, timeout=360)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "ok sidecars" in up.stdout and "running on nodes 0, 1" in up.stdout, up.stdout
        sidecars_up_at = time.time()
        st = status_json(SEAT, home)
        cluster = json.loads((home / "clusters" / f"{SEAT}.json").read_text())
        started = descendants(cluster["pid"]) + seat_processes(SEAT)  # engines and their hosts: outside Ray
        pgids = engine_pgids(st)
    except BaseException:
        run_cli(["down", SEAT], home, timeout=240)  # whatever `up` left running
        raise
    traffic = Traffic(f"http://127.0.0.1:{HTTP}", concurrency=8, max_new_tokens=32).start()
    try:
        yield Seat(home=home, url=f"http://127.0.0.1:{HTTP}", traffic=traffic, sidecars_up_at=sidecars_up_at,
                   traffic_from=time.time())
    finally:
        traffic.stop(10)
        down = run_cli(["down", SEAT], home, timeout=240)
        assert down.returncode == 0, down.stdout + down.stderr
        assert alive(started) == [], "Ray, agent, sidecar or engine processes left behind"
        assert in_groups(pgids) == []
        assert not Path(f"/dev/shm/sgl-seat-{SEAT}").exists(), "probe rings left in /dev/shm"


def test_healthy_traffic_gives_no_bundle_and_a_quiet_watch_view(seat: Seat) -> None:
    """30 s of this seat's traffic: no bundle, and `watch` shows every node sampling with nothing latched.

    The false-positive evidence proper is the soak (tests/integration/test_watchdog_soak.py in the full tier: a
    400k-token prefill, bursts, idle gaps, a slow rank; bench/watchdog_soak.py for 30 minutes); this one checks the
    watch view and the sampler counters on the seat the tests below share (it was a 2-minute sleep before the
    soak).
    """
    t0 = time.time()
    tokens0 = seat.traffic.tokens
    time.sleep(30.0)
    assert seat.traffic.tokens > tokens0 and seat.traffic.failed == 0
    assert seat.bundles() == [], "a bundle without a hang (false positive)"
    doc = seat.watch()
    assert doc["bundles"] == []
    for n in doc["nodes"]:
        assert n.get("verdict") is None and not n.get("latched"), n
        assert n["sampler"] == "ok" and n["samples_taken"] >= 2 * 30  # two ranks a node at 1 Hz, and more
    assert time.time() - t0 >= 30.0


def test_rowfetch_stall_on_rank3_gives_one_bundle_within_10s(seat: Seat) -> None:
    # a full minute of stack history, and of requests, before the hang (the traffic starts after `up` returns and
    # the status is read: up to ~20 s after the sidecars on a loaded machine)
    time.sleep(max(0.0, seat.sidecars_up_at + 63.0 - time.time(), seat.traffic_from + 63.0 - time.time()))
    assert seat.bundles() == []
    r = httpx.post(seat.admin(1), json={"fault": "rowfetch-stall:rank=3"}, timeout=10, trust_env=False)
    assert r.status_code == 200, r.text
    try:
        _check_the_stall(seat, t_stall=time.time())
    finally:
        # released whatever failed above: a seat left hung keeps its sidecars latched, and every later test of the
        # module would fail for this one's reason (the crash test's "no bundle within 60 s", once)
        httpx.delete(seat.admin(1), timeout=10, trust_env=False)


def _check_the_stall(seat: Seat, *, t_stall: float) -> None:
    assert wait_until(lambda: seat.bundles(), 10.0), "no bundle within 10 s of the stall"
    t_bundle = time.time()
    (path,) = seat.bundles()
    seat.stall_bundle = path
    # The bundle is complete on disk first (Python stacks, what the sidecars held in memory); the native stacks
    # follow it, added within their budget (the manifest's "late").
    assert wait_until(lambda: "late" in read_bundle(path).manifest.extra, 10.0), "no native stacks added"
    b = read_bundle(path)
    v = b.manifest.verdict
    assert v is not None and v.kind is VerdictKind.ROWFETCH_STALL, v
    assert (v.rank, v.node) == (3, 1)
    # Judged by the threshold learned from a minute of the seat's own healthy fetches, not the fixed 3 s: the
    # stalled call was named before it was 3 s old, and the bundle carries what was learned (SYNTHETIC figures).
    shapes = b.manifest.extra["learned"]["shapes"]
    print("learned shapes (samples):", {k: e.get("samples") for k, e in shapes.items()})
    assert "learned from" in v.evidence[0], v.evidence[0]
    stalled = [p for p in b.probes if p.end is None and p.rank == 3]
    assert stalled and v.t - stalled[0].start < b.manifest.thresholds["rowfetch_inflight_s"]
    assert any(k.startswith("1|") for k in b.manifest.extra["learned"]["shapes"])
    assert v.frame is not None and v.frame.startswith("fetch_rows (rowfetch.py:"), v.frame
    assert v.waiting_ranks == (0, 1, 2)
    assert t_bundle - t_stall <= 10.0
    # a capture-time stack of all four ranks, from both nodes: native where its dump landed inside the capture's
    # native budget (rank 3's, named by node 1's own detector, goes first), else the Python one, and then the
    # capture step says so; and Python stacks of all four
    native = [s for s in b.native_stacks if s.rank is not None]
    assert {(s.node, s.rank) for s in native} == {(0, 0), (0, 1), (1, 2), (1, 3)}
    assert all(any(f.native for t in s.threads for f in t.frames) for s in native if s.native)
    steps = {(c["node"], c["step"]): c for c in b.manifest.capture}
    for s in native:
        st = steps[(s.node, f"py-spy --native {s.pid}")]
        assert (st["status"] == "ok") == s.native and (s.native or "Python-only stack kept" in st["detail"]), st
    print("native stacks in the stall bundle:", sorted((s.rank, s.native) for s in native))
    assert {(s.node, s.rank) for s in b.stacks if s.rank is not None} == {(0, 0), (0, 1), (1, 2), (1, 3)}
    # the preceding 60 s of stack history, for every rank
    for rank in range(4):
        ts = [s.t for s in b.stacks if s.rank == rank and s.error is None]
        assert min(ts) <= t_stall - 60.0 and max(ts) >= t_stall, (rank, min(ts), max(ts))
    # the stalled fetch, in flight, on rank 3; completed fetches of every rank before it
    inflight = [p for p in b.probes if p.end is None]
    assert [(p.rank, p.node) for p in inflight] == [(3, 1)]
    assert t_stall - 1.0 <= inflight[0].start <= t_stall + 1.0
    assert {p.rank for p in b.probes if p.end is not None} == {0, 1, 2, 3}
    assert b.metrics and any(m.get("sglang:num_running_reqs") > 0 for m in b.metrics)
    assert set(b.log_text) == {0, 1}
    assert b.manifest.thresholds["rowfetch_inflight_s"] == 3.0
    replayed, why = rerun_detectors(b)  # `sgl-seat replay` reaches the live verdict from the same records
    assert replayed == v, why
    # the requests before the hang, from SGLang's own request log on node 0 (level 1: no text), redacted
    reqdir = seat.home / "logs" / SEAT / "requests"
    assert stat.S_IMODE(os.stat(reqdir).st_mode) == 0o700 and list(reqdir.glob("*_0.log"))
    assert b.manifest.redaction["prompts"] == "redacted" and b.manifest.redaction["requests"] == len(b.requests)
    assert len(b.requests) > 100 and min(r.t for r in b.requests) <= t_stall - 50.0
    assert all(r.route == "/generate" and r.max_tokens == 32 and r.prompt is None and r.prompt_hash == ""
               and r.sampling.get("ignore_eos") is True for r in b.requests)
    done = [r for r in b.requests if r.finished is not None]
    assert done and all(r.output_tokens == 32 and not r.tokens_estimated and r.prompt_tokens >= 40 for r in done)
    assert any(r.finished is None for r in b.requests)  # in flight when the seat hung
    # one hang, one bundle; `watch` shows it and the latch
    time.sleep(5.0)
    assert len(seat.bundles()) == 1
    doc = seat.watch()
    assert [x["id"] for x in doc["bundles"]] == [path.name]
    assert any(n.get("latched") for n in doc["nodes"])
    # `status` says HUNG and names the bundle while the watchdog is latched (every process is still alive)
    st = status_json(SEAT, seat.home)
    assert st["state"] == "HUNG", st["reason"]
    assert st["hang"]["bundle"] == path.name and "rank 3 node 1" in st["hang"]["verdict"], st["hang"]
    # release the stall: tokens flow again and the sidecars re-arm
    r = httpx.delete(seat.admin(1), timeout=10, trust_env=False)
    assert r.status_code == 200, r.text
    assert wait_until(lambda: not any(n.get("latched") for n in seat.watch()["nodes"]), 60.0, interval=2.0)
    st = status_json(SEAT, seat.home)
    assert st["state"] == "READY" and st["hang"] is None, st["reason"]


def _replay_outputs() -> ModuleType:
    """tests/unit/test_replay_outputs.py, for its headless-Chromium check (loaded by path: tests/unit is no package)."""
    spec = importlib.util.spec_from_file_location("replay_outputs", REPO / "tests" / "unit" / "test_replay_outputs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_replay_of_the_live_stall_bundle_names_rank3_and_the_exploding_bucket(seat: Seat, tmp_path: Path) -> None:
    assert seat.stall_bundle is not None, "the stall test did not capture a bundle"
    html = tmp_path / "out.html"
    res = run_cli(["replay", str(seat.stall_bundle), "--json", "--html", str(html)], seat.home, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    v = doc["verdict"]
    assert (v["kind"], v["rank"], v["node"]) == ("row-fetch stall", 3, 1) and "fetch_rows" in v["frame"], v
    assert doc["verdict_matches"] is True  # a consistency check: the same detectors over the same records
    # ... and the comparison that is not a round trip: the verdict node 1's sidecar reached live, on its own view
    assert doc["live_verdict"] is not None and doc["live_verdict_matches"] is True, doc["live_verdict"]
    assert doc["comparison"].startswith("agrees with the verdict the triggering sidecar reached live")
    (fetch,) = doc["rowfetch"]["in_flight_fetches"]
    assert (fetch["rank"], fetch["node"]) == (3, 1) and fetch["stalled"]
    buckets = doc["rowfetch"]["buckets"]
    (hot,) = [b for b in buckets if b["gather_size_min"] <= fetch["gather_size"] <= b["gather_size_max"]]
    # its own age, past the threshold learned for its shape (never below the learned floor), is the bucket's max
    assert hot["stalled"] and hot["in_flight"] == 1 and hot["max_ms"] >= 1000.0 * WatchdogSpec().learn_floor_s
    assert all(b["max_ms"] < hot["max_ms"] and not b["stalled"] for b in buckets if b is not hot), buckets
    assert doc["rowfetch"]["worst_bucket"]["gather_size_min"] == hot["gather_size_min"]
    assert doc["activity"]["requests"]["recorded"] > 100
    ro = _replay_outputs()
    if ro.CHROMIUM is None:
        pytest.skip(ro.NO_CHROMIUM)
    dom = ro.assert_renders_in_chromium(html, tmp_path)
    assert "rank 3" in dom


@pytest.mark.slow  # full tier only (README, "The tests")
def test_replayed_traffic_reproduces_the_stall_on_a_fresh_seat(seat: Seat, tmp_path: Path) -> None:
    """The live bundle's traffic, re-driven against a fresh sim seat with rank 3's row fetch armed to stall at a
    gather this traffic reaches (its 90th percentile on rank 3; idle health checks gather <= 4 rows): the target's
    watchdog captures a row-fetch stall on rank 3 and `replay --traffic` reports it reproduced."""
    assert seat.stall_bundle is not None, "the stall test did not capture a bundle"
    b = read_bundle(seat.stall_bundle)
    gathers = sorted(p.gather_size for p in b.probes if p.end is not None and p.rank == 3)
    gather_ge = max(16, gathers[int(0.9 * len(gathers))])
    target = SimSeat(sim_spec(TARGET, TARGET_HTTP), draft=True, workdir=tmp_path / "target",
                     faults=(f"rowfetch-stall:rank=3,gather_ge={gather_ge}",))
    bundles = seat.home / "bundles" / TARGET
    target.start()
    sidecars: dict[int, Any] = {}
    try:
        sidecars = target.sidecars(bundles)
        for sc in sidecars.values():
            sc.start()
        # light traffic does not fire the armed stall: one request completes and no bundle appears
        r = httpx.post(f"{target.url}/generate", json={"text": "ping", "sampling_params": {"max_new_tokens": 4}},
                       timeout=30, trust_env=False)
        assert r.status_code == 200, r.text
        time.sleep(5.0)
        assert not bundles.exists() or not any(bundles.iterdir())
        res = run_cli(["replay", str(seat.stall_bundle), "--traffic", "--target", target.url, "--target-seat", TARGET,
                       "--speed", "2", "--max-requests", "400", "--max-seconds", "30", "--watch-grace", "15", "--json"],
                      seat.home, timeout=180)
        assert res.returncode == 0, res.stderr[-2000:]
        tr = json.loads(res.stdout)["traffic"]
        assert tr["sent"] > 0 and tr["watched"] == str(bundles), json.dumps(tr)
        assert tr["reproduced"] is True, json.dumps(tr)
        (new,) = tr["new_bundles"]
        nv = read_bundle(Path(new)).manifest.verdict
        assert nv is not None and nv.kind is VerdictKind.ROWFETCH_STALL and (nv.rank, nv.node) == (3, 1), nv
    finally:
        for sc in sidecars.values():
            sc.stop()
        target.stop()


def _listener(port: int) -> int:
    """The pid listening on 127.0.0.1:``port`` (a sidecar's exporter: how this test finds node 1's sidecar)."""
    (pid,) = {c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port
              and c.pid is not None}
    return pid


@pytest.mark.slow  # full tier only (README, "The tests")
def test_a_killed_sidecar_is_restarted_by_ray_and_no_node_is_blamed(seat: Seat) -> None:
    """Issue 24, item 3 (a sidecar actor killed). Before: node 0 took node 1's silent sidecar for a lost node and
    wrote a false node-unreachable bundle every ~11 s, the seat flapping HUNG/READY while it served (measured on
    this seat's shape). Now node 1's agent still answering makes it a watch gap, and Ray restarts the sidecar."""
    before = set(seat.bundles())
    tokens0 = seat.traffic.tokens
    victim = _listener(HTTP + 16)  # node 1's exporter
    os.kill(victim, 9)
    t0 = time.monotonic()

    def back() -> bool:
        nodes = seat.watch()["nodes"]
        if len(nodes) < 2:  # the view lists node 1 again once its restarted sidecar answers (seen under load)
            return False
        n1 = nodes[1]
        return bool(n1.get("restarted")) and not n1.get("error") and n1.get("samples_taken", 0) > 0

    assert wait_until(back, 60.0, interval=1.0), seat.watch()["nodes"]
    print(f"node 1's sidecar restarted and sampling {time.monotonic() - t0:.1f} s after its SIGKILL")
    assert _listener(HTTP + 16) != victim
    time.sleep(max(0.0, 15.0 - (time.monotonic() - t0)))  # well past the 3 s silence that made a lost node
    assert set(seat.bundles()) == before, sorted(set(seat.bundles()) - before)
    st = status_json(SEAT, seat.home)
    assert st["state"] == "READY", st["reason"]
    assert seat.traffic.tokens > tokens0


@pytest.mark.slow  # full tier only (README, "The tests")
def test_a_killed_node_agent_leaves_its_engines_serving_and_status_names_them(seat: Seat) -> None:
    """Issue 24, item 3 (the node agent killed), measured: the engines are in their own session and outlive it, the
    seat goes on serving, and no bundle is written (nothing hangs). `status` says the agent is gone and that its
    engines still run, by pid, and how to stop them; `down` (this module's teardown) still leaves nothing."""
    before = set(seat.bundles())
    st = status_json(SEAT, seat.home)
    agent = st["nodes"][1]["agent_pid"]
    engines = [p for p in st["nodes"][1]["pids"]]
    assert agent and engines, st["nodes"][1]
    os.kill(agent, 9)
    assert wait_until(lambda: not psutil.pid_exists(agent) or psutil.Process(agent).status() == "zombie", 20.0)
    tokens0 = seat.traffic.tokens
    doc: dict[str, Any] = {}

    def named() -> bool:
        nonlocal doc
        doc = status_json(SEAT, seat.home)
        return doc["state"] == "FAILED" and "node 1 agent" in (doc["reason"] or "")

    assert wait_until(named, 60.0, interval=2.0), doc
    reason = doc["reason"]
    print("status:", reason)
    assert f"pid {agent}) is gone" in reason and "engine processes alive (pids " in reason, reason
    assert f"sgl-seat down {SEAT}" in reason
    time.sleep(5.0)
    assert all(psutil.pid_exists(p) for p in engines), engines
    assert seat.traffic.tokens > tokens0, "the seat stopped serving with its agent gone"
    assert set(seat.bundles()) == before, sorted(set(seat.bundles()) - before)


def test_crashed_rank_gives_a_process_exited_bundle_with_the_log_tail(seat: Seat) -> None:
    before = set(seat.bundles())
    # Rank 2 fails in its forward (SGLang's scheduler-exception path); its peers then fail their collective.
    # Which sidecar polls first is luck; the verdict must not depend on it (it did with a silent SIGKILL).
    r = httpx.post(seat.admin(1), json={"fault": "error:rank=2"}, timeout=10, trust_env=False)
    assert r.status_code == 200, r.text
    # No bound is claimed for this path (the stall's 10 s is above): the wait is only long enough for a capture of
    # four ranks on a loaded CI machine (15 s was not, once), as the real engine's fault tests allow 60 s.
    assert wait_until(lambda: set(seat.bundles()) - before, 60.0), "no bundle within 60 s of the crash"
    (path,) = sorted(set(seat.bundles()) - before)
    b = read_bundle(path)
    v = b.manifest.verdict
    assert v is not None and v.kind is VerdictKind.PROCESS_EXITED, v
    assert (v.rank, v.node) == (2, 1), v
    # gone, or (a capture that beat its exit: it SIGQUITs its node, whose cleanup can kill its neighbours first)
    # still exiting, and the verdict says which
    (r2,) = [p for p in b.processes if p.rank == 2]
    assert not r2.alive or "is exiting after its own error" in v.evidence[0], (r2, v.evidence)
    tail = b.log_text[1]
    # as real SGLang: the prefixed line opens the traceback, whose last line is the error
    assert "Scheduler hit an exception: Traceback (most recent call last):" in tail, tail[-2000:]
    assert "RuntimeError: sim fault: rank 2 failed in its forward" in tail, tail[-2000:]
    assert any("rank 2's own error" in e for e in v.evidence), v.evidence
    assert b.logs or tail
