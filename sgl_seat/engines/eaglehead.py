"""An EAGLE draft head for the trained model, trained here from the model's own generations.

Why: the drafts the trained model had were NGRAM (no weights: accepted on text that repeats itself, little else) and a
layer-skip draft of the model's first 8 layers (accepted 1.04-1.08 tokens a step on one H100: it loses everywhere).
SGLang's adaptive config, the hybrid, takes EAGLE with topk 1 only. An EAGLE-1 head is the smallest draft that is
trained for this model: one decoder layer over the concatenation of the next token's embedding and the target's last
hidden state (``fc``: 2 x hidden -> hidden, the layer without its input norm, no final norm), the target's embedding
and head shared. It predicts the target's next hidden state, which the shared head turns into the next token.

How: the target writes its own training text (chat prompts of four kinds: a list to copy, a question, code, a story;
sampled at temperature 0.7, end of sequence honoured), its last hidden states are read over each text (teacher
forcing: what the engine hands the draft for accepted tokens), and the head learns to predict the hidden state of
position t+1 from (the state of t, the token of t+1): smooth-L1 on the state plus 0.1 x cross-entropy of the shared
head's logits against the target's own distribution there (EAGLE's losses; the cross-entropy on a sample of positions
a step, since the 49,152-word head is most of a step's cost on a CPU). Held-out texts give the head's top-1
agreement with the target, the first draft token's acceptance under greedy decoding: an offline figure, printed and
kept in the manifest; the engine's own counters give the real acceptance.

Written for both engines from one set of weights (``write_for``): vLLM 0.32's ``EagleLlamaForCausalLM`` (config
architecture ``LlamaForCausalLM``, which its ``EAGLEConfig`` prefixes with ``Eagle``; ``fc`` without a bias) and
SGLang's ``LlamaForCausalLMEagle`` (that architecture in the config; its ``fc`` is a ``torch.nn.Linear`` with a bias,
written as zeros so both compute the same function). Neither checkpoint holds an embedding or a head: both engines
share the target's.

Standard library at module level (it runs as a script in an engine environment, like ``trainedmodel.py``): ``python
eaglehead.py train --model DIR --out DIR``; torch, transformers and safetensors inside the functions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MANIFEST = "sgl-seat-eagle-head.json"
MANIFEST_VERSION = "1.0"
ENGINES = ("vllm", "sglang")
#: The config architecture each engine's EAGLE loader is chosen by (see the module's docstring).
ARCHITECTURE = {"vllm": "LlamaForCausalLM", "sglang": "LlamaForCausalLMEagle"}

Progress = Callable[[str], object]

# Prompt material: plain words and topics, so the texts are the model's own answers to ordinary requests.
_WORDS = ("apple", "banana", "cherry", "grape", "lemon", "mango", "orange", "peach", "pear", "plum", "river",
          "mountain", "forest", "desert", "ocean", "island", "valley", "meadow", "canyon", "glacier", "red", "blue",
          "green", "yellow", "purple", "silver", "golden", "violet", "copper", "amber", "table", "chair", "window",
          "door", "lamp", "shelf", "carpet", "mirror", "clock", "pillow", "teacher", "doctor", "farmer", "pilot",
          "sailor", "painter", "baker", "writer", "singer", "dancer")
_TOPICS = ("the moon", "volcanoes", "honey bees", "the printing press", "rain", "chess", "bread", "bicycles",
           "the human heart", "lighthouses", "glaciers", "the internet", "tea", "owls", "electricity", "maps")
_CODE = ("a function that reverses a string", "a function that checks if a number is prime",
         "a function that returns the Fibonacci numbers up to n", "a class for a simple bank account",
         "a function that counts the words in a text", "a function that sorts a list of numbers")
_STORY = ("a lost dog who finds its way home", "a robot learning to paint", "a girl who talks to the wind",
          "two friends building a boat", "a dragon afraid of the dark", "a baker's magic oven")


def prompts(n: int, seed: int) -> list[str]:
    """``n`` chat requests, the four kinds in turn, their words drawn by ``seed``."""
    rng = random.Random(seed)  # noqa: S311 (reproducible prompts, not secrets)
    out: list[str] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            items = ", ".join(rng.sample(_WORDS, rng.randint(6, 16)))
            out.append(f"Repeat this list exactly, one item per line: {items}")
        elif kind == 1:
            out.append(f"{rng.choice(('Tell me', 'Explain', 'What do you know', 'Give three facts'))} about "
                       f"{rng.choice(_TOPICS)}.")
        elif kind == 2:
            out.append(f"Write {rng.choice(_CODE)} in Python, with a short test.")
        else:
            out.append(f"Write a short story about {rng.choice(_STORY)}.")
    return out


def generate(model: Any, tok: Any, requests: Sequence[str], *, max_new_tokens: int, temperature: float, batch: int,
             seed: int, progress: Progress) -> list[list[int]]:
    """The target's own answers: each request through the chat template, then sampled; prompt and answer ids."""
    import torch

    torch.manual_seed(seed)
    tok.padding_side = "left"
    out: list[list[int]] = []
    for i in range(0, len(requests), batch):
        chunk = [tok.apply_chat_template([{"role": "user", "content": r}], tokenize=False, add_generation_prompt=True)
                 for r in requests[i:i + batch]]
        enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                                 max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
        for row, mask in zip(gen, enc["attention_mask"], strict=True):
            ids = row[int(mask.shape[0] - mask.sum()):].tolist()  # the left padding dropped
            while ids and ids[-1] == tok.pad_token_id:
                ids.pop()
            out.append(ids)
        progress(f"generated {len(out)}/{len(requests)} answers")
    return out


