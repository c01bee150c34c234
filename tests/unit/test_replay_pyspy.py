"""Replay is robust to what real py-spy dumps look like, not only to the tidy golden fixtures.

Shapes copied from bundles the watchdog captured from the sim seat with py-spy 0.4.3: qualified
function names (``Condition.wait``, ``Scheduler._drain``), native frames whose filename and module are
shared-library paths, address-only frames (``0x7f16...``), 64-bit thread ids, the main thread listed
last, helper threads, a main process titled with its whole command line, failed dumps (error, no
threads), a failed native dump beside a good one, empty metrics and log files.
"""

from __future__ import annotations

import json
from pathlib import Path

from sgl_seat.core.records import EngineProcess, Frame, ProbeRecord, StackSample, ThreadStack
from sgl_seat.forensics import encode_probe_records, encode_records, encode_stack_samples, write_bundle
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.replay.analysis import classify_thread
from sgl_seat.forensics.replay.bundle_html import render_html
from sgl_seat.forensics.replay.exports import chrome_trace, speedscope
from sgl_seat.forensics.replay.replayer import replay_bundle

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
LIBPY = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"
STD = "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py"


def nat(name: str, lib: str = LIBC) -> Frame:
    return Frame(name, lib, 0, lib, True)


def py(name: str, file: str, line: int) -> Frame:
    return Frame(name, file, line, None, False)


BOOT = (py("Thread.run", STD, 982), py("Thread._bootstrap_inner", STD, 1045), py("Thread._bootstrap", STD, 1002),
        nat("thread_run", LIBPY), nat("0x7f160dca71f5"), nat("0x7f160dd278ec"))
HELPER = ThreadStack(140501565195968, "sim-watchdog", False, False,
                     (nat("clock_nanosleep"), nat("time_sleep", LIBPY),
                      py("NodeRuntime._child_watchdog", "/work/main/sgl_seat/sim/node.py", 206), *BOOT))
DRAIN = (nat("pthread_cond_timedwait"), py("Condition.wait", STD, 331),
         py("Scheduler._drain", "/work/main/sgl_seat/sim/scheduler.py", 284),
         py("Scheduler.event_loop", "/work/main/sgl_seat/sim/scheduler.py", 190), py("<module>", "<string>", 1))
