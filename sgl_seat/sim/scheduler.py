"""One scheduler rank (``sglang::scheduler_TP{r}_EP{e}``): rendezvous, then lockstep steps with every rank.

Why it is built this way: a real multi-node hang looks like one rank stuck in a host-side operation while
every other rank waits inside a collective. So every step here does what a TP rank does, for real:

1. rank 0 decides the step (continuous batching in :mod:`sgl_seat.sim.step.batch`) and broadcasts an 8-int
   header to all ranks (``torch.distributed.broadcast``, gloo; SGLang broadcasts the requests likewise);
2. every rank gathers rows of its host table through ``rowfetch.fetch_rows`` (gather size = requests x
   positions per request), where an injected stall waits;
3. every rank sleeps to the modelled end of the step (wall time is the cost model);
4. every rank joins an ``all_reduce`` (the MoE/TP reduction), so one late rank holds everyone here.

With ``--device cuda`` (:mod:`sgl_seat.sim.step.device`) the same steps run on GPUs: NCCL instead of gloo, the
rows copied from a pinned host table to the rank's GPU, a matmul on them, and a device sync after the
all-reduce; a ``gpu-stall`` fault stalls the fetch on the GPU stream while the host thread runs on.

Rank 0 then turns the step into tokens, sends them to the detokenizer and logs SGLang's lines. Each rank
runs SGLang's watchdog on its forward count. Idle, rank 0 still broadcasts an idle header every tick so the
others block in the collective (no busy waiting) well inside ``--dist-timeout``.

One module of about 500 lines on purpose: it is one process, the :class:`Scheduler`, whose step phases
share that rank's state and the lockstep protocol above; the batching, cost model, row fetch and faults it
drives already live in their own modules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore  # torch.distributed's own name for it, without a typed re-export

from sgl_seat.sim import contract, rowfetch, simlog
from sgl_seat.sim.args import ENV_PROBE, TORCH_DEFAULT_TIMEOUT_S, SimConfig
from sgl_seat.sim.faults import GPU_STALL, Fault, FaultState, parse_fault
from sgl_seat.sim.graphs import SimGraphRunner
from sgl_seat.sim.step import tokens
from sgl_seat.sim.step.adaptive import AdaptivePolicy
from sgl_seat.sim.step.batch import DECODE, EXTEND, IDLE, SHUTDOWN, Batcher, Req, StepPlan
from sgl_seat.sim.step.costmodel import KV_BYTES_PER_TOKEN, SYNTHETIC_AVAILABLE_GB, CostModel, SpecShape
from sgl_seat.sim.step.device import CUDA, CudaRank
from sgl_seat.sim.wire import Channel, ChannelClosed, Message

HEADER_LEN = 8  # kind, step_no, n_running, gather, seed, step_us, n_queue, reserved
MAX_GATHER = 2048  # prefill gathers are capped so a long prompt does not copy hundreds of MB per rank
STATS_EVERY_S = 0.5
LONG_PROMPT_HASH = 20_000  # prompt tokens in one prefill from which their hashes are computed beside the step


class RendezvousError(Exception):
    """The ranks could not meet at --dist-init-addr within --dist-timeout."""


def _listen_fd(host: str, port: int) -> int:
    """A socket listening on ``host:port`` only, handed over (fd) to rank 0's TCPStore, which owns it then."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock.detach()


def _maybe_install_probe() -> None:
    """The watchdog's probe wraps ``rowfetch.fetch_rows`` when ``SGLSEAT_PROBE`` is set."""
    if not os.environ.get(ENV_PROBE):
        return
    try:
        importlib.import_module("sgl_seat.probe").install_from_env()
    except Exception as e:  # a missing or broken probe must not take the engine down
        simlog.get().warning(f"{ENV_PROBE} is set but the probe could not be installed: {type(e).__name__}: {e}")


