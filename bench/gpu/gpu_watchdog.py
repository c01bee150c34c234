"""The watchdog on real GPUs: the sim in CUDA mode on 2 GPUs, two sidecars, three faults, and the probe's cost.

Run on a machine with 2 (or more) NVIDIA GPUs (``bench/gpu/run.sh`` installs the carried wheels first)::

    python bench/gpu/gpu_watchdog.py --out /tmp/gpu-out

What it does, all measured in this one run, and prints as JSON (``--out``/result.json too):

1. ``versions``: date, GPUs, driver, Python, torch, NCCL, py-spy.
2. ``probe_cost``: ns per call of a trivial function bare, wrapped by the probe (host timing only) and
   wrapped with CUDA events (GPU-stream timing), in batches of 1,000 calls whose events are resolved
   between batches (outside the timed region, as the engine's reader thread does off the hot path).
3. For each scenario, a fresh two-node seat without Ray (two ``sgl_seat.sim.launch_server`` processes with
   ``--device cuda``, ``CUDA_VISIBLE_DEVICES`` = the node's GPU, NCCL; one in-process Sidecar per node,
   coordinated through ``local_peers``), traffic through ``/generate``, then a fault on rank 1 through the
   sim's admin route: ``rowfetch-stall`` (CPU side), ``gpu-stall`` (kernel side: the stream spins inside
   ``fetch_rows`` while the host thread runs on) and ``crash``. Printed: seconds from the admin route's
   answer to the bundle directory's appearance, the bundle's verdict (kind, rank, node, frame, first
   evidence line), whether rank 0's and rank 1's last Python stacks were identical, and each ``py-spy
   --native`` dump's time from the capture steps.

What it does not do: Ray (the seat is brought up by hand here, not by ``sgl-seat up``), decode throughput
with the sidecar off / 1 Hz / 5 Hz (the sim's step time is its cost model's sleep, so its throughput cannot
show sampling cost; that needs a real engine), a UVA/Triton read of a host-registered table (the kernel-side
stall is ``torch.cuda._sleep``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import timeit
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sgl_seat.forensics import read_bundle  # noqa: E402
from sgl_seat.spec import WatchdogSpec  # noqa: E402
from sgl_seat.watchdog.config import SidecarConfig  # noqa: E402
from sgl_seat.watchdog.peers import local_peers  # noqa: E402
from sgl_seat.watchdog.sidecar import Sidecar  # noqa: E402

HOST = "127.0.0.1"
TARGET = "sgl_seat.sim.rowfetch:fetch_rows@ids:numel"


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
    """ns per call: bare, probe (host only), probe + CUDA events (Event.record(), and the raw cudaEventRecord
    path the probe uses by itself); min over batches (the least disturbed)."""
    import torch

    from sgl_seat.watchdog import probe

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
        out: dict[str, Any] = {"calls_per_batch": batch, "batches": batches}

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
        raw = probe._raw_recorder(torch)
        variants = {"event_record_method": (lambda: torch.cuda.Event(enable_timing=True), None)}
        if raw is not None:
            variants["raw_cudaEventRecord"] = raw
        for name, (factory, record) in variants.items():
            timer = probe.enable_gpu(factory, torch.cuda.is_current_stream_capturing, start_thread=False,
                                     record=record)
            assert timer is not None
            recorded: list[int] = []

            def drain(timer: Any = timer, recorded: list[int] = recorded) -> None:
                recorded.append(len(timer._pending))
                torch.cuda.synchronize()
                timer.poll()

            ns = per_call(wrapped, drain)
            out[f"probe_events_{name}_ns"] = ns
            out[f"added_by_events_{name}_ns"] = ns - out["probe_host_ns"]
            out[f"event_pairs_per_batch_min_{name}"] = min(recorded)
            probe.disable_gpu()
        return out
    finally:
        probe.reset()
        for k, v in saved.items():  # the seats started later inherit this environment
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _free_port(span: int = 3) -> int:
    for p in range(38100, 38900, 7):
        ok = True
        for q in range(p, p + span):
            with socket.socket() as s:
                try:
                    s.bind((HOST, q))
                except OSError:
                    ok = False
                    break
        if ok:
            return p
    raise RuntimeError("no free port")


class Seat:
    """Two sim nodes (one GPU each) and their sidecars, on this host."""

    def __init__(self, tmp: Path, device: str = "cuda") -> None:
        self.tmp = tmp
        self.device = device
        self.p0 = _free_port()
        self.p1 = self.p0 + 3
        self.dist = self.p0 + 6
        self.bundles = tmp / "bundles"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.sidecars: dict[int, Sidecar] = {}
        self.stop_traffic = threading.Event()
        self.traffic_threads: list[threading.Thread] = []
        self.completed = 0

    def start(self) -> None:
        common = ["--model-path", "sim/gpu", "--tp-size", "2", "--ep-size", "2", "--nnodes", "2",
                  "--dist-init-addr", f"{HOST}:{self.dist}", "--dist-timeout", "600", "--watchdog-timeout", "300",
                  "--enable-metrics", "--host", HOST, "--port", str(self.p0), "--max-running-requests", "16",
                  "--device", self.device, "--decode-log-interval", "20"]
        for node in (0, 1):
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(node), "SGL_SEAT_PROBE": TARGET,
                   "SGL_SEAT_PROBE_DIR": str(self.tmp / "rings" / f"node{node}"), "GLOO_SOCKET_IFNAME": "lo",
                   "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                   "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
            if node == 1:
                env["SGL_SEAT_SIM_NODE_PORT"] = str(self.p1)
            log = open(self.tmp / f"node{node}.log", "wb")  # noqa: SIM115 - the child owns it
            self.procs[node] = subprocess.Popen(
                [sys.executable, "-m", "sgl_seat.sim.launch_server", *common, "--node-rank", str(node)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        for node, port in ((0, self.p0), (1, self.p1)):
            self._wait_health(port, node)
        th = WatchdogSpec().model_dump()
        for node in (0, 1):
            cfg = SidecarConfig(
                seat="gpu-bench", node=node, nnodes=2, thresholds=th, bundle_dir=str(self.bundles), quota_mb=512,
                probe_dir=str(self.tmp / "rings" / f"node{node}"), log_path=str(self.tmp / f"node{node}.log"),
                metrics_url=f"http://{HOST}:{self.p0}/metrics" if node == 0 else None, metrics_port=None,
                rank_nodes={0: 0, 1: 1}, root_pid=self.procs[node].pid, gpu=True)
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
        def one() -> None:
            with httpx.Client(timeout=600) as c:
                while not self.stop_traffic.is_set():
                    try:
                        r = c.post(f"http://{HOST}:{self.p0}/generate",
                                   json={"text": "the quick brown fox " * 20,
                                         "sampling_params": {"max_new_tokens": 128, "ignore_eos": True}})
                        if r.status_code == 200:
                            self.completed += 1
                    except httpx.HTTPError:
                        time.sleep(0.2)

        for _ in range(clients):
            t = threading.Thread(target=one, daemon=True)
            t.start()
            self.traffic_threads.append(t)

    def inject(self, fault: str, node: int) -> float:
        port = (self.p0 if node == 0 else self.p1) + 2
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
        self.stop_traffic.set()
        for s in self.sidecars.values():
            with contextlib.suppress(Exception):
                s.stop()
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(20)


def _same_stacks(b: Any) -> bool | None:
    last: dict[int, Any] = {}
    for s in b.stacks:
        if s.rank in (0, 1) and s.title.startswith("sglang::scheduler") and s.threads:
            last[s.rank] = s
    if set(last) != {0, 1}:
        return None
    sig = [tuple((f.name, f.filename.rsplit("/", 1)[-1], f.line) for f in last[r].main_thread().frames) for r in (0, 1)]
    return sig[0] == sig[1]


def scenario(kind: str, warm_s: float, wait_s: float, device: str = "cuda") -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"gpu-{kind}-"))
    seat = Seat(tmp, device)
    out: dict[str, Any] = {"fault": f"{kind}:rank=1"}
    try:
        t0 = time.monotonic()
        seat.start()
        out["seat_up_s"] = round(time.monotonic() - t0, 1)
        seat.traffic()
        time.sleep(warm_s)
        out["requests_done_before_fault"] = seat.completed
        t_fault = seat.inject(f"{kind}:rank=1", node=1)
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
        out["last_python_stacks_identical_rank0_rank1"] = _same_stacks(b)
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
        for n in (0, 1):
            log = tmp / f"node{n}.log"
            if log.exists():
                text = log.read_text(errors="replace")
                out.setdefault("log_tail", {})[n] = text[-1500:]
                out.setdefault("probe_lines", {})[n] = [ln for ln in text.splitlines() if "sgl-seat probe" in ln][:5]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="directory for result.json")
    ap.add_argument("--scenarios", default="gpu-stall,rowfetch-stall,crash")
    ap.add_argument("--warm-s", type=float, default=12.0)
    ap.add_argument("--wait-s", type=float, default=30.0)
    ap.add_argument("--skip-probe-cost", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: check the harness on a machine without GPUs")
    a = ap.parse_args()
    res: dict[str, Any] = {"versions": versions(), "device": a.device}
    print(json.dumps(res, indent=1), flush=True)
    if not a.skip_probe_cost:
        res["probe_cost"] = probe_cost()
        print(json.dumps({"probe_cost": res["probe_cost"]}, indent=1), flush=True)
    for kind in [k for k in a.scenarios.split(",") if k]:
        r = scenario(kind, a.warm_s, a.wait_s, a.device)
        res[kind] = r
        print(json.dumps({kind: {k: v for k, v in r.items() if k != "log_tail"}}, indent=1), flush=True)
        if "error" in r:
            print(json.dumps({kind + "_log_tail": r.get("log_tail")}, indent=1), flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "result.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
