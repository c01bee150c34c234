"""How fast and how big is replaying a one-hour bundle? (target on 2 cores: load + analysis under 10 s)

Builds a synthetic bundle the size an hour of the watchdog produces on the large seat (3,600 stack
samples x 8 ranks at 1 Hz, 1,000,000 row-fetch probe records, an hour of 1 Hz metrics, 20,000 request
shapes) with the real writer, then measures, in a fresh process so nothing of the build counts:
verify (sizes and sha256 of every file), decode into the record types, the detectors re-run over the
whole history, the analysis, and the HTML report; and the peak resident memory of that process.
Every figure is synthetic and labelled so.

    python bench/replay_scale.py [--keep DIR] [--probes N] [--seconds S]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sgl_seat.core.records import (
    EngineProcess,
    Frame,
    LogLine,
    MetricsPoint,
    ProbeRecord,
    StackSample,
    ThreadStack,
    Verdict,
    VerdictKind,
)
from sgl_seat.forensics import (
    Redactor,
    encode_env,
    encode_logs,
    encode_probe_records,
    encode_records,
    encode_stack_samples,
    layout,
    write_bundle,
)

RANKS = 8
T0 = 1_764_000_000.0
TARGET = "sglang.srt.layers.engram.host_table.gather_rows"


def _frames(rng: random.Random) -> list[tuple[Frame, ...]]:
    """~40 distinct scheduler stacks, 20-30 frames deep, like SGLang's scheduler under py-spy."""
    base = tuple(Frame(f"fn_{i}", f"/usr/lib/python3/site-packages/sglang/srt/managers/mod_{i}.py", 10 + i)
                 for i in range(18))
    tops = [Frame("gather_rows", "/usr/lib/python3/site-packages/sglang/srt/layers/engram/host_table.py", 212),
            Frame("all_reduce", "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", 2806),
            Frame("synchronize", "/usr/lib/python3/site-packages/torch/cuda/__init__.py", 1162)]
    out = []
    for k in range(40):
        extra = tuple(Frame(f"layer_{k}_{j}", f"/usr/lib/python3/site-packages/sglang/srt/models/dsv4_{j}.py",
                            100 + k) for j in range(rng.randint(2, 10)))
        out.append((tops[k % 3], *extra, *base))
    return out


