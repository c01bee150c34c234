"""The seat carries its settings (issue 47, item 2), on a real local seat: `sgl-seat up --draft on --on-hang
rollback-draft` of a two-node sim seat on a local Ray cluster, then its ``seat.yaml`` edited while it runs (the
row-fetch stall threshold 3.0 -> 2.0 s, the draft's tokens 4 -> 2, the draft-off slots 32 -> 24).

1. Node 1's sidecar SIGKILLed and restarted by Ray; a row-fetch stall on rank 3 while six long requests decode
   (a verify step gathers 6 x 4 = 24 rows): the bundle's thresholds are those recorded at `up`; the supervisor rolls
   the draft back, because 24 is within what the recorded draft gathers (8 slots x 4 tokens = 32; from the edited
   file, 8 x 2 = 16, it took the stall for a prefill and restarted instead), and the draft-off plan it rebuilt has
   the recorded 32 slots, not the file's 24.
2. A second stall after that healing: its bundle, written by the sidecars the supervisor started again, still holds
   the recorded thresholds (before, they read the edited file: 2.0 s).

`down` leaves no process behind. Ports 27500-27516 (the seat, its sidecars' exporters at +15/+16; ours, see
tests/integration/conftest.py). Processes are checked by pid and process group, never by name.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from launchutil import (
    LongRequest,
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

from sgl_seat.sim.front import ports as sim_ports
from sgl_seat.spec import load_spec

pytestmark = pytest.mark.integration

SEAT = "kept-seat"
HTTP = 27500  # +2 admin node 0, +5 dist-init, +10/+12 node 1 and its admin, +15/+16 the sidecar exporters


@dataclass
class Seat:
    home: Path
    url: str
    spec: Path
    recorded: dict[str, Any]
    started: list[Any] = field(default_factory=list)
    pgids: set[int] = field(default_factory=set)

    def status(self) -> dict[str, Any]:
        st = status_json(SEAT, self.home)
        self.pgids |= set(engine_pgids(st))
        return st

    def history(self) -> list[dict[str, Any]]:
        hist: list[dict[str, Any]] = self.status()["remediation"]["history"]
        return hist

    def fault(self, fault: str) -> None:
        admin = f"http://127.0.0.1:{sim_ports.admin_port(sim_ports.node_port(HTTP, 1))}/sim/faults"
        r = httpx.post(admin, json={"fault": fault}, timeout=10, trust_env=False)
        assert r.status_code == 200, r.text

    def bundles(self) -> list[Path]:
        d = self.home / "bundles" / SEAT
        return sorted((p for p in d.glob("*") if p.is_dir() and not p.name.startswith(".")),
                      key=lambda p: p.stat().st_mtime) if d.is_dir() else []

    def watch(self) -> dict[str, Any]:
        res = run_cli(["watch", SEAT, "--once", "--json"], self.home, timeout=90)
        assert res.returncode == 0, res.stdout + res.stderr
        doc: dict[str, Any] = json.loads(res.stdout)
        return doc

    def thresholds(self) -> dict[str, Any]:
        """The detector thresholds recorded at `up` (the watchdog section less what happens after a hang)."""
        return {k: v for k, v in self.recorded["watchdog"].items() if k not in ("on_hang", "remediation")}


def _running(url: str) -> float:
    try:
        text = httpx.get(f"{url}/metrics", timeout=5, trust_env=False).text
    except httpx.HTTPError:
        return 0.0
    vals = [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("sglang:num_running_reqs")]
    return max(vals, default=0.0)


def _listener(port: int) -> int:
    """The pid listening on 127.0.0.1:``port`` (a sidecar's exporter: how this test finds node 1's sidecar)."""
    (pid,) = {c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port
              and c.pid is not None}
    return pid


def _ended(seat: Seat, n: int) -> bool:
    hist = seat.history()
    return len(hist) == n and hist[-1]["outcome"] != "pending"


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seat]:
    tmp = tmp_path_factory.mktemp("keptseat")
    home = tmp / "home"
    # no cooldown: the second stall, soon after the first healing, is healed too (its bundle is what is checked)
    spec = local_sim_spec(tmp, SEAT, HTTP, draft=True,
                          sections={"watchdog": {"rowfetch_inflight_s": 3.0, "remediation": {"cooldown_s": 0}}})
    up = run_cli(["up", "--seat", str(spec), "--draft", "on", "--on-hang", "rollback-draft", "--timeout", "300"],
                 home, timeout=360)
    s = Seat(home=home, url=f"http://127.0.0.1:{HTTP}", spec=spec, recorded={})
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "ok supervisor" in up.stdout and "running on nodes 0, 1" in up.stdout, up.stdout
        cluster = json.loads((home / "clusters" / f"{SEAT}.json").read_text())
        s.started = descendants(cluster["pid"]) + seat_processes(SEAT)  # engines and their hosts: outside Ray
        s.recorded = json.loads((home / "seats" / f"{SEAT}.json").read_text())["spec"]
        s.status()
        yield s
    finally:
        down = run_cli(["down", SEAT], home, timeout=240)
        print(down.stdout, down.stderr)
        assert down.returncode == 0, down.stdout + down.stderr
        assert alive(s.started) == [], "Ray, agent, supervisor, sidecar or engine processes left behind"
        assert in_groups(sorted(s.pgids)) == []


@pytest.mark.slow  # full tier only (README, "The tests")
def test_an_edited_seat_file_changes_neither_the_bundles_thresholds_nor_the_healing(seat: Seat) -> None:
    """GIVEN the READY seat, its spec recorded at `up` WHEN its file is edited (stall threshold, draft tokens,
    draft-off slots), node 1's sidecar is killed and restarted by Ray, and rank 3 stalls in a verify step THEN the
    bundle's thresholds and the rollback (its decision and its rebuilt plan) are those recorded at `up`; and after
    that healing a second stall's bundle, from the sidecars the supervisor started again, has them too."""
    t0 = time.monotonic()
    rec = seat.recorded
    assert (rec["watchdog"]["rowfetch_inflight_s"], rec["draft"]["draft_tokens"], rec["slots"]) == (3.0, 4, 32), rec
    doc = yaml.safe_load(seat.spec.read_text())
    doc["watchdog"]["rowfetch_inflight_s"] = 2.0
    doc["draft"].update(steps=1, draft_tokens=2)
    doc["slots"] = 24
    seat.spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert load_spec(str(seat.spec)).draft.draft_tokens == 2  # a valid spec: a file read again would take it

    victim = _listener(HTTP + 16)  # node 1's sidecar
    os.kill(victim, 9)

    def back() -> bool:
        nodes = seat.watch()["nodes"]
        return len(nodes) == 2 and bool(nodes[1].get("restarted")) and not nodes[1].get("error") \
            and nodes[1].get("samples_taken", 0) > 0

    assert wait_until(back, 90.0, interval=1.0), seat.watch()["nodes"]
    print(f"node 1's sidecar restarted {time.monotonic() - t0:.1f} s in")

    long = [LongRequest(seat.url, timeout_s=300.0) for _ in range(6)]
    for r in long:
        r.start()
    assert wait_until(lambda: _running(seat.url) >= 6, 60), "the long requests are not all running"
    time.sleep(1.0)  # past their prefill: every step now is a verify of 6 x 4 = 24 positions
    seat.fault("rowfetch-stall:rank=3,gather_ge=20")
    assert wait_until(lambda: _ended(seat, 1), 180, interval=2.0), f"no remediation ended: {seat.history()}"
    (r1,) = seat.history()
    print(f"remediation 1: {r1['action']} {r1['outcome']}: {r1['reason']} ({time.monotonic() - t0:.1f} s in)")
    gather = re.search(r"gather size (\d+)", r1["reason"])
    assert gather is not None and 16 < int(gather[1]) <= 32 and "<= 32" in r1["reason"], r1  # 16: the edited bound
    assert r1["action"] == "rollback-draft" and r1["outcome"] == "serving", r1
    st = seat.status()
    assert st["state"] == "READY" and st["draft"] is False, st
    plan = json.loads((seat.home / "seats" / f"{SEAT}.json").read_text())["plan"]
    assert plan["slots"] == 32, plan["slots"]  # the recorded spec's draft-off slots, not the edited file's 24
    (b1,) = seat.bundles()
    m1 = json.loads((b1 / "manifest.json").read_text())
    assert m1["verdict"]["kind"] == "row-fetch stall" and m1["verdict"]["rank"] == 3, m1["verdict"]
    assert m1["thresholds"] == seat.thresholds(), m1["thresholds"]
    for lr in long:
        lr.join(60)

    second = LongRequest(seat.url, tokens=400, timeout_s=300.0)
    seat.fault("rowfetch-stall:rank=3")
    second.start()
    assert wait_until(lambda: _ended(seat, 2), 180, interval=2.0), f"no second remediation ended: {seat.history()}"
    r2 = seat.history()[-1]
    print(f"remediation 2: {r2['action']} {r2['outcome']}: {r2['reason']} ({time.monotonic() - t0:.1f} s in)")
    b2 = next(b for b in seat.bundles() if b != b1)
    m2 = json.loads((b2 / "manifest.json").read_text())
    assert m2["thresholds"]["rowfetch_inflight_s"] == 3.0 and m2["thresholds"] == seat.thresholds(), m2["thresholds"]
    assert r2["outcome"] == "serving", r2
    second.join(60)
