"""The watchdog on real GPUs: the sim in CUDA mode, one sidecar per simulated node, three faults, the probe's cost.

Run on a machine with 2 (or more) NVIDIA GPUs (``bench/gpu/run.sh`` installs the carried wheels first)::

    python bench/gpu/gpu_watchdog.py --out /tmp/gpu-out                      # 2 nodes x 1 GPU, TP2/EP2
    python bench/gpu/gpu_watchdog.py --gpus-per-node 2 --draft on \
        --scenarios rowfetch-stall:3,gpu-stall:3,crash:2 --out /tmp/gpu-out   # the field report's shape, TP4/EP4

The seat is ``--nodes`` simulated nodes of ``--gpus-per-node`` GPUs each (node ``n`` sees GPUs
``n*G .. n*G+G-1`` through ``CUDA_VISIBLE_DEVICES``), TP = EP = nodes x GPUs. A scenario is ``fault[:rank]``
(default rank: the last one); the fault goes to the admin route of that rank's node. ``--device cpu`` runs the
same harness with gloo on a machine without GPUs (a check of the harness, nothing measured).

What it does, all measured in this one run, and prints as JSON (``--out``/result.json too):

1. ``versions``: date, GPUs, driver, Python, torch, NCCL, py-spy.
2. ``probe_cost``: ns per call of a trivial function bare, wrapped by the probe (host timing only) and
   wrapped with CUDA events (GPU-stream timing), in batches of 1,000 calls whose events are resolved
   between batches (outside the timed region, as the engine's reader thread does off the hot path).
3. For each scenario, a fresh seat without Ray (one ``sgl_seat.sim.launch_server`` process per node with
   ``--device cuda``, ``CUDA_VISIBLE_DEVICES`` = the node's GPUs, NCCL; one in-process Sidecar per node,
   coordinated through ``local_peers``), traffic through ``/generate``, then a fault on one rank through the
   sim's admin route: ``rowfetch-stall`` (CPU side), ``gpu-stall`` (kernel side: the stream spins inside
   ``fetch_rows`` while the host thread runs on) and ``crash``. Printed: seconds from the admin route's
   answer to the bundle directory's appearance, the bundle's verdict (kind, rank, node, frame, first
   evidence line), whether rank 0's and the faulty rank's last Python stacks were identical, and each
   ``py-spy --native`` dump's time from the capture steps.

What it does not do: Ray (the seat is brought up by hand here, not by ``sgl-seat up``), decode throughput
with the sidecar off / 1 Hz / 5 Hz (the sim's step time is its cost model's sleep, so its throughput cannot
show sampling cost: ``bench/gpu/decode_loop.py`` measures that on a loop with no sleep), a UVA/Triton read of
a host-registered table (the kernel-side stall is ``torch.cuda._sleep``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sgl_seat.forensics import read_bundle  # noqa: E402
from sgl_seat.forensics.recording.loadgen import Load, posting, request_body  # noqa: E402
from sgl_seat.netports import free_block  # noqa: E402
from sgl_seat.spec import WatchdogSpec  # noqa: E402
from sgl_seat.watchdog.config import SidecarConfig  # noqa: E402
from sgl_seat.watchdog.peers import local_peers  # noqa: E402
from sgl_seat.watchdog.sidecar import Sidecar  # noqa: E402

HOST = "127.0.0.1"
TARGET = "sgl_seat.sim.rowfetch:fetch_rows@ids:numel"
#: --graphs: the sim's decode replays CUDA graphs (sgl_seat/sim/graphs.py); the probe wraps its replay entry too.
GRAPH_TARGET = "sgl_seat.sim.graphs:SimGraphBackend.replay@shape_key:graph"


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"


def versions() -> dict[str, Any]:
    import torch

    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpus": _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "py_spy": _run([shutil.which("py-spy") or "py-spy", "--version"]),
    }


def probe_cost(batches: int = 200, batch: int = 1000) -> dict[str, Any]:
    """ns per call: bare, probe (host timing only), probe + its one CUDA event per call through each record path
    (``Event.record()``, ctypes ``cudaEventRecord``, ``_CudaEventBase.record`` with the stream cached, see
    ``probe.cuda_paths``); min over batches (the least disturbed)."""
    import torch

    from sgl_seat import probe

    saved = {k: os.environ.get(k) for k in (probe.ENV_DIR, probe.ENV_GPU)}
    os.environ[probe.ENV_DIR] = tempfile.mkdtemp(prefix="probe-cost-")
    os.environ[probe.ENV_GPU] = "0"
    probe.reset()
    try:
        def bare(table: object, ids: object) -> None:
            return None

        wrapped = probe.make_wrapper(bare, probe.parse_target("bench_gpu:bare@ids:none"))
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        out: dict[str, Any] = {"calls_per_batch": batch, "batches": batches, "writer": probe.native_state()}

        def per_call(fn: Any, after: Any = None) -> float:
            best = float("inf")
            for _ in range(batches):
                t = timeit.timeit(lambda: fn(None, None), number=batch) / batch
                best = min(best, t)
                if after is not None:
                    after()
            return best * 1e9

        wrapped(None, None)
        out["bare_ns"] = per_call(bare)
        out["probe_host_ns"] = per_call(wrapped)
        # One event per call (the end), through each record path; the capture test through the CUDAGraph hooks.
        for how, w_us in (("method", 0.0), ("ctypes", 0.0), ("base", 0.0), ("base", probe.DEFAULT_COALESCE_US)):
            timer = probe.enable_gpu_cuda(torch, how, start_thread=False, coalesce_us=w_us)
            assert timer is not None
            recorded: list[int] = []

            def drain(timer: Any = timer, recorded: list[int] = recorded) -> None:
                recorded.append(timer._queued)
                torch.cuda.synchronize()
                timer.poll()

            ns = per_call(wrapped, drain)
            name = how if not w_us else f"{how}_coalesce_{w_us:g}us"
            out[f"probe_event_{name}_ns"] = ns
            out[f"added_by_event_{name}_ns"] = ns - out["probe_host_ns"]
            out[f"calls_queued_per_batch_min_{name}"] = min(recorded)
            out[f"events_recorded_{name}"] = timer.recorded
            out[f"event_errors_{name}"] = timer.errors
            probe.disable_gpu()
        return out
    finally:
        probe.reset()
        for k, v in saved.items():  # the seats started later inherit this environment
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def fetch_cost_cuda(calls: int = 3000) -> dict[str, Any]:
    """What the probe adds around the sim's real CUDA-mode ``fetch_rows`` (host gather into pinned staging, copy to
    the GPU), host timing only and with its CUDA event (the default record path; the reader thread resolving them
    as in an engine), at the field report's gather sizes; interleaved calls, 95 % interval over blocks."""
    import torch

    sys.path.insert(0, str(REPO / "bench"))
    from watchdog_overhead import GATHER_SIZES, added_ns, interleaved_ns

    from sgl_seat import probe
    from sgl_seat.sim import rowfetch

    saved = {k: os.environ.get(k) for k in (probe.ENV_DIR, probe.ENV_GPU)}
    os.environ[probe.ENV_DIR] = tempfile.mkdtemp(prefix="probe-fetch-", dir="/dev/shm")
    os.environ[probe.ENV_GPU] = "0"
    probe.reset()
    try:
        torch.set_num_threads(1)
        dev = torch.device("cuda", 0)
        rowfetch.use_cuda(dev, cycles_per_s=1e9, max_rows=max(GATHER_SIZES))
        table = rowfetch.pin_table(rowfetch.make_table())
        fr = rowfetch.fetch_rows
        host = probe.make_wrapper(fr, probe.parse_target(TARGET))
        out: dict[str, Any] = {"calls_per_arm": calls, "writer": probe.native_state()}
        for size in GATHER_SIZES:
            ids = [rowfetch.make_ids(seed, size, table.shape[0]) for seed in range(1009)]
            probe.disable_gpu()
            t = interleaved_ns({"bare": lambda x: fr(table, x), "probe": lambda x: host(table, x)}, ids, calls)
            torch.cuda.synchronize()
            fig = {"host_only": added_ns(t, "probe")}
            timer = probe.enable_gpu_cuda(torch, probe.DEFAULT_GPU_PATH)
            t = interleaved_ns({"bare": lambda x: fr(table, x), "probe": lambda x: host(table, x)}, ids, calls)
            torch.cuda.synchronize()
            fig["with_event"] = added_ns(t, "probe")
            fig["event_errors"] = timer.errors if timer is not None else None
            fig["reader_queries"] = timer.queries if timer is not None else None
            fig["events_recorded"] = timer.recorded if timer is not None else None
            probe.disable_gpu()
            out[f"fetch_rows_{size}"] = fig
        return out
    finally:
        probe.disable_gpu()
        probe.reset()
        rowfetch._device = rowfetch._staging = None  # back to host mode for anything after
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _free_port(span: int = 3) -> int:
    """The first free run of ``span`` ports in 31000-31999 (below Linux's ephemeral range)."""
    p = free_block(range(31000, 32000 - span, span), range(span), host=HOST, reuse=False)
    if p is None:
        raise RuntimeError("no free port")
    return p


