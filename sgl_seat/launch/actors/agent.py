"""The node agent: one detached Ray actor per bundle that owns its node's engine.

Only data crosses into and out of it: the plan arrives as a JSON string (``LaunchPlan.to_json``)
and every answer is a JSON string, so nothing sgl-seat defines is pickled between processes. The
class is plain Python (wrapped with ``ray.remote`` by the driver), so it imports without Ray and
its logic is testable on its own. Ray is imported lazily, only for the node's address and GPU ids.

What it does on its node: resolves its address, runs the preflight checks its engine backend asks
for, starts the engine for its node rank in a new process group with the plan's environment and
``CUDA_VISIBLE_DEVICES`` set from Ray's GPU ids, writes the engine's output to
``$SGLSEAT_HOME/logs/<seat>/node<r>.log``, reports the engine's processes and exit, hands out log
tails and new log bytes, and kills the process group on request.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sgl_seat import envcompat
from sgl_seat.engines import backend_for, preflight, preflight_facts
from sgl_seat.engines.preflight import Check, Failure
from sgl_seat.launch.host import processgroups
from sgl_seat.launch.seatrecord.home import host_id, logs_dir, seat_home
from sgl_seat.niceness import restore_raylet_niceness
from sgl_seat.plan import LaunchPlan, NodePlan, Placeholder
from sgl_seat.probe.writer import ENV_RANK_TITLE
from sgl_seat.procstate import state_name
from sgl_seat.watchdog import boot_dir
from sgl_seat.watchdog.config import metrics_port_for

LOG_SCAN_BYTES = 4 << 20
#: A scheduler found gone this long before its engine's launcher exited went first (SGLang's launcher exits
#: seconds after a scheduler dies); within it, both went at once (the process group killed together).
LOST_BEFORE_EXIT_S = 1.0


def tail_lines(path: Path, n: int, *, max_bytes: int = 1 << 20) -> list[str]:
    """The last ``n`` lines of a file (reads at most ``max_bytes`` from its end)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-n:] if n > 0 else []


def engine_env(node: NodePlan, base: dict[str, str], gpu_ids: list[str], *, rank_title: str = "") -> dict[str, str]:
    """The engine's environment: the agent's, then the plan's per-node env, then Ray's GPUs explicitly.

    ``rank_title``: the engine's rank process title at one rank (its backend's words), for the probe, which reads a
    process's rank from its title and names no engine itself (``probe.writer.ENV_RANK_TITLE``).

    Ray sets ``CUDA_VISIBLE_DEVICES`` in the actor's own environment, but whether it does depends
    on flags that changed across Ray versions (``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO``,
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``), so the mapping is written out here.

    An engine whose interpreter is a path gets that interpreter's directory first on ``PATH``, as an activated
    environment has it: SGLang runs tools of its environment by name (its own watchdog's crash diagnostics run
    ``py-spy dump``; without this it found none in the engine's own ``.venv-sglang/bin``).
    """
    env = dict(base)
    env.update(node.env_dict())
    python = node.command[0] if node.command else ""
    if os.sep in python and "PATH" not in node.env_dict():
        bindir = os.path.dirname(python)
        parts = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]
        env["PATH"] = os.pathsep.join([bindir, *parts])
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if rank_title:
        env.setdefault(ENV_RANK_TITLE, rank_title)
    return env


