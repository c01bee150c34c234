"""Metrics for a remote Prometheus (issue 24, item 7): the spec's ``watchdog.exporter_bind`` decides where each
node's sidecar exporter listens, and `sgl-seat prometheus-config` lists every node's sidecar as a scrape target.

Only 127.0.0.1 is ever bound here: the cluster mode is checked by the address it resolves to from a given node
address (198.18.0.0/15, the test range), not by binding it. Also `status` carrying the watchdog's failed captures.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import ValidationError

from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord, save_record
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.sidecars import ALERT_RULES, prometheus_config_of
from sgl_seat.launch.status import capture_failure_line, capture_failures_of, latched_failure, status_json
from sgl_seat.spec import WatchdogSpec, builtin_seats_dir, load_spec
from sgl_seat.watchdog.config import SidecarConfig, exporter_address, metrics_port_for, scrape_host
from sgl_seat.watchdog.prometheus.exporter import Exporter
from sgl_seat.watchdog.prometheus.scrape_config import WATCHDOG_JOB, scrape_config
from sgl_seat.watchdog.sampler import Sampler
from sgl_seat.watchdog.sidecar import Sidecar
from tests.cli_runner import run_cli

NODE0, NODE1 = "198.18.0.1", "198.18.0.2"
PROMTOOL = shutil.which("promtool")


def test_the_bind_resolves_from_the_spec_and_the_nodes_address() -> None:
    """loopback (the default) is 127.0.0.1 whatever the node; cluster is the node's own address; an explicit
    address is bound as given and a wildcard one is scraped at the node's address."""
    assert WatchdogSpec().exporter_bind == "loopback"
    assert exporter_address("loopback", NODE1) == "127.0.0.1"
    assert exporter_address("cluster", NODE1) == NODE1
    assert exporter_address("cluster", None) == "127.0.0.1"  # address unknown: served locally, logged
    assert exporter_address("0.0.0.0", NODE1) == "0.0.0.0" and scrape_host("0.0.0.0", NODE1) == NODE1
    assert scrape_host("cluster", NODE1) == NODE1 and scrape_host("loopback", NODE1) == "127.0.0.1"
    assert scrape_host("::", "fd00::2") == "fd00::2"
    for ok in ("cluster", "loopback", "10.0.0.7", "::"):
        assert WatchdogSpec(exporter_bind=ok).exporter_bind == ok
    for bad in ("everywhere", "node1.example", ""):
        with pytest.raises(ValidationError, match="exporter_bind"):
            WatchdogSpec(exporter_bind=bad)


def test_a_malformed_exporter_bind_is_one_clear_spec_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    text = (builtin_seats_dir() / "local-sim.yaml").read_text()
    doc = yaml.safe_load(text)
    doc.setdefault("watchdog", {})["exporter_bind"] = "public"
    (tmp_path / "seats").mkdir()
    spec = tmp_path / "seats" / "bad.yaml"
    spec.write_text(yaml.safe_dump(doc))
    (tmp_path / "models").symlink_to(builtin_seats_dir().parent / "models")
    assert run_cli(["plan", "--seat", str(spec)], monkeypatch) == 2
    err = capsys.readouterr().err
    assert "watchdog.exporter_bind" in err and "'public' is not 'loopback', 'cluster' or an IP address" in err


def test_the_exporter_serves_on_the_address_it_is_given(tmp_path: Path) -> None:
    """GIVEN a sidecar configured with exporter_addr 127.0.0.1 and a free port THEN its exporter listens there,
    serves its metrics, and its snapshot says where; the default is loopback too."""
    cfg = SidecarConfig(seat="s", node=1, nnodes=2, thresholds={}, bundle_dir=str(tmp_path), metrics_port=0,
                        exporter_addr="127.0.0.1")
    assert SidecarConfig.from_json(cfg.to_json()).exporter_addr == "127.0.0.1"
    sc = Sidecar(cfg, sampler=Sampler(node=1, discover=lambda: [], pyspy=False))
    try:
        assert sc.exporter.addr == "127.0.0.1" and sc.exporter.port
        assert sc.exporter._server.server_address[0] == "127.0.0.1"
        r = httpx.get(f"http://127.0.0.1:{sc.exporter.port}/metrics", timeout=5.0, trust_env=False)
        assert r.status_code == 200 and 'sgl_seat_watchdog_capture_failures_total{node="1",reason="disk-full"} 0.0' \
            in r.text
        assert sc.snapshot()["exporter"] == {"addr": "127.0.0.1", "port": sc.exporter.port}
    finally:
        sc.exporter.close()
    plain = Exporter(node=0, port=None)
    assert plain.addr is None and plain.port is None
    assert SidecarConfig(seat="s", node=0, nnodes=1, thresholds={}, bundle_dir="/b").exporter_addr == "127.0.0.1"