BCAST = (nat("gloo::transport::tcp::UnboundBuffer::waitRecv", "/venv/lib/torch/lib/libtorch_cpu.so"),
         py("broadcast", "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 3151),
         py("wrapper", "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 81),
         py("Scheduler._sync", "/work/main/sgl_seat/sim/scheduler.py", 240),
         py("Scheduler.event_loop", "/work/main/sgl_seat/sim/scheduler.py", 190))
SERVER = (nat("epoll_wait"), py("EpollSelector.select", "/root/.pyenv/versions/3.11.7/lib/python3.11/selectors.py",
                                468), py("main", "/work/main/sgl_seat/sim/launch_server.py", 110))
TITLE = ("/work/main/.venv/bin/python -m sgl_seat.sim.launch_server --model-path sim/dsv41 --tp-size 4 "
         "--ep-size 4 --nnodes 2 --node-rank 0 --dist-init-addr 127.0.0.1:33025 --watchdog-timeout ")


def _sample(t: float, rank: int | None, frames: tuple[Frame, ...], *, native: bool = False,
            error: str | None = None) -> StackSample:
    pid = 29000 + (rank if rank is not None else 99)
    title = f"sglang::scheduler_TP{rank}_EP{rank}" if rank is not None else TITLE
    main = ThreadStack(140502137293696 + pid, "MainThread", False, False, frames)
    threads = () if error else (HELPER, main)  # py-spy lists the main thread last here
    return StackSample(t=t, node=(rank or 0) // 2, pid=pid, title=title, rank=rank, native=native, threads=threads,
                       error=error)


def _bundle(tmp: Path) -> Path:
    t0 = 1_795_982_826.0
    samples = []
    for i in range(8):
        t = t0 + i * 1.02
        samples.append(_sample(t, 0, DRAIN))
        for r in (1, 2, 3):
            samples.append(_sample(t + 0.01, r, BCAST))
        samples.append(_sample(t + 0.02, None, SERVER))
    samples.append(_sample(t0 + 3.5, 2, (), error="py-spy timed out after 2s"))
    native = [_sample(t0 + 9.0, r, DRAIN if r == 0 else BCAST, native=True) for r in range(4)]
    native.append(_sample(t0 + 9.0, 1, (), native=True, error="Failed to merge native and python frames"))
    probes = [ProbeRecord(0, 0, 29000, 140502137322696, i, "sgl_seat.sim.rowfetch:fetch_rows", t0 + i * 0.3,
                          t0 + i * 0.3 + 0.0001, 1) for i in range(8)]
    procs = [EngineProcess(r // 2, 29000 + r, f"sglang::scheduler_TP{r}_EP{r}", r, True) for r in range(4)]
    procs.append(EngineProcess(0, 29099, TITLE, None, True, None))
    trig = t0 + 8.2
    return write_bundle(tmp, "pyspy-shaped", {
        "seat": "lt-fail", "trigger": {"t": trig, "source": "detector", "reproduced": False}, "verdict": None,
        "nodes": [0, 1], "ranks": [0, 1, 2, 3], "rank_nodes": {"0": 0, "1": 0, "2": 1, "3": 1},
        "time_range": {"start": t0, "end": trig + 1}, "thresholds": {"stack_unchanged_samples": 5, "sample_hz": 1.0},
        "versions": {"py_spy": "0.4.3"},
    }, {layout.STACKS: encode_stack_samples(samples), layout.NATIVE_STACKS: encode_stack_samples(native),
        layout.PROBE: encode_probe_records(probes), layout.PROCESSES: encode_records(procs),
        layout.METRICS: b"", layout.LOGS: b""}, quota_mb=10)


def test_classifier_reads_qualified_names_and_native_frames() -> None:
    drain = ThreadStack(1, "MainThread", False, False, DRAIN)
    assert classify_thread(drain).state == "running"
    assert classify_thread(drain).frame == "Scheduler._drain (scheduler.py:284)"
    bcast = classify_thread(ThreadStack(1, "MainThread", True, True, BCAST))
    assert (bcast.state, bcast.frame) == ("collective", "broadcast (distributed_c10d.py:3151)")
    assert classify_thread(ThreadStack(1, "MainThread", False, False, SERVER)).state == "running"
    assert classify_thread(ThreadStack(1, "x", False, False, SERVER[:2])).state == "idle"
    assert classify_thread(ThreadStack(1, "x", False, False, ())).state == "error"


def test_replay_of_a_pyspy_shaped_bundle(tmp_path: Path) -> None:
    """GIVEN real-looking dumps and no recorded verdict WHEN replayed THEN the detectors name rank 0 at its
    engine frame, the other ranks wait in broadcast, and every output renders."""
    result = replay_bundle(_bundle(tmp_path))
    doc = result.to_json()
    assert result.recorded is None and doc["verdict_source"] == "replayed"
    v = doc["verdict"]
    assert (v["kind"], v["rank"], v["frame"]) == ("stack unchanged", 0, "Scheduler._drain (scheduler.py:284)")
    assert doc["divergence"]["waiting"] == [1, 2, 3] and doc["divergence"]["lagging"] == [0]
    r1 = next(r for r in doc["divergence"]["ranks"] if r["rank"] == 1)
    assert r1["source"] == "native"  # the native dump wins over the failed one at the same instant
    assert doc["stuck"][0]["rank"] == 0 and doc["stuck"][0]["frame"].startswith("Scheduler._drain")
    # its failed dump is drawn as a stack not read, not as a fault of the rank
    assert any(seg["state"] == "unread" for r in doc["timeline"] if r["rank"] == 2 for seg in r["segments"])
    assert doc["exited"] == [] and doc["activity"]["metrics_points"] == 0
    assert "<svg" in render_html(result)
    json.dumps(speedscope(result))
    assert chrome_trace(result)["traceEvents"]
