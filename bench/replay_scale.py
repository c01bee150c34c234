"""How fast and how big is replaying a one-hour bundle (target on 2 cores: load + analysis <= 2 s, 300 MB)?

Issue 15's targets: load + analysis at most 2 s on 2 cores, peak RSS at most 300 MB, the verdict unchanged.

Builds a synthetic bundle the size an hour of the watchdog produces on the large seat (3,600 stack
samples x 8 ranks at 1 Hz, 1,000,000 row-fetch probe records, an hour of 1 Hz metrics, 20,000 request
shapes) with the real writer, then measures, in a fresh process so nothing of the build counts:
verify alone (sizes and sha256 of every file; for reference), read (verify and decode of probe records,
samples and requests into columns / shared stacks; since issue 15.4 the digests are checked on a second
thread beside the decoding), the detectors re-run over the whole history, the analysis, the pre-hang warning,
and the HTML report; and the peak resident memory of that process (VmHWM). Each stage gives wall and CPU
seconds (CPU time says how much of a wall figure is other load on the machine; the load average is printed
too; CPU time counts both threads of the read).

Side by side in the same run: the same measurement with the code of ``--baseline`` (a git revision; default
the last one before the columnar replay, where the detectors built a million ProbeRecords), checked out into
a temporary directory and imported from there. "verdict unchanged" compares the replayed verdict (kind, rank,
node, frame, evidence, waiting ranks) of both; "analysis unchanged" the report's analysis sections.
Every figure is synthetic and labelled so. On a machine shared with other work, wall time counts theirs:
``chrt -f 10 python bench/replay_scale.py`` (root) keeps the scheduler from taking the CPU away mid-stage
(the CPU column is not affected by that, but still by a busy sibling core or memory bus).

    python bench/replay_scale.py [--keep DIR] [--probes N] [--seconds S] [--runs N] [--baseline REV | --no-baseline]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sgl_seat.core.records import Frame

# The builder's imports are made inside build(): the measuring child imports only what measure() names, through
# _imported(), so the code of --baseline (an older layout of the package) is measured by the same script.

RANKS = 8
T0 = 1_764_000_000.0
TARGET = "sglang.srt.layers.engram.host_table.gather_rows"


def _frames(rng: random.Random) -> list[tuple[Frame, ...]]:
    """~40 distinct scheduler stacks, 20-30 frames deep, like SGLang's scheduler under py-spy."""
    from sgl_seat.core.records import Frame

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
        write_bundle,
    )
    from sgl_seat.forensics.format import layout

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


BASELINE = "c85e31a"  # the last commit before the columnar replay (issue 15.4)
TARGET_S = 2.0
TARGET_MB = 300


#: Where each function measure() calls lives: today's module first, then the older layouts a baseline may have
#: (before the house reorganisation the forensics package was flat).
_WHERE = {
    "read_bundle": ("sgl_seat.forensics.format.bundle", "sgl_seat.forensics.bundle"),
    "verify_bundle": ("sgl_seat.forensics.format.bundle", "sgl_seat.forensics.bundle"),
    "analyse": ("sgl_seat.forensics.replay.analysis", "sgl_seat.forensics.analysis"),
    "render_html": ("sgl_seat.forensics.replay.bundle_html", "sgl_seat.forensics.html"),
    "rerun_detectors": ("sgl_seat.forensics.replay.redetect", "sgl_seat.forensics.redetect"),
    "first_warning_before": ("sgl_seat.forensics.replay.redetect", "sgl_seat.forensics.redetect"),
    "ReplayResult": ("sgl_seat.forensics.replay.replayer", "sgl_seat.forensics.replay"),
}


def _imported(name: str) -> Any:
    """``name`` from the first of its modules (``_WHERE``) that has it; None where none does."""
    import importlib

    for mod in _WHERE[name]:
        try:
            return getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError):
            continue
    return None


