"""The sampler: finds a node's engine processes by title and keeps a ring of their py-spy stacks.

Every py-spy call runs in its own session under a hard timeout and is SIGKILLed past it; afterwards
the target is checked in ``/proc`` and sent SIGCONT if py-spy left it stopped (only if it was not
stopped before we touched it). Periodic samples use ``--nonblocking``, which never stops the target;
``--native`` (capture time only) has to pause it briefly, hence the check. py-spy missing or denied
yields one warning and an empty sampler; the sidecar keeps running on metrics and probe alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sgl_seat.core.records import EngineProcess, Frame, StackSample, ThreadStack

log = logging.getLogger("sgl_seat.watchdog")

MAIN_MODULES = ("sgl_seat.sim.launch_server", "sglang.launch_server")
TITLE_PREFIX = "sglang::"
SCHEDULER_PREFIX = "sglang::scheduler"
_TITLE_RANK = re.compile(r"_TP(\d+)(?:_|$)")
_DENIED = re.compile(r"permission denied|operation not permitted|os error 1\)|os error 13\)", re.I)
_GONE = re.compile(r"no such process|os error 3\)|process .* not found|failed to open process", re.I)
ENV_PYSPY = "SGL_SEAT_PYSPY"


@dataclass(frozen=True, slots=True)
class EngineProc:
    """A live engine process as discovery found it. ``kind`` is scheduler, detokenizer, main or other."""

    pid: int
    title: str
    rank: int | None
    kind: str
    create_time: float


def rank_of_title(title: str) -> int | None:
    """``sglang::scheduler_TP3_EP3`` -> 3; a scheduler without TP in its title (tp=1) is rank 0."""
    m = _TITLE_RANK.search(title)
    if m:
        return int(m.group(1))
    if title.startswith(SCHEDULER_PREFIX):
        return 0
    return None


def _flag(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def is_main_cmdline(argv: list[str]) -> bool:
    """``python -m sglang.launch_server ...`` / ``-m sgl_seat.sim.launch_server`` / ``sglang serve``."""
    for i, a in enumerate(argv):
        if a == "-m" and i + 1 < len(argv) and argv[i + 1] in MAIN_MODULES:
            return True
        if a.endswith("/sglang") and i + 1 < len(argv) and argv[i + 1] == "serve":
            return True
    return False


def _title_of(proc: psutil.Process) -> str:
    try:
        argv = proc.cmdline()
    except (psutil.Error, OSError):
        return ""
    if argv and argv[0].startswith(TITLE_PREFIX):
        return argv[0].strip()
    return " ".join(argv)[:300]


def _kind(title: str) -> str:
    if title.startswith(SCHEDULER_PREFIX):
        return "scheduler"
    if title.startswith("sglang::detokenizer"):
        return "detokenizer"
    if title.startswith(TITLE_PREFIX):
        return "other"
    return "main"


def find_engine_processes(*, node_rank: int | None = None, port: int | None = None,
                          root_pid: int | None = None) -> list[EngineProc]:
    """Engine processes of one node: main processes (filtered by ``--node-rank`` / ``--port`` when given,
    or the tree under ``root_pid``) and their ``sglang::*`` descendants."""
    mains: list[psutil.Process] = []
    if root_pid is not None:
        try:
            root = psutil.Process(root_pid)
            for p in [root, *root.children(recursive=True)]:
                try:
                    if is_main_cmdline(p.cmdline()):
                        mains.append(p)
                except (psutil.Error, OSError):
                    continue
        except (psutil.Error, OSError):
            return []
    else:
        for p in psutil.process_iter(["cmdline"]):
            argv = p.info.get("cmdline") or []
            if not is_main_cmdline(argv):
                continue
            if node_rank is not None and int(_flag(argv, "--node-rank") or 0) != node_rank:
                continue
            if port is not None and _flag(argv, "--port") != str(port):
                continue
            mains.append(p)
    out: dict[int, EngineProc] = {}
    for m in mains:
        try:
            procs = [m, *m.children(recursive=True)]
        except (psutil.Error, OSError):
            continue
        for p in procs:
            try:
                title = _title_of(p)
                if p is not m and not title.startswith(TITLE_PREFIX):
                    continue
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                out[p.pid] = EngineProc(pid=p.pid, title=title, rank=rank_of_title(title), kind=_kind(title),
                                        create_time=p.create_time())
            except (psutil.Error, OSError):
                continue
    return sorted(out.values(), key=lambda e: (e.kind != "main", e.rank if e.rank is not None else 1 << 20, e.pid))


# --------------------------------------------------------------------------------------------------
# py-spy


def find_pyspy() -> str | None:
    """``$SGL_SEAT_PYSPY``, else the py-spy beside this interpreter (venv), else PATH."""
    env = os.environ.get(ENV_PYSPY)
    if env is not None:
        return env if os.path.isfile(env) and os.access(env, os.X_OK) else None
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def proc_state(pid: int) -> str | None:
    """The one-letter state from /proc/PID/status (``T`` stopped, ``t`` tracing stop), None if gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("State:"):
                    return line.split()[1]
    except OSError:
        return None
    return None


