#!/usr/bin/env python3
"""The race on real SGLang 0.5.23: sgl-seat's watchdog against SGLang's own, fault by fault, side by side.

Each case is a fresh ``local-sglang`` rehearsal seat (SGLang's CPU engine, TP2 over two nodes on this host,
brought up by ``sgl-seat up``, so the real sidecars run) with SGLang's ``--watchdog-timeout`` set through
``watchdog.engine_timeout_s`` (its default, 300 s, or 20 s). One streamed completion is in flight when the fault
lands (except ``sigstop-idle``, where nothing runs and one request is sent after the stop). Faults:

- ``probe-stall``: rank 1's embedding lookup stalls inside real SGLang (``sgl-seat fault probe-stall:rank=1``);
- ``sigstop-decode``: rank 1's scheduler SIGSTOPped mid-decode; ``sigstop-idle``: the same on an idle seat;
- ``sigkill``: rank 1's scheduler SIGKILLed mid-decode;
- ``detok-stop``: node 0's detokenizer SIGSTOPped mid-decode.

Observed for ``--observe-s`` past 1.5 timeouts (SGLang's watchdog checks its forward counter every half timeout,
so it fires 1 to 1.5 timeouts after the last progress it saw; then SIGQUIT and its crash
diagnostics, a 60 s wait "for CUDA coredumps", then the kill: ``sglang-cpu.md``), or until both sides are done.
Printed per case: seconds from the fault to sgl-seat's first diagnosis (its detector's trigger) and to a complete
bundle, and to SGLang's first watchdog line (its own debug dump or "Scheduler watchdog timeout") and to its
killing the tree; whether each named the culprit (sgl-seat: the verdict's rank, or the detokenizer; SGLang: a
watchdog line from the culprit's own process, which cannot log while it is stopped); what each left behind; and
whether the request in flight got its answer within the window. Times are this host's ``time.time()``: the
fault's from `sgl-seat fault` (the agent's clock as it acted), SGLang's lines as this script read them from the
node logs (polled every 0.2 s). The engine and its watchdog are real; the model is the profile's (the trained
SmolLM2-135M-Instruct since 2026-12-06; the committed results were measured on a tiny model with random weights).

Usage::

    python bench/real_watchdog_race.py [--timeouts 300,20] [--faults probe-stall,sigstop-decode,...]
                                       [--observe-s 100] [--json] [--keep]

Ports 24300-24399. Needs the engine environment (bash scripts/setup.sh --engine sglang) and no other local Ray
cluster running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "launch" / "seats" / "local-sglang.yaml"
HTTP_PORT, DIST_PORT = 24300, 24305
NAME = "race"
FAULTS = {
    "probe-stall": "probe-stall:rank=1",
    "sigstop-decode": "sigstop:rank=1",
    "sigstop-idle": "sigstop:rank=1",
    "sigkill": "sigkill:rank=1",
    "detok-stop": "sigstop:detokenizer",
}
RELEASE = {"probe-stall": "clear", "sigstop-decode": "sigcont:rank=1", "sigstop-idle": "sigcont:rank=1",
           "detok-stop": "sigcont:detokenizer"}
#: SGLang's own watchdog, as it logs (utils/watchdog.py, scheduler debug dump; sglang-cpu.md's timeline).
SGLANG_FIRST = ("Scheduler watchdog timeout", "Scheduler debug info", "py-spy dump")
SGLANG_TIMEOUT_LINE = "Scheduler watchdog timeout"
#: `up` tries per case (a failed start-up is reported in the case's notes).
UP_ATTEMPTS = 3


@dataclass
class Case:
    fault: str
    timeout_s: int
    seat_up_s: float = 0.0
    fault_t: float = 0.0
    ours_first_s: float | None = None
    ours_bundle_s: float | None = None
    ours_verdict: str | None = None
    ours_named: bool = False
    ours_left: str = "nothing"
    theirs_first_s: float | None = None
    theirs_timeout_line_s: float | None = None
    theirs_killed_s: float | None = None
    theirs_named: bool = False
    theirs_left: str = "nothing"
    request_answered: bool | None = None
    notes: list[str] = field(default_factory=list)


def cli(args: list[str], home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGLSEAT_HOME": str(home), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    return subprocess.run([sys.executable, "-m", "sgl_seat.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _logs_text(home: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (home / "logs" / NAME).glob("node*.log"))


def write_spec(directory: Path, timeout_s: int) -> Path:
    doc: dict[str, Any] = yaml.safe_load(PROFILE.read_text())
    doc["name"] = NAME
    doc["network"]["http_port"], doc["network"]["dist_init_port"] = HTTP_PORT, DIST_PORT
    doc.setdefault("watchdog", {})["engine_timeout_s"] = timeout_s
    path = directory / f"race-{timeout_s}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class LogWatch:
    """Timestamps every new line of the seat's node logs as this process reads it (every 0.2 s)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.lines: list[tuple[float, int, str]] = []
        self.offsets: dict[Path, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for node in (0, 1):
                p = self.logs / f"node{node}.log"
                if not p.is_file():
                    continue
                off = self.offsets.get(p)
                if off is None:  # first sight: only what comes after the start counts
                    off = self.offsets[p] = p.stat().st_size
                with p.open("rb") as fh:
                    fh.seek(off)
                    data = fh.read()
                if not data:
                    self.offsets[p] = off
                    continue
                cut = data.rfind(b"\n") + 1
                now = time.time()
                for raw in data[:cut].splitlines():
                    self.lines.append((now, node, raw.decode("utf-8", "replace")))
                self.offsets[p] = off + cut
            time.sleep(0.2)

    def first(self, needles: tuple[str, ...], since: float) -> tuple[float, int, str] | None:
        return next(((t, n, s) for t, n, s in self.lines if t >= since and any(x in s for x in needles)), None)


def in_flight_request(endpoint: str, out: dict[str, Any], started: threading.Event, window_s: float) -> None:
    """One streamed completion; ``out['answered']`` True when its stream ended with [DONE] in the window."""
    model = yaml.safe_load(PROFILE.read_text())["model"]["served_name"]
    body = {"model": model, "prompt": "the request in flight", "max_tokens": 1500, "ignore_eos": True,
            "stream": True}
    out["answered"] = False
    try:
        with httpx.stream("POST", f"{endpoint}/v1/completions", json=body, timeout=window_s,
                          trust_env=False) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    started.set()
                    if line.strip() == "data: [DONE]":
                        out["answered"] = True
                        return
    except httpx.HTTPError as exc:
        out["error"] = type(exc).__name__
    finally:
        started.set()


def engine_alive(home: Path) -> bool:
    from sgl_seat import envcompat

    for q in psutil.process_iter():
        try:
            if envcompat.lookup(q.environ(), "SGLSEAT_NAME") == NAME and q.status() != psutil.STATUS_ZOMBIE:
                return True
        except (psutil.Error, OSError):
            continue
    return False


def bundles(home: Path) -> set[Path]:
    from sgl_seat.forensics.format.store import complete_bundles

    return complete_bundles(home / "bundles" / NAME)


def run_case(fault: str, timeout_s: int, work: Path, observe_s: float) -> Case:
    case = Case(fault=fault, timeout_s=timeout_s)
    home = work / f"home-{fault}-{timeout_s}"
    spec = write_spec(work, timeout_s)
    for attempt in range(1, UP_ATTEMPTS + 1):
        t0 = time.monotonic()
        up = cli(["up", "--seat", str(spec), "--timeout", "600"], home, timeout=700)
        case.seat_up_s = time.monotonic() - t0
        if up.returncode == 0:
            break
        # SGLang's own watchdog can fire on the start-up warm-up forward (a short timeout on a loaded CPU).
        out = up.stdout + up.stderr
        why = "SGLang's watchdog fired during start-up" if "Scheduler watchdog timeout" in _logs_text(home) \
            else out[-300:]
        case.notes.append(f"up attempt {attempt} failed ({case.seat_up_s:.0f} s): {why}")
        cli(["down", NAME], home, timeout=240)
    else:
        return case
    endpoint = f"http://127.0.0.1:{HTTP_PORT}"
    watch = LogWatch(home / "logs" / NAME)
    watch.thread.start()
    req: dict[str, Any] = {}
    # SGLang's watchdog (utils/watchdog.py) checks its forward counter every timeout/2, so it fires between 1 and
    # 1.5 timeouts after the last progress it saw: the window covers the latest, then --observe-s of its aftermath.
    window = 1.5 * timeout_s + observe_s
    try:
        started = threading.Event()
        if fault != "sigstop-idle":
            threading.Thread(target=in_flight_request, args=(endpoint, req, started, window), daemon=True).start()
            started.wait(120)
            time.sleep(1.0)  # well into the decode
        before = bundles(home)
        res = cli(["fault", FAULTS[fault], "--name", NAME, "--json"], home, timeout=90)
        if res.returncode != 0:
            case.notes.append(f"fault failed: {res.stderr[-300:]}")
            return case
        doc = json.loads(res.stdout)
        case.fault_t = float(doc.get("applied_t") or doc["t"])
        if fault == "sigstop-idle":
            threading.Thread(target=in_flight_request, args=(endpoint, req, started, window), daemon=True).start()
        deadline = case.fault_t + window
        while time.time() < deadline:
            new = sorted(bundles(home) - before)
            theirs_dead = case.theirs_killed_s is not None
            if new and case.ours_bundle_s is None:
                m = json.loads((new[0] / "manifest.json").read_text())
                v = m.get("verdict") or {}
                case.ours_first_s = m["trigger"]["t"] - case.fault_t
                case.ours_bundle_s = m["created"] - case.fault_t
                case.ours_verdict = f"{v.get('kind')} rank {v.get('rank')} node {v.get('node')}"
                want_detok = fault == "detok-stop"
                case.ours_named = (v.get("rank") is None and any("detokenizer" in e for e in v.get("evidence", []))
                                   if want_detok else v.get("rank") == 1)
                size = sum(f.stat().st_size for f in new[0].rglob("*") if f.is_file())
                case.ours_left = (f"bundle {new[0].name}: {len(m.get('files', {}))} files, {size / 1e6:.1f} MB, "
                                  f"{len(m.get('ranks', []))} ranks' stacks, history "
                                  f"{m['time_range']['end'] - m['time_range']['start']:.0f} s")
            if case.theirs_killed_s is None and not engine_alive(home):
                case.theirs_killed_s = time.time() - case.fault_t
            done_ours = case.ours_bundle_s is not None
            if done_ours and (theirs_dead or (req.get("answered") and fault != "sigstop-idle")):
                break
            time.sleep(0.2)
        first = watch.first(SGLANG_FIRST, case.fault_t)
        line = watch.first((SGLANG_TIMEOUT_LINE,), case.fault_t)
        if first is not None:
            case.theirs_first_s = first[0] - case.fault_t
            case.theirs_named = " TP1]" in first[2] if fault != "detok-stop" else "detokenizer" in first[2].lower()
        if line is not None:
            case.theirs_timeout_line_s = line[0] - case.fault_t
        theirs = [s for t, _, s in watch.lines if t >= case.fault_t and any(x in s for x in (*SGLANG_FIRST,
                  "All pyspy dump attempts failed", "Waiting", "SIGQUIT", "coredump"))]
        if theirs:
            case.theirs_left = f"{len(theirs)} log lines (no history), e.g. {theirs[0][:90]!r}"
        case.request_answered = bool(req.get("answered"))
    finally:
        watch.stop.set()
        if fault in RELEASE:  # the agents answer even where the engine died (a probe stall's file must go)
            cli(["fault", RELEASE[fault], "--name", NAME], home, timeout=90)
        down = cli(["down", NAME], home, timeout=240)
        if down.returncode != 0:
            case.notes.append(f"down: {down.stdout[-300:]}")
    return case


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(cases: list[Case]) -> str:
    head = (f"{'fault':<15}{'timeout':>8} | {'ours: diag':>10}{'bundle':>8}  {'named':<6}| "
            f"{'SGLang: 1st':>11}{'timeout':>8}{'killed':>8}  {'named':<6}| {'answered':<8}")
    out = [head, "-" * len(head)]
    for c in cases:
        out.append(f"{c.fault:<15}{c.timeout_s:>8} | {fmt(c.ours_first_s):>10}{fmt(c.ours_bundle_s):>8}  "
                   f"{'yes' if c.ours_named else 'no':<6}| {fmt(c.theirs_first_s):>11}"
                   f"{fmt(c.theirs_timeout_line_s):>8}{fmt(c.theirs_killed_s):>8}  "
                   f"{'yes' if c.theirs_named else 'no':<6}| {'yes' if c.request_answered else 'no':<8}")
    out.append("")
    for c in cases:
        out.append(f"{c.fault} @ {c.timeout_s} s: sgl-seat: {c.ours_verdict or 'no verdict'}; left {c.ours_left}")
        out.append(f"{'':>{len(c.fault) + len(str(c.timeout_s)) + 6}}SGLang: left {c.theirs_left}")
        for n in c.notes:
            out.append(f"    note: {n}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeouts", default="300,20", help="SGLang --watchdog-timeout values, comma-separated")
    ap.add_argument("--faults", default=",".join(FAULTS), help="faults, comma-separated: " + ", ".join(FAULTS))
    ap.add_argument("--observe-s", type=float, default=100.0,
                    help="seconds to watch past 1.5 timeouts (SGLang fires 1-1.5 timeouts after the last "
                         "progress it saw; at 20 s it had killed its tree 11 s after its first line)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (homes, bundles, logs)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sgl-seat-race-"))
    cases: list[Case] = []
    try:
        for t in (int(x) for x in args.timeouts.split(",")):
            for f in args.faults.split(","):
                if f not in FAULTS:
                    ap.error(f"unknown fault {f!r}")
                print(f"== {f}, --watchdog-timeout {t}", file=sys.stderr, flush=True)
                c = run_case(f, t, work, args.observe_s)
                print(f"   {asdict(c)}", file=sys.stderr, flush=True)
                cases.append(c)
    finally:
        print("real SGLang 0.5.23 CPU engine (tiny model, random weights), TP2 on two local nodes; seconds from the "
              "fault")
        print(table(cases))
        if args.json:
            print(json.dumps([asdict(c) for c in cases], indent=1))
        if args.keep:
            print(f"work directory: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
