#!/usr/bin/env python3
"""Healing by policy, measured: hang -> bundle -> engines stopped -> serving again, per injected stall (issue 26).

Brings a seat up with `sgl-seat up --on-hang POLICY` (the seat's supervisor, a detached Ray actor, acts on each
complete bundle), keeps a little traffic on it, and injects stalls one after another with `sgl-seat fault`. For
each stall it takes, all measured in this one run:

- hang: when `sgl-seat fault` applied the stall (its own ``applied_t``);
- bundle: the bundle's manifest ``created``;
- engines stopped: the supervisor's ``engines_stopped`` (every engine process group gone);
- healthy: the first 200 from rank 0's health route (``/health_generate`` on SGLang and the sim), polled by this
  script every 0.2 s from the client side;
- serving again: the first request this script gets back whole after the stall (``/generate``), also polled;
  the supervisor's own ``serving_again`` is printed beside it.

It prints p50 and p95 (and max) per stage over the stalls. ``rollback-draft`` turns the draft off for good, so
each of its stalls gets a fresh seat (`up --draft on`, one stall, `down`); ``restart`` keeps one seat for all its
stalls (budget raised to the run's size, no cooldown). On ``local-sglang`` (real SGLang's CPU engine: no draft,
so ``restart``) the engine's own start time is printed beside it: SGLang's "Application startup complete" less
its process's start, from the node-0 log. Beside everything, SGLang's own watchdog as measured on the real engine
here (``bench/results/real_watchdog_race_300s.txt``): it kills the server after its timeout and serves nothing
afterwards. The sim's figures are synthetic engine figures (its start is a stand-in for weight loading); the
supervisor's and the watchdog's are real.

    python bench/remediation.py --seat local-sim --policy restart --stalls 10
    python bench/remediation.py --seat local-sim --policy rollback-draft --stalls 10
    python bench/remediation.py --seat local-sglang --policy restart --stalls 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from sgl_seat.forensics.recording.loadgen import Load, posting, request_body

REPO = Path(__file__).resolve().parents[1]
SEATS = REPO / "launch" / "seats"
RACE = REPO / "bench" / "results" / "real_watchdog_race_300s.txt"
#: Per seat: the stall to inject (the sim's own host row-fetch stall on rank 3; the probe's stall inside real
#: SGLang's embedding lookup on rank 1), the port block, and how long a stall may take to be healed.
SEAT_FAULT = {"local-sim": "rowfetch-stall:rank=3", "local-sglang": "probe-stall:rank=1,for_s=3600"}
PORT = {"local-sim": 27300, "local-sglang": 27400}
HEAL_TIMEOUT = {"local-sim": 180.0, "local-sglang": 900.0}


def cli(args: list[str], home: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGLSEAT_HOME": str(home), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    exe = shutil.which("sgl-seat") or str(Path(sys.executable).parent / "sgl-seat")
    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def write_spec(seat: str, work: Path, policy: str, stalls: int) -> Path:
    src = SEATS / f"{seat}.yaml"
    doc: dict[str, Any] = yaml.safe_load(src.read_text())
    doc["name"] = f"bench-heal-{seat.removeprefix('local-')}"
    doc["network"]["http_port"], doc["network"]["dist_init_port"] = PORT[seat], PORT[seat] + 5
    cfg = doc.get("model", {}).get("config")
    if cfg and not Path(cfg).is_absolute():
        doc["model"]["config"] = str((src.parent / cfg).resolve())
    doc.setdefault("watchdog", {})["on_hang"] = policy
    doc["watchdog"]["remediation"] = {"max": stalls + 2, "window_s": 3600, "cooldown_s": 0}
    if seat == "local-sim":
        doc["draft"]["enabled"] = policy == "rollback-draft"
    out = work / f"{doc['name']}.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def traffic(url: str, tokens: int) -> Load:
    """Two clients with long answers (so the stalled step is a decode step, which the draft shapes); an answer of any
    status is taken, a transport error pauses the client."""
    body = request_body("/generate", "bench", max_tokens=tokens, sampling={"ignore_eos": True})
    return Load(posting(url, "/generate", lambda i, n: body, check=False), concurrency=2, timeout=600.0)


@dataclass
class Stall:
    hang: float
    bundle: float | None = None
    stopped: float | None = None
    healthy: float | None = None
    serving: float | None = None
    supervisor_serving: float | None = None
    action: str | None = None
    outcome: str | None = None
    notes: list[str] = field(default_factory=list)

    def stages(self) -> dict[str, float | None]:
        def d(x: float | None) -> float | None:
            return None if x is None else x - self.hang

        return {"hang->bundle": d(self.bundle), "hang->engines stopped": d(self.stopped),
                "hang->healthy": d(self.healthy), "hang->serving again": d(self.serving),
                "hang->serving (supervisor)": d(self.supervisor_serving)}


def _ok(url: str, path: str) -> bool:
    try:
        if path == "/generate":
            body = {"text": "back?", "sampling_params": {"max_new_tokens": 2}}
            return httpx.post(f"{url}{path}", json=body, timeout=10, trust_env=False).status_code == 200
        return httpx.get(f"{url}{path}", timeout=5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def status(name: str, home: Path) -> dict[str, Any]:
    res = cli(["status", name, "--json"], home, timeout=120)
    doc: dict[str, Any] = json.loads(res.stdout) if res.stdout.strip() else {}
    return doc


def one_stall(name: str, home: Path, url: str, fault: str, heal_s: float, n_before: int) -> Stall:
    res = cli(["fault", fault, "--name", name, "--json"], home, timeout=120)
    if res.returncode != 0:
        raise SystemExit(f"sgl-seat fault failed: {res.stdout}{res.stderr}")
    doc = json.loads(res.stdout)
    applied = doc.get("applied_t") or next((r.get("applied_t") for r in doc.get("results", []) if r.get("applied_t")),
                                           None) or time.time()
    st = Stall(hang=float(applied))
    deadline = time.time() + heal_s
    down_seen = False
    while time.time() < deadline and st.serving is None:
        if not down_seen and not _ok(url, "/health_generate"):
            down_seen = True
        if down_seen and st.healthy is None and _ok(url, "/health_generate"):
            st.healthy = time.time()
        if st.healthy is not None and _ok(url, "/generate"):
            st.serving = time.time()
        time.sleep(0.2)
    for _ in range(60):
        hist = status(name, home).get("remediation", {}).get("history", [])
        if len(hist) > n_before and hist[-1]["outcome"] != "pending":
            r = hist[-1]
            st.stopped, st.supervisor_serving = r.get("engines_stopped"), r.get("serving_again")
            st.action, st.outcome = r["action"], r["outcome"]
            bundles = sorted((home / "bundles" / name).glob("*/manifest.json"))
            by_id = {p.parent.name: p for p in bundles}
            m = by_id.get(r.get("bundle_id") or "")
            if m is not None:
                st.bundle = json.loads(m.read_text())["created"]
            break
        time.sleep(2.0)
    return st


def engine_start_s(home: Path, name: str) -> float | None:
    """SGLang's own start on node 0: 'Application startup complete' less the first line's time, from its log."""
    log = home / "logs" / name / "node0.log"
    if not log.is_file():
        return None
    import re

    stamps = [(m.group(1), line) for line in log.read_text(errors="replace").splitlines()
              if (m := re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", line))]
    first = stamps[0][0] if stamps else None
    done = [s for s, line in stamps if "Application startup complete" in line]
    if not first or not done:
        return None
    fmt = "%Y-%m-%d %H:%M:%S"
    return time.mktime(time.strptime(done[-1], fmt)) - time.mktime(time.strptime(first, fmt))


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def table(stalls: list[Stall]) -> str:
    rows = ["| stage | n | p50 s | p95 s | max s |", "| --- | --- | --- | --- | --- |"]
    keys = list(stalls[0].stages()) if stalls else []
    for k in keys:
        xs = [v for s in stalls if (v := s.stages()[k]) is not None]
        if xs:
            rows.append(f"| {k} | {len(xs)} | {statistics.median(xs):.2f} | {pct(xs, 0.95):.2f} | {max(xs):.2f} |")
        else:
            rows.append(f"| {k} | 0 | - | - | - |")
    return "\n".join(rows)


def sglang_exit_lines() -> list[str]:
    """The race's table rows at SGLang's default 300 s timeout (each fault once: its last run)."""
    if not RACE.is_file():
        return [f"(no {RACE.relative_to(REPO)} here)"]
    lines = RACE.read_text().splitlines()
    head = next((ln for ln in lines if ln.startswith("fault ") and "timeout" in ln), None)
    rows: dict[str, str] = {}
    for ln in lines:
        parts = ln.split()
        if len(parts) > 2 and parts[1] == "300" and parts[2] == "|":
            rows[parts[0]] = ln
    return ([head] if head else []) + list(rows.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seat", choices=sorted(SEAT_FAULT), default="local-sim")
    ap.add_argument("--policy", choices=("restart", "rollback-draft"), default="restart")
    ap.add_argument("--stalls", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.seat == "local-sglang" and a.policy == "rollback-draft":
        ap.error("local-sglang runs without the draft (SGLang's CPU engine refuses it): use --policy restart")
    work = Path(tempfile.mkdtemp(prefix="bench-heal-"))
    home = work / "home"
    spec = write_spec(a.seat, work, a.policy, a.stalls)
    name = yaml.safe_load(spec.read_text())["name"]
    url = f"http://127.0.0.1:{PORT[a.seat]}"
    fault = SEAT_FAULT[a.seat]
    per_seat = 1 if a.policy == "rollback-draft" else a.stalls
    stalls: list[Stall] = []
    ups: list[float] = []
    starts: list[float] = []
    t0 = time.time()
    while len(stalls) < a.stalls:
        args = ["up", "--seat", str(spec), "--timeout", "900"]
        if a.seat == "local-sim":
            args += ["--draft", "on" if a.policy == "rollback-draft" else "off"]
        tu = time.time()
        up = cli(args, home, timeout=960)
        if up.returncode != 0:
            print(up.stdout, up.stderr, file=sys.stderr)
            cli(["down", name], home, timeout=300)
            return 1
        ups.append(time.time() - tu)
        if (s := engine_start_s(home, name)) is not None:
            starts.append(s)
        tr = traffic(url, 512 if a.seat == "local-sim" else 32).start()
        try:
            time.sleep(8.0)  # past the first prefills
            for _ in range(min(per_seat, a.stalls - len(stalls))):
                n_before = len(status(name, home).get("remediation", {}).get("history", []))
                st = one_stall(name, home, url, fault, HEAL_TIMEOUT[a.seat], n_before)
                stalls.append(st)
                if (s := engine_start_s(home, name)) is not None:
                    starts.append(s)
                print(f"stall {len(stalls)}/{a.stalls}: {st.action} {st.outcome} "
                      + " ".join(f"{k.split('->')[1]}={v:.1f}" for k, v in st.stages().items() if v is not None),
                      file=sys.stderr, flush=True)
                time.sleep(3.0)
        finally:
            tr.halt()
            down = cli(["down", name], home, timeout=300)
            if down.returncode != 0:
                print(down.stdout, down.stderr, file=sys.stderr)
    wall = time.time() - t0
    lines = [f"# bench/remediation.py --seat {a.seat} --policy {a.policy} --stalls {a.stalls}",
             f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {os.cpu_count()} cores, wall {wall:.0f} s; fault {fault}",
             f"# actions: {sorted({(s.action, s.outcome) for s in stalls}, key=str)}",
             "", table(stalls), ""]
    if starts:
        lines.append(f"engine start (SGLang's own log, node 0: first line to 'Application startup complete'): "
                     f"p50 {statistics.median(starts):.0f} s over {len(starts)} starts")
    lines.append(f"`sgl-seat up` of the seat: p50 {statistics.median(ups):.1f} s over {len(ups)}")
    if a.seat == "local-sim":
        lines.append("The sim's engine start is synthetic (no weights); the supervisor's steps are real.")
    lines += ["", "Beside it, SGLang's own watchdog on the real engine (measured, bench/results/"
              "real_watchdog_race_300s.txt): it fires after its timeout and serves nothing afterwards:",
              *sglang_exit_lines()]
    print("\n".join(lines))
    if a.json:
        print(json.dumps({"seat": a.seat, "policy": a.policy, "stalls": [s.__dict__ for s in stalls],
                          "ups_s": ups, "engine_start_s": starts}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
