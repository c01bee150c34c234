"""The watchdog sidecar: one per node, beside the node agent, started by `up` and stopped by `down`.

:class:`Sidecar` is plain Python (testable without Ray): it owns the node's :class:`Sampler`, reads the
probe rings, scrapes rank 0's ``/metrics``, tails the engine log, runs :func:`detect` every tick and, when
it fires, asks the seat's capture coordinator (node 0's sidecar, else itself) for one coordinated capture.
It exports its own Prometheus metrics on 127.0.0.1, or on the node's cluster address where the spec says
``watchdog.exporter_bind: cluster`` (:mod:`sgl_seat.watchdog.prometheus.exporter`). Node 0's sidecar
also follows SGLang's request log (``--log-requests``, which the plan turns on) into a redacting recorder, so
a bundle carries the request shapes of the last ``history_s`` seconds (``requests.jsonl``) that
``replay --traffic`` re-drives.

Its configuration is :mod:`sgl_seat.watchdog.config`; the other sidecars are reached through
:class:`~sgl_seat.watchdog.peers.Peers` (Ray actors in a seat, :mod:`sgl_seat.watchdog.actors`).

One hang, one bundle: a capture latches every sidecar it reaches; a sidecar unlatches only after its own
detectors have been quiet for ``RECOVER_S`` *and* it has seen progress since the latch (tokens on
``/metrics`` or completed row fetches), or when the engine was restarted (a new generation of processes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sgl_seat.core.columns import is_beat
from sgl_seat.core.detect import detect
from sgl_seat.core.isolation import SelfCheck, own_side_gone
from sgl_seat.core.learned import LearnedThresholds, Learner
from sgl_seat.core.nodeloss import loss_verdict, node_isolated
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import ProbeRecord, StackSample, Verdict, VerdictKind
from sgl_seat.core.warning import PreHangWarning, WarningRule, judge, tail_readings
from sgl_seat.forensics.recording.recorder import RequestRecorder
from sgl_seat.forensics.recording.requestlog import RequestLogFollower
from sgl_seat.watchdog import capture as cap
from sgl_seat.watchdog import selfcheck
from sgl_seat.watchdog.config import SidecarConfig
from sgl_seat.watchdog.peers import CoordinatorUnreachable, Peers, SidecarCore
from sgl_seat.watchdog.procfind import EngineProc, find_engine_processes
from sgl_seat.watchdog.prometheus.exporter import Exporter
from sgl_seat.watchdog.rankview import RankView, rank_views, tokens_per_s
from sgl_seat.watchdog.sampler import Sampler
from sgl_seat.watchdog.sources import LogTailer, MetricsPoller, ProbeReader
from sgl_seat.watchdog.spool import SampleSpool

log = logging.getLogger("sgl_seat.watchdog")

#: How often the engine processes' /proc entries are checked (a read of /proc/PID/stat each) and the probe rings
#: read: the fast loop, event-driven detection. A stall is told from a slow call by its learned threshold
#: (core/learned.py, a few hundred ms), so the rings are read at a rate that fits it, not at the 1 Hz of the stacks.
LIVENESS_S = 0.05
METRICS_EVERY_S = 1.0
PROBE_EVERY_S = 0.5
REQUEST_LOG_EVERY_S = 0.5
#: Full detection runs this often; the fast loop wakes it at once when a process dies or stops, or a row fetch
#: passes its threshold ...
DETECT_EVERY_S = 1.0
#: ... but not more often than this while the condition lasts without a verdict (a warm-up call that the learner
#: takes for late and the detectors, reading the records, do not).
URGENT_EVERY_S = 0.2
#: Seconds each stack dump may take in a capture triggered by a lost node (5 s otherwise): measured on 2 loaded
#: cores, a native dump of a rank blocked on its cut-off peer ran past 5 s while its Python dump took 0.1 s.
NODE_LOSS_NATIVE_S = 1.5
#: Completed row fetches the live detectors look at (the detectors' own windows are shorter).
LIVE_PROBE_WINDOW_S = 65.0
#: Seconds one of the seat's own interfaces must stay down before this node names itself isolated without waiting
#: for its peers to go silent (a flap shorter than this is left to the heartbeats).
LINK_DOWN_S = 1.0
#: A self-check older than this (seconds before a capture's time) is not put into the node's part.
SELF_CHECK_FRESH_S = 60.0
#: Failed captures a sidecar keeps for `status` and `watch` (the exporter's counter counts all of them).
MAX_FAILURES = 20


class Sidecar:
    """One node's watchdog (see the module doc). ``peers`` None: a single-node seat, it coordinates itself."""

    def __init__(self, cfg: SidecarConfig, *, peers: Peers | None = None, sampler: Sampler | None = None,
                 clock: Callable[[], float] = time.time, host_gone: Callable[[], bool] | None = None,
                 net_root: Path = selfcheck.NET_SYSFS, ib_root: Path = selfcheck.IB_SYSFS,
                 spool: SampleSpool | None = None, bind_wait_s: float = 0.0) -> None:
        self.cfg = cfg
        #: Where each sample also goes, as it is taken (the keeper's directory: its history once it takes over).
        self.spool = spool
        #: True once this node's own Ray raylet is gone (the Ray actor's parent exited): the node's engines die
        #: with it and this sidecar soon after, so it neither detects nor captures any more; the other nodes name
        #: this node unreachable (its heartbeats stop), which is the finding, not the deaths that follow it.
        self.host_gone = host_gone
        self._host_gone_logged = False
        self.th = cfg.watchdog
        self.peers = peers
        self.clock = clock
        #: The engine's names for its processes and metrics (its backend's): what the detectors read by.
        self.words = words = cfg.words
        discover: Callable[[], list[EngineProc]]
        if cfg.root_pid is not None:
            root = cfg.root_pid
            discover = lambda: find_engine_processes(words, root_pid=root)  # noqa: E731
        else:
            node, port = cfg.node, cfg.engine_port
            discover = lambda: find_engine_processes(words, node_rank=node, port=port)  # noqa: E731
        self.sampler = sampler or Sampler(node=cfg.node, sample_hz=self.th.sample_hz, history_s=self.th.history_s,
                                          discover=discover, pyspy=cfg.pyspy if cfg.pyspy else True)
        self.exporter = Exporter(cfg.node, cfg.metrics_port, cfg.exporter_addr, bind_wait_s=bind_wait_s)
        self.exporter.rank_states.source = self._rank_views
        self.sampler.on_sample = self._on_sample
        self.probes = ProbeReader(cfg.probe_dir, node=cfg.node, history_s=self.th.history_s) if cfg.probe_dir else None
        #: The healthy calls' distribution per shape (core/learned.py), fed by every completed probe record.
        self._learn_lock = threading.Lock()
        self.learner = Learner(self.th)
        self.learned: LearnedThresholds = self.learner.thresholds()
        if self.probes is not None:
            self.probes.on_complete = self._on_fetch
        self.metrics = MetricsPoller(cfg.metrics_url, node=cfg.node, prefix=words.metric_prefix,
                                     history_s=self.th.history_s) if cfg.metrics_url else None
        self.logs = LogTailer(cfg.log_path, node=cfg.node)
        self.recorder: RequestRecorder | None = None
        self.request_log: RequestLogFollower | None = None
        if cfg.request_log_dir:
            self.recorder = RequestRecorder(raw_prompts=cfg.raw_prompts, history_s=self.th.history_s)
            self.request_log = RequestLogFollower(cfg.request_log_dir, self.recorder)
        self._last_request_log = float("-inf")
        self._lock = threading.RLock()
        self._capture_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._live_thread: threading.Thread | None = None
        self._last_metrics = float("-inf")
        self._last_detect = float("-inf")
        self._urgent_flag = False
        #: capture id -> (processes dumped, focus ranks, native budget) for its late part (native_part).
        self._late: dict[str, tuple[list[EngineProc], list[int], float | None]] = {}
        self._dead_seen = 0
        self._last_probe = float("-inf")
        self.verdict: Verdict | None = None
        self.warning: PreHangWarning | None = None
        self.latched_at: float | None = None
        self.latched_by: str | None = None
        self._clear_since: float | None = None
        self._generation: frozenset[int] = frozenset()
        self.bundles: list[dict[str, Any]] = []
        self.capture_errors: list[str] = []
        #: The captures whose bundle the disk did not take whole (newest last, at most MAX_FAILURES): what `status`
        #: and `watch` show, with where the part that was written lies and what is missing.
        self.capture_failures: list[dict[str, Any]] = []
        self.ticks = 0
        #: This node's last look at its own side (taken when it lost peers or a seat interface went down).
        self.self_check: SelfCheck | None = None
        self._link_down_since: float | None = None
        #: Peers whose sidecar is silent while their node agent answers (``Peers.watch_gaps``), as last seen.
        self.watch_gaps: dict[int, str] = {}
        #: Where the self-check reads links and RDMA ports (sysfs; a test's own tree).
        self._net_root = net_root
        self._ib_root = ib_root

    # ---- life cycle

    def start(self) -> None:
        """Start the tick and liveness threads; a second call while they run does nothing (a start per call
        once piled up tick threads, each sending its own heartbeats, until pings went unanswered)."""
        if self._thread is not None and self._thread.is_alive():
            return
        if self.probes is not None:
            self.probes.cleanup(set())
        self.sampler.refresh(force=True)
        self._generation = frozenset(e.pid for e in self.sampler.live() if e.kind == "main")
        self.sampler.start()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"sgl-seat-watchdog-{self.cfg.node}", daemon=True)
        self._thread.start()
        self._live_thread = threading.Thread(target=self._liveness, name=f"sgl-seat-liveness-{self.cfg.node}",
                                             daemon=True)
        self._live_thread.start()

    def stop(self, *, remove_rings: bool = True) -> None:
        """Stop watching. `down` calls this just before the engines are killed, so the rings go too."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._live_thread is not None:
            self._live_thread.join(5)
        self.sampler.stop()
        if self.metrics is not None:
            self.metrics.close()
        self.exporter.close()
        if self.request_log is not None:
            self.request_log.close()
        if self.probes is not None:
            if remove_rings:
                self.probes.remove_all()
            else:
                self.probes.cleanup(set())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # the watchdog must outlive anything it watches
                log.exception("node %d sidecar tick failed: %s", self.cfg.node, exc)
            self._wake.wait(self.cfg.tick_s)
            self._wake.clear()

    def _liveness(self) -> None:
        """The fast loop, every LIVENESS_S: engine processes' /proc states (a death is timed finely: cascades are
        ordered by it; a stop is timed from its first read) and the probe rings. A death, a stop past
        ``stopped_s`` or a call past its threshold wakes the tick, which runs the detectors at once."""
        while not self._stop.wait(LIVENESS_S):
            try:
                if self.fast_check(self.clock()):
                    self._urgent_flag = True
                    self._wake.set()
            except Exception as exc:
                log.debug("liveness check failed: %s", exc)

    def fast_check(self, now: float) -> bool:
        """One round of the fast loop; True when the detectors should run now."""
        died = self.sampler.check_liveness()
        if self.probes is not None:
            self._last_probe = now
            self.probes.read(self._pid_ranks(), now)
        if died:
            return True
        if self.verdict is not None or self.latched_at is not None:
            return False
        if any(now - t >= self.th.stopped_s for t in self.sampler.stopped().values()):
            return True
        if self.probes is None:
            return False
        with self._learn_lock:
            return any((a := p.inflight_age(now)) is not None and a >= self.learner.threshold_for(p)
                       for p in self.probes.in_flight())

    def _on_fetch(self, rec: ProbeRecord) -> None:
        """Each completed probe record: the exporter's histogram, and the learner (healthy while not latched);
        a heartbeat is neither's (the latch's progress check reads it from the records)."""
        if is_beat(rec.target):
            return
        self.exporter.observe_fetch(rec)
        with self._learn_lock:
            self.learner.observe((rec,), healthy=self.latched_at is None)

    def _on_sample(self, s: StackSample) -> None:
        self.exporter.samples.inc()
        if s.error is not None:
            self.exporter.errors.inc()
        if self.spool is not None:
            self.spool.append(s)

    # ---- one tick

    def _pid_ranks(self) -> dict[int, int | None]:
        return {p.pid: p.rank for p in self.sampler.processes()}

    def poll_sources(self, now: float, *, capture: bool = False) -> None:
        """Read every source due. ``capture``: what a capture's part needs now (the rings, the logs, the request
        log), not process discovery or /metrics, which the last tick read and the fast loop keeps current."""
        if capture:
            if self.request_log is not None:
                self._last_request_log = now
                self.request_log.poll(now)
            if self.probes is not None:
                self._last_probe = now
                self.probes.read(self._pid_ranks(), now)
            self.logs.poll(now)
            return
        self.sampler.refresh()
        if self.request_log is not None and now - self._last_request_log >= REQUEST_LOG_EVERY_S:
            self._last_request_log = now
            self.request_log.poll(now)
        if self.probes is not None and now - self._last_probe >= PROBE_EVERY_S:
            self._last_probe = now
            self.probes.read(self._pid_ranks(), now)
        if self.metrics is not None and now - self._last_metrics >= METRICS_EVERY_S:
            self._last_metrics = now
            self.metrics.poll_in_background(now)  # never in the tick: an unreachable /metrics waits out its timeout
        self.logs.poll(now)
        self.exporter.sampler_up.set(1 if self.sampler.state == "ok" else 0)
        infl = [a for p in (self.probes.in_flight() if self.probes else []) if (a := p.inflight_age(now)) is not None]
        self.exporter.inflight.set(max(infl) if infl else 0.0)

    def observation(self, *, probe_window_s: float | None = None, now: float | None = None) -> Observation:
        """The node's records; ``probe_window_s`` limits completed row fetches to the recent ones (what the
        detectors look at live; captures take everything)."""
        since = (now if now is not None else self.clock()) - probe_window_s if probe_window_s is not None else None
        return Observation.of(
            samples=self.sampler.samples(),
            probes=self.probes.records(since) if self.probes else (),
            metrics=self.metrics.points() if self.metrics else (),
            logs=self.logs.lines(),
            processes=self.sampler.processes(),
            rank_nodes=self.cfg.rank_nodes,
            learned=self.learned if self.th.learn_enabled else None,
            words=self.words,
        )

    def _urgent(self, now: float) -> bool:
        """Whether the detectors run before DETECT_EVERY_S: a process gone since the last look, or the fast loop
        found a stop or a late call (at most every URGENT_EVERY_S while it lasts)."""
        dead = sum(1 for p in self.sampler.processes() if not p.alive)
        urgent = dead != self._dead_seen or (self._urgent_flag and now - self._last_detect >= URGENT_EVERY_S)
        self._dead_seen = dead
        self._urgent_flag = False
        return urgent

    def tick(self) -> Verdict | None:
        now = self.clock()
        # Woken by the fast loop (a stop, a late call): the detectors run on what it read, before the slower sources
        # (process discovery, the request log, the engine log) are polled; they are polled on the next tick.
        if not (self._urgent_flag and self.verdict is None and self.latched_at is None):
            self.poll_sources(now)
        self.ticks += 1
        if self.host_gone is not None and self.host_gone():
            if not self._host_gone_logged:
                log.warning("node %d watchdog: this node's raylet is gone; no more captures from here (the other "
                            "nodes name this node unreachable)", self.cfg.node)
                self._host_gone_logged = True
            return self.verdict
        lost = self.peers.silent(now) if self.peers is not None else {}
        self._note_gaps(self.peers.watch_gaps() if self.peers is not None else {})
        if self.peers is not None and self.latched_at is None:
            gone = self._node_loss(lost, now)
            if gone is not None:
                return gone
        if not self._urgent(now) and now - self._last_detect < DETECT_EVERY_S:
            return self.verdict
        self._last_detect = now
        with self._learn_lock:
            self.learner.forget_pids(p.pid for p in self.sampler.live())
            self.learned = self.learner.thresholds()
        obs = self.observation(probe_window_s=LIVE_PROBE_WINDOW_S, now=now)
        verdict = detect(obs, self.th, now)
        prev, self.verdict = self.verdict, verdict
        if verdict is not None and (prev is None or prev.kind != verdict.kind):
            self.exporter.fired.labels(node=str(self.cfg.node), kind=verdict.kind.value).inc()
            log.warning("node %d watchdog: %s, rank %s, node %s, %s", self.cfg.node, verdict.kind.value,
                        verdict.rank, verdict.node, verdict.frame)
        self._update_latch(verdict, now)
        if verdict is not None and self.latched_at is None:
            self._trigger(verdict, now)
        self.warn(obs, now)
        return verdict

    def _note_gaps(self, gaps: dict[int, str]) -> None:
        """Log a peer's watchdog gone (its node answering) once when it begins and once when it ends."""
        for n in sorted(set(gaps) - set(self.watch_gaps)):
            log.warning("node %d watchdog: node %d %s (not a lost node: no bundle)", self.cfg.node, n, gaps[n])
        for n in sorted(set(self.watch_gaps) - set(gaps)):
            log.info("node %d watchdog: node %d's sidecar answers again", self.cfg.node, n)
        self.watch_gaps = gaps

    def _own_link_down(self, now: float) -> bool:
        """One of the seat's interfaces has been down for LINK_DOWN_S (a cheap sysfs read every tick)."""
        if not self.cfg.interfaces:
            return False
        if not selfcheck.links_down(self.cfg.interfaces, self._net_root):
            self._link_down_since = None
            return False
        if self._link_down_since is None:
            self._link_down_since = now
        return now - self._link_down_since >= LINK_DOWN_S

    def _node_loss(self, lost: dict[int, str], now: float) -> Verdict | None:
        """A node lost is a finding by itself, with or without traffic; but this node looks at its own side first
        (``core.isolation``): its own link or route gone, it names itself ``node-isolated``, else the silent peer
        ``node-unreachable``, with its own healthy side as evidence."""
        if not lost and not self._own_link_down(now):
            return None
        # The head is tried here only where it decides (every one of two or more peers silent: the route rule);
        # elsewhere its connect (up to HEAD_CONNECT_S when the route is gone) waits for the capture's part.
        peers = self.cfg.nnodes - 1
        decides = peers >= 2 and len(lost) >= peers
        check = selfcheck.take(self.cfg.node, now, interfaces=self.cfg.interfaces,
                               head_address=self.cfg.head_address if decides else None, silent=lost, peers=peers,
                               net_root=self._net_root, ib_root=self._ib_root)
        self.self_check = check
        if own_side_gone(check):
            verdict = node_isolated(self.cfg.node, check, self.cfg.rank_nodes, now)
            log.warning("node %d watchdog: this node is isolated (%s)", self.cfg.node, "; ".join(own_side_gone(check)))
        elif lost:
            present = sorted(set(self.cfg.rank_nodes.values()) - set(lost)) or [self.cfg.node]
            found = loss_verdict(self.cfg.rank_nodes, present, now, checks={self.cfg.node: check}, last_seen=lost)
            assert found is not None  # lost is not empty
            verdict = found
            log.warning("node %d watchdog: node %d unreachable (%s)", self.cfg.node, min(lost), lost[min(lost)])
        else:  # a link down that the check no longer sees (it came back between the two reads)
            return None
        self.verdict = verdict
        self.exporter.fired.labels(node=str(self.cfg.node), kind=verdict.kind.value).inc()
        self._trigger(verdict, now)
        return verdict

    def warn(self, obs: Observation, now: float) -> None:
        """The pre-hang warning (a warning, never a capture) and the state gauges, once per detection."""
        rule = WarningRule.for_stall(self.th.rowfetch_inflight_s)
        readings = tail_readings(obs.probes, now, rule)
        warning = judge(readings, now, rule)
        if warning is not None and self.warning is None:
            log.warning("node %d watchdog: %s", self.cfg.node, warning.summary())
        self.warning = warning
        self.exporter.observe_state(latched=self.latched_at is not None, warning=warning, readings=readings)

    # ---- latch

    def _progressed_since(self, t: float) -> bool:
        if self.probes is not None and any(p.end is not None and p.end > t for p in self.probes.records()):
            return True
        if self.metrics is not None:
            pts = [m for m in self.metrics.points() if m.t >= t]
            gen = [m.values.get(self.words.generated) for m in pts]
            return len({g for g in gen if g is not None}) > 1
        return False

    def _update_latch(self, verdict: Verdict | None, now: float) -> None:
        gen = frozenset(e.pid for e in self.sampler.live() if e.kind == "main")
        with self._lock:
            if gen and gen != self._generation:
                if self._generation and self.latched_at is not None:
                    log.info("node %d: new engine generation; watchdog re-armed", self.cfg.node)
                    self.latched_at = None
                self._generation = gen
            if self.latched_at is None:
                self._clear_since = None
                return
            if verdict is not None:
                self._clear_since = None
                return
            if self._clear_since is None:
                self._clear_since = now
            if now - self._clear_since >= self.cfg.recover_s and self._progressed_since(self.latched_at):
                log.info("node %d: seat recovered; watchdog re-armed", self.cfg.node)
                self.latched_at = None
                self._clear_since = None

    def latch(self, capture_id: str, t: float) -> bool:
        """Latch for capture ``capture_id``; False if already latched (by this or another capture)."""
        with self._lock:
            if self.latched_at is not None:
                if self.latched_by == "pending":  # our own trigger, answered by the coordinator
                    self.latched_by = capture_id
                return self.latched_by == capture_id
            self.latched_at = t
            self.latched_by = capture_id
            self._clear_since = None
            return True

    # ---- capture

    def _trigger(self, verdict: Verdict, now: float) -> None:
        trigger = {"t": now, "source": "detector", "node": self.cfg.node, "kind": verdict.kind.value,
                   "rank": verdict.rank, "verdict": verdict.to_json()}
        # Latch locally at once so the next tick does not trigger again while the capture runs.
        with self._lock:
            if self.latched_at is not None:
                return
            self.latched_at = now
            self.latched_by = "pending"
        threading.Thread(target=self._request, args=(trigger,), name="sgl-seat-capture", daemon=True).start()

    def _request(self, trigger: dict[str, Any]) -> None:
        try:
            # An isolated node reaches nobody, by its own evidence: it captures from here at once.
            local = self.peers is None or self.cfg.node == 0 or trigger.get("kind") == VerdictKind.NODE_ISOLATED.value
            ans = self.coordinate(trigger) if local else self.peers.request_capture(trigger)  # type: ignore[union-attr]
        except CoordinatorUnreachable as exc:
            log.warning("node %d: the coordinator is unreachable (%s); capturing from here", self.cfg.node, exc)
            ans = self.coordinate(trigger)
        except Exception as exc:  # the coordinator got it but answered late or failed: never a second capture
            log.warning("node %d: capture request failed: %s", self.cfg.node, exc)
            return
        if ans.get("status") == "ok":
            log.warning("node %d: capture %s written to %s", self.cfg.node, ans.get("bundle_id"), ans.get("path"))

    def coordinate(self, trigger: dict[str, Any]) -> dict[str, Any]:
        """Run one capture for the seat (the coordinator's job); refuse while latched by an earlier one."""
        if not self._capture_lock.acquire(blocking=False):
            return {"status": "busy"}
        try:
            capture_id = uuid.uuid4().hex[:12]
            t = float(trigger.get("t") or self.clock())
            with self._lock:
                mine = self.latched_by == "pending" and int(trigger.get("node", -1)) == self.cfg.node
                if self.latched_at is not None and not mine:
                    return {"status": "latched", "by": self.latched_by}
                self.latched_at = self.latched_at or t
                self.latched_by = capture_id
            return self._capture(capture_id, t, trigger)
        finally:
            self._capture_lock.release()

    def _capture(self, capture_id: str, t: float, trigger: dict[str, Any]) -> dict[str, Any]:
        t0 = time.time()
        kind = trigger.get("kind")
        if self.peers is not None and kind == VerdictKind.NODE_ISOLATED.value:
            # Cut off by its own side: no peer is asked (each would cost a timeout); the others are named missing.
            check = self.self_check
            parts = [self.part(capture_id, t, dump_timeout_s=NODE_LOSS_NATIVE_S)]
            missing = [{"node": n, "step": "reach", "status": "not asked",
                        "detail": f"node {self.cfg.node} is isolated (its own side is gone): not asked",
                        "last_seen": (check.silent.get(n) if check is not None else None) or ""}
                       for n in range(self.cfg.nnodes) if n != self.cfg.node]
        elif self.peers is not None:
            # A lost node is the finding: the reachable ranks' native stacks get a short budget (their Python stacks,
            # taken first, are always kept), so the bundle is not held up by slow native unwinding.
            budget = NODE_LOSS_NATIVE_S if kind == VerdictKind.NODE_UNREACHABLE.value else None
            parts, missing = self.peers.collect(capture_id, t, lambda: self.part(capture_id, t, dump_timeout_s=budget))
        else:
            parts, missing = [self.part(capture_id, t)], []
        tv = trigger.get("verdict")
        trigger_verdict = Verdict.from_json(tv) if isinstance(tv, dict) else None
        res = cap.assemble(
            seat=self.cfg.seat, parts=parts,
            trigger={k: v for k, v in trigger.items() if k != "verdict"} | {"capture_id": capture_id,
                                                                           "detect_to_capture_s": time.time() - t},
            trigger_verdict=trigger_verdict, thresholds=self.th, rank_nodes=self.cfg.rank_nodes, plan=self.cfg.plan,
            dest_root=Path(self.cfg.bundle_dir), quota_mb=self.cfg.quota_mb, missing=missing, words=self.words)
        doc = res.to_json() | {"status": "ok" if res.error is None else "error", "capture_id": capture_id,
                               "detected_at": t, "written_at": time.time(), "collect_s": time.time() - t0}
        self.exporter.capture_done(None if res.error is None else res.reason or "other")
        if res.error is None and res.path is not None:
            # The late part: native stacks and nvidia-smi, after the bundle is on disk (they take a second or more).
            # The bundle is named in `bundles` (what the supervisor acts on and annotates) only after it.
            t_late = time.time()
            answered = [int(p["node"]) for p in parts]
            late = self.peers.collect_native(capture_id, answered, lambda: self.native_part(capture_id)) \
                if self.peers is not None and len(answered) > 1 else [self.native_part(capture_id)]
            doc["late_error"] = cap.add_native(Path(res.path), late, written_at=doc["written_at"])
            doc["late_s"] = time.time() - t_late
        with self._lock:
            if res.error is None:
                self.bundles.append(doc)
            else:
                self.capture_errors.append(res.error)
                inc = res.incomplete or {}
                self.capture_failures.append({
                    "t": doc["written_at"], "capture_id": capture_id, "bundle_id": res.bundle_id,
                    "reason": res.reason or "other", "error": res.error, "path": inc.get("path"),
                    "missing": list(inc.get("missing") or []), "written": list(inc.get("written") or []),
                    "marker": bool(inc.get("marker"))})
                del self.capture_failures[:-MAX_FAILURES]
        return doc

    def part(self, capture_id: str, t: float, *, dump_timeout_s: float | None = None) -> dict[str, Any]:
        """This node's share of capture ``capture_id`` (called by the coordinator, possibly over Ray);
        ``dump_timeout_s``: each stack dump's budget (None: node_part's default)."""
        self.latch(capture_id, t)
        now = self.clock()
        self.sampler.check_liveness()  # the process states as of now, not of the last fast round
        self.poll_sources(now, capture=True)
        pids = self.sampler.live()
        env: dict[str, str] = {}
        mains = [e for e in pids if e.kind == "main"]
        if mains:
            with contextlib.suppress(Exception):
                import psutil

                env = dict(psutil.Process(mains[0].pid).environ())
        check = self.self_check
        if check is not None and check.head is None and self.cfg.head_address:  # evidence, off the tick
            check = self.self_check = dataclasses.replace(check, head=selfcheck.reach_head(self.cfg.head_address))
        # The rank this node's own detectors name gets its native stack first (in the late part, native_part).
        focus = [self.verdict.rank] if self.verdict is not None and self.verdict.rank is not None else []
        with self._lock:
            self._late[capture_id] = (pids, focus, dump_timeout_s)
            for old in list(self._late)[:-4]:  # a coordinator that never asked for them
                del self._late[old]
        # Python stacks and what is in memory only: native stacks and nvidia-smi follow the written bundle.
        part = cap.node_part(
            node=self.cfg.node, procs=pids, pyspy=self.sampler.pyspy, samples=self.sampler.samples(),
            probes=self.probes.records() if self.probes else [], metrics=self.metrics.points() if self.metrics else [],
            logs=self.logs.lines(), processes=self.sampler.processes(), log_text=self.logs.tail_text(), env=env,
            gpu=self.cfg.gpu, native=False, focus_ranks=focus,
            **({} if dump_timeout_s is None else {"dump_timeout_s": dump_timeout_s}),
            learned=self.learned.to_json() if self.th.learn_enabled else None,
            requests=self.recorder.snapshot(now=now) if self.recorder is not None else None,
            request_redaction=self.recorder.redaction if self.recorder is not None else None)
        if check is not None and t - check.t <= SELF_CHECK_FRESH_S:
            part["self_check"] = check.to_json()  # this node's own side, as it saw it when it lost its peers
        return part

    def native_part(self, capture_id: str) -> dict[str, Any]:
        """This node's late part of capture ``capture_id``, asked once its bundle is on disk: the native stacks of
        the processes its part dumped (cap.NATIVE_BUDGET_S; a lost node's capture: NODE_LOSS_NATIVE_S) and
        ``nvidia-smi -q``."""
        with self._lock:
            ctx = self._late.pop(capture_id, None)
        if ctx is None:
            return {"node": self.cfg.node, "native": [], "gpu": None,
                    "capture": [{"node": self.cfg.node, "step": "native", "status": "skipped",
                                 "detail": "this node took no part in the capture"}]}
        procs, focus, budget = ctx
        return cap.node_native(node=self.cfg.node, procs=[p for p in procs if p.pid in {q.pid for q in
                                                                                       self.sampler.live()}],
                               pyspy=self.sampler.pyspy, focus_ranks=focus, gpu=self.cfg.gpu,
                               budget_s=cap.NATIVE_BUDGET_S if budget is None else min(budget, cap.NATIVE_BUDGET_S))

    # ---- views

    def _learning(self) -> dict[str, Any]:
        with self._learn_lock:
            return {**self.learner.stats(), "enabled": self.th.learn_enabled, "floor_s": self.th.learn_floor_s,
                    "k": self.th.learn_k, "quantile": self.th.learn_quantile}

    def _rank_views(self) -> list[RankView]:
        """This node's ranks as `watch` shows them, over the detectors' window (the exporter's rank states)."""
        now = self.clock()
        obs = self.observation(probe_window_s=LIVE_PROBE_WINDOW_S, now=now)
        return [v for v in rank_views(obs, now) if v.node in (None, self.cfg.node)]

    def snapshot(self) -> dict[str, Any]:
        """What `watch` shows for this node (plain data)."""
        now = self.clock()
        obs = self.observation()
        with self._lock:
            return {
                "node": self.cfg.node,
                "t": now,
                "sampler": self.sampler.state,
                "warnings": list(self.sampler.warnings),
                "samples_taken": self.sampler.samples_taken,
                "sampler_errors": self.sampler.errors,
                "metrics_port": self.exporter.port,
                "ranks": [v.to_json() for v in rank_views(obs, now) if v.node in (None, self.cfg.node)],
                "tokens_per_s": tokens_per_s(obs.metrics, now, self.words),
                "verdict": self.verdict.to_json() if self.verdict else None,
                "warning": self.warning.to_json() if self.warning else None,
                "latched": self.latched_at is not None,
                # The capture that holds the latch: its bundle (in some node's "bundles") is what `status` names.
                "latched_by": self.latched_by,
                "bundles": list(self.bundles),
                "capture_errors": list(self.capture_errors),
                # Structured: reason (disk-full, read-only, ...), the .incomplete-<id> directory, missing files.
                "capture_failures": [dict(f) for f in self.capture_failures],
                "exporter": {"addr": self.exporter.addr, "port": self.exporter.port},
                # The learned thresholds and how close healthy calls came to them (near misses: >= half).
                "learning": self._learning(),
                "processes": [p.to_json() for p in obs.processes],
                "request_log": dict(self.request_log.stats()) if self.request_log is not None else None,
                # Peers whose sidecar is silent while their node answers: their watchdog is gone, not the node.
                "watch_gaps": {str(n): why for n, why in sorted(self.watch_gaps.items())},
            }


if TYPE_CHECKING:
    # mypy holds the Sidecar to what in-process peers call on it (peers.local_peers knows only the protocol).
    _is_a_core: type[SidecarCore] = Sidecar
