"""Coordinated capture: each node's part (stacks now, process and GPU state, its rings) and the one bundle.

:func:`node_part` runs on every node when asked and returns plain JSON-able data (it crosses Ray);
:func:`assemble` merges the parts of all nodes, re-runs :func:`~sgl_seat.core.detect.detect` over
the merged records (so the bundle's verdict is the seat-wide one that ``replay`` reproduces from the same
records) and writes one bundle through the forensics writer (atomic, with the disk quota). A full or
read-only disk is a logged error, never an exception into the sidecar.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import logging
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sgl_seat import __version__
from sgl_seat.core.columns import ProbeColumns
from sgl_seat.core.detect import detect
from sgl_seat.core.isolation import SelfCheck
from sgl_seat.core.learned import LearnedThresholds
from sgl_seat.core.nodeloss import loss_verdict, missing_nodes, ranks_of
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import (
    EngineProcess,
    LogLine,
    MetricsPoint,
    ProbeRecord,
    StackSample,
    Verdict,
)
from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.errors import BundleError
from sgl_seat.forensics import encode_bundle, write_bundle
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.annotate import add_late_files
from sgl_seat.forensics.format.bundle import BundleWriteError, failure_reason, read_bundle
from sgl_seat.forensics.format.codec import (
    decode_probe_records,
    decode_stack_samples,
    encode_probe_records,
    encode_stack_samples,
    encode_text,
)
from sgl_seat.forensics.format.redact import RequestShape
from sgl_seat.forensics.format.scrub import scrub_lines
from sgl_seat.procstate import pid_state
from sgl_seat.spec import WatchdogSpec
from sgl_seat.watchdog.procfind import EngineProc
from sgl_seat.watchdog.pyspy import DumpResult, pyspy_dump

log = logging.getLogger("sgl_seat.watchdog")


def process_state(pids: Sequence[int]) -> list[dict[str, Any]]:
    """psutil's view of each engine process: status, threads, CPU, RSS, open connections."""
    out: list[dict[str, Any]] = []
    for pid in pids:
        doc: dict[str, Any] = {"pid": pid}
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                doc.update(
                    status=p.status(), title=(p.cmdline() or [p.name()])[0][:300], ppid=p.ppid(),
                    threads=p.num_threads(), cpu_user_s=p.cpu_times().user, cpu_system_s=p.cpu_times().system,
                    rss_bytes=p.memory_info().rss, create_time=p.create_time(),
                )
            with contextlib.suppress(OSError):
                doc["thread_states"] = _thread_states(pid)
            try:
                doc["connections"] = [
                    {"fd": c.fd, "status": c.status,
                     "laddr": f"{c.laddr.ip}:{c.laddr.port}" if c.laddr else None,
                     "raddr": f"{c.raddr.ip}:{c.raddr.port}" if c.raddr else None}
                    for c in p.net_connections(kind="inet")
                ]
            except (psutil.Error, OSError) as exc:
                doc["connections_error"] = str(exc)
        except (psutil.Error, OSError) as exc:
            doc["error"] = f"{type(exc).__name__}: {exc}"
        out.append(doc)
    return out


