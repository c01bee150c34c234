"""A node's main process: start the children, wait for them, watch them, and tear the tree down like SGLang.

What SGLang does and the sim copies (contracts section 5):

- launch: start the local schedulers (and, on node 0, the detokenizer); wait until every one reports ready.
  A child that fails during launch takes the node down with its message and a non-zero exit.
- running: a child that dies (a crash fault, an OOM, anything) is noticed within a second
  (``SubprocessWatchdog``): the main process SIGQUITs itself; a scheduler whose watchdog fires, or whose
  collective fails because a peer died, SIGQUITs its parent. SIGQUIT kills every descendant, then the main
  process itself (``kill_process_tree``). SGLang's 60 s wait for CUDA coredumps is skipped: there is no GPU.
- SIGTERM: node 0 stops serving, broadcasts shutdown to every rank through rank 0, waits for its children and
  exits 0. A node >= 1 only logs, waiting for that broadcast, as SGLang does, but gives up after
  ``NODE_SIGTERM_WAIT_S`` and tears down (a second SIGTERM tears down at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Generator
from typing import Any

import uvicorn

from sgl_seat.sim import contract, simlog
from sgl_seat.sim.args import TORCH_DEFAULT_TIMEOUT_S, SimConfig
from sgl_seat.sim.proctree import Child, kill_process_tree, spawn
from sgl_seat.sim.wire import Channel, ChannelClosed, Message

IMPORT_ALLOWANCE_S = 90.0  # children import torch before they can rendezvous
NODE_SIGTERM_WAIT_S = 30.0
CHILD_POLL_S = 1.0


class LaunchError(Exception):
    """The node could not start; the message says why."""


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal capture: the node owns SIGTERM/SIGINT/SIGQUIT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def make_server(app: Any) -> QuietServer:
    config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=3, loop="asyncio")
    return QuietServer(config)


class NodeRuntime:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.log = simlog.get()
        self.children: list[Child] = []
        self.sched: dict[int, Child] = {}
        self.ctl: dict[int, Channel] = {}
        self.detok: Child | None = None
        self.detok_out: Channel | None = None
        self.ready: dict[int, dict[str, Any]] = {}
        self.stats: dict[str, Any] = {}
        self.phase = "launch"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pending: dict[str, asyncio.Future[Message]] = {}
        self.servers: list[QuietServer] = []
        self.on_out: Callable[[Message], None] | None = None
        self.on_stats: Callable[[Message], None] | None = None
        self._sigterm_count = 0
        self.startup_time = time.time()

    # --- launch -------------------------------------------------------------------------------------------
    def install_signals(self) -> None:
        signal.signal(signal.SIGQUIT, self._on_sigquit)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigterm)

    def spawn_children(self) -> None:
        cfg = self.cfg
        base = cfg.to_json()
        to_detok: tuple[socket.socket, socket.socket] | None = None
        if cfg.node_rank == 0:
            to_detok = socket.socketpair()
        for r in cfg.local_tp_ranks():
            title = contract.scheduler_title(r, cfg.ep_rank_of(r), cfg.tp_size, cfg.ep_size)
            direct = {"out": to_detok[0]} if (r == 0 and to_detok is not None) else None
            # The watchdog's probe labels its ring with these (it can also read the rank from the title).
            rank_env = {"SGLSEAT_RANK": str(r), "SGLSEAT_NODE_RANK": str(cfg.node_rank)}
            child = spawn("scheduler", title, {**base, "extra": {"tp_rank": r}}, ["ctl"], direct, rank_env)
            self.children.append(child)
            self.sched[r] = child
            self.ctl[r] = Channel(child.socks["ctl"])
        if to_detok is not None:
            self.detok = spawn("detokenizer", contract.DETOKENIZER_TITLE, base, ["out"], {"in": to_detok[1]})
            self.children.append(self.detok)
            self.detok_out = Channel(self.detok.socks["out"])

    def wait_ready(self) -> None:
        cfg = self.cfg
        budget = float(cfg.dist_timeout or TORCH_DEFAULT_TIMEOUT_S) + IMPORT_ALLOWANCE_S
        deadline = time.monotonic() + budget
        waiting = dict(self.ctl)
        by_sock = {ch.sock: r for r, ch in waiting.items()}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LaunchError(
                    f"ranks {sorted(waiting)} were not ready within {budget:.0f} s "
                    f"(--dist-timeout {cfg.dist_timeout} + {IMPORT_ALLOWANCE_S:.0f} s to start)"
                )
            readable, _, _ = select.select([ch.sock for ch in waiting.values()], [], [], min(0.5, left))
            for sock in readable:
                r = by_sock[sock]
                try:
                    msg = waiting[r].recv()
                except ChannelClosed:
                    raise LaunchError(self._exit_note(self.sched[r])) from None
                if msg.get("t") == "ready":
                    self.ready[r] = msg
                    del waiting[r]
                elif msg.get("t") == "fatal":
                    raise LaunchError(str(msg.get("message")))
            for child in self.children:
                if child.proc.poll() is not None:
                    raise LaunchError(self._exit_note(child))

    def _exit_note(self, child: Child) -> str:
        try:
            code = child.proc.wait(timeout=2)
        except Exception:
            code = None
        return f"{child.name} (pid={child.pid}) exited during launch with code {code}"

    def fail_launch(self, message: str) -> int:
        self.log.error(f"sim engine failed to start on node_rank {self.cfg.node_rank}: {message}")
        self.phase = "stopping"
        kill_process_tree(os.getpid(), include_parent=False)
        return 1

    # --- running ------------------------------------------------------------------------------------------
    def start_threads(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.phase = "running"
        for r, ch in self.ctl.items():
            threading.Thread(target=self._ctl_reader, args=(r, ch), name=f"ctl-{r}", daemon=True).start()
        if self.detok_out is not None:
            threading.Thread(target=self._out_reader, args=(self.detok_out,), name="detok", daemon=True).start()
        threading.Thread(target=self._child_watchdog, name="subprocess-watchdog", daemon=True).start()

    def _ctl_reader(self, rank: int, ch: Channel) -> None:
        assert self.loop is not None
        while True:
            try:
                msg = ch.recv()
            except ChannelClosed:
                return
            self.loop.call_soon_threadsafe(self._dispatch, rank, msg)

    def _out_reader(self, ch: Channel) -> None:
        assert self.loop is not None
        while True:
            try:
                msg = ch.recv()
            except ChannelClosed:
                return
            if self.on_out is not None:
                self.loop.call_soon_threadsafe(self.on_out, msg)

    def _dispatch(self, rank: int, msg: Message) -> None:
        mid = msg.get("id")
        if mid is not None and mid in self.pending:
            fut = self.pending.pop(mid)
            if not fut.done():
                fut.set_result(msg)
            return
        if msg.get("t") == "stats":
            self.stats = msg
            if self.on_stats is not None:
                self.on_stats(msg)
        elif msg.get("t") == "fatal":
            self.log.error(f"rank {rank}: {msg.get('message')}")

    async def ask(self, rank: int, msg: Message, timeout: float) -> Message:
        """Send ``msg`` to a local rank's control channel and wait for its answer."""
        assert self.loop is not None
        mid = uuid.uuid4().hex
        fut: asyncio.Future[Message] = self.loop.create_future()
        self.pending[mid] = fut
        try:
            self.ctl[rank].send({**msg, "id": mid})
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.pending.pop(mid, None)

    def send(self, rank: int, msg: Message) -> None:
        self.ctl[rank].send(msg)

    def _child_watchdog(self) -> None:
        while self.phase == "running":
            time.sleep(CHILD_POLL_S)
            if self.phase != "running":
                return
            exited = [(c, c.proc.poll()) for c in self.children]
            dead = [(c, code) for c, code in exited if code is not None]
            if not dead:
                continue
            scheds = [c for c in self.children if c is not self.detok]
            if (self.cfg.node_rank > 0 and all(code == 0 for _, code in dead)
                    and all(c.proc.poll() is not None for c in scheds)):
                self.log.info(f"node_rank {self.cfg.node_rank}: schedulers stopped by the rank-0 shutdown; exiting")
                self.request_stop()
                return
            if self.cfg.node_rank > 0 and all(code == 0 for _, code in dead):
                continue  # the others are stopping too; look again
            child, code = dead[0]
            self.log.error(contract.log_subprocess_crashed(child.name, child.pid, code))
            os.kill(os.getpid(), signal.SIGQUIT)
            return

    # --- stopping -----------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        self.phase = "stopping"
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._stop_servers)

    def _stop_servers(self) -> None:
        for s in self.servers:
            s.should_exit = True

    def finish_stop(self) -> int:
        """After the servers stopped: ask the ranks to stop (node 0), wait for the children, exit code."""
        self.phase = "stopping"
        if self.cfg.node_rank == 0 and 0 in self.ctl:
            with contextlib.suppress(ChannelClosed):
                self.ctl[0].send({"t": "shutdown"})
        deadline = time.monotonic() + 15.0
        for c in self.children:
            with contextlib.suppress(Exception):
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        alive = [c for c in self.children if c.proc.poll() is None]
        if alive:
            self.log.warning(f"children still alive after shutdown: {[c.name for c in alive]}; killing them")
            kill_process_tree(os.getpid(), include_parent=False)
        return 0

    def teardown(self) -> None:
        self.phase = "stopping"
        kill_process_tree(os.getpid())

    def _on_sigquit(self, signum: int, frame: object) -> None:
        if self.cfg.node_rank == 0 and self.phase == "running":
            self.log.error(contract.log_running_sigquit(signum))
        else:
            self.log.error(contract.LOG_LAUNCH_SIGQUIT)
        self.teardown()

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self._sigterm_count += 1
        if self.phase == "launch":
            self.log.warning(f"signal {signum} during launch; tearing down")
            self.phase = "stopping"
            kill_process_tree(os.getpid(), include_parent=False)
            os._exit(128 + signum)
        if self.cfg.node_rank == 0:
            if self._sigterm_count > 1:
                self.teardown()
            self.log.warning(f"SIGTERM received. signum={signum}, frame=None. Draining requests and shutting down...")
            self.request_stop()
            return
        if self._sigterm_count > 1:
            self.teardown()
        self.log.warning(contract.log_node_sigterm(self.cfg.node_rank))
        timer = threading.Timer(NODE_SIGTERM_WAIT_S, self._sigterm_timeout)
        timer.daemon = True
        timer.start()

    def _sigterm_timeout(self) -> None:
        if self.phase == "running":
            self.log.error(f"no shutdown broadcast from rank 0 within {NODE_SIGTERM_WAIT_S:.0f} s; tearing down")
            self.teardown()
