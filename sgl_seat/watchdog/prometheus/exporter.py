"""A sidecar's own Prometheus metrics (samples, errors, captures, detections, row-fetch latency), on 127.0.0.1 unless
the spec's ``watchdog.exporter_bind`` says otherwise (the node's cluster address, for a Prometheus on another host).

The row-fetch histogram is labelled by gather-size bucket (:func:`sgl_seat.core.stats.gather_bucket_label`, the
report's buckets too), so a latency that grows with the gather size shows as one exploding bucket. The latch, the
pre-hang warning (:mod:`sgl_seat.core.warning`) and each rank's state are gauges, so that the alert rules and the
dashboard shipped in ``watchdog/prometheus/`` and ``watchdog/grafana/`` read what the sidecar concluded instead of
re-deriving it in PromQL. What the seat's ``watchdog.on_hang`` policy did is counted here too
(:class:`RemediationMetrics`: the supervisor calls :meth:`Exporter.remediation_done`). The tests hold those assets to
the names this registry exports.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sgl_seat.core.records import ProbeRecord, VerdictKind
from sgl_seat.core.remediation import Action, Outcome
from sgl_seat.core.stats import gather_bucket_label
from sgl_seat.core.warning import PreHangWarning, TailReading
from sgl_seat.forensics.format.bundle import FAILURE_REASONS
from sgl_seat.watchdog.rankview import RankView

log = logging.getLogger("sgl_seat.watchdog")

#: ``sgl_seat_watchdog_rank_state``'s values (the dashboard maps them back to these names): `watch`'s states.
RANK_STATES: dict[str, int] = {"unknown": 0, "running": 1, "collective": 2, "fetching": 3, "gpu fetch": 4,
                               "exited": 5}

class RankStates:
    """``sgl_seat_watchdog_rank_state{node, rank}``, computed when Prometheus scrapes (not every detection: the
    per-rank view reads every stack and probe record, which costs more than the detectors' own pass).

    ``source`` returns the node's :class:`RankView` list; the sidecar sets it. A view that fails is logged and
    the family served empty: a scrape must not fail, or the sidecar would read as down.
    """

    NAME = "sgl_seat_watchdog_rank_state"
    HELP = "Each rank's state as `watch` shows it: " + ", ".join(f"{v} {k}" for k, v in RANK_STATES.items())

    def __init__(self, node: int, source: Callable[[], Iterable[RankView]] | None = None) -> None:
        self.node = str(node)
        self.source = source

    def _family(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        return GaugeMetricFamily(self.NAME, self.HELP, labels=["node", "rank"])

    def describe(self) -> Iterator[Any]:
        yield self._family()

    def collect(self) -> Iterator[Any]:
        fam = self._family()
        if self.source is not None:
            try:
                for v in self.source():
                    fam.add_metric([self.node, str(v.rank)], RANK_STATES.get(v.state, 0))
            except Exception as exc:  # a scrape must not fail on one family
                log.exception("node %s: rank states for the exporter failed: %s", self.node, exc)
        yield fam


class RemediationMetrics:
    """``sgl_seat_remediations_total{node, action, outcome}`` and ``sgl_seat_remediation_exhausted{node}``: what the
    seat's ``watchdog.on_hang`` policy did (:mod:`sgl_seat.core.remediation`), for the alert and the dashboard.

    Registered in a sidecar's registry (:class:`Exporter`, node 0's is where the supervisor counts) or in a
    registry of the supervisor's own. Every (action, outcome) pair a decision can end in starts at 0, so that the
    first remediation is an increase to Prometheus and not a new series.
    """

    #: The (action, outcome) pairs counted: a remediation once it served again or failed (not while pending, so
    #: that each is counted once); a decision of none or a refusal as not acted on.
    PAIRS: tuple[tuple[str, str], ...] = tuple(
        (a.value, o.value) for a in Action
        for o in ((Outcome.SERVING, Outcome.FAILED) if a.remediates() else (Outcome.NOT_ACTED,)))

    def __init__(self, registry: Any, node: int | str) -> None:
        from prometheus_client import Counter, Gauge

        self.node = str(node)
        self.counted = Counter("sgl_seat_remediations", "Remediations under watchdog.on_hang (and refusals), by "
                               "action and outcome", ["node", "action", "outcome"], registry=registry)
        self.exhausted = Gauge("sgl_seat_remediation_exhausted", "1 while the seat is REMEDIATION-EXHAUSTED (its "
                               "on_hang budget or cooldown refused a remediation: an operator's turn)", ["node"],
                               registry=registry).labels(node=self.node)
        for action, outcome in self.PAIRS:
            self.counted.labels(node=self.node, action=action, outcome=outcome)

    def count(self, action: Action | str, outcome: Outcome | str) -> None:
        """One remediation (or refusal) with its outcome. Count a remediation once, when its outcome is known
        (serving or failed); a refusal when it is decided. A refusal also sets the exhausted gauge."""
        a = Action(action)
        o = Outcome(outcome)
        if (a.value, o.value) not in self.PAIRS:
            raise ValueError(f"a {a.value} does not end {o.value}")
        self.counted.labels(node=self.node, action=a.value, outcome=o.value).inc()
        if a.refused():
            self.exhausted.set(1)

    def set_exhausted(self, exhausted: bool) -> None:
        """The seat is (1) or is no longer (0) REMEDIATION-EXHAUSTED."""
        self.exhausted.set(1 if exhausted else 0)


#: Where the exporter listens unless the spec says otherwise.
LOOPBACK = "127.0.0.1"


class Exporter:
    """The sidecar's own Prometheus metrics, served on ``addr`` (loopback unless the spec binds the node's cluster
    address: :func:`sgl_seat.watchdog.config.exporter_address`)."""

    def __init__(self, node: int, port: int | None, addr: str = LOOPBACK, *, bind_wait_s: float = 0.0) -> None:
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
        # Every label value known in advance starts at 0: a series that first appears at 1 reads as no increase
        # to Prometheus (rate/increase need a sample before the first capture), and an alert on it would never fire.
        # A capture that the disk did not take (full, read-only, failing): the bundle was left incomplete or not
        # written at all. The gauge says whether the last capture failed, so an alert clears once one succeeds.
        self.capture_failures = Counter("sgl_seat_watchdog_capture_failures",
                                        "Captures whose bundle could not be written whole, by reason "
                                        "(disk-full, read-only, permission, io, other)", ["node", "reason"],
                                        registry=self.registry)
        self.last_capture_failed = Gauge("sgl_seat_watchdog_last_capture_failed",
                                         "1 if this sidecar's last capture left no complete bundle", ["node"],
                                         registry=self.registry).labels(**lab)
        for result in ("ok", "error"):
            self.captures.labels(node=str(node), result=result)
        for reason in FAILURE_REASONS:
            self.capture_failures.labels(node=str(node), reason=reason)
        for kind in VerdictKind:
            self.fired.labels(node=str(node), kind=kind.value)
        self.rowfetch = Histogram(
            "sgl_seat_watchdog_rowfetch_seconds", "Row-fetch duration by gather-size bucket", ["node", "gather"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 3.0, 10.0),
            registry=self.registry)
        self.inflight = Gauge("sgl_seat_watchdog_rowfetch_inflight_age_seconds",
                              "Age of the oldest row fetch in flight (0: none)", ["node"],
                              registry=self.registry).labels(**lab)
        self.latched = Gauge("sgl_seat_watchdog_latched", "1 while this sidecar is latched on a captured hang",
                             ["node"], registry=self.registry).labels(**lab)
        self.warning = Gauge("sgl_seat_watchdog_prehang_warning",
                             "1 while the pre-hang warning holds (row-fetch tail growing at the largest gathers)",
                             ["node"], registry=self.registry).labels(**lab)
        self.tail_ratio = Gauge("sgl_seat_watchdog_rowfetch_tail_ratio",
                                "Largest recent/baseline row-fetch p99 ratio at the largest gather buckets (0: none)",
                                ["node"], registry=self.registry).labels(**lab)
        self.rank_states = RankStates(node)
        self.registry.register(self.rank_states)
        self.remediation = RemediationMetrics(self.registry, node)
        self.sampler_up = Gauge("sgl_seat_watchdog_sampler_up", "1 if py-spy sampling works, 0 if missing or denied",
                                ["node"], registry=self.registry).labels(**lab)
        self.keeper_watching = Gauge("sgl_seat_watchdog_keeper_watching",
                                     "1 while this node's keeper watches in its sidecar's place (its Ray raylet gone)",
                                     ["node"], registry=self.registry).labels(**lab)
        self.node = str(node)
        self.port: int | None = None
        #: The address it listens on (None while not serving).
        self.addr: str | None = None
        self._server: Any = None
        if port is not None:
            from prometheus_client import start_http_server

            # ``bind_wait_s``: a port another process is about to free (the keeper takes over a dying sidecar's).
            deadline = time.monotonic() + bind_wait_s
            while True:
                try:
                    res = start_http_server(port, addr=addr, registry=self.registry)
                    self._server = res[0] if isinstance(res, tuple) else None
                    self.port = self._server.server_port if self._server is not None else port
                    self.addr = addr
                    break
                except OSError as exc:
                    if time.monotonic() >= deadline:
                        log.warning("node %d sidecar: metrics exporter not started on %s:%s (%s)", node, addr, port,
                                    exc)
                        break
                    time.sleep(0.2)

    def capture_done(self, reason: str | None) -> None:
        """One capture's outcome: None when its bundle was written, else why not (a FAILURE_REASONS word)."""
        ok = reason is None
        self.captures.labels(node=self.node, result="ok" if ok else "error").inc()
        if reason is not None:
            self.capture_failures.labels(node=self.node, reason=reason).inc()
        self.last_capture_failed.set(0 if ok else 1)

    def remediation_done(self, action: Action | str, outcome: Outcome | str) -> None:
        """Count one remediation under ``watchdog.on_hang`` (:meth:`RemediationMetrics.count`)."""
        self.remediation.count(action, outcome)

    def observe_fetch(self, rec: ProbeRecord) -> None:
        if rec.end is not None:
            bucket = gather_bucket_label(rec.gather_size)
            self.rowfetch.labels(node=self.node, gather=bucket).observe(rec.end - rec.start)

    def observe_state(self, *, latched: bool, warning: PreHangWarning | None, readings: Iterable[TailReading]) -> None:
        """What the sidecar concluded at its last detection: the latch, the warning, the tail."""
        self.latched.set(1 if latched else 0)
        self.warning.set(1 if warning is not None else 0)
        ratios = [r.ratio for r in readings if r.ratio == r.ratio]  # NaN: no baseline
        self.tail_ratio.set(max(ratios, default=0.0))

    def close(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.shutdown()
                self._server.server_close()