def measure(path: Path) -> dict[str, Any]:
    """Runs in a fresh process: each stage timed (wall and CPU), then peak RSS and digests of the results."""
    read_bundle, verify_bundle = _imported("read_bundle"), _imported("verify_bundle")
    analyse, render_html, rerun_detectors = _imported("analyse"), _imported("render_html"), _imported("rerun_detectors")
    ReplayResult = _imported("ReplayResult")
    first_warning_before = _imported("first_warning_before")  # what replay_bundle also runs; old baselines lack it
    if None in (read_bundle, verify_bundle, analyse, render_html, rerun_detectors, ReplayResult):
        raise SystemExit("this code has no replay this bench can call (read_bundle, analyse, render_html, ...)")

    out: dict[str, Any] = {}

    def stage(name: str, fn: Callable[[], Any]) -> Any:
        w, c = time.perf_counter(), time.process_time()
        r = fn()
        out[name] = time.perf_counter() - w
        out[name + "_cpu"] = time.process_time() - c
        return r

    stage("verify_s", lambda: verify_bundle(path))
    b = stage("read_s", lambda: read_bundle(path))  # verifies again, then decodes
    out["decode_s"] = out["read_s"] - out["verify_s"]
    out["decode_s_cpu"] = out["read_s_cpu"] - out["verify_s_cpu"]
    replayed, _note = stage("detect_s", lambda: rerun_detectors(b))
    a = stage("analyse_s", lambda: analyse(b))
    warning = stage("warning_s", lambda: first_warning_before(b) if first_warning_before else None)
    res = ReplayResult(path, b, a, b.manifest.verdict, replayed, None)
    if warning is not None:
        res.warning = warning
    out["warning"] = None if warning is None else json.dumps(res.to_json().get("prehang_warning"))[:160]
    html = stage("report_s", lambda: (render_html(res), json.dumps(res.to_json()))[0])
    out["html_kb"] = len(html) / 1024
    out["records"] = len(b.probes)
    out["samples"] = len(b.stacks)
    doc = res.to_json()
    v = doc["verdict"] or {}
    out["verdict"] = [v.get(k) for k in ("kind", "rank", "node", "frame", "evidence", "waiting_ranks")]
    out["verdict_ok"] = res.verdict_matches is True
    out["analysis_sha256"] = hashlib.sha256(json.dumps(
        {k: doc[k] for k in ("divergence", "stuck", "rowfetch", "activity", "exited", "log_tail", "timeline", "notes")},
        sort_keys=True).encode()).hexdigest()
    out["peak_rss_mb"] = _peak_rss_mb()
    return out


def _peak_rss_mb() -> float:
    """This process's peak resident memory: ``VmHWM`` (its own address space's high-water mark) where Linux gives
    it. ``ru_maxrss`` is the fallback only: Linux carries it across exec from the forked parent, so a measuring
    child started by a parent that had just built the bundle (~500 MB) reported the parent's peak, not its own."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _load_analysis(m: dict[str, Any]) -> float:
    return float(m["read_s"] + m["detect_s"] + m["analyse_s"] + m["warning_s"])


class Unmeasured(Exception):
    """The measuring process failed (its last line of stderr): for a baseline, code that cannot read this bundle."""


def _run(path: Path, code: Path | None, runs: int) -> dict[str, Any]:
    """The best of ``runs`` fresh-process measurements (least load + analysis), with ``code`` first on the path;
    ``spread`` holds every run's load + analysis (wall) and its load average, for the median and the worst."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [env.get("PYTHONPATH")])])
    best: dict[str, Any] | None = None
    spread: list[tuple[float, float]] = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, __file__, "--measure", str(path)], capture_output=True, text=True,
                              check=False, env=env)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise Unmeasured(tail[:300])
        m = json.loads(proc.stdout.strip().splitlines()[-1])
        spread.append((_load_analysis(m), os.getloadavg()[0]))
        if best is None or _load_analysis(m) < _load_analysis(best):
            best = m
    assert best is not None
    best["spread"] = spread
    return best


