"""The watchdog sidecar: one per node, beside the node agent, started by `up` and stopped by `down`.

:class:`Sidecar` is plain Python (testable without Ray): it owns the node's :class:`Sampler`, reads the
probe rings, scrapes rank 0's ``/metrics``, tails the engine log, runs :func:`detect` every tick and, when
it fires, asks the seat's capture coordinator (node 0's sidecar, else itself) for one coordinated capture.
It exports its own Prometheus metrics on 127.0.0.1. Node 0's sidecar also follows SGLang's request log
(``--log-requests``, which the plan turns on) into a redacting recorder, so a bundle carries the request
shapes of the last ``history_s`` seconds (``requests.jsonl``) that ``replay --traffic`` re-drives.

:class:`SidecarActor` wraps it as a detached, named Ray actor (``sgl-seat-<seat>-watchdog<r>`` in the
seat's namespace) on the node agent's bundle; every method takes and returns JSON strings, so nothing
sgl-seat defines is pickled between processes. :func:`start_sidecars` / :func:`stop_sidecars` are the
functions `up` and `down` call (``sgl_seat.launch.sidecars``).

One hang, one bundle: a capture latches every sidecar it reaches; a sidecar unlatches only after its own
detectors have been quiet for ``RECOVER_S`` *and* it has seen progress since the latch (tokens on
``/metrics`` or completed row fetches), or when the engine was restarted (a new generation of processes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sgl_seat.core.detect import detect
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import ProbeRecord, StackSample, Verdict
from sgl_seat.forensics.recorder import RequestRecorder
from sgl_seat.forensics.requestlog import RequestLogFollower
from sgl_seat.spec import WatchdogSpec
from sgl_seat.watchdog import capture as cap
from sgl_seat.watchdog.rankview import rank_views, tokens_per_s
from sgl_seat.watchdog.sampler import EngineProc, Sampler, find_engine_processes
from sgl_seat.watchdog.sources import LogTailer, MetricsPoller, ProbeReader

log = logging.getLogger("sgl_seat.watchdog")

RECOVER_S = 10.0
TICK_S = 0.25
#: How often the engine processes' /proc entries are checked (a read of /proc/PID/stat each).
LIVENESS_S = 0.05
METRICS_EVERY_S = 1.0
PROBE_EVERY_S = 0.5
REQUEST_LOG_EVERY_S = 0.5
#: Full detection runs this often; cheap checks every tick trigger it at once when a process dies or a
#: row fetch passes its threshold.
DETECT_EVERY_S = 1.0
#: Completed row fetches the live detectors look at (the detectors' own windows are shorter).
LIVE_PROBE_WINDOW_S = 65.0
CAPTURE_TIMEOUT_S = 20.0
#: Row-fetch latency buckets (upper bounds of the gather size) for the exported histogram's label.
GATHER_BUCKETS = (64, 256, 1024, 4096, 16384)


def sidecar_name(seat: str, node_rank: int) -> str:
    return f"sgl-seat-{seat}-watchdog{node_rank}"


def gather_bucket(size: int) -> str:
    if size < 0:
        return "unknown"
    for b in GATHER_BUCKETS:
        if size <= b:
            return f"<={b}"
    return f">{GATHER_BUCKETS[-1]}"


@dataclass(frozen=True)
class SidecarConfig:
    """Everything one sidecar needs; plain data, crosses Ray as JSON."""

    seat: str
    node: int
    nnodes: int
    thresholds: dict[str, Any]
    bundle_dir: str
    quota_mb: int = 2048
    probe_dir: str | None = None
    log_path: str | None = None
    metrics_url: str | None = None
    metrics_port: int | None = None
    rank_nodes: dict[int, int] = field(default_factory=dict)
    root_pid: int | None = None
    engine_port: int | None = None
    plan: dict[str, Any] | None = None
    namespace: str | None = None
    pyspy: str | None = None
    gpu: bool = True
    recover_s: float = RECOVER_S
    tick_s: float = TICK_S
    #: Node 0: SGLang's request log directory (``--log-requests-target``); its requests go into bundles.
    request_log_dir: str | None = None
    #: ``bundles.raw_prompts``: keep prompt text in request shapes (off: lengths, counts, hashes only).
    raw_prompts: bool = False

    def to_json(self) -> str:
        d = asdict(self)
        d["rank_nodes"] = {str(k): v for k, v in self.rank_nodes.items()}
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> SidecarConfig:
        d = json.loads(text)
        d["rank_nodes"] = {int(k): int(v) for k, v in (d.get("rank_nodes") or {}).items()}
        return cls(**d)

    @property
    def watchdog(self) -> WatchdogSpec:
        return WatchdogSpec.model_validate(self.thresholds)


class CoordinatorUnreachable(RuntimeError):
    """Node 0's sidecar does not answer a ping: the requester coordinates the capture itself."""


