"""A real Prometheus (Debian's ``prometheus`` package) scraping the local-sim seat's watchdog sidecars with the
shipped alert rules: during an injected slow-then-stall of one rank's row fetch, the pre-hang warning alert fires
before the hang alert, and the dashboard's queries return data from what the sidecars and the sim's SGLang
``/metrics`` export.

The seat is the local-sim profile started without Ray (``rigs.simrig``: each node as the node agent would start
it, the sidecars in-process, configured from the plan as ``up`` configures them). Prometheus runs from
``watchdog/prometheus/scrape-example.yml`` with its targets replaced and 1 s intervals, on 127.0.0.1 only, with
its own storage directory in the test's temporary directory, as a process this test starts and kills by pid.
Ports 30900-30930 (seat 30900-30912, sidecar exporters 30915-30916, Prometheus 30930). Skips with the reason
where the ``prometheus`` package is not installed (``apt-get install -y prometheus``).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from launchutil import stop_pid

from rigs.simrig import SimSeat, Traffic, sim_spec
from sgl_seat.core.warning import WarningRule
from sgl_seat.forensics import read_bundle
from sgl_seat.forensics.replay.redetect import first_warning_before
from sgl_seat.watchdog.config import metrics_port_for
from sgl_seat.watchdog.sidecar import Sidecar

# Full tier only (README, "The tests"): a real Prometheus beside a slow-then-stall episode; the rules themselves are
# checked by promtool in tests/unit/test_prom_assets.py in the CI tier.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "sgl_seat" / "watchdog" / "prometheus"
DASHBOARD = ROOT / "sgl_seat" / "watchdog" / "grafana" / "seat-dashboard.json"
SEAT = "prom-seat"
HTTP = 30900
EXPORTERS = metrics_port_for(HTTP, 0)  # node r's sidecar at http_port + 15 + r, as `up` configures it
PROM_PORT = 30930
PROMETHEUS = shutil.which("prometheus")


@dataclass
class Rig:
    seat: SimSeat
    sidecars: dict[int, Sidecar]
    prom: subprocess.Popen[bytes]
    api: str
    log: Path
    traffic_at: float

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.api}/api/v1/query", params={"query": expr}, timeout=10.0, trust_env=False)
        r.raise_for_status()
        res: list[dict[str, Any]] = r.json()["data"]["result"]
        return res

    def alerts(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.api}/api/v1/alerts", timeout=10.0, trust_env=False)
        r.raise_for_status()
        out: list[dict[str, Any]] = r.json()["data"]["alerts"]
        return out

    def firing(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"]


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            got = cond()
            if got:
                return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s")
        time.sleep(interval)


def prometheus_config(tmp: Path) -> Path:
    """The shipped example with this seat's targets, 1 s intervals and the shipped rules by absolute path."""
    doc = yaml.safe_load((PROM_DIR / "scrape-example.yml").read_text())
    doc["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    doc["rule_files"] = [str(PROM_DIR / "alerts.yml")]
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    jobs["sgl-seat-watchdog"]["static_configs"] = [
        {"targets": [f"127.0.0.1:{EXPORTERS + n}" for n in (0, 1)], "labels": {"seat": SEAT}}]
    jobs["sglang"]["static_configs"] = [{"targets": [f"127.0.0.1:{HTTP}"], "labels": {"seat": SEAT}}]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    if PROMETHEUS is None:
        pytest.skip("Debian's prometheus package is not installed (apt-get install -y prometheus)")
    tmp = tmp_path_factory.mktemp("prom")
    seat = SimSeat(spec=sim_spec(SEAT, HTTP), draft=False, workdir=tmp / "seat")
    started: list[psutil.Process] = []
    sidecars: dict[int, Sidecar] = {}
    traffic: Traffic | None = None
    prom: subprocess.Popen[bytes] | None = None
    api = f"http://127.0.0.1:{PROM_PORT}"
    log = tmp / "prometheus.log"
    try:
        # Prometheus first: it starts while the seat does (its first scrapes fail, which it shrugs off).
        with log.open("wb") as logf:
            prom = subprocess.Popen(
                [PROMETHEUS, f"--config.file={prometheus_config(tmp)}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{PROM_PORT}", "--storage.tsdb.retention.time=1h"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        seat.start()
        started = [psutil.Process(p.pid) for p in seat.procs.values()]
        started += [c for p in list(started) for c in p.children(recursive=True)]
        sidecars = seat.sidecars(tmp / "bundles", metrics_port=EXPORTERS, recover_s=5.0)
        for s in sidecars.values():
            s.start()
        assert [s.exporter.port for s in sidecars.values()] == [metrics_port_for(HTTP, n) for n in (0, 1)]
        traffic = Traffic(seat.url, concurrency=4, max_new_tokens=16).start()
        traffic_at = time.time()
        wait_for(lambda: httpx.get(f"{api}/-/ready", timeout=2.0, trust_env=False).status_code == 200, 30,
                 "Prometheus not ready")
        yield Rig(seat=seat, sidecars=sidecars, prom=prom, api=api, log=log, traffic_at=traffic_at)
    finally:
        if seat.procs:
            seat.clear_faults()  # first: the stalled rank's requests finish, so the traffic threads stop at once
        if prom is not None:
            stop_pid(prom)
        if traffic is not None:
            traffic.stop(10)
        for s in sidecars.values():
            s.stop()
        seat.stop()
        left = [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert left == [], f"sim processes left behind: {left}"
        if prom is not None:
            assert not psutil.pid_exists(prom.pid) or psutil.Process(prom.pid).status() == psutil.STATUS_ZOMBIE, \
                "Prometheus left running"


def test_prometheus_listens_on_loopback_only(rig: Rig) -> None:
    addrs = {c.laddr.ip for c in psutil.Process(rig.prom.pid).net_connections(kind="inet")
             if c.status == psutil.CONN_LISTEN}
    assert addrs == {"127.0.0.1"}, addrs


def test_the_warning_then_the_hang_alert_fire_during_an_injected_slow_then_stall(rig: Rig) -> None:
    """GIVEN Prometheus scraping both sidecars and node 0's /metrics, with traffic flowing and no alert firing
    WHEN rank 3's row fetches slow down by 100 ms for 12 s and then stall (the sim's slow-stall fault: the field
    report's shape) THEN node 1's sidecar raises the pre-hang warning (what `watch` shows), SglSeatRowFetchTailRising
    fires before the hang, then SglSeatRowFetchInFlight and SglSeatHangLatched fire for node 1, and the bundle's
    row-fetch history holds the warning before its trigger (what `replay` reports)."""
    wait_for(lambda: len(rig.query('up{job="sgl-seat-watchdog"} == 1')) == 2, 30, "both sidecars scraped")
    wait_for(lambda: rig.query("sum(rate(sglang:generation_tokens_total[5s])) > 0"), 30, "tokens flowing")
    quiet = ("SglSeatHangLatched", "SglSeatRowFetchInFlight", "SglSeatRowFetchTailRising", "SglSeatSidecarDown")
    assert [a["labels"]["alertname"] for a in rig.alerts() if a["labels"]["alertname"] in quiet] == []
    assert rig.sidecars[1].warning is None
    # The warning compares with fetches older than its recent window: let the traffic build that baseline first.
    time.sleep(max(0.0, rig.traffic_at + WarningRule().recent_s + 5.0 - time.time()))
    t0 = rig.seat.inject("slow-stall:rank=3,ms=100,slow_s=12", 3)
    warned = wait_for(lambda: rig.sidecars[1].snapshot()["warning"], 12, "no pre-hang warning during the slow phase")
    assert warned["rank"] == 3 and warned["node"] == 1, warned
    tail = wait_for(lambda: rig.firing("SglSeatRowFetchTailRising"), 30, "no tail-rising alert")
    stall = wait_for(lambda: rig.firing("SglSeatRowFetchInFlight"), 40, "no in-flight alert")
    # The capture latches every sidecar it reaches, node 1's (whose rank stalled) among them; Prometheus sees each
    # latch at that sidecar's next scrape, so node 0's alert can be the first one firing.
    hang = wait_for(lambda: [a for a in rig.firing("SglSeatHangLatched") if a["labels"]["node"] == "1"], 30,
                    "no hang alert for node 1")
    assert time.time() - t0 < 60.0
    assert any(a["labels"]["node"] == "1" for a in tail)
    assert any(a["labels"]["node"] == "1" for a in stall)
    assert all(a["annotations"]["runbook"] == "runbooks/watchdog-fired.md" for a in hang)
    active = {a["labels"]["alertname"]: a["activeAt"] for a in rig.alerts() if a["labels"].get("node") == "1"}
    assert active["SglSeatRowFetchTailRising"] < active["SglSeatHangLatched"], active  # RFC 3339, one zone
    # the alert fires at the latch, as the capture starts; the bundle it speaks of follows
    wait_for(lambda: any(s.bundles for s in rig.sidecars.values()), 60, "no bundle")
    wait_for(lambda: rig.query('sum(increase(sgl_seat_watchdog_captures_total{result="ok"}[1m])) > 0'), 10,
             "the capture not counted")
    (doc,) = [d for s in rig.sidecars.values() for d in s.bundles]
    b = read_bundle(Path(doc["path"]))
    w = first_warning_before(b)
    assert b.manifest.verdict is not None and w is not None and w.rank == 3
    assert w.t < b.manifest.verdict.t, (w.t, b.manifest.verdict.t)


def test_the_dashboards_queries_return_data(rig: Rig) -> None:
    """Every panel query of the dashboard, with Grafana's variables filled in, returns at least one series from
    what this seat exports (run after the stall, so captures, the latch and a fetching rank exist)."""
    import json

    fill = {"$__rate_interval": "10s", "$__range": "5m", "$job": "sgl-seat-watchdog", "$gather": ".*"}
    empty = []
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        for t in p["targets"]:
            e = t["expr"]
            for k, v in fill.items():
                e = e.replace(k, v)
            if not rig.query(e):
                empty.append((p["title"], e))
    assert empty == [], empty
    states = {r["metric"]["rank"]: float(r["value"][1]) for r in rig.query("sgl_seat_watchdog_rank_state")}
    assert set(states) == {"0", "1", "2", "3"} and states["3"] == 3.0  # rank 3 fetching (the stall)