def _baseline_tree(rev: str, dest: Path) -> Path | None:
    """``sgl_seat/`` as of ``rev``, unpacked under ``dest`` (None, with a note, where git cannot give it)."""
    repo = Path(__file__).resolve().parent.parent
    try:
        data = subprocess.run(["git", "-C", str(repo), "archive", rev, "sgl_seat"], capture_output=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"baseline {rev}: not measured ({exc})")
        return None
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _report(new: dict[str, Any], old: dict[str, Any] | None, rev: str) -> None:
    cols = f"{'stage':<42}{'wall s':>8}{'cpu s':>8}" + (f"{'old wall':>10}{'old cpu':>9}" if old else "")
    print(cols)

    def row(label: str, key: str) -> None:
        line = f"{label:<42}{new[key]:>8.2f}{new[key + '_cpu']:>8.2f}"
        if old:
            line += f"{old[key]:>10.2f}{old[key + '_cpu']:>9.2f}"
        print(line)

    for key, label in (("verify_s", "verify alone (size + sha256, not in sum)"),
                       ("read_s", "read (verify + decode; new: in parallel)"),
                       ("detect_s", "re-run detectors (watchdog detect)"), ("analyse_s", "analysis"),
                       ("warning_s", "pre-hang warning over the history"),
                       ("report_s", "report (JSON + HTML)")):
        row(label, key)

    for m in (new, old):
        if m is not None:
            m["total_s"] = _load_analysis(m)
            m["total_s_cpu"] = float(m["read_s_cpu"] + m["detect_s_cpu"] + m["analyse_s_cpu"] + m["warning_s_cpu"])
    row("load + analysis (read..warning)", "total_s")
    ok_t = new["total_s"] <= TARGET_S
    ok_m = new["peak_rss_mb"] <= TARGET_MB
    print(f"target load + analysis <= {TARGET_S:.0f} s on 2 cores: {'PASS' if ok_t else 'MISS'} "
          f"({new['total_s']:.2f} s wall, {new['total_s_cpu']:.2f} s CPU)")
    for tag, m in (("new", new), ("old", old)):
        if m is not None and len(m["spread"]) > 1:
            walls, loads = [w for w, _ in m["spread"]], [la for _, la in m["spread"]]
            print(f"  {tag}: load + analysis over {len(walls)} runs: median {statistics.median(walls):.2f} s, worst "
                  f"{max(walls):.2f} s wall (load average {min(loads):.1f}-{max(loads):.1f})")
    print(f"peak RSS of the replay process: {new['peak_rss_mb']:.0f} MB (target <= {TARGET_MB}): "
          f"{'PASS' if ok_m else 'MISS'}" + (f"; old {old['peak_rss_mb']:.0f} MB" if old else ""))
    print(f"verdict reproduced (replayed == recorded): {new['verdict_ok']}; HTML {new['html_kb']:.0f} KB; "
          f"pre-hang warning before the trigger: {new.get('warning')}")
    if old:
        print(f"verdict unchanged vs {rev} (kind, rank, node, frame, evidence, waiting): "
              f"{new['verdict'] == old['verdict']}")
        print(f"analysis unchanged vs {rev} (divergence, stuck, row-fetch, activity, timeline...): "
              f"{new['analysis_sha256'] == old['analysis_sha256']}")
        if new["verdict"] != old["verdict"]:
            print(f"  kind, rank, node, frame unchanged: {new['verdict'][:4] == old['verdict'][:4]}; the detectors "
                  f"may have changed since {rev} (replay runs the current ones):\n  new: {new['verdict']}\n"
                  f"  old: {old['verdict']}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--probes", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=1,
                    help="fresh-process runs per code version; the best is shown, with the median and the worst")
    ap.add_argument("--baseline", default=BASELINE, help="git revision to measure side by side")
    ap.add_argument("--no-baseline", action="store_true")
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
        new = _run(path, None, args.runs)
        old = None
        if not args.no_baseline:
            with tempfile.TemporaryDirectory(prefix="sgl-seat-baseline-") as tmp:
                code = _baseline_tree(args.baseline, Path(tmp))
                try:
                    old = _run(path, code, args.runs) if code is not None else None
                except Unmeasured as exc:  # an older bundle reader refuses today's bundle: said, not a crash
                    print(f"baseline {args.baseline}: not measured, its code cannot replay this bundle ({exc}); "
                          "name a later revision with --baseline, or --no-baseline")
        print(f"synthetic one-hour bundle: {new['samples']:,} stack samples ({RANKS} ranks), "
              f"{new['records']:,} probe records, {size / 1e6:.1f} MB on disk; {os.cpu_count()} CPUs visible, "
              f"load average {os.getloadavg()[0]:.1f} at the end; best of {args.runs} run(s) each")
        _report(new, old, args.baseline)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