def _thread_states(pid: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for tid in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (tid / "status").read_text(encoding="ascii", errors="replace").splitlines():
                if line.startswith("State:"):
                    st = line.split(None, 1)[1].strip()
                    counts[st] = counts.get(st, 0) + 1
                    break
        except OSError:
            continue
    return counts


def nvidia_smi(timeout_s: float = 10.0) -> tuple[str | None, str]:
    """``nvidia-smi -q`` text, or (None, why not)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "nvidia-smi not found"
    try:
        res = subprocess.run([exe, "-q"], capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi timed out after {timeout_s:g}s"
    except OSError as exc:
        return None, str(exc)
    if res.returncode != 0:
        return None, res.stderr.decode("utf-8", "replace").strip()[:300] or f"exit {res.returncode}"
    return res.stdout.decode("utf-8", "replace"), "ok"


def _step(node: int, step: str, status: str, detail: str = "") -> dict[str, Any]:
    return {"node": node, "step": step, "status": status, "detail": detail[:500]}


#: Seconds a node's capture waits for native (``--native``) stack dumps once its Python-only dumps are in. Why a
#: budget: a native dump is CPU-bound (py-spy reads the symbols of every library the process maps: 0.3-2 s for a
#: scheduler with torch loaded, on 2 cores), a node's take 2-5 s in all on a loaded box, and the soak measured
#: them as most of its 4-14 s from a stall passing its threshold to the bundle on disk (target 3 s). The Python
#: stacks (tens of milliseconds, the target never stopped) are taken first and always kept; native dumps run by
#: priority inside the budget, and the bundle's capture steps say which were not captured in time.
NATIVE_BUDGET_S = 1.0
#: ... and native dumps stop this long after the detection that asked for the capture (the sidecar passes the
#: deadline): time lost before the dumps began (a busy host, a slow source poll) comes out of the native budget,
#: not on top of it, so a bundle follows its detection by about this plus the writing.
NATIVE_BY_S = 1.25


def native_workers() -> int:
    """Native dumps at a time: about the cores (each is CPU-bound: more at once only makes each slower)."""
    return max(2, min(8, os.cpu_count() or 2))


def native_order(procs: Sequence[EngineProc], focus_ranks: Sequence[int] = ()) -> list[EngineProc]:
    """The order native dumps start in: the ranks the node's verdict names, then schedulers by rank, then the
    rest (launcher, detokenizer), so the stacks that matter most land inside the budget."""
    focus = {r: i for i, r in enumerate(focus_ranks)}
    return sorted(procs, key=lambda ep: (ep.rank not in focus, focus.get(ep.rank, 0) if ep.rank is not None else 0,
                                         ep.rank is None, ep.rank if ep.rank is not None else 0, ep.pid))


def _native_dumps(procs: Sequence[EngineProc], pyspy: str, budget_s: float, timeout_s: float
                  ) -> dict[int, DumpResult | None]:
    """Native dumps of ``procs`` (in that order, native_workers() at a time) until ``budget_s`` from now: a dump
    still running then is stopped (py-spy killed, the target resumed), one not begun by then is None."""
    deadline = time.monotonic() + budget_s

    def one(ep: EngineProc) -> DumpResult | None:
        left = min(timeout_s, deadline - time.monotonic())
        if left < MIN_NATIVE_S:
            return None
        return pyspy_dump(ep.pid, exe=pyspy, native=True, timeout_s=left)

    if not procs:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(native_workers(), len(procs))) as pool:
        futures = [(ep.pid, pool.submit(one, ep)) for ep in procs]  # a FIFO queue: they start in this order
        return {pid: f.result() for pid, f in futures}


#: A native dump is not begun with less than this left of the budget.
MIN_NATIVE_S = 0.05


def node_part(
    *,
    node: int,
    procs: Sequence[EngineProc],
    pyspy: str | None,
    samples: Sequence[StackSample],
    probes: Sequence[ProbeRecord],
    metrics: Sequence[MetricsPoint],
    logs: Sequence[LogLine],
    processes: Sequence[EngineProcess],
    log_text: str,
    env: Mapping[str, str],
    dump_timeout_s: float = 5.0,
    native_budget_s: float = NATIVE_BUDGET_S,
    native_deadline: float | None = None,
    focus_ranks: Sequence[int] = (),
    gpu: bool = True,
    requests: Sequence[RequestShape] | None = None,
    request_redaction: Mapping[str, Any] | None = None,
    native: bool = True,
    learned: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """This node's share of a capture, as plain data (no pickle-only types; Ray carries dicts).

    Python-only stacks of every process first, all at once (``--nonblocking``: the target never stops), then
    native ones by priority (``focus_ranks`` first) for ``native_budget_s`` and until ``native_deadline`` (epoch
    seconds; see NATIVE_BUDGET_S, NATIVE_BY_S); a process whose native dump did not land keeps its Python stack as
    its capture-time stack, and its step says why.
    ``native`` False: no native dumps and no ``nvidia-smi`` here (the sub-second capture: they follow the written
    bundle, :func:`node_native` and :func:`add_native`); every process keeps its Python stack for now.
    ``learned``: the node's learned thresholds (``LearnedThresholds.to_json()``), put into the bundle.
    ``requests``: the request shapes this node recorded (node 0, from SGLang's request log), None where the
    node records none.
    """
    t0 = time.time()
    steps: list[dict[str, Any]] = []
    now_stacks: list[StackSample] = []
    py_now: list[StackSample] = []
    # The logs' secrets are scrubbed here, on the node, while its stack dumps run (they wait on py-spy): not one
    # after the other at the coordinator, which then writes them as they come (encode_bundle's logs_scrubbed).
    scrub_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    scrubbed = scrub_pool.submit(lambda: (scrub_lines([ln.text for ln in logs]),
                                          "".join(scrub_lines(log_text.splitlines(keepends=True)))))

    # nvidia-smi -q takes about a second on a GPU host: it runs beside the stack dumps, not after them.
    gpu_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    gpu_future = gpu_pool.submit(nvidia_smi) if gpu and native else None
    py: dict[int, DumpResult] = {}
    nat: dict[int, DumpResult | None] = {}
    budget = native_budget_s
    if not procs:
        steps.append(_step(node, "discover", "error", "no engine process found on this node"))
    elif pyspy is None:
        py = {ep.pid: DumpResult((), "py-spy not found", 0.0, False) for ep in procs}
    else:
        exe = pyspy
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(procs))) as pool:
            py = dict(zip([ep.pid for ep in procs],
                          pool.map(lambda ep: pyspy_dump(ep.pid, exe=exe, native=False, timeout_s=dump_timeout_s),
                                   procs), strict=True))
        t_py = time.time()
        if native:
            budget = native_budget_s if native_deadline is None else min(native_budget_s, native_deadline - t_py)
            nat = _native_dumps([ep for ep in native_order(procs, focus_ranks) if not py[ep.pid].gone], exe,
                                budget, dump_timeout_s)
            steps.append(_step(node, "stacks", "ok", f"Python-only {t_py - t0:.2f}s, then native "
                                                     f"{time.time() - t_py:.2f}s of a {max(0.0, budget):.2f}s budget"))
        else:
            steps.append(_step(node, "stacks", "ok", f"Python-only {t_py - t0:.2f}s (native stacks follow the "
                                                     "written bundle)"))
    for ep in procs:
        t = time.time()
        p = py[ep.pid]
        n = nat.get(ep.pid)
        py_sample = StackSample(t=t, node=node, pid=ep.pid, title=ep.title, rank=ep.rank, native=False,
                                threads=p.threads, error=p.error, state=pid_state(ep.pid))
        py_now.append(py_sample)
        steps.append(_step(node, f"py-spy {ep.pid}", "ok" if p.error is None else "error",
                           p.error or f"{p.duration_s:.2f}s"))
        if n is not None and n.error is None:
            now_stacks.append(StackSample(t=t, node=node, pid=ep.pid, title=ep.title, rank=ep.rank, native=True,
                                          threads=n.threads))
            steps.append(_step(node, f"py-spy --native {ep.pid}", "ok", f"{n.duration_s:.2f}s"))
        elif not native:
            now_stacks.append(py_sample)
        else:
            if pyspy is None or p.gone:
                why = "target gone" if p.gone else "py-spy not found"
                status = "fallback"
            elif n is None:
                why, status = f"not begun within the capture's native budget ({max(0.0, budget):.2f}s)", "skipped"
            elif n.timed_out:
                why, status = f"not captured within the capture's native budget ({max(0.0, budget):.2f}s)", "timeout"
            else:
                why, status = n.error or "failed", "fallback"
            steps.append(_step(node, f"py-spy --native {ep.pid}", status, f"Python-only stack kept: {why}"))
            # The Python-only dump stands in for the native one, so every process has a capture-time stack.
            now_stacks.append(py_sample)
        if (n is not None and n.resumed) or p.resumed:
            steps.append(_step(node, f"resume {ep.pid}", "warn", "target was left stopped by py-spy; sent SIGCONT"))
    pstate = process_state([ep.pid for ep in procs])
    gpu_text: str | None = None
    if gpu_future is not None:
        gpu_text, why = gpu_future.result()
        steps.append(_step(node, "nvidia-smi -q", "ok" if gpu_text is not None else "skipped", why))
    gpu_pool.shutdown(wait=False)
    texts, log_text = scrubbed.result()
    scrub_pool.shutdown(wait=False)
    logs = [LogLine(t=ln.t, node=ln.node, text=x) for ln, x in zip(logs, texts, strict=True)]
    steps.append(_step(node, "capture", "ok", f"{time.time() - t0:.2f}s"))
    # The records stay objects (LOCAL): the coordinator's own part is used as it is, and wire() encodes a part only
    # when it crosses Ray (a peer's part). Encoding them here cost ~0.1-0.3 s of the GIL-bound critical path on an
    # H100 seat (10-40k probe records) for strings the coordinator never read.
    return {
        "node": node,
        "t": t0,
        "process_state": {"node": node, "processes": pstate},
        "gpu": gpu_text,
        "log_text": log_text,
        "scrubbed": True,  # logs and log_text (see above)
        "env": dict(env),
        "capture": steps,
        "versions": {"python": platform.python_version(), "py_spy": _pyspy_version(pyspy)},
        "requests": None if requests is None else list(requests),
        "request_redaction": dict(request_redaction or {}),
        "learned": None if learned is None else dict(learned),
        LOCAL: Parts(samples=[*samples, *py_now], native=now_stacks, probes=ProbeColumns.from_records(probes),
                     metrics=list(metrics),
                     logs=list(logs), processes=list(processes)),
    }


#: The key of a part's records as objects (in-process only).
LOCAL = "_records"


def wire(part: Mapping[str, Any]) -> dict[str, Any]:
    """A part as it crosses a process boundary: plain JSON values only (the records in the bundle's encodings)."""
    out = {k: v for k, v in part.items() if k != LOCAL}
    loc = part.get(LOCAL)
    if isinstance(loc, Parts):
        out |= {"samples_enc": encode_stack_samples(loc.samples).decode("utf-8"),
                "native_enc": encode_stack_samples(loc.native).decode("utf-8"),
                "probes_enc": encode_probe_records(loc.probes).decode("utf-8"),
                "metrics": [m.to_json() for m in loc.metrics], "logs": [ln.to_json() for ln in loc.logs],
                "processes": [p.to_json() for p in loc.processes]}
    if part.get("requests") is not None:
        out["requests"] = [r.to_json() if isinstance(r, RequestShape) else r for r in part["requests"]]
    return out


def node_native(*, node: int, procs: Sequence[EngineProc], pyspy: str | None, focus_ranks: Sequence[int] = (),
                budget_s: float = NATIVE_BUDGET_S, dump_timeout_s: float = 5.0, gpu: bool = True) -> dict[str, Any]:
    """A node's native stacks and ``nvidia-smi -q``, taken after the capture's bundle is on disk (what
    :func:`add_native` puts into it): by priority inside ``budget_s``, every native dump at once up to the cores."""
    t0 = time.time()
    gpu_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    gpu_future = gpu_pool.submit(nvidia_smi) if gpu else None
    steps: list[dict[str, Any]] = []
    native: list[StackSample] = []
    nat = _native_dumps(native_order(procs, focus_ranks), pyspy, budget_s, dump_timeout_s) if pyspy else {}
    for ep in procs:
        n = nat.get(ep.pid)
        if n is not None and n.error is None:
            native.append(StackSample(t=time.time(), node=node, pid=ep.pid, title=ep.title, rank=ep.rank,
                                      native=True, threads=n.threads))
            steps.append(_step(node, f"py-spy --native {ep.pid}", "ok", f"{n.duration_s:.2f}s after the bundle"))
        else:
            why, status = ("py-spy not found", "fallback") if pyspy is None else \
                (f"not begun within the native budget ({budget_s:.2f}s)", "skipped") if n is None else \
                (f"not captured within the native budget ({budget_s:.2f}s)", "timeout") if n.timed_out else \
                ("target gone" if n.gone else n.error or "failed", "fallback")
            steps.append(_step(node, f"py-spy --native {ep.pid}", status, f"Python-only stack kept: {why}"))
        if n is not None and n.resumed:
            steps.append(_step(node, f"resume {ep.pid}", "warn", "target was left stopped by py-spy; sent SIGCONT"))
    gpu_text: str | None = None
    if gpu_future is not None:
        gpu_text, why = gpu_future.result()
        steps.append(_step(node, "nvidia-smi -q", "ok" if gpu_text is not None else "skipped", why))
    gpu_pool.shutdown(wait=False)
    steps.append(_step(node, "native", "ok", f"{time.time() - t0:.2f}s"))
    return {"node": node, "native": [x.to_json() for x in native], "gpu": gpu_text, "capture": steps}


_PYSPY_VERSION: dict[str, str] = {}


def _pyspy_version(exe: str | None) -> str:
    if exe is None:
        return "missing"
    if exe not in _PYSPY_VERSION:
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, timeout=5, check=False).stdout
            _PYSPY_VERSION[exe] = out.decode("utf-8", "replace").strip().removeprefix("py-spy ") or "unknown"
        except (OSError, subprocess.TimeoutExpired):
            _PYSPY_VERSION[exe] = "unknown"
    return _PYSPY_VERSION[exe]


@dataclass(frozen=True, slots=True)
class Parts:
    """Node parts decoded back into records."""

    samples: list[StackSample]
    native: list[StackSample]
    probes: ProbeColumns
    metrics: list[MetricsPoint]
    logs: list[LogLine]
    processes: list[EngineProcess]


def _stacks(p: Mapping[str, Any], key: str) -> list[StackSample]:
    enc = p.get(f"{key}_enc")
    if isinstance(enc, str):
        return decode_stack_samples(io.BytesIO(enc.encode("utf-8")), f"node {p.get('node')}'s {key}")
    return [StackSample.from_json(d) for d in p.get(key, [])]


def _probes(p: Mapping[str, Any]) -> ProbeColumns:
    enc = p.get("probes_enc")
    if isinstance(enc, str):
        return decode_probe_records(io.BytesIO(enc.encode("utf-8")), f"node {p.get('node')}'s probes")
    return ProbeColumns.from_records([ProbeRecord.from_json(d) for d in p.get("probes", [])])


def decode_parts(parts: Sequence[Mapping[str, Any]]) -> Parts:
    """The parts' records: a part taken in this process as it is (its LOCAL objects), the others from their
    encodings (the bundle's stack table and probe columns; plain record lists are read too)."""
    each = [p[LOCAL] if isinstance(p.get(LOCAL), Parts) else Parts(
        samples=_stacks(p, "samples"), native=_stacks(p, "native"), probes=_probes(p),
        metrics=[MetricsPoint.from_json(d) for d in p.get("metrics", [])],
        logs=[LogLine.from_json(d) for d in p.get("logs", [])],
        processes=[EngineProcess.from_json(d) for d in p.get("processes", [])]) for p in parts]
    return Parts(samples=[x for q in each for x in q.samples], native=[x for q in each for x in q.native],
                 probes=ProbeColumns.concat([q.probes for q in each]), metrics=[x for q in each for x in q.metrics],
                 logs=[x for q in each for x in q.logs], processes=[x for q in each for x in q.processes])


def learned_of(parts: Sequence[Mapping[str, Any]]) -> LearnedThresholds | None:
    """Every node's learned thresholds as one (their shapes are named by node); None where no node sent any."""
    out: LearnedThresholds | None = None
    for p in parts:
        doc = p.get("learned")
        if isinstance(doc, Mapping):
            try:
                one = LearnedThresholds.from_json(dict(doc))
            except ValueError as exc:
                log.warning("node %s's learned thresholds are unreadable (%s): left out", p.get("node"), exc)
                continue
            out = one if out is None else out.merged(one)
    return out


def add_native(path: Path, natives: Sequence[Mapping[str, Any]], *, written_at: float) -> str | None:
    """Put the nodes' late parts (:func:`node_native`) into the written bundle at ``path``: the native stacks in
    place of the Python-only ones of the same processes, each node's nvidia-smi text. None, or why not (a log
    line: the bundle stays complete as written)."""
    try:
        bundle = read_bundle(path)
        got = {(int(x["node"]), int(x["pid"])): StackSample.from_json(x) for n in natives for x in n.get("native", [])}
        stacks = [got.get((s.node, s.pid), s) for s in bundle.native_stacks]
        files = {layout.NATIVE_STACKS: encode_stack_samples(sorted(stacks, key=lambda s: (s.node, s.pid)))}
        files |= {layout.gpu_file(int(n["node"])): encode_text(str(n["gpu"])) for n in natives if n.get("gpu")}
        steps = [dict(st) for n in natives for st in n.get("capture", [])]
        add_late_files(path, files, steps, {"t": time.time(), "after_bundle_s": round(time.time() - written_at, 3),
                                            "native_stacks": len(got), "nodes": len(natives)})
    except (BundleError, OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("bundle %s: its native stacks could not be added (%s); it stays as written", path, exc)
        return str(exc)
    return None


def bundle_id_for(verdict: Verdict | None, t: float) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(t)) + f"{t % 1:.3f}"[1:]
    if verdict is None:
        return f"{stamp}-manual"
    slug = verdict.kind.value.replace(" ", "-")
    return f"{stamp}-{slug}" + (f"-r{verdict.rank}" if verdict.rank is not None else "")


@dataclass(frozen=True, slots=True)
class CaptureResult:
    """One capture's outcome. On failure ``error`` says why, ``reason`` is its short word
    (:func:`sgl_seat.forensics.format.bundle.failure_reason`: disk-full, read-only, ...) and ``incomplete`` what the
    disk kept ({path, written, missing, reason, marker}; None when the bundle failed before a byte was written)."""

    path: str | None
    bundle_id: str
    verdict: Verdict | None
    error: str | None
    seconds: float
    reason: str | None = None
    incomplete: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        doc = {"path": self.path, "bundle_id": self.bundle_id, "error": self.error, "seconds": self.seconds,
               "verdict": self.verdict.to_json() if self.verdict else None}
        if self.error is not None:
            doc |= {"reason": self.reason, "incomplete": self.incomplete}
        return doc


def assemble(
    *,
    seat: str,
    parts: Sequence[Mapping[str, Any]],
    trigger: Mapping[str, Any],
    trigger_verdict: Verdict | None,
    thresholds: WatchdogSpec,
    rank_nodes: Mapping[int, int],
    plan: Mapping[str, Any] | None,
    dest_root: Path,
    quota_mb: int,
    words: EngineWords,
    missing: Sequence[dict[str, Any]] = (),
    now: float | None = None,
) -> CaptureResult:
    """Merge node parts, decide the seat-wide verdict and write one bundle. Never raises for disk trouble."""
    t_start = time.time()
    dec = decode_parts(parts)
    learned = learned_of(parts)
    obs = Observation.of(samples=dec.samples, probes=dec.probes, metrics=dec.metrics, logs=dec.logs,
                         processes=dec.processes, rank_nodes=rank_nodes, learned=learned, words=words)
    t_eval = now if now is not None else time.time()
    verdict = detect(obs, thresholds, t_eval)
    nodes = sorted({int(p["node"]) for p in parts})
    lost = missing_nodes(rank_nodes, nodes)
    why = {int(m["node"]): str(m.get("detail") or "") for m in missing if isinstance(m.get("node"), int)}
    seen = {int(m["node"]): str(m["last_seen"]) for m in missing
            if isinstance(m.get("node"), int) and m.get("last_seen")}
    checks = {int(p["node"]): SelfCheck.from_json(p["self_check"]) for p in parts
              if isinstance(p.get("self_check"), Mapping)}
    # Over half the ranks "every rank waits in a collective" is no finding: the missing node is (or the node that
    # isolated itself, from its own evidence: core.nodeloss.loss_verdict).
    lv = loss_verdict(rank_nodes, nodes, t_eval, checks=checks, why=why, last_seen=seen, partial=verdict)
    if lv is not None:
        verdict = lv
    reproducible = verdict is not None
    if verdict is None:
        verdict = trigger_verdict
    bid = bundle_id_for(verdict, float(trigger.get("t") or t_eval))
    steps = [dict(s) for p in parts for s in p.get("capture", [])] + [
        {k: v for k, v in m.items() if k != "last_seen"} for m in missing]
    redaction: dict[str, Any] = {"prompts": "not captured", "locals": False}
    recorded = [p for p in parts if p.get("requests") is not None]
    shapes: list[RequestShape] | None = None
    if recorded:
        shapes = sorted((d if isinstance(d, RequestShape) else RequestShape.from_json(d)
                         for p in recorded for d in p["requests"]), key=lambda r: r.t)
        redaction = {**{k: v for k, v in (recorded[0].get("request_redaction") or {}).items()
                        if v is None or isinstance(v, (bool, int, float, str))},
                     "requests": len(shapes), "locals": False}
    files = encode_bundle(
        stacks=obs.samples, native_stacks=sorted(dec.native, key=lambda s: (s.node, s.pid)), probes=obs.probes,
        metrics=obs.metrics, processes=obs.processes, logs=obs.logs,
        env={int(p["node"]): dict(p.get("env") or {}) for p in parts}, requests=shapes,
        log_text={int(p["node"]): str(p.get("log_text") or "") for p in parts},
        logs_scrubbed=all(p.get("scrubbed") is True for p in parts),
        process_state={int(p["node"]): p.get("process_state") or {} for p in parts},
        gpu={int(p["node"]): str(p["gpu"]) for p in parts if p.get("gpu")})
    starts = [s.t for s in obs.samples] + [m.t for m in obs.metrics] + obs.probes.start.tolist()
    t_end = max([t_eval, *(float(p.get("t") or 0) for p in parts)])
    versions: dict[str, Any] = {"sgl_seat": __version__, "python": platform.python_version()}
    for p in parts:
        for k, v in (p.get("versions") or {}).items():
            versions.setdefault(k, v)
    trig = {k: v for k, v in trigger.items() if v is None or isinstance(v, (bool, int, float, str))}
    trig["reproduced"] = reproducible
    fields: dict[str, Any] = {
        "seat": seat,
        "plan": dict(plan) if plan is not None else None,
        "trigger": trig,
        "verdict": verdict.to_json() if verdict else None,
        # What the triggering sidecar concluded live, from its own node's view, before the merge: the one
        # verdict in the bundle that was not computed from the bundle's records (replay compares with it).
        "live_verdict": trigger_verdict.to_json() if trigger_verdict else None,
        "nodes": nodes,
        "ranks": sorted(rank_nodes),
        "rank_nodes": {str(r): n for r, n in sorted(rank_nodes.items())},
        "time_range": {"start": min(starts) if starts else t_end, "end": t_end},
        "thresholds": thresholds.model_dump(),
        "versions": versions,
        "redaction": redaction,
        "capture": steps,
    }
    if words.engine:  # optional in schema 1: whose names the records carry (replay reads them by its words)
        fields["engine"] = words.engine
    if learned is not None:  # optional in schema 1: the thresholds learned from healthy calls (core.learned)
        fields["learned"] = learned.to_json()
    if checks:  # optional in schema 1: the nodes' own looks at their side (core.isolation), node -> check
        fields["self_check"] = {str(n): c.to_json() for n, c in sorted(checks.items())}
    if lost:  # optional in schema 1: absent when every node answered
        fields["missing_nodes"] = [{"node": n, "ranks": ranks_of(rank_nodes, n), "detail": why.get(n, "")[:300]}
                                   for n in lost]
    try:
        path = write_bundle(dest_root, bid, fields, files, quota_mb=quota_mb)
    except (BundleError, OSError) as exc:
        msg = str(exc).splitlines()[0]
        log.error("capture of seat %s failed, the seat keeps serving: %s", seat, msg)
        return CaptureResult(None, bid, verdict, msg, time.time() - t_start, reason=failure_reason(exc),
                             incomplete=exc.to_json() if isinstance(exc, BundleWriteError) else None)
    log.warning("seat %s: hang bundle %s (%s)", seat, path,
                f"{verdict.kind.value}, rank {verdict.rank}, node {verdict.node}, {verdict.frame}" if verdict else "")
    return CaptureResult(str(path), bid, verdict, None, time.time() - t_start)
