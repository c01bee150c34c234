"""Healing by policy (issue 26) on a real local seat: `sgl-seat up --draft on --on-hang rollback-draft` of a two-node
sim seat on a local Ray cluster, the seat's supervisor a detached Ray actor started by `up`.

1. A row-fetch stall on rank 3 during decode (only long requests running, so the stalled step gathers what a
   draft-on verify step gathers): a bundle; the supervisor rolls the draft back with no operator (the engines are
   stopped and started again from a plan with the draft off); the seat serves again; `status --json` shows the
   remediation with its timings; the bundle's manifest records it; a request in flight at the hang (client timeout
   600 s) ends in an error long before that, not a hang.
2. Three more stalls in a row (the draft is off now, so rollback-draft falls back to restart): the second and third
   restart the seat, the fourth finds the budget of 3 spent: REMEDIATION-EXHAUSTED, the engines stay down, and
   the alert SglSeatRemediationExhausted fires in a real Prometheus (Debian's ``prometheus``) scraping the seat's
   sidecars with the shipped rules.

`down` removes the supervisor first and leaves no process behind. Ports 27200-27216 (the seat, its sidecars'
exporters at +15/+16), Prometheus 27240. Processes are checked by pid and process group, never by name.
"""

from __future__ import annotations

import json
import shutil
import subprocess
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
    CLI_S,
    LongRequest,
    alive,
    descendants,
    engine_pgids,
    in_groups,
    local_sim_spec,
    run_cli,
    seat_processes,
    status_json,
    stop_pid,
    wait_until,
)

from sgl_seat.sim.front import ports as sim_ports
from sgl_seat.watchdog.config import metrics_port_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "sgl_seat" / "watchdog" / "prometheus" / "alerts.yml"
SEAT = "rm-seat"
HTTP = 27200
PROM_PORT = 27240
PROMETHEUS = shutil.which("prometheus")
#: Far above any remediation here: a request that waits this long has hung.
IN_FLIGHT_TIMEOUT_S = 600.0


@dataclass
class Seat:
    home: Path
    url: str
    spec: Path
    started: list[Any] = field(default_factory=list)
    pgids: set[int] = field(default_factory=set)

    def status(self) -> dict[str, Any]:
        st = status_json(SEAT, self.home)
        self.pgids |= set(engine_pgids(st))
        return st

    def history(self) -> list[dict[str, Any]]:
        hist: list[dict[str, Any]] = self.status()["remediation"]["history"]
        return hist

    def stall_rank3(self) -> float:
        admin = f"http://127.0.0.1:{sim_ports.admin_port(sim_ports.node_port(HTTP, 1))}/sim/faults"
        r = httpx.post(admin, json={"fault": "rowfetch-stall:rank=3"}, timeout=10, trust_env=False)
        assert r.status_code == 200, r.text
        return time.time()

    def bundles(self) -> list[Path]:
        d = self.home / "bundles" / SEAT
        return sorted(p for p in d.glob("*") if p.is_dir() and not p.name.startswith(".")) if d.is_dir() else []


def _complete(url: str) -> bool:
    body = {"text": "are you back?", "sampling_params": {"max_new_tokens": 4}}
    try:
        return httpx.post(f"{url}/generate", json=body, timeout=30, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _running(url: str) -> float:
    try:
        text = httpx.get(f"{url}/metrics", timeout=5, trust_env=False).text
    except httpx.HTTPError:
        return 0.0
    vals = [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("sglang:num_running_reqs")]
    return max(vals, default=0.0)


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seat]:
    tmp = tmp_path_factory.mktemp("rmseat")
    home = tmp / "home"
    # the budget of the acceptance (3 in an hour); no cooldown, so four stalls in a row meet the budget, not it
    spec = local_sim_spec(tmp, SEAT, HTTP, draft=True,
                          sections={"watchdog": {"remediation": {"max": 3, "window_s": 3600, "cooldown_s": 0}}})
    up = run_cli(["up", "--seat", str(spec), "--draft", "on", "--on-hang", "rollback-draft", "--timeout", "300"],
                 home, timeout=360)
    s = Seat(home=home, url=f"http://127.0.0.1:{HTTP}", spec=spec)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "ok supervisor" in up.stdout, up.stdout
        cluster = json.loads((home / "clusters" / f"{SEAT}.json").read_text())
        s.started = descendants(cluster["pid"]) + seat_processes(SEAT)  # engines and their hosts: outside Ray
        s.status()
        yield s
    finally:
        down = run_cli(["down", SEAT], home, timeout=240)
        print(down.stdout, down.stderr)
        assert down.returncode == 0, down.stdout + down.stderr
        assert alive(s.started) == [], "Ray, agent, supervisor, sidecar or engine processes left behind"
        assert in_groups(sorted(s.pgids)) == []