def pid_state(pid: int) -> str | None:
    """The state letter from /proc/PID/stat (one read, no parsing of names), None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read(512)
    except OSError:
        return None
    end = data.rfind(b")")
    return data[end + 2:end + 3].decode("ascii", "replace") if end > 0 else None


def _thread_states(pid: int) -> list[str]:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out = []
    for tid in tids:
        st = proc_state(int(tid)) if tid.isdigit() else None
        if st:
            out.append(st)
    return out


def ensure_not_stopped(pid: int, *, was_stopped: bool, settle_s: float = 0.2) -> bool:
    """After a py-spy call: resume ``pid`` if it (or a thread) is left stopped and was not before.

    Returns True if a SIGCONT was sent. A tracer that died detaches at once; a leftover group stop
    (``T``) needs SIGCONT. We poll briefly because the kernel detaches asynchronously.
    """
    if was_stopped:
        return False
    deadline = time.monotonic() + settle_s
    while True:
        states = _thread_states(pid) or [s for s in [proc_state(pid)] if s]
        if not states:
            return False
        if "T" in states:
            try:
                os.kill(pid, signal.SIGCONT)
                log.warning("pid %d was left stopped after py-spy; sent SIGCONT", pid)
                return True
            except OSError:
                return False
        if "t" not in states or time.monotonic() >= deadline:
            if "t" in states:
                try:
                    os.kill(pid, signal.SIGCONT)
                    return True
                except OSError:
                    return False
            return False
        time.sleep(0.02)


@dataclass(frozen=True, slots=True)
class DumpResult:
    """One py-spy call: parsed threads (py-spy JSON, already typed), or the error."""

    threads: tuple[ThreadStack, ...]
    error: str | None
    duration_s: float
    native: bool
    denied: bool = False
    gone: bool = False
    timed_out: bool = False
    resumed: bool = False


def parse_pyspy_json(doc: Any) -> tuple[ThreadStack, ...]:
    """py-spy ``dump --json`` output -> ThreadStacks (frames innermost first, as py-spy gives them)."""
    if not isinstance(doc, list):
        raise ValueError("py-spy JSON is not a list of threads")
    threads = []
    for th in doc:
        if not isinstance(th, dict):
            continue
        frames = []
        for f in th.get("frames") or []:
            if not isinstance(f, dict):
                continue
            module = f.get("module")
            line = f.get("line")
            frames.append(Frame(
                name=str(f.get("name") or "?"),
                filename=str(f.get("filename") or f.get("short_filename") or "?"),
                line=int(line) if isinstance(line, int) and not isinstance(line, bool) and line > 0 else 0,
                module=str(module) if isinstance(module, str) else None,
                native=isinstance(module, str),
            ))
        tid = th.get("thread_id")
        name = th.get("thread_name")
        threads.append(ThreadStack(
            thread_id=int(tid) if isinstance(tid, int) else 0,
            name=str(name) if isinstance(name, str) else None,
            active=bool(th.get("active")),
            owns_gil=bool(th.get("owns_gil")),
            frames=tuple(frames),
        ))
    return tuple(threads)


def pyspy_dump(pid: int, *, exe: str, native: bool = False, timeout_s: float = 2.0) -> DumpResult:
    """One ``py-spy dump --json`` of ``pid`` under a hard timeout. Never raises for target trouble."""
    argv = [exe, "dump", "--json", "--pid", str(pid)]
    argv.append("--native" if native else "--nonblocking")
    was_stopped = proc_state(pid) in ("T", "t")
    t0 = time.monotonic()
    timed_out = False
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        return DumpResult((), f"cannot run py-spy: {exc}", 0.0, native, denied=isinstance(exc, PermissionError))
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: py-spy and anything it started
        proc.kill()
        try:
            out, err = proc.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
    dur = time.monotonic() - t0
    resumed = ensure_not_stopped(pid, was_stopped=was_stopped) if (native or timed_out) else False
    if timed_out:
        return DumpResult((), f"py-spy timed out after {timeout_s:g}s", dur, native, timed_out=True, resumed=resumed)
    text = err.decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        msg = text.splitlines()[-1] if text else f"py-spy exited with {proc.returncode}"
        gone = bool(_GONE.search(text)) or not psutil.pid_exists(pid)
        return DumpResult((), msg[:500], dur, native, denied=bool(_DENIED.search(text)) and not gone, gone=gone,
                          resumed=resumed)
    try:
        threads = parse_pyspy_json(json.loads(out.decode("utf-8", "replace")))
    except (ValueError, UnicodeDecodeError) as exc:
        return DumpResult((), f"unreadable py-spy output: {exc}", dur, native, resumed=resumed)
    return DumpResult(threads, None, dur, native, resumed=resumed)


def capture_stacks(pid: int, *, exe: str | None, timeout_s: float = 5.0) -> tuple[DumpResult, DumpResult | None]:
    """Capture-time dumps: ``--native`` first, then Python-only (``--nonblocking``) as well.

    Both are kept: native stacks show where a thread sits in C (the driver, NCCL, a sleep), the
    Python one is the cheap, always-available view. A failed native dump leaves the Python one.
    """
    if exe is None:
        missing = DumpResult((), "py-spy not found", 0.0, False)
        return missing, None
    py = pyspy_dump(pid, exe=exe, native=False, timeout_s=timeout_s)
    if py.gone:
        return py, None
    nat = pyspy_dump(pid, exe=exe, native=True, timeout_s=timeout_s)
    return py, nat


# --------------------------------------------------------------------------------------------------
# The sampler


class Sampler:
    """Discovers engine processes, tracks liveness, samples stacks at ``sample_hz`` into a ring."""

    def __init__(
        self,
        *,
        node: int,
        sample_hz: float = 1.0,
        history_s: float = 120.0,
        discover: Callable[[], list[EngineProc]] | None = None,
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
        self._discover = discover or (lambda: find_engine_processes(node_rank=node))
        self._clock = clock
        self.pyspy: str | None = find_pyspy() if pyspy is True else (pyspy or None)
        self._lock = threading.Lock()
        self._ring: deque[StackSample] = deque(maxlen=max(64, int(history_s * sample_hz * 16) + 64))
        self._known: dict[int, EngineProc] = {}
        self._dead: dict[int, EngineProcess] = {}
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
            self._warn("py-spy was not found (set SGL_SEAT_PYSPY or install py-spy): stack sampling is off; "
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
                                            exit_code=None, gone_t=now)
        log.warning("node %d: engine process %d (%s) is gone", self.node, pid, ep.title)
        return True

    def check_liveness(self) -> bool:
        """The fast path (every few tens of ms): a known process whose /proc entry is gone or a zombie is dead.
        True if one died. Cheap enough to run often, so a cascade of deaths is ordered finely."""
        now = self._clock()
        with self._lock:
            pids = list(self._known)
        died = False
        for pid in pids:
            if pid_state(pid) in (None, "Z", "X"):
                died = self._mark_dead(pid, now) or died
        return died

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

    def live(self) -> list[EngineProc]:
        with self._lock:
            return list(self._known.values())

    def processes(self) -> list[EngineProcess]:
        """Every engine process seen in this generation: alive ones and those that went away."""
        with self._lock:
            alive = [EngineProcess(node=self.node, pid=e.pid, title=e.title, rank=e.rank, alive=True)
                     for e in self._known.values()]
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
            if ep.kind != "scheduler":
                # Schedulers every round; the main process and the detokenizer (context, not detection) less often.
                if now - self._last_other.get(ep.pid, float("-inf")) < self.others_every_s:
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
                                 native=False, threads=res.threads, error=res.error)
            self.samples_taken += 1
            self._push(sample)
            out.append(sample)
        return out

    def _push(self, sample: StackSample) -> None:
        with self._lock:
            self._ring.append(sample)
            cutoff = sample.t - self.history_s
            while self._ring and self._ring[0].t < cutoff:
                self._ring.popleft()
        cb = self.on_sample
        if cb is not None:
            with contextlib.suppress(Exception):  # a metrics hook must not stop sampling
                cb(sample)

    def add_samples(self, samples: Iterable[StackSample]) -> None:
        for s in samples:
            self._push(s)

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