class Peers(Protocol):
    """How a sidecar reaches the others (Ray in production, direct calls in tests)."""

    def request_capture(self, trigger: dict[str, Any]) -> dict[str, Any]:
        """Ask the coordinator for a capture; returns its answer (status, bundle path...)."""
        ...

    def collect(self, capture_id: str, t: float, local: Callable[[], dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every node's part of capture ``capture_id`` (local computed in-process) and missing-node notes."""
        ...


class _Exporter:
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
            self.rowfetch.labels(node=self.node, gather=gather_bucket(rec.gather_size)).observe(rec.end - rec.start)

    def close(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.shutdown()
                self._server.server_close()


class Sidecar:
    """One node's watchdog (see the module doc). ``peers`` None: a single-node seat, it coordinates itself."""

    def __init__(self, cfg: SidecarConfig, *, peers: Peers | None = None, sampler: Sampler | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.th = cfg.watchdog
        self.peers = peers
        self.clock = clock
        discover: Callable[[], list[EngineProc]]
        if cfg.root_pid is not None:
            root = cfg.root_pid
            discover = lambda: find_engine_processes(root_pid=root)  # noqa: E731
        else:
            node, port = cfg.node, cfg.engine_port
            discover = lambda: find_engine_processes(node_rank=node, port=port)  # noqa: E731
        self.sampler = sampler or Sampler(node=cfg.node, sample_hz=self.th.sample_hz, history_s=self.th.history_s,
                                          discover=discover, pyspy=cfg.pyspy if cfg.pyspy else True)
        self.exporter = _Exporter(cfg.node, cfg.metrics_port)
        self.sampler.on_sample = self._on_sample
        self.probes = ProbeReader(cfg.probe_dir, node=cfg.node, history_s=self.th.history_s) if cfg.probe_dir else None
        if self.probes is not None:
            self.probes.on_complete = self.exporter.observe_fetch
        self.metrics = MetricsPoller(cfg.metrics_url, node=cfg.node, history_s=self.th.history_s) \
            if cfg.metrics_url else None
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
        self._dead_seen = 0
        self._last_probe = float("-inf")
        self.verdict: Verdict | None = None
        self.latched_at: float | None = None
        self.latched_by: str | None = None
        self._clear_since: float | None = None
        self._generation: frozenset[int] = frozenset()
        self.bundles: list[dict[str, Any]] = []
        self.capture_errors: list[str] = []
        self.ticks = 0

    # ---- life cycle

    def start(self) -> None:
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
        """Engine processes checked every LIVENESS_S: a death is timed finely (cascades are ordered by it)
        and wakes the tick at once."""
        while not self._stop.wait(LIVENESS_S):
            try:
                if self.sampler.check_liveness():
                    self._wake.set()
            except Exception as exc:
                log.debug("liveness check failed: %s", exc)

    def _on_sample(self, s: StackSample) -> None:
        self.exporter.samples.inc()
        if s.error is not None:
            self.exporter.errors.inc()

    # ---- one tick

    def _pid_ranks(self) -> dict[int, int | None]:
        return {p.pid: p.rank for p in self.sampler.processes()}

    def poll_sources(self, now: float, *, requests_now: bool = False) -> None:
        self.sampler.refresh()
        if self.request_log is not None and (requests_now or now - self._last_request_log >= REQUEST_LOG_EVERY_S):
            self._last_request_log = now
            self.request_log.poll(now)
        if self.probes is not None and now - self._last_probe >= PROBE_EVERY_S:
            self._last_probe = now
            self.probes.read(self._pid_ranks(), now)
        if self.metrics is not None and now - self._last_metrics >= METRICS_EVERY_S:
            self._last_metrics = now
            self.metrics.poll(now)
        self.logs.poll(now)
        self.exporter.sampler_up.set(1 if self.sampler.state == "ok" else 0)
        infl = [now - p.start for p in (self.probes.in_flight() if self.probes else [])]
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
        )

    def _urgent(self, now: float) -> bool:
        """Cheap checks between full detections: a process gone, or a row fetch past its threshold."""
        dead = sum(1 for p in self.sampler.processes() if not p.alive)
        late = any(now - p.start >= self.th.rowfetch_inflight_s for p in
                   (self.probes.in_flight() if self.probes else []))
        urgent = dead != self._dead_seen or (late and self.verdict is None)
        self._dead_seen = dead
        return urgent

    def tick(self) -> Verdict | None:
        now = self.clock()
        self.poll_sources(now)
        self.ticks += 1
        if not self._urgent(now) and now - self._last_detect < DETECT_EVERY_S:
            return self.verdict
        self._last_detect = now
        verdict = detect(self.observation(probe_window_s=LIVE_PROBE_WINDOW_S, now=now), self.th, now)
        prev, self.verdict = self.verdict, verdict
        if verdict is not None and (prev is None or prev.kind != verdict.kind):
            self.exporter.fired.labels(node=str(self.cfg.node), kind=verdict.kind.value).inc()
            log.warning("node %d watchdog: %s, rank %s, node %s, %s", self.cfg.node, verdict.kind.value,
                        verdict.rank, verdict.node, verdict.frame)
        self._update_latch(verdict, now)
        if verdict is not None and self.latched_at is None:
            self._trigger(verdict, now)
        return verdict

    # ---- latch

    def _progressed_since(self, t: float) -> bool:
        if self.probes is not None and any(p.end is not None and p.end > t for p in self.probes.records()):
            return True
        if self.metrics is not None:
            pts = [m for m in self.metrics.points() if m.t >= t]
            gen = [m.values.get("sglang:generation_tokens_total") for m in pts]
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
            local = self.peers is None or self.cfg.node == 0
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
        if self.peers is not None:
            parts, missing = self.peers.collect(capture_id, t, lambda: self.part(capture_id, t))
        else:
            parts, missing = [self.part(capture_id, t)], []
        tv = trigger.get("verdict")
        trigger_verdict = Verdict.from_json(tv) if isinstance(tv, dict) else None
        res = cap.assemble(
            seat=self.cfg.seat, parts=parts,
            trigger={k: v for k, v in trigger.items() if k != "verdict"} | {"capture_id": capture_id,
                                                                           "detect_to_capture_s": time.time() - t},
            trigger_verdict=trigger_verdict, thresholds=self.th, rank_nodes=self.cfg.rank_nodes, plan=self.cfg.plan,
            dest_root=Path(self.cfg.bundle_dir), quota_mb=self.cfg.quota_mb, missing=missing)
        doc = res.to_json() | {"status": "ok" if res.error is None else "error", "capture_id": capture_id,
                               "detected_at": t, "written_at": time.time(), "collect_s": time.time() - t0}
        self.exporter.captures.labels(node=str(self.cfg.node), result="ok" if res.error is None else "error").inc()
        with self._lock:
            if res.error is None:
                self.bundles.append(doc)
            else:
                self.capture_errors.append(res.error)
        return doc

    def part(self, capture_id: str, t: float) -> dict[str, Any]:
        """This node's share of capture ``capture_id`` (called by the coordinator, possibly over Ray)."""
        self.latch(capture_id, t)
        now = self.clock()
        self.poll_sources(now, requests_now=True)
        pids = self.sampler.live()
        env: dict[str, str] = {}
        mains = [e for e in pids if e.kind == "main"]
        if mains:
            with contextlib.suppress(Exception):
                import psutil

                env = dict(psutil.Process(mains[0].pid).environ())
        return cap.node_part(
            node=self.cfg.node, procs=pids, pyspy=self.sampler.pyspy, samples=self.sampler.samples(),
            probes=self.probes.records() if self.probes else [], metrics=self.metrics.points() if self.metrics else [],
            logs=self.logs.lines(), processes=self.sampler.processes(), log_text=self.logs.tail_text(), env=env,
            gpu=self.cfg.gpu, requests=self.recorder.snapshot(now=now) if self.recorder is not None else None,
            request_redaction=self.recorder.redaction if self.recorder is not None else None)

    # ---- views

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
                "tokens_per_s": tokens_per_s(obs.metrics, now),
                "verdict": self.verdict.to_json() if self.verdict else None,
                "latched": self.latched_at is not None,
                "bundles": list(self.bundles),
                "capture_errors": list(self.capture_errors),
                "processes": [p.to_json() for p in obs.processes],
                "request_log": dict(self.request_log.stats()) if self.request_log is not None else None,
            }


# --------------------------------------------------------------------------------------------------
# Ray: the actor, the peers, and the functions `up` / `down` call


class SidecarActor:
    """Ray face of :class:`Sidecar`: JSON strings in and out."""

    def __init__(self, config_json: str) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per /metrics poll otherwise
        self.cfg = SidecarConfig.from_json(config_json)
        peers = RayPeers(self.cfg) if self.cfg.nnodes > 1 and self.cfg.namespace else None
        self.core = Sidecar(self.cfg, peers=peers)
        self.core.start()

    def ping(self) -> str:
        return json.dumps({"node": self.cfg.node, "pid": os.getpid(), "metrics_port": self.core.exporter.port,
                           "sampler": self.core.sampler.state, "processes": len(self.core.sampler.live())})

    def request_capture(self, trigger_json: str) -> str:
        return json.dumps(self.core.coordinate(json.loads(trigger_json)))

    def capture_part(self, capture_id: str, t: float) -> str:
        return json.dumps(self.core.part(capture_id, t))

    def snapshot(self) -> str:
        return json.dumps(self.core.snapshot())

    def stop(self) -> str:
        self.core.stop()
        return "{}"


class RayPeers:
    """Reaches the other sidecars by name in the seat's namespace, every call under a timeout."""

    def __init__(self, cfg: SidecarConfig) -> None:
        self.cfg = cfg

    def _actor(self, node: int) -> Any:
        import ray

        return ray.get_actor(sidecar_name(self.cfg.seat, node), namespace=self.cfg.namespace)

    def request_capture(self, trigger: dict[str, Any]) -> dict[str, Any]:
        import ray

        try:
            coord = self._actor(0)
            ray.get(coord.ping.remote(), timeout=3.0)
        except Exception as exc:
            raise CoordinatorUnreachable(f"{type(exc).__name__}: {exc}") from None
        ans: dict[str, Any] = json.loads(ray.get(coord.request_capture.remote(json.dumps(trigger)),
                                                 timeout=CAPTURE_TIMEOUT_S + 15))
        return ans

    def collect(self, capture_id: str, t: float, local: Callable[[], dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        import ray

        futures: dict[int, Any] = {}
        missing: list[dict[str, Any]] = []
        for n in range(self.cfg.nnodes):
            if n == self.cfg.node:
                continue
            try:
                futures[n] = self._actor(n).capture_part.remote(capture_id, t)
            except Exception as exc:
                missing.append({"node": n, "step": "capture", "status": "error", "detail": f"no sidecar: {exc}"})
        parts = [local()]
        deadline = time.monotonic() + CAPTURE_TIMEOUT_S
        for n, fut in futures.items():
            try:
                parts.append(json.loads(ray.get(fut, timeout=max(0.5, deadline - time.monotonic()))))
            except Exception as exc:
                missing.append({"node": n, "step": "capture", "status": "error",
                                "detail": f"{type(exc).__name__}: {exc}"[:300]})
        return parts, missing


def _rget(ref: Any, timeout: float) -> Any:
    import ray

    return ray.get(ref, timeout=timeout)


def _configs(ctx: Any) -> list[SidecarConfig]:
    """One config per node from the `up` context (filled plan JSON, the spec for thresholds)."""
    import ray

    from sgl_seat.forensics import layout
    from sgl_seat.spec import load_spec

    plan = json.loads(ctx.plan_json)
    spec = load_spec(ctx.spec_source) if ctx.spec_source else None
    wd = spec.watchdog if spec is not None else WatchdogSpec()
    bundle_dir = (Path(spec.bundles.dir).expanduser() if spec is not None and spec.bundles.dir
                  else layout.seat_bundles_dir(ctx.seat))
    quota = spec.bundles.quota_mb if spec is not None else 2048
    rank_nodes = {int(r["tp_rank"]): int(n["node_rank"]) for n in plan["nodes"] for r in n["ranks"]}
    http_port = int(plan["http_port"])
    metrics_url = rank0_metrics_url(plan, next((n.ip for n in ctx.nodes if n.node_rank == 0), None))
    out = []
    for nd in ctx.nodes:
        r = nd.node_rank
        node_env = plan["nodes"][r].get("env") or {}
        root_pid = log_path = request_log_dir = None
        try:
            agent = ray.get_actor(nd.agent, namespace=ctx.namespace)
            st = json.loads(_rget(agent.engine_state.remote(), min(30.0, ctx.timeout)))
            root_pid = st.get("pid")
            log_path = st.get("log_path")
            if "--log-requests-target" in plan["nodes"][r]["command"]:  # node 0 while the watchdog is on
                request_log_dir = st.get("request_log_dir")
        except Exception as exc:
            log.warning("node %d: no engine state from agent %s (%s); finding engines by title", r, nd.agent, exc)
        out.append(SidecarConfig(
            seat=ctx.seat, node=r, nnodes=len(plan["nodes"]), thresholds=wd.model_dump(), bundle_dir=str(bundle_dir),
            quota_mb=quota, probe_dir=node_env.get("SGL_SEAT_PROBE_DIR"), log_path=log_path, metrics_url=metrics_url,
            metrics_port=metrics_port_for(http_port, r), rank_nodes=rank_nodes, root_pid=root_pid,
            engine_port=http_port, plan=plan, namespace=ctx.namespace, request_log_dir=request_log_dir,
            raw_prompts=bool(spec is not None and spec.bundles.raw_prompts)))
    return out


#: The exporter of node r listens on 127.0.0.1 at the seat's HTTP port + 15 + r (r < 5; beyond, a free port).
#: The seat already uses http, +2 (sim admin), +5 (dist-init), +10 r and +10 r + 2 (co-located sim nodes).
EXPORTER_PORT_OFFSET = 15


def rank0_metrics_url(plan: Mapping[str, Any], node0_ip: str | None) -> str | None:
    """Rank 0's ``/metrics``: node 0's address when the engine binds every interface, else its ``--host``."""
    argv = list(plan["nodes"][0]["command"])
    host = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--host"), "0.0.0.0")
    if host in ("0.0.0.0", "::", ""):
        dist = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--dist-init-addr"), "")
        host = node0_ip or dist.rsplit(":", 1)[0]
    if not host or "${" in host:
        return None
    return f"http://{'[' + host + ']' if ':' in host else host}:{int(plan['http_port'])}/metrics"


def metrics_port_for(http_port: int, node_rank: int) -> int:
    """The sidecar exporter's port (loopback only); 0 asks the OS for a free one."""
    return http_port + EXPORTER_PORT_OFFSET + node_rank if node_rank < 5 else 0


def start_sidecars(ctx: Any) -> None:
    """`up`: one detached sidecar actor per node on the node agent's bundle. Never fails `up`: a sidecar that
    cannot start is logged and the seat serves without it."""
    import ray
    from ray.util import get_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    try:
        pg = get_placement_group(ctx.pg_name)
        configs = _configs(ctx)
    except Exception as exc:
        log.error("watchdog sidecars not started: %s", exc)
        return
    remote_cls: Any = ray.remote(SidecarActor)
    handles = []
    for cfg in configs:
        name = sidecar_name(ctx.seat, cfg.node)
        with contextlib.suppress(Exception):
            ray.kill(ray.get_actor(name, namespace=ctx.namespace))  # a leftover of an earlier seat
        try:
            h = remote_cls.options(
                name=name, namespace=ctx.namespace, lifetime="detached", num_cpus=0, max_concurrency=8,
                max_restarts=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=cfg.node),
            ).remote(cfg.to_json())
            handles.append((cfg.node, h))
        except Exception as exc:
            log.error("node %d: watchdog sidecar not started: %s", cfg.node, exc)
    for node, h in handles:
        try:
            info = json.loads(_rget(h.ping.remote(), ctx.timeout))
            log.info("node %d: watchdog sidecar up (%s)", node, info)
        except Exception as exc:
            log.error("node %d: watchdog sidecar did not answer: %s", node, exc)


def stop_sidecars(ctx: Any) -> None:
    """`down` (before engines are killed): stop each sidecar, then kill its actor."""
    import ray

    for nd in ctx.nodes:
        name = sidecar_name(ctx.seat, nd.node_rank)
        try:
            h = ray.get_actor(name, namespace=ctx.namespace)
        except ValueError:
            continue
        with contextlib.suppress(Exception):
            ray.get(h.stop.remote(), timeout=15)
        with contextlib.suppress(Exception):
            ray.kill(h)


def snapshots(seat: str, namespace: str, nnodes: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Every reachable sidecar's snapshot (for `watch`); a missing one is a dict with an error."""
    import ray

    out: list[dict[str, Any]] = []
    futs: list[tuple[int, Any]] = []
    from sgl_seat.errors import ClusterError
    from sgl_seat.launch.cluster import bounded

    for n in range(nnodes):
        try:
            # get_actor asks the GCS with no deadline of its own: a wedged cluster must not hang `watch`.
            actor = bounded("ray.get_actor (watchdog sidecar)", ray.get_actor, sidecar_name(seat, n),
                            namespace=namespace, timeout=timeout)
            futs.append((n, actor.snapshot.remote()))
        except ValueError:
            out.append({"node": n, "error": "no watchdog sidecar (seat started with --no-watchdog, or down)"})
        except ClusterError as exc:
            out.append({"node": n, "error": str(exc)[:200]})
    for n, f in futs:
        try:
            out.append(json.loads(_rget(f, timeout)))
        except Exception as exc:
            out.append({"node": n, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return sorted(out, key=lambda d: int(d.get("node", 0)))


def local_peers(sidecars: Mapping[int, Sidecar]) -> dict[int, Peers]:
    """In-process peers for tests and single-host tools: node 0 coordinates, everyone reaches everyone."""

    class _Local:
        def __init__(self, me: int) -> None:
            self.me = me

        def request_capture(self, trigger: dict[str, Any]) -> dict[str, Any]:
            coord = sidecars.get(0) or sidecars[self.me]
            return coord.coordinate(trigger)

        def collect(self, capture_id: str, t: float, local: Callable[[], dict[str, Any]]
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            parts = [local()]
            for n, sc in sorted(sidecars.items()):
                if n != self.me:
                    parts.append(json.loads(json.dumps(sc.part(capture_id, t))))
            return parts, []

    return {n: _Local(n) for n in sidecars}
