"""Sidecar configuration: thresholds asset = code defaults, config JSON round trip, rank 0's /metrics URL,
exporter ports inside the seat's port block."""

from __future__ import annotations

from pathlib import Path

import yaml

from sgl_seat.plan import Placeholder, build_plan
from sgl_seat.sim.front import ports as sim_ports
from sgl_seat.spec import WatchdogSpec, load_spec
from sgl_seat.watchdog.config import SidecarConfig, metrics_port_for, rank0_metrics_url, sidecar_name

ASSET = Path(__file__).resolve().parents[2] / "watchdog" / "thresholds.yaml"


def test_thresholds_asset_matches_the_spec_defaults() -> None:
    doc = yaml.safe_load(ASSET.read_text())
    assert WatchdogSpec.model_validate(doc["watchdog"]) == WatchdogSpec()
    assert set(doc["watchdog"]) == set(WatchdogSpec.model_fields)


def test_config_round_trips_through_json() -> None:
    cfg = SidecarConfig(seat="s", node=1, nnodes=2, thresholds=WatchdogSpec().model_dump(), bundle_dir="/b",
                        rank_nodes={0: 0, 3: 1}, metrics_url="http://127.0.0.1:1/metrics", root_pid=42,
                        plan={"seat": "s"})
    back = SidecarConfig.from_json(cfg.to_json())
    assert back == cfg and back.watchdog == WatchdogSpec()
    assert sidecar_name("local-sim", 1) == "sgl-seat-local-sim-watchdog1"


def test_rank0_metrics_url() -> None:
    sim = build_plan(load_spec("local-sim")).fill({Placeholder.NODE0_ADDR: "127.0.0.1"}).to_json()
    assert rank0_metrics_url(sim, "10.9.9.9") == "http://127.0.0.1:31000/metrics"  # --host 127.0.0.1 wins
    large = build_plan(load_spec("large")).fill({Placeholder.NODE0_ADDR: "10.1.1.1"}).to_json()
    assert rank0_metrics_url(large, None) == "http://10.1.1.1:30000/metrics"  # 0.0.0.0: node 0's address
    assert rank0_metrics_url(large, "10.0.0.7") == "http://10.0.0.7:30000/metrics"
    unfilled = build_plan(load_spec("large")).to_json()
    assert rank0_metrics_url(unfilled, None) is None


def test_exporter_ports_avoid_the_seats_own_ports() -> None:
    http = 31000
    nodes = [sim_ports.node_port(http, r) for r in range(3)]  # co-located sim nodes 0-2 and their admin routes
    used = {http, http + 5, *nodes, *(sim_ports.admin_port(p) for p in nodes)}  # + dist-init (the profiles' choice)
    ports = [metrics_port_for(http, r) for r in range(5)]
    assert len(set(ports)) == 5 and not used & set(ports)
    assert metrics_port_for(http, 7) == 0  # beyond: a free port from the OS
