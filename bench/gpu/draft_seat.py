"""`sgl-seat up --seat h200-1` with the draft off and on, on real SGLang 0.5.17 on one H200, through Ray (and
``--seat h200x2-tp2``: TP2 across two Ray nodes of one H200 each, on the device's 2-GPU kind).

What it does per arm (off, eagle, standalone, ngram), each through the product's own commands: ``plan --json``
(the KV pool and slot ceiling the plan predicts), ``up`` (local Ray cluster, placement group, node agent, the engine
from the offline engine package, the watchdog sidecar with the probe loaded through the plan's boot path),
``status --json`` (READY, the scheduler's pid and title), one streamed answer, the engine's own pool and slot cap
(``/get_server_info``: ``max_total_num_tokens``, ``max_running_requests``; and its "KV Cache is allocated" log
line) beside the plan's, the probe's records by target and gather size; with ``--stall`` (a draft arm) a rehearsal
stall of the probed graph replay during draft-on decode under load (``sgl-seat fault probe-stall:...``), the bundle
it gives (seconds from the fault, the rank and target it names, the gather buckets), ``replay --json`` and
``replay --html``; then ``down`` and a check that no engine process is left.

THE MODEL IS RANDOM WEIGHTS (``--load-format dummy``): an 8B-shaped Llama (hidden 4096, 32 layers, 8 KV heads,
vocabulary 1024) and random drafts (a 1-layer EAGLE head; a 4-layer STANDALONE draft of the same width). Say so
wherever a figure from here is shown.

The memory inputs of the plan are measured here, not fitted: the GPU's total memory and what a fresh CUDA process
holds (``torch.cuda.mem_get_info`` in the engine's interpreter) go into ``cluster.gpu_memory_gb`` and
``gpu.cuda_context_gb`` of the arm's spec copy; nothing is taken from the boot the plan is compared with.

    python bench/gpu/draft_seat.py --engine-venv ENG --out DIR [--home DIR] [--seat PROFILE] [--stall]
        [--stall-rank R] [--sigstop] ARM [ARM ...]

Run by the image's Python with the seat package and this checkout on PYTHONPATH (docs/gpu-validation.md has the
device call). Writes DIR/draft_seat.json and, per arm, the raw outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from rigs import promtext
from rigs.closedloop import closed_loop
from rigs.faulttimes import bundle_written_t, stalled_call_start

REPO = Path(__file__).resolve().parents[2]
PORT = 31300
ARMS: dict[str, dict[str, Any]] = {
    "off": {"enabled": False},
    "eagle": {"enabled": True, "algorithm": "EAGLE", "model": "llama-8b-shape-eagle"},
    "standalone": {"enabled": True, "algorithm": "STANDALONE", "model": "llama-8b-shape-4layers"},
    "ngram": {"enabled": True, "algorithm": "NGRAM", "draft_tokens": 12},
}
MODELS = ("llama-8b-shape", "llama-8b-shape-eagle", "llama-8b-shape-4layers")
#: With --trained: the model's own first k layers as a STANDALONE draft (trainedmodel.layer_skip, real weights).
SKIP_ARMS: dict[str, dict[str, Any]] = {
    f"skip{k}": {"enabled": True, "algorithm": "STANDALONE", "skip_layers": k} for k in (2, 4, 8, 15)}
ARMS.update(SKIP_ARMS)
#: Acceptance workloads, sampled as users do (temperature 0.7, end of sequence honoured): a list to copy (what an
#: n-gram draft feeds on), a question, code, free text.
WORKLOADS: dict[str, str] = {
    "copy-list": "Repeat this list exactly, one item per line: apple, banana, cherry, date, elderberry, fig, grape, "
                 "honeydew, kiwi, lemon, mango, nectarine, orange, papaya, quince, raspberry.",
    "question": "What is the capital of France? Answer in one sentence, then name two famous landmarks there.",
    "code": "Write a Python function that returns the n-th Fibonacci number, with a docstring and a short test.",
    "story": "Tell me a short story about a lighthouse keeper who finds a message in a bottle.",
}
KV_LINE = re.compile(r"KV Cache is allocated\. dtype: \S+, #tokens: (\d+)")


def cli(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "sgl_seat.cli.main", *args], env=env, capture_output=True,
                           text=True, timeout=timeout, check=False, cwd=str(REPO))
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = 124, str(exc.stdout or ""), f"timed out after {timeout} s"
    return {"args": args, "rc": rc, "stdout": out, "stderr": err[-4000:], "s": round(time.monotonic() - t0, 1)}


def as_json(res: dict[str, Any]) -> Any:
    try:
        return json.loads(res["stdout"])
    except (ValueError, TypeError):
        return None


def gpu_facts(engine_python: str) -> dict[str, Any]:
    """Total memory and what a fresh CUDA process holds, in the engine's own interpreter (its torch)."""
    code = ("import json, torch; free, total = torch.cuda.mem_get_info(0); "
            "print(json.dumps({'total_bytes': total, 'free_bytes': free, 'device': torch.cuda.get_device_name(0), "
            "'torch': torch.__version__}))")
    out = subprocess.run([engine_python, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    doc["context_bytes"] = doc["total_bytes"] - doc["free_bytes"]
    return doc


def write_spec(arm: str, facts: dict[str, Any], dest: Path, profile: str = "h200-1",
               trained: Path | None = None, eagle_head: Path | None = None) -> Path:
    doc: dict[str, Any] = yaml.safe_load((REPO / "launch" / "seats" / f"{profile}.yaml").read_text())
    models = REPO / "launch" / "models"
    doc["name"] = f"{profile}-{arm}"
    doc["model"]["config"] = str(models / "llama-8b-shape")
    if trained is not None:  # the trained model's own weights, its own config for planning
        doc["model"].update(path=str(trained), served_name=trained.name, config=str(trained))
        doc["gpu"]["load_format"] = "auto"
        a = ARMS[arm]
        d = doc["draft"]
        d["enabled"] = a["enabled"]
        d["algorithm"] = a.get("algorithm", d["algorithm"])
        if a.get("skip_layers"):
            skip = trained.parent / f"{trained.name}-skip{a['skip_layers']}"
            d.update(model_path=str(skip), config=str(skip))
        elif arm == "eagle":  # the head eaglehead.py trained from this model's generations (SGLang's flavour)
            if eagle_head is None:
                raise SystemExit("the eagle arm of the trained model needs --eagle-head DIR (eaglehead.py's sglang/)")
            d.update(model_path=str(eagle_head), config=str(eagle_head), steps=3, topk=1, draft_tokens=4)
        else:
            d.pop("model_path", None)
            d.pop("config", None)
            if a.get("algorithm") == "NGRAM":
                d["draft_tokens"] = a["draft_tokens"]
    else:
        _random_draft(doc, arm, models)
    doc["cluster"]["gpu_memory_gb"] = facts["total_bytes"] / (1 << 30)
    doc["gpu"]["cuda_context_gb"] = facts["context_bytes"] / (1 << 30)
    path = dest / f"{profile}-{arm}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _random_draft(doc: dict[str, Any], arm: str, models: Path) -> None:
    a = ARMS[arm]
    d = doc["draft"]
    d["config"] = str(models / Path(d["config"]).name)
    d["enabled"] = a["enabled"]
    if a.get("algorithm"):
        d["algorithm"] = a["algorithm"]
    if a.get("model"):
        d["model_path"] = "${engine_venv}/models/" + a["model"]
        d["config"] = str(models / a["model"])
    elif a.get("algorithm") == "NGRAM":
        d.pop("model_path", None)
        d.pop("config", None)
        d["draft_tokens"] = a["draft_tokens"]


def stream_once(prompt: str, max_tokens: int = 32, timeout: float = 120) -> dict[str, Any]:
    body = json.dumps({"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    chunks, first = 0, None
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for line in resp:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                chunks += 1
                first = first or time.monotonic() - t0
    return {"chunks": chunks, "first_chunk_s": round(first or -1, 3), "s": round(time.monotonic() - t0, 3)}


def get_json(path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=30) as resp:
        return json.loads(resp.read())


def metric_sums(names: tuple[str, ...]) -> dict[str, float]:
    """Each named metric of /metrics summed over its label sets (SGLang's own counters)."""
    return promtext.metric_sums(f"http://127.0.0.1:{PORT}/metrics", names)


COUNTERS = ("sglang:generation_tokens_total", "sglang:spec_verify_calls_total")


def chat(prompt: str, max_tokens: int = 256, temperature: float = 0.7, timeout: float = 180) -> int:
    """One sampled chat completion (end of sequence honoured); its completion tokens."""
    body = json.dumps({"model": "default", "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": temperature}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return int(json.loads(resp.read())["usage"]["completion_tokens"])


def acceptance(requests: int) -> dict[str, Any]:
    """Per workload, one client, ``requests`` sampled answers: output tokens/s and the engine's own accept length
    (generated tokens / verify calls, from its counters' change over the workload; None with the draft off)."""
    out: dict[str, Any] = {}
    for name, prompt in WORKLOADS.items():
        before = metric_sums(COUNTERS)
        t0 = time.monotonic()
        tokens = sum(chat(prompt) for _ in range(requests))
        dt = time.monotonic() - t0
        after = metric_sums(COUNTERS)
        gen = after[COUNTERS[0]] - before[COUNTERS[0]]
        verify = after[COUNTERS[1]] - before[COUNTERS[1]]
        out[name] = {"requests": requests, "tokens": tokens, "s": round(dt, 2), "tok_s": round(tokens / dt, 1),
                     "accept_length": round(gen / verify, 3) if verify else None,
                     "generated": gen, "verify_calls": verify}
    return out


def throughput(clients: int, seconds: float) -> dict[str, Any]:
    """Closed loop, ``clients`` at once, the workloads in turn, sampled, for ``seconds``: the answers finished inside
    the window (``tokens``, ``ok``) and the engine's generated tokens over it. (Before 2026-12-06 14:30 UTC the
    answers in flight at the window's end were waited for and counted, and the time with them: the H100 tables of
    that day's runs 1-5 were measured so.)"""
    before = metric_sums(COUNTERS)
    res = closed_loop(chat, list(WORKLOADS.values()), clients, seconds, at_stop=lambda: metric_sums(COUNTERS))
    after = res.pop("at_stop")
    gen = after[COUNTERS[0]] - before[COUNTERS[0]]
    verify = after[COUNTERS[1]] - before[COUNTERS[1]]
    return {**res, "generated_tok_s": round(gen / res["s"], 1),
            "accept_length": round(gen / verify, 3) if verify else None}


class Load:
    """Closed-loop streamed clients until stopped; counts answers and failures."""

    def __init__(self, clients: int, max_tokens: int = 128) -> None:
        self.stop = threading.Event()
        self.ok = self.failed = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i, max_tokens), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self, i: int, max_tokens: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                stream_once(f"client {i} request {n}: the seat decodes", max_tokens, timeout=180)
                with self.lock:
                    self.ok += 1
            except Exception:
                with self.lock:
                    self.failed += 1
                time.sleep(0.5)

    def close(self) -> dict[str, int]:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=200)
        return {"ok": self.ok, "failed": self.failed}


def engine_processes() -> list[dict[str, Any]]:
    """Every process that is SGLang's (title ``sglang::...`` or ``-m sglang.launch_server``)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd.startswith("sglang::") or "sglang.launch_server" in cmd:
            out.append({"pid": int(d.name), "cmd": cmd[:200]})
    return out


def bundles_of(home: Path, seat: str) -> set[Path]:
    root = home / "bundles" / seat
    return {p for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()


def wait_bundle(home: Path, seat: str, before: set[Path], timeout: float) -> Path | None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for p in sorted(bundles_of(home, seat) - before):
            if (p / "manifest.json").is_file():
                return p
        time.sleep(0.2)
    return None


def stopped(seat: str, ns: argparse.Namespace, env: dict[str, str], d: Path) -> dict[str, Any]:
    """SIGSTOP rank ``--stall-rank``'s scheduler under the load until a bundle comes, then SIGCONT."""
    time.sleep(5)  # the stall's bundle latch releases and decode resumes
    before = bundles_of(ns.home, seat)
    t0 = time.monotonic()
    fault = cli(["fault", f"sigstop:rank={ns.stall_rank}", "--name", seat, "--json"], env, 90)
    try:
        bundle = wait_bundle(ns.home, seat, before, 60)
    finally:
        cli(["fault", f"sigcont:rank={ns.stall_rank}", "--name", seat, "--json"], env, 90)
    out: dict[str, Any] = {"rc": fault["rc"], "err": fault["stderr"][-800:],
                           "bundle_after_fault_s": round(time.monotonic() - t0, 2) if bundle else None}
    if bundle is not None:
        time.sleep(3)
        out["verdict"] = json.loads((bundle / "manifest.json").read_text()).get("verdict")
        rep = cli(["replay", str(bundle), "--json"], env, 300)
        (d / "replay-sigstop.json").write_text(rep["stdout"] or rep["stderr"])
        out["replay_verdict"] = (as_json(rep) or {}).get("verdict")
    return out


def wait_unlatched(seat: str, env: dict[str, str], timeout: float) -> float:
    """Wait until no sidecar of the seat is latched (`watch --once --json`); the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        doc = as_json(cli(["watch", seat, "--once", "--json"], env, 60)) or {}
        if doc.get("nodes") and not any(n.get("latched") for n in doc["nodes"]):
            break
        time.sleep(1)
    return round(time.monotonic() - t0, 1)


def repeat_faults(seat: str, ns: argparse.Namespace, env: dict[str, str]) -> list[dict[str, Any]]:
    """``--repeat-faults`` stalls of the probed graph replay and as many SIGSTOPs of the scheduler, alternating,
    under the running load: per fault the seconds from the fault command's return to a complete bundle on disk
    (the manifest written), and the bundle's verdict."""
    out: list[dict[str, Any]] = []
    for i in range(ns.repeat_faults):
        for kind in ("stall", "sigstop"):
            # One hang, one bundle: a fault while the sidecars are still latched by the last bundle gives none (the
            # 2026-12-06 H100 run's stalls 4 s after each SIGSTOP's bundle gave none), so wait for the re-arm.
            rec0 = wait_unlatched(seat, env, 90)
            before = bundles_of(ns.home, seat)
            if kind == "stall":
                fault = cli(["fault", f"probe-stall:rank={ns.stall_rank},target=FullCudaGraphBackend.replay,"
                             f"after_calls=20,for_s=4", "--name", seat, "--json"], env, 90)
            else:
                fault = cli(["fault", f"sigstop:rank={ns.stall_rank}", "--name", seat, "--json"], env, 90)
            bundle = wait_bundle(ns.home, seat, before, 30)
            man: dict[str, Any] = {}
            if bundle is not None:  # the native stacks follow the bundle: wait for them before the release
                end = time.monotonic() + 15
                while time.monotonic() < end:
                    man = json.loads((bundle / "manifest.json").read_text())
                    if "late" in man:
                        break
                    time.sleep(0.2)
            if kind == "sigstop":
                cli(["fault", f"sigcont:rank={ns.stall_rank}", "--name", seat, "--json"], env, 90)
            rec: dict[str, Any] = {"i": i, "kind": kind, "rc": fault["rc"], "bundle": bundle.name if bundle else None,
                                   "err": fault["stderr"][-300:] if fault["rc"] else ""}
            if bundle is not None:
                # As the CPU soak (bench/realsoak.py) measures: from the stalled call's start in the bundle, or
                # the SIGSTOP's own time, to the bundle written (the manifest's, before its late native stacks).
                v = man.get("verdict") or {}
                written = bundle_written_t(man)
                start = stalled_call_start(bundle, ns.stall_rank) if kind == "stall" else \
                    float((as_json(fault) or {}).get("applied_t") or (as_json(fault) or {}).get("t") or 0) or None
                rec.update(verdict=f"{v.get('kind')} rank {v.get('rank')}", detected=float(man["trigger"]["t"]),
                           evidence=(v.get("evidence") or [""])[0][:300])
                if start is not None:
                    rec.update(fault_to_detect_s=round(rec["detected"] - start, 3),
                               fault_to_bundle_s=round(written - start, 3))
            rec["waited_for_rearm_s"] = rec0
            out.append(rec)
            # The timings first (a long evidence line cut them off the printed line), and every fault kept on disk
            # as it comes: a device call that ends at its limit takes the bench with it (the H100 run 3 lost its
            # last fault's timing so).
            head = {k: rec.get(k) for k in ("i", "kind", "verdict", "fault_to_detect_s", "fault_to_bundle_s")}
            print(json.dumps({**head, **rec}, default=str)[:400], flush=True)
            with (ns.out / "repeats.jsonl").open("a") as fh:
                fh.write(json.dumps(rec, default=str) + "\n")
            if kind == "stall":
                time.sleep(4)  # the 4 s stall ends
    return out


def run_arm(arm: str, ns: argparse.Namespace, facts: dict[str, Any], env: dict[str, str], out: Path) -> dict[str, Any]:
    d = out / arm
    d.mkdir(parents=True, exist_ok=True)
    spec = write_spec(arm, facts, d, ns.seat, ns.trained, ns.eagle_head)
    seat = f"{ns.seat}-{arm}"
    draft = "on" if ARMS[arm]["enabled"] else "off"
    res: dict[str, Any] = {"arm": arm, "seat": seat, "draft": draft, "spec": spec.read_text()}
    plan = cli(["plan", "--seat", str(spec), "--draft", draft, "--json"], env, 300)
    (d / "plan.json").write_text(plan["stdout"] or plan["stderr"])
    pdoc = as_json(plan) or {}
    cap = (pdoc.get("capacity") or {}).get(f"draft_{draft}") or {}
    res["plan"] = {"rc": plan["rc"], "kv_pool_tokens": cap.get("kv_pool_tokens"),
                   "max_running_requests": cap.get("max_running_requests"),
                   "source": (pdoc.get("capacity") or {}).get("source"), "error": plan["stderr"][-600:]}
    up = cli(["up", "--seat", str(spec), "--draft", draft, "--timeout", str(ns.up_timeout)], env, ns.up_timeout + 60)
    (d / "up.txt").write_text(up["stdout"] + "\n--- stderr\n" + up["stderr"])
    res["up"] = {"rc": up["rc"], "s": up["s"]}
    try:
        if up["rc"] != 0:
            res["up"]["tail"] = (up["stdout"] + up["stderr"])[-2500:]
            return res
        st = cli(["status", seat, "--json"], env, 120)
        (d / "status.json").write_text(st["stdout"] or st["stderr"])
        sdoc = as_json(st) or {}
        res["status"] = {"rc": st["rc"], "state": sdoc.get("state"),
                         "ranks": [{k: r.get(k) for k in ("pid", "title", "tp_rank", "state")}
                                   for n in sdoc.get("nodes", []) for r in n.get("ranks", [])]}
        res["stream"] = stream_once("the quick brown fox")
        info = get_json("/get_server_info")
        (d / "server_info.json").write_text(json.dumps(info, indent=1))
        real_pool = info.get("max_total_num_tokens")
        real_slots = info.get("max_running_requests")
        if real_pool is None or real_slots is None:  # 0.5.17 keeps them per scheduler
            internal = (info.get("internal_states") or [{}])[0]
            real_pool = real_pool or internal.get("max_total_num_tokens")
            real_slots = real_slots or internal.get("max_running_requests")
        kv_lines: dict[int, list[int]] = {}  # per node: every rank allocates the same pool (TP)
        for node in range(len(sdoc.get("nodes", [])) or 1):
            logs = cli(["logs", seat, "--node", str(node), "--lines", "100000"], env, 120)
            (d / f"engine-node{node}.log").write_text(logs["stdout"])
            kv_lines[node] = [int(m.group(1)) for m in KV_LINE.finditer(logs["stdout"])]
        res["real"] = {"kv_pool_tokens": real_pool, "max_running_requests": real_slots, "kv_log_tokens": kv_lines,
                       "avail_mem_lines": [ln.strip()[-160:] for ln in logs["stdout"].splitlines()
                                           if "avail mem" in ln][:6]}
        pp, rp = res["plan"]["kv_pool_tokens"], real_pool
        if isinstance(pp, int) and isinstance(rp, int) and rp:
            res["pool_plan_over_real"] = round(pp / rp, 5)
        res["slots_equal"] = res["plan"]["max_running_requests"] == real_slots
        if ns.trained is not None:
            res["answer"] = chat("What is the capital of France?", max_tokens=32, temperature=0)
            res["acceptance"] = acceptance(ns.accept_requests)
            res["throughput"] = [throughput(c, ns.tput_s) for c in ns.tput_clients]
        load = Load(ns.clients)
        time.sleep(ns.load_s)
        watch = cli(["watch", seat, "--json", "--once"], env, 60)
        (d / "watch.json").write_text(watch["stdout"] or watch["stderr"])
        if ns.stall and draft == "on":
            before = bundles_of(ns.home, seat)
            t0 = time.monotonic()
            fault = cli(["fault", f"probe-stall:rank={ns.stall_rank},target=FullCudaGraphBackend.replay,"
                         f"after_calls=40,for_s={ns.stall_s}", "--name", seat, "--json"], env, 90)
            res["fault"] = {"rc": fault["rc"], "out": fault["stdout"][-800:], "err": fault["stderr"][-800:]}
            bundle = wait_bundle(ns.home, seat, before, ns.stall_s + 30)
            res["bundle_after_fault_s"] = round(time.monotonic() - t0, 2) if bundle else None
            if bundle is not None:
                time.sleep(3)  # the bundle's other files land after its manifest
                man = json.loads((bundle / "manifest.json").read_text())
                res["bundle"] = {"path": str(bundle), "verdict": man.get("verdict"), "trigger": man.get("trigger")}
                rep = cli(["replay", str(bundle), "--json", "--html", str(d / "report.html")], env, 300)
                (d / "replay.json").write_text(rep["stdout"] or rep["stderr"])
                res["replay"] = {"rc": rep["rc"], "doc": as_json(rep)}
                subprocess.run(["tar", "-C", str(bundle.parent), "-czf", str(d / "bundle.tgz"), bundle.name],
                               check=False, timeout=120)
        if ns.sigstop and draft == "on":
            res["sigstop"] = stopped(seat, ns, env, d)
        if ns.repeat_faults and arm == ns.faults_arm:
            res["repeats"] = repeat_faults(seat, ns, env)
        res["load"] = load.close()
    finally:
        down = cli(["down", seat], env, 300)
        (d / "down.txt").write_text(down["stdout"] + "\n--- stderr\n" + down["stderr"])
        time.sleep(2)
        res["down"] = {"rc": down["rc"], "s": down["s"], "engine_processes_left": engine_processes()}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("arms", nargs="+", choices=sorted(ARMS))
    ap.add_argument("--engine-venv", required=True, help="the laid-out engine package (hostlayout.py DEST)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--home", type=Path, default=Path("/tmp/sgl-seat-home"))
    ap.add_argument("--seat", default="h200-1", help="the profile (launch/seats): h200-1, or h200x2-tp2 on 2 GPUs")
    ap.add_argument("--stall", action="store_true", help="a probe stall during draft-on decode, in draft arms")
    ap.add_argument("--stall-rank", type=int, default=0, help="the rank the stall (and --sigstop) hits")
    ap.add_argument("--sigstop", action="store_true", help="then SIGSTOP that rank's scheduler, in draft arms")
    ap.add_argument("--stall-s", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--load-s", type=float, default=10.0)
    ap.add_argument("--up-timeout", type=float, default=420.0)
    ap.add_argument("--trained", type=Path, help="the trained model's directory on this host (converted: "
                    "trainedmodel.py ensure); its layer-skip drafts beside it as NAME-skipK (made if missing)")
    ap.add_argument("--eagle-head", type=Path, help="with --trained: the EAGLE head of sgl_seat/engines/eaglehead.py "
                    "for this model, SGLang's flavour (its sglang/ directory), for the eagle arm")
    ap.add_argument("--accept-requests", type=int, default=6, help="sampled answers per workload, one client")
    ap.add_argument("--tput-clients", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--tput-s", type=float, default=15.0)
    ap.add_argument("--repeat-faults", type=int, default=0, help="then N stalls and N SIGSTOPs in --faults-arm")
    ap.add_argument("--faults-arm", default="ngram")
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    eng = Path(ns.engine_venv).resolve()
    env = dict(os.environ, SGLSEAT_HOME=str(ns.home), SGLSEAT_ENGINE_VENV=str(eng),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONUNBUFFERED="1")
    report: dict[str, Any] = {"model": "RANDOM WEIGHTS (--load-format dummy): 8B-shaped Llama, hidden 4096, 32 "
                              "layers, vocabulary 1024; drafts random too", "arms": []}
    if ns.trained is not None:
        from sgl_seat.engines import trainedmodel

        report["model"] = (f"TRAINED: {trainedmodel.TITLE}, {ns.trained}; drafts: NGRAM (no weights), STANDALONE "
                           "layer-skip (the model's own first k layers, no training), EAGLE (a head trained from the "
                           "model's own generations by eaglehead.py)")
        if ns.eagle_head is not None:
            report["eagle_head"] = json.loads((ns.eagle_head / "sgl-seat-eagle-head.json").read_text())
        for arm in ns.arms:
            k = ARMS[arm].get("skip_layers")
            skip = ns.trained.parent / f"{ns.trained.name}-skip{k}"
            if k and not (skip / "config.json").is_file():
                report.setdefault("drafts_made", []).append(trainedmodel.layer_skip(ns.trained, skip, int(k)))
    facts = gpu_facts(str(eng / "bin" / "python"))
    report["gpu_facts"] = facts
    for m in MODELS if ns.trained is None else ():
        if not (eng / "models" / m / "config.json").is_file():
            made = cli(["model", "tiny", str(eng / "models" / m), "--config", str(REPO / "launch" / "models" / m)],
                       env, 300)
            if made["rc"] != 0:
                report["model_error"] = made
    for arm in ns.arms:
        t0 = time.monotonic()
        res = run_arm(arm, ns, facts, env, ns.out)
        res["arm_s"] = round(time.monotonic() - t0, 1)
        report["arms"].append(res)
        (ns.out / "draft_seat.json").write_text(json.dumps(report, indent=1, default=str))
        print(json.dumps({k: res.get(k) for k in ("arm", "plan", "up", "real", "pool_plan_over_real", "slots_equal",
                                                   "stream", "bundle_after_fault_s", "down")}, default=str),
              flush=True)
    # The model as the report names it (trained or random weights) and the GPU the facts came from: this line said
    # "RANDOM-WEIGHTS ... one H200" on the trained model's H100 runs.
    gpu = (facts.get("device") if isinstance(facts, dict) else None) or "the GPU"
    print(f"\nplan vs real ({report['model'][:60]}; {gpu}; SGLang 0.5.17):")
    print(f"{'arm':<11} {'plan pool':>11} {'real pool':>11} {'plan/real':>9} {'plan slots':>10} {'real slots':>10}")
    for r in report["arms"]:
        real = r.get("real") or {}
        print(f"{r['arm']:<11} {r['plan'].get('kv_pool_tokens')!s:>11} {real.get('kv_pool_tokens')!s:>11} "
              f"{r.get('pool_plan_over_real')!s:>9} {r['plan'].get('max_running_requests')!s:>10} "
              f"{real.get('max_running_requests')!s:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