class _Head:
    """The EAGLE-1 head's modules, in the parameter names both engines load (``fc``, ``layers.0.*``)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import torch
        from torch import nn

        h, inter = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
        self.heads, self.kv_heads = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
        self.head_dim = int(cfg.get("head_dim") or h // self.heads)
        self.eps = float(cfg["rms_norm_eps"])
        rope = cfg.get("rope_parameters") or {}
        self.theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        self.mods: Any = nn.ModuleDict({
            "fc": nn.Linear(2 * h, h, bias=False),
            "q_proj": nn.Linear(h, self.heads * self.head_dim, bias=False),
            "k_proj": nn.Linear(h, self.kv_heads * self.head_dim, bias=False),
            "v_proj": nn.Linear(h, self.kv_heads * self.head_dim, bias=False),
            "o_proj": nn.Linear(self.heads * self.head_dim, h, bias=False),
            "gate_proj": nn.Linear(h, inter, bias=False),
            "up_proj": nn.Linear(h, inter, bias=False),
            "down_proj": nn.Linear(inter, h, bias=False),
        })
        self.post_norm: Any = nn.Parameter(torch.ones(h))

    def parameters(self) -> list[Any]:
        return [*self.mods.parameters(), self.post_norm]

    def _rms(self, x: Any) -> Any:
        import torch

        var = x.pow(2).mean(-1, keepdim=True)
        return self.post_norm * (x * torch.rsqrt(var + self.eps))

    def _rope(self, x: Any, positions: Any) -> Any:
        """Rotary embedding, neox style (``rotate_half``), as the engines' Llama applies it."""
        import torch

        half = self.head_dim // 2
        inv = 1.0 / (self.theta ** (torch.arange(0, half, dtype=torch.float32) / half))
        ang = positions[..., None].float() * inv  # [B, T, half]
        cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]  # [B, 1, T, half]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def forward(self, embeds: Any, states: Any, positions: Any, mask: Any) -> Any:
        """The head over [B, T] positions: (the next token's embedding, the target's state) -> the next state.

        ``mask`` [B, T] marks real tokens (the rest is padding, on the right)."""
        import torch
        import torch.nn.functional as F

        m = self.mods
        x = m["fc"](torch.cat((embeds, states), dim=-1))
        b, t, _ = x.shape
        q = m["q_proj"](x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = m["k_proj"](x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = m["v_proj"](x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self._rope(q, positions), self._rope(k, positions)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        allowed = causal[None, None] & mask[:, None, None, :].bool()
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        x = x + m["o_proj"](att.transpose(1, 2).reshape(b, t, -1))  # no input norm: EAGLE-1's first layer
        y = self._rms(x)
        return x + m["down_proj"](F.silu(m["gate_proj"](y)) * m["up_proj"](y))

    def state_dict(self, *, fc_bias: bool) -> dict[str, Any]:
        import torch

        sd: dict[str, Any] = {"fc.weight": self.mods["fc"].weight.detach().clone().contiguous()}
        if fc_bias:
            sd["fc.bias"] = torch.zeros(self.mods["fc"].weight.shape[0])
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[f"layers.0.self_attn.{name}.weight"] = self.mods[name].weight.detach().clone().contiguous()
        for name in ("gate_proj", "up_proj", "down_proj"):
            sd[f"layers.0.mlp.{name}.weight"] = self.mods[name].weight.detach().clone().contiguous()
        sd["layers.0.post_attention_layernorm.weight"] = self.post_norm.detach().clone().contiguous()
        return sd


def _batches(count: int, size: int, rng: random.Random) -> list[list[int]]:
    """The indices 0..count-1 shuffled, in batches of ``size``."""
    order = list(range(count))
    rng.shuffle(order)
    return [order[i:i + size] for i in range(0, len(order), size)]


def _pad(seqs: Sequence[list[int]], idx: Sequence[int]) -> tuple[Any, Any]:
    import torch

    t = max(len(seqs[i]) for i in idx)
    ids = torch.zeros(len(idx), t, dtype=torch.long)
    mask = torch.zeros(len(idx), t, dtype=torch.bool)
    for r, i in enumerate(idx):
        ids[r, :len(seqs[i])] = torch.tensor(seqs[i])
        mask[r, :len(seqs[i])] = True
    return ids, mask


def train(model_dir: Path, *, texts: int = 256, max_new_tokens: int = 192, epochs: int = 4, batch: int = 8,
          lr: float = 1e-3, ce_positions: int = 512, held_out: int = 16, seed: int = 0,
          progress: Progress = print) -> tuple[_Head, dict[str, Any]]:
    """Train a head for the model in ``model_dir``; the head and a report of what was done and measured."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    torch.manual_seed(seed)
    rng = random.Random(seed)  # noqa: S311 (a reproducible batch order)
    cfg = json.loads((model_dir / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    seqs = generate(model, tok, prompts(texts + held_out, seed), max_new_tokens=max_new_tokens, temperature=0.7,
                    batch=16, seed=seed, progress=progress)
    t_gen = time.time() - t0
    embed = model.get_input_embeddings().weight.detach()
    lm_head = model.get_output_embeddings().weight.detach()

    def states(idx: Sequence[int]) -> tuple[Any, Any, Any]:
        ids, mask = _pad(seqs, idx)
        with torch.no_grad():
            h = model.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        return ids, mask, h

    head = _Head(cfg)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    steps = epochs * math.ceil(texts / batch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))

    def step_loss(idx: Sequence[int], *, all_ce: bool) -> tuple[Any, Any, Any, int]:
        ids, mask, h = states(idx)
        b, t = ids.shape
        pos = torch.arange(t - 1)[None].expand(b, -1)
        valid = mask[:, 1:] & mask[:, :-1]  # position t and t+1 both real
        pred = head.forward(embed[ids[:, 1:]], h[:, :-1], pos, mask[:, 1:])
        want = h[:, 1:]
        reg = F.smooth_l1_loss(pred[valid], want[valid])
        flat_pred, flat_want = pred[valid], want[valid]
        n = flat_pred.shape[0]
        pick = torch.arange(n) if all_ce else torch.randperm(n)[:ce_positions]
        logits = flat_pred[pick] @ lm_head.T
        with torch.no_grad():
            p_target = torch.softmax(flat_want[pick] @ lm_head.T, dim=-1)
        ce = -(p_target * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
        agree = int((logits.argmax(-1) == p_target.argmax(-1)).sum())
        return reg, ce, agree, int(pick.shape[0])

    losses: list[float] = []
    step = 0
    for epoch in range(epochs):
        for idx in _batches(texts, batch, rng):  # the first ``texts`` answers train; the rest are held out
            reg, ce, _, _ = step_loss(idx, all_ce=False)
            loss = reg + 0.1 * ce
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            step += 1
            if step % 10 == 0 or step == steps:
                progress(f"epoch {epoch + 1}/{epochs} step {step}/{steps}: loss {losses[-1]:.4f} "
                         f"(smooth-L1 {float(reg):.4f}, cross-entropy {float(ce):.3f})")
    with torch.no_grad():
        agree = total = 0
        for i in range(texts, texts + held_out, batch):
            _, _, a, n = step_loss(list(range(i, min(i + batch, texts + held_out))), all_ce=True)
            agree, total = agree + a, total + n
    report = {
        "texts": texts, "held_out": held_out, "tokens": sum(len(s) for s in seqs[:texts]),
        "max_new_tokens": max_new_tokens, "temperature": 0.7, "epochs": epochs, "steps": steps, "batch": batch,
        "lr": lr, "seed": seed, "first_loss": losses[0] if losses else None,
        "last_loss": sum(losses[-10:]) / max(1, len(losses[-10:])),
        "held_out_top1_agreement": agree / total if total else None, "held_out_positions": total,
        "generate_s": round(t_gen, 1), "train_s": round(time.time() - t0 - t_gen, 1),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    return head, report


def write_for(head: _Head, report: dict[str, Any], model_dir: Path, out: Path, engine: str, dtype: str) -> Path:
    """The head as ``engine`` loads it: config.json (the target's, one layer, the engine's architecture) and
    model.safetensors, beside the manifest. Written under a temporary name and renamed into place."""
    import torch
    from safetensors.torch import save_file

    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg.update(num_hidden_layers=1, architectures=[ARCHITECTURE[engine]], dtype=dtype)
    cfg.pop("torch_dtype", None)
    if engine == "sglang":
        # SGLang's EAGLE worker hands the head the target's embedding and head (``set_embed_and_head``: ``del
        # model.embed_tokens.weight`` then ``del lm_head.weight``); a tied config makes those one module, and the
        # second ``del`` fails at start ("'VocabParallelEmbedding' object has no attribute 'weight'", 0.5.17 on an
        # H100 with SmolLM2's tied config). The head holds neither, so untied costs nothing.
        cfg["tie_word_embeddings"] = False
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=False)
    sd = {k: v.to(getattr(torch, dtype)) for k, v in head.state_dict(fc_bias=engine == "sglang").items()}
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    made = model_dir / "sgl-seat-model.json"  # trainedmodel.py's manifest: which model this head was trained for
    target = json.loads(made.read_text()) if made.is_file() else {}
    manifest = {"version": MANIFEST_VERSION, "kind": "EAGLE-1 head, trained here from the target's own generations",
                "engine": engine, "architecture": ARCHITECTURE[engine], "dtype": dtype,
                "target": {"dir": str(model_dir), "title": target.get("title"),
                           "safetensors_sha256": target.get("safetensors_sha256")},
                "parameters": sum(int(v.numel()) for v in sd.values()), "training": report}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eaglehead.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train a head from the model's own generations and write it for each engine")
    t.add_argument("--model", type=Path, required=True, help="the target model's directory (trainedmodel.py's)")
    t.add_argument("--out", type=Path, required=True, help="a directory; one head per engine is written under it")
    t.add_argument("--engine", action="append", choices=ENGINES, help="repeatable (default: both)")
    t.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    t.add_argument("--texts", type=int, default=256)
    t.add_argument("--max-new-tokens", type=int, default=192)
    t.add_argument("--epochs", type=int, default=4)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    a = ap.parse_args(argv)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    head, report = train(a.model, texts=a.texts, max_new_tokens=a.max_new_tokens, epochs=a.epochs, seed=a.seed,
                         progress=progress)
    written = {e: str(write_for(head, report, a.model, a.out / e, e, a.dtype)) for e in (a.engine or ENGINES)}
    print(json.dumps({"written": written, "training": report}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
