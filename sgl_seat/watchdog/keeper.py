"""A node's watchdog when its Ray raylet dies: a small process outside Ray that the sidecar starts and stops.

Why: the sidecar is a Ray actor, and a Ray worker exits as soon as its raylet is gone, so a node whose raylet was
killed wrote no bundle of its own (issue 24: "there is no partial bundle from host b"), and its sampling stopped
while its engines, outside Ray (``launch/host/enginehost.py``), served on. The keeper runs in a session of its own
(``start_new_session``), so it outlives the raylet and its workers. It watches the raylet's pid (with its create
time) and the sidecar's; it keeps the node's engine process table (which engines are still alive, which went
when), and:

- the raylet gone: it takes the sidecar's place at once: a :class:`~sgl_seat.watchdog.sidecar.Sidecar` of its own,
  without peers (nothing of Ray is left to reach them), on the sidecar's exporter port, its history the samples the
  sidecar spooled to this directory as it took them (:mod:`sgl_seat.watchdog.spool`), so sampling, detection and
  local captures go on; its exporter says ``sgl_seat_watchdog_keeper_watching 1``. Then it captures this node
  alone (the engines' stacks where they still run, their process table, the engine log's tail, the probe rings'
  records, the node's own links) into a partial bundle, ``node-isolated`` naming this node with "its Ray raylet is
  gone" as its own evidence. It watches on until the stop file, SIGTERM, or no engine process of its node has
  been alive for ``ENGINES_GONE_S``;
- the sidecar gone with the raylet alive (the sidecar stopped, killed by `down`, or it crashed): it exits quietly,
  its directory removed;
- a stop file in its directory (the sidecar's :meth:`stop`, or `down --local`): it exits quietly.

It never signals a process; everything it reads is this node's. Run: ``python -m sgl_seat.watchdog.keeper DIR``,
with ``DIR/keeper.json`` written by :func:`start_keeper`.

Its directory: ``keeper.json`` (``{"schema_version": 1, "config": SidecarConfig, "raylet": {"pid", "create_time"},
"sidecar": {...}}``), ``pid`` (the keeper's pid, a bare integer), ``stop``, ``keeper.log``, the sidecar's spool
(:mod:`sgl_seat.watchdog.spool`) and, once it captured, ``result.json`` (``{"schema_version": 1, ...}``: the
capture's result, ``path`` or ``error``, for the operator). ``schema_version`` is :data:`KEEPER_SCHEMA_VERSION`; a
``keeper.json`` of another version is refused (FormatVersionError), one without it (the release before) is version 1.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sgl_seat.core.isolation import SelfCheck
from sgl_seat.core.nodeloss import node_isolated
from sgl_seat.core.records import StackSample
from sgl_seat.errors import FormatVersionError
from sgl_seat.watchdog import capture as cap
from sgl_seat.watchdog import selfcheck
from sgl_seat.watchdog.config import SidecarConfig
from sgl_seat.watchdog.procfind import find_engine_processes
from sgl_seat.watchdog.sampler import Sampler
from sgl_seat.watchdog.sidecar import Sidecar
from sgl_seat.watchdog.sources import LogTailer, ProbeReader
from sgl_seat.watchdog.spool import CURRENT as SPOOL_CURRENT
from sgl_seat.watchdog.spool import HEADER as SPOOL_HEADER
from sgl_seat.watchdog.spool import PREVIOUS as SPOOL_PREVIOUS
from sgl_seat.watchdog.spool import SampleSpool

log = logging.getLogger("sgl_seat.watchdog.keeper")

#: Seconds between two looks at the raylet, the sidecar and the stop file (and a refresh of the engine table).
POLL_S = 0.1
STOP = "stop"
CONFIG = "keeper.json"
RESULT = "result.json"
#: A bare integer, not a versioned document: it has no layout to change, and a ``down --local`` of either release
#: must read the pid of the other's keeper to stop it (it checks the pid's command line names the directory).
PID = "pid"
#: The layout of CONFIG and RESULT; only a change that older readers cannot read bumps it.
KEEPER_SCHEMA_VERSION = 1
#: Seconds with no engine process of its node alive after which a keeper that took over stops watching (the seat was
#: taken down by pid, or its engines died and were captured).
ENGINES_GONE_S = 5.0
#: Seconds the keeper tries to bind the sidecar's exporter port: the dying actor may hold it for a moment.
BIND_WAIT_S = 10.0


@dataclass(frozen=True)
class Watched:
    """A process by pid and create time (a pid alone can be reused)."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> Watched:
        return cls(pid, psutil.Process(pid).create_time())

    def alive(self) -> bool:
        try:
            p = psutil.Process(self.pid)
            return abs(p.create_time() - self.create_time) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "create_time": self.create_time}