def build(dest: Path, *, seconds: int, probes: int) -> Path:
    rng = random.Random(2026)
    stacks = _frames(rng)
    helper = ThreadStack(9, "Thread-2", False, False, (Frame("wait", "/usr/lib/python3.11/threading.py", 327),
                                                        Frame("run", "/usr/lib/python3.11/threading.py", 975)))
    samples = [StackSample(t=T0 + i, node=r // 4, pid=1000 + r, title=f"sglang::scheduler_TP{r}_EP{r}", rank=r,
                           native=False, threads=(ThreadStack(1, "MainThread", True, True, rng.choice(stacks)),
                                                  helper))
               for i in range(seconds) for r in range(RANKS)]
    per_rank = probes // RANKS
    step = (seconds - 3) / per_rank
    trig = T0 + seconds - 1
    recs = []
    for r in range(RANKS):
        for i in range(per_rank):
            start = T0 + i * step + rng.random() * 1e-4
            g = rng.choice((16, 32, 48, 64, 96, 128, 192, 256, 384))
            dur = (0.1 + 0.004 * g + (rng.uniform(5, 40) if g > 128 and rng.random() < 0.03 else 0.0)) / 1000
            if r == 5 and i == per_rank - 1:  # rank 5's last fetch never returns: in flight 2 s at the trigger
                recs.append(ProbeRecord(1, r, 1000 + r, 1, i, TARGET, trig - 2.0, None, 384))
                continue
            recs.append(ProbeRecord(r // 4, r, 1000 + r, 1, i, TARGET, start, start + dur, g))
    metrics = [MetricsPoint(T0 + i, 0, {"sglang:num_running_reqs": 48.0, "sglang:num_queue_reqs": 0.0,
                                        "sglang:generation_tokens_total": 1500.0 * min(i, seconds - 8),
                                        "sglang:spec_accept_length": 2.3, "sglang:token_usage": 0.7})
               for i in range(seconds)]
    red = Redactor(salt=b"bench")
    system = "shared system prompt " * 40
    reqs = [red.shape(t=T0 + i * seconds / 20_000, route="/v1/completions",
                      prompt=(system if i % 3 else "") + f"question {i} " * rng.randint(5, 60), prompt_tokens=None,
                      max_tokens=256) for i in range(20_000)]
    procs = [EngineProcess(r // 4, 1000 + r, f"sglang::scheduler_TP{r}_EP{r}", r, True) for r in range(RANKS)]
    files = {
        layout.STACKS: encode_stack_samples(samples),
        layout.PROBE: encode_probe_records(recs),
        layout.METRICS: encode_records(metrics),
        layout.PROCESSES: encode_records(procs),
        layout.LOGS: encode_logs([LogLine(T0 + i, 0, f"Decode batch, #running-req: 48, step {i}")
                                  for i in range(0, seconds, 10)]),
        layout.REQUESTS: encode_records(reqs),
        layout.ENV: encode_env({0: dict(os.environ), 1: dict(os.environ)}),
    }
    v = Verdict(VerdictKind.ROWFETCH_STALL, 5, 1, "gather_rows (host_table.py:212)", trig, ("synthetic",), ())
    return write_bundle(dest, "hour", {
        "seat": "bench", "trigger": {"t": trig, "source": "detector"}, "verdict": v.to_json(), "nodes": [0, 1],
        "ranks": list(range(RANKS)), "rank_nodes": {str(r): r // 4 for r in range(RANKS)},
        "time_range": {"start": T0, "end": trig + 1}, "thresholds": {"rowfetch_inflight_s": 0.5},
        "versions": {"engine": "synthetic"}, "synthetic": True,
    }, files, quota_mb=1 << 20)


def measure(path: Path) -> dict[str, float]:
    """Runs in a fresh process: each stage timed, then peak RSS."""
    from sgl_seat.forensics.analysis import analyse
    from sgl_seat.forensics.bundle import read_bundle, verify_bundle
    from sgl_seat.forensics.html import render_html
    from sgl_seat.forensics.redetect import rerun_detectors
    from sgl_seat.forensics.replay import ReplayResult

    out: dict[str, float] = {}
    t = time.perf_counter()
    verify_bundle(path)
    out["verify_s"] = time.perf_counter() - t
    t = time.perf_counter()
    b = read_bundle(path)  # verifies again, then decodes
    out["read_s"] = time.perf_counter() - t
    out["decode_s"] = out["read_s"] - out["verify_s"]
    t = time.perf_counter()
    replayed, _note = rerun_detectors(b)
    out["detect_s"] = time.perf_counter() - t
    t = time.perf_counter()
    a = analyse(b)
    out["analyse_s"] = time.perf_counter() - t
    t = time.perf_counter()
    res = ReplayResult(path, b, a, b.manifest.verdict, replayed, None)
    html = render_html(res)
    json.dumps(res.to_json())
    out["report_s"] = time.perf_counter() - t
    out["html_kb"] = len(html) / 1024
    out["records"] = float(len(b.probes))
    out["samples"] = float(len(b.stacks))
    out["verdict_ok"] = float(res.verdict_matches is True or (replayed is not None and replayed.rank == 5))
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--probes", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, help="build into (or reuse) this directory and keep it")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return 0
    root = args.keep or Path(tempfile.mkdtemp(prefix="sgl-seat-bench-"))
    try:
        path = root / "hour"
        if not path.exists():
            t = time.perf_counter()
            path = build(root, seconds=args.seconds, probes=args.probes)
            print(f"built {path} in {time.perf_counter() - t:.1f} s (not part of the measurement)")
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        proc = subprocess.run([sys.executable, __file__, "--measure", str(path)], capture_output=True, text=True,
                              check=True)
        m = json.loads(proc.stdout.strip().splitlines()[-1])
        load = m["read_s"]
        analysis = m["detect_s"] + m["analyse_s"]
        total = load + analysis
        print(f"synthetic one-hour bundle: {int(m['samples']):,} stack samples ({RANKS} ranks), "
              f"{int(m['records']):,} probe records, {size / 1e6:.1f} MB on disk; {os.cpu_count()} CPUs visible")
        print(f"{'stage':<34}{'seconds':>10}")
        for k, label in (("verify_s", "verify (size + sha256 of every file)"), ("decode_s", "decode into records"),
                         ("detect_s", "re-run detectors (watchdog detect)"), ("analyse_s", "analysis"),
                         ("report_s", "report (JSON + HTML)")):
            print(f"{label:<34}{m[k]:>10.2f}")
        print(f"{'load (verify + decode)':<34}{load:>10.2f}")
        print(f"{'analysis (detect + analyse)':<34}{analysis:>10.2f}")
        print(f"{'load + analysis':<34}{total:>10.2f}   target < 10 s on 2 cores: "
              f"{'PASS' if total < 10 else 'MISS'}")
        print(f"{'peak RSS of the replay process':<34}{m['peak_rss_mb']:>9.0f} MB; HTML {m['html_kb']:.0f} KB; "
              f"verdict reproduced: {bool(m['verdict_ok'])}")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
