"""A sidecar's own Prometheus metrics (samples, errors, captures, detections, row-fetch latency), on 127.0.0.1.

The row-fetch histogram is labelled by gather-size bucket (:func:`sgl_seat.core.stats.gather_bucket_label`, the
report's buckets too), so a latency that grows with the gather size shows as one exploding bucket.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from sgl_seat.core.records import ProbeRecord
from sgl_seat.core.stats import gather_bucket_label

log = logging.getLogger("sgl_seat.watchdog")

class Exporter:
    """The sidecar's own Prometheus metrics, on 127.0.0.1 only."""

    def __init__(self, node: int, port: int | None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        lab = {"node": str(node)}
        self.samples = Counter("sgl_seat_watchdog_samples", "Stack samples taken", ["node"],
                               registry=self.registry).labels(**lab)
        self.errors = Counter("sgl_seat_watchdog_sampler_errors", "py-spy calls that failed or timed out",
                              ["node"], registry=self.registry).labels(**lab)
        self.captures = Counter("sgl_seat_watchdog_captures", "Captures this sidecar took part in, by result",
                                ["node", "result"], registry=self.registry)
        self.fired = Counter("sgl_seat_watchdog_detections", "Detector verdicts (edges, not ticks), by kind",
                             ["node", "kind"], registry=self.registry)
        self.rowfetch = Histogram(
            "sgl_seat_watchdog_rowfetch_seconds", "Row-fetch duration by gather-size bucket", ["node", "gather"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 3.0, 10.0),
            registry=self.registry)
        self.inflight = Gauge("sgl_seat_watchdog_rowfetch_inflight_age_seconds",
                              "Age of the oldest row fetch in flight (0: none)", ["node"],
                              registry=self.registry).labels(**lab)
        self.sampler_up = Gauge("sgl_seat_watchdog_sampler_up", "1 if py-spy sampling works, 0 if missing or denied",
                                ["node"], registry=self.registry).labels(**lab)
        self.node = str(node)
        self.port: int | None = None
        self._server: Any = None
        if port is not None:
            try:
                from prometheus_client import start_http_server

                res = start_http_server(port, addr="127.0.0.1", registry=self.registry)
                self._server = res[0] if isinstance(res, tuple) else None
                self.port = self._server.server_port if self._server is not None else port
            except OSError as exc:
                log.warning("node %d sidecar: metrics exporter not started on 127.0.0.1:%s (%s)", node, port, exc)

    def observe_fetch(self, rec: ProbeRecord) -> None:
        if rec.end is not None:
            bucket = gather_bucket_label(rec.gather_size)
            self.rowfetch.labels(node=self.node, gather=bucket).observe(rec.end - rec.start)

    def close(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.shutdown()
                self._server.server_close()