def start_keeper(cfg: SidecarConfig, directory: Path, *, raylet: Watched, sidecar: Watched,
                 timeout: float = 10.0) -> Watched:
    """Write ``directory/keeper.json`` and start the keeper in a session of its own, not as a child of the caller.

    Why not a child: when a Ray worker exits (as it does when its raylet dies), Ray kills the worker's child
    processes, whatever their session (measured on the two-namespace cluster: a keeper started as the sidecar
    actor's child died with it, and so do the engines of the node agent's). So the keeper forks once more and its
    first process exits: the keeper's parent is then init (or the host's subreaper), and Ray has no child to kill.
    Returns the keeper's pid and create time (read from ``directory/pid``)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in (STOP, PID):
        (directory / name).unlink(missing_ok=True)
    (directory / CONFIG).write_text(json.dumps({"schema_version": KEEPER_SCHEMA_VERSION,
                                                "config": json.loads(cfg.to_json()), "raylet": raylet.to_json(),
                                                "sidecar": sidecar.to_json()}))
    with (directory / "keeper.log").open("ab") as out:
        first = subprocess.Popen([sys.executable, "-m", "sgl_seat.watchdog.keeper", "--detach", str(directory)],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
    first.wait(timeout=timeout)  # it exits as soon as the keeper is forked and has written its pid
    pid = int((directory / PID).read_text())
    return Watched.of(pid)


def stop_keeper(keeper: Watched | None, directory: Path, timeout: float = 5.0) -> None:
    """The sidecar's stop: the stop file, then wait for the keeper (it looks every POLL_S), then end it by pid."""
    with contextlib.suppress(OSError):
        (directory / STOP).touch()
    if keeper is not None:
        deadline = time.monotonic() + timeout
        while keeper.alive() and time.monotonic() < deadline:
            time.sleep(POLL_S / 2)
        if keeper.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(keeper.pid, signal.SIGKILL)
    shutil.rmtree(directory, ignore_errors=True)


def read_config(directory: Path) -> dict[str, Any]:
    """``directory/keeper.json`` as written by :func:`start_keeper`; FormatVersionError for another version."""
    path = directory / CONFIG
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON object")
    FormatVersionError.check(path, doc, KEEPER_SCHEMA_VERSION,
                             fix="the sidecar that wrote it runs another sgl-seat version than this one (sgl-seat "
                                 "changed under a running seat): stop that keeper with the sgl-seat that started it, "
                                 "or by the pid in its directory, and bring the seat up again with one version")
    return doc


def keeper_dir(seat: str, node: int, sidecar_pid: int) -> Path:
    """Where the sidecar of ``node`` (its pid) keeps its keeper's files (the config, the pid, the log)."""
    return Path(tempfile.gettempdir()) / f"sgl-seat-keeper-{seat}-{node}-{sidecar_pid}"


