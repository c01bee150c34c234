"""A Prometheus scrape config for one seat: every node's sidecar exporter, and node 0's SGLang ``/metrics``.

``watchdog/prometheus/scrape-example.yml`` shows the shape with fixed addresses; this module fills it in for a
real seat from what `up` recorded (the filled plan's ``http_port`` and each node's address as Ray reported it),
so a Prometheus on a monitoring host scrapes every node (the spec's ``watchdog.exporter_bind: cluster``). Node r's
exporter listens on ``http_port + 15 + r`` (:func:`~sgl_seat.watchdog.config.metrics_port_for`); a node past the
fixed range takes a free port, which no config written ahead can know: it is left out, and said so in ``notes``.

The job names are the ones the shipped alerts and dashboard read (``sgl-seat-watchdog``, ``sglang``); targets carry
a ``seat`` label only (each sample already has its own ``node`` label from the exporter).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from sgl_seat.watchdog.config import metrics_port_for, scrape_host

__all__ = ["WATCHDOG_JOB", "ScrapeConfig", "scrape_config"]

#: The job the shipped alert rules and dashboard select (``job="sgl-seat-watchdog"``).
WATCHDOG_JOB = "sgl-seat-watchdog"
SGLANG_JOB = "sglang"
#: Schema of :meth:`ScrapeConfig.to_json` (what `prometheus-config --json` prints).
SCHEMA_VERSION = 1


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    """The scrape config as data (``doc`` is Prometheus' own YAML shape) and what an operator should know."""

    seat: str
    doc: dict[str, Any]
    #: One target per node that has a known port: (node rank, "host:port").
    targets: tuple[tuple[int, str], ...]
    notes: tuple[str, ...] = field(default=())

    def render(self) -> str:
        """The YAML for ``prometheus --config.file``, its notes as comments at the top."""
        head = [f"# Prometheus scrape config for sgl-seat seat {self.seat} (`sgl-seat prometheus-config`)."]
        head += [f"# note: {n}" for n in self.notes]
        return "\n".join(head) + "\n" + yaml.safe_dump(self.doc, sort_keys=False)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "seat": self.seat, "config": self.doc,
                "targets": [{"node": n, "target": t} for n, t in self.targets], "notes": list(self.notes)}


def scrape_config(seat: str, http_port: int, nodes: Sequence[tuple[int, str | None]], bind: str, *,
                  endpoint: str | None = None, rule_files: Sequence[str] = ("alerts.yml",),
                  interval_s: float = 15.0) -> ScrapeConfig:
    """The scrape config for ``seat``: ``nodes`` are (node rank, node address or None), ``bind`` the spec's
    ``watchdog.exporter_bind``, ``endpoint`` the seat's HTTP endpoint (node 0's SGLang, for tokens/s)."""
    notes: list[str] = []
    targets: list[tuple[int, str]] = []
    for rank, ip in sorted(nodes):
        port = metrics_port_for(http_port, rank)
        if port == 0:
            notes.append(f"node {rank}'s exporter takes a free port (only nodes 0-4 have fixed ones): "
                         "`sgl-seat watch NAME --once --json` prints its metrics_port")
            continue
        if bind == "cluster" and not ip:
            notes.append(f"node {rank}'s address is not recorded; it is left out")
            continue
        targets.append((rank, _hostport(scrape_host(bind, ip), port)))
    if bind == "loopback":
        notes.append("watchdog.exporter_bind is loopback: each exporter listens on 127.0.0.1 of its own node, so "
                     "this config works only for a Prometheus (or agent) on that node; set "
                     "watchdog.exporter_bind: cluster for a Prometheus on another host")
    interval = f"{interval_s:g}s"
    jobs: list[dict[str, Any]] = [{"job_name": WATCHDOG_JOB, "static_configs": [
        {"targets": [t for _, t in targets], "labels": {"seat": seat}}]}]
    if endpoint:
        u = urlsplit(endpoint)
        if u.hostname and u.port:
            if u.hostname in ("127.0.0.1", "localhost", "::1"):
                notes.append("the seat's HTTP endpoint is on loopback (network.host): the sglang job reaches it "
                             "only from node 0's host")
            jobs.append({"job_name": SGLANG_JOB, "metrics_path": "/metrics", "static_configs": [
                {"targets": [_hostport(u.hostname, u.port)], "labels": {"seat": seat}}]})
    doc: dict[str, Any] = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                           "rule_files": list(rule_files), "scrape_configs": jobs}
    return ScrapeConfig(seat=seat, doc=doc, targets=tuple(targets), notes=tuple(notes))