DRAFT_ARGS = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "4"]  # launch/seats/large.yaml's draft: steps 3, topk 1, 4 tokens


class Seat:
    """``nodes`` sim nodes of ``gpn`` GPUs each and their sidecars, on this host."""

    def __init__(self, tmp: Path, device: str = "cuda", *, nodes: int = 2, gpn: int = 1, draft: bool = False,
                 graphs: bool = False) -> None:
        self.tmp = tmp
        self.graphs = graphs
        self.device = device
        self.nodes = nodes
        self.gpn = gpn
        self.draft = draft
        self.ports = [_free_port(3 * nodes + 1)]
        self.ports += [self.ports[0] + 3 * n for n in range(1, nodes)]
        self.p0 = self.ports[0]
        self.dist = self.p0 + 3 * nodes
        self.bundles = tmp / "bundles"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.sidecars: dict[int, Sidecar] = {}
        self.load: Load | None = None

    def rank_node(self, rank: int) -> int:
        return rank // self.gpn

    def start(self) -> None:
        world = self.nodes * self.gpn
        common = ["--model-path", "sim/gpu", "--tp-size", str(world), "--ep-size", str(world),
                  "--nnodes", str(self.nodes), "--dist-init-addr", f"{HOST}:{self.dist}", "--dist-timeout", "600",
                  "--watchdog-timeout", "300", "--enable-metrics", "--host", HOST, "--port", str(self.p0),
                  "--max-running-requests", "8" if self.draft else "16", "--device", self.device,
                  "--decode-log-interval", "20", *(DRAFT_ARGS if self.draft else []),
                  *(["--sim-cuda-graphs"] if self.graphs else [])]
        for node in range(self.nodes):
            gpus = ",".join(str(node * self.gpn + i) for i in range(self.gpn))
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus,
                   "SGLSEAT_PROBE": f"{TARGET},{GRAPH_TARGET}" if self.graphs else TARGET,
                   "SGLSEAT_PROBE_DIR": str(self.tmp / "rings" / f"node{node}"), "GLOO_SOCKET_IFNAME": "lo",
                   "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                   "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
            if node > 0:
                env["SGLSEAT_SIM_NODE_PORT"] = str(self.ports[node])
            log = open(self.tmp / f"node{node}.log", "wb")  # noqa: SIM115 - the child owns it
            self.procs[node] = subprocess.Popen(
                [sys.executable, "-m", "sgl_seat.sim.launch_server", *common, "--node-rank", str(node)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        for node, port in enumerate(self.ports):
            self._wait_health(port, node)
        th = WatchdogSpec().model_dump()
        rank_nodes = {r: self.rank_node(r) for r in range(world)}
        for node in range(self.nodes):
            cfg = SidecarConfig(
                seat="gpu-bench", node=node, nnodes=self.nodes, thresholds=th, bundle_dir=str(self.bundles),
                quota_mb=512, probe_dir=str(self.tmp / "rings" / f"node{node}"),
                log_path=str(self.tmp / f"node{node}.log"),
                metrics_url=f"http://{HOST}:{self.p0}/metrics" if node == 0 else None, metrics_port=None,
                rank_nodes=rank_nodes, root_pid=self.procs[node].pid, gpu=True)
            self.sidecars[node] = Sidecar(cfg)
        for n, peer in local_peers(self.sidecars).items():
            self.sidecars[n].peers = peer
        for s in self.sidecars.values():
            s.start()

    def _wait_health(self, port: int, node: int, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[node].poll() is not None:
                raise RuntimeError(f"node {node} exited: {(self.tmp / f'node{node}.log').read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://{HOST}:{port}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"node {node} not healthy in {timeout:.0f} s: "
                           f"{(self.tmp / f'node{node}.log').read_text()[-3000:]}")

    def traffic(self, clients: int = 8) -> None:
        body = request_body("/generate", "the quick brown fox " * 20, max_tokens=128, sampling={"ignore_eos": True})
        self.load = Load(posting(f"http://{HOST}:{self.p0}", "/generate", lambda i, n: body), concurrency=clients,
                         pause_s=0.2, timeout=600.0).start()

    @property
    def completed(self) -> int:
        """Requests answered with a 2xx status so far."""
        return self.load.ok if self.load is not None else 0

    def inject(self, fault: str, node: int) -> float:
        port = self.ports[node] + 2
        r = httpx.post(f"http://{HOST}:{port}/sim/faults", json={"fault": fault}, timeout=10)
        r.raise_for_status()
        return time.time()

    def wait_bundle(self, timeout: float) -> Path | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = sorted(p for p in self.bundles.glob("*") if p.is_dir() and not p.name.startswith("."))
            if found:
                return found[0]
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        if self.load is not None:
            self.load.halt()
        for s in self.sidecars.values():
            with contextlib.suppress(Exception):
                s.stop()
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(20)


def _same_stacks(b: Any, rank: int) -> bool | None:
    """Whether rank 0's and ``rank``'s last Python stacks (scheduler main thread) were the same frames."""
    last: dict[int, Any] = {}
    for s in b.stacks:
        if s.rank in (0, rank) and s.title.startswith("sglang::scheduler") and s.threads:
            last[s.rank] = s
    if set(last) != {0, rank}:
        return None
    sig = [tuple((f.name, f.filename.rsplit("/", 1)[-1], f.line) for f in last[r].main_thread().frames)
           for r in (0, rank)]
    return sig[0] == sig[1]


def _graph_view(b: Any, v: Any, rank: int) -> dict[str, Any]:
    """What the bundle says of graph replays: how many, by shape key, the one in flight on ``rank`` at the verdict
    (rank, token count, shape key: what the verdict must come from), and ``rank``'s last Python stack's top frames
    (on one GPU the stalled rank's own stack shows only the device sync)."""
    reps = [p for p in b.probes if p.graph_key is not None]
    keys: dict[int, int] = {}
    for p in reps:
        keys[p.graph_key] = keys.get(p.graph_key, 0) + 1
    infl = [p for p in reps if v is not None and p.gpu_in_flight(v.t)]
    last = [s for s in b.stacks if s.rank == rank and s.title.startswith("sglang::scheduler") and s.threads]
    top = []
    if last:
        th = last[-1].main_thread()
        top = [f"{f.name} ({f.filename.rsplit('/', 1)[-1]}:{f.line})" for f in (th.frames[:4] if th else ())]
    return {"graph_replays": len(reps), "by_shape_key": dict(sorted(keys.items())),
            "in_flight_on_gpu_at_verdict": [{"rank": p.rank, "tokens": p.gather_size, "shape_key": p.graph_key,
                                             "gpu_age_s": round(p.gpu_age(v.t), 2)} for p in infl],
            "verdict_from_graph_record": bool(v is not None and "graph replay" in (v.evidence[0] if v.evidence
                                                                                     else "")),
            f"last_python_stack_rank{rank}_top": top}


def scenario(kind: str, rank: int, warm_s: float, wait_s: float, device: str = "cuda", *, nodes: int = 2,
             gpn: int = 1, draft: bool = False, graphs: bool = False) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"gpu-{kind}-"))
    seat = Seat(tmp, device, nodes=nodes, gpn=gpn, draft=draft, graphs=graphs)
    out: dict[str, Any] = {"fault": f"{kind}:rank={rank}", "node": seat.rank_node(rank),
                           "shape": f"{nodes} nodes x {gpn} GPUs, TP{nodes * gpn}/EP{nodes * gpn}",
                           "draft": draft, "cuda_graphs": graphs}
    try:
        t0 = time.monotonic()
        seat.start()
        out["seat_up_s"] = round(time.monotonic() - t0, 1)
        seat.traffic()
        time.sleep(warm_s)
        out["requests_done_before_fault"] = seat.completed
        t_fault = seat.inject(f"{kind}:rank={rank}", node=seat.rank_node(rank))
        path = seat.wait_bundle(wait_s)
        if path is None:
            out["bundle"] = None
            out["error"] = f"no bundle within {wait_s:.0f} s"
            return out
        t_bundle = time.time()
        out["fault_to_bundle_dir_s"] = round(t_bundle - t_fault, 2)
        time.sleep(1.0)  # the bundle is written into a temp dir and renamed: it is complete once visible
        b = read_bundle(path)
        v = b.manifest.verdict
        out["verdict"] = None if v is None else {
            "kind": v.kind.value, "rank": v.rank, "node": v.node, "frame": v.frame,
            "evidence0": v.evidence[0] if v.evidence else None, "waiting_ranks": list(v.waiting_ranks),
            "verdict_t_minus_fault_s": round(v.t - t_fault, 2)}
        out[f"last_python_stacks_identical_rank0_rank{rank}"] = _same_stacks(b, rank)
        if graphs:
            out["graphs"] = _graph_view(b, v, rank)
        rank_of = {s.pid: s.rank for s in (*b.native_stacks, *b.stacks)}
        out["native_dumps"] = [f"node {c.get('node')} rank {rank_of.get(int(str(c.get('step')).split()[-1]))}: "
                               f"{c.get('step')} {c.get('status')} {c.get('detail')}"
                               for c in b.manifest.capture if "py-spy --native" in str(c.get("step"))]
        out["nvidia_smi_in_bundle"] = [c.get("status") for c in b.manifest.capture
                                       if "nvidia-smi" in str(c.get("step"))]
        gpu_recs = [p for p in b.probes if p.gpu]
        out["probe_records"] = {"total": len(b.probes), "with_gpu_timing": len(gpu_recs),
                                "gpu_in_flight_at_verdict": sorted({p.rank for p in gpu_recs
                                                                    if v is not None and p.gpu_in_flight(v.t)})}
        return out
    except Exception as exc:  # report, do not hide
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    finally:
        seat.stop()
        for n in range(nodes):
            log = tmp / f"node{n}.log"
            if log.exists():
                text = log.read_text(errors="replace")
                out.setdefault("log_tail", {})[n] = text[-1500:]
                out.setdefault("probe_lines", {})[n] = [ln for ln in text.splitlines() if "sgl-seat probe" in ln][:5]
                out.setdefault("sim_lines", {})[n] = [ln for ln in text.splitlines()
                                                      if "sim CUDA graphs" in ln or "sim fault" in ln][:8]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="directory for result.json")
    ap.add_argument("--scenarios", default="gpu-stall,rowfetch-stall,crash",
                    help="fault[:rank],...; default rank: the last one")
    ap.add_argument("--nodes", type=int, default=2, help="simulated nodes")
    ap.add_argument("--gpus-per-node", type=int, default=1, help="GPUs (ranks) per simulated node")
    ap.add_argument("--draft", choices=("on", "off"), default="off", help="EAGLE draft flags (steps 3, 4 tokens)")
    ap.add_argument("--warm-s", type=float, default=12.0)
    ap.add_argument("--wait-s", type=float, default=30.0)
    ap.add_argument("--skip-probe-cost", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: check the harness on a machine without GPUs")
    ap.add_argument("--graphs", action="store_true",
                    help="the sim's decode replays CUDA graphs (--sim-cuda-graphs) and the probe wraps the replay; "
                         "default scenarios then gpu-stall (inside a replayed graph) and crash")
    a = ap.parse_args()
    if a.graphs and a.scenarios == ap.get_default("scenarios"):
        a.scenarios = "gpu-stall,crash"
    res: dict[str, Any] = {"versions": versions(), "device": a.device, "nodes": a.nodes,
                           "gpus_per_node": a.gpus_per_node, "draft": a.draft, "cuda_graphs": a.graphs}
    world = a.nodes * a.gpus_per_node
    if a.device == "cuda":
        import torch

        if torch.cuda.device_count() < world:
            print(json.dumps({"error": f"{world} GPUs needed ({a.nodes} nodes x {a.gpus_per_node}), "
                                       f"{torch.cuda.device_count()} visible"}), flush=True)
            return 2
    print(json.dumps(res, indent=1), flush=True)
    if not a.skip_probe_cost:
        res["probe_cost"] = probe_cost()
        print(json.dumps({"probe_cost": res["probe_cost"]}, indent=1), flush=True)
        if a.device == "cuda":
            res["fetch_cost_cuda"] = fetch_cost_cuda()
            print(json.dumps({"fetch_cost_cuda": res["fetch_cost_cuda"]}, indent=1), flush=True)
    for item in [k for k in a.scenarios.split(",") if k]:
        kind, _, r_txt = item.partition(":")
        rank = int(r_txt) if r_txt else world - 1
        r = scenario(kind, rank, a.warm_s, a.wait_s, a.device, nodes=a.nodes, gpn=a.gpus_per_node,
                     draft=a.draft == "on", graphs=a.graphs)
        item = item if item not in res else f"{item}#{sum(k.split('#')[0] == item for k in res) + 1}"  # a repeat
        res[item] = r
        print(json.dumps({item: {k: v for k, v in r.items() if k != "log_tail"}}, indent=1), flush=True)
        if "error" in r:
            print(json.dumps({item + "_log_tail": r.get("log_tail")}, indent=1), flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "result.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