def test_a_stall_on_rank3_during_decode_is_rolled_back_and_the_seat_serves_again_with_the_draft_off(
        seat: Seat) -> None:
    """GIVEN the READY seat (draft on, on_hang rollback-draft) with three long requests decoding WHEN rank 3's
    row fetch stalls THEN a bundle; the supervisor restarts the engines with the draft off; the seat serves;
    status shows the remediation with its timings; the bundle records it; the in-flight requests end in an error
    long before their 600 s timeout."""
    st = seat.status()
    assert st["state"] == "READY" and st["draft"] is True, st
    assert st["remediation"]["policy"]["on_hang"] == "rollback-draft" and st["remediation"]["history"] == []
    long = [LongRequest(seat.url, timeout_s=IN_FLIGHT_TIMEOUT_S) for _ in range(3)]
    for r in long:
        r.start()
    assert wait_until(lambda: _running(seat.url) >= 3, 60), "the long requests are not all running"
    time.sleep(1.0)  # past their prefill: every step now is a decode/verify step
    t_stall = seat.stall_rank3()

    def served() -> bool:
        hist = seat.history()
        return bool(hist) and hist[-1]["outcome"] != "pending"

    assert wait_until(served, 180, interval=2.0), f"no remediation ended within 180 s: {seat.history()}"
    t_seen = time.time()
    st = seat.status()
    (r,) = st["remediation"]["history"]
    print(f"remediation: {json.dumps(r)}")
    print(f"hang -> serving again {r['serving_again'] - t_stall:.1f} s (stall at {t_stall:.1f})")
    assert r["action"] == "rollback-draft" and r["outcome"] == "serving", r
    assert r["draft_before"] is True and r["draft_after"] is False, r
    assert t_stall < r["started"] <= r["engines_stopped"] <= r["serving_again"] <= t_seen, r
    assert "rank 3" in r["verdict"] and "row-fetch stall" in r["verdict"], r
    assert st["state"] == "READY" and st["draft"] is False, st
    # the engines now run the draft-off plan: no speculative flag on either node's command line
    for n in st["nodes"]:
        argv = psutil.Process(n["engine_pid"]).cmdline()
        assert "--speculative-algorithm" not in argv, argv
    assert _complete(seat.url)
    (bundle,) = seat.bundles()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["verdict"]["kind"] == "row-fetch stall" and manifest["verdict"]["rank"] == 3
    assert manifest["remediation"] == {"action": "rollback-draft", "started": r["started"],
                                       "serving_again": r["serving_again"]}, manifest.get("remediation")
    verify = run_cli(["bundle", "verify", str(bundle)], seat.home, timeout=CLI_S)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    for lr in long:
        lr.join(30)
        print(f"in-flight request: {lr.outcome} after {(lr.ended or 0) - t_stall:.1f} s")
        assert lr.ended is not None and lr.outcome is not None, "an in-flight request still hangs"
        assert not lr.outcome.startswith("HTTP 200"), lr.outcome
        assert lr.ended - t_stall < r["serving_again"] - t_stall + 5.0 < IN_FLIGHT_TIMEOUT_S / 4
    text = run_cli(["status", SEAT], seat.home, timeout=CLI_S).stdout
    assert "rollback-draft" in text, text