class NodeAgent:
    """Runs on bundle ``node_rank``; methods take and return JSON strings (see the module doc)."""

    def __init__(self, seat: str, node_rank: int, engine: str, driver_home: str | None = None,
                 driver_host: str | None = None) -> None:
        self.seat = seat
        self.node_rank = node_rank
        self.backend = backend_for(engine)
        # On the driver's own host the log goes under the driver's $SGLSEAT_HOME (tests give each
        # run its own home); on another host the node's own home is used.
        home = Path(driver_home) if driver_home and driver_host == host_id() else seat_home()
        self.log_path = logs_dir(seat, home) / f"node{node_rank}.log"
        # ${request_log_dir}: SGLang's request log (node 0, --log-requests-target), read by the watchdog.
        self.request_log_dir = self.log_path.parent / "requests"
        # ${seat_files}: the plan's files (the draft policy's adaptive tiers), written before the engine reads them.
        self.files_dir = self.log_path.parent / "files" / f"node{node_rank}"
        self.proc: processgroups.HostedEngine | None = None
        self.node: NodePlan | None = None
        self.known: dict[int, float] = {}
        self.rank_pids: dict[str, tuple[int, float]] = {}
        #: Scheduler title -> when its process was first found gone (:meth:`_note_lost_ranks`).
        self.rank_lost_at: dict[str, float] = {}
        self.kv_tokens: int | None = None
        self.started_at: float | None = None
        self.exited_at: float | None = None
        self.rehearsal = False

    # -- facts ------------------------------------------------------------------------------

    @staticmethod
    def _gpu_ids() -> list[str]:
        import ray

        ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
        return [str(i) for i in ids]

    def node_info(self) -> str:
        import ray

        node_ip: Callable[[], str] = ray.util.get_node_ip_address  # unannotated in Ray
        return json.dumps({
            "node_rank": self.node_rank,
            "ip": node_ip(),
            "hostname": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "host_id": host_id(),
            "python": sys.executable,
            "pid": os.getpid(),
            "gpu_ids": self._gpu_ids(),
            "log_path": str(self.log_path),
        })

    # -- preflight ----------------------------------------------------------------------------

    def _node_of(self, plan_json: str) -> tuple[LaunchPlan, NodePlan]:
        plan = LaunchPlan.from_json(json.loads(plan_json))
        # ${watchdog_boot}: this node's directory of the probe loader (sgl_seat.watchdog.boot_dir, issue 5).
        plan = plan.fill({Placeholder.AGENT_PYTHON: sys.executable, Placeholder.WATCHDOG_BOOT: boot_dir(),
                          Placeholder.REQUEST_LOG_DIR: str(self.request_log_dir),
                          Placeholder.ENGINE_VENV: self.backend.engine_venv(),
                          Placeholder.SEAT_FILES: str(self.files_dir)})
        self._write_files(plan)
        return plan, plan.nodes[self.node_rank]

    def _write_files(self, plan: LaunchPlan) -> None:
        """The plan's files in ``${seat_files}``, each replaced whole (a temp file and a rename): an engine that
        reads one sees this plan's text or the last one's, never half of it."""
        if not plan.files:
            return
        self.files_dir.mkdir(parents=True, exist_ok=True)
        for name, text in plan.files:
            if "/" in name or name.startswith("."):
                raise RuntimeError(f"node {self.node_rank}: plan file name {name!r} is not a plain name")
            tmp = self.files_dir / f".{name}.{os.getpid()}.tmp"
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.files_dir / name)

    def preflight(self, plan_json: str, exporter_addr: str | None = None) -> str:
        """Every local check that applies to this node's engine, and, with ``exporter_addr`` (the watchdog on), that
        its sidecar's metrics exporter port is free there; a JSON list of failures."""
        plan, node = self._node_of(plan_json)
        found = self.local_checks(plan, node, self._gpu_ids())
        metrics = metrics_port_for(plan.http_port, self.node_rank) if exporter_addr else 0
        if exporter_addr and metrics:
            found += preflight.check_ports_free(self.node_rank, {preflight.EXPORTER_PORT: metrics},
                                                {metrics: preflight_facts.port_holder(metrics, exporter_addr)})
        return json.dumps([f.to_dict() for f in found])

    def local_checks(self, plan: LaunchPlan, node: NodePlan, gpu_ids: list[str]) -> list[Failure]:
        """The engine backend's checks on this host, with the environment the engine will start with."""
        found = self.backend.local_checks(plan, node, gpus=plan.topology.gpus_per_node, gpu_ids=gpu_ids,
                                          env={**os.environ, **node.env_dict()})
        if node.host is not None and node.expect_interfaces:
            found += preflight.check_host_interfaces(self.node_rank, node.host, node.expect_interfaces,
                                                     preflight_facts.interfaces())
        return found

    def check_dist_init(self, addr: str, port: int, timeout: float) -> str:
        """From a rank >= 1 node: can node 0's dist-init port be reached (TCP, with a timeout)?"""
        if Check.DIST_INIT_REACHABLE not in self.backend.checks:
            return "[]"
        err = preflight_facts.wait_connectable(addr, port, time.monotonic() + timeout)
        return json.dumps([f.to_dict() for f in preflight.check_dist_init_reachable(self.node_rank, addr, port, err)])

    # -- the engine ---------------------------------------------------------------------------

    def start_engine(self, plan_json: str) -> str:
        """Start this node's engine in its own process group; returns pid, pgid, log path and argv."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"node {self.node_rank}: an engine is already running (pid {self.proc.pid})")
        plan, node = self._node_of(plan_json)
        self.rehearsal = plan.rehearsal
        left = [p.value for p in Placeholder if any(p.value in a for a in (*node.command, *dict(node.env).values()))]
        if left:
            raise RuntimeError(f"node {self.node_rank}: plan still has placeholders {left}")
        env = engine_env(node, dict(os.environ), self._gpu_ids(), rank_title=self.backend.words.rank_title)
        if str(self.request_log_dir) in node.command:  # request text may land there: owner only
            self.request_log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.request_log_dir, 0o700)
        self.node = node
        self.kv_tokens = None
        self.known.clear()
        self.rank_pids.clear()
        self.rank_lost_at.clear()
        self._forget_rehearsal_faults(node)
        # Through an engine host, not as this worker's child: Ray kills a worker's children when the worker exits,
        # and every worker of a node exits once its raylet is gone; the engine must go on serving (issue 24).
        self.proc = processgroups.spawn_hosted(node.command, env, self.log_path,
                                       self.log_path.parent / ".engines" / f"node{self.node_rank}")
        # The engine inherits this Ray worker's niceness (Ray adds 15): give it the raylet's (sgl_seat.niceness).
        nice, nice_note = restore_raylet_niceness(self.proc.pid)
        self.started_at = time.time()
        self.exited_at = None
        threading.Thread(target=self._watch, args=(self.proc,), name="engine-watch", daemon=True).start()
        return json.dumps({"pid": self.proc.pid, "pgid": self.proc.pid, "log_path": str(self.log_path),
                           "argv": list(node.command), "cuda_visible_devices": env["CUDA_VISIBLE_DEVICES"],
                           "niceness": nice, "niceness_note": nice_note})

    def _watch(self, proc: processgroups.HostedEngine) -> None:
        """Note when the engine exits, so the first node to die can be told from those that followed.

        Polls instead of ``wait()``: a thread blocked in ``wait()`` makes every other ``poll()`` answer None.
        """
        tick = 0
        while proc.poll() is None:
            time.sleep(0.05)
            tick += 1
            if tick % 5 == 0 and proc is self.proc:
                self._note_lost_ranks()
        if proc is self.proc and self.exited_at is None:
            self.exited_at = time.time()

    def _note_lost_ranks(self) -> None:
        """When each seen scheduler process vanished (checked every 0.25 s): on a real SGLang node a dead
        scheduler takes its launcher and, within seconds, the other nodes with it, and the rank that went
        first is the one to name."""
        now = time.time()
        for title, (pid, ctime) in list(self.rank_pids.items()):
            if title not in self.rank_lost_at and processgroups.find(pid, ctime) is None:
                self.rank_lost_at[title] = now

    def _scan_kv(self) -> int | None:
        if self.kv_tokens is None:
            try:
                with self.log_path.open("rb") as fh:
                    text = fh.read(LOG_SCAN_BYTES).decode("utf-8", errors="replace")
            except OSError:
                return None
            self.kv_tokens = self.backend.parse_kv_tokens(text)
        return self.kv_tokens

    def state(self) -> dict[str, Any]:
        """The engine as it is now (a dict; :meth:`engine_state` is its JSON)."""
        if self.proc is None:
            return {"node_rank": self.node_rank, "started": False, "alive": False, "log_path": str(self.log_path),
                    "request_log_dir": str(self.request_log_dir)}
        rc = self.proc.poll()
        pgid = self.proc.pid
        live = processgroups.members(pgid, [self.proc.pid], self.known.items())
        infos = [i for i in (processgroups.info(p) for p in live) if i is not None]
        for i in infos:
            self.known[i.pid] = i.create_time
            if self.backend.words.is_engine_title(i.title):
                self.rank_pids.setdefault(i.title, (i.pid, i.create_time))
        live_pids = {i.pid for i in infos}
        ranks = []
        lost = []
        for r in self.node.ranks if self.node else ():
            seen = self.rank_pids.get(r.process_title)
            alive = seen is not None and seen[0] in live_pids
            if seen is not None and not alive:
                lost.append(f"{r.process_title} (pid {seen[0]})")
            ranks.append({"tp_rank": r.tp_rank, "ep_rank": r.ep_rank, "title": r.process_title,
                          "pid": seen[0] if seen else None, "alive": alive,
                          "state": state_name(seen[0]) if alive and seen else ("gone" if seen else None)})
        reason = None
        gone = f"scheduler process gone: {', '.join(lost)}" if lost else ""
        if rc is not None:
            exit_text = f"engine (pid {self.proc.pid}) {processgroups.describe_exit(rc)}"
            first_lost = min(self.rank_lost_at.values(), default=None)
            exit_t = self.exited_at if self.exited_at is not None else time.time()  # see exit_at below
            if gone and first_lost is not None and first_lost < exit_t - LOST_BEFORE_EXIT_S:
                reason = f"node {self.node_rank}: {gone}; then its {exit_text}"
            else:
                reason = f"node {self.node_rank} {exit_text}"
        elif lost:
            reason = f"node {self.node_rank}: {gone}"
        dead = reason is not None
        # This call's poll may reap the exit before the watch thread stamps it: then the exit is now.
        exit_at = self.exited_at if self.exited_at is not None or rc is None else time.time()
        went_at = min([*self.rank_lost_at.values(), *([exit_at] if exit_at is not None else [])], default=None)
        return {
            "node_rank": self.node_rank,
            "started": True,
            "pid": self.proc.pid,
            "pgid": pgid,
            "alive": not dead,
            "all_ranks_seen": all(r["pid"] is not None for r in ranks),
            "returncode": rc,
            "reason": reason,
            "processes": [i.to_dict() for i in infos],
            "ranks": ranks,
            "log_path": str(self.log_path),
            "request_log_dir": str(self.request_log_dir),
            "kv_tokens": self._scan_kv(),
            "log_tail": tail_lines(self.log_path, 40) if dead else [],
            "started_at": self.started_at,
            # When this node first went: a scheduler found gone, or the engine's exit (the seat's ordering).
            "exited_at": went_at if dead else None,
        }

    def engine_state(self) -> str:
        return json.dumps(self.state())

    def wait_listening(self, addr: str, port: int, timeout: float) -> str:
        """Node 0: wait until the engine listens on ``port`` (its backend's startup port); stop early if it dies."""
        deadline = time.monotonic() + timeout
        err: str | None = "not tried"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return json.dumps({"error": "the engine exited before listening", **self.state()})
            err = preflight_facts.tcp_connect(addr, port, 1.0)
            if err is None:
                return json.dumps({"error": None})
            time.sleep(0.2)
        return json.dumps({"error": f"nothing listens on {addr}:{port} after {timeout:.0f} s ({err})"})

    def kill_engine(self, timeout: float = 10.0) -> str:
        """SIGTERM the engine's process group, SIGKILL after ``timeout``, verify; JSON with survivors."""
        if self.proc is None:
            return json.dumps({"survivors": [], "returncode": None})
        self.state()  # refresh the known pids before they disappear
        survivors = processgroups.kill_group(self.proc.pid, [self.proc.pid], self.known.items(), timeout=timeout)
        # Its own parent (the engine host) reaps it and writes how it ended, within milliseconds.
        rc = self.proc.wait(2.0) if not survivors else self.proc.poll()
        return json.dumps({"survivors": [s.to_dict() for s in survivors], "returncode": rc})

    def survivors(self) -> str:
        """What of the engine's group is still alive (down's final check on this node)."""
        if self.proc is None:
            return "[]"
        live = processgroups.members(self.proc.pid, [self.proc.pid], self.known.items())
        return json.dumps([i.to_dict() for i in (processgroups.info(p) for p in live) if i is not None])

    # -- rehearsal faults (launch/rehearse.py) ------------------------------------------------------

    @staticmethod
    def _forget_rehearsal_faults(node: NodePlan) -> None:
        """A new engine starts with no run-time fault armed: the probe's control file lives in the node's probe
        directory, which outlives a seat (a stall armed on the last one, never cleared because its engine died
        first, stalled this one's first forward: its start-up hung). Faults given at start come from the plan."""
        directory = envcompat.lookup(node.env_dict(), "SGLSEAT_PROBE_DIR")
        if directory:
            from sgl_seat.probe.fault import CONTROL_FILE

            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, CONTROL_FILE))

    def rehearse(self, action_json: str) -> str:
        """One rehearsal fault on this node; refused unless the plan is a rehearsal's. JSON in, JSON out.

        ``{"probe": TEXT | null, "id": ID}`` arms (or, with null, clears) a probe stall through the probe's control
        file in this node's probe directory (every probed process of the node reads it; the fault's own ``rank``
        picks which stalls). ``{"signal": "STOP" | "CONT" | "KILL", "title": T}`` sends the signal to this
        engine's process titled ``T`` (found in its own process group, by pid and create time: never by name
        across the host).
        """
        import signal as _signal

        a = json.loads(action_json)
        if self.proc is None or self.node is None:
            return json.dumps({"error": f"node {self.node_rank}: no engine started"})
        if not self.rehearsal:
            return json.dumps({"error": f"node {self.node_rank}: the seat is not a rehearsal (rehearsal: true)"})
        if "probe" in a:
            from sgl_seat.probe.fault import write_control

            directory = envcompat.lookup(self.node.env_dict(), "SGLSEAT_PROBE_DIR")
            if not directory:
                return json.dumps({"error": f"node {self.node_rank}: no probe in this engine (SGLSEAT_PROBE_DIR)"})
            try:
                path = write_control(directory, a["probe"], fault_id=str(a.get("id", "")))
            except (OSError, ValueError) as exc:
                return json.dumps({"error": f"node {self.node_rank}: {exc}"})
            return json.dumps({"error": None, "path": str(path) if path else None, "t": time.time()})
        sig = {"STOP": _signal.SIGSTOP, "CONT": _signal.SIGCONT, "KILL": _signal.SIGKILL}.get(str(a.get("signal")))
        if sig is None:
            return json.dumps({"error": f"unknown action {a!r}"})
        title = str(a.get("title", ""))
        found = [p for p in self.state().get("processes", []) if p["title"] == title]
        if not found:
            return json.dumps({"error": f"node {self.node_rank}: no live engine process titled {title!r}"})
        target = processgroups.find(found[0]["pid"], found[0]["create_time"])
        if target is None:
            return json.dumps({"error": f"node {self.node_rank}: {title} (pid {found[0]['pid']}) is gone"})
        t = time.time()
        target.send_signal(sig)
        return json.dumps({"error": None, "pid": target.pid, "title": title, "t": t})

    # -- logs ---------------------------------------------------------------------------------

    def log_tail(self, n: int = 100) -> str:
        """The last ``n`` lines and the log's size (where ``read_log`` continues from)."""
        try:
            size = self.log_path.stat().st_size
        except OSError:
            size = 0
        return json.dumps({"path": str(self.log_path), "lines": tail_lines(self.log_path, n), "size": size})

    def read_log(self, offset: int, max_bytes: int = 1 << 16) -> str:
        """Whole new lines from ``offset`` (for ``logs -f``) and the offset to ask from next time.

        Stops at the last newline so a line (or a UTF-8 character) is never cut in two across calls.
        """
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                if offset > size:  # the log was restarted
                    offset = 0
                fh.seek(offset)
                data = fh.read(max_bytes)
        except OSError:
            return json.dumps({"data": "", "offset": offset})
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < max_bytes:
            data = b""  # an unfinished line: wait for the rest
        elif cut > 0:
            data = data[:cut]
        return json.dumps({"data": data.decode("utf-8", errors="replace"), "offset": offset + len(data)})
