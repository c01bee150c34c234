"""Which rank the one-event probe names when the host runs ahead of a stream that waits in a collective.

Why: the probe records one event after each wrapped call, and a call's GPU start is bounded by the previous probed
end on its stream, so unprobed work between calls (a collective) counts into the next call's in-flight age. The
sim synchronises every step, so its runs cannot show what happens when a rank's host has already enqueued the next
step's fetch while its stream waits in an all-reduce for a stalled peer (SGLang's overlap scheduler runs one
step ahead). Here two NCCL ranks (one GPU each, ``CUDA_VISIBLE_DEVICES``) loop: the sim's CUDA-mode
``fetch_rows`` (wrapped by the probe, GPU timing on: the production path, ``SGLSEAT_PROBE_GPU=1``), a spin of
``--step-ms`` of GPU time (the rest of a step), an all-reduce; then the host waits for the previous step
(``--ahead 1``: one step ahead, as SGLang's overlap scheduler) or for this one (``--ahead 0``: the sim's way).
At step ``--fault-step`` rank 1's fetch spins its stream for 60 s (a kernel-side stall). Four seconds later this
process reads both ranks' probe rings and, as the detectors do, names the rank of the oldest record in flight on
the GPU. Printed per case (JSON lines; ``--out``/runahead.json): each rank's oldest in-flight record (step,
start, age) and the rank named. Synthetic loop on real GPUs.

    python bench/gpu/runahead_check.py --cases 1:1,1:10,1:50,0:10 --repeat 2 --out DIR    (ahead:step_ms)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
PORT = 31050
TARGET = "sgl_seat.sim.rowfetch:fetch_rows@ids:numel"


def worker(rank: int, step_ms: float, ahead: int, fault_step: int, steps: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    from sgl_seat import probe
    from sgl_seat.sim import rowfetch
    from sgl_seat.sim.step.device import calibrate_sleep

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
    cps = calibrate_sleep(dev)
    rowfetch.use_cuda(dev, cycles_per_s=cps, max_rows=8)
    table = rowfetch.pin_table(rowfetch.make_table())
    probe.install([TARGET])
    x = torch.ones(1024, device=dev)
    step_cycles = int(cps * step_ms / 1e3)
    done: list[Any] = []
    for step in range(steps):
        if rank == 1 and step == fault_step:
            rowfetch.arm_gpu_stall(60.0)
            print(json.dumps({"rank": rank, "fault_at": time.time(), "step": step}), flush=True)
        rowfetch.fetch_rows(table, rowfetch.make_ids(step, 8, table.shape[0]))
        torch.cuda._sleep(step_cycles)
        dist.all_reduce(x)
        ev = torch.cuda.Event()
        ev.record()
        done.append(ev)
        if len(done) > ahead:
            done.pop(0).synchronize()  # the host waits for the step `ahead` steps back
    print(json.dumps({"rank": rank, "finished": True}), flush=True)


def oldest_in_flight(ring_dir: Path, now: float) -> dict[str, Any] | None:
    from sgl_seat import probe

    recs = [r for path in probe.list_rings(str(ring_dir)).values() for r in probe.read_ring(path)]
    infl = [r for r in recs if r.gpu_in_flight(now)]
    if not infl:
        return {"records": len(recs), "in_flight": 0}
    r = min(infl, key=lambda p: p.gpu_start or now)
    return {"records": len(recs), "in_flight": len(infl), "oldest_seq": r.seq,
            "oldest_gpu_start": r.gpu_start, "age_s": round(now - (r.gpu_start or now), 4),
            "host_start": r.start}


def run_case(ahead: int, step_ms: float, fault_step: int, port: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="runahead-"))
    procs = []
    for rank in (0, 1):
        d = tmp / f"r{rank}"
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(rank), "SGLSEAT_PROBE_DIR": str(d),
               "SGLSEAT_PROBE_GPU": "1", "SGLSEAT_RANK": str(rank), "PYTHONUNBUFFERED": "1"}
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(rank), "--ahead", str(ahead),
                                       "--step-ms", str(step_ms), "--fault-step", str(fault_step),
                                       "--port", str(port)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    out: dict[str, Any] = {"ahead": ahead, "step_ms": step_ms, "fault_step": fault_step}
    try:
        assert procs[1].stdout is not None
        deadline = time.time() + 120
        fault_at = None
        lines = []
        while time.time() < deadline:
            line = procs[1].stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            if '"fault_at"' in line:
                fault_at = json.loads(line)["fault_at"]
                break
        if fault_at is None:
            out["error"] = "rank 1 never reached the fault: " + " | ".join(lines[-5:])
            return out
        time.sleep(4.0)
        now = time.time()
        ranks = {rank: oldest_in_flight(tmp / f"r{rank}", now) for rank in (0, 1)}
        out["ranks"] = ranks
        starts = {r: v["oldest_gpu_start"] for r, v in ranks.items() if v and v.get("oldest_gpu_start")}
        out["named"] = min(starts, key=lambda r: starts[r]) if starts else None
        if len(starts) == 2:
            out["rank1_older_by_ms"] = round((starts[0] - starts[1]) * 1e3, 2)
        # Call numbers start at 1: step s is call s + 1.
        out["rank1_oldest_is_the_stalled_fetch"] = (ranks[1] or {}).get("oldest_seq") == fault_step + 1
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", type=int, default=None)
    ap.add_argument("--ahead", type=int, default=1)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--fault-step", type=int, default=60)
    ap.add_argument("--cases", default="1:1,1:10,1:50,0:10", help="ahead:step_ms,...")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--port", type=int, default=PORT)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.worker is not None:
        worker(a.worker, a.step_ms, a.ahead, a.fault_step, a.fault_step + 5, a.port)
        return 0
    res = []
    n = 0
    for _ in range(a.repeat):
        for case in a.cases.split(","):
            ahead, step_ms = case.split(":")
            r = run_case(int(ahead), float(step_ms), a.fault_step, PORT + n)  # a fresh port per case
            n += 1
            res.append(r)
            print(json.dumps(r), flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "runahead.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