def stop_local_keepers(seat: str, nodes: set[int], timeout: float = 5.0) -> list[int]:
    """`down --local`: stop the keepers of ``seat``'s ``nodes`` on this host (their sidecars are out of reach), by
    the pid each one's directory holds, once its command line names that directory; returns the pids stopped."""
    stopped = []
    for d in sorted(Path(tempfile.gettempdir()).glob(f"sgl-seat-keeper-{seat}-*")):
        try:
            cfg = read_config(d)["config"]
            if cfg.get("seat") != seat or int(cfg["node"]) not in nodes:
                continue
            pid = int((d / PID).read_text())
            if str(d) not in psutil.Process(pid).cmdline():
                continue  # not this directory's keeper (a reused pid)
            w = Watched.of(pid)
        except FormatVersionError as exc:
            log.warning("a keeper left running: %s", exc)  # not signalled by what this sgl-seat cannot read
            continue
        except (OSError, ValueError, KeyError, TypeError, psutil.Error):
            continue  # gone already (a keeper that captured removes its config)
        stop_keeper(w, d, timeout)
        stopped.append(pid)
    return stopped


def _sampler(cfg: SidecarConfig) -> Sampler:
    if cfg.root_pid is not None:
        root = cfg.root_pid
        return Sampler(node=cfg.node, discover=lambda: find_engine_processes(cfg.words, root_pid=root),
                       pyspy=cfg.pyspy or True)
    node, port = cfg.node, cfg.engine_port
    return Sampler(node=cfg.node, discover=lambda: find_engine_processes(cfg.words, node_rank=node, port=port),
                   pyspy=cfg.pyspy or True)  # never started: its process table and py-spy's path only


def capture_alone(cfg: SidecarConfig, sampler: Sampler, why: str, now: float,
                  samples: Sequence[StackSample] = ()) -> dict[str, Any]:
    """This node's partial bundle, its verdict ``node-isolated`` (``why``: the evidence), the others missing;
    ``samples``: the stack history it carries (the sidecar's spooled samples, and the keeper's since)."""
    sampler.refresh(force=True)
    probes = ProbeReader(cfg.probe_dir, node=cfg.node) if cfg.probe_dir else None
    if probes is not None:
        probes.read({p.pid: p.rank for p in sampler.processes()}, now)
    logs = LogTailer(cfg.log_path, node=cfg.node, from_start=True)
    logs.poll(now)
    check = SelfCheck(node=cfg.node, t=now, links=selfcheck.read_links(cfg.interfaces),
                      rdma=selfcheck.read_rdma(), peers=cfg.nnodes - 1, control=why)
    part = cap.node_part(node=cfg.node, procs=sampler.live(), pyspy=sampler.pyspy, samples=list(samples),
                         probes=probes.records() if probes else [], metrics=[], logs=logs.lines(),
                         processes=sampler.processes(), log_text=logs.tail_text(), env={}, gpu=cfg.gpu,
                         dump_timeout_s=2.0, native_deadline=now + cap.NATIVE_BY_S)
    part["self_check"] = check.to_json()
    verdict = node_isolated(cfg.node, check, cfg.rank_nodes, now)
    missing = [{"node": n, "step": "reach", "status": "not asked",
                "detail": f"node {cfg.node}'s Ray raylet is gone: the keeper captured this node alone"}
               for n in range(cfg.nnodes) if n != cfg.node]
    res = cap.assemble(seat=cfg.seat, parts=[part],
                       trigger={"t": now, "source": "keeper", "node": cfg.node, "kind": verdict.kind.value,
                                "rank": None},
                       trigger_verdict=verdict, thresholds=cfg.watchdog, rank_nodes=cfg.rank_nodes, plan=cfg.plan,
                       dest_root=Path(cfg.bundle_dir), quota_mb=cfg.quota_mb, missing=missing, words=cfg.words)
    return res.to_json()


def take_over(cfg: SidecarConfig, history: Sequence[StackSample] = (), *,
              bind_wait_s: float = BIND_WAIT_S) -> Sidecar:
    """This node's watchdog in the sidecar's place: no peers (the raylet is gone, and with it every Ray call), the
    same exporter port (retried while the dying actor still holds it), the sidecar's spooled samples as the start
    of its history (not counted again as samples taken), started."""
    core = Sidecar(cfg, peers=None, bind_wait_s=bind_wait_s)
    core.sampler.add_samples(history, notify=False)
    core.exporter.keeper_watching.set(1)
    core.start()
    return core


