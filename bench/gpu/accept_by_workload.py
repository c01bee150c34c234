"""A draft's acceptance per workload, from SGLang's own per-request counters in a seat's request log.

The gate's sweep cells count the engine's tokens and verify steps over a cell, which mixes the four kinds of chat
request the trained battery sends (``gate.workloads.chat_request``: a list to copy, a question, code, a story). SGLang
logs each finished request with its ``completion_tokens`` and ``spec_verify_ct`` (``--log-requests``, which every
seat's plan turns on), but at level 1 not its text. The kind is recovered from ``prompt_tokens``: each kind's
prompts, in SmolLM2's ChatML template and tokenized by the model's own tokenizer, have token counts no other kind has
(the script checks that and refuses otherwise; a list is any count above the other kinds').

    python bench/gpu/accept_by_workload.py --tokenizer MODEL_DIR/tokenizer.json LOG [LOG ...] [--json]

LOG: a seat's ``logs/SEAT/requests/*.log`` (plain or .zst). Only sampled requests (temperature > 0: the sweep's) are
counted. Prints, per kind: requests, accept length pooled (tokens over verify steps) and per request p10/p50/p90.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
from pathlib import Path
from typing import Any

import zstandard

from sgl_seat.gate import workloads


def kinds_by_tokens(tokenizer: Path) -> tuple[dict[int, str], int]:
    """Prompt token count -> kind for the question, code and story kinds; and the largest of them."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    out: dict[int, str] = {}
    for kind, texts in workloads.chat_texts().items():
        for c in {len(tok.encode(workloads.chatml(t), add_special_tokens=False).ids) for t in texts}:
            if c in out:
                raise SystemExit(f"prompt token count {c} is both {out[c]} and {kind}: the kinds cannot be told apart")
            out[c] = kind
    return out, max(out)


def finished(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    if path.suffix == ".zst":
        raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read()
    rows = []
    for line in raw.decode().splitlines():
        i = line.find("{")
        if i < 0:
            continue
        d = json.loads(line[i:])
        if d.get("event") != "request.finished":
            continue
        # SGLang 0.5.17 logs ``out`` as a Python repr at this level
        out = d["out"] if isinstance(d["out"], dict) else ast.literal_eval(d["out"])
        m, sp = out["meta_info"], d["obj"]["sampling_params"]
        rows.append({"temperature": sp.get("temperature"), "prompt_tokens": m.get("prompt_tokens"),
                     "completion_tokens": m.get("completion_tokens"), "verify": m.get("spec_verify_ct")})
    return rows


def summarize(rows: list[dict[str, Any]], by_tokens: dict[int, str], top: int) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if not r["temperature"] or not r["verify"]:
            continue
        p = r["prompt_tokens"]
        kind = by_tokens.get(p) or ("list" if p > top else None)
        if kind is None:
            raise SystemExit(f"a sampled request of {p} prompt tokens is none of the kinds")
        groups.setdefault(kind, []).append(r)
    out: dict[str, Any] = {}
    for kind in ("list", "question", "code", "story"):
        g = groups.get(kind, [])
        if not g:
            continue
        per = sorted(r["completion_tokens"] / r["verify"] for r in g)

        def q(p: float, per: list[float] = per) -> float:
            return round(per[min(len(per) - 1, int(p * len(per)))], 3)

        tokens, verify = sum(r["completion_tokens"] for r in g), sum(r["verify"] for r in g)
        out[kind] = {"requests": len(g), "tokens": tokens, "verify_steps": verify,
                     "accept_length": round(tokens / verify, 3), "per_request_p10_p50_p90": [q(0.1), q(0.5), q(0.9)]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True, help="the model's tokenizer.json")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    by_tokens, top = kinds_by_tokens(ns.tokenizer)
    rows = [r for p in ns.logs for r in finished(p)]
    doc = summarize(rows, by_tokens, top)
    if ns.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"{'kind':<9} {'requests':>8} {'accept length':>14}  per request p10 / p50 / p90")
    for kind, f in doc.items():
        p = f["per_request_p10_p50_p90"]
        print(f"{kind:<9} {f['requests']:>8} {f['accept_length']:>14}  {p[0]} / {p[1]} / {p[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