def _prometheus(tmp: Path) -> subprocess.Popen[bytes]:
    targets = [f"127.0.0.1:{metrics_port_for(HTTP, n)}" for n in (0, 1)]
    cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(ALERTS)],
           "scrape_configs": [{"job_name": "sgl-seat-sidecar", "static_configs": [{"targets": targets}]}]}
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    log = (tmp / "prometheus.log").open("wb")
    return subprocess.Popen(
        [str(PROMETHEUS), f"--config.file={path}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{PROM_PORT}"], stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)


def _firing(name: str) -> list[dict[str, Any]]:
    try:
        r = httpx.get(f"http://127.0.0.1:{PROM_PORT}/api/v1/alerts", timeout=5, trust_env=False)
    except httpx.HTTPError:
        return []
    return [a for a in r.json()["data"]["alerts"] if a["labels"]["alertname"] == name and a["state"] == "firing"]


@pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed (apt-get install -y prometheus)")
@pytest.mark.slow  # full tier only (README, "The tests")
def test_four_stalls_in_a_row_exhaust_a_budget_of_3_and_the_alert_fires(seat: Seat, tmp_path: Path) -> None:
    """GIVEN the seat after its rollback (1 of its 3 remediations used) WHEN rank 3 stalls three more times THEN
    the second and third stalls restart it (the draft is off: rollback-draft falls back to restart), the fourth
    finds the budget spent: REMEDIATION-EXHAUSTED, no engine left, and SglSeatRemediationExhausted fires."""
    prom = _prometheus(tmp_path)
    try:
        for n in (2, 3):
            assert wait_until(lambda: _complete(seat.url), 60), f"not serving before stall {n}"
            seat.stall_rank3()
            def ended(n: int = n) -> bool:
                hist = seat.history()
                return len(hist) == n and hist[-1]["outcome"] != "pending"

            assert wait_until(ended, 180, interval=2.0), f"stall {n}: {seat.history()}"
            r = seat.history()[-1]
            print(f"stall {n}: {r['action']} {r['outcome']} in {r['serving_again_s']} s: {r['reason']}")
            assert r["action"] == "restart" and r["outcome"] == "serving", r
            assert "falls back to restart" in r["reason"], r
        assert wait_until(lambda: _complete(seat.url), 60), "not serving before stall 4"
        assert _firing("SglSeatRemediationExhausted") == []
        seat.stall_rank3()
        assert wait_until(lambda: seat.status()["state"] == "REMEDIATION-EXHAUSTED", 120, interval=2.0), \
            seat.status()
        st = seat.status()
        last = st["remediation"]["history"][-1]
        print(f"stall 4: {last['action']}: {last['reason']}")
        assert last["action"] == "refused-budget" and st["remediation"]["left"] == 0, st["remediation"]
        assert st["reason"] == last["reason"] or "budget" in (st["reason"] or ""), st
        assert wait_until(lambda: bool(_firing("SglSeatRemediationExhausted")), 90, interval=2.0), \
            "the exhausted alert did not fire"
        text = httpx.get(f"http://127.0.0.1:{metrics_port_for(HTTP, 0)}/metrics", timeout=5, trust_env=False).text
        counts = {ln.split("{", 1)[1].split("}", 1)[0]: float(ln.split()[-1]) for ln in text.splitlines()
                  if ln.startswith("sgl_seat_remediations_total{")}
        print("node 0's remediation counters:", {k: v for k, v in counts.items() if v})
        assert sum(v for k, v in counts.items() if 'action="restart"' in k and 'outcome="serving"' in k) == 2
        assert sum(v for k, v in counts.items() if 'action="rollback-draft"' in k and 'outcome="serving"' in k) == 1
        assert not _complete(seat.url), "an exhausted seat still serves"
        assert all(not n.get("alive") for n in st["nodes"]), st["nodes"]
    finally:
        stop_pid(prom)
        assert not psutil.pid_exists(prom.pid), "Prometheus left running"