def run(directory: Path) -> int:
    doc = read_config(directory)
    cfg = SidecarConfig.from_json(json.dumps(doc["config"]))
    raylet = Watched(int(doc["raylet"]["pid"]), float(doc["raylet"]["create_time"]))
    sidecar = Watched(int(doc["sidecar"]["pid"]), float(doc["sidecar"]["create_time"]))
    sampler = _sampler(cfg)
    log.info("node %d keeper: watching raylet pid %d and sidecar pid %d", cfg.node, raylet.pid, sidecar.pid)
    while True:
        if (directory / STOP).exists():
            log.info("node %d keeper: stopped by its sidecar", cfg.node)
            return 0
        if not raylet.alive():
            break
        if not sidecar.alive():
            log.info("node %d keeper: the sidecar is gone with its raylet alive: nothing to capture", cfg.node)
            shutil.rmtree(directory, ignore_errors=True)  # its spool and config: nobody reads them any more
            return 0
        sampler.refresh()
        time.sleep(POLL_S)
    now = time.time()
    why = f"its Ray raylet (pid {raylet.pid}) is gone"
    log.warning("node %d keeper: %s; watching in the sidecar's place, and capturing this node alone", cfg.node, why)
    term = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: term.set())
    try:
        history = SampleSpool(directory).read(since=now - cfg.watchdog.history_s)
    except FormatVersionError as exc:  # its history begins at the takeover: the capture matters more than it
        log.warning("node %d keeper: the sidecar's samples are not read: %s", cfg.node, exc)
        history = []
    core = take_over(cfg, history)
    log.warning("node %d keeper: watching (exporter %s:%s), %d of the sidecar's samples as its history (the last "
                "%.1f s before the raylet went)", cfg.node, core.exporter.addr, core.exporter.port, len(history),
                now - max((x.t for x in history), default=now))
    try:
        faulthandler.dump_traceback_later(15.0, repeat=True)  # a capture that hangs says where, in keeper.log
        # The capture's process table is the one the keeper kept while the raylet lived (which engines went with it,
        # when); its stack dumps run beside the new sampler's, as every sidecar's capture runs beside its sampling.
        res = capture_alone(cfg, sampler, why, now, samples=core.sampler.samples())
        faulthandler.cancel_dump_traceback_later()
        (directory / RESULT).write_text(json.dumps({"schema_version": KEEPER_SCHEMA_VERSION, **res}))
        log.warning("node %d keeper: %s", cfg.node, res.get("path") or res.get("error"))
        gone_since: float | None = None
        while not term.is_set() and not (directory / STOP).exists():
            if core.sampler.live():
                gone_since = None
            elif gone_since is None:
                gone_since = time.monotonic()
            elif time.monotonic() - gone_since >= ENGINES_GONE_S:
                log.warning("node %d keeper: no engine process left for %.0f s; done", cfg.node, ENGINES_GONE_S)
                break
            term.wait(POLL_S)
        log.info("node %d keeper: stopped watching", cfg.node)
    finally:
        core.stop()
        # The seat's plan and its stacks: not left in a temporary directory (result.json and keeper.log stay).
        for name in (CONFIG, SPOOL_HEADER, SPOOL_CURRENT, SPOOL_PREVIOUS):
            (directory / name).unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    detach = args[:1] == ["--detach"]
    if detach:
        args = args[1:]
    if len(args) != 1:
        print("usage: python -m sgl_seat.watchdog.keeper [--detach] DIR", file=sys.stderr)
        return 2
    directory = Path(args[0])
    if detach:  # see start_keeper: the first process writes the keeper's pid and exits, the keeper goes on
        pid = os.fork()
        if pid:
            (directory / f".{PID}").write_text(str(pid))
            os.replace(directory / f".{PID}", directory / PID)
            os._exit(0)
    try:
        return run(directory)
    except FormatVersionError as exc:  # its words, not a traceback, in keeper.log
        log.error("%s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