class Scheduler:
    def __init__(self, cfg: SimConfig, tp_rank: int, ctl: Channel, out: Channel | None, parent_pid: int) -> None:
        self.cfg = cfg
        self.tp_rank = tp_rank
        self.ep_rank = cfg.ep_rank_of(tp_rank)
        self.ctl = ctl
        self.out = out
        self.parent_pid = parent_pid
        self.log = simlog.get()
        self.forward_ct = 0
        self.active = False
        self.n_running = 0
        self.started = time.monotonic()
        self.faults = FaultState(rank=tp_rank)
        self._fault_lock = threading.Lock()
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.spec = (
            SpecShape(
                algorithm=cfg.speculative_algorithm or "",
                num_steps=cfg.speculative_num_steps or 0,
                eagle_topk=cfg.speculative_eagle_topk or 1,
                num_draft_tokens=cfg.speculative_num_draft_tokens or 1,
                accept_rate=cfg.accept_rate,
            )
            if cfg.spec_on
            else None
        )
        self.cost = CostModel(floor_ms=cfg.floor_ms, prefill_token_ms=cfg.prefill_token_ms,
                              draft_cost=cfg.draft_cost)
        adaptive = (AdaptivePolicy.load(cfg.speculative_adaptive_config, cfg.speculative_num_steps or 0)
                    if cfg.speculative_adaptive and self.spec is not None else None)
        self.batcher = Batcher(
            capacity=cfg.kv_tokens, max_running=cfg.max_running_requests, cost=self.cost, spec=self.spec,
            flip_near_ties=cfg.flip_near_ties, disable_radix=cfg.disable_radix_cache, adaptive=adaptive,
        )
        self.table = torch.empty(0)
        self.header = torch.zeros(HEADER_LEN, dtype=torch.int64)
        self.red = torch.zeros(8, dtype=torch.float32)
        self.gpu: CudaRank | None = None  # --device cuda: this rank's GPU (sgl_seat.sim.step.device)
        self.graphs: SimGraphRunner | None = None  # --sim-cuda-graphs: decode replays CUDA graphs (sim.graphs)
        # A gpu-stall that fell on an eager step (a prefill) in graph mode: it waits for the next replayed graph.
        self._graph_stall: tuple[Fault, float | None] | None = None
        self._hdr_dev = self.header
        # Rank 0's log and gauge bookkeeping.
        self._decode_ct = 0
        self._last_log_t = time.monotonic()
        self._last_log_tokens = 0
        self._last_spec = (0, 0, 0, 0)
        self._last_gen_throughput = 0.0
        self._last_stats_t = 0.0
        self._last_prefill_t = time.monotonic()
        self._timeline: float | None = None

    # --- start-up -------------------------------------------------------------------------------------------
    def run(self) -> int:
        _maybe_install_probe()
        torch.set_num_threads(1)
        if self.cfg.device == CUDA:
            try:  # before NCCL starts: the rank's GPU; CUDA is initialised before the first probed fetch
                self.gpu = CudaRank(self.tp_rank, self.cfg.ranks_per_node)
            except Exception as e:
                msg = f"--device cuda on rank {self.tp_rank}: {type(e).__name__}: {e}"
                self.log.error(msg)
                self._send_ctl({"t": "fatal", "rank": self.tp_rank, "message": msg})
                return 1
            self.red = self.red.to(self.gpu.device)
            self._hdr_dev = self.header.to(self.gpu.device)
        try:
            self._rendezvous()
        except RendezvousError as e:
            self.log.error(str(e))
            self._send_ctl({"t": "fatal", "rank": self.tp_rank, "message": str(e)})
            return 1
        self.table = rowfetch.make_table(self.cfg.table_rows, seed=self.tp_rank)
        if self.gpu is not None:
            self.table = rowfetch.pin_table(self.table)
            rowfetch.use_cuda(self.gpu.device, self.gpu.cycles_per_s, min(MAX_GATHER, self.cfg.table_rows))
            if self.cfg.cuda_graphs:
                draft = self.cfg.speculative_num_draft_tokens if self.cfg.spec_on else None
                self.graphs = SimGraphRunner(self.gpu, self.table, max_bs=self.cfg.max_running_requests,
                                             draft_tokens=draft)
                self.log.info(f"sim CUDA graphs on rank {self.tp_rank}: captured bs {self.graphs.capture_bs} x "
                              f"{self.graphs.captured_req_width} tokens per request; host-table read: "
                              f"{self.graphs.host_read}")
        cfg = self.cfg
        kv_gb = cfg.kv_tokens * KV_BYTES_PER_TOKEN / 1e9
        self.log.info(contract.log_kv_allocated(cfg.kv_tokens, kv_gb))
        if self.tp_rank == 0 and "adaptive_disabled" in cfg.extra:
            self.log.warning(f"speculative_adaptive disabled: {cfg.extra['adaptive_disabled']}. "
                             "Falling back to static speculative params.")
        if self.tp_rank == 0 and cfg.draft_cost != 1.0 and self.spec is not None:
            self.log.warning(f"sim-only: the draft's costs are scaled by {cfg.draft_cost:g} (SGLSEAT_SIM_DRAFT_COST);"
                             " no real seat has this knob")
        if self.tp_rank == 0:
            self.log.info(contract.log_tp0_summary(
                cfg.kv_tokens, cfg.chunked_prefill_size, cfg.chunked_prefill_size * 2, cfg.max_running_requests,
                cfg.context_length, self.available_gb(),
            ))
        now = time.monotonic()
        for spec in cfg.faults:
            if self.faults.arm(parse_fault(spec), now):
                self.log.warning(f"sim fault armed on rank {self.tp_rank}: {spec}")
        threading.Thread(target=self._ctl_reader, name="sim-ctl", daemon=True).start()
        threading.Thread(target=self._watchdog, name="sim-watchdog", daemon=True).start()
        self._send_ctl({"t": "ready", "rank": self.tp_rank, "pid": os.getpid(), **self.init_info()})
        try:
            self._loop()
        except Exception:
            # As SGLang's run_scheduler_process: the whole traceback, on the prefixed line and the lines after it
            # (the real engine's error, e.g. gloo's peer error, is its last line: detect.py reads it from there).
            self.log.error(contract.log_scheduler_exception(traceback.format_exc().rstrip("\n")))
            self._sigquit_parent()
            return 1
        with contextlib.suppress(Exception):  # best effort at shutdown
            dist.destroy_process_group()
        return 0

    def available_gb(self) -> float:
        return SYNTHETIC_AVAILABLE_GB

    def init_info(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "status": "ready",
            "max_total_num_tokens": cfg.kv_tokens,
            "max_req_input_len": cfg.context_length - 1,
            "startup_time": time.time(),
            "kv_cache_gb": round(cfg.kv_tokens * KV_BYTES_PER_TOKEN / 1e9, 3),
            "available_gb": self.available_gb(),
        }

    def _rendezvous(self) -> None:
        cfg = self.cfg
        addr = cfg.dist_init_addr
        assert addr is not None
        host, _, port_s = addr.rpartition(":")
        host = host.strip("[]")
        port = int(port_s)
        timeout_s = float(cfg.dist_timeout or TORCH_DEFAULT_TIMEOUT_S)
        deadline = time.monotonic() + timeout_s
        flag = f"--dist-timeout {cfg.dist_timeout}" if cfg.dist_timeout else f"torch's default {timeout_s:.0f} s"
        # A hard deadline, whatever torch's own retries do.
        timer = threading.Timer(timeout_s + 1.0, self._rendezvous_deadline, args=(addr, timeout_s, flag))
        timer.daemon = True
        timer.start()
        if self.tp_rank != 0:
            last_err = ""
            while True:
                try:
                    socket.create_connection((host, port), timeout=min(2.0, timeout_s)).close()
                    break
                except OSError as e:
                    last_err = str(e)
                if time.monotonic() >= deadline:
                    timer.cancel()
                    raise RendezvousError(
                        f"rendezvous failed: could not reach the dist-init address {addr} within {flag} "
                        f"({last_err}); check that node 0 is up and that {addr} is reachable from this node"
                    )
                time.sleep(0.2)
        try:
            timeout = datetime.timedelta(seconds=max(1.0, deadline - time.monotonic()))
            # Rank 0 hosts the store on a socket bound to the --dist-init-addr host only: torch's own
            # ``tcp://`` rendezvous would listen on every interface (``::``).
            listen_fd = _listen_fd(host, port) if self.tp_rank == 0 else None
            store = TCPStore(host, port, world_size=cfg.tp_size, is_master=self.tp_rank == 0, timeout=timeout,
                             master_listen_fd=listen_fd)
            dist.init_process_group(backend="nccl" if self.gpu is not None else "gloo", store=store,
                                    world_size=cfg.tp_size, rank=self.tp_rank, timeout=timeout)
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RendezvousError(
                f"rendezvous failed at tcp://{addr} (rank {self.tp_rank} of {cfg.tp_size}, {flag}): {first}"
            ) from None
        finally:
            timer.cancel()

    def _rendezvous_deadline(self, addr: str, timeout_s: float, flag: str) -> None:
        msg = (f"rendezvous failed: the {self.cfg.tp_size} ranks did not all meet at {addr} within {flag}; "
               "check that every node was started with the same --dist-init-addr and --nnodes")
        self.log.error(msg)
        self._send_ctl({"t": "fatal", "rank": self.tp_rank, "message": msg})
        os._exit(1)

    # --- the lockstep loop ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        tick = 0.5 if self.cfg.dist_timeout is None else min(0.5, self.cfg.dist_timeout / 4)
        while True:
            plan: StepPlan | None = None
            if self.tp_rank == 0:
                kind, plan = self._next_plan(tick)
                self._fill_header(kind, plan)
            if self.gpu is None:
                dist.broadcast(self.header, src=0)
            else:  # NCCL broadcasts device tensors; the copy back waits for it
                self._hdr_dev.copy_(self.header)
                dist.broadcast(self._hdr_dev, src=0)
                self.header.copy_(self._hdr_dev)
            kind = int(self.header[0])
            if kind == SHUTDOWN:
                return
            if kind == IDLE:
                self.active = False
                self.n_running = 0
                if self.tp_rank == 0:
                    self._maybe_stats()
                continue
            self.active = True
            self.n_running = int(self.header[2])
            hashing = self._hash_prompts(plan) if plan is not None else None
            self._step(gather=int(self.header[3]), seed=int(self.header[4]), step_s=int(self.header[5]) / 1e6,
                       decode_bs=self.n_running if kind == DECODE else 0)
            if hashing is not None:
                hashing.join()
            self.forward_ct += 1
            if self.tp_rank == 0 and plan is not None:
                self._finish(plan)

    def _hash_prompts(self, plan: StepPlan) -> threading.Thread | None:
        """Long prompts' context hashes, computed in a thread beside the step's modelled forward, not after it.

        Why: hashing a 400k-token prompt is seconds of Python; done after the step it kept rank 0 out of the
        lockstep while its peers waited in the next broadcast, the very shape of a lagging rank, and the watchdog
        soak's long prefills raised false bundles on this sim artifact (SGLang does its per-token work in the
        tokenizer process and on the GPU, not in the scheduler between steps).
        """
        todo = [r for r in plan.reqs if r.prompt_h is None]
        if plan.kind != EXTEND or sum(len(r.input_ids) for r in todo) < LONG_PROMPT_HASH:
            return None

        def work() -> None:
            for r in todo:
                r.prompt_h = tokens.context_hash(r.input_ids)

        th = threading.Thread(target=work, name="sim-prompt-hash", daemon=True)
        th.start()
        return th

    def _fill_header(self, kind: int, plan: StepPlan | None) -> None:
        h = self.header
        h.zero_()
        h[0] = kind
        if plan is None:
            self._timeline = None
            return
        h[1] = plan.step_no
        h[2] = len(plan.reqs)
        h[3] = min(plan.gather, MAX_GATHER, self.cfg.table_rows)
        h[4] = plan.step_no * 7919 + 17
        h[5] = int(self._step_budget_s(plan.step_ms / 1000.0) * 1e6)
        h[6] = len(self.batcher.waiting)

    def _step_budget_s(self, step_s: float) -> float:
        """How long this step should last from now, so that back-to-back steps follow the cost model.

        Rank 0 keeps a timeline of modelled step ends. The real work between steps (outputs, the broadcast,
        the collective) eats into the next step's sleep instead of adding to it, up to one step of debt;
        a seat that falls further behind (an overloaded host) restarts the timeline from now.
        """
        now = time.monotonic()
        if self._timeline is None or now - self._timeline > step_s:
            self._timeline = now
        self._timeline = max(self._timeline, now - step_s) + step_s
        return max(0.0, self._timeline - now)

    def _step(self, *, gather: int, seed: int, step_s: float, decode_bs: int = 0) -> None:
        """One forward: the row fetch, the GPU work, the modelled rest of the step, the all-reduce, the sync.

        With ``--sim-cuda-graphs`` a decode step of ``decode_bs`` requests that a captured bucket holds replays that
        bucket's graph instead (:mod:`sgl_seat.sim.graphs`): the table read is a kernel inside it, not a
        ``fetch_rows`` call, and an armed GPU stall stalls inside the replayed graph."""
        t0 = time.monotonic()
        key = self.graphs.key_for(decode_bs) if self.graphs is not None and decode_bs > 0 else None
        with self._fault_lock:
            fx = self.faults.on_step(step=self.forward_ct, gather=gather, now=t0)
        if fx.crash is not None:
            self.log.error(f"sim fault: crashing rank {self.tp_rank} now ({fx.crash.spec()})")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if fx.error is not None:
            raise RuntimeError(f"sim fault: rank {self.tp_rank} failed in its forward ({fx.error.spec()})")
        if fx.stall is not None:
            until = "until the process dies" if fx.stall_s is None else f"for {fx.stall_s:g} s"
            self.log.warning(f"sim fault: row fetch on rank {self.tp_rank} stalls {until} ({fx.stall.spec()})")
            rowfetch.arm_stall(fx.stall_s)
        elif fx.fetch_delay_ms > 0:  # slow-stall's slow phase: this fetch takes that much longer
            rowfetch.arm_stall(fx.fetch_delay_ms / 1000.0)
        if self.graphs is not None:
            if fx.gpu_stall is not None and key is None:
                self._graph_stall = (fx.gpu_stall, fx.gpu_stall_s)  # for the next replay
                fx = dataclasses.replace(fx, gpu_stall=None, gpu_stall_s=None)
            elif fx.gpu_stall is None and key is not None and self._graph_stall is not None:
                fx = dataclasses.replace(fx, gpu_stall=self._graph_stall[0], gpu_stall_s=self._graph_stall[1])
                self._graph_stall = None
        if fx.gpu_stall is not None:
            until = "for about an hour" if fx.gpu_stall_s is None else f"for {fx.gpu_stall_s:g} s"
            inside = f"inside a replayed CUDA graph (shape key {key.size})" if key is not None else "in its row fetch"
            self.log.warning(f"sim fault: the GPU stream of rank {self.tp_rank} stalls {inside} {until} "
                             f"({fx.gpu_stall.spec()})")
            if key is not None and self.graphs is not None:
                self.graphs.arm_stall(key, fx.gpu_stall_s)
            else:
                rowfetch.arm_gpu_stall(fx.gpu_stall_s)
        if key is not None and self.graphs is not None:
            ids = rowfetch.make_ids(seed, key.size * self.graphs.captured_req_width, self.table.shape[0])
            rows = self.graphs.execute(key, ids).view(1, 1)  # the replay returns at once; the GPU runs on
        else:
            ids = rowfetch.make_ids(seed, gather, self.table.shape[0])
            rows = rowfetch.fetch_rows(self.table, ids)
            if self.gpu is not None:
                rows = self.gpu.compute(rows)  # enqueued behind the copy: no host sync until the step's end
        remaining = step_s * fx.slow_factor + fx.extra_ms / 1000.0 - (time.monotonic() - t0)
        if remaining > 0:
            time.sleep(remaining)
        self.red.zero_()
        if rows.numel():
            if self.gpu is not None:
                self.red[:1].copy_(rows[0, :1])  # device to device: the host does not wait for the rows
            else:
                self.red[0] = float(rows[0, 0])
        dist.all_reduce(self.red)
        if self.gpu is not None:
            self.gpu.sync()  # a step's end: a rank whose stream stalled waits here like its peers

    # --- rank 0: deciding steps ----------------------------------------------------------------------------
    def _next_plan(self, tick: float) -> tuple[int, StepPlan | None]:
        if self._drain(block_s=0.0):
            return SHUTDOWN, None
        plan = self.batcher.plan()
        self._send_rejected()
        if plan is None:
            if self.on_idle(tick):
                return SHUTDOWN, None
            plan = self.batcher.plan()
            self._send_rejected()
        if plan is None:
            return IDLE, None
        return plan.kind, plan

    def on_idle(self, tick: float) -> bool:
        """Nothing to run: wait up to ``tick`` for input. Named as SGLang's own idle hook (``Scheduler.on_idle``,
        where its rank 0 sleeps under --sleep-on-idle), so an idle sim rank 0 reads as idle to the watchdog's
        classifier, as a real one does; True if a shutdown was asked for."""
        return self._drain(block_s=tick)

    def _drain(self, block_s: float) -> bool:
        """Handle queued control messages; True if a shutdown was asked for."""
        first = True
        while True:
            try:
                msg = self.inbox.get(timeout=block_s) if first and block_s > 0 else self.inbox.get_nowait()
            except queue.Empty:
                return False
            first = False
            t = msg.get("t")
            if t == "req":
                self.batcher.add(Req.from_msg(msg))
            elif t == "abort":
                item = self.batcher.abort(str(msg.get("rid")))
                if item is not None:
                    self._send_out([item])
            elif t == "flush":
                ok = self.batcher.flush_cache()
                self._send_ctl({"t": "flush_result", "id": msg.get("id"), "success": ok})
                if ok:
                    self.log.info("Cache flushed successfully!")
            elif t == "shutdown":
                return True

    def _send_rejected(self) -> None:
        if self.batcher.rejected:
            self._send_out(self.batcher.rejected)
            self.batcher.rejected = []

    def _finish(self, plan: StepPlan) -> None:
        running_before = len(self.batcher.running)
        items = self.batcher.complete(plan)
        self._send_out(items)
        pool = self.batcher.pool
        if plan.kind == EXTEND:
            now = time.monotonic()
            gap = max(now - self._last_prefill_t, 1e-6)
            self._last_prefill_t = now
            self.log.info(contract.log_prefill_batch(
                len(plan.reqs), plan.new_tokens, plan.cached_tokens, pool.token_usage, running_before,
                len(self.batcher.waiting), plan.new_tokens / gap,
            ))
        elif plan.kind == DECODE:
            self._decode_ct += 1
            if self._decode_ct % self.cfg.decode_log_interval == 0:
                self._log_decode()
        self._maybe_stats()

    def _log_decode(self) -> None:
        b = self.batcher
        now = time.monotonic()
        gap = max(now - self._last_log_t, 1e-6)
        self._last_gen_throughput = (b.gen_tokens - self._last_log_tokens) / gap
        self._last_log_t, self._last_log_tokens = now, b.gen_tokens
        accept_len = accept_rate = None
        if self.spec is not None:
            f0, t0, c0, p0 = self._last_spec
            fwd, tok, cor, prop = (b.spec_forwards - f0, b.spec_tokens - t0, b.spec_correct - c0,
                                   b.spec_proposed - p0)
            self._last_spec = (b.spec_forwards, b.spec_tokens, b.spec_correct, b.spec_proposed)
            accept_len = tok / fwd if fwd else 0.0
            accept_rate = cor / prop if prop else 0.0
        self.log.info(contract.log_decode_batch(
            len(b.running), b.pool.used, b.pool.token_usage, accept_len, accept_rate, self._last_gen_throughput,
            len(b.waiting),
        ))

    def _maybe_stats(self) -> None:
        now = time.monotonic()
        if now - self._last_stats_t < STATS_EVERY_S:
            return
        self._last_stats_t = now
        b = self.batcher
        stats: dict[str, Any] = {
            "t": "stats",
            "num_running_reqs": len(b.running),
            "num_queue_reqs": len(b.waiting),
            "gen_throughput": self._last_gen_throughput,
            "cache_hit_rate": b.pool.hit_rate,
            "token_usage": b.pool.token_usage,
            "num_used_tokens": b.pool.used,
            "decode_sum_seq_lens": sum(len(r.input_ids) + len(r.output_ids) for r in b.running),
            "forward_ct": self.forward_ct,
        }
        if self.spec is not None:
            stats["spec_accept_length"] = b.spec_tokens / b.spec_forwards if b.spec_forwards else 0.0
            stats["spec_accept_rate"] = b.spec_correct / b.spec_proposed if b.spec_proposed else 0.0
        self._send_ctl(stats)

    def _send_out(self, items: list[dict[str, Any]]) -> None:
        if self.out is not None and items:
            with contextlib.suppress(ChannelClosed):
                self.out.send({"t": "out", "items": items})

    def _send_ctl(self, msg: Message) -> None:
        with contextlib.suppress(ChannelClosed):
            self.ctl.send(msg)

    # --- control channel (a thread: it answers even while the step loop is stuck) ------------------------------
    def _ctl_reader(self) -> None:
        while True:
            try:
                msg = self.ctl.recv()
            except ChannelClosed:
                if self.tp_rank == 0:
                    self.inbox.put({"t": "shutdown"})
                return
            t = msg.get("t")
            if t == "fault":
                self._on_fault(msg)
            elif t == "clear_faults":
                with self._fault_lock:
                    self.faults.clear()
                rowfetch.clear_stall()
                self.log.warning(f"sim faults cleared on rank {self.tp_rank}")
                self._send_ctl({"t": "ok", "id": msg.get("id")})
            elif t == "status":
                self._send_ctl({"t": "status", "id": msg.get("id"), **self.status()})
            elif self.tp_rank == 0:
                self.inbox.put(msg)

    def _on_fault(self, msg: Message) -> None:
        try:
            fault = parse_fault(str(msg.get("spec", "")))
        except Exception as e:
            self._send_ctl({"t": "error", "id": msg.get("id"), "message": str(e)})
            return
        if fault.kind == GPU_STALL and self.gpu is None:
            self._send_ctl({"t": "error", "id": msg.get("id"),
                            "message": f"{fault.spec()} stalls a GPU stream, but this sim runs with --device cpu"})
            return
        with self._fault_lock:
            armed = self.faults.arm(fault, time.monotonic())
        if armed:
            self.log.warning(f"sim fault armed on rank {self.tp_rank}: {fault.spec()}")
            self._send_ctl({"t": "ok", "id": msg.get("id")})
        else:
            self._send_ctl({"t": "error", "id": msg.get("id"), "message": f"fault is not for rank {self.tp_rank}"})

    def status(self) -> dict[str, Any]:
        with self._fault_lock:
            armed = [f.spec() for f in self.faults.armed()]
        return {
            "tp_rank": self.tp_rank,
            "ep_rank": self.ep_rank,
            "pid": os.getpid(),
            "title": contract.scheduler_title(self.tp_rank, self.ep_rank, self.cfg.tp_size, self.cfg.ep_size),
            "forward_ct": self.forward_ct,
            "active": self.active,
            "num_running_reqs": self.n_running,
            "rowfetch_stalled": rowfetch.stalled(),
            "faults": armed,
        }

    # --- SGLang's scheduler watchdog ------------------------------------------------------------------------
    def _watchdog(self) -> None:
        timeout = self.cfg.watchdog_timeout
        last_ct, last_t = self.forward_ct, time.monotonic()
        while True:
            now = time.monotonic()
            if not self.active or self.forward_ct != last_ct:
                last_ct, last_t = self.forward_ct, now
            elif now > last_t + timeout:
                break
            time.sleep(timeout / 2)
        self.log.error(
            f"Scheduler debug info:\nforward_ct={self.forward_ct}, batch_size={self.n_running}, "
            f"rowfetch_stalled={rowfetch.stalled()}"
        )
        self._pyspy_self()
        self.log.error(contract.log_watchdog_timeout(timeout))
        print(file=sys.stderr, flush=True)
        print(file=sys.stdout, flush=True)
        time.sleep(self.cfg.watchdog_grace_s)
        self._sigquit_parent()

    def _pyspy_self(self) -> None:
        """SGLang dumps its own stacks before giving up (``pyspy_dump_schedulers``); bounded here."""
        exe = shutil.which("py-spy")
        if exe is None:
            self.log.error("Pyspy failed (py-spy dump): py-spy is not on PATH")
            return
        cmd = [exe, "dump", "--pid", str(os.getpid())]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=15, check=True)
            self.log.error(f"Pyspy dump for PID {os.getpid()} ({' '.join(cmd[1:])}):\n{res.stdout}")
        except (subprocess.SubprocessError, OSError) as e:
            self.log.error(f"Pyspy failed ({' '.join(cmd[1:])}). Error: {e}")

    def _sigquit_parent(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.parent_pid, signal.SIGQUIT)


def run(cfg: SimConfig, tp_rank: int, ctl: Channel, out: Channel | None, parent_pid: int) -> int:
    return Scheduler(cfg, tp_rank, ctl, out, parent_pid).run()