def test_the_scrape_config_lists_every_node() -> None:
    """GIVEN a two-node seat bound on its cluster addresses THEN one watchdog target per node at its address and
    http_port + 15 + r, the sglang job at the endpoint, and no notes; loopback says why it will not reach."""
    cfg = scrape_config("s", 31210, [(1, NODE1), (0, NODE0)], "cluster", endpoint=f"http://{NODE0}:31210")
    assert cfg.targets == ((0, f"{NODE0}:31225"), (1, f"{NODE1}:31226")) and cfg.notes == ()
    jobs = {j["job_name"]: j for j in cfg.doc["scrape_configs"]}
    assert jobs[WATCHDOG_JOB]["static_configs"] == [{"targets": [f"{NODE0}:31225", f"{NODE1}:31226"],
                                                    "labels": {"seat": "s"}}]
    assert jobs["sglang"]["static_configs"][0]["targets"] == [f"{NODE0}:31210"]
    back = yaml.safe_load(cfg.render())
    assert back == cfg.doc and cfg.render().startswith("# Prometheus scrape config for sgl-seat seat s")
    lo = scrape_config("s", 30000, [(0, NODE0), (1, NODE1)], "loopback")
    assert [t for _, t in lo.targets] == ["127.0.0.1:30015", "127.0.0.1:30016"]
    assert any("exporter_bind is loopback" in n for n in lo.notes)
    wide = scrape_config("s", 30000, [(r, f"198.18.0.{r + 1}") for r in range(6)], "0.0.0.0")
    assert [n for n, _ in wide.targets] == [0, 1, 2, 3, 4]  # node 5 takes a free port: left out, and said so
    assert wide.targets[4] == (4, "198.18.0.5:30019") and any("node 5" in n for n in wide.notes)
    gap = scrape_config("s", 30000, [(0, NODE0), (1, None)], "cluster")
    assert [n for n, _ in gap.targets] == [0] and any("node 1's address" in n for n in gap.notes)


def _record(tmp_path: Path, bind: str) -> SeatRecord:
    doc = yaml.safe_load((builtin_seats_dir() / "local-sim.yaml").read_text())
    doc.setdefault("watchdog", {})["exporter_bind"] = bind
    (tmp_path / "seats").mkdir(exist_ok=True)
    spec = tmp_path / "seats" / "seat.yaml"
    spec.write_text(yaml.safe_dump(doc))
    if not (tmp_path / "models").exists():
        (tmp_path / "models").symlink_to(builtin_seats_dir().parent / "models")
    return SeatRecord(name="two", state=SeatState.READY, engine="sim", draft=False, cluster_address="x",
                      namespace="ns", pg_name="pg", spec_source=str(spec), spec=load_spec(str(spec)).to_json(), endpoint=f"http://{NODE0}:31210",
                      plan={"http_port": 31210, "nodes": []},
                      nodes=[NodeRecord(node_rank=0, agent="a0", ip=NODE0), NodeRecord(node_rank=1, agent="a1",
                                                                                      ip=NODE1)])


def test_prometheus_config_of_a_recorded_seat_and_its_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN a recorded two-node seat whose spec says exporter_bind: cluster THEN `prometheus-config` names both
    nodes' sidecars at their addresses, loads the shipped alert rules, and --json says the same."""
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path / "home"))
    rec = _record(tmp_path, "cluster")
    cfg = prometheus_config_of(rec)
    assert [t for _, t in cfg.targets] == [f"{NODE0}:{metrics_port_for(31210, 0)}", f"{NODE1}:31226"]
    assert cfg.doc["rule_files"] == [str(ALERT_RULES)] and ALERT_RULES.is_file()
    save_record(rec)
    assert run_cli(["prometheus-config", "two", "--json"], monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["target"] for t in doc["targets"]] == [f"{NODE0}:31225", f"{NODE1}:31226"]
    out = tmp_path / "prom.yml"
    assert run_cli(["prometheus-config", "two", "--out", str(out)], monkeypatch) == 0
    assert yaml.safe_load(out.read_text())["scrape_configs"][0]["static_configs"][0]["targets"] == [
        f"{NODE0}:31225", f"{NODE1}:31226"]
    if PROMTOOL is not None:  # Prometheus' own check of the file (and of the rule file it loads)
        res = subprocess.run([PROMTOOL, "check", "config", str(out)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr


def test_status_carries_the_watchdogs_failed_captures() -> None:
    """GIVEN sidecar snapshots with failed captures THEN status keeps them newest last, names the one that holds
    the latch, and prints what is missing and where the rest lies; --json carries them."""
    fail = {"t": 5.0, "capture_id": "c2", "bundle_id": "b2", "reason": "disk-full", "error": "no space",
            "path": "/h/bundles/s/.incomplete-b2", "missing": ["logs/node0.log", "manifest.json"]}
    snaps = [{"node": 0, "latched": True, "latched_by": "c2", "capture_failures": [
                 {**fail, "t": 1.0, "capture_id": "c1", "bundle_id": "b1"}, fail]},
             {"node": 1, "error": "no watchdog sidecar"}]
    got = capture_failures_of(snaps)
    assert [f["bundle_id"] for f in got] == ["b1", "b2"] and got[-1]["node"] == 0
    assert latched_failure(snaps) == fail and latched_failure([{**snaps[0], "latched": False}]) is None
    line = capture_failure_line(got[-1])
    assert "b2" in line and "disk-full" in line and "logs/node0.log" in line and ".incomplete-b2" in line
    rec = SeatRecord(name="s", state=SeatState.READY, engine="sim", draft=False, cluster_address="x",
                     namespace="n", pg_name="p", capture_failures=got)
    assert status_json(rec)["capture_failures"] == got
    assert SeatRecord.from_dict(rec.to_dict()).capture_failures == got
    old = rec.to_dict()
    del old["capture_failures"]  # a record written before the field existed
    assert SeatRecord.from_dict(old).capture_failures == []
