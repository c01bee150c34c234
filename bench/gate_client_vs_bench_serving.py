#!/usr/bin/env python3
"""The gate's client against ``sglang.bench_serving`` on the same seat and load, interleaved (synthetic figures).

One sim engine (single node, TP1, draft off or on) serves both clients. Each round runs the gate's closed-loop
client (``sgl_seat.gate.client.closed_loop``) and then ``python -m sglang.bench_serving`` (SGLang 0.5.23, backend
``sglang-oai``: the same ``/v1/completions`` route, streaming) with the same concurrency (``--max-concurrency``),
request count, fixed input and output lengths (``--dataset-name random-ids --random-range-ratio 1.0``) and
``ignore_eos``; rounds alternate which client goes first. Printed: each client's output tokens/s per round, the
ratio (gate / bench_serving) and its mean, and the gate client's own overhead at that concurrency.

bench_serving needs a tokenizer and the ``datasets`` package (imported at its start; not in the project's venv).
The tokenizer is a word-level one built here from the sim's vocabulary (one word = one token, as the sim counts),
saved as a Hugging Face fast tokenizer; ``datasets`` is taken from ``--extra-path`` (e.g. a directory made with
``pip install --target DIR datasets``).

Usage::

    python bench/gate_client_vs_bench_serving.py --extra-path /tmp/bsdeps [--concurrency 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sgl_seat.gate.client import closed_loop
from sgl_seat.gate.workloads import prompt_words
from sgl_seat.netports import free_block
from sgl_seat.sim.step import tokens

HOST = "127.0.0.1"
PORTS = range(30760, 30790)


def _free_port() -> int:
    """The first port p of PORTS with p and p + 2 (the sim's admin port) free."""
    p = free_block(PORTS, (0, 2), host=HOST, reuse=False)
    if p is None:
        raise SystemExit("no free port in 30760-30789")
    return p


def _tokenizer(d: Path) -> Path:
    """A word-level HF tokenizer over the sim's vocabulary (ids as the sim assigns them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": tokens.PAD_ID, "<s>": tokens.BOS_ID, "</s>": tokens.EOS_ID, "<unk>": 7}
    vocab.update({w: tokens.VOCAB_BASE + i for i, w in enumerate(tokens.WORDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(str(d))
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extra-path", default="", help="directory holding `datasets` (pip install --target)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=192)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--draft", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gate-vs-bs-"))
    tok_dir = _tokenizer(work / "tokenizer")
    port, dist = _free_port(), _free_port() + 4
    argv = [sys.executable, "-m", "sgl_seat.sim.launch_server", "--model-path", str(tok_dir), "--served-model-name",
            "sim", "--tp-size", "1", "--dist-init-addr", f"{HOST}:{dist}", "--enable-metrics", "--host", HOST,
            "--port", str(port), "--max-running-requests", "32"]
    if a.draft:
        argv += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", "4"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLSEAT_")}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    with open(work / "engine.log", "wb") as log:
        engine = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://{HOST}:{port}"
    rows = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=10, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise SystemExit(f"the sim engine did not come up; see {work / 'engine.log'}")
        path = os.pathsep.join(p for p in (a.extra_path, os.environ.get("PYTHONPATH", "")) if p)
        bs_env = {**os.environ, "PYTHONPATH": path, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
        for rnd in range(a.rounds):
            got: dict[str, float] = {}
            order = ("gate", "bench_serving") if rnd % 2 == 0 else ("bench_serving", "gate")
            for who in order:
                if who == "gate":
                    prompts = [prompt_words(rnd, a.input_len, tag=f"vs{i}") for i in range(a.requests)]
                    run = closed_loop(url, "sim", prompts, concurrency=a.concurrency, max_tokens=a.output_len)
                    s = run.summary()
                    got["gate"] = s["output_tok_s"]
                    got["lag"], got["cpu"] = s["client"]["loop_lag_ms_max"], s["client"]["cpu_s_per_request"]
                else:
                    out = work / f"bs{rnd}.jsonl"
                    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang-oai", "--base-url", url,
                           "--model", "sim", "--tokenizer", str(tok_dir), "--dataset-name", "random-ids",
                           "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
                           "--random-range-ratio", "1.0", "--num-prompts", str(a.requests), "--max-concurrency",
                           str(a.concurrency), "--request-rate", "inf", "--warmup-requests", "0",
                           "--output-file", str(out), "--seed", str(rnd + 1)]
                    p = subprocess.run(cmd, capture_output=True, text=True, env=bs_env, timeout=600, check=False)
                    if p.returncode != 0 or not out.is_file():
                        print(p.stdout[-3000:], p.stderr[-3000:], file=sys.stderr)
                        raise SystemExit(f"bench_serving failed (exit {p.returncode})")
                    doc = json.loads(out.read_text().splitlines()[-1])
                    got["bench_serving"] = float(doc["output_throughput"])
                    got["bs_completed"] = float(doc["completed"])
            rows.append(got)
    finally:
        os.killpg(engine.pid, 9)
        engine.wait(timeout=30)
    print("SYNTHETIC: a sim engine on this host (draft " + ("on" if a.draft else "off") + "), not SGLang on a GPU.")
    print(f"concurrency {a.concurrency}, {a.requests} requests, input {a.input_len}, output {a.output_len} tokens")
    print(f"{'round':<6} {'gate tok/s':>11} {'bench_serving tok/s':>20} {'gate/bs':>8}  bench_serving completed; gate "
          "client: loop lag max ms, CPU ms/request")
    ratios = []
    for i, r in enumerate(rows):
        ratio = r["gate"] / r["bench_serving"]
        ratios.append(ratio)
        print(f"{i:<6} {r['gate']:>11.1f} {r['bench_serving']:>20.1f} {ratio:>8.3f}  "
              f"{r['bs_completed']:.0f}/{a.requests}; {r['lag']:.1f}, {r['cpu'] * 1000:.2f}")
    mean = sum(ratios) / len(ratios)
    med = sorted(ratios)[len(ratios) // 2]
    print(f"mean gate/bench_serving {mean:.3f} ({(mean - 1) * 100:+.1f} %), median {med:.3f}; within 3 %: "
          f"{abs(mean - 1) <= 0.03}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
