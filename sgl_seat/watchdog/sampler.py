"""The sampler: a node's engine processes, their liveness, and a ring of their py-spy stacks.

It discovers the engine processes (:mod:`sgl_seat.watchdog.procfind`), checks their ``/proc`` entries
often so a death is timed finely, and samples every scheduler with ``py-spy dump --nonblocking``
(:mod:`sgl_seat.watchdog.pyspy`) at ``sample_hz`` into a time-pruned ring, each sample with the process's
``/proc`` state read just before its dump (``T``: stopped). py-spy missing or denied yields
one warning and an empty sampler; the sidecar keeps running on metrics and probe alone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

import psutil

from sgl_seat.core.records import EngineProcess, StackSample
from sgl_seat.procstate import pid_state
from sgl_seat.watchdog.procfind import EngineProc
from sgl_seat.watchdog.pyspy import find_pyspy, pyspy_dump

log = logging.getLogger("sgl_seat.watchdog")
#: Seconds between two reads of the schedulers' socket ports (see Sampler._read_ports); a few ms a read.
PORTS_EVERY_S = 10.0
#: ... and while a scheduler has none yet (its collective connects during start-up).
PORTS_UNREAD_EVERY_S = 2.0


class Sampler:
    """Discovers engine processes, tracks liveness, samples stacks at ``sample_hz`` into a ring."""

    def __init__(
        self,
        *,
        node: int,
        sample_hz: float = 1.0,
        history_s: float = 120.0,
        discover: Callable[[], list[EngineProc]],
        pyspy: str | bool | None = True,
        timeout_s: float = 2.0,
        rediscover_s: float = 2.0,
        others_every_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.sample_hz = sample_hz
        self.history_s = history_s
        self.timeout_s = timeout_s
        self.rediscover_s = rediscover_s
        self._discover = discover
        self._clock = clock
        self.pyspy: str | None = find_pyspy() if pyspy is True else (pyspy or None)
        self._lock = threading.Lock()
        self._ring: deque[StackSample] = deque(maxlen=max(64, int(history_s * sample_hz * 16) + 64))
        self._known: dict[int, EngineProc] = {}
        self._dead: dict[int, EngineProcess] = {}
        #: pid -> when its run of state-T reads began (check_liveness), and when the states were last read.
        self._stopped: dict[int, float] = {}
        self._state_t: float | None = None
        self._ports: dict[int, tuple[int, ...]] = {}  # scheduler pid -> its sockets' local TCP ports
        self._last_ports = float("-inf")
        self._last_discover = float("-inf")
        self._last_other: dict[int, float] = {}
        self.others_every_s = others_every_s
        self._denied_streak = 0
        self._disabled_until = float("-inf")
        self.state = "ok" if self.pyspy else "py-spy not found"
        self.warnings: list[str] = []
        self.samples_taken = 0
        self.errors = 0
        self.resumed = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_sample: Callable[[StackSample], None] | None = None
        if not self.pyspy:
            self._warn("py-spy was not found (set SGLSEAT_PYSPY or install py-spy): stack sampling is off; "
                       "the watchdog keeps running on metrics and the probe")

    # ---- processes

    def _warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)
            log.warning("node %d sampler: %s", self.node, msg)

    def _mark_dead(self, pid: int, now: float) -> bool:
        with self._lock:
            ep = self._known.pop(pid, None)
            if ep is None:
                return False
            self._dead[pid] = EngineProcess(node=self.node, pid=pid, title=ep.title, rank=ep.rank, alive=False,
                                            exit_code=None, gone_t=now, ports=self._ports.pop(pid, ()))
        log.warning("node %d: engine process %d (%s) is gone", self.node, pid, ep.title)
        return True

    def check_liveness(self) -> bool:
        """The fast path (every few tens of ms): a known process whose /proc entry is gone or a zombie is dead.
        True if one died. Cheap enough to run often, so a cascade of deaths is ordered finely. The same read
        times a stop: when each process entered state ``T`` in the run of reads that lasts to now."""
        now = self._clock()
        with self._lock:
            pids = list(self._known)
        died = False
        stopped: dict[int, float] = {}
        for pid in pids:
            st = pid_state(pid)
            if st in (None, "Z", "X"):
                died = self._mark_dead(pid, now) or died
            elif st == "T":
                stopped[pid] = self._stopped.get(pid, now)
        with self._lock:
            self._stopped = stopped
            self._state_t = now
        return died

    def stopped(self) -> dict[int, float]:
        """pid -> since when it has been stopped (state T in every read since), as of the latest read."""
        with self._lock:
            return dict(self._stopped)

    def refresh(self, *, force: bool = False) -> None:
        """Liveness of known processes every call; rediscovery every ``rediscover_s``."""
        now = self._clock()
        with self._lock:
            known = dict(self._known)
        for pid, ep in known.items():
            alive = False
            try:
                p = psutil.Process(pid)
                alive = abs(p.create_time() - ep.create_time) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
            except (psutil.Error, OSError):
                alive = False
            if not alive:
                self._mark_dead(pid, now)
        if force or now - self._last_discover >= self.rediscover_s or not known:
            self._last_discover = now
            try:
                found = self._discover()
            except Exception as exc:
                self._warn(f"process discovery failed: {exc}")
                found = []
            with self._lock:
                fresh = [e for e in found if e.pid not in self._known and e.pid not in self._dead]
                if fresh and any(e.kind == "main" for e in fresh) and not self._known and self._dead:
                    # A new engine generation (restart): the old, dead one no longer counts.
                    self._dead.clear()
                for e in found:
                    if e.pid not in self._dead:
                        self._known[e.pid] = e
        with self._lock:
            unread = any(e.rank is not None and e.pid not in self._ports for e in self._known.values())
        if now - self._last_ports >= (PORTS_UNREAD_EVERY_S if unread else PORTS_EVERY_S):
            self._last_ports = now
            self._read_ports()

    def _read_ports(self) -> None:
        """Each live scheduler's sockets' local TCP ports: when a rank dies, its peers' collective errors name it
        by one of these ("Connection closed by peer [ip]:port"), which names the dead rank in the engine's own
        words where polling cannot order deaths across nodes. A collective's connections are made at start-up
        and kept, so a snapshot every PORTS_EVERY_S is current when a rank dies."""
        with self._lock:
            scheds = [e for e in self._known.values() if e.rank is not None]
        got: dict[int, tuple[int, ...]] = {}
        for e in scheds:
            try:
                conns = psutil.Process(e.pid).net_connections(kind="tcp")
            except (psutil.Error, OSError):
                continue
            got[e.pid] = tuple(sorted({c.laddr.port for c in conns if c.laddr}))
        with self._lock:
            for pid, ports in got.items():
                if pid in self._known and ports:
                    self._ports[pid] = ports

    def live(self) -> list[EngineProc]:
        with self._lock:
            return list(self._known.values())

    def processes(self) -> list[EngineProcess]:
        """Every engine process seen in this generation: alive ones and those that went away."""
        with self._lock:
            alive = [EngineProcess(node=self.node, pid=e.pid, title=e.title, rank=e.rank, alive=True,
                                   ports=self._ports.get(e.pid, ()), stopped_since=self._stopped.get(e.pid),
                                   state_t=self._state_t) for e in self._known.values()]
            return sorted([*alive, *self._dead.values()], key=lambda p: p.pid)

    def forget_dead(self) -> None:
        with self._lock:
            self._dead.clear()

    # ---- sampling

    def sample_once(self) -> list[StackSample]:
        """One round: a nonblocking dump of every live engine process."""
        self.refresh()
        now = self._clock()
        if not self.pyspy or now < self._disabled_until:
            return []
        out: list[StackSample] = []
        for ep in self.live():
            state = pid_state(ep.pid)  # just before the dump: a stopped process may still be read, unchanged
            if ep.kind != "scheduler":
                # Schedulers every round; the main process and the detokenizer (context, not detection) less often,
                # except while stopped (SIGSTOP): then every round, so the stopped-process detector sees it soon.
                if state != "T" and now - self._last_other.get(ep.pid, float("-inf")) < self.others_every_s:
                    continue
                self._last_other[ep.pid] = now
            res = pyspy_dump(ep.pid, exe=self.pyspy, native=False, timeout_s=self.timeout_s)
            if res.resumed:
                self.resumed += 1
            if res.denied:
                self._denied_streak += 1
                if self._denied_streak >= 3:
                    self.state = "py-spy denied"
                    self._disabled_until = now + 60.0
                    self._warn(f"py-spy may not attach to engine processes ({res.error}); stack sampling is off "
                               "(run as the engine's user or grant CAP_SYS_PTRACE); retrying every 60 s")
                    self.errors += 1
                    return out
            else:
                self._denied_streak = 0
                if self.state == "py-spy denied" and res.error is None:
                    self.state = "ok"
            if res.error is not None:
                self.errors += 1
                if res.gone:
                    self.refresh(force=False)
            sample = StackSample(t=self._clock(), node=self.node, pid=ep.pid, title=ep.title, rank=ep.rank,
                                 native=False, threads=res.threads, error=res.error, state=state)
            self.samples_taken += 1
            self._push(sample)
            out.append(sample)
        return out

    def _push(self, sample: StackSample, *, notify: bool = True) -> None:
        with self._lock:
            self._ring.append(sample)
            cutoff = sample.t - self.history_s
            while self._ring and self._ring[0].t < cutoff:
                self._ring.popleft()
        cb = self.on_sample if notify else None
        if cb is not None:
            with contextlib.suppress(Exception):  # a metrics hook must not stop sampling
                cb(sample)

    def add_samples(self, samples: Iterable[StackSample], *, notify: bool = True) -> None:
        """Into the ring, each passed to ``on_sample`` unless ``notify`` is False (a history taken by another
        process, which is neither counted again nor spooled again)."""
        for s in samples:
            self._push(s, notify=notify)

    def samples(self, since: float | None = None) -> list[StackSample]:
        with self._lock:
            return [s for s in self._ring if since is None or s.t >= since]

    # ---- the background loop

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"sgl-seat-sampler-{self.node}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout)
        self._thread = None

    def _run(self) -> None:
        period = 1.0 / self.sample_hz
        nxt = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # the loop must survive anything a target does
                self.errors += 1
                self._warn(f"sampling round failed: {type(exc).__name__}: {exc}")
            nxt += period
            delay = nxt - time.monotonic()
            if delay < 0:
                nxt = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)
